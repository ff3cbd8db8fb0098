//! The brokers clients are sent to: this node alone, or every live node of its cluster.
//!
//! A single node is broker 0 and leads every partition. In a cluster each node's Kafka
//! listener records its advertised address under the node's etcd lease
//! (`<prefix>/kafka/brokers/<node id>`: `"<Kafka address> <node address>"`), so a node
//! that dies leaves the list with its lease. A node's broker id is a hash of its node id
//! (stable across restarts, as clients' cached metadata expects); two live nodes whose
//! ids hash alike are refused at start. A partition's leader is the broker whose node
//! address the bucket's NotLeader names; a group's coordinator is the live broker that
//! ranks first for the group (rendezvous hashing: when a node dies only its groups move).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, PutOptions};
use mink_node::Node;
use mink_node::cluster::Membership;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::server::ServeError;

/// Where the brokers are recorded, under the cluster's prefix.
const BROKERS: &str = "kafka/brokers";
/// How long a list of the cluster's brokers is used before it is read again.
const LIST_LIFETIME: Duration = Duration::from_millis(500);

/// The broker id of a single node.
const ALONE: i32 = 0;

/// A broker as clients reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerAddress {
    pub(crate) id: i32,
    /// The node's id (empty on a single node).
    node_id: String,
    pub(crate) host: String,
    pub(crate) port: i32,
    /// The node's own port as its peers and NotLeader name it.
    node_address: String,
}

/// This node's broker and, in a cluster, the others.
#[derive(Debug)]
pub(crate) struct Brokers {
    me: BrokerAddress,
    cluster: Option<ClusterBrokers>,
}

struct ClusterBrokers {
    client: Client,
    membership: Arc<Membership>,
    /// The last list read, when, and the lease this node's record was put under then.
    known: Mutex<Known>,
    /// One refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Known {
    brokers: Arc<Vec<BrokerAddress>>,
    read_at: Instant,
    recorded_under: i64,
}

impl Brokers {
    /// This node's broker at `host:port`, recorded in its cluster's etcd if it has one.
    ///
    /// # Errors
    /// etcd could not be reached, or another live node's broker id is this one's.
    pub(crate) async fn start(node: &Node, host: String, port: i32) -> Result<Self, ServeError> {
        let Some(membership) = node.membership() else {
            let me = BrokerAddress {
                id: ALONE,
                node_id: String::new(),
                host,
                port,
                node_address: String::new(),
            };
            return Ok(Self { me, cluster: None });
        };
        let config = membership.config();
        let me = BrokerAddress {
            id: broker_id(&config.node_id),
            node_id: config.node_id.clone(),
            host,
            port,
            node_address: config.advertise.clone(),
        };
        let etcd = |e: String| ServeError::Config(format!("the Kafka brokers in etcd: {e}"));
        let client = config
            .connect()
            .await
            .map_err(|e| ServeError::Config(e.to_string()))?;
        let cluster = ClusterBrokers {
            client,
            membership: Arc::clone(membership),
            known: Mutex::new(Known {
                brokers: Arc::new(Vec::new()),
                read_at: Instant::now(),
                recorded_under: 0,
            }),
            refreshing: tokio::sync::Mutex::new(()),
        };
        let brokers = cluster.read().await.map_err(|e| etcd(e.to_string()))?;
        if let Some(other) = brokers
            .iter()
            .find(|b| b.id == me.id && b.node_id != me.node_id)
        {
            return Err(ServeError::Config(format!(
                "node ids '{}' and '{}' give the same Kafka broker id {}: rename one",
                me.node_id, other.node_id, me.id
            )));
        }
        cluster.record(&me).await.map_err(|e| etcd(e.to_string()))?;
        info!(
            broker_id = me.id,
            "this node is a Kafka broker of its cluster"
        );
        Ok(Self {
            me,
            cluster: Some(cluster),
        })
    }

    /// This node's broker.
    pub(crate) fn me(&self) -> &BrokerAddress {
        &self.me
    }

    /// The live brokers, this one among them.
    pub(crate) async fn live(&self) -> Arc<Vec<BrokerAddress>> {
        match &self.cluster {
            None => Arc::new(vec![self.me.clone()]),
            Some(cluster) => cluster.live(&self.me).await,
        }
    }

    /// The broker of the node at `node_address` among `brokers`.
    pub(crate) fn at_node<'a>(
        brokers: &'a [BrokerAddress],
        node_address: &str,
    ) -> Option<&'a BrokerAddress> {
        brokers.iter().find(|b| b.node_address == node_address)
    }

    /// The broker coordinating `group`: the live one that ranks first for it.
    pub(crate) async fn coordinator(&self, group: &str) -> BrokerAddress {
        let live = self.live().await;
        first_for(&live, group)
            .cloned()
            .unwrap_or_else(|| self.me.clone())
    }

    /// Whether this node coordinates `group`.
    pub(crate) async fn coordinates(&self, group: &str) -> bool {
        self.coordinator(group).await.id == self.me.id
    }
}

impl std::fmt::Debug for ClusterBrokers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBrokers")
            .field("known", &self.known)
            .finish_non_exhaustive()
    }
}

