//! Lake upkeep in the tiering service: expiring snapshots, removing orphan files and
//! rewriting manifests ([`mink_lake::upkeep`]), on demand (`CALL system.expire_snapshots`
//! and its siblings) and on a schedule.
//!
//! Each runs under the tiering lock, after a reconcile, so no round or compaction of this
//! node is in flight and mink's record of the lake is current. Expiry never drops the
//! snapshot of mink's latest record (the seam union reads plan on), and forgets the
//! records of the snapshots it expired, so `system.lake_snapshots` lists only snapshots
//! that can still be read.
//!
//! Neither expiry nor orphan removal deletes a file a running read planned on: both keep
//! the snapshots leased by reads ([`mink_lake::upkeep::leases`]), this node's (the reads
//! it planned, held in memory) and other processes' (objects under the table's location).
//! Expiry reads the leases after it fixed the seam, and this node's holds again after its
//! commit, before it deletes (it plans every read, so a read that names an older snapshot
//! is held here before it loads the metadata). An orphan grace under [`MIN_ORPHAN_GRACE`] is refused.
//!
//! The schedule ([`UpkeepSchedule`]), after each round of a table: expiry when a snapshot
//! is due and the last expiry of the table is [`EXPIRE_EVERY`] old; orphan removal every
//! [`REMOVE_ORPHANS_EVERY`] (files older than
//! [`DEFAULT_ORPHAN_GRACE`]). Manifests need no
//! schedule: every commit merges them once there are enough
//! ([`mink_lake::commit::DEFAULT_MIN_COUNT_TO_MERGE`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use mink_core::table::TablePath;
use mink_lake::Lake;
use mink_lake::commit::{SnapshotChanges, rewrite_would_merge};
use mink_lake::layout::table_location;
use mink_lake::upkeep::leases::{held_here, leased_snapshots};
use mink_lake::upkeep::{
    DEFAULT_ORPHAN_GRACE, ExpireReport, LakeTableStats, MIN_ORPHAN_GRACE, OrphanReport, Retention,
    expirable_snapshots, expire_snapshots, remove_orphan_files,
};
use tracing::{info, warn};

use super::compaction::commit_replace;
use super::{crash_at, open_lake_table, reconcile};
use crate::error::Result;
use crate::metadata::now_ms;
use crate::node::{Failpoint, Node};

/// The shortest time between two scheduled expiries of a table.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(300);

/// How often the schedule removes a table's orphan files.
pub const REMOVE_ORPHANS_EVERY: Duration = Duration::from_secs(3600);

/// Expires the snapshots of a table's lake that its retention no longer keeps
/// ([`Retention`]), and deletes the files only they referenced.
///
/// # Errors
/// [`crate::NodeError::NoLake`] for a table without a lake; lake errors otherwise.
pub async fn expire_table_snapshots(node: &Node, path: &TablePath) -> Result<ExpireReport> {
    super::metrics::upkeep("expire_snapshots", run_expiry(node, path)).await
}

/// [`expire_table_snapshots`] without its metrics.
async fn run_expiry(node: &Node, path: &TablePath) -> Result<ExpireReport> {
    let _indexes = node.tiering.lock().await;
    let (table, lake, mut lake_table) = open_lake_table(node, path).await?;
    reconcile(node, &table, &mut lake_table).await?;
    let metadata = lake_table.metadata();
    let retention = Retention::of(&lake_table.identifier().to_string(), metadata)?;
    // The seam cannot move while the tiering lock is held: a read planned from here on
    // plans on it, and one planned before holds its snapshot by now.
    let seam = node.metadata.latest_lake_snapshot(table.table_id)?;
    let mut keep: HashSet<i64> = seam.iter().map(|record| record.snapshot_id).collect();
    keep.extend(leased(lake, path, &lake_table).await?);
    let expired = expirable_snapshots(metadata, &retention, now_ms(), &keep);
    let mut expiry = expire_snapshots(lake, &lake_table, &expired).await?;
    if !expired.is_empty() {
        crash_at(node, Failpoint::AbortAfterExpiryCommit);
    }
    // A read that named an expired snapshot itself may have taken its hold meanwhile.
    expiry.spare(&held(lake, path, &lake_table)).await?;
    // Also the records of snapshots an earlier expiry dropped before a crash.
    let lost: Vec<i64> = node
        .metadata
        .lake_snapshots(table.table_id)?
        .into_iter()
        .map(|record| record.snapshot_id)
        .filter(|id| expired.contains(id) || metadata.snapshot_by_id(*id).is_none())
        .collect();
    node.metadata.forget_lake_snapshots(table.table_id, &lost)?;
    Ok(expiry.delete_unreferenced(lake).await)
}

