//! The node's metadata, persisted in SQLite (`<data-dir>/meta.db`): tables with all their
//! schema versions, the partitions created so far, the lake snapshots mink recorded, and
//! what its Kafka listener keeps (consumer groups' committed offsets, producer ids).
//!
//! Kafka state a client creates by naming something new (a group id, a producer id)
//! is recorded with when it was last used, so that what nobody uses any more can be
//! forgotten ([`Metadata::forget_idle_groups`], [`Metadata::forget_idle_producers`]).
//!
//! Descriptors are stored as their protobuf encoding
//! ([`TableDescriptorProto`](mink_core::protocol::TableDescriptorProto)), the same
//! bytes the Flight protocol carries, so there is one serialization of a table.
//!
//! Every change is one SQLite transaction (a single statement, or an explicit
//! transaction where a change takes several), so a crash never leaves half of one: a
//! table row always holds its whole descriptor.
//!
//! The store is one [`Metadata`] over one connection; its methods are grouped by what
//! they keep:
//!
//! - `schema`: the tables of `meta.db`, created (or completed) when it is opened.
//! - `tables`: tables with their schema versions, and their partitions.
//! - `lake`: the lake snapshots mink recorded, and the tiering round pending a commit.
//! - `kafka`: consumer groups' committed offsets, producer ids and their last batches.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::Connection;

use crate::error::Result;

mod kafka;
mod lake;
mod schema;
mod tables;

pub use kafka::{ConsumerOffset, OffsetsCommitted, ProducerBatch};
pub use lake::{LakeSnapshotRecord, PendingRound};
pub use tables::PartitionRecord;

/// The SQLite metadata store.
#[derive(Debug)]
pub struct Metadata {
    connection: Mutex<Connection>,
}

impl Metadata {
    /// Opens (creating if needed) the store at `path`.
    ///
    /// A commit survives a power cut: the WAL is fsynced at every commit (`synchronous`
    /// `EXTRA`, which in WAL mode is `FULL`; should the file system refuse WAL, SQLite
    /// keeps its rollback journal, where only `EXTRA`'s fsync of the directory after the
    /// journal's deletion makes a commit durable).
    pub fn open(path: &Path) -> Result<Self> {
        let connection = Connection::open(path)?;
        schema::create(&connection)?;
        // SQLite fsyncs the directory when it creates a journal or a WAL file, never when
        // it creates the database file: a new `meta.db`'s name is made durable here,
        // before anything stored in it is acknowledged.
        mink_durable::sync_parent(path)?;
        Ok(Self {
            connection: Mutex::new(connection),
        })
    }

    fn connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

#[cfg(test)]
mod tests;
