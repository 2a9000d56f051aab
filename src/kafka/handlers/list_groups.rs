//! ListGroups: the groups this core coordinates (clients ask every broker, as with Kafka), filtered
//! by state from v4 and by type from v5 (`classic`, or `consumer` for the consumer group
//! protocol's groups, whose states are Empty, Assigning, Reconciling and Stable).

use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{ApiKey, GroupId, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::ListGroups,
    min: 0,
    max: 5,
};

/// The group types (KIP-848): the classic protocol's, and the consumer group protocol's.
const CLASSIC: &str = "classic";
const CONSUMER: &str = "consumer";

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: ListGroupsRequest = decode(req)?;
    let v = req.api_version;
    // DESCRIBE on the cluster lists every group; else those the client may describe.
    let all = who.may_cluster(core, Operation::Describe);
    let wanted = |consumer_protocol: bool| {
        let kind = if consumer_protocol { CONSUMER } else { CLASSIC };
        v < 5
            || request.types_filter.is_empty()
            || request
                .types_filter
                .iter()
                .any(|t| t.eq_ignore_ascii_case(kind))
    };
    let groups = core
        .groups()
        .list()
        .into_iter()
        .filter(|g| wanted(g.consumer_protocol))
        .filter(|g| all || who.may_group(core, Operation::Describe, &g.id))
        .filter(|g| {
            v < 4
                || request.states_filter.is_empty()
                || request
                    .states_filter
                    .iter()
                    .any(|f| f.eq_ignore_ascii_case(g.state))
        })
        .map(|g| {
            let kind = if g.consumer_protocol {
                CONSUMER
            } else {
                CLASSIC
            };
            let listed = ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(g.id)))
                .with_protocol_type(StrBytes::from_string(g.protocol_type));
            let listed = if v >= 4 {
                listed.with_group_state(StrBytes::from_static_str(g.state))
            } else {
                listed
            };
            if v >= 5 {
                listed.with_group_type(StrBytes::from_static_str(kind))
            } else {
                listed
            }
        })
        .collect();
    Ok(frame(
        ApiKey::ListGroups,
        req,
        &ListGroupsResponse::default().with_groups(groups),
    ))
}
