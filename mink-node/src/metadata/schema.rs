//! The tables of `meta.db` and the connection's settings, applied each time the store
//! is opened: `CREATE TABLE IF NOT EXISTS` completes a store written by an older mink.
//! (The Kafka listener's tables in the same file are its own: `mink_kafka`'s `state`.)

use rusqlite::Connection;

use crate::error::Result;

/// Sets `meta.db`'s journal (WAL, fsynced at every commit: see
/// [`Metadata::open`](super::Metadata::open)) and creates the tables it lacks.
pub(super) fn create(connection: &Connection) -> Result<()> {
    connection.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = EXTRA;
         CREATE TABLE IF NOT EXISTS tables (
             table_id   INTEGER PRIMARY KEY AUTOINCREMENT,
             database   TEXT NOT NULL,
             name       TEXT NOT NULL,
             descriptor BLOB NOT NULL,
             UNIQUE (database, name)
         );
         CREATE TABLE IF NOT EXISTS partitions (
             partition_id INTEGER PRIMARY KEY AUTOINCREMENT,
             table_id     INTEGER NOT NULL REFERENCES tables (table_id) ON DELETE CASCADE,
             name         TEXT NOT NULL,
             UNIQUE (table_id, name)
         );
         CREATE TABLE IF NOT EXISTS lake_snapshots (
             table_id     INTEGER NOT NULL REFERENCES tables (table_id) ON DELETE CASCADE,
             snapshot_id  INTEGER NOT NULL,
             offsets      TEXT NOT NULL,
             committed_at INTEGER NOT NULL,
             PRIMARY KEY (table_id, snapshot_id)
         );
         CREATE TABLE IF NOT EXISTS lake_pending (
             table_id        INTEGER PRIMARY KEY REFERENCES tables (table_id) ON DELETE CASCADE,
             parent_snapshot INTEGER,
             files           TEXT NOT NULL
         );
         PRAGMA foreign_keys = ON;",
    )?;
    Ok(())
}
