//! `shoal topic describe`: the topic's partitions from Metadata, each one's high watermark and log
//! start from its leader (ListOffsets latest and earliest), and its configs with their sources
//! (DescribeConfigs, from any broker).

use super::failure::Failure;
use super::output::{Report, Table};
use super::session::{topic_name, Session};
use super::topic::TOPIC_RESOURCE;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeConfigsRequest, DescribeConfigsResponse, ListOffsetsRequest,
    ListOffsetsResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

#[derive(Debug, Serialize)]
struct PartitionInfo {
    partition: i32,
    /// The leader's node id: for shoal, the core that owns the partition.
    leader: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    /// `None` where the leader could not say (no leader, or an error).
    high_watermark: Option<i64>,
    log_start: Option<i64>,
}

#[derive(Debug, Serialize)]
struct ConfigInfo {
    name: String,
    value: Option<String>,
    source: &'static str,
    sensitive: bool,
    read_only: bool,
}

#[derive(Debug, Serialize)]
struct TopicInfo {
    name: String,
    partitions: Vec<PartitionInfo>,
    configs: Vec<ConfigInfo>,
}

pub fn describe(s: &Session, name: &str) -> Result<Report, Failure> {
    let m = s.metadata(Some(&[name]))?;
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name))
        .ok_or_else(|| Failure::kafka(3, &format!("topic {name}"), None))?;
    Failure::check(t.error_code, &format!("topic {name}"), None)?;
    let mut partitions: Vec<PartitionInfo> = t
        .partitions
        .iter()
        .map(|p| PartitionInfo {
            partition: p.partition_index,
            leader: p.leader_id.0,
            replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
            isr: p.isr_nodes.iter().map(|b| b.0).collect(),
            high_watermark: None,
            log_start: None,
        })
        .collect();
    partitions.sort_by_key(|p| p.partition);
    // One ListOffsets per leader and timestamp, for all the partitions it leads.
    let mut by_leader: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in partitions.iter().filter(|p| p.leader >= 0) {
        by_leader.entry(p.leader).or_default().push(p.partition);
    }
    for (leader, ids) in by_leader {
        let addr = s.broker(&m, leader).ok_or_else(|| {
            Failure::other(
                "LeaderNotAvailable",
                format!("topic {name}: leader {leader} is not among the brokers"),
                "retry in a moment",
            )
        })?;
        let latest = offsets(s, addr, name, &ids, LATEST)?;
        let earliest = offsets(s, addr, name, &ids, EARLIEST)?;
        for p in partitions.iter_mut() {
            p.high_watermark = p.high_watermark.or(latest.get(&p.partition).copied());
            p.log_start = p.log_start.or(earliest.get(&p.partition).copied());
        }
    }
    let info = TopicInfo {
        name: name.to_string(),
        partitions,
        configs: configs(s, name)?,
    };
    Ok(Report {
        tables: tables(&info),
        json: serde_json::to_value(&info).expect("plain data serializes"),
    })
}

/// ListOffsets for `partitions` of `topic` at their leader `addr`: partition to offset (those
/// answered with an error left out).
pub fn offsets(
    s: &Session,
    addr: std::net::SocketAddr,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
) -> Result<BTreeMap<i32, i64>, Failure> {
    let version = s.version(ApiKey::ListOffsets, 1, 7)?;
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_timestamp(timestamp)
                    })
                    .collect(),
            )]);
    let r: ListOffsetsResponse = s.call(addr, ApiKey::ListOffsets, version, &req)?;
    Ok(r.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .filter(|p| p.error_code == 0)
        .map(|p| (p.partition_index, p.offset))
        .collect())
}

fn configs(s: &Session, topic: &str) -> Result<Vec<ConfigInfo>, Failure> {
    let version = s.version(ApiKey::DescribeConfigs, 1, 4)?;
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(StrBytes::from_string(topic.to_string()))
            .with_configuration_keys(None)]);
    let r: DescribeConfigsResponse = s.call(s.bootstrap, ApiKey::DescribeConfigs, version, &req)?;
    let mut out = Vec::new();
    for res in &r.results {
        Failure::check(
            res.error_code,
            &format!("the configs of topic {topic}"),
            res.error_message.as_deref(),
        )?;
        out.extend(res.configs.iter().map(|c| ConfigInfo {
            name: c.name.to_string(),
            value: c.value.as_ref().map(|v| v.to_string()),
            source: source_name(c.config_source),
            sensitive: c.is_sensitive,
            read_only: c.read_only,
        }));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// DescribeConfigs' `config_source`, as Kafka's tools print it.
fn source_name(source: i8) -> &'static str {
    match source {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        7 => "CLIENT_METRICS_CONFIG",
        8 => "GROUP_CONFIG",
        _ => "UNKNOWN",
    }
}

fn tables(info: &TopicInfo) -> Vec<Table> {
    let ids = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    let offset = |o: Option<i64>| o.map_or("-".to_string(), |o| o.to_string());
    let mut parts = Table::new(
        Some(format!("topic {}", info.name)),
        vec![
            "PARTITION",
            "LEADER",
            "REPLICAS",
            "ISR",
            "HIGH-WATERMARK",
            "LOG-START",
        ],
    );
    for p in &info.partitions {
        parts.rows.push(vec![
            p.partition.to_string(),
            p.leader.to_string(),
            ids(&p.replicas),
            ids(&p.isr),
            offset(p.high_watermark),
            offset(p.log_start),
        ]);
    }
    let mut configs = Table::new(Some("configs".into()), vec!["NAME", "VALUE", "SOURCE"]);
    for c in &info.configs {
        let value = match (&c.value, c.sensitive) {
            (_, true) => "(sensitive)".to_string(),
            (Some(v), false) => v.clone(),
            (None, false) => "-".to_string(),
        };
        configs
            .rows
            .push(vec![c.name.clone(), value, c.source.to_string()]);
    }
    vec![parts, configs]
}
