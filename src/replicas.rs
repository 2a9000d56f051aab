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

use crate::metrics::{core_label, Exposition, Family};
use crate::partition::Partition;
use crate::topic_configs::ReplicaPolicy;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use shards::{FastMap, Handover, LogConfig, LogEvent, LogSnapshot, TailCache, WeakLog};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a connection counts as fetching a partition after its last fetch of it.
pub const FETCHING_WITHIN: Duration = Duration::from_secs(10);
/// How often replicas are started or stopped, and replica cores report their load.
pub const TICK: Duration = Duration::from_secs(1);
/// `auto`: how long a partition must stay cool before its replicas stop.
pub const COOL_FOR: Duration = Duration::from_secs(30);
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
    },
    /// Owner to every core: the partition's replica cores now (Metadata's `replicas` and `isr`).
    Cores { of: ReplicaOf, cores: Vec<i32> },
}

/// Messages on their way to other cores, and how many wait for each.
#[derive(Debug)]
struct Outbox {
    tx: LocalSender<(usize, ReplicaMsg)>,
    queued: Vec<Cell<u32>>,
    /// Cores whose queue overflowed: fed again with snapshots once it has drained.
    lagging: Vec<Cell<bool>>,
}

impl Outbox {
    fn send(&self, to: usize, msg: ReplicaMsg) {
        let q = &self.queued[to];
        if matches!(msg, ReplicaMsg::Feed { .. }) {
            if self.lagging[to].get() {
                return;
            }
            if q.get() >= MAX_QUEUED {
                log::warn!("read replicas: core {to} is {MAX_QUEUED} hand-overs behind; it gets snapshots once it catches up");
                self.lagging[to].set(true);
                return;
            }
        }
        q.set(q.get() + 1);
        // Unbounded and never closed while the core runs.
        let _ = self.tx.try_send((to, msg));
    }
}

/// A partition this core owns that has replicas on other cores.
struct Fed {
    of: ReplicaOf,
    log: WeakLog,
    config: RefCell<LogConfig>,
    /// The replica cores.
    cores: RefCell<Vec<usize>>,
    /// What each replica core last reported: (fetch connections of the partition, busy share),
    /// and when consumers were sent there lately (those the report may not count yet).
    reported: RefCell<FastMap<usize, (u32, f64)>>,
    sent_lately: RefCell<FastMap<usize, Vec<Instant>>>,
    /// Owner connections and the core each was given, with when it was last seen.
    steered: RefCell<FastMap<u64, (usize, Instant)>>,
    /// `auto`: since when the partition has been cool.
    cool_since: Cell<Option<Instant>>,
}

/// A replica this core holds of another core's partition.
struct Held {
    partition: Rc<Partition>,
    source: u64,
    owner: usize,
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

/// The counters of one core's replicas (see [`crate::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Replicas this core holds of other cores' partitions.
    pub held: u64,
    /// Partitions of this core that have replicas elsewhere.
    pub fed: u64,
    /// Batches and bytes handed to this core by owners.
    pub handover_batches: u64,
    pub handover_bytes: u64,
    /// Snapshots this core took in (replicas started, segments changed, resynchronizations).
    pub snapshots: u64,
    /// Fetch answers of this core naming another core as the preferred read replica.
    pub redirects: u64,
    /// Fetch connections per partition on this core (open, and fetched it within
    /// [`FETCHING_WITHIN`]).
    pub fetch_connections: Vec<(String, i32, u32)>,
    /// Held and fed replicas: (topic, partition, replica cores).
    pub replica_cores: Vec<(String, i32, Vec<i32>)>,
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

/// What a fetch of a partition on its owner core should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    /// Serve it here.
    Here,
    /// Answer with no records and this core as the preferred read replica.
    To(i32),
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

    /// Connections that fetched the partition of log `log_id` here lately.
    pub fn fetch_connections(&self, log_id: u64, now: Instant) -> u32 {
        self.fetchers
            .borrow()
            .get(&log_id)
            .map_or(0, |f| f.active(now))
    }

