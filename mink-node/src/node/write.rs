//! Writes into a bucket: the batch checked against the table's schema and the bucket's
//! routing, then appended, upserted or deleted by key through the bucket's log. A
//! partition is created by the first write into it, within the node's bounds.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use mink_core::protocol::{AppendAck, BucketId, IdempotentWriter};
use mink_core::table::{TableDescriptor, TablePath};
use mink_log::{SentBatch, Write, WriteOp, WriteStream, Writer, WriterBatch};
use tracing::info;

use super::leadership::moving;
use super::validate::{check_bucket_address, check_routing, conform_keys, conform_to_schema};
use super::{Bucket, Node, SHORT_RECALL_BYTES, Slot, TableState};
use crate::error::{NodeError, Result};

impl Node {
    /// Checks that writes to `bucket` can be accepted (the table exists, the bucket and
    /// partition address fit it), before any data arrives.
    pub fn check_write_address(&self, bucket: &BucketId) -> Result<()> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        check_bucket_address(&state.descriptor(), bucket)
    }

    /// The bucket a write goes to, creating its partition on first write.
    fn bucket_for_write(
        &self,
        state: &TableState,
        descriptor: &Arc<TableDescriptor>,
        bucket: &BucketId,
    ) -> Result<Arc<Bucket>> {
        let mut partitions = state.partitions();
        if !partitions.contains_key(&bucket.partition) {
            let name = bucket
                .partition
                .as_deref()
                .ok_or_else(|| NodeError::BucketNotFound(bucket.to_string()))?;
            let max = self.storage.config.max_partitions;
            if partitions.len() >= max {
                return Err(NodeError::InvalidArgument(format!(
                    "table {} has {} partitions, the most a table may have: partition '{name}' is not created",
                    descriptor.path,
                    partitions.len()
                )));
            }
            if self.membership.is_some() {
                // In a cluster the partition's buckets go to the nodes the controller
                // assigns them to: the write is answered "moving", and retried.
                self.metadata.ensure_partition(descriptor.table_id, name)?;
                let slots = Slot::moving(descriptor, Some(name));
                let moving = slots[bucket.bucket as usize].led_tablets();
                partitions.insert(bucket.partition.clone(), slots);
                return moving;
            }
            let buckets = descriptor.bucket_num as usize;
            let what = format!("partition '{name}' of table {}", descriptor.path);
            self.open_buckets.reserve(buckets, &what)?;
            let tablets = self
                .create_new_partition(descriptor, name)
                .inspect_err(|_| {
                    self.open_buckets.release(buckets);
                })?;
            info!(table = %descriptor.path, partition = name, "created partition");
            partitions.insert(bucket.partition.clone(), Slot::led(tablets));
        }
        partitions[&bucket.partition][bucket.bucket as usize].led_tablets()
    }

    /// Creates a partition that does not exist yet, its buckets reserved: its metadata,
    /// then its tablets, the metadata undone when they fail.
    fn create_new_partition(
        &self,
        descriptor: &Arc<TableDescriptor>,
        name: &str,
    ) -> Result<Vec<Arc<Bucket>>> {
        let record = self.metadata.ensure_partition(descriptor.table_id, name)?;
        self.storage
            .create_partition(descriptor, Some(&record))
            .inspect_err(|_| {
                if let Err(e) = self.metadata.delete_partition(record.partition_id) {
                    tracing::warn!(partition = name, error = %e, "could not roll back a failed partition");
                }
            })
    }

    /// Writes a batch to a bucket once it checks out against the table's schema and the
    /// bucket's routing: appended to a log table, upserted into a primary-key table, or
    /// (with `delete`) deleted from it by key. Resolves when the write is durable.
    ///
    /// `stream` is the DoPut stream the batch belongs to (see [`WriteStream`]): once a
    /// write of the stream is refused or fails in the log, none of its later writes is
    /// written. `None` for a write on its own. A batch that comes with the IPC message a
    /// client sent it in ([`SentBatch`]) is stored as that message when it is stored
    /// unchanged.
    pub async fn write(
        &self,
        bucket: &BucketId,
        batch: impl Into<SentBatch>,
        delete: bool,
        stream: Option<&WriteStream>,
    ) -> Result<AppendAck> {
        self.write_as(bucket, batch, delete, stream, None).await
    }

    /// [`Node::write`] wherever the bucket is led: here, or in a cluster through its
    /// leader (a DoPut of the peers' client, which follows NotLeader while it moves).
    /// Like a one-off client write, a forwarded write is one attempt: an error after it
    /// was sent leaves it unknown whether it landed.
    ///
    /// # Errors
    /// As [`Node::write`], and the leader's answer ([`NodeError::Peer`]).
    pub async fn write_anywhere(
        &self,
        bucket: &BucketId,
        batch: RecordBatch,
        delete: bool,
    ) -> Result<AppendAck> {
        let started = Instant::now();
        let local = self
            .write_sent(bucket, batch.clone().into(), delete, None, None)
            .await;
        let not_leader = match local {
            // Written by the leader, which counts it.
            Err(NodeError::NotLeader(not_leader)) => not_leader,
            written => {
                record_outcome(started, &written);
                return written;
            }
        };
        let Some(peers) = self.peers().await? else {
            return Err(NodeError::NotLeader(not_leader));
        };
        let acks = if delete {
            peers.delete_keys(bucket, vec![batch]).await?
        } else {
            peers.append(bucket, vec![batch]).await?
        };
        acks.into_iter().next().ok_or_else(|| {
            NodeError::OutcomeUnknown(format!(
                "bucket {bucket}'s leader answered no acknowledgement"
            ))
        })
    }

    /// [`Node::write`] by an idempotent writer: its tag is stored with the batch, and a
    /// [`Writer::Checked`] one's batch is written once (see [`Writer`]).
    pub async fn write_as(
        &self,
        bucket: &BucketId,
        batch: impl Into<SentBatch>,
        delete: bool,
        stream: Option<&WriteStream>,
        writer: Option<Writer>,
    ) -> Result<AppendAck> {
        let started = Instant::now();
        let written = self
            .write_sent(bucket, batch.into(), delete, stream, writer)
            .await;
        record_outcome(started, &written);
        written
    }

    /// [`Node::write_as`] without the metrics of its outcome (the rows and bytes of a
    /// write that lands are counted here, by table).
    async fn write_sent(
        &self,
        bucket: &BucketId,
        SentBatch { batch, message }: SentBatch,
        delete: bool,
        stream: Option<&WriteStream>,
        writer: Option<Writer>,
    ) -> Result<AppendAck> {
        let state = self.table(&TablePath::parse(&bucket.table)?)?;
        let table = state.descriptor();
        check_bucket_address(&table, bucket)?;
        let op = match (table.has_primary_key(), delete) {
            (false, false) => WriteOp::Append(conform_to_schema(&table, batch)?),
            (false, true) => {
                return Err(NodeError::InvalidArgument(format!(
                    "table {} is a log table: it has no primary key to delete by",
                    table.path
                )));
            }
            (true, false) => WriteOp::Upsert(conform_to_schema(&table, batch)?),
            (true, true) => WriteOp::Delete(conform_keys(&table, batch)?),
        };
        let (WriteOp::Append(rows) | WriteOp::Upsert(rows) | WriteOp::Delete(rows)) = &op;
        check_routing(&table, bucket, rows)?;
        let counted = rows.clone();
        // Only a valid write creates a partition, and a delete never does: deleting from a
        // partition with no rows changes nothing.
        if delete && !state.partitions().contains_key(&bucket.partition) {
            return Ok(AppendAck {
                base_offset: 0,
                last_offset: -1,
                high_watermark: 0,
                duplicate: false,
            });
        }
        let target = self.bucket_for_write(&state, &table, bucket)?;
        self.check_lease(bucket)?;
        let write = Write {
            // Keys to delete are a batch of their own, not the one sent.
            sent: message.filter(|_| !delete),
            op,
            table,
            stream: stream.cloned(),
            writer,
        };
        let ack = target.log.write(write).await?;
        // A lease that ended meanwhile: the bucket may be another node's by now, and this
        // write then in its log or not (a checked writer's retry is written once).
        if self.check_lease(bucket).is_err() {
            return Err(NodeError::OutcomeUnknown(format!(
                "this node lost its cluster lease while it wrote to bucket {bucket}"
            )));
        }
        // A retry of a batch written before is not written again.
        if !ack.duplicate {
            state.written.add(&counted);
        }
        Ok(ack)
    }

    /// Before an idempotent writer's DoPut is written: the writer's batches that its log
    /// holds from the writer's `since` on, when the DoPut may send some of them again
    /// (see [`mink_log::LogTablet::recall_writer`]). A search of more than
    /// `SHORT_RECALL_BYTES` waits for one of a few turns: made-up writers cannot have the
    /// node read every log at once.
    pub async fn recall_writer(
        &self,
        bucket: &BucketId,
        writer: &IdempotentWriter,
    ) -> Result<Vec<WriterBatch>> {
        let tablets = match self.bucket(bucket) {
            Ok((_, tablets)) => tablets,
            // A partition created by the DoPut's first write holds nothing yet.
            Err(NodeError::BucketNotFound(_)) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let log = &tablets.log;
        let _turn = match log.bytes_from(writer.since) > SHORT_RECALL_BYTES {
            true => Some(
                (self.recalls.acquire().await)
                    .map_err(|_| NodeError::ShuttingDown("the node".into()))?,
            ),
            false => None,
        };
        Ok((log.recall_writer(writer.producer_id, writer.first_sequence, writer.since)).await?)
    }

    /// In a cluster, whether the node still holds the lease it joined with: one that
    /// does not acknowledges no write, its buckets "moving" (see
    /// [`Membership::holds_joined_lease`](crate::cluster::Membership::holds_joined_lease)).
    fn check_lease(&self, bucket: &BucketId) -> Result<()> {
        match self.membership() {
            Some(membership) if !membership.holds_joined_lease() => {
                Err(NodeError::NotLeader(moving(bucket, 0)))
            }
            _ => Ok(()),
        }
    }
}

/// Counts a write's outcome: its latency once acknowledged, or its cause of failure.
fn record_outcome(started: Instant, written: &Result<AppendAck>) {
    let metrics = mink_metrics::metrics();
    match written {
        Ok(_) => metrics
            .write_seconds
            .observe(started.elapsed().as_secs_f64()),
        Err(error) => {
            let cause = [error.metric_cause()];
            metrics.write_failures.with_label_values(&cause).inc();
        }
    }
}
