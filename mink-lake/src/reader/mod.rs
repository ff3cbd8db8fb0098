//! Planning the lake's reads and loading its deletes: a bucket's split of a snapshot
//! ([`plan_split`], [`plan_bucket_splits`]), the positions each data file's
//! position-delete files name ([`split_position_deletes`]), the keys of equality deletes
//! ([`EqualityFilter`]), and the row selections both become ([`rows_per_group`]).
//!
//! Union and Lake reads scan the files with DataFusion's Parquet scan (`mink-scan`),
//! handed these selections. This module keeps one raw reader of its own,
//! [`read_split_positioned`], for what a scan cannot give: the position in its data file
//! of every live row, which the tiering service's lake index (key -> file, row) and the
//! incremental read between snapshots (`table_changes`) need. It streams each file from
//! the object store with the projection pushed into the Parquet reader; nothing beyond
//! one row group's batches, and the split's delete files, is in memory.
//!
//! # Deletes
//!
//! Iceberg's planning attaches to each data file the delete files that apply to it (by
//! partition and sequence number); [`plan_split`] keeps them in [`LakeFile::deletes`].
//! [`read_split`] applies them exactly, in time linear in the rows read:
//!
//! - **Position deletes** (`file_path`, `pos`) become a Parquet row selection: the deleted
//!   positions of the data file, over the row groups its statistics keep, turn into
//!   select/skip runs, so deleted rows are never decoded. Positions the read does not
//!   cover (a pruned row group, past the end of the file) are ignored.
//! - **Equality deletes** (rows of the equality columns) become a hash set of keys
//!   encoded with arrow-row; the data file is read with the equality columns added to
//!   the projection, rows whose key is in the set are filtered out, then the batch is
//!   normalized to the requested schema (which drops the added columns). Nulls are equal
//!   to nulls, as Iceberg specifies.
//!
//! Each delete file is read once per read of a split, however many data files it covers.
//!
//! iceberg's own reader turns equality deletes into a predicate tree (`NOT (k = v1) AND
//! NOT (k = v2) ...`) evaluated on every row: O(rows x deleted keys), and deep trees for
//! the thousands of keys a tiering round of a primary-key table deletes. A hash probe
//! per row and a row selection keep the read O(rows).
//!
//! # Positions
//!
//! [`read_split_positioned`] also returns the position in its data file of every live
//! row (from the row selection and the row groups read), which is what a key -> (file,
//! row) index of the lake needs to write position deletes. [`read_split`] is the same
//! stream without them.

mod delete_files;
mod foreign_files;
mod positions;
mod selection;
mod wire;

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch, UInt64Array};
use arrow::compute::{filter, filter_record_batch};
use arrow::datatypes::{SchemaRef, UInt64Type};
use futures::future;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::{DataContentType, Struct, TableMetadata};
use iceberg::table::Table;
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::ParquetObjectReader;
use parquet::errors::ParquetError;

use self::delete_files::SplitDeletes;
pub(crate) use self::delete_files::load_positions;
use self::foreign_files::BucketPartitions;
pub use self::foreign_files::bucket_of_partition;
pub use self::positions::{EqualityFilter, PositionDeleteCache, split_position_deletes};
pub(crate) use self::selection::pick_rows;
pub use self::selection::{GroupRows, rows_per_group};
use self::selection::{LivePositions, row_group_spans, select_rows};
use crate::error::{LakeError, Result};
use crate::layout::bucket_dir;
use crate::predicate::{Pruning, to_predicate};
use crate::storage::LakeStorage;

/// One data file of a split, with the delete files that apply to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeFile {
    /// Its location.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its row count, when the manifest says.
    pub record_count: Option<u64>,
    /// Its partition values (in the order of the partition spec's fields).
    pub partition: Option<Struct>,
    /// The delete files that apply to it.
    pub deletes: Vec<LakeDeleteFile>,
    /// Positions of rows a union read's log range replaces (ascending): the union read's
    /// scan leaves them out with the positions of its delete files
    /// ([`split_position_deletes`]). Only a union read's split has any
    /// (`UnionPlan::replaced_rows_located`).
    pub replaced_rows: Vec<u64>,
}

