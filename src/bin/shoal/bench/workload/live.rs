//! The live line printed every second while a run goes on.

use super::Observer;
use crate::bench::stats;
use crate::bench::stats::{Counters, CpuSample, Shared, ThreadCpu};
use std::collections::HashMap;
use std::time::Instant;

/// Counters, CPU and metrics at one moment.
pub(super) struct Snap {
    pub(super) at: Instant,
    pub(super) counters: Counters,
    pub(super) cpu: CpuSample,
    /// The server process's CPU seconds, and whether at nanosecond resolution.
    pub(super) pid_cpu: Option<(f64, bool)>,
    /// Its threads (a shoal's cores) when it runs as another process on this host.
    pub(super) pid_threads: Option<CpuSample>,
    pub(super) metrics: Option<HashMap<String, f64>>,
}

impl Snap {
    pub(super) fn take(shared: &Shared, obs: &Observer, cpu: &mut CpuClocks) -> Snap {
        Snap {
            cpu: cpu.this.sample(),
            pid_cpu: obs.pid.and_then(stats::pid_cpu_s),
            pid_threads: cpu.server_process.as_mut().map(ThreadCpu::sample),
            metrics: obs.admin.and_then(|a| stats::scrape(a).ok()),
            counters: shared.snapshot(),
            at: Instant::now(),
        }
    }
}

/// The threads whose CPU a run follows, sampled every second (see [`ThreadCpu`]): this process's,
/// and the server process's where it runs apart on this host.
pub(super) struct CpuClocks {
    pub(super) this: ThreadCpu,
    pub(super) server_process: Option<ThreadCpu>,
}

impl CpuClocks {
    pub(super) fn new(obs: &Observer) -> CpuClocks {
        CpuClocks {
            this: ThreadCpu::new(obs.thread_prefix.unwrap_or("\0")),
            server_process: obs
                .pid
                .zip(obs.pid_thread_prefix)
                .map(|(pid, prefix)| ThreadCpu::of_process(pid, prefix)),
        }
    }

    pub(super) fn sample(&mut self) {
        self.this.sample();
        if let Some(s) = &mut self.server_process {
            s.sample();
        }
    }
}

/// Prints the live line every second.
pub(super) struct Live {
    pub(super) enabled: bool,
    /// The raw baseline: nothing is produced and latency is not sampled.
    pub(super) raw: bool,
    pub(super) t0: Instant,
    pub(super) prev: Counters,
    pub(super) prev_at: Instant,
}

impl Live {
    pub(super) fn line(&mut self, shared: &Shared, phase: &str) {
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
