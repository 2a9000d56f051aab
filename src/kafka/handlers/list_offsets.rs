//! ListOffsets: earliest (-2), latest (-1), the record with the largest timestamp (-3), or the first
//! offset at or after a timestamp. For read_committed (isolation level 1) the offsets end at the
//! last stable offset, as in Kafka: latest is it, and a record found by timestamp at or past it
//! is not there yet (-1). With no tiered storage, the earliest local offset (-4, v9+) is the earliest
//! and no offset is tiered (-5, v9+: -1), as Kafka answers for a topic without remote storage.
//! v10's `timeout_ms` bounds waits for remote storage, which shoal has none of.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::errors::code_of;
use crate::kafka::session::Session;
use crate::kafka::upstream;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ApiKey, ListOffsetsRequest, ListOffsetsResponse};
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::ListOffsets,
    min: 1,
    max: 10,
};

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const LATEST_TIERED: i64 = -5;

/// `request`, once the partitions it asks for that this core is still opening (just after a
/// start) are open: they are opened first.
async fn opened(core: &Core, request: ListOffsetsRequest) -> ListOffsetsRequest {
    core.wait_opening(request.topics.iter().flat_map(|t| {
        let name = t.name.0.to_string();
        t.partitions
            .iter()
            .map(move |p| (name.clone(), p.partition_index))
    }))
    .await;
    request
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request = opened(core, decode(req)?).await;
    let mut topics = Vec::new();
    for t in &request.topics {
        let name = t.name.0.to_string();
        let describable = who.may_topic(core, Operation::Describe, &name);
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let base =
                ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
            let timestamp = match p.timestamp {
                EARLIEST_LOCAL => EARLIEST,
                ts => ts,
            };
            // A view answers with its source's offsets (they are the same offsets).
            let found = if describable {
                core.local_partition(&name, p.partition_index)
            } else {
                Err(ResponseError::TopicAuthorizationFailed)
            };
            let (part, view) = match found {
                Ok((part, view)) => (part, view.is_some()),
                Err(err) => {
                    partitions.push(
                        base.with_error_code(err.code())
                            .with_offset(-1)
                            .with_timestamp(-1),
                    );
                    continue;
                }
            };
            let log = &part.log;
            if timestamp == LATEST_TIERED {
                partitions.push(base.with_offset(-1).with_timestamp(-1));
                continue;
            }
            // At the edge, the upstream answers (a view's offsets are its source's).
            let at_the_edge =
                upstream::list_offset(core, log, &part.topic, p.partition_index, timestamp, view)
                    .await;
            if let Some(answer) = at_the_edge {
                partitions.push(match answer {
                    Ok((offset, timestamp)) => base
                        .with_offset(offset)
                        .with_timestamp(timestamp)
                        .with_leader_epoch(if req.api_version >= 4 { 0 } else { -1 }),
                    Err(code) => base
                        .with_error_code(code)
                        .with_offset(-1)
                        .with_timestamp(-1),
                });
                continue;
            }
            let fetchable = if request.isolation_level == 1 {
                log.last_stable_offset()
            } else {
                log.high_watermark()
            };
            let found = match timestamp {
                LATEST => Ok(Some((fetchable, -1))),
                EARLIEST => Ok(Some((log.log_start_offset(), -1))),
                MAX_TIMESTAMP => match log.max_timestamp() {
                    Some(ts) => log.offset_for_timestamp(ts).await.map_err(Some),
                    None => Ok(None),
                },
                ts if ts >= 0 => log.offset_for_timestamp(ts).await.map_err(Some),
                _ => Err(None),
            };
            let found = match timestamp {
                LATEST | EARLIEST => found,
                _ => found.map(|f| f.filter(|&(offset, _)| offset < fetchable)),
            };
            partitions.push(match found {
                // leader_epoch exists from v4; older versions refuse to encode it.
                Ok(Some((offset, timestamp))) => base
                    .with_offset(offset)
                    .with_timestamp(timestamp)
                    .with_leader_epoch(if req.api_version >= 4 { 0 } else { -1 }),
                Ok(None) => base.with_offset(-1).with_timestamp(-1),
                Err(Some(e)) => base
                    .with_error_code(code_of(&e).code())
                    .with_offset(-1)
                    .with_timestamp(-1),
                Err(None) => base
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_offset(-1)
                    .with_timestamp(-1),
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
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
        ApiKey::ListOffsets,
        req,
        &ListOffsetsResponse::default().with_topics(topics),
    ))
}
