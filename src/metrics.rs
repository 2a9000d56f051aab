//! Per-core counters, their plain snapshots (sent to core 0 for `/metrics`), and the Prometheus text.

use std::cell::Cell;
use std::fmt::Write;

/// Kafka API keys we count; index = API key.
pub const MAX_API_KEY: usize = 80;

pub use shards::latency::{DurationHistogram, DurationSnapshot, DURATION_BUCKETS_US};

#[derive(Debug)]
pub struct CoreMetrics {
    pub requests: Vec<Cell<u64>>,
    pub errors: Vec<Cell<u64>>,
    /// Per API key: from the request read to its response written (or handed to the next
    /// response's write, which sends both).
    pub durations: Vec<DurationHistogram>,
    pub bytes_in: Cell<u64>,
    pub bytes_out: Cell<u64>,
    /// Writes of response bytes to connections (pipelined responses ready together share one).
    pub response_writes: Cell<u64>,
    pub connections_open: Cell<u64>,
    pub connections_total: Cell<u64>,
    /// Open connections that have sent a Fetch (an edge in front of this broker keeps one per
    /// partition it serves, however many consumers read there).
    pub fetch_connections: Cell<u64>,
    pub protocol_errors: Cell<u64>,
    /// Requests whose handling panicked (each closed its connection).
    pub handler_panics: Cell<u64>,
    /// SASL authentications that succeeded, and that failed.
    pub authentications: Cell<u64>,
    pub authentication_failures: Cell<u64>,
    /// TLS handshakes that failed (untrusted or expired certificates, plaintext clients, timeouts).
    pub tls_handshake_failures: Cell<u64>,
    /// TLS connections whose records the kernel encrypts (kTLS), and those rustls encrypts.
    pub tls_kernel_connections: Cell<u64>,
    pub tls_user_space_connections: Cell<u64>,
    /// Record bytes fetches read from the log (coalesced reads count once).
    pub fetch_log_read_bytes: Cell<u64>,
    /// Record bytes put in fetch responses.
    pub fetch_response_bytes: Cell<u64>,
    /// Long polls that waited for fetch pacing after new data arrived, and the time they waited.
    pub fetch_paced: Cell<u64>,
    pub fetch_paced_us: Cell<u64>,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        Self {
            requests: (0..MAX_API_KEY).map(|_| Cell::new(0)).collect(),
            errors: (0..MAX_API_KEY).map(|_| Cell::new(0)).collect(),
            durations: (0..MAX_API_KEY)
                .map(|_| DurationHistogram::default())
                .collect(),
            bytes_in: Cell::new(0),
            bytes_out: Cell::new(0),
            response_writes: Cell::new(0),
            connections_open: Cell::new(0),
            connections_total: Cell::new(0),
            fetch_connections: Cell::new(0),
            protocol_errors: Cell::new(0),
            handler_panics: Cell::new(0),
            authentications: Cell::new(0),
            authentication_failures: Cell::new(0),
            tls_handshake_failures: Cell::new(0),
            tls_kernel_connections: Cell::new(0),
            tls_user_space_connections: Cell::new(0),
            fetch_log_read_bytes: Cell::new(0),
            fetch_response_bytes: Cell::new(0),
            fetch_paced: Cell::new(0),
            fetch_paced_us: Cell::new(0),
        }
    }
}

pub fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

impl CoreMetrics {
    pub fn request(&self, api_key: i16) {
        if let Some(c) = self.requests.get(api_key as usize) {
            add(c, 1);
        }
    }
    pub fn error(&self, api_key: i16) {
        if let Some(c) = self.errors.get(api_key as usize) {
            add(c, 1);
        }
    }
    pub fn duration(&self, api_key: i16, d: std::time::Duration) {
        if let Some(h) = self.durations.get(api_key as usize) {
            h.record(d);
        }
    }
}

