//! One run of the fan-out workload: producers and consumers as tasks on a few glommio executors, an
//! orchestrating thread that moves the run through its phases (warm-up, measured interval, drain),
//! prints the live line every second and assembles the summary.
//!
//! Producers send one batch per request, round robin over their partitions, paced to `--rate`, with
//! up to `--max-in-flight` requests outstanding per connection (a writer task and a reader task share
//! the socket). Each batch's first record starts with the send time in microseconds.
//!
//! Each consumer has its own connection to its partition's leader and fetches on its own from its
//! own offset (no group). It walks batch headers only: it counts records, checks that offsets follow
//! on (a gap no batch explains is an error), and samples end-to-end latency from every batch's
//! embedded timestamp (for compressed batches, from one batch per response, which it decompresses).

//!
//! - [`executors`] — client executors and the plan of who runs where; [`consumer`], [`producer`]
//!   the tasks; [`live`] the line printed every second; [`summary`] and [`check`] what a run
//!   reports. This module holds the run itself (the orchestrating thread).

mod check;
mod consumer;
mod executors;
mod live;
mod producer;
mod summary;

use crate::bench::client::{self, Cluster, Codec, PartitionLeader};
use crate::bench::stats::{
    self, now_us, ConsumerStats, FetchMetrics, Latency, Phase, Shared, ViewMetrics,
};
use check::check;
use executors::{assign, spawn_clients, ClientCfg, ConsumerPlan};
use live::{Live, Snap};
pub(crate) use producer::template_batch;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use summary::{Delivered, Errors, GeneratorCpu, ServerFigures, Throughput, Totals};
pub use summary::{RunSummary, Settings};

/// Everything a run does, resolved from the command line.
#[derive(Debug, Clone)]
pub struct Workload {
    pub topic: String,
    pub partitions: i32,
    pub producers: usize,
    pub consumers_per_partition: usize,
    /// `--views N`: consumers read the N shard views `<topic>.shard-<i>-of-<N>` of each partition
    /// (`consumers_per_partition` on each shard), and records carry keys.
    pub views: Option<u32>,
    pub message_bytes: usize,
    pub records_per_batch: usize,
    /// Messages per second over all producers; 0: as fast as possible.
    pub rate: f64,
    pub acks: i16,
    pub duration: Duration,
    pub warmup: Duration,
    pub earliest: bool,
    pub backlog_bytes: u64,
    pub compression: Codec,
    pub client_threads: usize,
    /// CPU for each client executor (None: unbound).
    pub client_cpus: Vec<Option<usize>>,
    pub max_in_flight: usize,
    pub fetch_max_wait: Duration,
    pub fetch_max_bytes: i32,
    pub drain_timeout: Duration,
    pub receive_buffer: usize,
    /// Print a live line every second.
    pub live: bool,
}

/// What the consumers read from.
#[derive(Debug)]
pub enum Endpoint<'a> {
    /// A Kafka broker (shoal or another).
    Kafka(&'a Cluster),
    /// The raw TCP baseline: fetch answers from memory whose offsets wrap at `period`.
    Raw {
        addrs: Vec<SocketAddr>,
        period: i64,
        fetch_version: i16,
    },
}

