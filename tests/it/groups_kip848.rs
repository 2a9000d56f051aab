//! Consumer groups of the consumer group protocol (KIP-848, `group.protocol=consumer`) with real
//! clients: confluent-kafka's members join, leave and die while the group reads a topic, and every
//! record is read exactly once; the group is listed and described as a consumer group.

use crate::common;

use common::python::run_script;
use common::Shoal;

/// Quick sessions, so that a member that dies is noticed within the test.
const FLAGS: &[&str] = &[
    "--group-consumer-session-timeout-ms",
    "6000",
    "--group-consumer-heartbeat-interval-ms",
    "500",
];

/// Four members over 12 partitions, then a fifth joins, one leaves and one dies (no leave: its
/// session times out): each record is read exactly once, since members commit each record before
/// reporting it and a partition moves only after its owner released it.
#[test]
fn confluent_kafka_members_join_leave_and_die_and_every_record_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("kip848", 12)]);
    let records = 3000;
    let stdout = run_script(
        "kip848_group.py",
        &[&bootstrap, "kip848", &records.to_string(), "g848"],
    );
    let line = stdout.lines().last().unwrap_or_default();
    let summary: serde_json::Value = serde_json::from_str(line).expect(&stdout);
    let n = |k: &str| summary[k].as_u64().unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(n("missing"), 0, "{line}");
    assert_eq!(n("distinct"), records, "{line}");
    assert_eq!(n("records"), records, "no record read twice: {line}");
    let by_worker = summary["by_worker"].as_object().expect("by worker");
    assert!(by_worker.len() >= 4, "the members shared the work: {line}");
    assert!(
        shoal.metric("shoal_group_rebalances_total") >= 4,
        "the group epoch moved as members came and went"
    );
    // The members are gone; the group stays, of the consumer protocol, for its offsets.
    assert_eq!(
        shoal.metric_with("shoal_consumer_protocol_groups", "state=\"Empty\""),
        1
    );
    shoal.stop();
}

/// What the consumer protocol offers besides sharing partitions, through confluent-kafka: a
/// regular expression picks up a topic created later; a static member that leaves and comes back
/// (a new member with the same instance id) gets its partitions again without a new assignment; a
/// classic group and a consumer group read one topic side by side and are listed with their
/// types; a classic group without members is taken over by the consumer protocol and resumes
/// from its committed offset.
#[test]
fn confluent_kafka_regex_static_members_side_by_side_and_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let stdout = run_script("kip848_features.py", &[&shoal.bootstrap()]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"regex": [4, ["rx-b"]]}"#,
            r#"{"static": [true, 2]}"#,
            r#"{"side_by_side": [30, 30], "types": {"g-classic": "CLASSIC", "g-modern": "CONSUMER"}}"#,
            r#"{"converted": [6, 7, 8, 9]}"#,
        ],
        "{stdout}"
    );
    shoal.stop();
}

/// A member of a consumer-protocol group (librdkafka through `rdkafka`) reads half a topic,
/// committing as it goes; the broker restarts on the same ports; the member carries on (it joins
/// again: the broker does not keep members across a restart) and reads exactly the other half.
#[test]
fn a_consumer_protocol_member_resumes_from_its_commits_after_a_broker_restart() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::Message;
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let shoal = Shoal::start_on(dir.path(), 2, &listen, FLAGS);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("resume", 4)]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for i in 0..200 {
        let v = i.to_string();
        producer
            .send(BaseRecord::<(), _>::to("resume").partition(i % 4).payload(&v))
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "resumer")
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["resume"]).unwrap();
    let mut read = Vec::new();
    let mut poll_until = |n: usize, read: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while read.len() < n && Instant::now() < deadline {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            // Committed before it counts as read, so a restart cannot lose or repeat it.
            if consumer.commit_message(&m, CommitMode::Sync).is_ok() {
                read.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            }
        }
    };
    poll_until(100, &mut read);
    assert_eq!(read.len(), 100);
    shoal.stop();
    let shoal = Shoal::start_on(dir.path(), 2, &listen, FLAGS);
    poll_until(200, &mut read);
    let distinct: BTreeSet<&String> = read.iter().collect();
    assert_eq!(
        (read.len(), distinct.len()),
        (200, 200),
        "every record once, across the restart"
    );
    drop(consumer);
    shoal.stop();
}
