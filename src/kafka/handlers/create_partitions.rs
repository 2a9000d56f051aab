//! CreatePartitions: a topic grows; decided and applied through the control plane (core 0), which
//! places the new partitions on cores like the others and persists the topic table. Clients see
//! them in Metadata; consumer groups rebalance onto them when their leader's metadata shows them.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::control::{NewPartitions, TopicChange};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{
    ApiKey, CreatePartitionsRequest, CreatePartitionsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::CreatePartitions,
    min: 0,
    max: 3,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: CreatePartitionsRequest = decode(req)?;
    let topics: Vec<NewPartitions> = request
        .topics
        .iter()
        .map(|t| NewPartitions {
            name: t.name.0.to_string(),
            count: t.count,
            assignments: t.assignments.as_ref().map(|a| {
                a.iter()
                    .map(|b| b.broker_ids.iter().map(|id| id.0).collect())
                    .collect()
            }),
        })
        .collect();
    let outcomes = super::change_allowed(
        core,
        topics,
        |t| t.name.clone(),
        |t| who.may_topic(core, Operation::Alter, &t.name),
        |topics| TopicChange::Grow {
            topics,
            validate_only: request.validate_only,
        },
    )
    .await;
    let results: Vec<CreatePartitionsTopicResult> = outcomes
        .into_iter()
        .map(|o| {
            let r = CreatePartitionsTopicResult::default()
                .with_name(TopicName(StrBytes::from_string(o.name)));
            match o.error {
                Some((e, msg)) => r
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(msg))),
                None => r,
            }
        })
        .collect();
    count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::CreatePartitions,
        req,
        &CreatePartitionsResponse::default().with_results(results),
    ))
}
