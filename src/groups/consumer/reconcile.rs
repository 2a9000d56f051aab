//! One member's way to its target assignment, as Kafka's consumer group protocol reconciles it:
//! partitions leave before others get them. A member first loses the partitions its target no
//! longer holds (it keeps its epoch and must report, in a heartbeat, that it no longer owns
//! them), then moves to the target's epoch with the partitions of its target that no other
//! member still owns; those it waits for arrive in later heartbeats, once their owner released
//! them. So no partition is ever assigned to two members.

use super::{Assignment, TopicId};
use std::collections::HashSet;

/// Where a member stands with its target assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// It has its target at the group's assignment epoch.
    Stable,
    /// It must release partitions (`revoking`) before it gets anything new.
    UnrevokedPartitions,
    /// It is at the target epoch but waits for partitions other members still own.
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::UnrevokedPartitions => "unrevoked_partitions",
            Self::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

/// A member's assignment as reconciliation leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub state: MemberState,
    /// The epoch the member is at: the target's, unless it must revoke first.
    pub epoch: i32,
    pub assigned: Assignment,
    pub revoking: Assignment,
}

/// The next step of a member at `epoch` with `assigned` towards `target` (at `target_epoch`),
/// where `owned_by_others` holds every partition another member is assigned or still revoking.
pub fn next_step(
    epoch: i32,
    assigned: &Assignment,
    target: &Assignment,
    target_epoch: i32,
    owned_by_others: &HashSet<(TopicId, i32)>,
) -> Step {
    let mut kept = Assignment::new();
    let mut revoking = Assignment::new();
    for (t, parts) in assigned {
        let want = target.get(t);
        for &p in parts {
            let into = if want.is_some_and(|w| w.contains(&p)) {
                &mut kept
            } else {
                &mut revoking
            };
            into.entry(*t).or_default().insert(p);
        }
    }
    if !revoking.is_empty() {
        return Step {
            state: MemberState::UnrevokedPartitions,
            epoch,
            assigned: kept,
            revoking,
        };
    }
    let mut unreleased = false;
    for (t, parts) in target {
        for &p in parts {
            if kept.get(t).is_some_and(|k| k.contains(&p)) {
                continue;
            }
            if owned_by_others.contains(&(*t, p)) {
                unreleased = true;
            } else {
                kept.entry(*t).or_default().insert(p);
            }
        }
    }
    Step {
        state: if unreleased {
            MemberState::UnreleasedPartitions
        } else {
            MemberState::Stable
        },
        epoch: target_epoch,
        assigned: kept,
        revoking: Assignment::new(),
    }
}

/// Whether `owned` (what a member reports it owns) holds none of `revoking`.
pub fn released(owned: &Assignment, revoking: &Assignment) -> bool {
    revoking.iter().all(|(t, parts)| {
        owned
            .get(t)
            .is_none_or(|o| parts.iter().all(|p| !o.contains(p)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(spec: &[(u8, &[i32])]) -> Assignment {
        spec.iter()
            .map(|(t, ps)| {
                (
                    uuid::Uuid::from_bytes([*t; 16]),
                    ps.iter().copied().collect(),
                )
            })
            .collect()
    }

    #[test]
    fn revokes_before_it_assigns() {
        let step = next_step(
            3,
            &a(&[(1, &[0, 1, 2])]),
            &a(&[(1, &[1, 2, 3])]),
            4,
            &HashSet::new(),
        );
        assert_eq!(step.state, MemberState::UnrevokedPartitions);
        assert_eq!((step.epoch, step.assigned.clone()), (3, a(&[(1, &[1, 2])])));
        assert_eq!(step.revoking, a(&[(1, &[0])]));
        assert!(!released(&a(&[(1, &[0, 1])]), &step.revoking));
        assert!(released(&a(&[(1, &[1, 2])]), &step.revoking));
        // Revoked: now the new partition, at the new epoch.
        let next = next_step(
            3,
            &step.assigned,
            &a(&[(1, &[1, 2, 3])]),
            4,
            &HashSet::new(),
        );
        assert_eq!(next.state, MemberState::Stable);
        assert_eq!((next.epoch, next.assigned), (4, a(&[(1, &[1, 2, 3])])));
    }

    #[test]
    fn waits_for_partitions_others_still_own() {
        let t = uuid::Uuid::from_bytes([1; 16]);
        let others: HashSet<_> = [(t, 5)].into();
        let step = next_step(0, &Assignment::new(), &a(&[(1, &[4, 5])]), 2, &others);
        assert_eq!(step.state, MemberState::UnreleasedPartitions);
        assert_eq!((step.epoch, step.assigned), (2, a(&[(1, &[4])])));
    }
}
