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
//! What the coordinator holds is bounded ([`crate::limits`]): groups and members by
//! count, a member's protocols and its assignment by [`MAX_MEMBER_BYTES`], and
//! everything every group holds (ids, protocols, assignments, each entry counted at
//! [`ENTRY_BYTES`] beyond its strings) by [`MAX_COORDINATOR_BYTES`]. Members expire by
//! their session timeout ([`SESSION_TIMEOUTS`]) whether or not their group hears from
//! anyone again: at most every [`GROUP_SWEEP_INTERVAL`], a request of any group first
//! removes the expired members of every group and drops the groups left empty.
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

use crate::limits::{
    GROUP_SWEEP_INTERVAL, MAX_COORDINATOR_BYTES, MAX_GROUP_ID_BYTES, MAX_GROUP_MEMBERS, MAX_GROUPS,
    MAX_MEMBER_BYTES, MAX_REBALANCE_TIMEOUT, SESSION_TIMEOUTS,
};

/// How often a waiting join or sync looks for expired sessions.
const EXPIRY_CHECK: Duration = Duration::from_millis(200);
/// What a group, a member, a protocol or an assignment is counted at beyond its
/// strings: its entry in its map and its bookkeeping.
const ENTRY_BYTES: usize = 128;

/// Every group this node coordinates.
pub(crate) struct Groups {
    registry: Mutex<Registry>,
    /// Woken on every change of any group: joins and syncs waiting for one look again.
    changed: Notify,
}

/// The groups, and the bytes they hold in all.
struct Registry {
    groups: HashMap<String, Group>,
    /// The sum of every group's [`Group::held`].
    held: usize,
    /// When every group was last swept of expired members.
    swept: Instant,
}

impl Registry {
    /// Runs `change` on a group, then counts what the group holds again.
    fn update<T>(&mut self, group_id: &str, change: impl FnOnce(&mut Group) -> T) -> Option<T> {
        let group = self.groups.get_mut(group_id)?;
        let before = group.held;
        let out = change(group);
        group.held = group.bytes();
        self.held = self.held + group.held - before;
        Some(out)
    }

    /// The bytes a group may still take before [`MAX_COORDINATOR_BYTES`].
    fn room(&self) -> usize {
        MAX_COORDINATOR_BYTES.saturating_sub(self.held)
    }

    /// Adds an empty group, unless there are [`MAX_GROUPS`] already even after a sweep.
    fn create(&mut self, group_id: &str, now: Instant) -> Result<(), ResponseError> {
        if self.groups.contains_key(group_id) {
            return Ok(());
        }
        if self.groups.len() >= MAX_GROUPS {
            self.sweep_now(now);
            if self.groups.len() >= MAX_GROUPS {
                return Err(ResponseError::CoordinatorNotAvailable);
            }
        }
        let group = Group::new(group_id.len());
        self.held += group.held;
        self.groups.insert(group_id.to_string(), group);
        Ok(())
    }

    /// Drops a group that has no members left.
    fn drop_if_empty(&mut self, group_id: &str) {
        if let Some(group) = self.groups.get(group_id)
            && group.state == State::Empty
        {
            self.held -= group.held;
            self.groups.remove(group_id);
        }
    }

