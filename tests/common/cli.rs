//! The `shoal` binary run as an operator command (`shoal topic ...`, `shoal group ...`): its exit
//! status, output and how long it took, killed after 60 s, with its standard input given; and the
//! librdkafka helpers the operator-command tests share.

use rdkafka::consumer::{BaseConsumer, Consumer};
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

/// `shoal topic ARGS... -b BOOTSTRAP --format json`.
pub fn topic(bootstrap: &str, args: &[&str]) -> Run {
    let mut all = vec!["topic"];
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
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for (p, n) in counts.iter().enumerate() {
        for i in 0..*n {
            let value = format!("record {i}");
            super::send_retrying(
                &producer,
                BaseRecord::<(), _, ()>::to(topic)
                    .partition(p as i32)
                    .payload(&value),
            );
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("all delivered");
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
