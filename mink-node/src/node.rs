//! The node: every table's metadata and every bucket's log tablet, in one process.
//!
//! The node owns its data directory exclusively (a lock file keeps a second process out):
//!
//! ```text
//! <data-dir>/LOCK                         held while the node runs
//! <data-dir>/meta.db                      tables, schema versions, partitions (SQLite)
//! <data-dir>/log/t<table_id>/b<bucket>/   segments of an unpartitioned table's bucket
//! <data-dir>/log/t<table_id>/p<partition_id>/b<bucket>/
//! ```
//!
//! Writes are validated here: the batch must carry the table's current schema, and every
//! row must belong to the bucket (and partition) it is sent to, so bucket `b` of the log is
//! exactly the rows whose bucket key hashes to `b`. A partition is created by the first
//! write into it.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::Field;
use mink_core::protocol::{AppendAck, BucketId, BucketStatus, list_offsets};
use mink_core::routing::row_addresses;
use mink_core::table::{TableDescriptor, TablePath};
use tracing::info;

use crate::error::{NodeError, Result};
use crate::log::{LogConfig, LogTablet};
use crate::metadata::Metadata;

/// How a node is run.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where everything is stored.
    pub data_dir: PathBuf,
    /// How logs are stored.
    pub log: LogConfig,
}

impl NodeConfig {
    /// The default configuration for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            log: LogConfig::default(),
        }
    }
}

/// A mink node: leads every bucket of every table.
#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    metadata: Metadata,
    tables: RwLock<BTreeMap<TablePath, Arc<TableState>>>,
    _lock: File,
}

/// A table and its open tablets.
#[derive(Debug)]
struct TableState {
    descriptor: RwLock<Arc<TableDescriptor>>,
    /// Partition name (`None` when unpartitioned) -> that partition's tablets, by bucket.
    partitions: Mutex<BTreeMap<Option<String>, Vec<Arc<LogTablet>>>>,
}

