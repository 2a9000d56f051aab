//! What the load generator measures and how it reports it: shared counters (atomics, one writer
//! each), latency histograms (hdrhistogram, kept per client executor and merged), CPU and memory from
//! `/proc`, shoal's `/metrics`, the live line and the summary (printed and as JSON).

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const R: Ordering = Ordering::Relaxed;

/// Microseconds since the Unix epoch (the clock producers stamp batches with).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Latencies in microseconds, from 1 µs to an hour at 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

pub fn record(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.max(1));
}

/// Latency figures in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    pub samples: u64,
    pub mean: f64,
    pub p50: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub p99_99: u64,
    pub max: u64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Option<Latency> {
        (!h.is_empty()).then(|| Latency {
            samples: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p99_9: h.value_at_quantile(0.999),
            p99_99: h.value_at_quantile(0.9999),
            max: h.max(),
        })
    }
}

/// The histograms one client executor fills; merged into the shared copy a few times a second.
#[derive(Debug)]
pub struct Hists {
    /// Produce request sent -> response read, measured phase only.
    pub publish: Histogram<u64>,
    /// Batch stamped by the producer -> batch read by a consumer, measured phase only.
    pub e2e: Histogram<u64>,
    /// The same for the live line: every phase, reset every second.
    pub e2e_interval: Histogram<u64>,
}

impl Default for Hists {
    fn default() -> Self {
        Hists {
            publish: new_histogram(),
            e2e: new_histogram(),
            e2e_interval: new_histogram(),
        }
    }
}

impl Hists {
    /// Adds `other` into `self` and empties `other`.
    pub fn drain_from(&mut self, other: &mut Hists) {
        for (to, from) in [
            (&mut self.publish, &mut other.publish),
            (&mut self.e2e, &mut other.e2e),
            (&mut self.e2e_interval, &mut other.e2e_interval),
        ] {
            if !from.is_empty() {
                let _ = to.add(&*from);
                from.reset();
            }
        }
    }
}

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

// ---------------------------------------------------------------------------------------------------
// CPU and memory from /proc.

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime in clock ticks from a `stat` file's contents.
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After "pid (comm) ", field 3 (state) is f[0]: utime is field 14, stime field 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU seconds of a process at one moment: all of it (the process clock, exited threads
/// included), and what [`ThreadCpu`] attributes to the server's threads and to the others.
#[derive(Debug, Clone, Default)]
pub struct CpuSample {
    pub process_s: f64,
    pub server_s: f64,
    pub others_s: f64,
    /// The server's part by thread index (the number after the prefix in its name: a shoal
    /// core's index).
    pub cores: BTreeMap<usize, CoreCpu>,
}

/// CPU seconds of one server thread (a shoal core) and of the io_uring workers serving its ring.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CoreCpu {
    pub thread_s: f64,
    pub workers_s: f64,
}

impl CpuSample {
    /// CPU of the process between `begin` and `self` that neither figure holds: what threads
    /// used after the last sample that saw them, before they exited (or before it, when no
    /// sample saw them at all).
    pub fn unattributed_since(&self, begin: &CpuSample) -> f64 {
        let attributed = (self.server_s + self.others_s) - (begin.server_s + begin.others_s);
        (self.process_s - begin.process_s) - attributed
    }

    /// Each server thread's CPU (with its io_uring workers') between `begin` and `self`.
    pub fn cores_since(&self, begin: &CpuSample) -> BTreeMap<usize, CoreCpu> {
        self.cores
            .iter()
            .map(|(i, end)| {
                let b = begin.cores.get(i).copied().unwrap_or_default();
                let d = CoreCpu {
                    thread_s: end.thread_s - b.thread_s,
                    workers_s: end.workers_s - b.workers_s,
                };
                (*i, d)
            })
            .collect()
    }
}

/// What a thread seen by [`ThreadCpu`] is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ThreadKind {
    /// A server thread, or an io_uring worker of one (`worker`); `index`: the server thread's
    /// (see [`thread_index`]).
    Server {
        index: Option<usize>,
        worker: bool,
    },
    Other,
}

