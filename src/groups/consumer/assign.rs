//! The server-side assignors of the consumer group protocol: which member gets which partition
//! of the topics the members subscribe to. Pure functions of the members' subscriptions, the
//! topics' partition counts, and (for `uniform`) the assignment before, which they keep as much of
//! as balance allows.
//!
//! - `uniform` (Kafka's default): every partition of a subscribed topic to one member subscribed
//!   to it, the members' counts as even as their subscriptions allow, and partitions stay where
//!   they were unless balance needs them moved.
//! - `range`: per topic, its partitions in order, split into contiguous ranges over the members
//!   subscribed to it (sorted by member id), the first ones getting one more; members with the
//!   same subscriptions get the same partition numbers of co-partitioned topics.

use super::{Assignment, TopicId};
use std::collections::{BTreeMap, BTreeSet};

/// The assignors a member may ask for (`group.remote.assignor`).
pub const ASSIGNORS: &[&str] = &["uniform", "range"];

/// What an assignor is given: each member's subscribed topics (ids, already resolved from names
/// and regular expressions), every subscribed topic's partition count, and the assignment the
/// group had.
pub struct Input<'a> {
    pub members: &'a BTreeMap<String, BTreeSet<TopicId>>,
    pub partitions: &'a BTreeMap<TopicId, i32>,
    pub previous: &'a BTreeMap<String, Assignment>,
}

/// The target assignment of every member (each member present, maybe with nothing).
pub fn assign(assignor: &str, input: &Input<'_>) -> BTreeMap<String, Assignment> {
    match assignor {
        "range" => range(input),
        _ => uniform(input),
    }
}

fn range(input: &Input<'_>) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = input
        .members
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    for (&topic, &count) in input.partitions {
        let subscribers: Vec<&String> = input
            .members
            .iter()
            .filter(|(_, topics)| topics.contains(&topic))
            .map(|(m, _)| m)
            .collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        let n = subscribers.len() as i32;
        let (each, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, m) in subscribers.into_iter().enumerate() {
            let take = each + i32::from((i as i32) < extra);
            if take > 0 {
                let parts = out
                    .get_mut(m)
                    .expect("every member")
                    .entry(topic)
                    .or_default();
                parts.extend(next..next + take);
            }
            next += take;
        }
    }
    out
}

/// One partition of a topic.
type Partition = (TopicId, i32);

fn uniform(input: &Input<'_>) -> BTreeMap<String, Assignment> {
    let eligible = |m: &str, t: &TopicId| input.members.get(m).is_some_and(|s| s.contains(t));
    let exists = |(t, p): &Partition| input.partitions.get(t).is_some_and(|&n| *p < n);
    // Each member keeps what it had and may still have.
    let mut owned: BTreeMap<&str, BTreeSet<Partition>> = input
        .members
        .keys()
        .map(|m| (m.as_str(), BTreeSet::new()))
        .collect();
    let mut taken: BTreeSet<Partition> = BTreeSet::new();
    for (m, had) in input.previous {
        let Some(mine) = owned.get_mut(m.as_str()) else {
            continue;
        };
        for (&t, parts) in had {
            for &p in parts {
                if eligible(m, &t) && exists(&(t, p)) && taken.insert((t, p)) {
                    mine.insert((t, p));
                }
            }
        }
    }
    // The rest, each to the eligible member with the fewest (ties: the member id).
    for (&t, &count) in input.partitions {
        for p in 0..count.max(0) {
            if taken.contains(&(t, p)) {
                continue;
            }
            let least = owned
                .iter_mut()
                .filter(|(m, _)| eligible(m, &t))
                .min_by_key(|(m, parts)| (parts.len(), **m));
            if let Some((_, parts)) = least {
                parts.insert((t, p));
                taken.insert((t, p));
            }
        }
    }
    balance(&mut owned, eligible);
    owned
        .into_iter()
        .map(|(m, parts)| {
            let mut a = Assignment::new();
            for (t, p) in parts {
                a.entry(t).or_default().insert(p);
            }
            (m.to_string(), a)
        })
        .collect()
}

