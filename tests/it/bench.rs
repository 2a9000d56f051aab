//! `shoal bench fanout` end to end: the real binary against its embedded broker, in short runs with
//! small sizes. The JSON summary must carry every figure, every consumer must have received every
//! record, byte counts must fit the records (and the codec), latencies must be ordered and spread
//! and within the run; the raw baseline (compared with unpaced runs only), the coalescing
//! comparison, the catch-up workload (compressed and not) and the sweep's SVG plot are exercised
//! too. Each run's topic is its own (fresh, deleted after it unless kept; a named one holding
//! records refused where the consumers would read them), cautions say when figures mislead, byte
//! rates are in one unit, and the embedded broker's ports can be chosen.

use crate::common;
use crate::common::cli::topic;

use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A short paced run with two consumers, for tests of how the generator connects.
const SHORT_RUN: [&str; 11] = [
    "--consumers",
    "2",
    "--message-bytes",
    "200",
    "--rate",
    "3000",
    "--duration",
    "1s",
    "--warmup",
    "300ms",
    "--quiet",
];

/// One `shoal bench fanout` invocation.
struct Bench {
    ok: bool,
    stdout: String,
    /// The JSON summary.
    summary: Value,
    /// Wall-clock time of the whole process in microseconds: no latency of any run can exceed it.
    wall_us: f64,
}

/// Reads a child's pipe to the end on a thread of its own, so a chatty child never blocks on a
/// full pipe.
fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = pipe.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
}

