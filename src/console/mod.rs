//! The live console: one HTML page (`page.html`, compiled into the binary with its script and
//! styles, no external assets) that the admin endpoint serves at `GET /` and `GET /console`, and
//! the JSON it polls every few seconds (`GET /v1/console`), built here from the cores' snapshots
//! and the topic table.
//!
//! The JSON carries counters and gauges as they are; the page turns counters into rates between
//! two polls. The charts' last 15 minutes are kept here ([`History`], sampled by a thread of its
//! own) and sent from a time on (`history_since`). It stays small with many
//! partitions: topics are aggregated and paged (`topics_from`, `topics_limit`, `q` to filter by
//! name), partitions are listed for one topic at a time (`topic`, `from`, `limit`), and the edge's
//! upstream streams are capped. `docs/console.md` describes the page and the JSON.
//!
//! - `history` — the charts' samples: a bounded ring fed every few seconds.
//! - `sample`  — a large made-up cluster for the tests.

mod history;
#[cfg(test)]
mod sample;

use crate::stats::{CoreSnapshot, PartitionSnapshot};
use crate::table::TopicTable;
pub use history::History;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The page: HTML, CSS and script in one document.
pub const PAGE: &str = include_str!("page.html");
/// What `/` and `/console` answer without the admin token: a form that keeps it in a cookie.
pub const LOGIN_PAGE: &str = include_str!("login.html");

/// Rows per page, by default and at most.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;
/// Groups listed, the most lagging first.
const MAX_GROUPS: usize = 500;
/// Upstream streams listed in edge mode (the rest counted).
const MAX_STREAMS: usize = 200;

/// What the page asks for: a page of topics, and optionally one topic's partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleQuery {
    /// Only topics whose name contains this.
    pub filter: Option<String>,
    pub topics_from: usize,
    pub topics_limit: usize,
    /// The topic whose partitions are listed.
    pub topic: Option<String>,
    pub from: usize,
    pub limit: usize,
    /// The charts' samples taken after this time (ms since the epoch; 0 for all), if asked.
    pub history_since: Option<u64>,
}

impl ConsoleQuery {
    /// From a request target's query string (`/v1/console?topic=t&from=100`); unknown keys and
    /// bad numbers are ignored, limits are capped.
    pub fn parse(target: &str) -> ConsoleQuery {
        let mut q = ConsoleQuery {
            topics_limit: DEFAULT_LIMIT,
            limit: DEFAULT_LIMIT,
            ..ConsoleQuery::default()
        };
        let query = target.split_once('?').map_or("", |(_, q)| q);
        for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
            let value = percent_decode(value);
            let number = || value.parse::<usize>().ok();
            match key {
                "q" if !value.is_empty() => q.filter = Some(value.clone()),
                "topic" if !value.is_empty() => q.topic = Some(value.clone()),
                "topics_from" => q.topics_from = number().unwrap_or(0),
                "topics_limit" => q.topics_limit = number().unwrap_or(DEFAULT_LIMIT),
                "from" => q.from = number().unwrap_or(0),
                "limit" => q.limit = number().unwrap_or(DEFAULT_LIMIT),
                "history_since" => q.history_since = value.parse::<u64>().ok().or(Some(0)),
                _ => {}
            }
        }
        q.topics_limit = q.topics_limit.clamp(1, MAX_LIMIT);
        q.limit = q.limit.clamp(1, MAX_LIMIT);
        q
    }
}

/// `%XX` and `+` decoded (a query string, or the token cookie the login page writes with
/// `encodeURIComponent`); invalid escapes kept as they are.
pub fn percent_decode(s: &str) -> String {
    String::from_utf8_lossy(&crate::http::request::percent_decode_bytes(s)).into_owned()
}

/// What the console shows of the broker beside its cores' snapshots and the topic table.
#[derive(Debug, Clone, Copy)]
pub struct Broker<'a> {
    /// Kafka port of each core.
    pub ports: &'a [u16],
    /// The data directory, whose file system's free space is shown.
    pub data_dir: &'a Path,
    /// The charts' samples, and when the broker started.
    pub history: &'a History,
}

