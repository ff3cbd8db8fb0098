//! KV checkpoints in a log store, through a served node and its client: a primary-key
//! table without a lake, whose `log.ttl` removes the start of its log, reads back exactly
//! (every bucket's Snapshot, key lookups, SQL through the node's client) after restarts
//! that keep the disk and restarts that lose it (`log/` and `kv/`), over a random history
//! of upserts, deletes, checkpoints and retention, checked against a model after each
//! step.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use mink_client::MinkClient;
use mink_core::protocol::{BucketId, list_offsets::Spec};
use mink_core::table::TableDescriptor;
use mink_log::LogStoreConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::pk_support::{Key, Model, delete_some_keys, pk_keys, pk_rows, pk_table, values};
use crate::process::run_sql;
use crate::support::{TestNode, file_store_url, seed};

/// Steps of a history in CI; `MINK_KV_CHECKPOINT_STEPS` runs more.
const STEPS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_lake_past_its_ttl_restores_its_rows_after_lost_disks() {
    let test = "a_table_without_a_lake_past_its_ttl_restores_its_rows_after_lost_disks";
    let seed = seed(test);
    let steps = std::env::var("MINK_KV_CHECKPOINT_STEPS")
        .ok()
        .and_then(|steps| steps.parse().ok())
        .unwrap_or(STEPS);
    let store = tempfile::tempdir().expect("store dir");
    let mut node = TestNode::start_with(|config| {
        config.log_store = Some(LogStoreConfig::new(file_store_url(store.path())));
        // Segments that seal every few writes, so retention has segments to remove.
        config.log.segment_bytes = 4 << 10;
    })
    .await;
    let mut table = pk_table("kv", 2);
    table.log_ttl = Some(Duration::from_secs(1));
    let table = (node.client.create_table(&table, false).await).expect("create");
    let mut history = History {
        table,
        model: Model::new(),
        touched: BTreeSet::new(),
        rng: StdRng::seed_from_u64(seed),
    };
    let mut lost_past_the_start = 0;
    for step in 0..steps {
        match history.rng.random_range(0..100) {
            0..45 => history.upsert(&node.client).await,
            45..60 => {
                let (client, table) = (&node.client, &history.table);
                delete_some_keys(client, table, &mut history.model, &mut history.rng).await;
            }
            60..72 => checkpoint(&node).await,
            72..85 => history.expire(&node).await,
            85..92 => node.restart().await,
            _ => {
                let start = history.log_start(&node.client).await;
                eprintln!("step {step}: a restart that loses the disk (log start {start})");
                lost_past_the_start += usize::from(start > 0);
                node.restart_losing_disk().await;
            }
        }
        let when = format!("seed {seed}, step {step}");
        history.check(&node.client, &when).await;
    }
    if lost_past_the_start == 0 {
        history.expire(&node).await;
        let start = history.log_start(&node.client).await;
        assert!(start > 0, "seed {seed}: retention removed nothing");
        node.restart_losing_disk().await;
        history
            .check(&node.client, &format!("seed {seed}, at the end"))
            .await;
    }
    history.upsert(&node.client).await;
    checkpoint(&node).await;
    check_operators_view(&node);
}

/// Once every bucket is checkpointed, `system.log_store` shows each at its high
/// watermark, and when this node wrote a run of the buckets the last write touched.
fn check_operators_view(node: &TestNode) {
    let query = "SELECT high_watermark, kv_checkpoint_offset, kv_checkpoint_runs, \
                 kv_checkpoint_bytes, kv_checkpoint_written_at IS NOT NULL \
                 FROM system.log_store WHERE table_name = 'test.kv'";
    let (ok, stdout, stderr) = run_sql(&node.addr(), query);
    assert!(ok, "{query}: {stderr}");
    let rows: Vec<Vec<String>> = (stdout.lines().skip(1))
        .map(|line| line.split(',').map(str::to_string).collect())
        .collect();
    assert!(!rows.is_empty(), "{stdout}");
    for row in &rows {
        let [high_watermark, offset, runs, bytes, _] = row.as_slice() else {
            panic!("{stdout}");
        };
        if high_watermark != "0" {
            assert_eq!(offset, high_watermark, "{stdout}");
            assert_ne!(runs, "0", "{stdout}");
            assert_ne!(bytes, "0", "{stdout}");
        }
    }
    let written = rows.iter().filter(|row| row[4] == "true").count();
    assert!(written > 0, "no run written since the last open: {stdout}");
}

