//! `LogRangeExec`: the log ranges of a union read, one partition per bucket.
//!
//! Partition `i` reads bucket `i`'s log `[from, to)` from a [`LogSource`] and emits it in
//! log order, in the read schema (batches written under older schema versions are
//! normalized to it). What its rows are ([`LogRangeRows`]): a log table's rows; a primary-key
//! table's changes, each row with its change type ([`CHANGE_TYPE_COLUMN`], the byte of
//! [`mink_core::change::ChangeType`]) for the key merge above it to fold; or a
//! primary-key table's live rows, the changes already folded by key where the log lives
//! (the bucket's leader), so the merge above only appends them.
//!
//! The source is what differs between the two places a union read runs: the bucket
//! leader reads its own log tablets, the SQL engine reads the leader with Flight Scans
//! (with the session's login). The plan above it is the same.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt8Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_common::{DataFusionError, Result};
use datafusion_execution::TaskContext;
use datafusion_physical_expr::EquivalenceProperties;
use datafusion_physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion_physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion_physical_plan::stream::RecordBatchStreamAdapter;
use datafusion_physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;

use crate::external;

/// The column a primary-key range adds after the read schema's: each row's change type.
pub const CHANGE_TYPE_COLUMN: &str = "__mink_change_type";

/// One bucket's log range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRange {
    pub bucket: BucketId,
    pub from: i64,
    pub to: i64,
}

/// A batch of a log range, inside its range.
#[derive(Debug)]
pub struct LogRangeBatch {
    /// The rows, in the schema version they were written with (or already projected).
    pub rows: RecordBatch,
    /// The change vector; empty for a log table.
    pub changes: Vec<u8>,
    pub base_offset: i64,
    pub commit_timestamp: i64,
}

/// Where a log range is read from: the leader's own tablets or a Flight Scan of it.
pub trait LogSource: fmt::Debug + Send + Sync {
    /// The log `range` of its bucket, in log order, trimmed to the range; `columns` (by
    /// index in the table's current schema) are the ones the read needs, a hint the
    /// source may use to send less. A log that ends before `range.to` is an error.
    fn read(&self, range: &LogRange, columns: &[u32]) -> BoxStream<'static, Result<LogRangeBatch>>;

    /// The live rows of a primary-key table's log `range`, folded by key: for each key
    /// the range changes, its last change when that is `+I` or `+U`, in log order,
    /// columns `columns` of the table (in the schema they were written with, or the
    /// current one).
    fn read_live(
        &self,
        range: &LogRange,
        columns: &[u32],
    ) -> BoxStream<'static, Result<RecordBatch>>;
}

/// What the rows of a log range are (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogRangeRows {
    /// A log table's rows, as logged.
    Log,
    /// A primary-key table's changes, each with its change type ([`CHANGE_TYPE_COLUMN`]).
    Changes,
    /// A primary-key table's live rows, folded by key by the source
    /// ([`LogSource::read_live`]).
    Live,
}

impl LogRangeRows {
    fn name(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Changes => "changes",
            Self::Live => "live",
        }
    }
}

/// The log ranges of some buckets (see the module docs).
#[derive(Debug)]
pub struct LogRangeExec {
    source: Arc<dyn LogSource>,
    ranges: Vec<LogRange>,
    /// The read schema's columns, by index in the table.
    columns: Vec<u32>,
    read_schema: SchemaRef,
    rows: LogRangeRows,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl LogRangeExec {
    /// The log ranges `ranges` in `read_schema` (columns `columns` of the table), as `rows`.
    pub fn new(
        source: Arc<dyn LogSource>,
        ranges: Vec<LogRange>,
        columns: Vec<u32>,
        read_schema: SchemaRef,
        rows: LogRangeRows,
    ) -> Self {
        let schema = match rows {
            LogRangeRows::Changes => Arc::new(with_change_type(&read_schema)),
            LogRangeRows::Log | LogRangeRows::Live => Arc::clone(&read_schema),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(ranges.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Self {
            source,
            ranges,
            columns,
            read_schema,
            rows,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl LogRangeExec {
    /// The log ranges read, one partition each.
    pub fn ranges(&self) -> &[LogRange] {
        &self.ranges
    }

    /// The read schema's columns, by index in the table.
    pub fn columns(&self) -> &[u32] {
        &self.columns
    }

    /// The rows' schema, without the change type.
    pub fn read_schema(&self) -> &SchemaRef {
        &self.read_schema
    }

    /// What its rows are.
    pub fn rows(&self) -> LogRangeRows {
        self.rows
    }
}

/// `schema` with [`CHANGE_TYPE_COLUMN`] after its columns.
fn with_change_type(schema: &Schema) -> Schema {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_TYPE_COLUMN, DataType::UInt8, false));
    Schema::new(fields)
}

impl DisplayAs for LogRangeExec {
    /// `EXPLAIN` shows how many buckets and log rows, and what its rows are; `EXPLAIN
    /// VERBOSE` each range.
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log_rows: i64 = self.ranges.iter().map(|r| r.to - r.from).sum();
        write!(
            f,
            "LogRangeExec: buckets={}, log_rows={log_rows}, rows={}",
            self.ranges.len(),
            self.rows.name()
        )?;
        if matches!(format, DisplayFormatType::Verbose) {
            let ranges: Vec<String> = self
                .ranges
                .iter()
                .map(|r| format!("{}: [{}, {})", r.bucket, r.from, r.to))
                .collect();
            write!(f, ", ranges=[{}]", ranges.join("; "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for LogRangeExec {
    fn name(&self) -> &str {
        "LogRangeExec"
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
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let stream = match self.ranges.get(partition) {
            Some(range) => {
                let read_schema = Arc::clone(&self.read_schema);
                let emitted = match self.rows {
                    LogRangeRows::Live => self
                        .source
                        .read_live(range, &self.columns)
                        .map(move |rows| normalize_batch(&rows?, &read_schema).map_err(external))
                        .boxed(),
                    rows => {
                        let schema = Arc::clone(&self.schema);
                        let with_changes = rows == LogRangeRows::Changes;
                        self.source
                            .read(range, &self.columns)
                            .map(move |batch| batch?.emit(&read_schema, &schema, with_changes))
                            .boxed()
                    }
                };
                emitted
                    .inspect_ok(move |batch| metrics.record_output(batch.num_rows()))
                    .boxed()
            }
            // No bucket has a log range: one empty partition.
            None => stream::empty().boxed(),
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

impl LogRangeBatch {
    /// The rows in `read_schema`, with their change types when `with_changes` (`schema`
    /// is then the read schema and the change column).
    fn emit(
        self,
        read_schema: &SchemaRef,
        schema: &SchemaRef,
        with_changes: bool,
    ) -> Result<RecordBatch> {
        let rows = normalize_batch(&self.rows, read_schema).map_err(external)?;
        if !with_changes {
            return Ok(rows);
        }
        if self.changes.len() != rows.num_rows() {
            return Err(DataFusionError::Execution(format!(
                "a log batch at offset {} of {} rows has {} change types",
                self.base_offset,
                rows.num_rows(),
                self.changes.len()
            )));
        }
        let mut columns = rows.columns().to_vec();
        columns.push(Arc::new(UInt8Array::from(self.changes)) as ArrayRef);
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}