/// One load generator at a time: each pins its broker and clients to the machine's CPUs and
/// checks rates and CPU figures, which several at once on a small machine would distort.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `shoal bench fanout ARGS --json FILE` (killed after 120 s).
fn bench(dir: &Path, args: &[&str]) -> Bench {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let json = dir.join("summary.json");
    let _ = std::fs::remove_file(&json);
    let started = Instant::now();
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
    let stdout = collect(child.stdout.take().expect("piped stdout"));
    let stderr = collect(child.stderr.take().expect("piped stderr"));
    let deadline = started + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let wall_us = started.elapsed().as_secs_f64() * 1e6;
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    let Some(status) = status else {
        panic!(
            "bench fanout {args:?} ran for more than 120 s; stdout:\n{stdout}\nstderr:\n{stderr}"
        );
    };
    assert!(
        json.exists(),
        "no JSON summary ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap())
        .expect("the summary is JSON");
    if !status.success() {
        println!("stdout:\n{stdout}\nstderr:\n{stderr}");
    }
    Bench {
        ok: status.success(),
        stdout,
        summary,
        wall_us,
    }
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

/// Every field of a Kafka run of `b`, and the checks every run must pass.
fn check_run(b: &Bench, run: &Value) {
    for field in [
        "label",
        "kind",
        "topic",
        "partitions",
        "producers",
        "producer_mode.mode",
        "producer_mode.commit_interval_ms",
        "producer_mode.commits",
        "producer_mode.mean_end_txn_us",
        "consumers_per_partition",
        "consumers",
        "message_bytes",
        "records_per_batch",
        "coalescing",
        "views",
        "view_sharing",
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
        "totals.backlog_bytes",
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
        "correctness.log_records",
        "correctness.produced_records",
        "correctness.log_is_the_runs",
        "topic_deleted",
        "cautions",
        "generator.cpu_s",
        "generator.cores",
        "generator.cpu_s_per_delivered_gb",
        "server.observed",
        "server.cpu_s",
        "server.cores",
        "server.cpu_s_per_delivered_gb",
        "server.cpu_us_per_fetch",
        "server.peak_rss_bytes",
        "server.peak_rss_includes_generator",
        "server.rss_at_consumers_start_bytes",
        "server.peak_rss_since_consumers_start",
        "server.peak_rss_growth_bytes",
        "server.views",
        "server.fetch.coalescer_reads",
        "server.fetch.coalescer_inflight_hits",
        "server.fetch.coalescer_ready_hits",
        "server.fetch.coalescer_hit_ratio",
        "server.fetch.log_read_bytes",
        "server.fetch.response_bytes",
        "server.fetch.fan_out_saving",
        "server.device",
        "raw_baseline_fraction",
        "disk_baseline_fraction",
    ] {
        assert!(has(run, field), "run summary lacks {field}: {run:#}");
    }
    // Every run produces, so shoal's disk histograms saw its writes (an absent or zero figure
    // would mean the bench no longer reads them).
    assert!(
        num(run, "server.device.writes.count") > 0.0,
        "{:#}",
        run["server"]["device"]
    );
    // The broker's CPU per fetch response is its CPU over the responses the consumers counted.
    if !run["server"]["cpu_s"].is_null() && num(run, "delivered.fetches") > 0.0 {
        let expected = num(run, "server.cpu_s") * 1e6 / num(run, "delivered.fetches");
        let per_fetch = num(run, "server.cpu_us_per_fetch");
        assert!(
            (per_fetch - expected).abs() <= 1e-6 * expected.max(1.0),
            "{per_fetch} us per fetch, expected {expected}"
        );
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
    // The consumers read the run's records and no others.
    assert_eq!(run["correctness"]["log_is_the_runs"], true);
    assert_eq!(
        num(run, "correctness.log_records"),
        num(run, "totals.produced_records"),
        "{:#}",
        run["correctness"]
    );
    assert_eq!(num(run, "errors.count"), 0.0, "{:#}", run["errors"]);
    assert!(num(run, "produced.records") > 0.0);
    assert!(num(run, "delivered.records") > 0.0);
    // Bytes are whole record batches as sent: every record carries its value, unless compressed.
    let config = &b.summary["config"];
    let message_bytes = num(run, "message_bytes");
    let value_bytes = |records: &str| num(run, records) * message_bytes;
    if config["compression"] == "none" {
        assert!(
            num(run, "delivered.bytes") >= value_bytes("delivered.records"),
            "{:#}",
            run["delivered"]
        );
        assert!(num(run, "totals.consumed_bytes") >= value_bytes("totals.consumed_records"));
        assert!(num(run, "totals.produced_bytes") >= value_bytes("totals.produced_records"));
    } else {
        assert!(num(run, "totals.consumed_bytes") < value_bytes("totals.consumed_records"));
        assert!(num(run, "totals.produced_bytes") < value_bytes("totals.produced_records"));
    }
    // The totals include the backlog, in every figure.
    assert!(num(run, "totals.produced_records") >= num(run, "totals.backlog_records"));
    assert!(num(run, "totals.produced_bytes") >= num(run, "totals.backlog_bytes"));
    if config["acks"] != 0 {
        assert_eq!(
            num(run, "totals.acked_records"),
            num(run, "totals.produced_records"),
            "every produced record is acknowledged: {:#}",
            run["totals"]
        );
    }
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
        assert!(
            p50 <= p99 && p99 <= p999 && p999 <= p9999 && p9999 <= max,
            "{lat} out of order: {l}"
        );
        // Latencies vary, and none can outlast the process that measured it.
        assert!(p50 < p9999, "{lat}: no spread: {l}");
        assert!(
            max < b.wall_us,
            "{lat}: max {max} us in a {} us run",
            b.wall_us
        );
    }
    assert!(num(run, "generator.cpu_s") > 0.0);
    assert!(num(run, "server.cpu_s") > 0.0);
    assert!(num(run, "server.peak_rss_bytes") > 0.0);
    // The run's peak counts from its consumers' start (in process too: /proc/self/clear_refs).
    assert_eq!(run["server"]["peak_rss_since_consumers_start"], true);
    assert_eq!(
        num(run, "server.peak_rss_growth_bytes"),
        num(run, "server.peak_rss_bytes") - num(run, "server.rss_at_consumers_start_bytes")
    );
}

#[test]
fn short_run_reports_every_field_and_every_consumer_gets_everything() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
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
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
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
        assert!(has(s, field), "summary lacks {field}");
    }
    assert_eq!(s["ok"], true);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    check_run(&b, run);
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
fn raw_baseline_is_the_ceiling_of_an_unpaced_run() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
        dir.path(),
        &[
            "--consumers",
            "2",
            "--rate",
            "0",
            "--compression",
            "lz4",
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--raw-baseline",
            "--quiet",
        ],
    );
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let run = &s["runs"][0];
    check_run(&b, run);
    let raw = &s["raw_baselines"][0];
    assert_eq!(raw["kind"], "raw-baseline");
    assert_eq!(num(raw, "consumers"), 2.0);
    assert!(num(raw, "delivered.records") > 0.0);
    assert!(num(raw, "delivered.mb_per_s") > 0.0);
    assert_eq!(num(raw, "errors.count"), 0.0, "{:#}", raw["errors"]);
    // The raw server sends the same batches, compressed alike: a delivered byte means the same.
    let per_record = |r: &Value| num(r, "delivered.bytes") / num(r, "delivered.records");
    let (raw_b, run_b) = (per_record(raw), per_record(run));
    assert!(
        raw_b < num(raw, "message_bytes"),
        "raw batches are not compressed: {raw_b} B/record"
    );
    assert!(
        (0.8..1.25).contains(&(raw_b / run_b)),
        "raw baseline {raw_b} B/record, run {run_b} B/record"
    );
    let fraction = num(run, "raw_baseline_fraction");
    assert!(fraction > 0.0 && fraction.is_finite(), "{fraction}");
    let expected = num(run, "delivered.mb_per_s") / num(raw, "delivered.mb_per_s");
    assert!(
        (fraction - expected).abs() < 1e-9 * expected,
        "{fraction} vs {expected}"
    );
    assert!(stdout.contains("of the raw baseline"), "{stdout}");
    // Unpaced producers: the latency is the producers' queue's, and the report says so.
    let cautions = run["cautions"].as_array().unwrap();
    assert!(
        cautions
            .iter()
            .any(|c| c.as_str().unwrap().contains("not paced (--rate 0)")),
        "{cautions:?}"
    );
    assert!(
        stdout.contains("caution          the producers are not paced"),
        "{stdout}"
    );
}

