//! A node's membership: its etcd lease, kept alive, and its member record under it.
//!
//! The lease is renewed every third of its time to live. The node holds its lease until
//! the time it sent its last answered renewal plus the time to live etcd granted then:
//! etcd counts from when the renewal reached it, later, so the node lets go before etcd
//! does, never after. A node past that time ([`Membership::holds_lease`] false) may lead
//! nothing: a paused process that wakes finds it at once, whatever etcd did meanwhile.
//! A lease etcd ended (it answers a renewal with no time left) is gone for good: the node
//! takes a new one and records itself again, a new incarnation whose buckets the
//! controller assigns afresh.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
    WatchStream,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::error::{NodeError, Result};

/// How long connecting to etcd may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a node joining waits for the controller to drain its earlier life.
const MAX_DRAIN_WAIT: Duration = Duration::from_secs(600);

/// Where a node finds the cluster and how others reach it.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd's client endpoints, `host:port` each.
    pub endpoints: Vec<String>,
    /// The keys of this cluster in etcd start with it (`/mink`).
    pub prefix: String,
    /// This node's id, unique among the live members.
    pub node_id: String,
    /// The node port as other nodes and clients reach it.
    pub advertise: String,
    /// The lease's time to live: how long a dead node leads its buckets.
    pub lease: Duration,
    /// How this node reaches the others (their login and TLS): a tiering round reads the
    /// buckets other nodes lead from them.
    pub peers: mink_client::ConnectOptions,
}

impl ClusterConfig {
    /// The key `<prefix>/<part>/<part>...` of this cluster in etcd.
    pub fn key(&self, parts: &[&str]) -> String {
        let mut key = self.prefix.trim_end_matches('/').to_string();
        for part in parts {
            key.push('/');
            key.push_str(part);
        }
        key
    }

    /// Connects a client to the cluster's etcd.
    ///
    /// # Errors
    /// etcd could not be reached.
    pub async fn connect(&self) -> Result<Client> {
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        Ok(Client::connect(&self.endpoints, Some(options)).await?)
    }

    /// Every key under `<prefix>/<kind>/`: the rest of its name and its value.
    ///
    /// # Errors
    /// etcd could not be reached.
    pub async fn list(&self, client: &mut Client, kind: &str) -> Result<Vec<(String, String)>> {
        let prefix = self.key(&[kind, ""]);
        let listed = client
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        Ok((listed.kvs().iter())
            .map(|kv| {
                let name = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                (name, String::from_utf8_lossy(kv.value()).into_owned())
            })
            .collect())
    }

    /// Watches every key of the cluster: [`Changes::next`] resolves on a change.
    ///
    /// # Errors
    /// etcd could not be reached.
    pub(crate) async fn watch(&self, client: &mut Client) -> Result<Changes> {
        let everything = Some(WatchOptions::new().with_prefix());
        Ok(Changes(client.watch(self.key(&[""]), everything).await?))
    }
}

/// The changes under a cluster's prefix ([`ClusterConfig::watch`]).
pub(crate) struct Changes(WatchStream);

impl Changes {
    /// Resolves on the next change, or after `at_most`.
    ///
    /// # Errors
    /// etcd ended the watch or failed.
    pub(crate) async fn next(&mut self, at_most: Duration) -> Result<()> {
        match tokio::time::timeout(at_most, self.0.message()).await {
            Ok(Ok(Some(_))) | Err(_) => Ok(()),
            Ok(Ok(None)) => Err(NodeError::ClusterMetadata("etcd ended a watch".into())),
            Ok(Err(error)) => Err(error.into()),
        }
    }
}

/// A live member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: String,
    /// Its node port, as clients reach it.
    pub address: String,
}

/// This node's lease and member record, renewed in the background until dropped.
#[derive(Debug)]
pub struct Membership {
    config: ClusterConfig,
    /// The lease the node joined with.
    joined_with: i64,
    held: Arc<Mutex<Held>>,
    renewing: JoinHandle<()>,
}

/// The lease the node holds now.
#[derive(Debug, Clone, Copy)]
struct Held {
    lease: i64,
    until: Instant,
}

impl Membership {
    /// Takes a lease and records the node under it.
    ///
    /// # Errors
    /// etcd could not be reached, or a live member kept this node's id for twice the
    /// lease's time to live.
    pub async fn join(config: ClusterConfig) -> Result<Self> {
        let mut client = config.connect().await?;
        // The node's previous life (a crash, a restart) may hold the id until its lease
        // ends: wait that long for it, no longer.
        let patience = Instant::now() + 2 * config.lease;
        let drain_patience = Instant::now() + MAX_DRAIN_WAIT;
        let held = loop {
            match register(&mut client, &config).await {
                Err(NodeError::InvalidArgument(_)) if Instant::now() < patience => {
                    tokio::time::sleep(config.lease / 4).await;
                }
                Err(NodeError::ShuttingDown(why)) if Instant::now() < drain_patience => {
                    info!(node = %config.node_id, "waiting to join: {why}");
                    tokio::time::sleep(config.lease / 4).await;
                }
                registered => break registered?,
            }
        };
        info!(node = %config.node_id, advertise = %config.advertise, "joined the cluster");
        let joined_with = held.lease;
        let held = Arc::new(Mutex::new(held));
        let renewing = tokio::spawn(renew(client, config.clone(), Arc::clone(&held)));
        Ok(Self {
            config,
            joined_with,
            held,
            renewing,
        })
    }

    /// Whether the node holds its lease now: one that does not leads nothing.
    pub fn holds_lease(&self) -> bool {
        Instant::now() < self.held().until
    }

