//! Consumer group lag: how far each group's committed offsets are behind its partitions' high
//! watermarks, and how old the first record it has not consumed is. The coordinator core computes
//! the figures from the ends its partitions' owner cores report ([`compute`]; the round over the
//! mesh is `crate::cores::group_lag`'s) and keeps them here ([`LagFigures`]) for the statistics, which
//! render them ([`write_prometheus`]).

use super::offsets::TopicPartition;
use crate::metrics::{label_value, Exposition};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// Most timestamps one owner core reads for one round (one read of one batch each, mostly from
/// the tail cache); partitions past it report their high watermark only, and the time lag of
/// their groups is taken from their other partitions.
pub const MAX_TIMESTAMP_READS: usize = 10_000;

/// Settings from the command line.
#[derive(Debug, Clone, Copy)]
pub struct LagConfig {
    /// How often a coordinator core computes its groups' lag; zero: never (no lag series).
    /// Switchable live.
    pub interval: Duration,
    /// Also a series per group and partition (there can be many).
    pub per_partition: bool,
    /// Most per-partition series one core exports, over all its groups.
    pub max_partition_series: usize,
}

/// What a coordinator asks a partition's owner core: the partition, and the distinct offsets its
/// groups have committed to it (for the timestamps of the records there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndQuery {
    pub topic: String,
    pub partition: i32,
    /// Ascending.
    pub committed: Vec<i64>,
}

/// A partition's end, as its owner core reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionEnd {
    pub topic: String,
    pub partition: i32,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// (committed offset, timestamp of the record a consumer there gets next) for the asked offsets
    /// below the high watermark whose timestamp the log could tell; ascending by offset.
    pub next_timestamps: Vec<(i64, i64)>,
}

/// One partition's lag in a group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    pub lag: u64,
}

/// One group's lag over the partitions it has committed offsets for (those that still exist).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupLag {
    pub group: String,
    /// Records not yet consumed, over all partitions: high watermark minus committed offset.
    pub lag_sum: u64,
    /// The largest partition's.
    pub lag_max: u64,
    /// Age (ms) of the oldest record not yet consumed, over its partitions: now minus the timestamp
    /// of the record at the committed offset of each lagging partition; 0 when caught up. `None`
    /// when it lags and no lagging partition's timestamp could be read.
    pub time_lag_ms: Option<u64>,
    /// Per partition, when `--group-lag-per-partition` is on and within the series cap.
    pub partitions: Vec<PartitionLag>,
}

/// Committed offsets of a core's groups: (group, its (partition, offset) pairs).
pub type Positions = Vec<(String, Vec<(TopicPartition, i64)>)>;

/// The partitions whose ends the groups need, each with its distinct committed offsets but those
/// whose timestamps are `known` already.
pub fn queries(
    positions: &Positions,
    known: impl Fn(&TopicPartition, i64) -> bool,
) -> Vec<EndQuery> {
    let mut wanted: BTreeMap<&TopicPartition, BTreeSet<i64>> = BTreeMap::new();
    for (_, offsets) in positions {
        for (tp, offset) in offsets {
            let asked = wanted.entry(tp).or_default();
            if !known(tp, *offset) {
                asked.insert(*offset);
            }
        }
    }
    wanted
        .into_iter()
        .map(|((topic, partition), offsets)| EndQuery {
            topic: topic.clone(),
            partition: *partition,
            committed: offsets.into_iter().collect(),
        })
        .collect()
}

