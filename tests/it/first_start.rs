//! The README's first command, literally: `shoal serve` with no flags but the ports (the defaults
//! would clash between tests), in a fresh working directory, so the data directory is the default
//! relative `./shoal-data`. A librdkafka producer writes to a topic that does not exist yet, a
//! group consumer reads it all and commits, and the server logs no error. (Every other test passes
//! an absolute temporary directory, which once hid a first-start defect: relative paths failed
//! inside glommio, losing the first topics and the group stores.)

use crate::common;

use common::Shoal;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::TopicPartitionList;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

const RECORDS: usize = 100;

#[test]
fn serve_with_default_flags_in_a_fresh_directory() {
    let work = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.current_dir(work.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env_remove("RUST_LOG");
    let data_dir = work.path().join("shoal-data");
    let shoal = Shoal::spawn(cmd, &data_dir);
    let bootstrap = shoal.bootstrap();

    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "20000")
        .create()
        .expect("producer");
    for i in 0..RECORDS {
        let v = i.to_string();
        common::send_retrying(&producer, BaseRecord::to("first").key(&v).payload(&v));
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("every record acknowledged");
    assert_eq!(producer.in_flight_count(), 0);

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "first-group")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("consumer");
    consumer.subscribe(&["first"]).unwrap();
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < RECORDS {
        assert!(
            Instant::now() < deadline,
            "group consumer got {} of {RECORDS} records",
            seen.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.expect("consumed");
            let v: usize = std::str::from_utf8(m.payload().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            seen.insert(v);
            consumer
                .commit_message(&m, CommitMode::Sync)
                .expect("commit");
        }
    }
    assert_eq!(seen, (0..RECORDS).collect());
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition("first", 0);
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("OffsetFetch answered");
    assert_eq!(
        committed.find_partition("first", 0).unwrap().offset(),
        rdkafka::Offset::Offset(RECORDS as i64)
    );
    drop(consumer);
    drop(producer);

    // The data went where the README says: under the working directory, by the relative default.
    assert!(data_dir.join("topics").join("first").join("0").is_dir());
    assert!(data_dir.join("__groups").is_dir());
    let log = shoal.log_lines();
    let resolved = std::fs::canonicalize(&data_dir).unwrap();
    let said = format!("data directory: {}", resolved.display());
    assert_eq!(
        log.iter().filter(|l| l.contains(&said)).count(),
        1,
        "start-up names the resolved data directory once: {log:#?}"
    );
    let errors: Vec<&String> = log.iter().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "the server logged errors: {errors:#?}");
    shoal.stop();
}
