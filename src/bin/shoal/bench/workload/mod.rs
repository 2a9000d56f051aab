//! One run of the fan-out workload: producers and consumers as tasks on a few glommio executors, an
//! orchestrating thread that moves the run through its phases (warm-up, measured interval, drain),
//! prints the live line every second and assembles the summary.
//!
//! Producers send one batch per request, round robin over their partitions, paced to `--rate`, with
//! up to `--max-in-flight` requests outstanding per connection (a writer task and a reader task share
//! the socket). Each batch's first record starts with the send time in microseconds. Idempotent
//! producers stamp their producer id and per-partition sequences into each batch; transactional
//! ones also commit a transaction every commit interval.
//!
//! Each consumer has its own connection to its partition's leader and fetches on its own from its
//! own offset (no group); where a response prefers a read replica (KIP-392), it moves there. It
//! walks batch headers only: it counts records, checks that offsets follow on (a gap no batch
//! explains is an error), and samples end-to-end latency from every batch's embedded timestamp
//! (for compressed batches, from one batch per response, which it decompresses).

//!
//! This module holds the run itself (the orchestrating thread). Its parts, top layer first:
//! - [`executors`] — client executors: who runs where, the tasks spawned, histograms flushed.
//! - [`consumer`]  — a consumer task: fetches, checks offsets follow on, samples latency.
//! - [`stream_consumer`] — a consumer of shoal's HTTP streams (`--protocol sse|ws`).
//! - [`route`]     — which broker a consumer fetches from (leader or read replica) and why it moves.
//! - [`producer`]  — a producer task: paced batches, requests in flight, sequences.
//! - [`live`]      — the line printed every second.
//! - [`check`](mod@check) — the correctness verdict of a run.
//! - [`summary`]   — what a run reports.
//! - [`txn`]       — an idempotent or transactional producer's calls beside Produce.
//! - [`plan`]      — what each task is given: settings, its plan, its reporter, its connection.

mod check;
mod consumer;
mod executors;
mod live;
mod plan;
mod producer;
mod route;
mod stream_consumer;
mod summary;
mod txn;

use crate::bench::client::{self, Cluster, Codec, PartitionLeader};
use crate::bench::stats::{
    self, now_us, ConsumerStats, CoreCpu, DeviceMetrics, FetchMetrics, Latency, Phase, Shared,
    ViewMetrics,
};
use check::check;
use executors::{assign, spawn_clients};
use live::{CpuClocks, Live, Snap};
pub use plan::ProducerMode;
use plan::{ClientCfg, ConsumerPlan};
pub(crate) use producer::{template_batch, wire_bytes_per_message};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use summary::{
    per_gb, BrokerFigures, Delivered, Errors, GeneratorCpu, ProducerModeFigures, ReadReplicas,
    ServerFigures, Throughput, Totals,
};
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
    /// Record-batch bytes per message as sent (after compression): the unit of `--rate` in bytes
    /// and of the report's MB/s.
    pub wire_bytes_per_message: f64,
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
    /// The consumers' Fetch `isolation_level` (1: read_committed).
    pub isolation_level: i8,
    pub fetch_max_bytes: i32,
    pub drain_timeout: Duration,
    pub receive_buffer: usize,
    /// `--follow-replicas`: consumers move to the read replica a fetch response prefers.
    pub follow_replicas: bool,
    /// Consumers read HTTP streams (this protocol, at this address) instead of fetching.
    pub stream: Option<(crate::bench::args::Protocol, std::net::SocketAddr)>,
    /// `--idempotent`, `--transactional`.
    pub producer_mode: ProducerMode,
    /// Print a live line every second.
    pub live: bool,
}

/// What the consumers read from.
#[derive(Debug)]
pub enum Endpoint<'a> {
    /// A Kafka broker (shoal or another); with a second cluster, producers write there and the
    /// consumers read at the first (a shoal edge in front of it).
    Kafka(&'a Cluster, Option<&'a Cluster>),
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
    /// The name prefix of its core threads in that process (a shoal's), to tell its cores apart.
    pub pid_thread_prefix: Option<&'static str>,
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

