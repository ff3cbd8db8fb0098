//! `Produce` and `InitProducerId`: Kafka producers writing into tables.
//!
//! A produced record batch becomes rows of the topic's table ([`crate::rows`]), written
//! through the node like any other write: acknowledged once durable (every `acks`
//! value waits for the log's fsync; `acks=0` only skips the answer). Each row goes to
//! the bucket its key routes to: the partition a producer chose only picks the bucket of
//! a table without a bucket key. The answer's base offset is the first row's offset
//! when it went to the chosen partition's bucket, else -1.
//!
//! Idempotent producers (`enable.idempotence`) get a producer id from `InitProducerId`
//! that no restart reuses. Their batches are written with a [`WriterTag`] (producer id,
//! epoch, sequences) in the log frame itself, atomically with the rows; per producer and
//! partition the last batch is also recorded in the Kafka state ([`crate::state`]: the
//! node's `meta.db`, or the cluster's etcd; before a producer's first batch there, a
//! marker of where its batches start). A batch sent again after a lost answer is
//! recognized and not written twice; after a crash, or on a partition's new leader, the
//! first batch of a producer reads the chosen partition's log from the recorded batch
//! on, so a batch the log holds but the record missed is recognized too. What a node
//! remembers of a producer's batches on a partition holds only while it leads the
//! partition without a break: a partition led elsewhere meanwhile is looked up again.
//! The tag goes only on a batch that is one write into the chosen partition's bucket (a
//! log table without a bucket key; a primary-key batch of one kind whose keys all route
//! there), which the log holds whole or not at all. A batch written in several parts (rows routed to other buckets,
//! upserts and tombstones mixed) is not tagged: a crash between its log write and the
//! record makes the retry write it again, never lose part of it. In a cluster, rows
//! routed to a bucket another node leads are written through that node. For a
//! primary-key table that repeats the same upserts and deletes in the same order, which
//! leaves the same rows.
//! Transactions are refused (`TRANSACTIONAL_ID_AUTHORIZATION_FAILED`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use arrow::array::RecordBatch;
use bytes::{Buf, Bytes};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, RecordBatchDecoder};
use mink_core::protocol::BucketId;
use mink_core::routing::split_by_bucket;
use mink_log::{Writer, WriterTag};
use mink_node::Bucket;

use crate::broker::Broker;
use crate::compression::decompress;
use crate::error::{KafkaError, Result};
use crate::limits::{
    MAX_BATCH_RECORDS, MAX_CACHED_PRODUCERS, MAX_REQUEST_RECORDS, PRODUCER_EXPIRATION,
    PRODUCER_EXPIRY_INTERVAL,
};
use crate::periodic::AtMostEvery;
use crate::rows::{Rows, rows_of};
use crate::state::ProducerBatch;
use crate::topics::Topic;

/// The idempotent producers' last batches, per producer; each producer's map is locked
/// while one of its batches is checked, written and recorded. A cache of what the Kafka
/// state records: past [`MAX_CACHED_PRODUCERS`], the producers not writing at the
/// moment are dropped, and found again in the state and the log when they next write.
#[derive(Debug)]
pub(crate) struct Producers {
    producers: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<LastBatches>>>>,
    /// When `meta.db` is next rid of idle producers.
    expiry: AtMostEvery,
}

impl Default for Producers {
    fn default() -> Self {
        Self {
            producers: Mutex::default(),
            expiry: AtMostEvery::new(PRODUCER_EXPIRY_INTERVAL),
        }
    }
}

/// One producer's last batch per (topic, partition), as of the bucket's tablets it was
/// written to: tablets of a later leadership here know nothing of the batches another
/// node wrote meanwhile. `None`: looked up, never written.
type LastBatches = HashMap<(String, i32), (Weak<Bucket>, Option<ProducerBatch>)>;

impl Producers {
    fn of(&self, producer_id: i64) -> Arc<tokio::sync::Mutex<LastBatches>> {
        let mut producers = self
            .producers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if producers.len() >= MAX_CACHED_PRODUCERS && !producers.contains_key(&producer_id) {
            // Only the map hands out its entries: one no batch holds now is idle.
            producers.retain(|_, batches| Arc::strong_count(batches) > 1);
        }
        Arc::clone(producers.entry(producer_id).or_default())
    }
}

