//! What tiering records of the lake: the snapshots mink committed, each with the log
//! offsets it holds (the seam Union reads plan on), and the round whose files are written
//! but whose commit is not recorded yet.

use rusqlite::{OptionalExtension, params};

use super::{LakeMetadata, Metadata};
use crate::error::Result;

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

impl LakeMetadata for Metadata {
    fn record_lake_snapshot(&self, table_id: u64, record: &LakeSnapshotRecord) -> Result<()> {
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

    fn latest_lake_snapshot(&self, table_id: u64) -> Result<Option<LakeSnapshotRecord>> {
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

    fn lake_snapshots(&self, table_id: u64) -> Result<Vec<LakeSnapshotRecord>> {
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

    fn forget_lake_snapshots(&self, table_id: u64, snapshot_ids: &[i64]) -> Result<()> {
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

    fn set_pending_round(&self, table_id: u64, round: &PendingRound) -> Result<()> {
        let files = round.files.join("\n");
        self.connection().execute(
            "INSERT OR REPLACE INTO lake_pending (table_id, parent_snapshot, files) VALUES (?1, ?2, ?3)",
            params![table_id as i64, round.parent_snapshot, files],
        )?;
        Ok(())
    }

    fn pending_round(&self, table_id: u64) -> Result<Option<PendingRound>> {
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

    fn clear_pending_round(&self, table_id: u64) -> Result<()> {
        self.connection().execute(
            "DELETE FROM lake_pending WHERE table_id = ?1",
            [table_id as i64],
        )?;
        Ok(())
    }
}
