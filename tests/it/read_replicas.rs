//! Read replicas between cores (issue 36, KIP-392) against the real binary with real clients: on
//! `shoal serve --cores 2` a hot partition stays led by the core that owns it, Metadata lists the
//! other core in `replicas` and `isr`, and a consumer's Fetch to the owner may name the other core
//! as `preferred_read_replica`, which librdkafka (and kafka-python 3) then fetch from. Every test
//! checks exactly what each consumer received (offset, key, value, headers, timestamp) while
//! replicas serve: 64 consumers at the tail and more from the start over sealed segments, a kill -9
//! and restart, a compaction swap, retention, a topic deleted, a topic grown, the policy switched
//! live and per topic, the `auto` policy, and an edge node.
//!
//! What the broker must offer: the flags `--read-replicas all|auto|off` and
//! `--read-replica-min-consumers N` (on `serve` and `edge`), `PUT /v1/config/read_replicas`, the
//! topic config `shoal.read.replicas`, the metrics `shoal_read_replicas`,
//! `shoal_replica_handover_batches_total`, `shoal_replica_handover_bytes_total`,
//! `shoal_fetch_redirects_total` and `shoal_partition_fetch_connections`, and `replica_cores` in
//! `/v1/status`.

use crate::common;

use common::python::run_script;
use common::records::Rec;
use common::wire::{call, connect, topic_name};
use common::{free_port_run, shoal_command, Shoal};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse};
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders, Timestamp};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shards::partitioner::shard_of;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Record `i`'s create time is this plus `i` ms: the time the test process first asked, so that
/// records are recent (retention by time and producer expiry, which go by record times, leave
/// them alone) and the same wherever they are compared.
fn base_ts() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.expect("a clock after 1970").as_millis() as i64
    })
}

/// A key space where no two records share a key (topics that are not compacted).
const UNIQUE_KEYS: usize = usize::MAX;

// Kafka's error codes the raw fetches expect.
const NONE: i16 = 0;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;

// ---------------------------------------------------------------------------------------------
// The broker

/// Fails the test, saying why, where `shoal COMMAND` does not offer `flags`: then the feature is
/// missing, and every test would otherwise fail later with a start-up timeout.
fn require_flags(command: &str, flags: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([command, "--help"])
        .output()
        .expect("shoal runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = flags
        .iter()
        .copied()
        .filter(|f| !help.contains(&format!("{f} <")))
        .collect();
    assert!(
        missing.is_empty(),
        "`shoal {command}` offers no {missing:?}: read replicas between cores (issue 36) are \
         not in this binary"
    );
}

/// `shoal serve --cores 2 --read-replicas POLICY` on free ports, with `extra` flags.
fn start_broker(data_dir: &Path, policy: &str, extra: &[&str]) -> Shoal {
    start_broker_on(data_dir, "127.0.0.1:0", policy, extra)
}

/// Same, core 0 on `listen` (core 1 on its port + 1).
fn start_broker_on(data_dir: &Path, listen: &str, policy: &str, extra: &[&str]) -> Shoal {
    require_flags(
        "serve",
        &["--read-replicas", "--read-replica-min-consumers"],
    );
    let args = [&["--read-replicas", policy][..], extra].concat();
    Shoal::start_on(data_dir, 2, listen, &args)
}

/// Switches the broker's read replica policy live (`PUT /v1/config/read_replicas`).
fn set_policy(node: &Shoal, policy: &str) {
    let (status, body) = node.admin_request("PUT", "/v1/config/read_replicas", policy);
    assert_eq!(
        status, "HTTP/1.1 200 OK",
        "PUT /v1/config/read_replicas {policy}: {body}"
    );
}

/// Retries `attempt` every 50 ms until it returns `Ok`, for at most `timeout`; then fails the test
/// naming `what` and the last reason `attempt` gave.
fn wait_for<T>(what: &str, timeout: Duration, mut attempt: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match attempt() {
            Ok(t) => return t,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out ({timeout:?}) waiting for {what}; last: {why}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics and status

/// One sample of a Prometheus metric: its labels and its value.
struct Sample {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// `line` as a sample of `name`, if it is one.
fn parse_sample(line: &str, name: &str) -> Option<Sample> {
    let rest = line.strip_prefix(name)?;
    let (labels, value) = match rest.strip_prefix('{') {
        Some(r) => r.split_once("} ")?,
        None => ("", rest.strip_prefix(' ')?),
    };
    let labels = labels
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.trim_matches('"').to_string()))
        })
        .collect();
    let value = value.trim().parse().ok()?;
    Some(Sample { labels, value })
}

/// The sum of `name` over the samples of `/metrics` that carry every label of `labels` (in any
/// order); 0 where none does. Panics if shoal does not export `name` at all, so that a missing
/// metric cannot pass for a zero.
fn metric(node: &Shoal, name: &str, labels: &[(&str, &str)]) -> u64 {
    let (status, body) = node.admin_get("/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "/metrics: {body}");
    let samples: Vec<Sample> = body.lines().filter_map(|l| parse_sample(l, name)).collect();
    assert!(
        !samples.is_empty() || body.contains(&format!("# TYPE {name} ")),
        "shoal exports no metric {name} in /metrics"
    );
    let sum: f64 = samples
        .iter()
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).is_some_and(|have| have == v))
        })
        .map(|s| s.value)
        .sum();
    sum as u64
}

/// `name` on one core.
fn core_metric(node: &Shoal, name: &str, core: usize) -> u64 {
    metric(node, name, &[("core", &core.to_string())])
}

/// Connections on `core` that fetched `topic`/`partition` in the last 10 seconds.
fn fetch_connections(node: &Shoal, core: usize, topic: &str, partition: i32) -> u64 {
    metric(
        node,
        "shoal_partition_fetch_connections",
        &[
            ("core", &core.to_string()),
            ("topic", topic),
            ("partition", &partition.to_string()),
        ],
    )
}

/// Fetch answers (all cores) that named a preferred read replica.
fn redirects(node: &Shoal) -> u64 {
    metric(node, "shoal_fetch_redirects_total", &[])
}

/// Replica partitions held, all cores together.
fn replicas_held(node: &Shoal) -> u64 {
    metric(node, "shoal_read_replicas", &[])
}

/// Waits until the cores hold `n` replica partitions in all.
fn wait_for_replicas_held(node: &Shoal, n: u64) {
    wait_for(
        &format!("{n} replica partitions held"),
        Duration::from_secs(20),
        || match replicas_held(node) {
            held if held == n => Ok(()),
            held => Err(format!("{held} held")),
        },
    );
}

