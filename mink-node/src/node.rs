//! The node: every table's metadata and every bucket's tablets, in one process.
//!
//! The node owns its data directory exclusively (a lock file keeps a second process out):
//!
//! ```text
//! <data-dir>/LOCK                         held while the node runs
//! <data-dir>/meta.db                      tables, schema versions, partitions (SQLite)
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

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::Field;
use datafusion_execution::TaskContext;
use datafusion_execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use datafusion_execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use mink_core::protocol::{
    AppendAck, BucketId, BucketSeam, BucketStatus, LakeSnapshotInfo, list_offsets,
};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::{Lake, LakeConfig};
use tracing::{info, warn};

use crate::error::{NodeError, Result};
use crate::metadata::Metadata;
use crate::union::{FoldedTail, LocatedTail};
use mink_kv::{Found, KvConfig, KvTablet, encode_keys, lookup, prefix_lookup};
use mink_log::{LogConfig, LogTablet, SentBatch, Write, WriteOp, WriteStream, WriterTag};

mod open_buckets;
mod storage;
mod validate;

use open_buckets::OpenBuckets;
pub use open_buckets::raise_open_file_limit;
use storage::Storage;
use validate::{
    check_bucket_address, check_routing, check_table_size, conform_keys, conform_to_schema,
};

/// How a node is run.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where everything is stored.
    pub data_dir: PathBuf,
    /// How logs are stored.
    pub log: LogConfig,
    /// Where the lake is; `None`: the embedded lake in `<data-dir>/lake`.
    pub lake: Option<LakeConfig>,
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
    /// [`raise_open_file_limit`]).
    pub max_open_buckets: Option<usize>,
    /// The memory the node's reads hold beyond a batch in flight (the tail a union read
    /// folds by key) is reserved here; a read past it fails alone with
    /// `RESOURCE_EXHAUSTED`. `mink server` shares its SQL pool (`--sql-memory-limit`) with
    /// the node; the default is unbounded, for embedded nodes and benchmarks.
    pub memory_pool: Arc<dyn MemoryPool>,
    /// The memory of the KV store of primary-key tables: its write buffer and its cache.
    pub kv: KvConfig,
}

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
}

impl Failpoint {
    /// Parses `MINK_FAILPOINT` values (`abort-before-lake-commit`,
    /// `abort-after-lake-commit`, `abort-before-compaction-commit`, `abort-after-compaction-commit`,
    /// `abort-during-create-table`, `abort-after-expiry-commit`).
    pub fn parse(text: &str) -> Option<Self> {
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

impl NodeConfig {
    /// The default configuration for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            log: LogConfig::default(),
            lake: None,
            failpoint: None,
            max_bucket_num: DEFAULT_MAX_BUCKET_NUM,
            max_partitions: DEFAULT_MAX_PARTITIONS,
            max_open_buckets: None,
            memory_pool: Arc::new(UnboundedMemoryPool::default()),
            kv: KvConfig::default(),
        }
    }
}

/// A mink node: leads every bucket of every table.
#[derive(Debug)]
pub struct Node {
    storage: Storage,
    pub(crate) metadata: Metadata,
    tables: RwLock<BTreeMap<TablePath, Arc<TableState>>>,
    /// The buckets of every table, against [`NodeConfig::max_open_buckets`].
    open_buckets: OpenBuckets,
    /// Opened on first use: a node whose tables have no lake never touches it.
    lake: tokio::sync::OnceCell<Lake>,
    /// One tiering round or compaction at a time (mink is the only writer of its lake
    /// tables); the lock holds the lake indexes of primary-key tables.
    pub(crate) tiering: tokio::sync::Mutex<crate::lake_index::LakeIndexes>,
    /// One CREATE or DROP TABLE at a time: a create opens its tablets without holding
    /// the table map's lock, so readers and writers of other tables never wait for it.
    ddl: tokio::sync::Mutex<()>,
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
    /// The lake rows its tail replaces, as the last union read's plan located them.
    pub located: LocatedTail,
    /// Its tail folded by key, as the last LiveTail read folded it.
    pub folded: FoldedTail,
}

