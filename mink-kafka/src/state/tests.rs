//! The Kafka state in each of its stores: a node's `meta.db`, and a cluster's etcd (a
//! real one, Debian's `etcd-server`), over a node that names the topics' tables.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::testing::Etcd;
use mink_node::{Node, NodeConfig};

use super::{ConsumerOffset, EtcdState, KafkaState, OffsetsCommitted, ProducerBatch, SqliteState};

/// A node with tables `db.a` and `db.b`.
struct Tables {
    _dir: tempfile::TempDir,
    node: Arc<Node>,
}

impl Tables {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::new(dir.path());
        config.log.sync = false;
        let node = Node::open(config).await.unwrap();
        let tables = Self { _dir: dir, node };
        tables.create("db.a").await;
        tables.create("db.b").await;
        tables
    }

    async fn create(&self, topic: &str) {
        let schema = Schema::new(vec![Field::new("value", DataType::Int64, true)]);
        let path = TablePath::parse(topic).unwrap();
        let table = TableDescriptor::new(path, schema, vec![], vec![], TableOptions::default());
        self.node.create_table(table.unwrap(), false).await.unwrap();
    }

    async fn drop_and_create(&self, topic: &str) {
        let path = TablePath::parse(topic).unwrap();
        self.node.drop_table(&path, false, None).await.unwrap();
        self.create(topic).await;
    }

    /// The node's `meta.db` as the Kafka listener opens it.
    fn sqlite(&self) -> SqliteState {
        SqliteState::open(
            &self.node.data_dir().join("meta.db"),
            Arc::clone(&self.node),
        )
        .unwrap()
    }
}

/// The tables' node and an etcd.
struct Fixture {
    _etcd: Etcd,
    tables: Tables,
    endpoint: String,
}

impl Fixture {
    async fn start() -> Self {
        let etcd = Etcd::start();
        Self {
            endpoint: etcd.endpoint.clone(),
            _etcd: etcd,
            tables: Tables::start().await,
        }
    }

    /// A node's view of the cluster's state: its own etcd client.
    async fn state(&self) -> EtcdState {
        let client = etcd_client::Client::connect([self.endpoint.as_str()], None)
            .await
            .unwrap();
        EtcdState::new(client, "/test", Arc::clone(&self.tables.node))
    }
}

fn offset(topic: &str, partition: i32, offset: i64) -> ConsumerOffset {
    ConsumerOffset {
        topic: topic.into(),
        partition,
        offset,
        metadata: None,
    }
}

