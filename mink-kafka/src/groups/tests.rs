//! The coordinator as a state machine, on tokio's paused clock: sessions and rebalances
//! end when the test moves time on (`advance`), or when every task waits and the clock
//! jumps to the next timer.

use kafka_protocol::messages::GroupId;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use tokio::time::advance;

use super::*;

const GROUP: &str = "g";
/// The shortest session a member may ask for.
const SESSION: Duration = Duration::from_millis(*SESSION_TIMEOUTS.start() as u64);
/// A JoinGroup version that carries a rebalance timeout.
const JOIN_VERSION: i16 = 5;
/// The rebalance timeout members ask for, unless a test says otherwise.
const REBALANCE_MS: i32 = 10_000;
/// LeaveGroup from this version names its members in a list.
const LEAVE_VERSION: i16 = 3;

/// A JoinGroup of [`GROUP`] speaking `protocols` (name, metadata), as `member_id`
/// (empty for a new member).
fn join_request(member_id: &str, protocols: &[(&'static str, &'static str)]) -> JoinGroupRequest {
    let protocols = protocols
        .iter()
        .map(|(name, metadata)| {
            JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str(name))
                .with_metadata(Bytes::from_static(metadata.as_bytes()))
        })
        .collect();
    JoinGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
        .with_session_timeout_ms(*SESSION_TIMEOUTS.start())
        .with_rebalance_timeout_ms(REBALANCE_MS)
        .with_member_id(StrBytes::from_string(member_id.to_string()))
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(protocols)
}

/// A JoinGroup speaking `range` alone, with `metadata`.
fn ranged(member_id: &str, metadata: &'static str) -> JoinGroupRequest {
    join_request(member_id, &[("range", metadata)])
}

/// A JoinGroup of `group` with `metadata` bytes of protocol metadata.
fn sized(group: &str, metadata: usize) -> JoinGroupRequest {
    let protocol = JoinGroupRequestProtocol::default()
        .with_name(StrBytes::from_static_str("range"))
        .with_metadata(Bytes::from(vec![0u8; metadata]));
    ranged("", "")
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_protocols(vec![protocol])
}

fn error(code: i16) -> Option<ResponseError> {
    ResponseError::try_from_code(code)
}

/// The members a join answer lists (only the leader's lists any), with their metadata.
fn listed(answer: &JoinGroupResponse) -> Vec<(String, Bytes)> {
    let mut members: Vec<_> = answer
        .members
        .iter()
        .map(|m| (m.member_id.to_string(), m.metadata.clone()))
        .collect();
    members.sort();
    members
}

async fn sync(
    groups: &Groups,
    member_id: &str,
    generation: i32,
    assignments: &[(&str, &str)],
) -> SyncGroupResponse {
    let assignments = assignments
        .iter()
        .map(|(member_id, assignment)| {
            SyncGroupRequestAssignment::default()
                .with_member_id(StrBytes::from_string(member_id.to_string()))
                .with_assignment(Bytes::copy_from_slice(assignment.as_bytes()))
        })
        .collect();
    let request = SyncGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
        .with_generation_id(generation)
        .with_member_id(StrBytes::from_string(member_id.to_string()))
        .with_assignments(assignments);
    groups.sync(request).await
}

fn heartbeat(groups: &Groups, member_id: &str, generation: i32) -> Option<ResponseError> {
    let request = HeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
        .with_generation_id(generation)
        .with_member_id(StrBytes::from_string(member_id.to_string()));
    error(groups.heartbeat(&request).error_code)
}

/// A LeaveGroup (v3) of `members`: each one's answer.
fn leave(groups: &Groups, members: &[&str]) -> Vec<Option<ResponseError>> {
    let members = members
        .iter()
        .map(|id| MemberIdentity::default().with_member_id(StrBytes::from_string(id.to_string())))
        .collect();
    let request = LeaveGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
        .with_members(members);
    let answer = groups.leave(&request, LEAVE_VERSION);
    assert_eq!(error(answer.error_code), None);
    answer.members.iter().map(|m| error(m.error_code)).collect()
}