/// The CPU of a process's threads (this one's, or another's on this host), told apart by name:
/// the server's (names starting with a prefix: the broker's cores, or the raw baseline server's)
/// with their io_uring workers (a worker is named `iou-wrk-<tid>` after the thread whose ring it
/// serves, so it is counted with that thread), and the others (the generator, or the broker's
/// other threads). Each thread is kept, with what it had used, once a sample has seen it: one that
/// exits later still counts, up to that sample. Sampled once a second, a thread's CPU is lost only
/// from its last sample to its exit; io_uring workers exit after idling for seconds, so that is
/// close to nothing for them, and the remainder is reported ([`CpuSample::unattributed_since`]).
#[derive(Debug)]
pub struct ThreadCpu {
    /// Whose threads: None for this process.
    pid: Option<u32>,
    server_prefix: String,
    /// (tid, start time in clock ticks since boot: tids are reused) -> (what it is, CPU seconds
    /// when last seen).
    threads: HashMap<(String, u64), (ThreadKind, f64)>,
}

impl ThreadCpu {
    /// This process's threads.
    pub fn new(server_prefix: &str) -> ThreadCpu {
        ThreadCpu {
            pid: None,
            server_prefix: server_prefix.to_string(),
            threads: HashMap::new(),
        }
    }

    /// The threads of process `pid` on this host.
    pub fn of_process(pid: u32, server_prefix: &str) -> ThreadCpu {
        ThreadCpu {
            pid: Some(pid),
            ..ThreadCpu::new(server_prefix)
        }
    }

    /// The whole process's CPU seconds.
    fn process_s(&self, hz: f64) -> f64 {
        // Nanoseconds where the kernel gives them (the process clock, each thread's schedstat): a
        // light generator uses a few 10 ms clock ticks a second, too coarse to tell apart.
        if let Some(pid) = self.pid {
            return pid_cpu_s(pid).map_or(0.0, |(s, _)| s);
        }
        process_cpu_s().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/self/stat")
                .ok()
                .and_then(|s| stat_ticks(&s))
                .unwrap_or(0) as f64
                / hz
        })
    }

    /// Every live thread: (tid, start time, name, CPU seconds).
    fn live(&self, hz: f64) -> Vec<(String, u64, String, f64)> {
        let tasks = match self.pid {
            Some(pid) => format!("/proc/{pid}/task"),
            None => "/proc/self/task".to_string(),
        };
        let mut live = Vec::new();
        let Ok(dir) = std::fs::read_dir(tasks) else {
            return live;
        };
        for t in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue; // exited since the listing
            };
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let secs = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .map(|ns| ns as f64 / 1e9)
                .or_else(|| stat_ticks(&stat).map(|ticks| ticks as f64 / hz))
                .unwrap_or(0.0);
            let tid = t.file_name().to_string_lossy().to_string();
            let started = stat_start_time(&stat).unwrap_or(0);
            live.push((tid, started, comm.trim_end().to_string(), secs));
        }
        live
    }

    /// Reads every live thread's CPU and returns the totals, exited threads included.
    pub fn sample(&mut self) -> CpuSample {
        let hz = clock_ticks();
        let process_s = self.process_s(hz);
        let live = self.live(hz);
        // The server threads by tid, seen now or before: the owners of io_uring workers.
        let mut owners: HashMap<&str, Option<usize>> = HashMap::new();
        for ((tid, _), (kind, _)) in &self.threads {
            if let ThreadKind::Server {
                index,
                worker: false,
            } = kind
            {
                owners.insert(tid, *index);
            }
        }
        for (tid, _, comm, _) in &live {
            if let Some(rest) = comm.strip_prefix(self.server_prefix.as_str()) {
                owners.insert(tid, thread_index(rest));
            }
        }
        let mut updates = Vec::new();
        for (tid, started, comm, secs) in &live {
            let kind = if let Some(rest) = comm.strip_prefix(self.server_prefix.as_str()) {
                ThreadKind::Server {
                    index: thread_index(rest),
                    worker: false,
                }
            } else {
                match comm.strip_prefix("iou-wrk-").and_then(|o| owners.get(o)) {
                    Some(index) => ThreadKind::Server {
                        index: *index,
                        worker: true,
                    },
                    None => ThreadKind::Other,
                }
            };
            updates.push(((tid.clone(), *started), (kind, *secs)));
        }
        self.threads.extend(updates);
        let mut out = CpuSample {
            process_s,
            ..CpuSample::default()
        };
        for (kind, secs) in self.threads.values() {
            match *kind {
                ThreadKind::Server { index, worker } => {
                    out.server_s += secs;
                    if let Some(i) = index {
                        let core = out.cores.entry(i).or_default();
                        if worker {
                            core.workers_s += secs;
                        } else {
                            core.thread_s += secs;
                        }
                    }
                }
                ThreadKind::Other => out.others_s += secs,
            }
        }
        out
    }
}

