//! What a series prints: each run's summary, the medians of repeated runs, comparisons, the
//! raw-baseline table, the disk baseline, and the SVG plot of a sweep.

use super::args::{Compare, FanoutArgs, Rate, Start, Sweep, SweepKey};
use super::disk::DiskBaseline;
use super::repeat::{Repeats, Spread};
use super::workload::{RunSummary, Workload};
use super::{plot, ratio, stats, Report};
use std::net::SocketAddr;

/// One of shoal's switches, from its `/metrics` (None without an admin API or a shoal).
pub fn switch_enabled(admin: Option<SocketAddr>, c: Compare) -> Option<bool> {
    let metrics = stats::scrape(admin?).ok()?;
    let gauge = match c {
        Compare::Coalescing => "shoal_fetch_coalescer_enabled",
        Compare::ViewSharing => "shoal_view_sharing_enabled",
    };
    metrics.get(gauge).map(|v| *v > 0.0)
}

/// The unit of every byte figure printed, `--rate` in bytes included.
pub const BYTE_UNIT: &str = "record-batch bytes as sent and received (after --compression, batch \
     and record headers included, request framing not); MB = 10^6 bytes, MiB and GiB powers of 2";

/// The line that says which bytes the report and `--rate` count.
pub fn units_line() -> String {
    format!(
        "{:<16} {BYTE_UNIT}; --rate in bytes paces in these",
        "units"
    )
}

fn rate_label(rate: Rate) -> String {
    match rate {
        Rate::Unlimited => "as fast as possible".to_string(),
        Rate::MessagesPerSec(m) => format!("{} msg/s", stats::thousands(m as u64)),
        Rate::BytesPerSec(b) => format!("{:.1} MB/s", stats::mb(b)),
    }
}

/// How runs at `rate` are compared with the raw baseline: unpaced, by the share of its delivery
/// (it answers every fetch at once: the ceiling); paced, by broker CPU-s per delivered GB over its
/// own (it answers each long poll when the next batch is due: the floor of the cost).
fn raw_comparison_gap(rate: Rate) -> Option<String> {
    (rate != Rate::Unlimited).then(|| {
        format!(
            "(paced, --rate {}): broker CPU-s per delivered GB over the paced raw server's",
            rate_label(rate)
        )
    })
}

pub fn run_label(w: &Workload, mode: Option<(Compare, bool)>) -> String {
    let mut l = match w.views {
        None => format!("consumers={}x{}", w.consumers_per_partition, w.partitions),
        Some(n) => format!(
            "consumers={}x{n}x{} views={n}",
            w.consumers_per_partition, w.partitions
        ),
    };
    l.push_str(&format!(" producers={}", w.producers));
    if let Some((c, on)) = mode {
        l.push_str(&format!(" {}={}", c.label(), if on { "on" } else { "off" }));
    }
    l
}

pub fn describe_workload(w: &Workload, args: &FanoutArgs) -> String {
    let rate = if w.rate > 0.0 {
        format!(
            "{} msg/s ({:.1} MB/s)",
            stats::thousands(w.rate as u64),
            stats::mb(w.rate * w.wire_bytes_per_message)
        )
    } else {
        "as fast as possible".into()
    };
    format!(
        "topic {} ({} partition{}), {} producer{} at {rate}, acks={}, {} messages of {} B in batches of {}, \
         compression {}; {} consumer{} per {} from {}{}; {:.1} s warm-up + {:.1} s measured; \
         {} client thread{}",
        w.topic,
        w.partitions,
        plural(w.partitions as usize),
        w.producers,
        plural(w.producers),
        if w.acks == -1 { "all".to_string() } else { w.acks.to_string() },
        if w.rate > 0.0 { "paced" } else { "unpaced" },
        w.message_bytes,
        w.records_per_batch,
        format!("{:?}", args.compression).to_lowercase(),
        w.consumers_per_partition,
        plural(w.consumers_per_partition),
        match w.views {
            None => "partition".to_string(),
            Some(n) => format!("shard view of each partition ({n} views, keyed records)"),
        },
        if w.earliest || w.backlog_bytes > 0 { "the earliest offset" } else { "the latest offset" },
        if w.backlog_bytes > 0 {
            format!(" after a backlog of {}", stats::size(w.backlog_bytes))
        } else {
            String::new()
        },
        w.warmup.as_secs_f64(),
        w.duration.as_secs_f64(),
        w.client_threads,
        plural(w.client_threads),
    )
}

pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn latency_line(name: &str, l: &Option<stats::Latency>) -> String {
    match l {
        None => format!("{name:<16} -"),
        Some(l) => format!(
            "{name:<16} p50 {}  p99 {}  p99.9 {}  p99.99 {}  max {}  ({} samples)",
            stats::us(l.p50),
            stats::us(l.p99),
            stats::us(l.p99_9),
            stats::us(l.p99_99),
            stats::us(l.max),
            stats::thousands(l.samples)
        ),
    }
}