/// Two consumers paced at 2 MB/s for a second, with the raw baseline after them.
const PACED_RAW_BASELINE: [&str; 10] = [
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
];

#[test]
fn a_paced_raw_baseline_delivers_the_pace_and_is_compared_by_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(dir.path(), &PACED_RAW_BASELINE);
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let run = &s["runs"][0];
    check_run(&b, run);
    let raw = &s["raw_baselines"][0];
    assert_eq!(raw["kind"], "raw-baseline");
    assert!(num(raw, "delivered.mb_per_s") > 0.0);
    assert_eq!(num(raw, "errors.count"), 0.0, "{:#}", raw["errors"]);
    // Paced, the raw server delivers the run's pace (2 consumers x 2 MB/s), not its ceiling (GB/s).
    let paced = num(raw, "delivered.mb_per_s");
    assert!(
        paced < 4.0 * 3.0,
        "the raw baseline ignored --rate: {paced} MB/s"
    );
    // Compared by CPU per delivered GB, not by a share of its delivery.
    assert!(run["raw_baseline_fraction"].is_null(), "{run:#}");
    if !run["server"]["cpu_s_per_delivered_gb"].is_null() {
        assert!(num(run, "raw_cpu_ratio") > 0.0, "{run:#}");
    }
    assert!(stdout.contains("the paced raw server's"), "{stdout}");
    assert!(!stdout.contains("of the raw baseline's"), "{stdout}");
}

#[test]
fn coalescing_on_and_off_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
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
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    runs.iter().for_each(|r| check_run(&b, r));
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
    // One run each: the ratios come with a caution.
    assert!(
        c["caution"]
            .as_str()
            .is_some_and(|t| t.contains("--repeat 3")),
        "{c}"
    );
    assert!(stdout.contains(SINGLE_RUN_CAUTION), "{stdout}");
}

/// The caution under a comparison of single runs.
const SINGLE_RUN_CAUTION: &str =
    "caution              one run each: single runs of the same build differ by 10-20%";

/// `--repeat 3`: on, off and the raw server in turn, three times; the comparison, the table and the
/// JSON's medians are the medians of the three.
#[test]
fn repeated_runs_are_compared_by_their_medians() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
        dir.path(),
        &[
            "--consumers",
            "2",
            "--message-bytes",
            "200",
            "--rate",
            "0",
            "--duration",
            "500ms",
            "--warmup",
            "200ms",
            "--compare",
            "coalescing",
            "--raw-baseline",
            "--repeat",
            "3",
            "--quiet",
        ],
    );
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "three repeats of on and off");
    runs.iter().for_each(|r| check_run(&b, r));
    // In turn: on, off, on, off, ...; every run on a topic of its own.
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r["coalescing"], i % 2 == 0, "run {i}");
    }
    let topics: std::collections::HashSet<_> = runs.iter().map(|r| r["topic"].clone()).collect();
    assert_eq!(topics.len(), 6);
    let raws = s["raw_baselines"].as_array().unwrap();
    assert_eq!(raws.len(), 3, "a raw server per repeat");
    let medians = s["medians"].as_array().unwrap();
    assert_eq!(medians.len(), 2, "one per setting");
    let median_of = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[1]
    };
    for (m, first) in medians.iter().zip([0, 1]) {
        let ix: Vec<usize> = m["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(ix, vec![first, first + 2, first + 4]);
        for path in [
            "delivered.mb_per_s",
            "produced.mb_per_s",
            "server.cpu_s_per_delivered_gb",
            "e2e_latency_us.p99",
        ] {
            let mut v: Vec<f64> = ix.iter().map(|&i| num(&runs[i], path)).collect();
            let lowest = v.iter().copied().fold(f64::MAX, f64::min);
            let highest = v.iter().copied().fold(0.0, f64::max);
            let expected = median_of(&mut v);
            let got = num(&m["median"], path);
            assert!(
                (got - expected).abs() <= 1e-9 * expected.abs().max(1.0),
                "{path}: median {got}, runs {v:?}"
            );
            if path == "delivered.mb_per_s" {
                let spread = &m["delivered_mb_per_s"];
                assert_eq!(num(spread, "min"), lowest);
                assert_eq!(num(spread, "max"), highest);
                assert_eq!(num(spread, "median"), expected);
            }
        }
        // Against the median raw server.
        let raw_median = num(
            &s["raw_baseline_medians"][0]["median"],
            "delivered.mb_per_s",
        );
        let mut raw_v: Vec<f64> = raws.iter().map(|r| num(r, "delivered.mb_per_s")).collect();
        assert_eq!(raw_median, median_of(&mut raw_v));
        let fraction = num(&m["median"], "raw_baseline_fraction");
        let expected = num(&m["median"], "delivered.mb_per_s") / raw_median;
        assert!(
            (fraction - expected).abs() < 1e-9 * expected,
            "{fraction} vs {expected}"
        );
    }
    // Each run against its own repeat's raw server.
    for (i, r) in runs.iter().enumerate() {
        let raw = &raws[i / 2];
        let expected = num(r, "delivered.mb_per_s") / num(raw, "delivered.mb_per_s");
        let fraction = num(r, "raw_baseline_fraction");
        assert!((fraction - expected).abs() < 1e-9 * expected, "run {i}");
    }
    let c = &s["comparisons"][0];
    assert_eq!((num(c, "on_run"), num(c, "off_run")), (0.0, 1.0));
    let ratio = num(&medians[0]["median"], "delivered.mb_per_s")
        / num(&medians[1]["median"], "delivered.mb_per_s");
    assert!((num(c, "delivered_mb_per_s_ratio") - ratio).abs() < 1e-9 * ratio);
    assert!(stdout.contains("(repeat 3/3)"), "{stdout}");
    assert!(
        stdout.contains("median (lowest - highest) of 3 runs each"),
        "{stdout}"
    );
    assert!(
        stdout.contains("== all runs, medians of 3 runs =="),
        "{stdout}"
    );
    // Medians: no caution.
    assert!(c["caution"].is_null(), "{c}");
    assert!(!stdout.contains(SINGLE_RUN_CAUTION), "{stdout}");
}

