//! `Metadata` and `FindCoordinator`: which broker leads each partition and coordinates
//! each group ([`crate::brokers`]).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use mink_core::table::TableDescriptor;
use mink_node::NodeError;
use uuid::Uuid;

use crate::broker::Broker;
use crate::brokers::{BrokerAddress, Brokers};
use crate::topics::Topic;

/// The cluster id clients see.
const CLUSTER_ID: &str = "mink";
/// `FindCoordinator` key types.
const GROUP_KEY: i8 = 0;

/// A topic's stable id: the table id under a fixed prefix, so a table dropped and
/// created again under the same name is a new topic to clients.
pub(crate) fn topic_id(table: &TableDescriptor) -> Uuid {
    Uuid::from_u64_pair(u64::from_be_bytes(*b"minktopc"), table.table_id)
}

/// `Metadata`: the live brokers and the asked topics (every table when none are
/// named), each partition with the broker leading its bucket (`LEADER_NOT_AVAILABLE`
/// while it moves).
pub(crate) async fn metadata(broker: &Broker, request: MetadataRequest) -> MetadataResponse {
    let names: Vec<String> = match request.topics {
        Some(topics) => topics
            .into_iter()
            .filter_map(|t| t.name.map(|n| n.0.to_string()))
            .collect(),
        None => broker
            .node
            .list_tables(None)
            .iter()
            .map(Topic::name)
            .collect(),
    };
    let live = broker.brokers.live().await;
    let topics = names
        .into_iter()
        .map(|name| topic_metadata(broker, &live, name))
        .collect();
    let controller = live
        .iter()
        .map(|b| b.id)
        .min()
        .unwrap_or(broker.brokers.me().id);
    MetadataResponse::default()
        .with_brokers(live.iter().map(broker_metadata).collect())
        .with_cluster_id(Some(StrBytes::from_static_str(CLUSTER_ID)))
        .with_controller_id(BrokerId(controller))
        .with_topics(topics)
}

fn broker_metadata(broker: &BrokerAddress) -> MetadataResponseBroker {
    MetadataResponseBroker::default()
        .with_node_id(BrokerId(broker.id))
        .with_host(StrBytes::from_string(broker.host.clone()))
        .with_port(broker.port)
}

fn topic_metadata(broker: &Broker, live: &[BrokerAddress], name: String) -> MetadataResponseTopic {
    let answer = MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
    let Some(topic) = Topic::find(&broker.node, &name) else {
        return answer.with_error_code(ResponseError::UnknownTopicOrPartition.code());
    };
    let partitions = (0..topic.partition_count())
        .map(|index| {
            let partition = MetadataResponsePartition::default().with_partition_index(index);
            match partition_leader(broker, live, &topic, index) {
                Some(leader) => partition
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(leader_epoch(broker))
                    .with_replica_nodes(vec![BrokerId(leader)])
                    .with_isr_nodes(vec![BrokerId(leader)]),
                None => partition
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_leader_id(BrokerId(-1))
                    .with_leader_epoch(-1),
            }
        })
        .collect();
    answer
        .with_topic_id(topic_id(&topic.table))
        .with_partitions(partitions)
}

/// The broker leading a partition's bucket; `None` while the bucket moves or its
/// leader's broker is not known yet.
fn partition_leader(
    broker: &Broker,
    live: &[BrokerAddress],
    topic: &Topic,
    index: i32,
) -> Option<i32> {
    let bucket = topic.bucket(index)?;
    match broker.node.bucket(&bucket) {
        Ok(_) => Some(broker.brokers.me().id),
        Err(NodeError::NotLeader(not_leader)) => {
            Brokers::at_node(live, not_leader.leader.as_deref()?).map(|leader| leader.id)
        }
        Err(_) => None,
    }
}

/// The leader epoch partitions are answered with: 0 on a single node, which leads
/// every partition for good; -1 (unknown) in a cluster, where only the leader knows
/// its epoch and clients would take a lower one from another broker as stale metadata.
fn leader_epoch(broker: &Broker) -> i32 {
    if broker.node.membership().is_some() {
        -1
    } else {
        0
    }
}

/// `FindCoordinator`: the broker coordinating each group; transactions are not served.
pub(crate) async fn find_coordinator(
    broker: &Broker,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let keys = if version >= 4 {
        request.coordinator_keys
    } else {
        vec![request.key]
    };
    let mut coordinators = Vec::with_capacity(keys.len());
    for key in keys {
        let found = Coordinator::default().with_key(key.clone());
        coordinators.push(if request.key_type == GROUP_KEY {
            let coordinator = broker.brokers.coordinator(key.as_str()).await;
            found
                .with_node_id(BrokerId(coordinator.id))
                .with_host(StrBytes::from_string(coordinator.host))
                .with_port(coordinator.port)
        } else {
            found
                .with_node_id(BrokerId(-1))
                .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
                .with_error_message(Some(StrBytes::from_static_str(
                    "mink does not serve Kafka transactions",
                )))
        });
    }
    if version >= 4 {
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let found = coordinators.pop().unwrap_or_default();
    FindCoordinatorResponse::default()
        .with_error_code(found.error_code)
        .with_error_message(found.error_message)
        .with_node_id(found.node_id)
        .with_host(found.host)
        .with_port(found.port)
}
