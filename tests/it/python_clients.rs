//! Python clients against shoal, unmodified: kafka-python reads a view shard with long stretches
//! of empty batches, grows a topic and reads and changes its configs; confluent-kafka's
//! AdminClient grows a topic and changes its configs. Both are installed by the test itself into
//! `target/python-deps` (pinned), so `cargo test` works on a fresh machine.

use crate::common;

use common::python::run_script;
use common::{key_in_shard, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::time::Duration;

#[test]
fn kafka_python_reads_a_view_with_empty_batches() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    // Shard 1 of 3 has a record, then 300 records of shard 0 (shard 1 sees empty batches), then one more.
    let (mine, other) = (key_in_shard(1, 3, "mine"), key_in_shard(0, 3, "other"));
    let keys: Vec<&str> = std::iter::once(mine.as_str())
        .chain(std::iter::repeat_n(other.as_str(), 300))
        .chain(std::iter::once(mine.as_str()))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v{i}");
        producer
            .send(BaseRecord::to("py").partition(0).key(*k).payload(&v))
            .unwrap();
        if i % 50 == 0 {
            producer.flush(Duration::from_secs(10)).unwrap(); // several batches
        }
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let stdout = run_script(
        "consume.py",
        &[&bootstrap, "py.shard-1-of-3", "0", "2", "30"],
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].contains("\"offset\": 0") && lines[0].contains("\"value\": \"v0\""),
        "{stdout}"
    );
    assert!(
        lines[1].contains("\"offset\": 301") && lines[1].contains("\"value\": \"v301\""),
        "{stdout}"
    );
    assert!(
        lines[2].contains("\"position\": 302"),
        "kafka-python moved past every empty batch: {stdout}"
    );
    shoal.stop();
}

/// kafka-python's admin client grows a topic: fewer partitions are refused
/// (`InvalidPartitionsError`), a validate-only request (for 10) changes nothing, the real one (to
/// 5) is seen by kafka-python's own metadata at once.
#[test]
fn kafka_python_grows_a_topic() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("pygrow", 2)]);
    let stdout = run_script("grow.py", &[&bootstrap, "pygrow", "5"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].contains("InvalidPartitionsError"), "{stdout}");
    assert!(lines[1].contains("\"ok\": true"), "{stdout}");
    assert!(lines[2].contains("\"ok\": true"), "{stdout}");
    // Exactly 5: the validate-only request (for 10) changed nothing.
    assert!(
        lines[3].contains("\"partitions\": [0, 1, 2, 3, 4]}"),
        "{stdout}"
    );
    shoal.stop();
}

/// kafka-python's admin client reads and changes a topic's configs: IncrementalAlterConfigs SET
/// and DELETE (`reset_configs`), refusals with INVALID_CONFIG that change nothing, validate-only,
/// the legacy AlterConfigs, and the broker's configs, read-only.
#[test]
fn kafka_python_describes_and_alters_topic_configs() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("pyconf", 2)]);
    let stdout = run_script("configs.py", &[&bootstrap, "pyconf"]);
    let line = |key: &str| -> String {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{{\"{key}\"")))
            .unwrap_or_else(|| panic!("no {key} in {stdout}"))
            .to_string()
    };
    assert_eq!(line("modified_at_start"), r#"{"modified_at_start": {}}"#);
    for default in [
        r#""retention.ms": "604800000""#,
        r#""segment.bytes": "268435456""#,
        r#""cleanup.policy": "delete""#,
        r#""message.timestamp.type": "CreateTime""#,
    ] {
        assert!(line("all_at_start").contains(default), "{stdout}");
    }
    assert_eq!(
        line("modified_after_set"),
        r#"{"modified_after_set": {"retention.ms": "3600000", "segment.bytes": "1048576"}}"#
    );
    assert!(
        line("bad_value").contains("InvalidConfigurationError"),
        "{stdout}"
    );
    assert!(
        line("unknown_key").contains("InvalidConfigurationError"),
        "{stdout}"
    );
    assert!(line("validate_only").contains("OK"), "{stdout}");
    assert_eq!(
        line("modified_after_refusals"),
        r#"{"modified_after_refusals": {"retention.ms": "3600000", "segment.bytes": "1048576"}}"#,
        "refusals and validate-only changed nothing"
    );
    assert_eq!(
        line("modified_after_reset"),
        r#"{"modified_after_reset": {"retention.ms": "3600000"}}"#
    );
    assert_eq!(
        line("modified_after_legacy"),
        r#"{"modified_after_legacy": {"max.message.bytes": "65536", "retention.ms": "3600000"}}"#
    );
    assert!(
        line("broker").contains(r#""log.segment.bytes": true"#),
        "{stdout}"
    );
    assert!(
        !line("broker").contains("false"),
        "broker configs are read-only: {stdout}"
    );
    shoal.stop();
}

/// confluent-kafka's AdminClient (librdkafka underneath) grows a topic (and is refused a shrink
/// with INVALID_PARTITIONS), reads a topic config with its source, and changes it with
/// IncrementalAlterConfigs (a bad value refused with INVALID_CONFIG, changing nothing).
#[test]
fn confluent_kafka_grows_a_topic_and_alters_its_configs() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("ckgrow", 1)]);
    let stdout = run_script("confluent_admin.py", &[&bootstrap, "ckgrow"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"grow": "ok"}"#,
            r#"{"shrink": "INVALID_PARTITIONS"}"#,
            r#"{"partitions": 3}"#,
            r#"{"retention_at_start": ["604800000", 5]}"#,
            r#"{"set": "ok"}"#,
            r#"{"bad": "INVALID_CONFIG"}"#,
            r#"{"retention_after": ["3600000", 1]}"#,
        ],
        "{stdout}"
    );
    shoal.stop();
}