/// `--views 4`: 2 consumers on each of 4 shard views, readers shared and then not.
#[test]
fn views_with_shared_and_unshared_readers_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
        dir.path(),
        &[
            "--views",
            "4",
            "--consumers",
            "2",
            "--message-bytes",
            "200",
            "--batch-bytes",
            "2KiB",
            "--rate",
            "5000",
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--compare",
            "view-sharing",
            "--quiet",
        ],
    );
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    runs.iter().for_each(|r| check_run(&b, r));
    assert_eq!(runs[0]["view_sharing"], true);
    assert_eq!(runs[1]["view_sharing"], false);
    for r in runs {
        assert_eq!(num(r, "views"), 4.0);
        assert_eq!(num(r, "consumers"), 8.0, "2 per shard view");
        // Each shard got its share: together exactly what was produced, each consumer of a
        // shard the same records.
        assert_eq!(
            num(r, "correctness.received_records"),
            2.0 * num(r, "totals.produced_records"),
            "{:#}",
            r["correctness"]
        );
        let v = &r["server"]["views"];
        assert!(num(v, "source_batches") > 0.0, "{v}");
        assert_eq!(num(v, "decode_errors"), 0.0);
        assert!(num(v, "fetches_served") > 0.0);
    }
    // Shared: each source batch decoded once for all 8 consumers; not shared: once per fetch,
    // so about once per consumer (a fetch may cover several batches, or wait for one).
    let (on, off) = (&runs[0]["server"]["views"], &runs[1]["server"]["views"]);
    assert_eq!(num(on, "decodes_per_source_batch"), 1.0, "{on}");
    assert!(num(off, "decodes_per_source_batch") > 4.0, "{off}");
    assert_eq!(
        num(off, "shard_batches_encoded"),
        num(off, "source_batches_decoded"),
        "a fetch reading for itself builds its own shard's batch only: {off}"
    );
    assert!(num(&s["comparisons"][0], "view_decodes_ratio") < 0.25);
    assert!(stdout.contains("view-sharing on vs off"), "{stdout}");
}

/// `--broker-process`: each run gets a fresh `shoal serve` child, measured on its own and gone at the
/// end.
#[test]
fn a_fresh_broker_process_per_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--broker-process", "--compare", "coalescing"];
    args.extend(SHORT_RUN);
    let b = bench(dir.path(), &args);
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let pids: Vec<u32> = stdout
        .split("child process ")
        .skip(1)
        .map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap()
        })
        .collect();
    assert_eq!(pids.len(), 2, "one child per run: {stdout}");
    assert_ne!(pids[0], pids[1], "{stdout}");
    for pid in &pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "shoal child {pid} outlived the generator"
        );
    }
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (r, pid) in runs.iter().zip(&pids) {
        check_run(&b, r);
        let server = &r["server"];
        assert_eq!(server["observed"], format!("pid {pid}"), "{server}");
        assert_eq!(server["peak_rss_includes_generator"], false);
        assert_eq!(server["peak_rss_since_consumers_start"], true);
        let (peak, start, growth) = (
            num(server, "peak_rss_bytes"),
            num(server, "rss_at_consumers_start_bytes"),
            num(server, "peak_rss_growth_bytes"),
        );
        assert!(start > 0.0 && peak >= start, "{server}");
        assert_eq!(growth, peak - start, "{server}");
    }
    // Each child had its own data directory, under the bench's temporary directory, removed.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("shoal-bench-"))
        .collect();
    assert!(left.is_empty(), "data directories left behind: {left:?}");
}

