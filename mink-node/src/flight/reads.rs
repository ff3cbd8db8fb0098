//! The read tickets: Scan, Snapshot, LimitScan, Union, Lake and LiveRange (DoGet) and Tail
//! (DoExchange).

use std::sync::Arc;

use arrow_flight::FlightData;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use mink_core::filter::{ColumnFilter, filter_batch};
use mink_core::key::RowCodec;
use mink_core::protocol::{
    LakeRequest, LimitScanRequest, LiveRangeRequest, ScanRequest, SnapshotBatch, SnapshotRequest,
    TailEnd, TailRequest, UnionPlan, UnionRequest, decode,
};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::reader::LakeSplit;
use mink_scan::filters::physical_filter;
use mink_scan::union::{UnionScan, UnionSplit, execute_in_order, filter_and_project, read_columns};
use prost::Message;
use tonic::Status;

use super::encoder::{BatchEncoder, metadata_only};
use super::limits::{self, DEFAULT_BATCH_ROWS};
use super::{FlightStream, MinkFlightService, projection, required_bucket};
use crate::error::NodeError;
use crate::node::union::{LocalLog, PlannedUnion};
use crate::node::{Bucket, Node};
use mink_kv::{KvTablet, SnapshotReader};
use mink_log::{LastRows, LogBatch};

impl MinkFlightService {
    /// Scan: log batches from an offset, bounded by `max_bytes` (clamped to
    /// [`limits::MAX_ANSWER_BYTES`]).
    pub(super) async fn scan(&self, request: ScanRequest) -> Result<Vec<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "Scan")?;
        let (table, target) = self.node.bucket(&bucket)?;
        let mut encoder = BatchEncoder::new(projection(&table, &request.columns)?);
        let max_bytes = limits::answer_bytes(request.max_bytes);
        let frames = target.log.read_frames(request.offset, max_bytes).await?;
        let (_, high_watermark) = target.log.offsets();
        encoder.encode_all(&table, &frames, |encoder, frame| {
            encoder.encode_frame(frame, high_watermark)
        })
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
        tablet.check_offset(request.offset)?;
        let max_bytes = limits::answer_bytes(request.max_bytes);
        let min_bytes = limits::min_bytes(request.min_bytes, max_bytes);
        let max_wait = limits::tail_wait(request.max_wait_ms);
        tablet.wait_for(request.offset, min_bytes, max_wait).await?;
        let frames = tablet.read_frames(request.offset, max_bytes).await?;
        let (_, high_watermark) = tablet.offsets();
        let mut messages = encoder.encode_all(&table, &frames, |encoder, frame| {
            encoder.encode_frame(frame, high_watermark)
        })?;
        let end = TailEnd {
            next_offset: frames
                .last()
                .map_or(request.offset, |f| f.header.last_offset() + 1),
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
    /// Both are streamed as the client takes them, a bounded piece at a time: `limit` is
    /// a row count the client relies on, never clamped, and one larger than the bucket
    /// holds costs one piece's memory, not the bucket's.
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
        stream_last_rows(table, target, projection, u64::from(request.limit))
    }
}

/// The last `rows` rows of `bucket`'s log, as they stood when asked, read
/// [`limits::LIMIT_SCAN_READ_BYTES`] of log at a time as the client takes the answer:
/// the schema, then the batches as a Scan sends them, the first one without its rows
/// before the last `rows`.
fn stream_last_rows(
    table: Arc<TableDescriptor>,
    bucket: Arc<Bucket>,
    projection: Vec<usize>,
    rows: u64,
) -> Result<FlightStream<FlightData>, NodeError> {
    let mut encoder = BatchEncoder::new(projection);
    let schema = encoder.start(&table)?;
    let last = bucket.log.last_rows(rows);
    let pieces = stream::try_unfold((encoder, last), move |(mut encoder, last)| {
        let bucket = Arc::clone(&bucket);
        async move {
            if last.start >= last.end {
                return Ok(None);
            }
            let mut batches = bucket
                .log
                .read(last.start, limits::LIMIT_SCAN_READ_BYTES)
                .await?;
            batches.retain(|batch| batch.base_offset < last.end);
            let Some(next) = batches.last().map(|batch| batch.last_offset + 1) else {
                return Ok(None);
            };
            if let Some(first) = batches.first_mut() {
                skip_rows(first, last.skip);
            }
            let (_, high_watermark) = bucket.log.offsets();
            let mut messages = Vec::new();
            for batch in &batches {
                messages.extend(encoder.encode_log(batch, high_watermark)?);
            }
            let rest = LastRows {
                start: next,
                skip: 0,
                ..last
            };
            Ok(Some((messages, (encoder, rest))))
        }
    });
    Ok(answer(schema, pieces.boxed(), None))
}

/// `batch` without its first `rows` rows (and their changes), its offsets moved on.
fn skip_rows(batch: &mut LogBatch, rows: u64) {
    let rows = usize::try_from(rows).map_or(batch.batch.num_rows(), |rows| {
        rows.min(batch.batch.num_rows())
    });
    if rows == 0 {
        return;
    }
    batch.base_offset += rows as i64;
    batch.batch = batch.batch.slice(rows, batch.batch.num_rows() - rows);
    if let Some(changes) = &mut batch.changes {
        changes.drain(..rows.min(changes.len()));
    }
}