pub fn print_summary(s: &RunSummary) {
    for line in summary_lines(s) {
        println!("{line}");
    }
}

/// A run's summary: its throughput, latencies and correctness (Kafka runs), errors, the
/// generator's CPU, then the server's figures.
fn summary_lines(s: &RunSummary) -> Vec<String> {
    let mut lines = vec![format!(
        "-- summary: {} ({:.1} s measured) --",
        s.label, s.measured_s
    )];
    let kafka = s.kind == "kafka";
    if kafka {
        lines.push(produced_line(s));
        lines.push(producer_mode_line(s));
    }
    lines.push(delivered_line(s));
    if kafka {
        lines.push(latency_line("publish latency", &s.publish_latency_us));
        lines.push(latency_line("e2e latency", &s.e2e_latency_us));
        lines.extend(correctness_lines(s));
        lines.extend(s.cautions.iter().map(|c| format!("{:<16} {c}", "caution")));
    }
    lines.push(errors_line(s));
    lines.push(generator_line(s));
    lines.push(server_line(s));
    lines.extend(
        s.server
            .cpu_method
            .as_ref()
            .map(|method| format!("{:<16} {method}", "its CPU from")),
    );
    lines.extend(per_broker_line(s));
    lines.extend(read_replicas_line(s));
    lines.extend(fetch_path_line(s));
    lines.extend(broker_disk_line(s));
    lines.extend(views_line(s));
    lines
}

/// Per broker (a shoal core): the consumers fetching from it at the end of the measured interval,
/// and its CPU over it where its threads were seen.
fn per_broker_line(s: &RunSummary) -> Option<String> {
    if s.per_broker.is_empty() {
        return None;
    }
    let each: Vec<String> = s
        .per_broker
        .iter()
        .map(|b| {
            let cpu = b
                .cpu_s
                .map(|c| format!(", {c:.2} CPU-s"))
                .unwrap_or_default();
            let n = b.consumers_at_end;
            format!("{}: {n} consumer{}{cpu}", b.node_id, plural(n))
        })
        .collect();
    // CPU is seen per core: a shoal's threads, embedded or on this host.
    let workers: Vec<f64> = s
        .per_broker
        .iter()
        .filter_map(|b| b.io_uring_workers_cpu_s)
        .collect();
    let cores = !workers.is_empty();
    Some(format!(
        "{:<16} {} (consumers fetching from each at the end of the measured interval{})",
        if cores { "per core" } else { "per broker" },
        each.join("; "),
        if cores {
            let workers: f64 = workers.iter().sum();
            format!(
                "; CPU over it, each core's io_uring workers included: {workers:.2} CPU-s of them \
                 in all"
            )
        } else {
            String::new()
        }
    ))
}

/// KIP-392: the responses that preferred another broker, and the consumers' moves.
fn read_replicas_line(s: &RunSummary) -> Option<String> {
    let r = &s.read_replicas;
    if r.redirects + r.moves_to_replica + r.returns_to_leader == 0 {
        return None;
    }
    Some(format!(
        "{:<16} {} fetch responses preferred another broker ({}); {} moves to a read replica, {} \
         back to the leader",
        "read replicas",
        stats::thousands(r.redirects),
        if r.follow {
            "followed: --follow-replicas on"
        } else {
            "not followed: --follow-replicas off"
        },
        stats::thousands(r.moves_to_replica),
        stats::thousands(r.returns_to_leader),
    ))
}

fn produced_line(s: &RunSummary) -> String {
    format!(
        "{:<16} {} msgs, {}: {} msg/s, {:.1} MB/s",
        "produced",
        stats::thousands(s.produced.records),
        stats::size(s.produced.bytes),
        stats::thousands(s.produced.msg_per_s as u64),
        s.produced.mb_per_s
    )
}

/// Plain, idempotent or transactional producers; a transactional run's commits.
fn producer_mode_line(s: &RunSummary) -> String {
    let m = &s.producer_mode;
    let what = match (m.commit_interval_ms, m.commits) {
        (Some(interval), Some(commits)) => format!(
            "transactional, committing every {interval} ms: {} commits, EndTxn mean {} (a \
             read_committed consumer sees a record at its commit: its e2e latency includes up to \
             the commit interval)",
            stats::thousands(commits),
            m.mean_end_txn_us
                .map_or("-".into(), |us| stats::us(us.round() as u64)),
        ),
        _ if m.mode == "idempotent" => {
            "idempotent (a producer id, sequences per partition)".to_string()
        }
        _ => "plain (no producer id)".to_string(),
    };
    format!("{:<16} {what}", "producers")
}