/// One partition's figures.
#[derive(Debug, Clone)]
pub struct PartitionSnapshot {
    pub topic: String,
    pub partition: i32,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub size_bytes: u64,
    pub segments: usize,
    /// The storage failure the partition's log is in the middle of (appends fail), as first logged.
    pub storage_failure: Option<String>,
    /// Idempotent producers whose sequence state is kept.
    pub producer_ids: u64,
    /// Batch bytes appended since the log was opened.
    pub appended_bytes: u64,
    /// Writes to disk of grouped appends.
    pub writes: u64,
    /// fsyncs (group commits, flushes, segment seals).
    pub fsyncs: u64,
    /// Compaction passes, bytes of segments they rewrote, and bytes those became.
    pub compactions: u64,
    pub compacted_bytes: u64,
    pub compacted_to_bytes: u64,
    /// The first offset compaction has not reached yet (compacted topics).
    pub first_dirty_offset: i64,
    /// Edge mode: the partition's upstream position, once a consumer has asked for it.
    pub upstream: Option<FeedStatus>,
}

/// What the admin endpoint shows of edge mode (`crate::edge`) on one core.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EdgeStats {
    pub upstream: String,
    pub fetch_streams: u64,
    pub upstream_fetches: u64,
    pub upstream_bytes: u64,
    pub read_through: u64,
    pub read_through_bytes: u64,
    pub upstream_errors: u64,
}

/// One partition's upstream position, for `/v1/status`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct FeedStatus {
    pub fetching: bool,
    /// The next offset the fetcher asks for (the local high watermark).
    pub position: i64,
    /// The upstream's log start and high watermark as last seen (-1: not known).
    pub upstream_log_start_offset: i64,
    pub upstream_high_watermark: i64,
    pub last_error: Option<String>,
}

/// Everything one core reports, as plain data that can cross to core 0.
#[derive(Debug, Clone, Default)]
pub struct CoreSnapshot {
    pub core: usize,
    /// (API key, requests, errors) for keys with any traffic.
    pub apis: Vec<(i16, u64, u64)>,
    /// (API key, durations) for keys with any request answered.
    pub durations: Vec<(i16, DurationSnapshot)>,
    /// The storage device's write and fsync latencies, over every log of the core.
    pub device: shards::DeviceLatency,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub response_writes: u64,
    pub connections_open: u64,
    pub connections_total: u64,
    pub fetch_connections: u64,
    pub protocol_errors: u64,
    pub handler_panics: u64,
    pub authentications: u64,
    pub authentication_failures: u64,
    pub tls_handshake_failures: u64,
    pub tls_kernel_connections: u64,
    pub tls_user_space_connections: u64,
    pub tail_cache_used: u64,
    pub tail_cache_capacity: u64,
    pub tail_cache_hits: u64,
    pub tail_cache_misses: u64,
    pub coalescing: bool,
    pub view_sharing: bool,
    pub coalescer: shards::coalescer::CoalescerStats,
    pub fetch_log_read_bytes: u64,
    pub fetch_response_bytes: u64,
    pub fetch_paced: u64,
    pub fetch_paced_us: u64,
    /// The current fetch pacing delay (before the per-partition cap), in microseconds.
    pub fetch_pacing_delay_us: u64,
    /// Smoothed busy share of the core, in percent.
    pub busy_percent: u64,
    pub response_memory_bytes: u64,
    pub views: shards::view_reader::ViewStats,
    pub groups: crate::groups::GroupStats,
    /// Storage failures of every log on the core (partitions and group stores).
    pub storage: shards::StorageHealth,
    pub partitions: Vec<PartitionSnapshot>,
    /// Edge mode: the upstream fetchers' counters.
    pub edge: Option<EdgeStats>,
}

/// A duration histogram as Prometheus samples of `name` (cumulative buckets) with `labels`.
fn render_duration(out: &mut String, name: &str, labels: &str, d: &DurationSnapshot) {
    let mut below = 0;
    for (i, n) in d.buckets.iter().enumerate() {
        below += n;
        let le = DURATION_BUCKETS_US
            .get(i)
            .map_or("+Inf".to_string(), |us| format!("{}", *us as f64 / 1e6));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {below}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", d.sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {below}");
}

