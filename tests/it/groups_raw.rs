//! Consumer-group requests as raw wire bytes against the real binary: every advertised version on
//! its success path, the protocol's error codes for unknown members, wrong generations, unknown
//! groups and the wrong coordinator, oversized blobs, and a member that stops heartbeating being
//! expelled while a librdkafka consumer takes its partitions back.

use crate::common;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use common::wire::{self, connect, recv, recv_decoded, request_frame};
use common::{create_topics, Shoal};
use kafka_protocol::messages::consumer_protocol_assignment::ConsumerProtocolAssignment;
use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::consumer::{BaseConsumer, Consumer};
use shoal::groups::coordinator_core;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_COORDINATOR: i16 = 16;
const ILLEGAL_GENERATION: i16 = 22;
const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
const UNKNOWN_MEMBER_ID: i16 = 25;
const INVALID_GROUP_ID: i16 = 24;
const INVALID_SESSION_TIMEOUT: i16 = 26;
const REBALANCE_IN_PROGRESS: i16 = 27;
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
const INVALID_REQUEST: i16 = 42;
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;
const MEMBER_ID_REQUIRED: i16 = 79;
const FENCED_INSTANCE_ID: i16 = 82;

/// A request and its decoded response (correlation id 7).
fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    body: &Req,
) -> Resp {
    wire::call(s, key, version, 7, body)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

/// A consumer-protocol subscription (what a Kafka consumer sends as JoinGroup metadata).
fn subscription(topics: &[&str]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| s(t)).collect())
        .encode(&mut b, 0)
        .unwrap();
    b.freeze()
}

fn assignment(bytes: &Bytes) -> Vec<i32> {
    let mut b = bytes.clone();
    let version = b.get_i16();
    let a = ConsumerProtocolAssignment::decode(&mut b, version).unwrap();
    a.assigned_partitions
        .iter()
        .flat_map(|t| t.partitions.clone())
        .collect()
}

fn join_req(member: &str, session_ms: i32, meta: Bytes) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(gid(""))
        .with_session_timeout_ms(session_ms)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(meta)])
}

/// Joins `group` as a new member (MEMBER_ID_REQUIRED first from v4); returns the answer.
fn join(s: &mut TcpStream, v: i16, group: &str, session_ms: i32, meta: Bytes) -> JoinGroupResponse {
    let req = join_req("", session_ms, meta.clone()).with_group_id(gid(group));
    let r: JoinGroupResponse = call(s, ApiKey::JoinGroup, v, &req);
    if v < 4 {
        return r;
    }
    assert_eq!(r.error_code, MEMBER_ID_REQUIRED, "JoinGroup v{v}");
    assert!(!r.member_id.is_empty());
    call(
        s,
        ApiKey::JoinGroup,
        v,
        &req.with_member_id(r.member_id.clone()),
    )
}

fn sync_req(
    group: &str,
    generation: i32,
    member: &str,
    give: &[(&str, Bytes)],
) -> SyncGroupRequest {
    SyncGroupRequest::default()
        .with_group_id(gid(group))
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_assignments(
            give.iter()
                .map(|(m, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(m))
                        .with_assignment(a.clone())
                })
                .collect(),
        )
}

fn heartbeat(s: &mut TcpStream, v: i16, group: &str, generation: i32, member: &str) -> i16 {
    let r: HeartbeatResponse = call(
        s,
        ApiKey::Heartbeat,
        v,
        &HeartbeatRequest::default()
            .with_group_id(gid(group))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member.to_string())),
    );
    r.error_code
}

fn commit_req(
    group: &str,
    generation: i32,
    member: &str,
    topic: &str,
    offset: i64,
    meta: &str,
) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(gid(group))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)
                .with_committed_metadata(Some(s(meta)))])])
}

fn commit_error(r: &OffsetCommitResponse) -> i16 {
    r.topics[0].partitions[0].error_code
}

