//! What one core's read replicas count, and their `/metrics` families.

use super::Replicas;
use crate::metrics::{core_label, Exposition, Family};
use std::time::Instant;

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
    /// [`FETCHING_WITHIN`](super::FETCHING_WITHIN)).
    pub fetch_connections: Vec<(String, i32, u32)>,
    /// Fetch connections per topic on this core: distinct connections that fetched any of its
    /// partitions within [`FETCHING_WITHIN`](super::FETCHING_WITHIN), each counted once however
    /// many partitions it reads.
    pub topic_fetch_connections: Vec<(String, u32)>,
    /// Held and fed replicas: (topic, partition, replica cores).
    pub replica_cores: Vec<(String, i32, Vec<i32>)>,
}

impl Replicas {
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
        let mut by_topic: std::collections::BTreeMap<&str, std::collections::HashSet<u64>> =
            std::collections::BTreeMap::new();
        let fetchers = self.fetchers.borrow();
        for f in fetchers.values() {
            let active = f
                .last
                .iter()
                .filter(|(_, &t)| now.duration_since(t) < super::FETCHING_WITHIN);
            by_topic
                .entry(f.topic.as_str())
                .or_default()
                .extend(active.map(|(conn, _)| *conn));
        }
        let topic_fetch_connections = by_topic
            .into_iter()
            .filter(|(_, conns)| !conns.is_empty())
            .map(|(topic, conns)| (topic.to_string(), conns.len() as u32))
            .collect();
        ReplicaStats {
            held: held.values().map(|p| p.len() as u64).sum(),
            fed: self.fed.borrow().len() as u64,
            handover_batches: self.handover_batches.get(),
            handover_bytes: self.handover_bytes.get(),
            snapshots: self.snapshots.get(),
            redirects: self.redirects.get(),
            fetch_connections,
            topic_fetch_connections,
            replica_cores,
        }
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
