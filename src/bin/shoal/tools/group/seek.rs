//! `shoal group seek`: moves a stopped group's committed offsets. Refused while the group has
//! members (their next commit would undo it, and Kafka's tool refuses too). Each partition's new
//! offset is its target (log start, high watermark, an offset, or the first record at or after a
//! time: ListOffsets by timestamp, the high watermark where no record is that late), or the
//! committed offset (log start where none) with only `--shift-by`, plus the shift, clamped to
//! [log start, high watermark]; then committed with OffsetCommit as a simple (memberless) commit.

use super::args::{SeekArgs, TopicPartitions};
use super::coordinator::{self, Committed};
use crate::tools::failure::Failure;
use crate::tools::offsets::{self, Isolation, EARLIEST, LATEST};
use crate::tools::output::{Report, Table};
use crate::tools::session::Session;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// NON_EMPTY_GROUP, what Kafka answers for a change to a group with members.
const NON_EMPTY_GROUP: i16 = 68;
/// UNKNOWN_TOPIC_OR_PARTITION.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// Where a partition goes, before `--shift-by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Earliest,
    Latest,
    Offset(i64),
    /// The first record at or after this time (ms since the epoch).
    Time(i64),
    /// The committed offset: `--shift-by` alone.
    Committed,
}

#[derive(Debug, Serialize)]
struct Move {
    topic: String,
    partition: i32,
    /// The committed offset before (`None`: nothing committed).
    current: Option<i64>,
    new: i64,
    log_start: i64,
    high_watermark: i64,
}

fn target(a: &SeekArgs) -> Result<Target, Failure> {
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    Ok(match a {
        SeekArgs {
            to_earliest: true, ..
        } => Target::Earliest,
        SeekArgs {
            to_latest: true, ..
        } => Target::Latest,
        SeekArgs {
            to_offset: Some(n), ..
        } => Target::Offset(*n),
        SeekArgs {
            to_datetime: Some(t),
            ..
        } => Target::Time(*t),
        SeekArgs {
            by_duration: Some(d),
            ..
        } => Target::Time(now_ms() - d.as_millis() as i64),
        SeekArgs {
            shift_by: Some(_), ..
        } => Target::Committed,
        _ => {
            return Err(Failure::usage(
                "where to? one of --to-earliest, --to-latest, --to-offset N, --to-datetime TIME, \
                 --by-duration D, or --shift-by N",
            ))
        }
    })
}

/// A partition's new offset: the target's offset (`None`: the committed offset, else the log
/// start), shifted, within [log start, high watermark].
fn new_offset(
    target: Option<i64>,
    committed: Option<i64>,
    start: i64,
    hwm: i64,
    shift: i64,
) -> i64 {
    let base = target.or(committed).unwrap_or(start);
    base.saturating_add(shift).min(hwm).max(start)
}

pub fn seek(s: &Session, a: SeekArgs) -> Result<Report, Failure> {
    let target = target(&a)?;
    let group = a.group.as_str();
    let (g, committed) = coordinator::retrying(s, || {
        let (_, addr) = coordinator::find(s, group)?;
        let g = coordinator::describe(s, addr, group)?;
        Ok((g, coordinator::committed(s, addr, group)?))
    })?;
    if !coordinator::is_stopped(&g) {
        return Err(Failure::kafka(
            NON_EMPTY_GROUP,
            &format!(
                "group {group} is {} with {} member(s): its offsets can only be moved while it has \
                 none",
                g.group_state,
                g.members.len()
            ),
            None,
        ));
    }
    let chosen = partitions(s, &a, &committed)?;
    let names: Vec<&str> = chosen.keys().map(String::as_str).collect();
    let m = s.metadata(Some(&names))?;
    let mut moves = Vec::new();
    for (topic, ps) in &chosen {
        let ask = |ts| offsets::of_partitions(s, &m, topic, ps, ts, Isolation::ReadUncommitted);
        let (start, hwm) = (ask(EARLIEST)?, ask(LATEST)?);
        let at_time = match target {
            Target::Time(ts) => ask(ts)?,
            _ => BTreeMap::new(),
        };
        for p in ps {
            let (Some(&start), Some(&hwm)) = (start.get(p), hwm.get(p)) else {
                return Err(Failure::other(
                    "LeaderNotAvailable",
                    format!("{topic}-{p}: its leader did not answer ListOffsets"),
                    "retry in a moment",
                ));
            };
            let current = committed.get(&(topic.clone(), *p)).copied();
            let to = match target {
                Target::Earliest => Some(start),
                Target::Latest => Some(hwm),
                Target::Offset(n) => Some(n),
                // -1 or no answer: no record that late, so the end.
                Target::Time(_) => Some(at_time.get(p).copied().filter(|o| *o >= 0).unwrap_or(hwm)),
                Target::Committed => None,
            };
            moves.push(Move {
                topic: topic.clone(),
                partition: *p,
                current,
                new: new_offset(to, current, start, hwm, a.shift_by.unwrap_or(0)),
                log_start: start,
                high_watermark: hwm,
            });
        }
    }
    if !a.dry_run {
        let plan: Committed = moves
            .iter()
            .map(|mv| ((mv.topic.clone(), mv.partition), mv.new))
            .collect();
        coordinator::retrying(s, || {
            let (_, addr) = coordinator::find(s, group)?;
            coordinator::commit(s, addr, group, &plan)
        })?;
    }
    Ok(report(group, a.dry_run, moves))
}

