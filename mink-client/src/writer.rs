//! The pipelined table writer: rows routed to their buckets, every bucket written as an
//! ordered queue, buckets side by side.
//!
//! ```text
//!  caller                         writer task
//!  write(batch) ── route ──────▶  per-bucket queues ─ DoPut, one in flight per bucket;
//!   (waits while the writer          parts that wait meanwhile go together, in order,
//!    holds its limit of rows)        in its next; acks free the rows' room
//! ```
//!
//! Two DoPuts to one bucket in flight at once may land in either order, so a bucket has
//! one at most, and what it queued meanwhile follows in one DoPut stream, which keeps the
//! order. The writer runs as a task of its own: writes go on while its caller reads its
//! next input. At most its limit of rows is queued or being written, which bounds its
//! memory; a caller's `write` waits for room.
//!
//! # Written once
//!
//! A write whose answer is lost (its node died after the write was durable, the
//! connection broke, the node lost its lease as it wrote) is sent again, to the bucket's
//! leader, until it is answered or [`ConnectOptions::follow_for`] passes, and written
//! once: the writer is an idempotent writer ([`IdempotentWriter`]) with a random id, which
//! numbers its messages in each bucket. The node writes a number once and answers a
//! number sent again with the earlier write; a new leader of the bucket looks for the
//! writer's batches in its log from the offset the writer names, at or below every
//! earlier attempt: the bucket's high watermark before the writer's first write to it
//! (asked for once per bucket), then the end of its last acknowledged batch.
//!
//! ```text
//!   DoPut #4..#6 to n1 ── n1 writes #4 #5, dies ──▶ lost answer
//!   DoPut #4..#6 to n2 (the new leader, since = end of #3)
//!        n2 finds #4 #5 in the log from `since`: answers them as written, writes #6
//! ```
//!
//! After a write that failed otherwise (refused, or still unanswered at the end) nothing
//! more is sent: the writes in flight end, and [`finish`] says how many rows were
//! acknowledged before (a failed DoPut's rows may be partly written: each batch in it is
//! atomic, the DoPut is not). A writer dropped before [`finish`] stops at once, as a
//! client that went away.
//!
//! [`finish`]: TableWriter::finish
//! [`ConnectOptions::follow_for`]: crate::ConnectOptions::follow_for

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use futures::stream::{FuturesUnordered, StreamExt as _};
use mink_core::protocol::{AppendAck, BucketId, IdempotentWriter, list_offsets};
use mink_core::routing::split_by_bucket;
use mink_core::table::TableDescriptor;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{ClientError, MinkClient};

/// The pause before a write whose answer was lost is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Rows of a table's buckets, as the writer sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// Appended to a log table, upserted into a primary-key table.
    Write,
    /// Deleted by key (the rows hold the primary-key columns).
    Delete,
}

/// Why a [`TableWriter`] stopped.
#[derive(Debug, thiserror::Error)]
#[error(
    "{error}; {acknowledged_rows} rows were written before the failure (the {failed_rows} rows of the failed write may be partly written)"
)]
pub struct WriteFailed {
    /// The failure.
    pub error: ClientError,
    /// Rows acknowledged before it.
    pub acknowledged_rows: u64,
    /// Rows of the write that failed.
    pub failed_rows: usize,
}

/// Parts of one write, each for a bucket, with the room their rows hold.
struct Queued {
    parts: Vec<(BucketId, RecordBatch)>,
    room: OwnedSemaphorePermit,
}

/// The writer's task: the rows written in all, or why it stopped.
type WriterTask = JoinHandle<Result<u64, WriteFailed>>;

/// Writes a table's rows, pipelined (see the module doc).
#[derive(Debug)]
pub struct TableWriter {
    table: Arc<TableDescriptor>,
    /// The queue of the writer's task and the task: taken by [`TableWriter::finish`], the
    /// task aborted if the writer is dropped before.
    running: Option<(mpsc::UnboundedSender<Queued>, WriterTask)>,
    room: Arc<Semaphore>,
    max_rows: usize,
    acknowledged: watch::Receiver<u64>,
    /// Its round robin over the buckets of a table without a bucket key is the client's.
    client: MinkClient,
}

