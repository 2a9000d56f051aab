//! Read replicas of hot partitions on the other cores (KIP-392's follower fetching, between the
//! cores of one machine).
//!
//! The owner core stays the partition's leader: it appends, and every change of its log is handed,
//! once per batch per replica core, to the cores that hold a replica ([`shards::Handover`]: the
//! write's batches as shared slices of the owner's tail cache, or a snapshot of the segments after
//! a roll, a compaction swap, retention). A replica core serves fetches of the partition with its
//! own tail cache, coalescer and view readers, reading older data from the owner's files itself.
//! Consumers are steered to replica cores by Kafka's own `preferred_read_replica` (Fetch v11+),
//! by load, and stay on the core they were given ([`Replicas::steer`]).
//!
//! When: `--read-replicas all` (every partition, on every other core), `off`, or `auto` (the
//! default): a partition gets replicas once `--read-replica-min-consumers` connections fetch it
//! on its owner core, or the owner core is busy with at least two, and loses them after
//! [`COOL_FOR`] with fewer than half that many consumers over all its cores. A topic's
//! `shoal.read.replicas` config overrides the server's policy.
//!
//! Everything here is the core's own (`Rc`, `Cell`): messages to other cores leave through an
//! outbox that the core's sender task drains onto the mesh, in order ([`Replicas::outbox`]).
//!
//! ## Layout, top layer first
//! - `receive`  — the replica core's side: the replicas it holds, fed in arrival order.
//! - `feed`     — the owner's side: starting and stopping replicas, handing each change over.
//! - `steering` — where a consumer's fetch is served (`preferred_read_replica`).
//! - `policy`   — which partitions get replicas (`all`, `off`, `auto`).
//! - `stats`    — the counters and their `/metrics` families.

mod feed;
mod policy;
mod receive;
mod stats;
mod steering;

pub use stats::ReplicaStats;
pub use steering::Steer;

use crate::table::configs::ReplicaPolicy;
use feed::{resync, Fed, Outbox};
use glommio::channels::local_channel::{self, LocalReceiver};
use receive::Held;
use shards::partition::Partition;
use shards::{FastMap, Handover, LogConfig, LogSnapshot};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A new id for a client connection (Kafka or HTTP stream), unique in the process: replicas count
/// and steer consumers by connection.
pub fn connection_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// How long a connection counts as fetching a partition after its last fetch of it.
pub const FETCHING_WITHIN: Duration = Duration::from_secs(10);
/// How often replicas are started or stopped, and replica cores report their load.
pub const TICK: Duration = Duration::from_secs(1);
/// `auto`: how long a partition must stay cool before its replicas stop.
pub const COOL_FOR: Duration = Duration::from_secs(30);
/// How long a core's wish for a replica (a `Want`, a report of streams reading it) keeps it.
const WANT_HOLDS: Duration = Duration::from_secs(5);
/// `auto`: a core this busy (share of its time) counts as busy.
const BUSY: f64 = 0.75;
/// Hand-overs waiting for one core beyond which that core is resynchronized with snapshots
/// instead (a core that cannot keep up must not make the owner hold its batches without bound).
const MAX_QUEUED: u32 = 4096;
/// How long after being sent to a replica core a consumer may still be missing from that core's
/// report (its first fetch there, and the report's way back).
const REPORT_LAG: Duration = Duration::from_millis(250);
/// Most consumers whose core is remembered per partition (each remembered [`STEER_MEMORY`]).
const MAX_STEERED: usize = 100_000;
const STEER_MEMORY: Duration = Duration::from_secs(600);

/// The settings: `--read-replicas` (live: `PUT /v1/config/read_replicas`) and
/// `--read-replica-min-consumers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaConfig {
    pub policy: ReplicaPolicy,
    pub min_consumers: u32,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            policy: ReplicaPolicy::Auto,
            min_consumers: 8,
        }
    }
}

/// One partition's log as its owner core opened it: topic, index, and the log's process-unique
/// id, so a message about a deleted (or re-created) partition is never taken for another's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaOf {
    pub topic: String,
    pub partition: i32,
    pub topic_id: [u8; 16],
    /// The owner's [`shards::Log::id`].
    pub source: u64,
}

