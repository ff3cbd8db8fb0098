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
mod tests {
    use mink_lake::reader::{LakeFile, LakeSplit};

    use super::*;
    use crate::tiering::tests::{bucket, indexed, key, keys, table, users};

    /// An index of bucket files `(path, ids of its rows in order)`.
    fn index_of(files: &[(&str, &[i64])]) -> BucketIndex {
        let t = table();
        let mut index = BucketIndex::default();
        for (path, ids) in files {
            index
                .add(vec![indexed(path, ids.len() as u64)], keys(&t, ids))
                .unwrap();
        }
        index
    }

    /// `(path, rows, live)` of every file.
    fn counts(index: &BucketIndex) -> Vec<(String, u64, u64)> {
        let files = index.files().iter();
        files
            .map(|f| (f.path.to_string(), f.rows, f.live))
            .collect()
    }

    fn remove(index: &mut BucketIndex, id: i64) -> Option<(String, i64)> {
        let (file, row) = index.remove(&key(&table(), id))?;
        Some((file.to_string(), row))
    }

    fn at(path: &str, row: i64) -> Option<(String, i64)> {
        Some((path.to_string(), row))
    }

    #[test]
    fn every_row_is_found_at_its_file_and_position() {
        let mut index = index_of(&[("f0", &[10, 11, 12]), ("f1", &[20, 21])]);
        assert_eq!(remove(&mut index, 12), at("f0", 2));
        assert_eq!(remove(&mut index, 20), at("f1", 0));
        assert_eq!(remove(&mut index, 10), at("f0", 0));
        assert_eq!(remove(&mut index, 21), at("f1", 1));
        assert_eq!(remove(&mut index, 11), at("f0", 1));
        assert!(index.locations().is_empty());
    }

    #[test]
    fn files_added_together_number_their_rows_file_by_file() {
        let t = table();
        let mut index = BucketIndex::default();
        index
            .add(
                vec![indexed("f0", 2), indexed("f1", 1)],
                keys(&t, &[1, 2, 3]),
            )
            .unwrap();
        assert_eq!(remove(&mut index, 2), at("f0", 1));
        assert_eq!(remove(&mut index, 3), at("f1", 0));
    }

    #[test]
    fn a_removed_key_is_forgotten_and_its_file_loses_a_live_row() {
        let mut index = index_of(&[("f0", &[1, 2])]);
        assert_eq!(remove(&mut index, 1), at("f0", 0));
        assert_eq!(remove(&mut index, 1), None);
        assert_eq!(counts(&index), [("f0".into(), 2, 1)]);
    }

    #[test]
    fn a_key_not_in_the_lake_has_nothing_to_remove() {
        let mut index = index_of(&[("f0", &[1])]);
        assert_eq!(remove(&mut index, 7), None);
        assert_eq!(counts(&index), [("f0".into(), 1, 1)]);
    }

    #[test]
    fn keys_are_located_by_file_in_position_order() {
        let t = table();
        let index = index_of(&[("f0", &[10, 11, 12]), ("f1", &[20, 21])]);
        let wanted = keys(&t, &[21, 12, 99, 10, 12]);
        let located = index.locate(wanted.iter().map(AsRef::as_ref)).unwrap();
        let mut located: Vec<(String, Vec<u64>)> = located
            .into_iter()
            .map(|(path, rows)| (path.to_string(), rows))
            .collect();
        located.sort();
        assert_eq!(
            located,
            [("f0".to_string(), vec![0, 2]), ("f1".to_string(), vec![1])]
        );
    }

