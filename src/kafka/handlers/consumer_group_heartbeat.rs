//! ConsumerGroupHeartbeat (KIP-848): a member of a consumer-protocol group joins, heartbeats,
//! reconciles and leaves through it; the group coordinator core decides (see
//! [`crate::groups::consumer`]). READ on the group, and DESCRIBE on every topic subscribed to by
//! name (`TOPIC_AUTHORIZATION_FAILED` otherwise, as Kafka answers); a regular expression matches
//! only topics the member may describe. Assignments name topics by id, as the topic table has
//! them.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::consumer::{Assignment, Heartbeat, Topics};
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment as Assigned, TopicPartitions,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::ConsumerGroupHeartbeat,
    min: 0,
    max: 1,
};

/// Most partitions a member may report owning in one heartbeat: more than any assignment gets.
const MAX_OWNED: usize = 1 << 20;

/// Every topic of the table the member may describe, by name, as subscriptions (regular
/// expressions too) and assignments see them.
pub fn topics_view(core: &Core, who: &Session) -> Topics {
    let checked = core.config().authorizer.enabled;
    core.topics()
        .topics
        .iter()
        .filter(|(name, _)| !checked || who.may_topic(core, Operation::Describe, name))
        .map(|(name, meta)| {
            (
                name.clone(),
                (uuid::Uuid::from_bytes(meta.id), meta.partitions),
            )
        })
        .collect()
}

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let r: ConsumerGroupHeartbeatRequest = decode(req)?;
    let group = r.group_id.0.to_string();
    let answer = if !who.may_group(core, Operation::Read, &group) {
        Err((ResponseError::GroupAuthorizationFailed, String::new()))
    } else if let Some(t) = r
        .subscribed_topic_names
        .iter()
        .flatten()
        .find(|t| !who.may_topic(core, Operation::Describe, t))
    {
        Err((
            ResponseError::TopicAuthorizationFailed,
            format!("not authorized to describe topic {}", t.0),
        ))
    } else {
        match heartbeat_of(req, who, r) {
            Ok(mut hb) => {
                // Without ACLs every member sees the whole table, known by its revision.
                hb.topics_revision =
                    (!core.config().authorizer.enabled).then(|| core.topics().revision);
                core.groups()
                    .consumer_heartbeat(&group, hb, &topics_view(core, who))
            }
            Err(why) => Err((ResponseError::InvalidRequest, why)),
        }
    };
    let response = match answer {
        Ok(a) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(StrBytes::from_string(a.member_id)))
            .with_member_epoch(a.member_epoch)
            .with_heartbeat_interval_ms(a.heartbeat_interval_ms)
            .with_assignment(a.assignment.map(|a| {
                Assigned::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(id, parts)| {
                            TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(parts.into_iter().collect())
                        })
                        .collect(),
                )
            })),
        Err((e, why)) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_error_message((!why.is_empty()).then(|| StrBytes::from_string(why)))
            .with_member_epoch(-1),
    };
    count_errors(core, req, [response.error_code]);
    Ok(frame(ApiKey::ConsumerGroupHeartbeat, req, &response))
}

/// The request as the coordinator takes it; `Err` for what no member may send.
fn heartbeat_of(
    req: &Request,
    who: &Session,
    r: ConsumerGroupHeartbeatRequest,
) -> Result<Heartbeat, String> {
    let owned: Option<Assignment> = match r.topic_partitions {
        None => None,
        Some(tps) => {
            let count: usize = tps.iter().map(|t| t.partitions.len()).sum();
            if count > MAX_OWNED {
                return Err(format!(
                    "{count} owned partitions are more than any member has"
                ));
            }
            Some(
                tps.into_iter()
                    .map(|t| (t.topic_id, t.partitions.into_iter().collect()))
                    .collect(),
            )
        }
    };
    let s = |v: Option<StrBytes>| v.map(|v| v.to_string());
    Ok(Heartbeat {
        version: req.api_version,
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        instance_id: s(r.instance_id),
        rack_id: s(r.rack_id),
        rebalance_timeout_ms: r.rebalance_timeout_ms,
        subscribed_names: r
            .subscribed_topic_names
            .map(|names| names.into_iter().map(|n| n.0.to_string()).collect()),
        subscribed_regex: s(r.subscribed_topic_regex),
        server_assignor: s(r.server_assignor),
        owned,
        topics_revision: None,
        client_id: req
            .header
            .client_id
            .as_ref()
            .map_or_else(String::new, |c| c.to_string()),
        client_host: who.peer.to_string(),
    })
}
