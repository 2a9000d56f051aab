//! The owner's side of read replicas: a replica started from a snapshot of the log, every change
//! of the log handed over once per replica core, through an outbox drained in order onto the mesh.

use super::{ReplicaMsg, ReplicaOf, Replicas, MAX_QUEUED};
use glommio::channels::local_channel::LocalSender;
use shards::partition::Partition;
use shards::{FastMap, Handover, LogConfig, LogEvent, WeakLog};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

/// Messages on their way to other cores, and how many wait for each.
#[derive(Debug)]
pub(super) struct Outbox {
    pub(super) tx: LocalSender<(usize, ReplicaMsg)>,
    pub(super) queued: Vec<Cell<u32>>,
    /// Cores whose queue overflowed: fed again with snapshots once it has drained.
    pub(super) lagging: Vec<Cell<bool>>,
}

impl Outbox {
    pub(super) fn send(&self, to: usize, msg: ReplicaMsg) {
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
pub(super) struct Fed {
    pub(super) of: ReplicaOf,
    pub(super) log: WeakLog,
    pub(super) config: RefCell<LogConfig>,
    /// The replica cores.
    pub(super) cores: RefCell<Vec<usize>>,
    /// What each replica core last reported: (fetch connections of the partition, busy share),
    /// and when consumers were sent there lately (those the report may not count yet).
    pub(super) reported: RefCell<FastMap<usize, (u32, f64)>>,
    pub(super) sent_lately: RefCell<FastMap<usize, Vec<Instant>>>,
    /// Owner connections and the core each was given, with when it was last seen.
    pub(super) steered: RefCell<FastMap<u64, (usize, Instant)>>,
    /// Cores that want the replica for their stream subscribers, with when they last said so.
    pub(super) wanted: RefCell<FastMap<usize, Instant>>,
    /// `auto`: since when the partition has been cool.
    pub(super) cool_since: Cell<Option<Instant>>,
}

impl Replicas {
    /// Starts a replica of `part` on `core`: the log's hook (set with the first replica) hands
    /// every change over from now on, after the snapshot sent first.
    pub(super) fn start(&self, part: &Rc<Partition>, core: usize) {
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
    pub(super) fn fed_entry(&self, part: &Rc<Partition>) -> Rc<Fed> {
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
            wanted: RefCell::default(),
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
    pub(super) fn stop(&self, source: u64, core: usize) {
        let Some(fed) = self.fed.borrow().get(&source).cloned() else {
            return;
        };
        fed.cores.borrow_mut().retain(|&c| c != core);
        fed.reported.borrow_mut().remove(&core);
        fed.wanted.borrow_mut().remove(&core);
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

    pub(super) fn unhook(&self, fed: &Fed) {
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
    pub(super) fn announce(&self, fed: &Fed) {
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

    pub(super) fn set_cores(&self, of: &ReplicaOf, cores: Vec<i32>) {
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
pub(super) fn resync(outbox: &Outbox, fed: &Fed, core: usize) {
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
