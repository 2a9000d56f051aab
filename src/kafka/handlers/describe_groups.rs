//! DescribeGroups: state, protocol and members (with their metadata and assignments) of groups this
//! core coordinates. An unknown group is described as `Dead` with no error, as Kafka does.

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
