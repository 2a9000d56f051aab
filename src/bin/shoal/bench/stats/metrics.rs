//! shoal's `/metrics` text parsed into samples, and its figures over an interval between two
//! scrapes: storage device, fetch (coalescer, fan-out), shard views.

use serde::Serialize;
use std::collections::HashMap;

pub(super) fn parse_metrics(body: &str) -> HashMap<String, f64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
            parse_metrics(&shoal::stats::render_prometheus(&cores, false))
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
}
