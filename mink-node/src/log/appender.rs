//! The single writer of a tablet: group commit of appends.
//!
//! The appender takes every pending write, turns each into the batch the log stores (for
//! a primary-key table, its changelog: see [`Changelog`]), writes the frames, fsyncs
//! once, lets the changelog hook make the writes visible (the KV store), and only then
//! moves the high watermark and acknowledges. A failed write or fsync cuts the segment
//! back to where it was and aborts the hook, so the log and the KV store stay exactly as
//! acknowledged.

use std::io::Write as _;
use std::sync::Arc;

use mink_core::protocol::AppendAck;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use super::recovery::ActiveSegment;
use super::segment::{self, FrameHeader, StoredBatch};
use super::{Changelog, LogConfig, Shared, Write, WriteOp, now_ms};
use crate::error::{NodeError, Result};

/// Most writes one group commit takes.
const MAX_GROUP: usize = 256;

/// One write waiting for its acknowledgement.
#[derive(Debug)]
pub(super) struct WriteRequest {
    pub(super) write: Write,
    pub(super) reply: oneshot::Sender<Result<AppendAck>>,
}

/// What became of one write of a group.
#[derive(Debug)]
enum Outcome {
    /// Stored as this frame.
    Written(FrameHeader, Arc<StoredBatch>),
    /// Nothing to store (a delete of missing keys), at this offset.
    Nothing(i64),
    /// Refused; the rest of the group goes on.
    Refused(NodeError),
}

/// The single writer of a tablet.
#[derive(Debug)]
pub(super) struct Appender {
    pub(super) shared: Arc<Shared>,
    pub(super) config: LogConfig,
    pub(super) active: ActiveSegment,
    pub(super) next_offset: i64,
    pub(super) last_timestamp: i64,
    pub(super) changelog: Option<Box<dyn Changelog>>,
    /// Set when the KV store could not be updated after a durable write: the bucket
    /// refuses writes until a restart replays the log into the store.
    pub(super) broken: Option<String>,
}

