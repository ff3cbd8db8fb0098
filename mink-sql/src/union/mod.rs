//! The engine's union read: the tree of `mink_scan` (`docs/design.md#union-read`), the same plan
//! nodes the bucket leader executes for its Union ticket, under the engine's operators:
//!
//! ```text
//!   FilterExec (the filters the scan took, exact; projection to the statement's columns)
//!     KeyMergeExec                        primary-key table: lake minus changed keys (by
//!       DataSourceExec (ParquetSource)      position or by probe), then the log ranges' live rows
//!       LogRangeExec                         the leaders' logs over Flight ([`log_range`])
//!   or UnionExec(DataSourceExec, LogRangeExec)   log table: lake rows, then range rows
//! ```
//!
//! The lake side is pruned by every filter the statement pushed (row groups, pages, bloom
//! filters) as a physical expression. The buckets of a primary-key table that nothing was
//! tiered from yet are read from their KV stores (a [`MinkScanExec`] beside the merge),
//! where a merge would fold their whole changelog in memory. `EXPLAIN ANALYZE` shows each
//! node with its counters. In a session whose statements may run distributed, the
//! buckets' trees are planned one by one under a [`UnionTasksExec`], which deals them
//! to tasks ([`crate::distributed`]).

pub(crate) mod log_range;

use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::union::UnionExec;
use mink_core::protocol::UnionPlan;
pub(crate) use mink_scan::union::UnionSplit;
use mink_scan::union::{UnionScan, filter_and_project};

use self::log_range::FlightLog;
use crate::distributed::is_distributed;
use crate::distributed::tasks::{BucketRead, UnionTasksExec};
use crate::exec::MinkScanExec;
use crate::split::{Split, SplitReader, SplitSource};

/// What a union read's plan is built from.
#[derive(Debug)]
pub(crate) struct UnionRead {
    /// The read (its schema, filters and output as for a [`MinkScanExec`]).
    pub(crate) reader: SplitReader,
    pub(crate) splits: Vec<UnionSplit>,
    /// Every filter pushed into the scan, exact or not: the lake scan prunes with them.
    pub(crate) pruning: Vec<Expr>,
    /// The filters the scan answers exactly.
    pub(crate) exact: Vec<Expr>,
}

impl UnionRead {
    /// The plan of the read (see the module docs).
    ///
    /// # Errors
    /// A lake file outside the table's location; a delete file or footer that cannot be
    /// read; a filter DataFusion cannot plan.
    pub(crate) async fn plan(self, state: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        let Self {
            mut reader,
            splits,
            pruning,
            exact,
        } = self;
        let table = Arc::clone(&reader.table);
        let distributed = is_distributed(state.config());
        // A bucket with nothing tiered yet is read from its KV store.
        let (untiered_splits, splits): (Vec<UnionSplit>, Vec<UnionSplit>) = splits
            .into_iter()
            .partition(|split| table.has_primary_key() && untiered(&split.plan));
        // The read of a primary-key table merges when a tiered bucket has a log range (without
        // one, as in `t$lake`, the plan is the lake scan alone).
        let merges =
            table.has_primary_key() && splits.iter().any(|split| split.plan.log_range_len() > 0);
        let scan = UnionScan {
            table: &table,
            storage: Some(&reader.storage),
            log: Arc::new(FlightLog {
                client: reader.client.clone(),
            }),
            columns: reader.read_columns(),
            // A lake scan not under a key merge gets the filters through DataFusion's own
            // pushdown (its filters above a `UnionExec` go down both sides); the key merge
            // passes none down, so the lake scan under one is handed them here (handed
            // both, it would prune with each filter twice). Pruning is an optimization: a
            // filter DataFusion cannot plan over the table's columns prunes nothing and is
            // still applied above the scan.
            // A distributed read's lake scans are out of the optimizer's sight, inside
            // its tasks: they are handed the filters too.
            predicate: match merges || distributed {
                true => physical(state, table.schema(), pruning).ok().flatten(),
                false => None,
            },
            lake_first: false,
        };
        let mut plan = match distributed && !splits.is_empty() {
            true => in_tasks(&scan, state, &splits).await?,
            false => scan.plan(&state.task_ctx(), &splits).await?,
        };
        let output: Vec<usize> = std::mem::take(&mut reader.output);
        if !untiered_splits.is_empty() {
            // The KV stores' rows in the read schema, filtered above with the rest.
            reader.output = (0..reader.read_schema.fields().len()).collect();
            reader.filters.clear();
            let kv_splits = untiered_splits
                .into_iter()
                .map(|split| Split {
                    bucket: split.bucket,
                    source: SplitSource::KvSnapshot,
                })
                .collect();
            let kv = MinkScanExec::try_new(reader, kv_splits)?;
            plan = UnionExec::try_new(vec![Arc::new(kv), plan])?;
        }
        let exact = physical(state, &plan.schema(), exact)?;
        filter_and_project(plan, exact, output)
    }
}

/// The read of `splits` as a [`UnionTasksExec`]: one plan per bucket, all in one task
/// until the distributed planner deals them to more.
async fn in_tasks(
    scan: &UnionScan<'_>,
    state: &dyn Session,
    splits: &[UnionSplit],
) -> Result<Arc<dyn ExecutionPlan>> {
    let context = state.task_ctx();
    let mut buckets = Vec::with_capacity(splits.len());
    for split in splits {
        buckets.push(BucketRead {
            bucket: split.bucket.clone(),
            rows: split.lake.record_count() + split.plan.log_to.abs_diff(split.plan.log_from),
            plan: scan.plan(&context, std::slice::from_ref(split)).await?,
        });
    }
    let table = scan.table.path.to_string();
    Ok(Arc::new(UnionTasksExec::try_new(table, buckets, 1)?))
}

/// Whether a union split has a log range but no lake snapshot below it: nothing of the
/// bucket is tiered yet (a `t$lake` read has no range).
fn untiered(plan: &UnionPlan) -> bool {
    plan.snapshot_id.is_none() && plan.log_range_len() > 0
}

/// The conjunction of `filters` as a physical expression over `schema`; their columns'
/// table qualifiers are dropped (the schema has none).
fn physical(
    state: &dyn Session,
    schema: &arrow::datatypes::SchemaRef,
    filters: Vec<Expr>,
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let unqualified = filters
        .into_iter()
        .map(|filter| {
            filter
                .transform(|expr| match expr {
                    Expr::Column(column) => Ok(Transformed::yes(Expr::Column(
                        datafusion::common::Column::new_unqualified(column.name),
                    ))),
                    other => Ok(Transformed::no(other)),
                })
                .map(|transformed| transformed.data)
        })
        .collect::<Result<Vec<_>>>()?;
    let Some(predicate) = conjunction(unqualified) else {
        return Ok(None);
    };
    let schema = DFSchema::try_from(schema.as_ref().clone())?;
    state.create_physical_expr(predicate, &schema).map(Some)
}