fn commit_check(groups: &Groups, member_id: &str, generation: i32) -> Option<ResponseError> {
    groups
        .check_commit(GROUP, generation, member_id)
        .and_then(error)
}

/// A joins alone and syncs (generation 1), then B joins and A rejoins: generation 2,
/// led by A, not yet synced. Their ids.
async fn two_joined(groups: &Groups) -> (String, String) {
    let a = groups.join(ranged("", "a"), JOIN_VERSION).await;
    let a = a.member_id.to_string();
    sync(groups, &a, 1, &[(a.as_str(), "a1")]).await;
    let (b, a_again) = tokio::join!(
        groups.join(ranged("", "b"), JOIN_VERSION),
        groups.join(ranged(&a, "a"), JOIN_VERSION),
    );
    assert_eq!((b.generation_id, a_again.generation_id), (2, 2));
    (a, b.member_id.to_string())
}

/// [`two_joined`], then both synced: generation 2 is stable.
async fn two_synced(groups: &Groups) -> (String, String) {
    let (a, b) = two_joined(groups).await;
    let assignments = [(a.as_str(), "a2"), (b.as_str(), "b2")];
    let (a_sync, b_sync) =
        tokio::join!(sync(groups, &a, 2, &assignments), sync(groups, &b, 2, &[]),);
    assert_eq!((a_sync.error_code, b_sync.error_code), (0, 0));
    (a, b)
}

#[tokio::test(start_paused = true)]
async fn a_member_joining_alone_leads_and_gets_its_assignment_through_sync() {
    let groups = Groups::new();
    let joined = groups.join(ranged("", "meta"), JOIN_VERSION).await;
    assert_eq!(error(joined.error_code), None);
    let id = joined.member_id.to_string();
    assert!(id.starts_with("range-"), "{id}");
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader, joined.member_id);
    assert_eq!(joined.protocol_type.as_deref(), Some("consumer"));
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(listed(&joined), [(id.clone(), Bytes::from_static(b"meta"))]);
    // Joined, not yet synced: the heartbeat keeps the session and tells of nothing.
    assert_eq!(heartbeat(&groups, &id, 1), None);

    let synced = sync(&groups, &id, 1, &[(id.as_str(), "partitions")]).await;
    assert_eq!(error(synced.error_code), None);
    assert_eq!(synced.assignment, Bytes::from_static(b"partitions"));
    assert_eq!(synced.protocol_type.as_deref(), Some("consumer"));
    assert_eq!(synced.protocol_name.as_deref(), Some("range"));
    assert_eq!(heartbeat(&groups, &id, 1), None);
    assert_eq!(commit_check(&groups, &id, 1), None);
    assert_eq!(groups.with_members(), [GROUP]);
}

