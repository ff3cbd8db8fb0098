//! The lake index of a primary-key table: for every key in the lake, where its live row is.
//!
//! A tiering round of a primary-key table writes the newest version of each changed key
//! and must delete the lake row that version replaces. Iceberg position deletes name that
//! row by (data file, position); the index finds it without reading the lake:
//!
//! ```text
//!   bucket 3:  key k17 ──► (file 0, row 41)     files[0] = data/bucket=3/0192…a.parquet
//!              key k90 ──► (file 1, row 2)      files[1] = data/bucket=3/0193…f.parquet
//! ```
//!
//! The index lives in memory under the tiering lock and describes exactly one lake
//! snapshot. It is built by reading the key columns of that snapshot (deletes applied)
//! the first time a round needs it, moved forward by each round and compaction that
//! commits, and thrown away when a commit fails or the lake moved on without it (a crash,
//! another engine's commit). Since it is only ever rebuilt from a committed snapshot, it
//! cannot disagree with the lake.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::Schema;
use arrow::row::Rows;
use futures::TryStreamExt;
use mink_core::key::{KeyCodec, MapKey};
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use mink_lake::layout::bucket_dir;
use mink_lake::reader::{
    LakeFile, LakeSplit, SplitScope, bucket_of_partition, plan_split, read_split_positioned,
};
use mink_lake::{DataFile, Struct};
use mink_lake::{LakeTable, storage::LakeStorage};

use crate::Node;
use crate::error::{NodeError, Result};

/// The lake indexes of primary-key tables by table id, kept under the tiering lock.
pub(crate) type LakeIndexes = HashMap<u64, LakeIndex>;

/// The live lake rows of each bucket's keys (encoded by the table's key codec), by data
/// file ([`BucketIndex::locate`]), from the lake index of table `table_id`
/// when it describes `snapshot_id`. `None` when no such index is at hand without
/// waiting: a round or a compaction holds it, none was built since the node started, or
/// it cannot locate every row of a key.
pub(crate) fn locate_lake_rows(
    node: &Node,
    table_id: u64,
    snapshot_id: i64,
    keys: &[(&BucketId, &[Rows])],
) -> Option<Vec<LocatedRows>> {
    let indexes = node.tiering.try_lock().ok()?;
    index_at(&indexes, table_id, snapshot_id)?.locate(keys)
}

/// Whether [`locate_lake_rows`] would find the lake index of table `table_id` at
/// `snapshot_id` now: a caller asks before it reads the keys to locate.
pub(crate) fn has_lake_index(node: &Node, table_id: u64, snapshot_id: i64) -> bool {
    let indexes = node.tiering.try_lock();
    indexes.is_ok_and(|indexes| index_at(&indexes, table_id, snapshot_id).is_some())
}

/// The lake index of table `table_id`, when it describes `snapshot_id`.
fn index_at(indexes: &LakeIndexes, table_id: u64, snapshot_id: i64) -> Option<&LakeIndex> {
    indexes
        .get(&table_id)
        .filter(|index| index.snapshot_id == Some(snapshot_id))
}

/// The lake index of one table, as of one snapshot.
#[derive(Debug, Default)]
pub(crate) struct LakeIndex {
    /// The snapshot the index describes (`None`: an empty lake).
    pub(crate) snapshot_id: Option<i64>,
    buckets: HashMap<BucketId, BucketIndex>,
}

/// One bucket's files and where each of its live keys is.
#[derive(Debug, Default)]
pub(crate) struct BucketIndex {
    files: Vec<IndexedFile>,
    rows: ahash::HashMap<MapKey, RowLocation>,
    /// The lake held a key twice (only another engine's writes could do that): the
    /// index then knows one of its rows, and cannot locate every row of a key.
    duplicate_keys: bool,
}

/// A data file of a bucket.
#[derive(Debug, Clone)]
pub(crate) struct IndexedFile {
    /// Its location.
    pub(crate) path: Arc<str>,
    /// Its lake partition (every file of a bucket has the same).
    pub(crate) partition: Struct,
    /// Rows written to it.
    pub(crate) rows: u64,
    /// Rows of it still live (not position-deleted).
    pub(crate) live: u64,
}

/// The lake rows a bucket's keys replace: positions, ascending, by data file.
pub(crate) type LocatedRows = HashMap<Arc<str>, Vec<u64>>;

/// The fewest keys [`LakeIndex::locate`] spreads over threads.
const PARALLEL_LOCATE_KEYS: usize = 16 * 1024;

/// Where a live lake row is: a file of the bucket's list, and the row's position in it.
#[derive(Debug, Clone, Copy)]
struct RowLocation {
    file: u32,
    row: u32,
}

