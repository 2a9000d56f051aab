//! OffsetCommit: checked against the group (member, generation; simple commits with generation -1
//! to a group without members), then written durably to the coordinator core's offsets log and
//! answered once fsynced. `retention_time_ms` (v2-4) is ignored: offsets live until their group is
//! deleted.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::offsets::Committed;
use crate::groups::MAX_OFFSET_METADATA_BYTES;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};
use shards::now_ms;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::OffsetCommit,
    min: 2,
    max: 9,
};

/// Whether `topic`/`partition` exists (a view's partitions are its source's).
pub fn partition_exists(core: &Core, topic: &str, partition: i32) -> bool {
    core.data_owner(topic, partition).is_some()
}

/// Each partition's error code, per topic in request order: its own refusal, else the store's
/// failure to write the batch of commits (if it failed); counted in the error metrics.
pub fn outcomes(
    core: &Core,
    req: &Request,
    results: Vec<Vec<(i32, Option<ResponseError>)>>,
    written: Result<(), ResponseError>,
) -> Vec<Vec<(i32, i16)>> {
    let codes: Vec<Vec<(i32, i16)>> = results
        .into_iter()
        .map(|parts| {
            parts
                .into_iter()
                .map(|(index, error)| (index, error.or(written.err()).map_or(0, |e| e.code())))
                .collect()
        })
        .collect();
    count_errors(core, req, codes.iter().flatten().map(|(_, code)| *code));
    codes
}

/// Why the commit of one partition's offset is refused, if it is (OffsetCommit and
/// TxnOffsetCommit alike): the group's check failed, no READ on the topic, no such partition, or
/// metadata too large.
pub fn refusal<T>(
    core: &Core,
    who: &Session,
    checked: &Result<T, ResponseError>,
    topic: &str,
    partition: i32,
    metadata: Option<&str>,
) -> Option<ResponseError> {
    match checked {
        Err(e) => Some(*e),
        Ok(_) if !who.may_topic(core, Operation::Read, topic) => {
            Some(ResponseError::TopicAuthorizationFailed)
        }
        Ok(_) if !partition_exists(core, topic, partition) => {
            Some(ResponseError::UnknownTopicOrPartition)
        }
        Ok(_) if metadata.is_some_and(|m| m.len() > MAX_OFFSET_METADATA_BYTES) => {
            Some(ResponseError::OffsetMetadataTooLarge)
        }
        Ok(_) => None,
    }
}

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: OffsetCommitRequest = decode(req)?;
    let v = req.api_version;
    let instance = request
        .group_instance_id
        .as_ref()
        .filter(|_| v >= 7)
        .map(|s| s.to_string());
    let checked = if who.may_group(core, Operation::Read, &request.group_id) {
        core.groups().check_commit(
            &request.group_id,
            &request.member_id,
            instance.as_deref(),
            request.generation_id_or_member_epoch,
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
                    Committed {
                        offset: p.committed_offset,
                        leader_epoch: if v >= 6 { p.committed_leader_epoch } else { -1 },
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                        commit_timestamp: now,
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
                .commit(&store, &request.group_id, to_write)
                .await
        }
        _ => Ok(()),
    };
    let topics: Vec<OffsetCommitResponseTopic> = request
        .topics
        .iter()
        .zip(outcomes(core, req, results, written))
        .map(|(t, parts)| {
            let parts = parts.into_iter().map(|(index, code)| {
                OffsetCommitResponsePartition::default()
                    .with_partition_index(index)
                    .with_error_code(code)
            });
            OffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(parts.collect())
        })
        .collect();
    Ok(frame(
        ApiKey::OffsetCommit,
        req,
        &OffsetCommitResponse::default().with_topics(topics),
    ))
}
