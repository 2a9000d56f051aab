//! A large made-up cluster for the console's tests: many topics of many partitions spread over the
//! cores as the topic table spreads them, every partition with figures, and one partition read on
//! two cores (3 readers on core 1, 2 on core 2, of `topic-042` partition 7 where it exists).

use crate::stats::{CoreSnapshot, PartitionSnapshot};
use crate::table::{TopicMeta, TopicTable};
use std::collections::BTreeMap;

/// `topics` topics (`topic-000`, ...) of `partitions` partitions each on `cores` cores: every
/// partition's high watermark 10, size 100 bytes, 100 bytes appended.
pub fn many_partitions(
    topics: u64,
    partitions: i32,
    cores: usize,
) -> (Vec<CoreSnapshot>, TopicTable) {
    let mut table = TopicTable::default();
    for t in 0..topics {
        table.topics.insert(
            format!("topic-{t:03}"),
            TopicMeta {
                id: [t as u8; 16],
                partitions,
                configs: BTreeMap::new(),
                ordinal: t,
            },
        );
    }
    let mut snapshots: Vec<CoreSnapshot> = (0..cores)
        .map(|core| CoreSnapshot {
            core,
            ..CoreSnapshot::default()
        })
        .collect();
    for (name, m) in &table.topics {
        for p in 0..m.partitions {
            let owner = table.owner(m, p, cores);
            snapshots[owner].partitions.push(PartitionSnapshot {
                topic: name.clone(),
                partition: p,
                high_watermark: 10,
                last_stable_offset: 10,
                open_transactions: 0,
                log_start_offset: 0,
                size_bytes: 100,
                segments: 1,
                storage_failure: None,
                producer_ids: 0,
                appended_bytes: 100,
                writes: 1,
                fsyncs: 0,
                compactions: 0,
                compacted_bytes: 0,
                compacted_to_bytes: 0,
                first_dirty_offset: 0,
                upstream: None,
            });
        }
    }
    if cores > 2 {
        for (core, readers) in [(1, 3), (2, 2)] {
            snapshots[core]
                .replicas
                .fetch_connections
                .push(("topic-042".into(), 7, readers));
            snapshots[core]
                .replicas
                .topic_fetch_connections
                .push(("topic-042".into(), readers));
        }
    }
    (snapshots, table)
}
