//! Following NotLeader: in a cluster each bucket is led by one node, and a node asked
//! about a bucket it does not lead answers NotLeader, with the leader's address, or that
//! the bucket is moving. A client's bucket calls go to the node it last learned leads the
//! bucket (the node it connected to at first), and follow such answers: to the leader
//! named, or again after a pause while the bucket moves or its leader cannot be reached
//! (its node died, and the others name it until its lease ends), for up to [`FOLLOW_FOR`]
//! ([`ConnectOptions::follow_for`](crate::ConnectOptions::follow_for) sets another).
//!
//! Connections to the other nodes are made once, with the login and TLS of the first,
//! and shared by every clone of the client, as is what it learned of the leaders. A node
//! that no longer knows the connection's login (it restarted: its tokens are gone) is
//! connected to again, with a new login.
//!
//! The first node may die too: once a NotLeader answer showed the client a cluster, it
//! knows the members (the leaders named, and the live nodes the first node lists), and
//! a bucket call that cannot reach the first node asks another member instead, which
//! answers or names the bucket's leader.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use mink_core::protocol::{BucketId, NotLeader};
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use crate::client::{ConnectOptions, MinkClient};
use crate::error::{ClientError, Result};

/// How long a call follows a bucket that is moving.
pub const FOLLOW_FOR: Duration = Duration::from_secs(30);
/// The pause before asking again about a bucket that is moving.
const MOVING_PAUSE: Duration = Duration::from_millis(100);
/// Most redirections one call follows without a pause: nodes that keep pointing at each
/// other (their views of a move not yet settled) are not followed forever.
const MAX_HOPS: usize = 8;

/// A connection to one node, with the login it answered.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub(crate) inner: FlightServiceClient<Channel>,
    /// `Bearer <token>` from the login, sent on every call.
    pub(crate) authorization: Option<AsciiMetadataValue>,
}

/// The nodes a client reached and the leaders it learned, shared by its clones.
#[derive(Debug)]
pub(crate) struct Leaders {
    /// How every node is reached: the first one's login and TLS.
    options: ConnectOptions,
    /// The nodes connected to, by address.
    nodes: tokio::sync::Mutex<HashMap<String, Connection>>,
    /// The node each bucket was last said to be led by.
    buckets: Mutex<HashMap<BucketId, String>>,
    /// The other nodes of the cluster the client knows of (named as leaders, or listed by
    /// the first node once it named one): asked about a bucket when the first node
    /// cannot be reached; `None` until the client knows it talks to a cluster.
    members: Mutex<Option<BTreeSet<String>>>,
}

impl Leaders {
    pub(crate) fn new(options: ConnectOptions) -> Self {
        Self {
            options,
            nodes: tokio::sync::Mutex::default(),
            buckets: Mutex::default(),
            members: Mutex::default(),
        }
    }

    /// How long a call follows a bucket ([`ConnectOptions::follow_for`]).
    pub(crate) fn follow_for(&self) -> Duration {
        self.options.follow_for.unwrap_or(FOLLOW_FOR)
    }

    fn leader_of(&self, bucket: &BucketId) -> Option<String> {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        buckets.get(bucket).cloned()
    }

    fn learn(&self, bucket: &BucketId, leader: Option<String>) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        match leader {
            Some(leader) => buckets.insert(bucket.clone(), leader),
            None => buckets.remove(bucket),
        };
    }

    /// Adds `addresses` to the members known; whether the client knew of the cluster
    /// before.
    fn know_members(&self, addresses: impl IntoIterator<Item = String>) -> bool {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        let knew = members.is_some();
        members.get_or_insert_default().extend(addresses);
        knew
    }

    /// The members known (none before the client knew of a cluster).
    fn members(&self) -> Vec<String> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.iter().flatten().cloned().collect()
    }

    /// A member other than `first` and those in `tried`.
    fn untried_member(&self, first: &str, tried: &BTreeSet<String>) -> Option<String> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        (members.iter().flatten())
            .find(|member| *member != first && !tried.contains(*member))
            .cloned()
    }

    /// The connection to the node at `address`, made on first use.
    async fn connection(&self, address: &str) -> Result<Connection> {
        let mut nodes = self.nodes.lock().await;
        if let Some(connection) = nodes.get(address) {
            return Ok(connection.clone());
        }
        let connected = MinkClient::connect_with(address, &self.options).await?;
        let connection = connected.connection();
        nodes.insert(address.to_string(), connection.clone());
        Ok(connection)
    }

    /// Forgets the connection to the node at `address`: the next call logs in again.
    async fn forget_connection(&self, address: &str) {
        self.nodes.lock().await.remove(address);
    }
}

