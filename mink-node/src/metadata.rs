//! The node's metadata, persisted in SQLite (`<data-dir>/meta.db`): tables with all their
//! schema versions, the partitions created so far, the lake snapshots mink recorded, and
//! what its Kafka listener keeps (consumer groups' committed offsets, producer ids).
//!
//! Kafka state a client creates by naming something new (a group id, a producer id)
//! is recorded with when it was last used, so that what nobody uses any more can be
//! forgotten ([`Metadata::forget_idle_groups`], [`Metadata::forget_idle_producers`]).
//!
//! Descriptors are stored as their protobuf encoding ([`TableDescriptorProto`]), the same
//! bytes the Flight protocol carries, so there is one serialization of a table.
//!
//! Every change is one SQLite transaction (a single statement, or an explicit
//! transaction where a change takes several), so a crash never leaves half of one: a
//! table row always holds its whole descriptor.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use mink_core::protocol::{TableDescriptorProto, decode};
use mink_core::table::{TableDescriptor, TablePath};
use prost::Message;
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{NodeError, Result};

/// A partition of a partitioned table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRecord {
    /// Unique within the node; names the partition's directory.
    pub partition_id: i64,
    /// The partition name (`col=value/...`).
    pub name: String,
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
        PRODUCER_ACTIVITY.fill(&connection, now_ms())?;
        GROUP_ACTIVITY.fill(&connection, now_ms())?;
        // SQLite fsyncs the directory when it creates a journal or a WAL file, never when
        // it creates the database file: a new `meta.db`'s name is made durable here,
        // before anything stored in it is acknowledged.
        let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty());
        mink_durable::sync_dir(dir.unwrap_or(Path::new(".")))?;
        Ok(Self {
            connection: Mutex::new(connection),
        })
    }

    fn connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every table.
    pub fn load_tables(&self) -> Result<Vec<TableDescriptor>> {
        let connection = self.connection();
        let mut statement =
            connection.prepare("SELECT table_id, descriptor FROM tables ORDER BY table_id")?;
        let rows = statement.query_map([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })?;
        rows.map(|row| {
            let (table_id, bytes) = row?;
            let mut table = TableDescriptor::try_from(decode::<TableDescriptorProto>(
                "stored table descriptor",
                &bytes,
            )?)?;
            table.table_id = table_id as u64;
            Ok(table)
        })
        .collect()
    }

    /// Stores a new table and returns it with its assigned `table_id`, in one
    /// transaction (the descriptor carries the id, so the row is inserted, then filled).
    pub fn create_table(&self, table: &TableDescriptor) -> Result<TableDescriptor> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        let inserted = transaction.execute(
            "INSERT INTO tables (database, name, descriptor) VALUES (?1, ?2, x'')",
            params![table.path.database, table.path.name],
        );
        match inserted {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                return Err(NodeError::TableExists(table.path.to_string()));
            }
            other => other?,
        };
        let mut created = table.clone();
        created.table_id = transaction.last_insert_rowid() as u64;
        transaction.execute(
            "UPDATE tables SET descriptor = ?1 WHERE table_id = ?2",
            params![encode(&created), created.table_id as i64],
        )?;
        transaction.commit()?;
        Ok(created)
    }

    /// Removes a table by id, with its partitions (a create rolled back). Ids are never
    /// reused (`AUTOINCREMENT`).
    pub fn delete_table(&self, table_id: u64) -> Result<()> {
        self.connection()
            .execute("DELETE FROM tables WHERE table_id = ?1", [table_id as i64])?;
        Ok(())
    }

    /// Replaces a table's descriptor (a schema change).
    pub fn update_table(&self, table: &TableDescriptor) -> Result<()> {
        let changed = self.connection().execute(
            "UPDATE tables SET descriptor = ?1 WHERE table_id = ?2",
            params![encode(table), table.table_id as i64],
        )?;
        if changed == 0 {
            return Err(NodeError::TableNotFound(table.path.to_string()));
        }
        Ok(())
    }

    /// Removes a table and its partitions.
    pub fn drop_table(&self, path: &TablePath) -> Result<()> {
        let changed = self.connection().execute(
            "DELETE FROM tables WHERE database = ?1 AND name = ?2",
            params![path.database, path.name],
        )?;
        if changed == 0 {
            return Err(NodeError::TableNotFound(path.to_string()));
        }
        Ok(())
    }

    /// The partitions of a table.
    pub fn partitions(&self, table_id: u64) -> Result<Vec<PartitionRecord>> {
        let connection = self.connection();
        let mut statement = connection.prepare(
            "SELECT partition_id, name FROM partitions WHERE table_id = ?1 ORDER BY name",
        )?;
        let rows = statement.query_map([table_id as i64], |row| {
            Ok(PartitionRecord {
                partition_id: row.get(0)?,
                name: row.get(1)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The partition of that name, created if it does not exist yet (one transaction).
    pub fn ensure_partition(&self, table_id: u64, name: &str) -> Result<PartitionRecord> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        transaction.execute(
            "INSERT OR IGNORE INTO partitions (table_id, name) VALUES (?1, ?2)",
            params![table_id as i64, name],
        )?;
        let partition_id = transaction
            .query_row(
                "SELECT partition_id FROM partitions WHERE table_id = ?1 AND name = ?2",
                params![table_id as i64, name],
                |row| row.get(0),
            )
            .optional()?
            .ok_or_else(|| NodeError::TableNotFound(format!("table id {table_id}")))?;
        transaction.commit()?;
        Ok(PartitionRecord {
            partition_id,
            name: name.to_string(),
        })
    }

    /// Removes a partition (its creation rolled back).
    pub fn delete_partition(&self, partition_id: i64) -> Result<()> {
        self.connection().execute(
            "DELETE FROM partitions WHERE partition_id = ?1",
            [partition_id],
        )?;
        Ok(())
    }
}

/// A recorded lake snapshot: CommitLakeSnapshot { table, snapshot_id, bucket ->
/// log_end_offset }.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeSnapshotRecord {
    /// The Iceberg snapshot.
    pub snapshot_id: i64,
    /// Bucket -> log offset tiered up to, as the snapshot summary's JSON.
    pub offsets: String,
    /// When mink recorded it, ms since the epoch.
    pub committed_at: i64,
}

/// A tiering round whose files are written but whose commit is not recorded yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRound {
    /// The snapshot the round was planned on.
    pub parent_snapshot: Option<i64>,
    /// The locations of the round's data files.
    pub files: Vec<String>,
}

impl Metadata {
    /// Records a committed lake snapshot (idempotent).
    pub fn record_lake_snapshot(&self, table_id: u64, record: &LakeSnapshotRecord) -> Result<()> {
        self.connection().execute(
            "INSERT OR IGNORE INTO lake_snapshots (table_id, snapshot_id, offsets, committed_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![
                table_id as i64,
                record.snapshot_id,
                record.offsets,
                record.committed_at
            ],
        )?;
        Ok(())
    }

    /// The latest recorded lake snapshot of a table.
    pub fn latest_lake_snapshot(&self, table_id: u64) -> Result<Option<LakeSnapshotRecord>> {
        Ok(self
            .connection()
            .query_row(
                "SELECT snapshot_id, offsets, committed_at FROM lake_snapshots
                 WHERE table_id = ?1 ORDER BY rowid DESC LIMIT 1",
                [table_id as i64],
                |row| {
                    Ok(LakeSnapshotRecord {
                        snapshot_id: row.get(0)?,
                        offsets: row.get(1)?,
                        committed_at: row.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Every lake snapshot recorded for a table, oldest first.
    pub fn lake_snapshots(&self, table_id: u64) -> Result<Vec<LakeSnapshotRecord>> {
        let connection = self.connection();
        let mut statement = connection.prepare(
            "SELECT snapshot_id, offsets, committed_at FROM lake_snapshots
             WHERE table_id = ?1 ORDER BY rowid",
        )?;
        let records = statement
            .query_map([table_id as i64], |row| {
                Ok(LakeSnapshotRecord {
                    snapshot_id: row.get(0)?,
                    offsets: row.get(1)?,
                    committed_at: row.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(records)
    }

    /// Forgets recorded lake snapshots that expired from the lake. The latest record (the
    /// seam union reads plan on) is always kept.
    pub fn forget_lake_snapshots(&self, table_id: u64, snapshot_ids: &[i64]) -> Result<()> {
        let mut connection = self.connection();
        let transaction = connection.transaction()?;
        {
            let mut statement = transaction.prepare(
                "DELETE FROM lake_snapshots WHERE table_id = ?1 AND snapshot_id = ?2
                 AND rowid < (SELECT max(rowid) FROM lake_snapshots WHERE table_id = ?1)",
            )?;
            for snapshot_id in snapshot_ids {
                statement.execute(params![table_id as i64, snapshot_id])?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    /// Notes a round's files before its commit, so a crash leaves nothing unaccounted.
    pub fn set_pending_round(&self, table_id: u64, round: &PendingRound) -> Result<()> {
        let files = round.files.join("\n");
        self.connection().execute(
            "INSERT OR REPLACE INTO lake_pending (table_id, parent_snapshot, files) VALUES (?1, ?2, ?3)",
            params![table_id as i64, round.parent_snapshot, files],
        )?;
        Ok(())
    }

    /// The pending round of a table, if any.
    pub fn pending_round(&self, table_id: u64) -> Result<Option<PendingRound>> {
        Ok(self
            .connection()
            .query_row(
                "SELECT parent_snapshot, files FROM lake_pending WHERE table_id = ?1",
                [table_id as i64],
                |row| {
                    let files: String = row.get(1)?;
                    Ok(PendingRound {
                        parent_snapshot: row.get(0)?,
                        files: files.lines().map(str::to_string).collect(),
                    })
                },
            )
            .optional()?)
    }

    /// Forgets a table's pending round (committed and recorded, or cleaned up).
    pub fn clear_pending_round(&self, table_id: u64) -> Result<()> {
        self.connection().execute(
            "DELETE FROM lake_pending WHERE table_id = ?1",
            [table_id as i64],
        )?;
        Ok(())
    }
}

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
    fn fill(&self, connection: &Connection, now: i64) -> Result<()> {
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

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

fn encode(table: &TableDescriptor) -> Vec<u8> {
    TableDescriptorProto::from(table).encode_to_vec()
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use mink_core::options::TableOptions;

    use super::*;

    fn table(name: &str) -> TableDescriptor {
        let schema = Schema::new(vec![Field::new("a", DataType::Int32, true)]);
        TableDescriptor::new(
            TablePath::new("db", name),
            schema,
            vec![],
            vec![],
            TableOptions::default(),
        )
        .unwrap()
    }

    /// Every commit is fsynced before it returns (SQLite's WAL, `synchronous` at least
    /// `FULL`): what `meta.db` acknowledged survives a power cut.
    #[test]
    fn every_commit_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
        let connection = metadata.connection();
        let journal_mode: String =
            (connection.query_row("PRAGMA journal_mode", [], |row| row.get(0))).unwrap();
        let synchronous: i64 =
            (connection.query_row("PRAGMA synchronous", [], |row| row.get(0))).unwrap();
        assert_eq!(journal_mode, "wal");
        assert_eq!(synchronous, 3, "EXTRA");
    }

    #[test]
    fn tables_and_partitions_persist() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        let created = {
            let metadata = Metadata::open(&path).unwrap();
            let created = metadata.create_table(&table("t")).unwrap();
            assert!(matches!(
                metadata.create_table(&table("t")),
                Err(NodeError::TableExists(_))
            ));
            let evolved = created
                .with_added_column(Field::new("b", DataType::Utf8, true))
                .unwrap();
            metadata.update_table(&evolved).unwrap();
            let p = metadata.ensure_partition(created.table_id, "dt=1").unwrap();
            assert_eq!(
                metadata.ensure_partition(created.table_id, "dt=1").unwrap(),
                p
            );
            evolved
        };
        let metadata = Metadata::open(&path).unwrap();
        assert_eq!(metadata.load_tables().unwrap(), vec![created.clone()]);
        assert_eq!(metadata.partitions(created.table_id).unwrap().len(), 1);
        metadata.drop_table(&created.path).unwrap();
        assert!(metadata.load_tables().unwrap().is_empty());
        assert!(metadata.partitions(created.table_id).unwrap().is_empty());
        assert!(matches!(
            metadata.drop_table(&created.path),
            Err(NodeError::TableNotFound(_))
        ));
    }

    #[test]
    fn kafka_state_persists_until_its_topic_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        let offset = |topic: &str, partition, offset| ConsumerOffset {
            topic: topic.into(),
            partition,
            offset,
            metadata: None,
        };
        let batch = ProducerBatch {
            epoch: 0,
            first_sequence: 5,
            last_sequence: 9,
            base_offset: 42,
        };
        let first_id = {
            let metadata = Metadata::open(&path).unwrap();
            let committed = [offset("db.t", 0, 7), offset("db.u", 1, 3)];
            metadata
                .commit_consumer_offsets("g", &committed, now_ms(), 1)
                .unwrap();
            metadata
                .commit_consumer_offsets("g", &[offset("db.t", 0, 8)], now_ms(), 1)
                .unwrap();
            metadata
                .record_producer_batch(1, "db.t", 0, &batch)
                .unwrap();
            metadata.new_producer_id().unwrap()
        };
        let metadata = Metadata::open(&path).unwrap();
        let mut committed = metadata.consumer_offsets("g").unwrap();
        committed.sort_by(|a, b| a.topic.cmp(&b.topic));
        assert_eq!(committed, [offset("db.t", 0, 8), offset("db.u", 1, 3)]);
        assert!(metadata.consumer_offsets("other").unwrap().is_empty());
        assert_eq!(
            metadata.last_producer_batch(1, "db.t", 0).unwrap(),
            Some(batch)
        );
        assert!(
            metadata.new_producer_id().unwrap() > first_id,
            "ids are never reused"
        );
        metadata.forget_topic("db.t").unwrap();
        assert_eq!(
            metadata.consumer_offsets("g").unwrap(),
            [offset("db.u", 1, 3)]
        );
        assert_eq!(metadata.last_producer_batch(1, "db.t", 0).unwrap(), None);
    }

    /// Producers that wrote nothing since a time are forgotten, the others kept; ids
    /// handed out are kept to one row.
    #[test]
    fn idle_producers_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
        let batch = ProducerBatch {
            epoch: 0,
            first_sequence: 0,
            last_sequence: 0,
            base_offset: 0,
        };
        metadata
            .record_producer_batch(1, "db.t", 0, &batch)
            .unwrap();
        metadata
            .record_producer_batch(1, "db.t", 1, &batch)
            .unwrap();
        assert_eq!(
            metadata.forget_idle_producers(now_ms() - 60_000).unwrap(),
            0
        );
        assert_eq!(
            metadata.last_producer_batch(1, "db.t", 1).unwrap(),
            Some(batch)
        );
        assert_eq!(metadata.forget_idle_producers(now_ms() + 1).unwrap(), 1);
        assert_eq!(metadata.last_producer_batch(1, "db.t", 0).unwrap(), None);
        assert_eq!(metadata.last_producer_batch(1, "db.t", 1).unwrap(), None);
        for _ in 0..3 {
            metadata.new_producer_id().unwrap();
        }
        let ids: i64 = metadata
            .connection()
            .query_row("SELECT count(*) FROM producer_ids", [], |row| row.get(0))
            .unwrap();
        assert_eq!(ids, 1);
    }

    /// A group's committed offsets are forgotten once it has been idle for the
    /// retention: from its last commit, or from when it was last seen with members.
    /// Groups with a recent commit, or with members, keep theirs; a new group is
    /// refused once the bound's number of groups have offsets.
    #[test]
    fn idle_groups_are_forgotten_and_groups_are_bounded() {
        const DAY_MS: i64 = 24 * 60 * 60 * 1000;
        let retention = Duration::from_millis(7 * DAY_MS as u64);
        let dir = tempfile::tempdir().unwrap();
        let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
        let offsets = [ConsumerOffset {
            topic: "db.t".into(),
            partition: 0,
            offset: 1,
            metadata: None,
        }];
        let commit = |group: &str, at: i64| {
            metadata
                .commit_consumer_offsets(group, &offsets, at, 3)
                .unwrap()
        };
        let start = 1_000 * DAY_MS;
        assert_eq!(commit("idle", start), OffsetsCommitted::Stored);
        assert_eq!(commit("consuming", start), OffsetsCommitted::Stored);
        assert_eq!(commit("recent", start), OffsetsCommitted::Stored);
        assert_eq!(commit("fourth", start), OffsetsCommitted::TooManyGroups);
        assert!(metadata.consumer_offsets("fourth").unwrap().is_empty());
        assert_eq!(commit("recent", start + DAY_MS), OffsetsCommitted::Stored);

        let later = start + 7 * DAY_MS + 1;
        let active = ["consuming".to_string()];
        assert_eq!(
            metadata
                .forget_idle_groups(later, retention, &active)
                .unwrap(),
            1
        );
        assert!(metadata.consumer_offsets("idle").unwrap().is_empty());
        assert_eq!(metadata.consumer_offsets("consuming").unwrap(), offsets);
        assert_eq!(metadata.consumer_offsets("recent").unwrap(), offsets);
        assert_eq!(
            commit("fourth", later),
            OffsetsCommitted::Stored,
            "room again"
        );

        // Its members gone at `later`, "consuming" is idle from then on.
        let end = later + 7 * DAY_MS;
        assert_eq!(metadata.forget_idle_groups(end, retention, &[]).unwrap(), 1);
        assert!(metadata.consumer_offsets("recent").unwrap().is_empty());
        assert_eq!(metadata.consumer_offsets("consuming").unwrap(), offsets);
        assert_eq!(
            metadata
                .forget_idle_groups(end + 1, retention, &[])
                .unwrap(),
            2
        );
        assert!(metadata.consumer_offsets("consuming").unwrap().is_empty());
    }

    /// Groups that committed before their activity was recorded are counted, and idle,
    /// from the first open after it was.
    #[test]
    fn groups_committed_before_their_activity_was_recorded_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        {
            let metadata = Metadata::open(&path).unwrap();
            metadata
                .connection()
                .execute_batch(
                    "DROP TABLE consumer_group_activity;
                     INSERT INTO consumer_offsets VALUES ('old', 'db.t', 0, 5, NULL);",
                )
                .unwrap();
        }
        let metadata = Metadata::open(&path).unwrap();
        let offsets = [ConsumerOffset {
            topic: "db.t".into(),
            partition: 0,
            offset: 1,
            metadata: None,
        }];
        assert_eq!(
            metadata
                .commit_consumer_offsets("new", &offsets, now_ms(), 1)
                .unwrap(),
            OffsetsCommitted::TooManyGroups
        );
        let retention = Duration::from_secs(60);
        assert_eq!(
            metadata
                .forget_idle_groups(now_ms(), retention, &[])
                .unwrap(),
            0
        );
        let after = now_ms() + 60_001;
        assert_eq!(
            metadata.forget_idle_groups(after, retention, &[]).unwrap(),
            1
        );
        assert!(metadata.consumer_offsets("old").unwrap().is_empty());
    }

    #[test]
    fn expired_lake_snapshots_are_forgotten_but_never_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
        let record = |snapshot_id| LakeSnapshotRecord {
            snapshot_id,
            offsets: "{}".into(),
            committed_at: snapshot_id,
        };
        let expiring = metadata.create_table(&table("expiring")).unwrap().table_id;
        let other = metadata.create_table(&table("other")).unwrap().table_id;
        for snapshot_id in [11, 12, 13] {
            metadata
                .record_lake_snapshot(expiring, &record(snapshot_id))
                .unwrap();
        }
        metadata.record_lake_snapshot(other, &record(11)).unwrap();
        metadata
            .forget_lake_snapshots(expiring, &[11, 13, 99])
            .unwrap();
        assert_eq!(
            metadata.lake_snapshots(expiring).unwrap(),
            [record(12), record(13)]
        );
        assert_eq!(
            metadata.lake_snapshots(other).unwrap(),
            [record(11)],
            "other tables keep theirs"
        );
    }

    #[test]
    fn a_rolled_back_create_or_partition_leaves_no_row() {
        let dir = tempfile::tempdir().unwrap();
        let metadata = Metadata::open(&dir.path().join("meta.db")).unwrap();
        let kept = metadata.create_table(&table("kept")).unwrap();
        let undone = metadata.create_table(&table("undone")).unwrap();
        let partition = metadata.ensure_partition(kept.table_id, "dt=1").unwrap();
        metadata.ensure_partition(undone.table_id, "dt=1").unwrap();
        metadata.delete_table(undone.table_id).unwrap();
        metadata.delete_partition(partition.partition_id).unwrap();
        assert_eq!(metadata.load_tables().unwrap(), vec![kept.clone()]);
        assert!(metadata.partitions(kept.table_id).unwrap().is_empty());
        assert!(metadata.partitions(undone.table_id).unwrap().is_empty());
        let again = metadata.create_table(&table("undone")).unwrap();
        assert!(again.table_id > undone.table_id, "ids are not reused");
    }
}