/// (offset, metadata, error) of partition 0 of `topic` for `group`, with OffsetFetch v`v` (< 8).
fn fetch_offset(s: &mut TcpStream, v: i16, group: &str, topic: &str) -> (i64, String, i16) {
    let r: OffsetFetchResponse = call(
        s,
        ApiKey::OffsetFetch,
        v,
        &OffsetFetchRequest::default()
            .with_group_id(gid(group))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_indexes(vec![0])])),
    );
    let p = &r.topics[0].partitions[0];
    (
        p.committed_offset,
        p.metadata.as_ref().map_or(String::new(), |m| m.to_string()),
        p.error_code.max(r.error_code),
    )
}

/// A group name whose coordinator is `core` of `cores`.
fn group_on(core: usize, cores: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|g| coordinator_core(g, cores) == core)
        .unwrap()
}

#[test]
fn every_group_api_version_answers() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &["--group-initial-rebalance-delay-ms", "0"]);
    create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let port = shoal.ports[0];
    let mut c = connect(port);
    for v in 0..=4 {
        let req = FindCoordinatorRequest::default();
        let req = if v >= 4 {
            req.with_coordinator_keys(vec![s("a"), s("b")])
        } else {
            req.with_key(s("a"))
        };
        let r: FindCoordinatorResponse = call(&mut c, ApiKey::FindCoordinator, v, &req);
        if v >= 4 {
            assert_eq!(r.coordinators.len(), 2);
            for k in &r.coordinators {
                assert_eq!(
                    (k.error_code, k.node_id.0, k.port),
                    (NONE, 0, i32::from(port))
                );
            }
        } else {
            assert_eq!(
                (r.error_code, r.node_id.0, r.port),
                (NONE, 0, i32::from(port))
            );
        }
    }
    for v in 0..=9i16 {
        let group = format!("v{v}");
        let r = join(&mut c, v, &group, 10_000, subscription(&["t"]));
        assert_eq!(r.error_code, NONE, "JoinGroup v{v}");
        assert_eq!((r.generation_id, r.members.len()), (1, 1), "JoinGroup v{v}");
        assert_eq!(r.leader, r.member_id, "JoinGroup v{v}");
        let me = r.member_id.to_string();
        let sv = v.min(5);
        let give = [(me.as_str(), Bytes::from_static(b"assignment"))];
        let r: SyncGroupResponse = call(
            &mut c,
            ApiKey::SyncGroup,
            sv,
            &sync_req(&group, 1, &me, &give),
        );
        assert_eq!(
            (r.error_code, &r.assignment[..]),
            (NONE, &b"assignment"[..]),
            "SyncGroup v{sv}"
        );
        assert_eq!(
            heartbeat(&mut c, v.min(4), &group, 1, &me),
            NONE,
            "Heartbeat"
        );
        let cv = v.clamp(2, 8);
        let r: OffsetCommitResponse = call(
            &mut c,
            ApiKey::OffsetCommit,
            cv,
            &commit_req(&group, 1, &me, "t", 40 + i64::from(v), "meta"),
        );
        assert_eq!(commit_error(&r), NONE, "OffsetCommit v{cv}");
        let fv = v.clamp(1, 7);
        assert_eq!(
            fetch_offset(&mut c, fv, &group, "t"),
            (40 + i64::from(v), "meta".to_string(), NONE),
            "OffsetFetch v{fv}"
        );
        let dv = v.min(5);
        let r: DescribeGroupsResponse = call(
            &mut c,
            ApiKey::DescribeGroups,
            dv,
            &DescribeGroupsRequest::default().with_groups(vec![gid(&group)]),
        );
        let g = &r.groups[0];
        assert_eq!(
            (
                g.error_code,
                g.group_state.as_str(),
                g.protocol_data.as_str(),
                g.members.len()
            ),
            (NONE, "Stable", "range", 1),
            "DescribeGroups v{dv}"
        );
        assert_eq!(&g.members[0].member_assignment[..], b"assignment");
        let lv = v.min(5);
        let req = LeaveGroupRequest::default().with_group_id(gid(&group));
        let req = if lv >= 3 {
            req.with_members(vec![MemberIdentity::default().with_member_id(s(&me))])
        } else {
            req.with_member_id(s(&me))
        };
        let r: LeaveGroupResponse = call(&mut c, ApiKey::LeaveGroup, lv, &req);
        assert_eq!(r.error_code, NONE, "LeaveGroup v{lv}");
        if lv >= 3 {
            assert_eq!(r.members[0].error_code, NONE);
        }
    }
    // OffsetFetch v8: several groups, all topics.
    let r: OffsetFetchResponse = call(
        &mut c,
        ApiKey::OffsetFetch,
        8,
        &OffsetFetchRequest::default().with_groups(vec![
            OffsetFetchRequestGroup::default()
                .with_group_id(gid("v3"))
                .with_topics(None),
            OffsetFetchRequestGroup::default()
                .with_group_id(gid("v9"))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(s("t")))
                    .with_partition_indexes(vec![0, 5])])),
        ]),
    );
    let offsets: Vec<(i16, Vec<i64>)> = r
        .groups
        .iter()
        .map(|g| {
            (
                g.error_code,
                g.topics
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| p.committed_offset))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(offsets, vec![(NONE, vec![43]), (NONE, vec![49, -1])]);
    for v in 0..=4 {
        let r: ListGroupsResponse =
            call(&mut c, ApiKey::ListGroups, v, &ListGroupsRequest::default());
        assert_eq!(
            r.groups.len(),
            10,
            "ListGroups v{v}: every group has offsets"
        );
        if v >= 4 {
            assert!(r.groups.iter().all(|g| g.group_state.as_str() == "Empty"));
        }
    }
    for v in 0..=2 {
        let r: DeleteGroupsResponse = call(
            &mut c,
            ApiKey::DeleteGroups,
            v,
            &DeleteGroupsRequest::default().with_groups_names(vec![gid(&format!("v{v}"))]),
        );
        assert_eq!(r.results[0].error_code, NONE, "DeleteGroups v{v}");
        assert_eq!(fetch_offset(&mut c, 7, &format!("v{v}"), "t").0, -1);
    }
    drop(c);
    shoal.stop();
}

