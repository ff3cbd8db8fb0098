//! Topics and partitions: how Kafka's names map onto mink's tables and buckets.
//!
//! - A topic is a table, named `database.table`; the bare table name is accepted for the
//!   default database and answered under the name the client used.
//! - An unpartitioned table's partition `i` is its bucket `i`.
//! - A partitioned table's partitions number (partition, bucket) pairs: the mink
//!   partitions in the order they were created, each contributing `bucket.num`
//!   consecutive Kafka partitions. Partition `k` is bucket `k % bucket.num` of the
//!   `k / bucket.num`-th partition created. A new mink partition only appends Kafka
//!   partitions, so a committed offset keeps naming the same bucket.
//!
//! Kafka offsets are mink log offsets.

use std::sync::Arc;

use mink_core::protocol::BucketId;
use mink_core::table::{TableDescriptor, TablePath};
use mink_node::Node;

/// A table as a Kafka topic.
#[derive(Debug)]
pub(crate) struct Topic {
    pub(crate) table: Arc<TableDescriptor>,
    /// The mink partitions in creation order; `[None]` for an unpartitioned table.
    partitions: Vec<Option<String>>,
}

impl Topic {
    /// The topic named `name`, or `None` when no table has that name.
    pub(crate) fn find(node: &Node, name: &str) -> Option<Self> {
        let path = TablePath::parse(name).ok()?;
        Self::of(node, &path)
    }

    /// The topic of an existing table.
    pub(crate) fn of(node: &Node, path: &TablePath) -> Option<Self> {
        let table = node.describe(path).ok()?;
        let partitions = if table.is_partitioned() {
            node.partitions_in_creation_order(path)
                .ok()?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None]
        };
        Some(Self { table, partitions })
    }

    /// The topic's name: `database.table`.
    pub(crate) fn name(path: &TablePath) -> String {
        format!("{}.{}", path.database, path.name)
    }

    /// How many Kafka partitions the topic has now.
    pub(crate) fn partition_count(&self) -> i32 {
        let count = self.partitions.len() as u64 * u64::from(self.table.bucket_num);
        i32::try_from(count).unwrap_or(i32::MAX)
    }

    /// The bucket behind Kafka partition `index`, if the topic has it.
    pub(crate) fn bucket(&self, index: i32) -> Option<BucketId> {
        let index = u64::try_from(index).ok()?;
        let buckets = u64::from(self.table.bucket_num);
        let partition = self
            .partitions
            .get(usize::try_from(index / buckets).ok()?)?;
        Some(BucketId {
            table: self.table.path.to_string(),
            partition: partition.clone(),
            bucket: (index % buckets) as u32,
        })
    }
}
