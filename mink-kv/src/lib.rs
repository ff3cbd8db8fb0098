//! KV tablets: the current rows of a primary-key table's bucket, in key order.
//!
//! The store follows the log of its bucket ([`mink_log`]) as that log's changelog hook:
//! [`KvWriter`] implements [`mink_log::Changelog`], so the log turns each write into its
//! changelog through the store and applies each durable group to it, and replays the log
//! into a store that is behind when the bucket opens. The log knows nothing of the store.
//! The store's failures are [`KvError`]s; as the hook's, they reach the log's writers as
//! [`mink_log::LogError`]s (a refused write stays refused, a failed update is the hook's).
//!
//! All tablets of a node share one [fjall] database at `<data-dir>/kv`: a keyspace per
//! bucket holds key -> row (see [`mink_core::key`] for both encodings), and the `applied`
//! keyspace holds, per bucket, the log offset fjall's rows reflect. A committed group's
//! rows first join the tablet's write buffer in memory, after the log made them durable
//! (see [`KvWriter`]); a flush writes many groups to fjall at once, then their
//! applied offset (`buffer`). Reads see fjall and the buffer as one, so:
//!
//! * a snapshot of the store names exactly the changelog offset it reflects, and a Scan
//!   from there continues it with nothing missed and nothing doubled;
//! * the store needs no journal or fsync of its own for a group: after a crash, whatever
//!   it lost is replayed from the log, starting at fjall's applied offset.
//!
//! Reads (lookups, snapshots) and the updates of committed groups run on the store's own
//! threads (`threads`).
//!
//! # Keys the store cannot keep
//!
//! fjall asserts that a key is at most 65 535 bytes, and would panic on every flush of a
//! longer one. A write whose encoded key is longer than [`MAX_KEY_BYTES`] is refused when
//! its changelog is prepared (`writer`), before anything is logged: every write into a
//! primary-key table goes through there (DoPut, so `mink sql` and Flight SQL's DML and
//! bulk ingest, and the Kafka listener's produce). A log written before keys were bounded
//! may hold such a key: its replay leaves the key's rows out of the store with an error
//! logged (they stay in the log and the lake; no write can reach that key again). A
//! lookup or prefix of a longer key finds nothing, without reading fjall.
//!
//! # Power cuts
//!
//! fjall makes the rows of a flush durable before the flush writes its applied offset:
//! an ingestion's tables are fsynced, with their folder, and registered in a manifest
//! that is fsynced and swapped in atomically before it returns. The applied offset goes
//! to fjall's journal, which fjall fsyncs only when it rotates or closes it: a power cut
//! may take the offset back (never ahead of the rows), and the replay from there writes
//! rows fjall holds again, which changes nothing. The log below an applied offset is
//! deleted (retention) only once that offset is durable ([`KvStore::sync_applied_offsets`]).
//!
//! fjall fsyncs the folders it creates but not the directories that hold them, so mink
//! creates `<data-dir>/kv` itself, durably, and fsyncs `kv/keyspaces` once fjall created
//! a tablet's folder there: otherwise a cut could take the folder of a tablet whose rows
//! were durable while fjall's list of keyspaces and the tablet's applied offset still
//! name it, and the replay would start past rows the tablet no longer has. A tablet fjall
//! comes back without (in a store written before) has that offset forgotten and the
//! whole log replayed into it ([`KvStore::tablet`]). A cut inside fjall's creation of
//! the database can leave its first journal without its `version` marker, a directory
//! fjall refuses to open; it holds nothing yet, and is created again. What fjall deletes
//! without fsyncing the directory (old journals, compacted tables, a dropped tablet's
//! folder) a cut may bring back, and fjall's recovery recognizes it: journal entries its
//! tables hold are skipped, tables and folders nothing references are deleted.
//!
//! # A store behind its log
//!
//! When the update of a group that is durable in the log fails (fjall cannot write a
//! flush, say), the tablet is fenced (`KvTablet::fence`): it takes no more groups and
//! answers no reads, until a restart replays the log into it. The group itself is
//! acknowledged: it is in the log (see the appender's "Durable means written").

mod buffer;
mod checkpoint;
mod error;
mod lookup;
mod reader;
mod runs;
mod threads;
mod writer;

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use fjall::config::BlockSizePolicy;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable as _, UserValue};
use mink_core::key::MAX_KEY_BYTES;

