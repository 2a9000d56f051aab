//! ListTransactions (KIP-664): the transactional ids this core coordinates (a client asks every
//! broker and merges), filtered by state, producer id and (v1) how long the transaction has run;
//! only ids the client may describe.

use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ApiKey, ListTransactionsRequest, ListTransactionsResponse, ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::ListTransactions,
    min: 0,
    max: 1,
};

const STATES: [&str; 7] = [
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
];

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: ListTransactionsRequest = decode(req)?;
    let unknown: Vec<StrBytes> = request
        .state_filters
        .iter()
        .filter(|s| !STATES.contains(&s.as_str()))
        .cloned()
        .collect();
    let now = shards::now_ms();
    // v1: only transactions open at least this long (-1 or 0: any).
    let min_duration = if req.api_version >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let states: Vec<TransactionState> = core
        .transactions()
        .all()
        .into_iter()
        .filter(|(_, m)| {
            request.state_filters.is_empty()
                || request
                    .state_filters
                    .iter()
                    .any(|s| s.as_str() == m.state.name())
        })
        .filter(|(_, m)| {
            request.producer_id_filters.is_empty()
                || request
                    .producer_id_filters
                    .contains(&ProducerId(m.producer_id))
        })
        .filter(|(_, m)| min_duration <= 0 || (m.start_ms >= 0 && now - m.start_ms >= min_duration))
        .filter(|(id, _)| who.may_transactional_id(core, Operation::Describe, id))
        .map(|(id, m)| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(StrBytes::from_static_str(m.state.name()))
        })
        .collect();
    Ok(frame(
        ApiKey::ListTransactions,
        req,
        &ListTransactionsResponse::default()
            .with_unknown_state_filters(unknown)
            .with_transaction_states(states),
    ))
}
