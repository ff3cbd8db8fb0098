//! The group coordinator: what `subscribe()` with a `group.id` needs (Kafka's classic
//! group protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup).
//!
//! ```text
//!            join                      every member joined (or the rebalance timeout)
//!   Empty ─────────▶ PreparingRebalance ───────────────────────────▶ CompletingRebalance
//!     ▲                    ▲    ▲                                           │ the leader's SyncGroup
//!     │ last member leaves │    └── a join, a leave, a session that expired │ (its assignments)
//!     └────────────────────┴─────────────────────────────────────── Stable ◀┘
//! ```
//!
//! A rebalance waits for every member to join again; members learn of it from their
//! next Heartbeat (`REBALANCE_IN_PROGRESS`). The first member to join leads: it gets
//! every member's subscription and sends back the assignments in its SyncGroup, which
//! the other members' SyncGroups wait for. A member whose heartbeats stop for its
//! session timeout is removed, which starts a rebalance.
//!
//! Membership lives in memory only (a restart makes every member join again, as after a
//! coordinator move in Kafka); the offsets a group commits are stored durably
//! ([`crate::offsets`]). Static membership (`group.instance.id`) is treated as dynamic.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::limits::{MAX_GROUP_MEMBERS, MAX_GROUPS};

/// The session timeouts a member may ask for.
const SESSION_TIMEOUTS: std::ops::RangeInclusive<i32> = 1_000..=1_800_000;
/// The longest a rebalance waits for members to join again.
const MAX_REBALANCE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a waiting join or sync looks for expired sessions.
const EXPIRY_CHECK: Duration = Duration::from_millis(200);

/// Every group this node coordinates.
pub(crate) struct Groups {
    groups: Mutex<HashMap<String, Group>>,
    /// Woken on every change of any group: joins and syncs waiting for one look again.
    changed: Notify,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups").finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

#[derive(Debug)]
struct Group {
    state: State,
    generation: i32,
    protocol_type: String,
    protocol_name: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// When a rebalance stops waiting for members that have not joined again.
    rebalance_deadline: Instant,
    /// The leader's assignments for `generation`, once it has synced.
    assignments: Option<HashMap<String, Bytes>>,
}

#[derive(Debug)]
struct Member {
    protocols: Vec<(String, Bytes)>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    last_seen: Instant,
    /// Joined the rebalance in progress.
    joined: bool,
}

impl Group {
    fn new() -> Self {
        Self {
            state: State::Empty,
            generation: 0,
            protocol_type: String::new(),
            protocol_name: None,
            leader: None,
            members: BTreeMap::new(),
            rebalance_deadline: Instant::now(),
            assignments: None,
        }
    }

    fn start_rebalance(&mut self, now: Instant) {
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        self.state = State::PreparingRebalance;
        self.rebalance_deadline = now + timeout;
        self.assignments = None;
    }

    /// Removes members whose session expired; a rebalance starts if any was.
    fn expire(&mut self, now: Instant) {
        let before = self.members.len();
        self.members
            .retain(|_, m| m.joined || now.duration_since(m.last_seen) < m.session_timeout);
        if self.members.len() < before {
            self.after_departure(now);
        }
    }

    fn after_departure(&mut self, now: Instant) {
        if self.members.is_empty() {
            self.state = State::Empty;
            self.leader = None;
            self.assignments = None;
        } else {
            if self
                .leader
                .as_ref()
                .is_some_and(|l| !self.members.contains_key(l))
            {
                self.leader = self.members.keys().next().cloned();
            }
            self.start_rebalance(now);
        }
    }

    /// Ends the rebalance when every member has joined again (or its time is up, which
    /// removes those that have not): a new generation with a protocol all members speak.
    fn complete_join(&mut self, now: Instant) {
        if self.state != State::PreparingRebalance {
            return;
        }
        let all_joined = self.members.values().all(|m| m.joined);
        if !all_joined && now < self.rebalance_deadline {
            return;
        }
        self.members.retain(|_, m| m.joined);
        if self.members.is_empty() {
            self.state = State::Empty;
            self.leader = None;
            return;
        }
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        let leader = &self.members[self.leader.as_deref().unwrap_or_default()];
        self.protocol_name = leader
            .protocols
            .iter()
            .map(|(name, _)| name)
            .find(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == *name))
            })
            .cloned();
        self.generation += 1;
        self.state = State::CompletingRebalance;
        for member in self.members.values_mut() {
            member.joined = false;
            member.last_seen = now;
        }
    }

    /// A refusal for a member's request at `generation`, if any.
    fn check_member(&self, member_id: &str, generation: i32) -> Option<ResponseError> {
        if !self.members.contains_key(member_id) {
            Some(ResponseError::UnknownMemberId)
        } else if generation != self.generation {
            Some(ResponseError::IllegalGeneration)
        } else {
            None
        }
    }
}

