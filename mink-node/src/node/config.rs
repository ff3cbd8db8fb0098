//! How a node is run: its data directory, the stores' settings, the bounds on what
//! clients may create, and the crash point tests set.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use datafusion_execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use mink_kv::KvConfig;
use mink_lake::LakeConfig;
use mink_log::{LogConfig, LogStoreConfig, StoreCrash, StoreFailpoint};

use crate::cluster::ClusterConfig;

/// How a node is run.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where everything is stored.
    pub data_dir: PathBuf,
    /// How logs are stored.
    pub log: LogConfig,
    /// The object store that is the logs' durable home (`--log-store`); `None`: the one
    /// the data directory remembers, if any, else the local disk. Opening the node opens
    /// it and sets `log.store`.
    pub log_store: Option<LogStoreConfig>,
    /// Where the lake is; `None`: the embedded lake in `<data-dir>/lake`.
    pub lake: Option<LakeConfig>,
    /// The cluster the node is a member of (`mink server --cluster`): its metadata is in
    /// etcd, it leads the buckets the controller assigns it, and buckets move between
    /// nodes through the log store (which it needs). `None`: a single node.
    pub cluster: Option<ClusterConfig>,
    /// A deliberate crash point, for crash tests (`MINK_FAILPOINT`).
    pub failpoint: Option<Failpoint>,
    /// Most buckets a table may have (`bucket.num`); default
    /// [`DEFAULT_MAX_BUCKET_NUM`]. Every bucket holds an open segment file (and, for a
    /// primary-key table, a KV keyspace) for as long as the node runs.
    pub max_bucket_num: u32,
    /// Most partitions a partitioned table may have; default [`DEFAULT_MAX_PARTITIONS`].
    /// A partition opens `bucket.num` buckets.
    pub max_partitions: usize,
    /// Most buckets the node holds open, over every table and partition; `None` (the
    /// default): no bound. `mink server` derives it from its open-file limit
    /// ([`crate::flight::limits::max_open_buckets`], after
    /// [`raise_open_file_limit`](super::raise_open_file_limit)).
    pub max_open_buckets: Option<usize>,
    /// The memory the node's reads hold beyond a batch in flight (the log range a union read
    /// folds by key) is reserved here; a read past it fails alone with
    /// `RESOURCE_EXHAUSTED`. `mink server` shares its SQL pool (`--sql-memory-limit`) with
    /// the node; the default is unbounded, for embedded nodes and benchmarks.
    pub memory_pool: Arc<dyn MemoryPool>,
    /// The memory of the KV store of primary-key tables: its write buffer and its cache.
    pub kv: KvConfig,
    /// With a log store: how often each primary-key bucket that changed writes its next
    /// KV checkpoint run (`--kv-checkpoint-interval`, default
    /// [`DEFAULT_KV_CHECKPOINT_INTERVAL`]).
    pub kv_checkpoint_interval: Duration,
}

/// The default [`NodeConfig::kv_checkpoint_interval`].
pub const DEFAULT_KV_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);

/// Default bound on `bucket.num`.
pub const DEFAULT_MAX_BUCKET_NUM: u32 = 1024;
/// Default bound on the partitions of one table.
pub const DEFAULT_MAX_PARTITIONS: usize = 1024;

/// Where a node deliberately crashes, so tests can check what recovery makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// Abort the process once a tiering round's files are written, before its commit.
    AbortBeforeLakeCommit,
    /// Abort the process after a tiering round's Iceberg commit, before mink records it.
    AbortAfterLakeCommit,
    /// Abort the process once a compaction's files are written, before its commit.
    AbortBeforeCompactionCommit,
    /// Abort the process after a compaction's Iceberg commit, before mink records it.
    AbortAfterCompactionCommit,
    /// Abort the process while creating a table: its metadata committed, half of its
    /// buckets opened.
    AbortDuringCreateTable,
    /// Abort the process after an expiry's Iceberg commit, before mink forgets the expired
    /// snapshots and deletes their files.
    AbortAfterExpiryCommit,
    /// With a log store: a crash at one of its points ([`StoreCrash`]).
    Store(StoreCrash),
}

impl Failpoint {
    /// Parses `MINK_FAILPOINT` values (`abort-before-lake-commit`,
    /// `abort-after-lake-commit`, `abort-before-compaction-commit`, `abort-after-compaction-commit`,
    /// `abort-during-create-table`, `abort-after-expiry-commit`; with a log store
    /// `abort-mid-wal-upload`, `abort-after-wal-upload`, `abort-after-stream-upload`,
    /// `abort-after-kv-run-upload`, `abort-mid-kv-restore`, `abort-mid-upkeep-deletion`,
    /// `abort-after-merged-upload`, each optionally `@N`: once the point was passed N
    /// times).
    pub fn parse(text: &str) -> Option<Self> {
        if let Some(crash) = parse_store_crash(text) {
            return Some(Self::Store(crash));
        }
        match text {
            "abort-before-lake-commit" => Some(Self::AbortBeforeLakeCommit),
            "abort-after-lake-commit" => Some(Self::AbortAfterLakeCommit),
            "abort-before-compaction-commit" => Some(Self::AbortBeforeCompactionCommit),
            "abort-after-compaction-commit" => Some(Self::AbortAfterCompactionCommit),
            "abort-during-create-table" => Some(Self::AbortDuringCreateTable),
            "abort-after-expiry-commit" => Some(Self::AbortAfterExpiryCommit),
            _ => None,
        }
    }
}

/// A log store's crash point, `POINT[@N]` (N: the passes before the crash, default 0).
fn parse_store_crash(text: &str) -> Option<StoreCrash> {
    let (point, skip) = match text.split_once('@') {
        Some((point, skip)) => (point, skip.parse().ok()?),
        None => (text, 0),
    };
    let point = match point {
        "abort-mid-wal-upload" => StoreFailpoint::AbortMidWalUpload,
        "abort-after-wal-upload" => StoreFailpoint::AbortAfterWalUpload,
        "abort-after-stream-upload" => StoreFailpoint::AbortAfterStreamUpload,
        "abort-after-kv-run-upload" => StoreFailpoint::AbortAfterKvRunUpload,
        "abort-mid-kv-restore" => StoreFailpoint::AbortMidKvRestore,
        "abort-mid-upkeep-deletion" => StoreFailpoint::AbortMidUpkeepDeletion,
        "abort-after-merged-upload" => StoreFailpoint::AbortAfterMergedUpload,
        _ => return None,
    };
    Some(StoreCrash { point, skip })
}

impl NodeConfig {
    /// The default configuration for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            log: LogConfig::default(),
            log_store: None,
            lake: None,
            cluster: None,
            failpoint: None,
            max_bucket_num: DEFAULT_MAX_BUCKET_NUM,
            max_partitions: DEFAULT_MAX_PARTITIONS,
            max_open_buckets: None,
            memory_pool: Arc::new(UnboundedMemoryPool::default()),
            kv: KvConfig::default(),
            kv_checkpoint_interval: DEFAULT_KV_CHECKPOINT_INTERVAL,
        }
    }
}
