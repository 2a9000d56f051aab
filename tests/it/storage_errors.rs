//! A full disk, as an operator sees it: the data directory on a small tmpfs, acks=all produces until
//! the disk refuses them. The broker logs the failure once (with the file and the OS error) however
//! many produces fail, counts each in `shoal_storage_errors_total`, shows the partition in
//! `shoal_partitions_storage_failing` and in `/v1/status`; once the file system grows, the next
//! produce succeeds, the broker logs once that appends resume, and the gauge and status clear.
//!
//! Mounting a tmpfs needs root (CI and the development machines run as root).

use crate::common;
#[path = "../../shards/tests/support/mount.rs"]
mod mount;

use common::wire::{call, connect, produce_request};
use common::{create_topics, Shoal};
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use shards::batch::BatchBuilder;
use std::net::TcpStream;
use std::path::Path;

const TOPIC: &str = "full";
const KAFKA_STORAGE_ERROR: i16 = 56;

/// Produces one record of `len` bytes (acks=all) and returns (error code, base offset).
fn produce(s: &mut TcpStream, correlation: i32, len: usize) -> (i16, i64) {
    let mut b = BatchBuilder::new(1_700_000_000_000);
    b.push(1_700_000_000_000, None, Some(&vec![7u8; len]), &[]);
    let req = produce_request(TOPIC, 0, b.finish(0), -1);
    let r: ProduceResponse = call(s, ApiKey::Produce, 9, correlation, &req);
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// The server's log lines about the partition's directory.
fn lines_about(shoal: &Shoal, dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    shoal
        .log_lines()
        .into_iter()
        .filter(|l| l.contains(&dir))
        .collect()
}

#[test]
fn a_full_disk_is_logged_counted_and_shown_until_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mount) = mount::tmpfs_or_skip(
        dir.path(),
        "2m",
        "a_full_disk_is_logged_counted_and_shown_until_it_clears",
    ) else {
        return;
    };
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 1)]);
    let partition_dir = dir.path().join("topics").join(TOPIC).join("0");
    assert_eq!(shoal.metric("shoal_storage_errors_total"), 0);
    assert_eq!(shoal.metric("shoal_partitions_storage_failing"), 0);

    let mut s = connect(shoal.ports[0]);
    let mut acked = 0i64;
    let mut correlation = 0;
    loop {
        correlation += 1;
        let (code, base) = produce(&mut s, correlation, 64 << 10);
        if code == KAFKA_STORAGE_ERROR {
            break;
        }
        assert_eq!((code, base), (0, acked), "produce {correlation}");
        acked += 1;
        assert!(acked < 100, "2 MiB should fill up long before 100 x 64 KiB");
    }
    // More failures in the same episode.
    for _ in 0..4 {
        correlation += 1;
        assert_eq!(
            produce(&mut s, correlation, 64 << 10).0,
            KAFKA_STORAGE_ERROR
        );
    }
    assert_eq!(
        shoal.metric_with("shoal_storage_errors_total", "core=\"0\""),
        5
    );
    assert_eq!(shoal.metric("shoal_partitions_storage_failing"), 1);
    let (_, status) = shoal.admin_get("/v1/status");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let failures = status["storage_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{status}");
    assert_eq!(failures[0]["topic"], TOPIC);
    assert_eq!(failures[0]["partition"], 0);
    let error = failures[0]["error"].as_str().unwrap();
    assert!(error.contains("No space left on device"), "{error}");
    assert_eq!(status["cores"][0]["storage_errors"], 5);
    assert_eq!(status["cores"][0]["storage_failing"], 1);
    let lines = lines_about(&shoal, &partition_dir);
    assert_eq!(lines.len(), 1, "logged once for five failures: {lines:#?}");
    assert!(lines[0].contains("ERROR"), "{}", lines[0]);
    assert!(
        lines[0].contains("No space left on device (os error 28)"),
        "{}",
        lines[0]
    );

    // Room again: the next produce is written, at the next offset, and the episode ends.
    mount.resize("16m");
    correlation += 1;
    assert_eq!(produce(&mut s, correlation, 64 << 10), (0, acked));
    correlation += 1;
    assert_eq!(produce(&mut s, correlation, 64 << 10), (0, acked + 1));
    assert_eq!(shoal.metric("shoal_storage_errors_total"), 5);
    assert_eq!(shoal.metric("shoal_partitions_storage_failing"), 0);
    let (_, status) = shoal.admin_get("/v1/status");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["storage_failures"],
        serde_json::json!([]),
        "{status}"
    );
    assert_eq!(status["cores"][0]["storage_failing"], 0);
    let lines = lines_about(&shoal, &partition_dir);
    assert_eq!(lines.len(), 2, "the failure, then its end: {lines:#?}");
    assert!(lines[1].contains("WARN"), "{}", lines[1]);
    assert!(lines[1].contains("storage works again"), "{}", lines[1]);
    drop(s);
    shoal.stop();
}
