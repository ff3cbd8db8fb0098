//! The node: every table's metadata and every bucket's tablets, in one process.
//!
//! The node owns its data directory exclusively (a lock file keeps a second process out):
//!
//! ```text
//! <data-dir>/LOCK                         held while the node runs
//! <data-dir>/log-store                    the log store's URL, with --log-store
//! <data-dir>/meta.db                      tables, schema versions, partitions (SQLite;
//!                                         in a cluster, etcd holds them: `cluster`)
//! <data-dir>/kv/                          KV tablets of primary-key tables (fjall)
//! <data-dir>/log/t<table_id>/b<bucket>/   segments of an unpartitioned table's bucket
//! <data-dir>/log/t<table_id>/p<partition_id>/b<bucket>/
//! <data-dir>/lake/                        the embedded Iceberg lake (catalog.db, warehouse/)
//! ```
//!
//! Writes are validated here: the batch must carry the table's current schema, and every
//! row must belong to the bucket (and partition) it is sent to, so bucket `b` of the log is
//! exactly the rows whose bucket key hashes to `b`. A partition is created by the first
//! write into it.
//!
//! [`Node`]'s methods all live in this module, one file per job (public methods named):
//!
//! | file                | job                                                              | methods |
//! |---------------------|------------------------------------------------------------------|---------|
//! | `node.rs`           | opening the node; tables, buckets and offsets as they are now    | `open`, `lake`, `list_tables`, `describe`, `bucket`, `list_buckets`, `list_led_buckets`, `list_offsets`, `lake_snapshots` |
//! | `config`            | how a node is run ([`NodeConfig`], [`Failpoint`])                | |
//! | `ddl`               | creating, dropping and evolving tables, each step undone when a later one fails | `create_table`, `drop_table`, `add_column` |
//! | `write`             | validated writes into a bucket, creating its partition on the first | `write`, `write_anywhere`, `write_as`, `recall_writer` |
//! | `validate`          | the checks of a batch or a definition against its table          | |
//! | `lookup`            | key reads of a primary-key table's bucket                        | `lookup`, `kv_bucket` |
//! | [`union`]           | planning Union reads: the lake below the seam, then the log range | `plan_union`, `plan_table_union`, `live_range` |
//! | `lake_plan`         | planning Lake reads and the changes between two lake snapshots   | `plan_lake`, `plan_changes` |
//! | `retention`         | trimming logs to their `log.ttl`                                 | `enforce_retention` |
//! | `checkpoints`       | checkpointing KV stores into the log store                       | `checkpoint_kv`, `kv_checkpoint_due` |
//! | `log_store`         | the log store the node's logs are kept in                        | |
//! | `leadership`        | which buckets the node leads, and buckets moving to and from it through the log store (answered NotLeader elsewhere) | `take_over_bucket`, `hand_over_bucket`, `membership`, `list_nodes` |
//! | `metrics`           | the figures a scrape reads now                                   | `scraped_metrics` |
//! | `storage`, `open_buckets` | where tablets live on disk; the node-wide bound on open buckets | |

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use datafusion_execution::TaskContext;
use datafusion_execution::memory_pool::MemoryPool;
use datafusion_execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use mink_core::protocol::{
    BucketId, BucketList, BucketSeam, BucketStatus, LakeSnapshotInfo, NotLeader, list_offsets,
};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::{Lake, LakeConfig};
use tracing::info;

use crate::cluster::Membership;
use crate::cluster::drain::release_holds;
use crate::error::{NodeError, Result};
use crate::metadata::{EtcdMetadata, Metadata, MetadataStore};
use crate::node::union::{FoldedRange, LocatedRange};
use leadership::{Slot, join};
use metrics::WriteCounters;
use mink_kv::{KvTablet, Restored};
use mink_log::LogTablet;

mod checkpoints;
mod config;
mod ddl;
mod lake_plan;
mod leadership;
mod log_store;
mod lookup;
mod metrics;
mod open_buckets;
mod retention;
mod storage;
pub mod union;
mod validate;
mod write;

