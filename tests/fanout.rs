//! Fan-out with librdkafka: 64 independent consumers (no group, `assign`) long-poll an empty
//! partition; 10,000 records are produced; every consumer gets exactly those, in order, and the
//! broker read them from its log far fewer times than it sent them. Then coalescing is switched off
//! through the admin API and the same happens again, with one read per consumer.

mod common;

use common::Shoal;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONSUMERS: usize = 64;
const RECORDS: usize = 10_000;

fn admin_put(shoal: &Shoal, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(&shoal.admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Head and body in separate writes, as many clients send them.
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(body.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn produce(bootstrap: &str, from: usize, to: usize) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for i in from..to {
        let v = format!("record-{i}");
        let mut rec = BaseRecord::to("fan").partition(0).key(&v).payload(&v);
        while let Err((_, r)) = producer.send(rec) {
            rec = r;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

#[test]
fn sixty_four_consumers_share_reads() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let bootstrap = shoal.bootstrap();
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .unwrap();
    let topic = rdkafka::admin::NewTopic::new("fan", 1, rdkafka::admin::TopicReplication::Fixed(1));
    let opts = rdkafka::admin::AdminOptions::new();
    for r in futures_lite::future::block_on(admin.create_topics([&topic], &opts)).unwrap() {
        r.unwrap();
    }

    let connected = Arc::new(AtomicUsize::new(0));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let (bootstrap, connected) = (bootstrap.clone(), connected.clone());
            std::thread::spawn(move || {
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
                let mut said_hello = false;
                let deadline = Instant::now() + Duration::from_secs(120);
                while got.len() < 2 * RECORDS && Instant::now() < deadline {
                    match consumer.poll(Duration::from_millis(50)) {
                        Some(Ok(m)) => {
                            assert_eq!(
                                m.offset() as usize,
                                got.len(),
                                "consumer {c}: in order, no gaps"
                            );
                            got.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
                        }
                        Some(Err(e)) => panic!("consumer {c}: {e}"),
                        None => {
                            if !said_hello {
                                said_hello = true;
                                connected.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                }
                got
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while connected.load(Ordering::SeqCst) < CONSUMERS
        || shoal.metric("shoal_connections_open") < CONSUMERS as u64
    {
        assert!(Instant::now() < deadline, "consumers did not all start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500)); // all of them long-polling now

    // Phase 1: coalescing on (the default).
    produce(&bootstrap, 0, RECORDS);
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
    let log_bytes = shoal.metric("shoal_log_size_bytes");
    wait_for_all(log_bytes * CONSUMERS as u64, 0);
    let read1 = shoal.metric("shoal_fetch_log_read_bytes_total");
    let sent1 = shoal.metric("shoal_fetch_response_bytes_total");
    let hits = shoal.metric("shoal_fetch_coalescer_inflight_hits_total")
        + shoal.metric("shoal_fetch_coalescer_ready_hits_total");
    assert!(
        read1 * 8 <= sent1,
        "coalescing on: read {read1} bytes from the log to send {sent1}"
    );
    assert!(hits > 0);

    // Phase 2: switched off live; every fetch reads for itself.
    let answer = admin_put(&shoal, "/v1/config/fetch_coalescing", "off");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(shoal.metric("shoal_fetch_coalescer_enabled"), 0);
    assert_eq!(
        shoal.metric("shoal_fetch_coalescer_cached_bytes"),
        0,
        "switching off drops the cache"
    );
    produce(&bootstrap, RECORDS, 2 * RECORDS);
    let log_bytes2 = shoal.metric("shoal_log_size_bytes") - log_bytes;
    wait_for_all(log_bytes2 * CONSUMERS as u64, sent1);
    let read2 = shoal.metric("shoal_fetch_log_read_bytes_total") - read1;
    let sent2 = shoal.metric("shoal_fetch_response_bytes_total") - sent1;
    assert!(
        read2 * 2 >= sent2,
        "coalescing off: read {read2} bytes from the log to send {sent2}"
    );

    let want: Vec<String> = (0..2 * RECORDS).map(|i| format!("record-{i}")).collect();
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
    assert!(admin_put(&shoal, "/v1/config/fetch_coalescing", "on").starts_with("HTTP/1.1 200"));
    assert_eq!(
        shoal.metric("shoal_fetch_coalescer_enabled"),
        2,
        "on, on both cores"
    );
    for (path, body) in [
        ("/v1/config/view_sharing", "off"),
        ("/v1/config/max_delta_for_fanout", "500"),
    ] {
        let answer = admin_put(&shoal, path, body);
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    for (path, body) in [
        ("/v1/config/fetch_coalescing", "maybe"),
        ("/v1/config/max_delta_for_fanout", "-3"),
        ("/v1/config/nonsense", "1"),
    ] {
        let answer = admin_put(&shoal, path, body);
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{path} {body}: {answer}"
        );
    }
    shoal.stop();
}
