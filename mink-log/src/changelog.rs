//! The changelog hook: how a primary-key table's writes become its changelog, and how the
//! state the changelog folds to (the KV store, in mink-kv) follows the log.
//!
//! The log does not know the store: it drives a [`Changelog`] through a group commit
//! (prepare each write, commit once the group is durable, or abort), waits for the
//! commit's [`Applying`] before it acknowledges, and on open replays the durable log from
//! the hook's applied offset into it, [`REPLAY_CHUNK`] batches at a time.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::info;

use crate::error::{LogError, Result};
use crate::read::{PlannedBatch, Source, read_planned};
use crate::segment::FrameHeader;
use crate::store::StreamObject;
use crate::{LogBatch, StoredBatch, Write};

/// What turns a primary-key table's writes into its changelog, and keeps the state the
/// changelog folds to (the KV store) in line with the log.
///
/// The appender calls [`Changelog::prepare`] for each write of a group (in the order they
/// are logged), then, once the group is durable, [`Changelog::commit`] — or
/// [`Changelog::abort`] when the group failed. A commit may update the state in the
/// background while the appender writes the next group: the group is acknowledged once
/// its [`Applying`] resolves, and the prepares after the commit see its writes already.
pub trait Changelog: Send + std::fmt::Debug + 'static {
    /// The changelog batch of one write, seeing every earlier write of the group;
    /// `None` when the write changes nothing.
    fn prepare(&mut self, write: &Write) -> Result<Option<StoredBatch>>;
    /// The schema version of the batches [`Changelog::prepare`] returns: the newest the
    /// changelog has seen, which may be newer than the write's.
    fn schema_id(&self) -> u32;
    /// The prepared writes are durable up to `end_offset`: apply them. Fails when the
    /// previous commit's update failed; the state then no longer follows the log
    /// ([`Changelog::failure`]).
    fn commit(&mut self, end_offset: i64) -> Result<Applying>;
    /// Why the state no longer follows the log, once an update of it failed: the
    /// appender writes no group after that (see the appender's module doc).
    fn failure(&self) -> Option<String>;
    /// Waits until every committed write is applied.
    fn settle(&mut self) -> Result<()>;
    /// The prepared writes failed: forget them.
    fn abort(&mut self);
    /// The offset up to which the durable log has been applied (or is being applied).
    fn applied_offset(&self) -> i64;
    /// Applies a durable changelog batch (recovery replays the log from
    /// [`Changelog::applied_offset`]); [`Changelog::commit`] follows the last one.
    fn replay(&mut self, batch: &LogBatch) -> Result<()>;
}

/// A commit's update of the changelog's state, which may still be running: resolves once
/// readers of the state see the commit's writes, with the update's error if it failed.
#[derive(Debug)]
pub struct Applying(pub(crate) Option<oneshot::Receiver<Result<()>>>);

impl Applying {
    /// An update that is already done.
    pub fn done() -> Self {
        Self(None)
    }

    /// An update that reports on `done` when it ends.
    pub fn pending(done: oneshot::Receiver<Result<()>>) -> Self {
        Self(Some(done))
    }

    pub(crate) async fn wait(self) -> Result<()> {
        match self.0 {
            None => Ok(()),
            Some(done) => done
                .await
                .unwrap_or_else(|_| Err(LogError::Changelog("the KV store update stopped".into()))),
        }
    }
}

/// Batches read at once while replaying the log into a changelog hook: the hook is
/// committed after each chunk ([`Changelog::replay`]).
pub const REPLAY_CHUNK: usize = 64;

/// Replays the durable log from the changelog hook's applied offset into it.
pub(crate) fn replay(
    source: Source<'_>,
    batches: &VecDeque<(FrameHeader, i64)>,
    streamed: &BTreeMap<i64, Arc<StreamObject>>,
    end: i64,
    changelog: &mut dyn Changelog,
) -> Result<()> {
    let applied = changelog.applied_offset();
    if applied == end {
        return Ok(());
    }
    let first = batches.partition_point(|(h, _)| h.base_offset < applied);
    if batches.get(first).map(|(h, _)| h.base_offset) != Some(applied) {
        return Err(LogError::Corrupt(format!(
            "bucket {}: the KV store is at offset {applied}, which is not a batch boundary of the retained log",
            source.label
        )));
    }
    let plan: Vec<PlannedBatch> = batches
        .range(first..)
        .map(|(header, segment)| PlannedBatch {
            header: *header,
            segment: *segment,
            stream: streamed.get(segment).cloned(),
            cached: None,
        })
        .collect();
    info!(
        bucket = source.label,
        from = applied,
        to = end,
        "replaying the log into the KV store"
    );
    // A chunk at a time, each committed before the next is read (its update runs beside
    // that read): a whole log rebuilt into an empty store never sits in memory, and a
    // crash during the replay resumes after the last chunk applied.
    for chunk in plan.chunks(REPLAY_CHUNK) {
        let mut chunk_end = None;
        for batch in read_planned(source, chunk.to_vec(), LogBatch::from_found)? {
            changelog.replay(&batch)?;
            chunk_end = Some(batch.last_offset + 1);
        }
        if let Some(chunk_end) = chunk_end {
            changelog.commit(chunk_end)?;
        }
    }
    if changelog.applied_offset() != end {
        changelog.commit(end)?;
    }
    changelog.settle()
}
