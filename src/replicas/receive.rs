//! The replica core's side: the replicas it holds of other cores' partitions, started from a
//! snapshot and fed each hand-over in arrival order; its consumers' counts reported to owners.

use super::feed::resync;
use super::{ReplicaMsg, ReplicaOf, Replicas, FETCHING_WITHIN, REPORT_LAG};
use shards::partition::Partition;
use shards::{Handover, TailCache};
use std::rc::Rc;
use std::time::Instant;

/// A replica this core holds of another core's partition.
pub(super) struct Held {
    pub(super) partition: Rc<Partition>,
    pub(super) source: u64,
    pub(super) owner: usize,
}

impl Replicas {
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
                streams,
            } => {
                if let Some(f) = self.fed.borrow().get(&of.source) {
                    if streams > 0 {
                        f.wanted.borrow_mut().insert(from, Instant::now());
                    }
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
            // The owner's core answers it, with the partition in hand (`Replicas::want`).
            ReplicaMsg::Want { .. } => None,
            ReplicaMsg::Cores { of, cores } => {
                self.set_cores(&of, cores);
                None
            }
        }
    }

    pub(super) fn feed(&self, of: &ReplicaOf, handover: Handover) {
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
                        streams: self.streams_of(h.partition.log.id()),
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
}