impl Groups {
    pub(crate) fn new() -> Self {
        Self {
            groups: Mutex::default(),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `JoinGroup`: joins (or rejoins) and waits for the rebalance to end.
    pub(crate) async fn join(&self, request: JoinGroupRequest, version: i16) -> JoinGroupResponse {
        let refuse = |error: ResponseError| {
            JoinGroupResponse::default()
                .with_error_code(error.code())
                .with_generation_id(-1)
        };
        let group_id = request.group_id.0.to_string();
        if group_id.is_empty() {
            return refuse(ResponseError::InvalidGroupId);
        }
        if !SESSION_TIMEOUTS.contains(&request.session_timeout_ms) {
            return refuse(ResponseError::InvalidSessionTimeout);
        }
        let session_timeout = Duration::from_millis(request.session_timeout_ms as u64);
        let rebalance_timeout = match version {
            0 => session_timeout,
            _ => Duration::from_millis(u64::try_from(request.rebalance_timeout_ms).unwrap_or(0)),
        }
        .min(MAX_REBALANCE_TIMEOUT);
        let member_id = {
            let mut groups = self.lock();
            if !groups.contains_key(&group_id) && groups.len() >= MAX_GROUPS {
                // Groups whose members all went away without leaving are dropped first.
                let now = Instant::now();
                groups.retain(|_, group| {
                    group.expire(now);
                    group.complete_join(now);
                    group.state != State::Empty
                });
                if groups.len() >= MAX_GROUPS {
                    return refuse(ResponseError::CoordinatorNotAvailable);
                }
            }
            let group = groups.entry(group_id.clone()).or_insert_with(Group::new);
            let now = Instant::now();
            group.expire(now);
            let member_id = match request.member_id.as_str() {
                "" => format!("{}-{}", client_name(&request), uuid::Uuid::new_v4()),
                known if group.members.contains_key(known) => known.to_string(),
                _ => return refuse(ResponseError::UnknownMemberId),
            };
            if !group.members.contains_key(&member_id) && group.members.len() >= MAX_GROUP_MEMBERS {
                return refuse(ResponseError::GroupMaxSizeReached);
            }
            let protocol_type = request.protocol_type.to_string();
            if group.state != State::Empty && group.protocol_type != protocol_type {
                return refuse(ResponseError::InconsistentGroupProtocol);
            }
            group.protocol_type = protocol_type;
            let protocols = request
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect();
            group.members.insert(
                member_id.clone(),
                Member {
                    protocols,
                    session_timeout,
                    rebalance_timeout,
                    last_seen: now,
                    joined: true,
                },
            );
            if group.state != State::PreparingRebalance {
                group.start_rebalance(now);
            }
            group.complete_join(now);
            member_id
        };
        self.changed.notify_waiters();
        loop {
            let changed = self.changed.notified();
            {
                let mut groups = self.lock();
                let Some(group) = groups.get_mut(&group_id) else {
                    return refuse(ResponseError::UnknownMemberId);
                };
                let now = Instant::now();
                group.expire(now);
                group.complete_join(now);
                let Some(member) = group.members.get(&member_id) else {
                    return refuse(ResponseError::UnknownMemberId);
                };
                if group.state != State::PreparingRebalance && !member.joined {
                    return joined(group, &member_id);
                }
            }
            let _ = tokio::time::timeout(EXPIRY_CHECK, changed).await;
        }
    }

    /// `SyncGroup`: the leader hands in the assignments; every member waits for its own.
    pub(crate) async fn sync(&self, request: SyncGroupRequest) -> SyncGroupResponse {
        let refuse =
            |error: ResponseError| SyncGroupResponse::default().with_error_code(error.code());
        let group_id = request.group_id.0.to_string();
        let member_id = request.member_id.to_string();
        loop {
            let changed = self.changed.notified();
            {
                let mut groups = self.lock();
                let Some(group) = groups.get_mut(&group_id) else {
                    return refuse(ResponseError::UnknownMemberId);
                };
                if let Some(error) = group.check_member(&member_id, request.generation_id) {
                    return refuse(error);
                }
                if let Some(member) = group.members.get_mut(&member_id) {
                    member.last_seen = Instant::now();
                }
                match group.state {
                    State::PreparingRebalance | State::Empty => {
                        return refuse(ResponseError::RebalanceInProgress);
                    }
                    State::CompletingRebalance if group.leader.as_deref() == Some(&member_id) => {
                        group.assignments = Some(
                            request
                                .assignments
                                .iter()
                                .map(|a| (a.member_id.to_string(), a.assignment.clone()))
                                .collect(),
                        );
                        group.state = State::Stable;
                        self.changed.notify_waiters();
                    }
                    State::CompletingRebalance => {}
                    State::Stable => {}
                }
                if let Some(assignments) = &group.assignments {
                    let assignment = assignments.get(&member_id).cloned().unwrap_or_default();
                    return SyncGroupResponse::default()
                        .with_protocol_type(Some(StrBytes::from_string(
                            group.protocol_type.clone(),
                        )))
                        .with_protocol_name(group.protocol_name.clone().map(StrBytes::from_string))
                        .with_assignment(assignment);
                }
                group.expire(Instant::now());
            }
            let _ = tokio::time::timeout(EXPIRY_CHECK, changed).await;
        }
    }

    /// `Heartbeat`: keeps a member's session; tells it of a rebalance.
    pub(crate) fn heartbeat(&self, request: &HeartbeatRequest) -> HeartbeatResponse {
        let answer = |error: Option<ResponseError>| {
            HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code()))
        };
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(request.group_id.0.as_str()) else {
            return answer(Some(ResponseError::UnknownMemberId));
        };
        let now = Instant::now();
        group.expire(now);
        let member_id = request.member_id.as_str();
        if let Some(member) = group.members.get_mut(member_id) {
            member.last_seen = now;
        }
        if let Some(error) = group.check_member(member_id, request.generation_id) {
            return answer(Some(error));
        }
        match group.state {
            State::PreparingRebalance => answer(Some(ResponseError::RebalanceInProgress)),
            _ => answer(None),
        }
    }

