//! The tiering service: copies each lake-enabled table's log into its Iceberg table.
//!
//! A round, for one table:
//!
//! ```text
//!  1. reconcile   the lake's latest snapshot vs mink's record of it (repair a crash; go
//!                 back to what the lake holds when it lost commits)
//!  2. per bucket  read the log [tiered offset, high watermark) from the bucket's
//!                 leader (`leaders`: here, or another node of a cluster) -> Parquet data files:
//!                 a log table's rows as they are (`append`); for a primary-key table the
//!                 newest live version of each changed key, plus position deletes of the
//!                 lake rows those keys replace or remove, found through the table's
//!                 lake index (`upsert`, `crate::lake_index`)
//!  3. pending     note the round's files in metadata (orphans are cleaned after a crash)
//!  4. commit      one Iceberg snapshot, summary `mink.bucket-offsets` = every bucket's end
//!  5. record      CommitLakeSnapshot in metadata, then forget the pending round
//! ```
//!
//! **Exactly once.** A crash before step 4 leaves files no snapshot references: step 1 of
//! the next round deletes them. A crash between 4 and 5 leaves a snapshot mink did not
//! record: step 1 finds it (the newest snapshot carrying `mink.bucket-offsets` is mink's,
//! even when another engine committed on top of it) and records it from its summary.
//! Either way nothing is tiered twice and nothing is skipped. Rounds run one at a time per
//! node; in a cluster the node leading a table's first bucket runs its rounds
//! (`Node::runs_rounds_of`), and a round run elsewhere at the same time (by hand, or as
//! that role moves) is safe: both plan on the lake's current snapshot, the catalog commits
//! one of them, and the other fails with a conflict and deletes its files. Each node's
//! pending round is its own (`crate::metadata::etcd`). The same steps commit a compaction
//! (`compaction`), whose `replace` snapshot carries the offsets forward.
//!
//! **The lake is the truth.** The record can also be *ahead* of the lake: a catalog that
//! lost its last commits (a power cut on a catalog whose commit was not durable, a catalog
//! restored from a backup) no longer has the snapshot `meta.db` recorded. Reads would plan
//! on a snapshot the lake does not have, and the next round would tier from offsets whose
//! rows the lake does not hold, skipping them. Step 1 then goes back to what the lake
//! holds: its newest snapshot of mink's becomes the latest record again, or, when the lake
//! has none, an empty snapshot saying nothing is tiered (`{}`) is committed and recorded;
//! the rows after that seam are tiered again from the log by the next round, and log
//! retention, which keeps the log from the recorded seam on, keeps them meanwhile. The
//! node runs step 1 when it starts for every lake table whose record is ahead of its lake
//! ([`check_lake_records`]), before it serves a call and before log retention's first
//! pass.
//!
//! Iceberg 0.10 cannot commit delete files or replace files, so every snapshot is built
//! at the metadata layer and swapped in on the catalog ([`mink_lake::commit`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::Operation;
use mink_lake::commit::{SnapshotChanges, commit_snapshot};
use mink_lake::layout::lake_arrow_schema;
use mink_lake::offsets::{BUCKET_OFFSETS_PROPERTY, BucketOffsets};
use mink_lake::writer::delete_files;
use mink_lake::{Lake, LakeError, LakeTable as Table};
use tracing::{info, warn};

use crate::error::{NodeError, Result};
use crate::lake_index::{LakeIndex, LakeIndexes};
use crate::metadata::now_ms;
use crate::metadata::{LakeSnapshotRecord, PendingRound};
use crate::node::{Failpoint, Node};

mod append;
mod compaction;
mod leaders;
mod metrics;
#[cfg(test)]
pub(crate) mod tests;
mod upkeep;
mod upsert;

pub use compaction::{CompactReport, compact_table};
pub(crate) use upkeep::lease_location;
pub use upkeep::{
    EXPIRE_EVERY, REMOVE_ORPHANS_EVERY, RewriteManifestsReport, UpkeepIntervals, UpkeepSchedule,
    expire_table_snapshots, lake_table_stats, remove_table_orphan_files, rewrite_table_manifests,
};

