//! A cluster's Kafka state in its etcd, which every node reads and changes.
//!
//! Layout under the cluster's prefix:
//!
//! ```text
//! <prefix>/kafka/producer-ids                                the last producer id given
//! <prefix>/kafka/producers/<producer id>/<table id>/<partition>
//!                                  "<epoch> <first seq> <last seq> <base offset> <written at ms>"
//! <prefix>/kafka/groups/<group id>            the group's committed offsets (JSON)
//! <prefix>/kafka/group-activity/<group id>    when it last committed (ms), or had members
//! ```
//!
//! A group's offsets are one value, changed by a transaction that holds only if nobody
//! changed it since it was read (the group's coordinator is the one writer, but a
//! coordinator moving can overlap an old one's last commit): a commit is stored whole or
//! not at all. Producer ids are given by moving their counter from the value read.
//! Topics are kept under their table ids: the offsets and batches of a dropped table are
//! never found for a table created again under its name, and go with their group or
//! producer when it is forgotten.
//!
//! A producer's last batch on a partition is put at most every [`RECORD_INTERVAL`] (its
//! first, the marker of where its batches start, always): every put is a revision etcd
//! keeps until it is compacted, and a producer writes many batches a second. An older
//! record only makes a new leader read more of the log for the producer's later batches,
//! which their tags name (a batch written in several parts has none: sent again after
//! its leader died within the interval, it is written again).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use kafka_protocol::ResponseError;
use mink_node::Node;
use mink_node::metadata::now_ms;
use serde::{Deserialize, Serialize};

use super::{ConsumerOffset, KafkaState, OffsetsCommitted, ProducerBatch, millis, table_id};
use crate::error::{KafkaError, Result};

/// The largest group value written: etcd refuses requests over 1.5 MiB.
const MAX_GROUP_BYTES: usize = 1 << 20;
/// Most times a change is tried again after another node's change moved what it read.
const ATTEMPTS: usize = 64;
/// Keys read in one request of a listing.
const LIST_PAGE: i64 = 1000;
/// How often a producer's last batch on one partition is put.
const RECORD_INTERVAL: Duration = Duration::from_secs(1);
/// The most (producer, partition) pairs whose last put is remembered; past it the
/// memory is cleared, and each pair's next batch is put.
const MAX_REMEMBERED_RECORDS: usize = 100_000;

/// The Kafka state of a cluster, in etcd.
pub(crate) struct EtcdState {
    client: Client,
    /// `<cluster prefix>/kafka`.
    prefix: String,
    /// Names topics by their tables' ids.
    node: Arc<Node>,
    /// When each producer's last batch on a partition was last put, by its key.
    recorded: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for EtcdState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdState")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A group's committed offsets, as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StoredGroup {
    offsets: Vec<StoredOffset>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredOffset {
    topic: String,
    table_id: u64,
    partition: i32,
    offset: i64,
    metadata: Option<String>,
}

impl EtcdState {
    /// The Kafka state under `<cluster prefix>/kafka` of the etcd `client` reaches.
    pub(crate) fn new(client: Client, cluster_prefix: &str, node: Arc<Node>) -> Self {
        Self {
            client,
            prefix: format!("{}/kafka", cluster_prefix.trim_end_matches('/')),
            node,
            recorded: Mutex::default(),
        }
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut key = self.prefix.clone();
        for part in parts {
            key.push('/');
            key.push_str(part);
        }
        key
    }

    fn table_id(&self, topic: &str) -> Option<u64> {
        table_id(&self.node, topic)
    }

    /// The key of a producer's last batch on a partition; `None` for a topic that is gone.
    fn producer_key(&self, producer_id: i64, topic: &str, partition: i32) -> Option<String> {
        let table_id = self.table_id(topic)?;
        Some(self.key(&[
            "producers",
            &format!("{producer_id:020}"),
            &format!("{table_id:020}"),
            &partition.to_string(),
        ]))
    }

    /// The value under `key` and its revision (0: absent).
    async fn read(&self, key: &str) -> Result<(Option<Vec<u8>>, i64)> {
        let got = self.client.kv_client().get(key, None).await?;
        Ok(got.kvs().first().map_or((None, 0), |kv| {
            (Some(kv.value().to_vec()), kv.mod_revision())
        }))
    }

    /// Runs `then` if `key` is still at `revision`; whether it ran.
    async fn swap(&self, key: &str, revision: i64, then: Vec<TxnOp>) -> Result<bool> {
        let unchanged = Compare::mod_revision(key, CompareOp::Equal, revision);
        let txn = Txn::new().when([unchanged]).and_then(then);
        Ok(self.client.kv_client().txn(txn).await?.succeeded())
    }

