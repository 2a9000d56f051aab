//! Heartbeat: keeps a member's session alive and tells it when a rebalance is under way.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::errors::code;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::Heartbeat,
    min: 0,
    max: 4,
};

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: HeartbeatRequest = decode(req)?;
    if !who.may_group(core, Operation::Read, &request.group_id) {
        core.metrics.error(req.api_key);
        let denied = HeartbeatResponse::default()
            .with_error_code(kafka_protocol::error::ResponseError::GroupAuthorizationFailed.code());
        return Ok(frame(ApiKey::Heartbeat, req, &denied));
    }
    let instance = request
        .group_instance_id
        .as_ref()
        .filter(|_| req.api_version >= 3)
        .map(|s| s.to_string());
    let error = core.groups().heartbeat(
        &request.group_id,
        &request.member_id,
        instance.as_deref(),
        request.generation_id,
    );
    let response = HeartbeatResponse::default().with_error_code(code(error));
    count_errors(core, req, [response.error_code]);
    Ok(frame(ApiKey::Heartbeat, req, &response))
}
