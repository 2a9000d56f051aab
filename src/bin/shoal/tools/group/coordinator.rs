//! The requests `shoal group` makes of a group's coordinator (FindCoordinator, DescribeGroups,
//! OffsetFetch, OffsetCommit, DeleteGroups) and of every broker (ListGroups), with the consumer
//! protocol's assignments decoded.

use crate::tools::failure::Failure;
use crate::tools::session::{topic_name, Session};
use bytes::Buf;
use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup as ConsumerGroup;
use kafka_protocol::messages::consumer_protocol_assignment::ConsumerProtocolAssignment;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, DeleteGroupsRequest,
    DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Committed offsets by topic and partition.
pub type Committed = BTreeMap<(String, i32), i64>;

/// Coordinator errors that pass: the coordinator is loading its groups, not elected yet, or moved
/// (ask FindCoordinator again).
const PASSING: [&str; 3] = [
    "CoordinatorLoadInProgress",
    "CoordinatorNotAvailable",
    "NotCoordinator",
];

fn group_id(g: &str) -> GroupId {
    GroupId(StrBytes::from_string(g.to_string()))
}

/// Runs `f` (which finds the coordinator and asks it) again while it fails with an error that
/// passes, for at most --timeout; then its last answer.
pub fn retrying<T>(s: &Session, mut f: impl FnMut() -> Result<T, Failure>) -> Result<T, Failure> {
    let deadline = Instant::now() + s.timeout();
    loop {
        match f() {
            Err(e) if PASSING.contains(&e.name.as_str()) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            answer => return answer,
        }
    }
}

/// A group's coordinator: its node id and address.
pub fn find(s: &Session, group: &str) -> Result<(i32, SocketAddr), Failure> {
    let version = s.version(ApiKey::FindCoordinator, 1, 4)?;
    let key = StrBytes::from_string(group.to_string());
    let req = if version >= 4 {
        FindCoordinatorRequest::default().with_coordinator_keys(vec![key])
    } else {
        FindCoordinatorRequest::default().with_key(key)
    };
    let r: FindCoordinatorResponse = s.call(s.bootstrap, ApiKey::FindCoordinator, version, &req)?;
    let (code, message, node, host, port) = match r.coordinators.first() {
        Some(c) if version >= 4 => (
            c.error_code,
            c.error_message.clone(),
            c.node_id,
            c.host.clone(),
            c.port,
        ),
        _ => (
            r.error_code,
            r.error_message.clone(),
            r.node_id,
            r.host.clone(),
            r.port,
        ),
    };
    Failure::check(
        code,
        &format!("finding the coordinator of group {group}"),
        message.as_deref(),
    )?;
    let addr = crate::client::resolve(&format!("{host}:{port}"))?;
    Ok((node.0, addr))
}

/// DescribeGroups for one group at its coordinator.
pub fn describe(s: &Session, addr: SocketAddr, group: &str) -> Result<DescribedGroup, Failure> {
    let version = s.version(ApiKey::DescribeGroups, 0, 5)?;
    let req = DescribeGroupsRequest::default().with_groups(vec![group_id(group)]);
    let r: DescribeGroupsResponse = s.call(addr, ApiKey::DescribeGroups, version, &req)?;
    let g = r
        .groups
        .into_iter()
        .find(|g| g.group_id.0.as_str() == group)
        .ok_or_else(|| {
            Failure::other(
                "EmptyAnswer",
                format!("DescribeGroups: group {group} not in the answer"),
                "see the broker's log",
            )
        })?;
    Failure::check(
        g.error_code,
        &format!("describing group {group}"),
        g.error_message.as_deref(),
    )?;
    Ok(g)
}

/// ConsumerGroupDescribe of a consumer-protocol group at its coordinator: `None` where the broker
/// does not serve it or the group is not of that protocol.
pub fn describe_consumer(
    s: &Session,
    addr: SocketAddr,
    group: &str,
) -> Result<Option<ConsumerGroup>, Failure> {
    let Ok(version) = s.version(ApiKey::ConsumerGroupDescribe, 0, 1) else {
        return Ok(None);
    };
    let req = ConsumerGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
    let r: ConsumerGroupDescribeResponse =
        s.call(addr, ApiKey::ConsumerGroupDescribe, version, &req)?;
    Ok(r.groups
        .into_iter()
        .find(|g| g.group_id.0.as_str() == group && g.error_code == 0))
}

/// Whether a described group has no members: `Empty`, or `Dead` (it does not exist).
pub fn is_stopped(g: &DescribedGroup) -> bool {
    matches!(g.group_state.as_str(), "Empty" | "Dead") && g.members.is_empty()
}

