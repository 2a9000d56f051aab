//! AlterConfigs: replaces a topic's own configs with the ones given (those left out go back to
//! the server's). Decided and applied through the control plane (core 0); every core applies the
//! new settings to its partitions at once. Broker configs are `shoal serve` flags: read-only here.

use super::describe_configs::{BROKER, TOPIC};
use super::{count_errors, frame, HandlerResult, Versions};
use crate::control::{self, ConfigChange, ConfigOp, TopicChange};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse, ApiKey};
use kafka_protocol::protocol::StrBytes;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::AlterConfigs,
    min: 0,
    max: 2,
};

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: AlterConfigsRequest = decode(req)?;
    let resources = request.resources.iter().map(|r| {
        let ops = r
            .configs
            .iter()
            .map(|c| match &c.value {
                Some(v) => ConfigOp::Set(c.name.to_string(), v.to_string()),
                None => ConfigOp::Delete(c.name.to_string()),
            })
            .collect();
        (r.resource_type, r.resource_name.to_string(), ops)
    });
    let responses: Vec<AlterConfigsResourceResponse> = alter(
        core,
        req,
        who,
        resources.collect(),
        true,
        request.validate_only,
    )
    .await;
    Ok(frame(
        ApiKey::AlterConfigs,
        req,
        &AlterConfigsResponse::default().with_responses(responses),
    ))
}

/// A resource's answer: AlterConfigs and IncrementalAlterConfigs each have a type of their own
/// for it, with the same fields.
pub(super) trait ResourceAnswer {
    fn new(resource_type: i8, name: String, error: Option<(ResponseError, String)>) -> Self;
    fn error_code(&self) -> i16;
}

macro_rules! resource_answer {
    ($answer:ty) => {
        impl ResourceAnswer for $answer {
            fn new(
                resource_type: i8,
                name: String,
                error: Option<(ResponseError, String)>,
            ) -> Self {
                let r = Self::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(StrBytes::from_string(name));
                match error {
                    Some((e, why)) => r
                        .with_error_code(e.code())
                        .with_error_message(Some(StrBytes::from_string(why))),
                    None => r,
                }
            }

            fn error_code(&self) -> i16 {
                self.error_code
            }
        }
    };
}

resource_answer!(AlterConfigsResourceResponse);
resource_answer!(
    kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse
);

/// What an alter request asks of each resource: (type, name, operations).
pub(super) type Asked = Vec<(i8, String, Vec<ConfigOp>)>;

/// Applies the topics' changes through core 0 (`replace`: the topic's own configs become exactly
/// the ones set) and answers the rest here; one answer per resource, in order, errors counted.
pub(super) async fn alter<R: ResourceAnswer>(
    core: &Rc<Core>,
    req: &Request,
    who: &Session,
    asked: Asked,
    replace: bool,
    validate_only: bool,
) -> Vec<R> {
    let allowed: Vec<bool> = asked
        .iter()
        .map(|(t, name, _)| match *t {
            TOPIC => who.may_topic(core, Operation::AlterConfigs, name),
            BROKER => who.may_cluster(core, Operation::AlterConfigs),
            _ => true,
        })
        .collect();
    let changes: Vec<ConfigChange> = asked
        .iter()
        .zip(&allowed)
        .filter(|((t, _, _), ok)| *t == TOPIC && **ok)
        .map(|((_, name, ops), _)| ConfigChange {
            topic: name.clone(),
            replace,
            ops: ops.clone(),
        })
        .collect();
    let mut outcomes = if changes.is_empty() {
        Vec::new()
    } else {
        let change = TopicChange::Configure {
            changes,
            validate_only,
        };
        control::change_topics(core, change).await
    }
    .into_iter();
    let answers: Vec<R> = asked
        .into_iter()
        .zip(allowed)
        .map(|((resource_type, name, _), ok)| {
            let error = match resource_type {
                _ if !ok => Some(super::describe_configs::denied(resource_type)),
                TOPIC => match outcomes.next() {
                    Some(o) => o.error,
                    None => Some((
                        ResponseError::RequestTimedOut,
                        "the control plane did not answer".to_string(),
                    )),
                },
                BROKER => Some((
                    ResponseError::InvalidRequest,
                    "broker configs are shoal serve flags: read-only while it runs".to_string(),
                )),
                other => Some((
                    ResponseError::InvalidRequest,
                    format!("resource type {other} is not served (topics: 2, brokers: 4)"),
                )),
            };
            R::new(resource_type, name, error)
        })
        .collect();
    count_errors(core, req, answers.iter().map(R::error_code));
    answers
}