impl TableWriter {
    /// A writer of `table` through `client` that holds at most `max_rows` rows queued or
    /// being written (a larger write is let in alone). Starts a task on the current
    /// runtime.
    pub fn new(
        client: &MinkClient,
        table: Arc<TableDescriptor>,
        kind: WriteKind,
        max_rows: usize,
    ) -> Self {
        let max_rows = max_rows.clamp(1, Semaphore::MAX_PERMITS);
        let (queue, queued) = mpsc::unbounded_channel();
        let (acknowledged_to, acknowledged) = watch::channel(0);
        let task = tokio::spawn(write_queued(client.clone(), kind, queued, acknowledged_to));
        Self {
            table,
            running: Some((queue, task)),
            room: Arc::new(Semaphore::new(max_rows)),
            max_rows,
            acknowledged,
            client: client.clone(),
        }
    }

    /// Routes `batch` (in the table's current schema) to its buckets and queues it
    /// behind what was queued before; waits for room first.
    ///
    /// # Errors
    /// The batch does not route (see [`split_by_bucket`]), or a write failed: the
    /// writer sends nothing more, and [`TableWriter::finish`] says what was written.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<(), ClientError> {
        let parts = split_by_bucket(&self.table, batch, self.client.next_round_robin())?;
        self.write_routed(parts).await
    }

    /// Queues parts already routed to their buckets (as [`split_by_bucket`] routes them),
    /// in order behind what was queued before; waits for room first.
    ///
    /// # Errors
    /// A write failed: see [`TableWriter::write`].
    pub async fn write_routed(
        &mut self,
        parts: Vec<(BucketId, RecordBatch)>,
    ) -> Result<(), ClientError> {
        let rows: usize = parts.iter().map(|(_, part)| part.num_rows()).sum();
        if rows == 0 {
            return Ok(());
        }
        let permits = u32::try_from(rows.min(self.max_rows)).unwrap_or(u32::MAX);
        let room = Arc::clone(&self.room)
            .acquire_many_owned(permits)
            .await
            .map_err(|_| stopped())?;
        let (queue, _) = self.running.as_ref().ok_or_else(stopped)?;
        queue.send(Queued { parts, room }).map_err(|_| stopped())
    }

    /// Rows acknowledged so far.
    pub fn acknowledged_rows(&self) -> u64 {
        *self.acknowledged.borrow()
    }

    /// Waits for every write queued; the rows written in all.
    ///
    /// # Errors
    /// A write failed (the rows acknowledged before it are written).
    pub async fn finish(mut self) -> Result<u64, WriteFailed> {
        let (queue, task) = self.running.take().expect("a writer is finished once");
        // The queue closes: the task ends once what it holds is written.
        drop(queue);
        task.await.unwrap_or_else(|error| {
            Err(WriteFailed {
                error: ClientError::Protocol(format!("the writer's task failed: {error}")),
                acknowledged_rows: *self.acknowledged.borrow(),
                failed_rows: 0,
            })
        })
    }
}

/// A writer dropped before [`TableWriter::finish`] (its caller gave up: a cancelled
/// statement, a client gone) stops: what it has not sent yet is not sent.
impl Drop for TableWriter {
    fn drop(&mut self) {
        if let Some((_, task)) = self.running.take() {
            task.abort();
        }
    }
}

fn stopped() -> ClientError {
    ClientError::Protocol("the table writer stopped after a failed write".into())
}

/// The end of one DoPut: the writer's place in the bucket after it.
struct Put {
    bucket: BucketId,
    rows: usize,
    result: Result<Place, ClientError>,
}

/// The writer's place in a bucket: the number of its next message there, and an offset
/// at or below any write of it not acknowledged (`None` before its first write there).
#[derive(Debug, Clone, Copy, Default)]
struct Place {
    next_sequence: i32,
    since: Option<i64>,
}

