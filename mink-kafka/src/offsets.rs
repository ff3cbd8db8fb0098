//! Offsets: `ListOffsets` (by position and time, `docs/design.md#read-protocol`), and the offsets
//! consumer groups commit (`OffsetCommit`, `OffsetFetch`), stored durably in the node's
//! metadata (`meta.db`) under the topic's full name `database.table`.
//!
//! Committed offsets do not pile up for good: as Kafka's `offsets.retention.minutes`,
//! a group without members that commits nothing for [`OFFSETS_RETENTION`] loses them
//! (an OffsetCommit or OffsetFetch looks for such groups at most every
//! [`OFFSETS_EXPIRY_INTERVAL`](crate::limits::OFFSETS_EXPIRY_INTERVAL)), and at most
//! [`MAX_COMMITTED_GROUPS`] groups have some, so that a client naming a new group in
//! every commit cannot fill the disk meanwhile.

use std::collections::HashMap;

use crate::state::{ConsumerOffset, OffsetsCommitted};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    ListOffsetsRequest, ListOffsetsResponse, OffsetCommitRequest, OffsetCommitResponse,
    OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use mink_core::protocol::BucketId;
use mink_core::protocol::list_offsets::Spec;

use crate::broker::Broker;
use crate::error::KafkaError;
use crate::limits::{
    MAX_COMMITTED_GROUPS, MAX_GROUP_ID_BYTES, MAX_OFFSET_METADATA_BYTES, OFFSETS_RETENTION,
};
use crate::topics::Topic;

/// `ListOffsets` timestamps with a meaning of their own.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

