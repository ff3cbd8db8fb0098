//! The cluster's Kafka state against a real etcd (Debian's `etcd-server`), over a node
//! that names the topics' tables.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::metadata::{ConsumerOffset, OffsetsCommitted, ProducerBatch};
use mink_node::testing::Etcd;
use mink_node::{Node, NodeConfig};

use super::{EtcdState, KafkaState};

struct Fixture {
    _etcd: Etcd,
    _dir: tempfile::TempDir,
    node: Arc<Node>,
    endpoint: String,
}

impl Fixture {
    async fn start() -> Self {
        let etcd = Etcd::start();
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::new(dir.path());
        config.log.sync = false;
        let node = Node::open(config).await.unwrap();
        let fixture = Self {
            endpoint: etcd.endpoint.clone(),
            _etcd: etcd,
            _dir: dir,
            node,
        };
        fixture.create("db.a").await;
        fixture.create("db.b").await;
        fixture
    }

    /// Another node's view of the same state: its own etcd client.
    async fn state(&self) -> EtcdState {
        let client = etcd_client::Client::connect([self.endpoint.as_str()], None)
            .await
            .unwrap();
        EtcdState::new(client, "/test", Arc::clone(&self.node))
    }

    async fn create(&self, topic: &str) {
        let schema = Schema::new(vec![Field::new("value", DataType::Int64, true)]);
        let path = TablePath::parse(topic).unwrap();
        let table = TableDescriptor::new(path, schema, vec![], vec![], TableOptions::default());
        self.node.create_table(table.unwrap(), false).await.unwrap();
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
    let path = TablePath::parse("db.b").unwrap();
    fixture.node.drop_table(&path, false, None).await.unwrap();
    fixture.create("db.b").await;
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
        1
    );
    assert_eq!(
        states[0]
            .last_producer_batch(ids[0], "db.a", 3)
            .await
            .unwrap(),
        None
    );
}