/// The `replica_cores` `/v1/status` gives `topic`/`partition`: those of the object in it that names
/// that topic and partition (`"topic"`, `"partition"`) and has `"replica_cores"`.
fn status_replica_cores(node: &Shoal, topic: &str, partition: i32) -> Result<Vec<u64>, String> {
    fn find<'a>(
        v: &'a serde_json::Value,
        topic: &str,
        partition: i32,
    ) -> Option<&'a serde_json::Value> {
        match v {
            serde_json::Value::Object(o) => {
                let here = o.get("topic").and_then(|t| t.as_str()) == Some(topic)
                    && o.get("partition").and_then(|p| p.as_i64()) == Some(partition.into());
                match o.get("replica_cores") {
                    Some(cores) if here => Some(cores),
                    _ => o.values().find_map(|v| find(v, topic, partition)),
                }
            }
            serde_json::Value::Array(a) => a.iter().find_map(|v| find(v, topic, partition)),
            _ => None,
        }
    }
    let (status, body) = node.admin_get("/v1/status");
    assert_eq!(status, "HTTP/1.1 200 OK", "/v1/status: {body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("/v1/status is JSON");
    let cores = find(&json, topic, partition).ok_or_else(|| {
        format!("no entry for {topic}/{partition} with \"replica_cores\" in /v1/status: {body}")
    })?;
    serde_json::from_value(cores.clone()).map_err(|e| format!("replica_cores {cores}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Topics and their placement

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

fn admin_options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

/// Waits for an admin request's answer; fails the test, naming `what`, if the request or any of
/// its per-resource results failed.
fn admin_call<T, E: std::fmt::Debug>(
    what: &str,
    request: impl std::future::Future<Output = rdkafka::error::KafkaResult<Vec<Result<T, E>>>>,
) {
    let results = futures_lite::future::block_on(request)
        .unwrap_or_else(|e| panic!("{what}: not answered: {e}"));
    for r in results {
        if let Err(e) = r {
            panic!("{what}: {e:?}");
        }
    }
}

/// Creates `topic` with `partitions` partitions and topic configs `configs`.
fn create_topic(bootstrap: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let new = configs.iter().fold(
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
        |t, (k, v)| t.set(k, v),
    );
    admin_call(
        &format!("creating {topic} with {configs:?}"),
        admin(bootstrap).create_topics([&new], &admin_options()),
    );
}

fn delete_topic(bootstrap: &str, topic: &str) {
    admin_call(
        &format!("deleting {topic}"),
        admin(bootstrap).delete_topics(&[topic], &admin_options()),
    );
}

/// Grows `topic` to `count` partitions (CreatePartitions).
fn grow_topic(bootstrap: &str, topic: &str, count: usize) {
    admin_call(
        &format!("growing {topic} to {count} partitions"),
        admin(bootstrap).create_partitions([&NewPartitions::new(topic, count)], &admin_options()),
    );
}

/// Sets topic config `key` of `topic` (AlterConfigs).
fn alter_topic_config(bootstrap: &str, topic: &str, key: &str, value: &str) {
    let change = AlterConfig::new(ResourceSpecifier::Topic(topic)).set(key, value);
    admin_call(
        &format!("setting {key}={value} on {topic}"),
        admin(bootstrap).alter_configs([&change], &admin_options()),
    );
}

/// A client for Metadata requests.
fn metadata_client(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client")
}

/// A partition's place as Metadata gives it: its leader (the owner core), replicas and ISR.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    leader: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
}

impl Placement {
    /// The owner core and the other one (of two).
    fn cores(&self) -> Cores {
        let owner = self.leader as usize;
        Cores {
            owner,
            other: 1 - owner,
        }
    }
}

/// The two cores of `shoal serve --cores 2` as one partition sees them.
#[derive(Debug, Clone, Copy)]
struct Cores {
    owner: usize,
    other: usize,
}

/// `topic`'s partitions as Metadata lists them, by partition id.
fn placements(client: &BaseConsumer, topic: &str) -> Result<Vec<Placement>, String> {
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or("the topic is not in the answer")?;
    if let Some(e) = t.error() {
        return Err(format!("{:?}", RDKafkaErrorCode::from(e)));
    }
    let mut parts: Vec<_> = t.partitions().iter().collect();
    parts.sort_by_key(|p| p.id());
    Ok(parts
        .into_iter()
        .map(|p| Placement {
            leader: p.leader(),
            replicas: p.replicas().to_vec(),
            isr: p.isr().to_vec(),
        })
        .collect())
}

/// Waits until Metadata lists `partitions` partitions of `topic`, each with the other core as a
/// read replica (`replicated`: replicas and ISR are [leader, other core]) or without (both are
/// [leader]); returns them.
fn expect_placements(
    client: &BaseConsumer,
    topic: &str,
    partitions: usize,
    replicated: bool,
) -> Vec<Placement> {
    let what = format!(
        "Metadata to list {partitions} partitions of {topic}, {}",
        if replicated {
            "each with replicas and isr [leader, other core]"
        } else {
            "each with replicas and isr [leader] only"
        }
    );
    wait_for(&what, Duration::from_secs(20), || {
        let got = placements(client, topic)?;
        let right = got.len() == partitions
            && got.iter().all(|p| {
                let want = if replicated {
                    vec![p.leader, 1 - p.leader]
                } else {
                    vec![p.leader]
                };
                (0..2).contains(&p.leader) && p.replicas == want && p.isr == want
            });
        right.then_some(got.clone()).ok_or(format!("{got:?}"))
    })
}

/// Creates a one-partition topic (with `configs`) on a broker whose policy gives it a replica, and
/// waits for Metadata to list it; returns its owner and other core.
fn create_replicated(node: &Shoal, topic: &str, configs: &[(&str, &str)]) -> Cores {
    create_topic(&node.bootstrap(), topic, 1, configs);
    expect_placements(&metadata_client(&node.bootstrap()), topic, 1, true)[0].cores()
}

/// Waits until a connection on `core` has fetched `topic`/`partition` (in the last 10 s).
fn wait_for_readers_on(node: &Shoal, core: usize, topic: &str, partition: i32) {
    wait_for(
        &format!("a connection on core {core} fetching {topic}/{partition}"),
        Duration::from_secs(30),
        || match fetch_connections(node, core, topic, partition) {
            0 => Err("none".into()),
            _ => Ok(()),
        },
    );
}

/// Waits until consumers of `topic`/`partition` were redirected (some fetch answer named a
/// preferred read replica) and fetch from its other core.
fn wait_for_replica_readers(node: &Shoal, topic: &str, partition: i32, cores: Cores) {
    wait_for(
        "a fetch answered with a preferred read replica",
        Duration::from_secs(30),
        || match redirects(node) {
            0 => Err("no redirect".into()),
            _ => Ok(()),
        },
    );
    wait_for_readers_on(node, cores.other, topic, partition);
}

// ---------------------------------------------------------------------------------------------
// Records

/// The records of these tests: produced as [`Rec::nth`], delivered by librdkafka ([`Rec::of`]) or
/// kafka-python ([`Rec::of_json`]).
impl Rec {
    /// Record number `i` of a test, stored at `partition`/`offset`: key `k-<i mod keys>`, a value
    /// whose length and bytes vary with `i`, a header `i` holding `i`, create time [`base_ts`] + i.
    fn nth(partition: i32, offset: i64, i: usize, keys: usize) -> Rec {
        let value = format!("v{i}:")
            .into_bytes()
            .into_iter()
            .chain((0..i % 113).map(|j| (i ^ (j * 7)) as u8))
            .collect();
        Rec {
            partition,
            offset,
            key: Some(format!("k-{}", i % keys).into_bytes()),
            value: Some(value),
            headers: vec![("i".to_string(), Some(i.to_string().into_bytes()))],
            timestamp: Timestamp::CreateTime(base_ts() + i as i64),
        }
    }

    /// A record as `read_partition.py` printed it (bytes in hex).
    fn of_json(partition: i32, j: &serde_json::Value) -> Rec {
        let bytes = |v: &serde_json::Value| {
            v.as_str().map(|s| {
                (0..s.len())
                    .step_by(2)
                    .map(|k| u8::from_str_radix(&s[k..k + 2], 16).expect("hex"))
                    .collect()
            })
        };
        let ts = j["timestamp"].as_i64().expect("a timestamp");
        Rec {
            partition,
            offset: j["offset"].as_i64().expect("an offset"),
            key: bytes(&j["key"]),
            value: bytes(&j["value"]),
            headers: j["headers"]
                .as_array()
                .expect("headers")
                .iter()
                .map(|h| (h[0].as_str().unwrap().to_string(), bytes(&h[1])))
                .collect(),
            timestamp: match j["timestamp_type"].as_i64() {
                Some(0) => Timestamp::CreateTime(ts),
                Some(1) => Timestamp::LogAppendTime(ts),
                _ => Timestamp::NotAvailable,
            },
        }
    }

    /// The `i` the record was produced as (its header).
    fn index(&self) -> usize {
        let (_, v) = self.headers.first().expect("header i");
        std::str::from_utf8(v.as_deref().unwrap())
            .unwrap()
            .parse()
            .unwrap()
    }
}

/// Checks that `got` is exactly `want`: the same records, each partition's in offset order, no
/// gap, no repeat, nothing else.
fn check_exactly(who: &str, got: &[Rec], want: &[Rec]) {
    // Per partition, in delivery order (a consumer of several partitions interleaves them).
    let mut got = got.to_vec();
    got.sort_by_key(|r| r.partition);
    if let Some(k) = (0..got.len().min(want.len())).find(|&k| got[k] != want[k]) {
        panic!(
            "{who}: delivery {k} is\n  {:?}\nnot\n  {:?}",
            got[k], want[k]
        );
    }
    assert_eq!(
        got.len(),
        want.len(),
        "{who}: {} records delivered, {} expected (last delivered {:?}, last expected {:?})",
        got.len(),
        want.len(),
        got.last().map(|r| (r.partition, r.offset)),
        want.last().map(|r| (r.partition, r.offset)),
    );
}

/// Each acknowledged record: (partition, offset, i); and each record that failed, with why.
#[derive(Clone, Default)]
struct Acks(
    Arc<Mutex<Vec<(i32, i64, usize)>>>,
    Arc<Mutex<Vec<(usize, String)>>>,
);

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = usize;
    fn delivery(&self, result: &DeliveryResult<'_>, i: usize) {
        match result {
            Ok(m) => self.0.lock().unwrap().push((m.partition(), m.offset(), i)),
            Err((e, _)) => self.1.lock().unwrap().push((i, e.to_string())),
        }
    }
}

/// An idempotent acks=all producer of [`Rec::nth`] records, keeping their acknowledgements.
struct Writer {
    producer: ThreadedProducer<Acks>,
    acks: Acks,
    keys: usize,
}

impl Writer {
    fn new(bootstrap: &str, keys: usize) -> Writer {
        let acks = Acks::default();
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            // Batches fit the small segments the tests use (a batch is at most one segment).
            .set("batch.size", "4096")
            .set("message.timeout.ms", "60000")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "500")
            .create_with_context(acks.clone())
            .expect("producer");
        Writer {
            producer,
            acks,
            keys,
        }
    }

    /// Queues record `i` for `topic`/`partition`, waiting while the queue is full.
    fn send(&self, topic: &str, partition: i32, i: usize) {
        let r = Rec::nth(partition, -1, i, self.keys);
        let headers = r.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: v.as_deref(),
            })
        });
        let key = r.key.as_deref().unwrap();
        let value = r.value.as_deref().unwrap();
        let mut record = BaseRecord::with_opaque_to(topic, i)
            .partition(partition)
            .key(key)
            .payload(value)
            .headers(headers)
            .timestamp(base_ts() + i as i64);
        while let Err((e, back)) = self.producer.send(record) {
            assert_eq!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::QueueFull),
                "produce failed: {e}"
            );
            record = back;
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits (at most 60 s) for every queued record's acknowledgement; fails the test if any
    /// record failed.
    fn flush(&self) {
        self.producer
            .flush(Duration::from_secs(60))
            .expect("every record acknowledged within 60 s");
        let failed = self.acks.1.lock().unwrap();
        assert!(
            failed.is_empty(),
            "{} records failed, e.g. {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
    }

    /// Produces records `range` to `topic`/`partition` and waits for their acknowledgements.
    fn produce(&self, topic: &str, partition: i32, range: std::ops::Range<usize>) {
        for i in range {
            self.send(topic, partition, i);
        }
        self.flush();
    }

    /// The records acknowledged so far, as the broker must hold them: by partition, in offset
    /// order.
    fn acknowledged(&self) -> Vec<Rec> {
        let mut acks = self.acks.0.lock().unwrap().clone();
        acks.sort_unstable();
        acks.into_iter()
            .map(|(p, o, i)| Rec::nth(p, o, i, self.keys))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Consumers

/// What one consumer has received so far.
#[derive(Default)]
struct Seen {
    records: Vec<Rec>,
    errors: Vec<(Option<RDKafkaErrorCode>, String)>,
    /// The highest high watermark a fetch answer told it (librdkafka's cached watermark).
    high_watermark: i64,
}

/// A librdkafka consumer without a group (`assign`) on a thread of its own, keeping everything it
/// receives until finished.
struct Reader {
    name: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// Starts a consumer of `assignment` (topic, partition, where to start) with librdkafka's
    /// defaults (which follow preferred read replicas) and `extra` settings.
    fn start(
        name: &str,
        bootstrap: &str,
        assignment: &[(&str, i32, Offset)],
        extra: &[(&str, &str)],
    ) -> Reader {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("group.id", name)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "100")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "500");
        for (k, v) in extra {
            config.set(*k, *v);
        }
        let consumer: BaseConsumer = config.create().expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, from) in assignment {
            tpl.add_partition_offset(topic, *partition, *from).unwrap();
        }
        consumer.assign(&tpl).expect("assign");
        let watched: Vec<(CString, i32)> = assignment
            .iter()
            .map(|(t, p, _)| (CString::new(*t).unwrap(), *p))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            // A bound of its own, should the test fail without stopping it.
            let deadline = Instant::now() + Duration::from_secs(240);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let polled = consumer.poll(Duration::from_millis(50));
                    let high = watched
                        .iter()
                        .filter_map(|(t, p)| cached_high_watermark(&consumer, t, *p))
                        .max();
                    let mut seen = seen.lock().unwrap();
                    seen.high_watermark = seen.high_watermark.max(high.unwrap_or(-1));
                    match polled {
                        Some(Ok(m)) => seen.records.push(Rec::of(&m)),
                        Some(Err(e)) => seen.errors.push((e.rdkafka_error_code(), e.to_string())),
                        None => {}
                    }
                }
            })
        };
        Reader {
            name: name.to_string(),
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().records.len()
    }

    fn last_offset(&self) -> Option<i64> {
        self.seen.lock().unwrap().records.last().map(|r| r.offset)
    }

    fn errors(&self) -> Vec<(Option<RDKafkaErrorCode>, String)> {
        self.seen.lock().unwrap().errors.clone()
    }

    fn high_watermark(&self) -> i64 {
        self.seen.lock().unwrap().high_watermark
    }

    /// Stops and closes the consumer; what it received.
    fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().expect("consumer thread");
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The high watermark librdkafka last learned for `topic`/`partition` from a fetch answer.
fn cached_high_watermark(consumer: &BaseConsumer, topic: &CString, partition: i32) -> Option<i64> {
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client handle lives as long as `consumer`; `topic` is a NUL-terminated string
    // and the outputs are locals. librdkafka only reads its own cached offsets.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}

/// `n` readers named `<prefix>-<k>`, all of `assignment`.
fn start_readers(
    prefix: &str,
    n: usize,
    bootstrap: &str,
    assignment: &[(&str, i32, Offset)],
    extra: &[(&str, &str)],
) -> Vec<Reader> {
    (0..n)
        .map(|k| Reader::start(&format!("{prefix}-{k}"), bootstrap, assignment, extra))
        .collect()
}

/// Waits until every reader has at least `n` records; the message names the laggards.
fn wait_for_records(what: &str, readers: &[Reader], n: usize, timeout: Duration) {
    wait_for(what, timeout, || {
        let behind: Vec<(&str, usize)> = readers
            .iter()
            .map(|r| (r.name.as_str(), r.count()))
            .filter(|(_, c)| *c < n)
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        let first = readers.iter().find(|r| r.name == behind[0].0).unwrap();
        Err(format!(
            "{} of {} consumers have fewer than {n} records: {:?}; {}'s errors: {:?}",
            behind.len(),
            readers.len(),
            &behind[..behind.len().min(8)],
            first.name,
            first.errors()
        ))
    })
}

/// Waits until the last record every reader received is at `offset` (a compacted partition's
/// consumers get fewer records than were produced, but always the last one).
fn wait_for_last_offset(what: &str, readers: &[Reader], offset: i64) {
    wait_for(
        &format!("{what} to reach offset {offset}"),
        Duration::from_secs(60),
        || match readers.iter().find(|r| r.last_offset() != Some(offset)) {
            None => Ok(()),
            Some(r) => Err(format!("{} is at {:?}", r.name, r.last_offset())),
        },
    );
}

/// Stops every reader (a moment after the last wait, so that anything extra would have arrived)
/// and checks that each got exactly `want`.
fn finish_exactly(what: &str, readers: Vec<Reader>, want: &[Rec]) {
    std::thread::sleep(Duration::from_millis(300));
    for r in readers {
        let name = r.name.clone();
        let seen = r.finish();
        check_exactly(
            &format!("{what}: {name} (errors {:?})", seen.errors),
            &seen.records,
            want,
        );
    }
}

/// Reads `topic`/`partition` from `from` to `end` with kafka-python (`read_partition.py`) on a
/// thread of its own; joined, it gives the records kafka-python delivered.
fn kafka_python_reader(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    from: i64,
    end: i64,
) -> JoinHandle<Vec<Rec>> {
    let args: Vec<String> = vec![
        bootstrap.into(),
        topic.into(),
        partition.to_string(),
        from.to_string(),
        end.to_string(),
        "60".into(),
    ];
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdout = run_script("read_partition.py", &args);
        stdout
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .filter(|j| j.get("offset").is_some())
            .map(|j| Rec::of_json(partition, &j))
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// Raw fetches, straight to one core

/// One Fetch (v12, as a consumer: replica id -1, no session) of `topic`/`partition` at `offset`,
/// sent straight to the core on `port`: that partition's answer, and how long it took.
fn raw_fetch(
    port: u16,
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
) -> (PartitionData, Duration) {
    let request = FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])]);
    let mut s = connect(port);
    let started = Instant::now();
    let response: FetchResponse = call(&mut s, ApiKey::Fetch, 12, 1, &request);
    let took = started.elapsed();
    let p = response
        .responses
        .into_iter()
        .flat_map(|t| t.partitions)
        .find(|p| p.partition_index == partition)
        .expect("the partition is answered");
    (p, took)
}