/// Each group's figures from the partitions' ends at `now_ms`. Partitions without an end (deleted,
/// or their owner did not answer) are left out; a group left with none gets no figures.
pub fn compute(
    positions: &Positions,
    ends: &HashMap<TopicPartition, PartitionEnd>,
    now_ms: i64,
    config: &LagConfig,
) -> Vec<GroupLag> {
    let mut series_left = if config.per_partition {
        config.max_partition_series
    } else {
        0
    };
    let mut out = Vec::new();
    for (group, offsets) in positions {
        let mut figures = GroupLag {
            group: group.clone(),
            lag_sum: 0,
            lag_max: 0,
            time_lag_ms: Some(0),
            partitions: Vec::new(),
        };
        let (mut known, mut lagging, mut timed) = (false, false, false);
        for (tp, offset) in offsets {
            let Some(end) = ends.get(tp) else { continue };
            known = true;
            let lag = end.high_watermark.saturating_sub(*offset).max(0) as u64;
            figures.lag_sum += lag;
            figures.lag_max = figures.lag_max.max(lag);
            if lag > 0 {
                lagging = true;
                let at = end
                    .next_timestamps
                    .binary_search_by_key(offset, |(o, _)| *o);
                if let Ok(i) = at {
                    let age = now_ms.saturating_sub(end.next_timestamps[i].1).max(0) as u64;
                    figures.time_lag_ms = figures.time_lag_ms.max(Some(age));
                    timed = true;
                }
            }
            if series_left > 0 {
                series_left -= 1;
                figures.partitions.push(PartitionLag {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    lag,
                });
            }
        }
        if lagging && !timed {
            figures.time_lag_ms = None;
        }
        if known {
            out.push(figures);
        }
    }
    out
}

/// The group lag a core keeps: its settings (the interval switchable live) and the latest figures
/// of the groups it coordinates.
#[derive(Debug)]
pub struct LagFigures {
    config: LagConfig,
    interval: Cell<Duration>,
    latest: RefCell<Vec<GroupLag>>,
    /// Timestamps of the records at committed offsets, read in earlier rounds: a record does not
    /// change, so a group that does not move costs one read, not one per round. Kept while the
    /// offset is committed and not below its partition's log start (where the next record moves).
    known: RefCell<HashMap<TopicPartition, BTreeMap<i64, i64>>>,
}

impl LagFigures {
    pub fn new(config: LagConfig) -> Self {
        Self {
            config,
            interval: Cell::new(config.interval),
            latest: RefCell::new(Vec::new()),
            known: RefCell::new(HashMap::new()),
        }
    }
    /// The settings in effect (with the interval as last set live).
    pub fn config(&self) -> LagConfig {
        LagConfig {
            interval: self.interval.get(),
            ..self.config
        }
    }
    pub fn set_interval(&self, interval: Duration) {
        self.interval.set(interval);
    }
    pub fn latest(&self) -> Vec<GroupLag> {
        self.latest.borrow().clone()
    }
    pub fn replace(&self, figures: Vec<GroupLag>) {
        *self.latest.borrow_mut() = figures;
    }
    /// Whether the timestamp at `offset` of `tp` is known from an earlier round.
    pub fn knows(&self, tp: &TopicPartition, offset: i64) -> bool {
        self.known
            .borrow()
            .get(tp)
            .is_some_and(|k| k.contains_key(&offset))
    }

    /// Adds the known timestamps of the offsets committed now (below the high watermark) to the
    /// ends reported this round, then keeps every timestamp the ends hold for the next round.
    pub fn complete(
        &self,
        positions: &Positions,
        ends: &mut HashMap<TopicPartition, PartitionEnd>,
    ) {
        let mut known = self.known.borrow_mut();
        for (tp, offset) in positions.iter().flat_map(|(_, offsets)| offsets) {
            let (Some(end), Some(ts)) =
                (ends.get_mut(tp), known.get(tp).and_then(|k| k.get(offset)))
            else {
                continue;
            };
            if *offset < end.high_watermark && !end.next_timestamps.iter().any(|(o, _)| o == offset)
            {
                end.next_timestamps.push((*offset, *ts));
            }
        }
        known.clear();
        for (tp, end) in ends.iter_mut() {
            end.next_timestamps.sort_unstable();
            let kept = end
                .next_timestamps
                .iter()
                .filter(|(o, _)| *o >= end.log_start_offset);
            known.insert(tp.clone(), kept.copied().collect());
        }
    }

