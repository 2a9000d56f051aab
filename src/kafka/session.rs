//! Who is on a connection, and what they may do: the principal authentication gave, and the ACL
//! decisions taken for it so far. Each (resource, operation) is decided once per connection and
//! kept until the ACLs change (the topic table's revision moves), on the core that owns the
//! connection: no lock and no cross-core call per request.

use crate::auth::Principal;
use crate::cores::Core;
use crate::table::acl::{self, Operation, ResourceType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Decisions kept per connection at most (a client naming ever new topics starts over).
const MAX_DECISIONS: usize = 4096;

/// ACL decisions by (resource type, operation), then resource name as the client named it: a
/// decision already taken is found by `&str`, with no allocation per request.
#[derive(Debug, Default)]
struct Decisions {
    /// The topic table revision they were taken under (ACLs live in the table).
    revision: u64,
    count: usize,
    by_kind: HashMap<(ResourceType, Operation), HashMap<Box<str>, bool>>,
}

#[derive(Debug)]
pub struct Session {
    /// The client's address, for logs.
    pub peer: Rc<str>,
    /// Identifies the connection among every one the process accepted (read replicas steer
    /// consumers per connection).
    pub id: u64,
    pub principal: Principal,
    /// The listener the client connected to (index in `Core::listeners`): Metadata and
    /// FindCoordinator name that listener's ports.
    pub listener: usize,
    principal_name: String,
    host: String,
    decisions: RefCell<Decisions>,
    /// Edge mode: this connection's own connections to upstream group coordinators.
    pub forwarder: crate::kafka::upstream::Forwarder,
}

impl Session {
    pub fn new(
        peer: Rc<str>,
        principal: Principal,
        host: Option<std::net::IpAddr>,
        listener: usize,
    ) -> Self {
        Self {
            peer,
            id: crate::replicas::connection_id(),
            listener,
            principal_name: principal.to_string(),
            principal,
            host: host.map_or_else(|| "*".into(), |h| h.to_string()),
            decisions: RefCell::default(),
            forwarder: Default::default(),
        }
    }

    /// Whether this connection may do `op` on the resource (always, with no authorizer). A denial
    /// is logged the first time it is decided on the connection.
    pub fn allowed(&self, core: &Core, op: Operation, rt: ResourceType, name: &str) -> bool {
        let config = &core.config().authorizer;
        if !config.enabled {
            return true;
        }
        let revision = core.topics().revision;
        let mut decisions = self.decisions.borrow_mut();
        if decisions.revision != revision || decisions.count >= MAX_DECISIONS {
            *decisions = Decisions {
                revision,
                ..Decisions::default()
            };
        }
        if let Some(&d) = decisions.by_kind.get(&(rt, op)).and_then(|m| m.get(name)) {
            return d;
        }
        // A view is its source's data: its source's ACLs decide.
        let source = match rt {
            ResourceType::Topic => crate::table::source_topic(name).unwrap_or(name),
            _ => name,
        };
        let d = acl::authorize(
            config,
            &core.topics().acls,
            &self.principal_name,
            &self.host,
            op,
            rt,
            source,
        );
        if !d {
            log::info!(
                "denied: {} from {} may not {op:?} {rt:?} {source}",
                self.principal_name,
                self.peer
            );
        }
        decisions.count += 1;
        decisions
            .by_kind
            .entry((rt, op))
            .or_default()
            .insert(name.into(), d);
        d
    }

    pub fn may_topic(&self, core: &Core, op: Operation, topic: &str) -> bool {
        self.allowed(core, op, ResourceType::Topic, topic)
    }

    pub fn may_group(&self, core: &Core, op: Operation, group: &str) -> bool {
        self.allowed(core, op, ResourceType::Group, group)
    }

    pub fn may_transactional_id(&self, core: &Core, op: Operation, id: &str) -> bool {
        self.allowed(core, op, ResourceType::TransactionalId, id)
    }

    pub fn may_cluster(&self, core: &Core, op: Operation) -> bool {
        self.allowed(core, op, ResourceType::Cluster, acl::CLUSTER)
    }

    /// InitProducerId without a transactional id: IDEMPOTENT_WRITE on the cluster, or WRITE on
    /// some topic (KIP-679).
    pub fn may_write_idempotently(&self, core: &Core) -> bool {
        self.may_cluster(core, Operation::IdempotentWrite)
            || acl::allowed_on_some_topic(
                &core.config().authorizer,
                &core.topics().acls,
                &self.principal_name,
                &self.host,
                Operation::Write,
            )
    }
}
