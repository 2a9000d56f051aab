//! The core-to-core mesh: the messages cores send each other ([`CoreMsg`]) and a core's end of
//! the channels ([`Mesh`]): send, ask and wait for an answer with a deadline. What the messages
//! mean (topic changes, statistics, live settings) is the control plane's ([`crate::control`]).

use crate::stats::CoreSnapshot;
use crate::table::TopicTable;
use glommio::channels::channel_mesh::Senders;
use glommio::channels::local_channel::{self, LocalSender};
use kafka_protocol::error::ResponseError;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A topic to create, as asked.
#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    /// -1: the server default.
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// A change of the topic table, decided by core 0.
#[derive(Debug, Clone)]
pub enum TopicChange {
    /// CreateTopics.
    Create {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    /// CreatePartitions.
    Grow {
        topics: Vec<NewPartitions>,
        validate_only: bool,
    },
    /// AlterConfigs, IncrementalAlterConfigs (topics).
    Configure {
        changes: Vec<ConfigChange>,
        validate_only: bool,
    },
    /// DeleteTopics.
    Delete { names: Vec<String> },
    /// CreateAcls (already validated): one outcome per binding.
    CreateAcls {
        bindings: Vec<crate::table::acl::AclBinding>,
    },
    /// DeleteAcls: one outcome per filter, with the bindings it deleted.
    DeleteAcls {
        filters: Vec<crate::table::acl::AclFilter>,
    },
    /// Edge mode: the topics become exactly the upstream's (name -> partitions, topic id).
    Mirror {
        topics: std::collections::BTreeMap<String, (i32, [u8; 16])>,
    },
}

/// Changes to one topic's own configs.
#[derive(Debug, Clone)]
pub struct ConfigChange {
    pub topic: String,
    /// Start from no configs of the topic's own (AlterConfigs) rather than the current ones
    /// (IncrementalAlterConfigs).
    pub replace: bool,
    pub ops: Vec<ConfigOp>,
}

/// One operation on a topic config (Kafka's names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOp {
    Set(String, String),
    /// Back to the server's value.
    Delete(String),
    /// Add to a list config, unless there.
    Append(String, String),
    /// Remove from a list config.
    Subtract(String, String),
    /// An operation code that is none of the four, or one without its value.
    Invalid(String, i8),
}

/// A topic to grow to `count` partitions (CreatePartitions).
#[derive(Debug, Clone)]
pub struct NewPartitions {
    pub name: String,
    pub count: i32,
    /// The brokers (cores) asked for each new partition, if the client chose them.
    pub assignments: Option<Vec<Vec<i32>>>,
}

/// The outcome for one topic of a create or delete.
#[derive(Debug, Clone)]
pub struct TopicOutcome {
    pub name: String,
    pub error: Option<(ResponseError, String)>,
    pub partitions: i32,
    pub id: [u8; 16],
    /// DeleteAcls: the bindings the filter deleted.
    pub acls: Vec<crate::table::acl::AclBinding>,
}

/// A client connection one core hands to another, with the request head it already read: a
/// stream of a partition this core holds no copy of goes to the partition's owner.
#[derive(Debug)]
pub struct HandedStream {
    /// The connection's socket: closed with the message if it is never taken.
    pub fd: std::os::fd::OwnedFd,
    /// The request head as the client sent it.
    pub head: Vec<u8>,
}

