//! AddPartitionsToTxn (v0-3, what clients send): at the transactional id's coordinator core, the
//! partitions join the producer's open transaction (durable), then each partition's owner core is
//! told to accept the producer's transactional batches. v4+ (brokers verifying for each other,
//! KIP-890) is not served: the owner cores learn of the partitions from the coordinator.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::table::parse_view_name;
use crate::transactions::state::{for_client, TopicPartition};
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey};
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::AddPartitionsToTxn,
    min: 0,
    max: 3,
};

/// Why a partition cannot join a transaction, before the coordinator is asked.
fn refusal(core: &Core, who: &Session, topic: &str, partition: i32) -> Option<ResponseError> {
    if !who.may_topic(core, Operation::Write, topic) {
        Some(ResponseError::TopicAuthorizationFailed)
    } else if parse_view_name(topic).is_some() || core.owner(topic, partition).is_none() {
        // Views are read-only: no transaction writes to one.
        Some(ResponseError::UnknownTopicOrPartition)
    } else {
        None
    }
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: AddPartitionsToTxnRequest = decode(req)?;
    let id = request.v3_and_below_transactional_id.to_string();
    let (producer_id, epoch) = (
        request.v3_and_below_producer_id.0,
        request.v3_and_below_producer_epoch,
    );
    let asked: Vec<TopicPartition> = request
        .v3_and_below_topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), *p)))
        .collect();
    let mut results: Vec<Option<ResponseError>> =
        if !who.may_transactional_id(core, Operation::Write, &id) {
            vec![Some(ResponseError::TransactionalIdAuthorizationFailed); asked.len()]
        } else {
            asked
                .iter()
                .map(|(t, p)| refusal(core, who, t, *p))
                .collect()
        };
    if results.iter().any(Option::is_some) {
        // As Kafka: one refused partition and none is added; the others were not attempted.
        for r in results.iter_mut().filter(|r| r.is_none()) {
            *r = Some(ResponseError::OperationNotAttempted);
        }
    } else {
        let added = core
            .transactions()
            .add_partitions(&id, producer_id, epoch, &asked, shards::now_ms())
            .await;
        results = match added {
            Ok(()) => {
                crate::cores::transaction_markers::register(core, producer_id, epoch, &asked).await
            }
            Err(e) => vec![Some(for_client(e, req.api_version >= 2)); asked.len()],
        };
    }
    let mut by_topic: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((topic, partition), r) in asked.iter().zip(&results) {
        let result = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(*partition)
            .with_partition_error_code(r.map_or(0, |e| e.code()));
        match by_topic.last_mut() {
            Some(t) if t.name.as_str() == topic => t.results_by_partition.push(result),
            _ => by_topic.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(kafka_protocol::messages::TopicName(
                        kafka_protocol::protocol::StrBytes::from_string(topic.clone()),
                    ))
                    .with_results_by_partition(vec![result]),
            ),
        }
    }
    count_errors(core, req, results.iter().map(|r| r.map_or(0, |e| e.code())));
    Ok(frame(
        ApiKey::AddPartitionsToTxn,
        req,
        &AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(by_topic),
    ))
}
