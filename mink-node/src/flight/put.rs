//! DoPut: a client's batches in, one acknowledgement per batch out, in order.
//!
//! Up to [`PUT_PIPELINE`] batches of one stream are in flight at once, so they share
//! group commits, and at most [`PUT_PIPELINE_BYTES`] of them: a batch holds twice the
//! bytes of its IPC message (see [`sent_batches`]) from the moment it is read until its
//! acknowledgement is sent, reserved in the node's memory pool ([`Budget`]). A stream
//! whose budget is spent reads no further until its acknowledgements free some: the
//! client waits, as a slow disk makes it wait. Only a batch that the pool cannot take
//! while nothing of its stream is in flight is refused (`ResourceExhausted`, the acks
//! before it sent). Together, the streams of the node hold at most what its pool has
//! (`--sql-memory-limit` in `mink server`), plus one batch each that is read and waits
//! for room.
//!
//! The pipeline keeps one promise: **after an error, nothing later in the stream is
//! written.** A client that sees acks for batches `0..k` and then an error may retry
//! from batch `k` without duplicating anything.
//!
//! ```text
//!   client ──FlightData──► IPC guard ──► decoder ──► admit ──► [write k-2][write k-1][write k] ──► acks, in order
//!                                                     │                 │
//!                                                     │                 └─ in the log, one WriteStream:
//!                                                     │                      failed in its group -> k+1.. never written
//!                                                     └─ start write k, poll it once:
//!                                                          refused -> stop reading, drain, then the error
//!                                                          pending -> queued in the log, admit k+1
//! ```
//!
//! A batch can fail in two places, and each stops the stream there:
//!
//! * **Before the log.** [`Node::write`](crate::node::Node::write) checks a batch
//!   (schema, nulls, routing, address) before its first await, and only then queues it
//!   for the log's group commit. So one poll of a new write tells whether it was refused;
//!   the next batch is only started after that, and a refused batch stops the stream:
//!   nothing after it is read or queued.
//! * **In the log.** Batches queued behind one another can still fail when their group
//!   is written: refused at append time, or the whole group failed (a full disk). The
//!   pipeline hands `start` its [`WriteStream`] with every batch, and every write carries
//!   it to the log, so the log knows them as one stream and writes none of the batches
//!   queued after the one that failed (the stop rule of the log's appender).
//!
//! Either way the acknowledgements of the batches before the failed one are still sent,
//! then its error, and the stream ends.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use datafusion_execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use futures::future::{self, BoxFuture};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use mink_core::ipc_guard;
use tonic::Status;

use super::flight_error_to_status;
#[cfg(doc)]
use super::limits::{PUT_PIPELINE, PUT_PIPELINE_BYTES};
use crate::error::NodeError;
use mink_log::{SentBatch, WriteStream};

/// Refuses a FlightData whose IPC header declares compression, before any decoder sees
/// it. A message without a header (a descriptor only) passes: nothing in it is decoded.
pub(super) fn check_flight_data(data: FlightData) -> Result<FlightData, Status> {
    if !data.data_header.is_empty() {
        ipc_guard::check_header(&data.data_header).map_err(NodeError::from)?;
    }
    Ok(data)
}

/// A batch read from a client's stream, and the bytes it holds until it is acknowledged.
#[derive(Debug)]
pub(super) struct Received<B> {
    pub(super) batch: B,
    pub(super) bytes: usize,
}

/// The batches of a DoPut stream, each with the message it came in (see [`SentBatch`]):
/// one schema message first, then record batch messages (dictionaries between them). A
/// batch holds twice the bytes of its message (header and body): the node was measured to
/// hold that much per message in flight (the message and the buffer it was received in).
pub(super) fn sent_batches(
    data: impl Stream<Item = Result<FlightData, FlightError>> + Send + 'static,
) -> impl Stream<Item = Result<Received<SentBatch>, Status>> {
    let mut schema_seen = false;
    FlightDataDecoder::new(data)
        .map_err(flight_error_to_status)
        .try_filter_map(move |decoded| {
            let batch = match decoded.payload {
                DecodedPayload::Schema(_) if schema_seen => Err(Status::invalid_argument(
                    "a DoPut stream has one schema message",
                )),
                DecodedPayload::Schema(_) => {
                    schema_seen = true;
                    Ok(None)
                }
                DecodedPayload::None => Ok(None),
                DecodedPayload::RecordBatch(batch) => {
                    let message = decoded.inner.data_header.len() + decoded.inner.data_body.len();
                    let bytes = message.saturating_mul(2);
                    let batch = SentBatch::from_flight(decoded.inner, batch);
                    Ok(Some(Received { batch, bytes }))
                }
            };
            future::ready(batch)
        })
}