impl Appender {
    pub(super) async fn run(mut self, mut requests: mpsc::Receiver<WriteRequest>) {
        while let Some(first) = requests.recv().await {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match requests.try_recv() {
                    Ok(request) => group.push(request),
                    Err(_) => break,
                }
            }
            let joined = tokio::task::spawn_blocking(move || {
                let outcome = self.commit(&group);
                (self, group, outcome)
            })
            .await;
            let (appender, group, outcome) = match joined {
                Ok(done) => done,
                Err(e) => {
                    error!(error = %e, "log appender stopped");
                    return;
                }
            };
            self = appender;
            match outcome {
                Ok(outcomes) => {
                    for (request, outcome) in group.into_iter().zip(outcomes) {
                        let _ = request.reply.send(outcome);
                    }
                }
                Err(error) => {
                    warn!(bucket = %self.shared.label, %error, "write failed and was rolled back");
                    for request in group {
                        let _ = request.reply.send(Err(error.for_another_waiter()));
                    }
                }
            }
        }
    }

    /// Writes a group, makes it durable, then publishes it. On an I/O error the segment
    /// is cut back to where it was, so the log stays exactly as acknowledged.
    fn commit(&mut self, group: &[WriteRequest]) -> Result<Vec<Result<AppendAck>>> {
        if let Some(reason) = &self.broken {
            return Err(NodeError::ShuttingDown(format!(
                "bucket {} (restart the node: {reason})",
                self.shared.label
            )));
        }
        self.roll_if_needed().map_err(|e| self.classify(e))?;
        let (start_len, start_frames, start_offset) =
            (self.active.len, self.active.frames.len(), self.next_offset);
        let written = self.write_group(group).and_then(|outcomes| {
            if self.config.sync {
                self.active.file.sync_data()?;
            }
            Ok(outcomes)
        });
        let outcomes = match written {
            Ok(outcomes) => outcomes,
            Err(error) => {
                if let Some(changelog) = &mut self.changelog {
                    changelog.abort();
                }
                self.active.frames.truncate(start_frames);
                self.active.len = start_len;
                self.next_offset = start_offset;
                if let Err(e) = self.active.file.set_len(start_len) {
                    warn!(bucket = %self.shared.label, error = %e, "could not cut back a failed write");
                }
                return Err(self.classify(error));
            }
        };
        if let Some(changelog) = &mut self.changelog
            && let Err(error) = changelog.commit(self.next_offset)
        {
            // The log is durable, the KV store is behind it: a restart replays the log.
            error!(bucket = %self.shared.label, %error, "KV store update failed after a durable write");
            self.broken = Some(error.to_string());
            return Err(error);
        }
        Ok(self.publish(outcomes))
    }

    /// Makes written frames visible to readers and returns the acknowledgements.
    fn publish(&mut self, outcomes: Vec<Outcome>) -> Vec<Result<AppendAck>> {
        let high_watermark = self.next_offset;
        let mut state = self.shared.write_state();
        let acks = outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Outcome::Written(header, stored) => {
                    state.batches.push_back((header, self.active.base));
                    let size = u64::from(header.payload_len);
                    state.cache.insert(header.base_offset, stored, size);
                    Ok(AppendAck {
                        base_offset: header.base_offset,
                        last_offset: header.last_offset(),
                        high_watermark,
                    })
                }
                Outcome::Nothing(offset) => Ok(AppendAck {
                    base_offset: offset,
                    last_offset: offset - 1,
                    high_watermark,
                }),
                Outcome::Refused(error) => Err(error),
            })
            .collect();
        state.high_watermark = high_watermark;
        state.active_segment = self.active.base;
        drop(state);
        self.shared.watermark.send_replace(high_watermark);
        acks
    }

    /// Prepares and writes every write of the group; only I/O errors fail the group.
    fn write_group(&mut self, group: &[WriteRequest]) -> Result<Vec<Outcome>> {
        let mut outcomes = Vec::with_capacity(group.len());
        for request in group {
            let stored = match self.prepare(&request.write) {
                Ok(Some(stored)) => stored,
                Ok(None) => {
                    outcomes.push(Outcome::Nothing(self.next_offset));
                    continue;
                }
                Err(error) => {
                    outcomes.push(Outcome::Refused(error));
                    continue;
                }
            };
            self.last_timestamp = self.last_timestamp.max(now_ms());
            let records = u32::try_from(stored.batch.num_rows());
            let Ok(records) = records else {
                outcomes.push(Outcome::Refused(NodeError::InvalidArgument(
                    "a batch of more than 2^32 rows".into(),
                )));
                continue;
            };
            let mut header = FrameHeader {
                base_offset: self.next_offset,
                records,
                commit_timestamp: self.last_timestamp,
                schema_id: request.write.table.current().schema_id,
                has_changes: false,
                position: self.active.len,
                payload_len: 0,
            };
            let frame = segment::encode_frame(&mut header, &stored)?;
            self.active.file.write_all(&frame)?;
            self.active.len += frame.len() as u64;
            self.active.frames.push(header);
            self.next_offset = header.last_offset() + 1;
            outcomes.push(Outcome::Written(header, Arc::new(stored)));
        }
        Ok(outcomes)
    }

    /// The batch a write stores: the batch itself for a log table, the changelog for a
    /// primary-key table; `None` when there is nothing to store.
    fn prepare(&mut self, write: &Write) -> Result<Option<StoredBatch>> {
        match (&mut self.changelog, &write.op) {
            (None, WriteOp::Append(batch)) => Ok(Some(StoredBatch {
                batch: batch.clone(),
                changes: None,
            })),
            (None, WriteOp::Upsert(_) | WriteOp::Delete(_)) => {
                Err(NodeError::InvalidArgument(format!(
                    "table {} has no primary key to upsert or delete by",
                    write.table.path
                )))
            }
            (Some(changelog), _) => changelog.prepare(write),
        }
    }

    fn roll_if_needed(&mut self) -> Result<()> {
        let Some(first) = self.active.frames.first() else {
            return Ok(());
        };
        let age = now_ms() - first.commit_timestamp;
        let max_age = i64::try_from(self.config.segment_max_age.as_millis()).unwrap_or(i64::MAX);
        if self.active.len < self.config.segment_bytes && age <= max_age {
            return Ok(());
        }
        self.active.file.sync_data()?;
        segment::write_index(&self.shared.dir, self.active.base, &self.active.frames)?;
        self.active = ActiveSegment::create(&self.shared.dir, self.next_offset)?;
        Ok(())
    }

    fn classify(&self, error: NodeError) -> NodeError {
        match error {
            NodeError::Io(source)
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::StorageFull
                        | std::io::ErrorKind::FileTooLarge
                        | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                NodeError::DiskFull {
                    bucket: self.shared.label.clone(),
                    source,
                }
            }
            other => other,
        }
    }
}
