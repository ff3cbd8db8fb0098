//! Building a union read's tree from a table's planned splits (see the crate docs).
//!
//! [`UnionScan::plan`] returns the rows of the splits in the read schema, lake and range
//! combined; [`filter_and_project`] puts the exact filters and the final projection on
//! top. What differs between the node and the engine is handed in: the log source, the
//! pruning predicate (the engine's optimizer pushes a log table's filters into the scan
//! itself), and whether the log range must follow the whole lake.

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
use mink_core::protocol::{BucketId, MAX_LIVE_RANGE_ROWS, UnionPlan};
use mink_core::table::TableDescriptor;
use mink_lake::reader::LakeSplit;
use mink_lake::storage::LakeStorage;
use mink_lake::upkeep::leases::{Lease, location_of_file};

use crate::external;
use crate::lake_scan::LakeScan;
use crate::log_range::{LogRange, LogRangeExec, LogRangeRows, LogSource};
use crate::merge::{KeyMergeExec, LakeMerge};

/// One bucket's union split: its plan (seam, log range) and its lake files.
#[derive(Debug, Clone)]
pub struct UnionSplit {
    pub bucket: BucketId,
    pub plan: UnionPlan,
    pub lake: LakeSplit,
}

impl UnionSplit {
    /// The split's lake alone, as of its snapshot (a `t$lake` read): no log range, so no
    /// lake row is replaced.
    #[must_use]
    pub fn without_log_range(mut self) -> Self {
        self.plan.log_to = self.plan.log_from;
        self.plan.replaced_rows_located = false;
        for file in &mut self.lake.files {
            file.replaced_rows.clear();
        }
        self
    }
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
    /// filter columns it lacks ([`read_columns`]). A key merge reads the key columns
    /// besides where it needs them, and outputs these.
    pub columns: Vec<u32>,
    /// Prunes the lake's files, row groups and pages (over the table's schema); rows are
    /// not filtered by it.
    pub predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Emit every lake row before the first range row (the Union ticket's order: the lake
    /// partitions are read concurrently into one). Without it, each output partition
    /// emits its share of the lake, then its share of the log range.
    pub lake_first: bool,
}

impl UnionScan<'_> {
    /// The rows of `splits` in the read schema: a primary-key table's lake rows minus the
    /// keys their ranges changed, then the log ranges' live rows; a log table's lake rows, then
    /// its ranges.
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
        let ranges: Vec<LogRange> = splits
            .iter()
            .filter(|split| split.plan.log_range_len() > 0)
            .map(|split| LogRange {
                bucket: split.bucket.clone(),
                from: split.plan.log_from,
                to: split.plan.log_to,
            })
            .collect();
        if ranges.is_empty() {
            return self.lake_columns(context, &lakes, &self.columns).await;
        }
        if !self.table.has_primary_key() {
            let lake = self.lake_columns(context, &lakes, &self.columns).await?;
            let log_side = self.log_side(ranges, self.columns.clone(), LogRangeRows::Log)?;
            return UnionExec::try_new(vec![self.ordered(lake), log_side]);
        }
        let located = splits.iter().all(|split| {
            split.plan.replaced_rows_located
                || split.plan.log_to <= split.plan.log_from
                || split.lake.files.is_empty()
        });
        // A leader folds at most MAX_LIVE_RANGE_ROWS of a bucket's log at a time; a longer
        // range (a bucket with no lake files yet can have any) is folded here.
        let foldable = ranges.iter().all(|r| r.to - r.from <= MAX_LIVE_RANGE_ROWS);
        let (merge, lake, log_side) = match located && foldable {
            // The lake scan leaves the replaced rows out and the leaders fold their
            // ranges: neither side needs the key columns.
            true => {
                let lake = self.lake_columns(context, &lakes, &self.columns).await?;
                let log_side = self.log_side(ranges, self.columns.clone(), LogRangeRows::Live)?;
                (LakeMerge::Positions, lake, log_side)
            }
            // The log range carries the key columns for the fold, and the lake for the probe
            // (lake rows already left out by position are simply not found).
            false => {
                let mut keyed_columns = self.columns.clone();
                for column in key_columns(self.table) {
                    let index = self.table.schema().index_of(&column)? as u32;
                    if !keyed_columns.contains(&index) {
                        keyed_columns.push(index);
                    }
                }
                let lake = self.lake_columns(context, &lakes, &keyed_columns).await?;
                let log_side = self.log_side(ranges, keyed_columns, LogRangeRows::Changes)?;
                (LakeMerge::Probe, lake, log_side)
            }
        };
        let codec = Arc::new(KeyCodec::new(self.table).map_err(external)?);
        let columns = self.columns.len();
        let merged = KeyMergeExec::try_new(self.ordered(lake), log_side, codec, merge, columns)?;
        Ok(Arc::new(merged))
    }

    /// The read's log side: a `LogRangeExec` over `ranges`, columns `columns` of the table, as
    /// `rows`.
    fn log_side(
        &self,
        ranges: Vec<LogRange>,
        columns: Vec<u32>,
        rows: LogRangeRows,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let indices: Vec<usize> = columns.iter().map(|&i| i as usize).collect();
        let read_schema = Arc::new(self.table.schema().project(&indices)?);
        let log = Arc::clone(&self.log);
        let log_side = LogRangeExec::new(log, ranges, columns, read_schema, rows);
        Ok(Arc::new(log_side))
    }

    /// `lake` in one partition when its rows must all come before the log range's.
    fn ordered(&self, lake: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        match self.lake_first && lake.output_partitioning().partition_count() > 1 {
            true => Arc::new(CoalescePartitionsExec::new(lake)),
            false => lake,
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
        self.lake_columns(context, lakes, &self.columns).await
    }

    /// The lake rows of `lakes`, columns `columns` of the table.
    async fn lake_columns(
        &self,
        context: &TaskContext,
        lakes: &[&LakeSplit],
        columns: &[u32],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table_schema = Arc::clone(self.table.schema());
        let projection: Vec<usize> = columns.iter().map(|&i| i as usize).collect();
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
        let leases = take_leases(storage, self.table, lakes);
        LakeScan {
            storage,
            table_schema,
            projection,
            predicate: self.predicate.clone(),
        }
        .plan_holding(context, lakes, leases)
        .await
    }
}

