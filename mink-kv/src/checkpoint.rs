//! KV checkpoints: a tablet's rows in the log store, so that a node without its local KV
//! files restores them and replays only the log after them (the runs and chains in the
//! store are `mink_log`'s [`KvChain`]).
//!
//! * **A base** is every row fjall holds at its applied offset, exported from a fjall
//!   snapshot taken right after a flush, with no other flush in between.
//! * **An increment** is what the tablet's flushes wrote since the run before: each
//!   flush's runs (its sorted rows and deletions, already in memory) are kept from the
//!   base on ([`Pending`]), and a checkpoint merges them into one run, a key's newest
//!   entry winning. So a busy tablet uploads what changed, not its whole state; once its
//!   increments outweigh its base, or its chain holds [`MAX_CHAIN_RUNS`] runs, the next
//!   checkpoint is a base again (as an LSM merges its runs into the level below): a byte
//!   upserted goes up about twice in all.
//! * **What breaks the chain**: pending runs past [`PENDING_RUNS_PER_BUFFER`] times the
//!   tablet's buffer limit, or taking the pending runs of all the node's tablets past the
//!   node's write-buffer limit (dropped, their memory freed: a node's KV memory stays
//!   within twice that limit), a failed upload, or a restart (the pending runs were in
//!   memory). The next checkpoint is then a base. Checkpoints are due early once a
//!   tablet's pending runs reach its buffer limit, or the node's half of its limit
//!   ([`KvStore::checkpoint_due`]).
//! * **Restore**: a tablet that holds nothing (its node lost `kv/`, or never had it)
//!   ingests the furthest chain's runs in order, one fjall ingestion each (a later one's
//!   entries shadow an earlier one's, deletions included), then records the chain's end
//!   as its applied offset, durably; the log replays from there as after any crash, and
//!   its flushes continue the chain. A run streams in from the store a few parts ahead of
//!   its ingestion, so a restore's memory is a few parts, not the bucket; an ingestion is
//!   finished only once its whole run checked out.
//! * **A restore that did not end**: a durable marker (`restoring/<tablet>` among the
//!   applied offsets) is written first and removed with the offset. A restore a crash cut
//!   short deletes what it ingested and starts over (the furthest chain may be another by
//!   then), never taking those rows for the tablet's own. A damaged run (its CRC, its
//!   order) is logged and the tablet left empty: the log replays from its start, and the
//!   bucket opens only if its log still reaches back there.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fjall::Readable as _;
use mink_log::{KvChain, KvRun, LogError, LogStore, StoreFailpoint};

use super::buffer::lock;
use super::runs::{Merged, Run};
use super::{BufferLimits, KvStore, KvTablet, kv_error};
use crate::error::{KvError, Result};

/// Pending runs a tablet keeps, in multiples of its buffer limit
/// ([`crate::BufferLimits::tablet_bytes`]), before it drops them and writes a base next.
const PENDING_RUNS_PER_BUFFER: usize = 4;

/// Runs a chain holds at most: a restore reads each, so a bucket whose small increments
/// never outweigh its base gets a base again after this many.
const MAX_CHAIN_RUNS: usize = 32;

/// A tablet's checkpoints: the chain in the store and the runs flushed after it.
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    /// The furthest chain of the tablet's runs in the store, as found at open or written
    /// since.
    chain: Option<KvChain>,
    /// When this node wrote the chain's last run.
    written_at: Option<SystemTime>,
    /// The runs flushed since the chain's end, or since a base being written.
    pending: Option<Pending>,
}

/// How many bytes of pending runs the node's tablets keep, alone and together.
#[derive(Debug)]
pub(super) struct PendingLimits {
    /// A tablet's checkpoint is due early once its pending runs reach this (its buffer
    /// limit), every tablet's once the node's reach half of `node`.
    due: usize,
    /// A tablet whose pending runs pass this drops them.
    tablet: usize,
    /// A tablet whose flush takes the node's pending runs past this drops its own (the
    /// node's write-buffer limit: a node's KV memory stays within twice that).
    node: usize,
    /// The bytes of every tablet's pending runs.
    held: Arc<AtomicUsize>,
}