impl ClusterBrokers {
    /// The live brokers, read again when the last list is older than [`LIST_LIFETIME`]
    /// (the last list while etcd does not answer); this node's own record is put again
    /// when the node holds a new lease.
    async fn live(&self, me: &BrokerAddress) -> Arc<Vec<BrokerAddress>> {
        if let Some(fresh) = self.fresh() {
            return fresh;
        }
        let _one = self.refreshing.lock().await;
        if let Some(fresh) = self.fresh() {
            return fresh;
        }
        let lease = self.membership.lease();
        let recorded_under = self.lock().recorded_under;
        if lease != recorded_under
            && let Err(error) = self.record(me).await
        {
            warn!(%error, "recording this node's Kafka broker in etcd failed");
        }
        let mut known = match self.read().await {
            Ok(mut brokers) => {
                if !brokers.contains(me) {
                    brokers.push(me.clone());
                }
                let mut known = self.lock();
                known.brokers = Arc::new(brokers);
                known
            }
            Err(error) => {
                warn!(%error, "reading the cluster's Kafka brokers from etcd failed");
                self.lock()
            }
        };
        known.read_at = Instant::now();
        Arc::clone(&known.brokers)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh(&self) -> Option<Arc<Vec<BrokerAddress>>> {
        let known = self.lock();
        (known.read_at.elapsed() < LIST_LIFETIME && !known.brokers.is_empty())
            .then(|| Arc::clone(&known.brokers))
    }

    /// Puts this node's record under its lease.
    async fn record(&self, me: &BrokerAddress) -> Result<(), etcd_client::Error> {
        let lease = self.membership.lease();
        let value = format!("{}:{} {}", me.host, me.port, me.node_address);
        let key = self.membership.config().key(&[BROKERS, &me.node_id]);
        let options = PutOptions::new().with_lease(lease);
        self.client
            .kv_client()
            .put(key, value, Some(options))
            .await?;
        self.lock().recorded_under = lease;
        Ok(())
    }

    /// The brokers recorded now.
    async fn read(&self) -> mink_node::Result<Vec<BrokerAddress>> {
        let listed = (self.membership.config())
            .list(&mut self.client.clone(), BROKERS)
            .await?;
        Ok((listed.into_iter())
            .filter_map(|(node_id, value)| {
                let (kafka, node_address) = value.split_once(' ')?;
                let (host, port) = kafka.rsplit_once(':')?;
                Some(BrokerAddress {
                    id: broker_id(&node_id),
                    node_id,
                    host: host.to_string(),
                    port: port.parse().ok()?,
                    node_address: node_address.to_string(),
                })
            })
            .collect())
    }
}

/// The broker among `brokers` that ranks first for `group` (rendezvous hashing): every
/// node that knows the same brokers picks the same one, and a broker leaving moves only
/// the groups it ranked first for.
fn first_for<'a>(brokers: &'a [BrokerAddress], group: &str) -> Option<&'a BrokerAddress> {
    (brokers.iter())
        .max_by_key(|broker| fnv1a(&[broker.node_id.as_bytes(), b"\0", group.as_bytes()]))
}

/// The broker id of node `node_id` in a cluster: a non-negative hash of it.
fn broker_id(node_id: &str) -> i32 {
    (fnv1a(&[node_id.as_bytes()]) & 0x7fff_ffff) as i32
}

/// FNV-1a over `parts`: the same on every node and every build, as a group's
/// coordinator and a node's broker id must be.
fn fnv1a(parts: &[&[u8]]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in parts.iter().flat_map(|part| part.iter()) {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_ids_are_stable_and_not_negative() {
        assert_eq!(broker_id("n0"), broker_id("n0"));
        assert_ne!(broker_id("n0"), broker_id("n1"));
        for node in ["n0", "n1", "node-17", ""] {
            assert!(broker_id(node) >= 0);
        }
        // FNV-1a's published test vector: the hash may never change between builds.
        assert_eq!(fnv1a(&[b"a"]), 0xe40c_292c);
    }

    fn broker(node_id: &str) -> BrokerAddress {
        BrokerAddress {
            id: broker_id(node_id),
            node_id: node_id.into(),
            host: "127.0.0.1".into(),
            port: 9092,
            node_address: String::new(),
        }
    }

    #[test]
    fn groups_spread_over_brokers_and_only_a_leaving_broker_s_groups_move() {
        let three: Vec<BrokerAddress> = ["n0", "n1", "n2"].map(broker).into();
        let groups: Vec<String> = (0..3000).map(|g| format!("group-{g}")).collect();
        let first = |brokers: &[BrokerAddress], group: &str| {
            first_for(brokers, group).map(|b| b.node_id.clone())
        };
        for node in ["n0", "n1", "n2"] {
            let share = (groups.iter())
                .filter(|g| first(&three, g).as_deref() == Some(node))
                .count();
            assert!(
                (800..=1200).contains(&share),
                "{node} coordinates {share} of 3000"
            );
        }
        let two = [broker("n0"), broker("n2")];
        for group in &groups {
            let before = first(&three, group);
            let after = first(&two, group);
            if before.as_deref() != Some("n1") {
                assert_eq!(before, after, "{group} moved though its broker stayed");
            }
        }
        // The order brokers are listed in does not matter.
        let reversed: Vec<BrokerAddress> = three.iter().rev().cloned().collect();
        assert!(
            groups
                .iter()
                .all(|g| first(&three, g) == first(&reversed, g))
        );
        assert_eq!(first(&[], "g"), None);
    }
}
