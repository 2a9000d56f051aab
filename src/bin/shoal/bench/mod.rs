//! `shoal bench fanout`: the bundled fan-out load generator.
//!
//! Producers write to a topic; every partition is read by `--consumers` independent consumers (no
//! group: each fetches on its own from its own offset), the fan-out shoal is built for. Without
//! `--bootstrap` it starts an embedded shoal on a temporary data directory, so it works on a fresh
//! machine; with it, it loads any Kafka-compatible broker.
//!
//! It is part of the `shoal` binary, not of the library: it embeds the broker through
//! `shoal::server` and speaks Kafka through `shoal::wire`.
//!
//! ## Layout, top layer first
//! - [`broker`]   — the broker under test: embedded (in process or a child) or external.
//! - [`stream_baseline`] — the raw stream sender from memory (`--raw-baseline` with `--protocol
//!   sse|ws`).
//! - [`baseline`] — the raw TCP fan-out from memory (`--raw-baseline`).
//! - [`report`]   — what is printed: summaries, comparisons, tables, the plot of a sweep.
//! - [`topic`]    — each run's topic: a fresh one (or a named one checked), deleted after the run.
//! - [`args`]     — the command line: flags, value parsers, checks.
//! - [`client`]   — its own Kafka client: blocking set-up calls and request templates; fetch
//!   responses are read by `shoal::wire::fetch::decode` without copying or decoding records.
//! - [`disk`]     — the embedded broker's device: Direct I/O writes, with and without flushes
//!   (`--disk-baseline`).
//! - [`repeat`]   — `--repeat`: the median of each figure over a point's repeated runs.
//! - [`workload`] — one run: producers and consumers on glommio executors, phases, the summary.
//! - [`stats`]    — what a run measures, a file each: counters, latency histograms, `/proc` CPU and
//!   memory, finding the broker's process, shoal's admin API and `/metrics`, formatting.
//! - [`plot`]     — the SVG of a sweep (`--plot`).
//!
//! Its connections' TLS (`--tls-ca`) and SASL (`--sasl-mechanism`) are the binary's client's
//! (`src/bin/shoal/client/`), shared with the operator commands.
//!
//! This module runs the series: one run, or `--compare coalescing` (on, then off), over each
//! `--sweep` value, each followed by the raw baseline when asked, all of it `--repeat` times in
//! turn, then the disk baseline when asked; comparisons and the table are of the repeats' medians.

mod args;
pub mod baseline;
mod broker;
pub mod client;
mod disk;
pub mod plot;
mod repeat;
mod report;
pub mod stats;
mod stream_baseline;
mod topic;
pub mod workload;

pub use args::BenchCommand;
pub use broker::ServeConfig;

use crate::client::{sasl, tls};
use args::{validate, Compare, FanoutArgs, Rate, Start, SweepKey};
use broker::Broker;
use client::Cluster;
use repeat::Repeats;
use report::{
    cautions, describe_workload, plural, print_comparison, print_disk, print_medians, print_raw,
    print_summary, print_table, render_plot, run_label, switch_enabled,
};
use serde::Serialize;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use workload::{Endpoint, Observer, RunSummary, Settings, Workload};

pub fn run(cmd: BenchCommand, serve_config: ServeConfig) -> io::Result<()> {
    match cmd {
        BenchCommand::Fanout(args) => fanout(args, serve_config),
    }
}

/// The JSON document of `--json`.
#[derive(Debug, Serialize)]
struct Report {
    tool: &'static str,
    version: &'static str,
    broker: String,
    /// What every byte figure counts (`--rate` in bytes too).
    byte_unit: &'static str,
    config: FanoutArgs,
    runs: Vec<RunSummary>,
    raw_baselines: Vec<RunSummary>,
    disk_baselines: Vec<disk::DiskBaseline>,
    /// Per point of the series and setting, in order: the median of its `--repeat` runs (with one
    /// repeat, the run itself). The comparisons and the table are of these.
    medians: Vec<Repeats>,
    /// Per point, the median of its raw baselines (`--raw-baseline`).
    raw_baseline_medians: Vec<Repeats>,
    comparisons: Vec<Comparison>,
    /// Every run: every consumer received every record, and no errors.
    ok: bool,
}

