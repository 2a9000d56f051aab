//! A run's shared counters (atomics, one writer each): per producer and consumer, the phase,
//! errors, partition ends; and the values at one moment (`Counters`).

use super::latency::{new_histogram, Hists};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::Mutex;

const R: Ordering = Ordering::Relaxed;

/// One producer's counters.
#[derive(Debug, Default)]
pub struct ProducerStats {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub acked_records: AtomicU64,
    pub errors: AtomicU64,
    pub done: AtomicBool,
    /// A transactional producer's committed transactions, and their EndTxn calls' time.
    pub commits: AtomicU64,
    pub end_txn_us: AtomicU64,
}

/// One consumer's counters.
#[derive(Debug)]
pub struct ConsumerStats {
    pub partition: i32,
    /// The shard view it reads (`--views`), or None for the topic itself.
    pub shard: Option<u32>,
    pub start_offset: AtomicI64,
    /// The next offset it will fetch.
    pub position: AtomicI64,
    pub records: AtomicU64,
    /// Record-batch bytes received (whole batches; the protocol's framing is not counted).
    pub bytes: AtomicU64,
    pub fetches: AtomicU64,
    /// Offsets skipped between batches that no batch explains.
    pub gap_offsets: AtomicU64,
    pub gaps: AtomicU64,
    /// Offsets taken by control batches (transaction markers) it read past.
    pub control_offsets: AtomicU64,
    pub errors: AtomicU64,
    pub done: AtomicBool,
    /// It stopped on an error it cannot recover from.
    pub failed: AtomicBool,
    /// The broker (node id) it fetches from now: its partition's leader or a read replica; -1
    /// where brokers have no ids (the raw baseline).
    pub broker: AtomicI32,
    /// Fetch responses that preferred another broker (KIP-392), followed or not.
    pub redirects: AtomicU64,
    /// Times it moved to a read replica, and back to the leader.
    pub to_replica: AtomicU64,
    pub to_leader: AtomicU64,
}

impl ConsumerStats {
    pub fn new(partition: i32, start: i64) -> ConsumerStats {
        ConsumerStats {
            partition,
            shard: None,
            start_offset: AtomicI64::new(start),
            position: AtomicI64::new(start),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
            gap_offsets: AtomicU64::new(0),
            control_offsets: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            done: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            broker: AtomicI32::new(-1),
            redirects: AtomicU64::new(0),
            to_replica: AtomicU64::new(0),
            to_leader: AtomicU64::new(0),
        }
    }
}

/// Phases of a run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// Consumers connect; producers wait.
    Setup = 0,
    /// Producers pre-produce the backlog; consumers are not running.
    Backlog = 1,
    Warmup = 2,
    Measure = 3,
    /// Producers stop; consumers read up to the final high watermark.
    Drain = 4,
    Stop = 5,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Setup,
            1 => Phase::Backlog,
            2 => Phase::Warmup,
            3 => Phase::Measure,
            4 => Phase::Drain,
            _ => Phase::Stop,
        }
    }
}

/// Everything the client executors and the orchestrating thread share.
#[derive(Debug)]
pub struct Shared {
    phase: AtomicU8,
    pub producers: Vec<ProducerStats>,
    pub consumers: Vec<ConsumerStats>,
    /// Highest end offset known per partition (from produce acks and fetch high watermarks).
    pub partition_end: Vec<AtomicI64>,
    /// Where consumers of each partition stop in the drain phase (`i64::MAX` until known).
    pub drain_target: Vec<AtomicI64>,
    pub consumers_ready: AtomicUsize,
    /// Bytes of batches sent by all producers (for `--backlog`).
    pub bytes_sent: AtomicU64,
    /// Stop producing once `bytes_sent` reaches this (`u64::MAX`: no limit).
    pub byte_limit: AtomicU64,
    /// Per client executor.
    pub hists: Vec<Mutex<Hists>>,
    pub error_count: AtomicU64,
    errors: Mutex<Vec<String>>,
    /// Timestamps before this (µs since the epoch) are not this run's batches.
    pub epoch_us: u64,
}

/// Error messages kept for the summary (the count is always exact).
const KEPT_ERRORS: usize = 20;