    #[test]
    fn buckets_locate_alike_on_one_thread_and_on_several() {
        let t = table();
        let codec = KeyCodec::new(&t).unwrap();
        let mut index = LakeIndex::default();
        let buckets: Vec<BucketId> = (0..3).map(|b| bucket(&t, b)).collect();
        for (b, id) in buckets.iter().enumerate() {
            let ids: Vec<i64> = (0..100).map(|i| i * 3 + b as i64).collect();
            let file = format!("f{b}");
            let added = index
                .bucket_mut(id)
                .add(vec![indexed(&file, 100)], keys(&t, &ids));
            added.unwrap();
        }
        let encoded = |ids: &[i64]| {
            let rows: Vec<(i64, &str)> = ids.iter().map(|id| (*id, "")).collect();
            vec![codec.encode(&users(&t, &rows)).unwrap()]
        };
        // Bucket b holds ids b, b + 3, .., b + 297 in file fb, in that order.
        let wanted = [encoded(&[6, 0, 1000]), encoded(&[4]), encoded(&[299, 2])];
        let asked: Vec<(&BucketId, &[Rows])> = buckets
            .iter()
            .zip(&wanted)
            .map(|(id, rows)| (id, rows.as_slice()))
            .collect();
        let sorted = |located: Vec<LocatedRows>| -> Vec<Vec<(String, Vec<u64>)>> {
            located
                .into_iter()
                .map(|by_file| {
                    let mut files: Vec<_> = by_file
                        .into_iter()
                        .map(|(path, rows)| (path.to_string(), rows))
                        .collect();
                    files.sort();
                    files
                })
                .collect()
        };
        let one = sorted(index.locate_on(&asked, 1).unwrap());
        assert_eq!(
            one,
            [
                vec![("f0".to_string(), vec![0, 2])],
                vec![("f1".to_string(), vec![1])],
                vec![("f2".to_string(), vec![0, 99])],
            ]
        );
        assert_eq!(sorted(index.locate_on(&asked, 2).unwrap()), one);
        assert_eq!(sorted(index.locate_on(&asked, 8).unwrap()), one);
    }

    #[test]
    fn a_lake_holding_a_key_twice_locates_nothing() {
        let t = table();
        let index = index_of(&[("f0", &[1, 2]), ("f1", &[2])]);
        assert!(
            index
                .locate(keys(&t, &[1]).iter().map(AsRef::as_ref))
                .is_none()
        );
    }

    #[test]
    fn a_replaced_key_points_at_its_new_file() {
        // What a round does: remove the changed key, then add the file of its new version.
        let mut index = index_of(&[("f0", &[1, 2])]);
        assert_eq!(remove(&mut index, 1), at("f0", 0));
        index
            .add(vec![indexed("f1", 1)], keys(&table(), &[1]))
            .unwrap();
        assert_eq!(counts(&index), [("f0".into(), 2, 1), ("f1".into(), 1, 1)]);
        assert_eq!(remove(&mut index, 1), at("f1", 0));
        assert_eq!(remove(&mut index, 2), at("f0", 1));
    }

    #[test]
    fn a_key_indexed_twice_keeps_its_last_row_and_honest_live_counts() {
        // Only a lake holding a key twice does this: the later row wins, the earlier one
        // stops counting as live.
        let mut index = index_of(&[("f0", &[1, 2]), ("f1", &[1])]);
        assert_eq!(counts(&index), [("f0".into(), 2, 1), ("f1".into(), 1, 1)]);
        assert_eq!(remove(&mut index, 1), at("f1", 0));
        assert_eq!(counts(&index), [("f0".into(), 2, 1), ("f1".into(), 1, 0)]);
    }

    #[test]
    fn more_rows_than_keys_is_corrupt() {
        let mut index = BucketIndex::default();
        let error = index
            .add(vec![indexed("f0", 3)], keys(&table(), &[1, 2]))
            .unwrap_err();
        assert!(
            matches!(&error, NodeError::Corrupt(m) if m == "a lake file holds more rows than were written"),
            "{error}"
        );
    }

    #[test]
    fn more_keys_than_rows_is_corrupt() {
        let mut index = BucketIndex::default();
        let error = index
            .add(vec![indexed("f0", 1)], keys(&table(), &[1, 2]))
            .unwrap_err();
        assert!(
            matches!(&error, NodeError::Corrupt(m) if m == "rows were written that no lake file holds"),
            "{error}"
        );
    }

    #[test]
    fn the_partition_is_known_once_the_bucket_has_a_file() {
        let mut index = BucketIndex::default();
        assert!(index.partition().is_none());
        index.add(vec![indexed("f0", 0)], Vec::new()).unwrap();
        assert_eq!(index.partition(), Some(&Struct::empty()));
    }

    #[test]
    fn an_index_knows_only_the_buckets_asked_for() {
        let t = table();
        let mut index = LakeIndex::default();
        index
            .bucket_mut(&bucket(&t, 2))
            .add(vec![indexed("f0", 1)], keys(&t, &[1]))
            .unwrap();
        assert_eq!(index.bucket_mut(&bucket(&t, 2)).locations().len(), 1);
        assert!(index.bucket_mut(&bucket(&t, 3)).locations().is_empty());
        assert_eq!(index.buckets.len(), 2);
    }

    fn lake_file(path: &str) -> LakeFile {
        LakeFile {
            path: path.into(),
            size: 100,
            record_count: Some(1),
            partition: None,
            deletes: Vec::new(),
            replaced_rows: Vec::new(),
        }
    }