fn delivered_line(s: &RunSummary) -> String {
    format!(
        "{:<16} {} msgs, {} to {} consumers: {} msg/s, {:.1} MB/s (slowest consumer {} msg/s, {:.1} MB/s; {} fetches of {} on average)",
        "delivered",
        stats::thousands(s.delivered.records),
        stats::size(s.delivered.bytes),
        s.consumers,
        stats::thousands(s.delivered.msg_per_s as u64),
        s.delivered.mb_per_s,
        stats::thousands(s.delivered.slowest_consumer_msg_per_s as u64),
        s.delivered.slowest_consumer_mb_per_s,
        stats::thousands(s.delivered.fetches),
        stats::size(s.delivered.mean_fetch_bytes as u64),
    )
}

/// OK, or FAILED followed by a line per consumer that did not receive everything.
fn correctness_lines(s: &RunSummary) -> Vec<String> {
    let c = &s.correctness;
    if c.all_received {
        return vec![format!(
            "{:<16} OK: all {} consumers received every record the run produced ({} records in all, {} produced; drained in {:.2} s)",
            "correctness",
            c.consumers,
            stats::thousands(c.received_records),
            stats::thousands(s.totals.produced_records),
            c.drain_s
        )];
    }
    let mut lines = vec![format!(
        "{:<16} FAILED: {} of {} consumers received everything ({} of {} expected records; {} gaps)",
        "correctness",
        c.complete_consumers,
        c.consumers,
        stats::thousands(c.received_records),
        stats::thousands(c.expected_records),
        c.gaps
    )];
    if !c.log_is_the_runs {
        lines.push(format!(
            "{:<16}   the partitions hold {} records from the consumers' start offsets to the final offsets, the run produced {}: {}",
            "",
            stats::thousands(c.log_records),
            stats::thousands(c.produced_records),
            if c.log_records > c.produced_records {
                "the consumers read records that are not the run's (another producer, or an earlier run's)"
            } else {
                "records the broker acknowledged are missing"
            }
        ));
    }
    for i in &c.incomplete {
        lines.push(format!(
            "{:<16}   consumer {} (partition {}): from {} reached {} of {}, {} records received, {} offsets missing between batches",
            "", i.consumer, i.partition, i.start_offset, i.position, i.final_offset,
            i.received_records, i.gap_offsets
        ));
    }
    lines
}

fn errors_line(s: &RunSummary) -> String {
    format!(
        "{:<16} {} ({} produce, {} consume){}",
        "errors",
        s.errors.count,
        s.errors.produce,
        s.errors.consume,
        if s.errors.messages.is_empty() {
            String::new()
        } else {
            format!(": {}", s.errors.messages.join("; "))
        }
    )
}

fn generator_line(s: &RunSummary) -> String {
    format!(
        "{:<16} {:.2} CPU-s = {:.2} cores{}{}",
        "generator CPU",
        s.generator.cpu_s,
        s.generator.cores,
        s.generator
            .cpu_s_per_delivered_gb
            .map(|g| format!(", {g:.2} CPU-s per delivered GB"))
            .unwrap_or_default(),
        if s.generator.unattributed_cpu_s.abs() >= 0.005 {
            format!(
                " ({:.2} CPU-s more of this process unattributed: threads that exited)",
                s.generator.unattributed_cpu_s
            )
        } else {
            String::new()
        }
    )
}

/// The broker's (or the raw server's) CPU and peak memory.
fn server_line(s: &RunSummary) -> String {
    let who = if s.kind == "kafka" {
        "broker"
    } else {
        "raw server"
    };
    let sv = &s.server;
    let mut parts = Vec::new();
    if let Some(cpu) = sv.cpu_s {
        parts.push(format!(
            "{cpu:.2} CPU-s = {:.2} cores{}",
            sv.cores.unwrap_or(0.0),
            sv.cpu_s_per_delivered_gb
                .map(|g| format!(", {g:.2} CPU-s per delivered GB"))
                .unwrap_or_default()
        ));
        if let Some(us) = sv.cpu_us_per_fetch {
            parts.push(format!("{us:.1} us per fetch response"));
        }
    } else {
        parts.push("CPU not observable (not on this host; give --admin of a local shoal)".into());
    }
    parts.extend(peak_rss(s));
    format!("{who:<16} {}", parts.join("; "))
}

/// The server's peak resident memory, and what serving the consumers added to it.
fn peak_rss(s: &RunSummary) -> Option<String> {
    let sv = &s.server;
    let rss = sv.peak_rss_bytes?;
    Some(format!(
        "peak RSS {}{}{}",
        stats::size(rss),
        match (sv.rss_at_consumers_start_bytes, sv.peak_rss_growth_bytes) {
            (Some(start), Some(growth)) => format!(
                " ({} when the consumers started, +{} while serving them)",
                stats::size(start),
                stats::size(growth)
            ),
            _ => String::new(),
        },
        if sv.peak_rss_includes_generator {
            " (process, generator included)"
        } else {
            ""
        }
    ))
}

