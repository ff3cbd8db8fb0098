//! A single node's Kafka state, in its `meta.db` (SQLite, beside the node's own tables,
//! through a connection of its own): consumer groups' committed offsets, producer ids
//! and each idempotent producer's last batch per partition, with when each group and
//! producer was last used, so that idle ones are forgotten.
//!
//! Every change is one transaction, and a commit survives a power cut (WAL, fsynced at
//! every commit, as the node's own). Rows name their topic's table id: those of a table
//! dropped and created again under its name are not found (and are replaced by the new
//! table's, or go with their group or producer when it is forgotten). Rows written
//! before table ids were kept get theirs when the store is opened, or go if their table
//! is gone.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use mink_node::Node;
use mink_node::metadata::now_ms;
use rusqlite::{Connection, OptionalExtension, params};

use super::{ConsumerOffset, KafkaState, OffsetsCommitted, ProducerBatch, millis, table_id};
use crate::error::{KafkaError, Result};

/// The Kafka state in a node's `meta.db`.
#[derive(Debug)]
pub(crate) struct SqliteState {
    connection: Arc<Mutex<Connection>>,
    /// Names topics by their tables' ids.
    node: Arc<Node>,
}

impl SqliteState {
    /// The Kafka state in the SQLite database at `path` (the node's `meta.db`), its
    /// tables created or completed.
    ///
    /// # Errors
    /// The database could not be opened or its tables created.
    pub(crate) fn open(path: &Path, node: Arc<Node>) -> Result<Self> {
        let connection = Connection::open(path)?;
        create(&connection, &node)?;
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
            node,
        })
    }

    /// Runs `call` on the connection on tokio's blocking pool: SQLite's calls block.
    async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let connection = Arc::clone(&self.connection);
        let ran = tokio::task::spawn_blocking(move || {
            call(&mut connection.lock().unwrap_or_else(PoisonError::into_inner))
        });
        Ok(ran
            .await
            .map_err(|e| KafkaError::Internal(e.to_string()))??)
    }

    fn table_id(&self, topic: &str) -> Option<i64> {
        table_id(&self.node, topic).and_then(|id| i64::try_from(id).ok())
    }
}

