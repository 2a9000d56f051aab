//! The command line of `shoal bench`: its flags, their value parsers, and the checks across flags.

use super::client::Codec;
use super::workload::ProducerMode;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

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
    pub fn setting(self) -> &'static str {
        match self {
            Compare::Coalescing => "fetch_coalescing",
            Compare::ViewSharing => "view_sharing",
        }
    }

    /// Its name in labels and headings.
    pub fn label(self) -> &'static str {
        match self {
            Compare::Coalescing => "coalescing",
            Compare::ViewSharing => "view-sharing",
        }
    }
}

/// The consumers' isolation level (Kafka `isolation.level`).
/// How the consumers read: Kafka fetches, or shoal's HTTP streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Protocol {
    Kafka,
    /// Server-Sent Events (`--http-listen` streams, JSON records).
    Sse,
    /// WebSocket (`--http-listen` streams, JSON records).
    Ws,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Isolation {
    ReadUncommitted,
    ReadCommitted,
}

impl Isolation {
    /// The Fetch request's `isolation_level`.
    pub fn level(self) -> i8 {
        match self {
            Isolation::ReadUncommitted => 0,
            Isolation::ReadCommitted => 1,
        }
    }
}

/// A setting of the generator's own that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    pub fn on(self) -> bool {
        self == OnOff::On
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
    /// Messages per second, where a message takes `bytes_per_message` record-batch bytes as sent.
    pub fn messages_per_sec(self, bytes_per_message: f64) -> f64 {
        match self {
            Rate::Unlimited => 0.0,
            Rate::MessagesPerSec(m) => m,
            Rate::BytesPerSec(b) => b / bytes_per_message.max(1.0),
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
    /// Where the topic is created and the producers write, when --bootstrap is a `shoal edge`
    /// in front of this Kafka cluster (HOST:PORT); the consumers read at --bootstrap.
    #[arg(long, requires = "bootstrap")]
    pub produce_bootstrap: Option<String>,
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
    /// Connect with TLS, trusting the broker's certificate authority (PEM). For the embedded
    /// shoal give it its certificate too: --broker-arg=--tls-cert=server.pem
    /// --broker-arg=--tls-key=server.key.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// With --tls-ca: present this client certificate (PEM) for mTLS, with --tls-client-key.
    #[arg(long, requires = "tls_client_key", requires = "tls_ca")]
    pub tls_client_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_client_cert")]
    pub tls_client_key: Option<PathBuf>,
    /// Authenticate every connection with SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, as
    /// --sasl-username with --sasl-password (for the embedded shoal, add the user to its
    /// --data-dir with `shoal user add` and pass --broker-arg=--sasl-mechanisms=...).
    #[arg(long, value_parser = parse_sasl_mechanism, requires = "sasl_username", requires = "sasl_password")]
    pub sasl_mechanism: Option<String>,
    #[arg(long)]
    pub sasl_username: Option<String>,
    /// Never written to --json.
    #[arg(long)]
    #[serde(skip)]
    pub sasl_password: Option<String>,
    /// Extra `shoal serve` flag for the embedded shoal, e.g. --broker-arg=--flush-ms=0 (repeatable).
    /// Its --listen, --admin and --http-listen replace the bench's (free loopback ports), e.g.
    /// --broker-arg=--listen=127.0.0.1:19092 --broker-arg=--admin=127.0.0.1:19644.
    #[arg(long = "broker-arg", allow_hyphen_values = true, value_name = "FLAG")]
    pub broker_args: Vec<String>,
    /// Data directory of the embedded shoal (default: a new directory under the system temporary
    /// directory, removed at the end; note that it may be tmpfs, where fsync costs nothing).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Topic to use (created with --partitions if missing; later runs of a series use NAME-2,
    /// NAME-3, ...). Default: a fresh topic per run, shoal-bench-SERIES-RUN. A named topic that
    /// already holds records is refused when the consumers start at the earliest offset (--start
    /// earliest, --backlog): the run would read and count records it did not produce.
    #[arg(long)]
    pub topic: Option<String>,
    /// Keep each run's topic after it (default: the topics a run created are deleted after it; a
    /// topic that existed before is never deleted).
    #[arg(long)]
    pub keep_topic: bool,
    #[arg(long, default_value_t = 1)]
    pub partitions: i32,
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Independent consumers per partition (with --views: per shard view of each partition).
    #[arg(long, default_value_t = 8)]
    pub consumers: usize,
    /// Consumers read the N shard views `<topic>.shard-<i>-of-<N>` of the topic instead of the
    /// topic itself (shoal's sharded views); records get keys spread over the shards.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(shoal::table::MAX_VIEW_SHARDS)))]
    pub views: Option<u32>,
    /// Size of each message's value (at least 8: the first 8 bytes carry the send time).
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    pub message_bytes: u64,
    /// Target batch size: each batch holds max(1, batch-bytes / message-bytes) messages.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    pub batch_bytes: u64,
    /// Total produce rate: messages per second (e.g. 50000, 50k) or bytes per second with a unit
    /// (e.g. 100MB/s, 64MiB/s); 0 is as fast as possible. Bytes are record-batch bytes as sent,
    /// after --compression (the unit of every MB/s the report prints).
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
    /// coalescing, or view-sharing (with --views). Single runs vary: compare with --repeat 3 or
    /// more.
    #[arg(long, value_enum)]
    pub compare: Option<Compare>,
    /// Also run a plain TCP fan-out from memory to the same number of consumers (same batches, same
    /// compression; with --protocol sse|ws, a raw stream sender writing those batches as shoal's
    /// SSE events or WebSocket frames) and, when the producers are not paced (--rate 0), print the
    /// broker's delivered throughput as a fraction of it.
    #[arg(long)]
    pub raw_baseline: bool,
    /// Also measure the embedded broker's disk after each point of the series: sequential Direct
    /// I/O writes of 1 MiB in its data directory, a writer per partition (up to 16), alone and while each
    /// file is fdatasynced every --flush-ms (3 s each); print the produced MB/s as a fraction of
    /// the device's rate, and the writes' latency under those flushes beside the publish latency.
    #[arg(long)]
    pub disk_baseline: bool,
    /// Run each point of the series this many times (each --compare setting, then the raw
    /// baseline, in turn, so that a machine's drift reaches every side alike) and compare and
    /// tabulate the median of each figure, with its range: shared machines vary by 10-20% from one
    /// run to the next.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Run a series over KEY (consumers, producers or partitions), e.g. consumers=1,8,64,256.
    #[arg(long, value_parser = parse_sweep)]
    pub sweep: Option<Sweep>,
    /// Draw delivered MB/s, p99 end-to-end latency, the broker's CPU-s per delivered GB and the
    /// MB/s read from its log against the swept value into FILE.svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Client executors (threads) for producers and consumers (default: the CPUs the embedded
    /// broker leaves, 1 to 4).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Idempotent producers: each gets a producer id (InitProducerId) and numbers its batches per
    /// partition (sequences advance by the batch's records). Needs acks 1 or all.
    #[arg(long)]
    pub idempotent: bool,
    /// Transactional producers (idempotent too), transactional id shoal-bench-RUN-PRODUCER:
    /// each adds its partitions to a transaction (AddPartitionsToTxn), produces, and every
    /// --commit-interval-ms waits for its produces' acks and commits (EndTxn). Consumers with
    /// --isolation read_committed see the records once committed: their end-to-end latency
    /// includes up to the commit interval.
    #[arg(long)]
    pub transactional: bool,
    /// How long a transactional producer's transaction stays open (ms).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub commit_interval_ms: u64,
    /// Produce requests outstanding per connection.
    #[arg(long, default_value_t = 5)]
    pub max_in_flight: usize,
    /// Fetch max_wait_ms (long polling).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub fetch_max_wait: Duration,
    /// The consumers' isolation level: read_committed fetches stop at the last stable offset.
    #[arg(long, value_enum, default_value_t = Isolation::ReadUncommitted)]
    pub isolation: Isolation,
    /// Fetch max_bytes (and the partition's max_bytes).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub fetch_max_bytes: u64,
    /// After the producers stop, consumers read up to the final offsets: the drain gives up after
    /// this long without any consumer moving (or after ten times this long in all).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    #[serde(serialize_with = "secs")]
    pub drain_timeout: Duration,
    /// Receive buffer of each consumer connection (responses stream through it).
    #[arg(long, default_value = "128KiB", value_parser = parse_size)]
    pub receive_buffer: u64,
    /// How the consumers read: Kafka fetches, or shoal's HTTP streams of the same partitions
    /// (sse: Server-Sent Events, ws: WebSocket; JSON records; the embedded broker gets
    /// --http-listen, an external one needs --http).
    #[arg(long, value_enum, default_value_t = Protocol::Kafka)]
    pub protocol: Protocol,
    /// The HTTP stream address of an external broker (its --http-listen), for --protocol sse|ws.
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    /// Consumers follow a fetch response's preferred read replica (KIP-392), as librdkafka, the
    /// Java client and kafka-python 3 do: they move their partition's fetching to that broker (a
    /// shoal core) and go back to the leader when it refuses them. off: they stay with the
    /// leader, as clients without KIP-392 do (kafka-python 2, kafkajs).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub follow_replicas: OnOff,
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

// Value parsers.

use crate::units::parse_size;

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

pub fn validate(args: &FanoutArgs) -> Result<(), String> {
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
    if args.disk_baseline && args.bootstrap.is_some() {
        return Err(
            "--disk-baseline measures the embedded broker's data directory: it does not go with \
             --bootstrap"
                .into(),
        );
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
    if (args.idempotent || args.transactional) && args.acks == 0 {
        return Err(
            "--idempotent and --transactional producers need acknowledgements: --acks 1 or all"
                .into(),
        );
    }
    if args.plot.is_some() && args.sweep.is_none() {
        return Err("--plot draws a --sweep: give one, e.g. --sweep consumers=1,8,64".into());
    }
    Ok(())
}

impl FanoutArgs {
    /// `--idempotent`, `--transactional` and `--commit-interval-ms` together.
    pub fn producer_mode(&self) -> ProducerMode {
        if self.transactional {
            ProducerMode::Transactional {
                commit_interval: Duration::from_millis(self.commit_interval_ms),
            }
        } else if self.idempotent {
            ProducerMode::Idempotent
        } else {
            ProducerMode::Plain
        }
    }
}

fn parse_sasl_mechanism(s: &str) -> Result<String, String> {
    shoal::auth::SaslMechanism::parse(s).map(|m| m.name().to_string())
}

/// `shoal bench fanout ARGS`' flags, for tests.
#[cfg(test)]
pub(super) fn parse_fanout(args: &[&str]) -> FanoutArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        fanout: FanoutArgs,
    }
    let argv = std::iter::once("fanout").chain(args.iter().copied());
    <Cli as clap::Parser>::try_parse_from(argv).unwrap().fanout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> FanoutArgs {
        parse_fanout(args)
    }

    #[test]
    fn producer_modes_from_the_flags() {
        let transactional = |ms| ProducerMode::Transactional {
            commit_interval: Duration::from_millis(ms),
        };
        assert_eq!(parse(&[]).producer_mode(), ProducerMode::Plain);
        assert_eq!(
            parse(&["--idempotent"]).producer_mode(),
            ProducerMode::Idempotent
        );
        assert_eq!(
            parse(&["--idempotent", "--transactional"]).producer_mode(),
            transactional(100)
        );
        assert_eq!(
            parse(&["--transactional", "--commit-interval-ms", "250"]).producer_mode(),
            transactional(250)
        );
        // Producer ids need acknowledgements (sequences follow on from the acked ones).
        assert!(validate(&parse(&["--transactional", "--acks", "0"])).is_err());
        assert!(validate(&parse(&["--idempotent", "--acks", "0"])).is_err());
        assert!(validate(&parse(&["--idempotent", "--acks", "all"])).is_ok());
    }

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
            parse_rate("100MB/s").unwrap().messages_per_sec(1000.0),
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
