//! Buckets moving between the nodes of a cluster through one store: each node writes its
//! own WAL objects (`nodes/<id>/`), a bucket handed over is read whole by the node that
//! takes it over, and a dead node's buckets are handed over by a writer that reads its
//! WAL objects in its place.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use mink_core::table::TableDescriptor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;

use super::*;
use crate::testing::{rows, table, write};
use crate::tests::ids;
use crate::{LogConfig, LogTablet, Write, WriteOp};

/// A node of the cluster: its writer over the shared store, its disk, the buckets it
/// leads.
struct TestNode {
    store: Arc<LogStore>,
    disk: TempDir,
    tablets: HashMap<String, LogTablet>,
}

impl TestNode {
    /// Node `id`'s writer over `store`, its logs on `disk`.
    async fn open(store: &Path, id: &str, disk: TempDir) -> Self {
        let config = Self::config(store, id);
        let store = LogStore::open(config, disk.path(), 256).await.unwrap();
        Self {
            store,
            disk,
            tablets: HashMap::new(),
        }
    }

    /// Node `id`'s writer over `store`.
    fn config(store: &Path, id: &str) -> LogStoreConfig {
        LogStoreConfig {
            node: Some(id.into()),
            ..LogStoreConfig::new(format!("file://{}", store.display()))
        }
    }

    /// Opens bucket `key` as the store and this node's WAL objects hold it.
    fn open_bucket(&mut self, key: &str) {
        let config = LogConfig {
            segment_bytes: 256,
            store: Some(Arc::clone(&self.store)),
            ..LogConfig::default()
        };
        let tablet = LogTablet::open(key.into(), &self.disk.path().join(key), config, None);
        self.tablets.insert(key.into(), tablet.unwrap());
    }

    /// Takes bucket `key` over from the node that handed it over.
    async fn take_over(&mut self, key: &str) {
        let (store, dir) = (Arc::clone(&self.store), self.disk.path().join(key));
        tokio::task::spawn_blocking(move || store.take_over(&dir))
            .await
            .unwrap()
            .unwrap();
        self.open_bucket(key);
    }

    /// Hands bucket `key` over: every frame of it in the store.
    async fn hand_over(&mut self, key: &str) {
        let tablet = self.tablets.remove(key).expect("a bucket the node leads");
        tablet.hand_over().await.unwrap();
    }

    /// The node dies: its tablets and writer go, nothing handed over; its disk is
    /// returned.
    fn kill(self) -> TempDir {
        drop(self.tablets);
        drop(self.store);
        self.disk
    }

    /// Every row of bucket `key`, by write.
    async fn read(&self, key: &str) -> Vec<Vec<i64>> {
        ids(&self.tablets[key].read(0, u64::MAX).await.unwrap())
    }
}

fn tempdir() -> TempDir {
    tempfile::tempdir().unwrap()
}

