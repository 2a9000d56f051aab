//! Runs the real `shoal` binary for end-to-end tests: temp data directory, ports chosen by the OS,
//! stopped with SIGTERM (and checked to exit cleanly) when dropped.
#![allow(dead_code)]

pub mod browser;
pub mod cli;
pub mod debian;
pub mod edge;
pub mod node;
pub mod pki;
pub mod python;
pub mod records;
pub mod volatile_disk;
pub mod wire;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Shoal {
    child: Option<Child>,
    pub ports: Vec<u16>,
    /// Every listener: (security protocol, each core's port).
    pub listeners: Listeners,
    /// `--metrics-listen`'s address, if given.
    pub metrics: Option<String>,
    /// `--http-listen`'s address, if given.
    pub http: Option<String>,
    pub admin: String,
    pub data_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Shoal {
    /// Starts `shoal serve --cores N` on `data_dir` with extra flags, on free ports.
    pub fn start(data_dir: &Path, cores: usize, extra: &[&str]) -> Shoal {
        Self::start_on(data_dir, cores, "127.0.0.1:0", extra)
    }

    /// Same, with core 0 on `listen` (core i on its port + i).
    pub fn start_on(data_dir: &Path, cores: usize, listen: &str, extra: &[&str]) -> Shoal {
        let shoal = Self::spawn(serve_command(data_dir, cores, listen, extra), data_dir);
        assert_eq!(shoal.ports.len(), cores);
        shoal
    }

    /// Same as [`Shoal::start`], with the server's stderr (its log) handed to `on_line` line by line
    /// (from a thread of its own) instead of kept: for long runs that watch the log.
    pub fn start_watching_log(
        data_dir: &Path,
        cores: usize,
        extra: &[&str],
        on_line: impl FnMut(&str) + Send + 'static,
    ) -> Shoal {
        let cmd = serve_command(data_dir, cores, "127.0.0.1:0", extra);
        let shoal = Self::spawn_with(cmd, data_dir, Box::new(on_line));
        assert_eq!(shoal.ports.len(), cores);
        shoal
    }

    /// Runs a prepared `shoal serve` command (its flags, working directory and environment are the
    /// caller's) and waits for its ports. Its log (stderr) is passed through and kept for
    /// [`Shoal::log_lines`].
    pub fn spawn(cmd: Command, data_dir: &Path) -> Shoal {
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        let mut shoal = Self::spawn_with(
            cmd,
            data_dir,
            Box::new(move |line: &str| {
                let _ = writeln!(std::io::stderr(), "{line}");
                kept.lock().unwrap().push(line.to_string());
            }),
        );
        shoal.log = log;
        shoal
    }

    fn spawn_with(
        mut cmd: Command,
        data_dir: &Path,
        mut on_line: Box<dyn FnMut(&str) + Send>,
    ) -> Shoal {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("shoal binary starts");
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                on_line(&line);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("shoal listening:") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("shoal printed its ports within 30 s");
        let (ports, admin, listeners) = parse_listening(&line);
        let word = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_string)
        };
        let (metrics, http) = (word("metrics="), word("http="));
        Shoal {
            http,
            child: Some(child),
            ports,
            listeners,
            metrics,
            admin,
            data_dir: data_dir.to_path_buf(),
            log: Arc::default(),
        }
    }

    /// The lines the server has logged so far (not kept by [`Shoal::start_watching_log`]).
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The process id, for signals and /proc.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Kills the process with SIGKILL and reaps it, as a crash would.
    pub fn kill_hard(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.ports[0])
    }

    /// Sends SIGTERM and waits (at most 30 s) for a clean exit, which it asserts.
    pub fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let status = terminate(&mut child);
        assert!(
            status.is_some_and(|s| s.success()),
            "shoal did not exit cleanly: {status:?}"
        );
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// The sum over cores (and other labels) of a metric from `/metrics`.
    pub fn metric(&self, name: &str) -> u64 {
        self.metric_with(name, "")
    }

    /// Same, over the samples whose labels contain `label` (e.g. `api="Produce"`). Panics if no
    /// sample matches, so a renamed or missing metric cannot pass for a zero.
    pub fn metric_with(&self, name: &str, label: &str) -> u64 {
        let samples = self.samples(name, label);
        assert!(
            !samples.is_empty(),
            "no sample of {name}{{{label}}} in /metrics"
        );
        samples.iter().sum()
    }

    /// Same, 0 where no sample matches (a gauge not exported yet, a starting broker whose cores
    /// do not all answer).
    pub fn metric_or_zero(&self, name: &str, label: &str) -> u64 {
        self.samples(name, label).iter().sum()
    }

    /// The values of `name`'s samples on `/metrics` whose labels contain `label`.
    fn samples(&self, name: &str, label: &str) -> Vec<u64> {
        let (_, body) = self.admin_get("/metrics");
        body.lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(label)
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .collect()
    }

    /// GET on the admin server; returns (status line, body).
    pub fn admin_get(&self, path: &str) -> (String, String) {
        self.admin_request("GET", path, "")
    }

    /// A request to the admin server, head and body in separate writes as many clients send them;
    /// returns (status line, body).
    pub fn admin_request(&self, method: &str, path: &str, body: &str) -> (String, String) {
        self.admin_request_with(method, path, "", body)
    }

    /// [`Shoal::admin_request`] with extra header lines (each ending in `\r\n`).
    pub fn admin_request_with(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> (String, String) {
        let mut s = TcpStream::connect(&self.admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let length = body.len();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {length}\r\n\r\n"
        )
        .unwrap();
        if !body.is_empty() {
            s.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s.write_all(body.as_bytes()).unwrap();
        }
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    }
}