/// Runs the workload once against `endpoint` and returns its summary. The steps are [`Run`]'s:
/// plan, produce the backlog, start the clients, measure, drain, summarize.
pub fn run(
    w: &Workload,
    endpoint: &Endpoint<'_>,
    obs: &Observer,
    label: &str,
    settings: Settings,
) -> io::Result<RunSummary> {
    let run = Run::plan(w, endpoint, obs, label, settings)?;
    let backlog = run.produce_backlog()?;
    let mut clients = run.start_clients()?;
    let mut measured = run.measure(&clients);
    let drained = run.drain(&clients.shared, &mut measured.live)?;
    let views_after = clients.join(obs);
    Ok(run.summarize(&backlog, &clients, &measured, &drained, views_after))
}

/// One run: what it was asked for, and its plan (the partitions' leaders, what every client is told).
struct Run<'a> {
    w: &'a Workload,
    endpoint: &'a Endpoint<'a>,
    obs: &'a Observer,
    label: &'a str,
    settings: Settings,
    /// Timestamps before this (µs since the epoch) are not this run's batches.
    epoch_us: u64,
    leaders: Vec<PartitionLeader>,
    /// Where producers write: `leaders`, or the upstream's behind an edge.
    produce_leaders: Vec<PartitionLeader>,
    cfg: ClientCfg,
    /// The raw baseline: nothing is produced, nothing checked, latency not sampled.
    raw: bool,
    /// Producers of the measured run (none against the raw baseline).
    producers: usize,
    /// Client executors.
    threads: usize,
}

/// The measured run's clients at work, and what was noted as they started.
struct Clients {
    shared: Arc<Shared>,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
    consumers: usize,
    /// A pure catch-up (a backlog and no producers) ends at these offsets: the backlog's ends.
    caught_up_ends: Option<Vec<i64>>,
    memory: Memory,
    /// shoal's /metrics when the consumers started (`--views`).
    views_before: Option<HashMap<String, f64>>,
}

/// The server's resident set when the consumers start: the run's memory peak starts there.
struct Memory {
    /// Whose: `Some(None)` this process's, `Some(Some(pid))` another's, `None` nobody's.
    pid: Option<Option<u32>>,
    /// The peak could be reset, so it is the run's own.
    peak_reset: bool,
    at_start: Option<u64>,
}

/// The measured interval's first and last snapshot, and the live line (it goes on in the drain).
struct Measured {
    begin: Snap,
    end: Snap,
    live: Live,
    /// How many consumers fetched from each broker (node id) when it ended.
    consumers_per_broker: BTreeMap<i32, usize>,
}

/// The end offsets once the producers stopped, and the seconds the consumers took to reach them.
struct Drained {
    final_offsets: Vec<i64>,
    secs: f64,
}

