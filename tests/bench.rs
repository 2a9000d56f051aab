//! `shoal bench fanout` end to end: the real binary against its embedded broker, in short runs with
//! small sizes. The JSON summary must carry every figure, every consumer must have received every
//! record, latencies must be positive and ordered; the raw baseline, the coalescing comparison, the
//! catch-up workload and the sweep's SVG plot are exercised too.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `shoal bench fanout ARGS --json FILE` (killed after 120 s) and returns (exit ok, stdout,
/// the JSON summary).
fn bench(dir: &Path, args: &[&str]) -> (bool, String, Value) {
    let json = dir.join("summary.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["bench", "fanout"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .env("TMPDIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoal binary starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("bench fanout {args:?} ran for more than 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        json.exists(),
        "no JSON summary ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap())
        .expect("the summary is JSON");
    if !status.success() {
        println!("stdout:\n{stdout}\nstderr:\n{stderr}");
    }
    (status.success(), stdout, summary)
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for key in path.split('.') {
        cur = &cur[key];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {cur}"))
}

fn has(v: &Value, path: &str) -> bool {
    let mut cur = v;
    for key in path.split('.') {
        match cur.get(key) {
            Some(next) => cur = next,
            None => return false,
        }
    }
    true
}

/// Every field of a Kafka run, and the checks every run must pass.
fn check_run(run: &Value) {
    for field in [
        "label",
        "kind",
        "topic",
        "partitions",
        "producers",
        "consumers_per_partition",
        "consumers",
        "message_bytes",
        "records_per_batch",
        "coalescing",
        "warmup_s",
        "measured_s",
        "produced.records",
        "produced.bytes",
        "produced.msg_per_s",
        "produced.mb_per_s",
        "delivered.records",
        "delivered.bytes",
        "delivered.msg_per_s",
        "delivered.mb_per_s",
        "delivered.slowest_consumer_msg_per_s",
        "delivered.slowest_consumer_mb_per_s",
        "delivered.fetches",
        "delivered.mean_fetch_bytes",
        "publish_latency_us",
        "e2e_latency_us",
        "totals.produced_records",
        "totals.acked_records",
        "totals.consumed_records",
        "totals.consumed_bytes",
        "totals.backlog_records",
        "errors.count",
        "errors.produce",
        "errors.consume",
        "errors.messages",
        "correctness.checked",
        "correctness.all_received",
        "correctness.consumers",
        "correctness.complete_consumers",
        "correctness.expected_records",
        "correctness.received_records",
        "correctness.gaps",
        "correctness.final_offsets",
        "correctness.drain_s",
        "correctness.incomplete",
        "generator.cpu_s",
        "generator.cores",
        "generator.cpu_s_per_delivered_gb",
        "server.observed",
        "server.cpu_s",
        "server.cores",
        "server.cpu_s_per_delivered_gb",
        "server.peak_rss_bytes",
        "server.peak_rss_includes_generator",
        "server.fetch.coalescer_reads",
        "server.fetch.coalescer_inflight_hits",
        "server.fetch.coalescer_ready_hits",
        "server.fetch.coalescer_hit_ratio",
        "server.fetch.log_read_bytes",
        "server.fetch.response_bytes",
        "server.fetch.fan_out_saving",
        "raw_baseline_fraction",
    ] {
        assert!(has(run, field), "run summary lacks {field}: {run:#}");
    }
    assert_eq!(run["kind"], "kafka");
    assert!(
        run["correctness"]["all_received"] == true,
        "some consumer missed records: {:#}",
        run["correctness"]
    );
    assert_eq!(
        num(run, "correctness.complete_consumers"),
        num(run, "consumers")
    );
    assert_eq!(
        num(run, "correctness.received_records"),
        num(run, "correctness.expected_records")
    );
    assert_eq!(num(run, "errors.count"), 0.0, "{:#}", run["errors"]);
    assert!(num(run, "produced.records") > 0.0);
    assert!(num(run, "delivered.records") > 0.0);
    assert!(num(run, "delivered.bytes") >= num(run, "delivered.records"));
    for lat in ["publish_latency_us", "e2e_latency_us"] {
        let l = &run[lat];
        let (p50, p99, p999, p9999, max) = (
            num(l, "p50"),
            num(l, "p99"),
            num(l, "p99_9"),
            num(l, "p99_99"),
            num(l, "max"),
        );
        assert!(num(l, "samples") > 0.0, "{lat}: no samples");
        assert!(p50 > 0.0, "{lat}: p50 {p50}");
        assert!(
            p50 <= p99 && p99 <= p999 && p999 <= p9999 && p9999 <= max,
            "{lat} out of order: {l}"
        );
        assert!(max < 60e6, "{lat}: max {max} us");
    }
    assert!(num(run, "generator.cpu_s") >= 0.0);
    assert!(num(run, "server.cpu_s") >= 0.0);
    assert!(num(run, "server.peak_rss_bytes") > 0.0);
}

#[test]
fn short_run_reports_every_field_and_every_consumer_gets_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, s) = bench(
        dir.path(),
        &[
            "--consumers",
            "3",
            "--partitions",
            "2",
            "--producers",
            "2",
            "--message-bytes",
            "100",
            "--batch-bytes",
            "1KiB",
            "--rate",
            "4000",
            "--duration",
            "2s",
            "--warmup",
            "500ms",
        ],
    );
    assert!(ok, "{stdout}");
    for field in [
        "tool",
        "version",
        "broker",
        "config",
        "runs",
        "raw_baselines",
        "comparisons",
        "ok",
    ] {
        assert!(has(&s, field), "summary lacks {field}");
    }
    assert_eq!(s["ok"], true);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    check_run(run);
    assert_eq!(num(run, "consumers"), 6.0);
    assert_eq!(num(run, "records_per_batch"), 10.0);
    // About the asked rate: 4000 msg/s over 2 s.
    let produced = num(run, "produced.msg_per_s");
    assert!(
        (2000.0..=6000.0).contains(&produced),
        "produced {produced} msg/s"
    );
    // Every consumer gets every record: delivery is the produce rate times the fan-out.
    assert!(num(run, "totals.consumed_records") == 3.0 * num(run, "totals.produced_records"));
    assert!(
        stdout.contains("produce") && stdout.contains("e2e p50"),
        "live lines: {stdout}"
    );
    assert!(stdout.contains("correctness      OK"), "{stdout}");
}

#[test]
fn raw_baseline_runs_and_is_compared() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, s) = bench(
        dir.path(),
        &[
            "--consumers",
            "2",
            "--rate",
            "2MB/s",
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--raw-baseline",
            "--quiet",
        ],
    );
    assert!(ok, "{stdout}");
    check_run(&s["runs"][0]);
    let raw = &s["raw_baselines"][0];
    assert_eq!(raw["kind"], "raw-baseline");
    assert_eq!(num(raw, "consumers"), 2.0);
    assert!(num(raw, "delivered.records") > 0.0);
    assert!(num(raw, "delivered.mb_per_s") > 0.0);
    assert_eq!(num(raw, "errors.count"), 0.0, "{:#}", raw["errors"]);
    let fraction = num(&s["runs"][0], "raw_baseline_fraction");
    assert!(fraction > 0.0 && fraction.is_finite(), "{fraction}");
    assert!(stdout.contains("of the raw baseline"), "{stdout}");
}