    fn split_of(paths: &[&str]) -> LakeSplit {
        LakeSplit {
            snapshot_id: Some(7),
            files: paths.iter().map(|p| lake_file(p)).collect(),
        }
    }

    fn partitioned(partition: &str, number: u32) -> BucketId {
        BucketId {
            partition: Some(partition.into()),
            ..bucket(&table(), number)
        }
    }

    #[test]
    fn files_are_grouped_by_their_bucket_directory() {
        /// The file names of `bucket`'s split.
        fn names(by_bucket: &HashMap<BucketId, LakeSplit>, bucket: &BucketId) -> Vec<String> {
            let split = &by_bucket[bucket];
            assert_eq!(split.snapshot_id, Some(7));
            let names = split
                .files
                .iter()
                .map(|f| f.path.rsplit('/').next().unwrap());
            names.map(str::to_string).collect()
        }
        let t = table();
        let split = split_of(&[
            "s3://wh/db/users/data/bucket=0/a.parquet",
            "s3://wh/db/users/data/bucket=1/b.parquet",
            "s3://wh/db/users/data/bucket=0/c.parquet",
        ]);
        let by_bucket = split_by_bucket_dir("s3://wh/db/users", split, &t).unwrap();
        assert_eq!(by_bucket.len(), 2);
        assert_eq!(
            names(&by_bucket, &bucket(&t, 0)),
            ["a.parquet", "c.parquet"]
        );
        assert_eq!(names(&by_bucket, &bucket(&t, 1)), ["b.parquet"]);

        let mut t = table();
        t.partition_keys = vec!["dt".into()];
        let split = split_of(&[
            "s3://wh/db/users/data/dt=2024-01-01/bucket=0/d.parquet",
            "s3://wh/db/users/data/dt=2024-01-01/region=eu/bucket=4/e.parquet",
        ]);
        let by_bucket = split_by_bucket_dir("s3://wh/db/users", split, &t).unwrap();
        assert_eq!(by_bucket.len(), 2);
        assert_eq!(
            names(&by_bucket, &partitioned("dt=2024-01-01", 0)),
            ["d.parquet"]
        );
        assert_eq!(
            names(&by_bucket, &partitioned("dt=2024-01-01/region=eu", 4)),
            ["e.parquet"]
        );
        // An unpartitioned table's files are never in a partition directory, and a
        // partitioned table's always are.
        let split = split_of(&["s3://wh/db/users/data/bucket=0/a.parquet"]);
        assert!(split_by_bucket_dir("s3://wh/db/users", split, &t).is_err());
    }

    #[test]
    fn a_location_with_a_trailing_slash_groups_the_same() {
        let split = split_of(&["/wh/db/users/data/bucket=5/a.parquet"]);
        let t = table();
        let by_bucket = split_by_bucket_dir("/wh/db/users/", split, &t).unwrap();
        assert_eq!(by_bucket.keys().collect::<Vec<_>>(), [&bucket(&t, 5)]);
    }

    #[test]
    fn a_file_outside_every_bucket_directory_is_corrupt() {
        for path in [
            "/wh/db/users/data/a.parquet",
            "/wh/db/users/other/bucket=0/a.parquet",
            "/wh/db/users/data/bucket=x/a.parquet",
            "/wh/db/users/data/bucket=01/a.parquet",
            "/wh/db/users/data/bucket=-1/a.parquet",
            "/wh/db/users2/data/bucket=0/a.parquet",
            "/wh/db/usersdata/data/bucket=0/a.parquet",
            "/wh/db/users/data/nopart/bucket=0/a.parquet",
            "/elsewhere/data/bucket=0/a.parquet",
            "a.parquet",
        ] {
            let split = split_of(&["/wh/db/users/data/bucket=0/ok.parquet", path]);
            let error = split_by_bucket_dir("/wh/db/users", split, &table()).unwrap_err();
            assert!(
                matches!(&error, NodeError::Corrupt(m) if m.contains(path)),
                "{path}: {error}"
            );
        }
    }

    #[test]
    fn an_empty_split_has_no_buckets() {
        let by_bucket = split_by_bucket_dir("/wh", split_of(&[]), &table()).unwrap();
        assert!(by_bucket.is_empty());
    }

    #[test]
    fn row_numbers_beyond_u32_are_corrupt() {
        assert_eq!(row_number(u64::from(u32::MAX)).unwrap(), u32::MAX);
        assert!(matches!(
            row_number(u64::from(u32::MAX) + 1),
            Err(NodeError::Corrupt(_))
        ));
    }
}
