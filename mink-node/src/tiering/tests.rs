//! Fixtures of the tiering tests, and rounds and compactions on a real lake (a SQLite
//! catalog and a warehouse in a temporary directory) checking that the lake index a
//! round or compaction moves forward is the index rebuilt from the committed snapshot.
//!
//! The table is `db.users (id BIGINT PRIMARY KEY, name TEXT)` with one bucket.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, TimestampMicrosecondType};
use futures::TryStreamExt;
use mink_core::change::ChangeType;
use mink_core::key::KeyCodec;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::commit::{SnapshotChanges, commit_snapshot};
use mink_lake::layout::lake_arrow_schema;
use mink_lake::reader::{SplitScope, plan_split, read_split};
use mink_lake::{Lake, LakeConfig, LakeTable, Operation, Struct};

use super::RoundTarget;
use super::upsert::tier_range;
use crate::lake_index::{BucketIndex, IndexedFile, LakeIndex, split_by_bucket_dir};
use mink_log::LogBatch;

/// `+I`
pub(super) const I: u8 = ChangeType::Insert as u8;
/// `-U`
pub(super) const UB: u8 = ChangeType::UpdateBefore as u8;
/// `+U`
pub(super) const UA: u8 = ChangeType::UpdateAfter as u8;
/// `-D`
pub(super) const D: u8 = ChangeType::Delete as u8;

/// `db.users (id BIGINT PRIMARY KEY, name TEXT)`, lake enabled, one bucket.
pub(crate) fn table() -> TableDescriptor {
    users_table(vec!["id".into()])
}

/// `db.users (id BIGINT, name TEXT)` without a primary key (a log table).
pub(super) fn log_table() -> TableDescriptor {
    users_table(Vec::new())
}

fn users_table(primary_key: Vec<String>) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: 1,
        lake_enabled: true,
        ..TableOptions::default()
    };
    TableDescriptor::new(
        TablePath::new("db", "users"),
        schema,
        primary_key,
        vec![],
        options,
    )
    .unwrap()
}

/// The bucket `bucket` of an unpartitioned table.
pub(crate) fn bucket(table: &TableDescriptor, bucket: u32) -> BucketId {
    BucketId {
        table: table.path.to_string(),
        partition: None,
        bucket,
    }
}

/// The encoded key of `id`.
pub(crate) fn key(table: &TableDescriptor, id: i64) -> Box<[u8]> {
    let codec = KeyCodec::new(table).unwrap();
    let batch = users(table, &[(id, "")]);
    codec.encode(&batch).unwrap().row(0).as_ref().into()
}

/// The encoded keys of `ids`, in order.
pub(crate) fn keys(table: &TableDescriptor, ids: &[i64]) -> Vec<Box<[u8]>> {
    ids.iter().map(|id| key(table, *id)).collect()
}

/// `(id, name)` rows in the table's schema.
pub(crate) fn users(table: &TableDescriptor, rows: &[(i64, &str)]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).unwrap()
}

/// A changelog batch at `base_offset` committed at `commit_ms`: `(change, id, name)` rows.
pub(super) fn log_batch(
    table: &TableDescriptor,
    base_offset: i64,
    commit_ms: i64,
    rows: &[(u8, i64, &str)],
) -> LogBatch {
    let values: Vec<(i64, &str)> = rows.iter().map(|r| (r.1, r.2)).collect();
    LogBatch {
        base_offset,
        last_offset: base_offset + rows.len() as i64 - 1,
        commit_timestamp: commit_ms,
        schema_id: 0,
        batch: users(table, &values),
        changes: Some(rows.iter().map(|r| r.0).collect()),
        writer: None,
        size: 0,
    }
}

/// A data file of the index that holds `rows` rows.
pub(crate) fn indexed(path: &str, rows: u64) -> IndexedFile {
    IndexedFile {
        path: path.into(),
        partition: Struct::empty(),
        rows,
        live: 0,
    }
}

