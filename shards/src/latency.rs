//! Latency histograms kept as plain counters (Prometheus-style buckets), and the storage latencies
//! on this thread (one core): how long each write of grouped appends and each fsync took, from issue
//! to completion. A producer waits for its append's write: into the page cache (acks=0/1) or the
//! device write that made it durable (acks=all), so these say how much of its latency is the
//! storage's: a disk that holds writes behind its own cache flushes shows in the acks=all writes
//! and the fsyncs, not in the handler.

use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

/// Upper bounds of the buckets, in microseconds (then `+Inf`).
pub const DURATION_BUCKETS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

/// Durations: counts per bucket (not cumulative; the last is `+Inf`) and the sum, in microseconds.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    buckets: [Cell<u64>; DURATION_BUCKETS_US.len() + 1],
    sum_us: Cell<u64>,
}

impl DurationHistogram {
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = DURATION_BUCKETS_US.partition_point(|&b| b < us);
        self.buckets[i].set(self.buckets[i].get() + 1);
        self.sum_us.set(self.sum_us.get().saturating_add(us));
    }

    pub fn snapshot(&self) -> DurationSnapshot {
        DurationSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].get()),
            sum_us: self.sum_us.get(),
        }
    }
}

/// A [`DurationHistogram`] as plain data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DurationSnapshot {
    pub buckets: [u64; DURATION_BUCKETS_US.len() + 1],
    pub sum_us: u64,
}

impl DurationSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// The device latencies of every log on this thread, as plain data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceLatency {
    /// Each write of a group of appends (Direct I/O or buffered; O_DSYNC for durable groups).
    pub writes: DurationSnapshot,
    /// Each fsync: the periodic flush, group commit, a rolled segment's seal, an index file, a
    /// directory.
    pub fsyncs: DurationSnapshot,
}

#[derive(Default)]
struct Histograms {
    writes: DurationHistogram,
    fsyncs: DurationHistogram,
}

thread_local! {
    static DEVICE: Histograms = Histograms::default();
}

/// The device latencies of every log opened on this thread (this core) so far.
pub fn device_latency() -> DeviceLatency {
    DEVICE.with(|h| DeviceLatency {
        writes: h.writes.snapshot(),
        fsyncs: h.fsyncs.snapshot(),
    })
}

/// Runs a write of grouped appends, timing it.
pub(crate) async fn write<T>(f: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let r = f.await;
    DEVICE.with(|h| h.writes.record(start.elapsed()));
    r
}

/// Runs an fsync, timing it.
pub(crate) async fn fsync<T>(f: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let r = f.await;
    DEVICE.with(|h| h.fsyncs.record(start.elapsed()));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_their_buckets() {
        let h = DurationHistogram::default();
        for us in [1, 100, 101, 4_000, 6_000_000] {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 5);
        assert_eq!(s.buckets[0], 2, "up to 100 us, inclusive");
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[5], 1, "2.5 to 5 ms");
        assert_eq!(s.buckets[DURATION_BUCKETS_US.len()], 1, "+Inf");
        assert_eq!(s.sum_us, 1 + 100 + 101 + 4_000 + 6_000_000);
    }
}
