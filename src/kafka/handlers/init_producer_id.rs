//! InitProducerId: producer ids for idempotent producers (transactions are not supported).
//! Ids are unique without coordination: a per-core counter that starts from the clock, with the core
//! number in the low bits, so no two cores and no two runs hand out the same id.

use super::{frame, HandlerResult, Versions};
use crate::core_state::Core;
use crate::kafka::session::Session;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use std::cell::Cell;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::InitProducerId,
    min: 0,
    max: 4,
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

pub fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: InitProducerIdRequest = decode(req)?;
    let response = if request.transactional_id.is_some() {
        InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
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
