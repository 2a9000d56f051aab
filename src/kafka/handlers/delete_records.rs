//! DeleteRecords: moves each partition's log start offset up to the offset asked (-1: the high
//! watermark), on the partition's owner core, as Kafka's leader does. Reads, ListOffsets' earliest,
//! read replicas and views follow at once; whole segments below go. The answer is the log start
//! offset after it (`low_watermark`). `timeout_ms` bounds a wait for followers, which shoal has
//! none of. Refused with POLICY_VIOLATION, as Kafka refuses it, on a topic whose `cleanup.policy`
//! lacks `delete`; and through a view (its records are its source's) or at the edge (which only
//! mirrors its upstream).

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::errors::code_of;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse};
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DeleteRecords,
    min: 0,
    max: 2,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: DeleteRecordsRequest = decode(req)?;
    let mut topics = Vec::new();
    for t in &request.topics {
        let name = t.name.0.to_string();
        let deletable = who.may_topic(core, Operation::Delete, &name);
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let answer = if deletable {
                delete_one(core, &name, p.partition_index, p.offset, &who.peer).await
            } else {
                Err(ResponseError::TopicAuthorizationFailed.code())
            };
            let base =
                DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            partitions.push(match answer {
                Ok(low_watermark) => base.with_low_watermark(low_watermark),
                Err(code) => base.with_low_watermark(-1).with_error_code(code),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name.clone())
                .with_partitions(partitions),
        );
    }
    count_errors(
        core,
        req,
        topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
    );
    Ok(frame(
        ApiKey::DeleteRecords,
        req,
        &DeleteRecordsResponse::default().with_topics(topics),
    ))
}

/// One partition's deletion: its log start offset after it, or the error code.
async fn delete_one(
    core: &Core,
    topic: &str,
    index: i32,
    offset: i64,
    peer: &str,
) -> Result<i64, i16> {
    let (part, view) = core.local_partition(topic, index).map_err(|e| e.code())?;
    if !part.log.config().cleanup_delete {
        log::warn!(
            "refused DeleteRecords of {topic}/{index} from {peer}: a compacted topic \
             (cleanup.policy without delete) keeps its records"
        );
        return Err(ResponseError::PolicyViolation.code());
    }
    if view.is_some() || core.is_edge() {
        log::warn!(
            "refused DeleteRecords of {topic}/{index} from {peer}: {}",
            if view.is_some() {
                "a view's records are its source topic's"
            } else {
                "shoal edge only mirrors its upstream cluster"
            }
        );
        return Err(ResponseError::PolicyViolation.code());
    }
    part.log
        .delete_records(offset)
        .await
        .map_err(|e| code_of(&e).code())
}
