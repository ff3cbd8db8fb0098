//! Where a node's tablets live on disk, and how they are opened, created and removed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;

use crate::error::{NodeError, Result};
use crate::metadata::PartitionRecord;
use mink_kv::{KvStore, KvTablet, KvWriter, Restored};
use mink_log::{Changelog, LogStore, LogTablet};
use tracing::info;

use super::{Bucket, Failpoint, NodeConfig};
use crate::node::union::{FoldedRange, LocatedRange};

/// Whether a bucket being opened is new (nothing of it is anywhere yet) or was opened
/// before (its log, or its KV checkpoint, may be in the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    New,
    Existing,
}

/// Where tablets live, and how they are opened.
#[derive(Debug)]
pub(super) struct Storage {
    pub(super) config: NodeConfig,
    /// Opened with the first primary-key table: a node of log tables has no KV database.
    pub(super) kv: Mutex<Option<KvStore>>,
}

impl Storage {
    pub(super) fn kv(&self) -> Result<KvStore> {
        let mut kv = self.kv.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(store) = &*kv {
            return Ok(store.clone());
        }
        let store = KvStore::open(&self.config.data_dir.join("kv"), &self.config.kv)?;
        *kv = Some(store.clone());
        Ok(store)
    }

    /// Opens (creating or recovering) the buckets of one partition (`None`: of an
    /// unpartitioned table).
    pub(super) fn open_partition(
        &self,
        table: &Arc<TableDescriptor>,
        partition: Option<&PartitionRecord>,
    ) -> Result<Vec<Arc<Bucket>>> {
        (0..table.bucket_num)
            .map(|bucket| self.open_bucket(table, partition, bucket, Opening::Existing, 0))
            .collect()
    }

    /// Creates the buckets of a new partition (or unpartitioned table). On failure the
    /// buckets opened so far are removed again, KV tablets and directories, so nothing
    /// of it is left to open on the next start.
    pub(super) fn create_partition(
        &self,
        table: &Arc<TableDescriptor>,
        partition: Option<&PartitionRecord>,
    ) -> Result<Vec<Arc<Bucket>>> {
        let mut buckets = Vec::with_capacity(table.bucket_num as usize);
        for bucket in 0..table.bucket_num {
            if bucket == table.bucket_num / 2
                && self.config.failpoint == Some(Failpoint::AbortDuringCreateTable)
            {
                tracing::warn!("failpoint: aborting the process during CREATE TABLE");
                std::process::abort();
            }
            match self.open_bucket(table, partition, bucket, Opening::New, 0) {
                Ok(opened) => buckets.push(opened),
                Err(error) => {
                    self.remove_buckets(table, partition, buckets);
                    return Err(error);
                }
            }
        }
        Ok(buckets)
    }