/// A short run of `mode_args` producers (2, over 2 partitions, 3 consumers each) with
/// `extra` flags: every check of a run, and every produced record delivered to every consumer.
fn producer_mode_run(mode_args: &[&str], extra: &[&str]) -> (Bench, Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--consumers",
        "3",
        "--partitions",
        "2",
        "--producers",
        "2",
        "--message-bytes",
        "200",
        "--batch-bytes",
        "2KiB",
        "--rate",
        "4000",
        "--duration",
        "1500ms",
        "--warmup",
        "300ms",
        "--quiet",
    ];
    args.extend(mode_args);
    args.extend(extra);
    let b = bench(dir.path(), &args);
    assert!(b.ok, "{}", b.stdout);
    let run = b.summary["runs"][0].clone();
    check_run(&b, &run);
    assert!(b.stdout.contains("correctness      OK"), "{}", b.stdout);
    assert_eq!(
        num(&run, "totals.consumed_records"),
        3.0 * num(&run, "totals.produced_records"),
        "{:#}",
        run["totals"]
    );
    (b, run)
}

/// Idempotent producers (here with compressed batches, stamped before compression): every batch
/// is accepted in sequence and delivered; no transaction, no commit.
#[test]
fn idempotent_producers_deliver_everything() {
    let (b, run) = producer_mode_run(&["--idempotent"], &["--compression", "lz4"]);
    let m = &run["producer_mode"];
    assert_eq!(m["mode"], "idempotent", "{m}");
    assert!(
        m["commits"].is_null() && m["commit_interval_ms"].is_null(),
        "{m}"
    );
    assert!(
        b.stdout.contains("producers        idempotent"),
        "{}",
        b.stdout
    );
}

/// Transactional producers commit every 100 ms; read_committed consumers receive every record
/// (past the commit markers) once its transaction is committed, the last one at the end.
#[test]
fn transactional_producers_commit_and_read_committed_consumers_get_everything() {
    let (b, run) = producer_mode_run(
        &["--transactional", "--commit-interval-ms", "100"],
        &["--isolation", "read_committed"],
    );
    let m = &run["producer_mode"];
    assert_eq!(m["mode"], "transactional", "{m}");
    assert_eq!(num(m, "commit_interval_ms"), 100.0);
    // One per producer every 100 ms or so (fewer on a loaded machine), and each producer's last
    // transaction at the end.
    assert!(num(m, "commits") >= 2.0, "{m}");
    assert!(num(m, "mean_end_txn_us") > 0.0, "{m}");
    assert!(
        b.stdout
            .contains("producers        transactional, committing every 100 ms"),
        "{}",
        b.stdout
    );
    // A record is seen at its transaction's commit, not before.
    assert!(
        num(&run, "e2e_latency_us.p50") >= num(&run, "publish_latency_us.p50"),
        "{run:#}"
    );
}

/// `--disk-baseline` measures the broker's own data directory after the run (a writer per
/// partition, alone and under the broker's flush interval) and puts the run's produced MB/s beside
/// it; where the temporary directory does not take Direct I/O it says so and measures nothing.
#[test]
fn a_disk_baseline_beside_the_ingest() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--broker-process",
        "--disk-baseline",
        "--partitions",
        "2",
        "--broker-arg=--flush-ms=500",
    ];
    args.extend(SHORT_RUN);
    let b = bench(dir.path(), &args);
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let run = &s["runs"][0];
    check_run(&b, run);
    let disks = s["disk_baselines"]
        .as_array()
        .expect("a list of disk baselines");
    if disks.is_empty() {
        assert!(stdout.contains("does not take Direct I/O"), "{stdout}");
        assert!(run["disk_baseline_fraction"].is_null(), "{run:#}");
        return;
    }
    let d = &disks[0];
    assert_eq!(num(d, "writers"), 2.0, "{d:#}");
    assert_eq!(num(d, "write_bytes"), (1 << 20) as f64);
    let plain = num(d, "plain.mb_per_s");
    assert!(plain > 0.0, "{d:#}");
    assert!(num(d, "plain.write_latency_us.samples") > 0.0);
    assert_eq!(num(d, "flushed.flush_interval_ms"), 500.0, "{d:#}");
    assert!(
        num(d, "flushed.fdatasync_latency_us.samples") >= 2.0,
        "{d:#}"
    );
    let fraction = num(run, "disk_baseline_fraction");
    assert!(
        (fraction - num(run, "produced.mb_per_s") / plain).abs() < 1e-9,
        "{fraction} {run:#}"
    );
    assert!(stdout.contains("vs disk baseline"), "{stdout}");
    // The baseline's files went with it.
    let dir_of_broker = d["dir"].as_str().unwrap();
    assert!(
        !dir_of_broker.is_empty() && !Path::new(dir_of_broker).exists(),
        "the broker's fresh data directory (and the baseline's files in it) are removed"
    );
}