/// The first batch's base offset and the last whole batch's last offset in a Fetch answer's records.
fn batch_offsets(records: &[u8]) -> Option<(i64, i64)> {
    let (mut first, mut last, mut rest) = (None, None, records);
    while let Some(n) = shards::batch::peek_total_len(rest).filter(|n| *n <= rest.len()) {
        let h = shards::batch::BatchHeader::parse(&rest[..n]).expect("a batch header");
        first.get_or_insert(h.base_offset);
        last = Some(h.last_offset());
        rest = &rest[n..];
    }
    Some((first?, last?))
}

/// Asserts that a raw fetch at `port` answers `code` (and names no preferred read replica).
fn expect_fetch_error(port: u16, topic: &str, partition: i32, offset: i64, code: i16, what: &str) {
    let (p, _) = raw_fetch(port, topic, partition, offset, 0);
    assert_eq!(
        (p.error_code, p.preferred_read_replica.0),
        (code, -1),
        "{what}: a fetch of {topic}/{partition} at {offset} on port {port}"
    );
}

// ---------------------------------------------------------------------------------------------
// The tests

/// 64 librdkafka consumers of one partition on `--read-replicas all` are spread over both cores
/// (the other core holds at least 40% of the partition's fetch connections) and each gets exactly
/// the records produced while they wait at the tail; consumers that start later from offset 0
/// read several sealed segments, librdkafka's and kafka-python's alike, and get exactly the same.
#[test]
fn sixty_four_consumers_of_one_partition_are_spread_over_both_cores_and_get_every_record() {
    const TOPIC: &str = "hot";
    const TAIL: usize = 64;
    const CATCH_UP: usize = 16;
    const RECORDS: usize = 3000;
    const MORE: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--segment-bytes", "32KiB", "--metrics-per-partition"];
    let shoal = start_broker(dir.path(), "all", &flags);
    let bootstrap = shoal.bootstrap();
    let cores = create_replicated(&shoal, TOPIC, &[]);
    let hot = [(TOPIC, 0, Offset::Beginning)];

    let tail = start_readers("tail", TAIL, &bootstrap, &hot, &[]);
    let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
    writer.produce(TOPIC, 0, 0..RECORDS);
    wait_for_records(
        "the records produced while 64 consumers wait at the tail",
        &tail,
        RECORDS,
        Duration::from_secs(60),
    );
    // Spread by load: once the owner core's connections that were redirected have not fetched
    // there for 10 s, the other core holds about half of them.
    let (on_owner, on_other) = wait_for(
        "the other core to hold at least 40% of the partition's fetch connections",
        Duration::from_secs(40),
        || {
            let owner = fetch_connections(&shoal, cores.owner, TOPIC, 0);
            let other = fetch_connections(&shoal, cores.other, TOPIC, 0);
            let spread = other * 10 >= (owner + other) * 4 && owner + other >= TAIL as u64;
            spread.then_some((owner, other)).ok_or(format!(
                "owner core {}: {owner}, other core {}: {other}",
                cores.owner, cores.other
            ))
        },
    );
    eprintln!("fetch connections: owner {on_owner}, other {on_other}");
    assert!(
        redirects(&shoal) > 0,
        "no fetch named a preferred read replica"
    );
    assert_eq!(
        (
            core_metric(&shoal, "shoal_read_replicas", cores.owner),
            core_metric(&shoal, "shoal_read_replicas", cores.other)
        ),
        (0, 1),
        "replica partitions held by (owner core, other core)"
    );
    for counter in [
        "shoal_replica_handover_batches_total",
        "shoal_replica_handover_bytes_total",
    ] {
        assert!(
            core_metric(&shoal, counter, cores.other) > 0,
            "{counter} on core {}",
            cores.other
        );
    }
    assert_eq!(
        status_replica_cores(&shoal, TOPIC, 0),
        Ok(vec![cores.other as u64])
    );
    let segments = metric(
        &shoal,
        "shoal_log_segments",
        &[("core", &cores.owner.to_string()), ("topic", TOPIC)],
    );
    assert!(
        segments >= 4,
        "{segments} segments: the catch-up reads need sealed ones"
    );

    // Later consumers from offset 0, over the sealed segments.
    let catch_up = start_readers("catch-up", CATCH_UP, &bootstrap, &hot, &[]);
    let python: Vec<_> = (0..2)
        .map(|_| kafka_python_reader(&bootstrap, TOPIC, 0, 0, RECORDS as i64))
        .collect();
    wait_for_records(
        "the catch-up consumers to read from offset 0",
        &catch_up,
        RECORDS,
        Duration::from_secs(60),
    );
    // And records produced while every consumer waits at the tail.
    writer.produce(TOPIC, 0, RECORDS..RECORDS + MORE);
    let want = writer.acknowledged();
    let readers: Vec<Reader> = tail.into_iter().chain(catch_up).collect();
    wait_for_records(
        "the last records, at the tail",
        &readers,
        RECORDS + MORE,
        Duration::from_secs(60),
    );
    finish_exactly("librdkafka", readers, &want);
    for (k, py) in python.into_iter().enumerate() {
        let got = py.join().expect("kafka-python reader");
        check_exactly(&format!("kafka-python {k}"), &got, &want[..RECORDS]);
    }
    shoal.stop();
}