    /// `LeaveGroup`: the members go; a rebalance starts for the rest.
    pub(crate) fn leave(&self, request: &LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
        let leaving: Vec<String> = if version >= 3 {
            request
                .members
                .iter()
                .map(|m| m.member_id.to_string())
                .collect()
        } else {
            vec![request.member_id.to_string()]
        };
        let group_id = request.group_id.0.as_str();
        let known: Vec<bool> = {
            let mut groups = self.lock();
            let known = match groups.get_mut(group_id) {
                None => vec![false; leaving.len()],
                Some(group) => {
                    let known: Vec<bool> = leaving
                        .iter()
                        .map(|member_id| group.members.remove(member_id).is_some())
                        .collect();
                    if known.contains(&true) {
                        group.after_departure(Instant::now());
                    }
                    known
                }
            };
            if groups
                .get(group_id)
                .is_some_and(|g| g.state == State::Empty)
            {
                groups.remove(group_id);
            }
            known
        };
        let any_unknown = known.contains(&false);
        let responses = leaving
            .into_iter()
            .zip(&known)
            .map(|(member_id, known)| {
                let code = if *known {
                    0
                } else {
                    ResponseError::UnknownMemberId.code()
                };
                MemberResponse::default()
                    .with_member_id(StrBytes::from_string(member_id))
                    .with_error_code(code)
            })
            .collect();
        self.changed.notify_waiters();
        // Before v3 a leave names one member and has no list of answers.
        if version >= 3 {
            LeaveGroupResponse::default().with_members(responses)
        } else if any_unknown {
            LeaveGroupResponse::default().with_error_code(ResponseError::UnknownMemberId.code())
        } else {
            LeaveGroupResponse::default()
        }
    }

    /// Whether a member may commit offsets for `group` at `generation`: a group with
    /// members takes commits from its members of the current generation; a group with
    /// none takes them from anyone (a consumer that assigns its partitions itself).
    pub(crate) fn check_commit(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
    ) -> Option<i16> {
        let groups = self.lock();
        let group = groups.get(group_id)?;
        if group.members.is_empty() && generation < 0 {
            return None;
        }
        if let Some(error) = group.check_member(member_id, generation) {
            return Some(error.code());
        }
        (group.state == State::PreparingRebalance)
            .then(|| ResponseError::RebalanceInProgress.code())
    }
}

/// The answer to a member whose join completed.
fn joined(group: &Group, member_id: &str) -> JoinGroupResponse {
    let protocol = group.protocol_name.clone();
    let leader = group.leader.clone().unwrap_or_default();
    let members = if leader == member_id {
        group
            .members
            .iter()
            .map(|(id, member)| {
                let metadata = member
                    .protocols
                    .iter()
                    .find(|(name, _)| Some(name) == protocol.as_ref())
                    .map(|(_, metadata)| metadata.clone())
                    .unwrap_or_default();
                JoinGroupResponseMember::default()
                    .with_member_id(StrBytes::from_string(id.clone()))
                    .with_metadata(metadata)
            })
            .collect()
    } else {
        Vec::new()
    };
    JoinGroupResponse::default()
        .with_generation_id(group.generation)
        .with_protocol_type(Some(StrBytes::from_string(group.protocol_type.clone())))
        .with_protocol_name(protocol.map(StrBytes::from_string))
        .with_leader(StrBytes::from_string(leader))
        .with_member_id(StrBytes::from_string(member_id.to_string()))
        .with_members(members)
}

/// The prefix of a new member id: the protocol's first name, as brokers use the client
/// id (the request header is not at hand here).
fn client_name(request: &JoinGroupRequest) -> String {
    request
        .protocols
        .first()
        .map_or_else(|| "member".to_string(), |p| p.name.to_string())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect()
}
