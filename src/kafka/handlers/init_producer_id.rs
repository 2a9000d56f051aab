//! InitProducerId: producer ids for idempotent producers, and for transactional ones at their
//! transactional id's coordinator core (which bumps the epoch, fencing the previous producer, and
//! aborts its open transaction first). Ids are unique without coordination: a per-core counter
//! that starts from the clock, with the core number in the low bits, so no two cores and no two
//! runs hand out the same id.

use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::transactions::coordinator::Init;
use crate::transactions::state::{for_client, ProducerIdAndEpoch};
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use std::cell::Cell;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::InitProducerId,
    min: 0,
    max: 5,
};

thread_local! {
    static LAST: Cell<i64> = const { Cell::new(0) };
}

fn next_producer_id(core: usize) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    LAST.with(|last| {
        let base = (now << 4).max(last.get() + 1);
        last.set(base);
        (base << 8) | (core as i64 & 0xff)
    })
}

/// An error answer: no producer id.
fn refused(e: ResponseError) -> InitProducerIdResponse {
    InitProducerIdResponse::default()
        .with_error_code(e.code())
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1)
}

/// A transactional producer's InitProducerId, at its coordinator core: an open transaction of the
/// id is aborted (markers written) before the epoch is bumped again.
async fn transactional(
    core: &Rc<Core>,
    request: &InitProducerIdRequest,
    id: &str,
    version: i16,
) -> InitProducerIdResponse {
    let expected =
        (request.producer_id.0 >= 0 && request.producer_epoch >= 0).then_some(ProducerIdAndEpoch {
            producer_id: request.producer_id.0,
            epoch: request.producer_epoch,
        });
    let coordinator = core.transactions();
    // At most two rounds: the open transaction aborted, then the epoch bumped.
    for _ in 0..2 {
        let mut allocate = || next_producer_id(core.id());
        let init = coordinator
            .init_producer_id(
                id,
                request.transaction_timeout_ms,
                expected,
                shards::now_ms(),
                &mut allocate,
            )
            .await;
        match init {
            Ok(Init::Ready(producer_id, epoch)) => {
                return InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(epoch)
            }
            Ok(Init::AbortFirst(markers, _claim)) => {
                if crate::cores::transaction_markers::complete(core, id, &markers)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Err(e) => return refused(for_client(e, version >= 4)),
        }
    }
    // The abort's markers are still being written: the client retries.
    refused(ResponseError::ConcurrentTransactions)
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: InitProducerIdRequest = decode(req)?;
    let response = if let Some(id) = &request.transactional_id {
        if who.may_transactional_id(core, Operation::Write, id) {
            transactional(core, &request, id, req.api_version).await
        } else {
            refused(ResponseError::TransactionalIdAuthorizationFailed)
        }
    } else if !who.may_write_idempotently(core) {
        InitProducerIdResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    } else if request.producer_id.0 >= 0 && request.producer_epoch >= 0 {
        // KIP-360: an idempotent producer bumps its epoch to reset its sequence numbers.
        let (id, epoch) = if request.producer_epoch < i16::MAX - 1 {
            (request.producer_id.0, request.producer_epoch + 1)
        } else {
            (next_producer_id(core.id()), 0)
        };
        InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(epoch)
    } else {
        InitProducerIdResponse::default()
            .with_producer_id(ProducerId(next_producer_id(core.id())))
            .with_producer_epoch(0)
    };
    if response.error_code != 0 {
        core.metrics.error(req.api_key);
    }
    Ok(frame(ApiKey::InitProducerId, req, &response))
}