impl PendingLimits {
    pub(super) fn new(buffer: BufferLimits) -> Self {
        Self {
            due: buffer.tablet_bytes,
            tablet: buffer.tablet_bytes.saturating_mul(PENDING_RUNS_PER_BUFFER),
            node: buffer.node_bytes,
            held: Arc::default(),
        }
    }
}

/// The runs a tablet's flushes wrote to fjall from one offset on, counted among the
/// node's pending bytes while they are kept.
#[derive(Debug)]
struct Pending {
    from: i64,
    /// The offset they reach.
    to: i64,
    runs: Vec<Arc<Run>>,
    bytes: usize,
    held: Arc<AtomicUsize>,
}

impl Pending {
    /// None yet from `offset`, counted in `held`.
    fn at(offset: i64, held: &Arc<AtomicUsize>) -> Self {
        Self {
            from: offset,
            to: offset,
            runs: Vec::new(),
            bytes: 0,
            held: Arc::clone(held),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What a tablet's checkpoint writes.
enum Next {
    Nothing,
    Increment(Pending),
    Base { snapshot: fjall::Snapshot, to: i64 },
}

impl Checkpoints {
    /// A flush wrote `runs` to fjall, reaching `end_offset`: kept for the next increment
    /// within `limits`. Returns whether checkpoints are due early.
    pub(super) fn flushed(
        &mut self,
        runs: &[Arc<Run>],
        end_offset: i64,
        limits: &PendingLimits,
    ) -> bool {
        let Some(pending) = &mut self.pending else {
            return false;
        };
        let bytes = runs.iter().map(|run| run.bytes()).sum::<usize>();
        pending.runs.extend(runs.iter().cloned());
        pending.to = end_offset;
        pending.bytes += bytes;
        let held = limits.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if pending.bytes > limits.tablet || held > limits.node {
            self.pending = None;
            return false;
        }
        pending.bytes >= limits.due || held >= limits.node / 2
    }

    /// What the next checkpoint writes, fjall being at `applied` (no flush runs meanwhile).
    fn next(&mut self, store: &KvStore, applied: i64) -> Next {
        if applied == 0 {
            return Next::Nothing;
        }
        if let Some(chain) = &self.chain {
            if chain.end() > applied {
                // fjall is behind the chain (a power cut took its offset back): a base
                // now would end before the chain, and a restore takes the chain reaching
                // furthest. The log's replay brings fjall past it.
                return Next::Nothing;
            }
            match &mut self.pending {
                Some(pending) if pending.from == chain.end() => {
                    if pending.to == pending.from {
                        return Next::Nothing;
                    }
                    let outweighs =
                        (chain.increment_bytes() + pending.bytes as u64) > chain.base_bytes();
                    if !outweighs && chain.runs.len() < MAX_CHAIN_RUNS {
                        let taken =
                            std::mem::replace(pending, Pending::at(pending.to, &pending.held));
                        return Next::Increment(taken);
                    }
                }
                None if chain.end() == applied => {
                    // fjall is where the chain ends: the next flushes continue it.
                    self.pending = Some(Pending::at(applied, &store.tablets.pending.held));
                    return Next::Nothing;
                }
                _ => {}
            }
        }
        self.pending = Some(Pending::at(applied, &store.tablets.pending.held));
        Next::Base {
            snapshot: store.db.snapshot(),
            to: applied,
        }
    }

    /// `run` is in the store.
    fn written(&mut self, run: KvRun) {
        match (&mut self.chain, run.is_base()) {
            (Some(chain), false) => chain.runs.push(run),
            _ => self.chain = Some(KvChain { runs: vec![run] }),
        }
        self.written_at = Some(SystemTime::now());
    }
}

/// What a tablet's checkpoints are, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointState {
    /// The furthest chain in the store, as this node knows it.
    pub chain: Option<KvChain>,
    /// When this node wrote its last run (`None`: not since it opened).
    pub written_at: Option<SystemTime>,
    /// Bytes of runs flushed since, waiting for the next checkpoint.
    pub pending_bytes: usize,
}

/// What restoring a tablet from its checkpoint took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Restored {
    /// Its chain's runs.
    pub runs: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Entries ingested.
    pub entries: u64,
    /// The log offset the tablet is at.
    pub offset: i64,
    /// Reading the runs from the store.
    pub download: Duration,
    /// Ingesting them into fjall.
    pub ingestion: Duration,
}

impl KvStore {
    /// Resolves once a tablet's pending runs reach its buffer limit: its checkpoint is
    /// due before its time.
    pub async fn checkpoint_due(&self) {
        self.tablets.checkpoint_due.notified().await;
    }
}

impl KvTablet {
    /// Writes the tablet's next checkpoint run to `store`, for the bucket whose log is in
    /// `dir`: an increment, or a base (see the module doc); `None` if nothing changed
    /// since the last. Blocks (run it on a blocking thread); one runs at a time per tablet.
    ///
    /// # Errors
    /// The tablet's flush or fjall's snapshot failed, or the upload did: the next
    /// checkpoint is a base.
    pub fn checkpoint(&self, store: &LogStore, dir: &Path) -> Result<Option<KvRun>> {
        self.check_readable()?;
        let state = &self.state;
        let _one_at_a_time = lock(&state.checkpointing);
        let next = self.store.tablets.flushed(state, |applied| {
            Ok(lock(&state.checkpoints).next(&self.store, applied))
        })?;
        let written = match next {
            Next::Nothing => return Ok(None),
            Next::Increment(pending) => write_increment(store, dir, &pending),
            Next::Base { snapshot, to } => write_base(store, dir, &state.rows, &snapshot, to),
        };
        let mut checkpoints = lock(&state.checkpoints);
        match written {
            Ok(run) => {
                checkpoints.written(run);
                Ok(Some(run))
            }
            Err(error) => {
                checkpoints.pending = None;
                Err(error)
            }
        }
    }