/// What cores send each other.
#[derive(Debug)]
pub enum CoreMsg {
    /// A stream connection handed to this core (the partition's owner).
    Stream(HandedStream),
    /// A topic change for core 0 to decide.
    Change {
        from: usize,
        id: u64,
        change: TopicChange,
    },
    Outcomes {
        id: u64,
        outcomes: Vec<TopicOutcome>,
    },
    Apply {
        from: usize,
        id: u64,
        table: TopicTable,
    },
    Applied {
        id: u64,
    },
    /// The core's figures, with each partition's or not.
    Stats {
        from: usize,
        id: u64,
        partitions: bool,
    },
    /// A live setting changed through the admin API.
    Set {
        from: usize,
        id: u64,
        setting: Setting,
    },
    StatsReply {
        id: u64,
        snapshot: Box<CoreSnapshot>,
    },
    /// Read replicas of hot partitions (see [`crate::replicas`]); handled in arrival order.
    Replica(crate::replicas::ReplicaMsg),
    /// Consumer group lag: a coordinator core asks an owner core for the ends of the partitions
    /// its groups committed offsets for (all of that core's in one message).
    PartitionEnds {
        from: usize,
        id: u64,
        asked: Vec<crate::groups::lag::EndQuery>,
    },
    PartitionEndsReply {
        id: u64,
        ends: Vec<crate::groups::lag::PartitionEnd>,
    },
    /// A transaction coordinator asks a partition's owner core or a group's coordinator core
    /// (see [`crate::cores::transaction_markers`]).
    Txn {
        from: usize,
        id: u64,
        /// The asking core's topic table revision: a partition the asked core's table lacks was
        /// deleted only if that table is at least as new.
        revision: u64,
        ask: crate::transactions::TxnAsk,
    },
    /// A core has registered its open transactions' partitions again with their owners after the
    /// start (sent once, to every other core).
    TxnsRegistered {
        from: usize,
    },
    /// One result per item asked (`None`: done).
    TxnReply {
        id: u64,
        results: Vec<Option<ResponseError>>,
    },
}

/// Settings that change without a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    FetchCoalescing(bool),
    ViewSharing(bool),
    MaxDeltaForFanout(i64),
    ReadReplicas(crate::table::configs::ReplicaPolicy),
    /// How often coordinator cores compute their groups' lag (zero: never).
    GroupLagInterval(Duration),
}

/// A request sent to another core, waiting for its answer.
pub(crate) struct Asked {
    id: u64,
    rx: glommio::channels::local_channel::LocalReceiver<CoreMsg>,
    to: usize,
}

/// How long a core waits for another to apply a change or answer a question.
pub(crate) const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const QUESTION_TIMEOUT: Duration = Duration::from_secs(5);

/// A core's end of the control plane.
#[derive(Debug)]
pub struct Mesh {
    senders: Option<Senders<CoreMsg>>,
    next_id: Cell<u64>,
    waiting: RefCell<HashMap<u64, LocalSender<CoreMsg>>>,
    /// Core 0 applies one change at a time.
    pub(crate) changes: glommio::sync::Semaphore,
}

impl Mesh {
    pub fn new(senders: Option<Senders<CoreMsg>>) -> Self {
        Self {
            senders,
            next_id: Cell::new(1),
            waiting: RefCell::new(HashMap::new()),
            changes: glommio::sync::Semaphore::new(1),
        }
    }

    fn register(&self) -> (u64, local_channel::LocalReceiver<CoreMsg>) {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = local_channel::new_bounded(1);
        self.waiting.borrow_mut().insert(id, tx);
        (id, rx)
    }

    pub(crate) async fn send(&self, to: usize, msg: CoreMsg) -> bool {
        let sent = match &self.senders {
            Some(s) => s.send_to(to, msg).await.is_ok(),
            None => false,
        };
        if !sent {
            log::error!("control message to core {to} could not be sent");
        }
        sent
    }

    /// Sends the request `msg(id)` to core `to`; `None` if it could not be sent.
    pub(crate) async fn ask(&self, to: usize, msg: impl FnOnce(u64) -> CoreMsg) -> Option<Asked> {
        let (id, rx) = self.register();
        if self.send(to, msg(id)).await {
            Some(Asked { id, rx, to })
        } else {
            self.waiting.borrow_mut().remove(&id);
            None
        }
    }

    /// The answer to `asked`, or `None` after `deadline` (a dead or stuck core must not wedge the
    /// control plane; the late answer, if any, is dropped).
    pub(crate) async fn answer(&self, asked: Asked, deadline: Instant) -> Option<CoreMsg> {
        let timeout = async {
            glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
            None
        };
        let reply = futures_lite::future::or(asked.rx.recv(), timeout).await;
        if reply.is_none() {
            self.waiting.borrow_mut().remove(&asked.id);
            log::error!("core {} did not answer a control request in time", asked.to);
        }
        reply
    }

    /// Delivers a reply to whoever waits for `id`.
    pub(crate) fn complete(&self, id: u64, msg: CoreMsg) {
        if let Some(tx) = self.waiting.borrow_mut().remove(&id) {
            let _ = tx.try_send(msg);
        }
    }
}