/// Moves partitions from the fullest members to the emptiest eligible ones until no move makes
/// two members' counts closer: each move takes one partition from a member with at least two
/// more than the receiver. Bounded by the partitions' count times the members'.
fn balance(
    owned: &mut BTreeMap<&str, BTreeSet<Partition>>,
    eligible: impl Fn(&str, &TopicId) -> bool,
) {
    let total: usize = owned.values().map(BTreeSet::len).sum();
    for _ in 0..total.saturating_mul(owned.len().max(1)) {
        let mut by_count: Vec<(&str, usize)> = owned.iter().map(|(m, p)| (*m, p.len())).collect();
        by_count.sort_by_key(|&(m, n)| (std::cmp::Reverse(n), m));
        let mut moved = None;
        'find: for &(giver, n) in &by_count {
            for &(taker, k) in by_count.iter().rev() {
                if k + 1 >= n {
                    break;
                }
                if let Some(&part) = owned[giver].iter().rev().find(|(t, _)| eligible(taker, t)) {
                    moved = Some((giver, taker, part));
                    break 'find;
                }
            }
        }
        let Some((giver, taker, part)) = moved else {
            return;
        };
        owned.get_mut(giver).expect("a member").remove(&part);
        owned.get_mut(taker).expect("a member").insert(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(n: u8) -> TopicId {
        uuid::Uuid::from_bytes([n; 16])
    }

    fn members(spec: &[(&str, &[u8])]) -> BTreeMap<String, BTreeSet<TopicId>> {
        spec.iter()
            .map(|(m, ts)| (m.to_string(), ts.iter().map(|&t| topic(t)).collect()))
            .collect()
    }

    fn counts(a: &BTreeMap<String, Assignment>) -> Vec<usize> {
        a.values()
            .map(|x| x.values().map(BTreeSet::len).sum())
            .collect()
    }

    /// Every partition of a subscribed topic to exactly one member subscribed to it.
    fn check_complete(
        a: &BTreeMap<String, Assignment>,
        m: &BTreeMap<String, BTreeSet<TopicId>>,
        partitions: &BTreeMap<TopicId, i32>,
    ) {
        let mut seen = BTreeSet::new();
        for (member, parts) in a {
            for (t, ps) in parts {
                assert!(m[member].contains(t), "{member} is not subscribed to {t}");
                for p in ps {
                    assert!(seen.insert((*t, *p)), "{t}/{p} assigned twice");
                }
            }
        }
        for (t, n) in partitions {
            if m.values().any(|s| s.contains(t)) {
                for p in 0..*n {
                    assert!(seen.contains(&(*t, p)), "{t}/{p} not assigned");
                }
            }
        }
    }

    #[test]
    fn uniform_is_balanced_and_sticky() {
        let partitions: BTreeMap<_, _> = [(topic(1), 12)].into();
        let four = members(&[("a", &[1]), ("b", &[1]), ("c", &[1]), ("d", &[1])]);
        let none = BTreeMap::new();
        let first = assign(
            "uniform",
            &Input {
                members: &four,
                partitions: &partitions,
                previous: &none,
            },
        );
        check_complete(&first, &four, &partitions);
        assert_eq!(counts(&first), [3, 3, 3, 3]);
        // A fifth member: it takes two or three, and the others keep what they can.
        let five = members(&[
            ("a", &[1]),
            ("b", &[1]),
            ("c", &[1]),
            ("d", &[1]),
            ("e", &[1]),
        ]);
        let second = assign(
            "uniform",
            &Input {
                members: &five,
                partitions: &partitions,
                previous: &first,
            },
        );
        check_complete(&second, &five, &partitions);
        let mut c = counts(&second);
        c.sort();
        assert_eq!(c, [2, 2, 2, 3, 3]);
        let moved: usize = ["a", "b", "c", "d"]
            .iter()
            .map(|m| {
                let before = &first[*m][&topic(1)];
                let after = second[*m].get(&topic(1)).cloned().unwrap_or_default();
                before.difference(&after).count()
            })
            .sum();
        assert_eq!(moved, 2, "only the partitions the new member needs move");
    }

    #[test]
    fn uniform_respects_different_subscriptions() {
        let partitions: BTreeMap<_, _> = [(topic(1), 6), (topic(2), 2)].into();
        let m = members(&[("a", &[1, 2]), ("b", &[1]), ("c", &[2])]);
        let a = assign(
            "uniform",
            &Input {
                members: &m,
                partitions: &partitions,
                previous: &BTreeMap::new(),
            },
        );
        check_complete(&a, &m, &partitions);
        let c = counts(&a);
        assert!(
            c.iter().max().unwrap() - c.iter().min().unwrap() <= 2,
            "{c:?}"
        );
    }

    #[test]
    fn range_splits_each_topic_in_order() {
        let partitions: BTreeMap<_, _> = [(topic(1), 5), (topic(2), 5)].into();
        let m = members(&[("a", &[1, 2]), ("b", &[1, 2])]);
        let a = assign(
            "range",
            &Input {
                members: &m,
                partitions: &partitions,
                previous: &BTreeMap::new(),
            },
        );
        check_complete(&a, &m, &partitions);
        let a_parts: Vec<i32> = a["a"][&topic(1)].iter().copied().collect();
        assert_eq!(a_parts, [0, 1, 2]);
        assert_eq!(a["a"][&topic(1)], a["a"][&topic(2)], "co-partitioned");
        assert_eq!(
            a["b"][&topic(2)].iter().copied().collect::<Vec<_>>(),
            [3, 4]
        );
    }
}