#[test]
fn group_errors_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--group-initial-rebalance-delay-ms", "0"];
    let shoal = Shoal::start(dir.path(), 2, &flags);
    create_topics(&shoal.bootstrap(), &[("t", 2)]);
    let (g0, g1) = (group_on(0, 2, "g"), group_on(1, 2, "g"));
    let mut c0 = connect(shoal.ports[0]);
    let mut c1 = connect(shoal.ports[1]);

    // FindCoordinator names each group's core; other cores refuse the group.
    let r: FindCoordinatorResponse = call(
        &mut c1,
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default().with_coordinator_keys(vec![s(&g0), s(&g1)]),
    );
    let nodes: Vec<i32> = r.coordinators.iter().map(|c| c.node_id.0).collect();
    assert_eq!(nodes, vec![0, 1]);
    assert_eq!(heartbeat(&mut c1, 4, &g0, 1, "m"), NOT_COORDINATOR);
    let r: JoinGroupResponse = call(
        &mut c1,
        ApiKey::JoinGroup,
        5,
        &join_req("", 10_000, subscription(&["t"])).with_group_id(gid(&g0)),
    );
    assert_eq!(r.error_code, NOT_COORDINATOR);

    // Unknown groups and members.
    assert_eq!(heartbeat(&mut c0, 4, &g0, 1, "nobody"), UNKNOWN_MEMBER_ID);
    let r: SyncGroupResponse = call(
        &mut c0,
        ApiKey::SyncGroup,
        5,
        &sync_req(&g0, 1, "nobody", &[]),
    );
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);
    let r: JoinGroupResponse = call(
        &mut c0,
        ApiKey::JoinGroup,
        5,
        &join_req("nobody", 10_000, subscription(&["t"])).with_group_id(gid(&g0)),
    );
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);
    let r: DeleteGroupsResponse = call(
        &mut c0,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![gid(&g0)]),
    );
    assert_eq!(r.results[0].error_code, GROUP_ID_NOT_FOUND);
    let r: OffsetCommitResponse = call(
        &mut c0,
        ApiKey::OffsetCommit,
        8,
        &commit_req(&g0, 3, "nobody", "t", 1, ""),
    );
    assert_eq!(
        commit_error(&r),
        ILLEGAL_GENERATION,
        "no such group, generation 3"
    );

    // Session timeouts outside the broker's bounds (6 s to 30 min by default).
    let r: JoinGroupResponse = call(
        &mut c0,
        ApiKey::JoinGroup,
        5,
        &join_req("", 100, subscription(&["t"])).with_group_id(gid(&g0)),
    );
    assert_eq!(r.error_code, INVALID_SESSION_TIMEOUT);

    // A member, and wrong generations.
    let r = join(&mut c0, 5, &g0, 10_000, subscription(&["t"]));
    assert_eq!((r.error_code, r.generation_id), (NONE, 1));
    let me = r.member_id.to_string();
    let r: SyncGroupResponse = call(&mut c0, ApiKey::SyncGroup, 5, &sync_req(&g0, 2, &me, &[]));
    assert_eq!(r.error_code, ILLEGAL_GENERATION);
    let r: SyncGroupResponse = call(
        &mut c0,
        ApiKey::SyncGroup,
        5,
        &sync_req(&g0, 1, &me, &[(&me, Bytes::from_static(b"a"))]),
    );
    assert_eq!(r.error_code, NONE);
    assert_eq!(heartbeat(&mut c0, 4, &g0, 0, &me), ILLEGAL_GENERATION);
    assert_eq!(heartbeat(&mut c0, 4, &g0, 1, &me), NONE);
    let r: OffsetCommitResponse = call(
        &mut c0,
        ApiKey::OffsetCommit,
        8,
        &commit_req(&g0, 0, &me, "t", 1, ""),
    );
    assert_eq!(commit_error(&r), ILLEGAL_GENERATION);
    let r: OffsetCommitResponse = call(
        &mut c0,
        ApiKey::OffsetCommit,
        8,
        &commit_req(&g0, 1, "other", "t", 1, ""),
    );
    assert_eq!(commit_error(&r), UNKNOWN_MEMBER_ID);
    let r: OffsetCommitResponse = call(
        &mut c0,
        ApiKey::OffsetCommit,
        8,
        &commit_req(&g0, 1, &me, "nope", 1, ""),
    );
    assert_eq!(commit_error(&r), UNKNOWN_TOPIC_OR_PARTITION);
    let big = "m".repeat(5000);
    let r: OffsetCommitResponse = call(
        &mut c0,
        ApiKey::OffsetCommit,
        8,
        &commit_req(&g0, 1, &me, "t", 1, &big),
    );
    assert_eq!(commit_error(&r), OFFSET_METADATA_TOO_LARGE);
    // Another protocol type or no common protocol.
    let mut other = join_req("", 10_000, subscription(&["t"])).with_group_id(gid(&g0));
    other.protocol_type = s("connect");
    let r: JoinGroupResponse = call(&mut c0, ApiKey::JoinGroup, 5, &other);
    assert_eq!(r.error_code, INCONSISTENT_GROUP_PROTOCOL);
    // A second member starts a rebalance: the first learns it from its heartbeat. Both have
    // sessions far longer than this test, so a slow machine cannot expire them before the end.
    let mut c0b = connect(shoal.ports[0]);
    let second = std::thread::spawn(move || {
        let r = join(
            &mut c0b,
            5,
            &group_on(0, 2, "g"),
            300_000,
            subscription(&["t"]),
        );
        (c0b, r)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while heartbeat(&mut c0, 4, &g0, 1, &me) != REBALANCE_IN_PROGRESS {
        assert!(Instant::now() < deadline, "no rebalance announced");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r: JoinGroupResponse = call(
        &mut c0,
        ApiKey::JoinGroup,
        5,
        &join_req(&me, 300_000, subscription(&["t"])).with_group_id(gid(&g0)),
    );
    assert_eq!(
        (r.error_code, r.generation_id, r.members.len()),
        (NONE, 2, 2)
    );
    let (mut c0b, other) = second.join().unwrap();
    assert_eq!((other.error_code, other.generation_id), (NONE, 2));
    // Both sync (members that never do are removed after the rebalance timeout, 10 s here).
    assert_eq!(r.leader.as_str(), me);
    let r: SyncGroupResponse = call(&mut c0, ApiKey::SyncGroup, 5, &sync_req(&g0, 2, &me, &[]));
    assert_eq!(r.error_code, NONE);
    let r: SyncGroupResponse = call(
        &mut c0b,
        ApiKey::SyncGroup,
        5,
        &sync_req(&g0, 2, &other.member_id, &[]),
    );
    assert_eq!(r.error_code, NONE);
    let r: DeleteGroupsResponse = call(
        &mut c0,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![gid(&g0)]),
    );
    assert_eq!(r.results[0].error_code, NON_EMPTY_GROUP);

    // Static members: a second incarnation fences the first.
    let mut static_req = join_req("", 10_000, subscription(&["t"])).with_group_id(gid(&g1));
    static_req.group_instance_id = Some(s("instance-1"));
    let first: JoinGroupResponse = call(&mut c1, ApiKey::JoinGroup, 5, &static_req);
    assert_eq!(
        first.error_code, NONE,
        "static members need no MEMBER_ID_REQUIRED"
    );
    let r: SyncGroupResponse = call(
        &mut c1,
        ApiKey::SyncGroup,
        5,
        &sync_req(&g1, first.generation_id, &first.member_id, &[]),
    );
    assert_eq!(r.error_code, NONE);
    let second: JoinGroupResponse = call(&mut c1, ApiKey::JoinGroup, 5, &static_req);
    assert_eq!(
        (second.error_code, second.generation_id),
        (NONE, first.generation_id)
    );
    assert_ne!(second.member_id, first.member_id);
    // The restarted static leader cannot skip the assignment below v9: it is told the old leader
    // id and no members, so it acts as a follower (Kafka does the same).
    assert_eq!(second.leader, first.member_id);
    assert!(second.members.is_empty());
    // From v9 it is told it leads, with the members, and to skip the assignment.
    let third: JoinGroupResponse = call(&mut c1, ApiKey::JoinGroup, 9, &static_req);
    assert_eq!(
        (third.error_code, third.generation_id),
        (NONE, first.generation_id)
    );
    assert_eq!(third.leader, third.member_id);
    assert!(third.skip_assignment);
    assert_eq!(third.members.len(), 1);
    let r: HeartbeatResponse = call(
        &mut c1,
        ApiKey::Heartbeat,
        4,
        &HeartbeatRequest::default()
            .with_group_id(gid(&g1))
            .with_generation_id(first.generation_id)
            .with_member_id(first.member_id.clone())
            .with_group_instance_id(Some(s("instance-1"))),
    );
    assert_eq!(r.error_code, FENCED_INSTANCE_ID);
    // Leave by instance id, then simple (group-less) commits work on the empty group.
    let r: LeaveGroupResponse = call(
        &mut c1,
        ApiKey::LeaveGroup,
        5,
        &LeaveGroupRequest::default()
            .with_group_id(gid(&g1))
            .with_members(vec![
                MemberIdentity::default().with_group_instance_id(Some(s("instance-1"))),
                MemberIdentity::default().with_member_id(s("ghost")),
            ]),
    );
    let codes: Vec<i16> = r.members.iter().map(|m| m.error_code).collect();
    assert_eq!(codes, vec![NONE, UNKNOWN_MEMBER_ID]);
    let r: OffsetCommitResponse = call(
        &mut c1,
        ApiKey::OffsetCommit,
        8,
        &commit_req(&g1, -1, "", "t", 77, "x"),
    );
    assert_eq!(commit_error(&r), NONE);
    assert_eq!(fetch_offset(&mut c1, 7, &g1, "t"), (77, "x".into(), NONE));
    assert_eq!(fetch_offset(&mut c0, 7, &g1, "t").2, NOT_COORDINATOR);

    // A fresh heartbeat: the member's session then lasts well past the end of the test.
    assert_eq!(heartbeat(&mut c0, 4, &g0, 2, &me), NONE);
    // Oversized blobs: a real 2 MiB metadata is refused with an error code; one that only claims
    // 1 GiB fails to decode and closes only its connection.
    let r: JoinGroupResponse = call(
        &mut c0,
        ApiKey::JoinGroup,
        5,
        &join_req("", 10_000, Bytes::from(vec![1u8; 2 << 20])).with_group_id(gid(&g0)),
    );
    assert_eq!(r.error_code, INVALID_REQUEST);
    let r: SyncGroupResponse = call(
        &mut c0,
        ApiKey::SyncGroup,
        5,
        &sync_req(&g0, 2, &me, &[(&me, Bytes::from(vec![2u8; 2 << 20]))]),
    );
    assert_eq!(r.error_code, INVALID_REQUEST);
    let mut frame = request_frame(
        ApiKey::JoinGroup,
        5,
        9,
        &join_req("", 10_000, Bytes::from_static(b"MARK")).with_group_id(gid(&g0)),
    );
    let at = frame.windows(4).position(|w| w == b"MARK").unwrap();
    frame[at - 4..at].copy_from_slice(&(1i32 << 30).to_be_bytes());
    let mut bad = connect(shoal.ports[0]);
    bad.write_all(&frame).unwrap();
    assert!(recv(&mut bad).is_none(), "the connection is closed");
    assert_eq!(
        heartbeat(&mut c0, 4, &g0, 2, &me),
        NONE,
        "the core still serves"
    );
    drop((c0, c0b, c1));
    shoal.stop();
}

/// A member that stops heartbeating is expelled after its session timeout, and the librdkafka
/// consumer that shared the group gets every partition back.
#[test]
fn a_silent_member_is_expelled_after_its_session_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(
        dir.path(),
        2,
        &[
            "--group-initial-rebalance-delay-ms",
            "200",
            "--group-min-session-timeout-ms",
            "1000",
        ],
    );
    create_topics(&shoal.bootstrap(), &[("expel", 6)]);
    let group = "expel-group";
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", shoal.bootstrap())
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "300")
        .set("partition.assignment.strategy", "range")
        .create()
        .unwrap();
    consumer.subscribe(&["expel"]).unwrap();
    let assigned = |c: &BaseConsumer| c.assignment().map_or(0, |a| a.count());
    let poll_until = |what: &str, f: &dyn Fn(&BaseConsumer) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !f(&consumer) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            if let Some(Err(e)) = consumer.poll(Duration::from_millis(50)) {
                eprintln!("consumer: {e}");
            }
        }
    };
    poll_until("all six partitions", &|c| assigned(c) == 6);

    // The raw member joins (which waits for the rebalance the consumer completes), syncs, and then
    // says nothing more, with its connection left open.
    let port = shoal.ports[coordinator_core(group, 2)];
    let (tx, rx) = std::sync::mpsc::channel();
    let raw = std::thread::spawn(move || {
        let mut c = connect(port);
        let r = join(&mut c, 5, group, 3000, subscription(&["expel"]));
        assert_eq!(r.error_code, NONE);
        // Its session restarts when the SyncGroup answer is sent, which is after this instant.
        let sync_sent = Instant::now();
        let sync: SyncGroupResponse = call(
            &mut c,
            ApiKey::SyncGroup,
            5,
            &sync_req(group, r.generation_id, &r.member_id, &[]),
        );
        assert_eq!(sync.error_code, NONE);
        tx.send((
            sync_sent,
            assignment(&sync.assignment),
            r.member_id.to_string(),
            r.generation_id,
        ))
        .unwrap();
        c // kept open until the test ends
    });
    let (sync_sent, raw_parts, raw_id, generation) = {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(x) = rx.try_recv() {
                break x;
            }
            assert!(
                Instant::now() < deadline,
                "the raw member never got its assignment"
            );
            consumer.poll(Duration::from_millis(50));
        }
    };
    assert_eq!(
        raw_parts.len(),
        3,
        "range gives each of two members three partitions"
    );
    poll_until("the consumer to hold the other three", &|c| {
        assigned(c) == 3
    });
    assert_eq!(shoal.metric("shoal_group_members"), 2);
    poll_until("the consumer to get all six back", &|c| assigned(c) == 6);
    // The session clock restarted no earlier than the SyncGroup was sent, and the member has been
    // silent since: its expiry cannot come sooner than 3 s after that.
    let after = sync_sent.elapsed();
    assert!(
        after >= Duration::from_secs(3),
        "expelled after {after:?}, before its 3 s session timeout"
    );
    assert!(
        after < Duration::from_secs(20),
        "expelled only after {after:?}"
    );
    assert_eq!(shoal.metric("shoal_group_members"), 1);
    let mut c = raw.join().unwrap();
    assert_eq!(
        heartbeat(&mut c, 4, group, generation, &raw_id),
        UNKNOWN_MEMBER_ID
    );
    drop(consumer);
    shoal.stop();
}