#[test]
fn coalescing_on_and_off_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, s) = bench(
        dir.path(),
        &[
            "--consumers",
            "4",
            "--message-bytes",
            "200",
            "--rate",
            "5000",
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--compare",
            "coalescing",
            "--quiet",
        ],
    );
    assert!(ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    runs.iter().for_each(check_run);
    assert_eq!(runs[0]["coalescing"], true);
    assert_eq!(runs[1]["coalescing"], false);
    assert_ne!(
        runs[0]["topic"], runs[1]["topic"],
        "each run has its own topic"
    );
    // Off: every fetch reads for itself; on: reads are shared.
    let off = &runs[1]["server"]["fetch"];
    assert_eq!(num(off, "coalescer_hit_ratio"), 0.0);
    assert_eq!(num(off, "log_read_bytes"), num(off, "response_bytes"));
    let on = &runs[0]["server"]["fetch"];
    assert!(
        num(on, "log_read_bytes") < num(on, "response_bytes"),
        "{on}"
    );
    let c = &s["comparisons"][0];
    for field in [
        "delivered_mb_per_s_ratio",
        "e2e_p99_ratio",
        "broker_cpu_s_per_gb_ratio",
        "log_read_bytes_ratio",
    ] {
        assert!(num(c, field) > 0.0, "{field}: {c}");
    }
    assert!(stdout.contains("on/off"), "{stdout}");
}

#[test]
fn catch_up_with_backlog_compression_and_acks_all() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, s) = bench(
        dir.path(),
        &[
            "--consumers",
            "3",
            "--backlog",
            "2MiB",
            "--rate",
            "2000",
            "--acks",
            "all",
            "--compression",
            "lz4",
            "--duration",
            "1s",
        ],
    );
    assert!(ok, "{stdout}");
    let run = &s["runs"][0];
    check_run(run);
    let backlog = num(run, "totals.backlog_records");
    assert!(backlog >= 2048.0, "backlog of {backlog} records");
    // Consumers started at the beginning: they received the backlog and what followed.
    assert_eq!(
        num(run, "totals.consumed_records"),
        3.0 * num(run, "totals.produced_records")
    );
    assert!(stdout.contains("backlog:"), "{stdout}");
}

/// Checks that `svg` is well formed enough for a browser: one root `<svg>` element, every tag closed
/// in order, attributes quoted.
fn check_svg(svg: &str) {
    assert!(
        svg.starts_with("<svg"),
        "starts with {:?}",
        &svg[..20.min(svg.len())]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    let mut elements = 0;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("unterminated tag") + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "'<' inside a tag: {tag}");
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            let top = stack
                .pop()
                .unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(top, name.trim(), "</{name}> closes <{top}>");
        } else {
            elements += 1;
            let name = tag
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches('/');
            assert!(!name.is_empty(), "empty tag");
            if !tag.ends_with('/') {
                stack.push(name.to_string());
            }
        }
        rest = &rest[close + 1..];
        if stack.is_empty() {
            assert!(rest.trim().is_empty(), "content after the root element");
        }
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    assert!(elements > 20, "only {elements} elements");
}

#[test]
fn sweep_draws_a_valid_svg() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("fanout.svg");
    let (ok, stdout, s) = bench(
        dir.path(),
        &[
            "--sweep",
            "consumers=1,4",
            "--rate",
            "2000",
            "--message-bytes",
            "100",
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--quiet",
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    assert!(ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    runs.iter().for_each(check_run);
    assert_eq!(num(&runs[0], "consumers_per_partition"), 1.0);
    assert_eq!(num(&runs[1], "consumers_per_partition"), 4.0);
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    check_svg(&svg);
    assert!(svg.contains("consumers per partition"));
    assert!(svg.contains("delivered throughput") && svg.contains("p99"));
    assert_eq!(svg.matches("<polyline").count(), 2, "one line per panel");
}
