//! Fan-out with librdkafka: 64 independent consumers (no group, `assign`) long-poll a partition;
//! 10,000 records are produced; every consumer gets exactly those, in order, and the broker read them
//! from its log far fewer times than it sent them. Then coalescing is switched off through the admin
//! API and the same happens again, with one read per consumer.

use crate::common;

use common::{create_topics, send_retrying, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CONSUMERS: usize = 64;
const RECORDS: usize = 10_000;
const SENTINEL: &str = "sentinel";

fn produce(bootstrap: &str, values: impl Iterator<Item = String>) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for v in values {
        send_retrying(
            &producer,
            BaseRecord::to("fan").partition(0).key(&v).payload(&v),
        );
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// A consumer reading everything from offset 0; it says when it has the sentinel (then it is
/// long-polling at the tail) and returns every value it got.
fn consumer(c: usize, bootstrap: String, ready: mpsc::Sender<usize>) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", format!("fan-{c}"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "500")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("fan", 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while got.len() < 1 + 2 * RECORDS && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                assert_eq!(
                    m.offset() as usize,
                    got.len(),
                    "consumer {c}: in order, no gaps"
                );
                got.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
                if got.len() == 1 {
                    ready.send(c).unwrap();
                }
            }
            Some(Err(e)) => panic!("consumer {c}: {e}"),
            None => {}
        }
    }
    got
}

#[test]
fn sixty_four_consumers_share_reads() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    create_topics(&bootstrap, &[("fan", 1)]);

    let (ready, started) = mpsc::channel();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let (bootstrap, ready) = (bootstrap.clone(), ready.clone());
            std::thread::spawn(move || consumer(c, bootstrap, ready))
        })
        .collect();
    // Every consumer has read the sentinel: all of them are at the tail before the measured records.
    produce(&bootstrap, std::iter::once(SENTINEL.to_string()));
    for _ in 0..CONSUMERS {
        started
            .recv_timeout(Duration::from_secs(60))
            .expect("every consumer starts");
    }
    let wait_for_all = |expected_bytes: u64, before: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while shoal.metric("shoal_fetch_response_bytes_total") - before < expected_bytes {
            assert!(
                Instant::now() < deadline,
                "consumers did not receive everything in time"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let phase = |from: usize| {
        let (log0, read0, sent0) = (
            shoal.metric("shoal_log_size_bytes"),
            shoal.metric("shoal_fetch_log_read_bytes_total"),
            shoal.metric("shoal_fetch_response_bytes_total"),
        );
        produce(
            &bootstrap,
            (from..from + RECORDS).map(|i| format!("record-{i}")),
        );
        let new_bytes = shoal.metric("shoal_log_size_bytes") - log0;
        wait_for_all(new_bytes * CONSUMERS as u64, sent0);
        (
            shoal.metric("shoal_fetch_log_read_bytes_total") - read0,
            shoal.metric("shoal_fetch_response_bytes_total") - sent0,
        )
    };

    // Phase 1: coalescing on (the default).
    let hits0 = shoal.metric("shoal_fetch_coalescer_inflight_hits_total")
        + shoal.metric("shoal_fetch_coalescer_ready_hits_total");
    let (read1, sent1) = phase(0);
    let hits = shoal.metric("shoal_fetch_coalescer_inflight_hits_total")
        + shoal.metric("shoal_fetch_coalescer_ready_hits_total")
        - hits0;
    assert!(
        read1 * 8 <= sent1,
        "coalescing on: read {read1} bytes from the log to send {sent1}"
    );
    assert!(hits > 0);

    // Phase 2: switched off live; every fetch reads for itself.
    let (status, _) = shoal.admin_request("PUT", "/v1/config/fetch_coalescing", "off");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(shoal.metric("shoal_fetch_coalescer_enabled"), 0);
    assert_eq!(
        shoal.metric("shoal_fetch_coalescer_cached_bytes"),
        0,
        "switching off drops the cache"
    );
    let (read2, sent2) = phase(RECORDS);
    assert!(
        read2 * 2 >= sent2,
        "coalescing off: read {read2} bytes from the log to send {sent2}"
    );

    let want: Vec<String> = std::iter::once(SENTINEL.to_string())
        .chain((0..2 * RECORDS).map(|i| format!("record-{i}")))
        .collect();
    for (c, t) in consumers.into_iter().enumerate() {
        let got = t.join().expect("consumer thread");
        assert!(
            got == want,
            "consumer {c} got {} records, not exactly the {} produced",
            got.len(),
            want.len()
        );
    }
    println!("coalescing on: {read1} log bytes read for {sent1} sent; off: {read2} for {sent2}");
    shoal.stop();
}

#[test]
fn admin_settings_are_checked_and_applied_on_every_core() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &["--fetch-coalescing", "off"]);
    assert_eq!(
        shoal.metric("shoal_fetch_coalescer_enabled"),
        0,
        "the flag is honoured"
    );
    let (status, _) = shoal.admin_request("PUT", "/v1/config/fetch_coalescing", "on");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        shoal.metric("shoal_fetch_coalescer_enabled"),
        2,
        "on, on both cores"
    );
    for (path, body) in [
        ("/v1/config/view_sharing", "off"),
        ("/v1/config/max_delta_for_fanout", "500"),
    ] {
        let (status, answer) = shoal.admin_request("PUT", path, body);
        assert_eq!(status, "HTTP/1.1 200 OK", "{path}: {answer}");
    }
    for (path, body) in [
        ("/v1/config/fetch_coalescing", "maybe"),
        ("/v1/config/max_delta_for_fanout", "-3"),
        ("/v1/config/nonsense", "1"),
    ] {
        let (status, answer) = shoal.admin_request("PUT", path, body);
        assert_eq!(
            status, "HTTP/1.1 400 Bad Request",
            "{path} {body}: {answer}"
        );
    }
    shoal.stop();
}
