//! KV tablets: the current rows of a primary-key table's bucket, in key order.
//!
//! All tablets of a node share one [fjall] database at `<data-dir>/kv`: a keyspace per
//! bucket holds key -> row (see [`mink_core::key`] for both encodings), and the `applied`
//! keyspace holds, per bucket, the log offset fjall's rows reflect. A committed group's
//! rows first join the tablet's write buffer in memory, after the log made them durable
//! (see [`writer::KvWriter`]); a flush writes many groups to fjall at once, then their
//! applied offset ([`buffer`]). Reads see fjall and the buffer as one, so:
//!
//! * a snapshot of the store names exactly the changelog offset it reflects, and a Scan
//!   from there continues it with nothing missed and nothing doubled;
//! * the store needs no journal or fsync of its own for a group: after a crash, whatever
//!   it lost is replayed from the log, starting at fjall's applied offset.
//!
//! Reads (lookups, snapshots) and the updates of committed groups run on the store's own
//! threads ([`threads`]).

mod buffer;
mod lookup;
mod reader;
mod runs;
mod threads;
mod writer;

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use fjall::{Database, KeyspaceCreateOptions, Readable as _};

pub use self::buffer::BufferLimits;
use self::buffer::{Buffered, TabletState, Tablets};
pub use self::lookup::{Found, encode_keys, lookup, prefix_lookup};
pub use self::reader::{MAX_CHUNK_BYTES, SnapshotReader};
use self::runs::{Merged, Run};
use self::threads::{KvThreads, Submitted};
pub(crate) use self::writer::KvWriter;
use crate::error::{NodeError, Result};

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
    /// Opens (creating if needed) the database at `path`, its write buffer bounded by
    /// `limits`.
    ///
    /// The node holds its data directory's lock, so a database found locked can only be
    /// this process's previous node of the directory, whose bucket tasks are still letting
    /// go of it (a node reopened in process): that is waited for, briefly.
    pub fn open(path: &Path, limits: BufferLimits) -> Result<Self> {
        /// How long a previous node of this process gets to release the database.
        const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        let db = loop {
            match Database::builder(path).open() {
                Err(fjall::Error::Locked) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                opened => break opened.map_err(kv_error)?,
            }
        };
        let applied = db
            .keyspace("applied", KeyspaceCreateOptions::default)
            .map_err(kv_error)?;
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        Ok(Self {
            db,
            tablets: Arc::new(Tablets::new(applied, limits)),
            reads: KvThreads::start("mink-kv-read", threads)?,
            updates: KvThreads::start("mink-kv-update", threads)?,
        })
    }

    /// The tablet named `name` (one per bucket), created if needed. Every handle of one
    /// name shares its write buffer.
    pub fn tablet(&self, name: &str) -> Result<KvTablet> {
        let state = self.tablets.get_or_open(name, || {
            (self.db)
                .keyspace(name, KeyspaceCreateOptions::default)
                .map_err(kv_error)
        })?;
        Ok(KvTablet {
            store: self.clone(),
            state,
        })
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

    /// The log offset fjall's rows reflect: what survives a crash (the log the rest).
    pub fn flushed_offset(&self) -> Result<i64> {
        let value = (self.store.tablets.applied)
            .get(self.state.name.as_bytes())
            .map_err(kv_error)?;
        decode_offset(value.as_deref())
    }

    /// The stored row of `key`: from the write buffer, or from fjall if it may hold it.
    pub fn get(&self, key: &[u8]) -> Result<Option<fjall::UserValue>> {
        {
            let buffered = self.state.buffered();
            if let Some(row) = buffered.get(key) {
                return Ok(row.map(fjall::UserValue::from));
            }
            if !buffered.may_store(key) {
                return Ok(None);
            }
        }
        self.state.rows.get(key).map_err(kv_error)
    }

    /// No key the store holds is greater (nor any it held since it was opened).
    pub(crate) fn key_bound(&self) -> Option<Vec<u8>> {
        self.state.buffered().key_bound().map(<[u8]>::to_vec)
    }

    /// The rows whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Result<Vec<fjall::UserValue>> {
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
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.store.reads.run(read).await
    }

    /// Queues `read` on the store's read threads now; the future resolves with its result.
    pub(crate) fn queue_read<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<impl Future<Output = Result<T>> + Send + 'static> {
        self.store.reads.queue(read)
    }

    /// A consistent view of the store for a Snapshot read.
    pub fn snapshot(&self) -> Result<SnapshotReader> {
        SnapshotReader::new(self)
    }
}

fn decode_offset(value: Option<&[u8]>) -> Result<i64> {
    match value {
        None => Ok(0),
        Some(bytes) => bytes
            .try_into()
            .map(i64::from_le_bytes)
            .map_err(|_| NodeError::Corrupt("a stored applied offset is not 8 bytes".into())),
    }
}

fn kv_error(error: fjall::Error) -> NodeError {
    NodeError::Kv(error.to_string())
}