/// The partitions to move, by topic: those named (all of a topic's where none are), or with
/// --all-topics every partition of the topics the group has committed in (as `describe` shows
/// them: a partition nobody committed yet moves too).
fn partitions(
    s: &Session,
    a: &SeekArgs,
    committed: &Committed,
) -> Result<BTreeMap<String, Vec<i32>>, Failure> {
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    let specs: Vec<TopicPartitions> = if a.all_topics {
        let mut topics: Vec<&String> = committed.keys().map(|(t, _)| t).collect();
        topics.dedup();
        if topics.is_empty() {
            return Err(Failure::usage(format!(
                "group {} has no committed offsets: name the topics with --topic",
                a.group
            )));
        }
        topics
            .into_iter()
            .map(|t| TopicPartitions {
                topic: t.clone(),
                partitions: Vec::new(),
            })
            .collect()
    } else {
        a.topics.clone()
    };
    let names: Vec<&str> = specs.iter().map(|t| t.topic.as_str()).collect();
    let m = s.metadata(Some(&names))?;
    for spec in &specs {
        let what = format!("topic {}", spec.topic);
        let t = m
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == spec.topic))
            .ok_or_else(|| Failure::kafka(UNKNOWN_TOPIC_OR_PARTITION, &what, None))?;
        Failure::check(t.error_code, &what, None)?;
        let all: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
        let chosen = if spec.partitions.is_empty() {
            all
        } else if let Some(p) = spec.partitions.iter().find(|p| !all.contains(p)) {
            return Err(Failure::kafka(
                UNKNOWN_TOPIC_OR_PARTITION,
                &format!("{}-{p}", spec.topic),
                Some("no such partition"),
            ));
        } else {
            spec.partitions.clone()
        };
        let ps = out.entry(spec.topic.clone()).or_default();
        ps.extend(chosen);
        ps.sort_unstable();
        ps.dedup();
    }
    Ok(out)
}

fn report(group: &str, dry_run: bool, moves: Vec<Move>) -> Report {
    let title = if dry_run {
        format!("group {group}: the plan (dry run: nothing committed)")
    } else {
        format!("group {group}: offsets committed")
    };
    let mut t = Table::new(
        Some(title),
        vec![
            "TOPIC",
            "PARTITION",
            "CURRENT",
            "NEW",
            "LOG-START",
            "HIGH-WATERMARK",
        ],
    );
    for mv in &moves {
        t.rows.push(vec![
            mv.topic.clone(),
            mv.partition.to_string(),
            mv.current.map_or("-".into(), |c| c.to_string()),
            mv.new.to_string(),
            mv.log_start.to_string(),
            mv.high_watermark.to_string(),
        ]);
    }
    Report {
        tables: vec![t],
        json: json!({
            "group": group,
            "dry_run": dry_run,
            "committed": !dry_run,
            "partitions": moves,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_offsets_are_shifted_and_clamped() {
        // A target, shifted, kept within [log start, high watermark].
        assert_eq!(new_offset(Some(5), Some(9), 2, 20, 0), 5);
        assert_eq!(new_offset(Some(5), None, 2, 20, -10), 2);
        assert_eq!(new_offset(Some(50), None, 2, 20, 0), 20);
        // --shift-by alone: from the committed offset, else from the log start.
        assert_eq!(new_offset(None, Some(9), 2, 20, -3), 6);
        assert_eq!(new_offset(None, None, 2, 20, 4), 6);
        assert_eq!(new_offset(None, Some(9), 2, 20, i64::MAX), 20);
    }
}
