//! ListGroups: the groups this core coordinates (clients ask every broker, as with Kafka), filtered
//! by state from v4 and by type from v5 (every group here is of the classic type).

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

/// The one group type shoal serves (KIP-848's types: classic, consumer).
const CLASSIC: &str = "classic";

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: ListGroupsRequest = decode(req)?;
    let v = req.api_version;
    // DESCRIBE on the cluster lists every group; else those the client may describe.
    let all = who.may_cluster(core, Operation::Describe);
    let classic_wanted = v < 5
        || request.types_filter.is_empty()
        || request
            .types_filter
            .iter()
            .any(|t| t.eq_ignore_ascii_case(CLASSIC));
    let groups = core
        .groups()
        .list()
        .into_iter()
        .filter(|_| classic_wanted)
        .filter(|(id, _, _)| all || who.may_group(core, Operation::Describe, id))
        .filter(|(_, _, state)| {
            v < 4
                || request.states_filter.is_empty()
                || request
                    .states_filter
                    .iter()
                    .any(|f| f.eq_ignore_ascii_case(state.name()))
        })
        .map(|(id, protocol_type, state)| {
            let g = ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(id)))
                .with_protocol_type(StrBytes::from_string(protocol_type));
            let g = if v >= 4 {
                g.with_group_state(StrBytes::from_static_str(state.name()))
            } else {
                g
            };
            if v >= 5 {
                g.with_group_type(StrBytes::from_static_str(CLASSIC))
            } else {
                g
            }
        })
        .collect();
    Ok(frame(
        ApiKey::ListGroups,
        req,
        &ListGroupsResponse::default().with_groups(groups),
    ))
}
