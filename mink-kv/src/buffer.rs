//! The store's write buffer: the rows of committed groups, held in memory as sorted runs
//! and written to fjall many groups at a time.
//!
//! fjall writes a key through its journal and a skiplist memtable, then flushes and
//! compacts it: about 1.3 µs per row here, more than the rest of an upsert. The log
//! already is the store's write-ahead log, so a committed group's rows only need to be
//! readable, not durable: each group's rows join the tablet's [`Run`]s in memory, and a
//! flush writes all of a tablet's runs to fjall as sorted tables (fjall's ingestion, a
//! sequential write per row; a large flush split by key over the cores), then the
//! applied offset they reach.
//!
//! * fjall's applied offset is what fjall holds; the runs cover the log from there to the
//!   buffer's end. After a crash the runs are gone and the log's replay from fjall's
//!   applied offset rebuilds them, as it rebuilds any update lost.
//! * Reads see fjall and the runs as one ([`Merged`]): a run's row,
//!   or its deletion, hides fjall's. A reader takes the runs and its fjall snapshot under
//!   the runs' read lock; a flush makes its table visible in fjall before it lets go of
//!   the runs, so a reader sees a flushed row in one or both, never in neither.
//! * Runs are merged as they come, four of a like size into one (in one pass, each entry
//!   copied once), so a tablet holds a few runs of growing size, about five, and a row is
//!   copied about twice before its flush (merging two at a time copied it about five
//!   times); a lookup searches only the runs whose key range holds its key and whose
//!   Bloom filter may, and reads fjall only for a key at or below the greatest fjall may
//!   hold (`stored_key_bound`). Runs of an ascending load, each above the one before,
//!   are not merged once they hold a few thousand entries each: their key ranges do not
//!   meet, so a lookup searches one of them, and a merge would only copy them.
//! * A tablet is flushed once it buffers [`BufferLimits::tablet_bytes`], and once the
//!   node's tablets buffer [`BufferLimits::node_bytes`] together the largest is: in the
//!   background, on the store's update threads, while groups go on joining the runs (the
//!   runs being flushed are frozen, merged with nothing; a flush takes the runs there are
//!   when it starts and lets go of those alone). A tablet at twice its limit is flushed
//!   before its push returns, so writes wait for flushes that do not keep up. A tablet
//!   is also flushed when its writer is dropped (the bucket closes) and before log
//!   retention runs.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use fjall::Keyspace;

use super::checkpoint::{Checkpoints, PendingLimits};
use super::runs::{Merged, Run};
use super::threads;
use super::{decode_offset, kv_error};
use crate::error::{KvError, Result};

/// Runs merged into one at a time (see [`like_sized_tail`]).
const MERGE_FAN_IN: usize = 4;

/// Entries a run holds at least to stay apart from the runs beside it when their keys do
/// not interleave (see [`ascending_apart`]).
const MIN_ENTRIES_APART: usize = 4096;

/// Rows a flush gives each of its parts at least (see [`Tablets::write_runs`]): fewer are
/// not worth a thread.
const MIN_ROWS_PER_INGESTION: usize = 50_000;

/// When the write buffer is written to fjall.
#[derive(Debug, Clone, Copy)]
pub struct BufferLimits {
    /// A tablet is flushed once its runs hold this many bytes (default 32 MiB; a bucket
    /// loading 60-byte rows holds about 260 000 of them).
    pub tablet_bytes: usize,
    /// Once the node's tablets buffer this many bytes together, the largest is flushed
    /// (default 256 MiB).
    pub node_bytes: usize,
}

impl BufferLimits {
    /// Limits for a node whose tablets buffer at most about `node_bytes`: a tablet is
    /// flushed at an eighth of it.
    pub fn within(node_bytes: usize) -> Self {
        Self {
            tablet_bytes: node_bytes / 8,
            node_bytes,
        }
    }
}

impl Default for BufferLimits {
    fn default() -> Self {
        Self::within(256 << 20)
    }
}