/// Buckets of a table, each with its tablets.
pub(crate) type BucketTablets = Vec<(BucketId, Arc<Bucket>)>;

/// A table and its open tablets.
#[derive(Debug)]
struct TableState {
    descriptor: RwLock<Arc<TableDescriptor>>,
    /// Partition name (`None` when unpartitioned) -> that partition's tablets, by bucket.
    partitions: Mutex<BTreeMap<Option<String>, Vec<Arc<Bucket>>>>,
}

impl TableState {
    fn descriptor(&self) -> Arc<TableDescriptor> {
        Arc::clone(&self.descriptor.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn partitions(&self) -> std::sync::MutexGuard<'_, BTreeMap<Option<String>, Vec<Arc<Bucket>>>> {
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Node {
    /// Opens the node over its data directory, recovering every tablet. Must run inside a
    /// tokio runtime (each tablet starts its appender task).
    ///
    /// # Errors
    /// [`NodeError::DataDirLocked`] when another process holds the directory; I/O,
    /// metadata and corruption errors from recovery.
    pub fn open(config: NodeConfig) -> Result<Arc<Self>> {
        // Durably, the data directory's own name included: a power cut must not take the
        // directory, and every table in it, away.
        mink_durable::create_dir_all(&config.data_dir.join("log"))?;
        let lock = File::create(config.data_dir.join("LOCK"))?;
        if lock.try_lock().is_err() {
            return Err(NodeError::DataDirLocked(
                config.data_dir.display().to_string(),
            ));
        }
        let metadata = Metadata::open(&config.data_dir.join("meta.db"))?;
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
            if descriptor.is_partitioned() {
                for partition in metadata.partitions(descriptor.table_id)? {
                    let buckets = storage.open_partition(&descriptor, Some(&partition))?;
                    partitions.insert(Some(partition.name), buckets);
                }
            } else {
                partitions.insert(None, storage.open_partition(&descriptor, None)?);
            }
            info!(table = %descriptor.path, partitions = partitions.len(), "opened table");
            opened += partitions.values().map(Vec::len).sum::<usize>();
            tables.insert(
                descriptor.path.clone(),
                Arc::new(TableState {
                    descriptor: RwLock::new(descriptor),
                    partitions: Mutex::new(partitions),
                }),
            );
        }
        open_buckets.opened_at_start(opened);
        Ok(Arc::new(Self {
            storage,
            metadata,
            tables: RwLock::new(tables),
            open_buckets,
            lake: tokio::sync::OnceCell::new(),
            tiering: tokio::sync::Mutex::default(),
            ddl: tokio::sync::Mutex::default(),
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

    fn table(&self, path: &TablePath) -> Result<Arc<TableState>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .cloned()
            .ok_or_else(|| NodeError::TableNotFound(path.to_string()))
    }

    /// Creates a table (and its lake table when `lake.enabled`); with `if_not_exists`, an
    /// existing table of that name is returned.
    ///
    /// The table's metadata is one SQLite transaction; its tablets are opened next and its
    /// lake table created, and only then is the table visible. A failure at any step
    /// removes what the earlier steps made, so a failed create leaves nothing behind (a
    /// crash leaves at most a table whose missing tablets the next start creates).
    ///
    /// # Errors
    /// [`NodeError::TableExists`]; [`NodeError::InvalidArgument`] for a `bucket.num`
    /// above [`NodeConfig::max_bucket_num`], buckets past
    /// [`NodeConfig::max_open_buckets`], an option SQL's `WITH` would not take, a
    /// table over the size bounds of [`crate::flight::limits`] or an invalid descriptor;
    /// I/O, metadata and lake errors.
    pub async fn create_table(
        &self,
        descriptor: TableDescriptor,
        if_not_exists: bool,
    ) -> Result<TableDescriptor> {
        let _ddl = self.ddl.lock().await;
        let validated = self.validate_new_table(descriptor)?;
        if let Some(existing) = self.tables_read().get(&validated.path) {
            return if if_not_exists {
                Ok(existing.descriptor().as_ref().clone())
            } else {
                Err(NodeError::TableExists(validated.path.to_string()))
            };
        }
        // A partitioned table opens its buckets with each partition.
        let buckets = if validated.is_partitioned() {
            0
        } else {
            validated.bucket_num as usize
        };
        self.open_buckets
            .reserve(buckets, &format!("table {}", validated.path))?;
        let created = self.create_new_table(&validated).await;
        if created.is_err() {
            self.open_buckets.release(buckets);
        }
        created
    }

    /// Creates a table that does not exist yet, its buckets reserved: its metadata, its
    /// tablets and its lake table, each step undone when a later one fails.
    async fn create_new_table(&self, validated: &TableDescriptor) -> Result<TableDescriptor> {
        let created = Arc::new(self.metadata.create_table(validated)?);
        let mut partitions = BTreeMap::new();
        if !created.is_partitioned() {
            match self.storage.create_partition(&created, None) {
                Ok(buckets) => {
                    partitions.insert(None, buckets);
                }
                Err(error) => {
                    self.undo_create(&created, partitions);
                    return Err(error);
                }
            }
        }
        if created.lake_enabled {
            let lake_created = match self.lake().await {
                Ok(lake) => lake.create_table(&created).await.map_err(NodeError::from),
                Err(error) => Err(error),
            };
            if let Err(error) = lake_created {
                self.undo_create(&created, partitions);
                return Err(error);
            }
        }
        info!(table = %created.path, table_id = created.table_id, "created table");
        self.tables_write().insert(
            created.path.clone(),
            Arc::new(TableState {
                descriptor: RwLock::new(Arc::clone(&created)),
                partitions: Mutex::new(partitions),
            }),
        );
        Ok(created.as_ref().clone())
    }

    /// Re-validates what a client sent (the constructor derives and checks everything)
    /// and applies the node's bounds.
    fn validate_new_table(&self, descriptor: TableDescriptor) -> Result<TableDescriptor> {
        let current = descriptor.schema().as_ref().clone();
        let validated = TableDescriptor::new(
            descriptor.path.clone(),
            current,
            descriptor.primary_key.clone(),
            descriptor.partition_keys.clone(),
            descriptor.options().checked()?,
        )?;
        check_table_size(&validated)?;
        let max = self.storage.config.max_bucket_num;
        if validated.bucket_num == 0 || validated.bucket_num > max {
            return Err(NodeError::InvalidArgument(format!(
                "table {}: bucket.num = {} is out of range: a table has 1 to {max} buckets",
                validated.path, validated.bucket_num
            )));
        }
        Ok(validated)
    }

    /// Takes back a create that failed after its metadata was committed.
    fn undo_create(
        &self,
        created: &TableDescriptor,
        partitions: BTreeMap<Option<String>, Vec<Arc<Bucket>>>,
    ) {
        let buckets = partitions.into_values().flatten().collect();
        self.storage.remove_buckets(created, None, buckets);
        if let Err(error) = self.metadata.delete_table(created.table_id) {
            tracing::warn!(table = %created.path, %error, "could not roll back a failed create");
        }
    }

    fn tables_read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<TablePath, Arc<TableState>>> {
        self.tables.read().unwrap_or_else(|p| p.into_inner())
    }

    fn tables_write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<TablePath, Arc<TableState>>> {
        self.tables.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops a table: its log, its KV store and its lake table. With `table_id`, only
    /// while the table of that name is still that table.
    pub async fn drop_table(
        &self,
        path: &TablePath,
        if_exists: bool,
        table_id: Option<u64>,
    ) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let dropped = self.table(path).map(|t| t.descriptor());
        self.drop_table_storage(path, if_exists, table_id)?;
        if let Ok(table) = dropped
            && table.lake_enabled
        {
            // Under the tiering lock: no round writes the lake table while it goes.
            let mut lake_indexes = self.tiering.lock().await;
            lake_indexes.remove(&table.table_id);
            self.lake().await?.drop_table(path).await?;
        }
        Ok(())
    }

    fn drop_table_storage(
        &self,
        path: &TablePath,
        if_exists: bool,
        table_id: Option<u64>,
    ) -> Result<()> {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let Some(state) = tables.get(path).cloned() else {
            return if if_exists {
                Ok(())
            } else {
                Err(NodeError::TableNotFound(path.to_string()))
            };
        };
        if let Some(expected) = table_id
            && state.descriptor().table_id != expected
        {
            return Err(NodeError::TableReplaced(format!(
                "table '{path}' is no longer table {expected}: it was dropped and created again"
            )));
        }
        self.metadata.drop_table(path)?;
        self.metadata
            .forget_topic(&format!("{}.{}", path.database, path.name))?;
        tables.remove(path);
        let descriptor = state.descriptor();
        let buckets: Vec<Arc<Bucket>> = std::mem::take(&mut *state.partitions())
            .into_values()
            .flatten()
            .collect();
        self.open_buckets.release(buckets.len());
        for bucket in buckets {
            if let Some(kv) = &bucket.kv {
                self.storage.kv()?.drop_tablet(kv.clone())?;
            }
        }
        match mink_durable::remove_dir_all(&self.storage.table_dir(&descriptor)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        info!(table = %path, "dropped table");
        Ok(())
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

    /// Adds a nullable column; older batches keep their schema_id. The lake table, if any,
    /// gets the column too.
    pub async fn add_column(&self, path: &TablePath, field: Field) -> Result<TableDescriptor> {
        let evolved = self.add_column_metadata(path, field.clone())?;
        if evolved.lake_enabled {
            self.lake().await?.add_column(path, &field).await?;
        }
        Ok(evolved)
    }

    fn add_column_metadata(&self, path: &TablePath, field: Field) -> Result<TableDescriptor> {
        let state = self.table(path)?;
        let mut descriptor = state.descriptor.write().unwrap_or_else(|p| p.into_inner());
        let evolved = descriptor.with_added_column(field)?;
        check_table_size(&evolved)?;
        self.metadata.update_table(&evolved)?;
        *descriptor = Arc::new(evolved.clone());
        info!(table = %path, schema_id = evolved.current().schema_id, "added column");
        Ok(evolved)
    }

    /// The table and an existing bucket.
    pub fn bucket(&self, bucket: &BucketId) -> Result<(Arc<TableDescriptor>, Arc<Bucket>)> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let descriptor = state.descriptor();
        check_bucket_address(&descriptor, bucket)?;
        let partitions = state.partitions();
        let tablet = partitions
            .get(&bucket.partition)
            .and_then(|tablets| tablets.get(bucket.bucket as usize))
            .cloned()
            .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?;
        Ok((descriptor, tablet))
    }

    /// Checks that writes to `bucket` can be accepted (the table exists, the bucket and
    /// partition address fit it), before any data arrives.
    pub fn check_write_address(&self, bucket: &BucketId) -> Result<()> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        check_bucket_address(&state.descriptor(), bucket)
    }

    /// The bucket a write goes to, creating its partition on first write.
    fn bucket_for_write(
        &self,
        state: &TableState,
        descriptor: &Arc<TableDescriptor>,
        bucket: &BucketId,
    ) -> Result<Arc<Bucket>> {
        let mut partitions = state.partitions();
        if !partitions.contains_key(&bucket.partition) {
            let name = bucket
                .partition
                .as_deref()
                .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?;
            let max = self.storage.config.max_partitions;
            if partitions.len() >= max {
                return Err(NodeError::InvalidArgument(format!(
                    "table {} has {} partitions, the most a table may have: partition '{name}' is not created",
                    descriptor.path,
                    partitions.len()
                )));
            }
            let buckets = descriptor.bucket_num as usize;
            let what = format!("partition '{name}' of table {}", descriptor.path);
            self.open_buckets.reserve(buckets, &what)?;
            let tablets = self
                .create_new_partition(descriptor, name)
                .inspect_err(|_| {
                    self.open_buckets.release(buckets);
                })?;
            info!(table = %descriptor.path, partition = name, "created partition");
            partitions.insert(bucket.partition.clone(), tablets);
        }
        Ok(Arc::clone(
            &partitions[&bucket.partition][bucket.bucket as usize],
        ))
    }

    /// Creates a partition that does not exist yet, its buckets reserved: its metadata,
    /// then its tablets, the metadata undone when they fail.
    fn create_new_partition(
        &self,
        descriptor: &Arc<TableDescriptor>,
        name: &str,
    ) -> Result<Vec<Arc<Bucket>>> {
        let record = self.metadata.ensure_partition(descriptor.table_id, name)?;
        self.storage
            .create_partition(descriptor, Some(&record))
            .inspect_err(|_| {
                if let Err(e) = self.metadata.delete_partition(record.partition_id) {
                    tracing::warn!(partition = name, error = %e, "could not roll back a failed partition");
                }
            })
    }

    /// Writes a batch to a bucket once it checks out against the table's schema and the
    /// bucket's routing: appended to a log table, upserted into a primary-key table, or
    /// (with `delete`) deleted from it by key. Resolves when the write is durable.
    ///
    /// `stream` is the DoPut stream the batch belongs to (see [`WriteStream`]): once a
    /// write of the stream is refused or fails in the log, none of its later writes is
    /// written. `None` for a write on its own. A batch that comes with the IPC message a
    /// client sent it in ([`SentBatch`]) is stored as that message when it is stored
    /// unchanged.
    pub async fn write(
        &self,
        bucket: &BucketId,
        batch: impl Into<SentBatch>,
        delete: bool,
        stream: Option<&WriteStream>,
    ) -> Result<AppendAck> {
        self.write_as(bucket, batch, delete, stream, None).await
    }

    /// [`Node::write`] by an idempotent producer: its [`WriterTag`] is stored with the
    /// batch (see [`WriterTag`]).
    pub async fn write_as(
        &self,
        bucket: &BucketId,
        batch: impl Into<SentBatch>,
        delete: bool,
        stream: Option<&WriteStream>,
        writer: Option<WriterTag>,
    ) -> Result<AppendAck> {
        let SentBatch { batch, message } = batch.into();
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let table = state.descriptor();
        check_bucket_address(&table, bucket)?;
        let op = match (table.has_primary_key(), delete) {
            (false, false) => WriteOp::Append(conform_to_schema(&table, batch)?),
            (false, true) => {
                return Err(NodeError::InvalidArgument(format!(
                    "table {} is a log table: it has no primary key to delete by",
                    table.path
                )));
            }
            (true, false) => WriteOp::Upsert(conform_to_schema(&table, batch)?),
            (true, true) => WriteOp::Delete(conform_keys(&table, batch)?),
        };
        let (WriteOp::Append(rows) | WriteOp::Upsert(rows) | WriteOp::Delete(rows)) = &op;
        check_routing(&table, bucket, rows)?;
        // Only a valid write creates a partition, and a delete never does: deleting from a
        // partition with no rows changes nothing.
        if delete && !state.partitions().contains_key(&bucket.partition) {
            return Ok(AppendAck {
                base_offset: 0,
                last_offset: -1,
                high_watermark: 0,
            });
        }
        let target = self.bucket_for_write(&state, &table, bucket)?;
        let write = Write {
            // Keys to delete are a batch of their own, not the one sent.
            sent: message.filter(|_| !delete),
            op,
            table,
            stream: stream.cloned(),
            writer,
        };
        Ok(target.log.write(write).await?)
    }

    /// The table and KV tablet of a primary-key table's bucket; `None` for a partition
    /// that has no rows yet.
    pub fn kv_bucket(&self, bucket: &BucketId) -> Result<(Arc<TableDescriptor>, Option<KvTablet>)> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let table = state.descriptor();
        check_bucket_address(&table, bucket)?;
        if !table.has_primary_key() {
            return Err(NodeError::InvalidArgument(format!(
                "table {} is a log table: key reads need a primary key",
                table.path
            )));
        }
        let partitions = state.partitions();
        let kv = partitions
            .get(&bucket.partition)
            .and_then(|buckets| buckets.get(bucket.bucket as usize))
            .and_then(|b| b.kv.clone());
        Ok((table, kv))
    }

    /// `lookup` (`prefix == false`) or `prefix_lookup` of a batch of keys or prefixes that
    /// all belong to `bucket`.
    pub async fn lookup(
        &self,
        bucket: &BucketId,
        keys: RecordBatch,
        prefix: bool,
    ) -> Result<Found> {
        let (table, kv) = self.kv_bucket(bucket)?;
        check_routing(&table, bucket, &keys)?;
        let Some(kv) = kv else {
            // A partition with no rows yet: nothing to find, the keys checked all the same.
            encode_keys(&table, &keys, prefix)?;
            return Ok(Found {
                rows: RecordBatch::new_empty(Arc::clone(table.schema())),
                key_indices: Vec::new(),
            });
        };
        let store = kv.clone();
        let found = store
            .read(move || match prefix {
                true => prefix_lookup(&table, &kv, &keys),
                false => lookup(&table, &kv, &keys),
            })
            .await?;
        Ok(found)
    }

    /// Every bucket of a table created so far, with its offsets.
    pub fn list_buckets(&self, path: &TablePath) -> Result<Vec<BucketStatus>> {
        let (table, buckets) = self.table_buckets(path)?;
        let recorded = self.metadata.latest_lake_snapshot(table.table_id)?;
        let seams = crate::tiering::recorded_offsets(self, &table)?;
        Ok(buckets
            .into_iter()
            .map(|(bucket, tablet)| {
                let (log_start, high_watermark) = tablet.log.offsets();
                BucketStatus {
                    lake_log_end_offset: seams.get(&bucket),
                    lake_snapshot_id: recorded.as_ref().map(|r| r.snapshot_id),
                    bucket: Some(bucket),
                    log_start,
                    high_watermark,
                }
            })
            .collect())
    }

    /// A table and every bucket of it created so far (partition by partition, each
    /// partition's buckets in order), with their tablets.
    pub(crate) fn table_buckets(
        &self,
        path: &TablePath,
    ) -> Result<(Arc<TableDescriptor>, BucketTablets)> {
        let state = self.table(path)?;
        let table = state.descriptor();
        let buckets = state
            .partitions()
            .iter()
            .flat_map(|(partition, tablets)| {
                tablets.iter().enumerate().map(|(bucket, tablet)| {
                    let id = BucketId {
                        table: path.to_string(),
                        partition: partition.clone(),
                        bucket: bucket as u32,
                    };
                    (id, Arc::clone(tablet))
                })
            })
            .collect();
        Ok((table, buckets))
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

    /// What the node keeps for its Kafka listener: consumer groups' committed offsets
    /// and producer ids.
    pub fn kafka_state(&self) -> &Metadata {
        &self.metadata
    }

    /// Applies `log.ttl` retention to every table that has one; returns segments removed.
    /// A table that fails (dropped meanwhile, its metadata unreadable) is logged and
    /// skipped: the others are still trimmed.
    pub fn enforce_retention(&self) -> Result<usize> {
        let tables: Vec<Arc<TableState>> = self
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut removed = 0;
        for state in tables {
            let table = state.descriptor();
            let Some(ttl) = table.log_ttl else {
                continue;
            };
            match self.enforce_table_retention(&table, ttl) {
                Ok(segments) => removed += segments,
                Err(error) => warn!(table = %table.path, %error, "log retention skipped"),
            }
        }
        Ok(removed)
    }

    /// Removes `table`'s segments older than `ttl`, keeping what its KV stores would replay
    /// and, with a lake, its log from the recorded seam on: rows not yet tiered (a round
    /// that keeps failing, say) are never removed before the lake holds them.
    fn enforce_table_retention(&self, table: &TableDescriptor, ttl: Duration) -> Result<usize> {
        let seams = match table.lake_enabled {
            true => Some(crate::tiering::recorded_offsets(self, table)?),
            false => None,
        };
        let mut removed = 0;
        for (id, tablet) in self.table_buckets(&table.path)?.1 {
            // A KV store replays the log from fjall's applied offset: its buffered
            // rows go to fjall first, the offset is made durable (a power cut must not
            // take it back below the log's new start), and no segment from it on is
            // removed.
            let replay_from = tablet
                .kv
                .as_ref()
                .map(KvTablet::flush_durably)
                .transpose()?;
            let untiered_from = seams.as_ref().map(|seams| seams.get(&id));
            let keep_from = replay_from.into_iter().chain(untiered_from).min();
            removed += tablet.log.enforce_retention(ttl, keep_from)?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