/// Forgets the last batches of producers that wrote nothing for [`PRODUCER_EXPIRATION`]
/// (Kafka's `producer.id.expiration.ms`), when that is due: a new producer id for every
/// producer started, and a record for each one that writes, would otherwise pile up for
/// good. Such a producer writing again starts over.
async fn forget_idle_producers(broker: &Broker) {
    if !broker.producers.expiry.due() {
        return;
    }
    match broker
        .state
        .forget_idle_producers(PRODUCER_EXPIRATION)
        .await
    {
        Ok(0) => {}
        Ok(count) => tracing::info!(count, "forgot idle Kafka producers"),
        Err(error) => tracing::warn!(%error, "forgetting idle Kafka producers failed"),
    }
}

/// `InitProducerId`: a new producer id, epoch 0.
pub(crate) async fn init_producer_id(
    broker: &Broker,
    request: &InitProducerIdRequest,
) -> InitProducerIdResponse {
    if request.transactional_id.is_some() {
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    forget_idle_producers(broker).await;
    match broker.state.new_producer_id().await {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(error) => {
            tracing::warn!(%error, "allocating a producer id failed");
            InitProducerIdResponse::default()
                .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}

/// `Produce`: each partition's record batches written, in order.
pub(crate) async fn produce(broker: &Broker, request: ProduceRequest) -> ProduceResponse {
    // Each partition's batch headers are read once, before anything is inflated: their
    // counts bound the request, and a partition whose batches do not parse or announce
    // too many records is refused on its own below.
    let counted: Vec<Vec<Result<usize>>> = request
        .topic_data
        .iter()
        .map(|data| {
            let records = data.partition_data.iter().map(|p| p.records.as_ref());
            records
                .map(|records| records.map_or(Ok(0), announced_records))
                .collect()
        })
        .collect();
    let announced: usize = counted
        .iter()
        .flatten()
        .filter_map(|n| n.as_ref().ok())
        .sum();
    let refused = if request.transactional_id.is_some() {
        Some((
            ResponseError::TransactionalIdAuthorizationFailed,
            "refused".into(),
        ))
    } else if !matches!(request.acks, -1..=1) {
        Some((ResponseError::InvalidRequiredAcks, "refused".into()))
    } else if announced > MAX_REQUEST_RECORDS {
        Some((
            ResponseError::MessageTooLarge,
            format!(
                "the request's batches announce {announced} records (at most {MAX_REQUEST_RECORDS} in one Produce)"
            ),
        ))
    } else {
        None
    };
    let mut topics = Vec::with_capacity(request.topic_data.len());
    for (data, counted) in request.topic_data.into_iter().zip(counted) {
        let topic = Topic::find(&broker.node, data.name.as_str());
        let mut partitions = Vec::with_capacity(data.partition_data.len());
        for (partition, counted) in data.partition_data.into_iter().zip(counted) {
            let answer = PartitionProduceResponse::default()
                .with_index(partition.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let written = match (&refused, &topic) {
                (Some((error, message)), _) => Err(KafkaError::Refused(*error, message.clone())),
                (None, None) => Err(KafkaError::Refused(
                    ResponseError::UnknownTopicOrPartition,
                    format!("no table '{}'", data.name.as_str()),
                )),
                (None, Some(topic)) => {
                    let records = partition.records.unwrap_or_default();
                    produce_partition(broker, topic, partition.index, records, counted).await
                }
            };
            partitions.push(match written {
                Ok(base_offset) => answer.with_base_offset(base_offset),
                Err(error) => {
                    tracing::debug!(%error, "a produce was refused");
                    answer
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(error.to_string())))
                }
            });
        }
        topics.push(
            TopicProduceResponse::default()
                .with_name(data.name)
                .with_partition_responses(partitions),
        );
    }
    ProduceResponse::default().with_responses(topics)
}

/// Writes the record batches of one partition, given what [`announced_records`] found in
/// their headers; the base offset of the first.
async fn produce_partition(
    broker: &Broker,
    topic: &Topic,
    index: i32,
    mut records: Bytes,
    announced: Result<usize>,
) -> Result<i64> {
    let bucket = topic.bucket(index).ok_or_else(|| {
        KafkaError::Refused(
            ResponseError::UnknownTopicOrPartition,
            format!("topic {} has no partition {index}", topic.table.path),
        )
    })?;
    announced?;
    // A broker that does not lead the partition answers NOT_LEADER_OR_FOLLOWER: the
    // producer asks for metadata again.
    let (_, tablets) = broker.node.bucket(&bucket)?;
    let mut base_offset = None;
    while records.has_remaining() {
        let set =
            RecordBatchDecoder::decode_with_custom_compression(&mut records, Some(decompress))
                .map_err(|e| KafkaError::Malformed(format!("a produced record batch: {e}")))?;
        let written = write_batch(broker, topic, index, &bucket, &tablets, &set.records).await?;
        base_offset.get_or_insert(written);
    }
    Ok(base_offset.unwrap_or(-1))
}

/// The records the batches of one partition announce in their headers, read before
/// any is inflated or decoded; a batch announcing more than [`MAX_BATCH_RECORDS`] is
/// refused (`MESSAGE_TOO_LARGE`, on which a Java producer splits its batch and retries).
fn announced_records(records: &Bytes) -> Result<usize> {
    let batches = RecordBatchDecoder::decode_batch_info(&mut records.clone())
        .map_err(|e| KafkaError::Malformed(format!("a produced record batch: {e}")))?;
    let mut total = 0usize;
    for batch in batches {
        // The decoder refuses a negative count.
        let count = usize::try_from(batch.record_count).unwrap_or(usize::MAX);
        if count > MAX_BATCH_RECORDS {
            return Err(KafkaError::Refused(
                ResponseError::MessageTooLarge,
                format!("a batch announcing {count} records (at most {MAX_BATCH_RECORDS})"),
            ));
        }
        total += count;
    }
    Ok(total)
}

/// Writes one record batch, or finds it was written before (an idempotent retry).
async fn write_batch(
    broker: &Broker,
    topic: &Topic,
    index: i32,
    bucket: &BucketId,
    tablets: &Arc<Bucket>,
    records: &[Record],
) -> Result<i64> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Ok(-1);
    };
    if first.transactional || first.control {
        return Err(KafkaError::Refused(
            ResponseError::TransactionalIdAuthorizationFailed,
            "mink does not serve Kafka transactions".into(),
        ));
    }
    let writes = plan_writes(topic, bucket, rows_of(&topic.table, records)?)?;
    if first.producer_id < 0 {
        return write_all(broker, bucket, writes, None).await;
    }
    let tag = WriterTag {
        producer_id: first.producer_id,
        epoch: first.producer_epoch,
        first_sequence: first.sequence,
        last_sequence: last.sequence,
    };
    let name = Topic::name(&topic.table.path);
    let producer = broker.producers.of(tag.producer_id);
    let mut last_batches = producer.lock().await;
    let key = (name.clone(), index);
    let led_since = Arc::downgrade(tablets);
    let previous = match last_batches.get(&key) {
        Some((written_to, known)) if written_to.ptr_eq(&led_since) => *known,
        _ => recover_last_batch(broker, &name, index, tablets, tag).await?,
    };
    let batch = ProducerBatch {
        epoch: tag.epoch,
        first_sequence: tag.first_sequence,
        last_sequence: tag.last_sequence,
        base_offset: -1,
    };
    if let Some(previous) = previous {
        if check_sequence(&previous, &batch)? == SequenceCheck::Retry {
            last_batches.insert(key, (led_since, Some(previous)));
            return Ok(previous.base_offset);
        }
    } else {
        forget_idle_producers(broker).await;
        // The first batch of this producer here: where a later recovery starts looking
        // for its batches in the log, stored before any is written.
        let (_, high_watermark) = tablets.log.offsets();
        let marker = ProducerBatch {
            first_sequence: -1,
            last_sequence: -1,
            base_offset: high_watermark,
            ..batch
        };
        (broker.state)
            .record_producer_batch(tag.producer_id, &name, index, marker)
            .await?;
    }
    // Only a batch that is one write is tagged: a restart that found the tag of a batch
    // written in several parts could not tell which parts are missing.
    let tagged = is_one_write(&writes, bucket).then_some(tag);
    let base_offset = match write_all(broker, bucket, writes, tagged).await {
        Ok(base_offset) => base_offset,
        Err(error) => {
            // The batch may be in the log all the same (the node lost its lease as it
            // wrote): the producer's retry looks for it there, from the recorded batch.
            last_batches.remove(&key);
            return Err(error);
        }
    };
    let written = ProducerBatch {
        base_offset,
        ..batch
    };
    last_batches.insert(key, (led_since, Some(written)));
    // The batch is written: a record that fails only makes a later recovery read more
    // of the log (a tagged batch is found there), so the write is answered all the same.
    let recorded = (broker.state)
        .record_producer_batch(tag.producer_id, &name, index, written)
        .await;
    if let Err(error) = recorded {
        tracing::warn!(%error, producer_id = tag.producer_id, "recording a producer's batch failed");
    }
    Ok(base_offset)
}

