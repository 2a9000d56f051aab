//! `shoal group describe`: the group at its coordinator (state, protocol, members and their
//! assignments, committed offsets), each partition's log start, high watermark and last stable
//! offset at its leader, and the lag between them, per partition and per topic.
//!
//! Lag is the high watermark minus the committed offset (what a read-uncommitted consumer has
//! left); `lag_committed` the last stable offset minus it (what a read-committed consumer has
//! left: they differ only while transactions are open). The partitions shown are all those of
//! every topic the group has committed offsets in or is assigned. A partition without a commit
//! (nobody read it yet, or its owner has not committed) shows committed `-` and the lag of a
//! consumer starting at the log start: the most it may have to read. (Kafka's tool shows no lag
//! there; counting it keeps a topic's total lag the records the group has not read.)

use super::coordinator::{self, Committed};
use crate::tools::failure::Failure;
use crate::tools::offsets::{self, Isolation, EARLIEST, LATEST};
use crate::tools::output::{Report, Table};
use crate::tools::session::Session;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// GROUP_ID_NOT_FOUND.
const GROUP_ID_NOT_FOUND: i16 = 69;

#[derive(Debug, Serialize)]
struct Member {
    member_id: String,
    group_instance_id: Option<String>,
    client_id: String,
    host: String,
    /// Topic to assigned partitions (consumer protocol only).
    assignment: BTreeMap<String, Vec<i32>>,
}

#[derive(Debug, Default, Serialize)]
struct PartitionLag {
    topic: String,
    partition: i32,
    committed: Option<i64>,
    log_start: Option<i64>,
    high_watermark: Option<i64>,
    last_stable_offset: Option<i64>,
    lag: Option<i64>,
    lag_committed: Option<i64>,
    /// The member the partition is assigned to, if any.
    member_id: Option<String>,
    client_id: Option<String>,
    host: Option<String>,
}

#[derive(Debug, Serialize)]
struct TopicLag {
    topic: String,
    partitions: usize,
    lag: i64,
    lag_committed: i64,
}

/// A consumer-protocol group's epochs (KIP-848): the group's, the target assignment's, and each
/// member's with its assignment and target.
#[derive(Debug, Serialize)]
struct Epochs {
    group_epoch: i32,
    assignment_epoch: i32,
    assignor: String,
    members: Vec<MemberEpoch>,
}

#[derive(Debug, Serialize)]
struct MemberEpoch {
    member_id: String,
    member_epoch: i32,
    assignment: BTreeMap<String, Vec<i32>>,
    target: BTreeMap<String, Vec<i32>>,
}

#[derive(Debug, Serialize)]
struct GroupInfo {
    group: String,
    /// The coordinator's node id (for shoal, a core).
    coordinator: i32,
    state: String,
    protocol_type: String,
    protocol: String,
    members: Vec<Member>,
    partitions: Vec<PartitionLag>,
    topics: Vec<TopicLag>,
    total_lag: i64,
    total_lag_committed: i64,
    /// Of a consumer-protocol group only.
    #[serde(skip_serializing_if = "Option::is_none")]
    epochs: Option<Epochs>,
}

/// `end - committed`, or `end - log_start` where nothing is committed; `None` where the leader
/// did not say.
fn lag(committed: Option<i64>, log_start: Option<i64>, end: Option<i64>) -> Option<i64> {
    Some(end? - committed.or(log_start)?)
}

pub fn describe(s: &Session, group: &str) -> Result<Report, Failure> {
    let (node, g, committed, consumer) = coordinator::retrying(s, || {
        let (node, addr) = coordinator::find(s, group)?;
        let g = coordinator::describe(s, addr, group)?;
        let consumer = if g.protocol_type.as_str() == "consumer" {
            coordinator::describe_consumer(s, addr, group)?
        } else {
            None
        };
        Ok((node, g, coordinator::committed(s, addr, group)?, consumer))
    })?;
    if g.group_state.as_str() == "Dead" && committed.is_empty() {
        return Err(Failure::kafka(
            GROUP_ID_NOT_FOUND,
            &format!("group {group}"),
            Some("no such group"),
        ));
    }
    let protocol_type = g.protocol_type.to_string();
    let members: Vec<Member> = g
        .members
        .iter()
        .map(|m| Member {
            member_id: m.member_id.to_string(),
            group_instance_id: m.group_instance_id.as_ref().map(|i| i.to_string()),
            client_id: m.client_id.to_string(),
            host: m.client_host.to_string(),
            assignment: coordinator::assignment(&protocol_type, m),
        })
        .collect();
    let partitions = partition_lags(s, &committed, &members)?;
    let topics = topic_totals(&partitions);
    let info = GroupInfo {
        group: group.to_string(),
        coordinator: node,
        state: g.group_state.to_string(),
        protocol_type,
        protocol: g.protocol_data.to_string(),
        members,
        total_lag: topics.iter().map(|t| t.lag).sum(),
        total_lag_committed: topics.iter().map(|t| t.lag_committed).sum(),
        partitions,
        topics,
        epochs: consumer.map(|c| epochs(&c)),
    };
    Ok(Report {
        tables: tables(&info),
        json: serde_json::to_value(&info).expect("plain data serializes"),
    })
}