/// Records produced without a pause from a thread of their own (record `i` to partition 0).
struct Load {
    writer: Arc<Writer>,
    stop: Arc<AtomicBool>,
    /// The next `i` to send: every record with a smaller `i` was sent before it was read.
    next: Arc<AtomicUsize>,
    thread: JoinHandle<()>,
}

impl Load {
    fn start(bootstrap: &str, topic: &'static str) -> Load {
        let writer = Arc::new(Writer::new(bootstrap, UNIQUE_KEYS));
        let (stop, next) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let thread = {
            let (writer, stop, next) = (writer.clone(), stop.clone(), next.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let i = next.load(Ordering::SeqCst);
                    writer.send(topic, 0, i);
                    next.store(i + 1, Ordering::SeqCst);
                    if i % 10 == 9 {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        };
        Load {
            writer,
            stop,
            next,
            thread,
        }
    }

    fn acknowledged(&self) -> usize {
        self.writer.acks.0.lock().unwrap().len()
    }

    /// Stops sending and waits for every acknowledgement.
    fn stop(self) -> Arc<Writer> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("load thread");
        self.writer.flush();
        self.writer
    }
}

/// Reads `topic`/`partition` from offset 0 to its high watermark with a fresh consumer: the log as
/// the broker holds it now. Checks that its offsets run from 0 without a gap.
fn read_log(bootstrap: &str, topic: &str) -> Vec<Rec> {
    let (_, high) = metadata_client(bootstrap)
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("ListOffsets answered");
    let reader = Reader::start(
        "log-check",
        bootstrap,
        &[(topic, 0, Offset::Beginning)],
        &[],
    );
    wait_for_records(
        "the whole log",
        std::slice::from_ref(&reader),
        high as usize,
        Duration::from_secs(60),
    );
    let mut log = reader.finish().records;
    log.truncate(high as usize);
    let offsets: Vec<i64> = log.iter().map(|r| r.offset).collect();
    assert!(
        offsets.iter().copied().eq(0..high),
        "the log's offsets are not 0..{high}"
    );
    log
}

/// kill -9 of the broker while a producer (acks=all) writes and consumers read through the replica
/// core, and a restart on the same data and ports, twice: the consumers resume exactly where they
/// were, and afterwards the log holds every record any consumer received, every acknowledged record
/// at the offset its acknowledgement named, and below the highest high watermark any consumer was
/// told before a kill only records sent before that kill.
#[test]
fn a_kill_9_mid_run_loses_nothing_a_consumer_was_served() {
    const TOPIC: &str = "durable";
    const READERS: usize = 16;
    const KILLS: usize = 2;
    const FLAGS: [&str; 2] = ["--segment-bytes", "64KiB"];
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let mut shoal = start_broker_on(dir.path(), &listen, "all", &FLAGS);
    let cores = create_replicated(&shoal, TOPIC, &[]);
    let readers = start_readers(
        "durable",
        READERS,
        &listen,
        &[(TOPIC, 0, Offset::Beginning)],
        &[],
    );
    let load = Load::start(&listen, TOPIC);
    // Per kill: the highest high watermark a consumer was told before it, and the next `i`
    // the producer would send when it happened.
    let mut kills = Vec::new();
    for round in 0..=KILLS {
        let acked = load.acknowledged();
        let least = readers.iter().map(Reader::count).min().unwrap();
        wait_for(
            &format!("round {round}: 300 more records acknowledged and read by every consumer"),
            Duration::from_secs(40),
            || {
                let (now, slowest) = (
                    load.acknowledged(),
                    readers.iter().map(Reader::count).min().unwrap(),
                );
                if now >= acked + 300 && slowest >= least + 300 {
                    Ok(())
                } else {
                    Err(format!(
                        "{now} acknowledged, the slowest consumer has {slowest}"
                    ))
                }
            },
        );
        // The first process redirected consumers; after a restart those already on the replica
        // core may simply reconnect to it.
        if round == 0 {
            wait_for_replica_readers(&shoal, TOPIC, 0, cores);
        } else {
            wait_for_readers_on(&shoal, cores.other, TOPIC, 0);
        }
        if round == KILLS {
            break;
        }
        shoal.kill_hard();
        let next = load.next.load(Ordering::SeqCst);
        // Each consumer's thread notes the watermark of a fetch answer at its next poll.
        std::thread::sleep(Duration::from_millis(200));
        let high = readers.iter().map(Reader::high_watermark).max().unwrap();
        kills.push((high, next));
        shoal = start_broker_on(dir.path(), &listen, "all", &FLAGS);
        assert_eq!(
            shoal.ports,
            [port, port + 1],
            "round {round}: the same ports"
        );
    }
    let writer = load.stop();
    let log = read_log(&listen, TOPIC);
    for (o, i, want) in writer
        .acks
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|&(p, o, i)| (o, i, Rec::nth(p, o, i, UNIQUE_KEYS)))
    {
        assert_eq!(
            log.get(o as usize),
            Some(&want),
            "record {i}, acknowledged at offset {o}"
        );
    }
    for (k, (high, next)) in kills.iter().enumerate() {
        assert!(
            *high >= 0 && *high <= log.len() as i64,
            "kill {k}: consumers were told a high watermark of {high}; the log ends at {}",
            log.len()
        );
        // `next` was read after the kill; record `next` itself may have been queued just before.
        if let Some(r) = log[..*high as usize].iter().find(|r| r.index() > *next) {
            panic!(
                "kill {k}: offset {} (below the high watermark {high} consumers were told) \
                 holds record {}, sent after the kill (past {next}): what was there was lost",
                r.offset,
                r.index()
            );
        }
    }
    wait_for_records(
        "every consumer to reach the end of the log",
        &readers,
        log.len(),
        Duration::from_secs(60),
    );
    finish_exactly("after two kills", readers, &log);
    shoal.stop();
}

