//! What a core's group coordinator reports, and its `/metrics` families.

use super::consumer::ConsumerGroupState;
use super::group::GroupState;
use crate::metrics::{core_label, Exposition, Family};

/// One group a core coordinates, for the console.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupSummary {
    pub group: String,
    pub state: &'static str,
    pub members: u64,
    /// The group epoch of a group of the consumer group protocol (KIP-848); `None`: classic.
    pub epoch: Option<i32>,
}

/// The consumer groups a core coordinates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Groups per state, indexed by `GroupState as usize`.
    pub by_state: [u64; 5],
    /// Groups of the consumer group protocol per state, indexed by `ConsumerGroupState as usize`.
    pub consumer_by_state: [u64; 4],
    pub members: u64,
    pub rebalances: u64,
    /// Partition offsets committed (one OffsetCommit may commit many).
    pub offset_commits: u64,
}

const PER_CORE: [Family<GroupStats>; 3] = [
    (
        "members",
        "gauge",
        "Members of the consumer groups coordinated.",
        |g| g.members,
    ),
    (
        "rebalances_total",
        "counter",
        "Rebalances started by the consumer groups coordinated.",
        |g| g.rebalances,
    ),
    (
        "offset_commits_total",
        "counter",
        "Partition offsets committed to the groups coordinated.",
        |g| g.offset_commits,
    ),
];

impl GroupStats {
    /// The group families for every core: (core, its stats).
    pub fn write_prometheus(out: &mut Exposition, cores: &[(usize, &GroupStats)]) {
        out.family(
            "shoal_groups",
            "gauge",
            "Consumer groups coordinated, by state.",
            cores.iter().flat_map(|(core, g)| {
                GroupState::ALL.iter().map(move |s| {
                    let labels = format!("{},state=\"{}\"", core_label(*core), s.name());
                    (labels, g.by_state[*s as usize])
                })
            }),
        );
        out.family(
            "shoal_consumer_protocol_groups",
            "gauge",
            "Consumer groups of the consumer group protocol (KIP-848) coordinated, by state.",
            cores.iter().flat_map(|(core, g)| {
                ConsumerGroupState::ALL.iter().map(move |s| {
                    let labels = format!("{},state=\"{}\"", core_label(*core), s.name());
                    (labels, g.consumer_by_state[*s as usize])
                })
            }),
        );
        out.per_core("shoal_group_", &PER_CORE, cores);
    }
}
