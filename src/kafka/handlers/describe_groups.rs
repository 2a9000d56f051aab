//! DescribeGroups: state, protocol and members (with their metadata and assignments) of groups this
//! core coordinates. An unknown group is described as `Dead` with no error, as Kafka does. A
//! consumer-protocol group (KIP-848) is described as a classic consumer group would be: protocol
//! type `consumer`, its assignor as the protocol, each member's subscription and assignment in the
//! consumer protocol's encoding.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::group::GroupState;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{ApiKey, DescribeGroupsRequest, DescribeGroupsResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DescribeGroups,
    min: 0,
    max: 5,
};

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: DescribeGroupsRequest = decode(req)?;
    let v = req.api_version;
    let groups: Vec<DescribedGroup> = request
        .groups
        .iter()
        .map(|id| {
            let base = DescribedGroup::default().with_group_id(id.clone());
            let allowed = if who.may_group(core, Operation::Describe, id) {
                Ok(())
            } else {
                Err(kafka_protocol::error::ResponseError::GroupAuthorizationFailed)
            };
            if let Err(e) = allowed.and_then(|()| core.groups().check(id)) {
                return base
                    .with_error_code(e.code())
                    .with_group_state(StrBytes::from_static_str(GroupState::Dead.name()));
            }
            if let Some(g) = core
                .groups()
                .with_consumer_group(id, |g| consumer_group(core, base.clone(), g, v))
            {
                return g;
            }
            core.groups()
                .with_group(id, |g| {
                    base.clone()
                        .with_group_state(StrBytes::from_static_str(g.state().name()))
                        .with_protocol_type(StrBytes::from_string(
                            g.protocol_type().unwrap_or("").to_string(),
                        ))
                        .with_protocol_data(StrBytes::from_string(
                            g.protocol().unwrap_or("").to_string(),
                        ))
                        .with_members(
                            g.members()
                                .into_iter()
                                .map(|m| {
                                    DescribedGroupMember::default()
                                        .with_member_id(StrBytes::from_string(m.member_id))
                                        .with_group_instance_id(
                                            m.instance_id
                                                .filter(|_| v >= 4)
                                                .map(StrBytes::from_string),
                                        )
                                        .with_client_id(StrBytes::from_string(m.client_id))
                                        .with_client_host(StrBytes::from_string(m.client_host))
                                        .with_member_metadata(m.metadata)
                                        .with_member_assignment(m.assignment)
                                })
                                .collect(),
                        )
                })
                .unwrap_or_else(|| {
                    base.clone()
                        .with_group_state(StrBytes::from_static_str(GroupState::Dead.name()))
                })
        })
        .collect();
    count_errors(core, req, groups.iter().map(|g| g.error_code));
    Ok(frame(
        ApiKey::DescribeGroups,
        req,
        &DescribeGroupsResponse::default().with_groups(groups),
    ))
}

/// A consumer-protocol group in DescribeGroups' terms.
fn consumer_group(
    core: &Core,
    base: DescribedGroup,
    g: &crate::groups::consumer::ConsumerGroup,
    v: i16,
) -> DescribedGroup {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::{
        ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
    };
    use kafka_protocol::protocol::Encodable;
    /// The consumer protocol's version of both encodings here.
    const VERSION: i16 = 3;
    let encode = |body: &dyn Fn(&mut bytes::BytesMut)| {
        let mut b = bytes::BytesMut::new();
        bytes::BufMut::put_i16(&mut b, VERSION);
        body(&mut b);
        b.freeze()
    };
    let members = g
        .members()
        .map(|m| {
            let subscription = ConsumerProtocolSubscription::default().with_topics(
                m.names
                    .iter()
                    .map(|n| StrBytes::from_string(n.clone()))
                    .collect(),
            );
            let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(
                m.assigned
                    .iter()
                    .map(|(id, parts)| {
                        TopicPartition::default()
                            .with_topic(TopicName(
                                core.topic_name(id.as_bytes()).unwrap_or_default(),
                            ))
                            .with_partitions(parts.iter().copied().collect())
                    })
                    .collect(),
            );
            DescribedGroupMember::default()
                .with_member_id(StrBytes::from_string(m.id.clone()))
                .with_group_instance_id(
                    m.instance_id
                        .clone()
                        .filter(|_| v >= 4)
                        .map(StrBytes::from_string),
                )
                .with_client_id(StrBytes::from_string(m.client_id.clone()))
                .with_client_host(StrBytes::from_string(m.client_host.clone()))
                .with_member_metadata(encode(&|b| {
                    let _ = subscription.encode(b, VERSION);
                }))
                .with_member_assignment(encode(&|b| {
                    let _ = assignment.encode(b, VERSION);
                }))
        })
        .collect();
    base.with_group_state(StrBytes::from_static_str(g.state().name()))
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocol_data(StrBytes::from_static_str(g.assignor))
        .with_members(members)
}
