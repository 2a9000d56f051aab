//! JoinGroup: waits (this handler's task, not the connection) until the group's rebalance completes,
//! then answers with the generation, the chosen protocol, the leader, and for the leader every
//! member's metadata. v4+ members without an id first get `MEMBER_ID_REQUIRED` and their id.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::group::{Answer, JoinRequest};
use crate::groups::MAX_MEMBER_BLOB_BYTES;
use crate::kafka::errors::code;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{ApiKey, JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;
use std::time::Duration;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::JoinGroup,
    min: 0,
    max: 9,
};

/// The host part of a peer address, the way Kafka shows client hosts (`/127.0.0.1`).
pub fn client_host(peer: &str) -> String {
    let host = peer.rsplit_once(':').map_or(peer, |(h, _)| h);
    format!("/{}", host.trim_start_matches('[').trim_end_matches(']'))
}

fn timeout(ms: i32) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: JoinGroupRequest = decode(req)?;
    if !who.may_group(core, Operation::Read, &request.group_id) {
        core.metrics.error(req.api_key);
        let denied = JoinGroupResponse::default()
            .with_error_code(kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code());
        return Ok(frame(ApiKey::JoinGroup, req, &denied));
    }
    let v = req.api_version;
    let session = timeout(request.session_timeout_ms);
    let rebalance = if v >= 1 {
        timeout(request.rebalance_timeout_ms)
    } else {
        session
    };
    let answer = if request
        .protocols
        .iter()
        .any(|p| p.metadata.len() > MAX_MEMBER_BLOB_BYTES)
    {
        Err(ResponseError::InvalidRequest)
    } else if let (Some(session), Some(rebalance)) = (session, rebalance) {
        let join = JoinRequest {
            member_id: request.member_id.to_string(),
            instance_id: request
                .group_instance_id
                .as_ref()
                .filter(|_| v >= 5)
                .map(|s| s.to_string()),
            client_id: req
                .header
                .client_id
                .as_ref()
                .map_or_else(String::new, |s| s.to_string()),
            client_host: client_host(&who.peer),
            session_timeout: session,
            rebalance_timeout: rebalance,
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), Bytes::copy_from_slice(&p.metadata)))
                .collect(),
            require_known_member_id: v >= 4,
            supports_skip_assignment: v >= 9,
        };
        match core.groups().join(&request.group_id, join) {
            Answer::Now(a) => Ok(a),
            Answer::Later(rx) => rx.await.ok_or(ResponseError::NotCoordinator),
        }
    } else {
        Err(ResponseError::InvalidSessionTimeout)
    };
    let response = match answer {
        Ok(a) => JoinGroupResponse::default()
            .with_error_code(code(a.error))
            .with_generation_id(a.generation)
            .with_protocol_type(
                a.protocol_type
                    .filter(|_| v >= 7)
                    .map(StrBytes::from_string),
            )
            .with_protocol_name(if v >= 7 {
                a.protocol_name.map(StrBytes::from_string)
            } else {
                Some(StrBytes::from_string(a.protocol_name.unwrap_or_default()))
            })
            .with_leader(StrBytes::from_string(a.leader))
            .with_skip_assignment(v >= 9 && a.skip_assignment)
            .with_member_id(StrBytes::from_string(a.member_id))
            .with_members(
                a.members
                    .into_iter()
                    .map(|m| {
                        JoinGroupResponseMember::default()
                            .with_member_id(StrBytes::from_string(m.member_id))
                            .with_group_instance_id(
                                m.instance_id.filter(|_| v >= 5).map(StrBytes::from_string),
                            )
                            .with_metadata(m.metadata)
                    })
                    .collect(),
            ),
        Err(e) => JoinGroupResponse::default()
            .with_error_code(e.code())
            .with_generation_id(-1)
            .with_protocol_name((v < 7).then(StrBytes::default))
            .with_member_id(request.member_id.clone()),
    };
    if response.error_code != ResponseError::MemberIdRequired.code() {
        count_errors(core, req, [response.error_code]);
    }
    Ok(frame(ApiKey::JoinGroup, req, &response))
}