/// Many commits to few partitions: the offsets log is compacted in the background, start-up reads
/// only the live offsets, and they survive restarts (deleted groups stay deleted).
#[test]
fn the_offsets_log_is_compacted_and_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--group-offsets-compact-min-records", "100"];
    let shoal = Shoal::start(dir.path(), 1, &flags);
    create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let mut c = connect(shoal.ports[0]);
    for i in 0..600 {
        for g in ["kept", "deleted"] {
            let r: OffsetCommitResponse = call(
                &mut c,
                ApiKey::OffsetCommit,
                8,
                &commit_req(g, -1, "", "t", i, &format!("m{i}")),
            );
            assert_eq!(commit_error(&r), NONE);
        }
    }
    let r: DeleteGroupsResponse = call(
        &mut c,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![gid("deleted")]),
    );
    assert_eq!(r.results[0].error_code, NONE);
    assert_eq!(shoal.metric("shoal_group_offset_commits_total"), 1200);
    drop(c);
    shoal.stop();
    // 1200 commits and a tombstone were written; compaction kept the log near the live entries.
    let store = dir.path().join("__groups/core-0");
    let logs: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("log-"))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_ne!(logs[0], format!("log-{:020}", 0), "compacted at least once");
    let bytes: u64 = std::fs::read_dir(store.join(&logs[0]))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(bytes < 200 * 150, "{bytes} bytes left for 1 live offset");
    for _ in 0..2 {
        let shoal = Shoal::start(dir.path(), 1, &flags);
        let mut c = connect(shoal.ports[0]);
        assert_eq!(
            fetch_offset(&mut c, 7, "kept", "t"),
            (599, "m599".into(), NONE)
        );
        assert_eq!(fetch_offset(&mut c, 7, "deleted", "t").0, -1);
        let r: ListGroupsResponse =
            call(&mut c, ApiKey::ListGroups, 4, &ListGroupsRequest::default());
        let names: Vec<&str> = r.groups.iter().map(|g| g.group_id.as_str()).collect();
        assert_eq!(names, vec!["kept"]);
        drop(c);
        shoal.stop();
    }
}