/// shoal's fetch path: how many reads the coalescer saved, how often each byte read was sent.
fn fetch_path_line(s: &RunSummary) -> Option<String> {
    let f = s.server.fetch.as_ref()?;
    Some(format!(
        "{:<16} coalescer hit ratio {}; log bytes read {} for {} delivered ({})",
        "fetch path",
        f.coalescer_hit_ratio
            .map(|r| format!("{:.1}%", r * 100.0))
            .unwrap_or_else(|| "-".into()),
        stats::size(f.log_read_bytes),
        stats::size(f.response_bytes),
        f.fan_out_saving
            .map(|x| format!("each byte read served {x:.1} times"))
            .unwrap_or_else(|| "nothing read".into())
    ))
}

/// shoal's storage device: its writes of appends and its fsyncs.
fn broker_disk_line(s: &RunSummary) -> Option<String> {
    let d = s.server.device.as_ref()?;
    Some(format!(
        "{:<16} {}; {}",
        "broker disk",
        device_ops("writes of appends", &d.writes),
        device_ops("fsyncs", &d.fsyncs)
    ))
}

fn device_ops(what: &str, o: &stats::DeviceOps) -> String {
    format!(
        "{} {what} (mean {}; {} over 10 ms, {} over 100 ms, the slowest {})",
        stats::thousands(o.count),
        o.mean_us
            .map_or_else(|| "-".into(), |us| stats::us(us.round() as u64)),
        stats::thousands(o.over_10ms),
        stats::thousands(o.over_100ms),
        o.slowest_within_s
            .map_or_else(|| "over 5 s".into(), |s| format!("<= {s} s")),
    )
}

/// shoal's shard views (`--views`): the decoding and encoding they cost, and their reads.
fn views_line(s: &RunSummary) -> Option<String> {
    let v = s.server.views.as_ref()?;
    Some(format!(
        "{:<16} {} source batches decoded for {} produced ({} per batch), {} shard batches \
         encoded, {} view fetches, {} catch-up reads (and {} fetches served by another's), {} \
         decode errors, {} split without decompressing again{}",
        "views",
        stats::thousands(v.source_batches_decoded),
        stats::thousands(v.source_batches),
        v.decodes_per_source_batch
            .map_or_else(|| "-".into(), |d| format!("{d:.2}")),
        stats::thousands(v.shard_batches_encoded),
        stats::thousands(v.fetches_served),
        stats::thousands(v.catch_up_reads),
        stats::thousands(v.catch_up_reads_shared),
        v.decode_errors,
        stats::thousands(v.decompressions_saved),
        match s.view_sharing {
            Some(true) => "; readers shared",
            Some(false) => "; readers not shared",
            None => "",
        }
    ))
}

/// What makes a run's figures other than they seem: producers short of `--rate`, or not paced
/// at all, and a generator using every core it has.
pub fn cautions(s: &RunSummary, w: &Workload) -> Vec<String> {
    let mut out = Vec::new();
    if s.producers > 0 && w.rate > 0.0 && s.produced.msg_per_s < SHORT_OF_RATE * w.rate {
        out.push(format!(
            "the producers reached {} msg/s ({:.1} MB/s), {:.0}% of the {} msg/s asked (--rate): \
             the broker or the generator could not keep up, so the figures are of a lower rate \
             than asked, and latency includes the producers' own queue",
            stats::thousands(s.produced.msg_per_s as u64),
            s.produced.mb_per_s,
            100.0 * s.produced.msg_per_s / w.rate,
            stats::thousands(w.rate as u64),
        ));
    }
    if s.producers > 0 && w.rate == 0.0 {
        out.push(format!(
            "the producers are not paced (--rate 0): each sends as fast as acknowledgements come \
             back, {} requests in flight per connection, so latency measures the queue in front \
             of the broker, not the broker; give --rate below the {:.1} MB/s produced here for a \
             latency that means something",
            w.max_in_flight, s.produced.mb_per_s
        ));
    }
    let threads = w.client_threads.max(1) as f64;
    if s.generator.cores >= SATURATED * threads {
        out.push(format!(
            "the generator used {:.2} cores with {} client thread{}: it is saturated, and the \
             figures may be its limits rather than the broker's (more --client-threads, fewer \
             consumers, or a lower --rate)",
            s.generator.cores,
            w.client_threads,
            plural(w.client_threads)
        ));
    }
    out
}

