use std::time::Duration;

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
fn kafka_state_persists_until_its_topic_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let offset = |topic: &str, partition, offset| ConsumerOffset {
        topic: topic.into(),
        partition,
        offset,
        metadata: None,
    };
    let batch = ProducerBatch {
        epoch: 0,
        first_sequence: 5,
        last_sequence: 9,
        base_offset: 42,
    };
    let first_id = {
        let metadata = Metadata::open(&path).unwrap();
        let committed = [offset("db.t", 0, 7), offset("db.u", 1, 3)];
        metadata
            .commit_consumer_offsets("g", &committed, now_ms(), 1)
            .unwrap();
        metadata
            .commit_consumer_offsets("g", &[offset("db.t", 0, 8)], now_ms(), 1)
            .unwrap();
        metadata
            .record_producer_batch(1, "db.t", 0, &batch)
            .unwrap();
        metadata.new_producer_id().unwrap()
    };
    let metadata = Metadata::open(&path).unwrap();
    let mut committed = metadata.consumer_offsets("g").unwrap();
    committed.sort_by(|a, b| a.topic.cmp(&b.topic));
    assert_eq!(committed, [offset("db.t", 0, 8), offset("db.u", 1, 3)]);
    assert!(metadata.consumer_offsets("other").unwrap().is_empty());
    assert_eq!(
        metadata.last_producer_batch(1, "db.t", 0).unwrap(),
        Some(batch)
    );
    assert!(
        metadata.new_producer_id().unwrap() > first_id,
        "ids are never reused"
    );
    metadata.forget_topic("db.t").unwrap();
    assert_eq!(
        metadata.consumer_offsets("g").unwrap(),
        [offset("db.u", 1, 3)]
    );
    assert_eq!(metadata.last_producer_batch(1, "db.t", 0).unwrap(), None);
}

/// Producers that wrote nothing since a time are forgotten, the others kept; ids
/// handed out are kept to one row.
#[test]
fn idle_producers_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
    let batch = ProducerBatch {
        epoch: 0,
        first_sequence: 0,
        last_sequence: 0,
        base_offset: 0,
    };
    metadata
        .record_producer_batch(1, "db.t", 0, &batch)
        .unwrap();
    metadata
        .record_producer_batch(1, "db.t", 1, &batch)
        .unwrap();
    assert_eq!(
        metadata.forget_idle_producers(now_ms() - 60_000).unwrap(),
        0
    );
    assert_eq!(
        metadata.last_producer_batch(1, "db.t", 1).unwrap(),
        Some(batch)
    );
    assert_eq!(metadata.forget_idle_producers(now_ms() + 1).unwrap(), 1);
    assert_eq!(metadata.last_producer_batch(1, "db.t", 0).unwrap(), None);
    assert_eq!(metadata.last_producer_batch(1, "db.t", 1).unwrap(), None);
    for _ in 0..3 {
        metadata.new_producer_id().unwrap();
    }
    let ids: i64 = metadata
        .connection()
        .query_row("SELECT count(*) FROM producer_ids", [], |row| row.get(0))
        .unwrap();
    assert_eq!(ids, 1);
}

/// A group's committed offsets are forgotten once it has been idle for the
/// retention: from its last commit, or from when it was last seen with members.
/// Groups with a recent commit, or with members, keep theirs; a new group is
/// refused once the bound's number of groups have offsets.
#[test]
fn idle_groups_are_forgotten_and_groups_are_bounded() {
    const DAY_MS: i64 = 24 * 60 * 60 * 1000;
    let retention = Duration::from_millis(7 * DAY_MS as u64);
    let dir = tempfile::tempdir().unwrap();
    let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
    let offsets = [ConsumerOffset {
        topic: "db.t".into(),
        partition: 0,
        offset: 1,
        metadata: None,
    }];
    let commit = |group: &str, at: i64| {
        metadata
            .commit_consumer_offsets(group, &offsets, at, 3)
            .unwrap()
    };
    let start = 1_000 * DAY_MS;
    assert_eq!(commit("idle", start), OffsetsCommitted::Stored);
    assert_eq!(commit("consuming", start), OffsetsCommitted::Stored);
    assert_eq!(commit("recent", start), OffsetsCommitted::Stored);
    assert_eq!(commit("fourth", start), OffsetsCommitted::TooManyGroups);
    assert!(metadata.consumer_offsets("fourth").unwrap().is_empty());
    assert_eq!(commit("recent", start + DAY_MS), OffsetsCommitted::Stored);

    let later = start + 7 * DAY_MS + 1;
    let active = ["consuming".to_string()];
    assert_eq!(
        metadata
            .forget_idle_groups(later, retention, &active)
            .unwrap(),
        1
    );
    assert!(metadata.consumer_offsets("idle").unwrap().is_empty());
    assert_eq!(metadata.consumer_offsets("consuming").unwrap(), offsets);
    assert_eq!(metadata.consumer_offsets("recent").unwrap(), offsets);
    assert_eq!(
        commit("fourth", later),
        OffsetsCommitted::Stored,
        "room again"
    );

    // Its members gone at `later`, "consuming" is idle from then on.
    let end = later + 7 * DAY_MS;
    assert_eq!(metadata.forget_idle_groups(end, retention, &[]).unwrap(), 1);
    assert!(metadata.consumer_offsets("recent").unwrap().is_empty());
    assert_eq!(metadata.consumer_offsets("consuming").unwrap(), offsets);
    assert_eq!(
        metadata
            .forget_idle_groups(end + 1, retention, &[])
            .unwrap(),
        2
    );
    assert!(metadata.consumer_offsets("consuming").unwrap().is_empty());
}

/// Groups that committed before their activity was recorded are counted, and idle,
/// from the first open after it was.
#[test]
fn groups_committed_before_their_activity_was_recorded_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    {
        let metadata = Metadata::open(&path).unwrap();
        metadata
            .connection()
            .execute_batch(
                "DROP TABLE consumer_group_activity;
                 INSERT INTO consumer_offsets VALUES ('old', 'db.t', 0, 5, NULL);",
            )
            .unwrap();
    }
    let metadata = Metadata::open(&path).unwrap();
    let offsets = [ConsumerOffset {
        topic: "db.t".into(),
        partition: 0,
        offset: 1,
        metadata: None,
    }];
    assert_eq!(
        metadata
            .commit_consumer_offsets("new", &offsets, now_ms(), 1)
            .unwrap(),
        OffsetsCommitted::TooManyGroups
    );
    let retention = Duration::from_secs(60);
    assert_eq!(
        metadata
            .forget_idle_groups(now_ms(), retention, &[])
            .unwrap(),
        0
    );
    let after = now_ms() + 60_001;
    assert_eq!(
        metadata.forget_idle_groups(after, retention, &[]).unwrap(),
        1
    );
    assert!(metadata.consumer_offsets("old").unwrap().is_empty());
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