/// A backlog of 2 MiB (1 KiB messages) caught up by 3 consumers while producing goes on, acks=all.
fn catch_up(codec: &str) {
    const BACKLOG: f64 = (2 << 20) as f64;
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
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
            codec,
            "--duration",
            "1s",
        ],
    );
    let (s, stdout) = (&b.summary, &b.stdout);
    assert!(b.ok, "{stdout}");
    let run = &s["runs"][0];
    check_run(&b, run);
    // The backlog is measured in bytes as sent (compressed ones, with a codec).
    let (records, bytes) = (
        num(run, "totals.backlog_records"),
        num(run, "totals.backlog_bytes"),
    );
    assert!(bytes >= BACKLOG, "backlog of {bytes} bytes");
    let values = records * num(run, "message_bytes");
    if codec == "none" {
        assert!(bytes >= values, "{records} records in {bytes} bytes");
    } else {
        assert!(bytes < values, "{records} records in {bytes} bytes");
    }
    // Producing went on after the backlog, and the totals include both.
    assert!(
        num(run, "totals.produced_records") > records,
        "{:#}",
        run["totals"]
    );
    assert!(
        num(run, "totals.produced_bytes") > bytes,
        "{:#}",
        run["totals"]
    );
    // Consumers started at the beginning: they received the backlog and what followed.
    assert_eq!(
        num(run, "totals.consumed_records"),
        3.0 * num(run, "totals.produced_records")
    );
    assert_eq!(
        num(run, "totals.consumed_bytes"),
        3.0 * num(run, "totals.produced_bytes")
    );
    assert!(stdout.contains("backlog:"), "{stdout}");
}

#[test]
fn catch_up_with_backlog_uncompressed_and_acks_all() {
    catch_up("none");
}

#[test]
fn catch_up_with_backlog_compression_and_acks_all() {
    catch_up("lz4");
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
    let b = bench(
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
    assert!(b.ok, "{}", b.stdout);
    let runs = b.summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    runs.iter().for_each(|r| check_run(&b, r));
    assert_eq!(num(&runs[0], "consumers_per_partition"), 1.0);
    assert_eq!(num(&runs[1], "consumers_per_partition"), 4.0);
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    check_svg(&svg);
    assert!(svg.contains("consumers per partition"));
    assert!(svg.contains("delivered throughput") && svg.contains("p99"));
    // The broker's cost beside them: CPU per delivered GB and the log bytes read.
    assert!(svg.contains("broker CPU per delivered GB"), "{svg}");
    assert!(svg.contains("CPU-s per delivered GB"));
    assert!(svg.contains("log bytes read") && svg.contains("MB/s read from the log"));
    assert_eq!(svg.matches("<polyline").count(), 4, "one line per panel");
}

#[test]
fn a_run_over_tls_delivers_everything() {
    let dir = tempfile::tempdir().unwrap();
    // A CA and the broker's certificate for 127.0.0.1.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let files = dir.path().join("pki");
    std::fs::create_dir_all(&files).unwrap();
    let write = |name: &str, pem: String| {
        let p = files.join(name);
        std::fs::write(&p, pem).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (ca_pem, cert, key) = (
        write("ca.pem", ca.pem()),
        write("server.pem", server.pem()),
        write("server.key", key.serialize_pem()),
    );
    let (cert_arg, key_arg) = (
        format!("--broker-arg=--tls-cert={cert}"),
        format!("--broker-arg=--tls-key={key}"),
    );
    let mut args = vec!["--broker-process", &cert_arg, &key_arg, "--tls-ca", &ca_pem];
    args.extend(SHORT_RUN);
    let b = bench(dir.path(), &args);
    assert!(b.ok, "{}", b.stdout);
    let runs = b.summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    check_run(&b, &runs[0]);
}

#[test]
fn a_run_over_sasl_scram_delivers_everything_and_a_wrong_password_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let added = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args([
            "user",
            "add",
            "bench",
            "--password",
            "bench-pw",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(added.status.success());
    let shoal = common::Shoal::start(&data, 1, &["--sasl-mechanisms", "SCRAM-SHA-512"]);
    let bootstrap = shoal.bootstrap();
    let run = |password: &str| {
        let mut args = vec!["--bootstrap", &bootstrap, "--admin", &shoal.admin];
        args.extend([
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--sasl-username",
            "bench",
        ]);
        args.extend(["--sasl-password", password]);
        args.extend(SHORT_RUN);
        bench(dir.path(), &args)
    };
    let b = run("bench-pw");
    assert!(b.ok, "{}", b.stdout);
    check_run(&b, &b.summary["runs"][0]);
    assert!(
        !std::fs::read_to_string(dir.path().join("summary.json"))
            .unwrap()
            .contains("bench-pw"),
        "the password is not written to --json"
    );
    assert!(shoal.metric("shoal_sasl_authentications_total") >= 3);
    // A wrong password: the generator stops at its first connection and says why.
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["bench", "fanout", "--bootstrap", &bootstrap, "--quiet"])
        .args([
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--sasl-username",
            "bench",
        ])
        .args(["--sasl-password", "guess", "--duration", "1s"])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("SASL authentication failed (58)"), "{said}");
}

#[test]
fn stream_consumers_read_sse_and_websocket_against_a_raw_stream_sender() {
    for protocol in ["sse", "ws"] {
        let dir = tempfile::tempdir().unwrap();
        let b = bench(
            dir.path(),
            &[&["--protocol", protocol][..], &PACED_RAW_BASELINE].concat(),
        );
        let (s, stdout) = (&b.summary, &b.stdout);
        assert!(b.ok, "{protocol}: {stdout}");
        assert!(
            stdout.contains("correctness      OK"),
            "{protocol}: {stdout}"
        );
        let run = &s["runs"][0];
        check_run(&b, run);
        // The raw sender streams the same batches, encoded by shoal's encoder: its consumers
        // count every record, in order (offsets wrap where its memory does), at the run's pace.
        let raw = &s["raw_baselines"][0];
        assert_eq!(
            num(raw, "errors.count"),
            0.0,
            "{protocol}: {:#}",
            raw["errors"]
        );
        assert!(num(raw, "delivered.records") > 0.0, "{protocol}: {raw:#}");
        let paced = num(raw, "delivered.mb_per_s");
        assert!(
            paced < 4.0 * 3.0,
            "{protocol}: the raw sender ignored --rate: {paced} MB/s"
        );
        assert!(
            stdout.contains("raw stream baseline"),
            "{protocol}: {stdout}"
        );
    }
}

/// The topics `shoal topic list` shows at `bootstrap`.
fn topic_names(bootstrap: &str) -> Vec<String> {
    let listed = topic(bootstrap, &["list"]).json();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `shoal bench fanout ARGS` expected to stop before any run: its exit status and what it said.
fn refused(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["bench", "fanout"])
        .args(args)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), said)
}

