//! CreateAcls (`kafka-acls.sh --add`, admin clients): needs ALTER on the cluster. Bindings are
//! validated here, then added by core 0 to the topic table, persisted and applied on every core.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::mesh::TopicChange;
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::{AclBinding, Operation, PatternType, Permission, ResourceType};
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::{ApiKey, CreateAclsRequest, CreateAclsResponse};
use kafka_protocol::protocol::StrBytes;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::CreateAcls,
    min: 1,
    max: 3,
};

/// The binding a creation asks for, or why it cannot be stored.
fn binding(c: &AclCreation) -> Result<AclBinding, String> {
    let b = AclBinding {
        resource_type: ResourceType::from_code(c.resource_type).ok_or_else(|| {
            format!(
                "resource type {} is not served (topic 2, group 3, cluster 4)",
                c.resource_type
            )
        })?,
        name: c.resource_name.to_string(),
        pattern: PatternType::from_code(c.resource_pattern_type).ok_or_else(|| {
            format!(
                "pattern type {} (literal 3, prefixed 4)",
                c.resource_pattern_type
            )
        })?,
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation: Operation::from_code(c.operation)
            .ok_or_else(|| format!("operation {} is not served", c.operation))?,
        permission: Permission::from_code(c.permission_type)
            .ok_or_else(|| format!("permission type {} (deny 2, allow 3)", c.permission_type))?,
    };
    b.validate()?;
    Ok(b)
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: CreateAclsRequest = decode(req)?;
    let allowed = who.may_cluster(core, Operation::Alter);
    let disabled = super::acls_disabled(core);
    let checked: Vec<Result<AclBinding, (ResponseError, String)>> = request
        .creations
        .iter()
        .map(|c| {
            if let Some(disabled) = &disabled {
                return Err(disabled.clone());
            }
            if !allowed {
                return Err((
                    ResponseError::ClusterAuthorizationFailed,
                    "not authorized".into(),
                ));
            }
            binding(c).map_err(|why| (ResponseError::InvalidRequest, why))
        })
        .collect();
    let mut decided = super::change_checked(core, &checked, |bindings| TopicChange::CreateAcls {
        bindings,
    })
    .await;
    let results: Vec<AclCreationResult> = checked
        .into_iter()
        .map(|c| {
            let error = match c {
                Err(e) => Some(e),
                Ok(b) => match decided.next() {
                    Some(o) => {
                        if o.error.is_none() {
                            log::info!("ACL added by {}: {b:?}", who.principal);
                        }
                        o.error
                    }
                    None => Some((
                        ResponseError::RequestTimedOut,
                        "the control plane did not answer".into(),
                    )),
                },
            };
            match error {
                None => AclCreationResult::default(),
                Some((e, why)) => AclCreationResult::default()
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(why))),
            }
        })
        .collect();
    count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::CreateAcls,
        req,
        &CreateAclsResponse::default().with_results(results),
    ))
}
