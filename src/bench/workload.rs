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

use super::client::{
    self, embedded_timestamp, embedded_timestamp_compressed, Cluster, Codec, FetchTemplate,
    PartitionLeader, ProduceFrame,
};
use super::stats::{
    self, cpu_sample, now_us, record, ConsumerStats, Counters, CpuSample, FetchMetrics, Hists,
    Latency, Phase, Shared, ViewMetrics,
};
use bytes::Bytes;
use futures_lite::AsyncWriteExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use glommio::{LocalExecutorBuilder, Placement};
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use serde::Serialize;
use shards::batch::{BatchBuilder, BatchHeader};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Display;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
pub enum Target<'a> {
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

// ---------------------------------------------------------------------------------------------------
// The summary of a run.

#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    pub records: u64,
    pub bytes: u64,
    pub msg_per_s: f64,
    pub mb_per_s: f64,
}

impl Throughput {
    fn of(records: u64, bytes: u64, secs: f64) -> Throughput {
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

#[derive(Debug, Clone, Default, Serialize)]
pub struct Errors {
    pub count: u64,
    pub produce: u64,
    pub consume: u64,
    pub messages: Vec<String>,
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
    /// Every consumer received every record produced after its start offset, in order, no gaps.
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
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GeneratorCpu {
    /// CPU seconds of the load generator (this process minus the server's threads).
    pub cpu_s: f64,
    /// cpu_s over the measured seconds.
    pub cores: f64,
    pub cpu_s_per_delivered_gb: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerFigures {
    /// Where its CPU figure comes from: "threads" (in this process), "pid N", or null.
    pub observed: Option<String>,
    pub cpu_s: Option<f64>,
    pub cores: Option<f64>,
    pub cpu_s_per_delivered_gb: Option<f64>,
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
    /// From shoal's /metrics, over the whole run (`--views`).
    pub views: Option<ViewMetrics>,
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
    pub partitions: i32,
    pub producers: usize,
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
    /// Delivered MB/s over the raw baseline's with the same consumers: only when it ran and the
    /// producers were not paced (`--rate 0`), as the raw server answers every fetch at once.
    pub raw_baseline_fraction: Option<f64>,
}

// ---------------------------------------------------------------------------------------------------
// Client executors.

/// What every client task needs to know.
#[derive(Debug, Clone)]
struct ClientCfg {
    topic: String,
    produce_version: i16,
    fetch_version: i16,
    acks: i16,
    compression: Codec,
    message_bytes: usize,
    records_per_batch: usize,
    /// Shard views read (records get keys, and the first records of each batch one per shard).
    views: Option<u32>,
    /// Seconds between two batches of one producer (0: no pacing).
    batch_interval: f64,
    max_in_flight: usize,
    fetch_max_wait: Duration,
    fetch_max_bytes: i32,
    receive_buffer: usize,
    /// Raw baseline: offsets wrap at this.
    modulus: Option<i64>,
    sample_latency: bool,
}

#[derive(Debug, Clone)]
struct ConsumerPlan {
    id: usize,
    /// The topic it fetches: the workload's, or one of its shard views.
    topic: Arc<str>,
    partition: i32,
    leader: SocketAddr,
}

#[derive(Debug, Clone)]
struct ProducerPlan {
    id: usize,
    partitions: Vec<PartitionLeader>,
}

#[derive(Debug, Clone, Default)]
struct ExecPlan {
    consumers: Vec<ConsumerPlan>,
    producers: Vec<ProducerPlan>,
}

/// Starts one glommio executor per plan; each runs its tasks to the end.
fn spawn_clients(
    cfg: ClientCfg,
    shared: &Arc<Shared>,
    plans: Vec<ExecPlan>,
    cpus: &[Option<usize>],
) -> io::Result<Vec<glommio::ExecutorJoinHandle<()>>> {
    let cfg = Arc::new(cfg);
    let mut handles = Vec::new();
    for (i, plan) in plans.into_iter().enumerate() {
        let placement = match cpus.get(i).copied().flatten() {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        };
        let (cfg, shared) = (cfg.clone(), shared.clone());
        let h = LocalExecutorBuilder::new(placement)
            .name(&format!("bench-client-{i}"))
            .spawn(move || async move { executor_main(i, cfg, shared, plan).await })
            .map_err(|e| io::Error::other(format!("cannot start client executor {i}: {e}")))?;
        handles.push(h);
    }
    Ok(handles)
}

async fn executor_main(idx: usize, cfg: Arc<ClientCfg>, shared: Arc<Shared>, plan: ExecPlan) {
    let local = Rc::new(RefCell::new(Hists::default()));
    let mut tasks = Vec::new();
    for c in plan.consumers {
        tasks.push(glommio::spawn_local(consumer(
            cfg.clone(),
            shared.clone(),
            c,
            local.clone(),
        )));
    }
    for p in plan.producers {
        tasks.push(glommio::spawn_local(producer(
            cfg.clone(),
            shared.clone(),
            p,
            local.clone(),
        )));
    }
    let flusher = {
        let local = local.clone();
        let shared = shared.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(200)).await;
                flush(&shared, idx, &local);
            }
        })
    };
    for t in tasks {
        t.await;
    }
    drop(flusher);
    flush(&shared, idx, &local);
}

