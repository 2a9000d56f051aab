//! DeleteAcls (`kafka-acls.sh --remove`): needs ALTER on the cluster; core 0 deletes what each
//! filter matches, persists and applies the table everywhere, and reports the bindings deleted.

use super::describe_acls::filter;
use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::mesh::TopicChange;
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::{AclFilter, Operation};
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::{ApiKey, DeleteAclsRequest, DeleteAclsResponse};
use kafka_protocol::protocol::StrBytes;
use std::rc::Rc;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DeleteAcls,
    min: 1,
    max: 3,
};

fn failed(e: ResponseError, why: String) -> DeleteAclsFilterResult {
    DeleteAclsFilterResult::default()
        .with_error_code(e.code())
        .with_error_message(Some(StrBytes::from_string(why)))
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: DeleteAclsRequest = decode(req)?;
    let allowed = who.may_cluster(core, Operation::Alter);
    let disabled = super::acls_disabled(core);
    let checked: Vec<Result<AclFilter, (ResponseError, String)>> = request
        .filters
        .iter()
        .map(|f| {
            if let Some(disabled) = &disabled {
                return Err(disabled.clone());
            }
            if !allowed {
                return Err((
                    ResponseError::ClusterAuthorizationFailed,
                    "not authorized".into(),
                ));
            }
            filter(
                f.resource_type_filter,
                f.resource_name_filter.as_ref(),
                f.pattern_type_filter,
                f.principal_filter.as_ref(),
                f.host_filter.as_ref(),
                f.operation,
                f.permission_type,
            )
            .map_err(|why| (ResponseError::InvalidRequest, why))
        })
        .collect();
    let mut decided = super::change_checked(core, &checked, |filters| TopicChange::DeleteAcls {
        filters,
    })
    .await;
    let results: Vec<DeleteAclsFilterResult> = checked
        .into_iter()
        .map(|c| match c {
            Err((e, why)) => failed(e, why),
            Ok(_) => match decided.next() {
                None => failed(
                    ResponseError::RequestTimedOut,
                    "the control plane did not answer".into(),
                ),
                Some(o) => match o.error {
                    Some((e, why)) => failed(e, why),
                    None => {
                        for b in &o.acls {
                            log::info!("ACL removed by {}: {b:?}", who.principal);
                        }
                        DeleteAclsFilterResult::default().with_matching_acls(
                            o.acls
                                .into_iter()
                                .map(|b| {
                                    DeleteAclsMatchingAcl::default()
                                        .with_resource_type(b.resource_type as i8)
                                        .with_resource_name(StrBytes::from_string(b.name))
                                        .with_pattern_type(b.pattern as i8)
                                        .with_principal(StrBytes::from_string(b.principal))
                                        .with_host(StrBytes::from_string(b.host))
                                        .with_operation(b.operation as i8)
                                        .with_permission_type(b.permission as i8)
                                })
                                .collect(),
                        )
                    }
                },
            },
        })
        .collect();
    count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::DeleteAcls,
        req,
        &DeleteAclsResponse::default().with_filter_results(results),
    ))
}
