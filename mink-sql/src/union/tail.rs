//! `LogTailExec`: the log tails of a union read, one partition per bucket.
//!
//! Partition `i` reads bucket `i`'s log `[from, to)` from its leader with Flight Scans
//! (the session's client, so its login), trims the answer's batches to the range and
//! emits them in log order, in the read schema. For a primary-key table each row also
//! carries its change type ([`CHANGE_TYPE_COLUMN`], the byte of
//! [`mink_core::change::ChangeType`]), which the key merge above it needs.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt8Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_client::{ClientError, MinkClient, ReadBatch};
use mink_core::protocol::BucketId;
use mink_core::schema::normalize_batch;

use crate::split::external;

/// Bytes of log asked for per Scan of a tail.
const TAIL_SCAN_BYTES: u64 = 8 << 20;

/// The column a primary-key tail adds after the read schema's: each row's change type.
pub(crate) const CHANGE_TYPE_COLUMN: &str = "__mink_change_type";

/// One bucket's log range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TailRange {
    pub(crate) bucket: BucketId,
    pub(crate) from: i64,
    pub(crate) to: i64,
}

/// The log tails of some buckets (see the module docs).
#[derive(Debug)]
pub(crate) struct LogTailExec {
    client: MinkClient,
    ranges: Vec<TailRange>,
    /// The read schema's columns, by index in the table (what Scan asks for).
    columns: Vec<u32>,
    read_schema: SchemaRef,
    with_changes: bool,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl LogTailExec {
    /// The tails `ranges` in `read_schema` (columns `columns` of the table), with each
    /// row's change type when `with_changes`.
    pub(crate) fn new(
        client: MinkClient,
        ranges: Vec<TailRange>,
        columns: Vec<u32>,
        read_schema: SchemaRef,
        with_changes: bool,
    ) -> Self {
        let schema = match with_changes {
            true => Arc::new(with_change_type(&read_schema)),
            false => Arc::clone(&read_schema),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(ranges.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Self {
            client,
            ranges,
            columns,
            read_schema,
            with_changes,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

/// `schema` with [`CHANGE_TYPE_COLUMN`] after its columns.
fn with_change_type(schema: &Schema) -> Schema {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_TYPE_COLUMN, DataType::UInt8, false));
    Schema::new(fields)
}

impl DisplayAs for LogTailExec {
    /// `EXPLAIN` shows how many buckets and log rows; `EXPLAIN VERBOSE` each range.
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: i64 = self.ranges.iter().map(|r| r.to - r.from).sum();
        write!(
            f,
            "LogTailExec: buckets={}, log_rows={rows}",
            self.ranges.len()
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

impl ExecutionPlan for LogTailExec {
    fn name(&self) -> &str {
        "LogTailExec"
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
                let schema = Arc::clone(&self.schema);
                let with_changes = self.with_changes;
                scan_log(&self.client, range.clone(), self.columns.clone())
                    .and_then(move |batch| {
                        let emitted = batch.emit(&read_schema, &schema, with_changes);
                        if let Ok(emitted) = &emitted {
                            metrics.record_output(emitted.num_rows());
                        }
                        std::future::ready(emitted)
                    })
                    .boxed()
            }
            // No bucket has a tail: one empty partition.
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

/// A batch of a log tail, trimmed to its range.
#[derive(Debug)]
pub(crate) struct TailBatch {
    pub(crate) rows: RecordBatch,
    /// The change vector; empty for a log table.
    pub(crate) changes: Vec<u8>,
    pub(crate) base_offset: i64,
    pub(crate) commit_timestamp: i64,
}

impl TailBatch {
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
            return Err(external(ClientError::Protocol(format!(
                "a log batch at offset {} of {} rows has {} change types",
                self.base_offset,
                rows.num_rows(),
                self.changes.len()
            ))));
        }
        let mut columns = rows.columns().to_vec();
        columns.push(Arc::new(UInt8Array::from(self.changes)) as ArrayRef);
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

/// The log `range` (columns `columns` of the table), with each batch's change vector
/// (empty for a log table), read with Scans of the bucket's leader.
pub(crate) fn scan_log(
    client: &MinkClient,
    range: TailRange,
    columns: Vec<u32>,
) -> BoxStream<'static, Result<TailBatch>> {
    let client = client.clone();
    let TailRange { bucket, from, to } = range;
    stream::try_unfold(from, move |offset| {
        let (client, bucket, columns) = (client.clone(), bucket.clone(), columns.clone());
        async move {
            if offset >= to {
                return Ok(None);
            }
            let answer = client
                .scan(&bucket, offset, TAIL_SCAN_BYTES, &columns)
                .await
                .map_err(external)?;
            if answer.batches.is_empty() {
                // The node's answer breaks the read's plan: not the statement's fault.
                return Err(external(ClientError::Protocol(format!(
                    "the log of {bucket} ends at {} before the planned {to}",
                    answer.next_offset
                ))));
            }
            let next = answer.next_offset;
            let batches: Vec<Result<TailBatch>> = answer
                .batches
                .into_iter()
                .filter_map(|read| trim(read, offset, to))
                .map(Ok)
                .collect();
            Ok(Some((stream::iter(batches), next)))
        }
    })
    .try_flatten()
    .boxed()
}

/// The rows of a Scan batch inside `[from, to)`, with their change types.
fn trim(read: ReadBatch, from: i64, to: i64) -> Option<TailBatch> {
    let base = read.metadata.base_offset;
    let rows = read.batch.num_rows();
    let start = (from - base).clamp(0, rows as i64) as usize;
    let end = (to - base).clamp(0, rows as i64) as usize;
    if end <= start {
        return None;
    }
    // A change vector that does not fit the rows is left empty: the key merge refuses it.
    let changes = read
        .metadata
        .changes
        .and_then(|changes| changes.get(start..end).map(<[u8]>::to_vec))
        .unwrap_or_default();
    Some(TailBatch {
        rows: read.batch.slice(start, end - start),
        changes,
        base_offset: base + start as i64,
        commit_timestamp: read.metadata.commit_timestamp,
    })
}
