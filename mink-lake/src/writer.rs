//! Writing a tiering round: a bucket's rows as Parquet data files, then one Iceberg
//! snapshot for the whole round.

use std::collections::HashMap;

use arrow::array::RecordBatch;
use iceberg::Catalog;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, PartitionKey};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{FileNameGenerator, LocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use mink_core::protocol::BucketId;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::catalog::Lake;
use crate::error::{LakeError, Result};
use crate::layout::bucket_dir;
use crate::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};

/// Target size of one data file.
const TARGET_FILE_BYTES: usize = 256 << 20;

/// Data files are named by a fresh UUID: a per-process counter would let a second process
/// overwrite committed files.
#[derive(Debug, Clone)]
struct UuidNames;

impl FileNameGenerator for UuidNames {
    fn generate_file_name(&self) -> String {
        format!("{}.parquet", uuid::Uuid::now_v7())
    }
}

/// Every file of a bucket goes to the bucket's directory.
#[derive(Debug, Clone)]
struct BucketLocation(String);

impl LocationGenerator for BucketLocation {
    fn generate_location(&self, _partition: Option<&PartitionKey>, file_name: &str) -> String {
        format!("{}/{file_name}", self.0)
    }
}

/// Writes one bucket's lake batches as data files. They are invisible until
/// [`commit_round`] commits them.
///
/// # Errors
/// [`LakeError::Layout`] when the rows fall in more than one lake partition (the lake's
/// partitioning disagrees with mink's bucketing).
pub async fn write_bucket(
    table: &Table,
    bucket: &BucketId,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    let schema = table.metadata().current_schema();
    let spec = table.metadata().default_partition_spec();
    let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
        std::sync::Arc::clone(schema),
        std::sync::Arc::clone(spec),
    )?;
    let mut partition: Option<PartitionKey> = None;
    let mut parts = Vec::with_capacity(batches.len());
    for batch in batches {
        for (key, part) in splitter.split(batch)? {
            match &partition {
                Some(seen) if seen.data() != key.data() => {
                    return Err(LakeError::Layout {
                        table: table.identifier().to_string(),
                        message: format!(
                            "rows of bucket {bucket} fall in more than one lake partition"
                        ),
                    });
                }
                Some(_) => {}
                None => partition = Some(key),
            }
            parts.push(part);
        }
    }
    let Some(partition) = partition else {
        return Ok(Vec::new());
    };
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let location = BucketLocation(format!(
        "{}/{}",
        table.metadata().location(),
        bucket_dir(bucket)
    ));
    let rolling = RollingFileWriterBuilder::new(
        ParquetWriterBuilder::new(properties, std::sync::Arc::clone(schema)),
        TARGET_FILE_BYTES,
        table.file_io().clone(),
        location,
        UuidNames,
    );
    let mut writer = DataFileWriterBuilder::new(rolling)
        .build(Some(partition))
        .await?;
    for part in parts {
        writer.write(part).await?;
    }
    Ok(writer.close().await?)
}

/// Commits a round: its data files in one Iceberg snapshot whose summary carries the
/// complete bucket offsets. `parent` is the snapshot the round was planned on: if the
/// table moved on since, nothing is committed (mink is the only writer of its lake tables;
/// anything else is a conflict to surface, not to rebase over).
pub async fn commit_round(
    lake: &Lake,
    table: &Table,
    parent: Option<i64>,
    files: Vec<DataFile>,
    offsets: &BucketOffsets,
) -> Result<Table> {
    let current = lake.catalog().load_table(table.identifier()).await?;
    let current_id = current.metadata().current_snapshot_id();
    if current_id != parent {
        return Err(LakeError::Layout {
            table: table.identifier().to_string(),
            message: format!(
                "the lake table moved from snapshot {parent:?} to {current_id:?} during the round; the round is retried"
            ),
        });
    }
    let properties = HashMap::from([(BUCKET_OFFSETS_PROPERTY.to_string(), offsets.to_json())]);
    let tx = Transaction::new(&current);
    let tx = tx
        .fast_append()
        .with_check_duplicate(false)
        .add_data_files(files)
        .set_snapshot_properties(properties)
        .apply(tx)?;
    Ok(tx.commit(lake.catalog()).await?)
}

/// Deletes files written by a round that was never committed.
pub async fn delete_files(table: &Table, paths: &[String]) -> Result<()> {
    for path in paths {
        table.file_io().delete(path).await?;
    }
    Ok(())
}