/// How often the service looks for tables due for a round.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// What a round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierReport {
    /// The snapshot the round committed; `None` when there was nothing new to tier.
    pub snapshot_id: Option<i64>,
    /// Rows tiered.
    pub rows: u64,
    /// Data files written.
    pub files: u64,
    /// Lake rows deleted: the old versions of a primary-key table's changed keys.
    pub deleted_rows: u64,
    /// Position-delete files written.
    pub delete_files: u64,
    /// Whether a snapshot left unrecorded by a crash was recorded first.
    pub repaired: bool,
}

/// Runs one tiering round of a table now.
///
/// # Errors
/// [`NodeError::NoLake`] for a table without a lake; lake and log errors otherwise (the
/// round is then not recorded, and the next one starts over from the recorded offsets).
pub async fn tier_table(node: &Node, path: &TablePath) -> Result<TierReport> {
    metrics::round(path, run_round(node, path)).await
}

/// [`tier_table`] without its metrics.
async fn run_round(node: &Node, path: &TablePath) -> Result<TierReport> {
    let mut indexes = node.tiering.lock().await;
    let (table, lake, mut lake_table) = open_lake_table(node, path).await?;
    let mut report = TierReport {
        repaired: reconcile(node, &table, &mut lake_table).await?,
        ..TierReport::default()
    };
    let mut index = match table.has_primary_key() {
        true => Some(current_index(&mut indexes, lake, &table, &lake_table).await?),
        false => None,
    };
    let mut offsets = recorded_offsets(node, &table)?;
    let target = RoundTarget {
        table: &table,
        lake_table: &lake_table,
        lake_schema: lake_arrow_schema(lake_table.metadata().current_schema())?,
    };
    let mut changes = SnapshotChanges::default();
    let mut advanced = false;
    let round = async {
        for status in leaders::bucket_statuses(node, path).await? {
            let bucket_id = status.bucket.clone().ok_or_else(|| {
                NodeError::InvalidArgument("a bucket status without its bucket".into())
            })?;
            let tiered = offsets.get(&bucket_id);
            if tiered < status.log_start {
                warn!(bucket = %bucket_id, tiered, log_start = status.log_start,
                    "log retention removed rows before they were tiered; the lake misses them");
            }
            let (from, to) = (tiered.max(status.log_start), status.high_watermark);
            if from >= to {
                continue;
            }
            let log = leaders::bucket_log(node, &bucket_id, from..to).await?;
            let part = match index.as_mut() {
                Some(index) => {
                    let bucket_index = index.bucket_mut(&bucket_id);
                    let range = log.try_collect().await?;
                    upsert::tier_range(&target, &bucket_id, range, bucket_index).await?
                }
                None => append::tier_log(&target, &bucket_id, log).await?,
            };
            report.rows += part.rows;
            report.deleted_rows += part.deleted_rows;
            changes.added_data_files.extend(part.data_files);
            changes.added_delete_files.extend(part.delete_files);
            offsets.set(&bucket_id, to);
            advanced = true;
        }
        Ok::<_, NodeError>(())
    };
    if let Err(error) = round.await {
        // Best effort (failures are logged): the error to report is the round's.
        let _ = delete_files(&lake_table, &written_paths(&changes)).await;
        return Err(error);
    }
    if !advanced && !lake_moved_on(node, &table, &lake_table)? {
        indexes.extend(index.map(|index| (table.table_id, index)));
        return Ok(report);
    }
    report.files = changes.added_data_files.len() as u64;
    report.delete_files = changes.added_delete_files.len() as u64;
    let operation = match changes.added_delete_files.is_empty() {
        true => Operation::Append,
        false => Operation::Overwrite,
    };
    let snapshot_id = commit_and_record(
        node,
        &table,
        &lake_table,
        operation,
        changes,
        &offsets,
        [
            Failpoint::AbortBeforeLakeCommit,
            Failpoint::AbortAfterLakeCommit,
        ],
    )
    .await?;
    if let Some(mut index) = index {
        index.snapshot_id = Some(snapshot_id);
        indexes.insert(table.table_id, index);
    }
    info!(table = %path, snapshot_id, rows = report.rows, files = report.files,
        deleted_rows = report.deleted_rows, "tiered");
    report.snapshot_id = Some(snapshot_id);
    Ok(report)
}