/// The console's JSON for the cores' snapshots and the topic table.
pub fn console_json(
    stats: &[CoreSnapshot],
    table: &TopicTable,
    broker: &Broker,
    query: &ConsoleQuery,
) -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let layout = Layout::new(stats, table, broker.ports.len());
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "time_ms": now_ms,
        "started_ms": broker.history.started_ms(),
        "uptime_seconds": broker.history.uptime().as_secs(),
        "disk": disk_json(broker.data_dir),
        "errors": errors_json(stats),
        "cores": stats.iter().map(|s| core_json(s, broker.ports)).collect::<Vec<_>>(),
        "topics": topics_json(&layout, table, query),
        "partitions": query.topic.as_deref().map(|t| partitions_json(&layout, table, t, query)),
        "groups": groups_json(stats),
        "edge": edge_json(stats),
        "history": query.history_since.map(|since| broker.history.json_since(since)),
    })
    .to_string()
}

/// The data directory's file system: its size and the bytes the broker may still write.
fn disk_json(dir: &Path) -> Value {
    let sizes = crate::kafka::handlers::describe_log_dirs::file_system_bytes(dir);
    json!({
        "path": dir,
        "total_bytes": sizes.map(|s| s.0),
        "free_bytes": sizes.map(|s| s.1),
    })
}

/// The errors counted since start, summed over the cores.
fn errors_json(stats: &[CoreSnapshot]) -> Value {
    let sum = |read: fn(&CoreSnapshot) -> u64| stats.iter().map(read).sum::<u64>();
    json!({
        "storage_errors": sum(|s| s.storage.errors),
        "failing_logs": sum(|s| s.storage.failing_logs),
        "handler_panics": sum(|s| s.kafka.handler_panics),
        "authentication_failures": sum(|s| s.kafka.authentication_failures),
        "tls_handshake_failures": sum(|s| s.kafka.tls_handshake_failures),
        "protocol_errors": sum(|s| s.kafka.protocol_errors),
    })
}

/// One core's figures: gauges as they are, counters for the page to turn into rates.
fn core_json(s: &CoreSnapshot, ports: &[u16]) -> Value {
    let requests = |key: kafka_protocol::messages::ApiKey| {
        s.kafka
            .apis
            .iter()
            .find(|(k, _, _)| *k == key as i16)
            .map_or(0, |a| a.1)
    };
    use kafka_protocol::messages::ApiKey;
    json!({
        "core": s.core,
        "port": ports.get(s.core),
        "busy_percent": s.busy_percent,
        "connections_open": s.kafka.connections_open,
        "fetch_connections": s.kafka.fetch_connections,
        "stream_subscribers": s.http.subscribers,
        "stream_frames_encoded": s.http.frames_encoded,
        "stream_frames_sent": s.http.frames_sent,
        "bytes_in": s.kafka.bytes_in,
        "bytes_out": s.kafka.bytes_out,
        "fetch_requests": requests(ApiKey::Fetch),
        "produce_requests": requests(ApiKey::Produce),
        "partitions": s.partitions.len(),
        "log_bytes": s.partitions.iter().map(|p| p.size_bytes).sum::<u64>(),
        "tail_cache_used_bytes": s.tail_cache.used_bytes,
        "tail_cache_capacity_bytes": s.tail_cache.capacity_bytes,
        "fetch_cache_bytes": s.coalescer.cached_bytes,
        "fetch_cache_entries": s.coalescer.cached_entries,
        "coalescing": s.coalescing,
        "log_reads": s.coalescer.reads,
        "reads_saved": s.coalescer.ready_hits + s.coalescer.inflight_hits,
        "read_replicas_held": s.replicas.held,
        "partitions_replicated": s.replicas.fed,
        "view_sharing": s.view_sharing,
        "view_readers": s.views.readers,
        "view_fetches": s.views.fetches_served,
        "view_batches_decoded": s.views.source_batches_decoded,
        "storage_errors": s.storage.errors,
        "failing_logs": s.storage.failing_logs,
        "handler_panics": s.kafka.handler_panics,
        "authentication_failures": s.kafka.authentication_failures,
        "tls_handshake_failures": s.kafka.tls_handshake_failures,
        "protocol_errors": s.kafka.protocol_errors,
        "groups_members": s.groups.members,
    })
}