    /// How many groups have offsets stored.
    async fn groups_with_offsets(&self) -> Result<usize> {
        let prefix = self.key(&["group-activity", ""]);
        let options = GetOptions::new().with_prefix().with_count_only();
        let counted = self.client.kv_client().get(prefix, Some(options)).await?;
        Ok(usize::try_from(counted.count()).unwrap_or(usize::MAX))
    }

    /// Every key under `<prefix>/<kind>/` with its value and revision, read
    /// [`LIST_PAGE`] keys at a time (one answer of them all could pass gRPC's bound on a
    /// message).
    async fn list(&self, kind: &str) -> Result<Vec<(String, String, i64)>> {
        let prefix = self.key(&[kind, ""]);
        // The end of the prefix's range: its last byte, '/', plus one.
        let end = format!("{}0", &prefix[..prefix.len() - 1]);
        let mut listed = Vec::new();
        let mut from = prefix.clone().into_bytes();
        loop {
            let page = GetOptions::new()
                .with_range(end.as_str())
                .with_limit(LIST_PAGE);
            let got = self
                .client
                .kv_client()
                .get(from.clone(), Some(page))
                .await?;
            for kv in got.kvs() {
                let name = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                let value = String::from_utf8_lossy(kv.value()).into_owned();
                listed.push((name, value, kv.mod_revision()));
            }
            match got.kvs().last() {
                Some(last) if got.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(listed),
            }
        }
    }

    /// Whether the last batch under `key` is to be put now: its first, or one
    /// [`RECORD_INTERVAL`] after the last put.
    fn record_due(&self, key: &str) -> bool {
        let mut recorded = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if recorded
            .get(key)
            .is_some_and(|put| now < *put + RECORD_INTERVAL)
        {
            return false;
        }
        if recorded.len() >= MAX_REMEMBERED_RECORDS {
            recorded.clear();
        }
        recorded.insert(key.to_string(), now);
        true
    }
}

fn too_many_attempts(what: &str) -> KafkaError {
    KafkaError::Internal(format!(
        "{what}: other nodes' changes kept moving it ({ATTEMPTS} attempts)"
    ))
}

#[async_trait]
impl KafkaState for EtcdState {
    async fn commit_offsets(
        &self,
        group: &str,
        offsets: Vec<ConsumerOffset>,
        max_groups: usize,
    ) -> Result<OffsetsCommitted> {
        if offsets.is_empty() {
            return Ok(OffsetsCommitted::Stored);
        }
        let key = self.key(&["groups", group]);
        let activity = self.key(&["group-activity", group]);
        for _ in 0..ATTEMPTS {
            let (value, revision) = self.read(&key).await?;
            if value.is_none() && self.groups_with_offsets().await? >= max_groups {
                return Ok(OffsetsCommitted::TooManyGroups);
            }
            let stored: StoredGroup = match &value {
                Some(bytes) => serde_json::from_slice(bytes)
                    .map_err(|e| KafkaError::Internal(format!("group {group}'s offsets: {e}")))?,
                None => StoredGroup::default(),
            };
            let mut merged: BTreeMap<(u64, i32), StoredOffset> = BTreeMap::new();
            for offset in stored.offsets {
                if self.table_id(&offset.topic) == Some(offset.table_id) {
                    merged.insert((offset.table_id, offset.partition), offset);
                }
            }
            for offset in &offsets {
                let Some(table_id) = self.table_id(&offset.topic) else {
                    continue;
                };
                let stored = StoredOffset {
                    topic: offset.topic.clone(),
                    table_id,
                    partition: offset.partition,
                    offset: offset.offset,
                    metadata: offset.metadata.clone(),
                };
                merged.insert((table_id, offset.partition), stored);
            }
            let group_value = serde_json::to_vec(&StoredGroup {
                offsets: merged.into_values().collect(),
            })
            .map_err(|e| KafkaError::Internal(e.to_string()))?;
            if group_value.len() > MAX_GROUP_BYTES {
                return Err(KafkaError::Refused(
                    ResponseError::OffsetMetadataTooLarge,
                    format!(
                        "group {group}'s committed offsets would take {} bytes, over {MAX_GROUP_BYTES}",
                        group_value.len()
                    ),
                ));
            }
            let puts = vec![
                TxnOp::put(key.as_str(), group_value, None),
                TxnOp::put(activity.as_str(), now_ms().to_string(), None),
            ];
            if self.swap(&key, revision, puts).await? {
                return Ok(OffsetsCommitted::Stored);
            }
        }
        Err(too_many_attempts(&format!(
            "committing group {group}'s offsets"
        )))
    }

