//! `shoal bench fanout`: the bundled fan-out load generator.
//!
//! Producers write to a topic; every partition is read by `--consumers` independent consumers (no
//! group: each fetches on its own from its own offset), the fan-out shoal is built for. Without
//! `--bootstrap` it starts an embedded shoal on a temporary data directory, so it works on a fresh
//! machine; with it, it loads any Kafka-compatible broker.
//!
//! - [`client`]   — its own Kafka client: blocking set-up calls and request templates; fetch
//!   responses are read by `shoal::wire::fetch::decode` without copying or decoding records.
//! - [`workload`] — one run: producers and consumers on glommio executors, phases, the summary.
//! - [`stats`]    — counters, histograms, `/proc` CPU and memory, shoal's `/metrics`, formatting.
//! - [`baseline`] — the raw TCP fan-out from memory (`--raw-baseline`).
//! - [`plot`]     — the SVG of a sweep (`--plot`).
//!
//! This module holds the command line and runs the series: one run, or `--compare coalescing` (on,
//! then off), over each `--sweep` value, each followed by the raw baseline when asked.

pub mod baseline;
pub mod client;
pub mod plot;
pub mod stats;
pub mod workload;

use clap::{Args, Subcommand, ValueEnum};
use client::{Cluster, Codec};
use serde::Serialize;
use shoal::server::{Server, ServerConfig};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use workload::{Observer, RunSummary, Settings, Target, Workload};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Fan-out load: producers write, many independent consumers per partition read everything.
    /// Without --bootstrap, an embedded shoal is started on a temporary directory.
    Fanout(FanoutArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// Consumers start at the end of the log: they read what is produced after they start.
    Latest,
    /// Consumers start at the beginning of the log.
    Earliest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// Runs with shoal's fetch coalescing on, then off (through the admin API).
    Coalescing,
    /// Runs with shard-view readers shared, then not shared (each view fetch decodes and filters
    /// the source for itself); needs --views.
    ViewSharing,
}

impl Compare {
    /// The admin API's name of the setting switched.
    fn setting(self) -> &'static str {
        match self {
            Compare::Coalescing => "fetch_coalescing",
            Compare::ViewSharing => "view_sharing",
        }
    }

    /// Its name in labels and headings.
    fn label(self) -> &'static str {
        match self {
            Compare::Coalescing => "coalescing",
            Compare::ViewSharing => "view-sharing",
        }
    }
}

/// `--rate`: messages or bytes per second over all producers; 0 is as fast as possible.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rate {
    Unlimited,
    MessagesPerSec(f64),
    BytesPerSec(f64),
}

impl Rate {
    pub fn messages_per_sec(self, message_bytes: usize) -> f64 {
        match self {
            Rate::Unlimited => 0.0,
            Rate::MessagesPerSec(m) => m,
            Rate::BytesPerSec(b) => b / message_bytes.max(1) as f64,
        }
    }
}

