//! ACLs in Kafka's model, for what shoal serves: a binding allows or denies a principal (from a
//! host) an operation on a resource (a topic, a group, the cluster), named literally or by prefix.
//! They live in the topic table (persisted by core 0, copied to every core) and are checked by the
//! Kafka front end once per connection, resource and operation (`kafka::session`).
//!
//! Decisions follow Kafka's `AclAuthorizer`: super users may do anything; a matching DENY beats
//! any ALLOW; ALL matches every operation; READ, WRITE, DELETE and ALTER imply DESCRIBE, and
//! ALTER_CONFIGS implies DESCRIBE_CONFIGS; a resource no binding names is open only with
//! `--allow-everyone-if-no-acl-found`.

use serde::{Deserialize, Serialize};

/// Kafka's resource type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResourceType {
    Topic = 2,
    Group = 3,
    Cluster = 4,
    TransactionalId = 5,
}

/// Kafka's pattern type codes (bindings are literal or prefixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PatternType {
    Literal = 3,
    Prefixed = 4,
}

/// Kafka's operation codes, for the operations shoal checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operation {
    All = 2,
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
}

/// Kafka's permission type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Permission {
    Deny = 2,
    Allow = 3,
}

/// The cluster resource's one name.
pub const CLUSTER: &str = "kafka-cluster";

/// One ACL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    /// `User:<name>` or `User:*`.
    pub principal: String,
    /// A client address, or `*`.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// Which pattern types a filter matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PatternFilter {
    /// Any pattern type, the name compared as given.
    Any,
    /// Bindings that would apply to a resource of this name: literal with the name or `*`,
    /// prefixed with a prefix of it.
    Match,
    Exactly(PatternType),
}

/// A DescribeAcls / DeleteAcls filter; `None` fields match anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl ResourceType {
    pub fn from_code(c: i8) -> Option<Self> {
        [
            Self::Topic,
            Self::Group,
            Self::Cluster,
            Self::TransactionalId,
        ]
        .into_iter()
        .find(|r| *r as i8 == c)
    }
}

impl PatternType {
    pub fn from_code(c: i8) -> Option<Self> {
        [Self::Literal, Self::Prefixed]
            .into_iter()
            .find(|p| *p as i8 == c)
    }
}

impl Operation {
    pub const ALL_OPS: [Operation; 11] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
    ];

    pub fn from_code(c: i8) -> Option<Self> {
        Self::ALL_OPS.into_iter().find(|o| *o as i8 == c)
    }

    /// Whether an ALLOW binding for `self` allows `wanted`.
    fn allows(self, wanted: Operation) -> bool {
        self == wanted
            || self == Operation::All
            || wanted == Operation::Describe
                && matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                )
            || wanted == Operation::DescribeConfigs && self == Operation::AlterConfigs
    }
}

impl Permission {
    pub fn from_code(c: i8) -> Option<Self> {
        [Self::Deny, Self::Allow]
            .into_iter()
            .find(|p| *p as i8 == c)
    }
}

impl AclBinding {
    /// Why the binding cannot be stored (Kafka: `INVALID_REQUEST`), if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        let Some(user) = self.principal.strip_prefix("User:") else {
            return Err(format!(
                "principal {:?}: must be User:<name> or User:*",
                self.principal
            ));
        };
        if user.is_empty() {
            return Err("principal User: names no user".into());
        }
        if self.name.is_empty() {
            return Err("a resource name is required".into());
        }
        if self.resource_type == ResourceType::Cluster && self.name != CLUSTER {
            return Err(format!("the cluster resource is named {CLUSTER}"));
        }
        if self.host.is_empty() {
            return Err("host must be * or an address".into());
        }
        Ok(())
    }

    /// Whether the binding applies to `name` (of its resource type).
    fn covers(&self, name: &str) -> bool {
        match self.pattern {
            PatternType::Literal => self.name == name || self.name == "*",
            PatternType::Prefixed => name.starts_with(&self.name),
        }
    }

    fn applies_to(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == "User:*")
            && (self.host == "*" || self.host == host)
    }
}

impl AclFilter {
    pub fn matches(&self, b: &AclBinding) -> bool {
        let eq = |f: &Option<String>, v: &str| f.as_deref().is_none_or(|f| f == v);
        self.resource_type.is_none_or(|t| t == b.resource_type)
            && match self.pattern {
                PatternFilter::Any => eq(&self.name, &b.name),
                PatternFilter::Exactly(p) => p == b.pattern && eq(&self.name, &b.name),
                PatternFilter::Match => self.name.as_deref().is_none_or(|n| b.covers(n)),
            }
            && eq(&self.principal, &b.principal)
            && eq(&self.host, &b.host)
            && self.operation.is_none_or(|o| o == b.operation)
            && self.permission.is_none_or(|p| p == b.permission)
    }
}

/// What the authorizer is told at start-up.
#[derive(Debug, Clone, Default)]
pub struct AuthorizerConfig {
    /// ACLs are enforced; off: every client may do everything (no authorizer, as in Kafka).
    pub enabled: bool,
    /// Principals (`User:<name>`) allowed everything.
    pub super_users: Vec<String>,
    /// A resource that no binding names is open to everyone (Kafka's
    /// `allow.everyone.if.no.acl.found`).
    pub allow_if_no_acl: bool,
}

