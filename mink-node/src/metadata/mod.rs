//! The node's metadata: tables with all their schema versions, the partitions created so
//! far, and the lake snapshots mink recorded ([`MetadataStore`]).
//!
//! On a single node all of it is in SQLite (`<data-dir>/meta.db`, [`Metadata`]); in a
//! cluster the tables and lake records are in etcd ([`EtcdMetadata`]), which every node
//! reads. The Kafka listener keeps its own state beside them (`mink_kafka`'s `state`: in
//! `meta.db`, or in the cluster's etcd).
//!
//! Descriptors are stored as their protobuf encoding
//! ([`TableDescriptorProto`](mink_core::protocol::TableDescriptorProto)), the same
//! bytes the Flight protocol carries, so there is one serialization of a table.
//!
//! In SQLite every change is one transaction (a single statement, or an explicit
//! transaction where a change takes several), so a crash never leaves half of one: a
//! table row always holds its whole descriptor. In etcd, one transaction too.
//!
//! The SQLite store is one [`Metadata`] over one connection; its methods are grouped by
//! what they keep:
//!
//! - `schema`: the tables of `meta.db`, created (or completed) when it is opened.
//! - `tables`: tables with their schema versions, and their partitions.
//! - `lake`: the lake snapshots mink recorded, and the tiering round pending a commit.
//!
//! The etcd store's layout is the `etcd` module's.

use std::path::Path;
use std::sync::Mutex;

use mink_core::table::{TableDescriptor, TablePath};
use rusqlite::Connection;

use crate::error::Result;

mod etcd;
mod lake;
mod schema;
mod tables;

pub use etcd::EtcdMetadata;
pub use lake::{LakeSnapshotRecord, PendingRound};
pub use tables::PartitionRecord;

/// What the node keeps of its tables and their lakes: one SQLite database on a single
/// node ([`Metadata`]), etcd in a cluster ([`EtcdMetadata`]). Each change is atomic:
/// a crash never leaves half of one.
pub trait MetadataStore: TableMetadata + LakeMetadata + Send + Sync + std::fmt::Debug {}

impl<T: TableMetadata + LakeMetadata + Send + Sync + std::fmt::Debug> MetadataStore for T {}

/// Tables with their schema versions, and their partitions.
pub trait TableMetadata {
    /// Every table.
    fn load_tables(&self) -> Result<Vec<TableDescriptor>>;

    /// Stores a new table and returns it with its assigned `table_id` (never used
    /// before); [`NodeError::TableExists`](crate::NodeError::TableExists) if its path is
    /// taken.
    fn create_table(&self, table: &TableDescriptor) -> Result<TableDescriptor>;

    /// Removes a table by id, with its partitions (a create rolled back).
    fn delete_table(&self, table_id: u64) -> Result<()>;

    /// Replaces a table's descriptor (a schema change).
    fn update_table(&self, table: &TableDescriptor) -> Result<()>;

    /// Removes a table and its partitions.
    fn drop_table(&self, path: &TablePath) -> Result<()>;

    /// The partitions of a table, by name.
    fn partitions(&self, table_id: u64) -> Result<Vec<PartitionRecord>>;

    /// The partition of that name, created if it does not exist yet (its id never used
    /// before).
    fn ensure_partition(&self, table_id: u64, name: &str) -> Result<PartitionRecord>;

    /// Removes a partition (its creation rolled back).
    fn delete_partition(&self, partition_id: i64) -> Result<()>;
}

/// What tiering records of the lake: the snapshots mink committed, each with the log
/// offsets it holds (the seam union reads plan on), and the round whose files are written
/// but whose commit is not recorded yet.
pub trait LakeMetadata {
    /// Records a committed lake snapshot (idempotent).
    fn record_lake_snapshot(&self, table_id: u64, record: &LakeSnapshotRecord) -> Result<()>;

    /// The latest recorded lake snapshot of a table.
    fn latest_lake_snapshot(&self, table_id: u64) -> Result<Option<LakeSnapshotRecord>>;

    /// Every lake snapshot recorded for a table, oldest first.
    fn lake_snapshots(&self, table_id: u64) -> Result<Vec<LakeSnapshotRecord>>;

    /// Forgets recorded lake snapshots that expired from the lake. The latest record (the
    /// seam union reads plan on) is always kept.
    fn forget_lake_snapshots(&self, table_id: u64, snapshot_ids: &[i64]) -> Result<()>;

    /// Notes a round's files before its commit, so a crash leaves nothing unaccounted.
    fn set_pending_round(&self, table_id: u64, round: &PendingRound) -> Result<()>;

    /// The pending round of a table, if any.
    fn pending_round(&self, table_id: u64) -> Result<Option<PendingRound>>;

    /// Forgets a table's pending round (committed and recorded, or cleaned up).
    fn clear_pending_round(&self, table_id: u64) -> Result<()>;
}

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

pub use mink_core::clock::now_ms;

#[cfg(test)]
mod etcd_tests;
#[cfg(test)]
mod tests;