    /// [`Self::sweep_now`], at most every [`GROUP_SWEEP_INTERVAL`].
    fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.swept) >= GROUP_SWEEP_INTERVAL {
            self.sweep_now(now);
        }
    }

    /// Removes the expired members of every group (ending the rebalances whose time is
    /// up) and drops the groups left empty.
    fn sweep_now(&mut self, now: Instant) {
        self.swept = now;
        self.groups.retain(|_, group| {
            group.expire(now);
            group.complete_join(now);
            group.held = group.bytes();
            group.state != State::Empty
        });
        self.held = self.groups.values().map(|group| group.held).sum();
    }
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
    /// The length of the group's id.
    id_bytes: usize,
    /// What the group holds ([`Group::bytes`]) when last counted.
    held: usize,
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
    fn new(id_bytes: usize) -> Self {
        let mut group = Self {
            id_bytes,
            held: 0,
            state: State::Empty,
            generation: 0,
            protocol_type: String::new(),
            protocol_name: None,
            leader: None,
            members: BTreeMap::new(),
            rebalance_deadline: Instant::now(),
            assignments: None,
        };
        group.held = group.bytes();
        group
    }

    /// The bytes the group holds: its id, protocol type, members and assignments.
    fn bytes(&self) -> usize {
        let members: usize = self
            .members
            .iter()
            .map(|(id, member)| member_bytes(id, &member.protocols))
            .sum();
        let assignments: usize = self
            .assignments
            .iter()
            .flatten()
            .map(|(id, assignment)| ENTRY_BYTES + id.len() + assignment.len())
            .sum();
        ENTRY_BYTES + self.id_bytes + self.protocol_type.len() + members + assignments
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
            registry: Mutex::new(Registry {
                groups: HashMap::new(),
                held: 0,
                swept: Instant::now(),
            }),
            changed: Notify::new(),
        }
    }

    /// The registry, swept of expired members if that is due.
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        registry.sweep(Instant::now());
        registry
    }

    /// `JoinGroup`: joins (or rejoins) and waits for the rebalance to end.
    pub(crate) async fn join(&self, request: JoinGroupRequest, version: i16) -> JoinGroupResponse {
        let refuse = |error: ResponseError| {
            JoinGroupResponse::default()
                .with_error_code(error.code())
                .with_generation_id(-1)
        };
        let group_id = request.group_id.0.to_string();
        let member = match Joining::of(&request, version) {
            Ok(member) => member,
            Err(error) => return refuse(error),
        };
        let member_id = {
            let mut registry = self.lock();
            let now = Instant::now();
            if let Err(error) = registry.create(&group_id, now) {
                return refuse(error);
            }
            let room = registry.room();
            let joined = registry.update(&group_id, |group| group.join(member, room, now));
            match joined {
                Some(Ok(member_id)) => member_id,
                Some(Err(error)) => {
                    registry.drop_if_empty(&group_id);
                    return refuse(error);
                }
                None => return refuse(ResponseError::CoordinatorNotAvailable),
            }
        };
        self.changed.notify_waiters();
        loop {
            let changed = self.changed.notified();
            {
                let mut registry = self.lock();
                let now = Instant::now();
                let answer = registry.update(&group_id, |group| {
                    group.expire(now);
                    group.complete_join(now);
                    let member = group.members.get(&member_id)?;
                    let done = group.state != State::PreparingRebalance && !member.joined;
                    Some(done.then(|| joined(group, &member_id)))
                });
                match answer.flatten() {
                    None => return refuse(ResponseError::UnknownMemberId),
                    Some(Some(answer)) => return answer,
                    Some(None) => {}
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
            let step = {
                let mut registry = self.lock();
                let room = registry.room();
                registry.update(&group_id, |group| group.sync(&member_id, &request, room))
            };
            match step {
                None => return refuse(ResponseError::UnknownMemberId),
                Some(Err(error)) => return refuse(error),
                Some(Ok(Some(answer))) => {
                    // The leader's answer is the first: the others waiting get theirs.
                    self.changed.notify_waiters();
                    return answer;
                }
                Some(Ok(None)) => {}
            }
            let _ = tokio::time::timeout(EXPIRY_CHECK, changed).await;
        }
    }

    /// `Heartbeat`: keeps a member's session; tells it of a rebalance.
    pub(crate) fn heartbeat(&self, request: &HeartbeatRequest) -> HeartbeatResponse {
        let answer = |error: Option<ResponseError>| {
            HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code()))
        };
        let mut registry = self.lock();
        let error = registry.update(request.group_id.0.as_str(), |group| {
            let now = Instant::now();
            group.expire(now);
            let member_id = request.member_id.as_str();
            if let Some(member) = group.members.get_mut(member_id) {
                member.last_seen = now;
            }
            group
                .check_member(member_id, request.generation_id)
                .or((group.state == State::PreparingRebalance)
                    .then_some(ResponseError::RebalanceInProgress))
        });
        answer(error.unwrap_or(Some(ResponseError::UnknownMemberId)))
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
            let mut registry = self.lock();
            let known = registry.update(group_id, |group| {
                let known: Vec<bool> = leaving
                    .iter()
                    .map(|member_id| group.members.remove(member_id).is_some())
                    .collect();
                if known.contains(&true) {
                    group.after_departure(Instant::now());
                }
                known
            });
            registry.drop_if_empty(group_id);
            known.unwrap_or_else(|| vec![false; leaving.len()])
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

    /// The ids of the groups that have members now: their committed offsets are in use
    /// (`crate::offsets` keeps them).
    pub(crate) fn with_members(&self) -> Vec<String> {
        let registry = self.lock();
        registry
            .groups
            .iter()
            .filter(|(_, group)| !group.members.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
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
        let registry = self.lock();
        let group = registry.groups.get(group_id)?;
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

/// A member as its JoinGroup asks to join: checked, its protocols copied out of the
/// request (so the member holds its own bytes, not the whole request frame).
struct Joining {
    /// The id it asks to rejoin as; empty for a new member.
    member_id: String,
    /// The prefix of a new member's id.
    client: String,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
}

impl Joining {
    fn of(request: &JoinGroupRequest, version: i16) -> Result<Self, ResponseError> {
        let group_id = request.group_id.0.as_str();
        if group_id.is_empty() || group_id.len() > MAX_GROUP_ID_BYTES {
            return Err(ResponseError::InvalidGroupId);
        }
        if !SESSION_TIMEOUTS.contains(&request.session_timeout_ms) {
            return Err(ResponseError::InvalidSessionTimeout);
        }
        let client = client_name(request);
        // Everything the member keeps, each reply to its group repeats the protocol type.
        let protocols: usize = request
            .protocols
            .iter()
            .map(|p| ENTRY_BYTES + p.name.len() + p.metadata.len())
            .sum();
        let asked =
            protocols + request.protocol_type.len() + request.member_id.len() + client.len();
        if asked > MAX_MEMBER_BYTES {
            return Err(ResponseError::InvalidRequest);
        }
        let session_timeout = Duration::from_millis(request.session_timeout_ms as u64);
        let rebalance_timeout = match version {
            0 => session_timeout,
            _ => Duration::from_millis(u64::try_from(request.rebalance_timeout_ms).unwrap_or(0)),
        }
        .min(MAX_REBALANCE_TIMEOUT);
        Ok(Self {
            member_id: request.member_id.to_string(),
            client,
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), Bytes::copy_from_slice(&p.metadata)))
                .collect(),
            session_timeout,
            rebalance_timeout,
        })
    }
}