/// The bytes of a pipeline's writes in flight, reserved in a memory pool, at most `limit`
/// of them unless a single batch is larger.
#[derive(Debug)]
pub(super) struct Budget {
    limit: usize,
    reservation: MemoryReservation,
    /// The bytes of each write in flight, oldest first: acknowledged in this order.
    writes: VecDeque<usize>,
}

/// What [`Budget::admit`] decides for a batch.
enum Admission {
    /// Its bytes are reserved: start its write.
    Admitted,
    /// Not now: writes in flight will free bytes when they are acknowledged.
    Wait,
    /// Never: nothing is in flight and the pool cannot take it.
    Refused(Status),
}

impl Budget {
    /// A budget of `limit` bytes, reserved in `pool` under `name`.
    pub(super) fn new(pool: &Arc<dyn MemoryPool>, name: String, limit: usize) -> Self {
        Self {
            limit,
            reservation: MemoryConsumer::new(name).register(pool),
            writes: VecDeque::new(),
        }
    }

    /// Reserves a batch of `bytes` for a write, or says why not.
    fn admit(&mut self, bytes: usize) -> Admission {
        let alone = self.writes.is_empty();
        if !alone && self.reservation.size() + bytes > self.limit {
            return Admission::Wait;
        }
        match self.reservation.try_grow(bytes) {
            Ok(()) => {
                self.writes.push_back(bytes);
                Admission::Admitted
            }
            Err(_) if !alone => Admission::Wait,
            Err(error) => Admission::Refused(
                NodeError::MemoryExhausted(format!(
                    "a DoPut batch of {bytes} bytes (the node's memory pool is full; send \
                     smaller batches or retry later): {error}"
                ))
                .into(),
            ),
        }
    }

    /// Frees the bytes of the oldest write, acknowledged.
    fn release_oldest(&mut self) {
        if let Some(bytes) = self.writes.pop_front() {
            self.reservation.shrink(bytes);
        }
    }
}

/// The acknowledgements of a DoPut stream: `start` begins the write of one batch, a
/// write of the pipeline's [`WriteStream`].
pub(super) struct Pipeline<I, B, S, T> {
    input: Option<I>,
    /// A batch read and not yet admitted: its stream's [`Budget`] is spent.
    waiting: Option<Received<B>>,
    start: S,
    in_flight: FuturesOrdered<BoxFuture<'static, Result<T, Status>>>,
    budget: Budget,
    /// What the log knows the writes of this pipeline by.
    stream: WriteStream,
    depth: usize,
    failed: Option<Status>,
    done: bool,
}

impl<I, B, S, T> std::fmt::Debug for Pipeline<I, B, S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("in_flight", &self.in_flight.len())
            .field("budget", &self.budget)
            .field("waiting", &self.waiting.as_ref().map(|w| w.bytes))
            .field("depth", &self.depth)
            .field("reading", &self.input.is_some())
            .field("failed", &self.failed)
            .finish()
    }
}