impl MinkFlightService {
    /// Union: the bucket's lake rows below the seam, then its log up to the high
    /// watermark at plan time (for a primary-key table, merged by key), then the plan.
    pub(super) async fn union(
        &self,
        request: UnionRequest,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "Union")?;
        let filters = request.filters;
        let planned = self.node.plan_union(&bucket, &filters).await?;
        let projection = projection(&planned.table, &request.columns)?;
        if planned.table.has_primary_key() && planned.plan.snapshot_id.is_none() {
            return kv_union(planned, projection, filters);
        }
        let end = metadata_only(planned.plan.encode_to_vec());
        let split = UnionSplit {
            bucket: planned.id,
            plan: planned.plan,
            lake: planned.split,
        };
        let read = PlanRead {
            table: &planned.table,
            projection: &projection,
            filters: &filters,
        };
        let (schema, rows) = self.execute(read, Splits::Union(&[split])).await?;
        Ok(answer(schema, rows, Some(end)))
    }

    /// LiveRange: the live rows of a primary-key table's log range, folded here
    /// ([`Node::live_range`]): the schema, then the rows, with no metadata.
    pub(super) async fn live_range(
        &self,
        request: LiveRangeRequest,
    ) -> Result<FlightStream<FlightData>, NodeError> {
        let bucket = required_bucket(request.bucket, "LiveRange")?;
        let (table, _) = self.node.bucket(&bucket)?;
        let projection = projection(&table, &request.columns)?;
        let batches = self
            .node
            .live_range(&bucket, request.from, request.to, &projection)
            .await?;
        // The rows come projected: the encoder keeps their columns.
        let mut encoder = BatchEncoder::new((0..projection.len()).collect());
        let schema = encoder.start_with(&Arc::new(table.schema().project(&projection)?));
        let rows = stream::iter(batches).map(move |batch| encoder.encode(&batch.batch, Vec::new()));
        Ok(answer(schema, rows.boxed(), None))
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
        let read = PlanRead {
            table: &table,
            projection: &projection,
            filters: &request.filters,
        };
        let (schema, rows) = self.execute(read, Splits::Lake(&split)).await?;
        Ok(answer(schema, rows, None))
    }

    /// Executes `read` over `splits` with `mink_scan`'s plan (the engine's union read,
    /// with the node's own logs as its tail): the schema message, then the encoded rows.
    /// The plan's partitions run one after another ([`execute_in_order`]), so a union's
    /// tail follows its whole lake in log order; the lake's files are read concurrently
    /// inside the first.
    async fn execute(
        &self,
        read: PlanRead<'_>,
        splits: Splits<'_>,
    ) -> Result<
        (
            FlightData,
            BoxStream<'static, Result<Vec<FlightData>, NodeError>>,
        ),
        NodeError,
    > {
        let PlanRead {
            table,
            projection,
            filters,
        } = read;
        let columns = read_columns(table, projection, filters)?;
        let read_schema = table.schema().project(&columns)?;
        let has_files = match splits {
            Splits::Union(splits) => splits.iter().any(|s| !s.lake.files.is_empty()),
            Splits::Lake(split) => !split.files.is_empty(),
        };
        let storage = match has_files {
            true => Some(self.node.lake().await?.storage().clone()),
            false => None,
        };
        let scan = UnionScan {
            table,
            storage: storage.as_ref(),
            log: Arc::new(LocalLog {
                node: Arc::clone(&self.node),
            }),
            columns: columns.iter().map(|&i| i as u32).collect(),
            predicate: physical_filter(filters, table.schema())?,
            lake_first: true,
        };
        let context = self.node.read_context();
        let rows = match splits {
            Splits::Union(splits) => scan.plan(&context, splits).await?,
            Splits::Lake(split) => scan.lake(&context, &[split]).await?,
        };
        let exact = physical_filter(filters, &read_schema)?;
        let plan = filter_and_project(rows, exact, (0..projection.len()).collect())?;
        let mut encoder = BatchEncoder::new((0..projection.len()).collect());
        let schema = encoder.start_with(&plan.schema());
        let batches =
            execute_in_order(plan, context).map(move |batch| encoder.encode(&batch?, Vec::new()));
        Ok((schema, batches.boxed()))
    }
}

/// What a plan read answers: the table, the columns asked for (by index in the table)
/// and the filters every row must pass.
struct PlanRead<'a> {
    table: &'a TableDescriptor,
    projection: &'a [usize],
    filters: &'a [ColumnFilter],
}

/// What a plan read reads: a union of buckets, or the lake alone.
#[derive(Clone, Copy)]
enum Splits<'a> {
    Union(&'a [UnionSplit]),
    Lake(&'a LakeSplit),
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
    Ok(answer(schema, chunks, Some(metadata_only(metadata))))
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
    Ok(answer(
        schema,
        chunks,
        Some(metadata_only(plan.encode_to_vec())),
    ))
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

/// The schema, the batches, then the closing metadata-only message if there is one.
fn answer(
    schema: FlightData,
    batches: BoxStream<'static, Result<Vec<FlightData>, NodeError>>,
    end: Option<FlightData>,
) -> FlightStream<FlightData> {
    let batches = batches
        .chain(stream::iter(end.map(|end| Ok(vec![end]))))
        .map_err(Status::from)
        .map_ok(|messages| stream::iter(messages.into_iter().map(Ok)))
        .try_flatten();
    stream::once(async { Ok(schema) }).chain(batches).boxed()
}