/// The index in a server thread's name after the prefix: `shoal-core-3-17` is core 3 (glommio
/// appends `-<executor id>` to the name it is given).
fn thread_index(after_prefix: &str) -> Option<usize> {
    after_prefix.split('-').next()?.parse().ok()
}

/// A thread's or process's start time (field 22, clock ticks since boot) from its `stat` file.
fn stat_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's CPU time (all threads, exited ones included), in seconds at nanosecond
/// resolution.
fn process_cpu_s() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// CPU seconds of another process on this host (exited threads included), and whether they come
/// at nanosecond resolution (its process CPU clock, as [`ThreadCpu`] reads this process's
/// threads) or in clock ticks (`/proc/<pid>/stat`, where that clock cannot be read).
pub fn pid_cpu_s(pid: u32) -> Option<(f64, bool)> {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both calls write only to the valid, writable locals passed to them.
    let precise = unsafe {
        libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) == 0
            && libc::clock_gettime(clock, &mut ts) == 0
    };
    if precise {
        return Some((ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9, true));
    }
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some((stat_ticks(&s)? as f64 / clock_ticks(), false))
}

/// Peak resident set (VmHWM) of a process (None: this one), in bytes: since it started, or since
/// [`reset_peak_rss`].
pub fn peak_rss(pid: Option<u32>) -> Option<u64> {
    status_kb(pid, "VmHWM:").map(|kb| kb * 1024)
}

/// Resident set (VmRSS) of a process now, in bytes.
pub fn rss(pid: Option<u32>) -> Option<u64> {
    status_kb(pid, "VmRSS:").map(|kb| kb * 1024)
}

fn status_kb(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = pid.map_or_else(
        || "/proc/self/status".to_string(),
        |p| format!("/proc/{p}/status"),
    );
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Sets a process's peak resident set back to its resident set now (Linux `clear_refs` 5), so that
/// the peak of a run is its own; false where the kernel or permissions do not allow it.
pub fn reset_peak_rss(pid: Option<u32>) -> bool {
    let path = pid.map_or_else(
        || "/proc/self/clear_refs".to_string(),
        |p| format!("/proc/{p}/clear_refs"),
    );
    std::fs::write(path, "5").is_ok()
}

/// The process listening on `addr`'s port on this host, found through `/proc/net/tcp*` and the
/// processes' open sockets; `None` when it is elsewhere or not visible.
pub fn find_listener_pid(addr: SocketAddr) -> Option<u32> {
    let port = addr.port();
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let lport = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && lport == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------------
// shoal's admin API.

fn http(admin: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: shoal\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("admin: malformed HTTP answer"))?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        return Err(std::io::Error::other(format!(
            "admin {method} {path}: {status}: {}",
            body.trim()
        )));
    }
    Ok(body.to_string())
}

/// Every sample of `/metrics`, summed over labels, by family name; a histogram's buckets also by
/// their bound, as `NAME_bucket|le=BOUND` (summed over the other labels).
pub fn scrape(admin: SocketAddr) -> std::io::Result<HashMap<String, f64>> {
    Ok(parse_metrics(&http(admin, "GET", "/metrics", "")?))
}

fn parse_metrics(body: &str) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some(family) = line.split(['{', ' ']).next() else {
            continue;
        };
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *out.entry(family.to_string()).or_default() += v;
            let bound = line
                .split_once("le=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(le, _)| le);
            if let (true, Some(le)) = (family.ends_with("_bucket"), bound) {
                *out.entry(format!("{family}|le={le}")).or_default() += v;
            }
        }
    }
    out
}

/// How much sample `k` grew from scrape `a` to scrape `b` (a counter reset counts as none).
fn delta(a: &HashMap<String, f64>, b: &HashMap<String, f64>, k: &str) -> f64 {
    let v = b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0);
    v.max(0.0)
}

/// One of shoal's storage-device histograms over the measured interval.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct DeviceOps {
    pub count: u64,
    pub mean_us: Option<f64>,
    /// Operations that took longer than 10 ms, and than 100 ms.
    pub over_10ms: u64,
    pub over_100ms: u64,
    /// The upper bound of the slowest one's bucket, in seconds (`None` past the last bound).
    pub slowest_within_s: Option<f64>,
}