/// A lake row: `(id, name, __bucket, __offset, __timestamp in µs)`.
pub(super) type LakeRow = (i64, Option<String>, i32, i64, i64);

/// The rows of lake batches (the table's columns, then `__bucket`, `__offset`,
/// `__timestamp`).
pub(super) fn lake_values(batches: &[RecordBatch]) -> Vec<LakeRow> {
    let mut rows = Vec::new();
    for batch in batches {
        let id = batch.column(0).as_primitive::<Int64Type>();
        let name = batch.column(1).as_string::<i32>();
        let bucket = batch.column(2).as_primitive::<Int32Type>();
        let offset = batch.column(3).as_primitive::<Int64Type>();
        let timestamp = batch.column(4).as_primitive::<TimestampMicrosecondType>();
        for row in 0..batch.num_rows() {
            rows.push((
                id.value(row),
                name.is_valid(row).then(|| name.value(row).to_string()),
                bucket.value(row),
                offset.value(row),
                timestamp.value(row),
            ));
        }
    }
    rows
}

/// Where the index has each key of `ids`: `id -> (file path, row)`, for the ids it has.
pub(super) fn located(
    table: &TableDescriptor,
    index: &BucketIndex,
    ids: impl IntoIterator<Item = i64>,
) -> BTreeMap<i64, (String, u32)> {
    let locations = index.locations();
    ids.into_iter()
        .filter_map(|id| {
            let (file, row) = locations.get(&key(table, id))?;
            Some((id, (file.to_string(), *row)))
        })
        .collect()
}

/// A lake with the table created in it.
pub(super) struct TestLake {
    _dir: tempfile::TempDir,
    pub(super) lake: Lake,
    pub(super) table: Arc<TableDescriptor>,
    pub(super) lake_table: LakeTable,
}

impl TestLake {
    pub(super) async fn open() -> Self {
        Self::open_with(table()).await
    }

    pub(super) async fn open_with(table: TableDescriptor) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(LakeConfig::embedded(dir.path()).unwrap())
            .await
            .unwrap();
        let table = Arc::new(table);
        let lake_table = lake.create_table(&table).await.unwrap();
        Self {
            _dir: dir,
            lake,
            table,
            lake_table,
        }
    }

    pub(super) fn target(&self) -> RoundTarget<'_> {
        RoundTarget {
            table: &self.table,
            lake_table: &self.lake_table,
            lake_schema: lake_arrow_schema(self.lake_table.metadata().current_schema()).unwrap(),
        }
    }

    /// Tiers `tail` into bucket 0 and commits it as a round would; returns the deleted
    /// rows and the files written (data, then deletes).
    pub(super) async fn tier(
        &mut self,
        index: &mut BucketIndex,
        tail: Vec<LogBatch>,
    ) -> (u64, Vec<String>) {
        let bucket = bucket(&self.table, 0);
        let round = tier_range(&self.target(), &bucket, tail, index)
            .await
            .unwrap();
        let written: Vec<String> = round
            .data_files
            .iter()
            .chain(&round.delete_files)
            .map(|file| file.file_path().to_string())
            .collect();
        let operation = match round.delete_files.is_empty() {
            true => Operation::Append,
            false => Operation::Overwrite,
        };
        let changes = SnapshotChanges {
            added_data_files: round.data_files,
            added_delete_files: round.delete_files,
            ..SnapshotChanges::default()
        };
        self.commit(operation, changes).await;
        (round.deleted_rows, written)
    }

    pub(super) async fn commit(&mut self, operation: Operation, changes: SnapshotChanges) {
        let parent = self.lake_table.metadata().current_snapshot_id();
        self.lake_table = commit_snapshot(&self.lake, &self.lake_table, parent, operation, changes)
            .await
            .unwrap();
    }

    /// The index rebuilt from the lake's current snapshot.
    pub(super) async fn rebuilt(&self) -> LakeIndex {
        let snapshot = self.lake_table.metadata().current_snapshot_id();
        LakeIndex::build(self.lake.storage(), &self.lake_table, &self.table, snapshot)
            .await
            .unwrap()
    }

    /// The lake's current files of bucket 0, as a whole-table split groups them.
    pub(super) async fn bucket_split(&self) -> mink_lake::reader::LakeSplit {
        let snapshot = self.lake_table.metadata().current_snapshot_id().unwrap();
        let split = plan_split(&self.lake_table, snapshot, &SplitScope::Table, None)
            .await
            .unwrap();
        let mut by_bucket =
            split_by_bucket_dir(self.lake_table.metadata().location(), split, &self.table).unwrap();
        assert_eq!(by_bucket.len(), 1, "only bucket 0 has files");
        by_bucket.remove(&bucket(&self.table, 0)).unwrap()
    }

    /// Every live row of bucket 0, sorted.
    pub(super) async fn rows(&self) -> Vec<LakeRow> {
        let split = self.bucket_split().await;
        let schema = lake_arrow_schema(self.lake_table.metadata().current_schema()).unwrap();
        let batches: Vec<RecordBatch> = read_split(self.lake.storage(), split, schema)
            .try_collect()
            .await
            .unwrap();
        let mut rows = lake_values(&batches);
        rows.sort_unstable();
        rows
    }
}