/// The node's open tablets, their applied offsets and the bytes their runs hold.
pub(super) struct Tablets {
    /// Per tablet, the log offset fjall's rows reflect.
    pub(super) applied: Keyspace,
    limits: BufferLimits,
    open: Mutex<HashMap<String, Arc<TabletState>>>,
    buffered_bytes: AtomicUsize,
    /// The runs the tablets' flushes wrote since their last checkpoints, together.
    pub(super) pending: PendingLimits,
    /// Told when those runs reach their limits ([`Checkpoints::flushed`]).
    pub(super) checkpoint_due: tokio::sync::Notify,
}

/// One tablet: its fjall keyspace and the runs not written to it yet.
pub(super) struct TabletState {
    pub(super) name: String,
    pub(super) rows: Keyspace,
    buffered: RwLock<Buffered>,
    /// Held through a flush: one at a time per tablet.
    flushing: Mutex<()>,
    /// A flush in the background is queued and has not started yet.
    flush_queued: AtomicBool,
    /// Why the tablet can no longer follow its log (a flush in the background or an
    /// update failed): it takes no more groups and answers no reads ([`TabletState::fail`]).
    failed: Mutex<Option<String>>,
    /// The tablet was dropped: nothing is flushed to it any more.
    dropped: AtomicBool,
    /// Its checkpoints in the log store, and its flushes' runs since the last.
    pub(super) checkpoints: Mutex<Checkpoints>,
    /// Held through a checkpoint: one at a time per tablet.
    pub(super) checkpointing: Mutex<()>,
}

/// What a tablet's groups changed since fjall's applied offset.
#[derive(Debug, Clone, Default)]
pub(super) struct Buffered {
    /// Oldest first.
    pub(super) runs: Vec<Arc<Run>>,
    /// The first runs, which a flush is writing to fjall: merges leave them as they are.
    frozen: usize,
    /// The offset the buffered groups reach; `None`: none since fjall's applied offset.
    pub(super) end_offset: Option<i64>,
    bytes: usize,
    /// No key fjall holds (deleted or not) is greater: a key above it that no run has is
    /// in no source, without a read of fjall.
    stored_key_bound: Option<Vec<u8>>,
}

/// A flush a push made due.
#[derive(Debug)]
pub(super) struct Due {
    pub(super) tablet: Arc<TabletState>,
    /// The pushing tablet buffers twice its limit: flushes do not keep up with its
    /// writes, which wait for this one.
    pub(super) wait: bool,
}

impl Buffered {
    /// The row of `key` as the runs have it: `Some(None)` deleted, `None` not in them.
    pub(super) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.runs.iter().rev().find_map(|run| run.get(key))
    }

    /// Whether fjall may hold `key`.
    pub(super) fn may_store(&self, key: &[u8]) -> bool {
        self.stored_key_bound
            .as_deref()
            .is_some_and(|bound| key <= bound)
    }

    /// No key of the runs or fjall, deleted or not, is greater.
    pub(super) fn key_bound(&self) -> Option<&[u8]> {
        last_key(&self.runs).max(self.stored_key_bound.as_deref())
    }
}

/// Writes the entries of `runs` from `start` to below `end` (`None`: to the last) to
/// fjall's `rows` as one table.
fn ingest(
    rows: &Keyspace,
    runs: &[Arc<Run>],
    start: Bound<&[u8]>,
    end: Option<&[u8]>,
) -> Result<()> {
    let mut ingestion = rows.start_ingestion().map_err(kv_error)?;
    let fjall_rows = std::iter::empty::<fjall::Result<_>>();
    for entry in Merged::new(fjall_rows, runs, start) {
        let (key, row) = entry?;
        if end.is_some_and(|end| *key >= *end) {
            break;
        }
        match row {
            Some(row) => ingestion.write(key, row),
            None => ingestion.write_tombstone(key),
        }
        .map_err(kv_error)?;
    }
    ingestion.finish().map_err(kv_error)
}

