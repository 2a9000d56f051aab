//! The check after a run: did every consumer receive every record?

use super::summary::{Correctness, IncompleteConsumer};
use crate::bench::stats::Shared;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

/// Did every consumer receive every record from its start offset to the final end offset, and
/// are those the records the run produced (`produced`: None for the raw baseline, which is not
/// checked)? The offsets of transaction markers a consumer read past hold no record. With
/// `lossy` producers (acks=0) the log may hold fewer than were sent.
pub(super) fn check(
    shared: &Shared,
    final_offsets: &[i64],
    drain_s: f64,
    produced: Option<u64>,
    lossy: bool,
) -> Correctness {
    let checked = produced.is_some();
    let mut c = Correctness {
        checked,
        produced_records: produced.unwrap_or(0),
        consumers: shared.consumers.len(),
        final_offsets: final_offsets.to_vec(),
        drain_s,
        ..Correctness::default()
    };
    if !checked {
        return c;
    }
    let end_of = |p: i32| final_offsets.get(p as usize).copied().unwrap_or(-1);
    // Shard views (--views): which records a shard holds is the broker's to decide (its own tests
    // check that record by record), so here every consumer of a shard must receive the same
    // records, and the shards of a partition together exactly the partition's.
    let mut shard_records: HashMap<(i32, u32), u64> = HashMap::new();
    for s in &shared.consumers {
        if let Some(shard) = s.shard {
            let e = shard_records.entry((s.partition, shard)).or_default();
            *e = (*e).max(s.records.load(Relaxed));
        }
    }
    // What each partition holds between the start and final offsets: the fewest of its
    // consumers' counts (a consumer that stopped short saw fewer transaction markers).
    let mut log_records: HashMap<i32, u64> = HashMap::new();
    let mut partition_records: HashMap<i32, u64> = HashMap::new();
    for ((p, _), n) in &shard_records {
        *partition_records.entry(*p).or_default() += n;
    }
    for (i, s) in shared.consumers.iter().enumerate() {
        let end = end_of(s.partition);
        let start = s.start_offset.load(Relaxed);
        let position = s.position.load(Relaxed);
        let received = s.records.load(Relaxed);
        let gaps = s.gap_offsets.load(Relaxed);
        let whole = ((end - start).max(0) as u64).saturating_sub(s.control_offsets.load(Relaxed));
        let held = log_records.entry(s.partition).or_insert(whole);
        *held = (*held).min(whole);
        let (expected, shards_add_up) = match s.shard {
            None => (whole, true),
            Some(shard) => (
                shard_records[&(s.partition, shard)],
                partition_records[&s.partition] == whole,
            ),
        };
        c.expected_records += expected;
        c.received_records += received;
        c.gaps += s.gaps.load(Relaxed);
        let complete = !s.failed.load(Relaxed)
            && shards_add_up
            && s.gaps.load(Relaxed) == 0
            && position == end
            && received == expected;
        if complete {
            c.complete_consumers += 1;
        } else if c.incomplete.len() < 10 {
            c.incomplete.push(IncompleteConsumer {
                consumer: i,
                partition: s.partition,
                start_offset: start,
                position,
                final_offset: end,
                received_records: received,
                gap_offsets: gaps,
            });
        }
    }
    c.log_records = log_records.values().sum();
    c.log_is_the_runs = if lossy {
        c.log_records <= c.produced_records
    } else {
        c.log_records == c.produced_records
    };
    c.all_received = c.complete_consumers == c.consumers && c.log_is_the_runs;
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::ConsumerStats;

    /// Two consumers of each of two partitions, each from offset 10 to 110, every record received.
    fn everyone_read_everything() -> Shared {
        let consumers = [0, 0, 1, 1]
            .into_iter()
            .map(|p| {
                let s = ConsumerStats::new(p, 10);
                s.position.store(110, Relaxed);
                s.records.store(100, Relaxed);
                s
            })
            .collect();
        Shared::new(1, consumers, 2, 1, 0)
    }

    #[test]
    fn the_log_must_hold_the_runs_records_and_no_others() {
        let shared = everyone_read_everything();
        let ends = [110, 110];
        let c = check(&shared, &ends, 0.1, Some(200), false);
        assert!(c.all_received && c.log_is_the_runs, "{c:?}");
        assert_eq!((c.log_records, c.produced_records), (200, 200));
        // Every consumer got every record between its offsets, but 50 of them were not the run's.
        let c = check(&shared, &ends, 0.1, Some(150), false);
        assert_eq!(c.complete_consumers, 4);
        assert!(!c.log_is_the_runs && !c.all_received, "{c:?}");
        // acks=0: requests may be lost on the way, never records added.
        assert!(check(&shared, &ends, 0.1, Some(250), true).all_received);
        assert!(!check(&shared, &ends, 0.1, Some(250), false).all_received);
        assert!(!check(&shared, &ends, 0.1, Some(150), true).all_received);
        // The raw baseline is not checked.
        assert!(!check(&shared, &ends, 0.1, None, false).checked);
    }
}