/// Two rounds: every key the first wrote, then an update, a delete and an insert.
pub(super) async fn two_rounds(lake: &mut TestLake, index: &mut BucketIndex) {
    let t = Arc::clone(&lake.table);
    let first = vec![log_batch(
        &t,
        0,
        1_000,
        &[(I, 1, "a"), (I, 2, "b"), (I, 3, "c"), (I, 4, "d")],
    )];
    lake.tier(index, first).await;
    let second = vec![log_batch(
        &t,
        4,
        2_000,
        &[(UB, 2, "b"), (UA, 2, "b2"), (D, 4, "d"), (I, 5, "e")],
    )];
    let (deleted, _) = lake.tier(index, second).await;
    assert_eq!(deleted, 2, "the lake rows of keys 2 and 4");
}

#[tokio::test]
async fn an_index_moved_forward_by_rounds_is_the_index_rebuilt_from_the_lake() {
    let mut lake = TestLake::open().await;
    let mut index = BucketIndex::default();
    two_rounds(&mut lake, &mut index).await;
    let t = Arc::clone(&lake.table);

    let mut rebuilt = lake.rebuilt().await;
    assert_eq!(
        rebuilt.snapshot_id,
        lake.lake_table.metadata().current_snapshot_id()
    );
    let rebuilt = rebuilt.bucket_mut(&bucket(&t, 0));
    assert_eq!(rebuilt.locations(), index.locations());
    let live = located(&t, &index, 1..=6);
    assert_eq!(live.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 5]);
    // Keys 1 and 3 stay where the first round wrote them, 2 and 5 are the second's file.
    assert_eq!((live[&1].1, live[&3].1), (0, 2));
    assert_eq!((live[&2].1, live[&5].1), (0, 1));
    assert_eq!(live[&1].0, live[&3].0);
    assert_eq!(live[&2].0, live[&5].0);
    assert_ne!(live[&1].0, live[&2].0);
    // Live rows per file: 2 of the first file's 4, both of the second's.
    let counts = |index: &BucketIndex| -> Vec<(u64, u64)> {
        index.files().iter().map(|f| (f.rows, f.live)).collect()
    };
    assert_eq!(counts(&index), [(4, 2), (2, 2)]);
    let mut sorted = counts(rebuilt);
    sorted.sort_unstable_by_key(|(rows, _)| std::cmp::Reverse(*rows));
    assert_eq!(sorted, [(4, 2), (2, 2)]);
    assert!(rebuilt.partition().is_some());
}