/// Writes `ids`, one row each, to `log`: each write's ids.
async fn append(
    log: &LogTablet,
    table: &Arc<TableDescriptor>,
    ids: std::ops::Range<i64>,
) -> Vec<Vec<i64>> {
    let mut written = Vec::new();
    for id in ids {
        write(log, table, WriteOp::Append(rows(table, &[id], "x"))).await;
        written.push(vec![id]);
    }
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_handed_over_is_read_whole_by_the_node_taking_it_over_and_back() {
    let store_dir = tempdir();
    let table = table(&[]);
    let mut a = TestNode::open(store_dir.path(), "a", tempdir()).await;
    let mut b = TestNode::open(store_dir.path(), "b", tempdir()).await;
    assert_eq!(
        (a.store.epoch(), b.store.epoch()),
        (1, 1),
        "epochs are each node's own"
    );
    for node in ["a", "b"] {
        let own = store_dir.path().join("nodes").join(node);
        assert!(
            own.join("epochs").is_dir() && own.join("wal").is_dir(),
            "{node}"
        );
    }

    a.open_bucket("t1/b0");
    let mut model = append(&a.tablets["t1/b0"], &table, 0..30).await;
    let tablet = a.tablets.remove("t1/b0").unwrap();
    tablet.hand_over().await.unwrap();
    let refused = tablet
        .write(Write {
            op: WriteOp::Append(rows(&table, &[99], "x")),
            table: Arc::clone(&table),
            stream: None,
            writer: None,
            sent: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(refused, LogError::HandedOver { .. }), "{refused}");
    assert_eq!(
        tablet.offsets(),
        (0, 30),
        "the refused write is not in the log"
    );
    drop(tablet);

    b.take_over("t1/b0").await;
    assert_eq!(b.tablets["t1/b0"].offsets(), (0, 30));
    assert_eq!(b.read("t1/b0").await, model);
    model.extend(append(&b.tablets["t1/b0"], &table, 30..40).await);
    b.hand_over("t1/b0").await;

    // Back on a, whose local log of the bucket is stale: the store's is read.
    a.take_over("t1/b0").await;
    assert_eq!(a.read("t1/b0").await, model);
    model.extend(append(&a.tablets["t1/b0"], &table, 40..45).await);

    // a loses its disk: the bucket comes back from the store and a's own WAL objects.
    drop(a.kill());
    let mut a = TestNode::open(store_dir.path(), "a", tempdir()).await;
    assert_eq!(a.store.epoch(), 2);
    a.open_bucket("t1/b0");
    assert_eq!(a.read("t1/b0").await, model);
}

/// A random history over three nodes and four buckets: writes at each bucket's leader,
/// buckets moved to another node, nodes killed (tablets and writer dropped, nothing
/// handed over) and then restarted (with or without their disk) or replaced (a writer
/// over the dead node's WAL objects opens its buckets and hands them over to live
/// nodes; or the node paused meanwhile and wakes as a zombie, whose writes are refused),
/// dead nodes coming back. After each move every bucket moved reads exactly what
/// was acknowledged, and at the end every bucket does, and again after every node lost
/// its disk. `MINK_LOG_MOVES_SEEDS` sets how many histories run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_of_moves_and_deaths_lose_nothing_acknowledged() {
    let seeds: u64 = std::env::var("MINK_LOG_MOVES_SEEDS")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(8);
    for seed in 0..seeds {
        println!("seed {seed}");
        history(seed).await;
    }
}

const NODES: [&str; 3] = ["n0", "n1", "n2"];
const BUCKETS: [&str; 4] = ["t1/b0", "t1/b1", "t2/b0", "t2/p3/b0"];

/// The cluster of a history: the live nodes, the dead ones' disks, and who leads what.
struct Cluster {
    store: TempDir,
    live: BTreeMap<&'static str, TestNode>,
    dead: BTreeMap<&'static str, TempDir>,
    /// Nodes that paused while their buckets went to others, still running.
    zombies: Vec<TestNode>,
    leaders: BTreeMap<&'static str, &'static str>,
}

impl Cluster {
    fn led_by(&self, node: &str) -> Vec<&'static str> {
        (self.leaders.iter())
            .filter(|(_, leader)| **leader == node)
            .map(|(bucket, _)| *bucket)
            .collect()
    }

    /// Moves `bucket` to `to`, a live node.
    async fn move_bucket(&mut self, bucket: &'static str, to: &'static str) {
        let from = self.leaders[bucket];
        self.live.get_mut(from).unwrap().hand_over(bucket).await;
        self.live.get_mut(to).unwrap().take_over(bucket).await;
        self.leaders.insert(bucket, to);
    }

    /// Kills `node`; its buckets are then led again by the node restarted (with its disk
    /// or a new one), or its sequence is drained and they go to live nodes.
    /// Half the nodes replaced do not die but pause: they wake as zombies, fenced.
    async fn kill(&mut self, node: &'static str, rng: &mut StdRng) {
        let killed = self.live.remove(node).unwrap();
        let buckets = self.led_by(node);
        if self.live.is_empty() || rng.random_bool(0.5) {
            let disk = killed.kill();
            let disk = if rng.random_bool(0.5) {
                disk
            } else {
                tempdir()
            };
            let mut restarted = TestNode::open(self.store.path(), node, disk).await;
            for bucket in buckets {
                restarted.open_bucket(bucket);
            }
            self.live.insert(node, restarted);
            return;
        }
        let disk = match rng.random_bool(0.5) {
            true => killed.kill(),
            false => {
                self.zombies.push(killed);
                tempdir()
            }
        };
        self.dead.insert(node, disk);
        let config = TestNode::config(self.store.path(), node);
        let drained = crate::drain(config, tempdir().path(), 256).await.unwrap();
        for key in drained {
            assert!(BUCKETS.contains(&key.as_str()), "{key}");
        }
        let live: Vec<&'static str> = self.live.keys().copied().collect();
        for bucket in buckets {
            let to = live[rng.random_range(0..live.len())];
            self.live.get_mut(to).unwrap().take_over(bucket).await;
            self.leaders.insert(bucket, to);
        }
    }

    /// A dead node starts again, leading nothing.
    async fn revive(&mut self, node: &'static str) {
        let disk = self.dead.remove(node).unwrap();
        let revived = TestNode::open(self.store.path(), node, disk).await;
        self.live.insert(node, revived);
    }

    async fn read(&self, bucket: &str) -> Vec<Vec<i64>> {
        self.live[self.leaders[bucket]].read(bucket).await
    }
}

