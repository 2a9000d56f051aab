//! Latencies: the clock batches are stamped with, hdrhistogram histograms kept per client
//! executor and merged, and their figures (`Latency`).

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::{SystemTime, UNIX_EPOCH};

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