/// The last batch a producer wrote to a partition, as a restart or a new leader finds
/// it: the one the state recorded, or a later one the log holds (a crash between the
/// log's fsync and the record leaves the log a batch ahead; the tag in the frame tells).
async fn recover_last_batch(
    broker: &Broker,
    topic: &str,
    index: i32,
    tablets: &Bucket,
    tag: WriterTag,
) -> Result<Option<ProducerBatch>> {
    let recorded = (broker.state)
        .last_producer_batch(tag.producer_id, topic, index)
        .await?;
    let Some(recorded) = recorded else {
        return Ok(None);
    };
    let found = (tablets.log)
        .batches_of_writer(tag.producer_id, recorded.base_offset, u64::MAX)
        .await
        .map_err(mink_node::NodeError::from)?;
    let last = found.last().map_or(recorded, |found| ProducerBatch {
        epoch: found.tag.epoch,
        first_sequence: found.tag.first_sequence,
        last_sequence: found.tag.last_sequence,
        base_offset: found.base_offset,
    });
    if last != recorded {
        tracing::info!(
            producer_id = tag.producer_id,
            topic,
            partition = index,
            last_sequence = last.last_sequence,
            "the log holds a later batch of this producer than its record (a crash came between them, or a record failed)"
        );
    }
    Ok(Some(last))
}

