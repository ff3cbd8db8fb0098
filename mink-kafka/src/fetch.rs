//! `Fetch`: each topic partition is a bucket read by Tail (`docs/design.md#read-protocol`,
//! `docs/kafka.md`).
//!
//! The answer holds every asked partition's batches from its fetch offset up to the high
//! watermark, within `max_bytes` over all partitions and `partition_max_bytes` each (the
//! first chunk of rows at the fetch offset of the first partition with data is always
//! sent, so a consumer makes progress; a bound is passed by at most one chunk,
//! [`crate::limits::FETCH_CHUNK_ROWS`] rows). When the answer holds fewer than `min_bytes`, the fetch
//! waits, up to `max_wait_ms`, for any asked partition's watermark to move, and reads
//! again. A fetch offset outside `[log_start, high watermark]` is `OFFSET_OUT_OF_RANGE`
//! for that partition. Fetch sessions (KIP-227) are not kept: every answer carries
//! session id 0, which tells clients to send full fetches.

use std::sync::Arc;

use bytes::BytesMut;
use futures::future::select_all;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::records::RecordBatchDecoder;
use mink_core::protocol::limits::tail_wait;
use mink_core::table::TableDescriptor;
use mink_log::LogError;
use mink_node::Bucket;
use mink_node::NodeError;
use tokio::time::Instant;

use crate::broker::Broker;
use crate::error::{KafkaError, Result};
use crate::limits::fetch_bytes;
use crate::records::encode_batch;
use crate::topics::Topic;

/// A partition of the request, resolved once.
struct Asked {
    partition: FetchPartition,
    /// The bucket's table and tablets; `None` for a topic or partition that does not exist.
    bucket: Option<(Arc<TableDescriptor>, Arc<Bucket>)>,
}

/// `Fetch`: every asked partition read from its fetch offset, after a wait when the
/// answer would hold fewer than `min_bytes`.
pub(crate) async fn fetch(broker: &Broker, request: FetchRequest) -> FetchResponse {
    let max_bytes = fetch_bytes(request.max_bytes);
    let min_bytes = u64::try_from(request.min_bytes).unwrap_or(0).min(max_bytes);
    let wait = tail_wait(u64::try_from(request.max_wait_ms).unwrap_or(0));
    let deadline = Instant::now() + wait;
    let asked: Vec<(TopicName, Vec<Asked>)> = request
        .topics
        .into_iter()
        .map(|topic| {
            let found = Topic::find(&broker.node, topic.topic.as_str());
            let partitions = topic
                .partitions
                .into_iter()
                .map(|partition| {
                    let bucket = found
                        .as_ref()
                        .and_then(|t| t.bucket(partition.partition))
                        .and_then(|b| broker.node.bucket(&b).ok());
                    Asked { partition, bucket }
                })
                .collect();
            (topic.topic, partitions)
        })
        .collect();
    loop {
        let (answer, bytes, failed) = read(&asked, max_bytes).await;
        if bytes >= min_bytes || failed || Instant::now() >= deadline {
            count_sent(&answer, bytes);
            return answer;
        }
        wait_for_any(&asked, deadline).await;
    }
}

/// Counts the records and bytes an answer sends (`mink_kafka_fetched_*`): the record
/// counts in its batches' headers.
fn count_sent(answer: &FetchResponse, bytes: u64) {
    let records: i64 = (answer.responses.iter())
        .flat_map(|topic| &topic.partitions)
        .filter_map(|partition| partition.records.clone())
        .filter_map(|mut records| RecordBatchDecoder::decode_batch_info(&mut records).ok())
        .flatten()
        .map(|batch| i64::from(batch.record_count))
        .sum();
    let metrics = mink_metrics::metrics();
    metrics.kafka_fetched_bytes.inc_by(bytes);
    (metrics.kafka_fetched_records).inc_by(u64::try_from(records).unwrap_or(0));
}

/// One pass over every asked partition: the answer, its record bytes, and whether a
/// partition failed (which answers at once).
async fn read(asked: &[(TopicName, Vec<Asked>)], max_bytes: u64) -> (FetchResponse, u64, bool) {
    let mut left = max_bytes;
    let mut total = 0u64;
    let mut failed = false;
    let mut topics = Vec::with_capacity(asked.len());
    for (name, partitions) in asked {
        let mut answers = Vec::with_capacity(partitions.len());
        for asked in partitions {
            let index = asked.partition.partition;
            let answer = PartitionData::default()
                .with_partition_index(index)
                .with_preferred_read_replica(BrokerId(-1));
            let answer = match read_partition(asked, left, total == 0).await {
                Ok((data, records)) => {
                    let size = records.len() as u64;
                    total += size;
                    left = left.saturating_sub(size);
                    data.with_partition_index(index)
                        .with_preferred_read_replica(BrokerId(-1))
                        .with_records(Some(records.freeze()))
                }
                Err(error) => {
                    failed = true;
                    answer.with_error_code(error.code())
                }
            };
            answers.push(answer);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(name.clone())
                .with_partitions(answers),
        );
    }
    (
        FetchResponse::default().with_responses(topics),
        total,
        failed,
    )
}

/// One partition's records from its fetch offset, within `left` bytes (the first chunk
/// of rows at least when `first` is set: nothing was sent yet).
async fn read_partition(
    asked: &Asked,
    left: u64,
    first: bool,
) -> Result<(PartitionData, BytesMut)> {
    let (table, bucket) = asked.bucket.as_ref().ok_or_else(|| {
        KafkaError::Node(NodeError::BucketNotFound(format!(
            "partition {}",
            asked.partition.partition
        )))
    })?;
    let offset = asked.partition.fetch_offset;
    let budget = fetch_bytes(asked.partition.partition_max_bytes).min(left);
    let mut records = BytesMut::new();
    if budget > 0 || first {
        let (_, high_watermark) = bucket.log.offsets();
        if offset != high_watermark {
            let batches = bucket
                .log
                .read(offset, budget.max(1))
                .await
                .map_err(NodeError::from)?;
            for batch in &batches {
                if !records.is_empty() && records.len() as u64 + batch.size > budget {
                    break;
                }
                encode_batch(table, batch, offset, budget, &mut records)?;
            }
        }
    }
    // Read after the batches, so the watermark is never below what was sent.
    let (log_start, high_watermark) = bucket.log.offsets();
    if offset < log_start || offset > high_watermark {
        return Err(KafkaError::Node(NodeError::Log(
            LogError::OffsetOutOfRange {
                bucket: asked.partition.partition.to_string(),
                offset,
                log_start,
                high_watermark,
            },
        )));
    }
    let data = PartitionData::default()
        .with_high_watermark(high_watermark)
        .with_last_stable_offset(high_watermark)
        .with_log_start_offset(log_start);
    Ok((data, records))
}

/// Waits until some asked partition has rows past its fetch offset, or the deadline.
async fn wait_for_any(asked: &[(TopicName, Vec<Asked>)], deadline: Instant) {
    let max_wait = deadline.saturating_duration_since(Instant::now());
    let waits: Vec<_> = asked
        .iter()
        .flat_map(|(_, partitions)| partitions)
        .filter_map(|asked| {
            let (_, bucket) = asked.bucket.as_ref()?;
            let offset = asked.partition.fetch_offset;
            Some(Box::pin(bucket.log.wait_for(offset, 1, max_wait)))
        })
        .collect();
    if waits.is_empty() {
        tokio::time::sleep_until(deadline).await;
    } else {
        let _ = select_all(waits).await;
    }
}