/// confluent-kafka's AdminClient deletes records inside a batch: the log starts there at once, for
/// ListOffsets and for a consumer from the beginning, and still after a restart; past the end is
/// refused. (OffsetDelete, which its Python API lacks, runs in librdkafka's own suite: 0081.)
#[test]
fn confluent_kafka_deletes_records() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("ckdel", 2)]);
    let stdout = run_script("confluent_delete_records.py", &[&bootstrap, "ckdel"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"low_watermark": 45}"#,
            r#"{"earliest": 45}"#,
            r#"{"past_the_end": "OFFSET_OUT_OF_RANGE"}"#,
            r#"{"first": [45, "v45"]}"#,
        ],
        "{stdout}"
    );
    shoal.stop();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", shoal.bootstrap())
        .create()
        .unwrap();
    let marks = rdkafka::consumer::Consumer::fetch_watermarks(
        &consumer,
        "ckdel",
        0,
        Duration::from_secs(10),
    );
    assert_eq!(
        marks.unwrap(),
        (45, 100),
        "the log start is kept across a restart"
    );
    shoal.stop();
}

/// kafka-python keeps a fetch session per broker (KIP-227): it reads 500 partitions exactly once
/// while idling at the tail in incremental fetches; a larger consumer evicts its sessions from the
/// only slot of each core (`--max-fetch-sessions-per-core 1`), and it carries on with full fetches
/// after FETCH_SESSION_ID_NOT_FOUND, losing nothing; once the larger consumer is gone and its
/// sessions are stale, it starts sessions again.
#[test]
fn kafka_python_reads_500_partitions_in_fetch_sessions_through_evictions() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--max-fetch-sessions-per-core",
        "1",
        "--fetch-session-eviction-ms",
        "2000",
    ];
    let shoal = Shoal::start(dir.path(), 2, &flags);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("wide", 500), ("wider", 8)]);
    let stdout = run_script(
        "fetch_sessions.py",
        &[&bootstrap, "wide", "500", "wider", "8", "3"],
    );
    let line = stdout.lines().last().unwrap_or_default();
    println!("{line}");
    let summary: serde_json::Value = serde_json::from_str(line).expect(&stdout);
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(n(&summary["records"]), 3 * 500 * 2, "{stdout}");
    assert_eq!(n(&summary["distinct_values"]), 3 * 500 * 2, "{stdout}");
    assert_eq!(n(&summary["duplicates"]), 0, "{stdout}");
    assert_eq!(n(&summary["missing"]), 0, "{stdout}");
    let a = &summary["a"];
    assert!(n(&a["created"]) >= 2, "a session on each core: {stdout}");
    assert!(n(&a["not_found"]) >= 1, "evicted: {stdout}");
    assert!(
        n(&a["created_after_not_found"]) >= 1,
        "sessions again: {stdout}"
    );
    assert!(n(&summary["b"]["created"]) >= 1, "{stdout}");
    assert!(shoal.metric("shoal_fetch_incremental_total") >= 20);
    assert!(shoal.metric("shoal_fetch_session_evictions_total") >= 2);
    shoal.stop();
}
