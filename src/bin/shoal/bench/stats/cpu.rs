//! CPU seconds from `/proc` and the CPU clocks: a process's threads told apart by name (the
//! server's per core with their io_uring workers, and the others), and another process's total.

use std::collections::{BTreeMap, HashMap};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