    /// The tablet's checkpoints as this node knows them.
    pub fn checkpoint_state(&self) -> CheckpointState {
        let checkpoints = lock(&self.state.checkpoints);
        CheckpointState {
            chain: checkpoints.chain.clone(),
            written_at: checkpoints.written_at,
            pending_bytes: checkpoints
                .pending
                .as_ref()
                .map_or(0, |pending| pending.bytes),
        }
    }

    /// Takes `chain`, the furthest of the bucket's checkpoint in `store` (its log in
    /// `dir`), as the tablet's, and restores the tablet from it if the tablet holds
    /// nothing; `None` if it did not. Call before the log replays into the tablet.
    ///
    /// A run found damaged is logged and the tablet left empty: the log replays from its
    /// start, and the bucket opens if its log still reaches back there.
    ///
    /// # Errors
    /// A run could not be read or ingested: the tablet must not open (its log may not
    /// reach back to its start).
    pub fn restore(
        &self,
        store: &LogStore,
        dir: &Path,
        chain: Option<KvChain>,
    ) -> Result<Option<Restored>> {
        let restorable = chain.as_ref().filter(|chain| chain.end() > 0);
        if self.restoring()? {
            // A restore a crash cut short, perhaps of another chain: it starts over.
            self.delete_rows()?;
            self.end_restore()?;
        }
        let restored = match restorable {
            Some(chain) if self.holds_nothing()? => self.ingest_chain(store, dir, chain)?,
            _ => None,
        };
        let mut checkpoints = lock(&self.state.checkpoints);
        if let Some(restored) = &restored {
            checkpoints.pending = Some(Pending::at(
                restored.offset,
                &self.store.tablets.pending.held,
            ));
        }
        checkpoints.chain = chain;
        Ok(restored)
    }

    fn holds_nothing(&self) -> Result<bool> {
        let empty = self.state.rows.first_key_value().is_none();
        Ok(empty && self.applied_offset()? == 0)
    }

    /// Deletes every row fjall holds for the tablet: one ingestion of their deletions.
    fn delete_rows(&self) -> Result<()> {
        let rows = &self.state.rows;
        let mut ingestion = rows.start_ingestion().map_err(kv_error)?;
        for row in rows.iter() {
            ingestion
                .write_tombstone(row.key().map_err(kv_error)?)
                .map_err(kv_error)?;
        }
        ingestion.finish().map_err(kv_error)
    }