/// Whether the lake table's current snapshot is not the one mink recorded: another engine
/// committed on top of it (mink's own commits are recorded, or reconciled first). A round
/// with nothing to tier then still commits, with the same offsets, so that reads, which
/// plan on the recorded snapshot, take the other engine's rows in.
fn lake_moved_on(node: &Node, table: &TableDescriptor, lake_table: &Table) -> Result<bool> {
    let recorded = node.metadata.latest_lake_snapshot(table.table_id)?;
    Ok(lake_table.metadata().current_snapshot_id() != recorded.map(|r| r.snapshot_id))
}

/// What a round writes to: the table, its lake table and the Arrow schema of lake rows.
#[derive(Debug)]
struct RoundTarget<'a> {
    table: &'a TableDescriptor,
    lake_table: &'a Table,
    lake_schema: arrow::datatypes::SchemaRef,
}

/// A lake-enabled table, its lake and its lake table (created if missing).
async fn open_lake_table<'a>(
    node: &'a Node,
    path: &TablePath,
) -> Result<(Arc<TableDescriptor>, &'a Lake, Table)> {
    let table = node.describe(path)?;
    if !table.lake_enabled {
        return Err(NodeError::NoLake(path.to_string()));
    }
    let lake = node.lake().await?;
    let lake_table = lake.create_table(&table).await?;
    Ok((table, lake, lake_table))
}

/// The lake index of a primary-key table as of the lake's current snapshot: the one
/// kept from the last commit when it still describes that snapshot, else rebuilt.
async fn current_index(
    indexes: &mut LakeIndexes,
    lake: &Lake,
    table: &Arc<TableDescriptor>,
    lake_table: &Table,
) -> Result<LakeIndex> {
    let current = lake_table.metadata().current_snapshot_id();
    match indexes.remove(&table.table_id) {
        Some(index) if index.snapshot_id == current => Ok(index),
        _ => LakeIndex::build(lake.storage(), lake_table, table, current).await,
    }
}

/// Every file a snapshot would add.
fn written_paths(changes: &SnapshotChanges) -> Vec<String> {
    changes
        .added_data_files
        .iter()
        .chain(&changes.added_delete_files)
        .map(|file| file.file_path().to_string())
        .collect()
}

/// Steps 3 to 5 of a round (and of a compaction): note the new files as pending, commit
/// the snapshot on top of the one planned on, record it. `crash_points` are the
/// failpoints before and after the commit.
async fn commit_and_record(
    node: &Node,
    table: &TableDescriptor,
    lake_table: &Table,
    operation: Operation,
    mut changes: SnapshotChanges,
    offsets: &BucketOffsets,
    crash_points: [Failpoint; 2],
) -> Result<i64> {
    let written = written_paths(&changes);
    let parent = lake_table.metadata().current_snapshot_id();
    node.metadata.set_pending_round(
        table.table_id,
        &PendingRound {
            parent_snapshot: parent,
            files: written.clone(),
        },
    )?;
    crash_at(node, crash_points[0]);
    changes
        .properties
        .insert(BUCKET_OFFSETS_PROPERTY.to_string(), offsets.to_json());
    let lake = node.lake().await?;
    let committed = match commit_snapshot(lake, lake_table, parent, operation, changes).await {
        Ok(committed) => committed,
        Err(error @ LakeError::CommitConflict { .. }) => {
            // Certainly not committed: the files can go now.
            // Best effort (failures are logged): the error to report is the conflict.
            let _ = delete_files(lake_table, &written).await;
            node.metadata.clear_pending_round(table.table_id)?;
            return Err(error.into());
        }
        // Maybe committed: the next round's reconcile finds out, and keeps or deletes
        // the pending files accordingly.
        Err(error) => return Err(error.into()),
    };
    crash_at(node, crash_points[1]);
    let snapshot_id = committed
        .metadata()
        .current_snapshot_id()
        .ok_or_else(|| NodeError::Corrupt("a committed snapshot that is not current".into()))?;
    node.metadata.record_lake_snapshot(
        table.table_id,
        &LakeSnapshotRecord {
            snapshot_id,
            offsets: offsets.to_json(),
            committed_at: now_ms(),
        },
    )?;
    node.metadata.clear_pending_round(table.table_id)?;
    Ok(snapshot_id)
}