/// Producers below this share of `--rate` fell short of it.
const SHORT_OF_RATE: f64 = 0.9;
/// A generator using this share of its client threads' cores is saturated.
const SATURATED: f64 = 0.9;

/// The caution under a comparison of single runs.
pub const SINGLE_RUN_CAUTION: &str =
    "one run each: single runs of the same build differ by 10-20% \
     on a shared machine, tail latency far more; trust a ratio only from the medians of --repeat 3 \
     or more";

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// `on` and `off` side by side: two runs, or the medians of `repeat` runs each.
pub fn print_comparison(compared: Compare, on: &RunSummary, off: &RunSummary, repeat: usize) {
    println!(
        "\n-- {} on vs off: {} consumers{} --",
        compared.label(),
        on.consumers,
        of_repeats(repeat)
    );
    println!("{:<20} {:>14} {:>14} {:>10}", "", "on", "off", "on/off");
    for (name, a, b, f) in comparison_rows(on, off) {
        println!(
            "{name:<20} {:>14} {:>14} {:>10}",
            a.map_or_else(|| "-".into(), &f),
            b.map_or_else(|| "-".into(), &f),
            fmt_ratio(ratio(a, b))
        );
    }
    if repeat == 1 {
        println!("{:<20} {SINGLE_RUN_CAUTION}", "caution");
    }
}

/// A row of a comparison: its name, the figure on and off, and how a figure is written.
type Row = (
    &'static str,
    Option<f64>,
    Option<f64>,
    Box<dyn Fn(f64) -> String>,
);

/// The figures compared, on and off.
fn comparison_rows(on: &RunSummary, off: &RunSummary) -> Vec<Row> {
    vec![
        (
            "delivered MB/s",
            Some(on.delivered.mb_per_s),
            Some(off.delivered.mb_per_s),
            Box::new(|v| format!("{v:.1}")),
        ),
        (
            "produced MB/s",
            Some(on.produced.mb_per_s),
            Some(off.produced.mb_per_s),
            Box::new(|v| format!("{v:.1}")),
        ),
        (
            "e2e p50",
            on.e2e_latency_us.map(|l| l.p50 as f64),
            off.e2e_latency_us.map(|l| l.p50 as f64),
            Box::new(|v| stats::us(v as u64)),
        ),
        (
            "e2e p99",
            on.e2e_latency_us.map(|l| l.p99 as f64),
            off.e2e_latency_us.map(|l| l.p99 as f64),
            Box::new(|v| stats::us(v as u64)),
        ),
        (
            "e2e max",
            on.e2e_latency_us.map(|l| l.max as f64),
            off.e2e_latency_us.map(|l| l.max as f64),
            Box::new(|v| stats::us(v as u64)),
        ),
        (
            "broker CPU-s/GB",
            on.server.cpu_s_per_delivered_gb,
            off.server.cpu_s_per_delivered_gb,
            Box::new(|v| format!("{v:.2}")),
        ),
        (
            "log bytes read",
            on.server.fetch.map(|f| f.log_read_bytes as f64),
            off.server.fetch.map(|f| f.log_read_bytes as f64),
            Box::new(|v| stats::size(v as u64)),
        ),
        (
            "coalescer hits",
            on.server
                .fetch
                .and_then(|f| f.coalescer_hit_ratio)
                .map(|r| r * 100.0),
            off.server
                .fetch
                .and_then(|f| f.coalescer_hit_ratio)
                .map(|r| r * 100.0),
            Box::new(|v| format!("{v:.1}%")),
        ),
        (
            "generator CPU-s/GB",
            on.generator.cpu_s_per_delivered_gb,
            off.generator.cpu_s_per_delivered_gb,
            Box::new(|v| format!("{v:.2}")),
        ),
        (
            "peak RSS",
            on.server.peak_rss_bytes.map(|b| b as f64),
            off.server.peak_rss_bytes.map(|b| b as f64),
            Box::new(|v| stats::size(v as u64)),
        ),
        (
            "RSS growth",
            on.server.peak_rss_growth_bytes.map(|b| b as f64),
            off.server.peak_rss_growth_bytes.map(|b| b as f64),
            Box::new(|v| stats::size(v as u64)),
        ),
        (
            "view decodes",
            on.server.views.map(|v| v.source_batches_decoded as f64),
            off.server.views.map(|v| v.source_batches_decoded as f64),
            Box::new(|v| stats::thousands(v as u64)),
        ),
        (
            "decodes/src batch",
            on.server.views.and_then(|v| v.decodes_per_source_batch),
            off.server.views.and_then(|v| v.decodes_per_source_batch),
            Box::new(|v| format!("{v:.2}")),
        ),
    ]
}

/// ", medians of N runs" after a heading, for N > 1.
fn of_repeats(repeat: usize) -> String {
    match repeat {
        1 => String::new(),
        n => format!(", medians of {n} runs"),
    }
}