/// Where the last [`MERGE_FAN_IN`] of `runs` start, if they are of a like size (the
/// oldest at most twice the newest) and not runs of an ascending load: then they are
/// merged into one.
fn like_sized_tail(runs: &[Arc<Run>]) -> Option<usize> {
    let from = runs.len().checked_sub(MERGE_FAN_IN)?;
    let tail = &runs[from..];
    let (oldest, newest) = (&tail[0], tail.last()?);
    let like_sized = oldest.len() <= 2 * newest.len();
    (like_sized && !ascending_apart(tail)).then_some(from)
}

/// Whether `runs` each hold [`MIN_ENTRIES_APART`] entries or more, each run's keys above
/// the one's before: runs an ascending load leaves, which stay apart. Merged, they would
/// only be copied; apart, a key's search skips each run whose keys end below it or start
/// above it, and a tablet holds at most one run per [`MIN_ENTRIES_APART`] entries.
fn ascending_apart(runs: &[Arc<Run>]) -> bool {
    runs.iter().all(|run| run.len() >= MIN_ENTRIES_APART)
        && (runs.windows(2)).all(|pair| pair[0].last_key() < pair[1].first_key())
}

/// The greatest key of `runs`, deleted or not.
fn last_key(runs: &[Arc<Run>]) -> Option<&[u8]> {
    runs.iter().filter_map(|run| run.last_key()).max()
}

impl Tablets {
    pub(super) fn new(applied: Keyspace, limits: BufferLimits) -> Self {
        Self {
            applied,
            limits,
            open: Mutex::default(),
            buffered_bytes: AtomicUsize::new(0),
            pending: PendingLimits::new(limits),
            checkpoint_due: tokio::sync::Notify::new(),
        }
    }

    /// The state of tablet `name`, opened with `open` on first use.
    pub(super) fn get_or_open(
        &self,
        name: &str,
        open: impl FnOnce() -> Result<Keyspace>,
    ) -> Result<Arc<TabletState>> {
        let mut tablets = lock(&self.open);
        if let Some(tablet) = tablets.get(name) {
            return Ok(Arc::clone(tablet));
        }
        let rows = open()?;
        let last = rows.last_key_value().map(|pair| pair.key());
        let stored_key_bound = last.transpose().map_err(kv_error)?.map(|key| key.to_vec());
        let tablet = Arc::new(TabletState {
            name: name.to_string(),
            rows,
            buffered: RwLock::new(Buffered {
                stored_key_bound,
                ..Buffered::default()
            }),
            flushing: Mutex::default(),
            flush_queued: AtomicBool::new(false),
            failed: Mutex::default(),
            dropped: AtomicBool::new(false),
            checkpoints: Mutex::default(),
            checkpointing: Mutex::default(),
        });
        tablets.insert(name.to_string(), Arc::clone(&tablet));
        Ok(tablet)
    }

    /// Forgets a dropped tablet and its runs.
    pub(super) fn remove(&self, tablet: &TabletState) {
        let _flushing = lock(&tablet.flushing);
        tablet.dropped.store(true, Ordering::Release);
        let mut buffered = write(&tablet.buffered);
        buffered.runs.clear();
        self.recount(&mut buffered);
        *buffered = Buffered::default();
        lock(&self.open).remove(&tablet.name);
    }

    /// Adds a committed group's rows, reaching `end_offset`, to the tablet's runs; fails
    /// if a flush in the background failed.
    pub(super) fn push(&self, tablet: &TabletState, run: Arc<Run>, end_offset: i64) -> Result<()> {
        if let Some(failure) = tablet.failure() {
            return Err(KvError::Store(failure));
        }
        let mut buffered = write(&tablet.buffered);
        // Merge the runs before this one first (the writer still reads this one), not
        // those a flush is writing.
        while let Some(from) = like_sized_tail(&buffered.runs[buffered.frozen..]) {
            let from = buffered.frozen + from;
            let merged = Run::merge(&buffered.runs[from..]);
            buffered.runs.truncate(from);
            buffered.runs.push(Arc::new(merged));
        }
        if run.len() > 0 {
            buffered.runs.push(run);
        }
        buffered.end_offset = Some(end_offset);
        self.recount(&mut buffered);
        Ok(())
    }

