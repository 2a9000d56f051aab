//! CreateTopics: validated here, decided and applied through the control plane (core 0).

use super::{count_errors, frame, HandlerResult, Versions};
use crate::control::{NewTopic, TopicChange};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::CreateTopics,
    min: 2,
    max: 7,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: CreateTopicsRequest = decode(req)?;
    let topics: Vec<NewTopic> = request
        .topics
        .iter()
        .map(|t| NewTopic {
            name: t.name.0.to_string(),
            partitions: if t.assignments.is_empty() {
                t.num_partitions
            } else {
                t.assignments.len() as i32
            },
            replication_factor: t.replication_factor,
            configs: t
                .configs
                .iter()
                .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
                .collect::<BTreeMap<_, _>>(),
        })
        .collect();
    let configs: Vec<BTreeMap<String, String>> = topics.iter().map(|t| t.configs.clone()).collect();
    let any_topic = who.may_cluster(core, Operation::Create);
    let outcomes = super::change_allowed(
        core,
        topics,
        |t| t.name.clone(),
        |t| any_topic || who.may_topic(core, Operation::Create, &t.name),
        |topics| TopicChange::Create {
            topics,
            validate_only: request.validate_only,
        },
    )
    .await;
    let results: Vec<CreatableTopicResult> = outcomes
        .into_iter()
        .zip(configs)
        .map(|(o, configs)| {
            let r =
                CreatableTopicResult::default().with_name(TopicName(StrBytes::from_string(o.name)));
            match o.error {
                Some((e, msg)) => r
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(msg))),
                None => r
                    .with_error_message(None)
                    .with_topic_id(uuid::Uuid::from_bytes(o.id))
                    .with_num_partitions(o.partitions)
                    .with_replication_factor(1)
                    .with_configs(Some(
                        configs
                            .into_iter()
                            .map(|(k, v)| {
                                CreatableTopicConfigs::default()
                                    .with_name(StrBytes::from_string(k))
                                    .with_value(Some(StrBytes::from_string(v)))
                                    .with_config_source(1) // DYNAMIC_TOPIC_CONFIG
                            })
                            .collect(),
                    )),
            }
        })
        .collect();
    count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::CreateTopics,
        req,
        &CreateTopicsResponse::default().with_topics(results),
    ))
}
