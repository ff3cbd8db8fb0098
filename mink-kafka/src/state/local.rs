//! A single node's Kafka state: its `meta.db` (`mink_node::metadata::Metadata`), whose
//! calls block, so they run on tokio's blocking pool.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mink_node::Node;
use mink_node::metadata::{ConsumerOffset, Metadata, OffsetsCommitted, ProducerBatch, now_ms};

use super::KafkaState;
use crate::error::{KafkaError, Result};

/// The Kafka state in the node's `meta.db`.
#[derive(Debug)]
pub(crate) struct LocalState {
    node: Arc<Node>,
}

impl LocalState {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// Runs `call` on the node's `meta.db` on the blocking pool.
    async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce(&Metadata) -> mink_node::Result<T> + Send + 'static,
    ) -> Result<T> {
        let node = Arc::clone(&self.node);
        Ok(
            tokio::task::spawn_blocking(move || call(node.kafka_state()))
                .await
                .map_err(|e| KafkaError::Internal(e.to_string()))??,
        )
    }
}

#[async_trait]
impl KafkaState for LocalState {
    async fn commit_offsets(
        &self,
        group: &str,
        offsets: Vec<ConsumerOffset>,
        max_groups: usize,
    ) -> Result<OffsetsCommitted> {
        let group = group.to_string();
        self.run(move |state| state.commit_consumer_offsets(&group, &offsets, now_ms(), max_groups))
            .await
    }

    async fn committed_offsets(&self, group: &str) -> Result<Vec<ConsumerOffset>> {
        let group = group.to_string();
        self.run(move |state| state.consumer_offsets(&group)).await
    }

    async fn forget_idle_groups(&self, retention: Duration, active: Vec<String>) -> Result<usize> {
        self.run(move |state| state.forget_idle_groups(now_ms(), retention, &active))
            .await
    }

    async fn last_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
    ) -> Result<Option<ProducerBatch>> {
        let topic = topic.to_string();
        self.run(move |state| state.last_producer_batch(producer_id, &topic, partition))
            .await
    }

    async fn record_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
        batch: ProducerBatch,
    ) -> Result<()> {
        let topic = topic.to_string();
        self.run(move |state| state.record_producer_batch(producer_id, &topic, partition, &batch))
            .await
    }

    async fn forget_idle_producers(&self, expiration: Duration) -> Result<usize> {
        let idle_since = now_ms().saturating_sub(millis(expiration));
        self.run(move |state| state.forget_idle_producers(idle_since))
            .await
    }

    async fn new_producer_id(&self) -> Result<i64> {
        self.run(Metadata::new_producer_id).await
    }
}

/// `duration` in whole milliseconds, saturated.
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