/// Whether `principal` from `host` may do `op` on the resource, under `acls`.
pub fn authorize(
    config: &AuthorizerConfig,
    acls: &[AclBinding],
    principal: &str,
    host: &str,
    op: Operation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    if !config.enabled || config.super_users.iter().any(|s| s == principal) {
        return true;
    }
    let mut named = false;
    let mut allowed = false;
    for b in acls
        .iter()
        .filter(|b| b.resource_type == resource_type && b.covers(name))
    {
        named = true;
        if !b.applies_to(principal, host) {
            continue;
        }
        match b.permission {
            Permission::Deny if b.operation == op || b.operation == Operation::All => return false,
            Permission::Allow if b.operation.allows(op) => allowed = true,
            _ => {}
        }
    }
    allowed || !named && config.allow_if_no_acl
}

/// Whether `principal` is allowed `op` on some topic (Kafka's `authorizeByResourceType`, for
/// InitProducerId without IDEMPOTENT_WRITE on the cluster): by an ALLOW binding, or, with
/// `allow_if_no_acl`, because some topic is named by no binding; a DENY for all topics (literal
/// `*`) overrides both.
pub fn allowed_on_some_topic(
    config: &AuthorizerConfig,
    acls: &[AclBinding],
    principal: &str,
    host: &str,
    op: Operation,
) -> bool {
    if !config.enabled || config.super_users.iter().any(|s| s == principal) {
        return true;
    }
    let topic_acls = || {
        acls.iter()
            .filter(|b| b.resource_type == ResourceType::Topic && b.applies_to(principal, host))
    };
    let denied_everywhere = topic_acls().any(|b| {
        b.permission == Permission::Deny
            && b.pattern == PatternType::Literal
            && b.name == "*"
            && (b.operation == op || b.operation == Operation::All)
    });
    // With allow-everyone-if-no-acl-found, a topic no ACL names exists unless one names them all.
    let some_topic_unnamed = config.allow_if_no_acl
        && !acls.iter().any(|b| {
            b.resource_type == ResourceType::Topic
                && (b.pattern == PatternType::Literal && b.name == "*"
                    || b.pattern == PatternType::Prefixed && b.name.is_empty())
        });
    !denied_everywhere
        && (some_topic_unnamed
            || topic_acls().any(|b| b.permission == Permission::Allow && b.operation.allows(op)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        rt: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: Operation,
        permission: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt,
            name: name.into(),
            pattern,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission,
        }
    }

    #[test]
    fn decisions_follow_kafka() {
        use Operation::*;
        use PatternType::*;
        use Permission::*;
        use ResourceType::*;
        let on = AuthorizerConfig {
            enabled: true,
            super_users: vec!["User:admin".into()],
            allow_if_no_acl: false,
        };
        let acls = vec![
            acl(Topic, "orders", Literal, "User:alice", Read, Allow),
            acl(Topic, "logs.", Prefixed, "User:alice", Write, Allow),
            acl(Topic, "logs.secret", Literal, "User:alice", All, Deny),
            acl(Group, "g", Literal, "User:*", Read, Allow),
        ];
        let can =
            |who: &str, op, rt, name: &str| authorize(&on, &acls, who, "1.2.3.4", op, rt, name);
        assert!(can("User:alice", Read, Topic, "orders"));
        assert!(
            can("User:alice", Describe, Topic, "orders"),
            "READ implies DESCRIBE"
        );
        assert!(!can("User:alice", Write, Topic, "orders"));
        assert!(can("User:alice", Write, Topic, "logs.app"), "prefixed");
        assert!(
            !can("User:alice", Write, Topic, "logs.secret"),
            "deny beats allow"
        );
        assert!(!can("User:alice", Describe, Topic, "logs.secret"));
        assert!(!can("User:bob", Read, Topic, "orders"));
        assert!(can("User:bob", Read, Group, "g"), "User:*");
        assert!(!can("User:alice", Read, Topic, "other"), "no ACL: denied");
        assert!(can("User:admin", Delete, Topic, "anything"), "super user");
        let open = AuthorizerConfig {
            allow_if_no_acl: true,
            ..on.clone()
        };
        assert!(authorize(
            &open, &acls, "User:bob", "h", Read, Topic, "other"
        ));
        assert!(
            !authorize(&open, &acls, "User:bob", "h", Read, Topic, "orders"),
            "named: closed"
        );
        assert!(allowed_on_some_topic(&on, &acls, "User:alice", "h", Write));
        assert!(!allowed_on_some_topic(&on, &acls, "User:bob", "h", Write));
        assert!(allowed_on_some_topic(&open, &acls, "User:bob", "h", Write));
        let off = AuthorizerConfig::default();
        assert!(authorize(
            &off,
            &[],
            "User:ANONYMOUS",
            "h",
            Alter,
            Cluster,
            CLUSTER
        ));
    }

    #[test]
    fn filters_and_validation() {
        let b = acl(
            ResourceType::Topic,
            "logs.",
            PatternType::Prefixed,
            "User:a",
            Operation::Write,
            Permission::Allow,
        );
        let any = AclFilter {
            resource_type: None,
            name: None,
            pattern: PatternFilter::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        };
        assert!(any.matches(&b));
        assert!(AclFilter {
            pattern: PatternFilter::Match,
            name: Some("logs.x".into()),
            ..any.clone()
        }
        .matches(&b));
        assert!(!AclFilter {
            pattern: PatternFilter::Exactly(PatternType::Literal),
            ..any.clone()
        }
        .matches(&b));
        assert!(!AclFilter {
            principal: Some("User:b".into()),
            ..any.clone()
        }
        .matches(&b));
        assert!(b.validate().is_ok());
        for bad in [
            AclBinding {
                principal: "alice".into(),
                ..b.clone()
            },
            AclBinding {
                name: "".into(),
                ..b.clone()
            },
            AclBinding {
                resource_type: ResourceType::Cluster,
                name: "x".into(),
                ..b.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
