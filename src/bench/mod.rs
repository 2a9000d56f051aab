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
//! - [`args`]     — the command line: flags, value parsers, checks.
//! - [`broker`]   — the broker under test: embedded (in process or a child) or external.
//! - [`client`]   — its own Kafka client: blocking set-up calls and request templates; fetch
//!   responses are read by `shoal::wire::fetch::decode` without copying or decoding records.
//! - [`workload`] — one run: producers and consumers on glommio executors, phases, the summary.
//! - [`stats`]    — counters, histograms, `/proc` CPU and memory, shoal's `/metrics`, formatting.
//! - [`baseline`] — the raw TCP fan-out from memory (`--raw-baseline`).
//! - [`disk`]     — the embedded broker's device: Direct I/O writes, with and without flushes
//!   (`--disk-baseline`).
//! - [`repeat`]   — `--repeat`: the median of each figure over a point's repeated runs.
//! - [`report`]   — what is printed: summaries, comparisons, tables, the plot of a sweep.
//! - [`plot`]     — the SVG of a sweep (`--plot`).
//! - [`tls`]      — the generator's TLS client (`--tls-ca`): every connection, blocking or async.
//! - [`sasl`]     — the generator's SASL client (`--sasl-mechanism`): every connection.
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
mod sasl;
pub mod stats;
mod tls;
pub mod workload;

pub use args::BenchCommand;
pub use broker::ServeConfig;

use args::{validate, Compare, FanoutArgs, Rate, Start, SweepKey};
use broker::Broker;
use client::Cluster;
use repeat::Repeats;
use report::{
    describe_workload, plural, print_comparison, print_disk, print_medians, print_raw,
    print_summary, print_table, render_plot, run_label, switch_enabled,
};
use serde::Serialize;
use std::io;
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
}