/// Writes every bucket's next checkpoint run.
async fn checkpoint(node: &TestNode) {
    let served = Arc::clone(node.node());
    let pass = tokio::task::spawn_blocking(move || served.checkpoint_kv());
    let pass = pass.await.expect("checkpoints");
    assert_eq!(pass.failed, 0, "{pass:?}");
}

/// A table, the rows it should hold, and every key ever written to it.
struct History {
    table: TableDescriptor,
    model: Model,
    touched: BTreeSet<Key>,
    rng: StdRng,
}

impl History {
    /// Upserts a few random keys (of two partitions and a few dozen ids).
    async fn upsert(&mut self, client: &MinkClient) {
        let rng = &mut self.rng;
        let rows: BTreeMap<Key, Option<String>> = (0..rng.random_range(1..40))
            .map(|_| {
                let dt = ["2024-01-01", "2024-01-02"][rng.random_range(0..2)];
                let key = (
                    dt.to_string(),
                    rng.random_range(0..60),
                    rng.random_range(0..2),
                );
                let v = (rng.random_bool(0.9)).then(|| format!("v{}", rng.random_range(0..1000)));
                (key, v)
            })
            .collect();
        let rows: Vec<_> = rows.into_iter().collect();
        let batch = pk_rows(&self.table, &rows);
        client.write(&self.table, &batch).await.expect("upsert");
        self.touched.extend(rows.iter().map(|(key, _)| key.clone()));
        self.model.extend(rows);
    }

    /// Lets the log's segments age past the ttl, seals them with a write, checkpoints and
    /// applies retention: the log's start moves past what the checkpoints hold.
    async fn expire(&mut self, node: &TestNode) {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        self.upsert(&node.client).await;
        checkpoint(node).await;
        let served = Arc::clone(node.node());
        let retention = tokio::task::spawn_blocking(move || served.enforce_retention());
        retention.await.expect("retention task").expect("retention");
    }

    /// The greatest log start of the table's buckets.
    async fn log_start(&self, client: &MinkClient) -> i64 {
        let mut start = 0;
        for bucket in self.buckets(client).await {
            let earliest = client.list_offsets(&bucket, Spec::Earliest(true)).await;
            start = start.max(earliest.expect("earliest"));
        }
        start
    }

    async fn buckets(&self, client: &MinkClient) -> Vec<BucketId> {
        let listed = client
            .list_buckets(&self.table.path)
            .await
            .expect("buckets");
        (listed.into_iter())
            .map(|status| status.bucket.expect("a bucket id"))
            .collect()
    }

    /// Every bucket's Snapshot together holds the model's rows, and a lookup of every
    /// key ever written finds exactly the model's.
    async fn check(&self, client: &MinkClient, when: &str) {
        let mut read = Vec::new();
        for bucket in self.buckets(client).await {
            let snapshot = client.snapshot(&bucket, &[], 0).await.expect("snapshot");
            read.extend(snapshot.batches.iter().flat_map(values));
        }
        read.sort();
        let expected: Vec<_> = self.model.clone().into_iter().collect();
        assert_eq!(read, expected, "{when}: the buckets' snapshots");

        let asked: Vec<Key> = self.touched.iter().cloned().collect();
        if asked.is_empty() {
            return;
        }
        let found = client.lookup(&self.table, &pk_keys(&asked), &[]).await;
        let found = found.expect("lookup");
        let mut found: Vec<(usize, (Key, Option<String>))> = (found.key_indices.iter())
            .map(|&index| index as usize)
            .zip(values(&found.rows))
            .collect();
        found.sort();
        let expected: Vec<_> = (asked.iter().enumerate())
            .filter_map(|(index, key)| Some((index, (key.clone(), self.model.get(key)?.clone()))))
            .collect();
        assert_eq!(found, expected, "{when}: lookups of every key written");
    }
}
