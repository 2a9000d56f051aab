//! A consumer group as a clean stop saves it and the next start loads it: members keep their ids,
//! epochs and partitions, so that after a restart they carry on heartbeating with no new
//! assignment. Kept as JSON in the core's groups directory, written at a clean stop, moved to the
//! new coordinators' directories when `--cores` changed (`reshard`), and removed once loaded:
//! after a crash (no file) members rejoin and resume from their committed offsets.

use super::{Assignment, ConsumerGroup, Member, MemberState, TopicId, Topics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The file in a core's groups directory that holds its consumer-protocol groups between a clean
/// stop and the next start.
pub const SAVED_FILE: &str = "consumer-groups.json";

/// An assignment as saved: topic id (text) -> partitions.
type SavedAssignment = BTreeMap<String, Vec<i32>>;

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedGroup {
    id: String,
    group_epoch: i32,
    assignment_epoch: i32,
    assignor: String,
    rebalances: u64,
    members: Vec<SavedMember>,
    target: BTreeMap<String, SavedAssignment>,
    /// name -> (topic id, partitions).
    subscribed: BTreeMap<String, (String, i32)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedMember {
    id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: u64,
    names: Vec<String>,
    regex: Option<String>,
    assignor: Option<String>,
    epoch: i32,
    previous_epoch: i32,
    state: String,
    assigned: SavedAssignment,
    revoking: SavedAssignment,
}

fn save(a: &Assignment) -> SavedAssignment {
    a.iter()
        .map(|(t, ps)| (t.to_string(), ps.iter().copied().collect()))
        .collect()
}

fn load(a: &SavedAssignment) -> Option<Assignment> {
    a.iter()
        .map(|(t, ps)| Some((t.parse::<TopicId>().ok()?, ps.iter().copied().collect())))
        .collect()
}

fn state_named(name: &str) -> Option<MemberState> {
    [
        MemberState::Stable,
        MemberState::UnrevokedPartitions,
        MemberState::UnreleasedPartitions,
    ]
    .into_iter()
    .find(|s| s.name() == name)
}

impl SavedGroup {
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl ConsumerGroup {
    /// The group as a clean stop saves it.
    pub fn save(&self) -> SavedGroup {
        SavedGroup {
            id: self.id.clone(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: self.assignor.to_string(),
            rebalances: self.rebalances,
            members: self
                .members
                .values()
                .map(|m| SavedMember {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis() as u64,
                    names: m.names.clone(),
                    regex: m.regex.clone(),
                    assignor: m.assignor.clone(),
                    epoch: m.epoch,
                    previous_epoch: m.previous_epoch,
                    state: m.state.name().to_string(),
                    assigned: save(&m.assigned),
                    revoking: save(&m.revoking),
                })
                .collect(),
            target: self
                .target
                .iter()
                .map(|(m, a)| (m.clone(), save(a)))
                .collect(),
            subscribed: self
                .subscribed
                .iter()
                .map(|(n, (id, p))| (n.clone(), (id.to_string(), *p)))
                .collect(),
        }
    }

    /// A saved group back, its members' sessions starting at `now` (each has a session timeout
    /// to heartbeat again); `None` if the save does not read back whole.
    pub fn restore(saved: SavedGroup, session_timeout: Duration, now: Instant) -> Option<Self> {
        let mut g = ConsumerGroup::new(&saved.id);
        g.group_epoch = saved.group_epoch;
        g.assignment_epoch = saved.assignment_epoch;
        g.assignor = super::ASSIGNORS
            .iter()
            .find(|&&a| a == saved.assignor)
            .copied()
            .unwrap_or(super::ASSIGNORS[0]);
        g.rebalances = saved.rebalances;
        for m in saved.members {
            let compiled = match m.regex.as_deref() {
                Some(r) => Some(super::compile(r).ok()?),
                None => None,
            };
            if let Some(i) = &m.instance_id {
                g.statics.insert(i.clone(), m.id.clone());
            }
            let member = Member {
                id: m.id.clone(),
                instance_id: m.instance_id,
                rack_id: m.rack_id,
                client_id: m.client_id,
                client_host: m.client_host,
                rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms),
                names: m.names,
                regex: m.regex,
                compiled,
                assignor: m.assignor,
                epoch: m.epoch,
                previous_epoch: m.previous_epoch,
                // Commits at the previous epoch wait for the next move on.
                kept_all: false,
                state: state_named(&m.state)?,
                assigned: load(&m.assigned)?,
                revoking: load(&m.revoking)?,
                session_deadline: now + session_timeout,
                revoke_deadline: (!m.revoking.is_empty())
                    .then(|| now + Duration::from_millis(m.rebalance_timeout_ms)),
            };
            g.members.insert(m.id, member);
        }
        for (m, a) in &saved.target {
            g.target.insert(m.clone(), load(a)?);
        }
        let subscribed: Option<Topics> = saved
            .subscribed
            .iter()
            .map(|(n, (id, p))| Some((n.clone(), (id.parse().ok()?, *p))))
            .collect();
        g.subscribed = subscribed?;
        Some(g)
    }
}

/// Every group of a core, as saved.
pub type SavedGroups = Vec<SavedGroup>;