/// Leases on the snapshots of `lakes` that have files: the scan's plan holds them, so
/// that upkeep keeps the files while the read runs ([`mink_lake::upkeep::leases`]).
fn take_leases(storage: &LakeStorage, table: &TableDescriptor, lakes: &[&LakeSplit]) -> Vec<Lease> {
    let path = &table.path;
    let mut leases: Vec<(String, i64)> = lakes
        .iter()
        .filter_map(|lake| {
            let file = lake.files.first()?;
            let location = location_of_file(&path.database, &path.name, &file.path)?;
            Some((location, lake.snapshot_id?))
        })
        .collect();
    leases.sort_unstable();
    leases.dedup();
    leases
        .into_iter()
        .map(|(location, snapshot_id)| Lease::take(storage, &location, snapshot_id))
        .collect()
}

/// The columns a read of `table` reads, by index in the table: the `projection`, then the
/// columns `filters` name, each once.
///
/// # Errors
/// A filter on a column the table lacks.
pub fn read_columns(
    table: &TableDescriptor,
    projection: &[usize],
    filters: &[ColumnFilter],
) -> Result<Vec<usize>> {
    let mut columns = projection.to_vec();
    for filter in filters {
        let index = table.schema().index_of(&filter.column)?;
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
/// one before it ends): the order a Union ticket answers in, whose range partition comes
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

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion_physical_plan::displayable;
    use mink_core::options::TableOptions;
    use mink_core::table::TablePath;

    use super::*;
    use crate::log_range::LogRangeBatch;

    /// A log source no test reads: plans are only built.
    #[derive(Debug)]
    struct Unread;

    impl LogSource for Unread {
        fn read(&self, _: &LogRange, _: &[u32]) -> BoxStream<'static, Result<LogRangeBatch>> {
            stream::empty().boxed()
        }

        fn read_live(&self, _: &LogRange, _: &[u32]) -> BoxStream<'static, Result<RecordBatch>> {
            stream::empty().boxed()
        }
    }

    fn split(bucket: u32, log_to: i64) -> UnionSplit {
        let table = TablePath::new("db", "t");
        UnionSplit {
            bucket: BucketId::new(&table, bucket),
            plan: UnionPlan {
                snapshot_id: Some(1),
                log_to,
                replaced_rows_located: true,
                ..UnionPlan::default()
            },
            lake: LakeSplit::default(),
        }
    }

    #[tokio::test]
    async fn tails_a_leader_can_fold_come_live_and_longer_ones_are_folded_here() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]);
        let options = TableOptions {
            bucket_num: 2,
            ..TableOptions::default()
        };
        let table = TableDescriptor::new(
            TablePath::new("db", "t"),
            schema,
            vec!["id".into()],
            Vec::new(),
            options,
        )
        .unwrap();
        let scan = UnionScan {
            table: &table,
            storage: None,
            log: Arc::new(Unread),
            columns: vec![1],
            predicate: None,
            lake_first: false,
        };
        let context = TaskContext::default();
        let plan = |splits: Vec<UnionSplit>| {
            let (scan, context) = (&scan, &context);
            async move {
                let plan = scan.plan(context, &splits).await.unwrap();
                displayable(plan.as_ref()).indent(true).to_string()
            }
        };
        let short = plan(vec![split(0, 10), split(1, MAX_LIVE_RANGE_ROWS)]).await;
        assert!(short.contains("lake_merge=positions"), "{short}");
        assert!(short.contains("rows=live"), "{short}");
        let long = plan(vec![split(0, 10), split(1, MAX_LIVE_RANGE_ROWS + 1)]).await;
        assert!(long.contains("lake_merge=probe"), "{long}");
        assert!(long.contains("rows=changes"), "{long}");
    }
}
