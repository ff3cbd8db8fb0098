//! A node served on a loopback port over a temporary data directory, restartable.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use mink_client::MinkClient;
use mink_core::options::TableOptions;
use mink_core::table::{TableDescriptor, TablePath};
use mink_kv::BufferLimits;
use mink_log::LogConfig;
use mink_node::server::{ServerHandle, serve};
use mink_node::{Node, NodeConfig, NodeError};
use tempfile::TempDir;
use tokio::net::TcpListener;

/// A running node and a client connected to it.
pub(crate) struct TestNode {
    pub(crate) dir: TempDir,
    node: Option<Arc<Node>>,
    pub(crate) client: MinkClient,
    handle: Option<ServerHandle>,
    config: NodeConfig,
}

impl TestNode {
    /// A node with fsync on, small segments, so tests cross segment boundaries, and a
    /// small KV write buffer (8 KiB a bucket), so primary-key tables' rows go to the KV
    /// store's files every few writes, beside the writes that follow.
    pub(crate) async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`TestNode::start`]'s node, its configuration changed by `configure`.
    pub(crate) async fn start_with(configure: impl FnOnce(&mut NodeConfig)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = NodeConfig::new(dir.path());
        config.log = LogConfig {
            segment_bytes: 64 << 10,
            cache_bytes: 128 << 10,
            ..LogConfig::default()
        };
        config.kv.buffer = BufferLimits::within(64 << 10);
        configure(&mut config);
        let (node, handle, client) = open(&config).await;
        Self {
            dir,
            node: Some(node),
            client,
            handle: Some(handle),
            config,
        }
    }

    /// Shuts the server down, drops the node and opens it again over the same files.
    pub(crate) async fn restart(&mut self) {
        self.stop().await;
        self.reopen().await;
    }

    /// Like [`TestNode::restart`], with the disk lost in between ([`LOST_DISK`]): a node
    /// whose log is in a store (`NodeConfig::log_store`) rebuilds it from there.
    pub(crate) async fn restart_losing_disk(&mut self) {
        self.stop().await;
        remove_dirs(self.dir.path(), &LOST_DISK);
        self.reopen().await;
    }

    /// Shuts the server down and waits until the node (and its data-dir lock) is gone.
    async fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown().await.expect("clean shutdown");
        }
        // The old node (and its data-dir lock) must be gone before reopening.
        let old = self.node.take().expect("running");
        for _ in 0..500 {
            if Arc::strong_count(&old) == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            Arc::strong_count(&old),
            1,
            "the old node is still referenced"
        );
        drop(old);
    }

    /// Opens the node again over its data directory and serves it.
    async fn reopen(&mut self) {
        let (node, handle, client) = open(&self.config).await;
        self.node = Some(node);
        self.handle = Some(handle);
        self.client = client;
    }

    pub(crate) fn node(&self) -> &Arc<Node> {
        self.node.as_ref().expect("running")
    }

    pub(crate) fn addr(&self) -> String {
        self.handle.as_ref().expect("running").addr().to_string()
    }
}

async fn open(config: &NodeConfig) -> (Arc<Node>, ServerHandle, MinkClient) {
    // The old node's lock file is closed, but a process another test spawns at that moment
    // carries a copy of every open file until it starts its program, the lock with it:
    // the lock is gone within moments, so a reopen waits for it briefly.
    let mut attempts = 0;
    let node = loop {
        match Node::open(config.clone()).await {
            Err(NodeError::DataDirLocked(_)) if attempts < 250 => attempts += 1,
            opened => break opened.expect("open node"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let handle = serve(Arc::clone(&node), listener).await.expect("serve");
    let client = MinkClient::connect(&handle.addr().to_string())
        .await
        .expect("connect");
    (node, handle, client)
}

/// What a node that loses its disk loses: its log and its KV store (`meta.db` and the
/// lake stay, as on a node whose metadata is elsewhere).
pub(crate) const LOST_DISK: [&str; 2] = ["log", "kv"];

/// Deletes the directories `dirs` of a stopped node's data directory (those that exist).
/// A node stopped in this process may still be letting go of its KV store, whose
/// background thread can finish a compaction (a new file) during the removal: a
/// directory found not empty is removed again.
pub(crate) fn remove_dirs(data_dir: &Path, dirs: &[&str]) {
    for dir in dirs {
        let path = data_dir.join(dir);
        let mut attempts = 0;
        loop {
            match std::fs::remove_dir_all(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempts < 50 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    panic!("remove {}: {e}", path.display())
                }
                _ => break,
            }
        }
    }
}

/// The `--log-store` URL of a store in the local directory `dir`.
pub(crate) fn file_store_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// Options of a table with a lake that the tiering service leaves alone for an hour:
/// its rounds are run by the test (`tier`, `CALL system.tier`).
pub(crate) fn lake_options() -> TableOptions {
    TableOptions {
        lake_enabled: true,
        lake_freshness: std::time::Duration::from_secs(3600),
        ..TableOptions::default()
    }
}

/// `(id BIGINT NOT NULL, name STRING)`, bucketed by id.
pub(crate) fn events_table(name: &str, buckets: u32, options: TableOptions) -> TableDescriptor {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    let options = TableOptions {
        bucket_num: buckets,
        bucket_key: Some(vec!["id".into()]),
        ..options
    };
    TableDescriptor::new(
        TablePath::new("test", name),
        schema,
        vec![],
        vec![],
        options,
    )
    .expect("valid table")
}

/// A batch of `events_table` rows with the given ids.
pub(crate) fn events(table: &TableDescriptor, ids: &[i64]) -> RecordBatch {
    let names = ids.iter().map(|i| format!("event-{i}"));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.to_vec())),
        Arc::new(StringArray::from_iter_values(names)),
    ];
    RecordBatch::try_new(Arc::clone(table.schema()), columns).expect("batch")
}

/// A deterministic seed: `MINK_TEST_SEED` when set, else from the clock. Printed so a
/// failure can be replayed.
pub(crate) fn seed(test: &str) -> u64 {
    let seed = std::env::var("MINK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    eprintln!("{test}: seed {seed} (replay with MINK_TEST_SEED={seed})");
    seed
}

/// The values of each batch's first column (an `Int64` id), in order.
pub(crate) fn first_column_ids(batches: &[RecordBatch]) -> Vec<i64> {
    use arrow::array::AsArray;
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}
