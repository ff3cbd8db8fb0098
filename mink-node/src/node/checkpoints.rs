//! KV checkpoints of the node's primary-key buckets, with a log store: what a run holds
//! is mink-kv's `checkpoint` module, how runs sit in the store mink-log's `kv_runs`.
//!
//! Every [`NodeConfig::kv_checkpoint_interval`](super::NodeConfig), and as soon as a
//! bucket's flushed rows since its last run reach its buffer limit, every primary-key
//! bucket that changed writes its next run. Log retention keeps each such bucket's log
//! from its checkpoint's end (the `retention` module): a node that lost its disk restores
//! the checkpoint and replays the log after it (the `storage` module).

use std::sync::Arc;
use std::time::Duration;

use mink_log::{KvRun, LogStore};
use tracing::{debug, warn};

use super::{Bucket, Node};

/// What one pass of checkpoints wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointPass {
    /// Runs written.
    pub runs: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Buckets whose checkpoint failed (logged; the next pass writes a base for them).
    pub failed: usize,
}

impl Node {
    /// Writes the next KV checkpoint run of every primary-key bucket that changed since
    /// its last (none without a log store). Blocks: run it on a blocking thread.
    pub fn checkpoint_kv(&self) -> CheckpointPass {
        let mut pass = CheckpointPass::default();
        let Some(store) = self.storage.config.log.store.clone() else {
            return pass;
        };
        for state in self.table_states() {
            let buckets: Vec<_> = (state.partitions().values().flatten())
                .filter_map(|slot| slot.tablets().cloned())
                .collect();
            for bucket in buckets {
                match checkpoint_bucket(&store, &bucket) {
                    Ok(Some(run)) => {
                        pass.runs += 1;
                        pass.bytes += run.bytes;
                    }
                    Ok(None) => {}
                    Err(error) => {
                        pass.failed += 1;
                        warn!(bucket = %bucket.log.dir().display(), %error, "a KV checkpoint failed");
                    }
                }
            }
        }
        debug!(
            runs = pass.runs,
            bytes = pass.bytes,
            "KV checkpoints written"
        );
        pass
    }

    /// Writes the last KV checkpoint run of a primary-key bucket handed over (its log
    /// sealed): its next leader restores it and replays only the log after it. A failure
    /// is logged: the next leader replays the log from the checkpoint before.
    pub(super) async fn checkpoint_handed_over(&self, bucket: Arc<Bucket>) {
        let (Some(store), Some(_)) = (self.storage.config.log.store.clone(), &bucket.kv) else {
            return;
        };
        let dir = bucket.log.dir().to_path_buf();
        let written = tokio::task::spawn_blocking(move || checkpoint_bucket(&store, &bucket));
        match written.await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                warn!(bucket = %dir.display(), %error, "the KV checkpoint of a bucket handed over failed");
            }
            Err(error) => warn!(%error, "the KV checkpoint of a bucket handed over stopped"),
        }
    }

    /// How often the node writes KV checkpoints; `None` without a log store.
    pub(crate) fn kv_checkpoint_interval(&self) -> Option<Duration> {
        let config = &self.storage.config;
        config
            .log
            .store
            .as_ref()
            .map(|_| config.kv_checkpoint_interval)
    }

    /// Resolves when a bucket's KV checkpoint is due before its time (never on a node
    /// without primary-key tables yet).
    pub async fn kv_checkpoint_due(&self) {
        let kv = self
            .storage
            .kv
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match kv {
            Some(kv) => kv.checkpoint_due().await,
            None => std::future::pending().await,
        }
    }
}

/// Writes the next KV checkpoint run of a primary-key bucket that changed since its last
/// (`None`: a log table's bucket, or nothing new). A new base leaves the chain before it
/// (and any run a crash left off the chain) to the store's upkeep.
fn checkpoint_bucket(store: &LogStore, bucket: &Bucket) -> mink_kv::Result<Option<KvRun>> {
    let Some(kv) = &bucket.kv else {
        return Ok(None);
    };
    let run = kv.checkpoint(store, bucket.log.dir());
    record_checkpoint(&run);
    let run = run?;
    if run.is_some_and(|run| run.is_base()) {
        store.kv_checkpointed(bucket.log.dir());
    }
    Ok(run)
}

/// Counts a checkpoint that wrote a run or failed (`mink_kv_checkpoints_total`); one
/// with nothing new to write is none.
fn record_checkpoint(run: &mink_kv::Result<Option<KvRun>>) {
    let metrics = mink_metrics::metrics();
    match run {
        Ok(None) => {}
        Ok(Some(run)) => {
            metrics.kv_checkpoints.with_label_values(&["ok"]).inc();
            metrics.kv_checkpoint_bytes.inc_by(run.bytes);
        }
        Err(_) => metrics.kv_checkpoints.with_label_values(&["failed"]).inc(),
    }
}
