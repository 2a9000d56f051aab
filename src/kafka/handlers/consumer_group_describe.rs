//! ConsumerGroupDescribe (KIP-848): a consumer-protocol group's epochs, assignor and members, each
//! with its subscription, its assignment and its target. A classic group is
//! `GROUP_ID_NOT_FOUND` ("not a consumer group"), as Kafka answers, so admin clients describe it
//! with DescribeGroups instead. DESCRIBE on the group.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::consumer::{Assignment, ConsumerGroup};
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as Described, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::ConsumerGroupDescribe,
    min: 0,
    max: 1,
};

/// `authorized_operations` when the client did not ask for them.
const NOT_ASKED: i32 = i32::MIN;
/// A member of the consumer protocol (`member_type`, v1).
const CONSUMER_MEMBER: i8 = 1;

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let r: ConsumerGroupDescribeRequest = decode(req)?;
    let groups: Vec<DescribedGroup> = r
        .group_ids
        .iter()
        .map(|id| {
            let base = DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(NOT_ASKED);
            let refused = |e: ResponseError, why: String| {
                base.clone()
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(why)))
                    .with_group_state(StrBytes::from_static_str("Dead"))
            };
            if !who.may_group(core, Operation::Describe, id) {
                return refused(ResponseError::GroupAuthorizationFailed, String::new());
            }
            if let Err(e) = core.groups().check(id) {
                return refused(e, String::new());
            }
            let described = core
                .groups()
                .with_consumer_group(id, |g| describe(core, base.clone(), g));
            described.unwrap_or_else(|| {
                let why = if core.groups().exists(id) {
                    format!("Group {} is not a consumer group.", id.0)
                } else {
                    format!("Group {} not found.", id.0)
                };
                refused(ResponseError::GroupIdNotFound, why)
            })
        })
        .collect();
    count_errors(core, req, groups.iter().map(|g| g.error_code));
    Ok(frame(
        ApiKey::ConsumerGroupDescribe,
        req,
        &ConsumerGroupDescribeResponse::default().with_groups(groups),
    ))
}

fn describe(core: &Core, base: DescribedGroup, g: &ConsumerGroup) -> DescribedGroup {
    let s = |v: &str| StrBytes::from_string(v.to_string());
    let members = g
        .members()
        .map(|m| {
            Member::default()
                .with_member_id(s(&m.id))
                .with_instance_id(m.instance_id.as_deref().map(s))
                .with_rack_id(m.rack_id.as_deref().map(s))
                .with_member_epoch(m.epoch)
                .with_client_id(s(&m.client_id))
                .with_client_host(s(&m.client_host))
                .with_subscribed_topic_names(m.names.iter().map(|n| TopicName(s(n))).collect())
                .with_subscribed_topic_regex(m.regex.as_deref().map(s))
                .with_assignment(assignment(core, &m.assigned))
                .with_target_assignment(assignment(core, &g.target_of(&m.id)))
                .with_member_type(CONSUMER_MEMBER)
        })
        .collect();
    base.with_group_state(StrBytes::from_static_str(g.state().name()))
        .with_group_epoch(g.group_epoch)
        .with_assignment_epoch(g.assignment_epoch)
        .with_assignor_name(StrBytes::from_static_str(g.assignor))
        .with_members(members)
}

/// An assignment with each topic's name as the topic table has it now.
fn assignment(core: &Core, a: &Assignment) -> Described {
    Described::default().with_topic_partitions(
        a.iter()
            .map(|(id, parts)| {
                let name = core.topic_name(id.as_bytes()).unwrap_or_default();
                TopicPartitions::default()
                    .with_topic_id(*id)
                    .with_topic_name(TopicName(name))
                    .with_partitions(parts.iter().copied().collect())
            })
            .collect(),
    )
}
