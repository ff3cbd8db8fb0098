//! Building a union read's tree from a table's planned splits (see the crate docs).
//!
//! [`UnionScan::plan`] returns the rows of the splits in the read schema, lake and tail
//! combined; [`filter_and_project`] puts the exact filters and the final projection on
//! top. What differs between the node and the engine is handed in: the log source, the
//! pruning predicate (the engine's optimizer pushes a log table's filters into the scan
//! itself), and whether the tail must follow the whole lake.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion_common::{DataFusionError, Result};
use datafusion_execution::TaskContext;
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::expressions::Column;
use datafusion_physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion_physical_plan::empty::EmptyExec;
use datafusion_physical_plan::filter::FilterExecBuilder;
use datafusion_physical_plan::projection::ProjectionExec;
use datafusion_physical_plan::union::UnionExec;
use datafusion_physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::filter::ColumnFilter;
use mink_core::key::{KeyCodec, key_columns};
use mink_core::protocol::{BucketId, UnionPlan};
use mink_core::table::TableDescriptor;
use mink_lake::reader::LakeSplit;
use mink_lake::storage::LakeStorage;

use crate::external;
use crate::lake_scan::LakeScan;
use crate::merge::KeyMergeExec;
use crate::tail::{LogSource, LogTailExec, TailRange};

/// One bucket's union split: its plan (seam, log range) and its lake files.
#[derive(Debug, Clone)]
pub struct UnionSplit {
    pub bucket: BucketId,
    pub plan: UnionPlan,
    pub lake: LakeSplit,
}

/// What a union read's tree is built from.
#[derive(Debug)]
pub struct UnionScan<'a> {
    pub table: &'a TableDescriptor,
    /// Where the lake files are read from; `None` when no split has any (the lake of a
    /// node whose tables have none is never opened).
    pub storage: Option<&'a LakeStorage>,
    pub log: Arc<dyn LogSource>,
    /// The read schema's columns, by index in the table: the projection, then the
    /// filter and (for a primary-key table) key columns it lacks.
    pub columns: Vec<u32>,
    /// Prunes the lake's files, row groups and pages (over the table's schema); rows are
    /// not filtered by it.
    pub predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Emit every lake row before the first tail row (the Union ticket's order: the lake
    /// partitions are read concurrently into one). Without it, each output partition
    /// emits its share of the lake, then its share of the tail.
    pub lake_first: bool,
}

impl UnionScan<'_> {
    /// The rows of `splits` in the read schema: a primary-key table's lake rows minus the
    /// keys their tails changed, then the tails' live rows; a log table's lake rows, then
    /// its tails.
    ///
    /// # Errors
    /// A lake file outside the table's location; a delete file or footer that cannot be
    /// read.
    pub async fn plan(
        &self,
        context: &TaskContext,
        splits: &[UnionSplit],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let lakes: Vec<&LakeSplit> = splits.iter().map(|split| &split.lake).collect();
        let mut lake = self.lake(context, &lakes).await?;
        let ranges: Vec<TailRange> = splits
            .iter()
            .filter(|split| split.plan.log_to > split.plan.log_from)
            .map(|split| TailRange {
                bucket: split.bucket.clone(),
                from: split.plan.log_from,
                to: split.plan.log_to,
            })
            .collect();
        if ranges.is_empty() {
            return Ok(lake);
        }
        if self.lake_first && lake.output_partitioning().partition_count() > 1 {
            lake = Arc::new(CoalescePartitionsExec::new(lake));
        }
        let keyed = self.table.has_primary_key();
        let tail = Arc::new(LogTailExec::new(
            Arc::clone(&self.log),
            ranges,
            self.columns.clone(),
            lake.schema(),
            keyed,
        ));
        match keyed {
            true => {
                let codec = Arc::new(KeyCodec::new(self.table).map_err(external)?);
                Ok(Arc::new(KeyMergeExec::new(lake, tail, codec)))
            }
            false => UnionExec::try_new(vec![lake, tail]),
        }
    }

    /// The lake rows of `lakes` alone, in the read schema (a Lake ticket, `t$lake`).
    ///
    /// # Errors
    /// As [`Self::plan`].
    pub async fn lake(
        &self,
        context: &TaskContext,
        lakes: &[&LakeSplit],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table_schema = Arc::clone(self.table.schema());
        let projection: Vec<usize> = self.columns.iter().map(|&i| i as usize).collect();
        let Some(storage) = self.storage else {
            if lakes.iter().any(|lake| !lake.files.is_empty()) {
                return Err(DataFusionError::Internal(
                    "lake files to read without the lake's storage".into(),
                ));
            }
            return Ok(Arc::new(EmptyExec::new(Arc::new(
                table_schema.project(&projection)?,
            ))));
        };
        for lake in lakes {
            check_files(storage, self.table, lake)?;
        }
        LakeScan {
            storage,
            table_schema,
            projection,
            predicate: self.predicate.clone(),
        }
        .plan(context, lakes)
        .await
    }
}

/// The columns a read of `table` reads, by index in the table: the `projection`, then the
/// columns `filters` name and, for a read that merges a primary-key table's tails
/// (`merged`), the key columns the merge needs, each once.
///
/// # Errors
/// A filter on a column the table lacks.
pub fn read_columns(
    table: &TableDescriptor,
    projection: &[usize],
    filters: &[ColumnFilter],
    merged: bool,
) -> Result<Vec<usize>> {
    let mut columns = projection.to_vec();
    let merge_columns = match merged {
        true => key_columns(table),
        false => Vec::new(),
    };
    let filter_columns = filters.iter().map(|filter| filter.column.clone());
    for column in filter_columns.chain(merge_columns) {
        let index = table.schema().index_of(&column)?;
        if !columns.contains(&index) {
            columns.push(index);
        }
    }
    Ok(columns)
}

/// The node names the files; none outside the table's location is read.
///
/// # Errors
/// A data or delete file outside the table's location.
pub fn check_files(storage: &LakeStorage, table: &TableDescriptor, lake: &LakeSplit) -> Result<()> {
    for file in &lake.files {
        let deletes = file.deletes.iter().map(|d| d.path.as_str());
        for path in std::iter::once(file.path.as_str()).chain(deletes) {
            storage
                .check_table_file(&table.path, path)
                .map_err(external)?;
        }
    }
    Ok(())
}

/// `plan`'s rows that pass `predicate`, in its columns `output`.
///
/// # Errors
/// A predicate that is not boolean over `plan`'s schema.
pub fn filter_and_project(
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

/// Every row of `plan`, its partitions executed one after another (each only once the
/// one before it ends): the order a Union ticket answers in, whose tail partition comes
/// after the lake's.
pub fn execute_in_order(
    plan: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let partitions = plan.output_partitioning().partition_count();
    stream::iter(0..partitions)
        .map(move |partition| plan.execute(partition, Arc::clone(&context)))
        .try_flatten()
        .boxed()
}
