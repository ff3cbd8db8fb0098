//! Writing a tiering round: a bucket's rows as Parquet data files, then one Iceberg
//! snapshot for the whole round.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, Operation, PartitionKey};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{FileNameGenerator, LocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use mink_core::protocol::BucketId;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use tracing::warn;

use crate::catalog::Lake;
use crate::commit::{SnapshotChanges, commit_snapshot};
use crate::error::{LakeError, Result};
use crate::layout::bucket_dir;
use crate::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};

/// Target size of one data file.
pub(crate) const TARGET_FILE_BYTES: usize = 256 << 20;

/// Data files are named by a fresh UUID: a per-process counter would let a second process
/// overwrite committed files.
#[derive(Debug, Clone)]
pub struct UuidNames;

impl FileNameGenerator for UuidNames {
    fn generate_file_name(&self) -> String {
        format!("{}.parquet", uuid::Uuid::now_v7())
    }
}

/// Every file of a bucket goes to the bucket's directory.
#[derive(Debug, Clone)]
pub struct BucketLocation(String);

impl BucketLocation {
    /// Files go to `directory` (a location).
    pub fn new(directory: String) -> Self {
        Self(directory)
    }
}

impl LocationGenerator for BucketLocation {
    fn generate_location(&self, _partition: Option<&PartitionKey>, file_name: &str) -> String {
        format!("{}/{file_name}", self.0)
    }
}

/// Writes one bucket's lake batches of a round as data files, a batch at a time (the
/// round's rows are never all in memory). The files are invisible until
/// [`commit_round`] commits them.
pub struct BucketWriter {
    table: Table,
    bucket: BucketId,
    splitter: RecordBatchPartitionSplitter,
    open: Option<(
        PartitionKey,
        DataFileWriter<ParquetWriterBuilder, BucketLocation, UuidNames>,
    )>,
}

impl std::fmt::Debug for BucketWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketWriter")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

impl BucketWriter {
    /// A writer of `bucket`'s files into `table`.
    pub fn new(table: &Table, bucket: &BucketId) -> Result<Self> {
        let metadata = table.metadata();
        let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
            Arc::clone(metadata.current_schema()),
            Arc::clone(metadata.default_partition_spec()),
        )?;
        Ok(Self {
            table: table.clone(),
            bucket: bucket.clone(),
            splitter,
            open: None,
        })
    }

    /// Writes a lake batch (see [`crate::layout::lake_batch`]).
    ///
    /// # Errors
    /// [`LakeError::Layout`] when the bucket's rows fall in more than one lake partition
    /// (the lake's partitioning disagrees with mink's bucketing).
    pub async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        for (key, part) in self.splitter.split(&batch)? {
            let writer = match &mut self.open {
                Some((seen, writer)) if seen.data() == key.data() => writer,
                Some(_) => {
                    return Err(LakeError::layout(
                        self.table.identifier(),
                        format!(
                            "rows of bucket {} fall in more than one lake partition",
                            self.bucket
                        ),
                    ));
                }
                None => {
                    let writer = open_writer(&self.table, &self.bucket, key.clone()).await?;
                    &mut self.open.insert((key, writer)).1
                }
            };
            writer.write(part).await?;
        }
        Ok(())
    }

    /// Finishes the files; none when nothing was written.
    pub async fn close(self) -> Result<Vec<DataFile>> {
        match self.open {
            Some((_, mut writer)) => Ok(writer.close().await?),
            None => Ok(Vec::new()),
        }
    }
}

/// The Parquet writer properties of every file mink writes to the lake (data and delete
/// files): LZ4_RAW, the rest as Parquet's defaults.
///
/// Why LZ4_RAW (`mink-bench lake-codecs`, 10M rows, DataFusion reading every column in
/// 0.24 s against 0.39 s with zstd(1), one numeric column 2.1x faster; `docs/benchmarks.md`):
/// reads are what a union read spends its time on, and zstd's decompression was its
/// largest single cost; the files are larger (1.7x on that data), which a lake pays in
/// storage, not in reads. Every Iceberg reader takes it (pyiceberg/pyarrow, DuckDB, Daft,
/// Polars); Parquet's older Hadoop LZ4 is not used.
pub fn writer_properties() -> WriterProperties {
    writer_properties_with(Compression::LZ4_RAW)
}