impl DeviceOps {
    /// The histogram `name` between two scrapes.
    fn between(a: &HashMap<String, f64>, b: &HashMap<String, f64>, name: &str) -> DeviceOps {
        let d = |k: &str| delta(a, b, k);
        let count = d(&format!("{name}_count")) as u64;
        let below = |le: &str| d(&format!("{name}_bucket|le={le}")) as u64;
        let slowest_within_s = shards::latency::DURATION_BUCKETS_US
            .iter()
            .map(|us| *us as f64 / 1e6)
            .find(|le| below(&le.to_string()) >= count);
        DeviceOps {
            count,
            mean_us: (count > 0).then(|| d(&format!("{name}_sum")) * 1e6 / count as f64),
            over_10ms: count.saturating_sub(below("0.01")),
            over_100ms: count.saturating_sub(below("0.1")),
            slowest_within_s: slowest_within_s.filter(|_| count > 0),
        }
    }
}

/// shoal's storage device figures over the measured interval: its writes of appends and fsyncs.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct DeviceMetrics {
    pub writes: DeviceOps,
    pub fsyncs: DeviceOps,
}

impl DeviceMetrics {
    pub fn between(a: &HashMap<String, f64>, b: &HashMap<String, f64>) -> DeviceMetrics {
        DeviceMetrics {
            writes: DeviceOps::between(a, b, "shoal_log_write_duration_seconds"),
            fsyncs: DeviceOps::between(a, b, "shoal_log_fsync_duration_seconds"),
        }
    }
}

/// Turns one of shoal's on/off settings (`fetch_coalescing`, `view_sharing`) on or off on every
/// core, through its admin API.
pub fn set_switch(admin: SocketAddr, name: &str, on: bool) -> std::io::Result<()> {
    http(
        admin,
        "PUT",
        &format!("/v1/config/{name}"),
        if on { "on" } else { "off" },
    )
    .map(|_| ())
}

/// shoal's fetch figures over the measured interval.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct FetchMetrics {
    pub coalescer_reads: u64,
    pub coalescer_inflight_hits: u64,
    pub coalescer_ready_hits: u64,
    /// (ready_hits + inflight_hits) / (ready_hits + inflight_hits + reads).
    pub coalescer_hit_ratio: Option<f64>,
    /// Record bytes read from the log for fetches.
    pub log_read_bytes: u64,
    /// Record bytes sent in fetch responses.
    pub response_bytes: u64,
    /// response_bytes / log_read_bytes: about the number of consumers sharing each read.
    pub fan_out_saving: Option<f64>,
}

impl FetchMetrics {
    pub fn between(a: &HashMap<String, f64>, b: &HashMap<String, f64>) -> FetchMetrics {
        let d = |k: &str| delta(a, b, k) as u64;
        let reads = d("shoal_fetch_coalescer_reads_total");
        let inflight = d("shoal_fetch_coalescer_inflight_hits_total");
        let ready = d("shoal_fetch_coalescer_ready_hits_total");
        let log_read = d("shoal_fetch_log_read_bytes_total");
        let sent = d("shoal_fetch_response_bytes_total");
        let hits = inflight + ready;
        FetchMetrics {
            coalescer_reads: reads,
            coalescer_inflight_hits: inflight,
            coalescer_ready_hits: ready,
            coalescer_hit_ratio: (hits + reads > 0).then(|| hits as f64 / (hits + reads) as f64),
            log_read_bytes: log_read,
            response_bytes: sent,
            fan_out_saving: (log_read > 0).then(|| sent as f64 / log_read as f64),
        }
    }
}

/// shoal's shard-view figures over a whole run (`--views`).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ViewMetrics {
    /// Source batches the producers wrote in the run (backlog included): what the views had to
    /// cover.
    pub source_batches: u64,
    pub source_batches_decoded: u64,
    pub shard_batches_encoded: u64,
    pub fetches_served: u64,
    pub catch_up_reads: u64,
    /// View fetches served by another fetch's catch-up read.
    pub catch_up_reads_shared: u64,
    pub decode_errors: u64,
    /// Compressed source batches split without a second decompression (the produce path's kept).
    pub decompressions_saved: u64,
    /// source_batches_decoded / source_batches: 1 when one reader decodes each batch once for
    /// every shard and consumer.
    pub decodes_per_source_batch: Option<f64>,
}

