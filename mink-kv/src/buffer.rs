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
//! * Reads see fjall and the runs as one ([`Merged`](super::runs::Merged)): a run's row,
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

use super::kv_error;
use super::runs::{Merged, Run};
use super::threads;
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
        self.applied
            .insert(tablet.name.as_bytes(), end_offset.to_le_bytes())
            .map_err(kv_error)
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt as _;

    use super::*;
    use crate::{KvConfig, KvStore, KvTablet};

    /// A run of `(key, row)` (`None`: deleted), keys and rows one byte each.
    fn run(entries: &[(u8, Option<u8>)]) -> Arc<Run> {
        let entries: Vec<_> = (entries.iter())
            .map(|&(key, row)| (vec![key], row.map(|row| vec![row])))
            .collect();
        Arc::new(Run::from_owned(&entries))
    }

    fn store(limits: BufferLimits) -> (tempfile::TempDir, KvStore) {
        let dir = tempfile::tempdir().unwrap();
        let config = KvConfig {
            buffer: limits,
            ..KvConfig::default()
        };
        let store = KvStore::open(dir.path(), &config).unwrap();
        (dir, store)
    }

    /// Keys 1, 2, 3 in fjall (rows 1, 2, 3; offsets up to 3); then a group that writes 2
    /// and 4 (up to 5) and one that deletes 3 (up to 7).
    fn tablet_with_runs(store: &KvStore) -> KvTablet {
        let tablet = store.tablet("t").unwrap();
        tablet
            .buffer(run(&[(1, Some(1)), (2, Some(2)), (3, Some(3))]), 3)
            .unwrap();
        tablet.flush().unwrap();
        tablet
            .buffer(run(&[(2, Some(20)), (4, Some(40))]), 5)
            .unwrap();
        tablet.buffer(run(&[(3, None)]), 7).unwrap();
        tablet
    }

    /// Every read of the tablet agrees on its rows: `(key, row)`.
    async fn rows(tablet: &KvTablet) -> Vec<(u8, u8)> {
        let chunks: Vec<Vec<u8>> = (tablet.snapshot().unwrap())
            .into_chunks(2, usize::MAX, |rows| {
                Ok::<_, KvError>(rows.iter().map(|row| row[0]).collect())
            })
            .try_collect()
            .await
            .unwrap();
        let rows: Vec<u8> = chunks.concat();
        let prefixed: Vec<u8> = (tablet.prefix(&[]).unwrap().iter())
            .map(|row| row[0])
            .collect();
        assert_eq!(rows, prefixed, "snapshot and prefix read");
        (1..=5u8)
            .filter_map(|key| Some((key, tablet.get(&[key]).unwrap()?[0])))
            .inspect(|(_, row)| assert!(rows.contains(row), "a get finds a snapshot's row"))
            .collect()
    }

    /// Enough keys that `get_many` splits fjall's reads over threads: each key's row is
    /// found where it is (fjall, a run, deleted in a run, nowhere), in the keys' order.
    #[test]
    fn many_gets_read_each_key_where_it_is() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        let key = |i: u16| i.to_be_bytes().to_vec();
        let rows = |keys: &mut dyn Iterator<Item = u16>, row: fn(u16) -> Option<Vec<u8>>| {
            let entries: Vec<_> = keys.map(|i| (key(i), row(i))).collect();
            Arc::new(Run::from_owned(&entries))
        };
        // Even keys below 2000 in fjall; every sixth replaced, every tenth deleted.
        tablet
            .buffer(
                rows(&mut (0..2000).step_by(2), |i| {
                    Some(i.to_le_bytes().to_vec())
                }),
                1,
            )
            .unwrap();
        tablet.flush().unwrap();
        tablet
            .buffer(rows(&mut (0..2000).step_by(6), |_| Some(vec![6])), 2)
            .unwrap();
        tablet
            .buffer(rows(&mut (0..2000).step_by(10), |_| None), 3)
            .unwrap();
        let expected = |i: u16| match i {
            _ if i.is_multiple_of(10) || !i.is_multiple_of(2) || i >= 2000 => None,
            _ if i.is_multiple_of(6) => Some(vec![6]),
            _ => Some(i.to_le_bytes().to_vec()),
        };
        // Backwards, so the reads go in another order than the keys.
        let keys: Vec<Vec<u8>> = (0..2100).rev().map(key).collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let found = tablet.get_many(&keys).unwrap();
        let found: Vec<Option<Vec<u8>>> = found
            .into_iter()
            .map(|row| row.map(|row| row.to_vec()))
            .collect();
        let expected: Vec<Option<Vec<u8>>> = (0..2100).rev().map(expected).collect();
        assert_eq!(found, expected);
    }

    #[tokio::test]
    async fn buffered_rows_read_as_stored_ones_before_and_after_a_flush() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = tablet_with_runs(&store);
        let expected = [(1, 1), (2, 20), (4, 40)];
        assert_eq!(rows(&tablet).await, expected);
        assert_eq!(tablet.key_bound(), Some(vec![4]));
        assert_eq!(tablet.applied_offset().unwrap(), 7);
        assert_eq!(tablet.flushed_offset().unwrap(), 3);

        tablet.flush().unwrap();
        assert_eq!(rows(&tablet).await, expected, "the deletion flushed too");
        assert!(tablet.state.buffered().runs.is_empty());
        assert_eq!(tablet.applied_offset().unwrap(), 7);
        assert_eq!(tablet.flushed_offset().unwrap(), 7);
        assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn runs_that_do_not_interleave_are_flushed_with_their_deletions() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        tablet.buffer(run(&[(3, Some(3))]), 1).unwrap();
        tablet.flush().unwrap();
        tablet.buffer(run(&[(1, Some(1))]), 2).unwrap();
        tablet.buffer(run(&[(2, Some(2)), (3, None)]), 3).unwrap();
        tablet.flush().unwrap();
        assert!(tablet.state.buffered().runs.is_empty());
        assert_eq!(rows(&tablet).await, [(1, 1), (2, 2)], "3 deleted in fjall");
    }

    #[tokio::test]
    async fn a_snapshot_taken_before_a_flush_reads_the_rows_it_was_taken_with() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = tablet_with_runs(&store);
        let snapshot = tablet.snapshot().unwrap();
        tablet.flush().unwrap();
        tablet.buffer(run(&[(1, None), (5, Some(50))]), 9).unwrap();
        assert_eq!(snapshot.log_offset(), 7);
        let read: Vec<Vec<u8>> = snapshot
            .into_chunks(10, usize::MAX, |rows| {
                Ok::<_, KvError>(rows.iter().map(|row| row[0]).collect())
            })
            .try_collect()
            .await
            .unwrap();
        assert_eq!(read.concat(), [1, 20, 40]);
        assert_eq!(rows(&tablet).await, [(2, 20), (4, 40), (5, 50)]);
    }

    #[test]
    fn fjall_is_read_only_for_keys_at_or_below_the_greatest_it_may_hold() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
            tablet_with_runs(&store).flush().unwrap();
        }
        let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
        let tablet = store.tablet("t").unwrap();
        assert_eq!(
            tablet.key_bound(),
            Some(vec![4]),
            "fjall's last key, reopened"
        );
        // Rows fjall could not hold: written behind the tablet's back, above its bound.
        tablet.state.rows.insert([3], [33]).unwrap();
        tablet.state.rows.insert([5], [50]).unwrap();
        assert_eq!(
            tablet.get(&[3]).unwrap().unwrap()[0],
            33,
            "at or below: read"
        );
        assert_eq!(tablet.get(&[5]).unwrap(), None, "above: not read");
    }

    #[test]
    fn runs_merge_as_they_come_and_a_lookup_searches_a_few() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        for group in 0..64u8 {
            // Every group writes a new key and rewrites key 0.
            tablet
                .buffer(run(&[(0, Some(group)), (group + 1, Some(group))]), 1)
                .unwrap();
        }
        // At most three runs of each size, and sizes grow fourfold: 64 groups are 3 sizes.
        let runs = tablet.state.buffered().runs.len();
        assert!(runs <= 3 * (MERGE_FAN_IN - 1) + 1, "{runs} runs");
        assert_eq!(tablet.get(&[0]).unwrap().unwrap()[0], 63);
        assert_eq!(tablet.get(&[10]).unwrap().unwrap()[0], 9);
    }

    /// The run of `keys` (four-byte keys), each with the row `row` gives it.
    fn run_of(keys: impl Iterator<Item = u32>, row: impl Fn(u32) -> Option<u8>) -> Arc<Run> {
        let entries: Vec<_> = keys
            .map(|key| (key.to_be_bytes().to_vec(), row(key).map(|row| vec![row])))
            .collect();
        Arc::new(Run::from_owned(&entries))
    }

    /// Runs of `count` keys from `first` on, each key's row the key's low byte.
    fn ascending(first: u32, count: u32) -> Arc<Run> {
        run_of(first..first + count, |key| Some(key as u8))
    }

    #[test]
    fn large_runs_of_an_ascending_load_stay_apart_and_small_ones_merge() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        let apart = MIN_ENTRIES_APART as u32;
        for run in 0..12 {
            tablet.buffer(ascending(run * apart, apart), 1).unwrap();
        }
        assert_eq!(
            tablet.state.buffered().runs.len(),
            12,
            "large ascending runs apart"
        );
        for key in [0, apart - 1, 5 * apart + 7, 12 * apart - 1] {
            let row = tablet.get(&key.to_be_bytes()).unwrap();
            assert_eq!(row.unwrap().as_ref(), [key as u8], "{key}");
        }
        assert_eq!(tablet.get(&(12 * apart).to_be_bytes()).unwrap(), None);
        // Small ascending runs merge, as do large ones that interleave.
        for run in 0..64 {
            tablet
                .buffer(ascending(12 * apart + run * 10, 10), 1)
                .unwrap();
        }
        let runs = tablet.state.buffered().runs.len();
        assert!(runs <= 12 + 3 * (MERGE_FAN_IN - 1) + 1, "{runs} runs");
        for _ in 0..MERGE_FAN_IN {
            tablet.buffer(ascending(0, apart), 1).unwrap();
        }
        let runs_after = tablet.state.buffered().runs.len();
        assert!(runs_after <= runs + 1, "{runs} then {runs_after} runs");
        assert_eq!(
            tablet
                .get(&(12 * apart + 639).to_be_bytes())
                .unwrap()
                .unwrap()
                .as_ref(),
            [(12 * apart + 639) as u8]
        );
    }

    /// Groups of writes large enough that a flush of them is split by key (on a machine
    /// of more than one core), with their offsets: inserts, deletes and updates across
    /// the keys. The first is flushed on its own before the others.
    fn large_groups() -> Vec<(Arc<Run>, i64)> {
        let rows = 4 * MIN_ROWS_PER_INGESTION as u32;
        let group =
            |keys: std::iter::StepBy<std::ops::Range<u32>>, row: Option<u8>| run_of(keys, |_| row);
        vec![
            (group((0..rows).step_by(2), Some(1)), 1),
            (group((1..rows).step_by(2), Some(2)), 2),
            (group((0..rows).step_by(3), None), 3),
            (group((0..rows).step_by(5), Some(3)), 4),
        ]
    }

    /// Flushes the first of [`large_groups`], then buffers the others.
    fn buffer_large_groups(tablet: &KvTablet) {
        let groups = large_groups();
        tablet
            .buffer(Arc::clone(&groups[0].0), groups[0].1)
            .unwrap();
        tablet.flush().unwrap();
        for (run, offset) in &groups[1..] {
            tablet.buffer(Arc::clone(run), *offset).unwrap();
        }
    }

    /// The rows [`large_groups`] leave, in key order.
    fn model_of_large_groups() -> Vec<Vec<u8>> {
        (0..4 * MIN_ROWS_PER_INGESTION as u32)
            .filter_map(|key| match key {
                _ if key % 5 == 0 => Some(3),
                _ if key % 3 == 0 => None,
                _ => Some(if key % 2 == 0 { 1 } else { 2 }),
            })
            .map(|row| vec![row])
            .collect()
    }

    /// fjall's rows, in key order.
    fn fjall_rows(tablet: &KvTablet) -> Vec<Vec<u8>> {
        (tablet.state.rows.iter())
            .map(|entry| entry.into_inner().unwrap().1.to_vec())
            .collect()
    }

    /// fjall ends up with every row of a flush split by key, each key once, deletions
    /// applied.
    #[test]
    fn a_large_flush_split_by_key_writes_each_row_once() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        buffer_large_groups(&tablet);
        tablet.flush().unwrap();
        assert!(tablet.state.buffered().runs.is_empty());
        assert_eq!(tablet.flushed_offset().unwrap(), 4);
        let (stored, expected) = (fjall_rows(&tablet), model_of_large_groups());
        assert_eq!(stored.len(), expected.len());
        assert!(stored == expected, "fjall's rows are the model's");
    }

    /// A crash between the parts of a split flush leaves fjall the rows of the parts that
    /// landed under its old applied offset. The groups after that offset, buffered again
    /// as the log's replay does, read and flush as if no part had landed.
    #[tokio::test]
    async fn a_crash_between_the_parts_of_a_flush_is_mended_by_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let groups = large_groups();
        {
            let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
            let tablet = store.tablet("t").unwrap();
            buffer_large_groups(&tablet);
            // The parts from the first split key on land, the first does not.
            let runs = tablet.state.buffered().runs.clone();
            let split = Run::split_keys(&runs, 2)[0];
            ingest(&tablet.state.rows, &runs, Bound::Included(split), None).unwrap();
        }
        let store = KvStore::open(dir.path(), &KvConfig::default()).unwrap();
        let tablet = store.tablet("t").unwrap();
        assert_eq!(
            tablet.flushed_offset().unwrap(),
            1,
            "the old applied offset"
        );
        for (run, offset) in &groups[1..] {
            tablet.buffer(Arc::clone(run), *offset).unwrap();
        }
        let expected = model_of_large_groups();
        let read: Vec<Vec<u8>> = (tablet.prefix(&[]).unwrap().iter())
            .map(|row| row.to_vec())
            .collect();
        assert!(read == expected, "reads before the flush are the model's");
        let keys: Vec<Vec<u8>> = (0..4 * MIN_ROWS_PER_INGESTION as u32)
            .step_by(7)
            .map(|key| key.to_be_bytes().to_vec())
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let before = tablet.get_many(&keys).unwrap();
        tablet.flush().unwrap();
        assert!(
            fjall_rows(&tablet) == expected,
            "fjall's rows are the model's"
        );
        assert_eq!(
            tablet.get_many(&keys).unwrap(),
            before,
            "gets before and after"
        );
    }

    #[test]
    fn a_tablet_over_its_limit_is_flushed_in_the_background_and_at_twice_it_at_once() {
        let (two, one) = (run(&[(1, Some(1)), (2, Some(2))]), run(&[(3, Some(3))]));
        let limit = two.bytes() + one.bytes();
        let many = run(&(4..40).map(|key| (key, Some(key))).collect::<Vec<_>>());
        assert!(many.bytes() >= 2 * limit);
        let (_dir, store) = store(BufferLimits {
            tablet_bytes: limit,
            node_bytes: usize::MAX,
        });
        let tablet = store.tablet("t").unwrap();
        tablet.buffer(two, 2).unwrap();
        assert!(tablet.flush_if_due().unwrap().is_none(), "under its limit");
        tablet.buffer(one, 3).unwrap();
        let flush = tablet.flush_if_due().unwrap().expect("at its limit");
        flush.wait().unwrap();
        assert_eq!(tablet.flushed_offset().unwrap(), 3);
        tablet.buffer(many, 9).unwrap();
        assert!(tablet.flush_if_due().unwrap().is_none(), "flushed at once");
        assert_eq!(tablet.flushed_offset().unwrap(), 9);
        assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn over_the_nodes_limit_the_largest_buffer_is_flushed() {
        let (two, one) = (run(&[(1, Some(1)), (2, Some(2))]), run(&[(1, Some(1))]));
        let (_dir, store) = store(BufferLimits {
            tablet_bytes: usize::MAX,
            node_bytes: two.bytes() + one.bytes(),
        });
        let one_bytes = one.bytes();
        let (large, small) = (
            store.tablet("large").unwrap(),
            store.tablet("small").unwrap(),
        );
        large.buffer(two, 2).unwrap();
        small.buffer(one, 1).unwrap();
        small.flush_if_due().unwrap().expect("due").wait().unwrap();
        assert_eq!(large.flushed_offset().unwrap(), 2, "the largest is flushed");
        assert_eq!(small.flushed_offset().unwrap(), 0);
        assert_eq!(
            store.tablets.buffered_bytes.load(Ordering::Relaxed),
            one_bytes
        );
    }

    #[test]
    fn after_a_failed_flush_in_the_background_the_next_push_and_reads_fail() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        tablet.state.fail("no space left".into());
        let error = tablet.buffer(run(&[(1, Some(1))]), 1).unwrap_err();
        assert!(error.to_string().contains("no space left"), "{error}");
        let error = tablet.snapshot().unwrap_err();
        assert!(error.to_string().contains("restart the node"), "{error}");
    }

    #[test]
    fn a_dropped_tablet_flushes_nothing() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = tablet_with_runs(&store);
        store.drop_tablet(tablet.clone()).unwrap();
        tablet.flush().unwrap();
        assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
        let again = store.tablet("t").unwrap();
        assert_eq!(again.applied_offset().unwrap(), 0);
        assert_eq!(again.get(&[2]).unwrap(), None);
    }
}
