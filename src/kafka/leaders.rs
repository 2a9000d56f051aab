//! KIP-951: a partition answered `NOT_LEADER_OR_FOLLOWER` (Fetch v16+, Produce v10+) names its
//! current leader, the core that owns it (at leader epoch 0, as Metadata tells it), and the response
//! carries that core's endpoint on the client's listener, so the client goes there without asking
//! Metadata first.

use crate::cores::Core;
use crate::kafka::session::Session;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{
    LeaderIdAndEpoch, NodeEndpoint, TopicProduceResponse,
};
use kafka_protocol::messages::BrokerId;
use kafka_protocol::protocol::StrBytes;

/// The core leading `topic`'s partition `index` (a view's: its source's), if both exist.
pub fn leader_of(core: &Core, topic: &str, index: i32) -> Option<i32> {
    let owner = core.data_owner(topic, index);
    owner.and_then(|c| i32::try_from(c).ok())
}

/// Where the client reaches core `node` on its own listener: (host, port).
pub fn endpoint<'a>(core: &'a Core, who: &Session, node: i32) -> Option<(&'a str, i32)> {
    let ports = &core.cluster.listeners.get(who.listener)?.ports;
    let port = *ports.get(usize::try_from(node).ok()?)?;
    Some((core.cluster.advertised_host.as_str(), i32::from(port)))
}

/// Produce v10+: each partition answered `NOT_LEADER_OR_FOLLOWER` gets its current leader; the
/// answer is those leaders' endpoints, for the response's `node_endpoints`.
pub fn mark_produce(
    core: &Core,
    who: &Session,
    version: i16,
    topics: &mut [TopicProduceResponse],
) -> Vec<NodeEndpoint> {
    let mut endpoints: Vec<NodeEndpoint> = Vec::new();
    if version < 10 {
        return endpoints;
    }
    let not_leader = ResponseError::NotLeaderOrFollower.code();
    for t in topics.iter_mut() {
        let name = t.name.0.as_str();
        for p in t.partition_responses.iter_mut() {
            if p.error_code != not_leader {
                continue;
            }
            let Some(leader) = leader_of(core, name, p.index) else {
                continue;
            };
            let Some((host, port)) = endpoint(core, who, leader) else {
                continue;
            };
            p.current_leader = LeaderIdAndEpoch::default()
                .with_leader_id(BrokerId(leader))
                .with_leader_epoch(0);
            if !endpoints.iter().any(|e| e.node_id.0 == leader) {
                endpoints.push(
                    NodeEndpoint::default()
                        .with_node_id(BrokerId(leader))
                        .with_host(StrBytes::from_string(host.to_string()))
                        .with_port(port)
                        .with_rack(None),
                );
            }
        }
    }
    endpoints
}
