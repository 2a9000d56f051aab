//! The control plane at scale, against `shoal serve` on 2 cores: 10,000 topics created in batches
//! of 500 as an admin client (librdkafka's) sends them, and one topic of 10,000 partitions; then
//! Metadata for all of them (librdkafka's, and a raw request whose size is checked), the console's
//! JSON and `/metrics`. Each step has a bound of time generous enough for a debug build on a
//! shared machine (a release build takes a few seconds for the whole), and each answer a bound of
//! size: Metadata grows with the topics (Kafka's protocol lists them all), the console's JSON and
//! `/metrics` do not.

use crate::common;

use common::wire::{connect, recv, send};
use common::Shoal;
use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::Value;
use std::time::{Duration, Instant};

const TOPICS: usize = 10_000;
const BATCH: usize = 500;
const WIDE_PARTITIONS: i32 = 10_000;
/// Longest any one step may take.
const STEP: Duration = Duration::from_secs(60);

/// Runs `step`, fails the test if it took longer than [`STEP`], and says how long it took.
fn timed<T>(what: &str, step: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = step();
    let took = started.elapsed();
    eprintln!("{what}: {took:?}");
    assert!(took < STEP, "{what} took {took:?}");
    out
}

/// All topics, asked for by Metadata v12 (topics null), and the response frame's size.
fn metadata_of_all(port: u16) -> (MetadataResponse, usize) {
    let mut s = connect(port);
    let all = MetadataRequest::default().with_topics(None);
    send(&mut s, ApiKey::Metadata, 12, 1, &all);
    let frame = recv(&mut s).expect("a Metadata response");
    let size = frame.len();
    (common::wire::decode(ApiKey::Metadata, 12, 1, frame), size)
}

#[test]
fn ten_thousand_topics_are_created_in_batches_and_described_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    let (_, empty_metrics) = shoal.admin_get("/metrics");
    let names: Vec<String> = (0..TOPICS).map(|i| format!("many-{i:05}")).collect();
    let topics: Vec<(&str, i32)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    timed("10,000 topics, 500 per CreateTopics", || {
        common::create_topics_in_batches(&b, &topics, BATCH)
    });
    timed("one topic of 10,000 partitions", || {
        common::create_topics(&b, &[("wide", WIDE_PARTITIONS)])
    });

    let (metadata, size) = timed("Metadata of all topics", || metadata_of_all(shoal.ports[0]));
    eprintln!("Metadata of all topics: {size} bytes");
    assert_eq!(metadata.topics.len(), TOPICS + 1);
    assert!(metadata.topics.iter().all(|t| t.error_code == 0));
    let partitions: usize = metadata.topics.iter().map(|t| t.partitions.len()).sum();
    assert_eq!(partitions, TOPICS + WIDE_PARTITIONS as usize);
    // About 40 bytes a topic and 30 a partition (its leader, replicas and in-sync replicas).
    assert!(size < 1_200_000, "Metadata of all topics: {size} bytes");
    let client: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &b)
        .create()
        .unwrap();
    let seen = timed("librdkafka's Metadata of all topics", || {
        client
            .fetch_metadata(None, STEP)
            .expect("Metadata answered")
    });
    assert_eq!(seen.topics().len(), TOPICS + 1);

    let (status, body) = timed("the console's JSON", || shoal.admin_get("/v1/console"));
    assert!(status.contains("200"), "{status}");
    assert!(
        body.len() < 32 << 10,
        "the console's JSON: {} bytes",
        body.len()
    );
    let console: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(console["topics"]["total"], TOPICS + 1);
    let opened: u64 = console["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["partitions"].as_u64().unwrap())
        .sum();
    assert_eq!(opened, (TOPICS + WIDE_PARTITIONS as usize) as u64);

    // Without --metrics-per-partition no series is per partition: 20,000 partitions add to
    // /metrics only what the requests' own counters and histograms (by API) take.
    let (status, metrics) = timed("/metrics", || shoal.admin_get("/metrics"));
    assert!(status.contains("200"), "{status}");
    assert!(!metrics.contains("topic=\""), "a series per topic");
    let (before, after) = (empty_metrics.len(), metrics.len());
    eprintln!("/metrics: {before} bytes, then {after}");
    assert!(
        after < before + (32 << 10),
        "/metrics: {before} bytes, then {after}"
    );
    assert_eq!(
        shoal.metric("shoal_partitions"),
        (TOPICS + WIDE_PARTITIONS as usize) as u64
    );
    shoal.stop();
}