#[tokio::test(start_paused = true)]
async fn a_second_member_starts_a_rebalance_and_the_generation_increases() {
    let groups = Groups::new();
    let a = groups.join(ranged("", "a"), JOIN_VERSION).await;
    let a = a.member_id.to_string();
    sync(&groups, &a, 1, &[(a.as_str(), "a1")]).await;

    let (b_joined, a_joined) = tokio::join!(groups.join(ranged("", "b"), JOIN_VERSION), async {
        // B waits in its join: A learns of the rebalance from its heartbeat and joins again.
        assert_eq!(
            heartbeat(&groups, &a, 1),
            Some(ResponseError::RebalanceInProgress)
        );
        assert_eq!(
            commit_check(&groups, &a, 1),
            Some(ResponseError::RebalanceInProgress)
        );
        groups.join(ranged(&a, "a"), JOIN_VERSION).await
    });
    let b = b_joined.member_id.to_string();
    assert_eq!((a_joined.generation_id, b_joined.generation_id), (2, 2));
    assert_eq!(a_joined.leader.as_str(), a);
    assert_eq!(b_joined.leader.as_str(), a);
    assert_eq!(
        listed(&a_joined),
        sorted(vec![
            (a.clone(), Bytes::from_static(b"a")),
            (b.clone(), Bytes::from_static(b"b")),
        ])
    );
    assert!(
        listed(&b_joined).is_empty(),
        "only the leader hears of the members"
    );

    // B's sync waits for the leader's, which brings B its assignment.
    let assignments = [(a.as_str(), "a2"), (b.as_str(), "b2")];
    let (b_synced, a_synced) = tokio::join!(
        sync(&groups, &b, 2, &[]),
        sync(&groups, &a, 2, &assignments),
    );
    assert_eq!(b_synced.assignment, Bytes::from_static(b"b2"));
    assert_eq!(a_synced.assignment, Bytes::from_static(b"a2"));
    assert_eq!(heartbeat(&groups, &a, 2), None);
    assert_eq!(heartbeat(&groups, &b, 2), None);
    assert_eq!(
        heartbeat(&groups, &a, 1),
        Some(ResponseError::IllegalGeneration)
    );
}

fn sorted(mut members: Vec<(String, Bytes)>) -> Vec<(String, Bytes)> {
    members.sort();
    members
}

#[tokio::test(start_paused = true)]
async fn a_member_that_stops_heartbeating_is_removed_after_the_session_timeout() {
    let groups = Groups::new();
    let (a, b) = two_synced(&groups).await;
    // A heartbeats every 2 s; B's last word was its sync.
    for _ in 0..2 {
        advance(Duration::from_secs(2)).await;
        assert_eq!(heartbeat(&groups, &a, 2), None);
    }
    advance(SESSION - Duration::from_secs(4) - Duration::from_millis(1)).await;
    assert_eq!(heartbeat(&groups, &a, 2), None, "B's session has 1 ms left");
    advance(Duration::from_millis(1)).await;
    assert_eq!(
        heartbeat(&groups, &a, 2),
        Some(ResponseError::RebalanceInProgress)
    );
    assert_eq!(
        heartbeat(&groups, &b, 2),
        Some(ResponseError::UnknownMemberId)
    );

    let alone = groups.join(ranged(&a, "a"), JOIN_VERSION).await;
    assert_eq!(alone.generation_id, 3);
    assert_eq!(alone.leader.as_str(), a);
    assert_eq!(listed(&alone), [(a.clone(), Bytes::from_static(b"a"))]);
}

#[tokio::test(start_paused = true)]
async fn a_member_that_does_not_join_again_is_removed_when_the_rebalance_times_out() {
    let groups = Groups::new();
    // Sessions outlast the rebalance timeout: the timeout, not a session, removes A.
    let long = |member_id: &str, metadata| {
        ranged(member_id, metadata).with_session_timeout_ms(*SESSION_TIMEOUTS.end())
    };
    let a = groups.join(long("", "a"), JOIN_VERSION).await;
    let a = a.member_id.to_string();
    sync(&groups, &a, 1, &[(a.as_str(), "a1")]).await;

    let started = Instant::now();
    let b = groups.join(long("", "b"), JOIN_VERSION).await;
    let waited = started.elapsed();
    let timeout = Duration::from_millis(REBALANCE_MS as u64);
    assert!(
        (timeout..=timeout + EXPIRY_CHECK).contains(&waited),
        "{waited:?}"
    );
    let b_id = b.member_id.to_string();
    assert_eq!(b.generation_id, 2);
    assert_eq!(b.leader.as_str(), b_id, "the leader left: B leads");
    assert_eq!(listed(&b), [(b_id, Bytes::from_static(b"b"))]);
    assert_eq!(
        heartbeat(&groups, &a, 1),
        Some(ResponseError::UnknownMemberId)
    );
}

