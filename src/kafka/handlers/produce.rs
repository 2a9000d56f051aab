//! Produce: validate each partition's batches, check idempotent producers' sequence numbers, queue
//! the appends in request order, and answer when they are written (acks=1) or fsynced (acks=all).
//! acks=0 gets no response at all, as in Kafka.

use super::{count_errors, frame, HandlerResult, Reply, Versions};
use crate::acl::Operation;
use crate::core_state::Core;
use crate::kafka::errors::code_of;
use crate::kafka::session::Session;
use crate::partition::Partition;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use shards::batch::{self, BatchHeader};
use shards::producers::{is_idempotent, SequenceCheck};
use shards::{AppendOptions, InvalidBatch};
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::Produce,
    min: 3,
    max: 9,
};

/// The outcome of one partition, or the append it waits for.
enum Pending {
    Done(PartitionProduceResponse),
    /// The append and its bookkeeping run detached: a request cancelled mid-append (its client gone)
    /// still confirms or releases its producers' sequence numbers.
    Appending(glommio::task::JoinHandle<PartitionProduceResponse>),
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

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: ProduceRequest = decode(req)?;
    let acks = request.acks;
    let durable = acks == -1;
    // Everything up to the first await runs in request order, so pipelined produces are appended in
    // the order they were sent (idempotent producers depend on it).
    let mut topics: Vec<(StrBytes, Vec<Pending>)> = Vec::new();
    for t in request.topic_data {
        let name = t.name.0.clone();
        let mut parts = Vec::new();
        let writable = who.may_topic(core, Operation::Write, &name);
        let read_only = core
            .edge
            .as_ref()
            .map(|e| e.refuse_produce(&name, &who.peer));
        for p in t.partition_data {
            parts.push(if let Some(why) = &read_only {
                failed(
                    p.index,
                    ResponseError::TopicAuthorizationFailed,
                    Some(why.clone()),
                )
            } else if !writable {
                failed(p.index, ResponseError::TopicAuthorizationFailed, None)
            } else if request.transactional_id.is_some() {
                failed(
                    p.index,
                    ResponseError::TransactionalIdAuthorizationFailed,
                    Some("transactions are not supported".into()),
                )
            } else if !matches!(acks, -1..=1) {
                failed(p.index, ResponseError::InvalidRequiredAcks, None)
            } else {
                start_partition(core, &name, p.index, p.records, durable)
            });
        }
        topics.push((name, parts));
    }
    let mut responses = Vec::new();
    for (name, parts) in topics {
        let mut partition_responses = Vec::new();
        for p in parts {
            partition_responses.push(match p {
                Pending::Done(r) => r,
                Pending::Appending(task) => {
                    task.await.expect("a detached append runs to completion")
                }
            });
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(name.into())
                .with_partition_responses(partition_responses),
        );
    }
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
        &ProduceResponse::default().with_responses(responses),
    ))
}

fn start_partition(
    core: &Rc<Core>,
    topic: &str,
    index: i32,
    records: Option<bytes::Bytes>,
    durable: bool,
) -> Pending {
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
    // While view readers run on the log, what checking compressed batches decompresses is kept for
    // them (else they would decompress each batch again to split it).
    let keep = partition.log.keeps_decoded();
    let (headers, decoded) =
        match batch::validate_all_keeping(&blob, partition.log.max_batch_bytes(), keep) {
            Ok(h) => h,
            Err(e) => {
                let err = code_of(&shards::Error::InvalidBatch(e.clone()));
                return failed(index, err, Some(e.to_string()));
            }
        };
    // Compacted topics keep the latest record per key: records without one are refused.
    if let Err(e) = partition.log.check_keys(&blob, &headers) {
        log::debug!("produce to {topic}-{index} refused: {e}");
        let mut answer = error_response(index, code_of(&e).code(), Some(e.to_string()));
        // Which records (KIP-467): clients fail those with INVALID_RECORD and the rest of the
        // batch with a retriable error of their own.
        if let shards::Error::InvalidBatch(InvalidBatch::MissingKey { indexes }) = &e {
            answer.record_errors = indexes
                .iter()
                .map(|&i| BatchIndexAndErrorMessage::default().with_batch_index(i))
                .collect();
        }
        return Pending::Done(answer);
    }
    if let Some(done) = check_sequences(&partition, &headers, index) {
        return done;
    }
    // Queued now, in request order; only idempotent batches need their headers afterwards.
    let idempotent = if headers.iter().any(is_idempotent) {
        headers.clone()
    } else {
        Vec::new()
    };
    let append = partition
        .log
        .append_keeping(blob, headers, decoded, AppendOptions { durable });
    // A task of its own (the append is shared by the request's partitions), so outside the
    // request's `catch_unwind`: a panic finishing it answers this partition with an error instead
    // of taking the core down.
    let finished = std::panic::AssertUnwindSafe(async move {
        finish(index, &partition, &idempotent, append.await)
    });
    Pending::Appending(
        glommio::spawn_local(async move {
            use futures_lite::FutureExt;
            finished.catch_unwind().await.unwrap_or_else(|_| {
                log::error!("finishing a produce to partition {index} panicked");
                error_response(index, ResponseError::UnknownServerError.code(), None)
            })
        })
        .detach(),
    )
}

/// Checks idempotent batches, all or nothing: reserves their sequence numbers, or returns the answer
/// for the partition and leaves the producers' state as it was before the request.
fn check_sequences(partition: &Partition, headers: &[BatchHeader], index: i32) -> Option<Pending> {
    if !headers.iter().any(is_idempotent) {
        return None;
    }
    let mut states = partition.producers.borrow_mut();
    let (i, outcome) = states
        .check_and_reserve_all(headers, shards::now_ms())
        .err()?;
    Some(match outcome {
        SequenceCheck::Duplicate { base_offset } if headers.len() == 1 => Pending::Done(
            PartitionProduceResponse::default()
                .with_index(index)
                .with_base_offset(base_offset)
                .with_log_start_offset(partition.log.log_start_offset()),
        ),
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
            Some(format!(
                "expected sequence {expected}, got {}",
                headers[i].base_sequence
            )),
        ),
        SequenceCheck::Fenced => failed(index, ResponseError::InvalidProducerEpoch, None),
        SequenceCheck::UnknownProducer => failed(index, ResponseError::UnknownProducerId, None),
        SequenceCheck::Append => unreachable!("an accepted batch is not an error"),
    })
}

fn finish(
    index: i32,
    partition: &Partition,
    headers: &[BatchHeader],
    result: shards::Result<shards::AppendResult>,
) -> PartitionProduceResponse {
    let mut states = partition.producers.borrow_mut();
    match result {
        Ok(r) => {
            let now = shards::now_ms();
            let mut base = r.base_offset;
            for h in headers {
                if is_idempotent(h) {
                    states.confirm(h, base, now);
                }
                base += h.offset_count();
            }
            PartitionProduceResponse::default()
                .with_index(index)
                .with_base_offset(r.base_offset)
                .with_log_append_time_ms(r.log_append_time)
                .with_log_start_offset(r.log_start_offset)
        }
        Err(e) => {
            states.release_all(headers);
            error_response(index, code_of(&e).code(), Some(e.to_string()))
        }
    }
}
