//! What one core reports ([`CoreSnapshot`]: each component's snapshot, plain data that crosses to
//! core 0), and `/metrics`, composed from each component's families.
//!
//! - `engine`     — the `shards` engine's figures: device latency, storage health, tail cache,
//!   coalescer, response memory, fetch pacing, views.
//! - `partitions` — each partition's log figures ([`PartitionSnapshot`]).
//! - [`kafka`]      — the Kafka front end's counters.
//! - [`http`]       — the HTTP streams' counters.

mod engine;
pub mod http;
pub mod kafka;
mod partitions;

use crate::edge::stats::EdgeFigures;
pub use crate::edge::{EdgeStats, FeedStatus};
use crate::groups::GroupStats;
use crate::metrics::Exposition;
use crate::stats::kafka::FrontEndSnapshot;
pub use partitions::PartitionSnapshot;

/// Everything one core reports, as plain data that can cross to core 0.
#[derive(Debug, Clone, Default)]
pub struct CoreSnapshot {
    pub core: usize,
    /// The Kafka front end's counters.
    pub kafka: FrontEndSnapshot,
    /// The HTTP stream front end's counters.
    pub http: http::HttpSnapshot,
    /// The storage device's write and fsync latencies, over every log of the core.
    pub device: shards::DeviceLatency,
    /// Storage failures of every log on the core (partitions and group stores).
    pub storage: shards::StorageHealth,
    pub tail_cache: shards::TailCacheStats,
    /// The core's open files budget and its use.
    pub open_files: shards::OpenFiles,
    pub coalescing: bool,
    pub coalescer: shards::coalescer::CoalescerStats,
    pub view_sharing: bool,
    pub views: shards::view_reader::ViewStats,
    pub response_memory_bytes: u64,
    /// The current fetch pacing delay (before the per-partition cap), in microseconds.
    pub fetch_pacing_delay_us: u64,
    /// Smoothed busy share of the core, in percent.
    pub busy_percent: u64,
    pub groups: GroupStats,
    pub transactions: crate::transactions::coordinator::TxnStats,
    /// The lag of the consumer groups the core coordinates, as last computed.
    pub group_lag: Vec<crate::groups::lag::GroupLag>,
    /// The groups the core coordinates, with their states and members (for the console).
    pub group_list: Vec<crate::groups::GroupSummary>,
    pub partitions: Vec<PartitionSnapshot>,
    /// Read replicas held and fed, hand-overs, redirects, fetch connections per partition.
    pub replicas: crate::replicas::ReplicaStats,
    /// Edge mode: the upstream fetchers' counters.
    pub edge: Option<EdgeStats>,
}

/// Renders all cores' snapshots as Prometheus text exposition; the partitions' log figures one
/// series per partition with `per_partition` (`--metrics-per-partition`), else summed per core.
pub fn render_prometheus(cores: &[CoreSnapshot], per_partition: bool) -> String {
    let mut out = Exposition::default();
    let kafka: Vec<_> = cores.iter().map(|c| (c.core, &c.kafka)).collect();
    FrontEndSnapshot::write_prometheus(&mut out, &kafka);
    let streams: Vec<_> = cores.iter().map(|c| (c.core, &c.http)).collect();
    http::HttpSnapshot::write_prometheus(&mut out, &streams);
    let edge: Vec<_> = cores
        .iter()
        .map(|c| {
            let figures = EdgeFigures {
                stats: c.edge.clone(),
                cache_bytes: c.partitions.iter().map(|p| p.size_bytes).sum(),
            };
            (c.core, figures)
        })
        .collect();
    EdgeFigures::write_prometheus(&mut out, &edge);
    engine::write_prometheus(&mut out, cores);
    let groups: Vec<_> = cores.iter().map(|c| (c.core, &c.groups)).collect();
    GroupStats::write_prometheus(&mut out, &groups);
    let txns: Vec<_> = cores.iter().map(|c| (c.core, &c.transactions)).collect();
    crate::transactions::coordinator::TxnStats::write_prometheus(&mut out, &txns);
    let lag: Vec<_> = cores.iter().flat_map(|c| &c.group_lag).collect();
    crate::groups::lag::write_prometheus(&mut out, &lag);
    partitions::write_prometheus(&mut out, cores, per_partition);
    let replicas: Vec<_> = cores.iter().map(|c| (c.core, &c.replicas)).collect();
    crate::replicas::ReplicaStats::write_prometheus(&mut out, &replicas);
    out.into_text()
}

