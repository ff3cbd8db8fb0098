//! The store's write buffer: the rows of committed groups, held in memory as sorted runs
//! and written to fjall many groups at a time.
//!
//! fjall writes a key through its journal and a skiplist memtable, then flushes and
//! compacts it: about 1.3 µs per row here, more than the rest of an upsert. The log
//! already is the store's write-ahead log, so a committed group's rows only need to be
//! readable, not durable: each group's rows join the tablet's [`Run`]s in memory, and a
//! flush writes all of a tablet's runs to fjall as one sorted table (fjall's ingestion, a
//! sequential write per row), then the applied offset they reach.
//!
//! * fjall's applied offset is what fjall holds; the runs cover the log from there to the
//!   buffer's end. After a crash the runs are gone and the log's replay from fjall's
//!   applied offset rebuilds them, as it rebuilds any update lost.
//! * Reads see fjall and the runs as one ([`Merged`](super::runs::Merged)): a run's row,
//!   or its deletion, hides fjall's. A reader takes the runs and its fjall snapshot under
//!   the runs' read lock; a flush makes its table visible in fjall before it lets go of
//!   the runs, so a reader sees a flushed row in one or both, never in neither.
//! * Runs are merged as they come, a run with the one before while that one is at most
//!   twice its size, so a tablet holds a few runs of growing size and a lookup searches
//!   a few.
//! * A tablet is flushed once it buffers [`BufferLimits::tablet_bytes`]; once the node's
//!   tablets buffer [`BufferLimits::node_bytes`] together, the largest is flushed; and
//!   when its writer is dropped (the bucket closes) or log retention is about to run.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use fjall::Keyspace;

use super::kv_error;
use super::runs::{Merged, Run};
use crate::error::Result;

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
    /// Held through a push or a flush of the runs: a flush sees no run come or go.
    changing: Mutex<()>,
    /// The tablet was dropped: nothing is flushed to it any more.
    dropped: AtomicBool,
}

/// What a tablet's groups changed since fjall's applied offset.
#[derive(Debug, Clone, Default)]
pub(super) struct Buffered {
    /// Oldest first.
    pub(super) runs: Vec<Arc<Run>>,
    /// The offset the buffered groups reach; `None`: none since fjall's applied offset.
    pub(super) end_offset: Option<i64>,
    bytes: usize,
}

