use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};

use super::*;
use crate::error::NodeError;

fn table(name: &str) -> TableDescriptor {
    let schema = Schema::new(vec![Field::new("a", DataType::Int32, true)]);
    TableDescriptor::new(
        TablePath::new("db", name),
        schema,
        vec![],
        vec![],
        TableOptions::default(),
    )
    .unwrap()
}

/// Every commit is fsynced before it returns (SQLite's WAL, `synchronous` at least
/// `FULL`): what `meta.db` acknowledged survives a power cut.
#[test]
fn every_commit_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
    let connection = metadata.connection();
    let journal_mode: String =
        (connection.query_row("PRAGMA journal_mode", [], |row| row.get(0))).unwrap();
    let synchronous: i64 =
        (connection.query_row("PRAGMA synchronous", [], |row| row.get(0))).unwrap();
    assert_eq!(journal_mode, "wal");
    assert_eq!(synchronous, 3, "EXTRA");
}

#[test]
fn tables_and_partitions_persist() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let created = {
        let metadata = Metadata::open(&path).unwrap();
        let created = metadata.create_table(&table("t")).unwrap();
        assert!(matches!(
            metadata.create_table(&table("t")),
            Err(NodeError::TableExists(_))
        ));
        let evolved = created
            .with_added_column(Field::new("b", DataType::Utf8, true))
            .unwrap();
        metadata.update_table(&evolved).unwrap();
        let p = metadata.ensure_partition(created.table_id, "dt=1").unwrap();
        assert_eq!(
            metadata.ensure_partition(created.table_id, "dt=1").unwrap(),
            p
        );
        evolved
    };
    let metadata = Metadata::open(&path).unwrap();
    assert_eq!(metadata.load_tables().unwrap(), vec![created.clone()]);
    assert_eq!(metadata.partitions(created.table_id).unwrap().len(), 1);
    metadata.drop_table(&created.path).unwrap();
    assert!(metadata.load_tables().unwrap().is_empty());
    assert!(metadata.partitions(created.table_id).unwrap().is_empty());
    assert!(matches!(
        metadata.drop_table(&created.path),
        Err(NodeError::TableNotFound(_))
    ));
}

#[test]
fn expired_lake_snapshots_are_forgotten_but_never_the_latest() {
    let dir = tempfile::tempdir().unwrap();
    let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
    let record = |snapshot_id| LakeSnapshotRecord {
        snapshot_id,
        offsets: "{}".into(),
        committed_at: snapshot_id,
    };
    let expiring = metadata.create_table(&table("expiring")).unwrap().table_id;
    let other = metadata.create_table(&table("other")).unwrap().table_id;
    for snapshot_id in [11, 12, 13] {
        metadata
            .record_lake_snapshot(expiring, &record(snapshot_id))
            .unwrap();
    }
    metadata.record_lake_snapshot(other, &record(11)).unwrap();
    metadata
        .forget_lake_snapshots(expiring, &[11, 13, 99])
        .unwrap();
    assert_eq!(
        metadata.lake_snapshots(expiring).unwrap(),
        [record(12), record(13)]
    );
    assert_eq!(
        metadata.lake_snapshots(other).unwrap(),
        [record(11)],
        "other tables keep theirs"
    );
}

#[test]
fn a_rolled_back_create_or_partition_leaves_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
    let kept = metadata.create_table(&table("kept")).unwrap();
    let undone = metadata.create_table(&table("undone")).unwrap();
    let partition = metadata.ensure_partition(kept.table_id, "dt=1").unwrap();
    metadata.ensure_partition(undone.table_id, "dt=1").unwrap();
    metadata.delete_table(undone.table_id).unwrap();
    metadata.delete_partition(partition.partition_id).unwrap();
    assert_eq!(metadata.load_tables().unwrap(), vec![kept.clone()]);
    assert!(metadata.partitions(kept.table_id).unwrap().is_empty());
    assert!(metadata.partitions(undone.table_id).unwrap().is_empty());
    let again = metadata.create_table(&table("undone")).unwrap();
    assert!(again.table_id > undone.table_id, "ids are not reused");
}
