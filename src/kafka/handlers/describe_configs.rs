//! DescribeConfigs: a topic's configs (its own values, else the server's, with their sources and,
//! when asked, synonyms and documentation) and the broker's, which are read-only flags. Answered
//! from this core's copy of the topic table, without asking core 0.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::table::configs::{broker_config_entries, topic_config_entries, ConfigEntry};
use crate::table::source_topic;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DescribeConfigs,
    min: 1,
    max: 4,
};

/// The error for a config resource the client may not see or change.
pub(super) fn denied(resource_type: i8) -> (ResponseError, String) {
    let e = if resource_type == TOPIC {
        ResponseError::TopicAuthorizationFailed
    } else {
        ResponseError::ClusterAuthorizationFailed
    };
    (e, "not authorized".into())
}

/// Kafka's resource types.
pub const TOPIC: i8 = 2;
pub const BROKER: i8 = 4;

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: DescribeConfigsRequest = decode(req)?;
    let results: Vec<DescribeConfigsResult> = request
        .resources
        .iter()
        .map(|r| {
            let name = r.resource_name.to_string();
            let result = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let allowed = match r.resource_type {
                TOPIC => who.may_topic(core, Operation::DescribeConfigs, &name),
                BROKER => who.may_cluster(core, Operation::DescribeConfigs),
                _ => true,
            };
            let found = if allowed {
                entries(core, r.resource_type, &name)
            } else {
                Err(denied(r.resource_type))
            };
            match found {
                Err((e, why)) => result
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(why))),
                Ok(entries) => result.with_configs(
                    entries
                        .into_iter()
                        .filter(|e| {
                            r.configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name))
                        })
                        .map(|e| encode(e, &request, req.api_version))
                        .collect(),
                ),
            }
        })
        .collect();
    count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::DescribeConfigs,
        req,
        &DescribeConfigsResponse::default().with_results(results),
    ))
}

/// The configs of one resource, or why it cannot be described.
fn entries(
    core: &Core,
    resource_type: i8,
    name: &str,
) -> Result<Vec<ConfigEntry>, (ResponseError, String)> {
    match resource_type {
        TOPIC => {
            let table = core.topics();
            // A view has its source's configs.
            let source = source_topic(name).unwrap_or(name);
            let meta = table.get(source).ok_or_else(|| {
                (
                    ResponseError::UnknownTopicOrPartition,
                    format!("no topic named {name}"),
                )
            })?;
            Ok(topic_config_entries(&core.config().log, &meta.configs))
        }
        BROKER => match name.parse::<usize>() {
            Ok(id) if id < core.cores() => Ok(broker_config_entries(
                &core.config().log,
                core.config().default_partitions,
            )),
            // The cluster-wide default resource: the same flags.
            _ if name.is_empty() => Ok(broker_config_entries(
                &core.config().log,
                core.config().default_partitions,
            )),
            _ => Err((
                ResponseError::InvalidRequest,
                format!(
                    "no broker {name:?}: brokers are the cores 0 to {}",
                    core.cores() - 1
                ),
            )),
        },
        other => Err((
            ResponseError::InvalidRequest,
            format!("resource type {other} is not served (topics: 2, brokers: 4)"),
        )),
    }
}

/// One config as the request's version can carry it (types and documentation from v3).
fn encode(
    e: ConfigEntry,
    request: &DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResourceResult {
    let r = DescribeConfigsResourceResult::default()
        .with_name(StrBytes::from_static_str(e.name))
        .with_value(Some(StrBytes::from_string(e.value)))
        .with_read_only(e.read_only)
        .with_config_source(e.source as i8)
        .with_is_sensitive(false);
    let r = if version >= 3 {
        r.with_config_type(e.config_type as i8).with_documentation(
            request
                .include_documentation
                .then(|| StrBytes::from_static_str(e.doc)),
        )
    } else {
        r
    };
    r.with_synonyms(if request.include_synonyms {
        e.synonyms
            .into_iter()
            .map(|(name, value, source)| {
                DescribeConfigsSynonym::default()
                    .with_name(StrBytes::from_static_str(name))
                    .with_value(Some(StrBytes::from_string(value)))
                    .with_source(source as i8)
            })
            .collect()
    } else {
        Vec::new()
    })
}