/// The compared setting on vs off at one point of the series (ratios are on / off, of the medians
/// of the repeats).
#[derive(Debug, Serialize)]
struct Comparison {
    consumers_per_partition: usize,
    partitions: i32,
    producers: usize,
    /// Indexes in `medians`.
    on_run: usize,
    off_run: usize,
    delivered_mb_per_s_ratio: Option<f64>,
    e2e_p99_ratio: Option<f64>,
    broker_cpu_s_per_gb_ratio: Option<f64>,
    log_read_bytes_ratio: Option<f64>,
    /// Source batches decoded for views (`--views`).
    view_decodes_ratio: Option<f64>,
    peak_rss_ratio: Option<f64>,
    /// Of the resident memory added while serving the consumers.
    peak_rss_growth_ratio: Option<f64>,
    /// Set where the ratios are of single runs, not of medians.
    caution: Option<&'static str>,
}

impl Comparison {
    /// `on` against `off` (the medians of `repeat` runs at `on_run` and `on_run + 1`).
    fn of(on: &RunSummary, off: &RunSummary, on_run: usize, repeat: usize) -> Comparison {
        Comparison {
            caution: (repeat == 1).then_some(report::SINGLE_RUN_CAUTION),
            consumers_per_partition: on.consumers_per_partition,
            partitions: on.partitions,
            producers: on.producers,
            on_run,
            off_run: on_run + 1,
            delivered_mb_per_s_ratio: ratio(
                Some(on.delivered.mb_per_s),
                Some(off.delivered.mb_per_s),
            ),
            e2e_p99_ratio: ratio(
                on.e2e_latency_us.map(|l| l.p99 as f64),
                off.e2e_latency_us.map(|l| l.p99 as f64),
            ),
            broker_cpu_s_per_gb_ratio: ratio(
                on.server.cpu_s_per_delivered_gb,
                off.server.cpu_s_per_delivered_gb,
            ),
            log_read_bytes_ratio: ratio(
                on.server.fetch.map(|f| f.log_read_bytes as f64),
                off.server.fetch.map(|f| f.log_read_bytes as f64),
            ),
            peak_rss_ratio: ratio(
                on.server.peak_rss_bytes.map(|b| b as f64),
                off.server.peak_rss_bytes.map(|b| b as f64),
            ),
            peak_rss_growth_ratio: ratio(
                on.server.peak_rss_growth_bytes.map(|b| b as f64),
                off.server.peak_rss_growth_bytes.map(|b| b as f64),
            ),
            view_decodes_ratio: ratio(
                on.server.views.map(|v| v.source_batches_decoded as f64),
                off.server.views.map(|v| v.source_batches_decoded as f64),
            ),
        }
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => Some(a / b),
        _ => None,
    }
}

fn workload_for(args: &FanoutArgs, point: Option<(SweepKey, u64)>, cpus: usize) -> Workload {
    let (mut partitions, mut producers, mut consumers) =
        (args.partitions, args.producers, args.consumers);
    match point {
        Some((SweepKey::Consumers, v)) => consumers = v as usize,
        Some((SweepKey::Producers, v)) => producers = v as usize,
        Some((SweepKey::Partitions, v)) => partitions = v as i32,
        None => {}
    }
    let message_bytes = args.message_bytes as usize;
    let records_per_batch = (args.batch_bytes as usize / message_bytes.max(1)).max(1);
    let wire_bytes_per_message = workload::wire_bytes_per_message(
        message_bytes,
        records_per_batch,
        args.compression,
        args.views,
    );
    let broker_cpus = if args.bootstrap.is_none() {
        args.broker_cores.max(1)
    } else {
        0
    };
    let threads = args
        .client_threads
        .unwrap_or_else(|| cpus.saturating_sub(broker_cpus).clamp(1, 4))
        .max(1);
    // Pin client executors to the CPUs the broker (or the raw server) does not use, if there are.
    let client_cpus = (0..threads)
        .map(|i| {
            let cpu = broker_cpus.max(1) + i;
            (broker_cpus.max(1) + threads <= cpus).then_some(cpu)
        })
        .collect();
    Workload {
        topic: String::new(),
        partitions,
        producers,
        consumers_per_partition: consumers,
        views: args.views,
        message_bytes,
        records_per_batch,
        wire_bytes_per_message,
        rate: args.rate.messages_per_sec(wire_bytes_per_message),
        acks: args.acks,
        duration: args.duration,
        warmup: args.warmup.unwrap_or(if args.backlog.unwrap_or(0) > 0 {
            Duration::ZERO
        } else {
            Duration::from_secs(2)
        }),
        earliest: args.start == Start::Earliest,
        backlog_bytes: args.backlog.unwrap_or(0),
        compression: args.compression,
        client_threads: threads,
        client_cpus,
        max_in_flight: args.max_in_flight,
        fetch_max_wait: args.fetch_max_wait,
        isolation_level: args.isolation.level(),
        fetch_max_bytes: args.fetch_max_bytes.min(i32::MAX as u64) as i32,
        drain_timeout: args.drain_timeout,
        receive_buffer: (args.receive_buffer as usize).max(4096),
        follow_replicas: args.follow_replicas.on(),
        stream: None,
        producer_mode: args.producer_mode(),
        live: !args.quiet,
    }
}

