//! Where a consumer's fetch of a partition with replicas is served: a connection keeps the core
//! it was given; a new one gets the least loaded of the owner and the replica cores.

use super::{Replicas, BUSY, FETCHING_WITHIN, MAX_STEERED, STEER_MEMORY};
use shards::partition::Partition;
use std::time::Instant;

/// What a fetch of a partition on its owner core should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    /// Serve it here.
    Here,
    /// Answer with no records and this core as the preferred read replica.
    To(i32),
}

impl Replicas {
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
        let replicas: Vec<(usize, u32, f64)> = cores
            .iter()
            .map(|&core| {
                let (consumers, busy) = reported.get(&core).copied().unwrap_or((0, 0.0));
                let sent_there = sent.get(&core).map_or(0, |s| s.len() as u32);
                (core, consumers + sent_there, busy)
            })
            .collect();
        let core = least_loaded(self.me, (here, busy), &replicas);
        if core != self.me {
            sent.entry(core).or_default().push(now);
        }
        if steered.len() >= MAX_STEERED {
            steered.retain(|_, (_, seen)| now.duration_since(*seen) < STEER_MEMORY);
        }
        steered.insert(conn, (core, now));
        self.answer(core)
    }

    pub(super) fn answer(&self, core: usize) -> Steer {
        if core == self.me {
            Steer::Here
        } else {
            self.redirects.set(self.redirects.get() + 1);
            Steer::To(core as i32)
        }
    }
}

/// The core a new consumer goes to: the least loaded of this core (`me`, with `here` = its
/// consumers and busy share) and the replica cores (`(core, consumers, busy share)`). A core's
/// load is its consumers plus the new one, doubled past the busy mark (a saturated core gets
/// fewer; a transient busy share must not skew the split of a burst of new consumers). Ties go to
/// the replica: the owner also takes the partition's appends.
pub(super) fn least_loaded(me: usize, here: (u32, f64), replicas: &[(usize, u32, f64)]) -> usize {
    let load =
        |consumers: u32, busy: f64| (consumers + 1) as f64 * if busy >= BUSY { 2.0 } else { 1.0 };
    let mut best = (load(here.0, here.1), me);
    for &(core, consumers, busy) in replicas {
        let l = load(consumers, busy);
        if l <= best.0 {
            best = (l, core);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::least_loaded;

    #[test]
    pub(super) fn a_new_consumer_goes_to_the_least_loaded_core_and_ties_to_a_replica() {
        // No replica: here.
        assert_eq!(least_loaded(0, (5, 0.0), &[]), 0);
        // Equal consumers: the replica (the owner also appends).
        assert_eq!(least_loaded(0, (2, 0.1), &[(1, 2, 0.1)]), 1);
        // Fewer consumers win.
        assert_eq!(least_loaded(0, (1, 0.1), &[(1, 3, 0.1), (2, 2, 0.1)]), 0);
        assert_eq!(least_loaded(0, (4, 0.1), &[(1, 3, 0.1), (2, 2, 0.1)]), 2);
        // A busy core counts double: 2 consumers busy (6) lose to 4 idle (5).
        assert_eq!(least_loaded(0, (2, 0.9), &[(1, 4, 0.2)]), 1);
        assert_eq!(least_loaded(0, (2, 0.2), &[(1, 4, 0.9)]), 0);
    }
}