    async fn committed_offsets(&self, group: &str) -> Result<Vec<ConsumerOffset>> {
        let (Some(value), _) = self.read(&self.key(&["groups", group])).await? else {
            return Ok(Vec::new());
        };
        let stored: StoredGroup = serde_json::from_slice(&value)
            .map_err(|e| KafkaError::Internal(format!("group {group}'s offsets: {e}")))?;
        Ok((stored.offsets.into_iter())
            .filter(|offset| self.table_id(&offset.topic) == Some(offset.table_id))
            .map(|offset| ConsumerOffset {
                topic: offset.topic,
                partition: offset.partition,
                offset: offset.offset,
                metadata: offset.metadata,
            })
            .collect())
    }

    async fn forget_idle_groups(&self, retention: Duration, active: Vec<String>) -> Result<usize> {
        let now = now_ms();
        for group in &active {
            let activity = self.key(&["group-activity", group]);
            let has_offsets = Compare::version(activity.as_str(), CompareOp::Greater, 0);
            let noted = TxnOp::put(activity.as_str(), now.to_string(), None);
            let txn = Txn::new().when([has_offsets]).and_then([noted]);
            self.client.kv_client().txn(txn).await?;
        }
        let idle_since = now.saturating_sub(millis(retention));
        let mut forgotten = 0;
        for (group, active_at, revision) in self.list("group-activity").await? {
            if active_at.parse::<i64>().is_ok_and(|at| at >= idle_since) {
                continue;
            }
            let activity = self.key(&["group-activity", &group]);
            let deletes = vec![
                TxnOp::delete(self.key(&["groups", &group]), None),
                TxnOp::delete(activity.as_str(), None),
            ];
            if self.swap(&activity, revision, deletes).await? {
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }

    async fn last_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
    ) -> Result<Option<ProducerBatch>> {
        let Some(key) = self.producer_key(producer_id, topic, partition) else {
            return Ok(None);
        };
        let (Some(value), _) = self.read(&key).await? else {
            return Ok(None);
        };
        let value = String::from_utf8_lossy(&value);
        let batch = parse_batch(&value).ok_or_else(|| {
            KafkaError::Internal(format!("producer {producer_id}'s last batch: '{value}'"))
        })?;
        Ok(Some(batch.0))
    }

    async fn record_producer_batch(
        &self,
        producer_id: i64,
        topic: &str,
        partition: i32,
        batch: ProducerBatch,
    ) -> Result<()> {
        let Some(key) = self.producer_key(producer_id, topic, partition) else {
            return Ok(());
        };
        if !self.record_due(&key) {
            return Ok(());
        }
        let value = format!(
            "{} {} {} {} {}",
            batch.epoch,
            batch.first_sequence,
            batch.last_sequence,
            batch.base_offset,
            now_ms()
        );
        self.client.kv_client().put(key, value, None).await?;
        Ok(())
    }

    async fn forget_idle_producers(&self, expiration: Duration) -> Result<usize> {
        let idle_since = now_ms().saturating_sub(millis(expiration));
        let mut last_written: HashMap<String, i64> = HashMap::new();
        for (name, value, _) in self.list("producers").await? {
            let Some((producer, _)) = name.split_once('/') else {
                continue;
            };
            let written_at = parse_batch(&value).map_or(0, |(_, at)| at);
            let last = last_written.entry(producer.to_string()).or_default();
            *last = (*last).max(written_at);
        }
        let mut forgotten = 0;
        for (producer, written_at) in last_written {
            if written_at < idle_since {
                let batches = self.key(&["producers", &producer, ""]);
                let options = DeleteOptions::new().with_prefix();
                self.client
                    .kv_client()
                    .delete(batches, Some(options))
                    .await?;
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }

    async fn new_producer_id(&self) -> Result<i64> {
        let key = self.key(&["producer-ids"]);
        for _ in 0..ATTEMPTS {
            let (value, revision) = self.read(&key).await?;
            let last: i64 = match value {
                Some(bytes) => String::from_utf8_lossy(&bytes).parse().map_err(|_| {
                    KafkaError::Internal("the producer id counter does not parse".into())
                })?,
                None => 0,
            };
            let next = last + 1;
            let put = TxnOp::put(key.as_str(), next.to_string(), None);
            if self.swap(&key, revision, vec![put]).await? {
                return Ok(next);
            }
        }
        Err(too_many_attempts("giving a producer id"))
    }
}

/// A stored last batch and when it was written.
fn parse_batch(value: &str) -> Option<(ProducerBatch, i64)> {
    let mut fields = value.split(' ');
    let mut next = || fields.next();
    let batch = ProducerBatch {
        epoch: next()?.parse().ok()?,
        first_sequence: next()?.parse().ok()?,
        last_sequence: next()?.parse().ok()?,
        base_offset: next()?.parse().ok()?,
    };
    Some((batch, next()?.parse().ok()?))
}
