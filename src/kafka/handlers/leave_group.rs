//! LeaveGroup: one member (v0-2) or several, by member id or instance id (v3+).

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::errors::code;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{ApiKey, LeaveGroupRequest, LeaveGroupResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::LeaveGroup,
    min: 0,
    max: 5,
};

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: LeaveGroupRequest = decode(req)?;
    if !who.may_group(core, Operation::Read, &request.group_id) {
        core.metrics.error(req.api_key);
        let denied = LeaveGroupResponse::default()
            .with_error_code(kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code());
        return Ok(frame(ApiKey::LeaveGroup, req, &denied));
    }
    let v = req.api_version;
    let members: Vec<(String, Option<String>)> = if v >= 3 {
        request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let response = match core.groups().leave(&request.group_id, &members) {
        Err(e) => LeaveGroupResponse::default().with_error_code(e.code()),
        Ok(errors) if v >= 3 => LeaveGroupResponse::default().with_members(
            members
                .into_iter()
                .zip(errors)
                .map(|((id, instance), e)| {
                    MemberResponse::default()
                        .with_member_id(StrBytes::from_string(id))
                        .with_group_instance_id(instance.map(StrBytes::from_string))
                        .with_error_code(code(e))
                })
                .collect(),
        ),
        Ok(errors) => LeaveGroupResponse::default().with_error_code(code(errors[0])),
    };
    count_errors(
        core,
        req,
        std::iter::once(response.error_code).chain(response.members.iter().map(|m| m.error_code)),
    );
    Ok(frame(ApiKey::LeaveGroup, req, &response))
}
