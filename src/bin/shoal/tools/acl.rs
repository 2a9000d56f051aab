//! `shoal acl create | list | delete`: ACLs over CreateAcls, DescribeAcls and DeleteAcls, in
//! Kafka's codes (so they work against any Kafka-compatible broker), with the flags of
//! `kafka-acls.sh` shortened: a principal with its permission, operations, one resource.

use super::args::ClientArgs;
use super::failure::Failure;
use super::output::{Report, Table};
use super::session::Session;
use clap::{Args, Subcommand, ValueEnum};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use shoal::table::acl::Operation;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  shoal acl create --allow-principal User:alice --operation read --topic orders\n  \
    shoal acl list --topic orders --format json\n  \
    shoal acl delete --allow-principal User:alice --topic orders"
)]
pub struct AclCommand {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: AclAction,
}

#[derive(Debug, Subcommand)]
pub enum AclAction {
    /// Adds ACLs: each principal given is allowed (or denied) each operation on the resource.
    /// Example: `shoal acl create --allow-principal User:alice --operation read --operation describe --topic orders`
    Create(AclSpec),
    /// Lists the ACLs that match the flags given (none: every ACL). Example: `shoal acl list --topic orders`
    List(AclSpec),
    /// Deletes the ACLs that match the flags given (a resource is required) and prints them.
    /// Example: `shoal acl delete --deny-principal User:bob --topic orders`
    Delete(AclSpec),
}

/// An ACL to create, or the filter of ACLs to list or delete.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("resource").args(["topic", "group", "cluster", "transactional_id"]))]
pub struct AclSpec {
    /// A principal to allow, `User:NAME` (`User:*`: everyone); repeatable.
    #[arg(long)]
    pub allow_principal: Vec<String>,
    /// A principal to deny, `User:NAME`; repeatable. A DENY beats any ALLOW.
    #[arg(long)]
    pub deny_principal: Vec<String>,
    /// An operation: read, write, create, delete, alter, describe, cluster-action,
    /// describe-configs, alter-configs, idempotent-write or all; repeatable (list and delete:
    /// none means any).
    #[arg(long, value_parser = parse_operation)]
    pub operation: Vec<Operation>,
    /// The resource: a topic (`*`: every topic) ...
    #[arg(long)]
    pub topic: Option<String>,
    /// ... or a consumer group ...
    #[arg(long)]
    pub group: Option<String>,
    /// ... or the cluster ...
    #[arg(long)]
    pub cluster: bool,
    /// ... or a transactional id.
    #[arg(long)]
    pub transactional_id: Option<String>,
    /// How the resource name is matched: literal or prefixed (create; default literal); list and
    /// delete also take any (both, by that name) and match (every ACL that applies to that
    /// resource, `*` and prefixes included); default any.
    #[arg(long, value_enum)]
    pub resource_pattern_type: Option<PatternType>,
    /// The client host the ACL applies to (create: default `*`, any host).
    #[arg(long)]
    pub host: Option<String>,
}

/// Kafka's pattern type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PatternType {
    Any = 1,
    Match = 2,
    Literal = 3,
    Prefixed = 4,
}

const ANY: i8 = 1;
const DENY: i8 = 2;
const ALLOW: i8 = 3;
const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const CLUSTER: i8 = 4;
const TRANSACTIONAL_ID: i8 = 5;
/// The cluster resource's one name.
const CLUSTER_NAME: &str = "kafka-cluster";

/// One ACL as printed: Kafka's names for the codes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
struct Binding {
    resource_type: String,
    name: String,
    pattern_type: String,
    principal: String,
    host: String,
    operation: String,
    permission: String,
}

/// The fields of one filter (or one creation), in Kafka's codes.
#[derive(Debug, Clone)]
struct Filter {
    resource_type: i8,
    name: Option<String>,
    pattern: i8,
    principal: Option<String>,
    host: Option<String>,
    operation: i8,
    permission: i8,
}