#[tokio::test]
async fn a_round_deletes_the_lake_rows_the_rebuilt_index_no_longer_finds() {
    let mut lake = TestLake::open().await;
    let mut index = BucketIndex::default();
    two_rounds(&mut lake, &mut index).await;
    let t = Arc::clone(&lake.table);
    // A third round deletes key 1 and changes key 5 (written by the second round).
    let third = vec![log_batch(
        &t,
        8,
        3_000,
        &[(D, 1, "a"), (UB, 5, "e"), (UA, 5, "e2")],
    )];
    let (deleted, written) = lake.tier(&mut index, third).await;
    assert_eq!(
        (deleted, written.len()),
        (2, 2),
        "one data and one delete file"
    );

    let mut rebuilt = lake.rebuilt().await;
    let rebuilt = rebuilt.bucket_mut(&bucket(&t, 0));
    assert_eq!(rebuilt.locations(), index.locations());
    let live = located(&t, rebuilt, 1..=6);
    assert_eq!(live.keys().copied().collect::<Vec<_>>(), [2, 3, 5]);
    assert_eq!(live[&5], (written[0].clone(), 0));
}

#[tokio::test]
async fn the_index_of_an_empty_lake_is_empty() {
    let lake = TestLake::open().await;
    let mut index = lake.rebuilt().await;
    assert_eq!(index.snapshot_id, None);
    assert!(index.buckets_to_compact().is_empty());
    let bucket = index.bucket_mut(&bucket(&lake.table, 0));
    assert!(bucket.locations().is_empty());
    assert!(bucket.partition().is_none());
}

#[tokio::test]
async fn tiered_rows_carry_their_log_offset_and_commit_time_into_the_lake() {
    let mut lake = TestLake::open().await;
    let mut index = BucketIndex::default();
    two_rounds(&mut lake, &mut index).await;
    let rows = lake.rows().await;
    let s = |text: &str| Some(text.to_string());
    assert_eq!(
        rows,
        [
            (1, s("a"), 0, 0, 1_000_000),
            (2, s("b2"), 0, 5, 2_000_000),
            (3, s("c"), 0, 2, 1_000_000),
            (5, s("e"), 0, 7, 2_000_000),
        ]
    );
}

/// A node over a temporary directory (its embedded lake in it) with the log table
/// [`log_table`].
async fn node_with_log_table() -> (tempfile::TempDir, Arc<crate::Node>, TableDescriptor) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::NodeConfig::new(dir.path());
    config.log.sync = false;
    let node = crate::Node::open(config).await.unwrap();
    let table = node.create_table(log_table(), false).await.unwrap();
    (dir, node, table)
}

/// Writes the rows `ids` to bucket 0.
async fn write(node: &crate::Node, table: &TableDescriptor, ids: std::ops::Range<i64>) {
    let rows: Vec<(i64, &str)> = ids.map(|id| (id, "")).collect();
    let batch = users(table, &rows);
    node.write(&bucket(table, 0), batch, false, None)
        .await
        .unwrap();
}

/// Undoes the catalog's last commit to the lake table `name`, as a catalog whose commit
/// was not durable does after a power cut (the row's metadata location goes back).
fn lose_last_catalog_commit(dir: &std::path::Path, name: &str) {
    let catalog = rusqlite::Connection::open(dir.join("lake/catalog.db")).unwrap();
    let changed = catalog
        .execute(
            "UPDATE iceberg_tables SET metadata_location = previous_metadata_location \
             WHERE table_name = ?1",
            [name],
        )
        .unwrap();
    assert_eq!(changed, 1);
}

/// The ids the lake holds as of the latest recorded snapshot, sorted.
async fn lake_ids(node: &crate::Node, path: &TablePath) -> Vec<i64> {
    let (_, split) = node.plan_lake(path, None, None, &[]).await.unwrap();
    let lake = node.lake().await.unwrap();
    let lake_table = lake.load(path).await.unwrap();
    let schema = lake_arrow_schema(lake_table.metadata().current_schema()).unwrap();
    let batches: Vec<RecordBatch> = read_split(lake.storage(), split, schema)
        .try_collect()
        .await
        .unwrap();
    let mut ids: Vec<i64> = lake_values(&batches).iter().map(|row| row.0).collect();
    ids.sort_unstable();
    ids
}

