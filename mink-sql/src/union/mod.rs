//! The union read as a tree of plan nodes (`spec/union-read.md`):
//!
//! ```text
//!   FilterExec (the filters the scan took, exact; projection to the statement's columns)
//!     KeyMergeExec                        primary-key table: lake minus changed keys, then
//!       DataSourceExec (ParquetSource)      the tails' live rows
//!       LogTailExec
//!   or UnionExec(DataSourceExec, LogTailExec)   log table: lake rows, then tail rows
//! ```
//!
//! The lake side is DataFusion's own Parquet scan ([`lake_scan`]), pruned by every filter
//! the statement pushed (row groups, pages, bloom filters), with Iceberg's position deletes
//! as row selections; the tail side reads each bucket's log from its leader
//! ([`tail`]); the merge ([`merge`]) drops the lake rows whose key a tail changed. The
//! buckets of a primary-key table that nothing was tiered from yet are read from their KV
//! stores (a [`MinkScanExec`] beside the merge), where a merge would fold their whole
//! changelog in memory. `EXPLAIN ANALYZE` shows each node with its counters.
//!
//! Equality deletes (written by other engines, never by mink) are applied by an
//! `EqualityDeleteExec` over the lake files they apply to ([`equality`]).

pub(crate) mod equality;
pub(crate) mod lake_scan;
pub(crate) mod merge;
pub(crate) mod tail;

use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::filter::FilterExecBuilder;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;
use mink_core::key::KeyCodec;
use mink_core::protocol::{BucketId, UnionPlan};
use mink_lake::reader::LakeSplit;

use self::lake_scan::LakeScan;
use self::merge::KeyMergeExec;
use self::tail::{LogTailExec, TailRange};
use crate::exec::MinkScanExec;
use crate::split::{Split, SplitReader, SplitSource, external};

/// One bucket's union split: its plan (seam, log range) and its lake files.
#[derive(Debug, Clone)]
pub(crate) struct UnionSplit {
    pub(crate) bucket: BucketId,
    pub(crate) plan: UnionPlan,
    pub(crate) lake: LakeSplit,
}

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
        let table_schema = Arc::clone(table.schema());
        let read_schema = Arc::clone(&reader.read_schema);
        let columns = reader.read_columns();
        let projection: Vec<usize> = columns.iter().map(|&i| i as usize).collect();
        // A bucket with nothing tiered yet is read from its KV store.
        let (untiered_splits, splits): (Vec<UnionSplit>, Vec<UnionSplit>) = splits
            .into_iter()
            .partition(|split| table.has_primary_key() && untiered(&split.plan));
        let mut lakes: Vec<&LakeSplit> = Vec::new();
        let mut ranges = Vec::new();
        for UnionSplit { bucket, plan, lake } in &splits {
            check_files(&reader, lake)?;
            lakes.push(lake);
            if plan.log_to > plan.log_from {
                ranges.push(TailRange {
                    bucket: bucket.clone(),
                    from: plan.log_from,
                    to: plan.log_to,
                });
            }
        }
        let lake = LakeScan {
            storage: &reader.storage,
            table_schema: Arc::clone(&table_schema),
            projection,
            // A log table's filters reach the scan through DataFusion's own pushdown (its
            // filters above a `UnionExec` go down both sides); the key merge passes none
            // down, so a primary-key table's lake scan is handed them here. Pruning is an
            // optimization: a filter DataFusion cannot plan over the table's columns prunes
            // nothing and is still applied above the scan.
            predicate: match table.has_primary_key() {
                true => physical(state, &table_schema, pruning).ok().flatten(),
                false => None,
            },
        }
        .plan(state, &lakes)
        .await?;
        let mut plan = match (ranges.is_empty(), table.has_primary_key()) {
            (true, _) => lake,
            (false, true) => {
                let tail = LogTailExec::new(
                    reader.client.clone(),
                    ranges,
                    columns,
                    Arc::clone(&read_schema),
                    true,
                );
                let codec = Arc::new(KeyCodec::new(&table).map_err(external)?);
                Arc::new(KeyMergeExec::new(lake, Arc::new(tail), codec))
            }
            (false, false) => {
                let tail =
                    LogTailExec::new(reader.client.clone(), ranges, columns, read_schema, false);
                UnionExec::try_new(vec![lake, Arc::new(tail)])?
            }
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

/// Whether a union split has a tail but no lake snapshot below it: nothing of the
/// bucket is tiered yet (a `t$lake` read has no tail).
fn untiered(plan: &UnionPlan) -> bool {
    plan.snapshot_id.is_none() && plan.log_to > plan.log_from
}

/// `plan`'s rows that pass `predicate`, in its columns `output`.
fn filter_and_project(
    plan: Arc<dyn ExecutionPlan>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    output: Vec<usize>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = plan.schema();
    match predicate {
        Some(predicate) => Ok(Arc::new(
            FilterExecBuilder::new(predicate, plan)
                .apply_projection(Some(output))?
                .build()?,
        )),
        None if output.len() == schema.fields().len() => Ok(plan),
        None => {
            let columns = output.iter().map(|&i| {
                let name = schema.field(i).name().clone();
                let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(&name, i));
                (column, name)
            });
            Ok(Arc::new(ProjectionExec::try_new(columns, plan)?))
        }
    }
}

/// The node names the files; none outside the table's location is read.
pub(crate) fn check_files(reader: &SplitReader, lake: &LakeSplit) -> Result<()> {
    for file in &lake.files {
        let deletes = file.deletes.iter().map(|d| d.path.as_str());
        for path in std::iter::once(file.path.as_str()).chain(deletes) {
            reader
                .storage
                .check_table_file(&reader.table.path, path)
                .map_err(external)?;
        }
    }
    Ok(())
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
