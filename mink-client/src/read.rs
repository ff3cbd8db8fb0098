//! Decoding read answers: batches with their [`ScanBatch`] metadata, normalized to the
//! answer's schema.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedFlightData, DecodedPayload, FlightDataDecoder};
use futures::channel::mpsc::UnboundedSender;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use mink_core::log_range::OffsetBatch;
use mink_core::protocol::{BucketId, ScanBatch, TailEnd, TailRequest, decode};
use mink_core::schema::normalize_batch;
use mink_core::table::TableDescriptor;
use prost::Message;

use crate::MinkClient;
use crate::error::{ClientError, Result};

/// One batch of a log read.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    /// Offsets, commit time, schema version, change vector, high watermark.
    pub metadata: ScanBatch,
    /// The rows, in the answer's schema.
    pub batch: RecordBatch,
}

impl OffsetBatch for ReadBatch {
    fn base_offset(&self) -> i64 {
        self.metadata.base_offset
    }

    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn slice(mut self, start: usize, len: usize) -> Self {
        // A change vector that does not fit the rows is dropped: the key merge refuses a
        // primary-key batch without one.
        self.metadata.changes = (self.metadata.changes.take())
            .and_then(|changes| changes.get(start..start + len).map(<[u8]>::to_vec));
        self.metadata.base_offset += start as i64;
        self.metadata.last_offset = self.metadata.base_offset + len as i64 - 1;
        self.batch = self.batch.slice(start, len);
        self
    }
}

/// The answer to a Scan or one Tail poll.
#[derive(Debug, Clone)]
pub struct ReadAnswer {
    /// The schema of every batch: the table's current schema, projected.
    pub schema: SchemaRef,
    /// The batches, in log order.
    pub batches: Vec<ReadBatch>,
    /// The offset to read next.
    pub next_offset: i64,
    /// The bucket's high watermark as of the answer.
    pub high_watermark: i64,
}

impl ReadAnswer {
    /// Total rows of the answer.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.batch.num_rows()).sum()
    }
}

/// Reads one Tail poll's answer (up to its closing [`TailEnd`]).
pub(crate) async fn read_answer(
    decoder: &mut FlightDataDecoder,
    offset: i64,
) -> Result<ReadAnswer> {
    scan_answer(read_batches(decoder).await?, offset)
}

