//! `shoal topic`: create, list, alter configs, add partitions, delete; `describe` is in
//! [`super::describe`].

use super::args::TopicAction;
use super::describe::TOPIC_RESOURCE;
use super::failure::Failure;
use super::output::{done, Report, Table};
use super::session::{topic_name, Session};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    ApiKey, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde_json::json;

/// How long the broker may take over a create, delete or partition change.
const OPERATION_TIMEOUT_MS: i32 = 30_000;

pub fn run(s: &Session, action: TopicAction) -> Result<Report, Failure> {
    match action {
        TopicAction::Create {
            name,
            partitions,
            replication_factor,
            configs,
        } => create(s, &name, partitions, replication_factor, &configs),
        TopicAction::List => list(s),
        TopicAction::Describe { name } => super::describe::describe(s, &name),
        TopicAction::AlterConfig {
            name,
            configs,
            delete,
        } => alter_config(s, &name, &configs, &delete),
        TopicAction::AddPartitions { name, partitions } => add_partitions(s, &name, partitions),
        TopicAction::Delete { name } => delete(s, &name),
    }
}

fn create(
    s: &Session,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(String, String)],
) -> Result<Report, Failure> {
    let version = s.version(ApiKey::CreateTopics, 2, 7)?;
    // -1 ("the broker's default", KIP-464) needs v4.
    let rf = if replication_factor < 0 && version < 4 {
        1
    } else {
        replication_factor
    };
    let topic = CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions)
        .with_replication_factor(rf)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(k.clone()))
                        .with_value(Some(StrBytes::from_string(v.clone())))
                })
                .collect(),
        );
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(OPERATION_TIMEOUT_MS)
        .with_topics(vec![topic]);
    let r: CreateTopicsResponse = s.call_controller(ApiKey::CreateTopics, version, &req)?;
    let t = r.topics.first().ok_or_else(|| {
        Failure::other(
            "EmptyAnswer",
            "CreateTopics: no topic in the answer",
            "see the broker's log",
        )
    })?;
    Failure::check(
        t.error_code,
        &format!("creating topic {name}"),
        t.error_message.as_deref(),
    )?;
    Ok(done(
        format!(
            "created topic {name} with {partitions} partition{}",
            if partitions == 1 { "" } else { "s" }
        ),
        json!({"topic": name, "partitions": partitions, "created": true}),
    ))
}

fn list(s: &Session) -> Result<Report, Failure> {
    let m = s.metadata(None)?;
    let mut topics: Vec<(String, usize, bool, i16)> = m
        .topics
        .iter()
        .map(|t| {
            let name = t.name.as_ref().map_or(String::new(), |n| n.0.to_string());
            (name, t.partitions.len(), t.is_internal, t.error_code)
        })
        .collect();
    topics.sort();
    let mut table = Table::new(None, vec!["TOPIC", "PARTITIONS", "INTERNAL"]);
    for (name, partitions, internal, _) in &topics {
        table.rows.push(vec![
            name.clone(),
            partitions.to_string(),
            internal.to_string(),
        ]);
    }
    let json = topics
        .iter()
        .map(|(name, partitions, internal, error)| {
            json!({"name": name, "partitions": partitions, "internal": internal, "error_code": error})
        })
        .collect();
    Ok(Report {
        tables: vec![table],
        json: serde_json::Value::Array(json),
    })
}

fn alter_config(
    s: &Session,
    name: &str,
    set: &[(String, String)],
    delete: &[String],
) -> Result<Report, Failure> {
    if set.is_empty() && delete.is_empty() {
        return Err(Failure::usage(
            "nothing to change: give -c key=value or --delete-config key",
        ));
    }
    const SET: i8 = 0;
    const DELETE: i8 = 1;
    let version = s.version(ApiKey::IncrementalAlterConfigs, 0, 1)?;
    let config = |k: &str, op, v: Option<&str>| {
        AlterableConfig::default()
            .with_name(StrBytes::from_string(k.to_string()))
            .with_config_operation(op)
            .with_value(v.map(|v| StrBytes::from_string(v.to_string())))
    };
    let configs = set
        .iter()
        .map(|(k, v)| config(k, SET, Some(v)))
        .chain(delete.iter().map(|k| config(k, DELETE, None)))
        .collect();
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(configs),
    ]);
    let r: IncrementalAlterConfigsResponse =
        s.call_controller(ApiKey::IncrementalAlterConfigs, version, &req)?;
    for res in &r.responses {
        Failure::check(
            res.error_code,
            &format!("altering the configs of topic {name}"),
            res.error_message.as_deref(),
        )?;
    }
    let set_json: serde_json::Map<String, serde_json::Value> =
        set.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    Ok(done(
        format!(
            "topic {name}: {} config(s) set, {} removed",
            set.len(),
            delete.len()
        ),
        json!({"topic": name, "set": set_json, "deleted": delete}),
    ))
}

fn add_partitions(s: &Session, name: &str, partitions: i32) -> Result<Report, Failure> {
    let version = s.version(ApiKey::CreatePartitions, 0, 3)?;
    let req = CreatePartitionsRequest::default()
        .with_timeout_ms(OPERATION_TIMEOUT_MS)
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name(name))
            .with_count(partitions)
            .with_assignments(None)]);
    let r: CreatePartitionsResponse = s.call_controller(ApiKey::CreatePartitions, version, &req)?;
    for t in &r.results {
        Failure::check(
            t.error_code,
            &format!("adding partitions to topic {name}"),
            t.error_message.as_deref(),
        )?;
    }
    Ok(done(
        format!(
            "topic {name} now has {partitions} partition{}",
            if partitions == 1 { "" } else { "s" }
        ),
        json!({"topic": name, "partitions": partitions}),
    ))
}

fn delete(s: &Session, name: &str) -> Result<Report, Failure> {
    let version = s.version(ApiKey::DeleteTopics, 1, 6)?;
    let mut req = DeleteTopicsRequest::default().with_timeout_ms(OPERATION_TIMEOUT_MS);
    // v6 names topics in `topics` (by name or id); before, in `topic_names`.
    if version >= 6 {
        req = req.with_topics(vec![
            DeleteTopicState::default().with_name(Some(topic_name(name)))
        ]);
    } else {
        req = req.with_topic_names(vec![topic_name(name)]);
    }
    let r: DeleteTopicsResponse = s.call_controller(ApiKey::DeleteTopics, version, &req)?;
    for t in &r.responses {
        Failure::check(
            t.error_code,
            &format!("deleting topic {name}"),
            t.error_message.as_deref(),
        )?;
    }
    Ok(done(
        format!("deleted topic {name}"),
        json!({"topic": name, "deleted": true}),
    ))
}