impl<I, B, S, T> Pipeline<I, B, S, T>
where
    I: Stream<Item = Result<Received<B>, Status>> + Unpin,
    B: Unpin,
    S: FnMut(B, WriteStream) -> BoxFuture<'static, Result<T, Status>> + Unpin,
    T: Send + 'static,
{
    /// A pipeline of at most `depth` writes, and the bytes `budget` allows, in flight over
    /// the decoded `input`.
    pub(super) fn new(input: I, depth: usize, budget: Budget, start: S) -> Self {
        Self {
            input: Some(input),
            waiting: None,
            start,
            in_flight: FuturesOrdered::new(),
            budget,
            stream: WriteStream::default(),
            depth: depth.max(1),
            failed: None,
            done: false,
        }
    }

    /// Stops reading the client's stream; `status` follows the acks already in flight.
    fn fail(&mut self, status: Status) {
        self.failed = Some(status);
        self.stop_reading();
    }

    fn stop_reading(&mut self) {
        self.input = None;
        self.waiting = None;
    }

    /// Starts writes while there is room and input is ready.
    fn admit(&mut self, cx: &mut Context<'_>) {
        while self.failed.is_none() && self.in_flight.len() < self.depth {
            let Some(next) = self.next_batch(cx) else {
                return;
            };
            match self.budget.admit(next.bytes) {
                Admission::Admitted => self.start_write(next.batch, cx),
                Admission::Wait => {
                    self.waiting = Some(next);
                    return;
                }
                Admission::Refused(status) => self.fail(status),
            }
        }
    }

    /// The batch waiting for room, else the client's next one if it is ready.
    fn next_batch(&mut self, cx: &mut Context<'_>) -> Option<Received<B>> {
        if let Some(waiting) = self.waiting.take() {
            return Some(waiting);
        }
        match self.input.as_mut()?.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(batch))) => Some(batch),
            Poll::Ready(Some(Err(status))) => {
                self.fail(status);
                None
            }
            Poll::Ready(None) => {
                self.input = None;
                None
            }
            Poll::Pending => None,
        }
    }

    /// Starts the write of an admitted batch and polls it once (see the module doc).
    fn start_write(&mut self, batch: B, cx: &mut Context<'_>) {
        let mut write = (self.start)(batch, self.stream.clone());
        match write.poll_unpin(cx) {
            // Its bytes stay reserved until the pipeline, which reads nothing more, ends.
            Poll::Ready(Err(status)) => self.fail(status),
            Poll::Ready(Ok(ack)) => {
                self.in_flight.push_back(future::ready(Ok(ack)).boxed());
            }
            Poll::Pending => self.in_flight.push_back(write),
        }
    }
}