    /// Removes buckets that are no longer (or never were) part of a table: their KV
    /// tablets and the partition's (or table's) directory. Best effort: what cannot be
    /// removed is logged and left behind, referenced by nothing.
    pub(super) fn remove_buckets(
        &self,
        table: &TableDescriptor,
        partition: Option<&PartitionRecord>,
        buckets: Vec<Arc<Bucket>>,
    ) {
        for bucket in buckets {
            bucket.log.forget();
            if let Some(kv) = &bucket.kv
                && let Err(error) = self
                    .kv()
                    .and_then(|store| Ok(store.drop_tablet(kv.clone())?))
            {
                tracing::warn!(table = %table.path, %error, "could not remove a KV tablet");
            }
        }
        let mut dir = self.table_dir(table);
        if let Some(partition) = partition {
            dir.push(format!("p{}", partition.partition_id));
        }
        match mink_durable::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove tablets");
            }
            _ => {}
        }
    }

    /// Opens (creating or recovering) one bucket of a partition.
    fn open_bucket(
        &self,
        table: &Arc<TableDescriptor>,
        partition: Option<&PartitionRecord>,
        bucket: u32,
        opening: Opening,
        epoch: u64,
    ) -> Result<Arc<Bucket>> {
        let mut log_config = self.config.log.clone();
        if let Some(ttl) = table.log_ttl {
            log_config.segment_max_age = log_config
                .segment_max_age
                .min(ttl.max(Duration::from_secs(1)));
        }
        let key = bucket_key(table.table_id, partition.map(|p| p.partition_id), bucket);
        let dir = self.config.data_dir.join("log").join(&key);
        let label = BucketId {
            table: table.path.to_string(),
            partition: partition.map(|p| p.name.clone()),
            bucket,
        }
        .to_string();
        let mut restored = None;
        let kv = if table.has_primary_key() {
            let kv = self.kv()?.tablet(&kv_tablet_name(&key))?;
            if let Some(store) = &self.config.log.store
                && opening == Opening::Existing
            {
                restored = restore_kv(store, &dir, &kv, &label)?;
            }
            Some(kv)
        } else {
            None
        };
        let changelog = match &kv {
            Some(kv) => {
                Some(Box::new(KvWriter::new(kv.clone(), Arc::clone(table))?) as Box<dyn Changelog>)
            }
            None => None,
        };
        let started = Instant::now();
        let log = LogTablet::open(label, &dir, log_config, changelog)?;
        let log_opened_in = started.elapsed();
        Ok(Arc::new(Bucket {
            log,
            kv,
            located: LocatedRange::default(),
            folded: FoldedRange::default(),
            restored,
            log_opened_in,
            epoch,
        }))
    }

    /// Opens a bucket taken over from another node (see [`LogStore::take_over`]) to lead
    /// it from `epoch` on: its
    /// log from the store as it is now, and its KV store, for a primary-key table, from
    /// nothing (what this node kept of it from an earlier time it led it is stale):
    /// restored from its checkpoint, then the log after it replayed.
    ///
    /// # Errors
    /// No log store, or a store or tablet that fails to open.
    pub(super) fn take_over_bucket(
        &self,
        table: &Arc<TableDescriptor>,
        partition: Option<&PartitionRecord>,
        bucket: u32,
        epoch: u64,
    ) -> Result<Arc<Bucket>> {
        let store = self.log_store()?;
        let key = bucket_key(table.table_id, partition.map(|p| p.partition_id), bucket);
        store.take_over(&self.config.data_dir.join("log").join(&key))?;
        if table.has_primary_key() {
            let kv = self.kv()?;
            let stale = kv.tablet(&kv_tablet_name(&key))?;
            kv.drop_tablet(stale)?;
        }
        self.open_bucket(table, partition, bucket, Opening::Existing, epoch)
    }

    /// The node's log store, which buckets move between nodes through.
    ///
    /// # Errors
    /// [`NodeError::InvalidArgument`] for a node without one.
    pub(super) fn log_store(&self) -> Result<&Arc<LogStore>> {
        self.config.log.store.as_ref().ok_or_else(|| {
            NodeError::InvalidArgument(
                "a bucket moves between nodes through a log store: this node has none".into(),
            )
        })
    }

    pub(super) fn table_dir(&self, table: &TableDescriptor) -> PathBuf {
        self.config
            .data_dir
            .join("log")
            .join(format!("t{}", table.table_id))
    }
}

/// The key of a bucket of `table_id` (and partition): its log's key in the log store, and
/// its directory under the node's `log/`.
pub fn bucket_key(table_id: u64, partition_id: Option<i64>, bucket: u32) -> String {
    match partition_id {
        Some(partition) => format!("t{table_id}/p{partition}/b{bucket}"),
        None => format!("t{table_id}/b{bucket}"),
    }
}

/// The name of the KV tablet of the bucket of `key`.
fn kv_tablet_name(key: &str) -> String {
    key.replace('/', ".")
}

/// Takes the furthest KV checkpoint of the bucket whose log is in `dir` as its tablet's,
/// and restores the tablet from it if the tablet holds nothing (the node lost `kv/`):
/// the log then replays into it from the checkpoint's end, not from its start. What the
/// restore took, if it ran.
fn restore_kv(
    store: &LogStore,
    dir: &Path,
    kv: &KvTablet,
    bucket: &str,
) -> Result<Option<Restored>> {
    let chain = store.kv_chain(dir)?;
    let restored = kv.restore(store, dir, chain)?;
    if let Some(restored) = &restored {
        info!(
            bucket,
            offset = restored.offset,
            runs = restored.runs,
            bytes = restored.bytes,
            rows = restored.entries,
            download_ms = restored.download.as_millis() as u64,
            ingestion_ms = restored.ingestion.as_millis() as u64,
            "restored a KV store from its checkpoint in the log store"
        );
    }
    Ok(restored)
}
