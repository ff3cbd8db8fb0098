//! The read tickets: Scan, Snapshot and LimitScan (DoGet) and Tail (DoExchange).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow_flight::FlightData;
use datafusion_execution::memory_pool::{MemoryConsumer, MemoryReservation};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::filter::{ColumnFilter, filter_batch};
use mink_core::key::{KeyCodec, RowCodec};
use mink_core::merge::TailIndex;
use mink_core::protocol::{
    LakeRequest, LimitScanRequest, ScanRequest, SnapshotBatch, SnapshotRequest, TailEnd,
    TailRequest, UnionPlan, UnionRequest, decode,
};
use mink_core::schema::normalize_batch;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::reader::{LakeSplit, read_split};
use prost::Message;
use tonic::Status;

use super::encoder::{BatchEncoder, metadata_only};
use super::limits::{self, DEFAULT_BATCH_ROWS};
use super::{FlightStream, MinkFlightService, projection, required_bucket};
use crate::error::NodeError;
use crate::kv::{KvTablet, SnapshotReader};
use crate::log::LogBatch;
use crate::node::Node;
use crate::union::{PlannedUnion, changelog_rows, log_range};

impl MinkFlightService {
    /// Scan: log batches from an offset, bounded by `max_bytes` (clamped to
    /// [`limits::MAX_ANSWER_BYTES`]).
    pub(super) async fn scan(&self, request: ScanRequest) -> Result<Vec<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "Scan")?;
        let (table, target) = self.node.bucket(&bucket)?;
        let mut encoder = BatchEncoder::new(projection(&table, &request.columns)?);
        let max_bytes = limits::answer_bytes(request.max_bytes);
        let batches = target.log.read(request.offset, max_bytes).await?;
        let (_, high_watermark) = target.log.offsets();
        encoder.encode_all(&table, &batches, high_watermark)
    }

    /// Answers one Tail poll: waits, reads, and closes the answer with [`TailEnd`]. The
    /// wait, `min_bytes` and `max_bytes` are clamped by [`limits`].
    pub(super) async fn tail(
        node: Arc<Node>,
        message: FlightData,
    ) -> Result<Vec<FlightData>, NodeError> {
        let request: TailRequest = decode("Tail request", &message.app_metadata)?;
        let bucket = required_bucket(request.bucket, "Tail")?;
        let (table, target) = node.bucket(&bucket)?;
        let tablet = &target.log;
        let mut encoder = BatchEncoder::new(projection(&table, &request.columns)?);
        let (log_start, high_watermark) = tablet.offsets();
        if request.offset < log_start || request.offset > high_watermark {
            return Err(NodeError::OffsetOutOfRange {
                bucket: bucket.to_string(),
                offset: request.offset,
                log_start,
                high_watermark,
            });
        }
        let max_bytes = limits::answer_bytes(request.max_bytes);
        let min_bytes = limits::min_bytes(request.min_bytes, max_bytes);
        let max_wait = limits::tail_wait(request.max_wait_ms);
        tablet.wait_for(request.offset, min_bytes, max_wait).await?;
        let batches = tablet.read(request.offset, max_bytes).await?;
        let (_, high_watermark) = tablet.offsets();
        let mut messages = encoder.encode_all(&table, &batches, high_watermark)?;
        let end = TailEnd {
            next_offset: batches.last().map_or(request.offset, |b| b.last_offset + 1),
            high_watermark,
        };
        messages.push(metadata_only(end.encode_to_vec()));
        Ok(messages)
    }

    /// Snapshot: every row of the bucket's KV store in key order, `batch_rows` (clamped to
    /// [`limits::MAX_BATCH_ROWS`]) per batch.
    pub(super) fn snapshot(
        &self,
        request: SnapshotRequest,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "Snapshot")?;
        let (table, kv) = self.node.kv_bucket(&bucket)?;
        let projection = projection(&table, &request.columns)?;
        let batch_rows = limits::batch_rows(request.batch_rows);
        stream_kv(table, kv, projection, batch_rows, usize::MAX)
    }

    /// LimitScan: the first rows of a KV store, or the last rows of a log table's log.
    pub(super) async fn limit_scan(
        &self,
        request: LimitScanRequest,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "LimitScan")?;
        let (table, target) = self.node.bucket(&bucket)?;
        let projection = projection(&table, &request.columns)?;
        let limit = request.limit as usize;
        if table.has_primary_key() {
            let rows = limit.clamp(1, DEFAULT_BATCH_ROWS as usize);
            return stream_kv(table, target.kv.clone(), projection, rows, limit);
        }
        let mut encoder = BatchEncoder::new(projection);
        let batches = target.log.read_last(limit as u64).await?;
        let (_, high_watermark) = target.log.offsets();
        let messages = encoder.encode_all(&table, &batches, high_watermark)?;
        Ok(stream::iter(messages.into_iter().map(Ok)).boxed())
    }
}