/// The medians of one point's repeats, with their ranges: each setting's, then the raw baseline's.
pub fn print_medians(settings: &[Repeats], raw: Option<&Repeats>) {
    let Some(first) = settings.first() else {
        return;
    };
    println!(
        "\n-- {} consumers: median (lowest - highest) of {} runs each --",
        first.median.consumers,
        first.count()
    );
    let spread = |s: Option<Spread>, f: &dyn Fn(f64) -> String| {
        s.map_or_else(
            || "-".into(),
            |s| format!("{} ({} - {})", f(s.median), f(s.min), f(s.max)),
        )
    };
    let mb = |v: f64| format!("{v:.1}");
    println!(
        "{:<44} {:>26} {:>26} {:>22} {:>26}",
        "run", "delivered MB/s", "produced MB/s", "brk CPU-s/GB", "e2e p99"
    );
    for m in settings.iter().chain(raw) {
        println!(
            "{:<44} {:>26} {:>26} {:>22} {:>26}",
            m.median.label,
            spread(Some(m.delivered_mb_per_s), &mb),
            spread(m.produced_mb_per_s, &mb),
            spread(m.broker_cpu_s_per_gb, &|v| format!("{v:.2}")),
            spread(m.e2e_p99_us, &|v| stats::us(v as u64)),
        );
    }
}

pub fn print_raw(raw: &RunSummary, runs: &[RunSummary], rate: Rate) {
    for r in runs {
        match raw_comparison_gap(rate) {
            Some(_) => println!(
                "{:<16} {}: {} broker CPU-s per delivered GB = {} the paced raw server's {}",
                "vs raw baseline",
                r.label,
                r.server
                    .cpu_s_per_delivered_gb
                    .map_or_else(|| "-".into(), |g| format!("{g:.2}")),
                r.raw_cpu_ratio
                    .map_or_else(|| "-".into(), |f| format!("{f:.2}x")),
                raw.server
                    .cpu_s_per_delivered_gb
                    .map_or_else(|| "-".into(), |g| format!("{g:.2}")),
            ),
            None => println!(
                "{:<16} {}: {:.1} MB/s delivered = {} of the raw baseline's {:.1} MB/s",
                "vs raw baseline",
                r.label,
                r.delivered.mb_per_s,
                r.raw_baseline_fraction
                    .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
                raw.delivered.mb_per_s
            ),
        }
    }
}

/// The disk baseline's figures, and each run's produced MB/s and publish latency beside them.
pub fn print_disk(d: &DiskBaseline, runs: &[RunSummary]) {
    println!(
        "disk baseline    {:.1} MB/s of {} KiB writes",
        d.plain.mb_per_s,
        d.write_bytes >> 10
    );
    println!(
        "{}",
        latency_line("  write latency", &d.plain.write_latency_us)
    );
    if let Some(f) = &d.flushed {
        println!(
            "with flushes     {:.1} MB/s while each file is fdatasynced every {} ms (the broker's \
             flush interval)",
            f.writes.mb_per_s, f.flush_interval_ms
        );
        println!(
            "{}",
            latency_line("  write latency", &f.writes.write_latency_us)
        );
        println!("{}", latency_line("  fdatasync", &f.fdatasync_latency_us));
    }
    for r in runs {
        println!(
            "{:<16} {}: {:.1} MB/s produced = {} of the disk baseline's {:.1} MB/s; publish max {}",
            "vs disk baseline",
            r.label,
            r.produced.mb_per_s,
            r.disk_baseline_fraction
                .map_or_else(|| "-".into(), |f| format!("{:.1}%", f * 100.0)),
            d.plain.mb_per_s,
            r.publish_latency_us
                .map_or_else(|| "-".into(), |l| stats::us(l.max)),
        );
    }
}