/// What a batch is next to the producer's last one.
#[derive(Debug, PartialEq, Eq)]
enum SequenceCheck {
    /// The next batch: write it.
    Next,
    /// The last batch again (its answer was lost): answer as before, write nothing.
    Retry,
}

fn check_sequence(previous: &ProducerBatch, batch: &ProducerBatch) -> Result<SequenceCheck> {
    let refuse = |error: ResponseError, message: String| Err(KafkaError::Refused(error, message));
    if batch.epoch < previous.epoch {
        return refuse(
            ResponseError::InvalidProducerEpoch,
            format!("epoch {} is older than {}", batch.epoch, previous.epoch),
        );
    }
    if batch.epoch > previous.epoch {
        return if batch.first_sequence == 0 {
            Ok(SequenceCheck::Next)
        } else {
            refuse(
                ResponseError::OutOfOrderSequenceNumber,
                format!(
                    "a new epoch starts at sequence 0, not {}",
                    batch.first_sequence
                ),
            )
        };
    }
    if (batch.first_sequence, batch.last_sequence)
        == (previous.first_sequence, previous.last_sequence)
    {
        return Ok(SequenceCheck::Retry);
    }
    // Sequences wrap from i32::MAX to 0.
    let expected = previous.last_sequence.checked_add(1).unwrap_or(0);
    if batch.first_sequence == expected {
        Ok(SequenceCheck::Next)
    } else if batch.first_sequence < expected {
        refuse(
            ResponseError::DuplicateSequenceNumber,
            format!("sequence {} was written before", batch.first_sequence),
        )
    } else {
        refuse(
            ResponseError::OutOfOrderSequenceNumber,
            format!(
                "sequence {} after {}",
                batch.first_sequence, previous.last_sequence
            ),
        )
    }
}