fn fanout(args: FanoutArgs, serve_config: ServeConfig) -> io::Result<()> {
    validate(&args).map_err(io::Error::other)?;
    if let Some(ca) = &args.tls_ca {
        let client = args
            .tls_client_cert
            .as_deref()
            .zip(args.tls_client_key.as_deref());
        tls::enable(ca, client)?;
    }
    if let Some(m) = args
        .sasl_mechanism
        .as_deref()
        .and_then(shoal::auth::SaslMechanism::from_name)
    {
        let user = args.sasl_username.clone().unwrap_or_default();
        let password = args.sasl_password.clone().unwrap_or_default();
        sasl::enable(m, user, password)?;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut broker = Broker::start(&args, serve_config)?;
    let result = series(&args, &mut broker, cpus);
    broker.stop();
    let report = result?;
    if !report.ok {
        return Err(io::Error::other(
            "some consumer did not receive every record, or errors occurred (see above)",
        ));
    }
    Ok(())
}

/// The points of a series, the compared settings at each, and how often each runs.
struct Plan {
    points: Vec<Option<(SweepKey, u64)>>,
    /// `--compare`: on, then off; without it, the broker as it is.
    modes: Vec<Option<bool>>,
    repeat: usize,
    /// In the names of the series' fresh topics.
    series: String,
}

impl Plan {
    fn of(args: &FanoutArgs) -> Plan {
        Plan {
            points: match &args.sweep {
                Some(s) => s.values.iter().map(|v| Some((s.key, *v))).collect(),
                None => vec![None],
            },
            modes: if args.compare.is_some() {
                vec![Some(true), Some(false)]
            } else {
                vec![None]
            },
            repeat: args.repeat.max(1) as usize,
            series: topic::series_id(),
        }
    }

    fn total_runs(&self) -> usize {
        self.points.len() * self.modes.len() * self.repeat
    }
}

/// The broker under test and the generator's connections to it, renewed with each fresh broker
/// process.
struct UnderTest<'a> {
    broker: &'a mut Broker,
    cluster: Cluster,
    /// `--produce-bootstrap`: where the producers write instead.
    upstream: Option<Cluster>,
    obs: Observer,
}

impl UnderTest<'_> {
    /// A fresh broker process, so that the next run's peak RSS is its own.
    fn restart(&mut self, args: &FanoutArgs) -> io::Result<()> {
        self.broker.restart(args)?;
        self.cluster = Cluster::connect(self.broker.bootstrap)?;
        self.obs = self.broker.observer();
        println!(
            "\n(a fresh shoal process for the next run: {})",
            self.broker.describe()
        );
        Ok(())
    }
}

impl Report {
    /// The report of a series with `args`, before its first run.
    fn new(args: &FanoutArgs) -> Report {
        Report {
            tool: "shoal bench fanout",
            version: env!("CARGO_PKG_VERSION"),
            broker: String::new(),
            byte_unit: report::BYTE_UNIT,
            config: args.clone(),
            runs: Vec::new(),
            raw_baselines: Vec::new(),
            disk_baselines: Vec::new(),
            medians: Vec::new(),
            raw_baseline_medians: Vec::new(),
            comparisons: Vec::new(),
            ok: false,
        }
    }
}