    /// Whether the node holds the lease it joined with. Once that one ended, the node
    /// may have been drained (its log store writer fenced, its buckets moved) even if it
    /// joined again since: a node serving buckets leads none any more.
    pub fn holds_joined_lease(&self) -> bool {
        let held = self.held();
        held.lease == self.joined_with && Instant::now() < held.until
    }

    /// The lease the node holds, or held last.
    pub fn lease(&self) -> i64 {
        self.held().lease
    }

    /// The node's cluster config.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    fn held(&self) -> Held {
        *self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves the cluster: the lease is revoked, so the node's record goes at once
    /// rather than when the lease would have ended.
    ///
    /// # Errors
    /// etcd could not be reached (the lease then ends by itself).
    pub async fn leave(self) -> Result<()> {
        self.renewing.abort();
        let mut client = self.config.connect().await?;
        client.lease_revoke(self.held().lease).await?;
        Ok(())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.renewing.abort();
    }
}

/// Every live member, by id.
///
/// # Errors
/// etcd could not be reached.
pub async fn members(client: &mut Client, config: &ClusterConfig) -> Result<Vec<Member>> {
    Ok((config.list(client, "nodes").await?.into_iter())
        .map(|(id, address)| Member { id, address })
        .collect())
}

/// Takes a lease and puts the node's record under it, if no live member has its id and
/// the controller is not draining its earlier life's sequence; marks that sequence as one
/// that may hold frames (`incarnations/<id>`), to drain once this life ends.
async fn register(client: &mut Client, config: &ClusterConfig) -> Result<Held> {
    let ttl = i64::try_from(config.lease.as_secs().max(1)).unwrap_or(i64::MAX);
    let asked = Instant::now();
    let granted = client.lease_grant(ttl, None).await?;
    let key = config.key(&["nodes", &config.node_id]);
    let record = TxnOp::put(
        key.clone(),
        config.advertise.clone(),
        Some(PutOptions::new().with_lease(granted.id())),
    );
    let draining = config.key(&["draining", &config.node_id]);
    let incarnation = TxnOp::put(config.key(&["incarnations", &config.node_id]), "", None);
    let txn = Txn::new()
        .when([
            Compare::version(key.clone(), CompareOp::Equal, 0),
            Compare::version(draining.clone(), CompareOp::Equal, 0),
        ])
        .and_then([record, incarnation]);
    if !client.txn(txn).await?.succeeded() {
        let _ = client.lease_revoke(granted.id()).await;
        if !client.get(draining, None).await?.kvs().is_empty() {
            return Err(NodeError::ShuttingDown(format!(
                "the controller is draining node {}'s earlier life from the log store",
                config.node_id
            )));
        }
        let holder = client.get(key, None).await?;
        let address = (holder.kvs().first())
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            .unwrap_or_default();
        return Err(NodeError::InvalidArgument(format!(
            "node id {} is taken by a live member of the cluster (at {address}): each node \
             needs its own --node-id",
            config.node_id
        )));
    }
    Ok(Held {
        lease: granted.id(),
        until: asked + Duration::from_secs(granted.ttl().max(0) as u64),
    })
}

/// Renews the lease every third of its time to live, and takes a new one (recording the
/// node again) once etcd ended it.
async fn renew(mut client: Client, config: ClusterConfig, held: Arc<Mutex<Held>>) {
    let every = config.lease / 3;
    loop {
        let lease = held.lock().unwrap_or_else(|p| p.into_inner()).lease;
        let ended = match renew_lease(&mut client, lease, every, &held).await {
            Renewal::Ended => true,
            Renewal::Failed(error) => {
                warn!(%error, "renewing the node's etcd lease failed");
                // etcd refuses to renew a lease it ended: ask it whether it did.
                let left = client.lease_time_to_live(lease, None).await;
                left.is_ok_and(|left| left.ttl() <= 0)
            }
        };
        if ended {
            warn!(node = %config.node_id, "the node's etcd lease ended: joining again");
            match register(&mut client, &config).await {
                Ok(new) => *held.lock().unwrap_or_else(|p| p.into_inner()) = new,
                Err(error) => warn!(%error, "joining the cluster again failed"),
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Why renewing a lease stopped.
enum Renewal {
    /// etcd ended the lease.
    Ended,
    /// etcd could not be reached: the renewal starts over.
    Failed(NodeError),
}

/// Renews `lease` every `every` for as long as etcd answers, moving `held`'s end.
async fn renew_lease(
    client: &mut Client,
    lease: i64,
    every: Duration,
    held: &Mutex<Held>,
) -> Renewal {
    let (mut keeper, mut answers) = match client.lease_keep_alive(lease).await {
        Ok(stream) => stream,
        Err(error) => return Renewal::Failed(error.into()),
    };
    loop {
        let asked = Instant::now();
        if let Err(error) = keeper.keep_alive().await {
            return Renewal::Failed(error.into());
        }
        match tokio::time::timeout(every, answers.message()).await {
            Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                let until = asked + Duration::from_secs(answer.ttl() as u64);
                held.lock().unwrap_or_else(|p| p.into_inner()).until = until;
            }
            Ok(Ok(Some(_))) => return Renewal::Ended,
            Ok(Ok(None)) => {
                return Renewal::Failed(NodeError::ClusterMetadata(
                    "the lease's renewals stopped".into(),
                ));
            }
            Ok(Err(error)) => return Renewal::Failed(error.into()),
            Err(_) => {
                return Renewal::Failed(NodeError::ClusterMetadata(
                    "a lease renewal was not answered in time".into(),
                ));
            }
        }
        tokio::time::sleep_until(asked + every).await;
    }
}
