//! Reading the lake: a bucket's split of a snapshot, streamed from Parquet.
//!
//! The read path is mink's own (iceberg's scan is single-partition and holds whole files
//! per task): plan the snapshot's files with Iceberg, keep the bucket's (they share its
//! directory, see [`crate::layout`]), and stream each file from the object store with the
//! projection pushed into the Parquet reader. Nothing beyond one row group's batches is in
//! memory. The node's Union and Lake tickets and the SQL engine share it.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use iceberg::expr::Predicate;
use iceberg::table::Table;
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::ParquetObjectReader;

use crate::error::{LakeError, Result};
use crate::layout::bucket_dir;
use crate::storage::LakeStorage;

/// One data file of a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeFile {
    /// Its location.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its row count, when the manifest says.
    pub record_count: Option<u64>,
}

/// The lake files a read covers, in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LakeSplit {
    /// The snapshot planned on.
    pub snapshot_id: Option<i64>,
    /// Its data files.
    pub files: Vec<LakeFile>,
}

impl LakeSplit {
    /// Rows in the split, as far as the manifests say.
    pub fn record_count(&self) -> u64 {
        self.files.iter().filter_map(|f| f.record_count).sum()
    }
}

/// Which files of a snapshot a split takes.
#[derive(Debug, Clone)]
pub enum SplitScope {
    /// Every file.
    Table,
    /// The files of one partition of a partitioned table.
    Partition(String),
    /// The files of one bucket.
    Bucket(BucketId),
}

/// Plans a split of `snapshot_id`; with a predicate, files that cannot hold a matching row
/// (by partition values and column statistics) are left out.
///
/// # Errors
/// [`LakeError::SnapshotNotFound`] when the table has no such snapshot.
pub async fn plan_split(
    table: &Table,
    snapshot_id: i64,
    scope: &SplitScope,
    predicate: Option<Predicate>,
) -> Result<LakeSplit> {
    if table.metadata().snapshot_by_id(snapshot_id).is_none() {
        return Err(LakeError::SnapshotNotFound {
            table: table.identifier().to_string(),
            snapshot_id,
        });
    }
    let location = table.metadata().location();
    let prefix = match scope {
        SplitScope::Table => format!("{location}/"),
        SplitScope::Partition(partition) => format!("{location}/data/{partition}/"),
        SplitScope::Bucket(bucket) => format!("{location}/{}/", bucket_dir(bucket)),
    };
    let mut scan = table.scan().snapshot_id(snapshot_id).select_all();
    if let Some(predicate) = predicate {
        scan = scan.with_filter(predicate);
    }
    let scan = scan.build()?;
    let tasks: Vec<_> = scan.plan_files().await?.try_collect().await?;
    let files = tasks
        .into_iter()
        .filter(|task| task.data_file_path.starts_with(&prefix))
        .map(|task| LakeFile {
            path: task.data_file_path,
            size: task.file_size_in_bytes,
            record_count: task.record_count,
        })
        .collect();
    Ok(LakeSplit {
        snapshot_id: Some(snapshot_id),
        files,
    })
}

/// Streams a split's rows in `schema` (columns by name: a column a file lacks, added to
/// the table after the file was written, reads as null; columns not in `schema` are not
/// read at all).
pub fn read_split(
    storage: &LakeStorage,
    split: LakeSplit,
    schema: SchemaRef,
) -> BoxStream<'static, Result<RecordBatch>> {
    let storage = storage.clone();
    stream::iter(split.files)
        .then(move |file| {
            let storage = storage.clone();
            let schema = Arc::clone(&schema);
            async move { open_file(&storage, &file, schema).await }
        })
        .try_flatten()
        .boxed()
}

async fn open_file(
    storage: &LakeStorage,
    file: &LakeFile,
    schema: SchemaRef,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let reader = ParquetObjectReader::new(storage.store()?, storage.path(&file.path)?)
        .with_file_size(file.size);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let file_fields = builder.schema().fields().clone();
    let wanted: Vec<usize> = file_fields
        .iter()
        .enumerate()
        .filter(|(_, f)| schema.field_with_name(f.name()).is_ok())
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let batches = builder.with_projection(mask).build()?;
    Ok(batches
        .map(move |batch| Ok(normalize_batch(&batch?, &schema)?))
        .boxed())
}
