//! DoPut: a client's batches in, one acknowledgement per batch out, in order.
//!
//! Up to [`PUT_PIPELINE`] batches of one stream are in flight at once, so they share
//! group commits. The pipeline keeps one promise: **after an error, nothing later in the
//! stream is written.** A client that sees acks for batches `0..k` and then an error may
//! retry from batch `k` without duplicating anything.
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

use std::pin::Pin;
use std::task::{Context, Poll};

use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use futures::future::{self, BoxFuture};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use mink_core::ipc_guard;
use tonic::Status;

use super::flight_error_to_status;
#[cfg(doc)]
use super::limits::PUT_PIPELINE;
use crate::error::NodeError;
use crate::log::{SentBatch, WriteStream};

/// Refuses a FlightData whose IPC header declares compression, before any decoder sees
/// it. A message without a header (a descriptor only) passes: nothing in it is decoded.
pub(super) fn check_flight_data(data: FlightData) -> Result<FlightData, Status> {
    if !data.data_header.is_empty() {
        ipc_guard::check_header(&data.data_header).map_err(NodeError::from)?;
    }
    Ok(data)
}

/// The batches of a DoPut stream, each with the message it came in (see [`SentBatch`]):
/// one schema message first, then record batch messages (dictionaries between them).
pub(super) fn sent_batches(
    data: impl Stream<Item = Result<FlightData, FlightError>> + Send + 'static,
) -> impl Stream<Item = Result<SentBatch, Status>> {
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
                    Ok(Some(SentBatch::from_flight(decoded.inner, batch)))
                }
            };
            future::ready(batch)
        })
}

/// The acknowledgements of a DoPut stream: `start` begins the write of one batch, a
/// write of the pipeline's [`WriteStream`].
pub(super) struct Pipeline<I, S, T> {
    input: Option<I>,
    start: S,
    in_flight: FuturesOrdered<BoxFuture<'static, Result<T, Status>>>,
    /// What the log knows the writes of this pipeline by.
    stream: WriteStream,
    depth: usize,
    failed: Option<Status>,
    done: bool,
}

impl<I, S, T> std::fmt::Debug for Pipeline<I, S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("in_flight", &self.in_flight.len())
            .field("depth", &self.depth)
            .field("reading", &self.input.is_some())
            .field("failed", &self.failed)
            .finish()
    }
}

impl<I, B, S, T> Pipeline<I, S, T>
where
    I: Stream<Item = Result<B, Status>> + Unpin,
    S: FnMut(B, WriteStream) -> BoxFuture<'static, Result<T, Status>> + Unpin,
    T: Send + 'static,
{
    /// A pipeline of at most `depth` writes in flight over the decoded `input`.
    pub(super) fn new(input: I, depth: usize, start: S) -> Self {
        Self {
            input: Some(input),
            start,
            in_flight: FuturesOrdered::new(),
            stream: WriteStream::default(),
            depth: depth.max(1),
            failed: None,
            done: false,
        }
    }

    /// Stops reading the client's stream; `status` follows the acks already in flight.
    fn fail(&mut self, status: Status) {
        self.failed = Some(status);
        self.input = None;
    }

    /// Starts writes while there is room and input is ready.
    fn admit(&mut self, cx: &mut Context<'_>) {
        while self.failed.is_none() && self.in_flight.len() < self.depth {
            let Some(input) = self.input.as_mut() else {
                return;
            };
            match input.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(batch))) => {
                    let mut write = (self.start)(batch, self.stream.clone());
                    match write.poll_unpin(cx) {
                        Poll::Ready(Err(status)) => self.fail(status),
                        Poll::Ready(Ok(ack)) => {
                            self.in_flight.push_back(future::ready(Ok(ack)).boxed());
                        }
                        Poll::Pending => self.in_flight.push_back(write),
                    }
                }
                Poll::Ready(Some(Err(status))) => self.fail(status),
                Poll::Ready(None) => self.input = None,
                Poll::Pending => return,
            }
        }
    }
}

impl<I, B, S, T> Stream for Pipeline<I, S, T>
where
    I: Stream<Item = Result<B, Status>> + Unpin,
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
            Poll::Ready(Some(Ok(ack))) => Poll::Ready(Some(Ok(ack))),
            Poll::Ready(Some(Err(status))) => {
                // A write that failed in the log itself: the stream ends here. The log
                // writes none of the writes queued behind it, and they are not answered.
                this.done = true;
                this.input = None;
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
    use futures::stream;

    use super::*;

    fn batch(id: i64) -> RecordBatch {
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![id])) as _)]).unwrap()
    }

    fn id(batch: &RecordBatch) -> i64 {
        batch.column(0).as_primitive::<Int64Type>().value(0)
    }

    /// A fake log: a write of a negative id is refused on its first poll; every other
    /// one is "queued" (recorded) on its first poll and acknowledged after a delay.
    fn run(ids: Vec<i64>, depth: usize) -> (Vec<Result<i64, String>>, Vec<i64>) {
        let queued = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&queued);
        let start = move |batch: RecordBatch, _| {
            let log = Arc::clone(&log);
            async move {
                let id = id(&batch);
                if id < 0 {
                    return Err(Status::invalid_argument(format!("bad batch {id}")));
                }
                log.lock().unwrap().push(id);
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(id)
            }
            .boxed()
        };
        let input = stream::iter(ids.into_iter().map(|i| Ok(batch(i))));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let answers = runtime.block_on(
            Pipeline::new(input, depth, start)
                .map(|r| r.map_err(|s| s.message().to_string()))
                .collect::<Vec<_>>(),
        );
        let queued = queued.lock().unwrap().clone();
        (answers, queued)
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
            Ok(batch(1)),
            Err(Status::invalid_argument("malformed")),
            Ok(batch(2)),
        ]);
        let start = move |batch: RecordBatch, _| {
            log.lock().unwrap().push(id(&batch));
            future::ready(Ok(id(&batch))).boxed()
        };
        let answers = futures::executor::block_on(
            Pipeline::new(input, 64, start)
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

        use crate::log::{LogConfig, LogTablet, Write, WriteOp};

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
                    .await?;
                Ok::<_, Status>(ack.base_offset)
            }
            .boxed()
        };
        let input = stream::iter(ids.into_iter().map(|i| Ok(batch(i))));
        let answers = Pipeline::new(input, depth, start)
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