impl Buffered {
    /// The row of `key` as the runs have it: `Some(None)` deleted, `None` not in them.
    pub(super) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.runs.iter().rev().find_map(|run| run.get(key))
    }

    /// The greatest key of the runs, deleted or not.
    pub(super) fn last_key(&self) -> Option<&[u8]> {
        self.runs.iter().filter_map(|run| run.last_key()).max()
    }
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
        let tablet = Arc::new(TabletState {
            name: name.to_string(),
            rows: open()?,
            buffered: RwLock::default(),
            changing: Mutex::default(),
            dropped: AtomicBool::new(false),
        });
        tablets.insert(name.to_string(), Arc::clone(&tablet));
        Ok(tablet)
    }

    /// Forgets a dropped tablet and its runs.
    pub(super) fn remove(&self, tablet: &TabletState) {
        let _changing = lock(&tablet.changing);
        tablet.dropped.store(true, Ordering::Release);
        let mut buffered = write(&tablet.buffered);
        self.buffered_bytes
            .fetch_sub(buffered.bytes, Ordering::Relaxed);
        *buffered = Buffered::default();
        lock(&self.open).remove(&tablet.name);
    }

    /// Adds a committed group's rows, reaching `end_offset`, to the tablet's runs.
    pub(super) fn push(&self, tablet: &TabletState, run: Arc<Run>, end_offset: i64) {
        let _changing = lock(&tablet.changing);
        let mut buffered = write(&tablet.buffered);
        let before = buffered.bytes;
        // Merge the runs before this one first: the writer still reads this one.
        while let [.., older, newer] = buffered.runs.as_slice()
            && older.len() <= 2 * newer.len()
        {
            let newer = buffered.runs.pop().expect("two runs");
            let older = buffered.runs.pop().expect("two runs");
            let merged = Run::merge(unshared(older), unshared(newer));
            buffered.runs.push(Arc::new(merged));
        }
        if run.len() > 0 {
            buffered.runs.push(run);
        }
        buffered.end_offset = Some(end_offset);
        buffered.bytes = buffered.runs.iter().map(|run| run.bytes()).sum();
        let after = buffered.bytes;
        drop(buffered);
        if after >= before {
            self.buffered_bytes
                .fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.buffered_bytes
                .fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Flushes the tablet if it buffers [`BufferLimits::tablet_bytes`], or the node's
    /// largest buffer if the node's reach [`BufferLimits::node_bytes`].
    pub(super) fn flush_if_due(&self, tablet: &TabletState) -> Result<()> {
        if read(&tablet.buffered).bytes >= self.limits.tablet_bytes {
            return self.flush(tablet);
        }
        if self.buffered_bytes.load(Ordering::Relaxed) < self.limits.node_bytes {
            return Ok(());
        }
        let largest = lock(&self.open)
            .values()
            .max_by_key(|tablet| read(&tablet.buffered).bytes)
            .cloned();
        match largest {
            Some(largest) => self.flush(&largest),
            None => Ok(()),
        }
    }

    /// Writes the tablet's runs to fjall as one sorted table, then their end offset as
    /// fjall's applied offset, then lets go of them.
    pub(super) fn flush(&self, tablet: &TabletState) -> Result<()> {
        let _changing = lock(&tablet.changing);
        if tablet.dropped.load(Ordering::Acquire) {
            return Ok(());
        }
        let buffered = read(&tablet.buffered).clone();
        let Some(end_offset) = buffered.end_offset else {
            return Ok(());
        };
        if !buffered.runs.is_empty() {
            let mut ingestion = tablet.rows.start_ingestion().map_err(kv_error)?;
            let fjall_rows = std::iter::empty::<fjall::Result<_>>();
            for entry in Merged::new(fjall_rows, &buffered.runs, Bound::Unbounded) {
                let (key, row) = entry?;
                match row {
                    Some(row) => ingestion.write(key, row),
                    None => ingestion.write_tombstone(key),
                }
                .map_err(kv_error)?;
            }
            ingestion.finish().map_err(kv_error)?;
        }
        self.applied
            .insert(tablet.name.as_bytes(), end_offset.to_le_bytes())
            .map_err(kv_error)?;
        *write(&tablet.buffered) = Buffered::default();
        self.buffered_bytes
            .fetch_sub(buffered.bytes, Ordering::Relaxed);
        Ok(())
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
}

/// A run's rows to merge: taken if nobody else holds the run (a snapshot being read),
/// copied if somebody does.
fn unshared(run: Arc<Run>) -> Run {
    Arc::try_unwrap(run).unwrap_or_else(|shared| (*shared).clone())
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
    use crate::kv::{KvStore, KvTablet};

    /// A run of `(key, row)` (`None`: deleted), keys and rows one byte each.
    fn run(entries: &[(u8, Option<u8>)]) -> Arc<Run> {
        let entries = entries
            .iter()
            .map(|&(key, row)| (vec![key], row.map(|row| vec![row])));
        Arc::new(Run::from_sorted(entries.collect()))
    }

    fn store(limits: BufferLimits) -> (tempfile::TempDir, KvStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = KvStore::open(dir.path(), limits).unwrap();
        (dir, store)
    }

    /// Keys 1, 2, 3 in fjall (rows 1, 2, 3); then a group that writes 2 and 4 (offsets up
    /// to 5) and one that deletes 3 (up to 7).
    fn tablet_with_runs(store: &KvStore) -> KvTablet {
        let tablet = store.tablet("t").unwrap();
        for key in 1..=3u8 {
            tablet.state.rows.insert([key], [key]).unwrap();
        }
        tablet.buffer(run(&[(2, Some(20)), (4, Some(40))]), 5);
        tablet.buffer(run(&[(3, None)]), 7);
        tablet
    }

    /// Every read of the tablet agrees on its rows: `(key, row)`.
    async fn rows(tablet: &KvTablet) -> Vec<(u8, u8)> {
        let chunks: Vec<Vec<u8>> = (tablet.snapshot().unwrap())
            .into_chunks(2, usize::MAX, |rows| {
                Ok(rows.iter().map(|row| row[0]).collect())
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

    #[tokio::test]
    async fn buffered_rows_read_as_stored_ones_before_and_after_a_flush() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = tablet_with_runs(&store);
        let expected = [(1, 1), (2, 20), (4, 40)];
        assert_eq!(rows(&tablet).await, expected);
        assert_eq!(tablet.last_key().unwrap(), Some(vec![4]));
        assert_eq!(tablet.applied_offset().unwrap(), 7);
        assert_eq!(tablet.flushed_offset().unwrap(), 0);

        tablet.flush().unwrap();
        assert_eq!(rows(&tablet).await, expected, "the deletion flushed too");
        assert!(tablet.state.buffered().runs.is_empty());
        assert_eq!(tablet.applied_offset().unwrap(), 7);
        assert_eq!(tablet.flushed_offset().unwrap(), 7);
        assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_snapshot_taken_before_a_flush_reads_the_rows_it_was_taken_with() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = tablet_with_runs(&store);
        let snapshot = tablet.snapshot().unwrap();
        tablet.flush().unwrap();
        tablet.buffer(run(&[(1, None), (5, Some(50))]), 9);
        assert_eq!(snapshot.log_offset(), 7);
        let read: Vec<Vec<u8>> = snapshot
            .into_chunks(10, usize::MAX, |rows| {
                Ok(rows.iter().map(|row| row[0]).collect())
            })
            .try_collect()
            .await
            .unwrap();
        assert_eq!(read.concat(), [1, 20, 40]);
        assert_eq!(rows(&tablet).await, [(2, 20), (4, 40), (5, 50)]);
    }

    #[test]
    fn runs_merge_as_they_come_and_a_lookup_searches_a_few() {
        let (_dir, store) = store(BufferLimits::default());
        let tablet = store.tablet("t").unwrap();
        for group in 0..64u8 {
            // Every group writes a new key and rewrites key 0.
            tablet.buffer(run(&[(0, Some(group)), (group + 1, Some(group))]), 1);
        }
        let runs = tablet.state.buffered().runs.len();
        assert!(runs <= 8, "{runs} runs");
        assert_eq!(tablet.get(&[0]).unwrap().unwrap()[0], 63);
        assert_eq!(tablet.get(&[10]).unwrap().unwrap()[0], 9);
    }

    #[test]
    fn a_tablet_over_its_limit_is_flushed_and_over_the_nodes_the_largest() {
        let (_dir, store) = store(BufferLimits {
            tablet_bytes: 3 * (2 + 64),
            node_bytes: 1 << 30,
        });
        let tablet = store.tablet("t").unwrap();
        tablet.buffer(run(&[(1, Some(1)), (2, Some(2))]), 2);
        tablet.flush_if_due().unwrap();
        assert_eq!(tablet.flushed_offset().unwrap(), 0, "under its limit");
        tablet.buffer(run(&[(3, Some(3))]), 3);
        tablet.flush_if_due().unwrap();
        assert_eq!(tablet.flushed_offset().unwrap(), 3, "at its limit");

        let (_dir, store) = store_with_node_limit(3 * (2 + 64));
        let (large, small) = (
            store.tablet("large").unwrap(),
            store.tablet("small").unwrap(),
        );
        large.buffer(run(&[(1, Some(1)), (2, Some(2))]), 2);
        small.buffer(run(&[(1, Some(1))]), 1);
        small.flush_if_due().unwrap();
        assert_eq!(large.flushed_offset().unwrap(), 2, "the largest is flushed");
        assert_eq!(small.flushed_offset().unwrap(), 0);
        assert_eq!(store.tablets.buffered_bytes.load(Ordering::Relaxed), 2 + 64);
    }

    fn store_with_node_limit(node_bytes: usize) -> (tempfile::TempDir, KvStore) {
        store(BufferLimits {
            tablet_bytes: usize::MAX,
            node_bytes,
        })
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
