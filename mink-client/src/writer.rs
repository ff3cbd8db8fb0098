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
//! After a failed write nothing more is sent: the writes in flight end, and [`finish`]
//! says how many rows were acknowledged before (a failed DoPut's rows may be partly
//! written: each batch in it is atomic, the DoPut is not). A writer dropped before
//! [`finish`] stops at once, as a client that went away.
//!
//! [`finish`]: TableWriter::finish

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::stream::{FuturesUnordered, StreamExt as _};
use mink_core::protocol::BucketId;
use mink_core::routing::split_by_bucket;
use mink_core::table::TableDescriptor;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;

use crate::{ClientError, MinkClient};

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

/// The end of one DoPut.
struct Put {
    bucket: BucketId,
    rows: usize,
    result: Result<(), ClientError>,
}

/// The writer's task: takes queued writes and keeps every bucket with parts waiting
/// writing, one DoPut in flight each, until the queue closes or a write fails.
async fn write_queued(
    client: MinkClient,
    kind: WriteKind,
    mut queued: mpsc::UnboundedReceiver<Queued>,
    acknowledged_to: watch::Sender<u64>,
) -> Result<u64, WriteFailed> {
    let mut queues = BucketQueues::default();
    let mut in_flight = FuturesUnordered::new();
    let (mut acknowledged, mut queue_open) = (0u64, true);
    let mut failed: Option<(ClientError, usize)> = None;
    loop {
        if failed.is_none() {
            for (bucket, parts) in queues.ready() {
                let client = client.clone();
                in_flight.push(async move {
                    let rows = parts.iter().map(|(part, _)| part.num_rows()).sum();
                    let (parts, rooms): (Vec<RecordBatch>, Vec<_>) = parts.into_iter().unzip();
                    let result = match kind {
                        WriteKind::Write => client.append(&bucket, parts).await,
                        WriteKind::Delete => client.delete_keys(&bucket, parts).await,
                    };
                    drop(rooms);
                    Put {
                        bucket,
                        rows,
                        result: result.map(drop),
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
                    Ok(()) => {
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