fn series(args: &FanoutArgs, broker: &mut Broker, cpus: usize) -> io::Result<Report> {
    let cluster = Cluster::connect(broker.bootstrap)?;
    let upstream = match &args.produce_bootstrap {
        Some(addr) => Some(Cluster::connect(crate::client::resolve(addr)?)?),
        None => None,
    };
    let obs = broker.observer();
    println!("shoal bench fanout: {}", broker.describe());
    println!("{}", report::units_line());
    let mut ut = UnderTest {
        broker,
        cluster,
        upstream,
        obs,
    };
    let plan = Plan::of(args);
    let switch_before = args
        .compare
        .and_then(|c| switch_enabled(ut.broker.admin, c));
    let mut report = Report::new(args);
    for point in &plan.points {
        let mut w = workload_for(args, *point, cpus);
        run_point(args, &plan, &mut ut, &mut w, &mut report)?;
    }
    if let (Some(before), Some(admin), Some(c)) = (switch_before, ut.broker.admin, args.compare) {
        stats::set_switch(admin, c.setting(), before)?;
    }
    finish(args, ut.broker, plan.repeat, report)
}

/// One point of the series: each setting's runs, `--repeat` times, each repeat followed by the raw
/// baseline when asked; then their medians and comparison, and the disk baseline when asked.
fn run_point(
    args: &FanoutArgs,
    plan: &Plan,
    ut: &mut UnderTest,
    w: &mut Workload,
    report: &mut Report,
) -> io::Result<()> {
    let first_of_point = report.runs.len();
    // Per mode, the runs of its repeats; the raw baselines of the point.
    let mut of_mode: Vec<Vec<usize>> = vec![Vec::new(); plan.modes.len()];
    let mut of_raw = Vec::new();
    for rep in 0..plan.repeat {
        for (m, mode) in plan.modes.iter().enumerate() {
            let s = run_one(args, plan, ut, w, *mode, rep, report.runs.len())?;
            of_mode[m].push(report.runs.len());
            report.runs.push(s);
        }
        if args.raw_baseline {
            let raw = raw_baseline(w, ut.cluster.versions.fetch, ut.broker.cores.unwrap_or(1))?;
            // Each run of this repeat against this repeat's raw server.
            let these: Vec<usize> = of_mode.iter().map(|v| v[rep]).collect();
            for &i in &these {
                against_raw(&mut report.runs[i], &raw, args.rate);
            }
            let these: Vec<RunSummary> = these.iter().map(|&i| report.runs[i].clone()).collect();
            print_raw(&raw, &these, args.rate);
            of_raw.push(report.raw_baselines.len());
            report.raw_baselines.push(raw);
        }
    }
    let first_median = add_medians(args, plan, report, of_mode, of_raw);
    if let (true, Some(dir)) = (args.disk_baseline, &ut.broker.data_dir) {
        disk_baseline(
            dir,
            ut.broker.flush_interval,
            w,
            report,
            first_of_point,
            first_median,
        );
    }
    Ok(())
}

/// The `index`-th run of the series (from 0): the point's workload `w` with the compared setting
/// `mode`, in repeat `rep`.
fn run_one(
    args: &FanoutArgs,
    plan: &Plan,
    ut: &mut UnderTest,
    w: &mut Workload,
    mode: Option<bool>,
    rep: usize,
    index: usize,
) -> io::Result<RunSummary> {
    if args.broker_process && index > 0 {
        ut.restart(args)?;
    }
    if let (Some(on), Some(admin), Some(c)) = (mode, ut.broker.admin, args.compare) {
        stats::set_switch(admin, c.setting(), on)?;
    }
    w.topic = topic::name(args, &plan.series, index);
    let label = run_label(w, args.compare.zip(mode));
    let of_repeats = match plan.repeat {
        1 => String::new(),
        n => format!(" (repeat {}/{n})", rep + 1),
    };
    println!(
        "\n== run {}/{}: {label}{of_repeats} ==",
        index + 1,
        plan.total_runs()
    );
    println!("{}", describe_workload(w, args));
    let state = |c: Compare| match args.compare {
        Some(compared) if compared == c => mode,
        _ => switch_enabled(ut.broker.admin, c),
    };
    let settings = Settings {
        coalescing: state(Compare::Coalescing),
        view_sharing: w.views.and(state(Compare::ViewSharing)),
    };
    w.stream = match (args.protocol, ut.broker.http) {
        (args::Protocol::Kafka, _) => None,
        (protocol, Some(addr)) => Some((protocol, addr)),
        (_, None) => {
            return Err(io::Error::other(
                "--protocol sse|ws needs the broker's HTTP stream address (--http)",
            ))
        }
    };
    let endpoint = Endpoint::Kafka(&ut.cluster, ut.upstream.as_ref());
    // The topic lives where the producers write.
    let owner = ut.upstream.as_ref().unwrap_or(&ut.cluster);
    let run_topic = topic::RunTopic::prepare(owner, w, args.topic.is_some())?;
    let result = workload::run(w, &endpoint, &ut.obs, &label, settings);
    let (deleted, topic_line) = run_topic.finish(owner, args.keep_topic);
    let mut s = result?;
    s.topic_deleted = Some(deleted);
    s.cautions = cautions(&s, w);
    print_summary(&s);
    println!("{topic_line}");
    Ok(s)
}

