//! The tables of `meta.db` and the connection's settings, applied each time the store
//! is opened: `CREATE TABLE IF NOT EXISTS` completes a store written by an older mink,
//! and the Kafka clients' activity is filled in for state recorded before it was kept.

use rusqlite::Connection;

use super::kafka::{GROUP_ACTIVITY, PRODUCER_ACTIVITY};
use super::now_ms;
use crate::error::Result;

/// Sets `meta.db`'s journal (WAL, fsynced at every commit: see
/// [`Metadata::open`](super::Metadata::open)), creates the tables it lacks and notes the
/// Kafka state recorded before its activity was as used now.
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
         CREATE TABLE IF NOT EXISTS consumer_offsets (
             group_id  TEXT NOT NULL,
             topic     TEXT NOT NULL,
             partition INTEGER NOT NULL,
             offset    INTEGER NOT NULL,
             metadata  TEXT,
             PRIMARY KEY (group_id, topic, partition)
         );
         CREATE TABLE IF NOT EXISTS consumer_group_activity (
             group_id  TEXT PRIMARY KEY,
             active_at INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS producer_ids (
             producer_id INTEGER PRIMARY KEY AUTOINCREMENT
         );
         CREATE TABLE IF NOT EXISTS producer_batches (
             producer_id    INTEGER NOT NULL,
             topic          TEXT NOT NULL,
             partition      INTEGER NOT NULL,
             epoch          INTEGER NOT NULL,
             first_sequence INTEGER NOT NULL,
             last_sequence  INTEGER NOT NULL,
             base_offset    INTEGER NOT NULL,
             PRIMARY KEY (producer_id, topic, partition)
         );
         CREATE TABLE IF NOT EXISTS producer_activity (
             producer_id INTEGER PRIMARY KEY,
             written_at  INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS lake_pending (
             table_id        INTEGER PRIMARY KEY REFERENCES tables (table_id) ON DELETE CASCADE,
             parent_snapshot INTEGER,
             files           TEXT NOT NULL
         );
         PRAGMA foreign_keys = ON;",
    )?;
    PRODUCER_ACTIVITY.fill(connection, now_ms())?;
    GROUP_ACTIVITY.fill(connection, now_ms())?;
    Ok(())
}