fn sorted(mut offsets: Vec<ConsumerOffset>) -> Vec<(String, i32, i64)> {
    offsets.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    (offsets.into_iter())
        .map(|o| (o.topic, o.partition, o.offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_from_several_nodes_at_once_all_land_and_are_read_back() {
    let fixture = Fixture::start().await;
    let states = [fixture.state().await, fixture.state().await];
    // 16 commits of one group at once, from two nodes' clients, each its own partition:
    // a commit that met another's retries on what that one stored.
    let commits = (0..16).map(|partition| {
        let state = &states[partition as usize % 2];
        state.commit_offsets(
            "g",
            vec![offset("db.a", partition, 100 + i64::from(partition))],
            10,
        )
    });
    for committed in futures::future::join_all(commits).await {
        assert_eq!(committed.unwrap(), OffsetsCommitted::Stored);
    }
    let read = sorted(states[1].committed_offsets("g").await.unwrap());
    let expected: Vec<_> = (0..16)
        .map(|p| ("db.a".to_string(), p, 100 + i64::from(p)))
        .collect();
    assert_eq!(read, expected);
    // A later commit replaces a partition's offset and keeps the others.
    (states[0].commit_offsets("g", vec![offset("db.a", 3, 7), offset("db.b", 0, 1)], 10))
        .await
        .unwrap();
    let read = sorted(states[0].committed_offsets("g").await.unwrap());
    assert_eq!(read.len(), 17);
    assert!(read.contains(&("db.a".into(), 3, 7)));
    assert!(read.contains(&("db.b".into(), 0, 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_bounded_expire_and_forget_dropped_tables() {
    let fixture = Fixture::start().await;
    let state = fixture.state().await;
    for group in ["g1", "g2"] {
        let committed = state.commit_offsets(group, vec![offset("db.a", 0, 5)], 2);
        assert_eq!(committed.await.unwrap(), OffsetsCommitted::Stored);
    }
    let third = state.commit_offsets("g3", vec![offset("db.a", 0, 5)], 2);
    assert_eq!(third.await.unwrap(), OffsetsCommitted::TooManyGroups);
    let again = state.commit_offsets("g1", vec![offset("db.a", 1, 6)], 2);
    assert_eq!(again.await.unwrap(), OffsetsCommitted::Stored);

    // A table dropped and created again under its name: its offsets are not found.
    (state.commit_offsets("g2", vec![offset("db.b", 0, 9)], 2))
        .await
        .unwrap();
    fixture.tables.drop_and_create("db.b").await;
    let read = sorted(state.committed_offsets("g2").await.unwrap());
    assert_eq!(read, vec![("db.a".into(), 0, 5)]);

    // Idle for no time at all, g1 kept as a group with members: g2 is forgotten.
    let forgotten = state.forget_idle_groups(Duration::ZERO, vec!["g1".into()]);
    assert_eq!(forgotten.await.unwrap(), 1);
    assert!(state.committed_offsets("g2").await.unwrap().is_empty());
    assert_eq!(state.committed_offsets("g1").await.unwrap().len(), 2);
    let new_group = state.commit_offsets("g3", vec![offset("db.a", 0, 5)], 2);
    assert_eq!(new_group.await.unwrap(), OffsetsCommitted::Stored);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_ids_are_unique_across_nodes_and_last_batches_expire() {
    let fixture = Fixture::start().await;
    let states = [fixture.state().await, fixture.state().await];
    let asked = (0..40).map(|i| states[i % 2].new_producer_id());
    let ids: Vec<i64> = (futures::future::join_all(asked).await.into_iter())
        .map(Result::unwrap)
        .collect();
    let distinct: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "a producer id was given twice: {ids:?}"
    );
    assert!(ids.iter().all(|id| *id > 0));

    let batch = ProducerBatch {
        epoch: 2,
        first_sequence: 10,
        last_sequence: 19,
        base_offset: 1234,
    };
    (states[0].record_producer_batch(ids[0], "db.a", 3, batch))
        .await
        .unwrap();
    let found = states[1]
        .last_producer_batch(ids[0], "db.a", 3)
        .await
        .unwrap();
    assert_eq!(found, Some(batch));
    assert_eq!(
        states[1]
            .last_producer_batch(ids[0], "db.a", 4)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        states[1]
            .last_producer_batch(ids[0], "db.gone", 3)
            .await
            .unwrap(),
        None
    );

    // More producers than a page of a listing holds.
    let more =
        (1_000..2_500).map(|producer| states[0].record_producer_batch(producer, "db.b", 0, batch));
    for recorded in futures::future::join_all(more).await {
        recorded.unwrap();
    }
    // Nothing is idle for an hour; everything for no time at all.
    assert_eq!(
        states[1]
            .forget_idle_producers(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        states[1]
            .forget_idle_producers(Duration::ZERO)
            .await
            .unwrap(),
        1501
    );
    assert_eq!(
        states[0]
            .last_producer_batch(ids[0], "db.a", 3)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_state_persists_across_a_reopen_and_forgets_dropped_tables() {
    let tables = Tables::start().await;
    let batch = ProducerBatch {
        epoch: 0,
        first_sequence: 5,
        last_sequence: 9,
        base_offset: 42,
    };
    let first_id = {
        let state = tables.sqlite();
        let committed = vec![offset("db.a", 0, 7), offset("db.b", 1, 3)];
        state.commit_offsets("g", committed, 1).await.unwrap();
        state
            .commit_offsets("g", vec![offset("db.a", 0, 8)], 1)
            .await
            .unwrap();
        state
            .record_producer_batch(1, "db.a", 0, batch)
            .await
            .unwrap();
        state.new_producer_id().await.unwrap()
    };
    let state = tables.sqlite();
    let read = sorted(state.committed_offsets("g").await.unwrap());
    assert_eq!(read, [("db.a".into(), 0, 8), ("db.b".into(), 1, 3)]);
    assert!(state.committed_offsets("other").await.unwrap().is_empty());
    assert_eq!(
        state.last_producer_batch(1, "db.a", 0).await.unwrap(),
        Some(batch)
    );
    assert!(
        state.new_producer_id().await.unwrap() > first_id,
        "ids are never reused"
    );

    tables.drop_and_create("db.a").await;
    let read = sorted(state.committed_offsets("g").await.unwrap());
    assert_eq!(read, [("db.b".into(), 1, 3)]);
    assert_eq!(state.last_producer_batch(1, "db.a", 0).await.unwrap(), None);
    // The new table's own commits are kept.
    state
        .commit_offsets("g", vec![offset("db.a", 0, 1)], 1)
        .await
        .unwrap();
    assert_eq!(sorted(state.committed_offsets("g").await.unwrap()).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_groups_are_bounded_and_idle_ones_forgotten() {
    let tables = Tables::start().await;
    let state = tables.sqlite();
    for group in ["idle", "consuming", "recent"] {
        let committed = state.commit_offsets(group, vec![offset("db.a", 0, 1)], 3);
        assert_eq!(committed.await.unwrap(), OffsetsCommitted::Stored);
    }
    let fourth = state.commit_offsets("fourth", vec![offset("db.a", 0, 1)], 3);
    assert_eq!(fourth.await.unwrap(), OffsetsCommitted::TooManyGroups);
    // "idle" and "consuming" last committed an hour ago; "consuming" has members.
    let an_hour_ago = mink_node::metadata::now_ms() - 3_600_000;
    let connection = rusqlite::Connection::open(tables.node.data_dir().join("meta.db")).unwrap();
    connection
        .execute(
            "UPDATE consumer_group_activity SET active_at = ?1 WHERE group_id <> 'recent'",
            [an_hour_ago],
        )
        .unwrap();
    let minute = Duration::from_secs(60);
    let forgotten = state.forget_idle_groups(minute, vec!["consuming".into()]);
    assert_eq!(forgotten.await.unwrap(), 1);
    assert!(state.committed_offsets("idle").await.unwrap().is_empty());
    assert_eq!(state.committed_offsets("consuming").await.unwrap().len(), 1);
    assert_eq!(state.committed_offsets("recent").await.unwrap().len(), 1);
    let fourth = state.commit_offsets("fourth", vec![offset("db.a", 0, 1)], 3);
    assert_eq!(
        fourth.await.unwrap(),
        OffsetsCommitted::Stored,
        "room again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_producers_expire_and_only_the_newest_id_is_kept() {
    let tables = Tables::start().await;
    let state = tables.sqlite();
    let batch = ProducerBatch {
        epoch: 0,
        first_sequence: 0,
        last_sequence: 0,
        base_offset: 0,
    };
    for partition in [0, 1] {
        (state.record_producer_batch(1, "db.a", partition, batch))
            .await
            .unwrap();
    }
    assert_eq!(
        state
            .forget_idle_producers(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        state.forget_idle_producers(Duration::ZERO).await.unwrap(),
        1
    );
    assert_eq!(state.last_producer_batch(1, "db.a", 1).await.unwrap(), None);
    for _ in 0..3 {
        state.new_producer_id().await.unwrap();
    }
    let connection = rusqlite::Connection::open(tables.node.data_dir().join("meta.db")).unwrap();
    let ids: i64 = connection
        .query_row("SELECT count(*) FROM producer_ids", [], |row| row.get(0))
        .unwrap();
    assert_eq!(ids, 1);
}

/// A `meta.db` whose Kafka tables predate table ids and activity: its rows get their
/// table's id (those of a table that is gone are deleted), its groups their activity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_written_before_table_ids_were_kept_is_named_on_open() {
    let tables = Tables::start().await;
    let connection = rusqlite::Connection::open(tables.node.data_dir().join("meta.db")).unwrap();
    connection
        .execute_batch(
            "CREATE TABLE consumer_offsets (
                 group_id TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
                 offset INTEGER NOT NULL, metadata TEXT, PRIMARY KEY (group_id, topic, partition));
             INSERT INTO consumer_offsets VALUES ('old', 'db.a', 0, 5, NULL);
             INSERT INTO consumer_offsets VALUES ('old', 'db.gone', 0, 6, NULL);",
        )
        .unwrap();
    let state = tables.sqlite();
    let read = sorted(state.committed_offsets("old").await.unwrap());
    assert_eq!(read, [("db.a".into(), 0, 5)]);
    let rows: i64 = connection
        .query_row("SELECT count(*) FROM consumer_offsets", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(rows, 1, "the row of a table that is gone is deleted");
    // The group counts against the bound from the open on.
    let new = state.commit_offsets("new", vec![offset("db.a", 0, 1)], 1);
    assert_eq!(new.await.unwrap(), OffsetsCommitted::TooManyGroups);
}

/// A group's offsets are one etcd value: a commit that would make it pass its bound
/// (each offset's metadata within Kafka's 4 KiB, but hundreds of partitions) is refused
/// whole, and the offsets stored before stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_s_offsets_in_etcd_are_bounded() {
    let fixture = Fixture::start().await;
    let state = fixture.state().await;
    let stored = state.commit_offsets("g", vec![offset("db.a", 0, 1)], 10);
    assert_eq!(stored.await.unwrap(), OffsetsCommitted::Stored);
    let huge: Vec<ConsumerOffset> = (0..300)
        .map(|partition| ConsumerOffset {
            metadata: Some("m".repeat(4 << 10)),
            ..offset("db.a", partition, 2)
        })
        .collect();
    match state.commit_offsets("g", huge, 10).await {
        Err(crate::error::KafkaError::Refused(error, _)) => {
            assert_eq!(error, kafka_protocol::ResponseError::OffsetMetadataTooLarge);
        }
        other => panic!("a commit past the group's bound was {other:?}"),
    }
    let read = sorted(state.committed_offsets("g").await.unwrap());
    assert_eq!(read, [("db.a".into(), 0, 1)]);
}