/// The medians of a point's repeats (`of_mode`: per setting, its runs), against the median of its
/// raw baselines (`of_raw`), printed with the comparison of the settings. Returns the index of the
/// point's first median.
fn add_medians(
    args: &FanoutArgs,
    plan: &Plan,
    report: &mut Report,
    of_mode: Vec<Vec<usize>>,
    of_raw: Vec<usize>,
) -> usize {
    let point_medians: Vec<Repeats> = of_mode
        .into_iter()
        .map(|ix| Repeats::of(&ix.iter().map(|&i| &report.runs[i]).collect::<Vec<_>>(), ix))
        .collect();
    let raw_median = (!of_raw.is_empty()).then(|| {
        Repeats::of(
            &of_raw
                .iter()
                .map(|&i| &report.raw_baselines[i])
                .collect::<Vec<_>>(),
            of_raw,
        )
    });
    let first_median = report.medians.len();
    report.medians.extend(point_medians);
    if let Some(raw) = &raw_median {
        // The medians against the median raw server.
        for m in &mut report.medians[first_median..] {
            against_raw(&mut m.median, &raw.median, args.rate);
        }
    }
    if plan.repeat > 1 {
        print_medians(&report.medians[first_median..], raw_median.as_ref());
    }
    if plan.modes.len() == 2 {
        let (on, off) = (
            &report.medians[first_median].median,
            &report.medians[first_median + 1].median,
        );
        report
            .comparisons
            .push(Comparison::of(on, off, first_median, plan.repeat));
        let compared = args.compare.expect("two modes only with --compare");
        print_comparison(compared, on, off, plan.repeat);
    }
    report.raw_baseline_medians.extend(raw_median);
    first_median
}

/// The disk baseline in the embedded broker's data directory `dir`, beside the point's runs (from
/// `first_run`) and medians (from `first_median`).
fn disk_baseline(
    dir: &Path,
    flush_interval: Option<Duration>,
    w: &Workload,
    report: &mut Report,
    first_run: usize,
    first_median: usize,
) {
    let writers = disk::writers_for(w.partitions as usize);
    println!(
        "\n== disk baseline: {writers} writer{} of {} KiB Direct I/O writes in {} ==",
        plural(writers),
        disk::WRITE_BYTES >> 10,
        dir.display()
    );
    // A baseline that cannot run (a full disk) is reported; the runs still stand.
    let measured = disk::measure(dir, writers, flush_interval, disk::PHASE).unwrap_or_else(|e| {
        println!("disk baseline    failed: {e}");
        None
    });
    let Some(d) = measured else {
        return;
    };
    for r in &mut report.runs[first_run..] {
        r.disk_baseline_fraction = ratio(Some(r.produced.mb_per_s), Some(d.plain.mb_per_s));
    }
    for m in &mut report.medians[first_median..] {
        m.median.disk_baseline_fraction =
            ratio(Some(m.median.produced.mb_per_s), Some(d.plain.mb_per_s));
    }
    print_disk(&d, &report.runs[first_run..]);
    report.disk_baselines.push(d);
}

