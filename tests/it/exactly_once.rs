//! An exactly-once pipeline through crashes: a consume-transform-produce loop (confluent-kafka,
//! `tests/python/eos_pipeline.py`) reads an input topic read_committed, writes each record to an
//! output topic and commits its input offsets in the same transaction. The broker is killed with
//! `kill -9` three times and the pipeline twice, mid-transaction; at the end a read_committed
//! consumer of the output sees every input record exactly once (a read_uncommitted one may see
//! the aborted duplicates).

use crate::common;

use common::python::python_deps;
use common::{create_topics, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: usize = 3000;
const PARTITIONS: i32 = 4;

fn start_broker(dir: &std::path::Path, listen: &str) -> Shoal {
    Shoal::start_on(
        dir,
        2,
        listen,
        &["--transaction-timeout-check-interval-ms", "200"],
    )
}

fn start_pipeline(bootstrap: &str) -> Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/eos_pipeline.py");
    Command::new("python3")
        .env("PYTHONPATH", python_deps())
        .args([script, bootstrap, "in", "out", &PARTITIONS.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 runs")
}

/// Every value of `out` a consumer at `isolation` reads, with how often, until `want` values or
/// the deadline (then 1 s more: anything more would be a duplicate).
fn read_out(
    bootstrap: &str,
    isolation: &str,
    want: usize,
    within: Duration,
) -> BTreeMap<String, usize> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("check-{isolation}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("fetch.wait.max.ms", "50")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset("out", p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut n = 0;
    let deadline = Instant::now() + within;
    let mut quiet_until = None;
    while Instant::now() < deadline && quiet_until.is_none_or(|q| Instant::now() < q) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            *seen.entry(v).or_default() += 1;
            n += 1;
        }
        if n >= want && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + Duration::from_secs(1));
        }
    }
    seen
}

fn committed_count(bootstrap: &str) -> usize {
    read_out(
        bootstrap,
        "read_committed",
        usize::MAX,
        Duration::from_secs(3),
    )
    .values()
    .sum()
}

#[test]
fn an_exactly_once_pipeline_survives_broker_and_pipeline_kills() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let mut broker = start_broker(dir.path(), &listen);
    create_topics(&listen, &[("in", PARTITIONS), ("out", PARTITIONS)]);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &listen)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for i in 0..RECORDS {
        let key = format!("k{i}");
        let value = format!("v-{i:05}");
        common::send_retrying(&producer, BaseRecord::to("in").key(&key).payload(&value));
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    drop(producer);
    let mut pipeline = start_pipeline(&listen);
    // Kills at rising progress of the output: broker, pipeline, broker, pipeline, broker.
    let schedule = ["broker", "pipeline", "broker", "pipeline", "broker"];
    let deadline = Instant::now() + Duration::from_secs(240);
    for (i, what) in schedule.iter().enumerate() {
        // Let the pipeline make some progress (its transactions commit every 50 records or
        // 0.5 s), then kill in the middle of whatever it is doing.
        let target = (i + 1) * RECORDS / (schedule.len() + 2);
        while committed_count(&listen) < target {
            assert!(
                Instant::now() < deadline,
                "no progress before kill {i} ({what})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_millis(137));
        match *what {
            "broker" => {
                broker.kill_hard();
                broker = start_broker(dir.path(), &listen);
            }
            _ => {
                let _ = pipeline.kill();
                let _ = pipeline.wait();
                pipeline = start_pipeline(&listen);
            }
        }
    }
    // The pipeline catches up.
    let seen = loop {
        let seen = read_out(&listen, "read_committed", RECORDS, Duration::from_secs(10));
        if seen.len() >= RECORDS || Instant::now() >= deadline {
            break seen;
        }
        if let Ok(Some(status)) = pipeline.try_wait() {
            panic!("the pipeline exited: {status}");
        }
    };
    let _ = pipeline.kill();
    let _ = pipeline.wait();
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicates.is_empty(), "read twice: {duplicates:?}");
    let missing: Vec<String> = (0..RECORDS)
        .map(|i| format!("out-v-{i:05}"))
        .filter(|v| !seen.contains_key(v))
        .collect();
    assert!(
        missing.is_empty(),
        "{} missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(seen.len(), RECORDS);
    // read_uncommitted sees at least every record, and the aborted duplicates on top.
    let all: usize = read_out(
        &listen,
        "read_uncommitted",
        RECORDS,
        Duration::from_secs(10),
    )
    .values()
    .sum();
    assert!(all >= RECORDS, "{all}");
    eprintln!(
        "exactly once: {RECORDS} records committed once each; read_uncommitted saw {all} \
         ({} from aborted transactions)",
        all - RECORDS
    );
    assert_eq!(broker.metric("shoal_log_last_stable_offset_lag"), 0);
    broker.stop();
}
