//! The admin endpoint against the real binary: it runs on its own thread, so admin clients that
//! never finish their request delay neither Kafka requests on core 0 nor other admin requests, nor
//! hold up a stop.

use crate::common;

use common::wire::{call, connect};
use common::Shoal;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Admin clients that opened a connection, sent part of a request and went quiet: half a head, or
/// a whole head and half its body.
fn stuck_admin_clients(admin: &str) -> Vec<TcpStream> {
    let mut stuck = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(admin).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAcc")
            .unwrap();
        stuck.push(s);
        let mut s = TcpStream::connect(admin).unwrap();
        s.write_all(b"PUT /v1/config/view_sharing HTTP/1.1\r\nContent-Length: 3\r\n\r\no")
            .unwrap();
        stuck.push(s);
    }
    stuck
}

#[test]
fn stuck_admin_clients_delay_neither_kafka_on_core_0_nor_other_admin_requests() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let stuck = stuck_admin_clients(&shoal.admin);
    std::thread::sleep(Duration::from_millis(200));

    let mut kafka = connect(shoal.ports[0]);
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("admin-test"))
        .with_client_software_version(StrBytes::from_static_str("1.0"));
    let mut slowest = Duration::ZERO;
    for correlation in 0..50 {
        let started = Instant::now();
        let r: ApiVersionsResponse =
            call(&mut kafka, ApiKey::ApiVersions, 3, correlation, &request);
        assert_eq!(r.error_code, 0);
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a Kafka request on core 0 took {slowest:?} beside stuck admin clients"
    );

    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        for path in ["/metrics", "/v1/status"] {
            let started = Instant::now();
            let (status, body) = shoal.admin_get(path);
            assert_eq!(status, "HTTP/1.1 200 OK", "{path}: {body}");
            slowest = slowest.max(started.elapsed());
        }
    }
    assert!(
        slowest < Duration::from_secs(2),
        "an admin request took {slowest:?} beside stuck admin clients"
    );
    // Settings still reach every core.
    let (status, _) = shoal.admin_request("PUT", "/v1/config/fetch_coalescing", "off");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(shoal.metric("shoal_fetch_coalescer_enabled"), 0);

    // Nor do they hold up a stop (SIGTERM; the Kafka connection is closed first, so the cores have
    // nothing to drain).
    drop(kafka);
    let stopping = Instant::now();
    shoal.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(4),
        "stopping took {:?} with stuck admin clients",
        stopping.elapsed()
    );
    drop(stuck);
}

#[test]
fn admin_answers_every_path_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let (status, body) = shoal.admin_get("/nope");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert_eq!(
        body,
        "not found: try /console, /metrics, /v1/status or /v1/config\n"
    );
    let (status, body) = shoal.admin_request("DELETE", "/v1/status", "");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert_eq!(
        body,
        "only GET is served (PUT or POST on /v1/config/<name>)\n"
    );
    let (status, body) = shoal.admin_request("POST", "/v1/config/view_sharing?value=off", "");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, "{\"view_sharing\":\"off\"}\n");
    assert_eq!(
        shoal.metric("shoal_view_sharing_enabled"),
        0,
        "off on both cores"
    );
    // Live settings read back as JSON, in the words a request uses.
    shoal.admin_request("PUT", "/v1/config/read_replicas", "all");
    let (status, body) = shoal.admin_get("/v1/config");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let all: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(all["view_sharing"], "off");
    assert_eq!(all["read_replicas"], "all");
    assert_eq!(all["fetch_coalescing"], "on");
    assert!(all["max_delta_for_fanout"].is_u64(), "{body}");
    assert!(all["group_lag_interval_ms"].is_u64(), "{body}");
    let (status, body) = shoal.admin_get("/v1/config/read_replicas");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, "{\"read_replicas\":\"all\"}\n");
    let (status, body) = shoal.admin_get("/v1/config/nonsense");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert!(body.contains("read_replicas"), "{body}");
    let (status, body) = shoal.admin_get(&format!("/metrics?{}", "x".repeat(20 << 10)));
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    assert_eq!(body, "request too large\n");
    let (status, body) = shoal.admin_get("/v1/status");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["cores"][1]["port"], shoal.ports[1]);
    assert_eq!(json["settings"]["read_replicas"], "all", "{body}");
    shoal.stop();
}

#[test]
fn a_bearer_token_guards_every_admin_path_but_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, "s3cr3t-token-of-some-length\n").unwrap();
    let data = dir.path().join("data");
    let shoal = Shoal::start(
        &data,
        1,
        &[
            "--admin-token-file",
            token_file.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let good = "Authorization: Bearer s3cr3t-token-of-some-length\r\n";
    let bad = "Authorization: Bearer s3cr3t-token-of-some-lengtH\r\n";
    for (method, path, body) in [
        ("GET", "/v1/status", ""),
        ("PUT", "/v1/config/fetch_coalescing", "off"),
    ] {
        for headers in ["", bad] {
            let (status, _) = shoal.admin_request_with(method, path, headers, body);
            assert!(
                status.contains("401"),
                "{method} {path} {headers:?}: {status}"
            );
        }
        let (status, _) = shoal.admin_request_with(method, path, good, body);
        assert!(status.contains("200"), "{method} {path}: {status}");
    }
    let (status, body) = shoal.admin_get("/metrics");
    assert!(
        status.contains("200") && body.contains("shoal_partitions"),
        "{status}"
    );
    // The metrics address serves /metrics to anyone, and nothing else.
    let metrics = shoal.metrics.clone().expect("a metrics address");
    let get = |path: &str| {
        let mut s = TcpStream::connect(&metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
        out
    };
    let m = get("/metrics");
    assert!(
        m.starts_with("HTTP/1.1 200") && m.contains("shoal_partitions"),
        "{m}"
    );
    assert!(get("/v1/status").starts_with("HTTP/1.1 404"));
    // A token too short to be one is refused at start.
    std::fs::write(&token_file, "short").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--cores",
            "1",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("other"))
        .arg("--admin-token-file")
        .arg(&token_file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16 characters"));
}