    /// The key of the tablet's marker of a restore under way, among the applied offsets.
    fn restore_marker(&self) -> String {
        format!("restoring/{}", self.state.name)
    }

    /// Removes the tablet's restore marker, durably.
    fn end_restore(&self) -> Result<()> {
        (self.store.tablets.applied)
            .remove(self.restore_marker())
            .map_err(kv_error)?;
        self.store.sync_applied_offsets()
    }

    /// Whether a restore of the tablet began and did not end.
    fn restoring(&self) -> Result<bool> {
        let applied = &self.store.tablets.applied;
        Ok(applied
            .get(self.restore_marker())
            .map_err(kv_error)?
            .is_some())
    }

    /// Reads `run` from the store as it streams in and ingests its entries, counting them
    /// in `restored`. Only a run read whole and found intact is ingested: an ingestion
    /// not finished adds nothing to the tablet.
    fn ingest_run(
        &self,
        store: &LogStore,
        dir: &Path,
        run: &KvRun,
        restored: &mut Restored,
    ) -> Result<()> {
        let started = Instant::now();
        let mut entries = store.read_kv_run(dir, run)?;
        let mut ingestion = self.state.rows.start_ingestion().map_err(kv_error)?;
        while let Some((key, row)) = entries.next_entry()? {
            match row {
                Some(row) => ingestion.write(key.as_ref(), row.as_ref()),
                None => ingestion.write_tombstone(key.as_ref()),
            }
            .map_err(kv_error)?;
            restored.entries += 1;
        }
        ingestion.finish().map_err(kv_error)?;
        restored.download += entries.waited();
        restored.ingestion += started.elapsed().saturating_sub(entries.waited());
        restored.runs += 1;
        restored.bytes += run.bytes;
        Ok(())
    }

