//! Planning reads of the lake alone: Lake tickets (a table's or a partition's files as of
//! one snapshot) and incremental reads between two of its snapshots
//! ([`mink_lake::delta`]). Union reads, which add the log after the seam, are planned in
//! [`crate::union`].

use std::sync::Arc;

use mink_core::filter::ColumnFilter;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::delta::{DeltaPlan, plan_delta};
use mink_lake::predicate::to_predicate;
use mink_lake::reader::{LakeSplit, SplitScope, plan_split};

use crate::error::{NodeError, Result};
use crate::node::Node;
use crate::union::check_filters;

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
        let recorded = self.metadata.latest_lake_snapshot(table.table_id)?;
        let Some(snapshot_id) = snapshot_id.or(recorded.map(|r| r.snapshot_id)) else {
            return Ok((table, LakeSplit::default()));
        };
        let lake_table = self.lake().await?.load(path).await?;
        let scope = match partition {
            Some(partition) => SplitScope::Partition(partition),
            None => SplitScope::Table,
        };
        let predicate = to_predicate(filters, table.schema());
        let split = plan_split(&lake_table, snapshot_id, &scope, predicate).await?;
        Ok((table, split))
    }

    /// Plans the changes of a table's lake from snapshot `from` (excluded) to `to`
    /// (included), both snapshots of its lake table (`list_lake_snapshots` lists those
    /// mink committed).
    ///
    /// # Errors
    /// [`NodeError::NoLake`] for a table without a lake; [`mink_lake::LakeError`]'s
    /// `SnapshotNotFound` and `NotAncestor` for ids that do not make a range.
    pub async fn plan_changes(&self, path: &TablePath, from: i64, to: i64) -> Result<DeltaPlan> {
        let table = self.describe(path)?;
        if !table.lake_enabled {
            return Err(NodeError::NoLake(path.to_string()));
        }
        let lake_table = self.lake().await?.load(path).await?;
        Ok(plan_delta(&lake_table, from, to).await?)
    }
}
