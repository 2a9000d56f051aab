//! `shoal topic describe`: the topic's partitions from Metadata, each one's high watermark and log
//! start from its leader (ListOffsets latest and earliest) and its size on disk (DescribeLogDirs to
//! the leader, where the broker serves it and the user may describe the cluster), and its configs
//! with their sources (DescribeConfigs, from any broker).

use super::failure::Failure;
use super::offsets::{self, Isolation, EARLIEST, LATEST};
use super::output::{Report, Table};
use super::session::{topic_name, Session};

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::{
    ApiKey, DescribeConfigsRequest, DescribeConfigsResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Bytes on the leader's disk; `None` where it could not say.
    size_bytes: Option<i64>,
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
            size_bytes: None,
        })
        .collect();
    partitions.sort_by_key(|p| p.partition);
    // One ListOffsets per leader and timestamp, for all the partitions it leads.
    let ids: Vec<i32> = partitions.iter().map(|p| p.partition).collect();
    let latest = offsets::of_partitions(s, &m, name, &ids, LATEST, Isolation::ReadUncommitted)?;
    let earliest = offsets::of_partitions(s, &m, name, &ids, EARLIEST, Isolation::ReadUncommitted)?;
    let mut sizes = BTreeMap::new();
    for (addr, ids) in offsets::by_leader(s, &m, name, &ids)? {
        sizes.extend(sizes_at(s, addr, name, &ids));
    }
    for p in partitions.iter_mut() {
        p.high_watermark = latest.get(&p.partition).copied();
        p.log_start = earliest.get(&p.partition).copied();
        p.size_bytes = sizes.get(&p.partition).copied();
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

/// DescribeLogDirs for `partitions` of `topic` at their leader `addr`: partition to bytes on
/// disk. Empty where the broker does not serve it or refuses it (it needs DESCRIBE on the
/// cluster): the size is then left out, not the description.
fn sizes_at(
    s: &Session,
    addr: std::net::SocketAddr,
    topic: &str,
    partitions: &[i32],
) -> BTreeMap<i32, i64> {
    let Ok(version) = s.version(ApiKey::DescribeLogDirs, 1, 4) else {
        return BTreeMap::new();
    };
    let req =
        DescribeLogDirsRequest::default()
            .with_topics(Some(vec![DescribableLogDirTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(partitions.to_vec())]));
    let Ok(r) = s.call::<_, DescribeLogDirsResponse>(addr, ApiKey::DescribeLogDirs, version, &req)
    else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for dir in r.results.iter().filter(|d| d.error_code == 0) {
        for p in dir
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| &t.partitions)
            .filter(|p| !p.is_future_key)
        {
            *out.entry(p.partition_index).or_insert(0) += p.partition_size;
        }
    }
    out
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
            "SIZE",
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
            offset(p.size_bytes),
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

/// DescribeConfigs' and IncrementalAlterConfigs' resource type for a topic.
pub const TOPIC_RESOURCE: i8 = 2;