pub use self::buffer::BufferLimits;
use self::buffer::{Buffered, TabletState, Tablets};
pub use self::checkpoint::{CheckpointState, Restored};
pub use self::error::{KvError, Result};
pub use self::lookup::{Found, encode_keys, lookup, prefix_lookup};
pub use self::reader::{MAX_CHUNK_BYTES, SnapshotReader};
use self::runs::{Merged, Run};
use self::threads::{KvThreads, Submitted};
pub use self::writer::KvWriter;

/// The memory a node's KV store may hold.
#[derive(Debug, Clone, Copy)]
pub struct KvConfig {
    /// When committed rows buffered in memory are written to fjall.
    pub buffer: BufferLimits,
    /// fjall's cache of table blocks (default 256 MiB). Every lookup of a key that may
    /// exist reads a block, and so does every upsert of a key already stored: with the
    /// blocks of the stored rows cached, neither goes to the file.
    pub cache_bytes: u64,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            buffer: BufferLimits::default(),
            cache_bytes: 256 << 20,
        }
    }
}

impl KvConfig {
    /// The defaults but for the sizes given, as `mink server --kv-write-buffer` (the
    /// node's write buffer, see [`BufferLimits::within`]) and `--kv-cache` take them.
    pub fn sized(write_buffer_bytes: Option<usize>, cache_bytes: Option<usize>) -> Self {
        let default = Self::default();
        Self {
            buffer: write_buffer_bytes.map_or(default.buffer, BufferLimits::within),
            cache_bytes: cache_bytes.map_or(default.cache_bytes, |bytes| bytes as u64),
        }
    }
}

// fjall (lsm-tree) asserts that a key is at most 65 535 bytes long.
const _: () = assert!(MAX_KEY_BYTES <= u16::MAX as usize);

/// Reads of fjall that [`KvTablet::get_many`] gives a thread: fewer are not worth
/// starting one.
const MIN_READS_PER_THREAD: usize = 64;

/// The size of a tablet's data blocks in fjall (fjall's default: 4 KiB). A Snapshot reads
/// its rows block by block, and each block costs a cache lookup and an iterator of its
/// own: 16 KiB blocks made a Snapshot 1.1x as fast (32 KiB: less), with lookups and
/// upserts unchanged (docs/benchmarks.md). fjall keeps a keyspace's options from its
/// creation: tablets created before this setting keep theirs.
const DATA_BLOCK_BYTES: u32 = 16 * 1024;

/// fjall's background threads, which compact the tablets' tables (mink's own threads
/// write them, [`buffer`]). fjall defaults to one per core, up to four, but in a pool of
/// more than one its first worker never compacts: it hands each compaction on to the
/// others and, while they are all busy, takes it back and hands it on again, a core
/// spinning for as long as any compaction runs (fjall 3.1's `worker_tick`; upstream's
/// fjall-rs/fjall#323 reworks it). A pool of two compacts on one thread as this one
/// does, plus that spin: one worker made a 1M-key upsert load cost 0.45-0.46 µs of CPU
/// per row instead of 0.46-0.61, a 3M-key one 0.55 instead of 1.31 (docs/benchmarks.md).
/// Compactions of several tablets run one at a time.
const FJALL_WORKERS: usize = 1;

/// The node's KV database.
#[derive(Clone)]
pub struct KvStore {
    db: Database,
    tablets: Arc<Tablets>,
    /// Lookups and snapshot chunks.
    reads: KvThreads,
    /// The updates of committed groups ([`KvWriter`]).
    updates: KvThreads,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore").finish_non_exhaustive()
    }
}

impl KvStore {
    /// Opens (creating if needed) the database at `path`, with `config`'s memory.
    ///
    /// The node holds its data directory's lock, so a database found locked can only be
    /// this process's previous node of the directory, whose bucket tasks are still letting
    /// go of it (a node reopened in process): that is waited for, briefly.
    pub fn open(path: &Path, config: &KvConfig) -> Result<Self> {
        /// How long a previous node of this process gets to release the database.
        const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        prepare_dir(path)?;
        let db = loop {
            match Database::builder(path)
                .cache_size(config.cache_bytes)
                .worker_threads(FJALL_WORKERS)
                .open()
            {
                Err(fjall::Error::Locked) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                opened => break opened.map_err(kv_error)?,
            }
        };
        let (applied, _) = keyspace(&db, "applied", KeyspaceCreateOptions::default)?;
        let cores = threads::cores();
        Ok(Self {
            db,
            tablets: Arc::new(Tablets::new(applied, config.buffer)),
            reads: KvThreads::start("mink-kv-read", cores)?,
            updates: KvThreads::start("mink-kv-update", cores)?,
        })
    }

