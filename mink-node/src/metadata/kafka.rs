//! What the Kafka listener keeps: consumer groups' committed offsets, producer ids and
//! each idempotent producer's last batch per partition, with when each group and
//! producer was last used, so that idle ones are forgotten.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{Metadata, now_ms};
use crate::error::Result;

/// The offset a consumer group committed for one partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerOffset {
    /// The topic (`database.table`).
    pub topic: String,
    /// The topic's partition.
    pub partition: i32,
    /// The next offset the group reads.
    pub offset: i64,
    /// What the consumer attached to the commit.
    pub metadata: Option<String>,
}

/// What became of a group's commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetsCommitted {
    /// Its offsets are stored.
    Stored,
    /// Refused: the group has none stored and as many groups as allowed have some.
    TooManyGroups,
}

/// The last batch an idempotent Kafka producer wrote to one partition: what tells a
/// retry of it (or of an older batch) from a new one, also after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    /// The producer's epoch.
    pub epoch: i16,
    /// The sequence number of the batch's first record.
    pub first_sequence: i32,
    /// The sequence number of its last record.
    pub last_sequence: i32,
    /// The log offset its first row was written at.
    pub base_offset: i64,
}

impl Metadata {
    /// Stores a group's committed offsets, all of them or none (one transaction), and
    /// notes the group active at `now` (ms since the epoch). A group that has none
    /// stored yet is refused when `max_groups` groups already have some.
    pub fn commit_consumer_offsets(
        &self,
        group: &str,
        offsets: &[ConsumerOffset],
        now: i64,
        max_groups: usize,
    ) -> Result<OffsetsCommitted> {
        if offsets.is_empty() {
            return Ok(OffsetsCommitted::Stored);
        }
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        if !group_has_offsets(&transaction, group)?
            && groups_with_offsets(&transaction)? >= max_groups
        {
            return Ok(OffsetsCommitted::TooManyGroups);
        }
        {
            let mut insert = transaction.prepare(
                "INSERT OR REPLACE INTO consumer_offsets (group_id, topic, partition, offset, metadata)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for committed in offsets {
                insert.execute(params![
                    group,
                    committed.topic,
                    committed.partition,
                    committed.offset,
                    committed.metadata
                ])?;
            }
        }
        transaction.execute(
            "INSERT OR REPLACE INTO consumer_group_activity (group_id, active_at) VALUES (?1, ?2)",
            params![group, now],
        )?;
        transaction.commit()?;
        Ok(OffsetsCommitted::Stored)
    }

    /// Forgets the committed offsets of the groups that have been idle for `retention`
    /// at `now` (ms since the epoch), as Kafka brokers expire them
    /// (`offsets.retention.minutes`); how many groups were forgotten. A group is idle
    /// from its last commit, except while it is `active` (it has members): those are
    /// noted active at `now`, so their time starts when their last member is gone.
    pub fn forget_idle_groups(
        &self,
        now: i64,
        retention: Duration,
        active: &[String],
    ) -> Result<usize> {
        let idle_since =
            now.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        {
            let mut keep = transaction.prepare(
                "UPDATE consumer_group_activity SET active_at = max(active_at, ?2)
                 WHERE group_id = ?1",
            )?;
            for group in active {
                keep.execute(params![group, now])?;
            }
        }
        let forgotten = GROUP_ACTIVITY.forget(&transaction, idle_since)?;
        transaction.commit()?;
        Ok(forgotten)
    }