    // ---- owner side --------------------------------------------------------------------------

    /// Where a consumer's fetch of `part` (owned here) should be served; `Here` unless the
    /// partition has replicas. A connection keeps the core it was given while that core holds a
    /// replica; a new one gets the least loaded of the owner and the replica cores.
    pub fn steer(&self, part: &Partition, conn: u64, busy: f64, now: Instant) -> Steer {
        let Some(fed) = self.fed.borrow().get(&part.log.id()).cloned() else {
            return Steer::Here;
        };
        let cores = fed.cores.borrow();
        let mut steered = fed.steered.borrow_mut();
        if let Some((core, seen)) = steered.get_mut(&conn) {
            *seen = now;
            if *core == self.me {
                return Steer::Here;
            }
            if cores.contains(core) {
                // Sent to a replica and back here: a client that does not follow
                // preferred_read_replica (kafkajs), or one its replica sent back. It is served
                // here from now on.
                *core = self.me;
                return Steer::Here;
            }
            // Its replica has stopped: it is given a core again.
        }
        let reported = fed.reported.borrow();
        let mut sent = fed.sent_lately.borrow_mut();
        // Without reports (a replica core that stopped answering) these would only grow.
        sent.values_mut()
            .for_each(|s| s.retain(|&t| now.duration_since(t) < FETCHING_WITHIN));
        // Consumers here: connections that fetched lately and were not sent elsewhere (this one,
        // new, is not counted: it has not been given a core yet).
        let here = self.fetchers.borrow().get(&part.log.id()).map_or(0, |f| {
            f.last
                .iter()
                .filter(|(c, t)| {
                    **c != conn
                        && now.duration_since(**t) < FETCHING_WITHIN
                        && steered.get(*c).is_none_or(|(core, _)| *core == self.me)
                })
                .count() as u32
        });
        // Consumers decide; a core past the busy mark counts double, so a saturated core gets
        // fewer (a transient busy share must not skew the split of a burst of new consumers).
        let load = |consumers: u32, busy: f64| {
            (consumers + 1) as f64 * if busy >= BUSY { 2.0 } else { 1.0 }
        };
        let mut best = (load(here, busy), self.me);
        for &core in cores.iter() {
            let (consumers, busy) = reported.get(&core).copied().unwrap_or((0, 0.0));
            let consumers = consumers + sent.get(&core).map_or(0, |s| s.len() as u32);
            // Ties go to the replica: the owner also takes the partition's appends.
            let l = load(consumers, busy);
            if l <= best.0 {
                best = (l, core);
            }
        }
        let core = best.1;
        if core != self.me {
            sent.entry(core).or_default().push(now);
        }
        if steered.len() >= MAX_STEERED {
            steered.retain(|_, (_, seen)| now.duration_since(*seen) < STEER_MEMORY);
        }
        steered.insert(conn, (core, now));
        self.answer(core)
    }

    fn answer(&self, core: usize) -> Steer {
        if core == self.me {
            Steer::Here
        } else {
            self.redirects.set(self.redirects.get() + 1);
            Steer::To(core as i32)
        }
    }

    /// The replica cores `part` (owned here) should have now, given its topic's policy and how
    /// busy this core is; then starts and stops replicas to match.
    pub fn evaluate(&self, part: &Rc<Partition>, policy: ReplicaPolicy, busy: f64, now: Instant) {
        if self.cores < 2 {
            return;
        }
        let current: Vec<usize> = self
            .fed
            .borrow()
            .get(&part.log.id())
            .map(|f| f.cores.borrow().clone())
            .unwrap_or_default();
        let others: Vec<usize> = (0..self.cores).filter(|&c| c != self.me).collect();
        let wanted = match policy {
            ReplicaPolicy::All => others,
            ReplicaPolicy::Off => Vec::new(),
            ReplicaPolicy::Auto => self.auto_wanted(part, busy, now, current.clone(), others),
        };
        for &core in wanted.iter().filter(|c| !current.contains(c)) {
            self.start(part, core);
        }
        for &core in current.iter().filter(|c| !wanted.contains(c)) {
            self.stop(part.log.id(), core);
        }
    }

