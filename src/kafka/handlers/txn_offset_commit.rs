//! TxnOffsetCommit (KIP-98; v3 adds KIP-447's member id, generation and instance id): a
//! transactional producer's consumed offsets, written durably to the group's coordinator core as
//! *pending* offsets of its producer id and answered once fsynced. They become committed offsets
//! when the transaction commits (`Coordinator::end_transaction`, on the transaction
//! coordinator's marker) and are dropped when it aborts; until then OffsetFetch does not show
//! them, and with `require_stable` answers `UNSTABLE_OFFSET_COMMIT` for their partitions.
//!
//! Not checked here: that the transaction added this group (AddOffsetsToTxn; that state is on the
//! transaction coordinator's core, and Kafka does not check it before v5 either).

use super::offset_commit::{outcomes, refusal};
use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::offsets::{Committed, PendingOffset};
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use shards::now_ms;

/// v4 and v5 (KIP-890) are left out: v5 asks the broker to add the group to the transaction
/// itself, which is the transaction coordinator's state.
pub const VERSIONS: Versions = Versions {
    key: ApiKey::TxnOffsetCommit,
    min: 0,
    max: 3,
};

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: TxnOffsetCommitRequest = decode(req)?;
    let v = req.api_version;
    // Before v3 a request names no member: the old clients' "-1 and no member id".
    let (generation, member, instance) = if v >= 3 {
        (
            request.generation_id,
            request.member_id.as_str(),
            request.group_instance_id.as_deref(),
        )
    } else {
        (-1, "", None)
    };
    let checked = if !who.may_transactional_id(core, Operation::Write, &request.transactional_id) {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    } else if who.may_group(core, Operation::Read, &request.group_id) {
        core.groups().check_txn_commit(
            &request.group_id,
            member,
            instance,
            generation,
            (request.producer_id.0, request.producer_epoch),
        )
    } else {
        Err(ResponseError::GroupAuthorizationFailed)
    };
    // Per partition: its error, or None while it is to be written.
    let mut results: Vec<Vec<(i32, Option<ResponseError>)>> = Vec::new();
    let mut to_write = Vec::new();
    let now = now_ms();
    for t in &request.topics {
        let mut parts = Vec::new();
        for p in &t.partitions {
            let metadata = p.committed_metadata.as_deref();
            let error = refusal(core, who, &checked, &t.name, p.partition_index, metadata);
            if error.is_none() {
                to_write.push((
                    (t.name.to_string(), p.partition_index),
                    PendingOffset {
                        producer_epoch: request.producer_epoch,
                        value: Committed {
                            offset: p.committed_offset,
                            leader_epoch: if v >= 2 { p.committed_leader_epoch } else { -1 },
                            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                            commit_timestamp: now,
                        },
                    },
                ));
            }
            parts.push((p.partition_index, error));
        }
        results.push(parts);
    }
    let written = match checked {
        Ok(store) if !to_write.is_empty() => {
            core.groups()
                .txn_commit(&store, &request.group_id, request.producer_id.0, to_write)
                .await
        }
        _ => Ok(()),
    };
    let topics: Vec<TxnOffsetCommitResponseTopic> = request
        .topics
        .iter()
        .zip(outcomes(core, req, results, written))
        .map(|(t, parts)| {
            let parts = parts.into_iter().map(|(index, code)| {
                TxnOffsetCommitResponsePartition::default()
                    .with_partition_index(index)
                    .with_error_code(code)
            });
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(parts.collect())
        })
        .collect();
    Ok(frame(
        ApiKey::TxnOffsetCommit,
        req,
        &TxnOffsetCommitResponse::default().with_topics(topics),
    ))
}
