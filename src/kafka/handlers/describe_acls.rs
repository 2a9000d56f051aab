//! DescribeAcls (`kafka-acls.sh --list`): needs DESCRIBE on the cluster; the bindings a filter
//! matches, grouped by resource. Also the filter decoding DeleteAcls shares.

use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::{
    AclBinding, AclFilter, Operation, PatternFilter, PatternType, Permission, ResourceType,
};
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{ApiKey, DescribeAclsRequest, DescribeAclsResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DescribeAcls,
    min: 1,
    max: 3,
};

/// Kafka's ANY code in the filter enums.
const ANY: i8 = 1;
const MATCH: i8 = 2;

/// `None` for ANY, else the value `parse` finds for `code`.
fn any_or<T>(code: i8, parse: fn(i8) -> Option<T>, what: &str) -> Result<Option<T>, String> {
    if code == ANY {
        Ok(None)
    } else {
        parse(code)
            .map(Some)
            .ok_or_else(|| format!("{what} {code} is not served"))
    }
}

/// A filter from its wire fields, or why it is invalid (Kafka: `INVALID_REQUEST`).
pub(super) fn filter(
    resource_type: i8,
    name: Option<&StrBytes>,
    pattern: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, String> {
    Ok(AclFilter {
        resource_type: any_or(resource_type, ResourceType::from_code, "resource type")?,
        name: name.map(|n| n.to_string()),
        pattern: match pattern {
            ANY => PatternFilter::Any,
            MATCH => PatternFilter::Match,
            p => PatternFilter::Exactly(
                PatternType::from_code(p)
                    .ok_or_else(|| format!("pattern type {p} is not served"))?,
            ),
        },
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation: any_or(operation, Operation::from_code, "operation")?,
        permission: any_or(permission, Permission::from_code, "permission type")?,
    })
}

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let r: DescribeAclsRequest = decode(req)?;
    let response = DescribeAclsResponse::default();
    let response = if let Some((e, why)) = super::acls_disabled(core) {
        core.metrics.error(req.api_key);
        response
            .with_error_code(e.code())
            .with_error_message(Some(StrBytes::from_string(why)))
    } else if !who.may_cluster(core, Operation::Describe) {
        core.metrics.error(req.api_key);
        response
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            .with_error_message(Some(StrBytes::from_static_str("not authorized")))
    } else {
        match filter(
            r.resource_type_filter,
            r.resource_name_filter.as_ref(),
            r.pattern_type_filter,
            r.principal_filter.as_ref(),
            r.host_filter.as_ref(),
            r.operation,
            r.permission_type,
        ) {
            Err(why) => {
                core.metrics.error(req.api_key);
                response
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(StrBytes::from_string(why)))
            }
            Ok(f) => {
                let table = core.topics();
                response.with_resources(grouped(table.acls.iter().filter(|b| f.matches(b))))
            }
        }
    };
    Ok(frame(ApiKey::DescribeAcls, req, &response))
}

/// Bindings grouped by resource (type, name, pattern), in first-seen order.
fn grouped<'a>(bindings: impl Iterator<Item = &'a AclBinding>) -> Vec<DescribeAclsResource> {
    let mut out: Vec<DescribeAclsResource> = Vec::new();
    for b in bindings {
        let acl = AclDescription::default()
            .with_principal(StrBytes::from_string(b.principal.clone()))
            .with_host(StrBytes::from_string(b.host.clone()))
            .with_operation(b.operation as i8)
            .with_permission_type(b.permission as i8);
        match out.iter_mut().find(|r| {
            r.resource_type == b.resource_type as i8
                && r.resource_name.as_str() == b.name
                && r.pattern_type == b.pattern as i8
        }) {
            Some(r) => r.acls.push(acl),
            None => out.push(
                DescribeAclsResource::default()
                    .with_resource_type(b.resource_type as i8)
                    .with_resource_name(StrBytes::from_string(b.name.clone()))
                    .with_pattern_type(b.pattern as i8)
                    .with_acls(vec![acl]),
            ),
        }
    }
    out
}
