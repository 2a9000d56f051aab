//! Produce: hand each partition its batches in request order (the partition validates them, checks
//! idempotent producers' sequence numbers and queues the append), and answer when they are written
//! (acks=1) or fsynced (acks=all). acks=0 gets no response at all, as in Kafka.

use super::{count_errors, frame, HandlerResult, Reply, Versions};
use crate::cores::Core;
use crate::kafka::errors::code_of;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use shards::partition::{Appending, Produced, Refused};
use shards::producers::SequenceCheck;
use shards::InvalidBatch;
use std::rc::Rc;
use uuid::Uuid;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::Produce,
    min: 3,
    max: 13,
};

/// Longest a transactional produce waits after a start for the coordinators to register their
/// open transactions again.
const REGISTRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The outcome of one partition, or the append it waits for.
enum Pending {
    Done(PartitionProduceResponse),
    /// The partition's append (of the partition with this index).
    Appending(Appending, i32),
}

fn failed(index: i32, err: ResponseError, message: Option<String>) -> Pending {
    Pending::Done(error_response(index, err.code(), message))
}

/// A partition's answer with an error: no offset.
fn error_response(index: i32, code: i16, message: Option<String>) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(code)
        .with_base_offset(-1)
        .with_error_message(message.map(StrBytes::from_string))
}

/// Just after a start, the partitions written that this core is still opening are opened first
/// and waited for; produces that waited for a partition resume in the order they came.
async fn wait_opening(core: &Core, request: &ProduceRequest, version: i16) {
    core.wait_opening(request.topic_data.iter().flat_map(|t| {
        let name = match version >= 13 {
            true => core
                .topic_name(t.topic_id.as_bytes())
                .map_or_else(String::new, |n| n.to_string()),
            false => t.name.0.to_string(),
        };
        t.partition_data
            .iter()
            .map(move |p| (name.clone(), p.index))
    }))
    .await;
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: ProduceRequest = decode(req)?;
    wait_opening(core, &request, req.api_version).await;
    if request.transactional_id.is_some() {
        // Just after a start, a partition may not know yet that an open transaction had added
        // it: its coordinator registers it again first.
        core.until_transactions_registered(REGISTRATION_WAIT).await;
    }
    let acks = request.acks;
    let durable = acks == -1;
    // Everything from here to the first await runs in request order, so pipelined produces are
    // appended in the order they were sent (idempotent producers depend on it; transactional ones
    // waiting above just after a start are woken in the order they came).
    let mut topics: Vec<(StrBytes, Uuid, Vec<Pending>)> = Vec::new();
    for t in request.topic_data {
        // v13 names the topic by id (KIP-516): an id no topic has is UNKNOWN_TOPIC_ID.
        let found = if req.api_version >= 13 {
            core.topic_name(t.topic_id.as_bytes())
        } else {
            Some(t.name.0.clone())
        };
        let name = found.clone().unwrap_or_default();
        let mut parts = Vec::new();
        let writable = who.may_topic(core, Operation::Write, &name);
        let read_only = crate::kafka::upstream::refuses_produce(core, &name, &who.peer);
        // A transactional producer needs WRITE on its transactional id too.
        let txn_refused = request
            .transactional_id
            .as_ref()
            .is_some_and(|id| !who.may_transactional_id(core, Operation::Write, id));
        for p in t.partition_data {
            parts.push(if found.is_none() {
                failed(p.index, ResponseError::UnknownTopicId, None)
            } else if let Some(why) = &read_only {
                failed(
                    p.index,
                    ResponseError::TopicAuthorizationFailed,
                    Some(why.clone()),
                )
            } else if !writable {
                failed(p.index, ResponseError::TopicAuthorizationFailed, None)
            } else if txn_refused {
                failed(
                    p.index,
                    ResponseError::TransactionalIdAuthorizationFailed,
                    None,
                )
            } else if !matches!(acks, -1..=1) {
                failed(p.index, ResponseError::InvalidRequiredAcks, None)
            } else {
                start_partition(core, &name, p.index, p.records, (durable, req.api_version))
            });
        }
        topics.push((name, t.topic_id, parts));
    }
    let mut responses = Vec::new();
    for (name, id, parts) in topics {
        let mut partition_responses = Vec::new();
        for p in parts {
            partition_responses.push(match p {
                Pending::Done(r) => r,
                Pending::Appending(append, index) => appended(index, append.finished().await),
            });
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(name.into())
                .with_topic_id(id)
                .with_partition_responses(partition_responses),
        );
    }
    let node_endpoints =
        crate::kafka::leaders::mark_produce(core, who, req.api_version, &mut responses);
    count_errors(
        core,
        req,
        responses
            .iter()
            .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code)),
    );
    if acks == 0 {
        // No response can carry an error: as Kafka does, close the connection so the producer
        // refreshes its metadata instead of losing records without a sign.
        let failed = responses
            .iter()
            .flat_map(|t| &t.partition_responses)
            .any(|p| p.error_code != 0);
        return Ok(if failed { Reply::Close } else { Reply::None });
    }
    Ok(frame(
        ApiKey::Produce,
        req,
        &ProduceResponse::default()
            .with_responses(responses)
            .with_node_endpoints(node_endpoints),
    ))
}