/// Against a broker: each run of a pair writes a fresh topic of its own, deleted after it;
/// `--keep-topic` keeps it.
#[test]
fn each_run_gets_a_fresh_topic_deleted_after_it_unless_kept() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = common::Shoal::start(&dir.path().join("data"), 1, &[]);
    let bootstrap = shoal.bootstrap();
    let mut args = vec!["--bootstrap", &bootstrap, "--admin", &shoal.admin];
    args.extend(["--compare", "coalescing"]);
    args.extend(SHORT_RUN);
    let b = bench(dir.path(), &args);
    assert!(b.ok, "{}", b.stdout);
    let runs = b.summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    let names: Vec<&str> = runs.iter().map(|r| r["topic"].as_str().unwrap()).collect();
    assert_ne!(names[0], names[1], "each run has its own topic");
    for (r, name) in runs.iter().zip(&names) {
        check_run(&b, r);
        assert!(name.starts_with("shoal-bench-"), "{name}");
        assert_eq!(r["topic_deleted"], true, "{name}");
        assert!(
            b.stdout
                .contains(&format!("topic            {name} deleted after the run")),
            "{}",
            b.stdout
        );
    }
    let left = topic_names(&bootstrap);
    assert!(
        names.iter().all(|n| !left.iter().any(|l| l == n)),
        "topics left behind: {left:?}"
    );

    let mut args = vec!["--bootstrap", &bootstrap, "--admin", &shoal.admin];
    args.push("--keep-topic");
    args.extend(SHORT_RUN);
    let b = bench(dir.path(), &args);
    assert!(b.ok, "{}", b.stdout);
    let run = &b.summary["runs"][0];
    check_run(&b, run);
    let kept = run["topic"].as_str().unwrap();
    assert_eq!(run["topic_deleted"], false);
    assert!(
        b.stdout.contains(&format!("{kept} kept: --keep-topic")),
        "{}",
        b.stdout
    );
    assert!(topic_names(&bootstrap).iter().any(|t| t == kept));
}

