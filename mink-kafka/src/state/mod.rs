//! What the Kafka listener keeps beyond the log: consumer groups' committed offsets,
//! producer ids, and each idempotent producer's last batch per partition, with when each
//! group and producer was last used, so that idle ones are forgotten.
//!
//! Two stores keep it ([`KafkaState`]): a single node's `meta.db` ([`SqliteState`]),
//! and a cluster's etcd ([`EtcdState`]), which every node reads: the node coordinating a
//! group after another died finds the offsets it committed, a partition's new leader the
//! producers' last batches. Both keep a topic's state under its table id, so a table
//! dropped and created again under the same name starts with none.

mod etcd;
mod sqlite;
#[cfg(test)]
mod tests;

use std::time::Duration;

use async_trait::async_trait;
use mink_core::table::TablePath;
use mink_node::Node;

pub(crate) use etcd::EtcdState;
pub(crate) use sqlite::SqliteState;

use crate::error::Result;

/// The offset a consumer group committed for one partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumerOffset {
    /// The topic (`database.table`).
    pub(crate) topic: String,
    /// The topic's partition.
    pub(crate) partition: i32,
    /// The next offset the group reads.
    pub(crate) offset: i64,
    /// What the consumer attached to the commit.
    pub(crate) metadata: Option<String>,
}

/// What became of a group's commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OffsetsCommitted {
    /// Its offsets are stored.
    Stored,
    /// Refused: the group has none stored and as many groups as allowed have some.
    TooManyGroups,
}

/// The last batch an idempotent Kafka producer wrote to one partition: what tells a
/// retry of it (or of an older batch) from a new one, also after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducerBatch {
    /// The producer's epoch.
    pub(crate) epoch: i16,
    /// The sequence number of the batch's first record.
    pub(crate) first_sequence: i32,
    /// The sequence number of its last record.
    pub(crate) last_sequence: i32,
    /// The log offset its first row was written at.
    pub(crate) base_offset: i64,
}

/// The Kafka listener's durable state: one store per node, or one for the cluster.
#[async_trait]
pub(crate) trait KafkaState: Send + Sync + std::fmt::Debug {
    /// Stores a group's committed offsets, all of them or none, and notes the group
    /// active now. A group that has none stored yet is refused when `max_groups`
    /// groups already have some.
    async fn commit_offsets(
        &self,
        group: &str,
        offsets: Vec<ConsumerOffset>,
        max_groups: usize,
    ) -> Result<OffsetsCommitted>;

    /// Every offset a group committed, for topics that still exist.
    async fn committed_offsets(&self, group: &str) -> Result<Vec<ConsumerOffset>>;

    /// Forgets the committed offsets of the groups idle for `retention` (from their last
    /// commit; `active` groups, those with members, are noted active now); how many.
    async fn forget_idle_groups(&self, retention: Duration, active: Vec<String>) -> Result<usize>;

    /// The last batch `producer_id` wrote to a topic's partition.
    async fn last_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
    ) -> Result<Option<ProducerBatch>>;

    /// Records the batch `producer_id` just wrote to a topic's partition, and when.
    async fn record_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
        batch: ProducerBatch,
    ) -> Result<()>;

    /// Forgets the last batches of producers that wrote nothing for `expiration`; how
    /// many producers were forgotten.
    async fn forget_idle_producers(&self, expiration: Duration) -> Result<usize>;

    /// A producer id never handed out before, by any node, not even before a restart.
    async fn new_producer_id(&self) -> Result<i64>;
}

/// The id of the table behind `topic` now, if it exists.
fn table_id(node: &Node, topic: &str) -> Option<u64> {
    let path = TablePath::parse(topic).ok()?;
    Some(node.describe(&path).ok()?.table_id)
}

/// `duration` in whole milliseconds, saturated.
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