    /// Drops a deleted group's figures at once, not at the next round.
    pub fn forget(&self, group: &str) {
        self.latest.borrow_mut().retain(|g| g.group != group);
    }
}

/// Whole seconds, rounded up: a group that lags by a few milliseconds does not read as caught up.
fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The group lag families over every core's groups (each group is on one core).
pub fn write_prometheus(out: &mut Exposition, groups: &[&GroupLag]) {
    let label = |g: &GroupLag| format!("group=\"{}\"", label_value(&g.group));
    out.family(
        "shoal_group_lag_sum",
        "gauge",
        "Records a consumer group has not consumed, over its partitions (high watermark minus \
         committed offset).",
        groups.iter().map(|g| (label(g), g.lag_sum)),
    );
    out.family(
        "shoal_group_lag_max",
        "gauge",
        "Records a consumer group has not consumed in its most lagging partition.",
        groups.iter().map(|g| (label(g), g.lag_max)),
    );
    out.family(
        "shoal_group_time_lag_seconds_max",
        "gauge",
        "Age of the oldest record a consumer group has not consumed (now minus the record's \
         timestamp), in whole seconds rounded up; 0 when caught up.",
        groups
            .iter()
            .filter_map(|g| Some((label(g), seconds_up(g.time_lag_ms?)))),
    );
    out.family(
        "shoal_group_partition_lag",
        "gauge",
        "Records a consumer group has not consumed in one partition (--group-lag-per-partition).",
        groups.iter().flat_map(|g| {
            g.partitions.iter().map(move |p| {
                let labels = format!(
                    "{},topic=\"{}\",partition=\"{}\"",
                    label(g),
                    label_value(&p.topic),
                    p.partition
                );
                (labels, p.lag)
            })
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        (t.to_string(), p)
    }

    fn config(per_partition: bool, max: usize) -> LagConfig {
        LagConfig {
            interval: Duration::from_secs(5),
            per_partition,
            max_partition_series: max,
        }
    }

    fn end(t: &str, p: i32, hw: i64, ts: &[(i64, i64)]) -> (TopicPartition, PartitionEnd) {
        let e = PartitionEnd {
            topic: t.to_string(),
            partition: p,
            high_watermark: hw,
            log_start_offset: 2,
            next_timestamps: ts.to_vec(),
        };
        (tp(t, p), e)
    }

    fn positions() -> Positions {
        vec![
            ("a".into(), vec![(tp("t", 0), 10), (tp("t", 1), 4)]),
            ("b".into(), vec![(tp("t", 0), 12), (tp("gone", 0), 3)]),
            ("c".into(), vec![(tp("gone", 0), 1)]),
        ]
    }

    #[test]
    fn queries_ask_each_partition_once_with_its_distinct_offsets() {
        let mut p = positions();
        p.push(("d".into(), vec![(tp("t", 0), 10)]));
        assert_eq!(
            queries(&p, |tp, o| *tp == ("t".to_string(), 1) && o == 4),
            vec![
                EndQuery {
                    topic: "gone".into(),
                    partition: 0,
                    committed: vec![1, 3]
                },
                EndQuery {
                    topic: "t".into(),
                    partition: 0,
                    committed: vec![10, 12]
                },
                EndQuery {
                    topic: "t".into(),
                    partition: 1,
                    committed: vec![],
                },
            ]
        );
    }

    #[test]
    fn lag_per_group_over_the_partitions_that_exist() {
        let ends: HashMap<_, _> = [
            end("t", 0, 12, &[(10, 1_000)]),
            end("t", 1, 9, &[(4, 4_500)]),
        ]
        .into_iter()
        .collect();
        let figures = compute(&positions(), &ends, 7_001, &config(true, 100));
        assert_eq!(
            figures.len(),
            2,
            "a group with only deleted partitions: none"
        );
        let a = &figures[0];
        assert_eq!((a.lag_sum, a.lag_max), (7, 5));
        assert_eq!(a.time_lag_ms, Some(6_001), "the oldest unconsumed record");
        assert_eq!(
            a.partitions,
            vec![
                PartitionLag {
                    topic: "t".into(),
                    partition: 0,
                    lag: 2
                },
                PartitionLag {
                    topic: "t".into(),
                    partition: 1,
                    lag: 5
                },
            ]
        );
        let b = &figures[1];
        assert_eq!((b.group.as_str(), b.lag_sum, b.lag_max), ("b", 0, 0));
        assert_eq!(b.time_lag_ms, Some(0), "caught up");
        assert_eq!(b.partitions.len(), 1);
    }

    #[test]
    fn timestamps_are_read_once_while_the_offset_stays_committed_above_the_log_start() {
        let figures = LagFigures::new(config(false, 0));
        let round = |positions: &Positions, reported: Vec<(TopicPartition, PartitionEnd)>| {
            let mut ends: HashMap<_, _> = reported.into_iter().collect();
            figures.complete(positions, &mut ends);
            compute(positions, &ends, 10_000, &figures.config())
        };
        let first = round(
            &positions(),
            vec![
                end("t", 0, 12, &[(10, 1_000)]),
                end("t", 1, 9, &[(4, 4_000)]),
            ],
        );
        assert_eq!(first[0].time_lag_ms, Some(9_000));
        assert!(figures.knows(&tp("t", 0), 10) && figures.knows(&tp("t", 1), 4));
        // The next round asks for no timestamp of these (12 is at the end: no read for it).
        let asked: Vec<Vec<i64>> = queries(&positions(), |tp, o| figures.knows(tp, o))
            .into_iter()
            .filter(|q| q.topic == "t")
            .map(|q| q.committed)
            .collect();
        assert_eq!(asked, [vec![12], vec![]]);
        let second = round(
            &positions(),
            vec![end("t", 0, 12, &[]), end("t", 1, 9, &[])],
        );
        assert_eq!(second, first);
        // Offset 1 of "gone" is below its log start: the record there moves, it is asked again.
        let p: Positions = vec![("c".into(), vec![(tp("gone", 0), 1)])];
        round(&p, vec![end("gone", 0, 5, &[(1, 3_000)])]);
        assert!(!figures.knows(&tp("gone", 0), 1));
        assert!(
            !figures.knows(&tp("t", 0), 10),
            "forgotten once no group commits it"
        );
    }

    #[test]
    fn partition_series_are_capped_and_off_by_default() {
        let ends: HashMap<_, _> = [end("t", 0, 12, &[]), end("t", 1, 9, &[])]
            .into_iter()
            .collect();
        let capped = compute(&positions(), &ends, 0, &config(true, 2));
        let kept: usize = capped.iter().map(|g| g.partitions.len()).sum();
        assert_eq!(kept, 2);
        let off = compute(&positions(), &ends, 0, &config(false, 100));
        assert!(off.iter().all(|g| g.partitions.is_empty()));
        assert_eq!(off[0].time_lag_ms, None, "lagging, and no timestamp read");
    }

    #[test]
    fn rendered_with_escaped_labels_and_time_lag_in_seconds_up() {
        let g = GroupLag {
            group: "we\"ird\\".into(),
            lag_sum: 7,
            lag_max: 5,
            time_lag_ms: Some(1_001),
            partitions: vec![PartitionLag {
                topic: "t".into(),
                partition: 1,
                lag: 5,
            }],
        };
        let mut out = Exposition::default();
        write_prometheus(&mut out, &[&g]);
        let text = out.into_text();
        assert!(text.contains("shoal_group_lag_sum{group=\"we\\\"ird\\\\\"} 7\n"));
        assert!(text.contains("shoal_group_time_lag_seconds_max{group=\"we\\\"ird\\\\\"} 2\n"));
        assert!(text.contains(
            "shoal_group_partition_lag{group=\"we\\\"ird\\\\\",topic=\"t\",partition=\"1\"} 5\n"
        ));
    }
}