impl Place {
    /// The place after `messages` messages acknowledged by `acks`.
    fn after(self, since: i64, messages: usize, acks: &[AppendAck]) -> Result<Self, ClientError> {
        let next_sequence = i32::try_from(messages)
            .ok()
            .and_then(|messages| self.next_sequence.checked_add(messages))
            .ok_or_else(|| {
                ClientError::Protocol(format!(
                    "a writer numbers at most {} messages per bucket",
                    i32::MAX
                ))
            })?;
        let end = acks.iter().map(|ack| ack.last_offset + 1).max();
        Ok(Self {
            next_sequence,
            since: Some(end.map_or(since, |end| end.max(since))),
        })
    }
}

/// One DoPut of the writer to one bucket.
struct BucketPut<'a> {
    client: &'a MinkClient,
    bucket: &'a BucketId,
    delete: bool,
    producer_id: i64,
}

impl BucketPut<'_> {
    /// Writes `parts` as the writer's next messages in the bucket, sent again while their
    /// answer is lost (see "Written once" in the module doc); the writer's place after.
    async fn write_once(
        &self,
        parts: Vec<RecordBatch>,
        place: Place,
    ) -> Result<Place, ClientError> {
        let deadline = Instant::now() + self.client.leaders().follow_for();
        let since = match place.since {
            Some(since) => since,
            None => self.high_watermark().await?,
        };
        let writer = IdempotentWriter {
            producer_id: self.producer_id,
            first_sequence: place.next_sequence,
            since,
        };
        loop {
            let sent = (self.client)
                .put_as(self.bucket, parts.clone(), self.delete, writer)
                .await;
            match sent {
                Ok(put) => return place.after(since, put.messages, &put.acks),
                Err(error) if answer_lost(&error) && Instant::now() < deadline => {
                    tracing::debug!(bucket = %self.bucket, %error, "a write's answer was lost: sent again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The bucket's high watermark before the writer's first write to it; 0 for a
    /// partition that does not exist yet.
    async fn high_watermark(&self) -> Result<i64, ClientError> {
        let latest = list_offsets::Spec::Latest(true);
        match self.client.list_offsets(self.bucket, latest).await {
            Err(error) if error.code() == Some(tonic::Code::NotFound) => Ok(0),
            offset => offset,
        }
    }
}

/// Whether a write may have failed on its way back, or before it was written: its
/// node went away, its connection broke, it lost its lease as it wrote, or it did not
/// lead the bucket when the write reached it.
fn answer_lost(error: &ClientError) -> bool {
    use tonic::Code;
    match error {
        ClientError::PartlyWritten { error, .. } => answer_lost(error),
        ClientError::Connect { .. } => true,
        error if error.not_leader().is_some() => true,
        error => matches!(
            error.code(),
            Some(Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded)
        ),
    }
}

/// The writer's task: takes queued writes and keeps every bucket with parts waiting
/// writing, one DoPut in flight each, until the queue closes or a write fails.
async fn write_queued(
    client: MinkClient,
    kind: WriteKind,
    mut queued: mpsc::UnboundedReceiver<Queued>,
    acknowledged_to: watch::Sender<u64>,
) -> Result<u64, WriteFailed> {
    let producer_id = rand::random_range(0..=i64::MAX);
    let mut places: HashMap<BucketId, Place> = HashMap::new();
    let mut queues = BucketQueues::default();
    let mut in_flight = FuturesUnordered::new();
    let (mut acknowledged, mut queue_open) = (0u64, true);
    let mut failed: Option<(ClientError, usize)> = None;
    loop {
        if failed.is_none() {
            for (bucket, parts) in queues.ready() {
                let client = client.clone();
                let place = places.remove(&bucket).unwrap_or_default();
                in_flight.push(async move {
                    let rows = parts.iter().map(|(part, _)| part.num_rows()).sum();
                    let (parts, rooms): (Vec<RecordBatch>, Vec<_>) = parts.into_iter().unzip();
                    let put = BucketPut {
                        client: &client,
                        bucket: &bucket,
                        delete: kind == WriteKind::Delete,
                        producer_id,
                    };
                    let result = put.write_once(parts, place).await;
                    drop(rooms);
                    Put {
                        bucket,
                        rows,
                        result,
                    }
                });
            }
        }
        tokio::select! {
            item = queued.recv(), if queue_open && failed.is_none() => match item {
                Some(Queued { parts, room }) => {
                    let room = Arc::new(room);
                    for (bucket, part) in parts {
                        queues.push(bucket, (part, Arc::clone(&room)));
                    }
                }
                None => queue_open = false,
            },
            Some(put) = in_flight.next() => {
                queues.finished(&put.bucket);
                match put.result {
                    Ok(place) => {
                        places.insert(put.bucket, place);
                        acknowledged += put.rows as u64;
                        acknowledged_to.send_replace(acknowledged);
                    }
                    Err(error) => {
                        if failed.is_none() {
                            failed = Some((error, put.rows));
                            // Nothing more is sent: what waits is dropped, its room freed.
                            queues = BucketQueues::default();
                            queued.close();
                        }
                    }
                }
            },
            else => break,
        }
    }
    match failed {
        None => Ok(acknowledged),
        Some((error, failed_rows)) => Err(WriteFailed {
            error,
            acknowledged_rows: acknowledged,
            failed_rows,
        }),
    }
}

/// A part waiting, with the room of the write it came in.
type Waiting = (RecordBatch, Arc<OwnedSemaphorePermit>);

/// Per-bucket write queues: parts of a bucket wait, in the order pushed, while the
/// bucket has a DoPut in flight, and are then taken together.
#[derive(Debug, Default)]
struct BucketQueues {
    waiting: BTreeMap<BucketId, Vec<Waiting>>,
    busy: BTreeSet<BucketId>,
}

impl BucketQueues {
    /// Queues a part behind the bucket's earlier parts.
    fn push(&mut self, bucket: BucketId, part: Waiting) {
        self.waiting.entry(bucket).or_default().push(part);
    }

    /// Takes the waiting parts of every bucket with no DoPut in flight, and marks those
    /// buckets busy.
    fn ready(&mut self) -> Vec<(BucketId, Vec<Waiting>)> {
        let idle: Vec<BucketId> = (self.waiting.keys())
            .filter(|bucket| !self.busy.contains(*bucket))
            .cloned()
            .collect();
        idle.into_iter()
            .filter_map(|bucket| {
                let parts = self.waiting.remove(&bucket)?;
                self.busy.insert(bucket.clone());
                Some((bucket, parts))
            })
            .collect()
    }

    /// Marks the bucket's DoPut finished.
    fn finished(&mut self, bucket: &BucketId) {
        self.busy.remove(bucket);
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn bucket(n: u32) -> BucketId {
        BucketId {
            table: "db.t".into(),
            partition: None,
            bucket: n,
        }
    }

    fn part(ids: &[i64]) -> Waiting {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let column = Arc::new(Int64Array::from(ids.to_vec()));
        let batch = RecordBatch::try_new(schema, vec![column]).unwrap();
        let room = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        (batch, Arc::new(room))
    }

    fn ids((batch, _): &Waiting) -> Vec<i64> {
        let column = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        column.values().to_vec()
    }

    #[test]
    fn a_busy_bucket_keeps_its_parts_in_order_for_its_next_put() {
        let mut queues = BucketQueues::default();
        queues.push(bucket(0), part(&[1]));
        queues.push(bucket(1), part(&[2]));
        let ready = queues.ready();
        assert_eq!(
            ready.iter().map(|(b, _)| b.bucket).collect::<Vec<_>>(),
            [0, 1]
        );
        assert!(queues.ready().is_empty());

        queues.push(bucket(0), part(&[3]));
        queues.push(bucket(0), part(&[4]));
        assert!(queues.ready().is_empty(), "bucket 0 is still writing");
        queues.finished(&bucket(1));
        assert!(queues.ready().is_empty(), "bucket 1 has nothing waiting");
        queues.finished(&bucket(0));
        let ready = queues.ready();
        assert_eq!(ready.len(), 1);
        let (b, parts) = &ready[0];
        assert_eq!(b.bucket, 0);
        assert_eq!(parts.iter().map(ids).collect::<Vec<_>>(), [[3], [4]]);
    }
}
