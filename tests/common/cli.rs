//! The `shoal` binary run as an operator command (`shoal topic ...`, `shoal group ...`): its exit
//! status, output and how long it took, killed after 60 s; and the librdkafka helpers the
//! operator-command tests share.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use serde_json::Value;
use std::io::Read;
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
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .env_remove("SHOAL_PASSWORD")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoal runs");
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
    produce_stamped(bootstrap, topic, counts, None);
}

/// [`produce`] with every record stamped `timestamp_ms` (CreateTime), or by the client if `None`.
pub fn produce_stamped(bootstrap: &str, topic: &str, counts: &[usize], timestamp_ms: Option<i64>) {
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for (p, n) in counts.iter().enumerate() {
        for i in 0..*n {
            let value = format!("record {i}");
            let mut record = BaseRecord::<(), _, ()>::to(topic)
                .partition(p as i32)
                .payload(&value);
            record.timestamp = timestamp_ms;
            super::send_retrying(&producer, record);
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("all delivered");
}