/// A fetch sent right behind a commit on the same connection, without waiting for the commit's
/// answer, sees the committed offset (Kafka runs a connection's requests one at a time; shoal runs
/// them concurrently, so the fetch waits for the group's commits in flight).
#[test]
fn a_fetch_pipelined_behind_a_commit_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &["--group-initial-rebalance-delay-ms", "0"]);
    create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let mut c = connect(shoal.ports[0]);
    for i in 1..=40i64 {
        let fetch_v: i16 = if i % 2 == 0 { 8 } else { 7 };
        let fetch = if fetch_v >= 8 {
            OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(gid("pipelined"))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(s("t")))
                    .with_partition_indexes(vec![0])]))])
        } else {
            OffsetFetchRequest::default()
                .with_group_id(gid("pipelined"))
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(TopicName(s("t")))
                    .with_partition_indexes(vec![0])]))
        };
        let mut bytes = request_frame(
            ApiKey::OffsetCommit,
            8,
            1,
            &commit_req("pipelined", -1, "", "t", i, ""),
        );
        bytes.extend(request_frame(ApiKey::OffsetFetch, fetch_v, 2, &fetch));
        c.write_all(&bytes).unwrap();
        let commit: OffsetCommitResponse = recv_decoded(&mut c, ApiKey::OffsetCommit, 8, 1);
        assert_eq!(commit_error(&commit), NONE);
        let r: OffsetFetchResponse = recv_decoded(&mut c, ApiKey::OffsetFetch, fetch_v, 2);
        let offset = if fetch_v >= 8 {
            r.groups[0].topics[0].partitions[0].committed_offset
        } else {
            r.topics[0].partitions[0].committed_offset
        };
        assert_eq!(
            offset, i,
            "the fetch behind commit {i} (OffsetFetch v{fetch_v})"
        );
    }
    drop(c);
    shoal.stop();
}