impl MinkFlightService {
    /// Union: the bucket's lake rows below the seam, then its log up to the high
    /// watermark at plan time (for a primary-key table, folded by key), then the plan.
    pub(super) async fn union(
        &self,
        request: UnionRequest,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "Union")?;
        let filters = request.filters;
        let planned = self.node.plan_union(&bucket, &filters).await?;
        let projection = projection(&planned.table, &request.columns)?;
        let end = metadata_only(planned.plan.encode_to_vec());
        let (log_from, log_to) = (planned.plan.log_from, planned.plan.log_to);
        let log = log_range(Arc::clone(&planned.bucket), log_from, log_to);
        if planned.table.has_primary_key() {
            if planned.plan.snapshot_id.is_none() {
                return kv_union(planned, projection, filters);
            }
            return self
                .merged_union(planned.table, planned.split, log, projection, filters, end)
                .await;
        }
        let mut log_encoder = BatchEncoder::new(projection.clone());
        let schema = log_encoder.start(&planned.table)?;
        let lake = self
            .lake_batches(&planned.table, planned.split, &projection, &filters, None)
            .await?;
        let table = Arc::clone(&planned.table);
        let log = log.map(move |batch| {
            let current =
                normalize_batch(&batch?.batch, table.schema()).map_err(NodeError::from)?;
            let rows = filter_batch(&filters, &current).map_err(NodeError::from)?;
            Ok(log_encoder.encode(&rows, Vec::new())?)
        });
        let answer = stream::once(async { Ok(vec![schema]) })
            .chain(lake)
            .chain(log)
            .chain(stream::once(async { Ok(vec![end]) }))
            .map_ok(|messages| stream::iter(messages.into_iter().map(Ok)))
            .try_flatten();
        Ok(answer.boxed())
    }

    /// Lake: one snapshot of a table or partition.
    pub(super) async fn lake(
        &self,
        request: LakeRequest,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let path = TablePath::parse(&request.table)?;
        let (table, split) = self
            .node
            .plan_lake(
                &path,
                request.partition,
                request.snapshot_id,
                &request.filters,
            )
            .await?;
        let projection = projection(&table, &request.columns)?;
        let schema = BatchEncoder::new(projection.clone()).start(&table)?;
        let lake = self
            .lake_batches(&table, split, &projection, &request.filters, None)
            .await?;
        let answer = stream::once(async { Ok(vec![schema]) })
            .chain(lake)
            .map_ok(|messages| stream::iter(messages.into_iter().map(Ok)))
            .try_flatten();
        Ok(answer.boxed())
    }

    /// The key merge of a primary-key table's union (`spec/union-read.md`): the tail is
    /// folded by key in memory, the lake is streamed without the rows whose key the tail
    /// changed, then the tail's live rows follow in log order.
    async fn merged_union(
        &self,
        table: Arc<TableDescriptor>,
        split: LakeSplit,
        log: BoxStream<'static, Result<LogBatch, NodeError>>,
        projection: Vec<usize>,
        filters: Vec<ColumnFilter>,
        end: FlightData,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let (tail, reservation) = self.collect_tail(&table, log).await?;
        let codec = KeyCodec::new(&table)?;
        let merge = Arc::new(KeyMerge {
            index: TailIndex::new(&codec, tail)?,
            codec,
            _reservation: reservation,
        });
        let mut encoder = BatchEncoder::new(projection.clone());
        let schema = encoder.start(&table)?;
        let lake = self
            .lake_batches(
                &table,
                split,
                &projection,
                &filters,
                Some(Arc::clone(&merge)),
            )
            .await?;
        // The index is built from the unfiltered tail; filters apply to what it emits.
        let mut live = Vec::new();
        for rows in merge.index.live_rows()? {
            live.extend(encoder.encode(&filter_batch(&filters, &rows)?, Vec::new())?);
        }
        live.push(end);
        let answer = stream::once(async { Ok(vec![schema]) })
            .chain(lake)
            .chain(stream::once(async { Ok(live) }))
            .map_ok(|messages| stream::iter(messages.into_iter().map(Ok)))
            .try_flatten();
        Ok(answer.boxed())
    }

    /// A primary-key union's tail as changelog rows, its memory reserved in the node's
    /// pool for as long as the merge holds it.
    async fn collect_tail(
        &self,
        table: &TableDescriptor,
        mut log: BoxStream<'static, Result<LogBatch, NodeError>>,
    ) -> Result<(Vec<(RecordBatch, Vec<u8>)>, MemoryReservation), NodeError> {
        let reservation = MemoryConsumer::new(format!("Union tail of {}", table.path))
            .register(self.node.memory_pool());
        let mut tail = Vec::new();
        while let Some(batch) = log.try_next().await? {
            let (rows, changes) = changelog_rows(table, batch)?;
            reservation
                .try_grow(rows.get_array_memory_size() + changes.len())
                .map_err(|e| {
                    NodeError::MemoryExhausted(format!(
                        "the log tail of a union read of {}: {e}",
                        table.path
                    ))
                })?;
            tail.push((rows, changes));
        }
        Ok((tail, reservation))
    }

    /// The encoded rows of a lake split that match `filters`, projected. Only the projected
    /// and filtered columns (and, for a key merge, the key columns) are read from Parquet;
    /// `merge` drops the rows whose key the tail changed.
    async fn lake_batches(
        &self,
        table: &TableDescriptor,
        split: LakeSplit,
        projection: &[usize],
        filters: &[ColumnFilter],
        merge: Option<Arc<KeyMerge>>,
    ) -> Result<BoxStream<'static, Result<Vec<FlightData>, Status>>, NodeError> {
        if split.files.is_empty() {
            return Ok(stream::empty().boxed());
        }
        let mut read = projection.to_vec();
        let filter_columns = filters.iter().map(|f| f.column.as_str());
        let key_columns = merge
            .iter()
            .flat_map(|m| m.codec.columns().iter().map(String::as_str));
        for column in filter_columns.chain(key_columns) {
            let index = table.schema().index_of(column)?;
            if !read.contains(&index) {
                read.push(index);
            }
        }
        let read_schema = Arc::new(table.schema().project(&read)?);
        let mut encoder = BatchEncoder::new((0..projection.len()).collect());
        let filters = filters.to_vec();
        let storage = self.node.lake().await?.storage().clone();
        Ok(read_split(&storage, split, read_schema, filters.clone())
            .map(move |batch| {
                let mut batch = batch.map_err(NodeError::from)?;
                if let Some(merge) = &merge {
                    batch = merge
                        .index
                        .filter_lake(&merge.codec, &batch)
                        .map_err(NodeError::from)?;
                }
                let rows = filter_batch(&filters, &batch).map_err(NodeError::from)?;
                Ok(encoder.encode(&rows, Vec::new())?)
            })
            .boxed())
    }
}

