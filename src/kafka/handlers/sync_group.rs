//! SyncGroup: the leader brings the assignment of the generation; every member (leader included)
//! waits until it has arrived and gets its own part. The broker never reads the assignments.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::group::{Answer, SyncRequest};
use crate::groups::MAX_MEMBER_BLOB_BYTES;
use crate::kafka::errors::code;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::SyncGroup,
    min: 0,
    max: 5,
};

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: SyncGroupRequest = decode(req)?;
    if !who.may_group(core, Operation::Read, &request.group_id) {
        core.metrics.error(req.api_key);
        let denied = SyncGroupResponse::default()
            .with_error_code(kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code());
        return Ok(frame(ApiKey::SyncGroup, req, &denied));
    }
    let v = req.api_version;
    let answer = if request
        .assignments
        .iter()
        .any(|a| a.assignment.len() > MAX_MEMBER_BLOB_BYTES)
    {
        Err(ResponseError::InvalidRequest)
    } else {
        let sync = SyncRequest {
            generation: request.generation_id,
            member_id: request.member_id.to_string(),
            instance_id: request
                .group_instance_id
                .as_ref()
                .filter(|_| v >= 3)
                .map(|s| s.to_string()),
            protocol_type: request.protocol_type.as_ref().map(|s| s.to_string()),
            protocol_name: request.protocol_name.as_ref().map(|s| s.to_string()),
            // Copied: a slice would keep the whole request frame alive as long as the group.
            assignments: request
                .assignments
                .iter()
                .map(|a| {
                    (
                        a.member_id.to_string(),
                        Bytes::copy_from_slice(&a.assignment),
                    )
                })
                .collect(),
        };
        match core.groups().sync(&request.group_id, sync) {
            Answer::Now(a) => Ok(a),
            Answer::Later(rx) => rx.await.ok_or(ResponseError::NotCoordinator),
        }
    };
    let response = match answer {
        Ok(a) => SyncGroupResponse::default()
            .with_error_code(code(a.error))
            .with_protocol_type(
                a.protocol_type
                    .filter(|_| v >= 5)
                    .map(StrBytes::from_string),
            )
            .with_protocol_name(
                a.protocol_name
                    .filter(|_| v >= 5)
                    .map(StrBytes::from_string),
            )
            .with_assignment(a.assignment),
        Err(e) => SyncGroupResponse::default().with_error_code(e.code()),
    };
    count_errors(core, req, [response.error_code]);
    Ok(frame(ApiKey::SyncGroup, req, &response))
}