/// Checks what a consumer of a compacted partition received against what was produced (`sent`, by
/// offset): offsets only grow, every record is the one produced at its offset, and the latest
/// record of every key is there. Returns how many records it received.
fn check_compacted(who: &str, got: &[Rec], sent: &[Rec], latest: &BTreeSet<i64>) -> usize {
    for w in got.windows(2) {
        assert!(
            w[0].offset < w[1].offset,
            "{who}: offset {} after {}",
            w[1].offset,
            w[0].offset
        );
    }
    for r in got {
        assert_eq!(
            Some(r),
            sent.get(r.offset as usize),
            "{who}: the record at offset {}",
            r.offset
        );
    }
    let have: BTreeSet<i64> = got.iter().map(|r| r.offset).collect();
    let missing: Vec<&i64> = latest.difference(&have).collect();
    assert!(
        missing.is_empty(),
        "{who}: the latest records of some keys are missing, at offsets {missing:?}"
    );
    got.len()
}

/// A compacted topic with small segments is compacted (segments swapped) while consumers read it
/// through the replica core: every consumer gets only records produced at the offsets it sees them
/// at, in order, with the latest value of every key; consumers starting after the compaction get
/// fewer records than were produced.
#[test]
fn a_compaction_swap_under_replica_readers_keeps_every_keys_latest_record() {
    const TOPIC: &str = "compacted";
    const KEYS: usize = 40;
    const RECORDS: usize = 4000;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "all", &["--metrics-per-partition"]);
    let bootstrap = shoal.bootstrap();
    let configs = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "8192"),
        ("min.cleanable.dirty.ratio", "0.01"),
    ];
    let cores = create_replicated(&shoal, TOPIC, &configs);
    let from_start = [(TOPIC, 0, Offset::Beginning)];
    let tail = start_readers("compacted-tail", 8, &bootstrap, &from_start, &[]);
    let writer = Writer::new(&bootstrap, KEYS);
    let compactions = || metric(&shoal, "shoal_log_compactions_total", &[("topic", TOPIC)]);
    let mut passes = 0;
    // Half, a compaction pass, the other half read while more passes swap segments.
    for half in [0..RECORDS / 2, RECORDS / 2..RECORDS] {
        let end = half.end as i64;
        writer.produce(TOPIC, 0, half);
        wait_for_replica_readers(&shoal, TOPIC, 0, cores);
        passes = wait_for(
            "a compaction pass",
            Duration::from_secs(30),
            || match compactions() {
                n if n > passes => Ok(n),
                n => Err(format!("{n} passes")),
            },
        );
        wait_for_last_offset("the tail consumers", &tail, end - 1);
    }
    let sent = writer.acknowledged();
    let latest: BTreeSet<i64> = {
        let mut by_key = BTreeMap::new();
        for r in &sent {
            by_key.insert(r.key.clone(), r.offset);
        }
        by_key.into_values().collect()
    };
    let catch_up = start_readers("compacted-late", 4, &bootstrap, &from_start, &[]);
    wait_for_last_offset("the late consumers", &catch_up, RECORDS as i64 - 1);
    std::thread::sleep(Duration::from_millis(300));
    for r in tail {
        let name = r.name.clone();
        check_compacted(&name, &r.finish().records, &sent, &latest);
    }
    for r in catch_up {
        let name = r.name.clone();
        let n = check_compacted(&name, &r.finish().records, &sent, &latest);
        assert!(
            n < RECORDS,
            "{name} read {n} of {RECORDS} records after compaction: nothing was compacted away"
        );
    }
    shoal.stop();
}