/// A populated snapshot of two cores (every figure non-zero on core 0; core 1 without edge mode)
/// and the text the renderer gives for it by default (`metrics_golden.txt`), and with each
/// partition's log figures.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{DurationHistogram, DurationSnapshot};
    use std::time::Duration;

    fn histogram(us: &[u64]) -> DurationSnapshot {
        let h = DurationHistogram::default();
        for &u in us {
            h.record(Duration::from_micros(u));
        }
        h.snapshot()
    }

    fn partition(topic: &str, index: i32, n: u64, upstream: bool) -> PartitionSnapshot {
        PartitionSnapshot {
            topic: topic.to_string(),
            partition: index,
            high_watermark: 1000 + n as i64,
            last_stable_offset: 990 + n as i64,
            log_start_offset: 10 + n as i64,
            size_bytes: 4096 * n,
            segments: 2 + n as usize,
            storage_failure: Some("disk full".to_string()),
            producer_ids: 3 + n,
            open_transactions: 2 + n,
            appended_bytes: 5000 + n,
            writes: 40 + n,
            fsyncs: 20 + n,
            compactions: 1 + n,
            compacted_bytes: 700 + n,
            compacted_to_bytes: 300 + n,
            first_dirty_offset: 500 + n as i64,
            upstream: upstream.then_some(FeedStatus {
                fetching: true,
                position: 1000,
                upstream_log_start_offset: 5,
                upstream_high_watermark: 1200,
                last_error: None,
            }),
        }
    }

    fn populated() -> Vec<CoreSnapshot> {
        (0..2usize)
            .map(|core| {
                let n = core as u64 + 1;
                CoreSnapshot {
                    core,
                    http: http::HttpSnapshot {
                        subscribers: 70 * n,
                        subscribers_total: 71 * n,
                        websocket_subscribers: 72 * n,
                        frames_encoded: 73 * n,
                        frames_sent: 74 * n,
                        frames_private: 75 * n,
                        records_sent: 76 * n,
                        bytes_sent: 77 * n,
                        gaps: 78 * n,
                        slow_disconnects: 79 * n,
                        refused: 80 * n,
                        handed_over: 81 * n,
                        tls_failures: 82 * n,
                        spread: 84 * n,
                        topics: vec![("prices".into(), 83 * n), ("prices.shard-0-of-2".into(), n)],
                    },
                    kafka: FrontEndSnapshot {
                        apis: vec![(0, 100 * n, 3 * n), (1, 200 * n, n), (99, n, 0)],
                        durations: vec![
                            (0, histogram(&[50, 100, 101, 900, 7_000_000])),
                            (1, histogram(&[20_000, 300 * n])),
                            (99, histogram(&[1])),
                        ],
                        bytes_in: 11 * n,
                        bytes_out: 12 * n,
                        response_writes: 13 * n,
                        connections_open: 14 * n,
                        connections_total: 15 * n,
                        fetch_connections: 16 * n,
                        protocol_errors: 17 * n,
                        handler_panics: 18 * n,
                        authentications: 19 * n,
                        authentication_failures: 20 * n,
                        tls_handshake_failures: 21 * n,
                        tls_kernel_connections: 22 * n,
                        tls_user_space_connections: 23 * n,
                        fetch_log_read_bytes: 36 * n,
                        fetch_response_bytes: 37 * n,
                        fetch_paced: 38 * n,
                        fetch_paced_us: 39 * n,
                        fetch_sessions: 85 * n,
                        fetch_session_evictions: 86 * n,
                        fetch_full: 87 * n,
                        fetch_incremental: 88 * n,
                    },
                    device: shards::DeviceLatency {
                        writes: histogram(&[200, 200_000, 30 * n]),
                        fsyncs: histogram(&[2_000, 9_000 * n]),
                    },
                    tail_cache: shards::TailCacheStats {
                        used_bytes: 24 * n as usize,
                        capacity_bytes: 25 * n as usize,
                        hits: 26 * n,
                        misses: 27 * n,
                        evicted_chunks: 0,
                        reused_chunks: 0,
                    },
                    open_files: shards::OpenFiles {
                        limit: 89 * n,
                        open: 90 * n,
                        evictions: 91 * n,
                        refusals: 92 * n,
                    },
                    coalescing: core == 0,
                    view_sharing: core == 0,
                    coalescer: shards::coalescer::CoalescerStats {
                        insertions: 28 * n,
                        reinsertions: 29 * n,
                        ready_hits: 30 * n,
                        inflight_hits: 31 * n,
                        evictions: 32 * n,
                        cached_bytes: 33 * n,
                        cached_entries: 34 * n,
                        reads: 35 * n,
                    },
                    fetch_pacing_delay_us: 40 * n,
                    busy_percent: 41 * n,
                    response_memory_bytes: 42 * n,
                    views: shards::view_reader::ViewStats {
                        readers: 43 * n,
                        source_batches_decoded: 44 * n,
                        shard_batches_encoded: 45 * n,
                        fetches_served: 46 * n,
                        catch_up_reads: 47 * n,
                        decode_errors: 48 * n,
                        decompressions_saved: 49 * n,
                        catch_up_reads_shared: 50 * n,
                    },
                    groups: GroupStats {
                        by_state: [51 * n, 52 * n, 53 * n, 54 * n, 55 * n],
                        consumer_by_state: [91 * n, 92 * n, 93 * n, 94 * n],
                        members: 56 * n,
                        rebalances: 57 * n,
                        offset_commits: 58 * n,
                    },
                    transactions: crate::transactions::coordinator::TxnStats {
                        ids: 77 * n,
                        open: 78 * n,
                        commits: 79 * n,
                        aborts: 80 * n,
                        timeouts: 81 * n,
                        fenced: 82 * n,
                    },
                    group_list: Vec::new(),
                    group_lag: vec![crate::groups::lag::GroupLag {
                        group: format!("g{core}"),
                        lag_sum: 74 * n,
                        lag_max: 75 * n,
                        time_lag_ms: (core == 0).then_some(76_000),
                        partitions: vec![crate::groups::lag::PartitionLag {
                            topic: "a".into(),
                            partition: 0,
                            lag: 74 * n,
                        }],
                    }],
                    storage: shards::StorageHealth {
                        errors: 59 * n,
                        failing_logs: 60 * n,
                    },
                    partitions: vec![
                        partition("a", 0, n, core == 0),
                        partition("b", 3, n + 10, false),
                    ],
                    replicas: crate::replicas::ReplicaStats {
                        held: 67 * n,
                        fed: 68 * n,
                        handover_batches: 69 * n,
                        handover_bytes: 70 * n,
                        snapshots: 71 * n,
                        redirects: 72 * n,
                        fetch_connections: vec![("a".into(), 0, 73 * n as u32)],
                        topic_fetch_connections: vec![("a".into(), 73 * n as u32)],
                        replica_cores: vec![("a".into(), 0, vec![1 - core as i32])],
                    },
                    edge: (core == 0).then(|| EdgeStats {
                        upstream: "up:9092".to_string(),
                        fetch_streams: 61,
                        upstream_fetches: 62,
                        upstream_bytes: 63,
                        read_through: 64,
                        read_through_bytes: 65,
                        upstream_errors: 66,
                    }),
                }
            })
            .collect()
    }

    #[test]
    fn metrics_text_is_unchanged() {
        let text = render_prometheus(&populated(), false);
        if std::env::var_os("SHOAL_BLESS_METRICS").is_some() {
            std::fs::write(
                concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics_golden.txt"),
                &text,
            )
            .unwrap();
        }
        assert_eq!(
            families(&text),
            families(include_str!("../metrics_golden.txt"))
        );
    }

    #[test]
    fn edge_families_only_when_a_core_is_in_edge_mode() {
        let mut cores = populated();
        assert!(render_prometheus(&cores, false).contains("\nshoal_edge_cache_bytes{core=\"1\"} "));
        cores[0].edge = None;
        assert!(!render_prometheus(&cores, false).contains("shoal_edge_"));
    }

    #[test]
    fn log_families_are_per_partition_only_when_asked_and_sum_alike() {
        let cores = populated();
        let sum = |text: &str, family: &str| -> (usize, u64) {
            let samples: Vec<u64> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{family}{{")))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect();
            (samples.len(), samples.iter().sum())
        };
        let (by_core, by_partition) = (
            render_prometheus(&cores, false),
            render_prometheus(&cores, true),
        );
        let per_partition = |l: &&str| l.starts_with("shoal_log_") && l.contains("topic=");
        assert_eq!(by_core.lines().filter(per_partition).count(), 0);
        assert_eq!(by_partition.lines().filter(per_partition).count(), 12 * 4);
        assert!(by_partition
            .contains("\nshoal_log_size_bytes{core=\"0\",topic=\"a\",partition=\"0\"} 4096\n"));
        // Core 0: partitions of n = 1 and 11; core 1: of n = 2 and 12.
        assert!(by_core.contains("\nshoal_log_size_bytes{core=\"0\"} 49152\n"));
        for family in [
            "shoal_log_size_bytes",
            "shoal_log_high_watermark",
            "shoal_log_fsyncs_total",
        ] {
            let (cores_n, core_sum) = sum(&by_core, family);
            let (partitions_n, partition_sum) = sum(&by_partition, family);
            assert_eq!((cores_n, partitions_n), (2, 4), "{family}");
            assert_eq!(core_sum, partition_sum, "{family}");
        }
        // Everything else is the same text.
        let others = |text: &str| -> Vec<String> {
            families(text)
                .into_iter()
                .filter(|f| !f.starts_with("# HELP shoal_log_") || f.contains("_duration_seconds"))
                .collect()
        };
        assert_eq!(others(&by_core), others(&by_partition));
    }

    /// The text's metric families (each its HELP and TYPE lines and samples, in order), sorted by
    /// name: the exposition format leaves the order of families free.
    fn families(text: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for line in text.lines() {
            if line.starts_with("# HELP ") || out.is_empty() {
                out.push(String::new());
            }
            let family = out.last_mut().unwrap();
            family.push_str(line);
            family.push('\n');
        }
        out.sort();
        out
    }
}
