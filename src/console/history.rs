//! The console's charts' data: every [`SAMPLE_EVERY`] a thread of its own asks for the cores'
//! figures and keeps, per core, the rates and latencies of the interval just ended (and the
//! groups' lag) in a ring of [`KEPT`] samples, so a page opened now draws the last 15 minutes at
//! once. A sample holds numbers only, so the ring's memory is bounded by the cores and
//! [`MAX_GROUPS`]: 96 bytes per core and 32 plus the name per group, times [`KEPT`] (with 2 cores
//! and 10 groups about 120 KB; with 64 cores about 1.1 MB).

use crate::metrics::{DurationSnapshot, DURATION_BUCKETS_US};
use crate::stats::CoreSnapshot;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a sample is taken.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept: 15 minutes.
pub const KEPT: usize = 180;
/// Groups charted: the most lagging at each sample.
pub const MAX_GROUPS: usize = 10;
/// How often the sampling thread looks at the stop flag between samples.
const STOP_POLL: Duration = Duration::from_millis(100);

/// The ring of samples, and when the broker (its admin side) started.
#[derive(Debug)]
pub struct History {
    started: Instant,
    started_ms: u64,
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    samples: VecDeque<Sample>,
    /// Each core's counters at the last sample, to take the next interval's rates from.
    last: HashMap<usize, Counters>,
}

/// One interval's figures: when it ended, each core's, and the most lagging groups' lag.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    time_ms: u64,
    cores: Vec<CoreSample>,
    lag: Vec<(String, u64)>,
}

/// One core over one interval. Rates are `None` for a core's first sample, latencies where the
/// interval had no request of the kind.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CoreSample {
    core: usize,
    bytes_in: Option<f64>,
    bytes_out: Option<f64>,
    fetch_responses: Option<f64>,
    fetch_connections: u64,
    produce_p99_ms: Option<f64>,
    fetch_p99_ms: Option<f64>,
}

/// A core's counters as last seen.
#[derive(Debug, Clone, Copy)]
struct Counters {
    at: Instant,
    bytes_in: u64,
    bytes_out: u64,
    fetches: u64,
    produce: DurationSnapshot,
    fetch: DurationSnapshot,
}

impl Counters {
    fn of(s: &CoreSnapshot, at: Instant) -> Counters {
        use kafka_protocol::messages::ApiKey;
        let durations = |key: ApiKey| {
            s.kafka
                .durations
                .iter()
                .find(|(k, _)| *k == key as i16)
                .map_or_else(DurationSnapshot::default, |d| d.1)
        };
        Counters {
            at,
            bytes_in: s.kafka.bytes_in,
            bytes_out: s.kafka.bytes_out,
            fetches: s
                .kafka
                .apis
                .iter()
                .find(|a| a.0 == ApiKey::Fetch as i16)
                .map_or(0, |a| a.1),
            produce: durations(ApiKey::Produce),
            fetch: durations(ApiKey::Fetch),
        }
    }
}

impl History {
    pub fn new() -> History {
        History {
            started: Instant::now(),
            started_ms: now_ms(),
            ring: Mutex::default(),
        }
    }

    /// A history fed by a thread (`shoal-console`, returned for joining) that calls `gather`
    /// every `SAMPLE_EVERY`, the first time one interval after the start (a `None` answer skips
    /// the sample), until `stop` is set. A gather that takes longer than the interval (core 0
    /// slow to answer) is followed by half an interval's rest, never by another at once.
    pub fn spawn(
        gather: impl Fn() -> Option<Vec<CoreSnapshot>> + Send + 'static,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<(Arc<History>, std::thread::JoinHandle<()>)> {
        let history = Arc::new(History::new());
        let fed = history.clone();
        let thread = std::thread::Builder::new()
            .name("shoal-console".into())
            .spawn(move || {
                let mut next = Instant::now() + SAMPLE_EVERY;
                while !stop.load(Ordering::SeqCst) {
                    if Instant::now() < next {
                        std::thread::sleep(STOP_POLL.min(next - Instant::now()));
                        continue;
                    }
                    let planned = next + SAMPLE_EVERY;
                    if let Some(stats) = gather() {
                        fed.record(&stats, Instant::now(), now_ms());
                    }
                    next = planned.max(Instant::now() + SAMPLE_EVERY / 2);
                }
            })?;
        Ok((history, thread))
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    /// Takes a sample of `stats`, seen at `at` (`time_ms` on the wall clock).
    pub fn record(&self, stats: &[CoreSnapshot], at: Instant, time_ms: u64) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let cores = stats
            .iter()
            .map(|s| {
                let now = Counters::of(s, at);
                let before = ring.last.insert(s.core, now);
                CoreSample::between(s, before.as_ref(), &now)
            })
            .collect();
        let mut lag: Vec<(String, u64)> = stats
            .iter()
            .flat_map(|s| &s.group_lag)
            .map(|g| (g.group.clone(), g.lag_sum))
            .collect();
        lag.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        lag.truncate(MAX_GROUPS);
        ring.samples.push_back(Sample {
            time_ms,
            cores,
            lag,
        });
        while ring.samples.len() > KEPT {
            ring.samples.pop_front();
        }
    }