/// Removes the files under a table's lake location that nothing references and that are
/// older than `grace`.
///
/// # Errors
/// [`crate::NodeError::NoLake`] for a table without a lake; lake errors otherwise.
pub async fn remove_table_orphan_files(
    node: &Node,
    path: &TablePath,
    grace: Duration,
) -> Result<OrphanReport> {
    super::metrics::upkeep("remove_orphan_files", run_orphan_removal(node, path, grace)).await
}

/// [`remove_table_orphan_files`] without its metrics.
async fn run_orphan_removal(
    node: &Node,
    path: &TablePath,
    grace: Duration,
) -> Result<OrphanReport> {
    if grace < MIN_ORPHAN_GRACE {
        return Err(crate::NodeError::InvalidArgument(format!(
            "remove_orphan_files on {path}: an orphan must be at least {} hours old, not \
             {grace:?}: a younger file may belong to a commit another engine is still writing \
             (Iceberg's Spark procedure refuses under 24 hours too)",
            MIN_ORPHAN_GRACE.as_secs() / 3600
        )));
    }
    remove_orphans_older_than(node, path, grace).await
}

/// [`remove_table_orphan_files`] with any grace: the schedule's own (benchmarks compress
/// days into minutes).
async fn remove_orphans_older_than(
    node: &Node,
    path: &TablePath,
    grace: Duration,
) -> Result<OrphanReport> {
    let _indexes = node.tiering.lock().await;
    let (table, lake, mut lake_table) = open_lake_table(node, path).await?;
    // A crashed round's files go here (its pending record names them), not as orphans.
    reconcile(node, &table, &mut lake_table).await?;
    let older_than = now_ms().saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
    let leased = leased(lake, path, &lake_table).await?;
    Ok(remove_orphan_files(lake, &lake_table, older_than, &leased).await?)
}

/// Where this node holds the reads it plans of a table's lake ([`held_here`]): the
/// table's location in the warehouse.
pub(crate) fn lease_location(lake: &Lake, path: &TablePath) -> String {
    table_location(lake.warehouse(), path)
}

/// The snapshots of a table's lake this process holds for reads (planned here, or read
/// here).
fn held(lake: &Lake, path: &TablePath, lake_table: &mink_lake::LakeTable) -> HashSet<i64> {
    let mut held = held_here(&lease_location(lake, path));
    held.extend(held_here(lake_table.metadata().location()));
    held
}

/// Every snapshot of a table's lake a running read holds, here or in another process.
async fn leased(
    lake: &Lake,
    path: &TablePath,
    lake_table: &mink_lake::LakeTable,
) -> Result<HashSet<i64>> {
    let location = lake_table.metadata().location();
    let mut leased = leased_snapshots(lake.storage(), location).await?;
    leased.extend(held(lake, path, lake_table));
    Ok(leased)
}

/// What rewriting a table's manifests did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RewriteManifestsReport {
    /// The `replace` snapshot committed; `None` when the table has no snapshot yet or no
    /// manifests to merge (nothing is committed then).
    pub snapshot_id: Option<i64>,
    /// Manifests merged.
    pub manifests_replaced: u64,
    /// Manifests written by merging them.
    pub manifests_created: u64,
}

/// Merges every manifest of a table's current snapshot into as few as their size allows,
/// in one `replace` snapshot (the same files, recorded like a compaction).
///
/// # Errors
/// [`crate::NodeError::NoLake`] for a table without a lake; lake errors otherwise.
pub async fn rewrite_table_manifests(
    node: &Node,
    path: &TablePath,
) -> Result<RewriteManifestsReport> {
    super::metrics::upkeep("rewrite_manifests", run_manifest_rewrite(node, path)).await
}

/// [`rewrite_table_manifests`] without its metrics.
async fn run_manifest_rewrite(node: &Node, path: &TablePath) -> Result<RewriteManifestsReport> {
    let mut indexes = node.tiering.lock().await;
    let (table, _, mut lake_table) = open_lake_table(node, path).await?;
    reconcile(node, &table, &mut lake_table).await?;
    let Some(parent) = lake_table.metadata().current_snapshot_id() else {
        return Ok(RewriteManifestsReport::default());
    };
    if !rewrite_would_merge(&lake_table).await? {
        return Ok(RewriteManifestsReport::default());
    }
    let changes = SnapshotChanges {
        rewrite_manifests: true,
        ..SnapshotChanges::default()
    };
    let committed = commit_replace(node, &table, &lake_table, changes).await?;
    // The same files at the same rows: a lake index of the parent describes it too.
    if let Some(index) = indexes.get_mut(&table.table_id)
        && index.snapshot_id == Some(parent)
    {
        index.snapshot_id = Some(committed);
    }
    let lake_table = node.lake().await?.load(path).await?;
    let summary = lake_table
        .metadata()
        .snapshot_by_id(committed)
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    let count = |key: &str| summary.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
    let report = RewriteManifestsReport {
        snapshot_id: Some(committed),
        manifests_replaced: count("manifests-replaced"),
        manifests_created: count("manifests-created"),
    };
    info!(table = %path, snapshot_id = committed, replaced = report.manifests_replaced,
        created = report.manifests_created, "rewrote lake manifests");
    Ok(report)
}

