//! What a write to the log carries: its rows and what to do with them, the table it was
//! validated against, the client stream it belongs to (the appender's stop rule) and the
//! idempotent writer that sent it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::array::RecordBatch;
use mink_core::table::TableDescriptor;

use crate::SentMessage;

/// An idempotent writer's batch (a Kafka producer's, a mink writer's): who wrote it and
/// its sequence numbers. It is stored in the batch's frame, atomically with the rows, so
/// after a crash or a leader move the log itself tells whether a batch the writer sends
/// again was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterTag {
    /// The producer id.
    pub producer_id: i64,
    /// The producer's epoch.
    pub epoch: i16,
    /// The sequence number of the batch's first record.
    pub first_sequence: i32,
    /// The sequence number of its last record.
    pub last_sequence: i32,
}

/// One write to a bucket, validated against its table.
#[derive(Debug)]
pub struct Write {
    /// What to do.
    pub op: WriteOp,
    /// The table as the write was validated against (its current schema version).
    pub table: Arc<TableDescriptor>,
    /// The DoPut stream the write belongs to; `None` for a write on its own.
    pub stream: Option<WriteStream>,
    /// The idempotent writer writing, stored with the batch; `None` for other writers.
    pub writer: Option<Writer>,
    /// The message the client sent the op's rows in, which the log stores as it is when
    /// it stores those rows unchanged.
    pub sent: Option<SentMessage>,
}

/// An idempotent writer of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// One whose batches the log writes once each (a mink writer's DoPut): see the
    /// `writers` module.
    Checked(WriterTag),
    /// One whose batches are checked before they reach the log (Kafka's producers: see
    /// mink-kafka's `produce`); the log only stores its tag.
    Unchecked(WriterTag),
}

/// The kinds of write.
#[derive(Debug)]
pub enum WriteOp {
    /// Append rows to a log table.
    Append(RecordBatch),
    /// Upsert whole rows into a primary-key table.
    Upsert(RecordBatch),
    /// Delete rows of a primary-key table by key (the batch holds the key columns).
    Delete(RecordBatch),
}

/// The writes of one client stream (a DoPut) to a tablet, which stop at their first
/// failure: once one of them is refused or fails, the appender writes none of the later
/// ones (see the stop rule in the appender's module doc).
///
/// A write joins the stream by carrying it in [`Write::stream`]; the clones of one
/// `WriteStream` share one flag, so a DoPut makes one (the default) and gives each of its
/// writes a clone.
#[derive(Debug, Clone, Default)]
pub struct WriteStream(Arc<AtomicBool>);

impl WriteStream {
    /// Whether a write of the stream was refused or failed.
    pub(crate) fn stopped(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// A write of the stream was refused or failed: none of the later ones is written.
    pub(crate) fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}