pub use checkpoints::CheckpointPass;
pub use config::{
    DEFAULT_KV_CHECKPOINT_INTERVAL, DEFAULT_MAX_BUCKET_NUM, DEFAULT_MAX_PARTITIONS, Failpoint,
    NodeConfig,
};
use open_buckets::OpenBuckets;
pub use open_buckets::raise_open_file_limit;
use storage::Storage;
pub use storage::bucket_key;
use validate::check_bucket_address;

/// Long searches of logs for idempotent writers that run at once: writers a client makes
/// up (each naming the log's start) read at most this many logs at once, whatever their
/// number, while every other write and read goes on.
const MAX_CONCURRENT_RECALLS: usize = 4;
/// A search of at most this many bytes of log runs without waiting for a turn: a
/// writer's first write to a bucket, and most retries, search that little.
const SHORT_RECALL_BYTES: u64 = 8 << 20;

/// A mink node: leads the buckets of its tables (alone, every bucket).
#[derive(Debug)]
pub struct Node {
    storage: Storage,
    /// In a cluster, the node's membership: it leads buckets only while it holds its
    /// lease.
    membership: Option<Arc<Membership>>,
    /// Tables, partitions and lake records.
    pub(crate) metadata: Arc<dyn MetadataStore>,
    tables: RwLock<BTreeMap<TablePath, Arc<TableState>>>,
    /// The buckets of every table, against [`NodeConfig::max_open_buckets`].
    open_buckets: OpenBuckets,
    /// Opened on first use: a node whose tables have no lake never touches it.
    lake: tokio::sync::OnceCell<Lake>,
    /// In a cluster, the client of the other nodes, connected on first use
    /// ([`Node::peers`]).
    peers: tokio::sync::OnceCell<mink_client::MinkClient>,
    /// One tiering round or compaction at a time (mink is the only writer of its lake
    /// tables); the lock holds the lake indexes of primary-key tables.
    pub(crate) tiering: tokio::sync::Mutex<crate::lake_index::LakeIndexes>,
    /// Held while the node brings its tables in line with the cluster's metadata
    /// (`Node::follow_tables`), with when a table it did not know made it last do so.
    following: Mutex<Option<std::time::Instant>>,
    /// One CREATE or DROP TABLE at a time: a create opens its tablets without holding
    /// the table map's lock, so readers and writers of other tables never wait for it.
    ddl: tokio::sync::Mutex<()>,
    /// Turns of the long searches of a bucket's log for an idempotent writer it does not
    /// know ([`Node::recall_writer`]: each reads up to [`mink_log::MAX_RECALL_BYTES`]).
    recalls: tokio::sync::Semaphore,
    /// What the plans of the node's Union and Lake reads run in: the node's memory pool,
    /// and DataFusion's caches (Parquet footers) kept from one read to the next.
    reads: Arc<RuntimeEnv>,
    _lock: File,
}

/// One bucket: its log and, for a primary-key table, its KV store.
#[derive(Debug)]
pub struct Bucket {
    /// The bucket's log (the changelog of a primary-key table).
    pub log: LogTablet,
    /// The current rows of a primary-key table's bucket.
    pub kv: Option<KvTablet>,
    /// The lake rows its range replaces, as the last union read's plan located them.
    pub located: LocatedRange,
    /// Its range folded by key, as the last LiveRange read folded it.
    pub folded: FoldedRange,
    /// What restoring its KV store from its checkpoint in the log store took, if the
    /// node's open did (the store held nothing of the bucket).
    pub restored: Option<Restored>,
    /// How long opening its log took: for a primary-key bucket, the replay into its KV
    /// store of the log after what the store held.
    pub log_opened_in: Duration,
    /// The leader epoch this node leads it in (a cluster's assignment numbers each
    /// leader of a bucket; 0 on a single node).
    pub epoch: u64,
}

/// Buckets of a table, each with its tablets.
pub(crate) type BucketTablets = Vec<(BucketId, Arc<Bucket>)>;

/// A table and its open tablets.
#[derive(Debug)]
struct TableState {
    descriptor: RwLock<Arc<TableDescriptor>>,
    /// Partition name (`None` when unpartitioned) -> that partition's buckets, as this
    /// node holds them.
    partitions: Mutex<BTreeMap<Option<String>, Vec<Slot>>>,
    /// Its rows and bytes written, as metrics count them.
    written: WriteCounters,
}

