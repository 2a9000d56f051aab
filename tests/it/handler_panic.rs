//! A panic while one request is handled closes that request's connection only: it is logged with
//! the API and version and counted, and the core goes on serving every other connection, a request
//! in flight over the panic included, with the partition it was working on intact. The panic is
//! injected through `SHOAL_TEST_PANIC_CLIENT_ID` (requests with that client id panic inside their
//! handler task, after a first yield to the executor), which the binary reads only when built with
//! the `fault-injection` feature: the crate's dev-dependency on itself turns it on for `cargo test`.

use crate::common;

use common::wire::{
    call, connect, expect_closed, produce_request, recv_decoded, request_frame_as, send,
};
use common::Shoal;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse, ProduceRequest,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use shards::batch::BatchBuilder;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

const BOOM: &str = "boom";
const TOPIC: &str = "panicky";

fn produce_req(value: &str) -> ProduceRequest {
    let mut b = BatchBuilder::new(1_700_000_000_000);
    b.push(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    produce_request(TOPIC, 0, b.finish(0), -1)
}

/// A Fetch of partition 0 from `offset` that waits up to `max_wait` for a byte.
fn fetch_req(offset: i64, max_wait: Duration) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait.as_millis() as i32)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

fn produce(s: &mut std::net::TcpStream, correlation: i32, value: &str) -> i64 {
    let r: ProduceResponse = call(s, ApiKey::Produce, 9, correlation, &produce_req(value));
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 0);
    p.base_offset
}

#[test]
fn a_panicking_handler_closes_only_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--cores", "1", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .env("SHOAL_TEST_PANIC_CLIENT_ID", BOOM);
    let mut shoal = Shoal::spawn(cmd, dir.path());
    let port = shoal.ports[0];

    // A bystander connection, with a request in flight over the panic: a long poll at the end of
    // the partition, read by the server (the connection counts as fetching) before any panic.
    let mut other = connect(port);
    let m: MetadataResponse = call(
        &mut other,
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str(TOPIC))))]))
            .with_allow_auto_topic_creation(true),
    );
    assert_eq!(m.topics[0].error_code, 0, "{TOPIC} auto-created");
    assert_eq!(produce(&mut other, 2, "before"), 0);
    let max_wait = Duration::from_secs(15);
    let polled_at = Instant::now();
    send(&mut other, ApiKey::Fetch, 12, 3, &fetch_req(1, max_wait));
    let deadline = Instant::now() + Duration::from_secs(5);
    while shoal.metric("shoal_fetch_connections") == 0 {
        assert!(Instant::now() < deadline, "the long poll was never read");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Metadata and Produce (to the same partition) from the panicking client: each closes its
    // connection without an answer.
    for (key, version, frame) in [
        (
            ApiKey::Metadata,
            12,
            request_frame_as(BOOM, ApiKey::Metadata, 12, 7, &MetadataRequest::default()),
        ),
        (
            ApiKey::Produce,
            9,
            request_frame_as(BOOM, ApiKey::Produce, 9, 8, &produce_req("lost")),
        ),
    ] {
        let mut victim = connect(port);
        victim.write_all(&frame).unwrap();
        expect_closed(&mut victim, &format!("{key:?} v{version} that panicked"));
    }
    assert!(shoal.is_running(), "the server survived");

    // A produce on a new connection wakes the bystander's long poll, which answers with it: the
    // connection and its request in flight survived the panics.
    let mut fresh = connect(port);
    assert_eq!(produce(&mut fresh, 1, "after"), 1);
    let f: FetchResponse = recv_decoded(&mut other, ApiKey::Fetch, 12, 3);
    assert!(polled_at.elapsed() < max_wait, "woken, not timed out");
    assert_eq!(f.error_code, 0);
    let p = &f.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    let values = common::wire::record_values(p.records.as_ref().unwrap());
    assert_eq!(values, ["after"]);

    // The bystander is still served; the partition is intact.
    assert_eq!(produce(&mut other, 4, "bystander"), 2);
    let f: FetchResponse = call(
        &mut fresh,
        ApiKey::Fetch,
        12,
        2,
        &fetch_req(0, Duration::ZERO),
    );
    let p = &f.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (0, 3));
    let records = p.records.as_ref().unwrap();
    let values = common::wire::record_values(records);
    assert_eq!(values, ["before", "after", "bystander"]);

    assert_eq!(shoal.metric("shoal_handler_panics_total"), 2);
    let log = shoal.log_lines();
    for what in ["Metadata v12", "Produce v9"] {
        assert!(
            log.iter()
                .any(|l| l.contains("ERROR") && l.contains(what) && l.contains("panicked")),
            "no error line for {what}: {log:#?}"
        );
    }
    shoal.stop();
}