/// The lake's writer properties with another codec (`mink-bench lake-codecs` measures
/// them against each other).
pub fn writer_properties_with(compression: Compression) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(compression)
        .build()
}

/// Opens the data file writer of one bucket's partition. (A free function: the future
/// must not borrow the [`BucketWriter`], whose open writer is not `Sync`.)
async fn open_writer(
    table: &Table,
    bucket: &BucketId,
    partition: PartitionKey,
) -> Result<DataFileWriter<ParquetWriterBuilder, BucketLocation, UuidNames>> {
    let metadata = table.metadata();
    let location = BucketLocation(format!("{}/{}", metadata.location(), bucket_dir(bucket)));
    let rolling = RollingFileWriterBuilder::new(
        ParquetWriterBuilder::new(writer_properties(), Arc::clone(metadata.current_schema())),
        TARGET_FILE_BYTES,
        table.file_io().clone(),
        location,
        UuidNames,
    );
    Ok(DataFileWriterBuilder::new(rolling)
        .build(Some(partition))
        .await?)
}

/// Commits a round: its data files in one Iceberg snapshot whose summary carries the
/// complete bucket offsets. `parent` is the snapshot the round was planned on: if the
/// table moved on since, nothing is committed (mink is the only writer of its lake tables;
/// anything else is a conflict to surface, not to rebase over). The snapshot is committed
/// at the metadata layer by [`commit_snapshot`], never by iceberg's `fast_append` (which
/// silently rebases onto whatever the table holds at commit time).
///
/// # Errors
/// [`LakeError::CommitConflict`] when the table is no longer at `parent`; the errors of
/// [`commit_snapshot`] otherwise.
pub async fn commit_round(
    lake: &Lake,
    table: &Table,
    parent: Option<i64>,
    files: Vec<DataFile>,
    offsets: &BucketOffsets,
) -> Result<Table> {
    let changes = SnapshotChanges {
        added_data_files: files,
        properties: HashMap::from([(BUCKET_OFFSETS_PROPERTY.to_string(), offsets.to_json())]),
        ..SnapshotChanges::default()
    };
    commit_snapshot(lake, table, parent, Operation::Append, changes).await
}

/// Deletes lake files no snapshot references (a round's data files, a failed commit's
/// delete files, manifests and metadata, the files of expired snapshots), best effort:
/// every path is tried, each failure is logged with `warn!`, and the first one is returned
/// after all were tried.
///
/// A caller that is already failing with another error keeps its own error: it drops
/// this result (the failures are logged here), it never `?`s it over the original error.
/// An orphaned file is harmless; a deleted committed file is not, so only call this with
/// files no snapshot of the table references.
///
/// # Errors
/// [`LakeError::Iceberg`] of the first file that could not be deleted (a file that is
/// already gone is no error).
pub async fn delete_files(table: &Table, paths: &[String]) -> Result<()> {
    let mut first = None;
    for path in paths {
        if let Err(error) = table.file_io().delete(path).await {
            warn!(table = %table.identifier(), %path, %error, "could not delete an unreferenced lake file");
            first.get_or_insert(error);
        }
    }
    first.map_or(Ok(()), |error| Err(error.into()))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::catalog::fixture::lake_table;

    #[tokio::test]
    async fn deleting_files_tries_every_path_and_reports_the_first_failure() {
        let dir = tempfile::tempdir().unwrap();
        let (_lake, _descriptor, table) = lake_table(dir.path()).await;
        let file_io = table.file_io();
        let location = table.metadata().location();
        let written: Vec<String> = ["a", "b"]
            .iter()
            .map(|name| format!("{location}/data/{name}.parquet"))
            .collect();
        for path in &written {
            file_io
                .new_output(path)
                .unwrap()
                .write(Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        // Not an absolute path: the store cannot delete it.
        let paths = [
            vec!["not/absolute".to_string()],
            written.clone(),
            vec!["also/not/absolute".to_string()],
        ]
        .concat();
        let err = delete_files(&table, &paths).await.unwrap_err();
        assert!(err.to_string().contains("not/absolute"), "{err}");
        assert!(!err.to_string().contains("also/not/absolute"), "{err}");
        for path in &written {
            assert!(!file_io.exists(path).await.unwrap(), "{path} is left");
        }
        // Files already gone are no failure.
        delete_files(&table, &written).await.unwrap();
    }
}
