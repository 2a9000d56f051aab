//! IncrementalAlterConfigs: SET, DELETE (back to the server's value), APPEND and SUBTRACT (list
//! configs: `cleanup.policy`) on a topic's own configs, applied by core 0 to the table it holds, so
//! concurrent changes to different keys do not undo each other.

use super::alter_configs::alter;
use super::{frame, HandlerResult, Versions};
use crate::control::ConfigOp;
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    ApiKey, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::IncrementalAlterConfigs,
    min: 0,
    max: 1,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: IncrementalAlterConfigsRequest = decode(req)?;
    let asked = request
        .resources
        .iter()
        .map(|r| {
            let ops = r
                .configs
                .iter()
                .map(|c| {
                    let name = c.name.to_string();
                    match (c.config_operation, c.value.as_ref().map(|v| v.to_string())) {
                        (0, Some(v)) => ConfigOp::Set(name, v),
                        (1, _) => ConfigOp::Delete(name),
                        (2, Some(v)) => ConfigOp::Append(name, v),
                        (3, Some(v)) => ConfigOp::Subtract(name, v),
                        (op, _) => ConfigOp::Invalid(name, op),
                    }
                })
                .collect();
            (r.resource_type, r.resource_name.to_string(), ops)
        })
        .collect();
    let responses: Vec<AlterConfigsResourceResponse> =
        alter(core, req, who, asked, false, request.validate_only).await;
    Ok(frame(
        ApiKey::IncrementalAlterConfigs,
        req,
        &IncrementalAlterConfigsResponse::default().with_responses(responses),
    ))
}