/// A named topic that already holds records: consumers starting at the earliest offset would read
/// them too, so the bench refuses it; starting at the latest offset, it is used and kept.
#[test]
fn a_named_topic_holding_records_is_refused_where_consumers_would_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = common::Shoal::start(&dir.path().join("data"), 1, &[]);
    let bootstrap = shoal.bootstrap();
    let on_broker = |extra: &[&str]| {
        let mut args = vec!["--bootstrap", bootstrap.as_str(), "--admin", &shoal.admin];
        args.extend(["--topic", "held"]);
        args.extend(extra);
        args.extend(SHORT_RUN);
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>()
    };
    // The first run creates it: it is the run's, and kept as asked.
    let b = bench(dir.path(), &strs(&on_broker(&["--keep-topic"])));
    assert!(b.ok, "{}", b.stdout);
    check_run(&b, &b.summary["runs"][0]);
    assert_eq!(b.summary["runs"][0]["topic"], "held");
    assert_eq!(b.summary["runs"][0]["topic_deleted"], false);
    for earliest in [&["--start", "earliest"][..], &["--backlog", "64KiB"]] {
        let (ok, said) = refused(&strs(&on_broker(earliest)));
        assert!(!ok, "{earliest:?}: {said}");
        assert!(
            said.contains("topic held already holds") && said.contains("--start earliest"),
            "{earliest:?}: {said}"
        );
    }
    // At the latest offset the consumers read only the run's records.
    let b = bench(dir.path(), &strs(&on_broker(&[])));
    assert!(b.ok, "{}", b.stdout);
    let run = &b.summary["runs"][0];
    check_run(&b, run);
    assert_eq!(run["topic_deleted"], false, "it existed before the run");
    assert!(
        b.stdout.contains("held kept: it existed before the run"),
        "{}",
        b.stdout
    );
    assert!(topic_names(&bootstrap).iter().any(|t| t == "held"));
}

/// Producers paced far beyond what they reach: the summary says they fell short.
#[test]
fn producers_short_of_the_rate_are_cautioned() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--rate", "20GB/s"];
    args.extend(SHORT_RUN.iter().filter(|a| !["--rate", "3000"].contains(a)));
    let b = bench(dir.path(), &args);
    assert!(b.ok, "{}", b.stdout);
    let run = &b.summary["runs"][0];
    check_run(&b, run);
    let cautions = run["cautions"].as_array().unwrap();
    assert!(
        cautions.iter().any(|c| {
            let c = c.as_str().unwrap();
            c.starts_with("the producers reached") && c.contains("asked (--rate)")
        }),
        "{cautions:?}"
    );
    assert!(
        b.stdout.contains("caution          the producers reached"),
        "{}",
        b.stdout
    );
}

/// `--rate` in bytes paces the bytes the report counts, record batches as sent: compressed, the
/// produced MB/s is the rate asked (not the rate of the values before compression).
#[test]
fn a_byte_rate_is_in_the_reports_unit() {
    let dir = tempfile::tempdir().unwrap();
    let b = bench(
        dir.path(),
        &[
            "--consumers",
            "1",
            "--rate",
            "2MB/s",
            "--compression",
            "lz4",
            "--duration",
            "2s",
            "--warmup",
            "300ms",
            "--quiet",
        ],
    );
    assert!(b.ok, "{}", b.stdout);
    let run = &b.summary["runs"][0];
    check_run(&b, run);
    let produced = num(run, "produced.mb_per_s");
    assert!((1.6..2.4).contains(&produced), "{produced} MB/s produced");
    // The values alone came at a higher rate: compression shrank them.
    let values = num(run, "produced.msg_per_s") * num(run, "message_bytes") / 1e6;
    assert!(values > 1.5 * produced, "{values} MB/s of values");
    let unit = b.summary["byte_unit"].as_str().unwrap();
    assert!(unit.starts_with("record-batch bytes as sent"), "{unit}");
    assert!(
        b.stdout.contains(&format!(
            "units            {unit}; --rate in bytes paces in these"
        )),
        "{}",
        b.stdout
    );
}

/// `--broker-arg=--listen=...` and `--admin=...` put the embedded broker on those ports; its data
/// directory and cores stay the bench's own flags.
#[test]
fn the_embedded_brokers_ports_can_be_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let _ports = common::ports_lock();
    let port = common::free_port_run(2);
    let (listen, admin) = (
        format!("--broker-arg=--listen=127.0.0.1:{port}"),
        format!("--broker-arg=--admin=127.0.0.1:{}", port + 1),
    );
    let mut args = vec![listen.as_str(), admin.as_str()];
    args.extend(SHORT_RUN);
    let b = bench(dir.path(), &args);
    assert!(b.ok, "{}", b.stdout);
    check_run(&b, &b.summary["runs"][0]);
    let on = format!("on 127.0.0.1:{port}, admin 127.0.0.1:{}", port + 1);
    assert!(b.stdout.contains(&on), "{}", b.stdout);
    assert!(b.summary["broker"].as_str().unwrap().contains(&on));
    let (ok, said) = refused(&["--broker-arg=--cores=2", "--duration", "1s"]);
    assert!(!ok && said.contains("--broker-cores"), "{said}");
}