    /// The tablet named `name` (one per bucket), created if needed. Every handle of one
    /// name shares its write buffer.
    pub fn tablet(&self, name: &str) -> Result<KvTablet> {
        let state = self.tablets.get_or_open(name, || {
            let (rows, created) = keyspace(&self.db, name, || {
                KeyspaceCreateOptions::default()
                    .data_block_size_policy(BlockSizePolicy::all(DATA_BLOCK_BYTES))
            })?;
            if created {
                self.forget_applied_offset(name)?;
            }
            Ok(rows)
        })?;
        Ok(KvTablet {
            store: self.clone(),
            state,
        })
    }

    /// A tablet fjall had no keyspace for holds no rows, whatever offset `applied` keeps
    /// for it: its folder was lost in a power cut (a store written before mink fsynced
    /// `kv/keyspaces`). That offset is removed, durably, so the whole log is replayed
    /// into the tablet, or its start fails loudly if retention removed part of it.
    fn forget_applied_offset(&self, name: &str) -> Result<()> {
        let applied = &self.tablets.applied;
        if let Some(offset) = applied.get(name).map_err(kv_error)? {
            tracing::warn!(
                tablet = name,
                offset = decode_offset(Some(&offset))?,
                "the KV store lost a tablet it had applied the log to: rebuilding it from the log"
            );
            applied.remove(name).map_err(kv_error)?;
            self.db.persist(PersistMode::SyncAll).map_err(kv_error)?;
        }
        Ok(())
    }

    /// Makes every tablet's applied offset written so far ([`KvTablet::flush`]) survive a
    /// power cut: one fsync of fjall's journal, which all the store's tablets share. Once
    /// it returns, the log below a flushed tablet's offset is no longer needed to rebuild
    /// it.
    pub fn sync_applied_offsets(&self) -> Result<()> {
        self.db.persist(PersistMode::SyncAll).map_err(kv_error)
    }

    /// Deletes a tablet, its buffered rows and its applied offset (its table was dropped).
    pub fn drop_tablet(&self, tablet: KvTablet) -> Result<()> {
        self.tablets.remove(&tablet.state);
        (self.tablets.applied)
            .remove(tablet.state.name.as_bytes())
            .map_err(kv_error)?;
        self.db
            .delete_keyspace(tablet.state.rows.clone())
            .map_err(kv_error)
    }
}

/// The KV store of one bucket. Cheap to clone.
#[derive(Clone)]
pub struct KvTablet {
    store: KvStore,
    state: Arc<TabletState>,
}

impl std::fmt::Debug for KvTablet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTablet")
            .field("name", &self.state.name)
            .finish_non_exhaustive()
    }
}

impl KvTablet {
    /// The log offset the store has applied, buffered groups included (0 for a new store).
    pub fn applied_offset(&self) -> Result<i64> {
        if let Some(end_offset) = self.state.buffered().end_offset {
            return Ok(end_offset);
        }
        self.flushed_offset()
    }

    /// The log offset fjall's rows reflect: what survives a process crash (the log the
    /// rest). A power cut may take it back to the last one made durable
    /// ([`KvStore::sync_applied_offsets`]).
    pub fn flushed_offset(&self) -> Result<i64> {
        self.store.tablets.flushed_offset(&self.state)
    }