impl Shared {
    pub fn new(
        producers: usize,
        consumers: Vec<ConsumerStats>,
        partitions: usize,
        executors: usize,
        epoch_us: u64,
    ) -> Shared {
        Shared {
            phase: AtomicU8::new(Phase::Setup as u8),
            producers: (0..producers).map(|_| ProducerStats::default()).collect(),
            consumers,
            partition_end: (0..partitions).map(|_| AtomicI64::new(-1)).collect(),
            drain_target: (0..partitions).map(|_| AtomicI64::new(i64::MAX)).collect(),
            consumers_ready: AtomicUsize::new(0),
            bytes_sent: AtomicU64::new(0),
            byte_limit: AtomicU64::new(u64::MAX),
            hists: (0..executors)
                .map(|_| Mutex::new(Hists::default()))
                .collect(),
            error_count: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            epoch_us,
        }
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    pub fn error(&self, msg: String) {
        self.error_count.fetch_add(1, R);
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if e.len() < KEPT_ERRORS {
            e.push(msg);
        }
    }

    pub fn error_messages(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn note_end(&self, partition: usize, end: i64) {
        if let Some(e) = self.partition_end.get(partition) {
            e.fetch_max(end, R);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> Counters {
        Counters {
            produced_records: self.producers.iter().map(|p| p.records.load(R)).sum(),
            produced_bytes: self.producers.iter().map(|p| p.bytes.load(R)).sum(),
            consumers: self
                .consumers
                .iter()
                .map(|c| (c.records.load(R), c.bytes.load(R)))
                .collect(),
            fetches: self.consumers.iter().map(|c| c.fetches.load(R)).sum(),
        }
    }

    /// How many consumers fetch from each broker (node id) now; those without one left out.
    pub fn consumers_per_broker(&self) -> BTreeMap<i32, usize> {
        let mut out = BTreeMap::new();
        for c in &self.consumers {
            let b = c.broker.load(R);
            if b >= 0 {
                *out.entry(b).or_default() += 1;
            }
        }
        out
    }

    /// Largest lag of any consumer behind its partition's known end, in records.
    pub fn max_lag(&self) -> i64 {
        self.consumers
            .iter()
            .map(|c| {
                let end = self.partition_end[c.partition as usize].load(R);
                (end - c.position.load(R)).max(0)
            })
            .max()
            .unwrap_or(0)
    }

    /// Takes the live-line histogram of every executor (and resets them).
    pub fn take_interval(&self) -> Histogram<u64> {
        let mut out = new_histogram();
        for h in &self.hists {
            let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
            let _ = out.add(&h.e2e_interval);
            h.e2e_interval.reset();
        }
        out
    }

    /// Records the producers had acknowledged.
    pub fn acked_records(&self) -> u64 {
        self.producers.iter().map(|p| p.acked_records.load(R)).sum()
    }

    /// The measured-phase histograms of all executors merged: (publish, e2e).
    pub fn totals(&self) -> (Histogram<u64>, Histogram<u64>) {
        let (mut p, mut e) = (new_histogram(), new_histogram());
        for h in &self.hists {
            let h = h.lock().unwrap_or_else(|e| e.into_inner());
            let _ = p.add(&h.publish);
            let _ = e.add(&h.e2e);
        }
        (p, e)
    }
}

/// Counter values at one moment.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub produced_records: u64,
    pub produced_bytes: u64,
    /// (records, bytes) per consumer.
    pub consumers: Vec<(u64, u64)>,
    pub fetches: u64,
}

impl Counters {
    pub fn consumed(&self) -> (u64, u64) {
        self.consumers
            .iter()
            .fold((0, 0), |(r, b), (cr, cb)| (r + cr, b + cb))
    }

    /// The consumer that moved the fewest records from `earlier` to `self`: (records, bytes).
    pub fn slowest_since(&self, earlier: &Counters) -> (u64, u64) {
        self.consumers
            .iter()
            .zip(&earlier.consumers)
            .map(|(now, then)| (now.0 - then.0, now.1 - then.1))
            .min()
            .unwrap_or((0, 0))
    }
}