/// Aborts the process at `point` when the node is configured to (crash tests).
fn crash_at(node: &Node, point: Failpoint) {
    if node.failpoint() == Some(point) {
        warn!(?point, "failpoint: aborting the process");
        std::process::abort();
    }
}

/// The offsets of the latest recorded snapshot (all zero before the first round).
pub(crate) fn recorded_offsets(node: &Node, table: &TableDescriptor) -> Result<BucketOffsets> {
    offsets_of(node.metadata.latest_lake_snapshot(table.table_id)?.as_ref())
}

/// The offsets of a recorded snapshot (all zero without one).
pub(crate) fn offsets_of(record: Option<&LakeSnapshotRecord>) -> Result<BucketOffsets> {
    match record {
        Some(record) => Ok(BucketOffsets::from_json(&record.offsets)?),
        None => Ok(BucketOffsets::default()),
    }
}

/// Step 1: brings mink's record in line with the lake (see the module docs): deletes the
/// files of a round that never committed, records a snapshot committed before a crash,
/// and goes back to what the lake holds when the record names a snapshot the lake lost.
/// `lake_table` is replaced by the table as committed when going back commits. Returns
/// whether the record changed.
async fn reconcile(node: &Node, table: &TableDescriptor, lake_table: &mut Table) -> Result<bool> {
    // In a cluster another node's round may have committed and recorded a snapshot since
    // `lake_table` was loaded: a record naming a snapshot it lacks is only taken for one
    // the lake lost once the table is loaded again (a record follows its commit).
    let recorded_id =
        (node.metadata.latest_lake_snapshot(table.table_id)?).map(|record| record.snapshot_id);
    if let Some(id) = recorded_id
        && lake_table.metadata().snapshot_by_id(id).is_none()
    {
        *lake_table = node.lake().await?.load(&table.path).await?;
    }
    let seam = lake_seam(lake_table);
    let newest = match &seam {
        LakeSeam::Tiered(newest) => Some(newest),
        LakeSeam::Nothing | LakeSeam::Unknown => None,
    };
    if let Some(pending) = node.metadata.pending_round(table.table_id)? {
        // The pending round committed iff mink's newest snapshot is its commit: the one
        // made on top of the snapshot the round was planned on.
        let committed = newest.is_some_and(|snapshot| {
            snapshot.parent == pending.parent_snapshot
                && Some(snapshot.id) != pending.parent_snapshot
        });
        if !committed {
            warn!(table = %table.path, files = pending.files.len(), "deleting the files of a round that was never committed");
            delete_files(lake_table, &pending.files).await?;
        }
        node.metadata.clear_pending_round(table.table_id)?;
    }
    match seam {
        LakeSeam::Tiered(newest) if recorded_id == Some(newest.id) => Ok(false),
        LakeSeam::Tiered(newest) => {
            BucketOffsets::from_json(&newest.offsets)?;
            match recorded_id {
                Some(lost) if !is_ancestor(lake_table, lost, newest.id) => {
                    warn!(table = %table.path, lost, snapshot_id = newest.id,
                        "the lake's main branch does not hold the snapshot mink recorded last \
                         (its catalog lost its last commits, or another engine rolled it back): \
                         going back to the lake's newest snapshot and tiering the rows after it \
                         again");
                }
                _ => {
                    warn!(table = %table.path, snapshot_id = newest.id, "recording a lake snapshot committed before a crash");
                }
            }
            record_as_latest(node, table.table_id, &newest)?;
            forget_lost_records(node, table.table_id, lake_table)?;
            Ok(true)
        }
        LakeSeam::Nothing => {
            let Some(lost) = recorded_id else {
                return Ok(false);
            };
            warn!(table = %table.path, lost,
                "the lake holds no snapshot of mink's, and mink recorded one (its catalog lost \
                 its commits): tiering every row again");
            // No record says "nothing tiered": a snapshot saying it is committed and recorded.
            commit_and_record(
                node,
                table,
                lake_table,
                Operation::Append,
                SnapshotChanges::default(),
                &BucketOffsets::default(),
                [
                    Failpoint::AbortBeforeLakeCommit,
                    Failpoint::AbortAfterLakeCommit,
                ],
            )
            .await?;
            *lake_table = node.lake().await?.load(&table.path).await?;
            forget_lost_records(node, table.table_id, lake_table)?;
            Ok(true)
        }
        LakeSeam::Unknown => {
            if let Some(lost) = recorded_id
                && lake_table.metadata().snapshot_by_id(lost).is_none()
            {
                warn!(table = %table.path, lost,
                    "the lake has neither the snapshot mink recorded last nor, on its main \
                     branch, an older one of mink's (expired by another engine?): the record \
                     is kept");
            }
            Ok(false)
        }
    }
}