impl LakeIndex {
    /// The index of `table`'s lake at `snapshot_id`, read from the lake: one scan plan,
    /// then the key columns of every live row, the buckets in parallel.
    pub(crate) async fn build(
        storage: &LakeStorage,
        lake_table: &LakeTable,
        table: &Arc<TableDescriptor>,
        snapshot_id: Option<i64>,
    ) -> Result<Self> {
        let mut index = Self {
            snapshot_id,
            buckets: HashMap::new(),
        };
        let Some(snapshot_id) = snapshot_id else {
            return Ok(index);
        };
        let split = plan_split(lake_table, snapshot_id, &SplitScope::Table, None).await?;
        let mut builds = tokio::task::JoinSet::new();
        for (bucket, split) in split_by_bucket_dir(lake_table.metadata().location(), split, table)?
        {
            let (storage, table) = (storage.clone(), Arc::clone(table));
            builds.spawn(async move {
                let bucket_index = BucketIndex::build(&storage, &table, split).await?;
                Ok::<_, NodeError>((bucket, bucket_index))
            });
        }
        while let Some(built) = builds.join_next().await {
            let (bucket, bucket_index) = built
                .map_err(|e| NodeError::Corrupt(format!("building a lake index failed: {e}")))??;
            index.buckets.insert(bucket, bucket_index);
        }
        Ok(index)
    }

    /// The live lake rows of each bucket's keys, by data file ([`BucketIndex::locate`]);
    /// `None` when a bucket's cannot all be told. From [`PARALLEL_LOCATE_KEYS`] keys on,
    /// the buckets are spread over a thread per core.
    pub(crate) fn locate(&self, keys: &[(&BucketId, &[Rows])]) -> Option<Vec<LocatedRows>> {
        let total: usize = keys
            .iter()
            .flat_map(|(_, keys)| keys.iter())
            .map(Rows::num_rows)
            .sum();
        let threads = match total < PARALLEL_LOCATE_KEYS {
            true => 1,
            false => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        };
        self.locate_on(keys, threads)
    }

    /// [`LakeIndex::locate`] on `threads` threads (1: on this one). Random probes into
    /// maps of millions of keys wait on memory, and the other cores would idle; a thread
    /// that panicked locates nothing (the read then probes).
    fn locate_on(&self, keys: &[(&BucketId, &[Rows])], threads: usize) -> Option<Vec<LocatedRows>> {
        let locate = |(bucket, keys): &(&BucketId, &[Rows])| {
            let rows = keys.iter().flat_map(|keys| keys.iter());
            self.bucket(bucket)?.locate(rows.map(|key| key.data()))
        };
        if threads <= 1 || keys.len() < 2 {
            return keys.iter().map(locate).collect();
        }
        let per_thread = keys.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let parts: Vec<_> = keys
                .chunks(per_thread)
                .map(|part| {
                    scope.spawn(move || part.iter().map(locate).collect::<Option<Vec<_>>>())
                })
                .collect();
            let mut located = Vec::with_capacity(keys.len());
            for part in parts {
                located.extend(part.join().ok()??);
            }
            Some(located)
        })
    }

    /// The index of a bucket, if the lake has any of its rows.
    pub(crate) fn bucket(&self, bucket: &BucketId) -> Option<&BucketIndex> {
        self.buckets.get(bucket)
    }

    /// The index of a bucket (empty when the lake has none of its rows yet).
    pub(crate) fn bucket_mut(&mut self, bucket: &BucketId) -> &mut BucketIndex {
        self.buckets.entry(bucket.clone()).or_default()
    }

    /// The buckets due for compaction: many files, or many deleted rows.
    pub(crate) fn buckets_to_compact(&self) -> Vec<BucketId> {
        self.buckets
            .iter()
            .filter(|(_, index)| index.needs_compaction())
            .map(|(bucket, _)| bucket.clone())
            .collect()
    }
}

/// A bucket compacts when it has more files than this...
pub(super) const MAX_FILES: usize = 8;
/// ...or when at least this share of its rows is deleted.
const MAX_DELETED_SHARE: f64 = 0.2;

impl BucketIndex {
    /// The index of one bucket's split: the key columns of every live row.
    async fn build(
        storage: &LakeStorage,
        table: &TableDescriptor,
        split: LakeSplit,
    ) -> Result<Self> {
        let codec = KeyCodec::new(table)?;
        let mut index = Self::default();
        let mut file_ids = HashMap::new();
        for file in &split.files {
            file_ids.insert(file.path.clone(), index.files.len() as u32);
            index.files.push(IndexedFile {
                path: file.path.as_str().into(),
                partition: file.partition.clone().unwrap_or_else(Struct::empty),
                rows: file.record_count.unwrap_or(0),
                live: 0,
            });
        }
        let key_schema = key_schema(table, &codec)?;
        let mut batches = read_split_positioned(storage, split, key_schema);
        while let Some(positioned) = batches.try_next().await? {
            let file = *file_ids.get(&*positioned.file).ok_or_else(|| {
                NodeError::Corrupt(format!("lake rows of unplanned file {}", positioned.file))
            })?;
            let keys = codec.encode(&positioned.batch)?;
            for (key, row) in keys.iter().zip(positioned.positions.values().iter()) {
                index.insert(key.as_ref(), file, row_number(*row)?);
            }
        }
        Ok(index)
    }

