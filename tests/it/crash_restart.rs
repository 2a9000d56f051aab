//! A broker killed with SIGKILL under load comes straight back on the same ports, as a supervisor
//! restarting it at once expects, and keeps everything it acknowledged: every produced record, and
//! the group's last acknowledged commit, read back exactly after each restart.
//!
//! The old process's listening sockets outlive it by a fraction of a second (the kernel closes them
//! when it tears down the dead process's io_uring rings), so the new one must wait for its ports
//! rather than fail with "Address already in use".

use crate::common;

use common::{free_port_run, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOPIC: &str = "crashy";
const RESTARTS: usize = 5;

/// Records the values whose produce was acknowledged.
#[derive(Clone, Default)]
struct Acked(Arc<Mutex<BTreeSet<u64>>>);

impl ClientContext for Acked {}

impl ProducerContext for Acked {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Ok(m) = result {
            let v = std::str::from_utf8(m.payload().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            self.0.lock().unwrap().insert(v);
        }
    }
}

fn start(data_dir: &std::path::Path, listen: &str) -> Shoal {
    // The default --bind-retry-ms (10 s) is what is under test.
    Shoal::start_on(
        data_dir,
        1,
        listen,
        &["--group-initial-rebalance-delay-ms", "0"],
    )
}

/// The group consumer's commits, shared with the test: while `hold` is set it commits nothing, so
/// `acked`, the offset of the last commit the broker acknowledged, is what a kill must keep.
#[derive(Default)]
struct Commits {
    hold: bool,
    acked: Option<i64>,
}

/// Partition 0 of the topic at `offset`, for a commit.
fn at(offset: i64) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(offset))
        .unwrap();
    tpl
}

