//! The requests the edge answers itself instead of the front end's handlers: consumer-group
//! requests forwarded to the upstream's group coordinator (so committed offsets live upstream),
//! ListGroups gathered from every upstream broker. The front end asks [`EdgeCore::answer`] first
//! and handles the request as usual when it declines.

use super::{forward, EdgeCore};
use crate::table::acl::Operation;
use crate::wire::header::{decode, encode, Request};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, DeleteGroupsRequest,
    DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, HeartbeatRequest,
    HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest,
    OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse, ResponseHeader,
    SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::Decodable;

/// The edge's answer to a request.
#[derive(Debug)]
pub enum Answer {
    /// A whole response frame, in chunks.
    Frame(Vec<Bytes>),
    /// The request cannot be answered (the upstream coordinator is unreachable): close the
    /// connection after earlier responses.
    Close,
}

/// What the connection may do, as the front end's authorizer decides it.
pub trait Rights: std::fmt::Debug {
    fn may_group(&self, op: Operation, group: &str) -> bool;
    fn may_cluster(&self, op: Operation) -> bool;
}

/// A client connection as the edge sees it: who it is, what it may do, and its own connections to
/// the upstream's coordinators.
#[derive(Debug)]
pub struct Client<'a> {
    pub peer: &'a str,
    pub rights: &'a dyn Rights,
    pub forwarder: &'a forward::Forwarder,
}

impl EdgeCore {
    /// Answers the requests the edge handles differently from `serve`; `None` for the others (and
    /// for group requests the connection may not make: the usual handler refuses those). `Err`:
    /// the request could not be decoded.
    pub async fn answer(&self, req: &Request, who: &Client<'_>) -> Option<Result<Answer, String>> {
        let key = ApiKey::try_from(req.api_key).ok()?;
        match key {
            ApiKey::JoinGroup
            | ApiKey::SyncGroup
            | ApiKey::Heartbeat
            | ApiKey::LeaveGroup
            | ApiKey::OffsetCommit
            | ApiKey::OffsetFetch
            | ApiKey::DescribeGroups
            | ApiKey::OffsetDelete
            | ApiKey::ConsumerGroupHeartbeat
            | ApiKey::ConsumerGroupDescribe
            | ApiKey::DeleteGroups => forward_group(self, req, who, key).await,
            ApiKey::ListGroups if who.rights.may_cluster(Operation::Describe) => {
                Some(Ok(list_groups(self, req, who).await))
            }
            _ => None,
        }
    }
}

/// The groups a group request names (the first one decides its coordinator).
fn groups_of(key: ApiKey, req: &Request) -> Result<Vec<String>, String> {
    let one = |g: &kafka_protocol::messages::GroupId| vec![g.0.to_string()];
    Ok(match key {
        ApiKey::JoinGroup => one(&decode::<JoinGroupRequest>(req)?.group_id),
        ApiKey::SyncGroup => one(&decode::<SyncGroupRequest>(req)?.group_id),
        ApiKey::Heartbeat => one(&decode::<HeartbeatRequest>(req)?.group_id),
        ApiKey::LeaveGroup => one(&decode::<LeaveGroupRequest>(req)?.group_id),
        ApiKey::OffsetCommit => one(&decode::<OffsetCommitRequest>(req)?.group_id),
        ApiKey::OffsetFetch => {
            let r = decode::<OffsetFetchRequest>(req)?;
            if req.api_version >= 8 {
                r.groups.iter().map(|g| g.group_id.0.to_string()).collect()
            } else {
                one(&r.group_id)
            }
        }
        ApiKey::OffsetDelete => one(&decode::<OffsetDeleteRequest>(req)?.group_id),
        ApiKey::ConsumerGroupHeartbeat => {
            one(&decode::<ConsumerGroupHeartbeatRequest>(req)?.group_id)
        }
        ApiKey::ConsumerGroupDescribe => decode::<ConsumerGroupDescribeRequest>(req)?
            .group_ids
            .iter()
            .map(|g| g.0.to_string())
            .collect(),
        ApiKey::DescribeGroups => decode::<DescribeGroupsRequest>(req)?
            .groups
            .iter()
            .map(|g| g.0.to_string())
            .collect(),
        ApiKey::DeleteGroups => decode::<DeleteGroupsRequest>(req)?
            .groups_names
            .iter()
            .map(|g| g.0.to_string())
            .collect(),
        _ => Vec::new(),
    })
}

/// Passes a group request to the upstream coordinator of its (first) group and its response back.
/// Groups of a several-group request that another upstream broker coordinates are answered
/// NOT_COORDINATOR by the upstream, as Kafka does; clients ask again for those. If the
/// coordinator cannot be reached, the connection is closed (clients reconnect and retry).
async fn forward_group(
    edge: &EdgeCore,
    req: &Request,
    who: &Client<'_>,
    key: ApiKey,
) -> Option<Result<Answer, String>> {
    let groups = match groups_of(key, req) {
        Ok(g) => g,
        Err(why) => return Some(Err(why)),
    };
    let op = match key {
        ApiKey::DescribeGroups | ApiKey::ConsumerGroupDescribe => Operation::Describe,
        ApiKey::DeleteGroups | ApiKey::OffsetDelete => Operation::Delete,
        _ => Operation::Read,
    };
    if groups.iter().any(|g| !who.rights.may_group(op, g)) {
        return None;
    }
    let group = groups.first()?;
    let limit = match key {
        ApiKey::JoinGroup => decode::<JoinGroupRequest>(req)
            .ok()
            .map(|j| forward::join_limit(j.rebalance_timeout_ms, j.session_timeout_ms)),
        _ => None,
    };
    let mut stale = false;
    let mut why = String::new();
    for _attempt in 0..2 {
        let addr = match edge.coordinator(group, stale).await {
            Ok(a) => a,
            Err(e) => {
                why = e;
                break;
            }
        };
        let sent = who.forwarder.forward(edge, &addr, req, limit).await;
        match sent {
            Ok(frame) => {
                if !stale
                    && top_errors(key, req.api_version, &frame)
                        .iter()
                        .any(|&c| EdgeCore::coordinator_moved(c))
                {
                    // The coordinator moved upstream: look it up again and retry once.
                    stale = true;
                    continue;
                }
                return Some(Ok(answer(req.correlation_id, frame)));
            }
            Err(e) => {
                why = e;
                stale = true;
                // A join or sync may have reached the coordinator: sending it again could
                // start another rebalance. The client reconnects and decides.
                if matches!(key, ApiKey::JoinGroup | ApiKey::SyncGroup) {
                    break;
                }
            }
        }
    }
    edge.error(&format!("{key:?} for group {group}"), &why);
    log::warn!(
        "closing connection from {}: the upstream coordinator of group {group} cannot be reached",
        who.peer
    );
    Some(Ok(Answer::Close))
}

