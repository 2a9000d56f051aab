//! The `shoal` binary run as an operator command (`shoal topic ...`, `shoal group ...`): its exit
//! status, output and how long it took, killed after 60 s, with its standard input given; and the
//! librdkafka helpers the operator-command tests share.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use serde_json::Value;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one CLI run did.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Run {
    pub fn json(&self) -> Value {
        assert!(self.ok, "the command failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// `shoal ARGS...` with `env`, killed (and the test failed) after 60 s.
pub fn shoal(args: &[&str], env: &[(&str, &str)]) -> Run {
    shoal_input(args, env, b"")
}

/// `shoal ARGS...` with `env` and `input` on its standard input, killed (and the test failed)
/// after 60 s.
pub fn shoal_input(args: &[&str], env: &[(&str, &str)], input: &[u8]) -> Run {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .env_remove("SHOAL_PASSWORD")
        .env_remove("SHOAL_NEW_PASSWORD")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoal runs");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // A thread of its own, so that a child that does not read cannot block the test; closing
    // it ends the input.
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("shoal {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Run {
        ok: status.success(),
        stdout,
        stderr,
        took,
    }
}

/// Checks that `shoal COMMAND --help` has an example (`Example: `shoal COMMAND ...`) and the
/// connection and output flags.
pub fn assert_help_has_an_example(command: &str) {
    let mut args: Vec<&str> = command.split(' ').collect();
    args.push("--help");
    let run = shoal(&args, &[]);
    assert!(run.ok, "{command}: {}", run.stderr);
    let example = format!("Example: `shoal {command}");
    assert!(run.stdout.contains(&example), "{command}: {}", run.stdout);
    for flag in ["--brokers", "--timeout", "--format", "--password-file"] {
        assert!(
            run.stdout.contains(flag),
            "{command} lacks {flag}: {}",
            run.stdout
        );
    }
}

/// A one-core `shoal serve` whose only listener is SASL_SSL (SCRAM-SHA-256, SCRAM-SHA-512 and
/// PLAIN), with ACLs on and `admin` its super user; the users `admin` (password `admin-pw`) and
/// `alice` (`alice-pw`); no topic auto-creation.
pub struct Secured {
    pub server: super::Shoal,
    pub pki: super::pki::Pki,
    pub data: tempfile::TempDir,
}

impl Secured {
    pub fn start() -> Secured {
        Self::start_with(&[("admin", "admin-pw"), ("alice", "alice-pw")], &[])
    }

    /// The same broker with only `users` (name, password) and `extra` flags.
    pub fn start_with(users: &[(&str, &str)], extra: &[&str]) -> Secured {
        let pki = super::pki::pki();
        let data = tempfile::tempdir().unwrap();
        for (name, password) in users {
            super::add_user(data.path(), name, password);
        }
        let (cert, key) = (
            pki.server.0.to_str().unwrap(),
            pki.server.1.to_str().unwrap(),
        );
        let flags = [
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-kernel",
            "off",
            "--sasl-mechanisms",
            "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
            "--auto-create-topics",
            "false",
        ];
        let server = super::Shoal::start(data.path(), 1, &[&flags[..], extra].concat());
        assert_eq!(server.listeners[0].0, "SASL_SSL");
        Secured { server, pki, data }
    }

    /// `shoal ARGS... -b BOOTSTRAP --tls-ca CA --sasl-mechanism MECHANISM --user USER --format json`
    /// with `env` (where a password may be).
    pub fn run(&self, mechanism: &str, user: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let b = self.server.bootstrap();
        let mut all = args.to_vec();
        all.extend_from_slice(&[
            "-b",
            &b,
            "--tls-ca",
            self.pki.ca_pem.to_str().unwrap(),
            "--sasl-mechanism",
            mechanism,
            "--user",
            user,
            "--format",
            "json",
        ]);
        shoal(&all, env)
    }
}

/// `shoal topic ARGS... -b BOOTSTRAP --format json`.
pub fn topic(bootstrap: &str, args: &[&str]) -> Run {
    operator("topic", bootstrap, args)
}

/// `shoal group ARGS... -b BOOTSTRAP --format json`.
pub fn group(bootstrap: &str, args: &[&str]) -> Run {
    operator("group", bootstrap, args)
}

/// `shoal COMMAND ARGS... -b BOOTSTRAP --format json`.
fn operator(command: &str, bootstrap: &str, args: &[&str]) -> Run {
    let mut all = vec![command];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-b", bootstrap, "--format", "json"]);
    shoal(&all, &[])
}

/// The partition count librdkafka sees for `topic` (`None`: it does not see the topic).
pub fn librdkafka_partitions(bootstrap: &str, topic: &str) -> Option<usize> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap();
    let m = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let t = m.topics().iter().find(|t| t.name() == topic)?;
    (t.error().is_none()).then(|| t.partitions().len())
}

/// Produces `counts[p]` records to partition `p` with librdkafka, and waits for them all.
pub fn produce(bootstrap: &str, topic: &str, counts: &[usize]) {
    produce_stamped(bootstrap, topic, counts, None);
}

/// [`produce`] with every record stamped `timestamp_ms` (CreateTime), or by the client if `None`.
pub fn produce_stamped(bootstrap: &str, topic: &str, counts: &[usize], timestamp_ms: Option<i64>) {
    let records: Vec<(i32, Option<i64>)> = counts
        .iter()
        .enumerate()
        .flat_map(|(p, n)| (0..*n).map(move |_| (p as i32, timestamp_ms)))
        .collect();
    produce_records(bootstrap, topic, &records);
}

/// Produces one record per `(partition, timestamp)` with librdkafka, in order (no timestamp: the
/// producer's clock), and waits for them all.
pub fn produce_records(bootstrap: &str, topic: &str, records: &[(i32, Option<i64>)]) {
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for (i, (p, ts)) in records.iter().enumerate() {
        let value = format!("record {i}");
        let mut record = BaseRecord::<(), _, ()>::to(topic)
            .partition(*p)
            .payload(&value);
        if let Some(ts) = ts {
            record = record.timestamp(*ts);
        }
        super::send_retrying(&producer, record);
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("all delivered");
}

/// A librdkafka consumer in `group` subscribed to `topic`: from the log start where the group has
/// no commit, committing only when told.
pub fn group_consumer(bootstrap: &str, group: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

/// Polls until `n` records came (failing the test after `within`); their (partition, offset).
pub fn consume(consumer: &BaseConsumer, n: usize, within: Duration) -> Vec<(i32, i64)> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} records within {within:?}: {got:?}",
            got.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("no consumer error");
            got.push((m.partition(), m.offset()));
        }
    }
    got
}

/// COUNT records of `topic`, every partition from the beginning, as librdkafka (confluent-kafka's,
/// with SSL, SCRAM and zstd) reads them with the extra settings `config`:
/// `tests/python/librdkafka_read.py`'s answer, `{"ok": true, "records": [...]}` or
/// `{"ok": false, "error": NAME}`.
pub fn librdkafka_read(bootstrap: &str, topic: &str, count: usize, config: &Value) -> Value {
    let out = super::python::run_script(
        "librdkafka_read.py",
        &[bootstrap, topic, &count.to_string(), &config.to_string()],
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}