/// Sends `record`, waiting while the producer's queue is full.
pub fn send_retrying<C, K, P>(
    producer: &rdkafka::producer::ThreadedProducer<C>,
    mut record: rdkafka::producer::BaseRecord<'_, K, P, ()>,
) where
    C: rdkafka::producer::ProducerContext<DeliveryOpaque = ()> + 'static,
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((e, r)) => {
                let full = matches!(
                    e.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                );
                assert!(full, "produce failed: {e}");
                record = r;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Sends `value` to `topic`/`partition` through a polled producer, polling while its queue is
/// full.
pub fn send_polling(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    partition: i32,
    value: &[u8],
) {
    let mut record = rdkafka::producer::BaseRecord::<(), [u8]>::to(topic)
        .partition(partition)
        .payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, r)) => {
                record = r;
                producer.poll(Duration::from_millis(10));
            }
        }
    }
}

/// Adds a SASL user to `data_dir` with `shoal user add` (a running server picks it up).
pub fn add_user(data_dir: &Path, name: &str, password: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["user", "add", name, "--password", password, "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Creates topics with librdkafka's admin client and checks each was created.
pub fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) {
    create_topics_in_batches(bootstrap, topics, topics.len().max(1));
}

/// Same, `batch` topics per CreateTopics request, one request at a time, as an admin client
/// creates many; each request may take a minute (thousands of partitions are created in seconds).
pub fn create_topics_in_batches(bootstrap: &str, topics: &[(&str, i32)], batch: usize) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let opts = AdminOptions::new()
        .request_timeout(Some(Duration::from_secs(60)))
        .operation_timeout(Some(Duration::from_secs(60)));
    for some in topics.chunks(batch) {
        let new: Vec<NewTopic> = some
            .iter()
            .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1)))
            .collect();
        for r in futures_lite::future::block_on(admin.create_topics(&new, &opts))
            .expect("CreateTopics answered")
        {
            r.expect("topic created");
        }
    }
}

/// A key that Kafka's default partitioner puts in `shard` of `n`.
pub fn key_in_shard(shard: u32, n: u32, prefix: &str) -> String {
    (0..1_000_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| shards::partitioner::shard_of(Some(k.as_bytes()), n) == Some(shard))
        .expect("some key lands in every shard")
}