/// What a member holds: its id and protocols, each entry at [`ENTRY_BYTES`] more.
fn member_bytes(member_id: &str, protocols: &[(String, Bytes)]) -> usize {
    let protocols: usize = protocols
        .iter()
        .map(|(name, metadata)| ENTRY_BYTES + name.len() + metadata.len())
        .sum();
    ENTRY_BYTES + member_id.len() + protocols
}

impl Group {
    /// Adds (or renews) a member and starts a rebalance; its id. `room`: the bytes the
    /// coordinator may still take.
    fn join(
        &mut self,
        joining: Joining,
        room: usize,
        now: Instant,
    ) -> Result<String, ResponseError> {
        self.expire(now);
        let member_id = match joining.member_id.as_str() {
            "" => format!("{}-{}", joining.client, uuid::Uuid::new_v4()),
            known if self.members.contains_key(known) => known.to_string(),
            _ => return Err(ResponseError::UnknownMemberId),
        };
        let previous = self.members.get(&member_id);
        if previous.is_none() && self.members.len() >= MAX_GROUP_MEMBERS {
            return Err(ResponseError::GroupMaxSizeReached);
        }
        let freed = previous.map_or(0, |m| member_bytes(&member_id, &m.protocols));
        let taken = member_bytes(&member_id, &joining.protocols) + joining.protocol_type.len();
        if taken > room + freed {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if self.state != State::Empty && self.protocol_type != joining.protocol_type {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        // A generation needs a protocol every member speaks: a member that would leave
        // none is refused, as Kafka does, rather than make the group's protocol unknown.
        let speaks_with_others = |name: &String| {
            (self.members.iter())
                .filter(|(id, _)| **id != member_id)
                .all(|(_, m)| m.protocols.iter().any(|(n, _)| n == name))
        };
        if !joining
            .protocols
            .iter()
            .any(|(name, _)| speaks_with_others(name))
        {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        self.protocol_type = joining.protocol_type;
        self.members.insert(
            member_id.clone(),
            Member {
                protocols: joining.protocols,
                session_timeout: joining.session_timeout,
                rebalance_timeout: joining.rebalance_timeout,
                last_seen: now,
                joined: true,
            },
        );
        if self.state != State::PreparingRebalance {
            self.start_rebalance(now);
        }
        self.complete_join(now);
        Ok(member_id)
    }

    /// One look at the group for a member's SyncGroup: the leader's hands in the
    /// assignments (only those of members, each within [`MAX_MEMBER_BYTES`], all
    /// within `room`); a member's answer once they are in, `None` until then.
    fn sync(
        &mut self,
        member_id: &str,
        request: &SyncGroupRequest,
        room: usize,
    ) -> Result<Option<SyncGroupResponse>, ResponseError> {
        if let Some(error) = self.check_member(member_id, request.generation_id) {
            return Err(error);
        }
        let now = Instant::now();
        if let Some(member) = self.members.get_mut(member_id) {
            member.last_seen = now;
        }
        match self.state {
            State::PreparingRebalance | State::Empty => {
                return Err(ResponseError::RebalanceInProgress);
            }
            State::CompletingRebalance if self.leader.as_deref() == Some(member_id) => {
                self.assignments = Some(self.checked_assignments(request, room)?);
                self.state = State::Stable;
            }
            State::CompletingRebalance | State::Stable => {}
        }
        let Some(assignments) = &self.assignments else {
            self.expire(now);
            return Ok(None);
        };
        let assignment = assignments.get(member_id).cloned().unwrap_or_default();
        Ok(Some(
            SyncGroupResponse::default()
                .with_protocol_type(Some(StrBytes::from_string(self.protocol_type.clone())))
                .with_protocol_name(self.protocol_name.clone().map(StrBytes::from_string))
                .with_assignment(assignment),
        ))
    }

    /// The leader's assignments to members of the group, copied out of the request.
    fn checked_assignments(
        &self,
        request: &SyncGroupRequest,
        room: usize,
    ) -> Result<HashMap<String, Bytes>, ResponseError> {
        let mut assignments = HashMap::new();
        let mut taken = 0usize;
        for given in &request.assignments {
            let member_id = given.member_id.as_str();
            if !self.members.contains_key(member_id) {
                continue;
            }
            let bytes = ENTRY_BYTES + member_id.len() + given.assignment.len();
            if bytes > MAX_MEMBER_BYTES {
                return Err(ResponseError::InvalidRequest);
            }
            taken += bytes;
            if taken > room {
                return Err(ResponseError::CoordinatorNotAvailable);
            }
            assignments.insert(
                member_id.to_string(),
                Bytes::copy_from_slice(&given.assignment),
            );
        }
        Ok(assignments)
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

#[cfg(test)]
mod tests;