/// How the server side can be observed.
#[derive(Debug, Clone, Default)]
pub struct Observer {
    /// Name prefix of the server's threads when it runs in this process.
    pub thread_prefix: Option<&'static str>,
    /// Its process id when it runs elsewhere on this host.
    pub pid: Option<u32>,
    /// shoal's admin HTTP address.
    pub admin: Option<SocketAddr>,
    /// Report this process's peak RSS as the server's (embedded broker; it includes the generator).
    pub rss_of_this_process: bool,
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// What the backlog's producers sent and had acknowledged (`--backlog`).
#[derive(Debug, Default)]
struct Backlog {
    records: u64,
    bytes: u64,
    acked_records: u64,
}

/// Runs the workload once against `endpoint` and returns its summary.
pub fn run(
    w: &Workload,
    endpoint: &Endpoint<'_>,
    obs: &Observer,
    label: &str,
    settings: Settings,
) -> io::Result<RunSummary> {
    let epoch_us = now_us();
    let partitions = w.partitions as usize;
    let (leaders, fetch_version, produce_version, modulus) = match endpoint {
        Endpoint::Kafka(cluster) => (
            cluster.ensure_topic(&w.topic, w.partitions)?,
            cluster.versions.fetch,
            cluster.versions.produce,
            None,
        ),
        Endpoint::Raw {
            addrs,
            period,
            fetch_version,
        } => (
            (0..w.partitions)
                .map(|p| PartitionLeader {
                    partition: p,
                    leader: addrs[p as usize % addrs.len()],
                })
                .collect(),
            *fetch_version,
            0,
            Some(*period),
        ),
    };
    let raw = modulus.is_some();
    let producers = if raw { 0 } else { w.producers };
    let per_producer = if producers > 0 {
        w.rate / producers as f64
    } else {
        0.0
    };
    let cfg = ClientCfg {
        topic: w.topic.clone(),
        produce_version,
        fetch_version,
        acks: w.acks,
        compression: w.compression,
        message_bytes: w.message_bytes,
        records_per_batch: w.records_per_batch,
        views: w.views,
        batch_interval: if per_producer > 0.0 {
            w.records_per_batch as f64 / per_producer
        } else {
            0.0
        },
        max_in_flight: w.max_in_flight,
        fetch_max_wait: w.fetch_max_wait,
        fetch_max_bytes: w.fetch_max_bytes,
        receive_buffer: w.receive_buffer,
        modulus,
        sample_latency: !raw,
    };
    let threads = w.client_threads.max(1);

    // The catch-up workload: pre-produce the backlog before any consumer starts.
    let mut backlog = Backlog::default();
    if !raw && w.backlog_bytes > 0 {
        let n = w.producers.max(1);
        let shared = Arc::new(Shared::new(n, Vec::new(), partitions, threads, epoch_us));
        shared.byte_limit.store(w.backlog_bytes, Relaxed);
        let plans = assign(threads, &leaders, n, Vec::new());
        let mut bcfg = cfg.clone();
        bcfg.batch_interval = 0.0;
        let handles = spawn_clients(bcfg, &shared, plans, &w.client_cpus)?;
        let started = Instant::now();
        shared.set_phase(Phase::Backlog);
        if w.live {
            println!(
                "producing a backlog of {} before the consumers start...",
                stats::size(w.backlog_bytes)
            );
        }
        for h in handles {
            let _ = h.join();
        }
        let c = shared.snapshot();
        backlog = Backlog {
            records: c.produced_records,
            bytes: c.produced_bytes,
            acked_records: shared
                .producers
                .iter()
                .map(|p| p.acked_records.load(Relaxed))
                .sum(),
        };
        if w.live {
            let secs = started.elapsed().as_secs_f64();
            println!(
                "backlog: {} msgs, {} in {secs:.1} s ({:.1} MB/s)",
                stats::thousands(c.produced_records),
                stats::size(c.produced_bytes),
                stats::mb(c.produced_bytes as f64) / secs
            );
        }
        if shared.error_count.load(Relaxed) > 0 {
            return Err(io::Error::other(format!(
                "producing the backlog failed: {}",
                shared.error_messages().join("; ")
            )));
        }
    }

    // The end of a pure catch-up: the backlog's end offsets.
    let caught_up_ends: Option<Vec<i64>> = match endpoint {
        Endpoint::Kafka(cluster) if w.backlog_bytes > 0 && producers == 0 => {
            Some(cluster.offsets(&w.topic, &leaders, client::LATEST)?)
        }
        _ => None,
    };

    // Where consumers start.
    let starts: Vec<i64> = match endpoint {
        Endpoint::Kafka(cluster) => {
            let ts = if w.earliest || w.backlog_bytes > 0 {
                client::EARLIEST
            } else {
                client::LATEST
            };
            cluster.offsets(&w.topic, &leaders, ts)?
        }
        Endpoint::Raw { .. } => vec![0; partitions],
    };
    // Without views, `consumers_per_partition` consumers of the topic; with --views N, that many
    // for each shard view of it (a view partition has the source partition's leader and offsets).
    let topics: Vec<(Option<u32>, Arc<str>)> = match w.views {
        None => vec![(None, w.topic.as_str().into())],
        Some(n) => (0..n)
            .map(|i| (Some(i), format!("{}.shard-{i}-of-{n}", w.topic).into()))
            .collect(),
    };
    let mut consumer_plans = Vec::new();
    let mut consumer_stats = Vec::new();
    for l in &leaders {
        for (shard, topic) in &topics {
            for _ in 0..w.consumers_per_partition {
                consumer_plans.push(ConsumerPlan {
                    id: consumer_plans.len(),
                    topic: topic.clone(),
                    partition: l.partition,
                    leader: l.leader,
                });
                let mut stats = ConsumerStats::new(l.partition, starts[l.partition as usize]);
                stats.shard = *shard;
                consumer_stats.push(stats);
            }
        }
    }
    let total_consumers = consumer_plans.len();
    let shared = Arc::new(Shared::new(
        producers,
        consumer_stats,
        partitions,
        threads,
        epoch_us,
    ));
    for (p, s) in starts.iter().enumerate() {
        shared.note_end(p, *s);
    }
    let plans = assign(threads, &leaders, producers, consumer_plans);
    // The run's memory peak starts here, when the consumers do.
    let rss_pid = if obs.rss_of_this_process {
        Some(None)
    } else {
        obs.pid.map(Some)
    };
    let peak_reset = rss_pid.is_some_and(stats::reset_peak_rss);
    let rss_at_start = rss_pid.and_then(stats::rss);
    // View figures cover the whole run: every batch produced in it is read through the views.
    let views_before = w.views.and(obs.admin).and_then(|a| stats::scrape(a).ok());
    let handles = spawn_clients(cfg, &shared, plans, &w.client_cpus)?;

    let ready_by = Instant::now() + Duration::from_secs(60);
    while shared.consumers_ready.load(Relaxed) < total_consumers {
        if Instant::now() > ready_by {
            shared.set_phase(Phase::Stop);
            return Err(io::Error::other(format!(
                "only {} of {total_consumers} consumers connected within 60 s",
                shared.consumers_ready.load(Relaxed)
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    // Warm-up, then the measured interval, with a live line every second.
    let t0 = Instant::now();
    shared.set_phase(Phase::Warmup);
    let mut live = Live {
        enabled: w.live,
        raw,
        t0,
        prev: shared.snapshot(),
        prev_at: t0,
    };
    let measure_start = t0 + w.warmup;
    let measure_end = measure_start + w.duration;
    // A pure catch-up (a backlog and no producers) is measured until every consumer has read it.
    let backlog_end = caught_up_ends.map(|ends| {
        move |shared: &Shared| {
            shared.consumers.iter().all(|c| {
                c.done.load(Relaxed) || c.position.load(Relaxed) >= ends[c.partition as usize]
            })
        }
    });
    let mut tick = 1u32;
    let mut begin: Option<Snap> = None;
    let (end, caught_up) = loop {
        let next_tick = t0 + Duration::from_secs(u64::from(tick));
        let boundary = if begin.is_none() {
            measure_start
        } else {
            measure_end
        };
        let mut wake = next_tick.min(boundary);
        if backlog_end.is_some() {
            wake = wake.min(Instant::now() + Duration::from_millis(2));
        }
        sleep_until(wake);
        let now = Instant::now();
        let done_early = begin.is_some() && backlog_end.as_ref().is_some_and(|f| f(&shared));
        if now >= next_tick {
            // The line covers the second just ended, named after the phase it was in.
            let phase = if shared.phase() == Phase::Measure {
                "measure"
            } else {
                "warmup"
            };
            live.line(&shared, phase);
            tick += 1;
        }
        if begin.is_none() && now >= measure_start {
            begin = Some(Snap::take(&shared, obs));
            shared.set_phase(Phase::Measure);
        } else if begin.is_some() && (now >= measure_end || done_early) {
            let s = Snap::take(&shared, obs);
            shared.set_phase(if raw { Phase::Stop } else { Phase::Drain });
            break (s, done_early);
        }
    };
    let begin = begin.expect("taken before the end");
    if caught_up && w.live {
        println!(
            "every consumer has read the backlog: the measurement ends after {:.2} s",
            (end.at - begin.at).as_secs_f64()
        );
    }

    // Drain: producers stop; consumers read up to the final end offsets.
    let drain_started = Instant::now();
    let mut final_offsets = Vec::new();
    let mut drain_s = 0.0;
    if !raw {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !shared.producers.iter().all(|p| p.done.load(Relaxed)) {
            if Instant::now() > deadline {
                shared.error("producers did not finish within 60 s of the end".into());
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Endpoint::Kafka(cluster) = endpoint {
            // acks=0 requests may still be on their way in: wait until the end offsets settle.
            let mut last = cluster.offsets(&w.topic, &leaders, client::LATEST)?;
            if w.acks == 0 {
                loop {
                    std::thread::sleep(Duration::from_millis(200));
                    let again = cluster.offsets(&w.topic, &leaders, client::LATEST)?;
                    if again == last {
                        break;
                    }
                    last = again;
                }
            }
            final_offsets = last;
        }
        for (p, end) in final_offsets.iter().enumerate() {
            shared.drain_target[p].store(*end, Relaxed);
            shared.note_end(p, *end);
        }
        let deadline = Instant::now() + w.drain_timeout;
        let mut next_tick = Instant::now() + Duration::from_secs(1);
        // A consumer at its target may still be in a long poll: reaching the target is enough.
        let drained = || {
            shared.consumers.iter().all(|c| {
                c.done.load(Relaxed)
                    || c.position.load(Relaxed)
                        >= shared.drain_target[c.partition as usize].load(Relaxed)
            })
        };
        while !drained() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            if Instant::now() >= next_tick {
                live.line(&shared, "drain");
                next_tick += Duration::from_secs(1);
            }
        }
        drain_s = drain_started.elapsed().as_secs_f64();
        shared.set_phase(Phase::Stop);
    }
    for h in handles {
        let _ = h.join();
    }
    let views_after = views_before
        .as_ref()
        .and(obs.admin)
        .and_then(|a| stats::scrape(a).ok());

    // The summary.
    let secs = (end.at - begin.at).as_secs_f64().max(1e-6);
    let produced = Throughput::of(
        end.counters.produced_records - begin.counters.produced_records,
        end.counters.produced_bytes - begin.counters.produced_bytes,
        secs,
    );
    let (er, eb) = end.counters.consumed();
    let (br, bb) = begin.counters.consumed();
    let (sr, sb) = end.counters.slowest_since(&begin.counters);
    let delivered = Delivered {
        records: er - br,
        bytes: eb - bb,
        msg_per_s: (er - br) as f64 / secs,
        mb_per_s: stats::mb((eb - bb) as f64) / secs,
        slowest_consumer_msg_per_s: sr as f64 / secs,
        slowest_consumer_mb_per_s: stats::mb(sb as f64) / secs,
        fetches: end.counters.fetches - begin.counters.fetches,
        mean_fetch_bytes: (eb - bb) as f64
            / (end.counters.fetches - begin.counters.fetches).max(1) as f64,
    };
    let (publish, e2e) = shared.totals();
    let all = shared.snapshot();
    let (consumed_records, consumed_bytes) = all.consumed();
    let totals = Totals {
        produced_records: backlog.records + all.produced_records,
        produced_bytes: backlog.bytes + all.produced_bytes,
        acked_records: backlog.acked_records
            + shared
                .producers
                .iter()
                .map(|p| p.acked_records.load(Relaxed))
                .sum::<u64>(),
        consumed_records,
        consumed_bytes,
        backlog_records: backlog.records,
        backlog_bytes: backlog.bytes,
    };
    let errors = Errors {
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
    };
    let correctness = check(&shared, &final_offsets, drain_s, !raw);
    let peak_rss = rss_pid.and_then(stats::peak_rss);
    let gb = delivered.bytes as f64 / 1e9;
    let per_gb = |cpu: f64| (gb > 0.0).then(|| cpu / gb);
    let server_cpu = match (obs.thread_prefix, obs.pid) {
        (Some(_), _) => Some(end.cpu.server_s - begin.cpu.server_s),
        (None, Some(_)) => end.pid_cpu.zip(begin.pid_cpu).map(|(a, b)| a - b),
        (None, None) => None,
    };
    let generator_cpu =
        (end.cpu.process_s - end.cpu.server_s) - (begin.cpu.process_s - begin.cpu.server_s);
    let server = ServerFigures {
        observed: match (obs.thread_prefix, obs.pid) {
            (Some(p), _) => Some(format!("threads {p}*")),
            (None, Some(pid)) => Some(format!("pid {pid}")),
            _ => None,
        },
        cpu_s: server_cpu,
        cores: server_cpu.map(|c| c / secs),
        cpu_s_per_delivered_gb: server_cpu.and_then(per_gb),
        peak_rss_bytes: peak_rss,
        peak_rss_includes_generator: obs.rss_of_this_process,
        rss_at_consumers_start_bytes: rss_at_start,
        peak_rss_since_consumers_start: peak_reset,
        peak_rss_growth_bytes: peak_rss
            .zip(rss_at_start)
            .filter(|_| peak_reset)
            .map(|(peak, start)| peak.saturating_sub(start)),
        fetch: begin
            .metrics
            .as_ref()
            .zip(end.metrics.as_ref())
            .map(|(a, b)| FetchMetrics::between(a, b)),
        views: views_before
            .as_ref()
            .zip(views_after.as_ref())
            .map(|(a, b)| {
                let records = totals.produced_records;
                ViewMetrics::between(a, b, records / w.records_per_batch.max(1) as u64)
            }),
    };
    Ok(RunSummary {
        label: label.to_string(),
        kind: if raw { "raw-baseline" } else { "kafka" },
        topic: (!raw).then(|| w.topic.clone()),
        partitions: w.partitions,
        producers,
        consumers_per_partition: w.consumers_per_partition,
        consumers: total_consumers,
        views: w.views,
        message_bytes: w.message_bytes,
        records_per_batch: w.records_per_batch,
        coalescing: settings.coalescing,
        view_sharing: settings.view_sharing,
        warmup_s: w.warmup.as_secs_f64(),
        measured_s: secs,
        produced,
        delivered,
        publish_latency_us: if raw || w.acks == 0 {
            None
        } else {
            Latency::of(&publish)
        },
        e2e_latency_us: if raw { None } else { Latency::of(&e2e) },
        totals,
        errors,
        correctness,
        generator: GeneratorCpu {
            cpu_s: generator_cpu,
            cores: generator_cpu / secs,
            cpu_s_per_delivered_gb: per_gb(generator_cpu),
        },
        server,
        raw_baseline_fraction: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::embedded_timestamp_compressed;

    #[test]
    fn template_batches_validate_and_compress() {
        let b = template_batch(100, 10, 1, None);
        let h = shards::batch::validate(&b, usize::MAX).unwrap();
        assert_eq!(h.record_count, 10);
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let mut s = b.clone();
            let at = client::first_value_at(&s).unwrap();
            client::stamp_batch(&mut s, &[at], 123_456_789);
            let c = codec.compress_batch(&s);
            let h = shards::batch::validate(&c, usize::MAX).unwrap();
            assert_eq!(h.compression(), codec.id() as u8, "{codec:?}");
            assert!(c.len() < b.len(), "{codec:?} compresses the letters");
            assert_eq!(embedded_timestamp_compressed(&c, &h), Some(123_456_789));
        }
    }

    #[test]
    fn view_templates_start_every_shard_with_a_stamped_record() {
        let n = 8;
        let mut b = template_batch(64, 20, 3, Some(n));
        let ats = client::value_positions(&b, n as usize).unwrap();
        client::stamp_batch(&mut b, &ats, 987_654_321);
        shards::batch::validate(&b, usize::MAX).unwrap();
        let recs = shards::batch::records(&b).unwrap();
        assert_eq!(recs.len(), 20);
        for (i, r) in recs.iter().enumerate() {
            let shard = shards::partitioner::shard_of(r.key, n).unwrap();
            if i < n as usize {
                assert_eq!(shard, i as u32, "record {i} opens shard {i}");
                assert_eq!(
                    &r.value.as_ref().unwrap()[..8],
                    &987_654_321u64.to_be_bytes()
                );
            }
        }
        // Every shard's part of the batch starts with a stamped record.
        for shard in 0..n {
            let first = recs
                .iter()
                .find(|r| shards::partitioner::shard_of(r.key, n) == Some(shard))
                .unwrap();
            assert_eq!(
                &first.value.as_ref().unwrap()[..8],
                &987_654_321u64.to_be_bytes()
            );
        }
    }

    #[test]
    fn assignment_spreads_partitions_and_consumers() {
        let leaders: Vec<PartitionLeader> = (0..4)
            .map(|p| PartitionLeader {
                partition: p,
                leader: "127.0.0.1:1".parse().unwrap(),
            })
            .collect();
        let plans = assign(2, &leaders, 2, Vec::new());
        let mut parts: Vec<Vec<i32>> = plans
            .iter()
            .flat_map(|p| &p.producers)
            .map(|p| p.partitions.iter().map(|l| l.partition).collect())
            .collect();
        parts.sort();
        assert_eq!(parts, vec![vec![0, 2], vec![1, 3]]);
    }
}