/// A primary-key union's tail, folded by key, and the codec of its keys.
#[derive(Debug)]
struct KeyMerge {
    index: TailIndex,
    codec: KeyCodec,
    /// The tail's memory, held in the node's pool until the merge is dropped.
    _reservation: MemoryReservation,
}

/// Streams a KV store in key order: the schema, batches of `batch_rows` rows (at most
/// `limit` in all) each with [`SnapshotBatch`], and a closing metadata-only message with
/// [`SnapshotBatch`] so even an empty store names its log offset. The store is read a
/// chunk at a time as the client asks for it, so a client that stops reading holds no
/// thread.
fn stream_kv(
    table: Arc<TableDescriptor>,
    kv: Option<KvTablet>,
    projection: Vec<usize>,
    batch_rows: usize,
    limit: usize,
) -> Result<FlightStream<FlightData>, NodeError> {
    let mut encoder = BatchEncoder::new(projection);
    let schema = encoder.start(&table)?;
    let Some(kv) = kv else {
        let end = metadata_only(SnapshotBatch { log_offset: 0 }.encode_to_vec());
        return Ok(stream::iter([Ok(schema), Ok(end)]).boxed());
    };
    let reader = kv.snapshot()?;
    let metadata = SnapshotBatch {
        log_offset: reader.log_offset(),
    }
    .encode_to_vec();
    let rows = KvRows {
        table,
        encoder,
        filters: Vec::new(),
        metadata: metadata.clone(),
    };
    let chunks = rows.read(reader, batch_rows, limit)?;
    Ok(answer(schema, chunks, metadata_only(metadata)))
}

