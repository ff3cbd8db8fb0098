//! `Metadata` and `FindCoordinator`: the one node leads every partition and coordinates
//! every group.

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
use uuid::Uuid;

use crate::broker::{BROKER_ID, Broker};
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

/// `Metadata`: the asked topics (every table when none are named), each partition led
/// by this node.
pub(crate) fn metadata(broker: &Broker, request: MetadataRequest) -> MetadataResponse {
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
    let topics = names
        .into_iter()
        .map(|name| topic_metadata(broker, name))
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(BROKER_ID))
                .with_host(StrBytes::from_string(broker.host.clone()))
                .with_port(broker.port),
        ])
        .with_cluster_id(Some(StrBytes::from_static_str(CLUSTER_ID)))
        .with_controller_id(BrokerId(BROKER_ID))
        .with_topics(topics)
}

fn topic_metadata(broker: &Broker, name: String) -> MetadataResponseTopic {
    let answer = MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
    let Some(topic) = Topic::find(&broker.node, &name) else {
        return answer.with_error_code(ResponseError::UnknownTopicOrPartition.code());
    };
    let partitions = (0..topic.partition_count())
        .map(|index| {
            MetadataResponsePartition::default()
                .with_partition_index(index)
                .with_leader_id(BrokerId(BROKER_ID))
                .with_leader_epoch(0)
                .with_replica_nodes(vec![BrokerId(BROKER_ID)])
                .with_isr_nodes(vec![BrokerId(BROKER_ID)])
        })
        .collect();
    answer
        .with_topic_id(topic_id(&topic.table))
        .with_partitions(partitions)
}

/// `FindCoordinator`: this node, for groups; transactions are not served.
pub(crate) fn find_coordinator(
    broker: &Broker,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let coordinator = |key: StrBytes| {
        let found = Coordinator::default()
            .with_key(key)
            .with_node_id(BrokerId(BROKER_ID))
            .with_host(StrBytes::from_string(broker.host.clone()))
            .with_port(broker.port);
        if request.key_type == GROUP_KEY {
            found
        } else {
            found
                .with_node_id(BrokerId(-1))
                .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
                .with_error_message(Some(StrBytes::from_static_str(
                    "mink does not serve Kafka transactions",
                )))
        }
    };
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .into_iter()
            .map(coordinator)
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let found = coordinator(request.key);
    FindCoordinatorResponse::default()
        .with_error_code(found.error_code)
        .with_error_message(found.error_message)
        .with_node_id(found.node_id)
        .with_host(found.host)
        .with_port(found.port)
}
