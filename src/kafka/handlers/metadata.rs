//! Metadata: one broker per core, every partition led by the core that owns it. Topics asked for and
//! missing are created when auto-creation is on. From v12 a topic may be asked for by id instead of
//! by name (KIP-516); an id no topic has is answered `UNKNOWN_TOPIC_ID`.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::control::{self, NewTopic, TopicChange};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::table::{parse_view_name, source_topic, validate_topic_name, view_topic_id};
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::rc::Rc;
use uuid::Uuid;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::Metadata,
    min: 0,
    max: 13,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: MetadataRequest = decode(req)?;
    let (by_id, unknown_ids) = by_id(core, req.api_version, &request);
    // v0: an empty list means all topics; v1+: null means all, empty means none.
    let wanted: Option<Vec<String>> = match &request.topics {
        None => None,
        Some(t) if t.is_empty() && req.api_version == 0 => None,
        Some(t) => Some(
            t.iter()
                .filter(|t| !asked_by_id(req.api_version, t))
                .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
                .collect(),
        ),
    };
    let auto_create = core.config().auto_create_topics
        && (req.api_version < 4 || request.allow_auto_topic_creation);
    if let (Some(names), true) = (&wanted, auto_create) {
        create_missing(core, who, names).await;
    }
    let table = core.topics();
    // All topics: those the client may describe; named ones it may not: refused by name.
    let names: Vec<String> = wanted.map_or_else(
        || {
            table
                .topics
                .keys()
                .filter(|n| who.may_topic(core, Operation::Describe, n))
                .cloned()
                .collect()
        },
        |named| {
            named
                .into_iter()
                .chain(by_id.iter().map(|(n, _)| n.clone()))
                .collect()
        },
    );
    let mut topics: Vec<MetadataResponseTopic> = names
        .iter()
        .map(|name| {
            let topic = MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
            if !who.may_topic(core, Operation::Describe, name) {
                // Asked for by id: the name is not told to a client that may not see it.
                let topic = match by_id.iter().find(|(n, _)| n == name) {
                    Some(&(_, id)) => topic.with_name(None).with_topic_id(id),
                    None => topic,
                };
                return topic.with_error_code(ResponseError::TopicAuthorizationFailed.code());
            }
            // A view `<source>.shard-<i>-of-<n>` exists whenever its source does, with the source's
            // partitions and leaders.
            let (meta, id) = match parse_view_name(name) {
                Some(Err(_)) => {
                    return topic.with_error_code(ResponseError::InvalidTopicException.code())
                }
                Some(Ok(view)) => match table.get(&view.source) {
                    Some(m) => (m, view_topic_id(m.id, &view)),
                    None => {
                        return topic.with_error_code(ResponseError::UnknownTopicOrPartition.code())
                    }
                },
                None => match table.get(name) {
                    Some(m) => (m, m.id),
                    None => {
                        let err = if validate_topic_name(name).is_err() {
                            ResponseError::InvalidTopicException
                        } else {
                            ResponseError::UnknownTopicOrPartition
                        };
                        return topic.with_error_code(err.code());
                    }
                },
            };
            let source = source_topic(name).unwrap_or(name);
            let partitions = (0..meta.partitions)
                .map(|p| {
                    let leader = BrokerId(table.owner(meta, p, core.cores()) as i32);
                    // The leader first, then the cores holding read replicas of it (in sync:
                    // they serve only what the leader has).
                    let replicas: Vec<BrokerId> = std::iter::once(leader)
                        .chain(
                            core.replicas
                                .replica_cores(source, p)
                                .into_iter()
                                .map(BrokerId),
                        )
                        .collect();
                    MetadataResponsePartition::default()
                        .with_partition_index(p)
                        .with_leader_id(leader)
                        .with_leader_epoch(0)
                        .with_replica_nodes(replicas.clone())
                        .with_isr_nodes(replicas)
                })
                .collect();
            topic
                .with_topic_id(uuid::Uuid::from_bytes(id))
                .with_partitions(partitions)
        })
        .collect();
    topics.extend(unknown_ids.into_iter().map(|id| {
        MetadataResponseTopic::default()
            .with_name(None)
            .with_topic_id(id)
            .with_error_code(ResponseError::UnknownTopicId.code())
    }));
    count_errors(core, req, topics.iter().map(|t| t.error_code));
    if req.api_version >= 8 && request.include_topic_authorized_operations {
        for t in topics.iter_mut().filter(|t| t.error_code == 0) {
            let name = t.name.clone().unwrap_or_default();
            t.topic_authorized_operations =
                authorized(&TOPIC_OPERATIONS, |op| who.may_topic(core, op, &name));
        }
    }
    // Asked for in v8-10 (later versions have DescribeCluster for it); else "not asked".
    let cluster_operations =
        if (8..=10).contains(&req.api_version) && request.include_cluster_authorized_operations {
            authorized(&CLUSTER_OPERATIONS, |op| who.may_cluster(core, op))
        } else {
            i32::MIN
        };
    let brokers = (0..core.cores())
        .map(|i| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(i as i32))
                .with_host(StrBytes::from_string(core.cluster.advertised_host.clone()))
                .with_port(core.cluster.listeners[who.listener].ports[i] as i32)
        })
        .collect();
    let response = MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_static_str("shoal")))
        .with_controller_id(BrokerId(0))
        .with_cluster_authorized_operations(cluster_operations)
        .with_topics(topics);
    Ok(frame(ApiKey::Metadata, req, &response))
}