/// Retention drops the oldest segments of a partition while consumers read it through the replica
/// core: they get every record; the replica core answers as the leader would (OFFSET_OUT_OF_RANGE
/// below the new log start and past the end, records from the log start, a long poll at the end);
/// consumers asking for offset 0 afterwards start at the log start with `auto.offset.reset`
/// earliest and get an error with `error`.
#[test]
fn retention_under_replica_readers_moves_the_log_start_on_both_cores() {
    const TOPIC: &str = "retained";
    const RECORDS: usize = 3000;
    const CHUNK: usize = 250;
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--retention-check-ms", "100", "--metrics-per-partition"];
    let shoal = start_broker(dir.path(), "all", &flags);
    let bootstrap = shoal.bootstrap();
    let configs = [("segment.bytes", "16384"), ("retention.bytes", "65536")];
    let cores = create_replicated(&shoal, TOPIC, &configs);
    let tail = start_readers(
        "retained-tail",
        8,
        &bootstrap,
        &[(TOPIC, 0, Offset::Beginning)],
        &[],
    );
    let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
    // In chunks the consumers read before the next, so that none falls behind retention.
    for from in (0..RECORDS).step_by(CHUNK) {
        writer.produce(TOPIC, 0, from..from + CHUNK);
        wait_for_records(
            "a chunk at the tail",
            &tail,
            from + CHUNK,
            Duration::from_secs(30),
        );
    }
    wait_for_replica_readers(&shoal, TOPIC, 0, cores);
    let owner = cores.owner.to_string();
    let log_start = || {
        metric(
            &shoal,
            "shoal_log_start_offset",
            &[("core", &owner), ("topic", TOPIC)],
        ) as i64
    };
    let start = wait_for(
        "retention to drop the oldest segments, and settle",
        Duration::from_secs(20),
        || {
            let before = log_start();
            std::thread::sleep(Duration::from_millis(500));
            match log_start() {
                now if now > 0 && now == before => Ok(now),
                now => Err(format!("log start {before}, then {now}")),
            }
        },
    );
    let end = RECORDS as i64;
    let replica_port = shoal.ports[cores.other];
    // The replica core learns the new log start from the owner: a moment after it, it answers
    // as the leader does.
    wait_for(
        "the replica core to answer below the log start, past the end and at the log start as \
         the leader does",
        Duration::from_secs(10),
        || {
            let error_at = |offset| raw_fetch(replica_port, TOPIC, 0, offset, 0).0.error_code;
            let (p, _) = raw_fetch(replica_port, TOPIC, 0, start, 0);
            let got = (
                error_at(0),
                error_at(end + 100),
                p.error_code,
                p.preferred_read_replica.0,
                p.high_watermark,
                p.log_start_offset,
                batch_offsets(p.records.as_deref().unwrap_or_default()).map(|(f, _)| f),
            );
            let want = (
                OFFSET_OUT_OF_RANGE,
                OFFSET_OUT_OF_RANGE,
                NONE,
                -1,
                end,
                start,
                Some(start),
            );
            (got == want).then_some(()).ok_or(format!(
                "(error below, error past the end; at the log start: error, preferred read \
                 replica, high watermark, log start, first batch) {got:?}"
            ))
        },
    );
    let (p, took) = raw_fetch(replica_port, TOPIC, 0, end, 500);
    assert_eq!(
        (
            p.error_code,
            p.high_watermark,
            batch_offsets(p.records.as_deref().unwrap_or_default())
        ),
        (NONE, end, None),
        "a fetch at the end on the replica core"
    );
    assert!(
        took >= Duration::from_millis(400),
        "the replica core long-polled only {took:?}"
    );

    let want = writer.acknowledged();
    let late = start_readers(
        "retained-late",
        3,
        &bootstrap,
        &[(TOPIC, 0, Offset::Offset(0))],
        &[],
    );
    let strict = Reader::start(
        "retained-strict",
        &bootstrap,
        &[(TOPIC, 0, Offset::Offset(0))],
        &[("auto.offset.reset", "error")],
    );
    wait_for_records(
        "the late consumers",
        &late,
        RECORDS - start as usize,
        Duration::from_secs(30),
    );
    wait_for(
        "the consumer with auto.offset.reset=error to get an error",
        Duration::from_secs(20),
        || {
            let errors = strict.errors();
            errors
                .iter()
                .any(|(code, _)| *code == Some(RDKafkaErrorCode::AutoOffsetReset))
                .then_some(())
                .ok_or(format!("{errors:?}"))
        },
    );
    assert_eq!(strict.finish().records, vec![], "auto.offset.reset=error");
    finish_exactly(
        "from offset 0 after retention",
        late,
        &want[start as usize..],
    );
    finish_exactly("at the tail", tail, &want);
    shoal.stop();
}