impl TableState {
    fn new(
        descriptor: Arc<TableDescriptor>,
        partitions: BTreeMap<Option<String>, Vec<Slot>>,
    ) -> Self {
        Self {
            written: WriteCounters::of(&descriptor.path),
            descriptor: RwLock::new(descriptor),
            partitions: Mutex::new(partitions),
        }
    }

    fn descriptor(&self) -> Arc<TableDescriptor> {
        Arc::clone(&self.descriptor.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn partitions(&self) -> std::sync::MutexGuard<'_, BTreeMap<Option<String>, Vec<Slot>>> {
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Node {
    /// Opens the node over its data directory, recovering every tablet; with a log store
    /// (given, or remembered by the data directory), every log is first rebuilt from it.
    /// Must run inside a tokio runtime (each tablet starts its appender task).
    ///
    /// # Errors
    /// [`NodeError::DataDirLocked`] when another process holds the directory; I/O,
    /// metadata and corruption errors from recovery.
    pub async fn open(mut config: NodeConfig) -> Result<Arc<Self>> {
        // Durably, the data directory's own name included: a power cut must not take the
        // directory, and every table in it, away.
        mink_durable::create_dir_all(&config.data_dir.join("log"))?;
        let lock = File::create(config.data_dir.join("LOCK"))?;
        if lock.try_lock().is_err() {
            return Err(NodeError::DataDirLocked(
                config.data_dir.display().to_string(),
            ));
        }
        let membership = match &config.cluster {
            Some(cluster) => Some(Arc::new(join(cluster, &config).await?)),
            None => None,
        };
        config.log.store = log_store::open(&config).await?;
        let metadata: Arc<dyn MetadataStore> = match &config.cluster {
            Some(cluster) => {
                // This life's open drained the earlier ones: they hold no bucket now.
                let mut client = cluster.connect().await?;
                release_holds(&mut client, cluster, &cluster.node_id, None).await?;
                Arc::new(EtcdMetadata::connect(
                    &cluster.endpoints,
                    &cluster.prefix,
                    &cluster.node_id,
                )?)
            }
            None => Arc::new(Metadata::open(&config.data_dir.join("meta.db"))?),
        };
        let reads = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::clone(&config.memory_pool))
            .build_arc()
            .map_err(|e| NodeError::Io(std::io::Error::other(format!("the read runtime: {e}"))))?;
        let open_buckets = OpenBuckets::new(config.max_open_buckets);
        let storage = Storage {
            config,
            kv: Mutex::new(None),
        };
        let mut tables = BTreeMap::new();
        let mut opened = 0;
        for descriptor in metadata.load_tables()? {
            let descriptor = Arc::new(descriptor);
            let mut partitions = BTreeMap::new();
            let records = match descriptor.is_partitioned() {
                true => metadata
                    .partitions(descriptor.table_id)?
                    .into_iter()
                    .map(Some)
                    .collect(),
                false => vec![None],
            };
            for partition in records {
                let name = partition.as_ref().map(|p| p.name.clone());
                // A cluster's node leads nothing before the assignment says so.
                let slots = match membership {
                    Some(_) => Slot::moving(&descriptor, name.as_deref()),
                    None => Slot::led(storage.open_partition(&descriptor, partition.as_ref())?),
                };
                partitions.insert(name, slots);
            }
            info!(table = %descriptor.path, partitions = partitions.len(), "opened table");
            opened += (partitions.values().flatten())
                .filter(|slot| slot.tablets().is_some())
                .count();
            tables.insert(
                descriptor.path.clone(),
                Arc::new(TableState::new(descriptor, partitions)),
            );
        }
        open_buckets.opened_at_start(opened);
        if let Some(store) = &storage.config.log.store {
            store.forget_unopened()?;
        }
        Ok(Arc::new(Self {
            storage,
            membership,
            metadata,
            tables: RwLock::new(tables),
            open_buckets,
            lake: tokio::sync::OnceCell::new(),
            peers: tokio::sync::OnceCell::new(),
            tiering: tokio::sync::Mutex::default(),
            following: Mutex::new(None),
            ddl: tokio::sync::Mutex::default(),
            recalls: tokio::sync::Semaphore::new(MAX_CONCURRENT_RECALLS),
            reads,
            _lock: lock,
        }))
    }

    /// The lake, opened on first use.
    pub async fn lake(&self) -> Result<&Lake> {
        self.lake
            .get_or_try_init(|| async {
                let config = match &self.storage.config.lake {
                    Some(config) => config.clone(),
                    None => LakeConfig::of_data_dir(&self.storage.config.data_dir)?,
                };
                Ok(Lake::open(config).await?)
            })
            .await
    }

    /// The context a read's plan executes in: its memory reserved from the node's pool
    /// ([`NodeConfig::memory_pool`]).
    pub(crate) fn read_context(&self) -> Arc<TaskContext> {
        Arc::new(TaskContext::default().with_runtime(Arc::clone(&self.reads)))
    }

    /// The memory pool of the node ([`NodeConfig::memory_pool`]).
    pub(crate) fn memory_pool(&self) -> &Arc<dyn MemoryPool> {
        &self.reads.memory_pool
    }

    /// The configured failpoint.
    pub(crate) fn failpoint(&self) -> Option<Failpoint> {
        self.storage.config.failpoint
    }

    /// A table's state. In a cluster, a table this node does not know yet (created
    /// through another node a moment ago) is looked for in the cluster's metadata first.
    fn table(&self, path: &TablePath) -> Result<Arc<TableState>> {
        let known = || self.tables_read().get(path).cloned();
        if let Some(state) = known() {
            return Ok(state);
        }
        let looked = self.membership.is_some() && self.look_for_new_tables();
        (looked.then(known).flatten()).ok_or_else(|| NodeError::TableNotFound(path.to_string()))
    }

    fn tables_read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<TablePath, Arc<TableState>>> {
        self.tables.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Every open table's state, taken out of the lock (a long pass over them, as
    /// retention's or checkpoints', holds it no longer than the copy).
    fn table_states(&self) -> Vec<Arc<TableState>> {
        self.tables_read().values().cloned().collect()
    }

    fn tables_write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<TablePath, Arc<TableState>>> {
        self.tables.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The tables, sorted; only those of `database` when given.
    pub fn list_tables(&self, database: Option<&str>) -> Vec<TablePath> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|path| database.is_none_or(|d| path.database == d))
            .cloned()
            .collect()
    }

    /// The descriptor of a table.
    pub fn describe(&self, path: &TablePath) -> Result<Arc<TableDescriptor>> {
        Ok(self.table(path)?.descriptor())
    }

    /// The table and an existing bucket.
    pub fn bucket(&self, bucket: &BucketId) -> Result<(Arc<TableDescriptor>, Arc<Bucket>)> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let descriptor = state.descriptor();
        check_bucket_address(&descriptor, bucket)?;
        let partitions = state.partitions();
        let tablets = partitions
            .get(&bucket.partition)
            .and_then(|slots| slots.get(bucket.bucket as usize))
            .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?
            .led_tablets()?;
        Ok((descriptor, tablets))
    }

    /// Every bucket of a table created so far, with its offsets.
    ///
    /// # Errors
    /// [`NodeError::NotLeader`] of the first bucket this node does not lead.
    pub fn list_buckets(&self, path: &TablePath) -> Result<Vec<BucketStatus>> {
        let listed = self.list_led_buckets(path)?;
        match listed.elsewhere.into_iter().next() {
            Some(not_leader) => Err(NodeError::NotLeader(not_leader)),
            None => Ok(listed.buckets),
        }
    }

    /// The buckets of a table this node leads, with their offsets, and where the others
    /// are (`list_buckets`' answer: a client asks their leaders for them).
    pub fn list_led_buckets(&self, path: &TablePath) -> Result<BucketList> {
        let (table, led, elsewhere) = self.led_buckets(path)?;
        let recorded = self.metadata.latest_lake_snapshot(table.table_id)?;
        let seams = crate::tiering::offsets_of(recorded.as_ref())?;
        let buckets = led
            .into_iter()
            .map(|(bucket, tablet)| {
                let (log_start, high_watermark) = tablet.log.offsets();
                let seam = seams.get(&bucket);
                BucketStatus {
                    lake_log_end_offset: seam,
                    lake_snapshot_id: recorded.as_ref().map(|r| r.snapshot_id),
                    store: log_store::usage(&tablet),
                    // A seam below the log's start (no round yet, the log trimmed by
                    // its TTL): the oldest row not tiered is the log's first.
                    oldest_untiered_at_ms: (table.lake_enabled)
                        .then(|| tablet.log.commit_time_at(seam.max(log_start)))
                        .flatten(),
                    leader_epoch: tablet.epoch,
                    bucket: Some(bucket),
                    log_start,
                    high_watermark,
                }
            })
            .collect();
        Ok(BucketList { buckets, elsewhere })
    }

    /// Every table with the buckets this node leads and their figures, and where the
    /// others are (what metrics and the status page show); a table dropped meanwhile is
    /// left out.
    pub fn every_table_buckets(&self) -> Vec<(Arc<TableDescriptor>, BucketList)> {
        (self.table_states().into_iter())
            .filter_map(|state| {
                let table = state.descriptor();
                let listed = self.list_led_buckets(&table.path).ok()?;
                Some((table, listed))
            })
            .collect()
    }

    /// A table, the buckets of it this node leads, with their tablets, and what requests
    /// for each other bucket are answered (in a cluster: its leader, or that it moves).
    pub(crate) fn led_buckets(
        &self,
        path: &TablePath,
    ) -> Result<(Arc<TableDescriptor>, BucketTablets, Vec<NotLeader>)> {
        let state = self.table(path)?;
        let table = state.descriptor();
        let (mut led, mut elsewhere) = (Vec::new(), Vec::new());
        for (partition, slots) in state.partitions().iter() {
            for (bucket, slot) in slots.iter().enumerate() {
                match slot {
                    Slot::Led(tablets) => {
                        let id = BucketId {
                            table: path.to_string(),
                            partition: partition.clone(),
                            bucket: bucket as u32,
                        };
                        led.push((id, Arc::clone(tablets)));
                    }
                    Slot::Elsewhere(not_leader) => elsewhere.push(not_leader.clone()),
                }
            }
        }
        Ok((table, led, elsewhere))
    }

    /// The lake snapshots mink recorded for a table (rounds and compactions), oldest first.
    pub fn lake_snapshots(&self, path: &TablePath) -> Result<Vec<LakeSnapshotInfo>> {
        let table = self.describe(path)?;
        self.metadata
            .lake_snapshots(table.table_id)?
            .into_iter()
            .map(|record| {
                let offsets = mink_lake::offsets::BucketOffsets::from_json(&record.offsets)?;
                Ok(LakeSnapshotInfo {
                    snapshot_id: record.snapshot_id,
                    committed_at: record.committed_at,
                    buckets: offsets
                        .seams()
                        .map(|(partition, bucket, log_end_offset)| BucketSeam {
                            partition: partition.map(str::to_string),
                            bucket,
                            log_end_offset,
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// `list_offsets`: Earliest, Latest or the first offset at a timestamp.
    pub fn list_offsets(&self, bucket: &BucketId, spec: &list_offsets::Spec) -> Result<i64> {
        let (_, target) = self.bucket(bucket)?;
        let tablet = &target.log;
        let (log_start, high_watermark) = tablet.offsets();
        Ok(match spec {
            list_offsets::Spec::Earliest(_) => log_start,
            list_offsets::Spec::Latest(_) => high_watermark,
            list_offsets::Spec::Timestamp(ts) => tablet.offset_for_timestamp(*ts),
        })
    }

    /// The partition names of a partitioned table in the order they were created (none for
    /// an unpartitioned table): a numbering that a new partition only extends.
    pub fn partitions_in_creation_order(&self, path: &TablePath) -> Result<Vec<String>> {
        let table = self.describe(path)?;
        let mut partitions = self.metadata.partitions(table.table_id)?;
        partitions.sort_by_key(|p| p.partition_id);
        Ok(partitions.into_iter().map(|p| p.name).collect())
    }

    /// The node's data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.storage.config.data_dir
    }
}

#[cfg(test)]
mod tests;