/// The group's committed offsets, every topic (OffsetFetch with no topic list).
pub fn committed(s: &Session, addr: SocketAddr, group: &str) -> Result<Committed, Failure> {
    let version = s.version(ApiKey::OffsetFetch, 2, 7)?;
    let req = OffsetFetchRequest::default()
        .with_group_id(group_id(group))
        .with_topics(None);
    let r: OffsetFetchResponse = s.call(addr, ApiKey::OffsetFetch, version, &req)?;
    let what = format!("the committed offsets of group {group}");
    Failure::check(r.error_code, &what, None)?;
    let mut out = Committed::new();
    for t in &r.topics {
        for p in &t.partitions {
            Failure::check(p.error_code, &what, None)?;
            // -1: nothing committed.
            if p.committed_offset >= 0 {
                out.insert(
                    (t.name.0.to_string(), p.partition_index),
                    p.committed_offset,
                );
            }
        }
    }
    Ok(out)
}

/// Commits `offsets` for a group without members, as Kafka's tool does: generation -1, no member.
pub fn commit(
    s: &Session,
    addr: SocketAddr,
    group: &str,
    offsets: &Committed,
) -> Result<(), Failure> {
    let version = s.version(ApiKey::OffsetCommit, 2, 8)?;
    let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
    for ((topic, partition), offset) in offsets {
        topics.entry(topic).or_default().push(
            OffsetCommitRequestPartition::default()
                .with_partition_index(*partition)
                .with_committed_offset(*offset)
                .with_committed_metadata(Some(StrBytes::default())),
        );
    }
    let mut req = OffsetCommitRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::default())
        .with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| {
                    OffsetCommitRequestTopic::default()
                        .with_name(topic_name(t))
                        .with_partitions(ps)
                })
                .collect(),
        );
    if version <= 4 {
        req = req.with_retention_time_ms(-1);
    }
    let r: OffsetCommitResponse = s.call(addr, ApiKey::OffsetCommit, version, &req)?;
    for t in &r.topics {
        for p in &t.partitions {
            Failure::check(
                p.error_code,
                &format!(
                    "committing {}-{} for group {group}",
                    t.name.0, p.partition_index
                ),
                None,
            )?;
        }
    }
    Ok(())
}

/// DeleteGroups at the coordinator: each group with its error code.
pub fn delete(
    s: &Session,
    addr: SocketAddr,
    groups: &[&str],
) -> Result<Vec<(String, i16)>, Failure> {
    let version = s.version(ApiKey::DeleteGroups, 0, 2)?;
    let req = DeleteGroupsRequest::default()
        .with_groups_names(groups.iter().map(|g| group_id(g)).collect());
    let r: DeleteGroupsResponse = s.call(addr, ApiKey::DeleteGroups, version, &req)?;
    Ok(r.results
        .into_iter()
        .map(|g| (g.group_id.0.to_string(), g.error_code))
        .collect())
}

/// ListGroups at one broker: the groups it coordinates. The state is empty before v4.
pub fn list(s: &Session, addr: SocketAddr) -> Result<Vec<ListedGroup>, Failure> {
    let version = s.version(ApiKey::ListGroups, 0, 4)?;
    let r: ListGroupsResponse = s.call(
        addr,
        ApiKey::ListGroups,
        version,
        &ListGroupsRequest::default(),
    )?;
    Failure::check(r.error_code, &format!("listing the groups at {addr}"), None)?;
    Ok(r.groups)
}

/// A consumer-protocol member's assigned partitions, by topic (empty for other protocols, or an
/// assignment that does not decode). The assignment is a version, then the body in it; a newer
/// version than this client knows is read as the newest it knows, as Kafka's clients do.
pub fn assignment(protocol_type: &str, m: &DescribedGroupMember) -> BTreeMap<String, Vec<i32>> {
    let mut out = BTreeMap::new();
    let mut b = m.member_assignment.clone();
    if protocol_type != "consumer" || b.remaining() < 2 {
        return out;
    }
    let version = b.get_i16().clamp(0, 3);
    if let Ok(a) = ConsumerProtocolAssignment::decode(&mut b, version) {
        for t in a.assigned_partitions {
            let mut ps = t.partitions;
            ps.sort_unstable();
            out.insert(t.topic.0.to_string(), ps);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::protocol::Encodable;

    #[test]
    fn consumer_assignments_decode() {
        let mut b = BytesMut::new();
        b.put_i16(1);
        ConsumerProtocolAssignment::default()
            .with_assigned_partitions(vec![TopicPartition::default()
                .with_topic(topic_name("clicks"))
                .with_partitions(vec![2, 0])])
            .encode(&mut b, 1)
            .unwrap();
        let m = DescribedGroupMember::default().with_member_assignment(b.freeze());
        let a = assignment("consumer", &m);
        assert_eq!(a.get("clicks"), Some(&vec![0, 2]));
        assert!(assignment("connect", &m).is_empty());
        let garbage = DescribedGroupMember::default()
            .with_member_assignment(bytes::Bytes::from_static(&[0, 0, 0xff]));
        assert!(assignment("consumer", &garbage).is_empty());
    }
}