    /// `auto`: every other core once the partition is hot; none once it has been cool for
    /// [`COOL_FOR`]; else as now.
    fn auto_wanted(
        &self,
        part: &Partition,
        busy: f64,
        now: Instant,
        current: Vec<usize>,
        others: Vec<usize>,
    ) -> Vec<usize> {
        let min = self.config.get().min_consumers.max(1);
        let here = self.fetch_connections(part.log.id(), now);
        if here >= min || (busy >= BUSY && here >= 2) {
            if let Some(f) = self.fed.borrow().get(&part.log.id()) {
                f.cool_since.set(None);
            }
            return others;
        }
        let Some(fed) = self.fed.borrow().get(&part.log.id()).cloned() else {
            return current;
        };
        let total = here + fed.reported.borrow().values().map(|r| r.0).sum::<u32>();
        if total * 2 >= min {
            fed.cool_since.set(None);
            return current;
        }
        let since = fed.cool_since.get().unwrap_or(now);
        fed.cool_since.set(Some(since));
        if now.duration_since(since) >= COOL_FOR {
            Vec::new()
        } else {
            current
        }
    }

    /// Starts a replica of `part` on `core`: the log's hook (set with the first replica) hands
    /// every change over from now on, after the snapshot sent first.
    fn start(&self, part: &Rc<Partition>, core: usize) {
        let snapshot = match part.log.snapshot() {
            Ok(s) => s,
            Err(e) => {
                log::warn!(
                    "read replica of {}-{} on core {core} not started: {e}",
                    part.topic,
                    part.index
                );
                return;
            }
        };
        let fed = self.fed_entry(part);
        fed.cores.borrow_mut().push(core);
        self.outbox.send(
            core,
            ReplicaMsg::Start {
                of: fed.of.clone(),
                owner: self.me,
                config: Box::new(fed.config.borrow().clone()),
                snapshot,
            },
        );
        log::info!(
            "read replica of {}-{} started on core {core}",
            part.topic,
            part.index
        );
        self.announce(&fed);
    }

    /// The feeding state of `part`, created (with the log's hook) if it has none.
    fn fed_entry(&self, part: &Rc<Partition>) -> Rc<Fed> {
        if let Some(f) = self.fed.borrow().get(&part.log.id()) {
            return f.clone();
        }
        let fed = Rc::new(Fed {
            of: ReplicaOf {
                topic: part.topic.clone(),
                partition: part.index,
                topic_id: part.topic_id,
                source: part.log.id(),
            },
            log: part.log.downgrade(),
            config: RefCell::new(part.log.config()),
            cores: RefCell::default(),
            reported: RefCell::default(),
            sent_lately: RefCell::default(),
            steered: RefCell::default(),
            cool_since: Cell::new(None),
        });
        let (hooked, outbox) = (Rc::downgrade(&fed), self.outbox.clone());
        part.log
            .set_replication(Some(Rc::new(move |event: LogEvent| {
                if let Some(fed) = hooked.upgrade() {
                    hand_over(&outbox, &fed, event);
                }
            })));
        self.fed.borrow_mut().insert(part.log.id(), fed.clone());
        fed
    }

    /// Stops the replica of the partition of log `source` on `core`.
    fn stop(&self, source: u64, core: usize) {
        let Some(fed) = self.fed.borrow().get(&source).cloned() else {
            return;
        };
        fed.cores.borrow_mut().retain(|&c| c != core);
        fed.reported.borrow_mut().remove(&core);
        self.outbox
            .send(core, ReplicaMsg::Stop { of: fed.of.clone() });
        log::info!(
            "read replica of {}-{} on core {core} stopped",
            fed.of.topic,
            fed.of.partition
        );
        if fed.cores.borrow().is_empty() {
            self.unhook(&fed);
        }
        self.announce(&fed);
    }

    fn unhook(&self, fed: &Fed) {
        if let Some(log) = fed.log.upgrade() {
            log.set_replication(None);
        }
        self.fed.borrow_mut().remove(&fed.of.source);
    }