#[async_trait]
impl KafkaState for SqliteState {
    async fn commit_offsets(
        &self,
        group: &str,
        offsets: Vec<ConsumerOffset>,
        max_groups: usize,
    ) -> Result<OffsetsCommitted> {
        let offsets: Vec<(ConsumerOffset, i64)> = (offsets.into_iter())
            .filter_map(|offset| Some((self.table_id(&offset.topic)?, offset)))
            .map(|(id, offset)| (offset, id))
            .collect();
        if offsets.is_empty() {
            return Ok(OffsetsCommitted::Stored);
        }
        let group = group.to_string();
        self.run(move |connection| {
            let transaction = connection.transaction()?;
            if !group_has_offsets(&transaction, &group)?
                && groups_with_offsets(&transaction)? >= max_groups
            {
                return Ok(OffsetsCommitted::TooManyGroups);
            }
            {
                let mut insert = transaction.prepare(
                    "INSERT OR REPLACE INTO consumer_offsets
                     (group_id, topic, partition, offset, metadata, table_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?;
                for (committed, table_id) in &offsets {
                    insert.execute(params![
                        group,
                        committed.topic,
                        committed.partition,
                        committed.offset,
                        committed.metadata,
                        table_id
                    ])?;
                }
            }
            transaction.execute(
                "INSERT OR REPLACE INTO consumer_group_activity (group_id, active_at)
                 VALUES (?1, ?2)",
                params![group, now_ms()],
            )?;
            transaction.commit()?;
            Ok(OffsetsCommitted::Stored)
        })
        .await
    }

    async fn committed_offsets(&self, group: &str) -> Result<Vec<ConsumerOffset>> {
        let group = group.to_string();
        let stored = self
            .run(move |connection| {
                let mut statement = connection.prepare(
                    "SELECT topic, partition, offset, metadata, table_id FROM consumer_offsets
                     WHERE group_id = ?1",
                )?;
                let rows = statement.query_map([group], |row| {
                    let offset = ConsumerOffset {
                        topic: row.get(0)?,
                        partition: row.get(1)?,
                        offset: row.get(2)?,
                        metadata: row.get(3)?,
                    };
                    Ok((offset, row.get::<_, Option<i64>>(4)?))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        Ok((stored.into_iter())
            .filter(|(offset, table_id)| *table_id == self.table_id(&offset.topic))
            .map(|(offset, _)| offset)
            .collect())
    }

    async fn forget_idle_groups(&self, retention: Duration, active: Vec<String>) -> Result<usize> {
        self.run(move |connection| {
            let now = now_ms();
            let transaction = connection.transaction()?;
            {
                let mut keep = transaction.prepare(
                    "UPDATE consumer_group_activity SET active_at = max(active_at, ?2)
                     WHERE group_id = ?1",
                )?;
                for group in &active {
                    keep.execute(params![group, now])?;
                }
            }
            let idle_since = now.saturating_sub(millis(retention));
            let forgotten = GROUP_ACTIVITY.forget(&transaction, idle_since)?;
            transaction.commit()?;
            Ok(forgotten)
        })
        .await
    }

    async fn last_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
    ) -> Result<Option<ProducerBatch>> {
        let Some(table_id) = self.table_id(topic) else {
            return Ok(None);
        };
        let topic = topic.to_string();
        self.run(move |connection| {
            connection
                .query_row(
                    "SELECT epoch, first_sequence, last_sequence, base_offset FROM producer_batches
                     WHERE producer_id = ?1 AND topic = ?2 AND partition = ?3 AND table_id = ?4",
                    params![producer_id, topic, partition, table_id],
                    |row| {
                        Ok(ProducerBatch {
                            epoch: row.get(0)?,
                            first_sequence: row.get(1)?,
                            last_sequence: row.get(2)?,
                            base_offset: row.get(3)?,
                        })
                    },
                )
                .optional()
        })
        .await
    }

    async fn record_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
        batch: ProducerBatch,
    ) -> Result<()> {
        let Some(table_id) = self.table_id(topic) else {
            return Ok(());
        };
        let topic = topic.to_string();
        self.run(move |connection| {
            let transaction = connection.transaction()?;
            transaction.execute(
                "INSERT OR REPLACE INTO producer_batches
                 (producer_id, topic, partition, epoch, first_sequence, last_sequence, base_offset,
                  table_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    producer_id,
                    topic,
                    partition,
                    batch.epoch,
                    batch.first_sequence,
                    batch.last_sequence,
                    batch.base_offset,
                    table_id
                ],
            )?;
            transaction.execute(
                "INSERT OR REPLACE INTO producer_activity (producer_id, written_at) VALUES (?1, ?2)",
                params![producer_id, now_ms()],
            )?;
            transaction.commit()
        })
        .await
    }

    async fn forget_idle_producers(&self, expiration: Duration) -> Result<usize> {
        let idle_since = now_ms().saturating_sub(millis(expiration));
        self.run(move |connection| {
            let transaction = connection.transaction()?;
            let forgotten = PRODUCER_ACTIVITY.forget(&transaction, idle_since)?;
            transaction.commit()?;
            Ok(forgotten)
        })
        .await
    }

    /// Only the newest id is kept: AUTOINCREMENT remembers the highest id ever used, so
    /// the table does not grow with every producer.
    async fn new_producer_id(&self) -> Result<i64> {
        self.run(|connection| {
            connection.execute("INSERT INTO producer_ids DEFAULT VALUES", [])?;
            let id = connection.last_insert_rowid();
            connection.execute("DELETE FROM producer_ids WHERE producer_id < ?1", [id])?;
            Ok(id)
        })
        .await
    }
}

/// Sets the journal (WAL, fsynced at every commit, as the node's connection does),
/// creates the tables the store lacks, gives rows written before table ids were kept
/// theirs, and notes the state recorded before its activity was as used now.
fn create(connection: &Connection, node: &Node) -> Result<()> {
    connection.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = EXTRA;
         CREATE TABLE IF NOT EXISTS consumer_offsets (
             group_id  TEXT NOT NULL,
             topic     TEXT NOT NULL,
             partition INTEGER NOT NULL,
             offset    INTEGER NOT NULL,
             metadata  TEXT,
             table_id  INTEGER,
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
             table_id       INTEGER,
             PRIMARY KEY (producer_id, topic, partition)
         );
         CREATE TABLE IF NOT EXISTS producer_activity (
             producer_id INTEGER PRIMARY KEY,
             written_at  INTEGER NOT NULL
         );",
    )?;
    for table in ["consumer_offsets", "producer_batches"] {
        name_tables(connection, table, node)?;
    }
    PRODUCER_ACTIVITY.fill(connection, now_ms())?;
    GROUP_ACTIVITY.fill(connection, now_ms())?;
    Ok(())
}

/// Gives the rows of `table` without a table id (written before ids were kept, or by
/// hand) their topic's, and deletes those whose topic is gone.
fn name_tables(connection: &Connection, table: &str, node: &Node) -> Result<()> {
    let has_column = connection
        .prepare(&format!(
            "SELECT 1 FROM pragma_table_info('{table}') WHERE name = 'table_id'"
        ))?
        .exists([])?;
    if !has_column {
        connection.execute(
            &format!("ALTER TABLE {table} ADD COLUMN table_id INTEGER"),
            [],
        )?;
    }
    let topics: Vec<String> = connection
        .prepare(&format!(
            "SELECT DISTINCT topic FROM {table} WHERE table_id IS NULL"
        ))?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for topic in topics {
        match table_id(node, &topic) {
            Some(id) => connection.execute(
                &format!("UPDATE {table} SET table_id = ?1 WHERE topic = ?2 AND table_id IS NULL"),
                params![i64::try_from(id).unwrap_or(-1), topic],
            )?,
            None => connection.execute(
                &format!("DELETE FROM {table} WHERE topic = ?1 AND table_id IS NULL"),
                [&topic],
            )?,
        };
    }
    Ok(())
}

/// A table of when each key a Kafka client names (a group, a producer) was last used,
/// beside the table of what the key holds.
struct Activity {
    table: &'static str,
    key: &'static str,
    used_at: &'static str,
    /// The rows each key holds, under the same key column.
    state: &'static str,
}

/// When each group last committed offsets (or was seen with members).
const GROUP_ACTIVITY: Activity = Activity {
    table: "consumer_group_activity",
    key: "group_id",
    used_at: "active_at",
    state: "consumer_offsets",
};

/// When each producer last wrote.
const PRODUCER_ACTIVITY: Activity = Activity {
    table: "producer_activity",
    key: "producer_id",
    used_at: "written_at",
    state: "producer_batches",
};

impl Activity {
    /// Notes the keys holding state recorded before their activity was as used at
    /// `now`: their idle time starts then.
    fn fill(&self, connection: &Connection, now: i64) -> rusqlite::Result<()> {
        connection.execute(
            &self.sql(
                "INSERT OR IGNORE INTO {table} ({key}, {used_at})
                 SELECT DISTINCT {key}, ?1 FROM {state}",
            ),
            [now],
        )?;
        Ok(())
    }

    /// Deletes what the keys unused since `idle_since` hold, then their activity; how
    /// many keys were forgotten.
    fn forget(&self, connection: &Connection, idle_since: i64) -> rusqlite::Result<usize> {
        connection.execute(
            &self.sql(
                "DELETE FROM {state} WHERE {key} IN
                 (SELECT {key} FROM {table} WHERE {used_at} < ?1)",
            ),
            [idle_since],
        )?;
        connection.execute(
            &self.sql("DELETE FROM {table} WHERE {used_at} < ?1"),
            [idle_since],
        )
    }

    /// `template` with this table's names in place of `{table}`, `{key}`, `{used_at}`
    /// and `{state}`.
    fn sql(&self, template: &str) -> String {
        template
            .replace("{table}", self.table)
            .replace("{key}", self.key)
            .replace("{used_at}", self.used_at)
            .replace("{state}", self.state)
    }
}

/// Whether `group` has committed offsets stored.
fn group_has_offsets(connection: &Connection, group: &str) -> rusqlite::Result<bool> {
    connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM consumer_group_activity WHERE group_id = ?1)",
        [group],
        |row| row.get(0),
    )
}

/// How many groups have committed offsets stored.
fn groups_with_offsets(connection: &Connection) -> rusqlite::Result<usize> {
    let count: i64 =
        connection.query_row("SELECT count(*) FROM consumer_group_activity", [], |row| {
            row.get(0)
        })?;
    Ok(usize::try_from(count).unwrap_or(usize::MAX))
}