/// `--sweep KEY=V1,V2,...`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sweep {
    pub key: SweepKey,
    pub values: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepKey {
    Consumers,
    Producers,
    Partitions,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct FanoutArgs {
    /// Kafka address (HOST:PORT) of the broker under test. Without it, an embedded shoal is started.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// shoal's admin HTTP address (HOST:PORT) when --bootstrap is a shoal: broker metrics, and the
    /// coalescing switch for --compare.
    #[arg(long)]
    pub admin: Option<String>,
    /// Cores of the embedded shoal.
    #[arg(long, default_value_t = 1)]
    pub broker_cores: usize,
    /// Run the embedded shoal as a child process (this binary's `shoal serve`), a fresh one for
    /// each run, rather than in this process: its CPU and peak RSS are then measured alone,
    /// without the generator's or an earlier run's.
    #[arg(long)]
    pub broker_process: bool,
    /// Extra `shoal serve` flag for the embedded shoal, e.g. --broker-arg=--flush-ms=0 (repeatable).
    #[arg(long = "broker-arg", allow_hyphen_values = true, value_name = "FLAG")]
    pub broker_args: Vec<String>,
    /// Data directory of the embedded shoal (default: a new directory under the system temporary
    /// directory, removed at the end; note that it may be tmpfs, where fsync costs nothing).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Topic name. Created with --partitions if missing; later runs of a series use NAME-2, NAME-3...
    #[arg(long, default_value = "shoal-bench")]
    pub topic: String,
    #[arg(long, default_value_t = 1)]
    pub partitions: i32,
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Independent consumers per partition (with --views: per shard view of each partition).
    #[arg(long, default_value_t = 8)]
    pub consumers: usize,
    /// Consumers read the N shard views `<topic>.shard-<i>-of-<N>` of the topic instead of the
    /// topic itself (shoal's sharded views); records get keys spread over the shards.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(shoal::router::MAX_VIEW_SHARDS)))]
    pub views: Option<u32>,
    /// Size of each message's value (at least 8: the first 8 bytes carry the send time).
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    pub message_bytes: u64,
    /// Target batch size: each batch holds max(1, batch-bytes / message-bytes) messages.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    pub batch_bytes: u64,
    /// Total produce rate: messages per second (e.g. 50000, 50k) or bytes per second with a unit
    /// (e.g. 100MB/s, 64MiB/s); 0 is as fast as possible.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub rate: Rate,
    /// Produce acks: 0, 1, or -1/all.
    #[arg(long, default_value = "1", value_parser = parse_acks, allow_negative_numbers = true)]
    pub acks: i16,
    /// Measured time (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// Time before the measurement starts (same load, not counted). Default: 2s, or 0 with --backlog
    /// (the catch-up is what is measured).
    #[arg(long, value_parser = parse_duration)]
    #[serde(serialize_with = "opt_secs")]
    pub warmup: Option<Duration>,
    /// Where consumers start.
    #[arg(long, value_enum, default_value_t = Start::Latest)]
    pub start: Start,
    /// Pre-produce this much (e.g. 1GiB) before the consumers start, then start them at the earliest
    /// offset: the catch-up workload. Producers keep producing at --rate during the run; with
    /// --producers 0 (a pure catch-up) the measurement ends when every consumer has read the backlog.
    #[arg(long, value_parser = parse_size)]
    pub backlog: Option<u64>,
    #[arg(long, value_enum, default_value_t = Codec::None)]
    pub compression: Codec,
    /// Write the summary (every figure of every run) to FILE as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run the workload twice, with a shoal setting on and then off, side by side: fetch
    /// coalescing, or view-sharing (with --views).
    #[arg(long, value_enum)]
    pub compare: Option<Compare>,
    /// Also run a plain TCP fan-out from memory to the same number of consumers (same batches, same
    /// compression) and, when the producers are not paced (--rate 0), print the broker's delivered
    /// throughput as a fraction of it.
    #[arg(long)]
    pub raw_baseline: bool,
    /// Run a series over KEY (consumers, producers or partitions), e.g. consumers=1,8,64,256.
    #[arg(long, value_parser = parse_sweep)]
    pub sweep: Option<Sweep>,
    /// Draw delivered MB/s and p99 end-to-end latency against the swept value into FILE.svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Client executors (threads) for producers and consumers (default: the CPUs the embedded
    /// broker leaves, 1 to 4).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Produce requests outstanding per connection.
    #[arg(long, default_value_t = 5)]
    pub max_in_flight: usize,
    /// Fetch max_wait_ms (long polling).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub fetch_max_wait: Duration,
    /// Fetch max_bytes (and the partition's max_bytes).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub fetch_max_bytes: u64,
    /// Longest the consumers may take, after the producers stop, to reach the final offsets.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub drain_timeout: Duration,
    /// Receive buffer of each consumer connection (responses stream through it).
    #[arg(long, default_value = "128KiB", value_parser = parse_size)]
    pub receive_buffer: u64,
    /// No live lines, only the summaries.
    #[arg(long)]
    pub quiet: bool,
}

/// Durations go to JSON as seconds.
fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Turns `shoal serve` flags (`--broker-arg`s, after the bench's own) into the embedded broker's
/// configuration; the command line owns that parsing.
pub type ServeConfig = fn(&[String]) -> Result<ServerConfig, String>;

pub fn run(cmd: BenchCommand, serve_config: ServeConfig) -> io::Result<()> {
    match cmd {
        BenchCommand::Fanout(args) => fanout(args, serve_config),
    }
}

// ---------------------------------------------------------------------------------------------------
// Value parsers.

pub use shoal::units::parse_size;

/// "0", "50000", "50k", "1.5M" messages/s, or "100MB/s", "64MiB/s" bytes/s.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let t = s.trim();
    if let Some(size) = t.strip_suffix("/s") {
        let b = parse_size(size)?;
        return Ok(if b == 0 {
            Rate::Unlimited
        } else {
            Rate::BytesPerSec(b as f64)
        });
    }
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected msg/s (50000, 50k) or bytes/s (100MB/s)"))?;
    if v < 0.0 {
        return Err(format!("{s:?}: a rate cannot be negative"));
    }
    Ok(if v == 0.0 {
        Rate::Unlimited
    } else {
        Rate::MessagesPerSec(v * mult)
    })
}

pub fn parse_acks(s: &str) -> Result<i16, String> {
    match s {
        "all" | "-1" => Ok(-1),
        "0" => Ok(0),
        "1" => Ok(1),
        _ => Err(format!("{s:?}: acks is 0, 1, or -1/all")),
    }
}

/// "10s", "500ms", "2m", "1.5" (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration like 10s, 500ms, 2m"))?;
    if !(0.0..=1e7).contains(&v) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

pub fn parse_sweep(s: &str) -> Result<Sweep, String> {
    let (key, values) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=V1,V2,... e.g. consumers=1,8,64,256"))?;
    let key = match key.trim() {
        "consumers" => SweepKey::Consumers,
        "producers" => SweepKey::Producers,
        "partitions" => SweepKey::Partitions,
        k => {
            return Err(format!(
                "cannot sweep {k:?}: consumers, producers or partitions"
            ))
        }
    };
    let values = values
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|v| *v > 0 || key == SweepKey::Producers)
                .ok_or_else(|| format!("{v:?} in --sweep is not a count"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if values.is_empty() {
        return Err("--sweep needs at least one value".into());
    }
    Ok(Sweep { key, values })
}

// ---------------------------------------------------------------------------------------------------
// The broker under test.

/// How the embedded shoal runs.
enum Embedded {
    InProcess(Server),
    Child(std::process::Child),
}

/// The embedded shoal, or the address of an external broker.
struct Broker {
    embedded: Option<(Embedded, Option<PathBuf>)>,
    bootstrap: SocketAddr,
    admin: Option<SocketAddr>,
    pid: Option<u32>,
    cores: Option<usize>,
    serve_config: ServeConfig,
}

impl Broker {
    fn start(args: &FanoutArgs, serve_config: ServeConfig) -> io::Result<Broker> {
        if let Some(b) = &args.bootstrap {
            let admin = args.admin.as_deref().map(client::resolve).transpose()?;
            // The broker's CPU and memory can be read when it runs on this host.
            // (Only for loopback addresses: a port number alone says nothing about other hosts.)
            let pid = admin
                .or(client::resolve(b).ok())
                .filter(|a| a.ip().is_loopback())
                .and_then(stats::find_listener_pid)
                .filter(|p| *p != std::process::id());
            return Ok(Broker {
                embedded: None,
                bootstrap: client::resolve(b)?,
                admin,
                pid,
                cores: None,
                serve_config,
            });
        }
        // A directory of our own (removed at the end) under the system's temporary directory, or
        // under --data-dir when each run gets a fresh process (a fresh process must not replay
        // the earlier runs' topics).
        let fresh_under = |parent: PathBuf| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let d = parent.join(format!("shoal-bench-{}-{nanos}", std::process::id()));
            (d.clone(), Some(d))
        };
        let (dir, remove) = match &args.data_dir {
            Some(d) if args.broker_process => fresh_under(d.clone()),
            Some(d) => (d.clone(), None),
            None => fresh_under(std::env::temp_dir()),
        };
        let cores = args.broker_cores.max(1).to_string();
        let data_dir = dir.to_string_lossy().to_string();
        let mut argv: Vec<String> = [
            "shoal",
            "serve",
            "--data-dir",
            &data_dir,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--cores",
            &cores,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        argv.extend(args.broker_args.iter().cloned());
        let config =
            serve_config(&argv[2..]).map_err(|e| io::Error::other(format!("--broker-arg: {e}")))?;
        let cores = Some(args.broker_cores.max(1));
        if args.broker_process {
            let (child, port, admin) = spawn_broker(&argv[1..])?;
            return Ok(Broker {
                pid: Some(child.id()),
                embedded: Some((Embedded::Child(child), remove)),
                bootstrap: SocketAddr::from(([127, 0, 0, 1], port)),
                admin: Some(admin),
                cores,
                serve_config,
            });
        }
        let server = Server::start(config)?;
        let bootstrap = SocketAddr::from(([127, 0, 0, 1], server.ports[0]));
        let admin = Some(server.admin);
        Ok(Broker {
            embedded: Some((Embedded::InProcess(server), remove)),
            bootstrap,
            admin,
            pid: None,
            cores,
            serve_config,
        })
    }

    fn observer(&self) -> Observer {
        let in_process = matches!(self.embedded, Some((Embedded::InProcess(_), _)));
        Observer {
            thread_prefix: in_process.then_some("shoal-core-"),
            pid: self.pid,
            admin: self.admin,
            rss_of_this_process: in_process,
        }
    }

    fn describe(&self) -> String {
        match (&self.embedded, self.admin) {
            (Some((how, _)), Some(a)) => format!(
                "embedded shoal ({} core{}{}) on {}, admin {a}",
                self.cores.unwrap_or(1),
                if self.cores == Some(1) { "" } else { "s" },
                match how {
                    Embedded::InProcess(_) => String::new(),
                    Embedded::Child(c) => format!(", child process {}", c.id()),
                },
                self.bootstrap
            ),
            (None, Some(a)) => format!("shoal at {}, admin {a}", self.bootstrap),
            _ => format!("Kafka broker at {}", self.bootstrap),
        }
    }

    /// Stops the embedded shoal and starts a fresh one (a new process and data directory).
    fn restart(&mut self, args: &FanoutArgs) -> io::Result<()> {
        self.stop();
        *self = Broker::start(args, self.serve_config)?;
        Ok(())
    }

    fn stop(&mut self) {
        if let Some((how, remove)) = self.embedded.take() {
            match how {
                Embedded::InProcess(server) => {
                    server.stop();
                    if let Err(e) = server.wait() {
                        log::error!("embedded shoal: {e}");
                    }
                }
                Embedded::Child(mut child) => {
                    // SAFETY: kill(2) on the child's pid, which is not reaped before wait().
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                    // An orderly stop, or SIGKILL after 30 s.
                    let deadline = std::time::Instant::now() + Duration::from_secs(30);
                    let status = loop {
                        match child.try_wait() {
                            Ok(None) if std::time::Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_millis(20))
                            }
                            Ok(None) => {
                                log::error!("embedded shoal process: no stop within 30 s, killed");
                                let _ = child.kill();
                                break child.wait();
                            }
                            done => break done.map(|s| s.expect("exited")),
                        }
                    };
                    match status {
                        Ok(status) if !status.success() => {
                            log::error!("embedded shoal process: {status}")
                        }
                        Err(e) => log::error!("embedded shoal process: {e}"),
                        Ok(_) => {}
                    }
                }
            }
            if let Some(d) = remove {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
}

/// Stops the embedded shoal however the generator ends (an error, a panic).
impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `shoal serve ARGS` (this executable) as a child process and reads its Kafka port and
/// admin address from the line it prints once it listens. Its other output goes to ours.
fn spawn_broker(serve_args: &[String]) -> io::Result<(std::process::Child, u16, SocketAddr)> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut command = std::process::Command::new(exe);
    // SAFETY: prctl(2) only, between fork and exec. The child gets SIGTERM if the thread that
    // started it dies, so a generator killed outright (SIGKILL) leaves no broker behind; the
    // series starts every child from the main thread, which lives until the end.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command
        .args(serve_args)
        // Its info lines would be interleaved with the report: warnings and errors only, unless
        // RUST_LOG says otherwise.
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in io::BufReader::new(stdout).lines().map_while(Result::ok) {
            match tx.take_if(|_| line.starts_with("shoal listening:")) {
                Some(tx) => drop(tx.send(line)),
                None => println!("{line}"),
            }
        }
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            let status = child.wait()?;
            let why = match e {
                std::sync::mpsc::RecvTimeoutError::Timeout => "did not start listening within 60 s",
                std::sync::mpsc::RecvTimeoutError::Disconnected => "exited before listening",
            };
            return Err(io::Error::other(format!(
                "the shoal process {why} ({status})"
            )));
        }
    };
    let (mut port, mut admin) = (None, None);
    for word in line.split_whitespace() {
        if let Some(p) = word.strip_prefix("kafka_ports=") {
            port = p.split(',').next().and_then(|p| p.parse().ok());
        } else if let Some(a) = word.strip_prefix("admin=") {
            admin = a.parse().ok();
        }
    }
    match (port, admin) {
        (Some(p), Some(a)) => Ok((child, p, a)),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err(io::Error::other(format!(
                "cannot read the shoal process's ports: {line:?}"
            )))
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The series.

/// The JSON document of `--json`.
#[derive(Debug, Serialize)]
struct Report {
    tool: &'static str,
    version: &'static str,
    broker: String,
    config: FanoutArgs,
    runs: Vec<RunSummary>,
    raw_baselines: Vec<RunSummary>,
    comparisons: Vec<Comparison>,
    /// Every run: every consumer received every record, and no errors.
    ok: bool,
}

/// The compared setting on vs off at one point of the series (ratios are on / off).
#[derive(Debug, Serialize)]
struct Comparison {
    consumers_per_partition: usize,
    partitions: i32,
    producers: usize,
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

fn validate(args: &FanoutArgs) -> Result<(), String> {
    if args.message_bytes < 8 {
        return Err("--message-bytes must be at least 8 (the send time rides in the value)".into());
    }
    if args.partitions < 1 {
        return Err("--partitions must be at least 1".into());
    }
    if args.consumers == 0
        && args
            .sweep
            .as_ref()
            .is_none_or(|s| s.key != SweepKey::Consumers)
    {
        return Err("--consumers must be at least 1".into());
    }
    if args.duration.is_zero() {
        return Err("--duration must be positive".into());
    }
    if args.fetch_max_bytes < 1024 || args.fetch_max_bytes > i32::MAX as u64 {
        return Err("--fetch-max-bytes must be between 1KiB and 2GiB".into());
    }
    if args.receive_buffer < (shoal::wire::fetch::decode::BATCH_PEEK as u64) {
        return Err("--receive-buffer is too small".into());
    }
    if let (Some(c), Some(_), None) = (args.compare, &args.bootstrap, &args.admin) {
        return Err(format!(
            "--compare {} switches a shoal setting through its admin API: give --admin",
            c.label()
        ));
    }
    if args.broker_process && args.bootstrap.is_some() {
        return Err("--broker-process starts shoal itself: it does not go with --bootstrap".into());
    }
    if let Some(n) = args.views {
        let records_per_batch = (args.batch_bytes / args.message_bytes.max(1)).max(1);
        if u64::from(n) > records_per_batch {
            return Err(format!(
                "--views {n}: batches of {records_per_batch} records cannot reach every shard; \
                 raise --batch-bytes or lower --message-bytes"
            ));
        }
    }
    if args.compare == Some(Compare::ViewSharing) && args.views.is_none() {
        return Err("--compare view-sharing compares shard views: give --views N".into());
    }
    if args.plot.is_some() && args.sweep.is_none() {
        return Err("--plot draws a --sweep: give one, e.g. --sweep consumers=1,8,64".into());
    }
    Ok(())
}

fn fanout(args: FanoutArgs, serve_config: ServeConfig) -> io::Result<()> {
    validate(&args).map_err(io::Error::other)?;
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
    let total_runs = points.len() * modes.len();
    let mut runs: Vec<RunSummary> = Vec::new();
    let mut raws: Vec<RunSummary> = Vec::new();
    let mut comparisons = Vec::new();
    for point in &points {
        let mut w = workload_for(args, *point, cpus);
        let first_of_point = runs.len();
        for mode in &modes {
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
            println!("\n== run {}/{total_runs}: {label} ==", runs.len() + 1);
            println!("{}", describe_workload(&w, args));
            let state = |c: Compare| match args.compare {
                Some(compared) if compared == c => *mode,
                _ => switch_enabled(broker.admin, c),
            };
            let settings = Settings {
                coalescing: state(Compare::Coalescing),
                view_sharing: w.views.and(state(Compare::ViewSharing)),
            };
            let s = workload::run(&w, &Target::Kafka(&cluster), &obs, &label, settings)?;
            print_summary(&s);
            runs.push(s);
        }
        if modes.len() == 2 {
            let (on, off) = (&runs[first_of_point], &runs[first_of_point + 1]);
            comparisons.push(Comparison {
                consumers_per_partition: on.consumers_per_partition,
                partitions: on.partitions,
                producers: on.producers,
                on_run: first_of_point,
                off_run: first_of_point + 1,
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
            });
            let compared = args.compare.expect("two modes only with --compare");
            print_comparison(compared, &runs[first_of_point], &runs[first_of_point + 1]);
        }
        if args.raw_baseline {
            let raw = raw_baseline(&w, cluster.versions.fetch, broker.cores.unwrap_or(1))?;
            if args.rate == Rate::Unlimited {
                for r in &mut runs[first_of_point..] {
                    r.raw_baseline_fraction =
                        ratio(Some(r.delivered.mb_per_s), Some(raw.delivered.mb_per_s));
                }
            }
            print_raw(&raw, &runs[first_of_point..], args.rate);
            raws.push(raw);
        }
    }
    if let (Some(before), Some(admin), Some(c)) = (switch_before, broker.admin, args.compare) {
        stats::set_switch(admin, c.setting(), before)?;
    }
    if runs.len() > 1 || !raws.is_empty() {
        print_table(&runs, &raws, args.rate);
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

/// One of shoal's switches, from its `/metrics` (None without an admin API or a shoal).
fn switch_enabled(admin: Option<SocketAddr>, c: Compare) -> Option<bool> {
    let metrics = stats::scrape(admin?).ok()?;
    let gauge = match c {
        Compare::Coalescing => "shoal_fetch_coalescer_enabled",
        Compare::ViewSharing => "shoal_view_sharing_enabled",
    };
    metrics.get(gauge).map(|v| *v > 0.0)
}

fn rate_label(rate: Rate) -> String {
    match rate {
        Rate::Unlimited => "as fast as possible".to_string(),
        Rate::MessagesPerSec(m) => format!("{} msg/s", stats::thousands(m as u64)),
        Rate::BytesPerSec(b) => format!("{:.1} MB/s", stats::mb(b)),
    }
}

/// Why runs at `rate` are not compared with the raw baseline, if they are not: the raw server
/// answers every fetch at once, a paced run delivers only what is produced.
fn raw_comparison_gap(rate: Rate) -> Option<String> {
    (rate != Rate::Unlimited).then(|| {
        format!(
            "n/a: the producers were paced (--rate {}) while the raw server never waits for data; \
             compare with --rate 0",
            rate_label(rate)
        )
    })
}

fn run_label(w: &Workload, mode: Option<(Compare, bool)>) -> String {
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

fn describe_workload(w: &Workload, args: &FanoutArgs) -> String {
    let rate = if w.rate > 0.0 {
        format!(
            "{} msg/s ({:.1} MB/s)",
            stats::thousands(w.rate as u64),
            stats::mb(w.rate * w.message_bytes as f64)
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

fn plural(n: usize) -> &'static str {
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

fn print_summary(s: &RunSummary) {
    println!(
        "-- summary: {} ({:.1} s measured) --",
        s.label, s.measured_s
    );
    if s.kind == "kafka" {
        println!(
            "{:<16} {} msgs, {}: {} msg/s, {:.1} MB/s",
            "produced",
            stats::thousands(s.produced.records),
            stats::size(s.produced.bytes),
            stats::thousands(s.produced.msg_per_s as u64),
            s.produced.mb_per_s
        );
    }
    println!(
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
    );
    if s.kind == "kafka" {
        println!("{}", latency_line("publish latency", &s.publish_latency_us));
        println!("{}", latency_line("e2e latency", &s.e2e_latency_us));
        let c = &s.correctness;
        if c.all_received {
            println!(
                "{:<16} OK: all {} consumers received every record produced after they started ({} records in all, {} produced; drained in {:.2} s)",
                "correctness",
                c.consumers,
                stats::thousands(c.received_records),
                stats::thousands(s.totals.produced_records),
                c.drain_s
            );
        } else {
            println!(
                "{:<16} FAILED: {} of {} consumers received everything ({} of {} expected records; {} gaps)",
                "correctness",
                c.complete_consumers,
                c.consumers,
                stats::thousands(c.received_records),
                stats::thousands(c.expected_records),
                c.gaps
            );
            for i in &c.incomplete {
                println!(
                    "{:<16}   consumer {} (partition {}): from {} reached {} of {}, {} records received, {} offsets missing between batches",
                    "", i.consumer, i.partition, i.start_offset, i.position, i.final_offset,
                    i.received_records, i.gap_offsets
                );
            }
        }
    }
    println!(
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
    );
    println!(
        "{:<16} {:.2} CPU-s = {:.2} cores{}",
        "generator CPU",
        s.generator.cpu_s,
        s.generator.cores,
        s.generator
            .cpu_s_per_delivered_gb
            .map(|g| format!(", {g:.2} CPU-s per delivered GB"))
            .unwrap_or_default()
    );
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
    } else {
        parts.push("CPU not observable (not on this host; give --admin of a local shoal)".into());
    }
    if let Some(rss) = sv.peak_rss_bytes {
        parts.push(format!(
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
        ));
    }
    println!("{who:<16} {}", parts.join("; "));
    if let Some(f) = &sv.fetch {
        println!(
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
        );
    }
    if let Some(v) = &sv.views {
        println!(
            "{:<16} {} source batches decoded for {} produced ({} per batch), {} shard batches \
             encoded, {} view fetches, {} catch-up reads, {} decode errors{}",
            "views",
            stats::thousands(v.source_batches_decoded),
            stats::thousands(v.source_batches),
            v.decodes_per_source_batch
                .map_or_else(|| "-".into(), |d| format!("{d:.2}")),
            stats::thousands(v.shard_batches_encoded),
            stats::thousands(v.fetches_served),
            stats::thousands(v.catch_up_reads),
            v.decode_errors,
            match s.view_sharing {
                Some(true) => "; readers shared",
                Some(false) => "; readers not shared",
                None => "",
            }
        );
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

fn print_comparison(compared: Compare, on: &RunSummary, off: &RunSummary) {
    println!(
        "\n-- {} on vs off: {} consumers --",
        compared.label(),
        on.consumers
    );
    type Row<'a> = (
        &'a str,
        Option<f64>,
        Option<f64>,
        Box<dyn Fn(f64) -> String>,
    );
    let rows: Vec<Row> = vec![
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
    ];
    println!("{:<20} {:>14} {:>14} {:>10}", "", "on", "off", "on/off");
    for (name, a, b, f) in rows {
        println!(
            "{name:<20} {:>14} {:>14} {:>10}",
            a.map_or_else(|| "-".into(), &f),
            b.map_or_else(|| "-".into(), &f),
            fmt_ratio(ratio(a, b))
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
    let server = baseline::RawServer::start(threads, ring.clone())?;
    let target = Target::Raw {
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
    let result = workload::run(&rw, &target, &obs, &label, Settings::default());
    server.stop();
    let s = result?;
    print_summary(&s);
    Ok(s)
}

fn print_raw(raw: &RunSummary, runs: &[RunSummary], rate: Rate) {
    for r in runs {
        match raw_comparison_gap(rate) {
            Some(gap) => println!(
                "{:<16} {}: {:.1} MB/s delivered, the raw baseline {:.1} MB/s; fraction {gap}",
                "vs raw baseline", r.label, r.delivered.mb_per_s, raw.delivered.mb_per_s
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

fn print_table(runs: &[RunSummary], raws: &[RunSummary], rate: Rate) {
    let gap = raw_comparison_gap(rate).filter(|_| !raws.is_empty());
    println!("\n== all runs ==");
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
            match (r.raw_baseline_fraction, &gap) {
                (Some(f), _) => format!("{:.1}%", f * 100.0),
                (None, Some(_)) if r.kind == "kafka" => "n/a".into(),
                (None, _) => "-".into(),
            },
        );
    }
    if let Some(gap) = gap {
        println!("vs raw {gap}");
    }
}

fn render_plot(report: &Report, sweep: &Sweep) -> String {
    let x_of = |r: &RunSummary| -> f64 {
        match sweep.key {
            SweepKey::Consumers => r.consumers_per_partition as f64,
            SweepKey::Producers => r.producers as f64,
            SweepKey::Partitions => r.partitions as f64,
        }
    };
    // One line per setting of the compared switch (coalescing without --compare), in the order
    // the runs met them.
    let compared = report.config.compare;
    let mode_of = |r: &RunSummary| match compared {
        Some(Compare::ViewSharing) => r.view_sharing,
        _ => r.coalescing,
    };
    let mut modes: Vec<Option<bool>> = Vec::new();
    for r in &report.runs {
        if !modes.contains(&mode_of(r)) {
            modes.push(mode_of(r));
        }
    }
    let mut throughput = Vec::new();
    let mut latency = Vec::new();
    for mode in modes {
        let name = match (mode, compared) {
            (Some(on), Some(c)) => {
                format!("shoal, {} {}", c.label(), if on { "on" } else { "off" })
            }
            (Some(true), None) => "shoal".into(),
            (Some(false), None) => "shoal (coalescing off)".into(),
            (None, _) => "broker".into(),
        };
        let pick = |f: &dyn Fn(&RunSummary) -> Option<f64>| -> Vec<(f64, f64)> {
            report
                .runs
                .iter()
                .filter(|r| mode_of(r) == mode)
                .filter_map(|r| f(r).map(|y| (x_of(r), y)))
                .collect()
        };
        // "off" is drawn dashed so that it stays visible where it lies on top of "on".
        let dash = (mode == Some(false)).then_some("3,3");
        throughput.push(plot::Series {
            name: name.clone(),
            points: pick(&|r| Some(r.delivered.mb_per_s)),
            dash,
        });
        latency.push(plot::Series {
            name,
            points: pick(&|r| r.e2e_latency_us.map(|l| l.p99 as f64 / 1e3)),
            dash,
        });
    }
    if !report.raw_baselines.is_empty() {
        throughput.push(plot::Series {
            name: "raw TCP baseline".into(),
            points: report
                .raw_baselines
                .iter()
                .map(|r| (x_of(r), r.delivered.mb_per_s))
                .collect(),
            dash: Some("8,4"),
        });
    }
    // A log axis where the values span more than 20x (the raw baseline beside a paced workload).
    let spans_decades = |series: &[plot::Series]| {
        let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let (lo, hi) = ys.fold((f64::MAX, 0.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
        lo > 0.0 && hi / lo > 20.0
    };
    let (log_throughput, log_latency) = (spans_decades(&throughput), spans_decades(&latency));
    let xs: Vec<f64> = sweep.values.iter().map(|v| *v as f64).collect();
    let first = report.runs.first();
    let title = format!(
        "shoal bench fanout: {} B messages, {} partition{}, {} producer{}",
        first.map_or(0, |r| r.message_bytes),
        first.map_or(0, |r| r.partitions),
        plural(first.map_or(0, |r| r.partitions as usize)),
        first.map_or(0, |r| r.producers),
        plural(first.map_or(0, |r| r.producers)),
    );
    let x_label = match sweep.key {
        SweepKey::Consumers => "consumers per partition",
        SweepKey::Producers => "producers",
        SweepKey::Partitions => "partitions",
    };
    let c = &report.config;
    let subtitle = format!(
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
    );
    plot::render(
        &title,
        &subtitle,
        x_label,
        &xs,
        &[
            plot::Panel {
                title: "delivered throughput".into(),
                y_label: "MB/s delivered (all consumers)".into(),
                series: throughput,
                log_y: log_throughput,
            },
            plot::Panel {
                title: "end-to-end latency, p99".into(),
                y_label: "p99 e2e latency (ms)".into(),
                series: latency,
                log_y: log_latency,
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_parsers() {
        assert_eq!(parse_size("16KiB"), Ok(16384));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("1 parsec").is_err());
        assert_eq!(parse_rate("0"), Ok(Rate::Unlimited));
        assert_eq!(parse_rate("50k"), Ok(Rate::MessagesPerSec(50_000.0)));
        assert_eq!(parse_rate("100MB/s"), Ok(Rate::BytesPerSec(1e8)));
        assert_eq!(
            parse_rate("100MB/s").unwrap().messages_per_sec(1000),
            100_000.0
        );
        assert_eq!(parse_acks("all"), Ok(-1));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(
            parse_sweep("consumers=1,8,64"),
            Ok(Sweep {
                key: SweepKey::Consumers,
                values: vec![1, 8, 64]
            })
        );
        assert!(parse_sweep("colour=1").is_err());
    }
}
