//! An idempotent writer's DoPut ([`IdempotentWriter`] in its header): each message of the
//! stream is the writer's next batch in the bucket, numbered from the header's
//! `first_sequence`, and written as a [`Writer::Checked`] batch, which the log writes
//! once (mink-log's `writers` module). A batch the log answers as written before takes
//! that write's offsets from the writer's batches the node recalled from its log before
//! the stream's first write, when the log no longer knew them.

use std::collections::HashMap;
use std::sync::Arc;

use mink_core::protocol::{AppendAck, BucketId, IdempotentWriter};
use mink_log::{Writer, WriterBatch, WriterTag};

use crate::error::{NodeError, Result};
use crate::node::Node;

/// The numbers of an idempotent writer's batches in one DoPut.
#[derive(Debug)]
pub(super) struct Numbering {
    writer: IdempotentWriter,
    /// The next message's number; `None` past `i32::MAX`.
    next: Option<i32>,
    /// The writer's batches in the log that the stream may send again, by number.
    recalled: Arc<HashMap<i32, WriterBatch>>,
}

impl Numbering {
    /// The numbering of `writer`'s DoPut to `bucket`, after the node recalled the batches
    /// of the writer it may send again.
    pub(super) async fn start(
        node: &Node,
        bucket: &BucketId,
        writer: IdempotentWriter,
    ) -> Result<Self> {
        let recalled = node.recall_writer(bucket, &writer).await?;
        Ok(Self {
            writer,
            next: Some(writer.first_sequence),
            recalled: Arc::new(
                (recalled.into_iter())
                    .map(|batch| (batch.tag.last_sequence, batch))
                    .collect(),
            ),
        })
    }

    /// The writer of the stream's next message.
    ///
    /// # Errors
    /// The writer's numbers run past `i32::MAX`.
    pub(super) fn next(&mut self) -> Result<Numbered> {
        let sequence = self.next.ok_or_else(|| {
            NodeError::InvalidArgument(format!(
                "writer {} numbered its batches past {}: a writer starts again with a new id",
                self.writer.producer_id,
                i32::MAX
            ))
        })?;
        self.next = sequence.checked_add(1);
        Ok(Numbered {
            tag: WriterTag {
                producer_id: self.writer.producer_id,
                epoch: 0,
                first_sequence: sequence,
                last_sequence: sequence,
            },
            recalled: Arc::clone(&self.recalled),
        })
    }
}

/// One numbered batch of an idempotent writer.
#[derive(Debug)]
pub(super) struct Numbered {
    tag: WriterTag,
    recalled: Arc<HashMap<i32, WriterBatch>>,
}

impl Numbered {
    /// The batch's writer, for the log.
    pub(super) fn writer(&self) -> Writer {
        Writer::Checked(self.tag)
    }

    /// The batch's acknowledgement: a duplicate whose offsets the log no longer knew
    /// takes those the node recalled.
    pub(super) fn acknowledged(&self, mut ack: AppendAck) -> AppendAck {
        if ack.duplicate
            && ack.base_offset < 0
            && let Some(earlier) = self.recalled.get(&self.tag.last_sequence)
        {
            ack.base_offset = earlier.base_offset;
            ack.last_offset = earlier.last_offset;
        }
        ack
    }
}
