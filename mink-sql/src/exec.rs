//! `MinkScanExec`: a scan of a mink table's KV stores or logs, one partition per bucket
//! (a split): a primary-key table's Snapshot, LimitScan and lookups, and `t$changelog`.
//! Union reads are plan nodes of their own (`crate::union`).
//!
//! The KV reads see each bucket's store as it is when their partition first polls; a
//! changelog's range is fixed when the scan is planned. `execute` does no I/O: each
//! partition's stream opens its split on its first poll (see [`crate::split`]).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};

use crate::split::{Split, SplitMetrics, SplitReader, SplitSource, changelog_schema};

/// A scan of a mink table: partition `i` reads split `i`.
#[derive(Debug)]
pub struct MinkScanExec {
    reader: Arc<SplitReader>,
    splits: Vec<Split>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl MinkScanExec {
    pub(crate) fn try_new(reader: SplitReader, splits: Vec<Split>) -> Result<Self> {
        let emitted = match reader.changelog {
            true => Arc::new(changelog_schema(&reader.read_schema)),
            false => Arc::clone(&reader.read_schema),
        };
        let schema = Arc::new(emitted.project(&reader.output)?);
        // Our own bucketing is not DataFusion's hash partitioning: declare none.
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(splits.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            reader: Arc::new(reader),
            splits,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for MinkScanExec {
    /// `EXPLAIN` shows the table, the pushed filters and what the splits read in total
    /// (stable across runs); `EXPLAIN VERBOSE` each split, with its lake snapshot.
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reader = &self.reader;
        write!(f, "MinkScanExec: table={}", reader.table.path)?;
        if reader.changelog {
            write!(f, ", changelog")?;
        }
        if !reader.filters.is_empty() {
            let filters: Vec<String> = reader.filters.iter().map(describe_filter).collect();
            write!(f, ", filters=[{}]", filters.join(" AND "))?;
        }
        if matches!(format, DisplayFormatType::Verbose) {
            let splits: Vec<String> = self.splits.iter().map(describe_split).collect();
            return write!(f, ", splits=[{}]", splits.join("; "));
        }
        write!(f, ", {}", describe_totals(&self.splits))
    }
}

/// What the splits of one scan read, summed (they all read the same way).
fn describe_totals(splits: &[Split]) -> String {
    let count = splits.len();
    let (mut log_rows, mut keys) = (0, 0);
    for split in splits {
        match &split.source {
            SplitSource::Changelog { from, to } => log_rows += to - from,
            SplitSource::Lookup { keys: batch } => keys += batch.num_rows(),
            SplitSource::KvSnapshot | SplitSource::LimitScan { .. } => {}
        }
    }
    match splits.first().map(|split| &split.source) {
        Some(SplitSource::KvSnapshot) => format!("kv snapshot, splits={count}"),
        Some(SplitSource::LimitScan { limit }) => format!("limit scan={limit}, splits={count}"),
        Some(SplitSource::Lookup { .. }) => format!("lookup keys={keys}, splits={count}"),
        Some(SplitSource::Changelog { .. }) => format!("splits={count}, log_rows={log_rows}"),
        None => "splits=0".to_string(),
    }
}

fn describe_split(split: &Split) -> String {
    let bucket = &split.bucket;
    match &split.source {
        SplitSource::KvSnapshot => format!("{bucket}: kv snapshot"),
        SplitSource::LimitScan { limit } => format!("{bucket}: limit scan={limit}"),
        SplitSource::Lookup { keys } => format!("{bucket}: lookup keys={}", keys.num_rows()),
        SplitSource::Changelog { from, to } => format!("{bucket}: log=[{from}, {to})"),
    }
}

fn describe_filter(filter: &mink_core::filter::ColumnFilter) -> String {
    use mink_core::filter::FilterOp;
    let op = match filter.operator() {
        Ok(FilterOp::Eq) => "=",
        Ok(FilterOp::NotEq) => "<>",
        Ok(FilterOp::Lt) => "<",
        Ok(FilterOp::LtEq) => "<=",
        Ok(FilterOp::Gt) => ">",
        Ok(FilterOp::GtEq) => ">=",
        Ok(FilterOp::IsNull) => "IS NULL",
        Ok(FilterOp::IsNotNull) => "IS NOT NULL",
        Err(_) => "?",
    };
    match &filter.value {
        Some(value) => format!("{} {op} {value}", filter.column),
        None => format!("{} {op}", filter.column),
    }
}

impl ExecutionPlan for MinkScanExec {
    fn name(&self) -> &str {
        "MinkScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let metrics = SplitMetrics {
            kv_rows: MetricBuilder::new(&self.metrics).counter("kv_rows", partition),
            log_rows: MetricBuilder::new(&self.metrics).counter("log_rows", partition),
        };
        let stream = match self.splits.get(partition) {
            Some(split) => Arc::clone(&self.reader).read(split.clone(), metrics),
            // A table without buckets is planned as one empty partition.
            None => Box::pin(futures::stream::empty()),
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