/// Makes `snapshot` the latest record of table `table_id`. A record of it may be there
/// already, older than the records of snapshots the lake lost: it is forgotten first, so
/// that recording it again makes it the latest (the seam reads plan on). A crash in
/// between leaves the lost record the latest, and the next reconcile does this again.
fn record_as_latest(node: &Node, table_id: u64, snapshot: &MinkSnapshot) -> Result<()> {
    node.metadata
        .forget_lake_snapshots(table_id, &[snapshot.id])?;
    node.metadata.record_lake_snapshot(
        table_id,
        &LakeSnapshotRecord {
            snapshot_id: snapshot.id,
            offsets: snapshot.offsets.clone(),
            committed_at: snapshot.timestamp_ms,
        },
    )
}

/// Forgets the records of table `table_id` whose snapshots `lake_table` does not have
/// (the latest record is always kept), so that `system.lake_snapshots` lists only
/// snapshots that can be read.
fn forget_lost_records(node: &Node, table_id: u64, lake_table: &Table) -> Result<()> {
    let metadata = lake_table.metadata();
    let lost: Vec<i64> = node
        .metadata
        .lake_snapshots(table_id)?
        .into_iter()
        .map(|record| record.snapshot_id)
        .filter(|id| metadata.snapshot_by_id(*id).is_none())
        .collect();
    node.metadata.forget_lake_snapshots(table_id, &lost)
}

/// Whether snapshot `ancestor` is `of` or one of its ancestors in `lake_table`.
fn is_ancestor(lake_table: &Table, ancestor: i64, of: i64) -> bool {
    let metadata = lake_table.metadata();
    let mut snapshot = metadata.snapshot_by_id(of);
    while let Some(current) = snapshot {
        if current.snapshot_id() == ancestor {
            return true;
        }
        snapshot = current
            .parent_snapshot_id()
            .and_then(|parent| metadata.snapshot_by_id(parent));
    }
    false
}

/// A snapshot mink committed (it carries `mink.bucket-offsets`).
#[derive(Debug)]
struct MinkSnapshot {
    id: i64,
    parent: Option<i64>,
    offsets: String,
    timestamp_ms: i64,
}

/// What a lake table's main branch says mink tiered.
#[derive(Debug)]
enum LakeSeam {
    /// The newest snapshot mink committed: the current one or, when other engines
    /// committed on top of it, the first of its ancestors that carries
    /// `mink.bucket-offsets`.
    Tiered(MinkSnapshot),
    /// Nothing: the branch has no snapshot, or none of its snapshots down to the first
    /// one carries mink's offsets.
    Nothing,
    /// The branch is cut before a snapshot of mink's (an ancestor expired): it cannot say.
    Unknown,
}