    /// The partition of log `source` is gone from this core (deleted): its replicas stop.
    pub fn forget_owned(&self, source: u64) {
        let Some(fed) = self.fed.borrow().get(&source).cloned() else {
            return;
        };
        for core in fed.cores.borrow_mut().drain(..) {
            self.outbox
                .send(core, ReplicaMsg::Stop { of: fed.of.clone() });
        }
        self.unhook(&fed);
        self.announce(&fed);
    }

    /// A topic's configs changed: replicas started from now on read with these settings.
    pub fn set_log_config(&self, source: u64, config: &LogConfig) {
        if let Some(f) = self.fed.borrow().get(&source) {
            *f.config.borrow_mut() = config.clone();
        }
    }

    /// Tells every core the partition's replica cores.
    fn announce(&self, fed: &Fed) {
        let cores: Vec<i32> = fed.cores.borrow().iter().map(|&c| c as i32).collect();
        self.set_cores(&fed.of, cores.clone());
        for core in (0..self.cores).filter(|&c| c != self.me) {
            self.outbox.send(
                core,
                ReplicaMsg::Cores {
                    of: fed.of.clone(),
                    cores: cores.clone(),
                },
            );
        }
    }

    fn set_cores(&self, of: &ReplicaOf, cores: Vec<i32>) {
        let mut sets = self.sets.borrow_mut();
        if cores.is_empty() {
            if let Some(t) = sets.get_mut(&of.topic) {
                t.remove(&of.partition);
            }
        } else {
            sets.entry(of.topic.clone())
                .or_default()
                .insert(of.partition, cores);
        }
    }

    /// The replica cores of a partition as its owner last said (none: served by the owner only).
    pub fn replica_cores(&self, topic: &str, partition: i32) -> Vec<i32> {
        self.sets
            .borrow()
            .get(topic)
            .and_then(|t| t.get(&partition))
            .cloned()
            .unwrap_or_default()
    }

    // ---- replica side ------------------------------------------------------------------------

    /// The replica of `topic`/`partition` this core holds, if any.
    pub fn held(&self, topic: &str, partition: i32) -> Option<Rc<Partition>> {
        self.held
            .borrow()
            .get(topic)?
            .get(&partition)
            .map(|h| h.partition.clone())
    }

    /// Handles a message from another core. Returns the replica dropped, if one was (its view
    /// readers are the caller's to forget).
    pub fn receive(&self, msg: ReplicaMsg, cache: &Rc<TailCache>) -> Option<Rc<Partition>> {
        match msg {
            ReplicaMsg::Start {
                of,
                owner,
                config,
                snapshot,
            } => {
                self.snapshots.set(self.snapshots.get() + 1);
                let log = match shards::Log::replica(snapshot, *config, cache.clone()) {
                    Ok(log) => log,
                    Err(e) => {
                        log::warn!(
                            "core {}: replica of {}-{} could not start: {e}",
                            self.me,
                            of.topic,
                            of.partition
                        );
                        return None;
                    }
                };
                let partition = Rc::new(Partition::replica(
                    &of.topic,
                    of.partition,
                    of.topic_id,
                    log,
                ));
                let held = Held {
                    partition,
                    source: of.source,
                    owner,
                };
                self.held
                    .borrow_mut()
                    .entry(of.topic)
                    .or_default()
                    .insert(of.partition, held)
                    .map(|old| old.partition)
            }
            ReplicaMsg::Feed { of, handover } => {
                self.feed(&of, handover);
                None
            }
            ReplicaMsg::Stop { of } => {
                let mut held = self.held.borrow_mut();
                let topic = held.get_mut(&of.topic)?;
                if topic.get(&of.partition)?.source != of.source {
                    return None;
                }
                let gone = topic.remove(&of.partition).map(|h| h.partition);
                if topic.is_empty() {
                    held.remove(&of.topic);
                }
                gone
            }
            ReplicaMsg::Resync { of, from } => {
                if let Some(f) = self.fed.borrow().get(&of.source) {
                    if f.cores.borrow().contains(&from) {
                        resync(&self.outbox, f, from);
                    }
                }
                None
            }
            ReplicaMsg::Load {
                of,
                from,
                connections,
                busy_percent,
            } => {
                if let Some(f) = self.fed.borrow().get(&of.source) {
                    f.reported
                        .borrow_mut()
                        .insert(from, (connections, busy_percent as f64 / 100.0));
                    // A consumer sent there shows in its report once it has fetched there:
                    // those sent just now may not have yet, and still count on top of it.
                    let counted_before = Instant::now() - REPORT_LAG;
                    if let Some(sent) = f.sent_lately.borrow_mut().get_mut(&from) {
                        sent.retain(|&t| t > counted_before);
                    }
                }
                None
            }
            ReplicaMsg::Cores { of, cores } => {
                self.set_cores(&of, cores);
                None
            }
        }
    }