/// What cores say to each other about read replicas (carried by the mesh in arrival order).
#[derive(Debug)]
pub enum ReplicaMsg {
    /// Owner to replica core: hold a replica of this log, from this snapshot.
    Start {
        of: ReplicaOf,
        owner: usize,
        config: Box<LogConfig>,
        snapshot: LogSnapshot,
    },
    /// Owner to replica core: the next change of the log.
    Feed { of: ReplicaOf, handover: Handover },
    /// Owner to replica core: drop the replica (its fetches answer NOT_LEADER_OR_FOLLOWER).
    Stop { of: ReplicaOf },
    /// Replica core to owner: its hand-overs fell out of step; it needs a fresh snapshot.
    Resync { of: ReplicaOf, from: usize },
    /// Replica core to owner, every tick: its fetch connections of the partition, and how busy it
    /// is (percent).
    Load {
        of: ReplicaOf,
        from: usize,
        connections: u32,
        busy_percent: u32,
        /// Streams (HTTP subscribers) reading the replica: it stays while there are any.
        streams: u32,
    },
    /// A core to a partition's owner: it has stream subscribers of the partition and wants a
    /// replica of it (answered with `Start` unless the topic's policy is `off`).
    Want {
        topic: String,
        partition: i32,
        from: usize,
    },
    /// Owner to every core: the partition's replica cores now (Metadata's `replicas` and `isr`).
    Cores { of: ReplicaOf, cores: Vec<i32> },
}

/// The connections of one partition (owned or held) on this core, with their last fetch.
#[derive(Default)]
struct Fetchers {
    topic: String,
    partition: i32,
    last: FastMap<u64, Instant>,
}

impl Fetchers {
    fn active(&self, now: Instant) -> u32 {
        self.last
            .values()
            .filter(|&&t| now.duration_since(t) < FETCHING_WITHIN)
            .count() as u32
    }
}

/// One core's side of every read replica: the partitions it feeds, the replicas it holds, what
/// it knows of every partition's replica cores, and its fetch connections per partition.
pub struct Replicas {
    me: usize,
    cores: usize,
    config: Cell<ReplicaConfig>,
    outbox: Rc<Outbox>,
    outgoing: RefCell<Option<LocalReceiver<(usize, ReplicaMsg)>>>,
    fed: RefCell<FastMap<u64, Rc<Fed>>>,
    held: RefCell<HashMap<String, HashMap<i32, Held>>>,
    /// Every partition's replica cores as their owners last said (Metadata on any core).
    sets: RefCell<HashMap<String, HashMap<i32, Vec<i32>>>>,
    fetchers: RefCell<FastMap<u64, Fetchers>>,
    /// Stream subscribers on this core of each partition (owned or held), by log id.
    streams: RefCell<FastMap<u64, u32>>,
    handover_batches: Cell<u64>,
    handover_bytes: Cell<u64>,
    snapshots: Cell<u64>,
    redirects: Cell<u64>,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("config", &self.config.get())
            .field("fed", &self.fed.borrow().len())
            .field("held", &self.held.borrow().len())
            .finish()
    }
}
impl Replicas {
    pub fn new(me: usize, cores: usize, config: ReplicaConfig) -> Self {
        let (tx, rx) = local_channel::new_unbounded();
        Self {
            me,
            cores,
            config: Cell::new(config),
            outbox: Rc::new(Outbox {
                tx,
                queued: (0..cores).map(|_| Cell::new(0)).collect(),
                lagging: (0..cores).map(|_| Cell::new(false)).collect(),
            }),
            outgoing: RefCell::new(Some(rx)),
            fed: RefCell::default(),
            held: RefCell::default(),
            sets: RefCell::default(),
            fetchers: RefCell::default(),
            streams: RefCell::default(),
            handover_batches: Cell::new(0),
            handover_bytes: Cell::new(0),
            snapshots: Cell::new(0),
            redirects: Cell::new(0),
        }
    }

    pub fn config(&self) -> ReplicaConfig {
        self.config.get()
    }