    /// The stored row of `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<UserValue>> {
        Ok(self.get_many(&[key])?.pop().flatten())
    }

    /// The stored row of each of `keys`, in their order: from the write buffer, or from
    /// fjall if it may hold it; a key above every key the tablet holds (every key of an
    /// ascending load) is not looked for. fjall's reads go in key order (neighbouring keys
    /// share blocks) and, when there are many, are spread over the machine's cores: the
    /// reads of the stored rows a group of upserts replaces are most of the group's work.
    pub fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<UserValue>>> {
        let mut rows = Vec::with_capacity(keys.len());
        let mut in_fjall = Vec::new();
        {
            let buffered = self.state.buffered();
            let bound = buffered.key_bound();
            for (index, &key) in keys.iter().enumerate() {
                // A key longer than any a write may store is in no source (and fjall
                // asserts on keys past its own limit).
                if key.len() > MAX_KEY_BYTES || bound.is_none_or(|bound| key > bound) {
                    rows.push(None);
                    continue;
                }
                let row = buffered.get(key);
                if row.is_none() && buffered.may_store(key) {
                    in_fjall.push(index);
                }
                rows.push(row.flatten().map(UserValue::from));
            }
        }
        in_fjall.sort_unstable_by_key(|&index| keys[index]);
        let split_threads = (in_fjall.len() / MIN_READS_PER_THREAD).clamp(1, threads::cores());
        let read_rows = threads::split_over(&in_fjall, split_threads, |part| {
            (part.iter())
                .map(|&index| self.state.rows.get(keys[index]).map_err(kv_error))
                .collect()
        })?;
        for (index, row) in in_fjall.into_iter().zip(read_rows) {
            rows[index] = row;
        }
        Ok(rows)
    }

    /// Whether the store holds a key from `first` to `last`, or a deletion of one it has
    /// not written to fjall yet.
    pub(crate) fn holds_key_in(&self, first: &[u8], last: &[u8]) -> Result<bool> {
        {
            // The runs before fjall: a flush moves rows from them to fjall, never back.
            let buffered = self.state.buffered();
            if (buffered.runs.iter()).any(|run| run.holds_key_in(first, last)) {
                return Ok(true);
            }
            if !buffered.may_store(first) {
                return Ok(false);
            }
        }
        let found = self
            .state
            .rows
            .range(first..=last)
            .next()
            .map(fjall::Guard::key);
        Ok(found.transpose().map_err(kv_error)?.is_some())
    }

    /// No key the store holds is greater (nor any it held since it was opened).
    pub(crate) fn key_bound(&self) -> Option<Vec<u8>> {
        self.state.buffered().key_bound().map(<[u8]>::to_vec)
    }

    /// The rows whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Result<Vec<fjall::UserValue>> {
        if prefix.len() > MAX_KEY_BYTES {
            // No stored key is that long (and fjall asserts on bounds past its limit).
            return Ok(Vec::new());
        }
        // Read without the runs' lock: a long read does not hold up the groups buffered.
        let (buffered, snapshot) = self.view();
        let stored = (snapshot.prefix(&self.state.rows, prefix)).map(fjall::Guard::into_inner);
        Merged::new(stored, &buffered.runs, Bound::Included(prefix))
            .rows()
            .take_while(|row| match row {
                Ok((key, _)) => key.starts_with(prefix),
                Err(_) => true,
            })
            .map(|row| row.map(|(_, value)| value))
            .collect()
    }

    /// The write buffer and a fjall snapshot, taken together under the runs' lock, so no
    /// flush moves rows from one to the other in between (see [`buffer`]).
    fn view(&self) -> (Buffered, fjall::Snapshot) {
        let buffered = self.state.buffered();
        (buffered.clone(), self.store.db.snapshot())
    }

    /// Adds a committed group's rows, reaching `end_offset`, to the store's write buffer:
    /// readable from now on. Fails if writing the buffer to fjall failed in the
    /// background.
    pub(crate) fn buffer(&self, rows: Arc<Run>, end_offset: i64) -> Result<()> {
        self.store.tablets.push(&self.state, rows, end_offset)
    }

    /// Writes buffered rows to fjall if this tablet, or the node's tablets together,
    /// buffer too many bytes: in the background (the flush returned, to wait for if need
    /// be), or at once if this tablet buffers twice its limit.
    pub(crate) fn flush_if_due(&self) -> Result<Option<Submitted<()>>> {
        let Some(due) = self.store.tablets.due(&self.state) else {
            return Ok(None);
        };
        if due.wait {
            return self.store.tablets.flush(&due.tablet).map(|()| None);
        }
        let tablets = Arc::clone(&self.store.tablets);
        let flush =
            (self.store.updates).submit(move || tablets.flush_in_background(&due.tablet))?;
        Ok(Some(flush))
    }

    /// Writes the buffered rows to fjall, and the offset they reach.
    pub fn flush(&self) -> Result<()> {
        self.store.tablets.flush(&self.state)
    }

    /// Runs `read` on the store's read threads.
    ///
    /// # Errors
    /// The tablet no longer follows its log ([`KvTablet::fence`]).
    pub async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.check_readable()?;
        self.store.reads.run(read).await
    }

    /// An update of the tablet failed after its group was durable in the log: the
    /// tablet is behind the log for good, so it takes no more groups and answers no
    /// reads (a read would miss writes the log acknowledged) until a restart replays the
    /// log into it.
    pub(crate) fn fence(&self, error: &KvError) {
        self.state.fail(error.to_string());
    }

    /// Why the tablet no longer follows its log, if it does not ([`KvTablet::fence`]).
    pub(crate) fn failure(&self) -> Option<String> {
        self.state.failure()
    }

    fn check_readable(&self) -> Result<()> {
        match self.failure() {
            None => Ok(()),
            Some(reason) => Err(KvError::ShuttingDown(format!(
                "the KV store of bucket {} (it is behind its log after a failed update; \
                 restart the node: {reason})",
                self.state.name
            ))),
        }
    }

    /// Queues `read` on the store's read threads now; the future resolves with its result.
    pub(crate) fn queue_read<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<impl Future<Output = Result<T>> + Send + 'static> {
        self.store.reads.queue(read)
    }

    /// A consistent view of the store for a Snapshot read.
    ///
    /// # Errors
    /// The tablet no longer follows its log, after a failed update (see "A store behind
    /// its log" in the module doc).
    pub fn snapshot(&self) -> Result<SnapshotReader> {
        self.check_readable()?;
        SnapshotReader::new(self)
    }
}

