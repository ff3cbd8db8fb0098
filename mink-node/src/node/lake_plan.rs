//! Planning reads of the lake alone: Lake tickets (a table's or a partition's files as of
//! one snapshot) and incremental reads between two of its snapshots
//! ([`mink_lake::changes`]). Union reads, which add the log after the seam, are planned in
//! [`crate::node::union`].
//!
//! Every plan holds the snapshots it names for a lease period
//! ([`mink_lake::upkeep::leases`]), so that this node's upkeep keeps their files until the
//! reader, in whatever process, holds its own lease: the latest recorded one atomically
//! with reading the record ([`Node::hold_latest_lake_snapshot`]), one a read names itself
//! before the metadata that has it is loaded. A plan that fails releases its holds
//! ([`mink_lake::upkeep::leases::PlannedHold`]).

use std::sync::Arc;

use mink_core::filter::ColumnFilter;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::changes::{ChangesPlan, plan_changes};
use mink_lake::predicate::Pruning;
use mink_lake::reader::{LakeSplit, SplitScope, plan_split};
use mink_lake::upkeep::leases::{PlannedHold, hold_planned, hold_planned_snapshots};

use crate::error::{NodeError, Result};
use crate::metadata::LakeSnapshotRecord;
use crate::node::Node;
use crate::node::union::check_filters;
use crate::tiering::lease_location;

impl Node {
    /// Plans a Lake read: `snapshot_id` (default: the latest recorded) of a table or of one
    /// of its partitions. `None` when the table has no tiered snapshot yet.
    pub async fn plan_lake(
        &self,
        path: &TablePath,
        partition: Option<String>,
        snapshot_id: Option<i64>,
        filters: &[ColumnFilter],
    ) -> Result<(Arc<TableDescriptor>, LakeSplit)> {
        let table = self.describe(path)?;
        if !table.lake_enabled {
            return Err(NodeError::NoLake(path.to_string()));
        }
        check_filters(&table, filters)?;
        let (snapshot_id, hold) = match snapshot_id {
            Some(named) => {
                let location = lease_location(self.lake().await?, path);
                (Some(named), hold_planned_snapshots(&location, &[named]))
            }
            None => {
                let (record, hold) = self.hold_latest_lake_snapshot(&table).await?;
                (record.map(|r| r.snapshot_id), hold)
            }
        };
        let Some(snapshot_id) = snapshot_id else {
            return Ok((table, LakeSplit::default()));
        };
        let lake_table = self.lake().await?.load(path).await?;
        let scope = match partition {
            Some(partition) => SplitScope::Partition(partition),
            None => SplitScope::Table,
        };
        let pruning = Pruning {
            filters,
            table_schema: table.schema(),
        };
        let split = plan_split(&lake_table, snapshot_id, &scope, Some(pruning)).await?;
        hold.keep();
        Ok((table, split))
    }

    /// Plans the changes of a table's lake from snapshot `from` (excluded) to `to`
    /// (included), both snapshots of its lake table (`list_lake_snapshots` lists those
    /// mink committed).
    ///
    /// # Errors
    /// [`NodeError::NoLake`] for a table without a lake; [`mink_lake::LakeError`]'s
    /// `SnapshotNotFound` and `NotAncestor` for ids that do not make a range.
    pub async fn plan_changes(&self, path: &TablePath, from: i64, to: i64) -> Result<ChangesPlan> {
        let table = self.describe(path)?;
        if !table.lake_enabled {
            return Err(NodeError::NoLake(path.to_string()));
        }
        let lake = self.lake().await?;
        let location = lease_location(lake, path);
        let ends = hold_planned_snapshots(&location, &[from, to]);
        let plan = plan_changes(&lake.load(path).await?, from, to).await?;
        let between: Vec<i64> = plan.snapshots.iter().map(|s| s.snapshot_id).collect();
        hold_planned_snapshots(&location, &between).keep();
        ends.keep();
        Ok(plan)
    }

    /// The latest lake snapshot recorded for `table`, held for the read about to plan on
    /// it: read under the lock upkeep reads the table's holds under, so that an expiry
    /// either sees the hold or keeps the snapshot as its seam. The hold is released when
    /// dropped unless the caller keeps it once its plan is made.
    ///
    /// # Errors
    /// The metadata store's.
    pub(crate) async fn hold_latest_lake_snapshot(
        &self,
        table: &TableDescriptor,
    ) -> Result<(Option<LakeSnapshotRecord>, PlannedHold)> {
        // A lake that cannot be opened has no upkeep to hold a snapshot against either.
        let lake = match table.lake_enabled {
            true => self.lake().await.ok(),
            false => None,
        };
        let Some(lake) = lake else {
            let record = self.metadata.latest_lake_snapshot(table.table_id)?;
            return Ok((record, PlannedHold::default()));
        };
        let location = lease_location(lake, &table.path);
        hold_planned(
            &location,
            || self.metadata.latest_lake_snapshot(table.table_id),
            |record| record.as_ref().map(|r| r.snapshot_id),
        )
    }
}
