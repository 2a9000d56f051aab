//! DeleteTopics: by name (v1-5) or by name or id (v6), through the control plane (core 0).

use super::{count_errors, frame, HandlerResult, Versions};
use crate::control::TopicChange;
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DeleteTopics,
    min: 1,
    max: 6,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: DeleteTopicsRequest = decode(req)?;
    let mut names: Vec<String> = request
        .topic_names
        .iter()
        .map(|n| n.0.to_string())
        .collect();
    let mut unknown_ids = Vec::new();
    for t in &request.topics {
        match &t.name {
            Some(n) => names.push(n.0.to_string()),
            None => {
                let table = core.topics();
                match table
                    .topics
                    .iter()
                    .find(|(_, m)| m.id == *t.topic_id.as_bytes())
                {
                    Some((n, _)) => names.push(n.clone()),
                    None => unknown_ids.push(t.topic_id),
                }
            }
        }
    }
    let outcomes = super::change_allowed(
        core,
        names,
        String::clone,
        |n| who.may_topic(core, Operation::Delete, n),
        |names| TopicChange::Delete { names },
    )
    .await;
    let mut responses: Vec<DeletableTopicResult> = outcomes
        .into_iter()
        .map(|o| {
            let r = DeletableTopicResult::default()
                .with_name(Some(TopicName(StrBytes::from_string(o.name))))
                .with_topic_id(uuid::Uuid::from_bytes(o.id));
            match o.error {
                Some((e, msg)) => r
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(msg))),
                None => r,
            }
        })
        .collect();
    responses.extend(unknown_ids.into_iter().map(|id| {
        DeletableTopicResult::default()
            .with_topic_id(id)
            .with_error_code(ResponseError::UnknownTopicId.code())
    }));
    count_errors(core, req, responses.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::DeleteTopics,
        req,
        &DeleteTopicsResponse::default().with_responses(responses),
    ))
}