/// The epochs ConsumerGroupDescribe gave.
fn epochs(
    c: &kafka_protocol::messages::consumer_group_describe_response::DescribedGroup,
) -> Epochs {
    use kafka_protocol::messages::consumer_group_describe_response::Assignment;
    let by_name = |a: &Assignment| -> BTreeMap<String, Vec<i32>> {
        a.topic_partitions
            .iter()
            .map(|t| (t.topic_name.to_string(), t.partitions.clone()))
            .collect()
    };
    Epochs {
        group_epoch: c.group_epoch,
        assignment_epoch: c.assignment_epoch,
        assignor: c.assignor_name.to_string(),
        members: c
            .members
            .iter()
            .map(|m| MemberEpoch {
                member_id: m.member_id.to_string(),
                member_epoch: m.member_epoch,
                assignment: by_name(&m.assignment),
                target: by_name(&m.target_assignment),
            })
            .collect(),
    }
}

/// Every partition of the topics the group has committed in or a member is assigned, with its
/// offsets and lag.
fn partition_lags(
    s: &Session,
    committed: &Committed,
    members: &[Member],
) -> Result<Vec<PartitionLag>, Failure> {
    let mut owner: BTreeMap<(&str, i32), &Member> = BTreeMap::new();
    for m in members {
        for (t, ps) in &m.assignment {
            for p in ps {
                owner.insert((t.as_str(), *p), m);
            }
        }
    }
    let keys: BTreeSet<(&str, i32)> = committed
        .keys()
        .map(|(t, p)| (t.as_str(), *p))
        .chain(owner.keys().copied())
        .collect();
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in &keys {
        by_topic.entry(t).or_default().push(*p);
    }
    let names: Vec<&str> = by_topic.keys().copied().collect();
    let m = if names.is_empty() {
        None
    } else {
        Some(s.metadata(Some(&names))?)
    };
    let mut out = Vec::new();
    for (topic, ps) in by_topic.iter_mut() {
        let m = m.as_ref().expect("metadata asked for every topic");
        // Every partition of the topic: one nobody committed or owns is lag too.
        if let Some(t) = m
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == *topic))
        {
            ps.extend(t.partitions.iter().map(|p| p.partition_index));
            ps.sort_unstable();
            ps.dedup();
        }
        let ask = |ts, iso| offsets::of_partitions(s, m, topic, ps, ts, iso);
        let hwm = ask(LATEST, Isolation::ReadUncommitted)?;
        let lso = ask(LATEST, Isolation::ReadCommitted)?;
        let start = ask(EARLIEST, Isolation::ReadUncommitted)?;
        for p in ps {
            let c = committed.get(&(topic.to_string(), *p)).copied();
            let (hwm, lso, start) = (
                hwm.get(p).copied(),
                lso.get(p).copied(),
                start.get(p).copied(),
            );
            let member = owner.get(&(*topic, *p));
            out.push(PartitionLag {
                topic: topic.to_string(),
                partition: *p,
                committed: c,
                log_start: start,
                high_watermark: hwm,
                last_stable_offset: lso,
                lag: lag(c, start, hwm),
                lag_committed: lag(c, start, lso),
                member_id: member.map(|m| m.member_id.clone()),
                client_id: member.map(|m| m.client_id.clone()),
                host: member.map(|m| m.host.clone()),
            });
        }
    }
    Ok(out)
}

fn topic_totals(partitions: &[PartitionLag]) -> Vec<TopicLag> {
    let mut totals: BTreeMap<&str, TopicLag> = BTreeMap::new();
    for p in partitions {
        let t = totals.entry(&p.topic).or_insert_with(|| TopicLag {
            topic: p.topic.clone(),
            partitions: 0,
            lag: 0,
            lag_committed: 0,
        });
        t.partitions += 1;
        t.lag += p.lag.unwrap_or(0);
        t.lag_committed += p.lag_committed.unwrap_or(0);
    }
    totals.into_values().collect()
}

