//! KV tablets: the current rows of a primary-key table's bucket, in key order.
//!
//! All tablets of a node share one [fjall] database at `<data-dir>/kv`: a keyspace per
//! bucket holds key -> row (see [`mink_core::key`] for both encodings), and the `applied`
//! keyspace holds, per bucket, the log offset the store has applied. A group of writes
//! updates the rows and the applied offset in one atomic fjall batch, after the log made
//! them durable (see [`writer::KvWriter`]), so:
//!
//! * a snapshot of the store names exactly the changelog offset it reflects, and a Scan
//!   from there continues it with nothing missed and nothing doubled;
//! * the store needs no fsync of its own: after a crash, whatever it lost is replayed from
//!   the log, starting at its applied offset.
//!
//! Reads (lookups, snapshots) and the updates of committed groups run on the store's own
//! threads ([`threads`]).

mod lookup;
mod reader;
mod threads;
mod writer;

use std::path::Path;

use fjall::{Database, Keyspace, KeyspaceCreateOptions};

pub use self::lookup::{Found, encode_keys, lookup, prefix_lookup};
pub use self::reader::{MAX_CHUNK_BYTES, SnapshotReader};
use self::threads::KvThreads;
pub(crate) use self::writer::KvWriter;
use crate::error::{NodeError, Result};

/// The node's KV database.
#[derive(Clone)]
pub struct KvStore {
    db: Database,
    applied: Keyspace,
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
    /// Opens (creating if needed) the database at `path`.
    ///
    /// The node holds its data directory's lock, so a database found locked can only be
    /// this process's previous node of the directory, whose bucket tasks are still letting
    /// go of it (a node reopened in process): that is waited for, briefly.
    pub fn open(path: &Path) -> Result<Self> {
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
            applied,
            reads: KvThreads::start("mink-kv-read", threads)?,
            updates: KvThreads::start("mink-kv-update", threads)?,
        })
    }

    /// The tablet named `name` (one per bucket), created if needed.
    pub fn tablet(&self, name: &str) -> Result<KvTablet> {
        let rows = self
            .db
            .keyspace(name, KeyspaceCreateOptions::default)
            .map_err(kv_error)?;
        Ok(KvTablet {
            store: self.clone(),
            rows,
            name: name.to_string(),
        })
    }

    /// Deletes a tablet and its applied offset (its table was dropped).
    pub fn drop_tablet(&self, tablet: KvTablet) -> Result<()> {
        self.applied
            .remove(tablet.name.as_bytes())
            .map_err(kv_error)?;
        self.db.delete_keyspace(tablet.rows).map_err(kv_error)
    }
}

/// The KV store of one bucket. Cheap to clone.
#[derive(Clone)]
pub struct KvTablet {
    store: KvStore,
    rows: Keyspace,
    name: String,
}

impl std::fmt::Debug for KvTablet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTablet")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KvTablet {
    /// The log offset the store has applied (0 for a new store).
    pub fn applied_offset(&self) -> Result<i64> {
        let value = self
            .store
            .applied
            .get(self.name.as_bytes())
            .map_err(kv_error)?;
        decode_offset(value.as_deref())
    }

    /// The stored row of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<fjall::UserValue>> {
        self.rows.get(key).map_err(kv_error)
    }

    /// The greatest key the store holds.
    pub(crate) fn last_key(&self) -> Result<Option<Vec<u8>>> {
        let last = self.rows.last_key_value().map(|pair| pair.key());
        Ok(last.transpose().map_err(kv_error)?.map(|key| key.to_vec()))
    }

    /// The rows whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Result<Vec<fjall::UserValue>> {
        self.rows
            .prefix(prefix)
            .map(|guard| guard.value().map_err(kv_error))
            .collect()
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