    /// The samples taken after `since_ms` (wall clock), oldest first, as JSON: each core's figures
    /// as an array in the order of `fields`.
    pub fn json_since(&self, since_ms: u64) -> Value {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let samples: Vec<Value> = ring
            .samples
            .iter()
            .filter(|s| s.time_ms > since_ms)
            .map(Sample::json)
            .collect();
        json!({
            "interval_ms": SAMPLE_EVERY.as_millis() as u64,
            "kept": KEPT,
            "fields": CoreSample::FIELDS,
            "samples": samples,
        })
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl Sample {
    fn json(&self) -> Value {
        json!({
            "time_ms": self.time_ms,
            "cores": self.cores.iter().map(CoreSample::json).collect::<Vec<_>>(),
            "lag": self.lag.iter().map(|(g, lag)| json!([g, lag])).collect::<Vec<_>>(),
        })
    }
}

impl CoreSample {
    const FIELDS: [&'static str; 7] = [
        "core",
        "bytes_in_per_s",
        "bytes_out_per_s",
        "fetch_responses_per_s",
        "fetch_connections",
        "produce_p99_ms",
        "fetch_p99_ms",
    ];

    fn between(s: &CoreSnapshot, before: Option<&Counters>, now: &Counters) -> CoreSample {
        let seconds = before.map_or(0.0, |b| now.at.duration_since(b.at).as_secs_f64());
        let rate = |read: fn(&Counters) -> u64| {
            before
                .filter(|_| seconds > 0.0)
                .map(|b| read(now).saturating_sub(read(b)) as f64 / seconds)
        };
        let p99 = |read: fn(&Counters) -> &DurationSnapshot| {
            let zero = DurationSnapshot::default();
            let b = before.map_or(&zero, read);
            quantile_ms(read(now), b, 0.99)
        };
        CoreSample {
            core: s.core,
            bytes_in: rate(|c| c.bytes_in),
            bytes_out: rate(|c| c.bytes_out),
            fetch_responses: rate(|c| c.fetches),
            fetch_connections: s.kafka.fetch_connections,
            produce_p99_ms: p99(|c| &c.produce),
            fetch_p99_ms: p99(|c| &c.fetch),
        }
    }

    fn json(&self) -> Value {
        let round = |v: Option<f64>, places: i32| {
            let scale = 10f64.powi(places);
            v.map(|v| (v * scale).round() / scale)
        };
        let whole = |v: Option<f64>| v.map(|v| v.round() as u64);
        json!([
            self.core,
            whole(self.bytes_in),
            whole(self.bytes_out),
            round(self.fetch_responses, 1),
            self.fetch_connections,
            round(self.produce_p99_ms, 3),
            round(self.fetch_p99_ms, 3),
        ])
    }
}

/// The `q` quantile, in milliseconds, of the durations recorded between `before` and `now`,
/// interpolated inside its bucket as Prometheus' `histogram_quantile` does (the last finite
/// bound for the open bucket); `None` if none were recorded.
fn quantile_ms(now: &DurationSnapshot, before: &DurationSnapshot, q: f64) -> Option<f64> {
    let counts: Vec<u64> = (0..now.buckets.len())
        .map(|i| now.buckets[i].saturating_sub(before.buckets[i]))
        .collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, &n) in counts.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let Some(&upper) = DURATION_BUCKETS_US.get(i) else {
                break;
            };
            let lower = if i == 0 {
                0
            } else {
                DURATION_BUCKETS_US[i - 1]
            };
            let within = (rank - below as f64) / n as f64;
            return Some((lower as f64 + within * (upper - lower) as f64) / 1000.0);
        }
        below += n;
    }
    Some(DURATION_BUCKETS_US[DURATION_BUCKETS_US.len() - 1] as f64 / 1000.0)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DurationHistogram;
    use crate::stats::kafka::FrontEndSnapshot;

    fn core(core: usize, bytes_in: u64, produce_us: &[u64]) -> CoreSnapshot {
        let h = DurationHistogram::default();
        for &us in produce_us {
            h.record(Duration::from_micros(us));
        }
        CoreSnapshot {
            core,
            kafka: FrontEndSnapshot {
                bytes_in,
                fetch_connections: 3,
                durations: vec![(0, h.snapshot())],
                ..FrontEndSnapshot::default()
            },
            ..CoreSnapshot::default()
        }
    }

    #[test]
    fn samples_carry_each_intervals_rates_and_latencies() {
        let h = History::new();
        let t0 = Instant::now();
        h.record(&[core(0, 1000, &[50; 10])], t0, 1_000);
        // 10,000 more bytes in 2 s; 100 produces more, 99 of them fast, one of 3 to 5 ms.
        let mut us = vec![50; 10 + 99];
        us.push(4_000);
        h.record(&[core(0, 11_000, &us)], t0 + Duration::from_secs(2), 3_000);
        let v = h.json_since(0);
        let samples = v["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(
            samples[0]["cores"][0][1],
            Value::Null,
            "no rate before a second sample"
        );
        let second = &samples[1]["cores"][0];
        assert_eq!(second[0], 0);
        assert_eq!(second[1], 5000);
        assert_eq!(second[4], 3);
        // The 99th of 100 durations lies in the first bucket (up to 0.1 ms).
        let p99 = second[5].as_f64().unwrap();
        assert!(p99 > 0.0 && p99 <= 0.1, "{p99}");
        assert_eq!(second[6], Value::Null, "no fetch answered");
        assert_eq!(h.json_since(1_000)["samples"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_ring_keeps_fifteen_minutes_and_the_most_lagging_groups() {
        let h = History::new();
        let t0 = Instant::now();
        for i in 0..(KEPT as u64 + 20) {
            let mut s = core(0, i * 100, &[]);
            s.group_lag = (0..(MAX_GROUPS as u64 + 5))
                .map(|g| crate::groups::lag::GroupLag {
                    group: format!("g{g:02}"),
                    lag_sum: g * 10,
                    lag_max: g,
                    time_lag_ms: None,
                    partitions: Vec::new(),
                })
                .collect();
            h.record(&[s], t0 + SAMPLE_EVERY * i as u32, 1 + i);
        }
        let v = h.json_since(0);
        let samples = v["samples"].as_array().unwrap();
        assert_eq!(samples.len(), KEPT);
        assert_eq!(samples[0]["time_ms"], 21);
        let lag = samples[KEPT - 1]["lag"].as_array().unwrap();
        assert_eq!(lag.len(), MAX_GROUPS);
        assert_eq!(lag[0], json!(["g14", 140]));
        // The bound the module's doc gives.
        assert_eq!(std::mem::size_of::<CoreSample>(), 96);
        assert_eq!(std::mem::size_of::<(String, u64)>(), 32);
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        let h = DurationHistogram::default();
        let zero = DurationSnapshot::default();
        assert_eq!(quantile_ms(&h.snapshot(), &zero, 0.99), None);
        for _ in 0..100 {
            h.record(Duration::from_micros(2_000)); // 1 to 2.5 ms
        }
        let p99 = quantile_ms(&h.snapshot(), &zero, 0.99).unwrap();
        assert!((p99 - 2.485).abs() < 1e-9, "{p99}");
        h.record(Duration::from_secs(60));
        let before = h.snapshot();
        h.record(Duration::from_secs(60));
        assert_eq!(quantile_ms(&h.snapshot(), &before, 0.99), Some(5000.0));
    }
}