/// One row per point and setting (the median of its repeats), then the raw baselines'.
pub fn print_table(runs: &[&RunSummary], raws: &[&RunSummary], rate: Rate, repeat: usize) {
    let gap = raw_comparison_gap(rate).filter(|_| !raws.is_empty());
    println!("\n== all runs{} ==", of_repeats(repeat));
    println!(
        "{:<44} {:>10} {:>12} {:>10} {:>10} {:>11} {:>10} {:>9} {:>9}",
        "run",
        "prod MB/s",
        "deliv MB/s",
        "slowest",
        "e2e p50",
        "e2e p99",
        "brk CPU/GB",
        "gen cores",
        "vs raw"
    );
    for r in runs.iter().chain(raws) {
        println!(
            "{:<44} {:>10} {:>12.1} {:>10.1} {:>10} {:>11} {:>10} {:>9.2} {:>9}",
            r.label,
            if r.kind == "kafka" {
                format!("{:.1}", r.produced.mb_per_s)
            } else {
                "-".into()
            },
            r.delivered.mb_per_s,
            r.delivered.slowest_consumer_mb_per_s,
            r.e2e_latency_us
                .map_or_else(|| "-".into(), |l| stats::us(l.p50)),
            r.e2e_latency_us
                .map_or_else(|| "-".into(), |l| stats::us(l.p99)),
            r.server
                .cpu_s_per_delivered_gb
                .map_or_else(|| "-".into(), |g| format!("{g:.2}")),
            r.generator.cores,
            match (r.raw_baseline_fraction, r.raw_cpu_ratio) {
                (Some(f), _) => format!("{:.1}%", f * 100.0),
                (None, Some(c)) => format!("{c:.2}x CPU"),
                (None, None) => "-".into(),
            },
        );
    }
    if let Some(gap) = gap {
        println!("vs raw {gap}");
    }
}

/// A figure of a sweep's plot: its panel's title and y axis, its value in a run, whether the raw
/// baseline has it, and whether its panel is drawn when no run has it (a broker other than shoal
/// has no log figures, one on another host no CPU).
struct Plotted {
    title: &'static str,
    y_label: &'static str,
    of: fn(&RunSummary) -> Option<f64>,
    raw: bool,
    always: bool,
}

const PLOTTED: [Plotted; 4] = [
    Plotted {
        title: "delivered throughput",
        y_label: "MB/s delivered (all consumers)",
        of: |r| Some(r.delivered.mb_per_s),
        raw: true,
        always: true,
    },
    Plotted {
        title: "end-to-end latency, p99",
        y_label: "p99 e2e latency (ms)",
        of: |r| r.e2e_latency_us.map(|l| l.p99 as f64 / 1e3),
        raw: false,
        always: true,
    },
    Plotted {
        title: "broker CPU per delivered GB",
        y_label: "CPU-s per delivered GB",
        of: |r| r.server.cpu_s_per_delivered_gb,
        raw: true,
        always: false,
    },
    Plotted {
        title: "log bytes read",
        y_label: "MB/s read from the log (all cores)",
        of: |r| {
            r.server
                .fetch
                .map(|f| stats::mb(f.log_read_bytes as f64) / r.measured_s.max(1e-6))
        },
        raw: false,
        always: false,
    },
];

/// The SVG of a sweep: each figure of [`PLOTTED`] against the swept value, a line per setting
/// of the compared switch (the medians of the repeats), and the raw baseline's where it has the
/// figure.
pub fn render_plot(report: &Report, sweep: &Sweep) -> String {
    let x_of = |r: &RunSummary| -> f64 {
        match sweep.key {
            SweepKey::Consumers => r.consumers_per_partition as f64,
            SweepKey::Producers => r.producers as f64,
            SweepKey::Partitions => r.partitions as f64,
        }
    };
    let runs: Vec<&RunSummary> = report.medians.iter().map(|m| &m.median).collect();
    let lines = plot_lines(&runs, report.config.compare);
    let panels = PLOTTED
        .iter()
        .map(|fig| {
            let mut series: Vec<plot::Series> = lines
                .iter()
                .map(|(name, runs_of_line, dash)| plot::Series {
                    name: name.clone(),
                    points: runs_of_line
                        .iter()
                        .filter_map(|r| (fig.of)(r).map(|y| (x_of(r), y)))
                        .collect(),
                    dash: *dash,
                })
                .collect();
            if fig.raw && !report.raw_baseline_medians.is_empty() {
                series.push(plot::Series {
                    name: "raw TCP baseline".into(),
                    points: report
                        .raw_baseline_medians
                        .iter()
                        .filter_map(|m| (fig.of)(&m.median).map(|y| (x_of(&m.median), y)))
                        .collect(),
                    dash: Some("8,4"),
                });
            }
            plot::Panel {
                title: fig.title.into(),
                y_label: fig.y_label.into(),
                log_y: spans_decades(&series),
                series,
            }
        })
        .zip(&PLOTTED)
        .filter(|(p, fig)| fig.always || p.series.iter().any(|s| !s.points.is_empty()))
        .map(|(p, _)| p)
        .collect::<Vec<_>>();
    let xs: Vec<f64> = sweep.values.iter().map(|v| *v as f64).collect();
    let x_label = match sweep.key {
        SweepKey::Consumers => "consumers per partition",
        SweepKey::Producers => "producers",
        SweepKey::Partitions => "partitions",
    };
    plot::render(
        &plot_title(runs.first().copied()),
        &plot_subtitle(report),
        x_label,
        &xs,
        &panels,
    )
}