impl TableState {
    fn descriptor(&self) -> Arc<TableDescriptor> {
        Arc::clone(&self.descriptor.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn partitions(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<Option<String>, Vec<Arc<LogTablet>>>> {
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
        std::fs::create_dir_all(config.data_dir.join("log"))?;
        let lock = File::create(config.data_dir.join("LOCK"))?;
        if lock.try_lock().is_err() {
            return Err(NodeError::DataDirLocked(
                config.data_dir.display().to_string(),
            ));
        }
        let metadata = Metadata::open(&config.data_dir.join("meta.db"))?;
        let mut tables = BTreeMap::new();
        for descriptor in metadata.load_tables()? {
            let mut partitions = BTreeMap::new();
            if descriptor.is_partitioned() {
                for partition in metadata.partitions(descriptor.table_id)? {
                    let dir =
                        partition_dir(&config.data_dir, &descriptor, Some(partition.partition_id));
                    let tablets =
                        open_tablets(&descriptor, Some(&partition.name), &dir, &config.log)?;
                    partitions.insert(Some(partition.name), tablets);
                }
            } else {
                let dir = partition_dir(&config.data_dir, &descriptor, None);
                partitions.insert(None, open_tablets(&descriptor, None, &dir, &config.log)?);
            }
            info!(table = %descriptor.path, partitions = partitions.len(), "opened table");
            tables.insert(
                descriptor.path.clone(),
                Arc::new(TableState {
                    descriptor: RwLock::new(Arc::new(descriptor)),
                    partitions: Mutex::new(partitions),
                }),
            );
        }
        Ok(Arc::new(Self {
            config,
            metadata,
            tables: RwLock::new(tables),
            _lock: lock,
        }))
    }

    /// The node's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    fn table(&self, path: &TablePath) -> Result<Arc<TableState>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .cloned()
            .ok_or_else(|| NodeError::TableNotFound(path.to_string()))
    }

    /// Creates a table; with `if_not_exists`, an existing table of that name is returned.
    pub fn create_table(
        &self,
        descriptor: TableDescriptor,
        if_not_exists: bool,
    ) -> Result<TableDescriptor> {
        // Re-validate what a client sent: the constructor derives and checks everything.
        let current = descriptor.schema().as_ref().clone();
        let validated = TableDescriptor::new(
            descriptor.path.clone(),
            current,
            descriptor.primary_key.clone(),
            descriptor.partition_keys.clone(),
            descriptor.options(),
        )?;
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = tables.get(&validated.path) {
            return if if_not_exists {
                Ok(existing.descriptor().as_ref().clone())
            } else {
                Err(NodeError::TableExists(validated.path.to_string()))
            };
        }
        let created = self.metadata.create_table(&validated)?;
        let mut partitions = BTreeMap::new();
        if !created.is_partitioned() {
            let dir = partition_dir(&self.config.data_dir, &created, None);
            partitions.insert(None, open_tablets(&created, None, &dir, &self.config.log)?);
        }
        info!(table = %created.path, table_id = created.table_id, "created table");
        tables.insert(
            created.path.clone(),
            Arc::new(TableState {
                descriptor: RwLock::new(Arc::new(created.clone())),
                partitions: Mutex::new(partitions),
            }),
        );
        Ok(created)
    }

    /// Drops a table and deletes its log.
    pub fn drop_table(&self, path: &TablePath, if_exists: bool) -> Result<()> {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let Some(state) = tables.get(path).cloned() else {
            return if if_exists {
                Ok(())
            } else {
                Err(NodeError::TableNotFound(path.to_string()))
            };
        };
        self.metadata.drop_table(path)?;
        tables.remove(path);
        let descriptor = state.descriptor();
        state.partitions().clear();
        let dir = self
            .config
            .data_dir
            .join("log")
            .join(format!("t{}", descriptor.table_id));
        match std::fs::remove_dir_all(&dir) {
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

    /// Adds a nullable column; older batches keep their schema_id.
    pub fn add_column(&self, path: &TablePath, field: Field) -> Result<TableDescriptor> {
        let state = self.table(path)?;
        let mut descriptor = state.descriptor.write().unwrap_or_else(|p| p.into_inner());
        let evolved = descriptor.with_added_column(field)?;
        self.metadata.update_table(&evolved)?;
        *descriptor = Arc::new(evolved.clone());
        info!(table = %path, schema_id = evolved.current().schema_id, "added column");
        Ok(evolved)
    }

    /// The table and tablet of an existing bucket.
    pub fn tablet(&self, bucket: &BucketId) -> Result<(Arc<TableDescriptor>, Arc<LogTablet>)> {
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

    /// The table and tablet a write goes to, creating its partition on first write.
    fn tablet_for_write(
        &self,
        bucket: &BucketId,
    ) -> Result<(Arc<TableDescriptor>, Arc<LogTablet>)> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let descriptor = state.descriptor();
        check_bucket_address(&descriptor, bucket)?;
        let mut partitions = state.partitions();
        if !partitions.contains_key(&bucket.partition) {
            let name = bucket
                .partition
                .as_deref()
                .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?;
            let record = self.metadata.ensure_partition(descriptor.table_id, name)?;
            let dir = partition_dir(
                &self.config.data_dir,
                &descriptor,
                Some(record.partition_id),
            );
            let tablets = open_tablets(&descriptor, Some(name), &dir, &self.config.log)?;
            info!(table = %descriptor.path, partition = name, "created partition");
            partitions.insert(bucket.partition.clone(), tablets);
        }
        let tablet = Arc::clone(&partitions[&bucket.partition][bucket.bucket as usize]);
        Ok((descriptor, tablet))
    }

    /// Appends a batch to a bucket of a log table once it checks out against the table's
    /// schema and the bucket's routing; resolves when it is durable.
    pub async fn append(&self, bucket: &BucketId, batch: RecordBatch) -> Result<AppendAck> {
        let (descriptor, tablet) = self.tablet_for_write(bucket)?;
        let batch = conform_to_schema(&descriptor, batch)?;
        check_routing(&descriptor, bucket, &batch)?;
        tablet
            .append(batch, descriptor.current().schema_id, None)
            .await
    }

    /// Every bucket of a table created so far, with its offsets.
    pub fn list_buckets(&self, path: &TablePath) -> Result<Vec<BucketStatus>> {
        let state = self.table(path)?;
        let partitions = state.partitions();
        let mut statuses = Vec::new();
        for (partition, tablets) in partitions.iter() {
            for (bucket, tablet) in tablets.iter().enumerate() {
                let (log_start, high_watermark) = tablet.offsets();
                statuses.push(BucketStatus {
                    bucket: Some(BucketId {
                        table: path.to_string(),
                        partition: partition.clone(),
                        bucket: bucket as u32,
                    }),
                    log_start,
                    high_watermark,
                });
            }
        }
        Ok(statuses)
    }

    /// `list_offsets`: Earliest, Latest or the first offset at a timestamp.
    pub fn list_offsets(&self, bucket: &BucketId, spec: &list_offsets::Spec) -> Result<i64> {
        let (_, tablet) = self.tablet(bucket)?;
        let (log_start, high_watermark) = tablet.offsets();
        Ok(match spec {
            list_offsets::Spec::Earliest(_) => log_start,
            list_offsets::Spec::Latest(_) => high_watermark,
            list_offsets::Spec::Timestamp(ts) => tablet.offset_for_timestamp(*ts),
        })
    }

    /// Applies `log.ttl` retention to every table that has one; returns segments removed.
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
            let Some(ttl) = state.descriptor().log_ttl else {
                continue;
            };
            let tablets: Vec<Arc<LogTablet>> =
                state.partitions().values().flatten().cloned().collect();
            for tablet in tablets {
                removed += tablet.enforce_retention(ttl)?;
            }
        }
        Ok(removed)
    }
}

fn partition_dir(data_dir: &Path, table: &TableDescriptor, partition_id: Option<i64>) -> PathBuf {
    let dir = data_dir.join("log").join(format!("t{}", table.table_id));
    match partition_id {
        Some(id) => dir.join(format!("p{id}")),
        None => dir,
    }
}

fn open_tablets(
    table: &TableDescriptor,
    partition: Option<&str>,
    dir: &Path,
    config: &LogConfig,
) -> Result<Vec<Arc<LogTablet>>> {
    let mut log_config = config.clone();
    if let Some(ttl) = table.log_ttl {
        log_config.segment_max_age = log_config
            .segment_max_age
            .min(ttl.max(Duration::from_secs(1)));
    }
    (0..table.bucket_num)
        .map(|bucket| {
            let label = BucketId {
                table: table.path.to_string(),
                partition: partition.map(str::to_string),
                bucket,
            }
            .to_string();
            let tablet =
                LogTablet::open(label, &dir.join(format!("b{bucket}")), log_config.clone())?;
            Ok(Arc::new(tablet))
        })
        .collect()
}

fn check_bucket_address(table: &TableDescriptor, bucket: &BucketId) -> Result<()> {
    if bucket.bucket >= table.bucket_num {
        return Err(NodeError::BucketNotFound(format!(
            "{bucket} (table {} has {} buckets)",
            table.path, table.bucket_num
        )));
    }
    if table.is_partitioned() != bucket.partition.is_some() {
        let expected = if table.is_partitioned() {
            "needs a partition"
        } else {
            "takes no partition"
        };
        return Err(NodeError::InvalidArgument(format!(
            "table {} {expected} in its bucket address",
            table.path
        )));
    }
    Ok(())
}

/// Checks that a written batch has the table's current columns (names and types, nulls
/// only where allowed) and relabels it with the table's exact schema.
fn conform_to_schema(table: &TableDescriptor, batch: RecordBatch) -> Result<RecordBatch> {
    let expected = table.schema();
    let actual = batch.schema();
    let describe = |fields: &arrow::datatypes::Fields| {
        fields
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let same_columns = expected.fields().len() == actual.fields().len()
        && expected
            .fields()
            .iter()
            .zip(actual.fields())
            .all(|(e, a)| e.name() == a.name() && e.data_type() == a.data_type());
    if !same_columns {
        return Err(NodeError::SchemaMismatch(format!(
            "batch columns ({}) do not match table {} (schema version {}: {})",
            describe(actual.fields()),
            table.path,
            table.current().schema_id,
            describe(expected.fields())
        )));
    }
    for (field, column) in expected.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(NodeError::SchemaMismatch(format!(
                "column '{}' of table {} is NOT NULL but the batch has {} nulls in it",
                field.name(),
                table.path,
                column.null_count()
            )));
        }
    }
    Ok(RecordBatch::try_new(
        Arc::clone(expected),
        batch.columns().to_vec(),
    )?)
}

/// Checks that every row belongs to the addressed bucket and partition.
fn check_routing(table: &TableDescriptor, bucket: &BucketId, batch: &RecordBatch) -> Result<()> {
    let addresses = row_addresses(table, batch)?;
    let misrouted = addresses
        .buckets
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, b)| **b != bucket.bucket);
    if let Some((row, actual)) = misrouted {
        return Err(NodeError::InvalidArgument(format!(
            "row {row} belongs to bucket {actual} of table {}, not bucket {}",
            table.path, bucket.bucket
        )));
    }
    if let (Some(names), Some(partition)) = (&addresses.partitions, &bucket.partition)
        && let Some((row, actual)) = names.iter().enumerate().find(|(_, n)| *n != partition)
    {
        return Err(NodeError::InvalidArgument(format!(
            "row {row} belongs to partition '{actual}' of table {}, not '{partition}'",
            table.path
        )));
    }
    Ok(())
}