impl<'a> Run<'a> {
    /// The topic's leaders (the topic created on a Kafka cluster if missing), the API versions and
    /// pacing every client is given.
    fn plan(
        w: &'a Workload,
        endpoint: &'a Endpoint<'a>,
        obs: &'a Observer,
        label: &'a str,
        settings: Settings,
    ) -> io::Result<Run<'a>> {
        let epoch_us = now_us();
        // Where the producers write: the upstream of an edge (the topic created there first).
        let produce_leaders = match endpoint {
            Endpoint::Kafka(_, Some(upstream)) => {
                Some(upstream.ensure_topic(&w.topic, w.partitions)?)
            }
            _ => None,
        };
        let producer_ids = match endpoint {
            Endpoint::Kafka(cluster, upstream) => upstream.unwrap_or(cluster).versions.producer_ids,
            Endpoint::Raw { .. } => Default::default(),
        };
        let (leaders, fetch_version, produce_version, modulus) = match endpoint {
            Endpoint::Kafka(cluster, upstream) => (
                match upstream {
                    None => cluster.ensure_topic(&w.topic, w.partitions)?,
                    Some(_) => cluster.await_topic(&w.topic, w.partitions, true)?,
                },
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
                        leader_id: -1,
                    })
                    .collect(),
                *fetch_version,
                0,
                Some(*period),
            ),
        };
        let raw = modulus.is_some();
        // Where a preferred read replica listens (KIP-392): the brokers of the metadata.
        let brokers = match endpoint {
            Endpoint::Kafka(cluster, _) if w.follow_replicas => cluster.brokers(&w.topic)?,
            _ => client::Brokers::new(),
        };
        let producers = if raw { 0 } else { w.producers };
        // Seconds between one producer's batches (0: unpaced).
        let per_producer = w.rate / producers.max(1) as f64;
        let batch_interval = if producers > 0 && per_producer > 0.0 {
            w.records_per_batch as f64 / per_producer
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
            batch_interval,
            max_in_flight: w.max_in_flight,
            fetch_max_wait: w.fetch_max_wait,
            isolation_level: w.isolation_level,
            fetch_max_bytes: w.fetch_max_bytes,
            receive_buffer: w.receive_buffer,
            modulus,
            sample_latency: !raw,
            follow_replicas: w.follow_replicas && !raw,
            brokers,
            producer_mode: w.producer_mode,
            stream: w.stream,
            producer_ids,
            transactional_prefix: format!("shoal-bench-{}", epoch_us / 1000),
        };
        Ok(Run {
            w,
            endpoint,
            obs,
            label,
            settings,
            epoch_us,
            produce_leaders: produce_leaders.unwrap_or_else(|| leaders.clone()),
            leaders,
            cfg,
            raw,
            producers,
            threads: w.client_threads.max(1),
        })
    }

    /// The catch-up workload (`--backlog`): produces the backlog before any consumer starts.
    fn produce_backlog(&self) -> io::Result<Backlog> {
        let w = self.w;
        if self.raw || w.backlog_bytes == 0 {
            return Ok(Backlog::default());
        }
        let n = w.producers.max(1);
        let partitions = w.partitions as usize;
        let shared = Arc::new(Shared::new(
            n,
            Vec::new(),
            partitions,
            self.threads,
            self.epoch_us,
        ));
        shared.byte_limit.store(w.backlog_bytes, Relaxed);
        let plans = assign(self.threads, &self.produce_leaders, n, Vec::new());
        let mut cfg = self.cfg.clone();
        cfg.batch_interval = 0.0;
        let handles = spawn_clients(cfg, &shared, plans, &w.client_cpus)?;
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
        let backlog = Backlog {
            records: c.produced_records,
            bytes: c.produced_bytes,
            acked_records: shared.acked_records(),
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
        Ok(backlog)
    }

    /// Starts the consumers and the producers, and waits until every consumer has connected.
    fn start_clients(&self) -> io::Result<Clients> {
        let w = self.w;
        let (starts, caught_up_ends) = self.start_offsets()?;
        let (consumer_plans, consumer_stats) = self.consumer_plans(&starts);
        let consumers = consumer_plans.len();
        let shared = Arc::new(Shared::new(
            self.producers,
            consumer_stats,
            w.partitions as usize,
            self.threads,
            self.epoch_us,
        ));
        for (p, s) in starts.iter().enumerate() {
            shared.note_end(p, *s);
        }
        let plans = assign(
            self.threads,
            &self.produce_leaders,
            self.producers,
            consumer_plans,
        );
        let memory = Memory::at_start(self.obs);
        // View figures cover the whole run: every batch produced in it is read through the views.
        let views_before = w
            .views
            .and(self.obs.admin)
            .and_then(|a| stats::scrape(a).ok());
        let handles = spawn_clients(self.cfg.clone(), &shared, plans, &w.client_cpus)?;
        wait_ready(&shared, consumers)?;
        Ok(Clients {
            shared,
            handles,
            consumers,
            caught_up_ends,
            memory,
            views_before,
        })
    }

    /// Where the consumers start, and where a pure catch-up (a backlog and no producers) ends.
    fn start_offsets(&self) -> io::Result<(Vec<i64>, Option<Vec<i64>>)> {
        let w = self.w;
        let Endpoint::Kafka(cluster, _) = self.endpoint else {
            return Ok((vec![0; w.partitions as usize], None));
        };
        let caught_up_ends = if w.backlog_bytes > 0 && self.producers == 0 {
            Some(cluster.offsets(&w.topic, &self.leaders, client::LATEST)?)
        } else {
            None
        };
        let ts = if w.earliest || w.backlog_bytes > 0 {
            client::EARLIEST
        } else {
            client::LATEST
        };
        let starts = cluster.offsets(&w.topic, &self.leaders, ts)?;
        Ok((starts, caught_up_ends))
    }

    /// Without views, `consumers_per_partition` consumers of the topic; with --views N, that many
    /// for each shard view of it (a view partition has the source partition's leader and offsets).
    fn consumer_plans(&self, starts: &[i64]) -> (Vec<ConsumerPlan>, Vec<ConsumerStats>) {
        let w = self.w;
        let topics: Vec<(Option<u32>, Arc<str>)> = match w.views {
            None => vec![(None, w.topic.as_str().into())],
            Some(n) => (0..n)
                .map(|i| (Some(i), format!("{}.shard-{i}-of-{n}", w.topic).into()))
                .collect(),
        };
        let mut plans = Vec::new();
        let mut stats = Vec::new();
        for l in &self.leaders {
            for (shard, topic) in &topics {
                for _ in 0..w.consumers_per_partition {
                    plans.push(ConsumerPlan {
                        id: plans.len(),
                        topic: topic.clone(),
                        partition: l.partition,
                        leader: l.leader,
                        leader_id: l.leader_id,
                    });
                    let mut s = ConsumerStats::new(l.partition, starts[l.partition as usize]);
                    s.shard = *shard;
                    stats.push(s);
                }
            }
        }
        (plans, stats)
    }

    /// Warm-up, then the measured interval, with a live line every second. A pure catch-up is
    /// measured until every consumer has read the backlog.
    fn measure(&self, clients: &Clients) -> Measured {
        let (w, shared) = (self.w, &*clients.shared);
        let t0 = Instant::now();
        shared.set_phase(Phase::Warmup);
        let mut live = Live {
            enabled: w.live,
            raw: self.raw,
            t0,
            prev: shared.snapshot(),
            prev_at: t0,
        };
        let measure_start = t0 + w.warmup;
        let measure_end = measure_start + w.duration;
        let backlog_end = clients.caught_up_ends.as_deref();
        let mut tick = 1u32;
        let mut begin: Option<Snap> = None;
        // Sampled every second as well as at both ends, so that a thread that exits in between
        // keeps what it used (see `ThreadCpu`).
        let mut cpu = CpuClocks::new(self.obs);
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
            let done_early =
                begin.is_some() && backlog_end.is_some_and(|ends| all_reached(shared, |p| ends[p]));
            if now >= next_tick {
                // The line covers the second just ended, named after the phase it was in.
                let phase = if shared.phase() == Phase::Measure {
                    "measure"
                } else {
                    "warmup"
                };
                live.line(shared, phase);
                cpu.sample();
                tick += 1;
            }
            if begin.is_none() && now >= measure_start {
                begin = Some(Snap::take(shared, self.obs, &mut cpu));
                shared.set_phase(Phase::Measure);
            } else if begin.is_some() && (now >= measure_end || done_early) {
                let s = Snap::take(shared, self.obs, &mut cpu);
                shared.set_phase(if self.raw { Phase::Stop } else { Phase::Drain });
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
        Measured {
            begin,
            end,
            live,
            consumers_per_broker: shared.consumers_per_broker(),
        }
    }

    /// Drain: producers stop; consumers read up to the final end offsets (against the raw
    /// baseline nothing was produced, so there is nothing to drain).
    fn drain(&self, shared: &Shared, live: &mut Live) -> io::Result<Drained> {
        let started = Instant::now();
        if self.raw {
            return Ok(Drained {
                final_offsets: Vec::new(),
                secs: 0.0,
            });
        }
        wait_for_producers(shared);
        let final_offsets = match self.endpoint {
            Endpoint::Kafka(cluster, _) => self.settled_end_offsets(cluster)?,
            Endpoint::Raw { .. } => Vec::new(),
        };
        for (p, end) in final_offsets.iter().enumerate() {
            shared.drain_target[p].store(*end, Relaxed);
            shared.note_end(p, *end);
        }
        // Consumers far behind (more fan-out asked than the broker delivers) may need long to
        // catch up: the drain waits while any of them moves, and gives up after `drain_timeout`
        // without progress (a consumer waiting for records that never come), or at the cap.
        let cap = Instant::now() + self.w.drain_timeout * DRAIN_CAP_TIMEOUTS;
        let mut progress = (consumed_sum(shared), Instant::now());
        let mut next_tick = Instant::now() + Duration::from_secs(1);
        while !all_reached(shared, |p| shared.drain_target[p].load(Relaxed)) && Instant::now() < cap
        {
            let now = consumed_sum(shared);
            if now != progress.0 {
                progress = (now, Instant::now());
            } else if progress.1.elapsed() >= self.w.drain_timeout {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
            if Instant::now() >= next_tick {
                live.line(shared, "drain");
                next_tick += Duration::from_secs(1);
            }
        }
        let secs = started.elapsed().as_secs_f64();
        shared.set_phase(Phase::Stop);
        Ok(Drained {
            final_offsets,
            secs,
        })
    }

    /// The end offsets after the producers stopped, where they wrote (behind an edge, the
    /// upstream's: the consumers read until the edge has them all). acks=0 requests may still be
    /// on their way in: then wait until the end offsets settle.
    fn settled_end_offsets(&self, cluster: &Cluster) -> io::Result<Vec<i64>> {
        let (cluster, leaders) = match self.endpoint {
            Endpoint::Kafka(_, Some(upstream)) => (*upstream, &self.produce_leaders),
            _ => (cluster, &self.leaders),
        };
        let topic = &self.w.topic;
        let mut last = cluster.offsets(topic, leaders, client::LATEST)?;
        if self.w.acks == 0 {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let again = cluster.offsets(topic, leaders, client::LATEST)?;
                if again == last {
                    break;
                }
                last = again;
            }
        }
        Ok(last)
    }

    /// The run's summary, from the snapshots around the measured interval and the whole-run counts.
    fn summarize(
        &self,
        backlog: &Backlog,
        clients: &Clients,
        measured: &Measured,
        drained: &Drained,
        views_after: Option<HashMap<String, f64>>,
    ) -> RunSummary {
        let (w, raw, shared) = (self.w, self.raw, &*clients.shared);
        let (begin, end) = (&measured.begin, &measured.end);
        let secs = (end.at - begin.at).as_secs_f64().max(1e-6);
        let produced = Throughput::of(
            end.counters.produced_records - begin.counters.produced_records,
            end.counters.produced_bytes - begin.counters.produced_bytes,
            secs,
        );
        let delivered = Delivered::between(&begin.counters, &end.counters, secs);
        let (publish, e2e) = shared.totals();
        let totals = Totals::of(shared, backlog);
        let errors = Errors::of(shared);
        let correctness = check(
            shared,
            &drained.final_offsets,
            drained.secs,
            (!raw).then_some(totals.produced_records),
            w.acks == 0,
        );
        let gb = delivered.bytes as f64 / 1e9;
        let views = clients.views_before.as_ref().zip(views_after.as_ref());
        let batches = totals.produced_records / w.records_per_batch.max(1) as u64;
        let views = views.map(|(a, b)| ViewMetrics::between(a, b, batches));
        let mut server = self.server_figures(&clients.memory, measured, secs, gb, views);
        server.cpu_us_per_fetch = server
            .cpu_s
            .filter(|_| delivered.fetches > 0)
            .map(|c| c * 1e6 / delivered.fetches as f64);
        let per_broker = if raw {
            Vec::new()
        } else {
            BrokerFigures::list(
                &measured.consumers_per_broker,
                self.cores(measured).as_ref(),
            )
        };
        RunSummary {
            label: self.label.to_string(),
            kind: if raw { "raw-baseline" } else { "kafka" },
            topic: (!raw).then(|| w.topic.clone()),
            topic_deleted: None,
            partitions: w.partitions,
            producers: self.producers,
            producer_mode: ProducerModeFigures::of(shared, w.producer_mode),
            consumers_per_partition: w.consumers_per_partition,
            consumers: clients.consumers,
            views: w.views,
            message_bytes: w.message_bytes,
            records_per_batch: w.records_per_batch,
            coalescing: self.settings.coalescing,
            view_sharing: self.settings.view_sharing,
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
            generator: GeneratorCpu::between(&begin.cpu, &end.cpu, secs, gb),
            server,
            per_broker,
            read_replicas: ReadReplicas::of(shared, self.cfg.follow_replicas),
            raw_baseline_fraction: None,
            raw_cpu_ratio: None,
            disk_baseline_fraction: None,
            cautions: Vec::new(),
        }
    }

    /// Each server core's CPU over the measured interval, where its threads can be seen: in this
    /// process, or in the broker's process on this host.
    fn cores(&self, m: &Measured) -> Option<BTreeMap<usize, CoreCpu>> {
        let (begin, end) = (&m.begin, &m.end);
        let cores = match (self.obs.thread_prefix, &begin.pid_threads, &end.pid_threads) {
            (Some(_), ..) => end.cpu.cores_since(&begin.cpu),
            (None, Some(b), Some(e)) => e.cores_since(b),
            _ => return None,
        };
        (!cores.is_empty()).then_some(cores)
    }

    /// The server's CPU over the measured interval (`gb`: gigabytes delivered in it), its memory,
    /// and shoal's fetch and view figures.
    fn server_figures(
        &self,
        memory: &Memory,
        m: &Measured,
        secs: f64,
        gb: f64,
        views: Option<ViewMetrics>,
    ) -> ServerFigures {
        let obs = self.obs;
        let (begin, end) = (&m.begin, &m.end);
        let cpu_s = match (obs.thread_prefix, obs.pid) {
            (Some(_), _) => Some(end.cpu.server_s - begin.cpu.server_s),
            (None, Some(_)) => end.pid_cpu.zip(begin.pid_cpu).map(|(a, b)| a.0 - b.0),
            (None, None) => None,
        };
        let cpu_method = match (obs.thread_prefix, obs.pid) {
            (Some(p), _) => Some(format!(
                "the CPU clocks (ns) of this process's threads {p}* and their io_uring workers, \
                 sampled every second: a thread that exits counts to its last sample"
            )),
            (None, Some(pid)) => end.pid_cpu.zip(begin.pid_cpu).map(|(a, b)| {
                if a.1 && b.1 {
                    format!("the process CPU clock (ns) of pid {pid}, exited threads included")
                } else {
                    format!("utime + stime of pid {pid} (clock ticks), exited threads included")
                }
            }),
            (None, None) => None,
        };
        let peak_rss = memory.pid.and_then(stats::peak_rss);
        ServerFigures {
            observed: match (obs.thread_prefix, obs.pid) {
                (Some(p), _) => Some(format!("threads {p}*")),
                (None, Some(pid)) => Some(format!("pid {pid}")),
                _ => None,
            },
            cpu_s,
            cpu_method,
            cores: cpu_s.map(|c| c / secs),
            cpu_s_per_delivered_gb: cpu_s.and_then(|c| per_gb(c, gb)),
            cpu_us_per_fetch: None,
            peak_rss_bytes: peak_rss,
            peak_rss_includes_generator: obs.rss_of_this_process,
            rss_at_consumers_start_bytes: memory.at_start,
            peak_rss_since_consumers_start: memory.peak_reset,
            peak_rss_growth_bytes: peak_rss
                .zip(memory.at_start)
                .filter(|_| memory.peak_reset)
                .map(|(peak, start)| peak.saturating_sub(start)),
            fetch: begin
                .metrics
                .as_ref()
                .zip(end.metrics.as_ref())
                .map(|(a, b)| FetchMetrics::between(a, b)),
            device: begin
                .metrics
                .as_ref()
                .zip(end.metrics.as_ref())
                .map(|(a, b)| DeviceMetrics::between(a, b))
                .filter(|d| d.writes.count + d.fsyncs.count > 0),
            views,
        }
    }
}

impl Clients {
    /// Waits for the client executors to end; then reads shoal's /metrics again (`--views`).
    fn join(&mut self, obs: &Observer) -> Option<HashMap<String, f64>> {
        for h in std::mem::take(&mut self.handles) {
            let _ = h.join();
        }
        self.views_before
            .as_ref()
            .and(obs.admin)
            .and_then(|a| stats::scrape(a).ok())
    }
}

impl Memory {
    /// Resets the observed process's peak (where it can) and reads its resident set.
    fn at_start(obs: &Observer) -> Memory {
        let pid = if obs.rss_of_this_process {
            Some(None)
        } else {
            obs.pid.map(Some)
        };
        let peak_reset = pid.is_some_and(stats::reset_peak_rss);
        let at_start = pid.and_then(stats::rss);
        Memory {
            pid,
            peak_reset,
            at_start,
        }
    }
}

/// Waits up to 60 s for every consumer to connect.
fn wait_ready(shared: &Shared, consumers: usize) -> io::Result<()> {
    let ready_by = Instant::now() + Duration::from_secs(60);
    while shared.consumers_ready.load(Relaxed) < consumers {
        if Instant::now() > ready_by {
            shared.set_phase(Phase::Stop);
            return Err(io::Error::other(format!(
                "only {} of {consumers} consumers connected within 60 s",
                shared.consumers_ready.load(Relaxed)
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Waits up to 60 s for the producers to stop after the measured interval.
fn wait_for_producers(shared: &Shared) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !shared.producers.iter().all(|p| p.done.load(Relaxed)) {
        if Instant::now() > deadline {
            shared.error("producers did not finish within 60 s of the end".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Has every consumer stopped or read up to `end(partition)`? A consumer there may still be in a
/// long poll: reaching the offset is enough.
/// The drain's overall cap, in drain timeouts (each the longest it waits without progress).
const DRAIN_CAP_TIMEOUTS: u32 = 10;

/// Sum of the consumers' positions: it moves while any consumer makes progress.
fn consumed_sum(shared: &Shared) -> i64 {
    shared
        .consumers
        .iter()
        .map(|c| c.position.load(Relaxed).max(0))
        .fold(0i64, i64::wrapping_add)
}

fn all_reached(shared: &Shared, end: impl Fn(usize) -> i64) -> bool {
    shared
        .consumers
        .iter()
        .all(|c| c.done.load(Relaxed) || c.position.load(Relaxed) >= end(c.partition as usize))
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
            client::stamp_batch(&mut s, &[at], 123_456_789, None);
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
        client::stamp_batch(&mut b, &ats, 987_654_321, None);
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
                leader_id: 0,
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