    /// The flush a push to `tablet` makes due, if any: of the tablet once it buffers
    /// [`BufferLimits::tablet_bytes`], else of the node's largest buffer once the node's
    /// reach [`BufferLimits::node_bytes`]. A tablet whose flush is queued is not due again.
    pub(super) fn due(&self, tablet: &Arc<TabletState>) -> Option<Due> {
        let bytes = read(&tablet.buffered).bytes;
        let due = if bytes >= self.limits.tablet_bytes {
            Arc::clone(tablet)
        } else if self.buffered_bytes.load(Ordering::Relaxed) >= self.limits.node_bytes {
            (lock(&self.open).values())
                .max_by_key(|tablet| read(&tablet.buffered).bytes)
                .cloned()?
        } else {
            return None;
        };
        let wait = Arc::ptr_eq(&due, tablet) && bytes >= 2 * self.limits.tablet_bytes;
        if !wait && due.flush_queued.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Due { tablet: due, wait })
    }

    /// Writes the tablet's runs to fjall (see [`Tablets::flush`]), for nobody waiting:
    /// skipped if a flush of the tablet runs; a failure is kept for its next push.
    pub(super) fn flush_in_background(&self, tablet: &TabletState) {
        tablet.flush_queued.store(false, Ordering::Release);
        let Ok(_flushing) = tablet.flushing.try_lock() else {
            return;
        };
        if let Err(error) = self.flush_runs(tablet) {
            tracing::error!(tablet = tablet.name, %error, "writing buffered rows to the KV store failed");
            tablet.fail(format!(
                "writing buffered rows to the KV store failed: {error}"
            ));
        }
    }

    /// Writes the tablet's runs to fjall as one sorted table, then the offset they reach
    /// as fjall's applied offset, then lets go of them. Groups pushed meanwhile stay
    /// buffered.
    pub(super) fn flush(&self, tablet: &TabletState) -> Result<()> {
        let _flushing = lock(&tablet.flushing);
        self.flush_runs(tablet)
    }

    /// Flushes the tablet, then runs `then` with fjall's applied offset before another
    /// flush can start: `then` sees fjall as that offset leaves it.
    pub(super) fn flushed<T>(
        &self,
        tablet: &TabletState,
        then: impl FnOnce(i64) -> Result<T>,
    ) -> Result<T> {
        let _flushing = lock(&tablet.flushing);
        self.flush_runs(tablet)?;
        then(self.flushed_offset(tablet)?)
    }

    /// The log offset the tablet's rows in fjall reflect.
    pub(super) fn flushed_offset(&self, tablet: &TabletState) -> Result<i64> {
        let applied = self.applied.get(tablet.name.as_bytes()).map_err(kv_error)?;
        decode_offset(applied.as_deref())
    }

    /// Records that the tablet's rows in fjall reflect the log up to `offset`.
    fn record_applied(&self, tablet: &TabletState, offset: i64) -> Result<()> {
        (self.applied)
            .insert(tablet.name.as_bytes(), offset.to_le_bytes())
            .map_err(kv_error)
    }

    /// Rows were ingested into the tablet's fjall keyspace (a restore): they reach
    /// `end_offset`.
    pub(super) fn restored(&self, tablet: &TabletState, end_offset: i64) -> Result<()> {
        let _flushing = lock(&tablet.flushing);
        let last = tablet.rows.last_key_value().map(|pair| pair.key());
        let last = last.transpose().map_err(kv_error)?;
        write(&tablet.buffered).stored_key_bound = last.map(|key| key.to_vec());
        self.record_applied(tablet, end_offset)
    }

    /// [`Tablets::flush`], its lock held.
    fn flush_runs(&self, tablet: &TabletState) -> Result<()> {
        if tablet.dropped.load(Ordering::Acquire) {
            return Ok(());
        }
        let (runs, end_offset) = {
            let mut buffered = write(&tablet.buffered);
            buffered.frozen = buffered.runs.len();
            (buffered.runs.clone(), buffered.end_offset)
        };
        let Some(end_offset) = end_offset else {
            return Ok(());
        };
        let written = self.write_runs(tablet, &runs, end_offset);
        let mut buffered = write(&tablet.buffered);
        buffered.frozen = 0;
        written?;
        let checkpoint_due = lock(&tablet.checkpoints).flushed(&runs, end_offset, &self.pending);
        if checkpoint_due {
            self.checkpoint_due.notify_one();
        }
        buffered.runs.drain(..runs.len());
        self.recount(&mut buffered);
        let flushed_bound = last_key(&runs);
        if flushed_bound > buffered.stored_key_bound.as_deref() {
            buffered.stored_key_bound = flushed_bound.map(<[u8]>::to_vec);
        }
        if buffered.runs.is_empty() && buffered.end_offset == Some(end_offset) {
            // Nothing buffered: fjall's applied offset is the tablet's.
            buffered.end_offset = None;
        }
        Ok(())
    }

    /// Writes `runs` to fjall as sorted tables, then `end_offset` as its applied offset.
    ///
    /// fjall's ingestion of a row costs more than the rest of its upsert, so many rows
    /// are split by key into parts ingested side by side, up to one per core (fjall
    /// registers each part's tables in turn). A crash between the parts leaves fjall some
    /// of the rows and its old applied offset: the replay from there writes them again,
    /// as it would after a crash between the table and the offset.
    fn write_runs(&self, tablet: &TabletState, runs: &[Arc<Run>], end_offset: i64) -> Result<()> {
        let entries: usize = runs.iter().map(|run| run.len()).sum();
        if entries > 0 {
            let parts = (entries / MIN_ROWS_PER_INGESTION).clamp(1, threads::cores());
            let splits = Run::split_keys(runs, parts);
            let starts = std::iter::once(Bound::Unbounded)
                .chain(splits.iter().map(|&key| Bound::Included(key)));
            let ends = splits.iter().map(|&key| Some(key)).chain([None]);
            let ranges: Vec<_> = starts.zip(ends).collect();
            threads::split_over(&ranges, ranges.len(), |ranges| {
                (ranges.iter())
                    .map(|&(start, end)| ingest(&tablet.rows, runs, start, end))
                    .collect()
            })?;
        }
        self.record_applied(tablet, end_offset)
    }

    /// Counts a tablet's bytes again after its runs changed, and the node's with them.
    fn recount(&self, buffered: &mut Buffered) {
        let (before, after) = (
            buffered.bytes,
            buffered.runs.iter().map(|run| run.bytes()).sum(),
        );
        buffered.bytes = after;
        if after >= before {
            self.buffered_bytes
                .fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.buffered_bytes
                .fetch_sub(before - after, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for Tablets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tablets")
            .field("buffered_bytes", &self.buffered_bytes)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TabletState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TabletState")
            .field("name", &self.name)
            .field("buffered", &self.buffered)
            .finish_non_exhaustive()
    }
}

impl TabletState {
    /// The runs, read-locked: no flush lets go of them while the guard is held.
    pub(super) fn buffered(&self) -> RwLockReadGuard<'_, Buffered> {
        read(&self.buffered)
    }

    /// The tablet can no longer follow its log: its next pushes fail, and so do its reads,
    /// until a restart replays the log into it. The first failure is the one kept.
    pub(super) fn fail(&self, reason: String) {
        lock(&self.failed).get_or_insert(reason);
    }

    /// Why the tablet can no longer follow its log, if it cannot.
    pub(super) fn failure(&self) -> Option<String> {
        lock(&self.failed).clone()
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