/// A topic is deleted while consumers read it through the replica core: they see it go
/// (UNKNOWN_TOPIC_OR_PARTITION), neither core serves it any more, its replica is dropped, and
/// consumers of another topic keep getting every record.
#[test]
fn a_topic_deleted_under_replica_readers_goes_and_others_are_still_served() {
    const RECORDS: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "all", &["--auto-create-topics", "false"]);
    let bootstrap = shoal.bootstrap();
    let extra = [
        ("topic.metadata.propagation.max.ms", "1000"),
        ("topic.metadata.refresh.interval.ms", "1000"),
    ];
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for topic in ["doomed", "kept"] {
        let cores = create_replicated(&shoal, topic, &[]);
        let these = start_readers(
            topic,
            6,
            &bootstrap,
            &[(topic, 0, Offset::Beginning)],
            &extra,
        );
        let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
        writer.produce(topic, 0, 0..RECORDS);
        wait_for_records(topic, &these, RECORDS, Duration::from_secs(30));
        wait_for_replica_readers(&shoal, topic, 0, cores);
        readers.push(these);
        writers.push(writer);
    }
    assert_eq!(replicas_held(&shoal), 2, "one replica of each topic");
    let kept_readers = readers.pop().unwrap();
    let doomed_readers = readers.pop().unwrap();

    delete_topic(&bootstrap, "doomed");
    let meta = metadata_client(&bootstrap);
    wait_for(
        "the deleted topic to leave Metadata",
        Duration::from_secs(20),
        || match placements(&meta, "doomed") {
            Err(e) if e.contains("UnknownTopic") || e.contains("not in the answer") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    wait_for_replicas_held(&shoal, 1);
    for port in &shoal.ports {
        expect_fetch_error(*port, "doomed", 0, 0, UNKNOWN_TOPIC_OR_PARTITION, "deleted");
    }
    let gone = [
        RDKafkaErrorCode::UnknownTopicOrPartition,
        RDKafkaErrorCode::UnknownPartition,
        RDKafkaErrorCode::UnknownTopic,
    ];
    for r in &doomed_readers {
        wait_for(
            &format!("{} to see its topic go", r.name),
            Duration::from_secs(30),
            || {
                let errors = r.errors();
                errors
                    .iter()
                    .any(|(code, _)| code.is_some_and(|c| gone.contains(&c)))
                    .then_some(())
                    .ok_or(format!("errors {errors:?}"))
            },
        );
    }
    finish_exactly(
        "the deleted topic's consumers",
        doomed_readers,
        &writers[0].acknowledged(),
    );
    writers[1].produce("kept", 0, RECORDS..2 * RECORDS);
    wait_for_records(
        "the other topic's consumers after the deletion",
        &kept_readers,
        2 * RECORDS,
        Duration::from_secs(30),
    );
    finish_exactly(
        "the other topic's consumers",
        kept_readers,
        &writers[1].acknowledged(),
    );
    shoal.stop();
}

/// A hot topic grows (CreatePartitions) under `all`: the new partitions get a replica on their
/// other core too, consumers of each are spread over both cores, and every consumer gets exactly
/// the records of the partitions it reads.
#[test]
fn partitions_added_to_a_hot_topic_get_replicas_too() {
    const TOPIC: &str = "growing";
    const N: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "all", &[]);
    let bootstrap = shoal.bootstrap();
    create_replicated(&shoal, TOPIC, &[]);
    let first = start_readers(
        "growing-first",
        8,
        &bootstrap,
        &[(TOPIC, 0, Offset::Beginning)],
        &[],
    );
    let before = Writer::new(&bootstrap, UNIQUE_KEYS);
    before.produce(TOPIC, 0, 0..N);
    wait_for_records("partition 0", &first, N, Duration::from_secs(30));

    grow_topic(&bootstrap, TOPIC, 3);
    let grown = expect_placements(&metadata_client(&bootstrap), TOPIC, 3, true);
    wait_for_replicas_held(&shoal, 3);
    let all: Vec<(&str, i32, Offset)> = (0..3).map(|p| (TOPIC, p, Offset::Beginning)).collect();
    let second = start_readers("growing-all", 8, &bootstrap, &all, &[]);
    // A new producer: the first one's metadata has the topic with one partition.
    let after = Writer::new(&bootstrap, UNIQUE_KEYS);
    for p in 0..3 {
        let from = N * (p as usize + 1);
        after.produce(TOPIC, p, from..from + N);
    }
    wait_for_records("every partition", &second, 4 * N, Duration::from_secs(60));
    wait_for_records("partition 0 again", &first, 2 * N, Duration::from_secs(30));
    for (p, placement) in grown.iter().enumerate() {
        wait_for_replica_readers(&shoal, TOPIC, p as i32, placement.cores());
    }
    let mut want = before.acknowledged();
    want.extend(after.acknowledged());
    want.sort_by_key(|r| (r.partition, r.offset));
    let in_0: Vec<Rec> = want.iter().filter(|r| r.partition == 0).cloned().collect();
    finish_exactly("partition 0's consumers", first, &in_0);
    finish_exactly("every partition's consumers", second, &want);
    shoal.stop();
}

/// The policy switched live from `all` to `off` sends consumers back to the owner (the other core
/// answers NOT_LEADER_OR_FOLLOWER, Metadata lists no replica, no more redirects) and back to `all`
/// spreads them again; every consumer gets exactly every record throughout, none twice.
#[test]
fn switching_replicas_off_live_returns_consumers_to_the_owner_without_loss_or_repeat() {
    const TOPIC: &str = "switched";
    const N: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "all", &[]);
    let bootstrap = shoal.bootstrap();
    let cores = create_replicated(&shoal, TOPIC, &[]);
    let meta = metadata_client(&bootstrap);
    let readers = start_readers(
        "switched",
        8,
        &bootstrap,
        &[(TOPIC, 0, Offset::Beginning)],
        &[],
    );
    let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
    writer.produce(TOPIC, 0, 0..N);
    wait_for_records("the first records", &readers, N, Duration::from_secs(30));
    wait_for_replica_readers(&shoal, TOPIC, 0, cores);

    set_policy(&shoal, "off");
    expect_placements(&meta, TOPIC, 1, false);
    wait_for_replicas_held(&shoal, 0);
    let sent_before = redirects(&shoal);
    expect_fetch_error(
        shoal.ports[cores.other],
        TOPIC,
        0,
        0,
        NOT_LEADER_OR_FOLLOWER,
        "the other core, no longer a replica",
    );
    writer.produce(TOPIC, 0, N..2 * N);
    wait_for_records(
        "the records after `off`",
        &readers,
        2 * N,
        Duration::from_secs(30),
    );
    assert_eq!(redirects(&shoal), sent_before, "redirects after `off`");
    wait_for(
        "no connection on the other core fetching the partition (10 s window)",
        Duration::from_secs(30),
        || match fetch_connections(&shoal, cores.other, TOPIC, 0) {
            0 => Ok(()),
            n => Err(format!("{n}")),
        },
    );

    set_policy(&shoal, "all");
    expect_placements(&meta, TOPIC, 1, true);
    writer.produce(TOPIC, 0, 2 * N..3 * N);
    wait_for_records(
        "the records after `all`",
        &readers,
        3 * N,
        Duration::from_secs(30),
    );
    wait_for_replica_readers(&shoal, TOPIC, 0, cores);
    wait_for(
        "redirects again",
        Duration::from_secs(30),
        || match redirects(&shoal) {
            n if n > sent_before => Ok(()),
            n => Err(format!("{n} redirects")),
        },
    );
    finish_exactly("across off and on", readers, &writer.acknowledged());
    shoal.stop();
}