/// Held while a test of this process picks a run of free ports with [`free_port_run`] and until
/// its server has bound them (or, killed, has bound them again): a restart leaves its ports free
/// for a moment, and [`free_port_run`] checks only that a port binds.
pub fn ports_lock() -> std::sync::MutexGuard<'static, ()> {
    static PORTS: Mutex<()> = Mutex::new(());
    PORTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port P such that P..P+n are all free right now, below the kernel's ephemeral range: client
/// connections hold ports in that range for a minute after they close (TIME_WAIT), and a test that
/// made tens of thousands of them (the fuzzer) would leave no run of free ports there.
///
/// All the tests run in one process, many at once: each call takes its runs from a process-wide
/// cursor, after the previous call's run (wrapping to the start of the range), so two calls never
/// return overlapping runs, even while the first caller's server has not bound its ports yet. The
/// cursor starts at a place derived from the process id, so that processes running at once (the
/// tests and a bench) rarely collide.
pub fn free_port_run(n: u16) -> u16 {
    // The next port to try; 0 until the first call.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u32, u32::from(low.saturating_sub(n)).max(10_001));
    let n32 = u32::from(n);
    for _ in 0..1000 {
        // Claims the run p..p+n: no other call gets it (until the cursor wraps all the way round).
        let mut p = 0;
        let _ = NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
            let next = if next == 0 {
                from + std::process::id() % (to - from)
            } else {
                next
            };
            p = if next >= to { from } else { next };
            Some(p + n32)
        });
        let p = p as u16;
        if (p..p + n).all(|q| std::net::TcpListener::bind(("127.0.0.1", q)).is_ok()) {
            return p;
        }
    }
    panic!("no run of {n} free ports");
}

/// The Kafka ports and the admin address from the line `shoal listening: kafka_ports=... admin=...`.
/// `shoal serve` on `data_dir` with `cores` cores, core 0 on `listen`, admin on a free port.
fn serve_command(data_dir: &Path, cores: usize, listen: &str, extra: &[&str]) -> Command {
    shoal_command("serve", data_dir, cores, listen, extra)
}

/// `shoal <command>` (serve, edge) on `data_dir` with `cores` cores, core 0 on `listen`, admin on
/// a free port, logging at `RUST_LOG` (default warn).
pub fn shoal_command(
    command: &str,
    data_dir: &Path,
    cores: usize,
    listen: &str,
    extra: &[&str],
) -> Command {
    // A benchmark may run another build against this one (`SHOAL_BIN`).
    let bin = std::env::var_os("SHOAL_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_shoal").into());
    let mut cmd = Command::new(bin);
    cmd.args([
        command,
        "--listen",
        listen,
        "--admin",
        "127.0.0.1:0",
        "--cores",
    ])
    .arg(cores.to_string())
    .arg("--data-dir")
    .arg(data_dir)
    .args(extra)
    .env(
        "RUST_LOG",
        std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
    );
    cmd
}

/// Each listener's security protocol and its cores' ports.
type Listeners = Vec<(String, Vec<u16>)>;

fn parse_listening(line: &str) -> (Vec<u16>, String, Listeners) {
    let mut ports = Vec::new();
    let mut admin = String::new();
    let mut listeners = Vec::new();
    for word in line.split_whitespace() {
        if let Some(p) = word.strip_prefix("kafka_ports=") {
            ports = p.split(',').map(|p| p.parse().unwrap()).collect();
        } else if let Some(a) = word.strip_prefix("admin=") {
            admin = a.to_string();
        } else if let Some(l) = word.strip_prefix("listeners=") {
            for one in l.split(';') {
                let (protocol, ports) = one.split_once(':').unwrap();
                let ports = ports.split(',').map(|p| p.parse().unwrap()).collect();
                listeners.push((protocol.to_string(), ports));
            }
        }
    }
    (ports, admin, listeners)
}

fn terminate(child: &mut Child) -> Option<std::process::ExitStatus> {
    unsafe_kill(child.id(), 15);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

fn unsafe_kill(pid: u32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for Shoal {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }
}
