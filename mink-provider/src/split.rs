//! Reading one union split in the engine: the bucket's lake files straight from the
//! object store, its log tail `[log_from, log_to)` from the bucket leader over Flight,
//! merged by key for a primary-key table (`spec/union-read.md`).
//!
//! ```text
//!   lake files (object store) ──► deletes applied ──► drop keys the tail changed ──┐
//!   tail (Scan over Flight) ──► TailIndex (key -> last change) ────────────────────┼─► filters ─► projection
//!                                      └──────────► live tail rows, in log order ──┘
//! ```
//!
//! Rows are read in the *read schema*: the projection, then the filter columns and the
//! key columns it lacks. Filters apply exactly to every emitted row; the tail index is
//! built from the unfiltered tail (a filtered tail would let an older lake version of a
//! key that left the filter resurrect). A log table's split is the lake rows, then the
//! tail's, streamed.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::metrics::Count;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_client::MinkClient;
use mink_core::filter::{ColumnFilter, filter_batch};
use mink_core::key::KeyCodec;
use mink_core::merge::TailIndex;
use mink_core::protocol::{BucketId, UnionPlan};
use mink_core::table::TableDescriptor;
use mink_lake::reader::{LakeSplit, read_split};
use mink_lake::storage::LakeStorage;

/// Bytes of log asked for per Scan of the tail.
const TAIL_SCAN_BYTES: u64 = 8 << 20;

/// One bucket's union split, planned.
#[derive(Debug, Clone)]
pub(crate) struct UnionSplit {
    pub(crate) bucket: BucketId,
    pub(crate) plan: UnionPlan,
    pub(crate) lake: LakeSplit,
}

/// Counters of a split's read, reported on the plan node.
#[derive(Debug, Clone)]
pub(crate) struct SplitMetrics {
    pub(crate) lake_files: Count,
    pub(crate) lake_rows: Count,
    pub(crate) tail_rows: Count,
    pub(crate) merge_dropped: Count,
}

/// What every split of a scan reads with.
#[derive(Debug)]
pub(crate) struct SplitReader {
    pub(crate) table: Arc<TableDescriptor>,
    pub(crate) client: MinkClient,
    pub(crate) storage: LakeStorage,
    /// Columns read: the projection first, then filter and key columns.
    pub(crate) read_schema: SchemaRef,
    /// How many leading columns of the read schema are output.
    pub(crate) output_columns: usize,
    pub(crate) filters: Vec<ColumnFilter>,
}

impl SplitReader {
    /// The split's rows, projected; no I/O before the first poll.
    pub(crate) fn read(
        self: Arc<Self>,
        split: UnionSplit,
        metrics: SplitMetrics,
    ) -> BoxStream<'static, Result<RecordBatch>> {
        stream::once(async move { self.open(split, metrics).await })
            .try_flatten()
            .boxed()
    }

    async fn open(
        self: Arc<Self>,
        split: UnionSplit,
        metrics: SplitMetrics,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        metrics.lake_files.add(split.lake.files.len());
        let lake = read_split(
            &self.storage,
            split.lake,
            Arc::clone(&self.read_schema),
            self.filters.clone(),
        )
        .map_err(external);
        let tail = self.tail(split.bucket, split.plan.log_from, split.plan.log_to);
        if !self.table.has_primary_key() {
            let reader = Arc::clone(&self);
            let (lake_rows, tail_rows) = (metrics.lake_rows.clone(), metrics.tail_rows.clone());
            let lake = lake.map_ok(move |batch| {
                lake_rows.add(batch.num_rows());
                batch
            });
            let tail = tail.map_ok(move |(batch, _)| {
                tail_rows.add(batch.num_rows());
                batch
            });
            return Ok(lake
                .chain(tail)
                .and_then(move |batch| std::future::ready(reader.emit(&batch)))
                .boxed());
        }
        let tail: Vec<(RecordBatch, Vec<u8>)> = tail.try_collect().await?;
        metrics
            .tail_rows
            .add(tail.iter().map(|(b, _)| b.num_rows()).sum());
        let codec = KeyCodec::new(&self.table).map_err(external)?;
        let index = Arc::new(TailIndex::new(&codec, tail).map_err(external)?);
        let live = index.live_rows().map_err(external)?;
        let reader = Arc::clone(&self);
        let lake = lake.and_then(move |batch| {
            metrics.lake_rows.add(batch.num_rows());
            let kept = index.filter_lake(&codec, &batch).map_err(external);
            if let Ok(kept) = &kept {
                metrics
                    .merge_dropped
                    .add(batch.num_rows() - kept.num_rows());
            }
            std::future::ready(kept.and_then(|kept| reader.emit(&kept)))
        });
        let reader = Arc::clone(&self);
        let live = stream::iter(live).map(move |batch| reader.emit(&batch));
        Ok(lake.chain(live).boxed())
    }

    /// A batch in the read schema, filtered and projected to the output.
    fn emit(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let rows = filter_batch(&self.filters, batch).map_err(external)?;
        Ok(rows.project(&(0..self.output_columns).collect::<Vec<_>>())?)
    }

    /// The log `[from, to)` in the read schema, with each batch's change vector (empty
    /// for a log table), read with Scans of the bucket leader.
    fn tail(
        &self,
        bucket: BucketId,
        from: i64,
        to: i64,
    ) -> BoxStream<'static, Result<(RecordBatch, Vec<u8>)>> {
        let client = self.client.clone();
        let columns: Vec<u32> = self
            .read_schema
            .fields()
            .iter()
            .filter_map(|f| self.table.schema().index_of(f.name()).ok())
            .map(|i| i as u32)
            .collect();
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
                    return Err(DataFusionError::Execution(format!(
                        "the log of {bucket} ends at {} before the planned {to}",
                        answer.next_offset
                    )));
                }
                let next = answer.next_offset;
                let batches: Vec<Result<(RecordBatch, Vec<u8>)>> = answer
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
}

/// The rows of a Scan batch inside `[from, to)`, with their change types.
fn trim(read: mink_client::ReadBatch, from: i64, to: i64) -> Option<(RecordBatch, Vec<u8>)> {
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
    Some((read.batch.slice(start, end - start), changes))
}

/// Any error of mink's crates, as DataFusion's.
pub(crate) fn external(error: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(error))
}
