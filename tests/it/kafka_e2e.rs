//! End to end with librdkafka (the `rdkafka` crate, built from source): a 2-core server, a topic of 8
//! partitions, 100,000 keyed messages produced with acks=all and idempotence, consumed back with
//! `assign` and compared record by record, before and after a restart, through each core's port.

use crate::common;

use common::{create_topics, send_retrying, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 8;
const MESSAGES: usize = 100_000;

/// What message `i` carries: key, value and a header, all derived from `i`.
fn message(i: usize) -> (String, Vec<u8>, Vec<u8>) {
    let key = format!("key-{i}");
    let value: Vec<u8> = (0..(10 + i % 190)).map(|j| (i * 7 + j) as u8).collect();
    (key, value, (i as u64).to_be_bytes().to_vec())
}

/// Produces every message to partition `i % 8`, in order, and waits for all acknowledgements.
fn produce_all(bootstrap: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer");
    for i in 0..MESSAGES {
        let (key, value, header) = message(i);
        let headers = OwnedHeaders::new().insert(Header {
            key: "i",
            value: Some(&header),
        });
        let record = BaseRecord::to(TOPIC)
            .partition((i % PARTITIONS as usize) as i32)
            .key(&key)
            .payload(&value)
            .headers(headers);
        send_retrying(&producer, record);
    }
    producer
        .flush(Duration::from_secs(120))
        .expect("all messages acknowledged");
    assert_eq!(producer.in_flight_count(), 0);
}

/// Consumes all partitions from the beginning through `bootstrap` and checks every record against
/// what was produced, in per-partition order.
fn consume_and_check(bootstrap: &str) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "e2e-assign")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut next_index: HashMap<i32, usize> = (0..PARTITIONS).map(|p| (p, p as usize)).collect();
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen < MESSAGES {
        assert!(
            Instant::now() < deadline,
            "consumed only {seen} of {MESSAGES} messages in time"
        );
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.expect("fetch succeeds");
        let p = msg.partition();
        let i = next_index[&p];
        let (key, value, header) = message(i);
        assert_eq!(
            msg.key(),
            Some(key.as_bytes()),
            "partition {p} offset {}",
            msg.offset()
        );
        assert_eq!(
            msg.payload(),
            Some(&value[..]),
            "partition {p} offset {}",
            msg.offset()
        );
        assert_eq!(
            msg.offset() as usize,
            i / PARTITIONS as usize,
            "offsets are dense and in order"
        );
        let h = msg.headers().expect("headers");
        assert_eq!(
            (h.count(), h.get(0).key, h.get(0).value),
            (1, "i", Some(&header[..]))
        );
        next_index.insert(p, i + PARTITIONS as usize);
        seen += 1;
    }
    // Nothing more than what was produced.
    assert!(consumer.poll(Duration::from_millis(500)).is_none());
}

#[test]
fn librdkafka_round_trip_restart_and_every_port() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, PARTITIONS)]);
    produce_all(&shoal.bootstrap());
    consume_and_check(&shoal.bootstrap());
    let (_, metrics) = shoal.admin_get("/metrics");
    assert!(
        metrics.contains("shoal_kafka_requests_total{core=\"1\",api=\"Produce\"}"),
        "both cores took produces"
    );
    // Every produce request read has been answered, and each answer's time is in the histogram.
    let produce = "api=\"Produce\"";
    assert_eq!(
        shoal.metric_with("shoal_kafka_request_duration_seconds_count", produce),
        shoal.metric_with("shoal_kafka_requests_total", produce)
    );
    // The records went to disk in timed writes, and each core's histogram is rendered, written
    // to or not.
    let writes = shoal.metric("shoal_log_write_duration_seconds_count");
    assert!(writes > 0, "{writes} timed writes");
    assert_eq!(
        shoal.metric_with("shoal_log_write_duration_seconds_bucket", "le=\"+Inf\""),
        writes
    );
    shoal.metric_with("shoal_log_fsync_duration_seconds_count", "core=\"1\"");
    shoal.stop();

    // After a restart (new ports, same data) everything is still there, through either core's port.
    let shoal = Shoal::start(dir.path(), 2, &[]);
    for port in &shoal.ports {
        consume_and_check(&format!("127.0.0.1:{port}"));
    }
    shoal.stop();
}

/// Each partition's leader (broker = core), from a fresh client's metadata.
fn leaders(bootstrap: &str, topic: &str) -> Vec<i32> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut parts: Vec<(i32, i32)> = md.topics()[0]
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, leader)| leader).collect()
}

/// When the cores change, partitions move to other cores. A producer that still has the old metadata
/// (a former leader refuses it with NOT_LEADER_OR_FOLLOWER, as `kafka_raw` checks byte by byte)
/// finds the new leaders and every record arrives, in order.
#[test]
fn clients_follow_partitions_to_their_new_core() {
    const T: &str = "moving";
    let dir = tempfile::tempdir().unwrap();
    let base = common::free_port_run(3);
    let listen = format!("127.0.0.1:{base}");
    let shoal = Shoal::start_on(dir.path(), 2, &listen, &["--default-partitions", "4"]);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", listen.as_str())
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "60000")
        .set("reconnect.backoff.max.ms", "200")
        .create()
        .unwrap();
    let send = |from: usize, to: usize| {
        for i in from..to {
            let v = format!("v{i}");
            send_retrying(
                &producer,
                BaseRecord::to(T)
                    .partition((i % 4) as i32)
                    .key(&v)
                    .payload(&v),
            );
        }
        producer
            .flush(Duration::from_secs(60))
            .expect("acknowledged");
    };
    send(0, 1000); // the topic is auto-created with 4 partitions, 2 per core
    let before = leaders(&listen, T);
    shoal.stop();
    // Three cores now: some partitions have new leaders, on the same ports the client knows; the
    // producer, still holding the old metadata, must find them.
    let shoal = Shoal::start_on(dir.path(), 3, &listen, &[]);
    let after = leaders(&listen, T);
    assert!(
        before.iter().zip(&after).any(|(a, b)| a != b),
        "leaders moved: {before:?} -> {after:?}"
    );
    send(1000, 2000);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", listen.as_str())
        .set("group.id", "e2e-moving")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..4 {
        tpl.add_partition_offset(T, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut got: Vec<Vec<String>> = vec![Vec::new(); 4];
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.iter().map(Vec::len).sum::<usize>() < 2000 {
        assert!(
            Instant::now() < deadline,
            "consumed {:?} in time",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            got[m.partition() as usize]
                .push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
        }
    }
    for (p, values) in got.iter().enumerate() {
        let want: Vec<String> = (0..2000)
            .filter(|i| i % 4 == p)
            .map(|i| format!("v{i}"))
            .collect();
        assert_eq!(values, &want, "partition {p}");
    }
    shoal.stop();
}
