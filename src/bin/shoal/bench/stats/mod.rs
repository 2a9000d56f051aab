//! What the load generator measures and how it reports it, one job per file:
//!
//! ## Layout, top layer first
//! - [`counters`] — the counters the client executors and the orchestrating thread share (atomics,
//!   one writer each), the run's phase, and their values at one moment.
//! - [`latency`]  — latency histograms (hdrhistogram, kept per client executor and merged) and
//!   their figures; the clock batches are stamped with.
//! - [`cpu`]      — CPU from `/proc` and the CPU clocks: by thread (the server's per core, with
//!   their io_uring workers) and of another process.
//! - [`memory`]   — a process's resident set and its peak.
//! - [`listener`] — the process listening on a port on this host (the broker to sample).
//! - [`admin`]    — shoal's admin API: scraping `/metrics`, switching settings.
//! - [`metrics`]  — `/metrics` parsed, and shoal's figures between two scrapes.
//! - [`format`](mod@format) — figures as printed: thousands, microseconds, sizes.

mod admin;
mod counters;
mod cpu;
mod format;
mod latency;
mod listener;
mod memory;
mod metrics;

pub use admin::{scrape, set_switch};
pub use counters::{ConsumerStats, Counters, Phase, Shared};
pub use cpu::{pid_cpu_s, CoreCpu, CpuSample, ThreadCpu};
pub use format::{mb, size, thousands, us};
pub use latency::{new_histogram, now_us, record, Hists, Latency};
pub use listener::find_listener_pid;
pub use memory::{peak_rss, reset_peak_rss, rss};
pub use metrics::{DeviceMetrics, DeviceOps, FetchMetrics, ViewMetrics};
