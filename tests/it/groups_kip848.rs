//! Consumer groups of the consumer group protocol (KIP-848, `group.protocol=consumer`) with real
//! clients: confluent-kafka's members join, leave and die while the group reads a topic, and every
//! record is read exactly once; the group is listed and described as a consumer group.

use crate::common;

use common::python::run_script;
use common::Shoal;

/// Quick sessions, so that a member that dies is noticed within the test.
const FLAGS: &[&str] = &[
    "--group-consumer-session-timeout-ms",
    "6000",
    "--group-consumer-heartbeat-interval-ms",
    "500",
];

/// Four members over 12 partitions, then a fifth joins, one leaves and one dies (no leave: its
/// session times out): each record is read exactly once, since members commit each record before
/// reporting it and a partition moves only after its owner released it.
#[test]
fn confluent_kafka_members_join_leave_and_die_and_every_record_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("kip848", 12)]);
    let records = 3000;
    let stdout = run_script(
        "kip848_group.py",
        &[&bootstrap, "kip848", &records.to_string(), "g848"],
    );
    let line = stdout.lines().last().unwrap_or_default();
    let summary: serde_json::Value = serde_json::from_str(line).expect(&stdout);
    let n = |k: &str| summary[k].as_u64().unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(n("missing"), 0, "{line}");
    assert_eq!(n("distinct"), records, "{line}");
    assert_eq!(n("records"), records, "no record read twice: {line}");
    let by_worker = summary["by_worker"].as_object().expect("by worker");
    assert!(by_worker.len() >= 4, "the members shared the work: {line}");
    assert!(
        shoal.metric("shoal_group_rebalances_total") >= 4,
        "the group epoch moved as members came and went"
    );
    // Lag covers the group: once computed after the last commits, nothing is left to read.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, body) = shoal.admin_get("/metrics");
        let lag = body
            .lines()
            .find(|l| l.starts_with("shoal_group_lag_sum{group=\"g848\"}"))
            .map(|l| l.rsplit(' ').next().unwrap().to_string());
        if lag.as_deref() == Some("0") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "g848's lag is {lag:?}, not 0"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    // The members are gone; the group stays, of the consumer protocol, for its offsets.
    assert_eq!(
        shoal.metric_with("shoal_consumer_protocol_groups", "state=\"Empty\""),
        1
    );
    shoal.stop();
}

/// What the consumer protocol offers besides sharing partitions, through confluent-kafka: a
/// regular expression picks up a topic created later; a static member that leaves and comes back
/// (a new member with the same instance id) gets its partitions again without a new assignment; a
/// classic group and a consumer group read one topic side by side and are listed with their
/// types; a classic group without members is taken over by the consumer protocol and resumes
/// from its committed offset.
#[test]
fn confluent_kafka_regex_static_members_side_by_side_and_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let stdout = run_script("kip848_features.py", &[&shoal.bootstrap()]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"regex": [4, ["rx-b"]]}"#,
            r#"{"static": [true, 2]}"#,
            r#"{"side_by_side": [30, 30], "types": {"g-classic": "CLASSIC", "g-modern": "CONSUMER"}}"#,
            r#"{"converted": [6, 7, 8, 9]}"#,
        ],
        "{stdout}"
    );
    shoal.stop();
}

/// A member of a consumer-protocol group (librdkafka through `rdkafka`) reads half a topic,
/// committing as it goes (`shoal group describe` shows its epochs and assignment); the broker
/// stops cleanly and restarts on the same ports; the member carries on at the same epoch (the
/// stop saved the group) and reads exactly the other half.
#[test]
fn a_consumer_protocol_member_resumes_from_its_commits_after_a_broker_restart() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::Message;
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let shoal = Shoal::start_on(dir.path(), 2, &listen, FLAGS);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("resume", 4)]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for i in 0..200 {
        let v = i.to_string();
        producer
            .send(
                BaseRecord::<(), _>::to("resume")
                    .partition(i % 4)
                    .payload(&v),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "resumer")
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["resume"]).unwrap();
    // A second member joins and leaves: the group epoch moves past what a group formed anew by
    // this member would have.
    let passing: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "resumer")
        .set("group.protocol", "consumer")
        .create()
        .unwrap();
    passing.subscribe(&["resume"]).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    drop(passing);
    std::thread::sleep(Duration::from_secs(1));
    let mut read = Vec::new();
    let poll_until = |n: usize, read: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while read.len() < n && Instant::now() < deadline {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            // Committed before it counts as read, so a restart cannot lose or repeat it.
            if consumer.commit_message(&m, CommitMode::Sync).is_ok() {
                read.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            }
        }
    };
    poll_until(100, &mut read);
    assert_eq!(read.len(), 100);
    // `shoal group describe` shows the group's epochs and the member's assignment.
    let described = common::cli::group(&bootstrap, &["describe", "resumer"]).json();
    let epochs = &described["epochs"];
    assert_eq!(described["protocol_type"], "consumer", "{described}");
    assert!(epochs["group_epoch"].as_i64() >= Some(4), "{described}");
    assert_eq!(
        epochs["members"][0]["member_epoch"],
        epochs["assignment_epoch"]
    );
    assert_eq!(
        epochs["members"][0]["assignment"]["resume"],
        serde_json::json!([0, 1, 2, 3]),
        "{described}"
    );
    shoal.stop();
    let shoal = Shoal::start_on(dir.path(), 2, &listen, FLAGS);
    poll_until(200, &mut read);
    // The clean stop saved the group: the member carried on at its epoch, with no new assignment.
    let after = common::cli::group(&bootstrap, &["describe", "resumer"]).json();
    assert_eq!(
        after["epochs"]["group_epoch"], epochs["group_epoch"],
        "{after}"
    );
    assert_eq!(
        after["epochs"]["members"][0]["member_id"],
        epochs["members"][0]["member_id"]
    );
    let distinct: BTreeSet<&String> = read.iter().collect();
    assert_eq!(
        (read.len(), distinct.len()),
        (200, 200),
        "every record once, across the restart"
    );
    drop(consumer);
    shoal.stop();
}