/// One write of a produced batch: rows (or keys to delete) for one bucket.
struct NodeWrite {
    bucket: BucketId,
    rows: RecordBatch,
    delete: bool,
}

/// The writes a batch's rows take, in order: each run of upserts or deletes, split by the
/// bucket each row routes to.
fn plan_writes(topic: &Topic, chosen: &BucketId, rows: Vec<Rows>) -> Result<Vec<NodeWrite>> {
    let mut writes = Vec::new();
    for run in rows {
        let (batch, delete) = match run {
            Rows::Write(batch) => (batch, false),
            Rows::Delete(keys) => (keys, true),
        };
        for (bucket, rows) in split_by_bucket(&topic.table, &batch, chosen.bucket)? {
            writes.push(NodeWrite {
                bucket,
                rows,
                delete,
            });
        }
    }
    Ok(writes)
}

/// Whether the writes are one write into the chosen bucket: then the log holds all of
/// the batch or none of it, and a [`WriterTag`] in it tells a restart which.
fn is_one_write(writes: &[NodeWrite], chosen: &BucketId) -> bool {
    matches!(writes, [only] if only.bucket == *chosen)
}

/// Makes the writes in order; the first row's offset when it went to `chosen`, else -1.
async fn write_all(
    broker: &Broker,
    chosen: &BucketId,
    writes: Vec<NodeWrite>,
    writer: Option<WriterTag>,
) -> Result<i64> {
    let writer = writer.map(Writer::Unchecked);
    let produced = (mink_metrics::metrics().kafka_produced_records)
        .with_label_values(&[chosen.table.as_str()]);
    let mut base_offset = None;
    for write in writes {
        let records = write.rows.num_rows() as u64;
        let ack = if write.bucket == *chosen {
            (broker.node)
                .write_as(&write.bucket, write.rows, write.delete, None, writer)
                .await?
        } else {
            (broker.node)
                .write_anywhere(&write.bucket, write.rows, write.delete)
                .await?
        };
        produced.inc_by(records);
        base_offset.get_or_insert(if write.bucket == *chosen {
            ack.base_offset
        } else {
            -1
        });
    }
    Ok(base_offset.unwrap_or(-1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(epoch: i16, first_sequence: i32, last_sequence: i32) -> ProducerBatch {
        ProducerBatch {
            epoch,
            first_sequence,
            last_sequence,
            base_offset: 7,
        }
    }

    #[test]
    fn sequences_tell_a_retry_from_the_next_batch() {
        let previous = batch(0, 10, 14);
        assert_eq!(
            check_sequence(&previous, &batch(0, 15, 20)).unwrap(),
            SequenceCheck::Next
        );
        assert_eq!(
            check_sequence(&previous, &batch(0, 10, 14)).unwrap(),
            SequenceCheck::Retry
        );
        assert_eq!(
            check_sequence(&previous, &batch(1, 0, 3)).unwrap(),
            SequenceCheck::Next
        );
        let code = |b| check_sequence(&previous, &b).unwrap_err().code();
        assert_eq!(
            code(batch(0, 5, 9)),
            ResponseError::DuplicateSequenceNumber.code()
        );
        assert_eq!(
            code(batch(0, 17, 20)),
            ResponseError::OutOfOrderSequenceNumber.code()
        );
        assert_eq!(
            code(batch(1, 4, 9)),
            ResponseError::OutOfOrderSequenceNumber.code()
        );
        let newer = batch(2, 0, 0);
        assert_eq!(
            check_sequence(&newer, &previous).unwrap_err().code(),
            ResponseError::InvalidProducerEpoch.code()
        );
        let wrapped = batch(0, i32::MAX - 1, i32::MAX);
        assert_eq!(
            check_sequence(&wrapped, &batch(0, 0, 3)).unwrap(),
            SequenceCheck::Next
        );
    }
}