impl Comparison {
    /// `on` against `off` (the medians at `on_run` and `on_run + 1`).
    fn of(on: &RunSummary, off: &RunSummary, on_run: usize) -> Comparison {
        Comparison {
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
        topic: args.topic.clone(),
        partitions,
        producers,
        consumers_per_partition: consumers,
        views: args.views,
        message_bytes,
        records_per_batch: (args.batch_bytes as usize / message_bytes.max(1)).max(1),
        rate: args.rate.messages_per_sec(message_bytes),
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
        fetch_max_bytes: args.fetch_max_bytes.min(i32::MAX as u64) as i32,
        drain_timeout: args.drain_timeout,
        receive_buffer: (args.receive_buffer as usize).max(4096),
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

fn series(args: &FanoutArgs, broker: &mut Broker, cpus: usize) -> io::Result<Report> {
    let mut cluster = Cluster::connect(broker.bootstrap)?;
    let upstream = match &args.produce_bootstrap {
        Some(addr) => Some(Cluster::connect(client::resolve(addr)?)?),
        None => None,
    };
    let mut obs = broker.observer();
    println!("shoal bench fanout: {}", broker.describe());
    let points: Vec<Option<(SweepKey, u64)>> = match &args.sweep {
        Some(s) => s.values.iter().map(|v| Some((s.key, *v))).collect(),
        None => vec![None],
    };
    let modes: Vec<Option<bool>> = if args.compare.is_some() {
        vec![Some(true), Some(false)]
    } else {
        vec![None]
    };
    let switch_before = args.compare.and_then(|c| switch_enabled(broker.admin, c));
    let repeat = args.repeat.max(1) as usize;
    let total_runs = points.len() * modes.len() * repeat;
    let mut runs: Vec<RunSummary> = Vec::new();
    let mut raws: Vec<RunSummary> = Vec::new();
    let mut medians: Vec<Repeats> = Vec::new();
    let mut raw_medians: Vec<Repeats> = Vec::new();
    let mut disks = Vec::new();
    let mut comparisons = Vec::new();
    for point in &points {
        let mut w = workload_for(args, *point, cpus);
        let first_of_point = runs.len();
        // Per mode, the runs of its repeats; the raw baselines of the point.
        let mut of_mode: Vec<Vec<usize>> = vec![Vec::new(); modes.len()];
        let mut of_raw = Vec::new();
        for rep in 0..repeat {
            for (m, mode) in modes.iter().enumerate() {
                if args.broker_process && !runs.is_empty() {
                    // Every run gets a fresh process: its peak RSS is its own.
                    broker.restart(args)?;
                    cluster = Cluster::connect(broker.bootstrap)?;
                    obs = broker.observer();
                    println!(
                        "\n(a fresh shoal process for the next run: {})",
                        broker.describe()
                    );
                }
                if let (Some(on), Some(admin), Some(c)) = (mode, broker.admin, args.compare) {
                    stats::set_switch(admin, c.setting(), *on)?;
                }
                w.topic = if runs.is_empty() {
                    args.topic.clone()
                } else {
                    format!("{}-{}", args.topic, runs.len() + 1)
                };
                let label = run_label(&w, args.compare.zip(*mode));
                let of_repeats = match repeat {
                    1 => String::new(),
                    n => format!(" (repeat {}/{n})", rep + 1),
                };
                println!(
                    "\n== run {}/{total_runs}: {label}{of_repeats} ==",
                    runs.len() + 1
                );
                println!("{}", describe_workload(&w, args));
                let state = |c: Compare| match args.compare {
                    Some(compared) if compared == c => *mode,
                    _ => switch_enabled(broker.admin, c),
                };
                let settings = Settings {
                    coalescing: state(Compare::Coalescing),
                    view_sharing: w.views.and(state(Compare::ViewSharing)),
                };
                let endpoint = Endpoint::Kafka(&cluster, upstream.as_ref());
                let s = workload::run(&w, &endpoint, &obs, &label, settings)?;
                print_summary(&s);
                of_mode[m].push(runs.len());
                runs.push(s);
            }
            if args.raw_baseline {
                let raw = raw_baseline(&w, cluster.versions.fetch, broker.cores.unwrap_or(1))?;
                // Each run of this repeat against this repeat's raw server.
                let these: Vec<usize> = of_mode.iter().map(|v| v[rep]).collect();
                for &i in &these {
                    against_raw(&mut runs[i], &raw, args.rate);
                }
                let these: Vec<RunSummary> = these.iter().map(|&i| runs[i].clone()).collect();
                print_raw(&raw, &these, args.rate);
                of_raw.push(raws.len());
                raws.push(raw);
            }
        }
        let point_medians: Vec<Repeats> = of_mode
            .into_iter()
            .map(|ix| Repeats::of(&ix.iter().map(|&i| &runs[i]).collect::<Vec<_>>(), ix))
            .collect();
        let raw_median = (!of_raw.is_empty()).then(|| {
            Repeats::of(
                &of_raw.iter().map(|&i| &raws[i]).collect::<Vec<_>>(),
                of_raw,
            )
        });
        let first_median = medians.len();
        medians.extend(point_medians);
        if let Some(raw) = &raw_median {
            // The medians against the median raw server.
            for m in &mut medians[first_median..] {
                against_raw(&mut m.median, &raw.median, args.rate);
            }
        }
        if repeat > 1 {
            print_medians(&medians[first_median..], raw_median.as_ref());
        }
        if modes.len() == 2 {
            let (on, off) = (
                &medians[first_median].median,
                &medians[first_median + 1].median,
            );
            comparisons.push(Comparison::of(on, off, first_median));
            let compared = args.compare.expect("two modes only with --compare");
            print_comparison(compared, on, off, repeat);
        }
        raw_medians.extend(raw_median);
        if let (true, Some(dir)) = (args.disk_baseline, &broker.data_dir) {
            let writers = disk::writers_for(w.partitions as usize);
            println!(
                "\n== disk baseline: {writers} writer{} of {} KiB Direct I/O writes in {} ==",
                plural(writers),
                disk::WRITE_BYTES >> 10,
                dir.display()
            );
            // A baseline that cannot run (a full disk) is reported; the runs still stand.
            let measured = disk::measure(dir, writers, broker.flush_interval, disk::PHASE)
                .unwrap_or_else(|e| {
                    println!("disk baseline    failed: {e}");
                    None
                });
            if let Some(d) = measured {
                for r in &mut runs[first_of_point..] {
                    r.disk_baseline_fraction =
                        ratio(Some(r.produced.mb_per_s), Some(d.plain.mb_per_s));
                }
                for m in &mut medians[first_median..] {
                    m.median.disk_baseline_fraction =
                        ratio(Some(m.median.produced.mb_per_s), Some(d.plain.mb_per_s));
                }
                print_disk(&d, &runs[first_of_point..]);
                disks.push(d);
            }
        }
    }
    if let (Some(before), Some(admin), Some(c)) = (switch_before, broker.admin, args.compare) {
        stats::set_switch(admin, c.setting(), before)?;
    }
    if medians.len() > 1 || !raws.is_empty() || repeat > 1 {
        let rows: Vec<&RunSummary> = medians.iter().map(|m| &m.median).collect();
        let raw_rows: Vec<&RunSummary> = raw_medians.iter().map(|m| &m.median).collect();
        print_table(&rows, &raw_rows, args.rate, repeat);
    }
    let ok = runs
        .iter()
        .all(|r| r.correctness.all_received && r.errors.count == 0)
        && raws.iter().all(|r| r.errors.count == 0);
    let report = Report {
        tool: "shoal bench fanout",
        version: env!("CARGO_PKG_VERSION"),
        broker: broker.describe(),
        config: args.clone(),
        runs,
        raw_baselines: raws,
        disk_baselines: disks,
        medians,
        raw_baseline_medians: raw_medians,
        comparisons,
        ok,
    };
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
    println!(
        "\n== raw TCP baseline: {} consumer connection{} fetching from memory, {} server thread{} ==",
        consumers,
        plural(consumers),
        threads,
        plural(threads)
    );
    let ring = Arc::new(baseline::Ring::new(
        w.message_bytes,
        w.records_per_batch,
        w.compression,
        64 << 20,
        w.fetch_max_bytes as usize,
    )?);
    // Paced runs: one batch per partition every records-per-batch / (rate / partitions) seconds.
    let pace = (w.rate > 0.0).then(|| {
        Duration::from_secs_f64(w.records_per_batch as f64 * f64::from(w.partitions) / w.rate)
    });
    let server = baseline::RawServer::start(threads, ring.clone(), pace)?;
    let endpoint = Endpoint::Raw {
        addrs: server.addrs.clone(),
        period: ring.period(),
        fetch_version,
    };
    let obs = Observer {
        thread_prefix: Some(baseline::THREAD_PREFIX),
        ..Observer::default()
    };
    let mut rw = w.clone();
    rw.backlog_bytes = 0;
    rw.views = None;
    rw.consumers_per_partition = per_partition;
    let label = format!(
        "raw TCP baseline consumers={}x{}",
        per_partition, w.partitions
    );
    let result = workload::run(&rw, &endpoint, &obs, &label, Settings::default());
    server.stop();
    let s = result?;
    print_summary(&s);
    Ok(s)
}
