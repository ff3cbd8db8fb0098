//! Membership and the controller against a real etcd.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema};
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use mink_log::LogStoreConfig;

use super::assignment::Leader;
use super::controller::{self, assignment};
use super::drain::Drainer;
use super::*;
use crate::metadata::{EtcdMetadata, MetadataStore, TableMetadata};
use crate::testing::Etcd;

/// etcd's shortest lease here (it raises shorter ones to 1.5 times its election timeout).
const LEASE: Duration = Duration::from_secs(2);

fn config(etcd: &Etcd, node: &str) -> ClusterConfig {
    ClusterConfig {
        endpoints: vec![etcd.endpoint.clone()],
        prefix: "/test".into(),
        node_id: node.into(),
        advertise: format!("{node}.example:9123"),
        lease: LEASE,
        peers: mink_client::ConnectOptions::default(),
    }
}

async fn member_ids(etcd: &Etcd) -> Vec<String> {
    let config = config(etcd, "reader");
    let mut client = config.connect().await.unwrap();
    let members = membership::members(&mut client, &config).await.unwrap();
    members.into_iter().map(|member| member.id).collect()
}

/// Waits up to 15 s for `done`.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut done: impl FnMut() -> F,
) {
    for _ in 0..150 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not after 15 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_id_is_one_live_members_and_a_leaving_node_goes_at_once() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "a")).await.unwrap();
    let b = Membership::join(config(&etcd, "b")).await.unwrap();
    assert!(a.holds_lease() && b.holds_lease());
    assert_eq!(member_ids(&etcd).await, ["a", "b"]);
    let error = Membership::join(config(&etcd, "a")).await.unwrap_err();
    assert!(error.to_string().contains("node id a is taken"), "{error}");
    a.leave().await.unwrap();
    assert_eq!(member_ids(&etcd).await, ["b"]);
    // The id is free again: a restarted node takes it.
    let again = Membership::join(config(&etcd, "a")).await.unwrap();
    assert!(again.holds_lease());
    assert_eq!(member_ids(&etcd).await, ["a", "b"]);
}

/// A lease etcd ended (here revoked from outside) is noticed at the next renewal: the
/// node joins again under a new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_ended_joins_again() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "a")).await.unwrap();
    let first = a.lease();
    let mut client = config(&etcd, "a").connect().await.unwrap();
    client.lease_revoke(first).await.unwrap();
    // The node may rejoin at once (it renews every third of the lease), so the record's
    // absence is not checked here; the revoked lease is gone, with what it held.
    let ended = client.lease_time_to_live(first, None).await.unwrap();
    assert!(ended.ttl() <= 0, "the first lease is gone");
    eventually("a new lease", || async { a.lease() != first }).await;
    eventually("a member again", || async {
        member_ids(&etcd).await == ["a"]
    })
    .await;
    let record = client.get("/test/nodes/a", None).await.unwrap();
    assert_eq!(
        record.kvs()[0].lease(),
        a.lease(),
        "recorded under the new lease"
    );
    assert!(a.holds_lease());
}