/// A primary-key table's union with nothing tiered yet: its KV store holds every change
/// of the log applied, so it is the answer, read a chunk at a time in key order rather
/// than the whole changelog folded in memory. The closing plan names the offset the
/// store reflects as its `log_to`.
fn kv_union(
    planned: PlannedUnion,
    projection: Vec<usize>,
    filters: Vec<ColumnFilter>,
) -> Result<FlightStream<FlightData>, NodeError> {
    let kv = planned.bucket.kv.clone().ok_or_else(|| {
        NodeError::Corrupt(format!(
            "primary-key table {} without a KV store",
            planned.table.path
        ))
    })?;
    let mut encoder = BatchEncoder::new(projection);
    let schema = encoder.start(&planned.table)?;
    let reader = kv.snapshot()?;
    let plan = UnionPlan {
        log_to: reader.log_offset(),
        ..planned.plan
    };
    let rows = KvRows {
        table: planned.table,
        encoder,
        filters,
        metadata: Vec::new(),
    };
    let chunks = rows.read(reader, DEFAULT_BATCH_ROWS as usize, usize::MAX)?;
    Ok(answer(schema, chunks, metadata_only(plan.encode_to_vec())))
}

/// How the rows of a KV snapshot are answered: decoded, filtered, encoded, each batch
/// with `metadata`.
struct KvRows {
    table: Arc<TableDescriptor>,
    encoder: BatchEncoder,
    filters: Vec<ColumnFilter>,
    metadata: Vec<u8>,
}

impl KvRows {
    /// The encoded batches of `reader`, `batch_rows` rows read at a time, at most `limit`.
    fn read(
        mut self,
        reader: SnapshotReader,
        batch_rows: usize,
        limit: usize,
    ) -> Result<BoxStream<'static, Result<Vec<FlightData>, NodeError>>, NodeError> {
        let codec = RowCodec::new(&self.table)?;
        Ok(reader.into_chunks(batch_rows, limit, move |values| {
            let batch = codec.decode(&values)?;
            let rows = filter_batch(&self.filters, &batch)?;
            self.encoder.encode(&rows, self.metadata.clone())
        }))
    }
}

/// The schema, the batches, then the closing metadata-only message.
fn answer(
    schema: FlightData,
    batches: BoxStream<'static, Result<Vec<FlightData>, NodeError>>,
    end: FlightData,
) -> FlightStream<FlightData> {
    let batches = batches
        .chain(stream::once(async move { Ok(vec![end]) }))
        .map_err(Status::from)
        .map_ok(|messages| stream::iter(messages.into_iter().map(Ok)))
        .try_flatten();
    stream::once(async { Ok(schema) }).chain(batches).boxed()
}
