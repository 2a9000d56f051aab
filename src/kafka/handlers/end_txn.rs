//! EndTxn: at the transactional id's coordinator core, the transaction's Prepare state is made
//! durable (from then on its outcome is decided: a crash completes it at restart), its markers
//! are written on every partition and its groups' offsets committed or dropped, then it is
//! complete and the producer answered. Should a marker not be written in time, the answer is still
//! success (the outcome is decided); the coordinator's ticker writes what is missing, and the
//! producer's next request gets CONCURRENT_TRANSACTIONS until then.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::transactions::state::for_client;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, EndTxnRequest, EndTxnResponse};
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::EndTxn,
    min: 0,
    max: 4,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: EndTxnRequest = decode(req)?;
    let id = request.transactional_id.as_str();
    let outcome = if !who.may_transactional_id(core, Operation::Write, id) {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    } else {
        let ended = core
            .transactions()
            .end_txn(
                id,
                request.producer_id.0,
                request.producer_epoch,
                request.committed,
                shards::now_ms(),
            )
            .await;
        match ended {
            Ok(Some((markers, _claim))) => {
                if let Err(e) =
                    crate::cores::transaction_markers::complete(core, id, &markers).await
                {
                    log::warn!("EndTxn of {id}: markers not all written yet ({e:?}); retried");
                }
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(for_client(e, req.api_version >= 2)),
        }
    };
    let code = outcome.err().map_or(0, |e| e.code());
    count_errors(core, req, [code]);
    Ok(frame(
        ApiKey::EndTxn,
        req,
        &EndTxnResponse::default().with_error_code(code),
    ))
}