    fn feed(&self, of: &ReplicaOf, handover: Handover) {
        let held = self.held.borrow();
        let Some(h) = held
            .get(&of.topic)
            .and_then(|t| t.get(&of.partition))
            .filter(|h| h.source == of.source)
        else {
            return;
        };
        match &handover {
            Handover::Appended(a) => {
                self.handover_batches
                    .set(self.handover_batches.get() + a.records.batches as u64);
                self.handover_bytes
                    .set(self.handover_bytes.get() + a.records.len as u64);
            }
            Handover::Snapshot(_) => self.snapshots.set(self.snapshots.get() + 1),
        }
        if let Err(e) = h.partition.log.apply(handover) {
            log::warn!(
                "core {}: replica of {}-{} out of step ({e}); asking core {} for a snapshot",
                self.me,
                of.topic,
                of.partition,
                h.owner
            );
            self.outbox.send(
                h.owner,
                ReplicaMsg::Resync {
                    of: of.clone(),
                    from: self.me,
                },
            );
        }
    }

    /// Every tick: replica cores report their fetch connections of each replica to its owner;
    /// connections not seen for a while are forgotten.
    pub fn report(&self, busy: f64, now: Instant) {
        self.fetchers.borrow_mut().retain(|_, f| {
            f.last
                .retain(|_, t| now.duration_since(*t) < FETCHING_WITHIN);
            !f.last.is_empty()
        });
        let held = self.held.borrow();
        for (topic, parts) in held.iter() {
            for (&partition, h) in parts {
                self.outbox.send(
                    h.owner,
                    ReplicaMsg::Load {
                        of: ReplicaOf {
                            topic: topic.clone(),
                            partition,
                            topic_id: h.partition.topic_id,
                            source: h.source,
                        },
                        from: self.me,
                        connections: self.fetch_connections(h.partition.log.id(), now),
                        busy_percent: (busy * 100.0).round() as u32,
                    },
                );
            }
        }
    }

    /// Replicas of topics the table no longer has as they were (`exists(topic, id)` false: gone
    /// or re-created): dropped, and returned. What is known of their replica cores goes too.
    pub fn drop_gone(
        &self,
        exists: impl Fn(&str, Option<&[u8; 16]>) -> bool,
    ) -> Vec<Rc<Partition>> {
        let mut gone = Vec::new();
        self.held.borrow_mut().retain(|topic, parts| {
            parts.retain(|_, h| {
                let keep = exists(topic, Some(&h.partition.topic_id));
                if !keep {
                    gone.push(h.partition.clone());
                }
                keep
            });
            !parts.is_empty()
        });
        self.sets
            .borrow_mut()
            .retain(|topic, _| exists(topic, None));
        gone
    }

    /// Every replica this core holds (closing at shutdown).
    pub fn take_held(&self) -> Vec<Rc<Partition>> {
        self.held
            .borrow_mut()
            .drain()
            .flat_map(|(_, parts)| parts.into_values().map(|h| h.partition))
            .collect()
    }