/// The figure for the consumer group protocol: 63 members of a group share 64 partitions that a
/// producer writes to every 100 ms; a 64th joins. Over the 20 s after it joins: when the new member
/// reads its first record, and how long records wait between their send and their read, per
/// partition, with the classic protocol (librdkafka's default eager assignors:
/// every member gives up every partition) and with the consumer protocol (only the partitions
/// that move wait), same broker, same load, same run. Prints both, with fast heartbeats and with
/// each protocol's default. About two minutes: `cargo test --test it kip848_figure -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a figure, about two minutes"]
fn kip848_figure_a_member_joining_a_64_member_group() {
    // Heartbeats every 500 ms (both protocols), then each protocol's default (librdkafka's
    // heartbeat.interval.ms of 3 s for the classic one, the broker's 5 s for the consumer one).
    for (name, heartbeat_ms) in [
        ("500 ms heartbeats", Some(500)),
        ("default heartbeats", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut flags = vec!["--group-initial-rebalance-delay-ms", "0"];
        if heartbeat_ms.is_some() {
            flags.extend(["--group-consumer-heartbeat-interval-ms", "500"]);
        }
        let shoal = Shoal::start(dir.path(), 2, &flags);
        let bootstrap = shoal.bootstrap();
        common::create_topics(&bootstrap, &[("figure", 64)]);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producing = figure::produce(&bootstrap, "figure", 64, stop.clone());
        for protocol in ["classic", "consumer"] {
            let f = figure::join_64th(&bootstrap, "figure", protocol, heartbeat_ms);
            println!(
                "{name}, group.protocol={protocol}: the 64th member read its first record \
                 {:.2} s after it joined; {} of 64 partitions had records held up over 250 ms, \
                 the longest wait {:.2} s, {:.1} s summed over those partitions",
                f.first_read.as_secs_f64(),
                f.paused,
                f.longest.as_secs_f64(),
                f.paused_total.as_secs_f64()
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        producing.join().unwrap();
        shoal.stop();
    }
}

mod figure {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::Message;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    /// A record to every partition every 100 ms.
    pub fn produce(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let topic = topic.to_string();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let v = now_ms().to_string();
                for p in 0..partitions {
                    let _ = producer.send(BaseRecord::<(), _>::to(&topic).partition(p).payload(&v));
                }
                producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(100));
            }
            producer.flush(Duration::from_secs(5)).unwrap();
        })
    }

    /// What a member reports of each record: (member, partition, sent ms, read ms).
    type Read = (usize, i32, u64, u64);

    /// A record read later than this after it was sent was held up by the rebalance (the
    /// producer sends every 100 ms; members poll every 50 ms).
    const SLOW_MS: u64 = 250;

    /// What a member joining did to the group: when it read its first record, how many
    /// partitions had a record held up (read more than [`SLOW_MS`] after it was sent), the
    /// longest wait of any record, and the sum over the held-up partitions of their longest.
    pub struct Figure {
        pub first_read: Duration,
        pub paused: usize,
        pub longest: Duration,
        pub paused_total: Duration,
    }

    /// Starts member `me` polling in a thread of its own, reporting each record it reads.
    fn member(
        me: usize,
        (bootstrap, topic, group, protocol): (&str, &str, &str, &str),
        heartbeat_ms: Option<u64>,
        tx: mpsc::Sender<Read>,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("group.protocol", protocol)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "true");
        if let (Some(ms), "classic") = (heartbeat_ms, protocol) {
            config
                .set("heartbeat.interval.ms", ms.to_string())
                .set("session.timeout.ms", "6000");
        }
        let consumer: BaseConsumer = config.create().unwrap();
        consumer.subscribe(&[topic]).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
                    let sent = std::str::from_utf8(m.payload().unwrap_or_default())
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let _ = tx.send((me, m.partition(), sent, now_ms()));
                }
            }
            drop(consumer);
        })
    }

    /// 63 members of a new group of `protocol` settle on the 64 partitions, a 64th joins; what
    /// the 20 s after that show.
    pub fn join_64th(
        bootstrap: &str,
        topic: &str,
        protocol: &str,
        heartbeat_ms: Option<u64>,
    ) -> Figure {
        let group = format!("figure-{protocol}");
        let at = (bootstrap, topic, group.as_str(), protocol);
        let (tx, rx) = mpsc::channel::<Read>();
        let stop = Arc::new(AtomicBool::new(false));
        let mut members: Vec<_> = (0..63)
            .map(|i| member(i, at, heartbeat_ms, tx.clone(), stop.clone()))
            .collect();
        // Settled: every partition read within the last 300 ms, for 5 s in a row.
        let mut last = [0u64; 64];
        let mut steady_since = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        while steady_since.is_none_or(|s: Instant| s.elapsed() < Duration::from_secs(5)) {
            assert!(Instant::now() < deadline, "the 63 members never settled");
            while let Ok((_, p, _, read)) = rx.try_recv() {
                last[p as usize] = read;
            }
            let now = now_ms();
            let steady = last.iter().all(|&t| now.saturating_sub(t) <= 300);
            steady_since = match (steady, steady_since) {
                (true, None) => Some(Instant::now()),
                (true, s) => s,
                (false, _) => None,
            };
            std::thread::sleep(Duration::from_millis(50));
        }
        let joined = now_ms();
        members.push(member(63, at, heartbeat_ms, tx, stop.clone()));
        // Each partition's longest wait from a record's send to its read, over records sent
        // after the join (and records read again after a rebalance, sent before it).
        let (mut first_read, mut waits) = (None, vec![0u64; 64]);
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            let Ok((who, p, sent, read)) = rx.recv_timeout(Duration::from_millis(100)) else {
                continue;
            };
            if who == 63 && first_read.is_none() {
                first_read = Some(read - joined);
            }
            let wait = &mut waits[p as usize];
            *wait = (*wait).max(read.saturating_sub(sent));
        }
        stop.store(true, Ordering::Relaxed);
        for m in members {
            m.join().unwrap();
        }
        let slow: Vec<u64> = waits.iter().copied().filter(|&w| w > SLOW_MS).collect();
        Figure {
            first_read: Duration::from_millis(first_read.unwrap_or(20_000)),
            paused: slow.len(),
            longest: Duration::from_millis(waits.iter().copied().max().unwrap_or(0)),
            paused_total: Duration::from_millis(slow.iter().sum()),
        }
    }
}