/// `ListOffsets`: Earliest (`log_start`), Latest (the high watermark) or the first
/// offset committed at or after a timestamp. MAX_TIMESTAMP (-3) and the tiered specs are
/// not served (`INVALID_REQUEST`).
pub(crate) async fn list_offsets(
    broker: &Broker,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for asked in request.topics {
        let topic = Topic::find(&broker.node, asked.name.as_str());
        let mut partitions = Vec::with_capacity(asked.partitions.len());
        for partition in asked.partitions {
            let answer = ListOffsetsPartitionResponse::default()
                .with_partition_index(partition.partition_index)
                .with_timestamp(-1)
                .with_offset(-1);
            let bucket = topic
                .as_ref()
                .and_then(|t| t.bucket(partition.partition_index));
            let answer = match (bucket, partition.timestamp) {
                (None, _) => answer.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                (Some(_), t) if t < 0 && t != LATEST && t != EARLIEST => {
                    answer.with_error_code(ResponseError::InvalidRequest.code())
                }
                (Some(bucket), timestamp) => match offset_at(broker, &bucket, timestamp).await {
                    Ok((offset, timestamp)) => answer.with_offset(offset).with_timestamp(timestamp),
                    Err(error) => answer.with_error_code(error.code()),
                },
            };
            partitions.push(answer);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(asked.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// The offset of a `ListOffsets` timestamp, with the timestamp Kafka answers beside it:
/// -1 for Earliest and Latest; for a time, the commit time of the batch found, or offset
/// -1 when every row is older.
async fn offset_at(
    broker: &Broker,
    bucket: &BucketId,
    timestamp: i64,
) -> Result<(i64, i64), KafkaError> {
    let spec = match timestamp {
        EARLIEST => Spec::Earliest(true),
        LATEST => Spec::Latest(true),
        at => Spec::Timestamp(at),
    };
    let offset = broker.node.list_offsets(bucket, &spec)?;
    if timestamp < 0 {
        return Ok((offset, -1));
    }
    let (_, tablet) = broker.node.bucket(bucket)?;
    let (_, high_watermark) = tablet.log.offsets();
    if offset >= high_watermark {
        return Ok((-1, -1));
    }
    let found = tablet
        .log
        .read(offset, 1)
        .await
        .map_err(mink_node::NodeError::from)?;
    let committed = found
        .first()
        .map_or(timestamp, |batch| batch.commit_timestamp);
    Ok((offset, committed))
}

/// Forgets the committed offsets of the groups without members that committed nothing
/// for [`OFFSETS_RETENTION`], when that is due.
async fn forget_idle_groups(broker: &Broker) {
    if !broker.offsets_expiry.due() {
        return;
    }
    let active = broker.groups.with_members();
    match broker
        .state
        .forget_idle_groups(OFFSETS_RETENTION, active)
        .await
    {
        Ok(0) => {}
        Ok(count) => tracing::info!(count, "forgot the committed offsets of idle groups"),
        Err(error) => tracing::warn!(%error, "forgetting idle groups' committed offsets failed"),
    }
}

/// `OffsetCommit`: every partition of a known topic is stored, in one transaction;
/// partitions of unknown topics, and those whose metadata is longer than
/// [`MAX_OFFSET_METADATA_BYTES`] (`OFFSET_METADATA_TOO_LARGE`), are refused one by one;
/// a group id longer than [`MAX_GROUP_ID_BYTES`] refuses them all (`INVALID_GROUP_ID`),
/// and so does a broker that does not coordinate the group (`NOT_COORDINATOR`) and a
/// group with no offsets stored once [`MAX_COMMITTED_GROUPS`] groups have some
/// (`COORDINATOR_NOT_AVAILABLE`).
pub(crate) async fn commit(broker: &Broker, request: OffsetCommitRequest) -> OffsetCommitResponse {
    forget_idle_groups(broker).await;
    let group = request.group_id.0.to_string();
    let refused = if group.len() > MAX_GROUP_ID_BYTES {
        Some(ResponseError::InvalidGroupId.code())
    } else if !broker.brokers.coordinates(&group).await {
        Some(ResponseError::NotCoordinator.code())
    } else {
        broker.groups.check_commit(
            &group,
            request.generation_id_or_member_epoch,
            request.member_id.as_str(),
        )
    };
    let mut stored = Vec::new();
    let mut topics = Vec::with_capacity(request.topics.len());
    for asked in request.topics {
        let topic = Topic::find(&broker.node, asked.name.as_str());
        let mut partitions = Vec::with_capacity(asked.partitions.len());
        for partition in asked.partitions {
            let known = topic
                .as_ref()
                .is_some_and(|t| t.bucket(partition.partition_index).is_some());
            let metadata_bytes = partition.committed_metadata.as_ref().map_or(0, |m| m.len());
            let code = match (refused, known, &topic) {
                (Some(code), _, _) => code,
                (None, false, _) | (None, true, None) => {
                    ResponseError::UnknownTopicOrPartition.code()
                }
                (None, true, Some(_)) if metadata_bytes > MAX_OFFSET_METADATA_BYTES => {
                    ResponseError::OffsetMetadataTooLarge.code()
                }
                (None, true, Some(topic)) => {
                    stored.push(ConsumerOffset {
                        topic: Topic::name(&topic.table.path),
                        partition: partition.partition_index,
                        offset: partition.committed_offset,
                        metadata: partition.committed_metadata.map(|m| m.to_string()),
                    });
                    0
                }
            };
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(partition.partition_index)
                    .with_error_code(code),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(asked.name)
                .with_partitions(partitions),
        );
    }
    if !stored.is_empty() {
        let saved = (broker.state)
            .commit_offsets(&group, stored, MAX_COMMITTED_GROUPS)
            .await;
        match saved {
            Ok(OffsetsCommitted::Stored) => {}
            Ok(OffsetsCommitted::TooManyGroups) => {
                refuse_stored(&mut topics, ResponseError::CoordinatorNotAvailable);
            }
            Err(KafkaError::Refused(error, message)) => {
                tracing::debug!(%message, "a commit of offsets was refused");
                refuse_stored(&mut topics, error);
            }
            Err(error) => {
                tracing::warn!(%error, "storing committed offsets failed");
                refuse_stored(&mut topics, ResponseError::KafkaStorageError);
            }
        }
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// Answers `error` for every partition of a commit that was to be stored.
fn refuse_stored(topics: &mut [OffsetCommitResponseTopic], error: ResponseError) {
    for topic in topics {
        for partition in &mut topic.partitions {
            if partition.error_code == 0 {
                partition.error_code = error.code();
            }
        }
    }
}

/// `OffsetFetch`: the offsets a group committed (-1 for a partition it never did); every
/// partition it committed when no topics are named. A broker that does not coordinate
/// the group answers `NOT_COORDINATOR`.
pub(crate) async fn fetch_committed(
    broker: &Broker,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    forget_idle_groups(broker).await;
    let group = request.group_id.0.to_string();
    if group.len() > MAX_GROUP_ID_BYTES {
        return refused_fetch(request, version, ResponseError::InvalidGroupId);
    }
    let committed = if broker.brokers.coordinates(&group).await {
        broker.state.committed_offsets(&group).await
    } else {
        Err(KafkaError::Refused(
            ResponseError::NotCoordinator,
            format!("group {group} is coordinated by another broker"),
        ))
    };
    let committed = match committed {
        Ok(committed) => committed,
        Err(error) => {
            let code = match error {
                KafkaError::Refused(code, _) => code,
                error => {
                    tracing::warn!(%error, "reading committed offsets failed");
                    ResponseError::CoordinatorNotAvailable
                }
            };
            return refused_fetch(request, version, code);
        }
    };
    let mut by_topic: HashMap<String, Vec<ConsumerOffset>> = HashMap::new();
    for offset in committed {
        by_topic
            .entry(offset.topic.clone())
            .or_default()
            .push(offset);
    }
    let answer = |offset: &ConsumerOffset| {
        OffsetFetchResponsePartition::default()
            .with_partition_index(offset.partition)
            .with_committed_offset(offset.offset)
            .with_committed_leader_epoch(-1)
            .with_metadata(offset.metadata.clone().map(StrBytes::from_string))
    };
    let topics = match request.topics {
        None => by_topic
            .iter()
            .map(|(name, offsets)| {
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(StrBytes::from_string(name.clone())))
                    .with_partitions(offsets.iter().map(answer).collect())
            })
            .collect(),
        Some(asked) => asked
            .into_iter()
            .map(|topic| {
                let full = Topic::find(&broker.node, topic.name.as_str())
                    .map(|t| Topic::name(&t.table.path));
                let offsets = full.and_then(|f| by_topic.get(&f));
                let partitions = topic
                    .partition_indexes
                    .iter()
                    .map(|index| {
                        offsets
                            .and_then(|o| o.iter().find(|o| o.partition == *index))
                            .map_or_else(
                                || {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(*index)
                                        .with_committed_offset(-1)
                                        .with_committed_leader_epoch(-1)
                                },
                                answer,
                            )
                    })
                    .collect();
                OffsetFetchResponseTopic::default()
                    .with_name(topic.name)
                    .with_partitions(partitions)
            })
            .collect(),
    };
    OffsetFetchResponse::default().with_topics(topics)
}

/// An `OffsetFetch` answered `error`: at the top from v2, in every asked partition
/// before (an answer naming no partition fails too, but says nothing of why).
fn refused_fetch(
    request: OffsetFetchRequest,
    version: i16,
    error: ResponseError,
) -> OffsetFetchResponse {
    if version >= 2 {
        return OffsetFetchResponse::default().with_error_code(error.code());
    }
    let topics = (request.topics.unwrap_or_default().into_iter())
        .map(|topic| {
            let partitions = (topic.partition_indexes.iter())
                .map(|index| {
                    OffsetFetchResponsePartition::default()
                        .with_partition_index(*index)
                        .with_committed_offset(-1)
                        .with_error_code(error.code())
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponse::default().with_topics(topics)
}