/// A node that cannot renew its lease (etcd paused) lets go of it within the lease's
/// time to live, on its own; once etcd answers again it holds one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_renew_lets_go_of_its_lease_in_time() {
    let etcd = Etcd::start();
    let a = Membership::join(config(&etcd, "a")).await.unwrap();
    assert!(a.holds_lease());
    etcd.signal("STOP");
    let paused = std::time::Instant::now();
    while a.holds_lease() {
        assert!(
            paused.elapsed() <= LEASE,
            "still held {:?} after etcd paused",
            paused.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    etcd.signal("CONT");
    eventually("the lease held again", || async { a.holds_lease() }).await;
    eventually("a member again", || async {
        member_ids(&etcd).await == ["a"]
    })
    .await;
}

fn table(name: &str, buckets: u32) -> TableDescriptor {
    let schema = Schema::new(vec![Field::new("a", DataType::Int32, true)]);
    let mut table = TableDescriptor::new(
        TablePath::new("db", name),
        schema,
        vec![],
        vec![],
        TableOptions::default(),
    )
    .unwrap();
    table.bucket_num = buckets;
    table
}

async fn current(etcd: &Etcd) -> BTreeMap<String, Leader> {
    let config = config(etcd, "reader");
    let mut client = config.connect().await.unwrap();
    assignment(&mut client, &config).await.unwrap()
}

/// Three nodes: the elected controller spreads every bucket over them; a node that dies
/// (its lease left to end) has its buckets moved to the others with their epochs bumped,
/// the others' staying; when the controller itself dies another takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_spreads_the_buckets_and_moves_a_dead_nodes() {
    let etcd = Etcd::start();
    let metadata: Arc<dyn MetadataStore> = Arc::new(
        EtcdMetadata::connect(std::slice::from_ref(&etcd.endpoint), "/test", "n1").unwrap(),
    );
    metadata.create_table(&table("t1", 4)).unwrap();
    metadata.create_table(&table("t2", 5)).unwrap();
    // All three join before any controller runs: the first assignment is over three.
    let mut memberships = BTreeMap::new();
    for node in ["a", "b", "c"] {
        let membership = Arc::new(Membership::join(config(&etcd, node)).await.unwrap());
        memberships.insert(node, membership);
    }
    let (store, roots) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let drainer = Drainer {
        store: LogStoreConfig::new(format!("file://{}", store.path().display())),
        root: roots.path().to_path_buf(),
        segment_bytes: 1 << 20,
    };
    let mut nodes = BTreeMap::new();
    for (node, membership) in memberships {
        let controller = tokio::spawn(controller::run(
            Arc::clone(&membership),
            Arc::clone(&metadata),
            drainer.clone(),
        ));
        nodes.insert(node, (membership, controller));
    }
    let balanced = |assigned: &BTreeMap<String, Leader>, live: &[&str]| {
        let mut loads = BTreeMap::new();
        for leader in assigned.values() {
            *loads.entry(leader.node.clone()).or_insert(0) += 1;
        }
        assigned.len() == 9
            && loads.len() == live.len()
            && loads.keys().all(|node| live.contains(&node.as_str()))
            && loads.values().max().unwrap() - loads.values().min().unwrap() <= 1
    };
    eventually("every bucket assigned", || async {
        balanced(&current(&etcd).await, &["a", "b", "c"])
    })
    .await;
    let before = current(&etcd).await;
    assert!(
        before.values().all(|leader| leader.epoch == 1),
        "{before:?}"
    );

    // The elected controller dies first, then one more node: each time the rest go on,
    // and only the dead node's buckets move.
    let mut client = config(&etcd, "reader").connect().await.unwrap();
    let elected = client.leader("/test/controller").await.unwrap();
    let controller_node = String::from_utf8_lossy(elected.kv().unwrap().value()).into_owned();
    let next_node = nodes
        .keys()
        .find(|node| **node != controller_node)
        .unwrap()
        .to_string();
    let mut before = before;
    for dead in [controller_node, next_node] {
        let (membership, controller) = nodes.remove(dead.as_str()).unwrap();
        controller.abort();
        drop(membership);
        let live: Vec<&str> = nodes.keys().copied().collect();
        eventually(&format!("{dead}'s buckets moved"), || async {
            balanced(&current(&etcd).await, &live)
        })
        .await;
        let after = current(&etcd).await;
        for (bucket, leader) in &after {
            let was = &before[bucket];
            if was.node == dead {
                assert_eq!(leader.epoch, was.epoch + 1, "{bucket} moved from {dead}");
            } else {
                assert_eq!(leader, was, "{bucket} stayed");
            }
        }
        // The dead node's sequence was drained: nothing marks it any more.
        let mark = format!("/test/incarnations/{dead}");
        assert!(client.get(mark, None).await.unwrap().kvs().is_empty());
        before = after;
    }
}

/// A table created through another node a moment ago is known at once: a request naming
/// a table the node does not know looks in the cluster's metadata before it says "does
/// not exist" (this node follows no assignment here, so nothing else would tell it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_created_through_another_node_is_known_at_once() {
    let etcd = Etcd::start();
    let (dir, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut node_config = crate::node::NodeConfig::new(dir.path());
    node_config.log_store = Some(LogStoreConfig::new(format!(
        "file://{}",
        store.path().display()
    )));
    node_config.cluster = Some(config(&etcd, "n1"));
    let node = crate::Node::open(node_config).await.unwrap();
    let other = EtcdMetadata::connect(std::slice::from_ref(&etcd.endpoint), "/test", "n2").unwrap();
    let created = other.create_table(&table("t9", 2)).unwrap();
    let described = node.describe(&created.path).unwrap();
    assert_eq!(described.table_id, created.table_id);
    let missing = node.describe(&TablePath::new("db", "missing")).unwrap_err();
    assert!(
        matches!(missing, crate::NodeError::TableNotFound(_)),
        "{missing}"
    );
}
