//! AddOffsetsToTxn: at the transactional id's coordinator core, the group's offsets (committed
//! with TxnOffsetCommit at the group's coordinator) become part of the producer's transaction:
//! committed with it, or dropped at its abort.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::transactions::state::for_client;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, ApiKey};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::AddOffsetsToTxn,
    min: 0,
    max: 4,
};

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: AddOffsetsToTxnRequest = decode(req)?;
    let id = request.transactional_id.as_str();
    let group = request.group_id.as_str();
    let outcome = if !who.may_transactional_id(core, Operation::Write, id) {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    } else if !who.may_group(core, Operation::Read, group) {
        Err(ResponseError::GroupAuthorizationFailed)
    } else {
        core.transactions()
            .add_offsets(
                id,
                request.producer_id.0,
                request.producer_epoch,
                group,
                shards::now_ms(),
            )
            .await
            .map_err(|e| for_client(e, req.api_version >= 2))
    };
    let code = outcome.err().map_or(0, |e| e.code());
    count_errors(core, req, [code]);
    Ok(frame(
        ApiKey::AddOffsetsToTxn,
        req,
        &AddOffsetsToTxnResponse::default().with_error_code(code),
    ))
}