async fn history(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let table = table(&[]);
    let mut cluster = Cluster {
        store: tempdir(),
        live: BTreeMap::new(),
        dead: BTreeMap::new(),
        zombies: Vec::new(),
        leaders: BTreeMap::new(),
    };
    for node in NODES {
        let opened = TestNode::open(cluster.store.path(), node, tempdir()).await;
        cluster.live.insert(node, opened);
    }
    let mut model: HashMap<&str, Vec<Vec<i64>>> = HashMap::new();
    for (i, bucket) in BUCKETS.into_iter().enumerate() {
        let leader = NODES[i % NODES.len()];
        cluster.live.get_mut(leader).unwrap().open_bucket(bucket);
        cluster.leaders.insert(bucket, leader);
        model.insert(bucket, Vec::new());
    }
    let mut next_id = 0;
    for step in 0..40 {
        let bucket = BUCKETS[rng.random_range(0..BUCKETS.len())];
        let leader = cluster.leaders[bucket];
        let live: Vec<&'static str> = cluster.live.keys().copied().collect();
        match rng.random_range(0..10) {
            0..6 => {
                let count = rng.random_range(1..8);
                let log = &cluster.live[leader].tablets[bucket];
                let written = append(log, &table, next_id..next_id + count).await;
                model.get_mut(bucket).unwrap().extend(written);
                next_id += count;
                // A zombie's write is never acknowledged.
                if let Some(zombie) = cluster.zombies.last()
                    && let Some(log) = zombie.tablets.values().next()
                {
                    let write = Write {
                        op: WriteOp::Append(rows(&table, &[-1], "zombie")),
                        table: Arc::clone(&table),
                        stream: None,
                        writer: None,
                        sent: None,
                    };
                    let refused = log.write(write).await.unwrap_err();
                    assert!(
                        matches!(refused, LogError::Fenced { .. }),
                        "seed {seed} step {step}: {refused}"
                    );
                }
            }
            6..8 => {
                let others: Vec<_> = live.into_iter().filter(|node| *node != leader).collect();
                if let Some(&to) = others.get(rng.random_range(0..others.len().max(1))) {
                    cluster.move_bucket(bucket, to).await;
                    assert_eq!(
                        cluster.read(bucket).await,
                        model[bucket],
                        "seed {seed} step {step}: {bucket} moved to {to}"
                    );
                }
            }
            8 => {
                let node = live[rng.random_range(0..live.len())];
                let buckets = cluster.led_by(node);
                cluster.kill(node, &mut rng).await;
                for bucket in buckets {
                    assert_eq!(
                        cluster.read(bucket).await,
                        model[bucket],
                        "seed {seed} step {step}: {node} killed, {bucket} on {}",
                        cluster.leaders[bucket]
                    );
                }
            }
            _ => {
                if let Some(&node) = cluster.dead.keys().next() {
                    cluster.revive(node).await;
                }
            }
        }
    }
    for bucket in BUCKETS {
        assert_eq!(
            cluster.read(bucket).await,
            model[bucket],
            "seed {seed}: {bucket} at the end"
        );
    }
    cluster.zombies.clear();
    // Every node loses its disk: every bucket comes back from the store.
    let nodes: Vec<&'static str> = cluster.live.keys().copied().collect();
    for node in nodes {
        drop(cluster.live.remove(node).unwrap().kill());
        let mut restarted = TestNode::open(cluster.store.path(), node, tempdir()).await;
        for bucket in cluster.led_by(node) {
            restarted.open_bucket(bucket);
        }
        cluster.live.insert(node, restarted);
    }
    for bucket in BUCKETS {
        assert_eq!(
            cluster.read(bucket).await,
            model[bucket],
            "seed {seed}: {bucket} after every disk was lost"
        );
    }
}