/// What a table's lake holds; `None` before its lake table exists.
///
/// # Errors
/// [`crate::NodeError::NoLake`] for a table without a lake; lake errors otherwise.
pub async fn lake_table_stats(node: &Node, path: &TablePath) -> Result<Option<LakeTableStats>> {
    let table = node.describe(path)?;
    if !table.lake_enabled {
        return Err(crate::NodeError::NoLake(path.to_string()));
    }
    let lake = node.lake().await?;
    if !lake.exists(path).await? {
        return Ok(None);
    }
    Ok(Some(LakeTableStats::of(&lake.load(path).await?).await?))
}

/// How often the schedule runs each kind of upkeep.
#[derive(Debug, Clone, Copy)]
pub struct UpkeepIntervals {
    /// The shortest time between two expiries of a table.
    pub expire_every: Duration,
    /// The time between two orphan removals of a table.
    pub remove_orphans_every: Duration,
    /// How old an unreferenced file must be to be removed as an orphan.
    pub orphan_grace: Duration,
}

impl Default for UpkeepIntervals {
    /// [`EXPIRE_EVERY`], [`REMOVE_ORPHANS_EVERY`] and [`DEFAULT_ORPHAN_GRACE`].
    fn default() -> Self {
        Self {
            expire_every: EXPIRE_EVERY,
            remove_orphans_every: REMOVE_ORPHANS_EVERY,
            orphan_grace: DEFAULT_ORPHAN_GRACE,
        }
    }
}

/// When the tiering service last ran each table's upkeep.
#[derive(Debug, Default)]
pub struct UpkeepSchedule {
    intervals: UpkeepIntervals,
    /// Per table id: the last expiry and the last orphan removal (the first of each is
    /// counted from when the schedule first saw the table).
    last: HashMap<u64, (Instant, Instant)>,
}

impl UpkeepSchedule {
    /// A schedule of other intervals than the default ones (benchmarks that compress
    /// hours of rounds into minutes).
    pub fn new(intervals: UpkeepIntervals) -> Self {
        Self {
            intervals,
            last: HashMap::new(),
        }
    }

    /// Runs the upkeep of a table that is due (after one of its rounds). Failures are
    /// logged and retried at the next due time.
    pub async fn run_due(&mut self, node: &Node, path: &TablePath, table_id: u64) {
        let UpkeepIntervals {
            expire_every,
            remove_orphans_every,
            orphan_grace,
        } = self.intervals;
        let now = Instant::now();
        let (last_expiry, last_orphans) = self.last.entry(table_id).or_insert((now, now));
        if last_expiry.elapsed() >= expire_every && expiry_due(node, path).await {
            *last_expiry = now;
            if let Err(error) = expire_table_snapshots(node, path).await {
                warn!(table = %path, %error, "expiring lake snapshots failed; retried later");
            }
        }
        if last_orphans.elapsed() >= remove_orphans_every {
            *last_orphans = now;
            match remove_orphans_older_than(node, path, orphan_grace).await {
                Ok(report) if !report.removed.is_empty() => {
                    info!(table = %path, files = report.removed.len(), "removed orphan lake files");
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(table = %path, %error, "removing orphan lake files failed; retried later");
                }
            }
        }
    }
}

/// Whether a table's lake has a snapshot its retention no longer keeps (from its cached
/// metadata: no file is read).
async fn expiry_due(node: &Node, path: &TablePath) -> bool {
    let Ok(lake) = node.lake().await else {
        return false;
    };
    let Ok(lake_table) = lake.load(path).await else {
        return false;
    };
    let metadata = lake_table.metadata();
    let Ok(retention) = Retention::of(&path.to_string(), metadata) else {
        return false;
    };
    retention.gc_enabled
        && !expirable_snapshots(metadata, &retention, now_ms(), &HashSet::new()).is_empty()
}