/// A clean stop saves consumer-protocol groups, and a start with another `--cores` moves them to
/// their new coordinators: the member carries on at the same group epoch, which the console shows.
#[test]
fn a_consumer_protocol_group_survives_a_cores_change() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port_run(3);
    let listen = format!("127.0.0.1:{port}");
    let shoal = Shoal::start_on(dir.path(), 2, &listen, FLAGS);
    let bootstrap = shoal.bootstrap();
    common::create_topics(&bootstrap, &[("moving", 3)]);
    let member = |group: &str| -> BaseConsumer {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", group)
            .set("group.protocol", "consumer")
            .create()
            .unwrap();
        c.subscribe(&["moving"]).unwrap();
        c
    };
    // Epochs past what a group formed anew would have: a second member came and went.
    let consumer = member("mover");
    let passing = member("mover");
    std::thread::sleep(Duration::from_secs(2));
    drop(passing);
    let describe = || common::cli::group(&bootstrap, &["describe", "mover"]).json();
    let settled = |want_epoch: Option<i64>| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            consumer.poll(Duration::from_millis(100));
            let d = describe();
            let e = &d["epochs"];
            let stable =
                d["state"] == "Stable" && e["members"].as_array().is_some_and(|m| m.len() == 1);
            if stable && want_epoch.is_none_or(|w| e["group_epoch"].as_i64() == Some(w)) {
                return d;
            }
            assert!(Instant::now() < deadline, "never settled: {d}");
        }
    };
    let before = settled(None);
    let epoch = before["epochs"]["group_epoch"].as_i64().unwrap();
    assert!(epoch >= 4, "{before}");
    shoal.stop();
    let shoal = Shoal::start_on(dir.path(), 3, &listen, FLAGS);
    let after = settled(Some(epoch));
    assert_eq!(
        after["epochs"]["members"][0]["member_id"],
        before["epochs"]["members"][0]["member_id"]
    );
    // The console shows the group with its protocol and epoch.
    let (_, body) = shoal.admin_get("/v1/console");
    let console: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = console["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["group"] == "mover"))
        .cloned()
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(
        (row["protocol"].as_str(), row["epoch"].as_i64()),
        (Some("consumer"), Some(epoch))
    );
    drop(consumer);
    shoal.stop();
}