/// A topic's own `shoal.read.replicas` overrides the broker's policy, set at CreateTopics or with
/// AlterConfigs, both ways: `off` under a broker's `all` (no replica, no consumer on the other
/// core), `all` under a broker switched to `off` (the replica stays).
#[test]
fn a_topics_own_read_replica_setting_overrides_the_brokers() {
    const N: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "all", &[]);
    let bootstrap = shoal.bootstrap();
    let meta = metadata_client(&bootstrap);
    create_topic(&bootstrap, "public", 1, &[]);
    create_topic(&bootstrap, "private", 1, &[("shoal.read.replicas", "off")]);
    expect_placements(&meta, "public", 1, true);
    let private = expect_placements(&meta, "private", 1, false)[0].cores();
    let readers = start_readers(
        "private",
        4,
        &bootstrap,
        &[("private", 0, Offset::Beginning)],
        &[],
    );
    let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
    writer.produce("private", 0, 0..N);
    wait_for_records("the private topic", &readers, N, Duration::from_secs(30));
    assert_eq!(replicas_held(&shoal), 1, "only the public topic's replica");
    assert_eq!(
        fetch_connections(&shoal, private.other, "private", 0),
        0,
        "consumers of the private topic fetched from its other core"
    );
    expect_fetch_error(
        shoal.ports[private.other],
        "private",
        0,
        0,
        NOT_LEADER_OR_FOLLOWER,
        "the private topic's other core",
    );

    alter_topic_config(&bootstrap, "private", "shoal.read.replicas", "all");
    expect_placements(&meta, "private", 1, true);
    set_policy(&shoal, "off");
    expect_placements(&meta, "public", 1, false);
    expect_placements(&meta, "private", 1, true);
    wait_for_replicas_held(&shoal, 1);
    writer.produce("private", 0, N..2 * N);
    wait_for_records(
        "the private topic",
        &readers,
        2 * N,
        Duration::from_secs(30),
    );
    wait_for_replica_readers(&shoal, "private", 0, private);
    finish_exactly("the private topic", readers, &writer.acknowledged());
    shoal.stop();
}

/// `auto` with `--read-replica-min-consumers 4`: eight consumers of a partition start its replica
/// on the other core and are spread over both, and get every record.
#[test]
fn auto_starts_a_replica_once_enough_consumers_fetch_a_partition() {
    const TOPIC: &str = "warm";
    const N: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "auto", &["--read-replica-min-consumers", "4"]);
    let bootstrap = shoal.bootstrap();
    create_topic(&bootstrap, TOPIC, 1, &[]);
    let readers = start_readers("warm", 8, &bootstrap, &[(TOPIC, 0, Offset::Beginning)], &[]);
    let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
    writer.produce(TOPIC, 0, 0..N);
    wait_for_records("the first records", &readers, N, Duration::from_secs(30));
    let cores = expect_placements(&metadata_client(&bootstrap), TOPIC, 1, true)[0].cores();
    assert_eq!(core_metric(&shoal, "shoal_read_replicas", cores.other), 1);
    wait_for_replica_readers(&shoal, TOPIC, 0, cores);
    writer.produce(TOPIC, 0, N..2 * N);
    wait_for_records(
        "the records after",
        &readers,
        2 * N,
        Duration::from_secs(30),
    );
    finish_exactly("auto", readers, &writer.acknowledged());
    shoal.stop();
}

/// An edge node (`shoal edge --cores 2 --read-replicas all`) serves a hot partition from both of
/// its cores, fed by one upstream fetch stream: every consumer gets exactly the upstream's records.
#[test]
fn an_edge_serves_a_hot_partition_from_both_cores_with_one_upstream_stream() {
    const TOPIC: &str = "edgy";
    const N: usize = 1000;
    require_flags("edge", &["--read-replicas"]);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = Shoal::start(dirs[0].path(), 1, &[]);
    create_topic(&upstream.bootstrap(), TOPIC, 1, &[]);
    let writer = Writer::new(&upstream.bootstrap(), UNIQUE_KEYS);
    writer.produce(TOPIC, 0, 0..N);
    let cmd = shoal_command(
        "edge",
        dirs[1].path(),
        2,
        "127.0.0.1:0",
        &[
            "--upstream",
            &upstream.bootstrap(),
            "--edge-metadata-refresh-ms",
            "500",
            "--read-replicas",
            "all",
        ],
    );
    let edge = Shoal::spawn(cmd, dirs[1].path());
    let cores = expect_placements(&metadata_client(&edge.bootstrap()), TOPIC, 1, true)[0].cores();
    let readers = start_readers(
        "edge",
        24,
        &edge.bootstrap(),
        &[(TOPIC, 0, Offset::Beginning)],
        &[],
    );
    wait_for_records(
        "the upstream's records",
        &readers,
        N,
        Duration::from_secs(60),
    );
    writer.produce(TOPIC, 0, N..2 * N);
    wait_for_records(
        "the records produced upstream at the tail",
        &readers,
        2 * N,
        Duration::from_secs(60),
    );
    wait_for_replica_readers(&edge, TOPIC, 0, cores);
    assert!(
        fetch_connections(&edge, cores.owner, TOPIC, 0) > 0,
        "no consumer on the owner core"
    );
    assert_eq!(
        metric(&edge, "shoal_edge_upstream_fetch_streams", &[]),
        1,
        "one upstream fetch stream for the partition, whichever core serves"
    );
    assert_eq!(core_metric(&edge, "shoal_read_replicas", cores.other), 1);
    finish_exactly("through the edge", readers, &writer.acknowledged());
    edge.stop();
    upstream.stop();
}

/// A sharded view of a hot partition is read on both cores: each core holding the partition (its
/// owner, its replica) runs its own interpreting reader, and every consumer of a shard gets
/// exactly that shard's records, with the source's offsets.
#[test]
fn a_view_of_a_hot_partition_is_read_on_both_cores() {
    const TOPIC: &str = "viewed";
    const N: usize = 600;
    let dir = tempfile::tempdir().unwrap();
    let shoal = start_broker(dir.path(), "all", &[]);
    let bootstrap = shoal.bootstrap();
    create_replicated(&shoal, TOPIC, &[]);
    let views: Vec<String> = (0..2).map(|s| format!("{TOPIC}.shard-{s}-of-2")).collect();
    let readers: Vec<Vec<Reader>> = views
        .iter()
        .map(|v| start_readers(v, 8, &bootstrap, &[(v.as_str(), 0, Offset::Beginning)], &[]))
        .collect();
    let writer = Writer::new(&bootstrap, UNIQUE_KEYS);
    writer.produce(TOPIC, 0, 0..N);
    let sent = writer.acknowledged();
    for (shard, readers) in readers.into_iter().enumerate() {
        let want: Vec<Rec> = sent
            .iter()
            .filter(|r| shard_of(r.key.as_deref(), 2).is_none_or(|s| s == shard as u32))
            .cloned()
            .collect();
        assert!(
            !want.is_empty() && want.len() < N,
            "keys spread over both shards"
        );
        let what = format!("shard {shard} of 2");
        wait_for_records(&what, &readers, want.len(), Duration::from_secs(60));
        finish_exactly(&what, readers, &want);
    }
    assert!(
        redirects(&shoal) > 0,
        "view consumers were sent to the replica"
    );
    for core in 0..2 {
        assert!(
            core_metric(&shoal, "shoal_view_fetches_served_total", core) > 0,
            "core {core} served view fetches from its own reader"
        );
    }
    shoal.stop();
}
