//! Changes of a real lake table (SQLite catalog, Parquet files in a temporary directory),
//! built snapshot by snapshot with the crate's own writers and commits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt;
use iceberg::spec::{DataFile, Operation};
use iceberg::table::Table;
use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};

use super::*;
use crate::catalog::{Lake, LakeConfig};
use crate::commit::{SnapshotChanges, commit_snapshot};
use crate::deletes::{delete_equality, write_position_deletes};
use crate::layout::{lake_arrow_schema, lake_batch};
use crate::reader::{SplitScope, plan_split, read_split, read_split_positioned};
use crate::writer::BucketWriter;

/// `db.t (id BIGINT NOT NULL, name STRING, PRIMARY KEY (id))` in one bucket.
fn descriptor() -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: 1,
        bucket_key: Some(vec!["id".into()]),
        lake_enabled: true,
        ..TableOptions::default()
    };
    TableDescriptor::new(
        TablePath::new("db", "t"),
        schema,
        vec!["id".into()],
        vec![],
        options,
    )
    .unwrap()
}

struct Fixture {
    _dir: tempfile::TempDir,
    lake: Lake,
    table: TableDescriptor,
    bucket: BucketId,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(LakeConfig::embedded(dir.path()).unwrap())
        .await
        .unwrap();
    let table = descriptor();
    lake.create_table(&table).await.unwrap();
    let bucket = BucketId::new(&table.path, 0);
    Fixture {
        _dir: dir,
        lake,
        table,
        bucket,
    }
}

/// The table's columns: what the changes are read as.
fn columns() -> Schema {
    descriptor().schema().as_ref().clone()
}

impl Fixture {
    async fn current(&self) -> Table {
        self.lake.load(&self.table.path).await.unwrap()
    }