/// An upstream response frame re-addressed to the client: its correlation id instead of ours,
/// the rest (header tagged fields, body) as it came.
fn answer(correlation_id: i32, frame: Bytes) -> Answer {
    let mut head = BytesMut::with_capacity(8);
    head.put_i32(frame.len() as i32);
    head.put_i32(correlation_id);
    Answer::Frame(vec![head.freeze(), frame.slice(4..)])
}

/// Decodes a response frame (correlation id first) of `key` at `version`.
fn decode_frame<R: Decodable>(key: ApiKey, version: i16, frame: &Bytes) -> Option<R> {
    let mut b = frame.clone();
    ResponseHeader::decode(&mut b, key.response_header_version(version)).ok()?;
    R::decode(&mut b, version).ok()
}

/// The error codes a group response carries (top level and per group or partition).
fn top_errors(key: ApiKey, version: i16, frame: &Bytes) -> Vec<i16> {
    match key {
        ApiKey::JoinGroup => decode_frame::<JoinGroupResponse>(key, version, frame)
            .map(|r| vec![r.error_code])
            .unwrap_or_default(),
        ApiKey::SyncGroup => decode_frame::<SyncGroupResponse>(key, version, frame)
            .map(|r| vec![r.error_code])
            .unwrap_or_default(),
        ApiKey::Heartbeat => decode_frame::<HeartbeatResponse>(key, version, frame)
            .map(|r| vec![r.error_code])
            .unwrap_or_default(),
        ApiKey::LeaveGroup => decode_frame::<LeaveGroupResponse>(key, version, frame)
            .map(|r| vec![r.error_code])
            .unwrap_or_default(),
        ApiKey::OffsetCommit => decode_frame::<OffsetCommitResponse>(key, version, frame)
            .map(|r| {
                r.topics
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
                    .collect()
            })
            .unwrap_or_default(),
        ApiKey::OffsetFetch => decode_frame::<OffsetFetchResponse>(key, version, frame)
            .map(|r| {
                let mut codes = vec![r.error_code];
                codes.extend(r.groups.iter().map(|g| g.error_code));
                codes
            })
            .unwrap_or_default(),
        ApiKey::DescribeGroups => decode_frame::<DescribeGroupsResponse>(key, version, frame)
            .map(|r| r.groups.iter().map(|g| g.error_code).collect())
            .unwrap_or_default(),
        ApiKey::DeleteGroups => decode_frame::<DeleteGroupsResponse>(key, version, frame)
            .map(|r| r.results.iter().map(|g| g.error_code).collect())
            .unwrap_or_default(),
        ApiKey::OffsetDelete => decode_frame::<OffsetDeleteResponse>(key, version, frame)
            .map(|r| vec![r.error_code])
            .unwrap_or_default(),
        ApiKey::ConsumerGroupHeartbeat => {
            decode_frame::<ConsumerGroupHeartbeatResponse>(key, version, frame)
                .map(|r| vec![r.error_code])
                .unwrap_or_default()
        }
        ApiKey::ConsumerGroupDescribe => {
            decode_frame::<ConsumerGroupDescribeResponse>(key, version, frame)
                .map(|r| r.groups.iter().map(|g| g.error_code).collect())
                .unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

/// ListGroups asked of every upstream broker (each lists the groups it coordinates), merged. A
/// broker that cannot be asked makes the answer COORDINATOR_NOT_AVAILABLE, with the groups the
/// others listed.
async fn list_groups(edge: &EdgeCore, req: &Request, who: &Client<'_>) -> Answer {
    let key = ApiKey::ListGroups;
    let _ = edge.refresh(false).await;
    let mut merged = ListGroupsResponse::default();
    let brokers = edge.brokers();
    if brokers.is_empty() {
        merged.error_code = 15;
    }
    for addr in brokers {
        let sent = who.forwarder.forward(edge, &addr, req, None).await;
        match sent.map(|f| decode_frame::<ListGroupsResponse>(key, req.api_version, &f)) {
            Ok(Some(r)) => {
                if r.error_code != 0 && merged.error_code == 0 {
                    merged.error_code = r.error_code;
                }
                merged.groups.extend(r.groups);
            }
            Ok(None) => {
                edge.error("ListGroups", &format!("{addr}: undecodable response"));
                merged.error_code = 15;
            }
            Err(e) => {
                edge.error("ListGroups", &e);
                merged.error_code = 15;
            }
        }
    }
    match encode(key, req.api_version, req.correlation_id, &merged) {
        Ok(frame) => Answer::Frame(vec![frame]),
        Err(e) => {
            log::error!("cannot encode a ListGroups response, closing the connection: {e}");
            Answer::Close
        }
    }
}