impl<I, B, S, T> Stream for Pipeline<I, B, S, T>
where
    I: Stream<Item = Result<Received<B>, Status>> + Unpin,
    B: Unpin,
    S: FnMut(B, WriteStream) -> BoxFuture<'static, Result<T, Status>> + Unpin,
    T: Send + 'static,
{
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        this.admit(cx);
        match this.in_flight.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(ack))) => {
                this.budget.release_oldest();
                Poll::Ready(Some(Ok(ack)))
            }
            Poll::Ready(Some(Err(status))) => {
                // A write that failed in the log itself: the stream ends here. The log
                // writes none of the writes queued behind it, and they are not answered.
                this.done = true;
                this.stop_reading();
                Poll::Ready(Some(Err(status)))
            }
            Poll::Ready(None) => {
                if let Some(status) = this.failed.take() {
                    this.done = true;
                    Poll::Ready(Some(Err(status)))
                } else if this.input.is_none() {
                    this.done = true;
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use arrow::array::{AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::Int64Type;
    use datafusion_execution::memory_pool::{GreedyMemoryPool, UnboundedMemoryPool};
    use futures::stream;

    use super::*;

    fn batch(id: i64) -> RecordBatch {
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![id])) as _)]).unwrap()
    }

    fn id(batch: &RecordBatch) -> i64 {
        batch.column(0).as_primitive::<Int64Type>().value(0)
    }

    fn received(id: i64, bytes: usize) -> Result<Received<RecordBatch>, Status> {
        Ok(Received {
            batch: batch(id),
            bytes,
        })
    }

    fn unbounded() -> Budget {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        Budget::new(&pool, "test".into(), usize::MAX)
    }

    /// What a pipeline over the fake log of [`run_in`] answered and did.
    struct Run {
        answers: Vec<Result<i64, String>>,
        /// The ids written, in order.
        queued: Vec<i64>,
        /// The most writes the log had at once.
        most_at_once: usize,
    }

    /// A fake log: a write of a negative id is refused on its first poll; every other
    /// one is "queued" (recorded) on its first poll and acknowledged after a delay.
    fn run(ids: Vec<i64>, depth: usize) -> (Vec<Result<i64, String>>, Vec<i64>) {
        let batches = ids.into_iter().map(|id| (id, 1)).collect();
        let run = run_in(batches, depth, unbounded());
        (run.answers, run.queued)
    }

    /// [`run`] of batches `(id, bytes)` under `budget`.
    fn run_in(batches: Vec<(i64, usize)>, depth: usize, budget: Budget) -> Run {
        let queued = Arc::new(Mutex::new(Vec::new()));
        let open = Arc::new(Mutex::new((0, 0)));
        let (log, writes) = (Arc::clone(&queued), Arc::clone(&open));
        let start = move |batch: RecordBatch, _| {
            let (log, writes) = (Arc::clone(&log), Arc::clone(&writes));
            async move {
                let id = id(&batch);
                if id < 0 {
                    return Err(Status::invalid_argument(format!("bad batch {id}")));
                }
                log.lock().unwrap().push(id);
                {
                    let mut open = writes.lock().unwrap();
                    open.0 += 1;
                    open.1 = open.1.max(open.0);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                writes.lock().unwrap().0 -= 1;
                Ok(id)
            }
            .boxed()
        };
        let input = stream::iter(batches.into_iter().map(|(id, bytes)| received(id, bytes)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let answers = runtime.block_on(
            Pipeline::new(input, depth, budget, start)
                .map(|r| r.map_err(|s| s.message().to_string()))
                .collect::<Vec<_>>(),
        );
        let queued = queued.lock().unwrap().clone();
        let most_at_once = open.lock().unwrap().1;
        Run {
            answers,
            queued,
            most_at_once,
        }
    }

    #[test]
    fn the_bytes_in_flight_stay_within_the_budget() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let batches = (0..20).map(|id| (id, 10)).collect();
        let run = run_in(batches, 64, Budget::new(&pool, "t".into(), 35));
        assert_eq!(run.answers, (0..20).map(Ok).collect::<Vec<_>>());
        assert_eq!(run.most_at_once, 3, "3 batches of 10 bytes fit in 35");
        assert_eq!(pool.reserved(), 0, "every byte freed once acknowledged");

        let batches = (0..5).map(|id| (id, 100)).collect();
        let run = run_in(batches, 64, Budget::new(&pool, "t".into(), 35));
        assert_eq!(run.answers, (0..5).map(Ok).collect::<Vec<_>>());
        assert_eq!(run.most_at_once, 1, "a batch over the budget goes alone");
    }

    #[test]
    fn a_full_pool_holds_the_stream_back_and_refuses_a_batch_alone_it_cannot_take() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(25));
        let batches = (0..10).map(|id| (id, 10)).collect();
        let run = run_in(batches, 64, Budget::new(&pool, "t".into(), usize::MAX));
        assert_eq!(run.answers, (0..10).map(Ok).collect::<Vec<_>>());
        assert_eq!(run.most_at_once, 2, "the pool takes 2 batches of 10 bytes");

        let batches = vec![(0, 10), (1, 10), (2, 30), (3, 10)];
        let run = run_in(batches, 64, Budget::new(&pool, "t".into(), usize::MAX));
        assert_eq!(run.queued, vec![0, 1], "nothing after the refused batch");
        assert_eq!(run.answers[..2], [Ok(0), Ok(1)]);
        assert_eq!(run.answers.len(), 3);
        let refused = run.answers[2].as_ref().unwrap_err();
        assert!(refused.contains("a DoPut batch of 30 bytes"), "{refused}");
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn every_batch_is_acknowledged_in_order() {
        let (answers, queued) = run((0..100).collect(), 8);
        let acks: Vec<i64> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(acks, (0..100).collect::<Vec<_>>());
        assert_eq!(queued, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn nothing_after_a_refused_batch_is_queued() {
        for depth in [1, 2, 64] {
            let ids: Vec<i64> = (0..10).chain([-1]).chain(11..64).collect();
            let (answers, queued) = run(ids, depth);
            assert_eq!(queued, (0..10).collect::<Vec<_>>(), "depth {depth}");
            let (acks, errors): (Vec<_>, Vec<_>) = answers.into_iter().partition(Result::is_ok);
            assert_eq!(acks.len(), 10, "depth {depth}");
            assert_eq!(
                errors,
                vec![Err("bad batch -1".to_string())],
                "depth {depth}"
            );
        }
    }

    #[test]
    fn a_refused_first_batch_is_the_only_answer() {
        let (answers, queued) = run(vec![-5, 1, 2], 64);
        assert_eq!(answers, vec![Err("bad batch -5".to_string())]);
        assert!(queued.is_empty());
    }

    #[test]
    fn a_decoding_error_stops_the_stream_after_the_acks_before_it() {
        let queued = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&queued);
        let input = stream::iter(vec![
            received(1, 1),
            Err(Status::invalid_argument("malformed")),
            received(2, 1),
        ]);
        let start = move |batch: RecordBatch, _| {
            log.lock().unwrap().push(id(&batch));
            future::ready(Ok(id(&batch))).boxed()
        };
        let answers = futures::executor::block_on(
            Pipeline::new(input, 64, unbounded(), start)
                .map(|r| r.map_err(|s| s.message().to_string()))
                .collect::<Vec<_>>(),
        );
        assert_eq!(answers, vec![Ok(1), Err("malformed".to_string())]);
        assert_eq!(*queued.lock().unwrap(), vec![1]);
    }

    /// `ids` written through the pipeline to a real log table, as a DoPut writes them: a
    /// negative id is an upsert, which the log (of a table without a primary key) refuses
    /// when the group it is queued in is written. Returns each answer (the base offset of
    /// an ack) and the ids the log then holds.
    async fn run_on_log(ids: Vec<i64>, depth: usize) -> (Vec<Result<i64, String>>, Vec<i64>) {
        use arrow::datatypes::{DataType, Field, Schema};
        use mink_core::options::TableOptions;
        use mink_core::table::{TableDescriptor, TablePath};

        use mink_log::{LogConfig, LogTablet, Write, WriteOp};

        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            sync: false,
            ..LogConfig::default()
        };
        let log = Arc::new(LogTablet::open("t".into(), dir.path(), config, None).unwrap());
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
        let path = TablePath::new("db", "t");
        let table = TableDescriptor::new(path, schema, vec![], vec![], TableOptions::default());
        let table = Arc::new(table.unwrap());
        let writer = Arc::clone(&log);
        let start = move |batch: RecordBatch, stream: WriteStream| {
            let log = Arc::clone(&writer);
            let table = Arc::clone(&table);
            async move {
                let op = if id(&batch) < 0 {
                    WriteOp::Upsert(batch)
                } else {
                    WriteOp::Append(batch)
                };
                let stream = Some(stream);
                let ack = log
                    .write(Write {
                        op,
                        table,
                        stream,
                        writer: None,
                        sent: None,
                    })
                    .await
                    .map_err(NodeError::from)?;
                Ok::<_, Status>(ack.base_offset)
            }
            .boxed()
        };
        let input = stream::iter(ids.into_iter().map(|i| received(i, 1)));
        let answers = Pipeline::new(input, depth, unbounded(), start)
            .map(|r| r.map_err(|s| s.message().to_string()))
            .collect::<Vec<_>>()
            .await;
        let stored = log.read(0, u64::MAX).await.unwrap();
        (answers, stored.iter().map(|b| id(&b.batch)).collect())
    }

    #[tokio::test]
    async fn nothing_queued_after_a_batch_the_log_refuses_is_written() {
        let (answers, stored) = run_on_log((0..200).collect(), 64).await;
        let offsets: Vec<i64> = (0..200).collect();
        assert_eq!(answers, offsets.iter().copied().map(Ok).collect::<Vec<_>>());
        assert_eq!(stored, offsets, "a healthy stream: every batch, once");

        for depth in [1, 2, 64] {
            let ids: Vec<i64> = (0..10).chain([-1]).chain(11..64).collect();
            let (answers, stored) = run_on_log(ids, depth).await;
            assert_eq!(stored, (0..10).collect::<Vec<_>>(), "depth {depth}");
            let acks: Vec<_> = (0..10).map(Ok).collect();
            assert_eq!(answers[..10], acks[..], "depth {depth}");
            assert_eq!(answers.len(), 11, "then the error, depth {depth}");
            assert!(answers[10].as_ref().unwrap_err().contains("no primary key"));
        }
    }

    #[test]
    fn a_compressed_header_is_refused_and_an_empty_one_passes() {
        assert!(check_flight_data(FlightData::new()).is_ok());
        let err =
            check_flight_data(FlightData::new().with_data_header(b"garbage".to_vec())).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }
}
