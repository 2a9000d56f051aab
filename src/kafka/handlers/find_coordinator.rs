//! FindCoordinator: a group's coordinator is the core `murmur2(group id) % cores`
//! ([`crate::groups::coordinator_core`]), a transactional id's the same hash of the id
//! ([`crate::transactions::coordinator_core`]); v4 looks up several keys at once.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::coordinator_core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::FindCoordinator,
    min: 0,
    max: 4,
};

const GROUP: i8 = 0;
const TRANSACTION: i8 = 1;

fn lookup(core: &Core, who: &Session, key: &StrBytes, key_type: i8) -> Coordinator {
    let c = Coordinator::default().with_key(key.clone());
    let error = |e: ResponseError, why: &'static str| {
        Coordinator::default()
            .with_key(key.clone())
            .with_error_code(e.code())
            .with_error_message(Some(StrBytes::from_static_str(why)))
            .with_node_id(BrokerId(-1))
            .with_host(StrBytes::default())
            .with_port(-1)
    };
    let owner = match key_type {
        GROUP => {
            if !who.may_group(core, Operation::Describe, key) {
                return error(
                    ResponseError::GroupAuthorizationFailed,
                    "not authorized to describe this group",
                );
            }
            // The empty group id has a coordinator too: OffsetCommit, OffsetFetch, DescribeGroups
            // and DeleteGroups accept it, as in Kafka (only the membership APIs refuse it).
            coordinator_core(key, core.cores())
        }
        TRANSACTION => {
            if key.is_empty() {
                return error(ResponseError::InvalidRequest, "empty transactional id");
            }
            if !who.may_transactional_id(core, Operation::Describe, key) {
                return error(
                    ResponseError::TransactionalIdAuthorizationFailed,
                    "not authorized to describe this transactional id",
                );
            }
            crate::transactions::coordinator_core(key, core.cores())
        }
        _ => {
            return error(
                ResponseError::InvalidRequest,
                "unknown key type: 0 (group) or 1 (transaction)",
            )
        }
    };
    c.with_node_id(BrokerId(owner as i32))
        .with_host(StrBytes::from_string(core.cluster.advertised_host.clone()))
        .with_port(i32::from(core.cluster.listeners[who.listener].ports[owner]))
}

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: FindCoordinatorRequest = decode(req)?;
    let v = req.api_version;
    let response = if v >= 4 {
        let coordinators: Vec<Coordinator> = request
            .coordinator_keys
            .iter()
            .map(|k| lookup(core, who, k, request.key_type))
            .collect();
        count_errors(core, req, coordinators.iter().map(|c| c.error_code));
        FindCoordinatorResponse::default().with_coordinators(coordinators)
    } else {
        let c = lookup(core, who, &request.key, request.key_type);
        count_errors(core, req, [c.error_code]);
        FindCoordinatorResponse::default()
            .with_error_code(c.error_code)
            .with_error_message(if v >= 1 { c.error_message } else { None })
            .with_node_id(c.node_id)
            .with_host(c.host)
            .with_port(c.port)
    };
    Ok(frame(ApiKey::FindCoordinator, req, &response))
}