/// The latest recorded snapshot of `table` and its bucket 0's seam.
fn seam(node: &crate::Node, table: &TableDescriptor) -> (Option<i64>, i64) {
    let status = &node.list_buckets(&table.path).unwrap()[0];
    (status.lake_snapshot_id, status.lake_log_end_offset)
}

#[tokio::test]
async fn a_record_the_lake_lost_goes_back_to_the_lakes_newest_snapshot() {
    let (dir, node, table) = node_with_log_table().await;
    write(&node, &table, 0..10).await;
    let first = super::tier_table(&node, &table.path).await.unwrap();
    write(&node, &table, 10..25).await;
    let second = super::tier_table(&node, &table.path).await.unwrap();
    assert_eq!(
        (seam(&node, &table).0, second.rows),
        (second.snapshot_id, 15)
    );
    lose_last_catalog_commit(dir.path(), &table.path.name);

    super::check_lake_records(&node).await;
    assert_eq!(seam(&node, &table), (first.snapshot_id, 10));
    let recorded: Vec<i64> = node
        .lake_snapshots(&table.path)
        .unwrap()
        .iter()
        .map(|snapshot| snapshot.snapshot_id)
        .collect();
    assert_eq!(
        recorded,
        [first.snapshot_id.unwrap()],
        "the lost record is forgotten"
    );
    assert_eq!(
        lake_ids(&node, &table.path).await,
        (0..10).collect::<Vec<_>>()
    );

    // The next round tiers the rows the lake lost again, once.
    let again = super::tier_table(&node, &table.path).await.unwrap();
    assert_eq!((again.rows, again.repaired), (15, false));
    assert_eq!(seam(&node, &table), (again.snapshot_id, 25));
    assert_eq!(
        lake_ids(&node, &table.path).await,
        (0..25).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_record_of_a_lake_with_no_snapshot_left_goes_back_to_nothing_tiered() {
    let (dir, node, table) = node_with_log_table().await;
    write(&node, &table, 0..10).await;
    let first = super::tier_table(&node, &table.path).await.unwrap();
    lose_last_catalog_commit(dir.path(), &table.path.name);
    write(&node, &table, 10..12).await;

    // A round reconciles first: an empty snapshot says nothing is tiered, then the round
    // tiers every row.
    let again = super::tier_table(&node, &table.path).await.unwrap();
    assert_eq!((again.rows, again.repaired), (12, true));
    assert_ne!(again.snapshot_id, first.snapshot_id);
    assert_eq!(seam(&node, &table), (again.snapshot_id, 12));
    assert_eq!(
        lake_ids(&node, &table.path).await,
        (0..12).collect::<Vec<_>>()
    );
    assert_eq!(node.lake_snapshots(&table.path).unwrap().len(), 2);

    // Nothing is lost twice: the start's check finds the records in line.
    super::check_lake_records(&node).await;
    assert_eq!(seam(&node, &table), (again.snapshot_id, 12));
}

/// In a cluster another node's round may commit and record a snapshot after this round
/// loaded the lake table: reconcile loads it again rather than taking the newer record
/// for one the lake lost (which went back to the older snapshot until the next round).
#[tokio::test]
async fn a_record_newer_than_the_loaded_lake_table_is_not_taken_for_a_lost_one() {
    let (_dir, node, table) = node_with_log_table().await;
    write(&node, &table, 0..10).await;
    super::tier_table(&node, &table.path).await.unwrap();
    let mut loaded = node.lake().await.unwrap().load(&table.path).await.unwrap();
    // "Another node's" round, committed and recorded meanwhile.
    write(&node, &table, 10..25).await;
    let second = super::tier_table(&node, &table.path).await.unwrap();

    let changed = super::reconcile(&node, &table, &mut loaded).await.unwrap();
    assert!(!changed, "the record is the lake's newest snapshot");
    assert_eq!(seam(&node, &table), (second.snapshot_id, 25));
    assert_eq!(loaded.metadata().current_snapshot_id(), second.snapshot_id);
}
