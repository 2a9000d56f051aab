//! Each partition's log figures on a core, and their `/metrics` families.

use super::CoreSnapshot;
use super::FeedStatus;
use crate::metrics::{core_label, Exposition, Family};

/// One partition's figures.
#[derive(Debug, Clone)]
pub struct PartitionSnapshot {
    pub topic: String,
    pub partition: i32,
    pub high_watermark: i64,
    /// Where read_committed reads end: the oldest open transaction's first offset, else the
    /// high watermark.
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub size_bytes: u64,
    pub segments: usize,
    /// The storage failure the partition's log is in the middle of (appends fail), as first logged.
    pub storage_failure: Option<String>,
    /// Idempotent producers whose sequence state is kept.
    pub producer_ids: u64,
    /// Transactions open in the partition (begun, no marker yet).
    pub open_transactions: u64,
    /// Batch bytes appended since the log was opened.
    pub appended_bytes: u64,
    /// Writes to disk of grouped appends.
    pub writes: u64,
    /// fsyncs (group commits, flushes, segment seals).
    pub fsyncs: u64,
    /// Compaction passes, bytes of segments they rewrote, and bytes those became.
    pub compactions: u64,
    pub compacted_bytes: u64,
    pub compacted_to_bytes: u64,
    /// The first offset compaction has not reached yet (compacted topics).
    pub first_dirty_offset: i64,
    /// Edge mode: the partition's upstream position, once a consumer has asked for it.
    pub upstream: Option<FeedStatus>,
}

/// Families with one sample per core, summed over its partitions.
const PER_CORE: [Family<CoreSnapshot>; 3] = [
    ("partitions", "gauge", "Partitions owned.", |c| {
        c.partitions.len() as u64
    }),
    (
        "producer_ids",
        "gauge",
        "Idempotent producers whose state is kept, summed over the core's partitions.",
        |c| c.partitions.iter().map(|p| p.producer_ids).sum(),
    ),
    (
        "open_transactions",
        "gauge",
        "Transactions open (begun, not ended by a marker), summed over the core's partitions.",
        |c| c.partitions.iter().map(|p| p.open_transactions).sum(),
    ),
];

const PER_PARTITION: [Family<PartitionSnapshot>; 12] = [
    ("size_bytes", "gauge", "Bytes in a partition's log.", |p| p.size_bytes),
    ("segments", "gauge", "Segments in a partition's log.", |p| p.segments as u64),
    ("appended_bytes_total", "counter", "Batch bytes appended to a partition's log since it was opened.", |p| p.appended_bytes),
    ("writes_total", "counter", "Disk writes of a partition's log (appends that arrive together share one).", |p| p.writes),
    ("fsyncs_total", "counter", "fsyncs of a partition's log: group commits (shared by concurrent acks=all appends), flushes, segment seals.", |p| p.fsyncs),
    ("compactions_total", "counter", "Compaction passes of a compacted partition's log.", |p| p.compactions),
    ("compacted_bytes_total", "counter", "Bytes of segments compaction rewrote (the log cleaned).", |p| p.compacted_bytes),
    ("compacted_to_bytes_total", "counter", "Bytes the segments compaction rewrote became.", |p| p.compacted_to_bytes),
    ("high_watermark", "gauge", "Next offset of a partition.", |p| p.high_watermark.max(0) as u64),
    ("last_stable_offset_lag", "gauge", "Offsets between a partition's last stable offset and its high watermark: what read_committed consumers wait on open transactions for.", |p| (p.high_watermark - p.last_stable_offset).max(0) as u64),
    ("start_offset", "gauge", "First offset of a partition.", |p| p.log_start_offset.max(0) as u64),
    ("first_dirty_offset", "gauge", "First offset of a partition not compacted yet (the start offset for topics that are not compacted).", |p| p.first_dirty_offset.max(0) as u64),
];

/// The per-core families, and the log families: with `per_partition` one sample per partition
/// (`{core,topic,partition}`: a dozen series per partition), else one per core, summed over its
/// partitions, so that `/metrics` stays small with any number of partitions and sums over the
/// family agree either way.
pub(super) fn write_prometheus(out: &mut Exposition, cores: &[CoreSnapshot], per_partition: bool) {
    let per_core: Vec<_> = cores.iter().map(|c| (c.core, c)).collect();
    out.per_core("shoal_", &PER_CORE, &per_core);
    for (name, kind, help, read) in PER_PARTITION {
        let name = format!("shoal_log_{name}");
        if !per_partition {
            let help = format!("{help} Summed over the core's partitions (each partition's with --metrics-per-partition).");
            let sums = cores.iter().map(|c| {
                let sum = c.partitions.iter().map(read).sum();
                (core_label(c.core), sum)
            });
            out.family(&name, kind, &help, sums);
            continue;
        }
        let samples = cores.iter().flat_map(|c| {
            c.partitions.iter().map(move |p| {
                let labels = format!(
                    "{},topic=\"{}\",partition=\"{}\"",
                    core_label(c.core),
                    p.topic,
                    p.partition
                );
                (labels, read(p))
            })
        });
        out.family(&name, kind, help, samples);
    }
}