/// A delete file that applies to a data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeDeleteFile {
    /// Its location.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// What it deletes.
    pub kind: DeleteKind,
}

/// What a delete file deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteKind {
    /// Rows by position: the file holds (`file_path`, `pos`) pairs.
    Positions,
    /// Rows by value: the file holds values of `columns`; a data row whose values of
    /// those columns equal one of the file's rows is gone.
    Equality {
        /// The equality columns, by name in the planned snapshot's schema.
        columns: Vec<String>,
    },
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
    /// Rows in the split before deletes, as far as the manifests say.
    pub fn record_count(&self) -> u64 {
        self.files.iter().filter_map(|f| f.record_count).sum()
    }

    /// Whether an equality-delete file applies to any of the split's data files (mink
    /// writes none; other engines may).
    pub fn has_equality_deletes(&self) -> bool {
        self.files
            .iter()
            .flat_map(|f| &f.deletes)
            .any(|d| matches!(d.kind, DeleteKind::Equality { .. }))
    }

    /// How many distinct delete files apply to the split's data files.
    pub fn delete_file_count(&self) -> usize {
        let mut paths: Vec<&str> = self
            .files
            .iter()
            .flat_map(|f| f.deletes.iter().map(|d| d.path.as_str()))
            .collect();
        paths.sort_unstable();
        paths.dedup();
        paths.len()
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

/// Plans a split of `snapshot_id`; with `pruning`, files that cannot hold a matching row
/// (by partition values and column statistics) are left out. Each data file comes with
/// the delete files that apply to it. A bucket's split is [`plan_bucket_splits`]'s for
/// that one bucket.
///
/// # Errors
/// [`LakeError::SnapshotNotFound`] when the table has no such snapshot;
/// [`LakeError::Layout`] when a delete file is not one mink can apply (an equality
/// delete naming a field the snapshot's schema lacks).
pub async fn plan_split(
    table: &Table,
    snapshot_id: i64,
    scope: &SplitScope,
    pruning: Option<Pruning<'_>>,
) -> Result<LakeSplit> {
    let metadata = table.metadata();
    let location = metadata.location();
    let (prefix, partition) = match scope {
        SplitScope::Table => (format!("{location}/"), None),
        SplitScope::Partition(partition) => (
            format!("{location}/data/{partition}/"),
            Some(partition.as_str()),
        ),
        SplitScope::Bucket(bucket) => {
            let mut splits =
                plan_bucket_splits(table, snapshot_id, std::slice::from_ref(bucket), pruning)
                    .await?;
            return Ok(splits.pop().unwrap_or_default());
        }
    };
    let tasks = plan_tasks(table, snapshot_id, pruning).await?;
    let table_name = table.identifier().to_string();
    let files = tasks
        .into_iter()
        .filter(|task| {
            task.data_file_path.starts_with(&prefix)
                || partition.is_some_and(|partition| foreign_in(metadata, task, partition))
        })
        .map(|task| lake_file(task, &table_name))
        .collect::<Result<_>>()?;
    Ok(LakeSplit {
        snapshot_id: Some(snapshot_id),
        files,
    })
}

/// Whether `task` is another engine's file (inside the table's location) whose partition
/// values name the mink partition `partition` ([`bucket_of_partition`]).
fn foreign_in(metadata: &TableMetadata, task: &FileScanTask, partition: &str) -> bool {
    task.data_file_path
        .starts_with(&format!("{}/", metadata.location()))
        && task
            .partition
            .as_ref()
            .and_then(|values| bucket_of_partition(metadata, values))
            .is_some_and(|(name, _)| name.as_deref() == Some(partition))
}

/// Plans the split of each of `buckets` in `snapshot_id` from one planning of the
/// snapshot's files (one read of its manifests, however many buckets): the split at `i`
/// is `buckets[i]`'s, holding the files under that bucket's directory
/// ([`bucket_dir`]) and the files other engines wrote elsewhere whose partition is the
/// bucket's ([`bucket_of_partition`]); files of no listed bucket are left out.
/// `pruning` prunes as in [`plan_split`].
///
/// # Errors
/// As [`plan_split`].
pub async fn plan_bucket_splits(
    table: &Table,
    snapshot_id: i64,
    buckets: &[BucketId],
    pruning: Option<Pruning<'_>>,
) -> Result<Vec<LakeSplit>> {
    let tasks = plan_tasks(table, snapshot_id, pruning).await?;
    let dirs = BucketDirs::new(table.metadata().location(), buckets);
    let partitions = BucketPartitions::new(table.metadata(), buckets);
    let table_name = table.identifier().to_string();
    let mut splits = vec![
        LakeSplit {
            snapshot_id: Some(snapshot_id),
            files: Vec::new(),
        };
        buckets.len()
    ];
    for task in tasks {
        let mut owners: Vec<usize> = dirs.owners(&task.data_file_path).collect();
        if owners.is_empty() {
            owners = partitions.owners(task.partition.as_ref());
        }
        let Some((&last, others)) = owners.split_last() else {
            continue;
        };
        let file = lake_file(task, &table_name)?;
        for &owner in others {
            splits[owner].files.push(file.clone());
        }
        splits[last].files.push(file);
    }
    // Iceberg plans manifests concurrently, so its order of files (and of each file's
    // deletes) varies from one planning to the next: by path, a split is the same every
    // time. Neither order means anything to a read.
    for split in &mut splits {
        split.files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        for file in &mut split.files {
            file.deletes.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        }
    }
    Ok(splits)
}

/// Every file task of `snapshot_id` that `pruning` keeps, with its deletes.
///
/// The predicate is made for the snapshot's own schema, which Iceberg binds it to: a
/// table's schema now may have columns the snapshot predates ([`to_predicate`]).
///
/// # Errors
/// [`LakeError::SnapshotNotFound`] when the table has no such snapshot.
pub(crate) async fn plan_tasks(
    table: &Table,
    snapshot_id: i64,
    pruning: Option<Pruning<'_>>,
) -> Result<Vec<FileScanTask>> {
    let metadata = table.metadata();
    let Some(snapshot) = metadata.snapshot_by_id(snapshot_id) else {
        return Err(LakeError::SnapshotNotFound {
            table: table.identifier().to_string(),
            snapshot_id,
        });
    };
    let mut scan = table.scan().snapshot_id(snapshot_id).select_all();
    if let Some(pruning) = pruning {
        let schema = snapshot.schema(metadata)?;
        if let Some(predicate) = to_predicate(pruning.filters, pruning.table_schema, &schema) {
            scan = scan.with_filter(predicate);
        }
    }
    let scan = scan.build()?;
    Ok(scan.plan_files().await?.try_collect().await?)
}

/// The directories of some buckets' files, `<location>/<bucket_dir>/`: a file belongs to
/// a bucket when its path starts with the bucket's directory.
#[derive(Debug)]
struct BucketDirs {
    /// Directory (with its trailing `/`) -> the indexes of the buckets it is the
    /// directory of (one, unless a bucket is listed twice).
    dirs: HashMap<String, Vec<usize>>,
}

impl BucketDirs {
    fn new(location: &str, buckets: &[BucketId]) -> Self {
        let mut dirs: HashMap<String, Vec<usize>> = HashMap::new();
        for (index, bucket) in buckets.iter().enumerate() {
            dirs.entry(format!("{location}/{}/", bucket_dir(bucket)))
                .or_default()
                .push(index);
        }
        Self { dirs }
    }

    /// The indexes of the buckets whose directory `path` starts with. A directory ends
    /// with `/`, so it is a prefix of `path` exactly when it is `path` up to one of its
    /// `/`: each of those is looked up, whatever the number of buckets.
    fn owners<'a>(&'a self, path: &'a str) -> impl Iterator<Item = usize> + 'a {
        path.match_indices('/')
            .filter_map(|(at, _)| self.dirs.get(&path[..=at]))
            .flatten()
            .copied()
    }
}

/// A planned task as a split's file; equality ids are resolved through the task's
/// schema (the planned snapshot's).
fn lake_file(task: FileScanTask, table: &str) -> Result<LakeFile> {
    let deletes = task
        .deletes
        .into_iter()
        .map(|delete| lake_delete_file(&task.schema, delete, table))
        .collect::<Result<_>>()?;
    Ok(LakeFile {
        path: task.data_file_path,
        size: task.file_size_in_bytes,
        record_count: task.record_count,
        partition: task.partition,
        deletes,
        replaced_rows: Vec::new(),
    })
}

fn lake_delete_file(
    schema: &iceberg::spec::Schema,
    delete: FileScanTaskDeleteFile,
    table: &str,
) -> Result<LakeDeleteFile> {
    let kind = match delete.file_type {
        DataContentType::PositionDeletes => DeleteKind::Positions,
        DataContentType::EqualityDeletes => DeleteKind::Equality {
            columns: equality_columns(
                schema,
                &delete.equality_ids.unwrap_or_default(),
                &delete.file_path,
                table,
            )?,
        },
        DataContentType::Data => {
            return Err(LakeError::layout(
                table,
                format!("data file {} planned as a delete file", delete.file_path),
            ));
        }
    };
    Ok(LakeDeleteFile {
        path: delete.file_path,
        size: delete.file_size_in_bytes,
        kind,
    })
}

/// The names in `schema` of the equality field `ids` of the equality-delete file `path`.
///
/// # Errors
/// [`LakeError::Layout`] when there are none or `schema` lacks one.
pub(crate) fn equality_columns(
    schema: &iceberg::spec::Schema,
    ids: &[i32],
    path: &str,
    table: &str,
) -> Result<Vec<String>> {
    if ids.is_empty() {
        return Err(LakeError::layout(
            table,
            format!("equality-delete file {path} names no equality field"),
        ));
    }
    ids.iter()
        .map(|&id| match schema.field_by_id(id) {
            Some(field) => Ok(field.name.clone()),
            None => Err(LakeError::layout(
                table,
                format!(
                    "equality-delete file {path} names field id {id}, which the snapshot's \
                     schema lacks"
                ),
            )),
        })
        .collect()
}

/// Live rows of a data file, with the position in the file of each.
#[derive(Debug, Clone)]
pub struct PositionedBatch {
    /// The data file's location ([`LakeFile::path`]).
    pub file: Arc<str>,
    /// The position in the data file of each row of `batch` (0-based, ascending).
    pub positions: UInt64Array,
    /// The rows, in the requested schema.
    pub batch: RecordBatch,
}

/// Streams a split's live rows in `schema` (columns by name: a column a file lacks, added
/// to the table after the file was written, reads as null; columns not in `schema` are
/// not returned). Deleted rows are left out (see the [module docs](crate::reader)).
///
/// Nothing is read before the stream is polled.
pub fn read_split(
    storage: &LakeStorage,
    split: LakeSplit,
    schema: SchemaRef,
) -> BoxStream<'static, Result<RecordBatch>> {
    read_split_positioned(storage, split, schema)
        .map_ok(|positioned| positioned.batch)
        .boxed()
}