    /// The live lake rows of `keys` (encoded by the table's [`KeyCodec`]) by data file,
    /// positions ascending, each once; keys the lake lacks have none. `None` when the
    /// index cannot tell every row of a key (the lake holds a key twice).
    pub(crate) fn locate<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Option<LocatedRows> {
        if self.duplicate_keys {
            return None;
        }
        let mut by_file: HashMap<u32, Vec<u64>> = HashMap::new();
        for location in keys.into_iter().filter_map(|key| self.rows.get(key)) {
            by_file
                .entry(location.file)
                .or_default()
                .push(u64::from(location.row));
        }
        let located = by_file.into_iter().map(|(file, mut rows)| {
            rows.sort_unstable();
            rows.dedup();
            (Arc::clone(&self.files[file as usize].path), rows)
        });
        Some(located.collect())
    }

    /// Forgets a key; returns the lake row to delete for it, `(data file, position)`.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<(Arc<str>, i64)> {
        let location = self.rows.remove(key)?;
        let file = &mut self.files[location.file as usize];
        file.live -= 1;
        Some((Arc::clone(&file.path), i64::from(location.row)))
    }

    /// Adds the files a round or compaction wrote, with the keys of their rows in the
    /// order they were written (files in order, then rows).
    pub(crate) fn add_files(
        &mut self,
        files: &[DataFile],
        keys: impl IntoIterator<Item = Box<[u8]>>,
    ) -> Result<()> {
        let files = files.iter().map(|file| IndexedFile {
            path: file.file_path().into(),
            partition: file.partition().clone(),
            rows: file.record_count(),
            live: 0,
        });
        self.add(files.collect(), keys)
    }

    /// [`Self::add_files`], of files described by their path, partition and row count.
    pub(super) fn add(
        &mut self,
        files: Vec<IndexedFile>,
        keys: impl IntoIterator<Item = Box<[u8]>>,
    ) -> Result<()> {
        let first = self.files.len() as u32;
        self.files.extend(files);
        let mut keys = keys.into_iter();
        for file in first..self.files.len() as u32 {
            for row in 0..self.files[file as usize].rows {
                let key = keys.next().ok_or_else(|| {
                    NodeError::Corrupt("a lake file holds more rows than were written".into())
                })?;
                self.insert(&key, file, row_number(row)?);
            }
        }
        if keys.next().is_some() {
            return Err(NodeError::Corrupt(
                "rows were written that no lake file holds".into(),
            ));
        }
        Ok(())
    }

    /// The bucket's lake partition, known once it has a file.
    pub(crate) fn partition(&self) -> Option<&Struct> {
        self.files.first().map(|f| &f.partition)
    }

    /// Every indexed key and where its row is, `(file path, position)`.
    #[cfg(test)]
    pub(super) fn locations(&self) -> std::collections::BTreeMap<Box<[u8]>, (Arc<str>, u32)> {
        self.rows
            .iter()
            .map(|(key, at)| {
                let path = Arc::clone(&self.files[at.file as usize].path);
                (key.as_slice().into(), (path, at.row))
            })
            .collect()
    }

    /// The bucket's files, in the order they were added.
    #[cfg(test)]
    pub(super) fn files(&self) -> &[IndexedFile] {
        &self.files
    }

    fn insert(&mut self, key: &[u8], file: u32, row: u32) {
        self.files[file as usize].live += 1;
        let location = RowLocation { file, row };
        if let Some(old) = self.rows.insert(MapKey::from_slice(key), location) {
            // Only a lake already holding a key twice gets here: keep the counts honest.
            self.files[old.file as usize].live -= 1;
            self.duplicate_keys = true;
        }
    }

    fn needs_compaction(&self) -> bool {
        let rows: u64 = self.files.iter().map(|f| f.rows).sum();
        let live: u64 = self.files.iter().map(|f| f.live).sum();
        let dead_files = self.files.iter().filter(|f| f.live == 0).count();
        self.files.len() - dead_files > MAX_FILES
            || (rows > 0 && rows.saturating_sub(live) as f64 >= MAX_DELETED_SHARE * rows as f64)
    }
}

