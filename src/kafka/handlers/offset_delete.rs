//! OffsetDelete: a group's committed offsets of some partitions go (tombstones in the coordinator
//! core's offsets log), as Kafka's coordinator does it: not those of topics the members of a group
//! with members subscribe to (`GROUP_SUBSCRIBED_TO_TOPIC`), and nothing of a group with members
//! that is not a consumer group (`NON_EMPTY_GROUP`). DELETE on the group and READ on each topic.

use super::offset_commit::partition_exists;
use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetDeleteRequest, OffsetDeleteResponse};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::OffsetDelete,
    min: 0,
    max: 0,
};

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: OffsetDeleteRequest = decode(req)?;
    let group = request.group_id.0.as_str();
    // Each partition's own refusal (no READ, no such partition), in request order.
    let mut asked = Vec::new();
    for t in &request.topics {
        let readable = who.may_topic(core, Operation::Read, &t.name);
        for p in &t.partitions {
            let refusal = if !readable {
                Some(ResponseError::TopicAuthorizationFailed)
            } else if !partition_exists(core, &t.name, p.partition_index) {
                Some(ResponseError::UnknownTopicOrPartition)
            } else {
                None
            };
            asked.push(((t.name.to_string(), p.partition_index), refusal));
        }
    }
    let outcome = if who.may_group(core, Operation::Delete, &request.group_id) {
        let deletable = asked
            .iter()
            .filter(|(_, refusal)| refusal.is_none())
            .map(|(tp, _)| tp.clone())
            .collect();
        core.groups().delete_offsets(group, deletable).await
    } else {
        Err(ResponseError::GroupAuthorizationFailed)
    };
    let mut response = OffsetDeleteResponse::default();
    match outcome {
        Err(e) => response.error_code = e.code(),
        Ok(decided) => {
            let mut decided = decided.into_iter();
            let mut topics: Vec<OffsetDeleteResponseTopic> = Vec::new();
            for ((topic, index), refusal) in asked {
                let error = refusal.or_else(|| decided.next().flatten());
                let part = OffsetDeleteResponsePartition::default()
                    .with_partition_index(index)
                    .with_error_code(error.map_or(0, |e| e.code()));
                match topics.last_mut() {
                    Some(t) if t.name.as_str() == topic => t.partitions.push(part),
                    _ => topics.push(
                        OffsetDeleteResponseTopic::default()
                            .with_name(
                                kafka_protocol::protocol::StrBytes::from_string(topic).into(),
                            )
                            .with_partitions(vec![part]),
                    ),
                }
            }
            response.topics = topics;
        }
    }
    count_errors(
        core,
        req,
        std::iter::once(response.error_code).chain(
            response
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
        ),
    );
    Ok(frame(ApiKey::OffsetDelete, req, &response))
}