/// zstd in a batch's compression bits.
const ZSTD: u8 = 4;

/// Whether any batch of a Produce request's records is zstd-compressed (the headers walked;
/// what is malformed is left for validation to refuse).
fn holds_zstd(records: Option<&[u8]>) -> bool {
    let mut rest = records.unwrap_or_default();
    while let Some(len) = shards::batch::peek_total_len(rest).filter(|&l| l <= rest.len()) {
        match shards::batch::BatchHeader::parse(rest) {
            Ok(h) if h.compression() == ZSTD => return true,
            Ok(_) => rest = &rest[len..],
            Err(_) => return false,
        }
    }
    false
}

fn start_partition(
    core: &Rc<Core>,
    topic: &str,
    index: i32,
    records: Option<bytes::Bytes>,
    (durable, version): (bool, i16),
) -> Pending {
    if version < 7 && holds_zstd(records.as_deref()) {
        let why = "zstd batches need Produce v7 or later (KIP-110)";
        return failed(
            index,
            ResponseError::UnsupportedCompressionType,
            Some(why.into()),
        );
    }
    let partition = match core.local_partition(topic, index) {
        Ok((_, Some(_))) => {
            let why = "views (<topic>.shard-<i>-of-<n>) are read-only; produce to the source topic";
            return failed(
                index,
                ResponseError::InvalidTopicException,
                Some(why.into()),
            );
        }
        Ok((partition, None)) => partition,
        Err(e) => return failed(index, e, None),
    };
    let Some(blob) = records.filter(|r| !r.is_empty()) else {
        return failed(
            index,
            ResponseError::CorruptMessage,
            Some("no records".into()),
        );
    };
    match partition.produce(blob, durable) {
        Ok(Produced::Appending(append)) => Pending::Appending(append, index),
        Ok(Produced::Duplicate { base_offset }) => Pending::Done(
            PartitionProduceResponse::default()
                .with_index(index)
                .with_base_offset(base_offset)
                .with_log_start_offset(partition.log.log_start_offset()),
        ),
        Err(Refused::Batch(e)) => {
            log::debug!("produce to {topic}-{index} refused: {e}");
            let mut message = e.to_string();
            if let shards::Error::InvalidBatch(InvalidBatch::TooLarge { .. }) = &e {
                message += &format!(
                    " (the topic's max.message.bytes: `shoal topic alter-config {topic} -c \
                     max.message.bytes=N`; --max-batch-bytes is the server's default)"
                );
            }
            let mut answer = error_response(index, code_of(&e).code(), Some(message));
            // Which records (KIP-467): clients fail those with INVALID_RECORD and the rest of the
            // batch with a retriable error of their own.
            if let shards::Error::InvalidBatch(InvalidBatch::MissingKey { indexes }) = &e {
                answer.record_errors = indexes
                    .iter()
                    .map(|&i| BatchIndexAndErrorMessage::default().with_batch_index(i))
                    .collect();
            }
            Pending::Done(answer)
        }
        Err(Refused::Sequence {
            base_sequence,
            check,
            ..
        }) => sequence_refused(index, base_sequence, check),
        // KIP-890's answer: the producer must add the partition to its transaction first.
        Err(Refused::NotInTransaction { producer_id, epoch }) => failed(
            index,
            ResponseError::InvalidTxnState,
            Some(format!(
                "producer {producer_id} (epoch {epoch}) has no transaction with this partition: \
                 AddPartitionsToTxn first"
            )),
        ),
    }
}

/// The answer for a partition whose idempotent batches' sequence check failed.
fn sequence_refused(index: i32, base_sequence: i32, check: SequenceCheck) -> Pending {
    match check {
        SequenceCheck::Duplicate { .. } => {
            failed(index, ResponseError::DuplicateSequenceNumber, None)
        }
        // A retry of a batch still being written (or fsynced): not a duplicate yet, since the
        // write may still fail, and clients take DUPLICATE_SEQUENCE_NUMBER as success. A retriable
        // error makes them try again, by when it is a duplicate (answered with its offset) or was
        // released (and is appended).
        SequenceCheck::InFlight => failed(
            index,
            ResponseError::RequestTimedOut,
            Some("the same batch is still being written".into()),
        ),
        SequenceCheck::OutOfOrder { expected } => failed(
            index,
            ResponseError::OutOfOrderSequenceNumber,
            Some(format!("expected sequence {expected}, got {base_sequence}")),
        ),
        SequenceCheck::Fenced => failed(index, ResponseError::InvalidProducerEpoch, None),
        SequenceCheck::UnknownProducer => failed(index, ResponseError::UnknownProducerId, None),
        SequenceCheck::Append => unreachable!("an accepted batch is not an error"),
    }
}

/// A partition's answer once its append is done.
fn appended(
    index: i32,
    result: Option<shards::Result<shards::AppendResult>>,
) -> PartitionProduceResponse {
    match result {
        Some(Ok(r)) => PartitionProduceResponse::default()
            .with_index(index)
            .with_base_offset(r.base_offset)
            .with_log_append_time_ms(r.log_append_time)
            .with_log_start_offset(r.log_start_offset),
        Some(Err(e)) => error_response(index, code_of(&e).code(), Some(e.to_string())),
        None => error_response(index, ResponseError::UnknownServerError.code(), None),
    }
}