    pub fn stats(&self, now: Instant) -> ReplicaStats {
        let held = self.held.borrow();
        let mut replica_cores: Vec<(String, i32, Vec<i32>)> = self
            .sets
            .borrow()
            .iter()
            .flat_map(|(t, parts)| parts.iter().map(move |(p, c)| (t.clone(), *p, c.clone())))
            .collect();
        replica_cores.sort();
        let mut fetch_connections: Vec<(String, i32, u32)> = self
            .fetchers
            .borrow()
            .values()
            .map(|f| (f.topic.clone(), f.partition, f.active(now)))
            .filter(|f| f.2 > 0)
            .collect();
        fetch_connections.sort();
        ReplicaStats {
            held: held.values().map(|p| p.len() as u64).sum(),
            fed: self.fed.borrow().len() as u64,
            handover_batches: self.handover_batches.get(),
            handover_bytes: self.handover_bytes.get(),
            snapshots: self.snapshots.get(),
            redirects: self.redirects.get(),
            fetch_connections,
            replica_cores,
        }
    }
}

/// The owner's log changed: every replica core of the partition gets the change, in order.
fn hand_over(outbox: &Outbox, fed: &Fed, event: LogEvent) {
    let cores = fed.cores.borrow();
    match event {
        LogEvent::Appended(a) => {
            for &core in cores.iter() {
                outbox.send(
                    core,
                    ReplicaMsg::Feed {
                        of: fed.of.clone(),
                        handover: Handover::Appended(a.clone()),
                    },
                );
            }
        }
        LogEvent::SegmentsChanged => {
            for &core in cores.iter() {
                resync(outbox, fed, core);
            }
        }
    }
}

/// Sends `core` a fresh snapshot of the partition.
fn resync(outbox: &Outbox, fed: &Fed, core: usize) {
    let Some(log) = fed.log.upgrade() else {
        return;
    };
    match log.snapshot() {
        Ok(snapshot) => outbox.send(
            core,
            ReplicaMsg::Feed {
                of: fed.of.clone(),
                handover: Handover::Snapshot(snapshot),
            },
        ),
        Err(e) => log::warn!(
            "read replica of {}-{}: no snapshot for core {core}: {e}",
            fed.of.topic,
            fed.of.partition
        ),
    }
}

const PER_CORE: [Family<ReplicaStats>; 5] = [
    (
        "read_replicas",
        "gauge",
        "Read replicas this core holds of other cores' partitions.",
        |s| s.held,
    ),
    (
        "replicated_partitions",
        "gauge",
        "Partitions of this core with read replicas on other cores.",
        |s| s.fed,
    ),
    (
        "replica_handover_batches_total",
        "counter",
        "Batches owners handed to this core's read replicas.",
        |s| s.handover_batches,
    ),
    (
        "replica_handover_bytes_total",
        "counter",
        "Bytes owners handed to this core's read replicas.",
        |s| s.handover_bytes,
    ),
    (
        "fetch_redirects_total",
        "counter",
        "Fetch answers of this core naming another core as the preferred read replica (KIP-392).",
        |s| s.redirects,
    ),
];

impl ReplicaStats {
    /// The read replica families for every core: (core, its stats).
    pub fn write_prometheus(out: &mut Exposition, cores: &[(usize, &ReplicaStats)]) {
        out.per_core("shoal_", &PER_CORE, cores);
        out.family(
            "shoal_replica_snapshots_total",
            "counter",
            "Snapshots of owners' segments this core's read replicas took in (starts, segment changes, resynchronizations).",
            cores.iter().map(|(core, s)| (core_label(*core), s.snapshots)),
        );
        out.family(
            "shoal_partition_fetch_connections",
            "gauge",
            "Open connections that fetched a partition on this core (its owner or a read replica) in the last 10 s.",
            cores.iter().flat_map(|(core, s)| {
                s.fetch_connections.iter().map(move |(topic, partition, n)| {
                    (
                        format!("{},topic=\"{topic}\",partition=\"{partition}\"", core_label(*core)),
                        u64::from(*n),
                    )
                })
            }),
        );
    }
}