/// The file fjall writes last when it creates a database (its `create_new`); fjall opens
/// a directory that has it, and creates a database in one that has not.
const FJALL_VERSION_MARKER: &str = "version";

/// Makes `path` ready for fjall: created durably (fjall fsyncs nothing above it). A
/// database whose creation a crash cut short (its first journal written, its
/// [`FJALL_VERSION_MARKER`] not) holds nothing, and fjall would refuse to create it
/// again over that journal: it is removed first.
fn prepare_dir(path: &Path) -> Result<()> {
    if path.is_dir() && !path.join(FJALL_VERSION_MARKER).try_exists()? {
        mink_durable::remove_dir_all(path)?;
    }
    mink_durable::create_dir_all(path)?;
    Ok(())
}

/// The keyspace `name` of `db`, created with `options` if it is new, and whether it is.
/// fjall fsyncs a new keyspace's folder but not the folder holding it: that is fsynced
/// here, before anything is written to the keyspace.
fn keyspace(
    db: &Database,
    name: &str,
    options: impl FnOnce() -> KeyspaceCreateOptions,
) -> Result<(Keyspace, bool)> {
    let created = !db.keyspace_exists(name);
    let keyspace = db.keyspace(name, options).map_err(kv_error)?;
    if created && let Some(folder) = keyspace.path().parent() {
        mink_durable::sync_dir(folder)?;
    }
    Ok((keyspace, created))
}

fn decode_offset(value: Option<&[u8]>) -> Result<i64> {
    match value {
        None => Ok(0),
        Some(bytes) => bytes
            .try_into()
            .map(i64::from_le_bytes)
            .map_err(|_| KvError::Corrupt("a stored applied offset is not 8 bytes".into())),
    }
}

fn kv_error(error: fjall::Error) -> KvError {
    KvError::Store(error.to_string())
}

#[cfg(test)]
mod over_the_log;
#[cfg(test)]
mod tests {
    use super::*;

    /// What fjall leaves when a crash cuts its creation of a database short: its lock,
    /// its keyspaces folder and its first journal, not its version marker. The store
    /// opens there as a new one, and keeps what is written to it from then on.
    #[test]
    fn a_store_whose_creation_a_crash_cut_short_is_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv");
        std::fs::create_dir_all(path.join("keyspaces")).unwrap();
        std::fs::write(path.join("lock"), b"").unwrap();
        std::fs::write(path.join("0.jnl"), b"").unwrap();
        {
            let store = KvStore::open(&path, &KvConfig::default()).expect("created again");
            store.tablet("t1.b0").unwrap();
            let applied = &store.tablets.applied;
            applied.insert("t1.b0", 7_i64.to_le_bytes()).unwrap();
        }
        let store = KvStore::open(&path, &KvConfig::default()).expect("reopened");
        assert_eq!(store.tablet("t1.b0").unwrap().flushed_offset().unwrap(), 7);
    }

    /// A tablet whose folder a power cut took, while fjall's list of keyspaces and the
    /// tablet's applied offset stayed, holds none of the rows that offset names: the
    /// offset is forgotten, so the log is replayed into the tablet from its start.
    #[test]
    fn a_tablet_whose_folder_was_lost_forgets_its_applied_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv");
        let folder = {
            let store = KvStore::open(&path, &KvConfig::default()).unwrap();
            let tablet = store.tablet("t1.b0").unwrap();
            let applied = &store.tablets.applied;
            applied.insert("t1.b0", 7_i64.to_le_bytes()).unwrap();
            tablet.state.rows.path().to_path_buf()
        };
        std::fs::remove_dir_all(folder).unwrap();
        for _ in 0..2 {
            let store = KvStore::open(&path, &KvConfig::default()).unwrap();
            assert_eq!(store.tablet("t1.b0").unwrap().flushed_offset().unwrap(), 0);
        }
    }
}