/// The empty group id works where Kafka accepts it (FindCoordinator, OffsetCommit, OffsetFetch,
/// DescribeGroups, DeleteGroups) and gets INVALID_GROUP_ID from the membership APIs.
#[test]
fn the_empty_group_id_is_a_group_for_offsets_only() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let core = coordinator_core("", 2);
    let mut c = connect(shoal.ports[core]);
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default().with_coordinator_keys(vec![s("")]),
    );
    assert_eq!(
        (r.coordinators[0].error_code, r.coordinators[0].node_id.0),
        (NONE, core as i32)
    );
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        3,
        &FindCoordinatorRequest::default().with_key(s("")),
    );
    assert_eq!((r.error_code, r.node_id.0), (NONE, core as i32));
    let r: OffsetCommitResponse = call(
        &mut c,
        ApiKey::OffsetCommit,
        8,
        &commit_req("", -1, "", "t", 12, "e"),
    );
    assert_eq!(commit_error(&r), NONE);
    assert_eq!(fetch_offset(&mut c, 7, "", "t"), (12, "e".into(), NONE));
    let r: DescribeGroupsResponse = call(
        &mut c,
        ApiKey::DescribeGroups,
        5,
        &DescribeGroupsRequest::default().with_groups(vec![gid("")]),
    );
    assert_eq!(
        (r.groups[0].error_code, r.groups[0].group_state.as_str()),
        (NONE, "Empty")
    );
    let r: DeleteGroupsResponse = call(
        &mut c,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![gid("")]),
    );
    assert_eq!(r.results[0].error_code, NONE);
    assert_eq!(fetch_offset(&mut c, 7, "", "t").0, -1);
    // The membership APIs refuse it.
    let r: JoinGroupResponse = call(
        &mut c,
        ApiKey::JoinGroup,
        5,
        &join_req("", 10_000, subscription(&["t"])),
    );
    assert_eq!(r.error_code, INVALID_GROUP_ID);
    let r: SyncGroupResponse = call(&mut c, ApiKey::SyncGroup, 5, &sync_req("", 1, "m", &[]));
    assert_eq!(r.error_code, INVALID_GROUP_ID);
    assert_eq!(heartbeat(&mut c, 4, "", 1, "m"), INVALID_GROUP_ID);
    let r: LeaveGroupResponse = call(
        &mut c,
        ApiKey::LeaveGroup,
        1,
        &LeaveGroupRequest::default()
            .with_group_id(gid(""))
            .with_member_id(s("m")),
    );
    assert_eq!(r.error_code, INVALID_GROUP_ID);
    drop(c);
    shoal.stop();
}