fn name_of(code: i8, names: &[(i8, &str)]) -> String {
    names
        .iter()
        .find(|(c, _)| *c == code)
        .map_or_else(|| format!("UNKNOWN({code})"), |(_, n)| n.to_string())
}

fn resource_name(code: i8) -> String {
    let names = [
        (TOPIC, "TOPIC"),
        (GROUP, "GROUP"),
        (CLUSTER, "CLUSTER"),
        (TRANSACTIONAL_ID, "TRANSACTIONAL_ID"),
        (6, "DELEGATION_TOKEN"),
        (7, "USER"),
    ];
    name_of(code, &names)
}

fn pattern_name(code: i8) -> String {
    name_of(code, &[(3, "LITERAL"), (4, "PREFIXED")])
}

fn permission_name(code: i8) -> String {
    name_of(code, &[(DENY, "DENY"), (ALLOW, "ALLOW")])
}

/// Kafka's name of an operation in `kafka-acls.sh`'s spelling: `ClusterAction`, `cluster-action`.
fn kebab(op: Operation) -> String {
    let mut out = String::new();
    for (i, c) in format!("{op:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn parse_operation(s: &str) -> Result<Operation, String> {
    let wanted = s.to_ascii_lowercase().replace('_', "-");
    Operation::ALL_OPS
        .into_iter()
        .find(|o| kebab(*o) == wanted)
        .ok_or_else(|| {
            let names: Vec<String> = Operation::ALL_OPS.into_iter().map(kebab).collect();
            format!("{s}: one of {}", names.join(", "))
        })
}

/// An operation code as Kafka names it: `CLUSTER_ACTION`.
fn operation_name(code: i8) -> String {
    Operation::from_code(code).map_or_else(
        || format!("UNKNOWN({code})"),
        |o| kebab(o).to_uppercase().replace('-', "_"),
    )
}

impl AclSpec {
    /// The resource named by the flags: type code and name.
    fn resource(&self) -> Option<(i8, String)> {
        if let Some(t) = &self.topic {
            return Some((TOPIC, t.clone()));
        }
        if let Some(g) = &self.group {
            return Some((GROUP, g.clone()));
        }
        if let Some(x) = &self.transactional_id {
            return Some((TRANSACTIONAL_ID, x.clone()));
        }
        self.cluster.then(|| (CLUSTER, CLUSTER_NAME.to_string()))
    }

    /// Every principal given with its permission; `[None]` when none is given (any principal).
    fn principals(&self) -> Vec<Option<(String, i8)>> {
        let allow = self
            .allow_principal
            .iter()
            .map(|p| Some((p.clone(), ALLOW)));
        let deny = self.deny_principal.iter().map(|p| Some((p.clone(), DENY)));
        let all: Vec<_> = allow.chain(deny).collect();
        if all.is_empty() {
            vec![None]
        } else {
            all
        }
    }

    /// One filter per principal and operation given (none given: any).
    fn filters(&self, default_pattern: PatternType) -> Vec<Filter> {
        let (resource_type, name) = self.resource().map_or((ANY, None), |(t, n)| (t, Some(n)));
        let pattern = self.resource_pattern_type.unwrap_or(default_pattern) as i8;
        let operations: Vec<i8> = if self.operation.is_empty() {
            vec![ANY]
        } else {
            self.operation.iter().map(|o| *o as i8).collect()
        };
        let mut out = Vec::new();
        for p in self.principals() {
            for op in &operations {
                out.push(Filter {
                    resource_type,
                    name: name.clone(),
                    pattern,
                    principal: p.as_ref().map(|(p, _)| p.clone()),
                    host: self.host.clone(),
                    operation: *op,
                    permission: p.as_ref().map_or(ANY, |(_, perm)| *perm),
                });
            }
        }
        out
    }
}

impl Filter {
    fn binding(&self) -> Binding {
        Binding {
            resource_type: resource_name(self.resource_type),
            name: self.name.clone().unwrap_or_default(),
            pattern_type: pattern_name(self.pattern),
            principal: self.principal.clone().unwrap_or_default(),
            host: self.host.clone().unwrap_or_default(),
            operation: operation_name(self.operation),
            permission: permission_name(self.permission),
        }
    }
}

fn text(s: &Option<String>) -> Option<StrBytes> {
    s.as_ref().map(|s| StrBytes::from_string(s.clone()))
}

pub fn run(s: &Session, action: AclAction) -> Result<Report, Failure> {
    match action {
        AclAction::Create(spec) => create(s, &spec),
        AclAction::List(spec) => list(s, &spec),
        AclAction::Delete(spec) => delete(s, &spec),
    }
}

fn create(s: &Session, spec: &AclSpec) -> Result<Report, Failure> {
    if spec.resource().is_none() {
        return Err(Failure::usage(
            "which resource? --topic, --group, --cluster or --transactional-id",
        ));
    }
    if spec.allow_principal.is_empty() && spec.deny_principal.is_empty() {
        return Err(Failure::usage(
            "whom? --allow-principal or --deny-principal",
        ));
    }
    if spec.operation.is_empty() {
        return Err(Failure::usage("which operation? --operation"));
    }
    if matches!(
        spec.resource_pattern_type,
        Some(PatternType::Any | PatternType::Match)
    ) {
        return Err(Failure::usage(
            "an ACL's --resource-pattern-type is literal or prefixed",
        ));
    }
    let mut creations = spec.filters(PatternType::Literal);
    for c in &mut creations {
        c.host.get_or_insert_with(|| "*".to_string());
    }
    let version = s.version(ApiKey::CreateAcls, 1, 3)?;
    let req = CreateAclsRequest::default().with_creations(
        creations
            .iter()
            .map(|c| {
                AclCreation::default()
                    .with_resource_type(c.resource_type)
                    .with_resource_name(text(&c.name).unwrap_or_default())
                    .with_resource_pattern_type(c.pattern)
                    .with_principal(text(&c.principal).unwrap_or_default())
                    .with_host(text(&c.host).unwrap_or_default())
                    .with_operation(c.operation)
                    .with_permission_type(c.permission)
            })
            .collect(),
    );
    let r: CreateAclsResponse = s.call_controller(ApiKey::CreateAcls, version, &req)?;
    for (res, c) in r.results.iter().zip(&creations) {
        let b = c.binding();
        let what = format!(
            "ACL {} {} {} on {} {}",
            b.permission, b.principal, b.operation, b.resource_type, b.name
        );
        Failure::check(res.error_code, &what, res.error_message.as_deref()).map_err(|mut f| {
            if f.name == "InvalidRequest" {
                f.hint = "check the principal (User:NAME), the resource and the operation: a \
                          broker may not serve every resource type";
            }
            f
        })?;
    }
    Ok(report(
        creations.iter().map(Filter::binding).collect(),
        "created",
    ))
}

fn list(s: &Session, spec: &AclSpec) -> Result<Report, Failure> {
    let version = s.version(ApiKey::DescribeAcls, 1, 3)?;
    let mut found = Vec::new();
    for f in spec.filters(PatternType::Any) {
        let req = DescribeAclsRequest::default()
            .with_resource_type_filter(f.resource_type)
            .with_resource_name_filter(text(&f.name))
            .with_pattern_type_filter(f.pattern)
            .with_principal_filter(text(&f.principal))
            .with_host_filter(text(&f.host))
            .with_operation(f.operation)
            .with_permission_type(f.permission);
        let r: DescribeAclsResponse = s.call(s.bootstrap, ApiKey::DescribeAcls, version, &req)?;
        Failure::check(r.error_code, "listing ACLs", r.error_message.as_deref())?;
        for res in &r.resources {
            for a in &res.acls {
                found.push(Binding {
                    resource_type: resource_name(res.resource_type),
                    name: res.resource_name.to_string(),
                    pattern_type: pattern_name(res.pattern_type),
                    principal: a.principal.to_string(),
                    host: a.host.to_string(),
                    operation: operation_name(a.operation),
                    permission: permission_name(a.permission_type),
                });
            }
        }
    }
    found.sort();
    found.dedup();
    Ok(report(found, ""))
}

fn delete(s: &Session, spec: &AclSpec) -> Result<Report, Failure> {
    if spec.resource().is_none() {
        return Err(Failure::usage(
            "delete needs a resource: --topic, --group, --cluster or --transactional-id",
        ));
    }
    let version = s.version(ApiKey::DeleteAcls, 1, 3)?;
    let req = DeleteAclsRequest::default().with_filters(
        spec.filters(PatternType::Any)
            .iter()
            .map(|f| {
                DeleteAclsFilter::default()
                    .with_resource_type_filter(f.resource_type)
                    .with_resource_name_filter(text(&f.name))
                    .with_pattern_type_filter(f.pattern)
                    .with_principal_filter(text(&f.principal))
                    .with_host_filter(text(&f.host))
                    .with_operation(f.operation)
                    .with_permission_type(f.permission)
            })
            .collect(),
    );
    let r: DeleteAclsResponse = s.call_controller(ApiKey::DeleteAcls, version, &req)?;
    let mut deleted = Vec::new();
    for fr in &r.filter_results {
        Failure::check(fr.error_code, "deleting ACLs", fr.error_message.as_deref())?;
        for m in &fr.matching_acls {
            Failure::check(m.error_code, "deleting an ACL", m.error_message.as_deref())?;
            deleted.push(Binding {
                resource_type: resource_name(m.resource_type),
                name: m.resource_name.to_string(),
                pattern_type: pattern_name(m.pattern_type),
                principal: m.principal.to_string(),
                host: m.host.to_string(),
                operation: operation_name(m.operation),
                permission: permission_name(m.permission_type),
            });
        }
    }
    deleted.sort();
    deleted.dedup();
    Ok(report(deleted, "deleted"))
}

/// The bindings as a table (titled with what was done to them, if anything) and as a JSON array.
fn report(bindings: Vec<Binding>, done: &str) -> Report {
    let title = (!done.is_empty()).then(|| format!("{done} {} ACL(s)", bindings.len()));
    let mut t = Table::new(
        title,
        vec![
            "PRINCIPAL",
            "PERMISSION",
            "OPERATION",
            "RESOURCE",
            "NAME",
            "PATTERN",
            "HOST",
        ],
    );
    for b in &bindings {
        t.rows.push(vec![
            b.principal.clone(),
            b.permission.clone(),
            b.operation.clone(),
            b.resource_type.clone(),
            b.name.clone(),
            b.pattern_type.clone(),
            b.host.clone(),
        ]);
    }
    Report {
        tables: vec![t],
        json: serde_json::to_value(&bindings).expect("plain data serializes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kafkas() {
        assert_eq!(
            operation_name(Operation::ClusterAction as i8),
            "CLUSTER_ACTION"
        );
        assert_eq!(operation_name(12), "IDEMPOTENT_WRITE");
        assert_eq!(operation_name(99), "UNKNOWN(99)");
        assert_eq!(resource_name(TRANSACTIONAL_ID), "TRANSACTIONAL_ID");
        assert_eq!(pattern_name(4), "PREFIXED");
    }

    #[test]
    fn one_filter_per_principal_and_operation() {
        let spec = AclSpec {
            allow_principal: vec!["User:a".into()],
            deny_principal: vec!["User:b".into()],
            operation: vec![Operation::Read, Operation::Write],
            topic: Some("t".into()),
            group: None,
            cluster: false,
            transactional_id: None,
            resource_pattern_type: None,
            host: None,
        };
        let f = spec.filters(PatternType::Literal);
        assert_eq!(f.len(), 4);
        assert_eq!(f[3].permission, DENY);
        assert_eq!(f[3].operation, Operation::Write as i8);
        assert_eq!(f[0].pattern, 3);
    }
}