/// [`read_split`], each batch with the data file it comes from and the positions of its
/// rows in that file. A batch never spans two files; empty batches are not returned.
pub fn read_split_positioned(
    storage: &LakeStorage,
    split: LakeSplit,
    schema: SchemaRef,
) -> BoxStream<'static, Result<PositionedBatch>> {
    let deletes = Arc::new(SplitDeletes::new(storage.clone(), &split.files));
    let storage = storage.clone();
    stream::iter(split.files)
        .then(move |file| {
            let storage = storage.clone();
            let schema = Arc::clone(&schema);
            let deletes = Arc::clone(&deletes);
            async move { open_file(&storage, file, schema, &deletes).await }
        })
        .try_flatten()
        .boxed()
}

/// Opens a Parquet file of the lake; its size, when known, saves a request.
pub(crate) async fn open_parquet(
    storage: &LakeStorage,
    path: &str,
    size: Option<u64>,
) -> Result<ParquetRecordBatchStreamBuilder<ParquetObjectReader>> {
    let mut reader = ParquetObjectReader::new(storage.store()?, storage.path(path)?);
    if let Some(size) = size {
        reader = reader.with_file_size(size);
    }
    Ok(ParquetRecordBatchStreamBuilder::new(reader).await?)
}

/// Opens one data file of a split: loads its deletes, and streams its live rows with
/// their positions.
async fn open_file(
    storage: &LakeStorage,
    file: LakeFile,
    schema: SchemaRef,
    deletes: &SplitDeletes,
) -> Result<BoxStream<'static, Result<PositionedBatch>>> {
    let builder = open_parquet(storage, &file.path, Some(file.size)).await?;
    let metadata = Arc::clone(builder.metadata());
    let kept: Vec<usize> = (0..metadata.num_row_groups()).collect();
    let file_deletes = deletes.for_file(&file).await?;
    let row_counts: Vec<u64> = metadata
        .row_groups()
        .iter()
        .map(|group| u64::try_from(group.num_rows()).unwrap_or(0))
        .collect();
    let selection = select_rows(
        &row_group_spans(&row_counts, &kept),
        &file_deletes.positions,
    );
    if selection.row_count() == 0 {
        return Ok(stream::empty().boxed());
    }
    let equality_columns: Vec<&str> = file_deletes.equality_columns().collect();
    let mask = columns_mask(&builder, |name| {
        schema.field_with_name(name).is_ok() || equality_columns.contains(&name)
    });
    let mut builder = builder
        .with_row_groups(kept)
        .with_projection(mask)
        .with_batch_size(READ_BATCH_ROWS);
    if let Some(row_selection) = selection.selection {
        builder = builder.with_row_selection(row_selection);
    }
    let batches = builder.build()?;
    let path: Arc<str> = file.path.into();
    let mut positions = LivePositions::new(selection.live);
    Ok(batches
        .map(move |batch| {
            let batch = batch?;
            let batch_positions = positions.take(batch.num_rows()).ok_or_else(|| {
                ParquetError::General(format!(
                    "{path}: the reader returned more rows than were selected"
                ))
            })?;
            let (batch, batch_positions) = match file_deletes.equality_live(&batch)? {
                Some(live) => (
                    filter_record_batch(&batch, &live)?,
                    filter(&batch_positions, &live)?
                        .as_primitive::<UInt64Type>()
                        .clone(),
                ),
                None => (batch, batch_positions),
            };
            Ok(PositionedBatch {
                file: Arc::clone(&path),
                positions: batch_positions,
                batch: normalize_batch(&batch, &schema)?,
            })
        })
        .try_filter(|positioned| future::ready(positioned.batch.num_rows() > 0))
        .boxed())
}

/// The projection of a file's columns whose names `wanted` accepts.
pub(crate) fn columns_mask(
    builder: &ParquetRecordBatchStreamBuilder<ParquetObjectReader>,
    wanted: impl Fn(&str) -> bool,
) -> ProjectionMask {
    let indexes = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| wanted(f.name()))
        .map(|(i, _)| i);
    ProjectionMask::roots(builder.parquet_schema(), indexes)
}

/// Rows per batch read from a lake file: Parquet's default of 1024 makes many small
/// messages downstream (Flight answers, merges).
pub(crate) const READ_BATCH_ROWS: usize = 8192;

#[cfg(test)]
mod tests;