fn row_number(row: u64) -> Result<u32> {
    u32::try_from(row)
        .map_err(|_| NodeError::Corrupt(format!("lake file row {row} beyond the index's range")))
}

/// The key columns of a table, in the table's types.
fn key_schema(table: &TableDescriptor, codec: &KeyCodec) -> Result<Arc<Schema>> {
    let indices = codec
        .columns()
        .iter()
        .map(|c| table.schema().index_of(c))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(table.schema().project(&indices)?))
}

/// A whole-table split grouped by bucket, by the directory of each file.
///
/// # Errors
/// [`NodeError::Corrupt`] for a data file outside every bucket directory (written by
/// another engine): mink could not keep its rows' deletes, so it refuses to go on.
pub(super) fn split_by_bucket_dir(
    location: &str,
    split: LakeSplit,
    table: &TableDescriptor,
) -> Result<HashMap<BucketId, LakeSplit>> {
    group_by_bucket(split, table, Unplaced::Refused, |file| {
        bucket_of_path(location, table, &file.path)
    })
}

/// A whole-table split grouped by bucket: by the directory of each file and, for a log
/// table, by the partition of a file another engine appended elsewhere
/// ([`bucket_of_partition`]). A log table's file in no bucket (another engine's, of a
/// bucket the table does not have) is left out: no read takes it either.
///
/// # Errors
/// [`NodeError::Corrupt`] for a primary-key table's data file in no bucket directory.
pub(super) fn split_by_bucket(
    lake_table: &LakeTable,
    split: LakeSplit,
    table: &TableDescriptor,
) -> Result<HashMap<BucketId, LakeSplit>> {
    let metadata = lake_table.metadata();
    let unplaced = match table.has_primary_key() {
        true => Unplaced::Refused,
        false => Unplaced::LeftOut,
    };
    group_by_bucket(split, table, unplaced, |file| {
        bucket_of_path(metadata.location(), table, &file.path).or_else(|| {
            let partition = file
                .partition
                .as_ref()
                .filter(|_| !table.has_primary_key())?;
            let (partition, bucket) = bucket_of_partition(metadata, partition)?;
            (bucket < table.bucket_num).then(|| BucketId {
                table: table.path.to_string(),
                partition,
                bucket,
            })
        })
    })
}

/// What [`group_by_bucket`] does with a file in no bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unplaced {
    /// It is an error ([`NodeError::Corrupt`]).
    Refused,
    /// It is left out of every bucket.
    LeftOut,
}

/// `split`'s files grouped by the bucket `bucket_of` finds for each.
fn group_by_bucket(
    split: LakeSplit,
    table: &TableDescriptor,
    unplaced: Unplaced,
    bucket_of: impl Fn(&LakeFile) -> Option<BucketId>,
) -> Result<HashMap<BucketId, LakeSplit>> {
    let mut by_bucket: HashMap<BucketId, LakeSplit> = HashMap::new();
    for file in split.files {
        let bucket = match (bucket_of(&file), unplaced) {
            (Some(bucket), _) => bucket,
            (None, Unplaced::LeftOut) => continue,
            (None, Unplaced::Refused) => {
                return Err(NodeError::Corrupt(format!(
                    "lake file {} of {} is in no bucket of mink's",
                    file.path, table.path
                )));
            }
        };
        by_bucket
            .entry(bucket)
            .or_insert_with(|| LakeSplit {
                snapshot_id: split.snapshot_id,
                files: Vec::new(),
            })
            .files
            .push(file);
    }
    Ok(by_bucket)
}

/// The bucket whose directory holds the file at `path` in the table at `location`.
fn bucket_of_path(location: &str, table: &TableDescriptor, path: &str) -> Option<BucketId> {
    path.rsplit_once('/')
        .and_then(|(dir, _)| dir.strip_prefix(location.trim_end_matches('/')))
        .and_then(|dir| dir.strip_prefix('/'))
        .and_then(|dir| bucket_of_dir(table, dir))
}

/// The bucket whose directory is `dir` (see [`bucket_dir`]).
fn bucket_of_dir(table: &TableDescriptor, dir: &str) -> Option<BucketId> {
    let rest = dir.strip_prefix("data/")?;
    let (partition, bucket) = match rest.rsplit_once('/') {
        Some((partition, bucket)) => (Some(partition.to_string()), bucket),
        None => (None, rest),
    };
    if partition.is_some() == table.partition_keys.is_empty() {
        return None;
    }
    let bucket: u32 = bucket.strip_prefix("bucket=")?.parse().ok()?;
    let id = BucketId {
        table: table.path.to_string(),
        partition,
        bucket,
    };
    (bucket_dir(&id) == dir).then_some(id)
}

#[cfg(test)]
mod tests;