/// The lines of each panel: per setting of the compared switch (coalescing without --compare),
/// in the order the runs met them, its name, its runs and its dashes ("off" is dashed so that it
/// stays visible where it lies on top of "on").
fn plot_lines<'a>(
    runs: &[&'a RunSummary],
    compared: Option<Compare>,
) -> Vec<(String, Vec<&'a RunSummary>, Option<&'static str>)> {
    let mode_of = |r: &RunSummary| match compared {
        Some(Compare::ViewSharing) => r.view_sharing,
        _ => r.coalescing,
    };
    let mut modes: Vec<Option<bool>> = Vec::new();
    for r in runs {
        if !modes.contains(&mode_of(r)) {
            modes.push(mode_of(r));
        }
    }
    modes
        .into_iter()
        .map(|mode| {
            let name = match (mode, compared) {
                (Some(on), Some(c)) => {
                    format!("shoal, {} {}", c.label(), if on { "on" } else { "off" })
                }
                (Some(true), None) => "shoal".into(),
                (Some(false), None) => "shoal (coalescing off)".into(),
                (None, _) => "broker".into(),
            };
            let of_mode = runs
                .iter()
                .copied()
                .filter(|r| mode_of(r) == mode)
                .collect();
            (name, of_mode, (mode == Some(false)).then_some("3,3"))
        })
        .collect()
}

/// A log axis where the values span more than 20x (the raw baseline beside a paced workload).
fn spans_decades(series: &[plot::Series]) -> bool {
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::MAX, 0.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    lo > 0.0 && hi / lo > 20.0
}

/// The plot's title: the workload of its first run.
fn plot_title(first: Option<&RunSummary>) -> String {
    format!(
        "shoal bench fanout: {} B messages, {} partition{}, {} producer{}",
        first.map_or(0, |r| r.message_bytes),
        first.map_or(0, |r| r.partitions),
        plural(first.map_or(0, |r| r.partitions as usize)),
        first.map_or(0, |r| r.producers),
        plural(first.map_or(0, |r| r.producers)),
    )
}

/// The plot's subtitle: the settings every run shares, and the broker.
fn plot_subtitle(report: &Report) -> String {
    let c = &report.config;
    format!(
        "produce rate {}, acks={}, {} from {}, compression {}; {}; {} s measured per run",
        rate_label(c.rate),
        if c.acks == -1 {
            "all".to_string()
        } else {
            c.acks.to_string()
        },
        if c.backlog.is_some() {
            "catch-up"
        } else {
            "tail"
        },
        if c.backlog.is_some() || c.start == Start::Earliest {
            "earliest"
        } else {
            "latest"
        },
        format!("{:?}", c.compression).to_lowercase(),
        report.broker.split(" on ").next().unwrap_or_default(),
        c.duration.as_secs_f64(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summaries the golden text holds: every line of a failed Kafka run, a complete one with
    /// fewer figures, and a raw baseline's.
    fn samples() -> Vec<RunSummary> {
        let failed = RunSummary::sample();
        let mut complete = RunSummary::sample();
        complete.correctness.all_received = true;
        complete.errors = Default::default();
        complete.cautions = Vec::new();
        complete.publish_latency_us = None;
        complete.generator.cpu_s_per_delivered_gb = None;
        complete.generator.unattributed_cpu_s = 0.0;
        complete.server.cpu_method = None;
        complete.server.cpu_s_per_delivered_gb = None;
        complete.server.cpu_us_per_fetch = None;
        complete.server.rss_at_consumers_start_bytes = None;
        complete.server.peak_rss_includes_generator = false;
        complete.server.fetch = complete.server.fetch.map(|mut f| {
            f.coalescer_hit_ratio = None;
            f.fan_out_saving = None;
            f
        });
        complete.server.device = None;
        complete.server.views = complete.server.views.map(|mut v| {
            v.decodes_per_source_batch = None;
            v
        });
        complete.view_sharing = Some(false);
        for b in &mut complete.per_broker {
            (b.cpu_s, b.io_uring_workers_cpu_s) = (None, None);
        }
        complete.read_replicas = Default::default();
        complete.producer_mode = Default::default();
        complete.producer_mode.mode = "plain";
        let mut raw = RunSummary::sample();
        raw.kind = "raw-baseline";
        raw.label = "raw TCP baseline consumers=4x2".into();
        raw.server = Default::default();
        raw.view_sharing = None;
        raw.per_broker = Vec::new();
        raw.read_replicas = Default::default();
        vec![failed, complete, raw]
    }

    /// The summaries are the same, byte for byte, as when the golden text was printed.
    #[test]
    fn summaries_print_the_golden_text() {
        let text: String = samples()
            .iter()
            .flat_map(summary_lines)
            .map(|l| l + "\n")
            .collect();
        assert_eq!(text, include_str!("report_golden.txt"));
    }
}