    /// Ingests `chain`'s runs under the tablet's restore marker; `None` if a run is
    /// damaged (the tablet is left empty: see [`KvTablet::restore`]).
    fn ingest_chain(
        &self,
        store: &LogStore,
        dir: &Path,
        chain: &KvChain,
    ) -> Result<Option<Restored>> {
        let mut restored = Restored {
            offset: chain.end(),
            ..Restored::default()
        };
        (self.store.tablets.applied)
            .insert(self.restore_marker(), chain.end().to_le_bytes())
            .map_err(kv_error)?;
        self.store.sync_applied_offsets()?;
        for run in &chain.runs {
            match self.ingest_run(store, dir, run, &mut restored) {
                Err(KvError::LogStore(error)) if matches!(*error, LogError::Corrupt(_)) => {
                    tracing::warn!(
                        tablet = %self.state.name,
                        %error,
                        "a KV checkpoint is damaged: rebuilding the tablet from its log's start"
                    );
                    self.delete_rows()?;
                    self.end_restore()?;
                    return Ok(None);
                }
                ingested => ingested?,
            }
            store.crash_at(StoreFailpoint::AbortMidKvRestore);
        }
        self.store.tablets.restored(&self.state, chain.end())?;
        self.end_restore()?;
        Ok(Some(restored))
    }
}

/// Writes the pending runs as one run: each key's newest entry, deletions kept.
fn write_increment(store: &LogStore, dir: &Path, pending: &Pending) -> Result<KvRun> {
    let mut writer = store.write_kv_run(dir, pending.from, pending.to)?;
    let none_stored = std::iter::empty::<fjall::Result<_>>();
    for entry in Merged::new(none_stored, &pending.runs, std::ops::Bound::Unbounded) {
        let (key, row) = entry?;
        writer.push(&key, row.as_deref())?;
    }
    Ok(writer.finish()?)
}

/// Writes every row of `rows` in `snapshot` as a base at offset `to`.
fn write_base(
    store: &LogStore,
    dir: &Path,
    rows: &fjall::Keyspace,
    snapshot: &fjall::Snapshot,
    to: i64,
) -> Result<KvRun> {
    let mut writer = store.write_kv_run(dir, 0, to)?;
    for row in snapshot.iter(rows) {
        let (key, row) = row.into_inner().map_err(kv_error)?;
        writer.push(&key, Some(&row))?;
    }
    Ok(writer.finish()?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mink_log::LogStoreConfig;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::*;
    use crate::KvConfig;

    /// A log store in a folder of its own (the first), for a node whose disk is the second.
    async fn open_store() -> (tempfile::TempDir, tempfile::TempDir, Arc<LogStore>) {
        let (store_dir, disk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let config = LogStoreConfig::new(format!("file://{}", store_dir.path().display()));
        let store = LogStore::open(config, disk.path(), 1 << 20).await.unwrap();
        (store_dir, disk, store)
    }

    /// A tablet's rows in key order, `(key, row)`, as fjall holds them after a flush.
    fn stored_rows(tablet: &KvTablet) -> Vec<(Vec<u8>, Vec<u8>)> {
        tablet.flush().unwrap();
        (tablet.state.rows.iter())
            .map(|row| {
                let (key, row) = row.into_inner().unwrap();
                (key.to_vec(), row.to_vec())
            })
            .collect()
    }

    /// A random history of groups (upserts and deletes of a few hundred keys), flushes
    /// and checkpoints; after each checkpoint, a node without the tablet's KV files
    /// restores exactly the rows the model holds at the checkpoint's end, and the runs
    /// are increments while they weigh less than their base.
    #[tokio::test(flavor = "multi_thread")]
    async fn restores_of_random_histories_match_the_model_at_each_checkpoint() {
        let seeds: u64 = std::env::var("MINK_KV_CHECKPOINT_SEEDS")
            .ok()
            .and_then(|seeds| seeds.parse().ok())
            .unwrap_or(4);
        let (_store_dir, disk, store) = open_store().await;
        tokio::task::spawn_blocking(move || {
            for seed in 0..seeds {
                history(&store, &disk.path().join(format!("t{seed}/b0")), seed);
            }
        })
        .await
        .unwrap();
    }

    fn history(store: &LogStore, dir: &Path, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let kv_dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(kv_dir.path(), &KvConfig::default()).unwrap();
        let tablet = kv.tablet("t.b0").unwrap();
        assert!(tablet.restore(store, dir, None).unwrap().is_none());
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let (mut offset, mut increments) = (0, 0);
        for _ in 0..60 {
            let mut group = BTreeMap::new();
            for _ in 0..rng.random_range(1..40) {
                let key = rng.random_range(0..300_u16).to_be_bytes().to_vec();
                let row = rng
                    .random_bool(0.8)
                    .then(|| vec![rng.random(); rng.random_range(0..64)]);
                group.insert(key, row);
            }
            for (key, row) in &group {
                match row {
                    Some(row) => model.insert(key.clone(), row.clone()),
                    None => model.remove(key),
                };
            }
            let entries: Vec<_> = group.into_iter().collect();
            offset += rng.random_range(1..5);
            tablet
                .buffer(Arc::new(Run::from_owned(&entries)), offset)
                .unwrap();
            if rng.random_bool(0.3) {
                tablet.flush().unwrap();
            }
            if rng.random_bool(0.2) {
                let run = tablet
                    .checkpoint(store, dir)
                    .unwrap()
                    .expect("rows changed");
                assert_eq!(run.to, offset, "seed {seed}");
                increments += usize::from(!run.is_base());
                let restored_dir = tempfile::tempdir().unwrap();
                let restored_kv = KvStore::open(restored_dir.path(), &KvConfig::default()).unwrap();
                let restored = restored_kv.tablet("t.b0").unwrap();
                let chain = store.kv_chain(dir).unwrap();
                assert_eq!(chain, tablet.checkpoint_state().chain, "seed {seed}");
                let done = restored
                    .restore(store, dir, chain)
                    .unwrap()
                    .expect("restored");
                assert_eq!(done.offset, offset, "seed {seed}");
                assert_eq!(restored.flushed_offset().unwrap(), offset, "seed {seed}");
                let expected: Vec<_> = model.clone().into_iter().collect();
                assert_eq!(stored_rows(&restored), expected, "seed {seed}");
                assert!(
                    tablet.checkpoint(store, dir).unwrap().is_none(),
                    "seed {seed}"
                );
            }
        }
        assert!(increments > 0, "seed {seed}: every run was a base");
    }

    /// A restore a crash cut short (its marker written, the base alone ingested) starts
    /// over on the next open: the tablet holds the chain's rows, a key the increment
    /// deleted included, and none of what it ingested from a chain a newer base replaced.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_restore_cut_short_runs_again_over_what_it_ingested() {
        let (_store_dir, disk, store) = open_store().await;
        let dir = disk.path().join("t1/b0");
        tokio::task::spawn_blocking(move || {
            let entries = |entries: &[(u8, Option<u8>)]| {
                let entries: Vec<_> = (entries.iter())
                    .map(|&(key, row)| (vec![key], row.map(|row| vec![row])))
                    .collect();
                Arc::new(Run::from_owned(&entries))
            };
            let written_dir = tempfile::tempdir().unwrap();
            let written = KvStore::open(written_dir.path(), &KvConfig::default()).unwrap();
            let tablet = written.tablet("t.b0").unwrap();
            tablet.restore(&store, &dir, None).unwrap();
            let base: Vec<(u8, Option<u8>)> = (0..100).map(|key| (key, Some(key))).collect();
            tablet.buffer(entries(&base), 3).unwrap();
            assert!(tablet.checkpoint(&store, &dir).unwrap().unwrap().is_base());
            tablet
                .buffer(entries(&[(2, None), (200, Some(200))]), 5)
                .unwrap();
            assert!(!tablet.checkpoint(&store, &dir).unwrap().unwrap().is_base());
            let chain = store.kv_chain(&dir).unwrap().unwrap();

            let cut_dir = tempfile::tempdir().unwrap();
            let cut = KvStore::open(cut_dir.path(), &KvConfig::default()).unwrap();
            let restoring = cut.tablet("t.b0").unwrap();
            let applied = &cut.tablets.applied;
            applied
                .insert(restoring.restore_marker(), 5_i64.to_le_bytes())
                .unwrap();
            let mut partial = Restored::default();
            restoring
                .ingest_run(&store, &dir, &chain.runs[0], &mut partial)
                .unwrap();
            assert_eq!(stored_rows(&restoring).len(), 100, "the base alone");

            let restored = restoring.restore(&store, &dir, Some(chain)).unwrap();
            assert_eq!(restored.unwrap().offset, 5);
            let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..100)
                .filter(|&key| key != 2)
                .chain([200])
                .map(|key| (vec![key], vec![key]))
                .collect();
            assert_eq!(stored_rows(&restoring), rows);
            assert!(!restoring.restoring().unwrap(), "the marker is gone");
            assert_eq!(restoring.flushed_offset().unwrap(), 5);

            // Cut short again, then a newer base without key 50 is the furthest chain.
            let chain = store.kv_chain(&dir).unwrap().unwrap();
            let cut_dir = tempfile::tempdir().unwrap();
            let cut = KvStore::open(cut_dir.path(), &KvConfig::default()).unwrap();
            let restoring = cut.tablet("t.b0").unwrap();
            (cut.tablets.applied)
                .insert(restoring.restore_marker(), 5_i64.to_le_bytes())
                .unwrap();
            restoring
                .ingest_run(&store, &dir, &chain.runs[0], &mut Restored::default())
                .unwrap();
            let mut newer = store.write_kv_run(&dir, 0, 7).unwrap();
            for (key, row) in rows.iter().filter(|(key, _)| key[0] != 50) {
                newer.push(key, Some(row)).unwrap();
            }
            newer.finish().unwrap();
            let chain = store.kv_chain(&dir).unwrap();
            let restored = restoring.restore(&store, &dir, chain).unwrap();
            assert_eq!(restored.unwrap().offset, 7);
            let rows: Vec<_> = rows.into_iter().filter(|(key, _)| key[0] != 50).collect();
            assert_eq!(stored_rows(&restoring), rows);
        })
        .await
        .unwrap();
    }

    /// The pending runs of all tablets stay within the node's write-buffer limit: the
    /// tablet whose flush takes them past it drops its own, and writes a base next.
    #[tokio::test(flavor = "multi_thread")]
    async fn pending_runs_stay_within_the_nodes_limit() {
        let (_store_dir, disk, store) = open_store().await;
        let disk = disk.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let kv_dir = tempfile::tempdir().unwrap();
            let buffer = BufferLimits {
                tablet_bytes: 1 << 20,
                node_bytes: 10_000,
            };
            let kv = KvStore::open(
                kv_dir.path(),
                &KvConfig {
                    buffer,
                    ..KvConfig::default()
                },
            )
            .unwrap();
            let rows = |first: u32, count: u32| {
                let entries: Vec<_> = (first..first + count)
                    .map(|key| (key.to_be_bytes().to_vec(), Some(vec![1; 1_000])))
                    .collect();
                Arc::new(Run::from_owned(&entries))
            };
            let tablets: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|name| {
                    let tablet = kv.tablet(name).unwrap();
                    let dir = disk.join(name);
                    tablet.restore(&store, &dir, None).unwrap();
                    tablet.buffer(rows(100, 20), 1).unwrap();
                    assert!(tablet.checkpoint(&store, &dir).unwrap().unwrap().is_base());
                    (tablet, dir)
                })
                .collect();
            let pending = |tablet: &KvTablet| tablet.checkpoint_state().pending_bytes;
            let held = || kv.tablets.pending.held.load(Ordering::Relaxed);

            let (a, b) = (&tablets[0].0, &tablets[1].0);
            a.buffer(rows(10, 4), 2).unwrap();
            a.flush().unwrap();
            assert!(pending(a) >= 4_000);
            b.buffer(rows(10, 7), 2).unwrap();
            b.flush().unwrap();
            assert_eq!(
                (pending(b), held()),
                (0, pending(a)),
                "b's runs were dropped"
            );
            assert!(
                !a.checkpoint(&store, &tablets[0].1)
                    .unwrap()
                    .unwrap()
                    .is_base()
            );
            assert!(
                b.checkpoint(&store, &tablets[1].1)
                    .unwrap()
                    .unwrap()
                    .is_base()
            );
            assert_eq!(held(), 0);
        })
        .await
        .unwrap();
    }

    /// A damaged run restores nothing: the tablet stays empty, to be rebuilt from its
    /// log's start, and opens again as a tablet that was never restored.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_damaged_checkpoint_leaves_the_tablet_to_its_log() {
        let (store_dir, disk, store) = open_store().await;
        let dir = disk.path().join("t1/b0");
        let runs = store_dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut base = store.write_kv_run(&dir, 0, 4).unwrap();
            for key in 0..1_000_u32 {
                base.push(&key.to_be_bytes(), Some(b"row")).unwrap();
            }
            let base = base.finish().unwrap();
            let file =
                find_file(&runs, &format!("{:020}-{:020}", 0, 4)).expect("the run is in the store");
            let mut bytes = std::fs::read(&file).unwrap();
            bytes[5_000] ^= 1;
            std::fs::write(&file, bytes).unwrap();

            let kv_dir = tempfile::tempdir().unwrap();
            let kv = KvStore::open(kv_dir.path(), &KvConfig::default()).unwrap();
            let tablet = kv.tablet("t.b0").unwrap();
            let chain = KvChain { runs: vec![base] };
            assert!(tablet.restore(&store, &dir, Some(chain)).unwrap().is_none());
            assert_eq!(stored_rows(&tablet), []);
            assert!(!tablet.restoring().unwrap());
            assert_eq!(tablet.flushed_offset().unwrap(), 0);
        })
        .await
        .unwrap();
    }

    /// The file named `name` under `dir`, at any depth.
    fn find_file(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
        std::fs::read_dir(dir).unwrap().find_map(|entry| {
            let path = entry.unwrap().path();
            if path.is_dir() {
                find_file(&path, name)
            } else {
                (path.file_name()? == name).then_some(path)
            }
        })
    }
}