impl ViewMetrics {
    pub fn between(
        a: &HashMap<String, f64>,
        b: &HashMap<String, f64>,
        source_batches: u64,
    ) -> ViewMetrics {
        let d = |k: &str| delta(a, b, k) as u64;
        let decoded = d("shoal_view_source_batches_decoded_total");
        ViewMetrics {
            source_batches,
            source_batches_decoded: decoded,
            shard_batches_encoded: d("shoal_view_shard_batches_encoded_total"),
            fetches_served: d("shoal_view_fetches_served_total"),
            catch_up_reads: d("shoal_view_catch_up_reads_total"),
            catch_up_reads_shared: d("shoal_view_catch_up_reads_shared_total"),
            decode_errors: d("shoal_view_decode_errors_total"),
            decompressions_saved: d("shoal_view_decompressions_saved_total"),
            decodes_per_source_batch: (source_batches > 0)
                .then(|| decoded as f64 / source_batches as f64),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Formatting.

pub fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// 1234567 -> "1,234,567".
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Microseconds as a short human figure: "850us", "1.25ms", "3.2s".
pub fn us(v: u64) -> String {
    if v < 1_000 {
        format!("{v}us")
    } else if v < 1_000_000 {
        format!("{:.2}ms", v as f64 / 1e3)
    } else {
        format!("{:.2}s", v as f64 / 1e6)
    }
}

/// Bytes as "512 B", "16.0 KiB", "1.00 GiB".
pub fn size(v: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_skips_odd_thread_names() {
        let s = "12 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 4242 0";
        assert_eq!(stat_ticks(s), Some(300));
        assert_eq!(stat_start_time(s), Some(4242));
    }

    #[test]
    fn a_server_thread_that_exits_between_samples_keeps_its_cpu() {
        let mut cpu = ThreadCpu::new("cpu-test-server");
        let begin = cpu.sample();
        let (spun, spun_rx) = std::sync::mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("cpu-test-server".into())
            .spawn(move || {
                spin_cpu(200);
                spun.send(()).unwrap();
                // Seen by a sample while alive, then more work before it exits.
                std::thread::park();
                spin_cpu(5);
            })
            .unwrap();
        spun_rx.recv().unwrap();
        cpu.sample();
        worker.thread().unpark();
        worker.join().unwrap();
        let end = cpu.sample();
        let server = end.server_s - begin.server_s;
        assert!(
            (0.2..0.25).contains(&server),
            "the exited server thread's CPU: {server} s"
        );
    }

    /// Burns `ms` of the calling thread's own CPU time, however busy the machine.
    fn spin_cpu(ms: u64) {
        let thread_s = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
        };
        let until = thread_s() + ms as f64 / 1e3;
        let mut x = 0u64;
        while thread_s() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn server_threads_are_told_apart_by_the_index_in_their_name() {
        // Read through /proc/<pid>, as another process's threads are.
        let mut cpu = ThreadCpu::of_process(std::process::id(), "cpu-core-");
        let begin = cpu.sample();
        let (tids, tid) = std::sync::mpsc::channel();
        let mut threads: Vec<_> = [(0, 50), (1, 250)]
            .into_iter()
            .map(|(core, ms)| {
                let tids = tids.clone();
                std::thread::Builder::new()
                    // As glommio names an executor's thread: the name given, `-<executor id>`.
                    .name(format!("cpu-core-{core}-1{core}"))
                    .spawn(move || {
                        // SAFETY: gettid has no preconditions.
                        tids.send((core, unsafe { libc::gettid() })).unwrap();
                        spin_cpu(ms);
                        std::thread::park();
                    })
                    .unwrap()
            })
            .collect();
        // An io_uring worker of core 0's ring, named after the thread it serves.
        let core0 = std::iter::from_fn(|| tid.recv().ok())
            .find(|(core, _)| *core == 0)
            .unwrap()
            .1;
        threads.push(
            std::thread::Builder::new()
                .name(format!("iou-wrk-{core0}"))
                .spawn(|| {
                    spin_cpu(100);
                    std::thread::park();
                })
                .unwrap(),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let end = loop {
            std::thread::sleep(Duration::from_millis(50));
            let s = cpu.sample();
            let cores = s.cores_since(&begin);
            let (c0, c1) = (cores.get(&0).copied(), cores.get(&1).copied());
            let (c0, c1) = (c0.unwrap_or_default(), c1.unwrap_or_default());
            let done = c0.thread_s >= 0.05 && c0.workers_s >= 0.1 && c1.thread_s >= 0.25;
            if done || std::time::Instant::now() > deadline {
                break s;
            }
        };
        for t in threads {
            t.thread().unpark();
            t.join().unwrap();
        }
        let cores = end.cores_since(&begin);
        let (c0, c1) = (cores[&0], cores[&1]);
        assert!((0.05..0.1).contains(&c0.thread_s), "core 0: {c0:?}");
        assert!((0.25..0.3).contains(&c1.thread_s), "core 1: {c1:?}");
        assert!((0.1..0.15).contains(&c0.workers_s), "core 0: {c0:?}");
        assert_eq!(c1.workers_s, 0.0);
        let server = end.server_s - begin.server_s;
        let cores_s = c0.thread_s + c0.workers_s + c1.thread_s;
        assert!((server - cores_s).abs() < 1e-9, "{server} vs {cores_s}");
    }

    #[test]
    fn another_process_cpu_is_read_at_nanosecond_resolution() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 30",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // Until the loop is done: the process is asleep and its CPU no longer moves.
        let (cpu, precise) = loop {
            let (a, precise) = pid_cpu_s(pid).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let (b, _) = pid_cpu_s(pid).unwrap();
            if a > 0.0 && a == b {
                break (b, precise);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child never slept"
            );
        };
        let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| stat_ticks(&s))
            .unwrap() as f64
            / clock_ticks();
        let _ = child.kill();
        let _ = child.wait();
        assert!(precise, "read from the process CPU clock");
        assert!(
            (cpu - ticks).abs() < 0.05,
            "{cpu} s by the clock, {ticks} s in clock ticks"
        );
    }

    #[test]
    fn device_histograms_between_two_scrapes() {
        // shoal's own rendering (`render_prometheus`) of two cores' write histograms: `fast`
        // writes of 200 us and `slow` ones of 200 ms on each.
        let render = |fast: u64, slow: u64| {
            let cores: Vec<_> = (0..2)
                .map(|core| {
                    let h = shards::DurationHistogram::default();
                    (0..fast).for_each(|_| h.record(Duration::from_micros(200)));
                    (0..slow).for_each(|_| h.record(Duration::from_millis(200)));
                    shoal::stats::CoreSnapshot {
                        core,
                        device: shards::DeviceLatency {
                            writes: h.snapshot(),
                            ..Default::default()
                        },
                        ..Default::default()
                    }
                })
                .collect();
            parse_metrics(&shoal::stats::render_prometheus(&cores))
        };
        let (a, b) = (render(10, 0), render(110, 2));
        let d = DeviceMetrics::between(&a, &b);
        // Per core 100 fast writes and 2 slow ones: 200 and 4 over two cores.
        assert_eq!(d.writes.count, 204);
        assert_eq!((d.writes.over_10ms, d.writes.over_100ms), (4, 4));
        assert_eq!(d.writes.slowest_within_s, Some(0.25));
        let mean = d.writes.mean_us.unwrap();
        assert!(
            (mean - (200.0 * 200.0 + 4.0 * 200_000.0) / 204.0).abs() < 1e-6,
            "{mean}"
        );
        // No fsyncs in either scrape.
        assert_eq!(d.fsyncs, DeviceOps::default());
    }

    #[test]
    fn fetch_metrics_deltas_and_ratios() {
        let a: HashMap<String, f64> = [("shoal_fetch_coalescer_reads_total".to_string(), 10.0)]
            .into_iter()
            .collect();
        let b: HashMap<String, f64> = [
            ("shoal_fetch_coalescer_reads_total", 20.0),
            ("shoal_fetch_coalescer_ready_hits_total", 20.0),
            ("shoal_fetch_coalescer_inflight_hits_total", 10.0),
            ("shoal_fetch_log_read_bytes_total", 100.0),
            ("shoal_fetch_response_bytes_total", 400.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let m = FetchMetrics::between(&a, &b);
        assert_eq!(m.coalescer_reads, 10);
        assert_eq!(m.coalescer_hit_ratio, Some(0.75));
        assert_eq!(m.fan_out_saving, Some(4.0));
    }

    #[test]
    fn number_formats() {
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(us(850), "850us");
        assert_eq!(us(1_250), "1.25ms");
        assert_eq!(size(16 << 10), "16.0 KiB");
    }
}