#[tokio::test(start_paused = true)]
async fn a_follower_waiting_in_sync_hears_of_the_rebalance_when_the_leaders_session_ends() {
    let groups = Groups::new();
    let (a, b) = two_joined(&groups).await;
    // A never syncs; B's sync keeps B's session and waits for A's.
    let started = Instant::now();
    let synced = sync(&groups, &b, 2, &[]).await;
    assert_eq!(
        error(synced.error_code),
        Some(ResponseError::RebalanceInProgress)
    );
    let waited = started.elapsed();
    assert!(
        (SESSION..=SESSION + 2 * EXPIRY_CHECK).contains(&waited),
        "{waited:?}"
    );
    let alone = groups.join(ranged(&b, "b"), JOIN_VERSION).await;
    assert_eq!(alone.generation_id, 3);
    assert_eq!(alone.leader.as_str(), b);
    assert_eq!(
        heartbeat(&groups, &a, 2),
        Some(ResponseError::UnknownMemberId)
    );
}

#[tokio::test(start_paused = true)]
async fn a_leaving_member_starts_a_rebalance_and_the_last_one_drops_the_group() {
    let groups = Groups::new();
    let (a, b) = two_synced(&groups).await;
    assert_eq!(leave(&groups, &[&b]), [None]);
    assert_eq!(
        heartbeat(&groups, &a, 2),
        Some(ResponseError::RebalanceInProgress)
    );
    let alone = groups.join(ranged(&a, "a"), JOIN_VERSION).await;
    assert_eq!(alone.generation_id, 3);
    assert_eq!(listed(&alone), [(a.clone(), Bytes::from_static(b"a"))]);

    assert_eq!(leave(&groups, &[&a]), [None]);
    assert!(groups.with_members().is_empty());
    assert_eq!(
        heartbeat(&groups, &a, 3),
        Some(ResponseError::UnknownMemberId)
    );
    // With the group gone, a commit is anyone's (a consumer assigning itself).
    assert_eq!(commit_check(&groups, "", -1), None);
}

#[tokio::test(start_paused = true)]
async fn when_the_leader_leaves_a_remaining_member_leads_the_next_generation() {
    let groups = Groups::new();
    let (a, b) = two_synced(&groups).await;
    assert_eq!(leave(&groups, &[&a]), [None]);
    let joined = groups.join(ranged(&b, "b"), JOIN_VERSION).await;
    assert_eq!(joined.generation_id, 3);
    assert_eq!(joined.leader.as_str(), b);
    assert_eq!(listed(&joined), [(b, Bytes::from_static(b"b"))]);
}

