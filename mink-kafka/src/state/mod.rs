//! What the Kafka listener keeps beyond the log: consumer groups' committed offsets,
//! producer ids, and each idempotent producer's last batch per partition, with when each
//! group and producer was last used, so that idle ones are forgotten.
//!
//! Two stores keep it ([`KafkaState`]): a single node's `meta.db`
//! ([`LocalState`], SQLite, where a dropped table's state goes with it), and a cluster's
//! etcd ([`EtcdState`]), which every node reads: the node coordinating a group after
//! another died finds the offsets it committed, a partition's new leader the producers'
//! last batches. In etcd a topic's state is kept under its table id, so a table dropped
//! and created again under the same name starts with none.

mod etcd;
mod local;
#[cfg(test)]
mod tests;

use std::time::Duration;

use async_trait::async_trait;
use mink_node::metadata::{ConsumerOffset, OffsetsCommitted, ProducerBatch};

pub(crate) use etcd::EtcdState;
pub(crate) use local::LocalState;

use crate::error::Result;

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