    pub fn set_policy(&self, policy: ReplicaPolicy) {
        if policy != self.config.get().policy {
            log::info!("core {}: read replicas {}", self.me, policy.name());
        }
        self.config.set(ReplicaConfig {
            policy,
            ..self.config.get()
        });
    }

    /// The messages for other cores, once: the core's sender task puts them on the mesh in
    /// order and calls [`Replicas::sent`] after each.
    pub fn outbox(&self) -> Option<LocalReceiver<(usize, ReplicaMsg)>> {
        self.outgoing.borrow_mut().take()
    }

    /// A message to `to` has left. A core whose queue overflowed is fed again, with a fresh
    /// snapshot of every partition it holds, once its queue has drained.
    pub fn sent(&self, to: usize) {
        let q = &self.outbox.queued[to];
        q.set(q.get().saturating_sub(1));
        if q.get() == 0 && self.outbox.lagging[to].replace(false) {
            let fed: Vec<Rc<Fed>> = self.fed.borrow().values().cloned().collect();
            for f in fed.iter().filter(|f| f.cores.borrow().contains(&to)) {
                resync(&self.outbox, f, to);
            }
        }
    }

    // ---- every core: the fetch connections of each partition --------------------------------

    /// Connection `conn` fetched this partition (owned or held) now.
    pub fn note_fetch(&self, part: &Partition, conn: u64, now: Instant) {
        let mut fetchers = self.fetchers.borrow_mut();
        let f = fetchers.entry(part.log.id()).or_insert_with(|| Fetchers {
            topic: part.topic.clone(),
            partition: part.index,
            last: FastMap::default(),
        });
        f.last.insert(conn, now);
    }

    /// A connection that fetched closed: it no longer counts as fetching anything here, and an
    /// owner forgets the core it gave it.
    pub fn connection_closed(&self, conn: u64) {
        for f in self.fetchers.borrow_mut().values_mut() {
            f.last.remove(&conn);
        }
        for f in self.fed.borrow().values() {
            f.steered.borrow_mut().remove(&conn);
        }
    }

    /// A stream subscriber of the partition of log `log_id` opened here; it holds a read replica
    /// on this core for as long as it lives (see [`Replicas::stream_closed`]).
    pub fn stream_opened(&self, log_id: u64) {
        *self.streams.borrow_mut().entry(log_id).or_default() += 1;
    }

    pub fn stream_closed(&self, log_id: u64) {
        let mut streams = self.streams.borrow_mut();
        if let Some(n) = streams.get_mut(&log_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&log_id);
            }
        }
    }

    fn streams_of(&self, log_id: u64) -> u32 {
        self.streams.borrow().get(&log_id).copied().unwrap_or(0)
    }

    /// Asks `owner` for a read replica of `topic`/`partition` on this core, for stream
    /// subscribers that landed here.
    pub fn ask_for(&self, owner: usize, topic: &str, partition: i32) {
        if owner == self.me || owner >= self.cores {
            return;
        }
        self.outbox.send(
            owner,
            ReplicaMsg::Want {
                topic: topic.to_string(),
                partition,
                from: self.me,
            },
        );
    }

    /// On the owner: `from` wants a replica of `part` for its stream subscribers; started at once
    /// unless `policy` is `off`, and kept while that core's streams read it.
    pub fn want(&self, part: &Rc<Partition>, from: usize, policy: ReplicaPolicy) {
        if policy == ReplicaPolicy::Off || from == self.me || from >= self.cores {
            return;
        }
        let fed_there = |fed: &FastMap<u64, Rc<Fed>>| {
            fed.get(&part.log.id())
                .is_some_and(|f| f.cores.borrow().contains(&from))
        };
        if !fed_there(&self.fed.borrow()) {
            self.start(part, from);
        }
        if let Some(f) = self.fed.borrow().get(&part.log.id()) {
            f.wanted.borrow_mut().insert(from, Instant::now());
        }
    }

    /// Connections that fetched the partition of log `log_id` here lately.
    pub fn fetch_connections(&self, log_id: u64, now: Instant) -> u32 {
        self.fetchers
            .borrow()
            .get(&log_id)
            .map_or(0, |f| f.active(now))
    }
}