/// Where each partition lives and who reads it: the owners' snapshots by (topic, partition),
/// replica cores, and fetch connections per core.
struct Layout<'a> {
    cores: usize,
    owned: HashMap<(&'a str, i32), (usize, &'a PartitionSnapshot)>,
    replicas: HashMap<(&'a str, i32), &'a [i32]>,
    /// Fetch connections per partition, by core.
    readers: HashMap<(&'a str, i32), BTreeMap<usize, u32>>,
    /// Distinct fetch connections per topic, summed over the cores (a connection is on one core).
    topic_readers: HashMap<&'a str, u64>,
    /// HTTP streams open per topic (its views' counted with it), over all cores.
    streams: HashMap<&'a str, u64>,
}

impl<'a> Layout<'a> {
    fn new(stats: &'a [CoreSnapshot], table: &TopicTable, cores: usize) -> Layout<'a> {
        let mut layout = Layout {
            cores,
            owned: HashMap::new(),
            replicas: HashMap::new(),
            readers: HashMap::new(),
            topic_readers: HashMap::new(),
            streams: HashMap::new(),
        };
        for s in stats {
            for p in &s.partitions {
                // In edge mode every core may hold a mirror; the owner's counts.
                let owner = table
                    .get(&p.topic)
                    .map_or(s.core, |m| table.owner(m, p.partition, cores));
                if owner == s.core {
                    layout
                        .owned
                        .insert((p.topic.as_str(), p.partition), (s.core, p));
                }
            }
            for (topic, partition, cores) in &s.replicas.replica_cores {
                layout
                    .replicas
                    .entry((topic.as_str(), *partition))
                    .or_insert(cores.as_slice());
            }
            for (topic, n) in &s.http.topics {
                let source = crate::table::source_topic(topic).unwrap_or(topic);
                *layout.streams.entry(source).or_default() += n;
            }
            for (topic, n) in &s.replicas.topic_fetch_connections {
                *layout.topic_readers.entry(topic.as_str()).or_default() += u64::from(*n);
            }
            for (topic, partition, n) in &s.replicas.fetch_connections {
                *layout
                    .readers
                    .entry((topic.as_str(), *partition))
                    .or_default()
                    .entry(s.core)
                    .or_default() += n;
            }
        }
        layout
    }

    fn consumers(&self, topic: &str, partition: i32) -> u64 {
        self.readers
            .get(&(topic, partition))
            .map_or(0, |by_core| by_core.values().map(|&n| u64::from(n)).sum())
    }
}

/// A page of topics, busiest (most consumers) first, each aggregated over its partitions.
fn topics_json(layout: &Layout, table: &TopicTable, q: &ConsoleQuery) -> Value {
    let mut rows: Vec<Value> = table
        .topics
        .iter()
        .filter(|(name, _)| q.filter.as_ref().is_none_or(|f| name.contains(f.as_str())))
        .map(|(name, m)| {
            let mut leaders: BTreeMap<usize, u32> = BTreeMap::new();
            let (mut hw, mut size, mut appended, mut replicated) = (0, 0, 0, 0);
            for p in 0..m.partitions {
                *leaders.entry(table.owner(m, p, layout.cores)).or_default() += 1;
                if let Some((_, s)) = layout.owned.get(&(name.as_str(), p)) {
                    hw += s.high_watermark.max(0);
                    size += s.size_bytes;
                    appended += s.appended_bytes;
                }
                replicated += u32::from(layout.replicas.contains_key(&(name.as_str(), p)));
            }
            json!({
                "name": name,
                "partitions": m.partitions,
                "leaders": leaders,
                "replicated_partitions": replicated,
                "high_watermark_sum": hw,
                "size_bytes": size,
                "appended_bytes": appended,
                "consumers": layout.topic_readers.get(name.as_str()).copied().unwrap_or(0),
                "stream_subscribers": layout.streams.get(name.as_str()).copied().unwrap_or(0),
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        b["consumers"]
            .as_u64()
            .cmp(&a["consumers"].as_u64())
            .then_with(|| a["name"].as_str().cmp(&b["name"].as_str()))
    });
    page(rows, q.topics_from, q.topics_limit)
}

/// One topic's partitions, a page of them, each with its owner, replicas, offsets, size, readers
/// per core and produced bytes.
fn partitions_json(layout: &Layout, table: &TopicTable, topic: &str, q: &ConsoleQuery) -> Value {
    let Some(m) = table.get(topic) else {
        return json!({ "topic": topic, "error": "no such topic" });
    };
    let rows = (0..m.partitions)
        .map(|p| {
            let owned = layout.owned.get(&(topic, p));
            json!({
                "partition": p,
                "leader": table.owner(m, p, layout.cores),
                "replica_cores": layout.replicas.get(&(topic, p)).copied().unwrap_or(&[]),
                "high_watermark": owned.map(|(_, s)| s.high_watermark),
                "last_stable_offset": owned.map(|(_, s)| s.last_stable_offset),
                "open_transactions": owned.map(|(_, s)| s.open_transactions),
                "log_start_offset": owned.map(|(_, s)| s.log_start_offset),
                "size_bytes": owned.map(|(_, s)| s.size_bytes),
                "appended_bytes": owned.map(|(_, s)| s.appended_bytes),
                "consumers": layout.consumers(topic, p),
                "consumers_by_core": layout.readers.get(&(topic, p)),
                "storage_failure": owned.and_then(|(_, s)| s.storage_failure.as_ref()),
            })
        })
        .collect();
    let mut out = page(rows, q.from, q.limit);
    out["topic"] = json!(topic);
    out
}

/// Every group with its coordinator core, protocol (`classic`, or `consumer` with its group
/// epoch), state, members and lag as last computed (`null` where
/// lag is not computed: no commits yet, lag turned off, or edge mode); the busiest lag first, at
/// most [`MAX_GROUPS`].
fn groups_json(stats: &[CoreSnapshot]) -> Value {
    let mut rows: Vec<Value> = stats
        .iter()
        .flat_map(|s| {
            s.group_list.iter().map(move |g| {
                let lag = s.group_lag.iter().find(|l| l.group == g.group);
                json!({
                    "group": g.group,
                    "core": s.core,
                    "state": g.state,
                    "protocol": if g.epoch.is_some() { "consumer" } else { "classic" },
                    "epoch": g.epoch,
                    "members": g.members,
                    "lag_sum": lag.map(|l| l.lag_sum),
                    "lag_max": lag.map(|l| l.lag_max),
                    "time_lag_seconds": lag.and_then(|l| l.time_lag_ms).map(|ms| ms as f64 / 1000.0),
                    "partitions": lag.map(|l| &l.partitions),
                })
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        b["lag_sum"]
            .as_u64()
            .cmp(&a["lag_sum"].as_u64())
            .then_with(|| a["group"].as_str().cmp(&b["group"].as_str()))
    });
    rows.truncate(MAX_GROUPS);
    Value::Array(rows)
}

/// Edge mode: each partition's upstream stream (position, the upstream's range, its last error),
/// at most [`MAX_STREAMS`]; `null` in `serve`.
fn edge_json(stats: &[CoreSnapshot]) -> Value {
    if stats.iter().all(|s| s.edge.is_none()) {
        return Value::Null;
    }
    let streams: Vec<Value> = stats
        .iter()
        .flat_map(|s| {
            s.partitions.iter().filter_map(move |p| {
                p.upstream.as_ref().map(|u| {
                    json!({
                        "core": s.core,
                        "topic": p.topic,
                        "partition": p.partition,
                        "high_watermark": p.high_watermark,
                        "upstream": u,
                    })
                })
            })
        })
        .collect();
    json!({
        "cores": stats
            .iter()
            .map(|s| json!({ "core": s.core, "stats": s.edge, "bytes_out": s.kafka.bytes_out }))
            .collect::<Vec<_>>(),
        "streams_total": streams.len(),
        "streams": streams.into_iter().take(MAX_STREAMS).collect::<Vec<_>>(),
    })
}

/// `rows[from..from + limit]` with the total, so the page can offer the next page.
fn page(rows: Vec<Value>, from: usize, limit: usize) -> Value {
    let total = rows.len();
    let items: Vec<Value> = rows.into_iter().skip(from).take(limit).collect();
    json!({ "total": total, "from": from, "limit": limit, "items": items })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_thousand_partitions_make_a_small_page() {
        let (cores, table) = sample::many_partitions(100, 100, 4);
        let history = History::new();
        history.record(&cores, std::time::Instant::now(), 1);
        let broker = Broker {
            ports: &[9092, 9093, 9094, 9095],
            data_dir: Path::new("/"),
            history: &history,
        };
        let text = console_json(&cores, &table, &broker, &ConsoleQuery::parse("/v1/console"));
        assert!(text.len() < 32 << 10, "{} bytes", text.len());
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["topics"]["total"], 100);
        assert_eq!(
            v["topics"]["items"].as_array().unwrap().len(),
            DEFAULT_LIMIT
        );
        // The read topic comes first, its figures summed over its 100 partitions.
        let first = &v["topics"]["items"][0];
        assert_eq!(first["name"], "topic-042");
        assert_eq!(first["consumers"], 5);
        assert_eq!(first["high_watermark_sum"], 1000);
        assert_eq!(first["size_bytes"], 10_000);
        assert_eq!(v["partitions"], Value::Null);
        assert_eq!(v["history"], Value::Null, "only when asked");
        assert!(
            v["disk"]["free_bytes"].as_i64().unwrap() > 0,
            "{}",
            v["disk"]
        );
        assert_eq!(v["errors"]["handler_panics"], 0);
        let q = ConsoleQuery::parse("/v1/console?topic=topic-042&from=5&limit=3&history_since=0");
        let text = console_json(&cores, &table, &broker, &q);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["history"]["samples"][0]["cores"]
                .as_array()
                .unwrap()
                .len(),
            4
        );
        let items = v["partitions"]["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[2]["partition"], 7);
        assert_eq!(items[2]["consumers"], 5);
        assert_eq!(
            items[2]["consumers_by_core"],
            serde_json::json!({"1": 3, "2": 2})
        );
    }

    #[test]
    fn queries_are_decoded_and_bounded() {
        let q = ConsoleQuery::parse("/v1/console?q=a%2Eb+c&topic=x%zz&limit=99999&from=-1&what=1");
        assert_eq!(q.filter.as_deref(), Some("a.b c"));
        assert_eq!(q.topic.as_deref(), Some("x%zz"));
        assert_eq!(q.limit, MAX_LIMIT);
        assert_eq!(q.from, 0);
        assert_eq!(q.topics_limit, DEFAULT_LIMIT);
        assert_eq!(ConsoleQuery::parse("/v1/console?limit=0").limit, 1);
        assert_eq!(q.history_since, None);
        let since = |t| ConsoleQuery::parse(t).history_since;
        assert_eq!(
            since("/v1/console?history_since=1700000000000"),
            Some(1_700_000_000_000)
        );
        assert_eq!(since("/v1/console?history_since="), Some(0));
        assert_eq!(percent_decode("%e2%82%ac%"), "€%");
    }
}
