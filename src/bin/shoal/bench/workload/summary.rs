//! The summary of a run: what `--json` writes and the report prints.

use super::plan::ProducerMode;
use super::Backlog;
use crate::bench::stats;
use crate::bench::stats::{
    ConsumerStats, CoreCpu, Counters, CpuSample, DeviceMetrics, FetchMetrics, Latency, Shared,
    ViewMetrics,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    pub records: u64,
    pub bytes: u64,
    pub msg_per_s: f64,
    pub mb_per_s: f64,
}

impl Throughput {
    pub(super) fn of(records: u64, bytes: u64, secs: f64) -> Throughput {
        Throughput {
            records,
            bytes,
            msg_per_s: records as f64 / secs,
            mb_per_s: stats::mb(bytes as f64) / secs,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Delivered {
    pub records: u64,
    pub bytes: u64,
    pub msg_per_s: f64,
    pub mb_per_s: f64,
    pub slowest_consumer_msg_per_s: f64,
    pub slowest_consumer_mb_per_s: f64,
    pub fetches: u64,
    /// Record bytes per fetch response, on average (small at the tail, up to max_bytes catching up).
    pub mean_fetch_bytes: f64,
}

impl Delivered {
    /// What the consumers received between two snapshots `secs` apart.
    pub(super) fn between(begin: &Counters, end: &Counters, secs: f64) -> Delivered {
        let (er, eb) = end.consumed();
        let (br, bb) = begin.consumed();
        let (sr, sb) = end.slowest_since(begin);
        let fetches = end.fetches - begin.fetches;
        Delivered {
            records: er - br,
            bytes: eb - bb,
            msg_per_s: (er - br) as f64 / secs,
            mb_per_s: stats::mb((eb - bb) as f64) / secs,
            slowest_consumer_msg_per_s: sr as f64 / secs,
            slowest_consumer_mb_per_s: stats::mb(sb as f64) / secs,
            fetches,
            mean_fetch_bytes: (eb - bb) as f64 / fetches.max(1) as f64,
        }
    }
}

/// Whole-run counts (warm-up, backlog and drain included), for the correctness check. Bytes are
/// record-batch bytes as sent and received: compressed ones with `--compression`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub produced_records: u64,
    pub produced_bytes: u64,
    pub acked_records: u64,
    pub consumed_records: u64,
    pub consumed_bytes: u64,
    /// The part of the produced figures that is the backlog (`--backlog`).
    pub backlog_records: u64,
    pub backlog_bytes: u64,
}

impl Totals {
    /// The whole run's counts: the backlog's and the measured run's (its clients stopped).
    pub(super) fn of(shared: &Shared, backlog: &Backlog) -> Totals {
        let all = shared.snapshot();
        let (consumed_records, consumed_bytes) = all.consumed();
        Totals {
            produced_records: backlog.records + all.produced_records,
            produced_bytes: backlog.bytes + all.produced_bytes,
            acked_records: backlog.acked_records + shared.acked_records(),
            consumed_records,
            consumed_bytes,
            backlog_records: backlog.records,
            backlog_bytes: backlog.bytes,
        }
    }
}

/// How the producers marked their batches (`--idempotent`, `--transactional`), and the
/// transactional producers' commits over the run (warm-up and drain included; not the backlog's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProducerModeFigures {
    /// "plain", "idempotent" or "transactional".
    pub mode: &'static str,
    pub commit_interval_ms: Option<u64>,
    pub commits: Option<u64>,
    /// Mean time from sending EndTxn(commit) to its answer (the markers written).
    pub mean_end_txn_us: Option<f64>,
}

impl ProducerModeFigures {
    pub(super) fn of(shared: &Shared, mode: ProducerMode) -> ProducerModeFigures {
        let Some(interval) = mode.commit_interval() else {
            return ProducerModeFigures {
                mode: mode.name(),
                ..ProducerModeFigures::default()
            };
        };
        let commits: u64 = shared
            .producers
            .iter()
            .map(|p| p.commits.load(Relaxed))
            .sum();
        let us: u64 = shared
            .producers
            .iter()
            .map(|p| p.end_txn_us.load(Relaxed))
            .sum();
        ProducerModeFigures {
            mode: mode.name(),
            commit_interval_ms: Some(interval.as_millis() as u64),
            commits: Some(commits),
            mean_end_txn_us: (commits > 0).then(|| us as f64 / commits as f64),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Errors {
    pub count: u64,
    pub produce: u64,
    pub consume: u64,
    pub messages: Vec<String>,
}

impl Errors {
    pub(super) fn of(shared: &Shared) -> Errors {
        Errors {
            count: shared.error_count.load(Relaxed),
            produce: shared
                .producers
                .iter()
                .map(|p| p.errors.load(Relaxed))
                .sum(),
            consume: shared
                .consumers
                .iter()
                .map(|c| c.errors.load(Relaxed))
                .sum(),
            messages: shared.error_messages(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct IncompleteConsumer {
    pub consumer: usize,
    pub partition: i32,
    pub start_offset: i64,
    pub position: i64,
    pub final_offset: i64,
    pub received_records: u64,
    pub gap_offsets: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Correctness {
    /// False for the raw baseline (nothing was produced).
    pub checked: bool,
    /// Every consumer received every record from its start offset to the final offset, in order,
    /// no gaps, and those records are the ones the run produced (`log_is_the_runs`).
    pub all_received: bool,
    pub consumers: usize,
    pub complete_consumers: usize,
    /// Sum over consumers of (final offset - start offset).
    pub expected_records: u64,
    pub received_records: u64,
    pub gaps: u64,
    /// End offset of each partition after the producers stopped.
    pub final_offsets: Vec<i64>,
    /// Seconds the consumers took to reach those after the producers stopped.
    pub drain_s: f64,
    /// Up to 10 consumers that did not receive everything.
    pub incomplete: Vec<IncompleteConsumer>,
    /// The records the partitions hold from the consumers' start offsets to the final offsets
    /// (transaction markers left out).
    pub log_records: u64,
    /// The records the run's producers sent (the backlog's included).
    pub produced_records: u64,
    /// `log_records` is `produced_records` (with acks=0, at most that: a request may be lost):
    /// the consumers read the run's records and no others.
    pub log_is_the_runs: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GeneratorCpu {
    /// CPU seconds of the load generator: this process's threads other than the server's.
    pub cpu_s: f64,
    /// cpu_s over the measured seconds.
    pub cores: f64,
    pub cpu_s_per_delivered_gb: Option<f64>,
    /// CPU seconds of this process that neither the generator's nor an embedded server's figure
    /// holds: what threads used after the last once-a-second sample that saw them, before they
    /// exited.
    pub unattributed_cpu_s: f64,
}

impl GeneratorCpu {
    /// The generator threads' CPU between two samples `secs` apart, in which `gb` gigabytes were
    /// delivered.
    pub(super) fn between(begin: &CpuSample, end: &CpuSample, secs: f64, gb: f64) -> GeneratorCpu {
        let cpu_s = end.others_s - begin.others_s;
        GeneratorCpu {
            cpu_s,
            cores: cpu_s / secs,
            cpu_s_per_delivered_gb: per_gb(cpu_s, gb),
            unattributed_cpu_s: end.unattributed_since(begin),
        }
    }
}

/// CPU seconds per delivered gigabyte (none when nothing was delivered).
pub(super) fn per_gb(cpu_s: f64, gb: f64) -> Option<f64> {
    (gb > 0.0).then(|| cpu_s / gb)
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerFigures {
    /// Where its CPU figure comes from: "threads" (in this process), "pid N", or null.
    pub observed: Option<String>,
    pub cpu_s: Option<f64>,
    /// How `cpu_s` was measured (the clock read, its resolution, what happens to exited threads).
    pub cpu_method: Option<String>,
    pub cores: Option<f64>,
    pub cpu_s_per_delivered_gb: Option<f64>,
    /// Its CPU over the fetch responses the consumers received (microseconds; the produce work,
    /// if any, included): at the tail, where every response carries a batch or two, the figure
    /// that the CPU per GB and the time to answer every consumer once follow from.
    pub cpu_us_per_fetch: Option<f64>,
    /// The peak from the moment the consumers start (or over the process's life where the peak
    /// cannot be reset: see `peak_rss_since_consumers_start`).
    pub peak_rss_bytes: Option<u64>,
    pub peak_rss_includes_generator: bool,
    /// Resident set when the consumers start (after any backlog was produced).
    pub rss_at_consumers_start_bytes: Option<u64>,
    pub peak_rss_since_consumers_start: bool,
    /// peak_rss_bytes - rss_at_consumers_start_bytes: what serving the consumers cost in memory,
    /// beyond what was resident already (caches filled by producing, the process itself).
    pub peak_rss_growth_bytes: Option<u64>,
    /// From shoal's /metrics, over the measured interval.
    pub fetch: Option<FetchMetrics>,
    /// shoal's storage device latencies (writes of appends, fsyncs), over the measured interval.
    pub device: Option<DeviceMetrics>,
    /// From shoal's /metrics, over the whole run (`--views`).
    pub views: Option<ViewMetrics>,
}

/// One broker as the run saw it; for shoal, one core (the node id is the core's index).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BrokerFigures {
    pub node_id: i32,
    /// Consumers fetching from it when the measured interval ended: those of the partitions it
    /// leads, and those a fetch response sent to it as a read replica.
    pub consumers_at_end: usize,
    /// Its core thread's CPU seconds over the measured interval, with those of the io_uring
    /// workers serving that thread's ring (a worker is named after the thread: `iou-wrk-<tid>`),
    /// where the broker's threads can be seen (an embedded shoal, or one on this host).
    pub cpu_s: Option<f64>,
    /// The io_uring workers' part of `cpu_s`.
    pub io_uring_workers_cpu_s: Option<f64>,
}

impl BrokerFigures {
    /// Every broker that consumers fetched from at the end (`consumers`, by node id) and every
    /// core whose CPU was seen (`cores`, by index), in node id order.
    pub(super) fn list(
        consumers: &BTreeMap<i32, usize>,
        cores: Option<&BTreeMap<usize, CoreCpu>>,
    ) -> Vec<BrokerFigures> {
        let mut out: BTreeMap<i32, BrokerFigures> = consumers
            .iter()
            .map(|(&node_id, &n)| {
                let b = BrokerFigures {
                    node_id,
                    consumers_at_end: n,
                    ..BrokerFigures::default()
                };
                (node_id, b)
            })
            .collect();
        for (&core, cpu) in cores.into_iter().flatten() {
            let Ok(node_id) = i32::try_from(core) else {
                continue;
            };
            let b = out.entry(node_id).or_insert_with(|| BrokerFigures {
                node_id,
                ..BrokerFigures::default()
            });
            b.cpu_s = Some(cpu.thread_s + cpu.workers_s);
            b.io_uring_workers_cpu_s = Some(cpu.workers_s);
        }
        out.into_values().collect()
    }
}

/// Read replicas (KIP-392) as the consumers met them, over the whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReadReplicas {
    /// `--follow-replicas`: consumers move to the broker a fetch response prefers.
    pub follow: bool,
    /// Fetch responses that preferred another broker than the one asked, followed or not.
    pub redirects: u64,
    /// Times a consumer moved to a read replica, and back to its partition's leader (the replica
    /// refused it, failed, or preferred the leader).
    pub moves_to_replica: u64,
    pub returns_to_leader: u64,
}

impl ReadReplicas {
    pub(super) fn of(shared: &Shared, follow: bool) -> ReadReplicas {
        let sum = |f: fn(&ConsumerStats) -> u64| shared.consumers.iter().map(f).sum();
        ReadReplicas {
            follow,
            redirects: sum(|c| c.redirects.load(Relaxed)),
            moves_to_replica: sum(|c| c.to_replica.load(Relaxed)),
            returns_to_leader: sum(|c| c.to_leader.load(Relaxed)),
        }
    }
}

/// The shoal settings a run was made with, where known (None: not set by the generator and not
/// read back).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Settings {
    pub coalescing: Option<bool>,
    pub view_sharing: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub label: String,
    /// "kafka" or "raw-baseline".
    pub kind: &'static str,
    pub topic: Option<String>,
    /// Whether the run's topic was deleted after it (None: the raw baseline, which has none).
    pub topic_deleted: Option<bool>,
    pub partitions: i32,
    pub producers: usize,
    pub producer_mode: ProducerModeFigures,
    pub consumers_per_partition: usize,
    pub consumers: usize,
    /// Shard views read per partition (`--views`).
    pub views: Option<u32>,
    pub message_bytes: usize,
    pub records_per_batch: usize,
    pub coalescing: Option<bool>,
    pub view_sharing: Option<bool>,
    pub warmup_s: f64,
    pub measured_s: f64,
    pub produced: Throughput,
    pub delivered: Delivered,
    pub publish_latency_us: Option<Latency>,
    pub e2e_latency_us: Option<Latency>,
    pub totals: Totals,
    pub errors: Errors,
    pub correctness: Correctness,
    pub generator: GeneratorCpu,
    pub server: ServerFigures,
    /// Per broker (a shoal core): the consumers fetching from it at the end of the measured
    /// interval, and its CPU over it where its threads can be seen. Empty for the raw baseline.
    pub per_broker: Vec<BrokerFigures>,
    pub read_replicas: ReadReplicas,
    /// Delivered MB/s over the raw baseline's with the same consumers: only when it ran and the
    /// producers were not paced (`--rate 0`), as the raw server answers every fetch at once.
    pub raw_baseline_fraction: Option<f64>,
    /// Paced runs (`--rate`): the broker's CPU-s per delivered GB over the paced raw server's with
    /// the same consumers (which sends as many responses of the same sizes, at no other cost).
    pub raw_cpu_ratio: Option<f64>,
    /// Produced MB/s over the disk baseline's write rate (`--disk-baseline`), when it ran.
    pub disk_baseline_fraction: Option<f64>,
    /// What makes the figures other than they seem (producers short of `--rate` or not paced, a
    /// saturated generator), a sentence each.
    pub cautions: Vec<String>,
}

#[cfg(test)]
impl RunSummary {
    /// A Kafka run with every figure set and two consumers short of records: the report's tests
    /// print it, and unset what they do not want.
    pub(crate) fn sample() -> RunSummary {
        let latency = |base: u64| Latency {
            samples: 12_345,
            mean: base as f64 * 1.5,
            p50: base,
            p99: base * 4,
            p99_9: base * 9,
            p99_99: base * 20,
            max: base * 50,
        };
        let incomplete = |consumer: usize| IncompleteConsumer {
            consumer,
            partition: consumer as i32 % 2,
            start_offset: 10,
            position: 900 + consumer as i64,
            final_offset: 1_000,
            received_records: 880,
            gap_offsets: 11,
        };
        let core = |node_id: i32, consumers_at_end: usize, cpu_s: f64| BrokerFigures {
            node_id,
            consumers_at_end,
            cpu_s: Some(cpu_s),
            io_uring_workers_cpu_s: Some(cpu_s / 8.0),
        };
        RunSummary {
            label: "consumers=4x2 producers=1 coalescing=on".into(),
            kind: "kafka",
            topic: Some("fanout".into()),
            topic_deleted: Some(true),
            partitions: 2,
            producers: 1,
            producer_mode: ProducerModeFigures {
                mode: "transactional",
                commit_interval_ms: Some(100),
                commits: Some(1_234),
                mean_end_txn_us: Some(2_345.6),
            },
            consumers_per_partition: 4,
            consumers: 8,
            views: Some(2),
            message_bytes: 1_000,
            records_per_batch: 16,
            coalescing: Some(true),
            view_sharing: Some(true),
            warmup_s: 2.0,
            measured_s: 5.25,
            produced: Throughput::of(1_234_567, 1_234_567_000, 5.25),
            delivered: Delivered {
                records: 9_876_543,
                bytes: 9_876_543_000,
                msg_per_s: 1_881_246.3,
                mb_per_s: 1_794.1,
                slowest_consumer_msg_per_s: 230_000.7,
                slowest_consumer_mb_per_s: 219.35,
                fetches: 456_789,
                mean_fetch_bytes: 21_621.9,
            },
            publish_latency_us: Some(latency(850)),
            e2e_latency_us: Some(latency(1_250)),
            totals: Totals {
                produced_records: 1_300_000,
                produced_bytes: 1_300_000_000,
                acked_records: 1_300_000,
                consumed_records: 10_400_000,
                consumed_bytes: 10_400_000_000,
                backlog_records: 0,
                backlog_bytes: 0,
            },
            errors: Errors {
                count: 3,
                produce: 1,
                consume: 2,
                messages: vec!["producer 0: timed out".into(), "consumer 3: reset".into()],
            },
            correctness: Correctness {
                checked: true,
                all_received: false,
                consumers: 8,
                complete_consumers: 6,
                expected_records: 7_920,
                received_records: 7_800,
                gaps: 2,
                final_offsets: vec![1_000, 1_000],
                drain_s: 0.125,
                incomplete: vec![incomplete(3), incomplete(6)],
                log_records: 1_301_024,
                produced_records: 1_300_000,
                log_is_the_runs: false,
            },
            generator: GeneratorCpu {
                cpu_s: 4.321,
                cores: 0.823,
                cpu_s_per_delivered_gb: Some(0.4375),
                unattributed_cpu_s: 0.25,
            },
            server: ServerFigures::sample(),
            per_broker: vec![core(0, 5, 4.0), core(1, 3, 2.25), core(2, 0, 0.25)],
            read_replicas: ReadReplicas {
                follow: true,
                redirects: 1_234,
                moves_to_replica: 40,
                returns_to_leader: 2,
            },
            raw_baseline_fraction: Some(0.456),
            raw_cpu_ratio: None,
            disk_baseline_fraction: None,
            cautions: vec![
                "the producers reached 235,155 msg/s (235.2 MB/s), 47% of the 500,000 \
                            msg/s asked (--rate)"
                    .into(),
            ],
        }
    }
}

#[cfg(test)]
impl ServerFigures {
    /// A shoal's figures, every one set, for [`RunSummary::sample`].
    fn sample() -> ServerFigures {
        let ops = |count: u64, slowest: Option<f64>| stats::DeviceOps {
            count,
            mean_us: Some(123.4),
            over_10ms: 3,
            over_100ms: 1,
            slowest_within_s: slowest,
        };
        ServerFigures {
            observed: Some("threads".into()),
            cpu_method: Some(
                "the process CPU clock (ns) of pid 4242, exited threads included".into(),
            ),
            cpu_s: Some(6.5),
            cores: Some(1.238),
            cpu_s_per_delivered_gb: Some(0.658),
            cpu_us_per_fetch: Some(14.23),
            peak_rss_bytes: Some(512 << 20),
            peak_rss_includes_generator: true,
            rss_at_consumers_start_bytes: Some(300 << 20),
            peak_rss_since_consumers_start: true,
            peak_rss_growth_bytes: Some(212 << 20),
            fetch: Some(stats::FetchMetrics {
                coalescer_reads: 1_000,
                coalescer_inflight_hits: 2_000,
                coalescer_ready_hits: 5_000,
                coalescer_hit_ratio: Some(0.875),
                log_read_bytes: 1_234_567_000,
                response_bytes: 9_876_543_000,
                fan_out_saving: Some(8.0),
            }),
            device: Some(DeviceMetrics {
                writes: ops(45_678, Some(0.25)),
                fsyncs: ops(321, None),
            }),
            views: Some(ViewMetrics {
                source_batches: 77_160,
                source_batches_decoded: 77_161,
                shard_batches_encoded: 154_320,
                fetches_served: 456_789,
                catch_up_reads: 42,
                catch_up_reads_shared: 17,
                decode_errors: 0,
                decompressions_saved: 1_234,
                decodes_per_source_batch: Some(1.0000129),
            }),
        }
    }
}