    /// Writes `rows` as one data file (not committed).
    async fn data_file(&self, rows: &[(i64, &str)]) -> DataFile {
        let table = self.current().await;
        let batch = RecordBatch::try_new(
            Arc::clone(self.table.schema()),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap();
        let arrow = lake_arrow_schema(table.metadata().current_schema()).unwrap();
        let lake_rows = lake_batch(&arrow, &batch, 0, 0, 1_700_000_000_000).unwrap();
        let mut writer = BucketWriter::new(&table, &self.bucket).unwrap();
        writer.write(lake_rows).await.unwrap();
        let mut files = writer.close().await.unwrap();
        assert_eq!(files.len(), 1);
        files.pop().unwrap()
    }

    /// Commits one snapshot on the current one; returns its id.
    async fn commit(&self, operation: Operation, changes: SnapshotChanges) -> i64 {
        let table = self.current().await;
        let parent = table.metadata().current_snapshot_id();
        let committed = commit_snapshot(&self.lake, &table, parent, operation, changes)
            .await
            .unwrap();
        committed.metadata().current_snapshot_id().unwrap()
    }

    /// Appends `rows` in one snapshot.
    async fn append(&self, rows: &[(i64, &str)]) -> i64 {
        let changes = SnapshotChanges {
            added_data_files: vec![self.data_file(rows).await],
            ..SnapshotChanges::default()
        };
        self.commit(Operation::Append, changes).await
    }

    /// Where each id lives in `snapshot`: (data file, position).
    async fn locations(&self, snapshot: i64) -> HashMap<i64, (String, i64)> {
        let table = self.current().await;
        let split = plan_split(&table, snapshot, &SplitScope::Table, None)
            .await
            .unwrap();
        let ids = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batches: Vec<_> = read_split_positioned(self.lake.storage(), split, ids)
            .try_collect()
            .await
            .unwrap();
        let mut locations = HashMap::new();
        for positioned in batches {
            let ids = positioned.batch.column(0).as_primitive::<Int64Type>();
            for row in 0..ids.len() {
                let position = i64::try_from(positioned.positions.value(row)).unwrap();
                locations.insert(ids.value(row), (positioned.file.to_string(), position));
            }
        }
        locations
    }

    /// A position-delete file deleting `deletes` (data file, position).
    async fn position_deletes(&self, deletes: Vec<(String, i64)>) -> DataFile {
        let table = self.current().await;
        let snapshot = table.metadata().current_snapshot_id().unwrap();
        let split = plan_split(&table, snapshot, &SplitScope::Table, None)
            .await
            .unwrap();
        let partition = split.files[0].partition.clone().unwrap();
        write_position_deletes(&table, &self.bucket, &partition, deletes)
            .await
            .unwrap()
    }

    /// A tiering round of a primary-key table: `rows` as new versions, the old rows of
    /// their ids and of `removed` position-deleted.
    async fn round(&self, rows: &[(i64, &str)], removed: &[i64]) -> i64 {
        let before = self
            .current()
            .await
            .metadata()
            .current_snapshot_id()
            .unwrap();
        let locations = self.locations(before).await;
        let deletes = rows
            .iter()
            .map(|r| r.0)
            .chain(removed.iter().copied())
            .filter_map(|id| locations.get(&id).cloned())
            .collect();
        let changes = SnapshotChanges {
            added_data_files: vec![self.data_file(rows).await],
            added_delete_files: vec![self.position_deletes(deletes).await],
            ..SnapshotChanges::default()
        };
        self.commit(Operation::Overwrite, changes).await
    }

    /// The table's rows at `snapshot`: id -> name.
    async fn state(&self, snapshot: i64) -> BTreeMap<i64, String> {
        let table = self.current().await;
        let split = plan_split(&table, snapshot, &SplitScope::Table, None)
            .await
            .unwrap();
        let batches: Vec<RecordBatch> =
            read_split(self.lake.storage(), split, Arc::clone(self.table.schema()))
                .try_collect()
                .await
                .unwrap();
        batches
            .iter()
            .flat_map(|batch| {
                let ids = batch.column(0).as_primitive::<Int64Type>().clone();
                let names = batch.column(1).as_string::<i32>().clone();
                (0..batch.num_rows())
                    .map(move |row| (ids.value(row), names.value(row).to_string()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    async fn plan(&self, from: i64, to: i64) -> ChangesPlan {
        plan_changes(&self.current().await, from, to).await.unwrap()
    }

    async fn changes(&self, plan: ChangesPlan) -> Vec<Change> {
        self.changes_with(plan, DeletedRows::Whole).await
    }

    async fn changes_with(&self, plan: ChangesPlan, deleted: DeletedRows<'_>) -> Vec<Change> {
        let sequence: HashMap<i64, i64> = plan
            .snapshots
            .iter()
            .map(|s| (s.snapshot_id, s.sequence_number))
            .collect();
        let batches: Vec<RecordBatch> =
            read_changes(self.lake.storage(), plan, &columns(), deleted)
                .try_collect()
                .await
                .unwrap();
        // Every row carries its snapshot's sequence number.
        for batch in &batches {
            let snapshots = batch.column(3).as_primitive::<Int64Type>();
            let numbers = batch.column(4).as_primitive::<Int64Type>();
            for row in 0..batch.num_rows() {
                assert_eq!(numbers.value(row), sequence[&snapshots.value(row)]);
            }
        }
        changes(&batches)
    }
}

/// A changed row: (change type, snapshot, id, name).
type Change = (String, i64, i64, Option<String>);

fn changes(batches: &[RecordBatch]) -> Vec<Change> {
    let mut out = Vec::new();
    for batch in batches {
        assert_eq!(batch.schema(), changes_schema(&columns()));
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let names = batch.column(1).as_string::<i32>();
        let kinds = batch.column(2).as_string::<i32>();
        let snapshots = batch.column(3).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            out.push((
                kinds.value(row).to_string(),
                snapshots.value(row),
                ids.value(row),
                names.is_valid(row).then(|| names.value(row).to_string()),
            ));
        }
    }
    out
}

fn change(kind: &str, snapshot: i64, id: i64, name: Option<&str>) -> Change {
    (kind.to_string(), snapshot, id, name.map(str::to_string))
}

/// Applies changes by key, checking that every delete names a row there is and every
/// insert a key there is not.
fn apply(state: &BTreeMap<i64, String>, changes: &[Change]) -> BTreeMap<i64, String> {
    let mut state = state.clone();
    for (kind, _, id, name) in changes {
        match kind.as_str() {
            DELETE => {
                let gone = state.remove(id);
                assert!(gone.is_some(), "deleting absent key {id}");
                if let Some(name) = name {
                    assert_eq!(gone.as_ref(), Some(name), "deleted row of {id}");
                }
            }
            INSERT => {
                let before = state.insert(*id, name.clone().unwrap());
                assert_eq!(before, None, "inserting present key {id}");
            }
            other => panic!("change type {other}"),
        }
    }
    state
}

fn snapshot_ids(plan: &ChangesPlan) -> Vec<i64> {
    plan.snapshots.iter().map(|s| s.snapshot_id).collect()
}

#[tokio::test]
async fn only_appended_rows_and_a_caught_up_cursor() {
    let f = fixture().await;
    let a = f.append(&[(1, "a"), (2, "b"), (3, "c")]).await;
    let b = f.append(&[(4, "d"), (5, "e")]).await;

    let plan = f.plan(a, b).await;
    assert_eq!(snapshot_ids(&plan), vec![b]);
    assert_eq!(plan.added_files().count(), 1);
    assert_eq!(plan.delete_files().count(), 0);
    assert!(!plan.needs_full_reload());
    assert_eq!(
        f.changes(plan).await,
        vec![
            change(INSERT, b, 4, Some("d")),
            change(INSERT, b, 5, Some("e"))
        ]
    );

    let caught_up = f.plan(b, b).await;
    assert!(caught_up.is_empty() && !caught_up.needs_full_reload());
    assert!(f.changes(caught_up).await.is_empty());
}

#[tokio::test]
async fn a_delta_spans_several_snapshots_oldest_first() {
    let f = fixture().await;
    let a = f.append(&[(1, "a"), (2, "b")]).await;
    let b = f.append(&[(3, "c"), (4, "d")]).await;
    let c = f.append(&[(5, "e"), (6, "f")]).await;

    let plan = f.plan(a, c).await;
    assert_eq!(snapshot_ids(&plan), vec![b, c]);
    assert_eq!(plan.added_files().count(), 2);
    let ids: Vec<(i64, i64)> = f
        .changes(plan)
        .await
        .into_iter()
        .map(|(_, snapshot, id, _)| (snapshot, id))
        .collect();
    assert_eq!(ids, vec![(b, 3), (b, 4), (c, 5), (c, 6)]);
}

#[tokio::test]
async fn sequence_numbers_grow_with_commit_order() {
    let f = fixture().await;
    let a = f.append(&[(1, "a")]).await;
    let b = f.round(&[(1, "a2")], &[]).await;
    let c = f.round(&[(2, "b")], &[1]).await;

    let plan = f.plan(a, c).await;
    let numbers: Vec<i64> = plan.snapshots.iter().map(|s| s.sequence_number).collect();
    assert!(
        numbers.is_sorted() && numbers[0] < numbers[1],
        "{numbers:?}"
    );
    // Sorted by (sequence number, change type), the rows keep the order they come in.
    let batches: Vec<RecordBatch> =
        read_changes(f.lake.storage(), plan, &columns(), DeletedRows::Whole)
            .try_collect()
            .await
            .unwrap();
    let order: Vec<(i64, String)> = batches
        .iter()
        .flat_map(|batch| {
            let kinds = batch.column(2).as_string::<i32>().clone();
            let numbers = batch.column(4).as_primitive::<Int64Type>().clone();
            (0..batch.num_rows()).map(move |row| (numbers.value(row), kinds.value(row).into()))
        })
        .collect();
    assert!(order.is_sorted(), "{order:?}");
    assert_eq!(
        order
            .iter()
            .map(|(_, kind)| kind.as_str())
            .collect::<Vec<_>>(),
        [DELETE, INSERT, DELETE, INSERT],
        "{b} then {c}"
    );
}

#[tokio::test]
async fn an_equality_delete_is_one_delete_file_and_its_identities() {
    let f = fixture().await;
    let a = f.append(&[(1, "a"), (2, "b"), (3, "c")]).await;
    let keys = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![2])) as ArrayRef],
    )
    .unwrap();
    let table = f.current().await;
    let deleted = delete_equality(&f.lake, &table, &keys, &["id"])
        .await
        .unwrap();
    let b = deleted.metadata().current_snapshot_id().unwrap();
    let summary = deleted.metadata().current_snapshot().unwrap().summary();
    assert_eq!(summary.operation, Operation::Delete);

    let plan = f.plan(a, b).await;
    assert_eq!(plan.added_files().count(), 0);
    let deletes: Vec<&LakeDeleteFile> = plan.delete_files().collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(
        deletes[0].kind,
        DeleteKind::Equality {
            columns: vec!["id".into()]
        }
    );
    assert!(!plan.needs_full_reload());
    // The identity only: the other columns are unknown.
    assert_eq!(f.changes(plan).await, vec![change(DELETE, b, 2, None)]);
}

#[tokio::test]
async fn position_deletes_resolve_to_the_rows_they_delete() {
    let f = fixture().await;
    let a = f.append(&[(1, "a"), (2, "b"), (3, "c"), (4, "d")]).await;
    // A round: 2 gets a new version, 5 is new, 3 is deleted.
    let b = f.round(&[(2, "b2"), (5, "e")], &[3]).await;
    // Another: 5 changes again, 1 is deleted.
    let c = f.round(&[(5, "e2")], &[1]).await;

    let plan = f.plan(a, b).await;
    assert_eq!(plan.snapshots[0].operation, Operation::Overwrite);
    assert!(!plan.needs_full_reload());
    assert_eq!(
        f.changes(plan).await,
        vec![
            change(DELETE, b, 2, Some("b")),
            change(DELETE, b, 3, Some("c")),
            change(INSERT, b, 2, Some("b2")),
            change(INSERT, b, 5, Some("e")),
        ]
    );
    // Identified by their key, deleted rows come without their other columns.
    let key = ["id".to_string()];
    assert_eq!(
        f.changes_with(f.plan(a, b).await, DeletedRows::Identity(&key))
            .await,
        vec![
            change(DELETE, b, 2, None),
            change(DELETE, b, 3, None),
            change(INSERT, b, 2, Some("b2")),
            change(INSERT, b, 5, Some("e")),
        ]
    );
    // Applied to the state at `from`, every change set gives the state at `to`.
    for (from, to) in [(a, b), (a, c), (b, c)] {
        let changes = f.changes(f.plan(from, to).await).await;
        assert_eq!(
            apply(&f.state(from).await, &changes),
            f.state(to).await,
            "{from} -> {to}"
        );
    }
}

#[tokio::test]
async fn a_row_deleted_by_its_own_snapshot_is_netted_out() {
    let f = fixture().await;
    let a = f.append(&[(1, "a")]).await;
    let file = f.data_file(&[(2, "b"), (9, "never seen")]).await;
    let own = f
        .position_deletes(vec![(file.file_path().to_string(), 1)])
        .await;
    let changes = SnapshotChanges {
        added_data_files: vec![file],
        added_delete_files: vec![own],
        ..SnapshotChanges::default()
    };
    let b = f.commit(Operation::Overwrite, changes).await;
    assert_eq!(
        f.changes(f.plan(a, b).await).await,
        vec![change(INSERT, b, 2, Some("b"))]
    );
}

#[tokio::test]
async fn from_off_the_lineage_is_an_error() {
    let f = fixture().await;
    let a = f.append(&[(1, "a")]).await;
    let b = f.append(&[(2, "b")]).await;
    let table = f.current().await;
    let err = plan_changes(&table, b, a).await.unwrap_err();
    assert!(
        matches!(err, LakeError::NotAncestor { from, to, .. } if from == b && to == a),
        "{err}"
    );
    assert!(err.to_string().contains("not an ancestor"), "{err}");
    let err = plan_changes(&table, 42, b).await.unwrap_err();
    assert!(
        matches!(
            err,
            LakeError::SnapshotNotFound {
                snapshot_id: 42,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn an_expired_snapshot_between_is_not_found() {
    let f = fixture().await;
    let a = f.append(&[(1, "a")]).await;
    let b = f.append(&[(2, "b")]).await;
    let c = f.append(&[(3, "c")]).await;
    let table = f.current().await;
    let expired =
        iceberg::spec::TableMetadataBuilder::new_from_metadata(table.metadata().clone(), None)
            .remove_snapshots(&[b])
            .build()
            .unwrap()
            .metadata;
    let table = Table::builder()
        .metadata(expired)
        .identifier(table.identifier().clone())
        .file_io(table.file_io().clone())
        .runtime(iceberg::Runtime::try_current().unwrap())
        .readonly(true)
        .build()
        .unwrap();
    let err = plan_changes(&table, a, c).await.unwrap_err();
    assert!(
        matches!(err, LakeError::SnapshotNotFound { snapshot_id, .. } if snapshot_id == b),
        "{err}"
    );
    assert!(err.to_string().contains(&b.to_string()), "{err}");
}

#[tokio::test]
async fn an_overwrite_removing_files_needs_a_full_reload() {
    let f = fixture().await;
    let a = f.append(&[(1, "a"), (2, "b")]).await;
    let b = f.append(&[(3, "c")]).await;
    let old: HashSet<String> = f.locations(b).await.into_values().map(|l| l.0).collect();
    let changes = SnapshotChanges {
        added_data_files: vec![f.data_file(&[(1, "a"), (3, "c")]).await],
        removed_files: old,
        ..SnapshotChanges::default()
    };
    let c = f.commit(Operation::Overwrite, changes).await;

    let plan = f.plan(a, c).await;
    assert!(plan.needs_full_reload());
    let cause = plan.full_reload_cause().unwrap();
    assert_eq!((cause.snapshot_id, cause.removed_files), (c, 2));
    // Up to the snapshot before, a change set still works.
    assert!(!f.plan(a, b).await.needs_full_reload());
    let err = read_changes(f.lake.storage(), plan, &columns(), DeletedRows::Whole)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LakeError::FullReloadNeeded { snapshot_id, .. } if snapshot_id == c),
        "{err}"
    );
}

#[tokio::test]
async fn a_compaction_between_contributes_nothing() {
    let f = fixture().await;
    let a = f.append(&[(1, "a"), (2, "b")]).await;
    let b = f.round(&[(2, "b2"), (3, "c")], &[]).await;
    // Compaction: the live rows rewritten as one file, the old files removed.
    let live = f.state(b).await;
    let rows: Vec<(i64, &str)> = live.iter().map(|(id, n)| (*id, n.as_str())).collect();
    let mut removed: HashSet<String> = f.locations(a).await.into_values().map(|l| l.0).collect();
    let table = f.current().await;
    let split = plan_split(&table, b, &SplitScope::Table, None)
        .await
        .unwrap();
    for file in &split.files {
        removed.insert(file.path.clone());
        removed.extend(file.deletes.iter().map(|d| d.path.clone()));
    }
    let changes = SnapshotChanges {
        added_data_files: vec![f.data_file(&rows).await],
        removed_files: removed,
        ..SnapshotChanges::default()
    };
    let c = f.commit(Operation::Replace, changes).await;
    // A round after it deletes rows of the compacted file.
    let d = f.round(&[(1, "a2")], &[3]).await;

    let compaction = f.plan(b, c).await;
    assert_eq!(compaction.snapshots.len(), 1);
    assert!(compaction.added_files().next().is_none() && !compaction.needs_full_reload());
    assert!(f.changes(compaction).await.is_empty());

    let plan = f.plan(a, d).await;
    assert_eq!(snapshot_ids(&plan), vec![b, c, d]);
    let changes = f.changes(plan).await;
    assert!(changes.iter().all(|(_, snapshot, _, _)| *snapshot != c));
    assert_eq!(
        changes
            .iter()
            .filter(|(_, snapshot, _, _)| *snapshot == d)
            .cloned()
            .collect::<Vec<_>>(),
        vec![
            change(DELETE, d, 1, Some("a")),
            change(DELETE, d, 3, Some("c")),
            change(INSERT, d, 1, Some("a2")),
        ]
    );
    assert_eq!(apply(&f.state(a).await, &changes), f.state(d).await);
}