/// The offset `crash-group` has committed on partition 0 (`None`: none), read by a client outside
/// the group; OffsetFetch is retried for 30 s while the restarted broker does not answer it.
fn committed_offset(bootstrap: &str) -> Option<i64> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "crash-group")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(TOPIC, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.committed_offsets(tpl.clone(), Duration::from_secs(5)) {
            Ok(c) => {
                return match c.find_partition(TOPIC, 0).unwrap().offset() {
                    Offset::Offset(o) => Some(o),
                    Offset::Invalid => None,
                    other => panic!("crash-group's committed offset reads {other:?}"),
                }
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "OffsetFetch not answered within 30 s: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[test]
fn kill_9_under_load_and_restart_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_run(1);
    let listen = format!("127.0.0.1:{port}");
    let bootstrap = listen.clone();
    let mut shoal = start(dir.path(), &listen);
    common::create_topics(&bootstrap, &[(TOPIC, 1)]);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Acked::default();
    let producer: ThreadedProducer<Acked> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "60000")
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "200")
        .create_with_context(acked.clone())
        .expect("producer");
    let producer = Arc::new(producer);
    let load = {
        let (producer, stop) = (producer.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let v = i.to_string();
                common::send_retrying(&producer, BaseRecord::to(TOPIC).key(&v).payload(&v));
                i += 1;
                if i % 50 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    // A committing group consumer: its fetches are in flight at each kill too; its commits are
    // held while the test kills, so that the last one acknowledged is known.
    let commits = Arc::new(Mutex::new(Commits::default()));
    let group = {
        let (bootstrap, stop, commits) = (bootstrap.clone(), stop.clone(), commits.clone());
        std::thread::spawn(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("group.id", "crash-group")
                .set("auto.offset.reset", "earliest")
                .set("enable.auto.commit", "false")
                .set("session.timeout.ms", "6000")
                .set("reconnect.backoff.max.ms", "200")
                .create()
                .expect("consumer");
            consumer.subscribe(&[TOPIC]).unwrap();
            let mut n = 0u64;
            let mut next = None;
            while !stop.load(Ordering::SeqCst) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    n += 1;
                    next = Some(m.offset() + 1);
                    if n % 100 == 0 {
                        // The lock is held through the commit: while the test holds it, no
                        // commit is in flight and `acked` is the last one the broker answered.
                        let mut c = commits.lock().unwrap();
                        if !c.hold
                            && consumer
                                .commit(&at(m.offset() + 1), CommitMode::Sync)
                                .is_ok()
                        {
                            c.acked = Some(m.offset() + 1);
                        }
                    }
                }
            }
            // One synchronous commit of where it got to, retried over a rejoin after the last
            // restart; not acknowledged within 30 s fails the test.
            let next = next.expect("the group consumer received records");
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Err(e) = consumer.commit(&at(next), CommitMode::Sync) {
                assert!(
                    Instant::now() < deadline,
                    "the final commit of {next} not acknowledged within 30 s: {e}"
                );
                consumer.poll(Duration::from_millis(100));
            }
            (n, next)
        })
    };

    let mut last_acked = None;
    for round in 0..RESTARTS {
        let before = acked.0.lock().unwrap().len();
        let deadline = Instant::now() + Duration::from_secs(30);
        // Let the load, and a new group commit, reach the new process before killing it.
        while acked.0.lock().unwrap().len() < before + 500
            || commits.lock().unwrap().acked == last_acked
        {
            assert!(
                Instant::now() < deadline,
                "round {round}: no acknowledged produce or group commit after the restart"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut held = commits.lock().unwrap();
        held.hold = true;
        last_acked = held.acked;
        drop(held);
        shoal.kill_hard();
        // At once: a supervisor would not wait either.
        shoal = start(dir.path(), &listen);
        assert_eq!(shoal.ports, vec![port], "round {round}: the same port");
        // The last commit acknowledged before the kill is what the group has committed now.
        let committed = committed_offset(&bootstrap);
        assert_eq!(
            committed, last_acked,
            "round {round}: the group's committed offset after the restart"
        );
        commits.lock().unwrap().hold = false;
    }

    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();
    producer
        .flush(Duration::from_secs(60))
        .expect("the producer drained");
    let (consumed, final_commit) = group.join().unwrap();
    assert!(consumed > 0, "the group consumer received records");
    let acked = acked.0.lock().unwrap().clone();
    assert!(acked.len() > RESTARTS * 500);

    // Everything acknowledged is in the log.
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "crash-check")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .unwrap();
    reader.assign(&tpl).unwrap();
    let mut missing = acked.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !missing.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} acknowledged records not in the log, e.g. {:?}",
            missing.len(),
            missing.iter().take(5).collect::<Vec<_>>()
        );
        if let Some(m) = reader.poll(Duration::from_millis(200)) {
            let m = m.expect("read back");
            let v: u64 = std::str::from_utf8(m.payload().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            missing.remove(&v);
        }
    }
    // The final commit, acknowledged after the last restart, is read back exactly.
    let (_, high) = reader
        .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
        .expect("ListOffsets answered");
    assert!(
        final_commit <= high,
        "crash-group committed {final_commit} of {high}"
    );
    assert_eq!(committed_offset(&bootstrap), Some(final_commit));
    // The last restart is served without errors, and no start waited in vain for its port.
    let errors: Vec<String> = shoal
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("cannot listen") || l.contains("ERROR"))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    shoal.stop();
}

/// A port held by someone else (as by a process that died a moment ago) is waited for, with one
/// warning, and served once it is free.
#[test]
fn a_port_still_in_use_at_start_up_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        drop(held);
    });
    let started = Instant::now();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.args([
        "serve",
        "--cores",
        "1",
        "--admin",
        "127.0.0.1:0",
        "--listen",
    ])
    .arg(format!("127.0.0.1:{port}"))
    .arg("--data-dir")
    .arg(dir.path())
    .env("RUST_LOG", "info");
    let shoal = Shoal::spawn(cmd, dir.path());
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(shoal.ports, vec![port]);
    release.join().unwrap();
    let log = shoal.log_lines();
    let waits = log
        .iter()
        .filter(|l| l.contains("is in use; retrying"))
        .count();
    assert_eq!(waits, 1, "one warning while waiting: {log:#?}");
    let mut s = common::wire::connect(port);
    let r: kafka_protocol::messages::ApiVersionsResponse = common::wire::call(
        &mut s,
        kafka_protocol::messages::ApiKey::ApiVersions,
        3,
        1,
        &kafka_protocol::messages::ApiVersionsRequest::default(),
    );
    assert_eq!(r.error_code, 0);
    shoal.stop();
}

/// A port that stays in use past `--bind-retry-ms` fails the start with a clear message.
#[test]
fn a_port_in_use_for_longer_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["serve", "--cores", "1", "--admin", "127.0.0.1:0"])
        .args(["--bind-retry-ms", "300", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    drop(held);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "shoal: core 0: cannot listen on port {port}: Address already in use"
        )),
        "{stderr}"
    );
}