#[tokio::test(start_paused = true)]
async fn a_leave_answers_each_member_and_before_v3_the_one_it_names() {
    let groups = Groups::new();
    let (a, b) = two_synced(&groups).await;
    assert_eq!(
        leave(&groups, &[&a, "ghost"]),
        [None, Some(ResponseError::UnknownMemberId)]
    );

    let old = |member_id: &str| {
        let request = LeaveGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
            .with_member_id(StrBytes::from_string(member_id.to_string()));
        let answer = groups.leave(&request, 0);
        assert!(answer.members.is_empty());
        error(answer.error_code)
    };
    assert_eq!(old("ghost"), Some(ResponseError::UnknownMemberId));
    assert_eq!(old(&b), None);
    assert_eq!(
        leave(&groups, &[&b]),
        [Some(ResponseError::UnknownMemberId)],
        "the group is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn requests_of_unknown_members_or_past_generations_are_refused() {
    let groups = Groups::new();
    let unknown = groups.join(ranged("ghost", "g"), JOIN_VERSION).await;
    assert_eq!(
        error(unknown.error_code),
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(unknown.generation_id, -1);
    assert!(groups.lock().groups.is_empty(), "no group is left behind");
    assert_eq!(
        heartbeat(&groups, "ghost", 0),
        Some(ResponseError::UnknownMemberId)
    );
    let synced = sync(&groups, "ghost", 0, &[]).await;
    assert_eq!(
        error(synced.error_code),
        Some(ResponseError::UnknownMemberId)
    );

    let (a, b) = two_joined(&groups).await;
    assert_eq!(
        heartbeat(&groups, "ghost", 2),
        Some(ResponseError::UnknownMemberId)
    );
    let stale = sync(&groups, &b, 1, &[]).await;
    assert_eq!(
        error(stale.error_code),
        Some(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        commit_check(&groups, &a, 1),
        Some(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        commit_check(&groups, "ghost", 2),
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        commit_check(&groups, "", -1),
        Some(ResponseError::UnknownMemberId),
        "a group with members takes commits from its members only"
    );
    assert_eq!(commit_check(&groups, &b, 2), None);

    // While a rejoin of A's is under way, a sync is told of the rebalance.
    let (rejoined, synced) = tokio::join!(groups.join(ranged(&a, "a"), JOIN_VERSION), async {
        sync(&groups, &b, 2, &[]).await
    });
    assert_eq!(
        error(synced.error_code),
        Some(ResponseError::RebalanceInProgress)
    );
    // B does not join again: its session ends, which leaves A alone.
    assert_eq!(rejoined.generation_id, 3);
    assert_eq!(listed(&rejoined), [(a, Bytes::from_static(b"a"))]);
}

#[tokio::test(start_paused = true)]
async fn joins_are_checked_before_the_group_is_touched() {
    let groups = Groups::new();
    let refused = |request: JoinGroupRequest| {
        let groups = &groups;
        async move {
            let answer = groups.join(request, JOIN_VERSION).await;
            assert_eq!(answer.generation_id, -1);
            error(answer.error_code)
        }
    };
    let group = |id: String| ranged("", "m").with_group_id(GroupId(StrBytes::from_string(id)));
    assert_eq!(
        refused(group(String::new())).await,
        Some(ResponseError::InvalidGroupId)
    );
    assert_eq!(
        refused(group("g".repeat(MAX_GROUP_ID_BYTES + 1))).await,
        Some(ResponseError::InvalidGroupId)
    );
    for session in [SESSION_TIMEOUTS.start() - 1, SESSION_TIMEOUTS.end() + 1, -1] {
        assert_eq!(
            refused(ranged("", "m").with_session_timeout_ms(session)).await,
            Some(ResponseError::InvalidSessionTimeout),
            "{session} ms"
        );
    }
    assert!(groups.with_members().is_empty());

    for accepted in [
        group("g".repeat(MAX_GROUP_ID_BYTES)),
        ranged("", "m").with_session_timeout_ms(*SESSION_TIMEOUTS.end()),
    ] {
        assert!(Joining::of(&accepted, JOIN_VERSION).is_ok());
    }
}

#[test]
fn the_rebalance_timeout_is_the_session_timeout_before_v1_and_at_most_five_minutes() {
    let timeout = |request: JoinGroupRequest, version| {
        Joining::of(&request, version).unwrap().rebalance_timeout
    };
    let request = ranged("", "m").with_session_timeout_ms(7_000);
    assert_eq!(timeout(request.clone(), 0), Duration::from_secs(7));
    assert_eq!(
        timeout(request.clone(), 1),
        Duration::from_millis(REBALANCE_MS as u64)
    );
    assert_eq!(
        timeout(request.clone().with_rebalance_timeout_ms(i32::MAX), 1),
        MAX_REBALANCE_TIMEOUT
    );
    assert_eq!(
        timeout(request.with_rebalance_timeout_ms(-1), 1),
        Duration::ZERO
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_of_another_protocol_type_is_refused() {
    let groups = Groups::new();
    let a = groups.join(ranged("", "a"), JOIN_VERSION).await;
    let connect = ranged("", "b").with_protocol_type(StrBytes::from_static_str("connect"));
    let refused = groups.join(connect, JOIN_VERSION).await;
    assert_eq!(
        error(refused.error_code),
        Some(ResponseError::InconsistentGroupProtocol)
    );
    assert_eq!(heartbeat(&groups, a.member_id.as_str(), 1), None);
}

#[tokio::test(start_paused = true)]
async fn the_groups_protocol_is_the_leaders_first_that_every_member_speaks() {
    let groups = Groups::new();
    let a = groups
        .join(
            join_request("", &[("sticky", "a-s"), ("roundrobin", "a-r")]),
            JOIN_VERSION,
        )
        .await;
    assert_eq!(a.protocol_name.as_deref(), Some("sticky"));
    let a = a.member_id.to_string();
    let (b, a_joined) = tokio::join!(
        groups.join(
            join_request("", &[("range", "b-g"), ("roundrobin", "b-r")]),
            JOIN_VERSION
        ),
        groups.join(
            join_request(&a, &[("sticky", "a-s"), ("roundrobin", "a-r")]),
            JOIN_VERSION
        ),
    );
    assert_eq!(a_joined.protocol_name.as_deref(), Some("roundrobin"));
    assert_eq!(b.protocol_name.as_deref(), Some("roundrobin"));
    // The leader gets each member's metadata for that protocol.
    assert_eq!(
        listed(&a_joined),
        sorted(vec![
            (a, Bytes::from_static(b"a-r")),
            (b.member_id.to_string(), Bytes::from_static(b"b-r")),
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_that_speaks_none_of_the_groups_protocols_is_refused() {
    let groups = Groups::new();
    let a = groups.join(ranged("", "a"), JOIN_VERSION).await;
    let a = a.member_id.to_string();
    // Kafka refuses such a member; with it, no protocol would be left for the group.
    let (b, a_joined) = tokio::join!(
        groups.join(join_request("", &[("roundrobin", "b")]), JOIN_VERSION),
        groups.join(ranged(&a, "a"), JOIN_VERSION),
    );
    assert_eq!(
        error(b.error_code),
        Some(ResponseError::InconsistentGroupProtocol)
    );
    assert_eq!(a_joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(listed(&a_joined), [(a, Bytes::from_static(b"a"))]);
    // Nor does a member speaking no protocol at all start a group.
    let mute = join_request("", &[]).with_group_id(GroupId(StrBytes::from_static_str("other")));
    let refused = groups.join(mute, JOIN_VERSION).await;
    assert_eq!(
        error(refused.error_code),
        Some(ResponseError::InconsistentGroupProtocol)
    );
    assert_eq!(groups.with_members(), [GROUP]);
}

#[tokio::test(start_paused = true)]
async fn a_leaders_assignments_are_bounded_and_kept_for_members_only() {
    let groups = Groups::new();
    let (a, b) = two_joined(&groups).await;
    let fits = MAX_MEMBER_BYTES - ENTRY_BYTES - a.len();
    let too_large = "x".repeat(fits + 1);
    let refused = sync(&groups, &a, 2, &[(a.as_str(), too_large.as_str())]).await;
    assert_eq!(
        error(refused.error_code),
        Some(ResponseError::InvalidRequest)
    );

    // Refused, the leader may sync again; an assignment to a stranger is dropped.
    let largest = "x".repeat(fits);
    let assignments = [(a.as_str(), largest.as_str()), ("ghost", "g")];
    let (a_synced, b_synced) = tokio::join!(
        sync(&groups, &a, 2, &assignments),
        sync(&groups, &b, 2, &[]),
    );
    assert_eq!(a_synced.assignment.len(), fits);
    assert_eq!(b_synced.assignment, Bytes::new(), "none was given to B");
    let registry = groups.lock();
    let group = &registry.groups[GROUP];
    let assigned: Vec<_> = group
        .assignments
        .iter()
        .flatten()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(assigned, [&a]);
}

#[test]
fn a_group_holds_at_most_max_group_members() {
    let groups = Groups::new();
    let now = Instant::now();
    let mut registry = groups.lock();
    registry.create(GROUP, now).unwrap();
    let mut join = |member_id: &str| {
        let member = Joining::of(&ranged(member_id, "m"), JOIN_VERSION).unwrap();
        let room = registry.room();
        registry
            .update(GROUP, |group| group.join(member, room, now))
            .unwrap()
    };
    let first = join("").unwrap();
    for _ in 1..MAX_GROUP_MEMBERS {
        join("").unwrap();
    }
    assert!(matches!(join(""), Err(ResponseError::GroupMaxSizeReached)));
    assert_eq!(
        join(first.as_str()).unwrap(),
        first,
        "a member joins again when full"
    );
}

#[tokio::test(start_paused = true)]
async fn the_coordinator_holds_at_most_max_groups_until_their_sessions_end() {
    let groups = Groups::new();
    for i in 0..MAX_GROUPS {
        let joined = groups.join(sized(&format!("g{i}"), 0), JOIN_VERSION).await;
        assert_eq!(joined.error_code, 0);
    }
    let one_more = groups.join(sized("new", 0), JOIN_VERSION).await;
    assert_eq!(
        error(one_more.error_code),
        Some(ResponseError::CoordinatorNotAvailable)
    );
    advance(SESSION).await;
    let after = groups.join(sized("new", 0), JOIN_VERSION).await;
    assert_eq!(after.error_code, 0);
    assert_eq!(groups.with_members(), ["new"]);
}

#[tokio::test(start_paused = true)]
async fn expired_members_of_every_group_are_swept_by_any_request_at_most_every_interval() {
    let groups = Groups::new();
    let joined = groups.join(sized("quiet", 0), JOIN_VERSION).await;
    assert_eq!(joined.error_code, 0);
    advance(SESSION - GROUP_SWEEP_INTERVAL / 2).await;
    assert_eq!(groups.with_members(), ["quiet"], "swept, not yet expired");
    advance(GROUP_SWEEP_INTERVAL / 2).await;
    assert_eq!(
        groups.with_members(),
        ["quiet"],
        "expired, but swept less than an interval ago"
    );
    advance(GROUP_SWEEP_INTERVAL / 2).await;
    assert!(groups.with_members().is_empty());
    assert_eq!(groups.lock().held, 0);
}

/// A member's protocols are bounded, so is what every group holds, and members
/// whose sessions ended are removed (their groups dropped) by a sweep, without a
/// request of their own group.
#[test]
fn members_are_bounded_in_bytes_and_expire_without_requests() {
    assert!(matches!(
        Joining::of(&sized(GROUP, MAX_MEMBER_BYTES), 1),
        Err(ResponseError::InvalidRequest)
    ));
    let groups = Groups::new();
    let now = Instant::now();
    let mut registry = groups.lock();
    let mut joined = 0;
    let refused = loop {
        let id = format!("g{joined}");
        registry.create(&id, now).unwrap();
        let member = Joining::of(&sized(GROUP, MAX_MEMBER_BYTES / 2), 1).unwrap();
        let room = registry.room();
        match registry.update(&id, |group| group.join(member, room, now)) {
            Some(Ok(_)) => joined += 1,
            Some(Err(error)) => break error,
            None => panic!("group {id} was not created"),
        }
    };
    assert!(matches!(refused, ResponseError::CoordinatorNotAvailable));
    let fits = MAX_COORDINATOR_BYTES / (MAX_MEMBER_BYTES / 2);
    assert!((fits - 2..fits).contains(&joined), "{joined} members");
    assert!(registry.held <= MAX_COORDINATOR_BYTES);
    let counted: usize = registry.groups.values().map(Group::bytes).sum();
    assert_eq!(registry.held, counted, "the running count is the sum");

    let timeout = Duration::from_millis(*SESSION_TIMEOUTS.start() as u64);
    registry.sweep_now(now + timeout / 2);
    assert_eq!(registry.groups.len(), joined, "sessions not over yet");
    registry.sweep_now(now + timeout);
    assert!(registry.groups.is_empty());
    assert_eq!(registry.held, 0);
}
