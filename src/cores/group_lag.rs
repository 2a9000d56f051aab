//! Consumer group lag, computed on each group's coordinator core: every interval, the core asks
//! each core that owns a partition its groups have committed offsets for (one message per owner
//! core, all its partitions in it) for the partition's high watermark and the timestamps of the
//! records at the committed offsets, then computes each group's figures
//! ([`crate::groups::lag::compute`]) and keeps them for the statistics. The owner answers from its
//! logs ([`partition_ends`]). Messages on the mesh, no lock; groups without commits cost nothing,
//! and partitions of deleted topics are skipped.

use crate::cores::mesh::{CoreMsg, QUESTION_TIMEOUT};
use crate::cores::Core;
use crate::groups::lag::{self, EndQuery, PartitionEnd};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often the round wakes to see whether the interval (switchable live) has passed.
const WAKE: Duration = Duration::from_secs(1);

/// Computes the lag of this core's groups every interval until the server stops. In edge mode
/// groups live upstream, and there is nothing to compute.
pub async fn run(core: Rc<Core>) {
    if core.is_edge() {
        return;
    }
    let mut last = Instant::now();
    loop {
        let interval = core.groups().lag().config().interval;
        let wait = if interval.is_zero() {
            WAKE
        } else {
            interval.saturating_sub(last.elapsed()).min(WAKE)
        };
        if !core.pause(wait).await {
            return;
        }
        let interval = core.groups().lag().config().interval;
        if interval.is_zero() {
            core.groups().lag().replace(Vec::new());
            continue;
        }
        if last.elapsed() < interval {
            continue;
        }
        last = Instant::now();
        match core.until_stopping(round(&core)).await {
            Some(figures) => core.groups().lag().replace(figures),
            None => return,
        }
    }
}

/// One round: the ends of every partition the groups committed offsets for, asked of their owner
/// cores at once, then the figures.
async fn round(core: &Rc<Core>) -> Vec<lag::GroupLag> {
    let positions = core.groups().positions();
    if positions.is_empty() {
        return Vec::new();
    }
    let mut by_owner: BTreeMap<usize, Vec<EndQuery>> = BTreeMap::new();
    let figures = core.groups().lag();
    for q in lag::queries(&positions, |tp, offset| figures.knows(tp, offset)) {
        if let Some(owner) = owner_of(core, &q.topic, q.partition) {
            by_owner.entry(owner).or_default().push(q);
        }
    }
    let local = by_owner.remove(&core.id()).unwrap_or_default();
    let mut asked = Vec::new();
    for (owner, queries) in by_owner {
        let msg = |id| CoreMsg::PartitionEnds {
            from: core.id(),
            id,
            asked: queries,
        };
        asked.extend(core.mesh().ask(owner, msg).await);
    }
    let mut ends: HashMap<_, PartitionEnd> = HashMap::new();
    let mut keep = |reported: Vec<PartitionEnd>| {
        ends.extend(
            reported
                .into_iter()
                .map(|e| ((e.topic.clone(), e.partition), e)),
        )
    };
    keep(partition_ends(core, local).await);
    let deadline = Instant::now() + QUESTION_TIMEOUT;
    for a in asked {
        if let Some(CoreMsg::PartitionEndsReply { ends, .. }) =
            core.mesh().answer(a, deadline).await
        {
            keep(ends);
        }
    }
    figures.complete(&positions, &mut ends);
    lag::compute(&positions, &ends, shards::now_ms(), &figures.config())
}

/// The core owning `topic`'s partition (a view's: its source's); `None` if the topic (or the
/// partition) no longer exists.
fn owner_of(core: &Core, topic: &str, partition: i32) -> Option<usize> {
    core.data_owner(topic, partition)
}

/// On an owner core: the asked partitions' ends, for those it owns (a partition moved or deleted
/// since is left out), reading at most [`lag::MAX_TIMESTAMP_READS`] timestamps.
pub async fn partition_ends(core: &Core, asked: Vec<EndQuery>) -> Vec<PartitionEnd> {
    let mut reads_left = lag::MAX_TIMESTAMP_READS;
    let mut out = Vec::with_capacity(asked.len());
    for q in asked {
        let Ok((p, _view)) = core.local_partition(&q.topic, q.partition) else {
            continue;
        };
        let high_watermark = p.log.high_watermark();
        let mut next_timestamps = Vec::new();
        for offset in q.committed.into_iter().filter(|&o| o < high_watermark) {
            if reads_left == 0 {
                break;
            }
            reads_left -= 1;
            match p.log.timestamp_at(offset).await {
                Ok(Some(ts)) => next_timestamps.push((offset, ts)),
                Ok(None) => {}
                Err(e) => log::debug!(
                    "group lag: no timestamp at {}-{} offset {offset}: {e}",
                    q.topic,
                    q.partition
                ),
            }
        }
        out.push(PartitionEnd {
            topic: q.topic,
            partition: q.partition,
            high_watermark,
            log_start_offset: p.log.log_start_offset(),
            next_timestamps,
        });
    }
    out
}