/// The end of a series: the table of the medians (when there is more than one run to show), the
/// verdict, then the JSON summary and the plot when asked.
fn finish(
    args: &FanoutArgs,
    broker: &Broker,
    repeat: usize,
    mut report: Report,
) -> io::Result<Report> {
    if report.medians.len() > 1 || !report.raw_baselines.is_empty() || repeat > 1 {
        let rows: Vec<&RunSummary> = report.medians.iter().map(|m| &m.median).collect();
        let raw_rows: Vec<&RunSummary> = report
            .raw_baseline_medians
            .iter()
            .map(|m| &m.median)
            .collect();
        print_table(&rows, &raw_rows, args.rate, repeat);
    }
    report.ok = report
        .runs
        .iter()
        .all(|r| r.correctness.all_received && r.errors.count == 0)
        && report.raw_baselines.iter().all(|r| r.errors.count == 0);
    report.broker = broker.describe();
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(io::Error::other)?;
        std::fs::write(path, text + "\n")?;
        println!("summary written to {}", path.display());
    }
    if let (Some(path), Some(sweep)) = (&args.plot, &args.sweep) {
        std::fs::write(path, render_plot(&report, sweep))?;
        println!("plot written to {}", path.display());
    }
    Ok(report)
}

/// Sets `r`'s figures against the raw baseline `raw` with the same consumers: its share of the raw
/// server's delivery (unpaced), or its CPU per delivered GB over the paced raw server's.
fn against_raw(r: &mut RunSummary, raw: &RunSummary, rate: Rate) {
    if rate == Rate::Unlimited {
        r.raw_baseline_fraction = ratio(Some(r.delivered.mb_per_s), Some(raw.delivered.mb_per_s));
    } else {
        r.raw_cpu_ratio = ratio(
            r.server.cpu_s_per_delivered_gb,
            raw.server.cpu_s_per_delivered_gb,
        );
    }
}

fn raw_baseline(w: &Workload, fetch_version: i16, threads: usize) -> io::Result<RunSummary> {
    // As many consumer connections as the run had (views: every shard's).
    let per_partition = w.consumers_per_partition * w.views.unwrap_or(1) as usize;
    let consumers = per_partition * w.partitions as usize;
    let stream = w.stream.map(|(protocol, _)| protocol);
    let what = match stream {
        None => "raw TCP baseline",
        Some(_) => "raw stream baseline",
    };
    println!(
        "\n== {what}: {} consumer connection{} {} from memory, {} server thread{} ==",
        consumers,
        plural(consumers),
        if stream.is_some() {
            "streamed"
        } else {
            "fetching"
        },
        threads,
        plural(threads)
    );
    // A stream's frames are kept per batch of the ring: a smaller ring.
    let ring_bytes = if stream.is_some() { 4 << 20 } else { 64 << 20 };
    let ring = Arc::new(baseline::Ring::new(
        w.message_bytes,
        w.records_per_batch,
        w.compression,
        ring_bytes,
        w.fetch_max_bytes as usize,
    )?);
    // Paced runs: one batch per partition every records-per-batch / (rate / partitions) seconds.
    let pace = (w.rate > 0.0).then(|| {
        Duration::from_secs_f64(w.records_per_batch as f64 * f64::from(w.partitions) / w.rate)
    });
    let mut rw = w.clone();
    let (server, addrs) = match stream {
        None => {
            let server = baseline::RawServer::start(threads, ring.clone(), pace)?;
            let addrs = server.addrs.clone();
            (RawSender::Fetches(server), addrs)
        }
        Some(protocol) => {
            let server = stream_baseline::RawStreamServer::start(threads, ring.clone(), pace)?;
            rw.stream = Some((protocol, server.addr));
            let addrs = vec![server.addr];
            (RawSender::Streams(server), addrs)
        }
    };
    let endpoint = Endpoint::Raw {
        addrs,
        period: ring.period(),
        fetch_version,
    };
    let obs = Observer {
        thread_prefix: Some(baseline::THREAD_PREFIX),
        ..Observer::default()
    };
    rw.backlog_bytes = 0;
    rw.views = None;
    rw.consumers_per_partition = per_partition;
    let label = format!("{what} consumers={}x{}", per_partition, w.partitions);
    let result = workload::run(&rw, &endpoint, &obs, &label, Settings::default());
    match server {
        RawSender::Fetches(s) => s.stop(),
        RawSender::Streams(s) => s.stop(),
    }
    let s = result?;
    print_summary(&s);
    Ok(s)
}

/// The raw baseline's server: fetches answered from memory, or streams written from it.
enum RawSender {
    Fetches(baseline::RawServer),
    Streams(stream_baseline::RawStreamServer),
}