/// Where `lake_table`'s main branch puts mink's seam.
fn lake_seam(lake_table: &Table) -> LakeSeam {
    let metadata = lake_table.metadata();
    let mut snapshot = metadata.current_snapshot();
    while let Some(current) = snapshot {
        if let Some(offsets) = current
            .summary()
            .additional_properties
            .get(BUCKET_OFFSETS_PROPERTY)
        {
            return LakeSeam::Tiered(MinkSnapshot {
                id: current.snapshot_id(),
                parent: current.parent_snapshot_id(),
                offsets: offsets.clone(),
                timestamp_ms: current.timestamp_ms(),
            });
        }
        let Some(parent) = current.parent_snapshot_id() else {
            return LakeSeam::Nothing;
        };
        snapshot = metadata.snapshot_by_id(parent);
        if snapshot.is_none() {
            return LakeSeam::Unknown;
        }
    }
    LakeSeam::Nothing
}

/// A start that checks its records agree: reconciles ([`reconcile`]) every lake table
/// whose latest record names a snapshot the lake's main branch does not hold (its catalog
/// lost its last commits), so that neither reads nor log retention go by a seam the lake
/// does not hold. A record *behind* the lake (a crash between a commit and its record) is
/// left to the table's next round: reads of the older snapshot are still right, and
/// retention keeps more of the log. A table that fails (a catalog out of reach) is logged
/// and left to its next round, which reconciles first.
pub async fn check_lake_records(node: &Node) {
    for path in node.list_tables(None) {
        if !node.describe(&path).is_ok_and(|table| table.lake_enabled) {
            continue;
        }
        let _indexes = node.tiering.lock().await;
        let checked = async {
            let (table, _, mut lake_table) = open_lake_table(node, &path).await?;
            let recorded = node.metadata.latest_lake_snapshot(table.table_id)?;
            let current = lake_table.metadata().current_snapshot_id();
            let held = |recorded: i64| {
                current.is_some_and(|current| is_ancestor(&lake_table, recorded, current))
            };
            match recorded {
                Some(record) if !held(record.snapshot_id) => {
                    reconcile(node, &table, &mut lake_table).await
                }
                _ => Ok(false),
            }
        };
        match checked.await {
            Ok(true) => {
                info!(table = %path, "brought the record of the lake back to what the lake holds")
            }
            Ok(false) => {}
            Err(error) => {
                warn!(table = %path, %error, "checking the record of the lake failed; its next round checks again");
            }
        }
    }
}

/// What the tiering service does for a table that is due: a round, the compaction due
/// when it committed, then the upkeep due ([`UpkeepSchedule`]). Compaction and upkeep
/// failures are logged (they are retried after the next round).
///
/// # Errors
/// The round's ([`tier_table`]).
pub async fn service_round(
    node: &Node,
    path: &TablePath,
    upkeep: &mut UpkeepSchedule,
) -> Result<TierReport> {
    let table_id = node.describe(path)?.table_id;
    let report = tier_table(node, path).await?;
    // Nothing new: nothing new to compact either.
    if report.snapshot_id.is_some()
        && let Err(error) = compaction::compact_due(node, path).await
    {
        warn!(table = %path, %error, "compaction failed; it is retried after the next round");
    }
    upkeep.run_due(node, path, table_id).await;
    Ok(report)
}

/// Runs due tiering rounds forever: each lake-enabled table every `lake.freshness` (the
/// first one freshness interval after the node starts or the table is created). The
/// server runs [`check_lake_records`] first.
pub async fn run_tiering(node: Arc<Node>) {
    let mut last_round: HashMap<u64, Instant> = HashMap::new();
    let mut upkeep = UpkeepSchedule::default();
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    loop {
        ticks.tick().await;
        for path in node.list_tables(None) {
            let Ok(table) = node.describe(&path) else {
                continue;
            };
            if !table.lake_enabled {
                continue;
            }
            // A table's first round comes one freshness interval after the node sees it.
            let since = last_round
                .entry(table.table_id)
                .or_insert_with(Instant::now);
            if since.elapsed() < table.lake_freshness || !node.runs_rounds_of(&path) {
                continue;
            }
            last_round.insert(table.table_id, Instant::now());
            match service_round(&node, &path, &mut upkeep).await {
                Ok(_) => {}
                Err(error) => {
                    warn!(table = %path, %error, "tiering round failed; it is retried next time");
                }
            }
        }
    }
}