fn tables(info: &GroupInfo) -> Vec<Table> {
    let opt = |o: &Option<i64>| o.map_or("-".to_string(), |o| o.to_string());
    let text = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let mut summary = Table::new(
        Some(format!("group {}", info.group)),
        vec![
            "COORDINATOR",
            "STATE",
            "PROTOCOL-TYPE",
            "PROTOCOL",
            "MEMBERS",
            "LAG",
        ],
    );
    summary.rows.push(vec![
        info.coordinator.to_string(),
        info.state.clone(),
        info.protocol_type.clone(),
        info.protocol.clone(),
        info.members.len().to_string(),
        info.total_lag.to_string(),
    ]);
    let mut parts = Table::new(
        Some("partitions".into()),
        vec![
            "TOPIC",
            "PARTITION",
            "COMMITTED",
            "LOG-START",
            "HIGH-WATERMARK",
            "LSO",
            "LAG",
            "LAG-COMMITTED",
            "MEMBER",
            "CLIENT-ID",
            "HOST",
        ],
    );
    for p in &info.partitions {
        parts.rows.push(vec![
            p.topic.clone(),
            p.partition.to_string(),
            opt(&p.committed),
            opt(&p.log_start),
            opt(&p.high_watermark),
            opt(&p.last_stable_offset),
            opt(&p.lag),
            opt(&p.lag_committed),
            text(&p.member_id),
            text(&p.client_id),
            text(&p.host),
        ]);
    }
    let mut topics = Table::new(
        Some("topics".into()),
        vec!["TOPIC", "PARTITIONS", "LAG", "LAG-COMMITTED"],
    );
    for t in &info.topics {
        topics.rows.push(vec![
            t.topic.clone(),
            t.partitions.to_string(),
            t.lag.to_string(),
            t.lag_committed.to_string(),
        ]);
    }
    let mut members = Table::new(
        Some("members".into()),
        vec!["MEMBER", "CLIENT-ID", "HOST", "ASSIGNED"],
    );
    for m in &info.members {
        let assigned: Vec<String> = m
            .assignment
            .iter()
            .map(|(t, ps)| {
                let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
                format!("{t}:{}", ps.join(","))
            })
            .collect();
        members.rows.push(vec![
            m.member_id.clone(),
            m.client_id.clone(),
            m.host.clone(),
            assigned.join(" "),
        ]);
    }
    let mut out = vec![summary, parts, topics];
    if !members.rows.is_empty() {
        out.push(members);
    }
    out.extend(info.epochs.as_ref().map(epochs_table));
    out
}

/// A consumer-protocol group's epochs, member by member.
fn epochs_table(e: &Epochs) -> Table {
    let list = |a: &BTreeMap<String, Vec<i32>>| -> String {
        let topics: Vec<String> = a
            .iter()
            .map(|(t, ps)| {
                let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
                format!("{t}:{}", ps.join(","))
            })
            .collect();
        topics.join(" ")
    };
    let mut t = Table::new(
        Some(format!(
            "consumer protocol: group epoch {}, assignment epoch {}, assignor {}",
            e.group_epoch, e.assignment_epoch, e.assignor
        )),
        vec!["MEMBER", "MEMBER-EPOCH", "ASSIGNED", "TARGET"],
    );
    for m in &e.members {
        t.rows.push(vec![
            m.member_id.clone(),
            m.member_epoch.to_string(),
            list(&m.assignment),
            list(&m.target),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_from_the_commit_or_the_log_start() {
        assert_eq!(lag(Some(7), Some(2), Some(10)), Some(3));
        assert_eq!(lag(None, Some(2), Some(10)), Some(8));
        assert_eq!(lag(Some(7), Some(2), None), None);
        assert_eq!(lag(None, None, Some(10)), None);
        let p = |topic: &str, lag| PartitionLag {
            topic: topic.into(),
            lag: Some(lag),
            lag_committed: Some(lag),
            ..PartitionLag::default()
        };
        let totals = topic_totals(&[p("a", 3), p("b", 1), p("a", 4)]);
        assert_eq!(totals.len(), 2);
        assert_eq!((totals[0].partitions, totals[0].lag), (2, 7));
        assert_eq!((totals[1].partitions, totals[1].lag), (1, 1));
    }
}
