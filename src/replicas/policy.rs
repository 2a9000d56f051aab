//! Which partitions get read replicas, by the topic's or the server's policy: `all` (every other
//! core), `off`, or `auto` (every other core once the partition is hot, none once it has been cool
//! for [`COOL_FOR`]).

use super::{Replicas, BUSY, COOL_FOR, WANT_HOLDS};
use crate::table::configs::ReplicaPolicy;
use shards::partition::Partition;
use std::rc::Rc;
use std::time::Instant;

impl Replicas {
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
        let mut wanted = match policy {
            ReplicaPolicy::All => others,
            ReplicaPolicy::Off => Vec::new(),
            ReplicaPolicy::Auto => self.auto_wanted(part, busy, now, current.clone(), others),
        };
        if policy == ReplicaPolicy::Auto {
            // Cores whose stream subscribers read the partition keep their replicas, however
            // cool it is.
            wanted.extend(self.wanted_for_streams(part.log.id(), now));
            wanted.sort_unstable();
            wanted.dedup();
        }
        for &core in wanted.iter().filter(|c| !current.contains(c)) {
            self.start(part, core);
        }
        for &core in current.iter().filter(|c| !wanted.contains(c)) {
            self.stop(part.log.id(), core);
        }
    }

    /// Cores that asked for a replica for their streams, or reported streams reading it, lately.
    fn wanted_for_streams(&self, log_id: u64, now: Instant) -> Vec<usize> {
        let Some(fed) = self.fed.borrow().get(&log_id).cloned() else {
            return Vec::new();
        };
        let mut wanted = fed.wanted.borrow_mut();
        wanted.retain(|_, &mut at| now.duration_since(at) < WANT_HOLDS);
        wanted.keys().copied().collect()
    }

    /// `auto`: see [`auto`]; the partition's cool time is kept with its feeding state.
    pub(super) fn auto_wanted(
        &self,
        part: &Partition,
        busy: f64,
        now: Instant,
        current: Vec<usize>,
        others: Vec<usize>,
    ) -> Vec<usize> {
        let fed = self.fed.borrow().get(&part.log.id()).cloned();
        let heat = Heat {
            here: self.fetch_connections(part.log.id(), now),
            elsewhere: fed
                .as_ref()
                .map(|f| f.reported.borrow().values().map(|r| r.0).sum()),
            busy,
            min: self.config.get().min_consumers.max(1),
        };
        let (wanted, cool_since) = auto(heat, fed.as_ref().and_then(|f| f.cool_since.get()), now);
        if let Some(f) = &fed {
            f.cool_since.set(cool_since);
        }
        match wanted {
            Wanted::All => others,
            Wanted::None => Vec::new(),
            Wanted::AsNow => current,
        }
    }
}

/// How many consumers a partition has, as its owner sees them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heat {
    /// Fetch connections of it on the owner core.
    pub here: u32,
    /// On its replica cores, as they last reported; `None` while it has no replicas.
    pub elsewhere: Option<u32>,
    /// The owner core's busy share.
    pub busy: f64,
    /// `--read-replica-min-consumers` (at least 1).
    pub min: u32,
}

/// The replica cores `auto` wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wanted {
    All,
    None,
    AsNow,
}

/// `auto`: every other core once `min` consumers fetch the partition on its owner (or two on a
/// busy owner); none once fewer than half of `min` over all its cores have fetched it for
/// [`COOL_FOR`]; else as now. Returns that, and since when the partition has been cool.
pub(super) fn auto(
    heat: Heat,
    cool_since: Option<Instant>,
    now: Instant,
) -> (Wanted, Option<Instant>) {
    if heat.here >= heat.min || (heat.busy >= BUSY && heat.here >= 2) {
        return (Wanted::All, None);
    }
    let Some(elsewhere) = heat.elsewhere else {
        return (Wanted::AsNow, cool_since);
    };
    if (heat.here + elsewhere) * 2 >= heat.min {
        return (Wanted::AsNow, None);
    }
    let since = cool_since.unwrap_or(now);
    if now.duration_since(since) >= COOL_FOR {
        (Wanted::None, Some(since))
    } else {
        (Wanted::AsNow, Some(since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    pub(super) fn heat(here: u32, elsewhere: Option<u32>, busy: f64) -> Heat {
        Heat {
            here,
            elsewhere,
            busy,
            min: 8,
        }
    }

    #[test]
    pub(super) fn auto_starts_replicas_when_hot_and_stops_them_after_a_cool_spell() {
        let t0 = Instant::now();
        // Hot: min consumers on the owner, or two on a busy owner.
        assert_eq!(auto(heat(8, None, 0.1), None, t0), (Wanted::All, None));
        assert_eq!(auto(heat(2, None, 0.8), None, t0), (Wanted::All, None));
        assert_eq!(auto(heat(1, None, 0.8), None, t0).0, Wanted::AsNow);
        // Hot again: the cool time is forgotten.
        assert_eq!(
            auto(heat(9, Some(0), 0.1), Some(t0), t0),
            (Wanted::All, None)
        );
        // Half of min over all cores keeps them, and resets the cool time.
        assert_eq!(
            auto(heat(1, Some(3), 0.1), Some(t0), t0),
            (Wanted::AsNow, None)
        );
        // Cool: kept until COOL_FOR has passed since it turned cool, then stopped.
        let (w, since) = auto(heat(1, Some(2), 0.1), None, t0);
        assert_eq!((w, since), (Wanted::AsNow, Some(t0)));
        let later = t0 + COOL_FOR - Duration::from_millis(1);
        assert_eq!(
            auto(heat(1, Some(2), 0.1), since, later),
            (Wanted::AsNow, since)
        );
        assert_eq!(
            auto(heat(1, Some(2), 0.1), since, t0 + COOL_FOR),
            (Wanted::None, since)
        );
        // Without replicas nothing is kept about it.
        assert_eq!(auto(heat(1, None, 0.1), None, t0), (Wanted::AsNow, None));
    }
}
