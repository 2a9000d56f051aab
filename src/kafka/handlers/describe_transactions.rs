//! DescribeTransactions (KIP-664): the state of transactional ids this core coordinates (the
//! client asks each id's coordinator); ids of other cores get NOT_COORDINATOR.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::transactions::state::TxnMetadata;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DescribeTransactions,
    min: 0,
    max: 0,
};

fn described(m: &TxnMetadata) -> TransactionState {
    let mut topics: Vec<TopicData> = Vec::new();
    for (topic, partition) in &m.partitions {
        match topics.last_mut() {
            Some(t) if t.topic.as_str() == topic => t.partitions.push(*partition),
            _ => topics.push(
                TopicData::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partitions(vec![*partition]),
            ),
        }
    }
    TransactionState::default()
        .with_transaction_state(StrBytes::from_static_str(m.state.name()))
        .with_transaction_timeout_ms(m.timeout_ms)
        .with_transaction_start_time_ms(m.start_ms)
        .with_producer_id(ProducerId(m.producer_id))
        .with_producer_epoch(m.epoch)
        .with_topics(topics)
}

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: DescribeTransactionsRequest = decode(req)?;
    let states: Vec<TransactionState> = request
        .transactional_ids
        .iter()
        .map(|id| {
            let found = if !who.may_transactional_id(core, Operation::Describe, id) {
                Err(ResponseError::TransactionalIdAuthorizationFailed)
            } else {
                core.transactions()
                    .check(id)
                    .and_then(|log| log.get(id).ok_or(ResponseError::TransactionalIdNotFound))
            };
            match found {
                Ok(m) => described(&m),
                Err(e) => TransactionState::default()
                    .with_error_code(e.code())
                    .with_transaction_state(StrBytes::default())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1),
            }
            .with_transactional_id(id.clone())
        })
        .collect();
    count_errors(core, req, states.iter().map(|s| s.error_code));
    Ok(frame(
        ApiKey::DescribeTransactions,
        req,
        &DescribeTransactionsResponse::default().with_transaction_states(states),
    ))
}