/// A Scan's or a Tail poll's answer read from `offset`.
pub(crate) fn scan_answer(answer: Batches, offset: i64) -> Result<ReadAnswer> {
    let batches = answer
        .batches
        .into_iter()
        .map(|(batch, metadata)| {
            Ok(ReadBatch {
                metadata: decode("ScanBatch", &metadata)?,
                batch,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let end: Option<TailEnd> = answer.end.map(|end| decode("TailEnd", &end)).transpose()?;
    let last = batches.last().map(|b| &b.metadata);
    let (next_offset, high_watermark) = match (&end, last) {
        (Some(end), _) => (end.next_offset, end.high_watermark),
        (None, Some(last)) => (last.last_offset + 1, last.high_watermark),
        // A Scan only comes back empty when it starts at the high watermark.
        (None, None) => (offset, offset),
    };
    Ok(ReadAnswer {
        schema: answer.schema,
        batches,
        next_offset,
        high_watermark,
    })
}

/// The answer to a Snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotAnswer {
    /// The schema of every batch: the table's current schema, projected.
    pub schema: SchemaRef,
    /// The rows, in key order.
    pub batches: Vec<RecordBatch>,
    /// Every change below this offset is in the snapshot, none at or above it: a Scan
    /// from here continues it.
    pub log_offset: i64,
}

impl SnapshotAnswer {
    /// Total rows of the answer.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// The answer to a Union read.
#[derive(Debug, Clone)]
pub struct UnionAnswer {
    /// The schema of every batch: the table's current schema, projected.
    pub schema: SchemaRef,
    /// Lake rows, then log rows (in log order).
    pub batches: Vec<RecordBatch>,
    /// The plan the node followed: snapshot, seam, log range.
    pub plan: mink_core::protocol::UnionPlan,
}

impl UnionAnswer {
    /// Total rows of the answer.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Rows found by a lookup or prefix lookup.
#[derive(Debug, Clone)]
pub struct LookupResult {
    /// The rows found, projected.
    pub rows: RecordBatch,
    /// For each row, the index of the key (or prefix) in the request it answers.
    pub key_indices: Vec<u32>,
}

impl LookupResult {
    /// Concatenates the answers of several buckets.
    pub(crate) fn concat(
        table: &TableDescriptor,
        columns: &[u32],
        answers: Vec<(RecordBatch, Vec<u32>)>,
    ) -> Result<Self> {
        let indices: Vec<usize> = if columns.is_empty() {
            (0..table.schema().fields().len()).collect()
        } else {
            columns.iter().map(|c| *c as usize).collect()
        };
        let schema = Arc::new(table.schema().project(&indices)?);
        let batches: Vec<&RecordBatch> = answers.iter().map(|(rows, _)| rows).collect();
        let rows = concat_batches(&schema, batches)?;
        let key_indices = answers.into_iter().flat_map(|(_, keys)| keys).collect();
        Ok(Self { rows, key_indices })
    }
}

/// The batches of one answer, normalized to its first schema, each with its
/// `app_metadata`, and the `app_metadata` of the metadata-only message that closed it.
#[derive(Debug)]
pub(crate) struct Batches {
    pub(crate) schema: SchemaRef,
    pub(crate) batches: Vec<(RecordBatch, bytes::Bytes)>,
    pub(crate) end: Option<bytes::Bytes>,
}

/// Reads one answer: up to the end of the stream, or up to a metadata-only message (which
/// closes a Tail poll or a Snapshot).
pub(crate) async fn read_batches(decoder: &mut FlightDataDecoder) -> Result<Batches> {
    let mut answer = AnswerReader::new(decoder);
    let mut batches = Vec::new();
    let mut end = None;
    while let Some(message) = answer.next().await? {
        match message {
            Answered::Batch(batch, metadata) => batches.push((batch, metadata)),
            Answered::End(metadata) => {
                end = Some(metadata);
                break;
            }
        }
    }
    let schema = answer
        .schema
        .ok_or_else(|| ClientError::Protocol("an answer without a schema".into()))?;
    Ok(Batches {
        schema,
        batches,
        end,
    })
}

/// The batches of one answer as they arrive, normalized to its first schema, up to the
/// end of the stream or its closing metadata-only message: a reader holds one batch at a
/// time, however large the answer.
pub(crate) fn stream_batches(
    decoder: FlightDataDecoder,
) -> BoxStream<'static, Result<RecordBatch>> {
    futures::stream::try_unfold(AnswerReader::new(decoder), |mut answer| async move {
        match answer.next().await? {
            Some(Answered::Batch(batch, _)) => Ok(Some((batch, answer))),
            Some(Answered::End(_)) => {
                read_to_end(&mut answer.decoder).await?;
                Ok(None)
            }
            None => Ok(None),
        }
    })
    .boxed()
}

/// Reads a DoGet or DoAction answer to its end, the server's trailers included. A stream
/// dropped before them is reset, and trailers that arrive after the reset count as the
/// server's stream errors: past 1024 of them (h2's limit) the connection is closed with
/// `ENHANCE_YOUR_CALM`, failing every call it carries.
pub(crate) async fn read_to_end<S, T, E>(stream: &mut S) -> std::result::Result<(), E>
where
    S: Stream<Item = std::result::Result<T, E>> + Unpin,
{
    while let Some(message) = stream.next().await {
        message?;
    }
    Ok(())
}

/// One data message of an answer.
enum Answered {
    /// A batch, in the answer's schema, with its `app_metadata`.
    Batch(RecordBatch, bytes::Bytes),
    /// The metadata-only message that closes the answer.
    End(bytes::Bytes),
}

/// Decodes an answer's messages (from a decoder, or a decoder borrowed for one answer of
/// several), normalizing every batch to the first schema sent.
struct AnswerReader<D> {
    decoder: D,
    schema: Option<SchemaRef>,
}

impl<D> AnswerReader<D>
where
    D: Stream<Item = arrow_flight::error::Result<DecodedFlightData>> + Unpin,
{
    fn new(decoder: D) -> Self {
        Self {
            decoder,
            schema: None,
        }
    }

    /// The next batch or closing message; `None` at the end of the stream.
    async fn next(&mut self) -> Result<Option<Answered>> {
        while let Some(message) = self.decoder.next().await {
            let message = message?;
            match message.payload {
                DecodedPayload::Schema(schema) => {
                    self.schema.get_or_insert(schema);
                }
                DecodedPayload::RecordBatch(batch) => {
                    let target = self
                        .schema
                        .as_ref()
                        .ok_or_else(|| ClientError::Protocol("a batch before any schema".into()))?;
                    let batch = normalize_batch(&batch, target)?;
                    return Ok(Some(Answered::Batch(batch, message.inner.app_metadata)));
                }
                DecodedPayload::None => return Ok(Some(Answered::End(message.inner.app_metadata))),
            }
        }
        Ok(None)
    }
}

/// A consumer polling one bucket over a Tail session (a DoExchange stream) with the node
/// leading it. A poll that fails (the bucket moved: NotLeader; its node gone) is asked
/// again on a new session with the bucket's leader, following NotLeader as every bucket
/// call does ([`FOLLOW_FOR`](crate::FOLLOW_FOR)); a poll only reads, so asking again is
/// harmless.
#[derive(Debug)]
pub struct Tailer {
    pub(crate) client: MinkClient,
    pub(crate) bucket: BucketId,
    pub(crate) columns: Vec<u32>,
    /// The session, opened on the first poll and again after the bucket moved.
    pub(crate) session: Option<TailSession>,
}

/// One Tail session with one node.
#[derive(Debug)]
pub(crate) struct TailSession {
    requests: UnboundedSender<arrow_flight::error::Result<FlightData>>,
    answers: FlightDataDecoder,
}

impl TailSession {
    /// Opens a session with the node of `client`.
    async fn open(client: &MinkClient) -> Result<Self> {
        let (requests, outgoing) = futures::channel::mpsc::unbounded();
        let answers = client.flight().do_exchange(outgoing).await?;
        Ok(Self {
            requests,
            answers: answers.into_inner(),
        })
    }

    async fn poll(&mut self, request: &TailRequest) -> Result<ReadAnswer> {
        let message = FlightData::new().with_app_metadata(request.encode_to_vec());
        self.requests
            .unbounded_send(Ok(message))
            .map_err(|_| ClientError::Protocol("the Tail stream is closed".into()))?;
        read_answer(&mut self.answers, request.offset).await
    }
}

impl Tailer {
    /// Waits up to `max_wait` for data at `offset` (at least `min_bytes` of it, if given)
    /// and returns what is there; an empty answer after the wait is normal.
    pub async fn poll(
        &mut self,
        offset: i64,
        max_wait: Duration,
        min_bytes: u64,
    ) -> Result<ReadAnswer> {
        let request = TailRequest {
            bucket: Some(self.bucket.clone()),
            offset,
            columns: self.columns.clone(),
            max_wait_ms: max_wait.as_millis() as u64,
            min_bytes,
            max_bytes: 0,
        };
        if let Some(session) = &mut self.session {
            match session.poll(&request).await {
                Ok(answer) => return Ok(answer),
                Err(_) => self.session = None,
            }
        }
        let (session, answer) = (self.client)
            .on_leader(&self.bucket, |leader| {
                let request = request.clone();
                async move {
                    let mut session = TailSession::open(&leader).await?;
                    let answer = session.poll(&request).await?;
                    Ok((session, answer))
                }
            })
            .await?;
        self.session = Some(session);
        Ok(answer)
    }
}