/// What Kafka lists among a topic's authorized operations (KIP-430).
const TOPIC_OPERATIONS: [Operation; 8] = [
    Operation::Read,
    Operation::Write,
    Operation::Create,
    Operation::Delete,
    Operation::Alter,
    Operation::Describe,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];

/// What Kafka lists among the cluster's authorized operations (KIP-430).
const CLUSTER_OPERATIONS: [Operation; 7] = [
    Operation::Create,
    Operation::Alter,
    Operation::Describe,
    Operation::ClusterAction,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
    Operation::IdempotentWrite,
];

/// The operations of `ops` the client may perform, as KIP-430's bit field (bit n: operation code n).
fn authorized(ops: &[Operation], may: impl Fn(Operation) -> bool) -> i32 {
    ops.iter()
        .filter(|&&op| may(op))
        .fold(0, |bits, &op| bits | 1 << (op as i32))
}

/// Whether a topic is asked for by id: from v12, with an id and no name (or an empty one).
fn asked_by_id(version: i16, t: &MetadataRequestTopic) -> bool {
    version >= 12 && !t.topic_id.is_nil() && t.name.as_ref().is_none_or(|n| n.is_empty())
}

/// The topics asked for by id: (name, id) of those that exist, and the ids no topic has.
fn by_id(core: &Core, version: i16, request: &MetadataRequest) -> (Vec<(String, Uuid)>, Vec<Uuid>) {
    let mut found = Vec::new();
    let mut unknown = Vec::new();
    for t in request
        .topics
        .iter()
        .flatten()
        .filter(|t| asked_by_id(version, t))
    {
        match core.topic_name(t.topic_id.as_bytes()) {
            Some(name) => found.push((name.to_string(), t.topic_id)),
            None => unknown.push(t.topic_id),
        }
    }
    (found, unknown)
}

/// Auto-creation: creates the topics named that do not exist and the client may create.
async fn create_missing(core: &Rc<Core>, who: &Session, names: &[String]) {
    let missing: Vec<NewTopic> = names
        .iter()
        .filter(|n| {
            core.topics().get(n).is_none()
                && validate_topic_name(n).is_ok()
                && !control::is_view_name(n)
                && (who.may_cluster(core, Operation::Create)
                    || who.may_topic(core, Operation::Create, n))
        })
        .map(|n| NewTopic {
            name: n.clone(),
            partitions: -1,
            replication_factor: -1,
            configs: BTreeMap::new(),
        })
        .collect();
    if !missing.is_empty() {
        let change = TopicChange::Create {
            topics: missing,
            validate_only: false,
        };
        control::change_topics(core, change).await;
    }
}
