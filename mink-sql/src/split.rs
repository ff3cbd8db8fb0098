//! Reading one split (one bucket) of a scan in the engine, when the KV store or the log
//! answers it: a primary-key table's KV store for the reads it does better than a union
//! read (the whole bucket when there is no lake: Snapshot; a bare `LIMIT`: LimitScan;
//! predicates that fix the whole primary key: lookup), and the log itself for
//! `t$changelog`. Union reads are plan nodes of their own (`crate::union`).
//!
//! Rows are read in the *read schema* (the projection, then the filter columns it lacks);
//! filters apply exactly to every emitted row, then the projection.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::error::Result;
use datafusion::physical_plan::metrics::Count;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_client::MinkClient;
use mink_core::change::ChangeType;
use mink_core::filter::{ColumnFilter, filter_batch};
use mink_core::protocol::BucketId;
use mink_core::table::TableDescriptor;
use mink_lake::storage::LakeStorage;
pub(crate) use mink_scan::external;
use mink_scan::log_range::{LogRange, LogRangeBatch};

use crate::union::log_range::scan_log;

/// One bucket's part of a scan, planned.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    pub(crate) bucket: BucketId,
    pub(crate) source: SplitSource,
}

/// What a split reads from its bucket.
#[derive(Debug, Clone)]
pub(crate) enum SplitSource {
    /// Every row of the KV store (a primary-key table without a lake).
    KvSnapshot,
    /// The first rows of the KV store, in key order (a bare `LIMIT`).
    LimitScan { limit: u32 },
    /// The rows of these primary keys, one KV get each.
    Lookup { keys: RecordBatch },
    /// The log `[from, to)` with its change columns (`t$changelog`).
    Changelog { from: i64, to: i64 },
}

/// Counters of a split's read, reported on the plan node.
#[derive(Debug, Clone)]
pub(crate) struct SplitMetrics {
    pub(crate) kv_rows: Count,
    pub(crate) log_rows: Count,
}

/// What every split of a scan reads with.
#[derive(Debug)]
pub(crate) struct SplitReader {
    pub(crate) table: Arc<TableDescriptor>,
    pub(crate) client: MinkClient,
    pub(crate) storage: LakeStorage,
    /// Columns read: the projection first, then filter and key columns.
    pub(crate) read_schema: SchemaRef,
    /// The columns output, by index in the rows emitted (the read schema, or for a
    /// changelog the read schema and [`CHANGELOG_COLUMNS`]).
    pub(crate) output: Vec<usize>,
    pub(crate) filters: Vec<ColumnFilter>,
    /// Emit the log's change columns after the table's (`t$changelog`).
    pub(crate) changelog: bool,
}

/// The columns a changelog read adds to the table's: each row's change type (`+I`, `-U`,
/// `+U`, `-D`; `+I` for a log table's rows), log offset and commit time.
pub const CHANGELOG_COLUMNS: [&str; 3] = ["_change_type", "_log_offset", "_commit_timestamp"];

/// `schema` with the changelog columns after it.
pub(crate) fn changelog_schema(schema: &Schema) -> Schema {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGELOG_COLUMNS[0], DataType::Utf8, false));
    fields.push(Field::new(CHANGELOG_COLUMNS[1], DataType::Int64, false));
    fields.push(Field::new(
        CHANGELOG_COLUMNS[2],
        DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
        false,
    ));
    Schema::new(fields)
}

impl SplitReader {
    /// The split's rows, projected; no I/O before the first poll.
    pub(crate) fn read(
        self: Arc<Self>,
        split: Split,
        metrics: SplitMetrics,
    ) -> BoxStream<'static, Result<RecordBatch>> {
        stream::once(async move { self.open(split, metrics).await })
            .try_flatten()
            .boxed()
    }

    async fn open(
        self: Arc<Self>,
        split: Split,
        metrics: SplitMetrics,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let columns = self.read_columns();
        let kv_rows = match split.source {
            SplitSource::Changelog { from, to } => {
                let reader = Arc::clone(&self);
                return Ok(self
                    .log_range(split.bucket, from, to)
                    .and_then(move |batch| {
                        metrics.log_rows.add(batch.rows.num_rows());
                        std::future::ready(reader.emit_changes(batch))
                    })
                    .boxed());
            }
            SplitSource::KvSnapshot => self.kv_snapshot(&split.bucket, &columns).await?,
            SplitSource::LimitScan { limit } => {
                let answer = self.client.limit_scan(&split.bucket, limit, &columns).await;
                stream::iter(answer.map_err(external)?).map(Ok).boxed()
            }
            SplitSource::Lookup { keys } => {
                let client = &self.client;
                let answer = client.lookup_in_bucket(&self.table, &split.bucket, &keys, &columns);
                stream::iter([Ok(answer.await.map_err(external)?.rows)]).boxed()
            }
        };
        let reader = Arc::clone(&self);
        Ok(kv_rows
            .and_then(move |batch| {
                metrics.kv_rows.add(batch.num_rows());
                std::future::ready(reader.emit(&batch))
            })
            .boxed())
    }

    /// Every row of a bucket's KV store, streamed: a bucket of any size is read a batch
    /// at a time.
    async fn kv_snapshot(
        &self,
        bucket: &BucketId,
        columns: &[u32],
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let answer = self.client.snapshot_stream(bucket, columns, 0).await;
        Ok(answer.map_err(external)?.map_err(external).boxed())
    }

    /// The read schema's columns, by index in the table (what Scan and Snapshot ask for).
    pub(crate) fn read_columns(&self) -> Vec<u32> {
        self.read_schema
            .fields()
            .iter()
            .filter_map(|f| self.table.schema().index_of(f.name()).ok())
            .map(|i| i as u32)
            .collect()
    }

    /// A batch in the read schema, filtered and projected to the output.
    fn emit(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let rows = filter_batch(&self.filters, batch).map_err(external)?;
        Ok(rows.project(&self.output)?)
    }

    /// A log batch with its change columns, projected to the output.
    fn emit_changes(&self, batch: LogRangeBatch) -> Result<RecordBatch> {
        let count = batch.rows.num_rows();
        let change_types: StringArray = match batch.changes.is_empty() {
            true => (0..count).map(|_| Some("+I")).collect(),
            false => batch
                .changes
                .iter()
                .map(|&byte| {
                    ChangeType::from_byte(byte)
                        .map(|change| Some(change.short_string()))
                        .map_err(external)
                })
                .collect::<Result<_>>()?,
        };
        let offsets =
            Int64Array::from_iter_values(batch.base_offset..batch.base_offset + count as i64);
        let times = TimestampMillisecondArray::from(vec![batch.commit_timestamp; count])
            .with_timezone("UTC");
        let mut columns = batch.rows.columns().to_vec();
        columns.extend([
            Arc::new(change_types) as ArrayRef,
            Arc::new(offsets),
            Arc::new(times),
        ]);
        let schema = Arc::new(changelog_schema(batch.rows.schema_ref()));
        Ok(RecordBatch::try_new(schema, columns)?.project(&self.output)?)
    }

    /// The log `[from, to)` of `bucket` in the read schema's columns.
    fn log_range(
        &self,
        bucket: BucketId,
        from: i64,
        to: i64,
    ) -> BoxStream<'static, Result<LogRangeBatch>> {
        scan_log(
            &self.client,
            LogRange { bucket, from, to },
            self.read_columns(),
        )
    }
}