    /// Every offset a group committed.
    pub fn consumer_offsets(&self, group: &str) -> Result<Vec<ConsumerOffset>> {
        let connection = self.connection();
        let mut statement = connection.prepare(
            "SELECT topic, partition, offset, metadata FROM consumer_offsets WHERE group_id = ?1",
        )?;
        let rows = statement.query_map([group], |row| {
            Ok(ConsumerOffset {
                topic: row.get(0)?,
                partition: row.get(1)?,
                offset: row.get(2)?,
                metadata: row.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The last batch `producer_id` wrote to a topic's partition.
    pub fn last_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
    ) -> Result<Option<ProducerBatch>> {
        Ok(self
            .connection()
            .query_row(
                "SELECT epoch, first_sequence, last_sequence, base_offset FROM producer_batches
                 WHERE producer_id = ?1 AND topic = ?2 AND partition = ?3",
                params![producer_id, topic, partition],
                |row| {
                    Ok(ProducerBatch {
                        epoch: row.get(0)?,
                        first_sequence: row.get(1)?,
                        last_sequence: row.get(2)?,
                        base_offset: row.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    /// Records the batch `producer_id` just wrote to a topic's partition, and when.
    pub fn record_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
        batch: &ProducerBatch,
    ) -> Result<()> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        transaction.execute(
            "INSERT OR REPLACE INTO producer_batches
             (producer_id, topic, partition, epoch, first_sequence, last_sequence, base_offset)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                producer_id,
                topic,
                partition,
                batch.epoch,
                batch.first_sequence,
                batch.last_sequence,
                batch.base_offset
            ],
        )?;
        transaction.execute(
            "INSERT OR REPLACE INTO producer_activity (producer_id, written_at) VALUES (?1, ?2)",
            params![producer_id, now_ms()],
        )?;
        transaction.commit()?;
        Ok(())
    }

    /// Forgets the last batches of the producers that have written nothing since
    /// `idle_since` (ms since the epoch), as Kafka brokers expire producer state
    /// (`producer.id.expiration.ms`); how many producers were forgotten. A forgotten
    /// producer that writes again starts over as a new one.
    pub fn forget_idle_producers(&self, idle_since: i64) -> Result<usize> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        let forgotten = PRODUCER_ACTIVITY.forget(&transaction, idle_since)?;
        transaction.commit()?;
        Ok(forgotten)
    }

    /// Forgets what Kafka clients kept for a topic (`database.table`): its committed
    /// offsets and its producers' last batches. A table dropped and created again under
    /// the same name starts with none.
    pub fn forget_topic(&self, topic: &str) -> Result<()> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        transaction.execute("DELETE FROM consumer_offsets WHERE topic = ?1", [topic])?;
        transaction.execute(
            "DELETE FROM consumer_group_activity WHERE group_id NOT IN
             (SELECT group_id FROM consumer_offsets)",
            [],
        )?;
        transaction.execute("DELETE FROM producer_batches WHERE topic = ?1", [topic])?;
        transaction.commit()?;
        Ok(())
    }

    /// A producer id never handed out before, not even before a restart. Only the
    /// newest is kept: AUTOINCREMENT remembers the highest id ever used, so the table
    /// does not grow with every producer.
    pub fn new_producer_id(&self) -> Result<i64> {
        let connection = self.connection();
        connection.execute("INSERT INTO producer_ids DEFAULT VALUES", [])?;
        let id = connection.last_insert_rowid();
        connection.execute("DELETE FROM producer_ids WHERE producer_id < ?1", [id])?;
        Ok(id)
    }
}

/// A table of when each key a Kafka client names (a group, a producer) was last used,
/// beside the table of what the key holds.
pub(super) struct Activity {
    table: &'static str,
    key: &'static str,
    used_at: &'static str,
    /// The rows each key holds, under the same key column.
    state: &'static str,
}

/// When each group last committed offsets (or was seen with members).
pub(super) const GROUP_ACTIVITY: Activity = Activity {
    table: "consumer_group_activity",
    key: "group_id",
    used_at: "active_at",
    state: "consumer_offsets",
};

/// When each producer last wrote.
pub(super) const PRODUCER_ACTIVITY: Activity = Activity {
    table: "producer_activity",
    key: "producer_id",
    used_at: "written_at",
    state: "producer_batches",
};

impl Activity {
    /// Notes the keys holding state recorded before their activity was as used at
    /// `now`: their idle time starts then.
    pub(super) fn fill(&self, connection: &Connection, now: i64) -> Result<()> {
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
    fn forget(&self, connection: &Connection, idle_since: i64) -> Result<usize> {
        connection.execute(
            &self.sql(
                "DELETE FROM {state} WHERE {key} IN
                 (SELECT {key} FROM {table} WHERE {used_at} < ?1)",
            ),
            [idle_since],
        )?;
        Ok(connection.execute(
            &self.sql("DELETE FROM {table} WHERE {used_at} < ?1"),
            [idle_since],
        )?)
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
fn group_has_offsets(connection: &Connection, group: &str) -> Result<bool> {
    Ok(connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM consumer_group_activity WHERE group_id = ?1)",
        [group],
        |row| row.get(0),
    )?)
}

/// How many groups have committed offsets stored.
fn groups_with_offsets(connection: &Connection) -> Result<usize> {
    let count: i64 =
        connection.query_row("SELECT count(*) FROM consumer_group_activity", [], |row| {
            row.get(0)
        })?;
    Ok(usize::try_from(count).unwrap_or(usize::MAX))
}