fn api_name(key: i16) -> String {
    kafka_protocol::messages::ApiKey::try_from(key)
        .map_or_else(|_| format!("api_{key}"), |k| format!("{k:?}"))
}

/// Which of a core's device histograms a family renders.
type DeviceHistogram = fn(&shards::DeviceLatency) -> &DurationSnapshot;

/// A per-core metric family: name suffix, type, help, and how to read it from a snapshot.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&CoreSnapshot) -> u64,
);

/// Renders all cores' snapshots as Prometheus text exposition.
pub fn render_prometheus(cores: &[CoreSnapshot]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP shoal_kafka_request_duration_seconds Time from a Kafka request read to its \
         response written (a fetch's long-poll wait included), by API.\n\
         # TYPE shoal_kafka_request_duration_seconds histogram"
    );
    for c in cores {
        for (key, d) in &c.durations {
            let labels = format!("core=\"{}\",api=\"{}\"", c.core, api_name(*key));
            render_duration(&mut out, "shoal_kafka_request_duration_seconds", &labels, d);
        }
    }
    let device: [(&str, &str, DeviceHistogram); 2] = [
        (
            "shoal_log_write_duration_seconds",
            "Time each write of grouped appends took on the storage device, from issue to \
             completion (acks=1 producers wait for it; O_DSYNC for acks=all groups).",
            |d| &d.writes,
        ),
        (
            "shoal_log_fsync_duration_seconds",
            "Time each fsync of the logs took: the periodic flush, group commit, a rolled \
             segment's seal, index files, directories.",
            |d| &d.fsyncs,
        ),
    ];
    for (name, help, of) in device {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for c in cores {
            render_duration(
                &mut out,
                name,
                &format!("core=\"{}\"", c.core),
                of(&c.device),
            );
        }
    }
    let mut family =
        |name: &str, kind: &str, help: &str, samples: &mut dyn Iterator<Item = (String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        };
    family(
        "shoal_kafka_requests_total",
        "counter",
        "Kafka requests handled, by API.",
        &mut cores.iter().flat_map(|c| {
            c.apis.iter().map(move |a| {
                (
                    format!("core=\"{}\",api=\"{}\"", c.core, api_name(a.0)),
                    a.1,
                )
            })
        }),
    );
    family(
        "shoal_kafka_request_errors_total",
        "counter",
        "Kafka requests that returned an error code for at least one item, by API.",
        &mut cores.iter().flat_map(|c| {
            c.apis.iter().map(move |a| {
                (
                    format!("core=\"{}\",api=\"{}\"", c.core, api_name(a.0)),
                    a.2,
                )
            })
        }),
    );
    let per_core = |f: fn(&CoreSnapshot) -> u64| {
        cores
            .iter()
            .map(move |c| (format!("core=\"{}\"", c.core), f(c)))
    };
    family(
        "shoal_bytes_in_total",
        "counter",
        "Request bytes received.",
        &mut per_core(|c| c.bytes_in),
    );
    family(
        "shoal_bytes_out_total",
        "counter",
        "Response bytes sent.",
        &mut per_core(|c| c.bytes_out),
    );
    family(
        "shoal_response_writes_total",
        "counter",
        "Writes of responses to connections: pipelined responses ready together go out in one.",
        &mut per_core(|c| c.response_writes),
    );
    family(
        "shoal_connections_open",
        "gauge",
        "Open Kafka connections.",
        &mut per_core(|c| c.connections_open),
    );
    family(
        "shoal_connections_total",
        "counter",
        "Kafka connections accepted.",
        &mut per_core(|c| c.connections_total),
    );
    family(
        "shoal_fetch_connections",
        "gauge",
        "Open Kafka connections that have sent a Fetch.",
        &mut per_core(|c| c.fetch_connections),
    );
    if cores.iter().any(|c| c.edge.is_some()) {
        let edge: [Family; 7] = [
            ("upstream_fetch_streams", "gauge", "Upstream fetchers running (one per partition being read at this edge).", |c| c.edge.as_ref().map_or(0, |e| e.fetch_streams)),
            ("upstream_fetches_total", "counter", "Fetches the upstream fetchers made.", |c| c.edge.as_ref().map_or(0, |e| e.upstream_fetches)),
            ("upstream_bytes_total", "counter", "Record bytes the upstream fetchers brought in (compare shoal_fetch_response_bytes_total: the fan-out saving).", |c| c.edge.as_ref().map_or(0, |e| e.upstream_bytes)),
            ("read_through_total", "counter", "Upstream fetches for consumers behind what the edge holds (each shared by every consumer asking).", |c| c.edge.as_ref().map_or(0, |e| e.read_through)),
            ("read_through_bytes_total", "counter", "Record bytes read-through fetches brought in.", |c| c.edge.as_ref().map_or(0, |e| e.read_through_bytes)),
            ("upstream_errors_total", "counter", "Upstream requests that failed (connects, timeouts, error codes).", |c| c.edge.as_ref().map_or(0, |e| e.upstream_errors)),
            ("cache_bytes", "gauge", "Bytes of upstream partitions kept on disk at the edge.", |c| c.partitions.iter().map(|p| p.size_bytes).sum()),
        ];
        for (suffix, kind, help, read) in edge {
            family(
                &format!("shoal_edge_{suffix}"),
                kind,
                help,
                &mut per_core(read),
            );
        }
    }
    family(
        "shoal_protocol_errors_total",
        "counter",
        "Connections closed for bad frames or requests.",
        &mut per_core(|c| c.protocol_errors),
    );
    family(
        "shoal_handler_panics_total",
        "counter",
        "Requests whose handling panicked; each closed its connection, the core went on serving.",
        &mut per_core(|c| c.handler_panics),
    );
    family(
        "shoal_sasl_authentications_total",
        "counter",
        "Connections that authenticated with SASL.",
        &mut per_core(|c| c.authentications),
    );
    family(
        "shoal_sasl_authentication_failures_total",
        "counter",
        "SASL authentications that failed (wrong password, unknown user, too many failures from the address, malformed tokens).",
        &mut per_core(|c| c.authentication_failures),
    );
    family(
        "shoal_tls_handshake_failures_total",
        "counter",
        "TLS handshakes on the Kafka listener that failed (untrusted or expired client certificates, plaintext clients, timeouts).",
        &mut per_core(|c| c.tls_handshake_failures),
    );
    family(
        "shoal_tls_kernel_connections_total",
        "counter",
        "TLS connections whose records the kernel encrypts and decrypts after the handshake (kTLS).",
        &mut per_core(|c| c.tls_kernel_connections),
    );
    family(
        "shoal_tls_user_space_connections_total",
        "counter",
        "TLS connections encrypted in user space by rustls (--tls-kernel off, or a kernel without kernel TLS).",
        &mut per_core(|c| c.tls_user_space_connections),
    );
    family(
        "shoal_partitions",
        "gauge",
        "Partitions owned.",
        &mut per_core(|c| c.partitions.len() as u64),
    );
    family(
        "shoal_storage_errors_total",
        "counter",
        "Storage operations that failed (log writes, fsyncs, segment rolls, index writes).",
        &mut per_core(|c| c.storage.errors),
    );
    family(
        "shoal_partitions_storage_failing",
        "gauge",
        "Logs (partitions, group stores) whose last storage operation failed: appends fail until one succeeds.",
        &mut per_core(|c| c.storage.failing_logs)
    );
    family(
        "shoal_producer_ids",
        "gauge",
        "Idempotent producers whose state is kept, summed over the core's partitions.",
        &mut per_core(|c| c.partitions.iter().map(|p| p.producer_ids).sum()),
    );
    family(
        "shoal_tail_cache_bytes",
        "gauge",
        "Memory held by the tail cache.",
        &mut per_core(|c| c.tail_cache_used),
    );
    family(
        "shoal_tail_cache_hits_total",
        "counter",
        "Reads served from the tail cache.",
        &mut per_core(|c| c.tail_cache_hits),
    );
    family(
        "shoal_tail_cache_misses_total",
        "counter",
        "Reads that went to disk.",
        &mut per_core(|c| c.tail_cache_misses),
    );
    let coalescer: [Family; 8] = [
        (
            "reads_total",
            "counter",
            "Reads run against the log for fetches.",
            |c| c.coalescer.reads,
        ),
        (
            "insertions_total",
            "counter",
            "Results cached under a new key.",
            |c| c.coalescer.insertions,
        ),
        (
            "reinsertions_total",
            "counter",
            "Stale results replaced by a new read.",
            |c| c.coalescer.reinsertions,
        ),
        (
            "ready_hits_total",
            "counter",
            "Fetches served from a fresh cached result.",
            |c| c.coalescer.ready_hits,
        ),
        (
            "inflight_hits_total",
            "counter",
            "Fetches that joined a read in flight.",
            |c| c.coalescer.inflight_hits,
        ),
        (
            "evictions_total",
            "counter",
            "Results that left the cache: for space, or because they can never be fresh again.",
            |c| c.coalescer.evictions,
        ),
        (
            "cached_bytes",
            "gauge",
            "Record bytes held by the cache.",
            |c| c.coalescer.cached_bytes,
        ),
        ("enabled", "gauge", "1 when fetch coalescing is on.", |c| {
            c.coalescing as u64
        }),
    ];
    for (name, kind, help, f) in coalescer {
        family(
            &format!("shoal_fetch_coalescer_{name}"),
            kind,
            help,
            &mut per_core(f),
        );
    }
    family(
        "shoal_fetch_log_read_bytes_total",
        "counter",
        "Record bytes fetches read from the log (a coalesced read counts once).",
        &mut per_core(|c| c.fetch_log_read_bytes),
    );
    family(
        "shoal_fetch_response_bytes_total",
        "counter",
        "Record bytes sent to consumers in fetch responses.",
        &mut per_core(|c| c.fetch_response_bytes),
    );
    let pacing: [Family; 4] = [
        (
            "shoal_fetch_paced_total",
            "counter",
            "Long polls that waited for fetch pacing after new data arrived (their core was busy).",
            |c| c.fetch_paced,
        ),
        (
            "shoal_fetch_paced_microseconds_total",
            "counter",
            "Time long polls waited for fetch pacing.",
            |c| c.fetch_paced_us,
        ),
        (
            "shoal_fetch_pacing_delay_microseconds",
            "gauge",
            "The core's current fetch pacing delay (capped per fetch by its partition's waiters and its max wait).",
            |c| c.fetch_pacing_delay_us,
        ),
        (
            "shoal_core_busy_percent",
            "gauge",
            "Smoothed share of the core's time spent running tasks.",
            |c| c.busy_percent,
        ),
    ];
    for (name, kind, help, f) in pacing {
        family(name, kind, help, &mut per_core(f));
    }
    family(
        "shoal_fetch_response_memory_bytes",
        "gauge",
        "Record bytes held by fetch responses not yet written (shared results counted once).",
        &mut per_core(|c| c.response_memory_bytes),
    );
    let views: [Family; 9] = [
        ("readers", "gauge", "Live view readers.", |c| {
            c.views.readers
        }),
        (
            "sharing_enabled",
            "gauge",
            "1 when view readers are shared (0: each view fetch decodes for itself).",
            |c| c.view_sharing as u64,
        ),
        (
            "source_batches_decoded_total",
            "counter",
            "Source batches decoded and split for views.",
            |c| c.views.source_batches_decoded,
        ),
        (
            "shard_batches_encoded_total",
            "counter",
            "Shard batches encoded for views.",
            |c| c.views.shard_batches_encoded,
        ),
        (
            "fetches_served_total",
            "counter",
            "Fetches of view partitions served.",
            |c| c.views.fetches_served,
        ),
        (
            "catch_up_reads_total",
            "counter",
            "View fetches served by their own read.",
            |c| c.views.catch_up_reads,
        ),
        (
            "catch_up_reads_shared_total",
            "counter",
            "View fetches served by another fetch's catch-up read of the same offset and size (any shard).",
            |c| c.views.catch_up_reads_shared,
        ),
        (
            "decode_errors_total",
            "counter",
            "Source batches views could not decode (skipped).",
            |c| c.views.decode_errors,
        ),
        (
            "decompressions_saved_total",
            "counter",
            "Compressed source batches split from the records decompressed when they were produced.",
            |c| c.views.decompressions_saved,
        ),
    ];
    for (name, kind, help, f) in views {
        family(&format!("shoal_view_{name}"), kind, help, &mut per_core(f));
    }
    family(
        "shoal_groups",
        "gauge",
        "Consumer groups coordinated, by state.",
        &mut cores.iter().flat_map(|c| {
            crate::groups::group::GroupState::ALL.iter().map(move |s| {
                (
                    format!("core=\"{}\",state=\"{}\"", c.core, s.name()),
                    c.groups.by_state[*s as usize],
                )
            })
        }),
    );
    family(
        "shoal_group_members",
        "gauge",
        "Members of the consumer groups coordinated.",
        &mut per_core(|c| c.groups.members),
    );
    family(
        "shoal_group_rebalances_total",
        "counter",
        "Rebalances started by the consumer groups coordinated.",
        &mut per_core(|c| c.groups.rebalances),
    );
    family(
        "shoal_group_offset_commits_total",
        "counter",
        "Partition offsets committed to the groups coordinated.",
        &mut per_core(|c| c.groups.offset_commits),
    );
    let per_partition = |f: fn(&PartitionSnapshot) -> u64| {
        cores.iter().flat_map(move |c| {
            c.partitions.iter().map(move |p| {
                (
                    format!(
                        "core=\"{}\",topic=\"{}\",partition=\"{}\"",
                        c.core, p.topic, p.partition
                    ),
                    f(p),
                )
            })
        })
    };
    family(
        "shoal_log_size_bytes",
        "gauge",
        "Bytes in a partition's log.",
        &mut per_partition(|p| p.size_bytes),
    );
    family(
        "shoal_log_segments",
        "gauge",
        "Segments in a partition's log.",
        &mut per_partition(|p| p.segments as u64),
    );
    family(
        "shoal_log_appended_bytes_total",
        "counter",
        "Batch bytes appended to a partition's log since it was opened.",
        &mut per_partition(|p| p.appended_bytes),
    );
    family(
        "shoal_log_writes_total",
        "counter",
        "Disk writes of a partition's log (appends that arrive together share one).",
        &mut per_partition(|p| p.writes),
    );
    family(
        "shoal_log_fsyncs_total",
        "counter",
        "fsyncs of a partition's log: group commits (shared by concurrent acks=all appends), flushes, segment seals.",
        &mut per_partition(|p| p.fsyncs),
    );
    family(
        "shoal_log_compactions_total",
        "counter",
        "Compaction passes of a compacted partition's log.",
        &mut per_partition(|p| p.compactions),
    );
    family(
        "shoal_log_compacted_bytes_total",
        "counter",
        "Bytes of segments compaction rewrote (the log cleaned).",
        &mut per_partition(|p| p.compacted_bytes),
    );
    family(
        "shoal_log_compacted_to_bytes_total",
        "counter",
        "Bytes the segments compaction rewrote became.",
        &mut per_partition(|p| p.compacted_to_bytes),
    );
    family(
        "shoal_log_high_watermark",
        "gauge",
        "Next offset of a partition.",
        &mut per_partition(|p| p.high_watermark.max(0) as u64),
    );
    family(
        "shoal_log_start_offset",
        "gauge",
        "First offset of a partition.",
        &mut per_partition(|p| p.log_start_offset.max(0) as u64),
    );
    family(
        "shoal_log_first_dirty_offset",
        "gauge",
        "First offset of a partition not compacted yet (the start offset for topics that are not compacted).",
        &mut per_partition(|p| p.first_dirty_offset.max(0) as u64),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn request_durations_render_as_a_cumulative_histogram() {
        let m = CoreMetrics::default();
        let produce = kafka_protocol::messages::ApiKey::Produce as i16;
        for us in [50, 100, 101, 900, 7_000_000] {
            m.duration(produce, Duration::from_micros(us));
        }
        m.duration(-1, Duration::from_micros(1)); // no such API: ignored
        let d = m.durations[produce as usize].snapshot();
        assert_eq!(d.count(), 5);
        let text = render_prometheus(&[CoreSnapshot {
            core: 3,
            durations: vec![(produce, d)],
            ..Default::default()
        }]);
        let sample = |series: &str| -> String {
            let line = text
                .lines()
                .find(|l| l.starts_with(series))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"));
            line.rsplit(' ').next().unwrap().to_string()
        };
        let bucket = |le: &str| {
            sample(&format!(
                "shoal_kafka_request_duration_seconds_bucket{{core=\"3\",api=\"Produce\",le=\"{le}\"}}"
            ))
        };
        // Bounds are inclusive (100 us is in the 100 us bucket) and buckets cumulative.
        assert_eq!(bucket("0.0001"), "2");
        assert_eq!(bucket("0.00025"), "3");
        assert_eq!(bucket("0.001"), "4");
        assert_eq!(bucket("5"), "4");
        assert_eq!(bucket("+Inf"), "5");
        let labels = "{core=\"3\",api=\"Produce\"}";
        assert_eq!(
            sample(&format!(
                "shoal_kafka_request_duration_seconds_count{labels}"
            )),
            "5"
        );
        assert_eq!(
            sample(&format!("shoal_kafka_request_duration_seconds_sum{labels}")),
            "7.001151"
        );
        assert_eq!(
            text.matches("# TYPE shoal_kafka_request_duration_seconds histogram")
                .count(),
            1
        );
    }
}

/// A populated snapshot of two cores (every figure non-zero on core 0; core 1 without edge mode)
/// and the text the renderer gave for it before the rendering was split by component.
#[cfg(test)]
mod golden {
    use super::*;
    use std::time::Duration;

    fn histogram(us: &[u64]) -> DurationSnapshot {
        let h = DurationHistogram::default();
        for &u in us {
            h.record(Duration::from_micros(u));
        }
        h.snapshot()
    }

    fn partition(topic: &str, index: i32, n: u64, upstream: bool) -> PartitionSnapshot {
        PartitionSnapshot {
            topic: topic.to_string(),
            partition: index,
            high_watermark: 1000 + n as i64,
            log_start_offset: 10 + n as i64,
            size_bytes: 4096 * n,
            segments: 2 + n as usize,
            storage_failure: Some("disk full".to_string()),
            producer_ids: 3 + n,
            appended_bytes: 5000 + n,
            writes: 40 + n,
            fsyncs: 20 + n,
            compactions: 1 + n,
            compacted_bytes: 700 + n,
            compacted_to_bytes: 300 + n,
            first_dirty_offset: 500 + n as i64,
            upstream: upstream.then(|| FeedStatus {
                fetching: true,
                position: 1000,
                upstream_log_start_offset: 5,
                upstream_high_watermark: 1200,
                last_error: None,
            }),
        }
    }

    pub(crate) fn populated() -> Vec<CoreSnapshot> {
        (0..2usize)
            .map(|core| {
                let n = core as u64 + 1;
                CoreSnapshot {
                    core,
                    apis: vec![(0, 100 * n, 3 * n), (1, 200 * n, n), (99, n, 0)],
                    durations: vec![
                        (0, histogram(&[50, 100, 101, 900, 7_000_000])),
                        (1, histogram(&[20_000, 300 * n])),
                        (99, histogram(&[1])),
                    ],
                    device: shards::DeviceLatency {
                        writes: histogram(&[200, 200_000, 30 * n]),
                        fsyncs: histogram(&[2_000, 9_000 * n]),
                    },
                    bytes_in: 11 * n,
                    bytes_out: 12 * n,
                    response_writes: 13 * n,
                    connections_open: 14 * n,
                    connections_total: 15 * n,
                    fetch_connections: 16 * n,
                    protocol_errors: 17 * n,
                    handler_panics: 18 * n,
                    authentications: 19 * n,
                    authentication_failures: 20 * n,
                    tls_handshake_failures: 21 * n,
                    tls_kernel_connections: 22 * n,
                    tls_user_space_connections: 23 * n,
                    tail_cache_used: 24 * n,
                    tail_cache_capacity: 25 * n,
                    tail_cache_hits: 26 * n,
                    tail_cache_misses: 27 * n,
                    coalescing: core == 0,
                    view_sharing: core == 0,
                    coalescer: shards::coalescer::CoalescerStats {
                        insertions: 28 * n,
                        reinsertions: 29 * n,
                        ready_hits: 30 * n,
                        inflight_hits: 31 * n,
                        evictions: 32 * n,
                        cached_bytes: 33 * n,
                        cached_entries: 34 * n,
                        reads: 35 * n,
                    },
                    fetch_log_read_bytes: 36 * n,
                    fetch_response_bytes: 37 * n,
                    fetch_paced: 38 * n,
                    fetch_paced_us: 39 * n,
                    fetch_pacing_delay_us: 40 * n,
                    busy_percent: 41 * n,
                    response_memory_bytes: 42 * n,
                    views: shards::view_reader::ViewStats {
                        readers: 43 * n,
                        source_batches_decoded: 44 * n,
                        shard_batches_encoded: 45 * n,
                        fetches_served: 46 * n,
                        catch_up_reads: 47 * n,
                        decode_errors: 48 * n,
                        decompressions_saved: 49 * n,
                        catch_up_reads_shared: 50 * n,
                    },
                    groups: crate::groups::GroupStats {
                        by_state: [51 * n, 52 * n, 53 * n, 54 * n, 55 * n],
                        members: 56 * n,
                        rebalances: 57 * n,
                        offset_commits: 58 * n,
                    },
                    storage: shards::StorageHealth {
                        errors: 59 * n,
                        failing_logs: 60 * n,
                    },
                    partitions: vec![
                        partition("a", 0, n, core == 0),
                        partition("b", 3, n + 10, false),
                    ],
                    edge: (core == 0).then(|| EdgeStats {
                        upstream: "up:9092".to_string(),
                        fetch_streams: 61,
                        upstream_fetches: 62,
                        upstream_bytes: 63,
                        read_through: 64,
                        read_through_bytes: 65,
                        upstream_errors: 66,
                    }),
                }
            })
            .collect()
    }

    #[test]
    fn metrics_text_is_unchanged() {
        let text = render_prometheus(&populated());
        if std::env::var_os("SHOAL_BLESS_METRICS").is_some() {
            std::fs::write(
                concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics_golden.txt"),
                &text,
            )
            .unwrap();
        }
        assert_eq!(
            families(&text),
            families(include_str!("metrics_golden.txt"))
        );
    }

    /// The text's metric families (each its HELP and TYPE lines and samples, in order), sorted by
    /// name: the exposition format leaves the order of families free.
    fn families(text: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for line in text.lines() {
            if line.starts_with("# HELP ") || out.is_empty() {
                out.push(String::new());
            }
            let family = out.last_mut().unwrap();
            family.push_str(line);
            family.push('\n');
        }
        out.sort();
        out
    }
}