/// Moves executor `idx`'s histograms into its shared copy.
fn flush(shared: &Shared, idx: usize, local: &RefCell<Hists>) {
    let mut to = shared.hists[idx].lock().unwrap_or_else(|e| e.into_inner());
    to.drain_from(&mut local.borrow_mut());
}

/// How a client task reports errors: in the run's list and its own counter.
struct Reporter<'a> {
    shared: &'a Shared,
    who: String,
    errors: &'a AtomicU64,
    /// Set by [`fail`](Self::fail): a consumer that gave up did not receive everything.
    failed: Option<&'a AtomicBool>,
}

impl Reporter<'_> {
    /// An error the task carries on after.
    fn error(&self, msg: impl Display) {
        self.shared.error(format!("{}: {msg}", self.who));
        self.errors.fetch_add(1, Relaxed);
    }

    /// An error that ends the task.
    fn fail(&self, msg: impl Display) {
        self.error(msg);
        if let Some(f) = self.failed {
            f.store(true, Relaxed);
        }
    }
}

/// Sets a task's `done` flag when the task ends, however it ends.
struct DoneOnDrop<'a>(&'a AtomicBool);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// Waits for the end of the set-up phase: every task starts together, once all consumers are
/// connected.
async fn setup_over(shared: &Shared) {
    while shared.phase() == Phase::Setup {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

use shoal::wire::fetch::decode::{read_fetch_response, BatchVisitor, FrameReader};
use shoal::wire::SharedStream;

async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(addr, Duration::from_secs(10))
        .await
        .map_err(|e| io::Error::other(format!("connecting to {addr}: {e}")))?;
    s.set_nodelay(true)
        .and_then(|_| s.set_read_timeout(Some(Duration::from_secs(60))))
        .and_then(|_| s.set_write_timeout(Some(Duration::from_secs(60))))
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(s)
}

// ---------------------------------------------------------------------------------------------------
// Consumers.

/// Walks the batches of one consumer's fetch responses.
struct Visitor {
    next: i64,
    modulus: Option<i64>,
    records: u64,
    bytes: u64,
    gaps: u64,
    gap_offsets: u64,
    sample_latency: bool,
    measuring: bool,
    /// A compressed batch was already decompressed for a sample in this response.
    sampled_compressed: bool,
    epoch_us: u64,
    hists: Rc<RefCell<Hists>>,
}

impl Visitor {
    fn sample(&self, ts: u64) {
        // Batches from before this run (an old topic read from the start) tell nothing.
        if ts < self.epoch_us {
            return;
        }
        let lat = now_us().saturating_sub(ts);
        let mut h = self.hists.borrow_mut();
        record(&mut h.e2e_interval, lat);
        if self.measuring {
            record(&mut h.e2e, lat);
        }
    }
}

impl BatchVisitor for Visitor {
    fn batch(&mut self, h: &BatchHeader, head: &[u8]) -> bool {
        let total = h.total_len() as u64;
        match self.modulus {
            Some(m) => {
                // Raw baseline: the server's memory holds offsets 0..m and wraps.
                if h.base_offset.rem_euclid(m) != self.next.rem_euclid(m) {
                    self.gaps += 1;
                }
                self.next += h.offset_count();
                self.records += h.record_count.max(0) as u64;
            }
            None => {
                let last = h.last_offset();
                if last < self.next {
                    return false; // an older batch (the fetch offset was inside it or before)
                }
                if h.base_offset > self.next {
                    self.gaps += 1;
                    self.gap_offsets += (h.base_offset - self.next) as u64;
                }
                if !h.is_control() {
                    self.records += if h.base_offset < self.next {
                        (last - self.next + 1) as u64
                    } else {
                        h.record_count.max(0) as u64
                    };
                }
                self.next = last + 1;
            }
        }
        self.bytes += total;
        if !self.sample_latency || h.is_control() {
            return false;
        }
        if h.compression() == 0 {
            if let Some(ts) = embedded_timestamp(head) {
                self.sample(ts);
            }
            false
        } else if !self.sampled_compressed {
            self.sampled_compressed = true;
            true
        } else {
            false
        }
    }

    fn whole_batch(&mut self, h: &BatchHeader, batch: &[u8]) {
        if let Some(ts) = embedded_timestamp_compressed(batch, h) {
            self.sample(ts);
        }
    }
}

async fn consumer(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ConsumerPlan,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.consumers[plan.id];
    let _done = DoneOnDrop(&stats.done);
    let report = Reporter {
        shared: &shared,
        who: format!(
            "consumer {} ({} partition {})",
            plan.id, plan.topic, plan.partition
        ),
        errors: &stats.errors,
        failed: Some(&stats.failed),
    };
    let part = plan.partition as usize;
    let stream = connect(plan.leader).await;
    // Counted whether it connected or not: the run waits for every consumer's attempt.
    shared.consumers_ready.fetch_add(1, Relaxed);
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => return report.fail(e),
    };
    let mut template = match FetchTemplate::new(
        &plan.topic,
        plan.partition,
        cfg.fetch_version,
        cfg.fetch_max_wait,
        cfg.fetch_max_bytes,
    ) {
        Ok(t) => t,
        Err(e) => return report.fail(e),
    };
    let mut reader = FrameReader::new(cfg.receive_buffer);
    let mut scratch = Vec::new();
    let mut v = Visitor {
        next: stats.start_offset.load(Relaxed),
        modulus: cfg.modulus,
        records: 0,
        bytes: 0,
        gaps: 0,
        gap_offsets: 0,
        sample_latency: cfg.sample_latency,
        measuring: false,
        sampled_compressed: false,
        epoch_us: shared.epoch_us,
        hists,
    };
    setup_over(&shared).await;
    let mut correlation = 0i32;
    loop {
        let phase = shared.phase();
        if phase == Phase::Stop || v.next >= shared.drain_target[part].load(Relaxed) {
            break;
        }
        correlation = correlation.wrapping_add(1);
        if let Err(e) = stream.write_all(template.frame(correlation, v.next)).await {
            report.fail(format!("sending a fetch: {e}"));
            break;
        }
        v.measuring = phase == Phase::Measure;
        v.sampled_compressed = false;
        let (records, bytes) = (v.records, v.bytes);
        let outcome = read_fetch_response(
            &mut reader,
            &mut stream,
            cfg.fetch_version,
            correlation,
            &mut v,
            &mut scratch,
        )
        .await;
        stats.records.fetch_add(v.records - records, Relaxed);
        stats.bytes.fetch_add(v.bytes - bytes, Relaxed);
        stats.position.store(v.next, Relaxed);
        stats.gaps.store(v.gaps, Relaxed);
        stats.gap_offsets.store(v.gap_offsets, Relaxed);
        match outcome {
            Err(e) => {
                report.fail(format!("reading a fetch response: {e}"));
                break;
            }
            Ok(o) => {
                stats.fetches.fetch_add(1, Relaxed);
                if cfg.modulus.is_none() && o.high_watermark >= 0 {
                    shared.note_end(part, o.high_watermark);
                }
                match o.error_code {
                    0 => {}
                    client::OFFSET_OUT_OF_RANGE => {
                        report.fail(format!("offset {} out of range", v.next));
                        break;
                    }
                    code => {
                        // NOT_LEADER_OR_FOLLOWER and the like: leaders do not move under an
                        // embedded shoal; count it and retry after a pause.
                        report.error(format!("fetch error {code}"));
                        glommio::timer::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Producers.

/// A batch of `records` values of `message_bytes`: pseudo-random words from a 64-word vocabulary,
/// compressible about like text logs by every codec; the first 8 bytes of the first value are left
/// for the send time. With `views: Some(n)` every record gets a key, and the keys of the first n
/// records map to shards 0, 1, ..., n-1 (Kafka's default partitioner), so that each shard's part
/// of the batch starts with a record whose value can carry the send time.
pub(crate) fn template_batch(
    message_bytes: usize,
    records: usize,
    seed: u64,
    views: Option<u32>,
) -> Vec<u8> {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "fu", "gi", "ho", "ja", "ve", "zo",
        "bu",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Words of 2 to 4 syllables, fixed for every run.
    let vocabulary: Vec<String> = (0..64u64)
        .map(|w| {
            (0..2 + w % 3)
                .map(|i| SYLLABLES[((w * 7 + i * 5 + w / 3) % 16) as usize])
                .collect()
        })
        .collect();
    let mut value = Vec::with_capacity(message_bytes + 16);
    let mut b = BatchBuilder::new(0);
    for i in 0..records {
        value.clear();
        while value.len() < message_bytes {
            value.extend_from_slice(vocabulary[(next() % 64) as usize].as_bytes());
            value.push(b' ');
        }
        value.truncate(message_bytes);
        let key = views.map(|n| template_key(seed, i, n));
        b.push(0, key.as_deref(), Some(&value), &[]);
    }
    b.finish(0)
}

/// The key of record `i` of producer `seed`'s batches when `n` shard views are read: for i < n,
/// the first such key that maps to shard i.
fn template_key(seed: u64, i: usize, n: u32) -> Vec<u8> {
    let key = |t: u32| format!("s{seed}-r{i}-{t}").into_bytes();
    if i >= n as usize {
        return key(0);
    }
    (0..)
        .map(key)
        .find(|k| shards::partitioner::shard_of(Some(k), n) == Some(i as u32))
        .expect("some key maps to every shard")
}

/// A produce request waiting for its response.
#[derive(Debug)]
struct Pending {
    correlation: i32,
    /// Taken right before the request was written.
    sent: Instant,
    measured: bool,
    records: u64,
    /// Its in-flight slot on the connection, given back once the response is read.
    _slot: StaticPermit,
}

/// With acks: the requests in flight on a connection, and the task reading their responses.
struct InFlight {
    /// `--max-in-flight` slots; closed if the reader stops early.
    slots: Rc<Semaphore>,
    pending: LocalSender<Pending>,
    reader: glommio::Task<()>,
}

struct ProducerConn {
    stream: SharedStream,
    in_flight: Option<InFlight>,
}

async fn producer(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ProducerPlan,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.producers[plan.id];
    let _done = DoneOnDrop(&stats.done);
    let report = Reporter {
        shared: &shared,
        who: format!("producer {}", plan.id),
        errors: &stats.errors,
        failed: None,
    };
    // One connection per leader; per partition, its connection and a ready-made request (without
    // compression; with it, each batch is compressed from the template).
    let mut conns: Vec<ProducerConn> = Vec::new();
    let mut by_leader: HashMap<SocketAddr, usize> = HashMap::new();
    let mut targets = Vec::new();
    let template = template_batch(
        cfg.message_bytes,
        cfg.records_per_batch,
        plan.id as u64 + 1,
        cfg.views,
    );
    let stamped = cfg
        .views
        .map_or(1, |n| (n as usize).min(cfg.records_per_batch));
    let value_ats =
        client::value_positions(&template, stamped).expect("template values are >= 8 bytes");
    for p in &plan.partitions {
        let conn = match by_leader.get(&p.leader) {
            Some(&c) => c,
            None => {
                let stream = match connect(p.leader).await {
                    Ok(s) => SharedStream::new(s),
                    Err(e) => return report.fail(e),
                };
                let in_flight = (cfg.acks != 0).then(|| {
                    let slots = Rc::new(Semaphore::new(cfg.max_in_flight.max(1) as u64));
                    let (pending, rx) = local_channel::new_unbounded();
                    let reader = glommio::spawn_local(produce_responses(
                        cfg.clone(),
                        shared.clone(),
                        plan.id,
                        stream.clone(),
                        rx,
                        slots.clone(),
                        hists.clone(),
                    ));
                    InFlight {
                        slots,
                        pending,
                        reader,
                    }
                });
                conns.push(ProducerConn { stream, in_flight });
                by_leader.insert(p.leader, conns.len() - 1);
                conns.len() - 1
            }
        };
        let frame = if cfg.compression == Codec::None {
            match ProduceFrame::new(
                &cfg.topic,
                p.partition,
                cfg.acks,
                cfg.produce_version,
                template.clone(),
                stamped,
            ) {
                Ok(f) => Some(f),
                Err(e) => return report.fail(e),
            }
        } else {
            None
        };
        targets.push((p.partition, conn, frame));
    }
    setup_over(&shared).await;
    let interval = Duration::from_secs_f64(cfg.batch_interval);
    let mut next_at = Instant::now();
    let mut correlation = 0i32;
    let mut scratch = template.clone();
    let mut i = 0usize;
    loop {
        let phase = shared.phase();
        if phase >= Phase::Drain
            || (phase == Phase::Backlog
                && shared.bytes_sent.load(Relaxed) >= shared.byte_limit.load(Relaxed))
        {
            break;
        }
        if !interval.is_zero() && phase != Phase::Backlog {
            let now = Instant::now();
            if next_at > now {
                glommio::timer::sleep(next_at - now).await;
            } else if now - next_at > Duration::from_millis(100) {
                next_at = now; // fell far behind: do not burst to catch up
            }
            next_at += interval;
        }
        let n = targets.len();
        let (partition, conn, frame) = &mut targets[i % n];
        let conn = &mut conns[*conn];
        i += 1;
        // Waits while --max-in-flight requests are outstanding on this connection.
        let slot = match &conn.in_flight {
            Some(f) => match f.slots.acquire_static_permit(1).await {
                Ok(slot) => Some(slot),
                Err(_) => break, // the reader stopped on an error (reported)
            },
            None => None,
        };
        correlation = correlation.wrapping_add(1);
        let ts = now_us();
        let compressed;
        let (request, batch_len): (&[u8], usize) = match frame {
            Some(f) => {
                let len = f.batch_len();
                (f.stamp(correlation, ts), len)
            }
            None => {
                scratch.copy_from_slice(&template);
                client::stamp_batch(&mut scratch, &value_ats, ts);
                let b = cfg.compression.compress_batch(&scratch);
                let len = b.len();
                let req = client::produce_request(&cfg.topic, *partition, cfg.acks, Bytes::from(b));
                let request =
                    client::request_frame(ApiKey::Produce, cfg.produce_version, correlation, &req)
                        .map(|f| (f, len));
                match request {
                    Ok((f, len)) => {
                        compressed = f;
                        (&compressed[..], len)
                    }
                    Err(e) => {
                        report.fail(format!("building a produce request: {e}"));
                        break;
                    }
                }
            }
        };
        // Publish latency starts here: the slot is taken and the request built.
        let sent = Instant::now();
        if let (Some(f), Some(slot)) = (&conn.in_flight, slot) {
            let p = Pending {
                correlation,
                sent,
                measured: phase == Phase::Measure,
                records: cfg.records_per_batch as u64,
                _slot: slot,
            };
            if f.pending.try_send(p).is_err() {
                break;
            }
        }
        if let Err(e) = conn.stream.write_all(request).await {
            report.fail(format!("sending a produce request: {e}"));
            break;
        }
        stats
            .records
            .fetch_add(cfg.records_per_batch as u64, Relaxed);
        stats.bytes.fetch_add(batch_len as u64, Relaxed);
        shared.bytes_sent.fetch_add(batch_len as u64, Relaxed);
    }
    // Let the readers collect the outstanding responses.
    for c in &mut conns {
        if let Some(InFlight {
            pending, reader, ..
        }) = c.in_flight.take()
        {
            drop(pending);
            reader.await;
        }
    }
}

async fn produce_responses(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    id: usize,
    mut stream: SharedStream,
    pending: LocalReceiver<Pending>,
    slots: Rc<Semaphore>,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.producers[id];
    let report = Reporter {
        shared: &shared,
        who: format!("producer {id}"),
        errors: &stats.errors,
        failed: None,
    };
    let mut reader = FrameReader::new(16 << 10);
    while let Some(p) = pending.recv().await {
        let frame = match reader.read_frame(&mut stream, 16 << 20).await {
            Ok(f) => f,
            Err(e) => {
                report.fail(format!("reading a produce response: {e}"));
                break;
            }
        };
        let latency = p.sent.elapsed().as_micros() as u64;
        let r: ProduceResponse = match client::decode_response(
            ApiKey::Produce,
            cfg.produce_version,
            p.correlation,
            frame,
        ) {
            Ok(r) => r,
            Err(e) => {
                report.fail(e);
                break;
            }
        };
        let mut ok = true;
        for t in &r.responses {
            for pr in &t.partition_responses {
                if pr.error_code != 0 {
                    ok = false;
                    report.error(format!(
                        "partition {}: produce error {}{}",
                        pr.index,
                        pr.error_code,
                        pr.error_message
                            .as_ref()
                            .map(|m| format!(" ({m})"))
                            .unwrap_or_default()
                    ));
                } else if pr.base_offset >= 0 {
                    shared.note_end(pr.index as usize, pr.base_offset + p.records as i64);
                }
            }
        }
        if ok {
            stats.acked_records.fetch_add(p.records, Relaxed);
            if p.measured {
                record(&mut hists.borrow_mut().publish, latency);
            }
        }
    }
    // After an error, the producer must not wait for slots that no response will give back.
    slots.close();
}

// ---------------------------------------------------------------------------------------------------
// The orchestrating thread.

/// Counters, CPU and metrics at one moment.
struct Snap {
    at: Instant,
    counters: Counters,
    cpu: CpuSample,
    pid_cpu: Option<f64>,
    metrics: Option<HashMap<String, f64>>,
}

impl Snap {
    fn take(shared: &Shared, obs: &Observer) -> Snap {
        Snap {
            cpu: cpu_sample(obs.thread_prefix.unwrap_or("\0")),
            pid_cpu: obs.pid.and_then(stats::pid_cpu_s),
            metrics: obs.admin.and_then(|a| stats::scrape(a).ok()),
            counters: shared.snapshot(),
            at: Instant::now(),
        }
    }
}

/// Prints the live line every second.
struct Live {
    enabled: bool,
    /// The raw baseline: nothing is produced and latency is not sampled.
    raw: bool,
    t0: Instant,
    prev: Counters,
    prev_at: Instant,
}

impl Live {
    fn line(&mut self, shared: &Shared, phase: &str) {
        let now = Instant::now();
        let c = shared.snapshot();
        let secs = (now - self.prev_at).as_secs_f64().max(1e-3);
        let interval = shared.take_interval();
        if self.enabled {
            let (pr, pb) = (
                c.produced_records - self.prev.produced_records,
                c.produced_bytes - self.prev.produced_bytes,
            );
            let (cr, cb) = c.consumed();
            let (pcr, pcb) = self.prev.consumed();
            let (sr, sb) = c.slowest_since(&self.prev);
            let e2e = if interval.is_empty() {
                "-".to_string()
            } else {
                format!(
                    "p50 {} p99 {}",
                    stats::us(interval.value_at_quantile(0.5)),
                    stats::us(interval.value_at_quantile(0.99))
                )
            };
            let produce = if self.raw {
                String::new()
            } else {
                format!(
                    "produce {} msg/s {:.1} MB/s | ",
                    stats::thousands((pr as f64 / secs) as u64),
                    stats::mb(pb as f64) / secs,
                )
            };
            let tail = if self.raw {
                String::new()
            } else {
                format!(
                    " | backlog {} msg | e2e {e2e}",
                    stats::thousands(shared.max_lag() as u64)
                )
            };
            println!(
                "[{:>3.0}s {phase}] {produce}consume {} msg/s {:.1} MB/s (slowest {} msg/s {:.1} MB/s){tail}",
                (now - self.t0).as_secs_f64(),
                stats::thousands(((cr - pcr) as f64 / secs) as u64),
                stats::mb((cb - pcb) as f64) / secs,
                stats::thousands((sr as f64 / secs) as u64),
                stats::mb(sb as f64) / secs,
            );
        }
        self.prev = c;
        self.prev_at = now;
    }
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

/// Runs the workload once against `target` and returns its summary.
pub fn run(
    w: &Workload,
    target: &Target<'_>,
    obs: &Observer,
    label: &str,
    settings: Settings,
) -> io::Result<RunSummary> {
    let epoch_us = now_us();
    let partitions = w.partitions as usize;
    let (leaders, fetch_version, produce_version, modulus) = match target {
        Target::Kafka(cluster) => (
            cluster.ensure_topic(&w.topic, w.partitions)?,
            cluster.versions.fetch,
            cluster.versions.produce,
            None,
        ),
        Target::Raw {
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
    let caught_up_ends: Option<Vec<i64>> = match target {
        Target::Kafka(cluster) if w.backlog_bytes > 0 && producers == 0 => {
            Some(cluster.offsets(&w.topic, &leaders, client::LATEST)?)
        }
        _ => None,
    };

    // Where consumers start.
    let starts: Vec<i64> = match target {
        Target::Kafka(cluster) => {
            let ts = if w.earliest || w.backlog_bytes > 0 {
                client::EARLIEST
            } else {
                client::LATEST
            };
            cluster.offsets(&w.topic, &leaders, ts)?
        }
        Target::Raw { .. } => vec![0; partitions],
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
        if let Target::Kafka(cluster) = target {
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

/// Spreads producers and consumers over the client executors, round robin. Producer i writes
/// partitions i, i + producers, ... (or partition i mod partitions when there are more producers).
fn assign(
    threads: usize,
    leaders: &[PartitionLeader],
    producers: usize,
    consumers: Vec<ConsumerPlan>,
) -> Vec<ExecPlan> {
    let mut plans = vec![ExecPlan::default(); threads];
    for (i, c) in consumers.into_iter().enumerate() {
        plans[i % threads].consumers.push(c);
    }
    for id in 0..producers {
        let partitions: Vec<PartitionLeader> = if producers >= leaders.len() {
            vec![leaders[id % leaders.len()]]
        } else {
            leaders
                .iter()
                .skip(id)
                .step_by(producers)
                .copied()
                .collect()
        };
        // Producers start from executor 1, away from executor 0's first consumers.
        plans[(id + 1) % threads]
            .producers
            .push(ProducerPlan { id, partitions });
    }
    plans
}

/// Did every consumer receive every record from its start offset to the final end offset?
fn check(shared: &Shared, final_offsets: &[i64], drain_s: f64, checked: bool) -> Correctness {
    let mut c = Correctness {
        checked,
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
        let whole = (end - start).max(0) as u64;
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
    c.all_received = c.complete_consumers == c.consumers;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

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