impl MinkClient {
    /// The address of the node this client calls about `bucket`: the one a NotLeader
    /// answer last named its leader, else the node it connected to.
    pub fn leader_of(&self, bucket: &BucketId) -> String {
        (self.leaders().leader_of(bucket)).unwrap_or_else(|| self.address().to_string())
    }

    /// Runs `call` on the node leading `bucket`, following NotLeader answers (see the
    /// module doc). An error that is not NotLeader is the call's, except that a leader
    /// learned before that cannot be reached any more is forgotten and the first node
    /// asked again; when it still cannot be reached at the end, the call fails with the
    /// NotLeader that named it.
    pub(crate) async fn on_leader<T, Fut>(
        &self,
        bucket: &BucketId,
        call: impl Fn(MinkClient) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        self.follow(bucket, Repeat::Always, call).await
    }

    /// [`MinkClient::on_leader`], for a call that `repeat` says may be made again or not
    /// after it failed on its way (a write without an idempotent writer must not: see
    /// [`Repeat`]). A NotLeader answer comes before the node does anything, so it is
    /// followed either way.
    pub(crate) async fn follow<T, Fut>(
        &self,
        bucket: &BucketId,
        repeat: Repeat,
        call: impl Fn(MinkClient) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.leaders().follow_for();
        let mut hops = 0;
        let mut named: Option<ClientError> = None;
        // The other members asked while the first node could not be reached.
        let mut tried = BTreeSet::new();
        loop {
            let learned = self.leaders().leader_of(bucket);
            let answer = match &learned {
                Some(address) => match self.leaders().connection(address).await {
                    Ok(connection) => call(self.at(address, connection)).await,
                    Err(error) => Err(error),
                },
                None => call(self.clone()).await,
            };
            let error = match answer {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            match error.not_leader() {
                Some(NotLeader {
                    leader: Some(leader),
                    ..
                }) if hops < MAX_HOPS => {
                    self.learn_members(&leader).await;
                    self.leaders().learn(bucket, Some(leader));
                    hops += 1;
                    named = Some(error);
                }
                Some(NotLeader { leader: None, .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(MOVING_PAUSE).await;
                    hops = 0;
                }
                // A leader gone (its node died): until the bucket moves, the first node
                // still names it; asked again after a pause.
                None if learned.is_some()
                    && unreachable(&error)
                    && (repeat == Repeat::Always || never_sent(&error)) =>
                {
                    if Instant::now() >= deadline {
                        return Err(named.unwrap_or(error));
                    }
                    self.leaders().learn(bucket, None);
                    tokio::time::sleep(MOVING_PAUSE).await;
                    hops = 0;
                }
                None if let Some(address) = &learned
                    && login_forgotten(&error)
                    && hops < MAX_HOPS =>
                {
                    self.leaders().forget_connection(address).await;
                    hops += 1;
                }
                // The first node gone: another member is asked about the bucket (it
                // answers, or names the leader), each once, then all again after a pause.
                None if learned.is_none()
                    && unreachable(&error)
                    && (repeat == Repeat::Always || never_sent(&error))
                    && Instant::now() < deadline =>
                {
                    let member = self.leaders().untried_member(self.address(), &tried);
                    match member {
                        Some(member) => {
                            tried.insert(member.clone());
                            self.leaders().learn(bucket, Some(member));
                        }
                        None if tried.is_empty() => return Err(error),
                        None => {
                            tried.clear();
                            tokio::time::sleep(MOVING_PAUSE).await;
                        }
                    }
                }
                _ => return Err(error),
            }
        }
    }
}

impl MinkClient {
    /// Notes `leader` a member of the cluster; the first time, also the live members the
    /// first node lists (best effort: what it cannot list is learned from later answers).
    async fn learn_members(&self, leader: &str) {
        if self.leaders().know_members([leader.to_string()]) {
            return;
        }
        if let Ok(nodes) = self.list_nodes().await {
            let live = nodes.into_iter().filter(|node| node.live);
            self.leaders()
                .know_members(live.filter_map(|node| node.address));
        }
    }

    /// A request about every bucket of a table (`list_buckets`, `plan_table_union`),
    /// which each node answers for the buckets it leads, naming the leaders of the others
    /// (`ask` gives one node's answer: its items, each naming its `bucket`, and the
    /// NotLeader of the rest). Asks this client's node (every member known instead when
    /// it cannot be reached), then each leader named, once each; a bucket moving or
    /// answered by no one is asked about again after a pause, for up to [`FOLLOW_FOR`]
    /// (or the client's `follow_for`). The items sorted by bucket (partition, then
    /// bucket), and each bucket's leader learned.
    pub(crate) async fn on_every_leader<T, Fut>(
        &self,
        bucket: impl Fn(&T) -> Option<BucketId>,
        ask: impl Fn(MinkClient) -> Fut,
    ) -> Result<Vec<T>>
    where
        Fut: Future<Output = Result<(Vec<T>, Vec<NotLeader>)>>,
    {
        let follow_for = self.leaders().follow_for();
        let deadline = Instant::now() + follow_for;
        loop {
            let mut answered: BTreeMap<BucketId, T> = BTreeMap::new();
            let mut missing: BTreeSet<BucketId> = BTreeSet::new();
            let mut asked: BTreeSet<String> = BTreeSet::new();
            let mut to_ask = vec![self.address().to_string()];
            // Why the first node did not answer, while no other did either.
            let mut unanswered: Option<ClientError> = None;
            while let Some(address) = to_ask.pop() {
                if !asked.insert(address.clone()) {
                    continue;
                }
                let first = address == self.address();
                let answer = match first {
                    true => ask(self.clone()).await,
                    false => match self.leaders().connection(&address).await {
                        Ok(connection) => ask(self.at(&address, connection)).await,
                        Err(error) => Err(error),
                    },
                };
                let (items, elsewhere) = match answer {
                    Ok(answer) => {
                        unanswered = None;
                        answer
                    }
                    // The first node gone: every member known is asked instead.
                    Err(error) if first && unreachable(&error) => {
                        let members = self.leaders().members();
                        if members.is_empty() {
                            return Err(error);
                        }
                        to_ask.extend(members);
                        unanswered = Some(error);
                        continue;
                    }
                    // A leader named that is gone: its buckets are asked about again.
                    Err(error) if !first && unreachable(&error) => continue,
                    // One that restarted: likewise, with a new login.
                    Err(error) if !first && login_forgotten(&error) => {
                        self.leaders().forget_connection(&address).await;
                        continue;
                    }
                    Err(error) => return Err(error),
                };
                for item in items {
                    let bucket = bucket(&item).ok_or_else(|| {
                        ClientError::Protocol(format!("an answer of {address} names no bucket"))
                    })?;
                    missing.remove(&bucket);
                    self.leaders()
                        .learn(&bucket, (!first).then(|| address.clone()));
                    answered.entry(bucket).or_insert(item);
                }
                for not_leader in elsewhere {
                    let Some(bucket) = not_leader.bucket else {
                        continue;
                    };
                    if !answered.contains_key(&bucket) {
                        missing.insert(bucket);
                        to_ask.extend(not_leader.leader);
                    }
                }
            }
            if let Some(error) = unanswered {
                // No node answered: nothing is known, not even that there is no bucket.
                if Instant::now() >= deadline {
                    return Err(error);
                }
            } else if missing.is_empty() {
                return Ok(answered.into_values().collect());
            }
            if Instant::now() >= deadline {
                let bucket = missing.into_iter().next();
                return Err(ClientError::Protocol(format!(
                    "no node answered for bucket {} within {follow_for:?}: it is moving",
                    bucket.map_or_else(String::new, |bucket| bucket.to_string())
                )));
            }
            tokio::time::sleep(MOVING_PAUSE).await;
        }
    }
}

/// Whether a call to a leader that cannot be reached may be made again (to the node the
/// client connected to, then the leader it names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Always (a read, an idempotent writer's write).
    Always,
    /// Only when it surely did not reach the node: its connection was refused.
    IfNotSent,
}

/// Whether `error` says the call never reached the node: its connection could not be
/// made, or was refused.
fn never_sent(error: &ClientError) -> bool {
    let ClientError::Status(status) = error else {
        return matches!(error, ClientError::Connect { .. });
    };
    let mut source = std::error::Error::source(status.as_ref());
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// Whether `error` says the node does not know the connection's login (as a node that
/// restarted since the login does not).
fn login_forgotten(error: &ClientError) -> bool {
    error.code() == Some(tonic::Code::Unauthenticated)
}

/// Whether `error` says the node could not be reached (as a node gone does).
fn unreachable(error: &ClientError) -> bool {
    match error {
        ClientError::Connect { .. } => true,
        ClientError::Status(status) => status.code() == tonic::Code::Unavailable,
        _ => false,
    }
}
