//! Transactions ended across a `kill -9`: right after the restart, while one core is still opening
//! its partitions, and at random moments under load. Every record ends as its transaction did.

use crate::common::Shoal;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// A transactional producer (the module's own) that reconnects at once after the broker comes
/// back.
fn producer(bootstrap: &str, id: &str) -> BaseProducer {
    super::transactional_producer(
        bootstrap,
        id,
        &[
            ("linger.ms", "2"),
            ("reconnect.backoff.ms", "10"),
            ("reconnect.backoff.max.ms", "100"),
            ("retry.backoff.ms", "20"),
            ("retry.backoff.max.ms", "100"),
        ],
    )
}

/// Sends each (partition, value) of `topic` and waits for every acknowledgement.
fn send(p: &BaseProducer, topic: &str, records: &[(i32, String)]) -> Result<(), KafkaError> {
    for (partition, value) in records {
        let mut record = BaseRecord::<(), str>::to(topic)
            .partition(*partition)
            .payload(value.as_str());
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    p.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
    p.flush(WAIT)
}

/// `n` transactional ids that core `core` of `cores` coordinates.
fn ids_on(core: usize, cores: usize, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|id| shoal::transactions::coordinator_core(id, cores) == core)
        .take(n)
        .collect()
}

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

/// The leader (core) of every partition of every topic.
fn leaders(bootstrap: &str) -> BTreeMap<(String, i32), i32> {
    let c = consumer(bootstrap, "read_uncommitted");
    let md = c.fetch_metadata(None, WAIT).expect("metadata");
    md.topics()
        .iter()
        .flat_map(|t| {
            t.partitions()
                .iter()
                .map(|p| ((t.name().to_string(), p.id()), p.leader()))
        })
        .collect()
}

/// `2 * n` one-partition topics, of which those on `fast` are deleted again: the other core is
/// left with `n` more partitions to open at every start than `fast`.
fn load_one_core(bootstrap: &str, fast: i32, n: usize) {
    let names: Vec<String> = (0..2 * n).map(|i| format!("bulk-{i}")).collect();
    let topics: Vec<(&str, i32)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    crate::common::create_topics(bootstrap, &topics);
    let doomed: Vec<String> = leaders(bootstrap)
        .into_iter()
        .filter(|((t, _), leader)| t.starts_with("bulk-") && *leader == fast)
        .map(|((t, _), _)| t)
        .collect();
    assert_eq!(doomed.len(), n);
    let doomed: Vec<&str> = doomed.iter().map(String::as_str).collect();
    let opts = AdminOptions::new().operation_timeout(Some(WAIT));
    for r in futures_lite::future::block_on(admin(bootstrap).delete_topics(&doomed, &opts))
        .expect("DeleteTopics answered")
    {
        r.expect("topic deleted");
    }
}

fn consumer(bootstrap: &str, isolation: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("restart-{isolation}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("fetch.wait.max.ms", "50")
        .set("reconnect.backoff.max.ms", "100")
        .create()
        .expect("consumer")
}

/// Waits until every partition's last stable offset is its high watermark (no transaction open,
/// every marker written), then returns the ends.
fn settled(bootstrap: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let committed = consumer(bootstrap, "read_committed");
    let uncommitted = consumer(bootstrap, "read_uncommitted");
    let deadline = Instant::now() + WAIT;
    loop {
        let ends: Vec<(i64, i64)> = (0..partitions)
            .map(|p| {
                let lso = committed.fetch_watermarks(topic, p, WAIT).expect("LSO").1;
                let hw = uncommitted.fetch_watermarks(topic, p, WAIT).expect("HW").1;
                (lso, hw)
            })
            .collect();
        if ends.iter().all(|(lso, hw)| lso == hw) {
            return ends.into_iter().map(|e| e.1).collect();
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: transactions still open (last stable offset, high watermark): {ends:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every record of `topic` up to `ends` as a consumer at `isolation` reads it:
/// (partition, offset, value).
fn read_all(
    bootstrap: &str,
    topic: &str,
    ends: &[i64],
    isolation: &str,
) -> Vec<(i32, i64, String)> {
    let c = consumer(bootstrap, isolation);
    let mut tpl = TopicPartitionList::new();
    for p in 0..ends.len() as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    let done = |c: &BaseConsumer| {
        let positions = c.position().unwrap();
        (0..ends.len()).all(|p| {
            positions
                .find_partition(topic, p as i32)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o >= ends[p]),
                    _ => None,
                })
                .unwrap_or(ends[p] == 0)
        })
    };
    while !done(&c) {
        assert!(
            Instant::now() < deadline,
            "{topic}: not read to {ends:?} in time"
        );
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.expect("fetch succeeds");
            let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            out.push((m.partition(), m.offset(), value));
        }
    }
    out
}

/// Starts a broker of `cores` cores on a run of free ports: it and core 0's address.
pub fn start(dir: &Path, cores: usize, args: &[&str]) -> (Shoal, String) {
    let _picking = crate::common::ports_lock();
    let listen = format!("127.0.0.1:{}", crate::common::free_port_run(cores as u16));
    (Shoal::start_on(dir, cores, &listen, args), listen)
}

/// Kills the broker and starts it again on the same ports.
pub fn restart(shoal: Shoal, dir: &Path, listen: &str, args: &[&str]) -> Shoal {
    let _ports_free_meanwhile = crate::common::ports_lock();
    let cores = shoal.ports.len();
    shoal.kill_hard();
    Shoal::start_on(dir, cores, listen, args)
}

/// What [`end_after_restarts`] wrote: the values of the committed and of the aborted
/// transactions.
#[derive(Default)]
struct Ended {
    committed: BTreeSet<String>,
    aborted: BTreeSet<String>,
}

/// `rounds` rounds of: each producer writes a transaction of 20 records over partitions
/// `0..spread` of `topic`; the broker is killed with `kill -9` and started again; the moment it
/// is back, the even producers commit and the odd ones abort, all at once.
fn end_after_restarts(
    mut shoal: Shoal,
    (dir, listen, args): (&Path, &str, &[&str]),
    producers: &[BaseProducer],
    (topic, spread): (&str, i32),
    rounds: usize,
    ended: &mut Ended,
) -> Shoal {
    for round in 0..rounds {
        for (i, p) in producers.iter().enumerate() {
            p.begin_transaction().unwrap();
            let records: Vec<(i32, String)> = (0..20)
                .map(|k| (k % spread, format!("r{round}-p{i}-{k}")))
                .collect();
            send(p, topic, &records).expect("records acknowledged");
            let values = records.into_iter().map(|r| r.1);
            if i % 2 == 0 {
                ended.committed.extend(values);
            } else {
                ended.aborted.extend(values);
            }
        }
        shoal = restart(shoal, dir, listen, args);
        std::thread::scope(|s| {
            for (i, p) in producers.iter().enumerate() {
                s.spawn(move || match i % 2 {
                    0 => p.commit_transaction(WAIT).expect("commit"),
                    _ => p.abort_transaction(WAIT).expect("abort"),
                });
            }
        });
    }
    shoal
}

/// Once no transaction is open on partitions `0..spread` of `topic`: every committed record is
/// read once by read_committed consumers, no aborted one is, and read_uncommitted ones read all.
fn check_ended(listen: &str, (topic, spread): (&str, i32), ended: &Ended) {
    let ends = settled(listen, topic, spread);
    let read: Vec<String> = read_all(listen, topic, &ends, "read_committed")
        .into_iter()
        .map(|r| r.2)
        .collect();
    let read_set: BTreeSet<String> = read.iter().cloned().collect();
    assert_eq!(read.len(), read_set.len(), "a committed record read twice");
    let leaked: Vec<&String> = read_set.intersection(&ended.aborted).collect();
    assert!(
        leaked.is_empty(),
        "aborted records read_committed: {leaked:?}"
    );
    let lost: Vec<&String> = ended.committed.difference(&read_set).collect();
    assert!(lost.is_empty(), "committed records lost: {lost:?}");
    let all: BTreeSet<String> = read_all(listen, topic, &ends, "read_uncommitted")
        .into_iter()
        .map(|r| r.2)
        .collect();
    assert_eq!(
        all.len(),
        ended.committed.len() + ended.aborted.len(),
        "records lost"
    );
}

/// Transactions over a partition of each core, coordinated by the core with few partitions,
/// ended (two committed, two aborted) the moment the broker is back after a `kill -9` while the
/// other core still opens its 100 more partitions: ten rounds, so twenty of each end.
fn ended_right_after_a_restart(slow: i32) {
    let fast = 1 - slow;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--transaction-timeout-check-interval-ms", "100"];
    let (shoal, listen) = start(dir.path(), 2, &args);
    crate::common::create_topics(&listen, &[("t", 2)]);
    load_one_core(&listen, fast, 100);
    let ids = ids_on(fast as usize, 2, &format!("restart-{slow}"), 4);
    let producers: Vec<BaseProducer> = ids.iter().map(|id| producer(&listen, id)).collect();
    let mut ended = Ended::default();
    let shoal = end_after_restarts(
        shoal,
        (dir.path(), &listen, &args),
        &producers,
        ("t", 2),
        10,
        &mut ended,
    );
    check_ended(&listen, ("t", 2), &ended);
    drop(producers);
    shoal.stop();
}

/// 1,000 partitions more on core 0: transactions coordinated by both cores over a partition of
/// each, ended the moment the broker is back from a `kill -9` while core 0 opens its partitions.
/// No marker is lost.
#[test]
fn transactions_ended_while_a_core_opens_1000_partitions_lose_no_marker() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--transaction-timeout-check-interval-ms", "100"];
    let (shoal, listen) = start(dir.path(), 2, &args);
    crate::common::create_topics(&listen, &[("wide", 2)]);
    load_one_core(&listen, 1, 1000);
    let mut ids = ids_on(0, 2, "wide", 2);
    ids.extend(ids_on(1, 2, "wide", 2));
    let producers: Vec<BaseProducer> = ids.iter().map(|id| producer(&listen, id)).collect();
    let mut ended = Ended::default();
    let shoal = end_after_restarts(
        shoal,
        (dir.path(), &listen, &args),
        &producers,
        ("wide", 2),
        3,
        &mut ended,
    );
    check_ended(&listen, ("wide", 2), &ended);
    drop(producers);
    shoal.stop();
}

#[test]
fn transactions_ended_right_after_a_restart_keep_their_markers_when_core_0_opens_last() {
    ended_right_after_a_restart(0);
}

#[test]
fn transactions_ended_right_after_a_restart_keep_their_markers_when_core_1_opens_last() {
    ended_right_after_a_restart(1);
}

/// Sets its flag when dropped.
struct Raise<'a>(&'a AtomicBool);

impl Drop for Raise<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// How a transaction of the history ended, as its producer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted,
    /// The producer failed (fatal error, broker gone at the end): either, but all or nothing.
    Unknown,
}

/// One producer's transactions: each one's values and how it ended.
type History = Vec<(Vec<String>, Outcome)>;

/// The end of a transaction whose records were all acknowledged; `None` when the producer must
/// be made again (its outcome unknown).
fn end(p: &BaseProducer, commit: bool) -> Option<Outcome> {
    let deadline = Instant::now() + WAIT;
    loop {
        let ended = if commit {
            p.commit_transaction(WAIT)
        } else {
            p.abort_transaction(WAIT)
        };
        match ended {
            Ok(()) if commit => return Some(Outcome::Committed),
            Ok(()) => return Some(Outcome::Aborted),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(KafkaError::Transaction(e)) if e.txn_requires_abort() => {
                return p.abort_transaction(WAIT).ok().map(|()| Outcome::Aborted)
            }
            Err(_) => return None,
        }
    }
}

/// Producer `i`: transactions of 1-6 records over the topic's partitions, committed or aborted at
/// random, a third of them ended only once the broker is back from its next kill; until `stop`.
fn run_producer(
    bootstrap: &str,
    id: &str,
    i: usize,
    restarts: &Arc<Mutex<u64>>,
    stop: &AtomicBool,
) -> History {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let mut p = producer(bootstrap, id);
    let mut history = History::new();
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if p.begin_transaction().is_err() {
            p = producer(bootstrap, id);
            continue;
        }
        let records: Vec<(i32, String)> = (0..rng.gen_range(1..=6))
            .map(|k| (rng.gen_range(0..4), format!("p{i}-t{n:05}-{k}")))
            .collect();
        let values: Vec<String> = records.iter().map(|r| r.1.clone()).collect();
        let mut commit = rng.gen_bool(0.5);
        if send(&p, "h", &records).is_err() {
            commit = false;
        } else if rng.gen_range(0..3) == 0 {
            let seen = *restarts.lock().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while *restarts.lock().unwrap() == seen && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        match end(&p, commit) {
            Some(outcome) => history.push((values, outcome)),
            None => {
                history.push((values, Outcome::Unknown));
                p = producer(bootstrap, id);
            }
        }
    }
    drop(p);
    history
}

/// A read_committed consumer of every partition from the start until `stop`: what it read.
fn run_reader(bootstrap: &str, stop: &AtomicBool) -> Vec<(i32, i64, String)> {
    let c = consumer(bootstrap, "read_committed");
    let mut tpl = TopicPartitionList::new();
    for p in 0..4 {
        tpl.add_partition_offset("h", p, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut read = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
            let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            read.push((m.partition(), m.offset(), value));
        }
    }
    read
}

/// One run of the history: four transactional producers (two coordinated by each core) over four
/// partitions (two on each core, one of which has 100 partitions more) and a read_committed reader, while the broker is killed with
/// `kill -9` and started again three times; then every check over what was read.
fn history_run(run: usize) {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--transaction-timeout-check-interval-ms", "100"];
    let (shoal, listen) = start(dir.path(), 2, &args);
    let mut shoal = Some(shoal);
    crate::common::create_topics(&listen, &[("h", 4)]);
    // One core (each run the other) opens 100 more partitions at every start.
    load_one_core(&listen, (run % 2) as i32, 100);
    let mut ids = ids_on(0, 2, &format!("history-{run}"), 2);
    ids.extend(ids_on(1, 2, &format!("history-{run}"), 2));
    let restarts = Arc::new(Mutex::new(0u64));
    let (stop_producers, stop_reader) = (AtomicBool::new(false), AtomicBool::new(false));
    let (histories, live) = std::thread::scope(|s| {
        // Whatever fails below, the threads stop (the scope waits for them).
        let _stop = (Raise(&stop_producers), Raise(&stop_reader));
        let producers: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let (listen, restarts, stop) = (&listen, &restarts, &stop_producers);
                s.spawn(move || run_producer(listen, id, i, restarts, stop))
            })
            .collect();
        let reader = s.spawn(|| run_reader(&listen, &stop_reader));
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1500));
            shoal = Some(restart(shoal.take().unwrap(), dir.path(), &listen, &args));
            *restarts.lock().unwrap() += 1;
        }
        std::thread::sleep(Duration::from_millis(1000));
        stop_producers.store(true, Ordering::SeqCst);
        let histories: Vec<History> = producers.into_iter().map(|p| p.join().unwrap()).collect();
        settled(&listen, "h", 4);
        stop_reader.store(true, Ordering::SeqCst);
        (histories, reader.join().unwrap())
    });
    let ends = settled(&listen, "h", 4);
    let last = read_all(&listen, "h", &ends, "read_committed");
    check_history(run, &histories, &live, &last);
    shoal.unwrap().stop();
}

/// The checks of one run: no aborted record read, every committed one read exactly once, a
/// transaction of unknown outcome all or nothing, what the live reader read at an offset is what
/// is there at the end, and each producer's records in a partition in the order it sent them.
fn check_history(
    run: usize,
    histories: &[History],
    live: &[(i32, i64, String)],
    last: &[(i32, i64, String)],
) {
    let outcome: HashMap<&str, Outcome> = histories
        .iter()
        .flatten()
        .flat_map(|(values, o)| values.iter().map(move |v| (v.as_str(), *o)))
        .collect();
    let mut at: HashMap<&str, (i32, i64)> = HashMap::new();
    for (p, offset, v) in last {
        let o = outcome.get(v.as_str());
        assert!(o.is_some(), "run {run}: {v} was never sent");
        assert_ne!(o, Some(&Outcome::Aborted), "run {run}: aborted {v} read");
        assert!(
            at.insert(v, (*p, *offset)).is_none(),
            "run {run}: {v} read twice"
        );
    }
    let (mut committed, mut unknown) = (0, 0);
    for (values, o) in histories.iter().flatten() {
        let found = values
            .iter()
            .filter(|v| at.contains_key(v.as_str()))
            .count();
        match o {
            Outcome::Committed => {
                committed += 1;
                assert_eq!(found, values.len(), "run {run}: committed {values:?} lost");
            }
            Outcome::Unknown => {
                unknown += 1;
                assert!(
                    found == 0 || found == values.len(),
                    "run {run}: half of {values:?} visible"
                );
            }
            Outcome::Aborted => {}
        }
    }
    let by_offset: HashMap<(i32, i64), &str> = last
        .iter()
        .map(|(p, o, v)| ((*p, *o), v.as_str()))
        .collect();
    for (p, offset, v) in live {
        assert_ne!(
            outcome.get(v.as_str()),
            Some(&Outcome::Aborted),
            "run {run}: aborted {v} read live"
        );
        assert_eq!(
            by_offset.get(&(*p, *offset)),
            Some(&v.as_str()),
            "run {run}: {v} read live at {p}/{offset}"
        );
    }
    let mut order: HashMap<(i32, &str), &str> = HashMap::new();
    for (p, _, v) in last {
        let producer = v.split('-').next().unwrap();
        if let Some(before) = order.insert((*p, producer), v) {
            assert!(before < v.as_str(), "run {run}: {v} after {before} in {p}");
        }
    }
    assert!(committed > 0, "run {run}: nothing committed");
    eprintln!(
        "history run {run}: {} transactions ({committed} committed, {unknown} unknown), {} records read at the end, {} live",
        histories.iter().map(Vec::len).sum::<usize>(),
        last.len(),
        live.len()
    );
}

/// Five runs of the history check.
#[test]
fn a_history_of_transactions_over_kill_9s_is_atomic_and_ordered() {
    for run in 0..5 {
        history_run(run);
    }
}

/// What read_committed consumers read of partition 0 of `topic` once no transaction is open.
fn committed_values(listen: &str, topic: &str) -> Vec<String> {
    let ends = settled(listen, topic, 1);
    read_all(listen, topic, &ends, "read_committed")
        .into_iter()
        .map(|r| r.2)
        .collect()
}

/// A transactional producer's session over the wire, as librdkafka speaks it, with partition 0
/// of one topic (named as its transactional id).
struct RawSession {
    c: std::net::TcpStream,
    topic: &'static str,
    producer_id: i64,
    epoch: i16,
    correlation: i32,
}

impl RawSession {
    /// A one-core broker with `topic` (one partition), and a session whose transaction has
    /// added its partition.
    fn on_one_core(topic: &'static str) -> (tempfile::TempDir, Shoal, String, RawSession) {
        let dir = tempfile::tempdir().unwrap();
        let (shoal, listen) = start(dir.path(), 1, &[]);
        crate::common::create_topics(&listen, &[(topic, 1)]);
        let mut session = RawSession::start(shoal.ports[0], topic);
        session.add_partition();
        (dir, shoal, listen, session)
    }

    /// The same producer on a new connection (the broker was restarted).
    fn reconnect(self, port: u16) -> RawSession {
        RawSession {
            c: crate::common::wire::connect(port),
            ..self
        }
    }

    fn start(port: u16, topic: &'static str) -> RawSession {
        use kafka_protocol::messages::{
            InitProducerIdRequest, InitProducerIdResponse, TransactionalId,
        };
        let mut c = crate::common::wire::connect(port);
        let r: InitProducerIdResponse = crate::common::wire::call(
            &mut c,
            kafka_protocol::messages::ApiKey::InitProducerId,
            4,
            1,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(super::s(topic))))
                .with_transaction_timeout_ms(60_000),
        );
        assert_eq!(r.error_code, 0, "{r:?}");
        RawSession {
            c,
            topic,
            producer_id: r.producer_id.0,
            epoch: r.producer_epoch,
            correlation: 2,
        }
    }

    fn next(&mut self) -> i32 {
        self.correlation += 1;
        self.correlation
    }

    fn add_partition(&mut self) {
        use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
        use kafka_protocol::messages::{
            AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ProducerId, TopicName,
            TransactionalId,
        };
        let correlation = self.next();
        let r: AddPartitionsToTxnResponse = crate::common::wire::call(
            &mut self.c,
            kafka_protocol::messages::ApiKey::AddPartitionsToTxn,
            3,
            correlation,
            &AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(super::s(self.topic)))
                .with_v3_and_below_producer_id(ProducerId(self.producer_id))
                .with_v3_and_below_producer_epoch(self.epoch)
                .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(super::s(self.topic)))
                    .with_partitions(vec![0])]),
        );
        let code = r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code;
        assert_eq!(code, 0, "{r:?}");
    }

    /// Produces one record at `sequence`; the partition's answer (error code, base offset).
    fn produce(&mut self, sequence: i32, value: &str) -> (i16, i64) {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
        let mut b = shards::batch::BatchBuilder::new(shards::now_ms())
            .producer(self.producer_id, self.epoch, sequence)
            .transactional();
        b.push(shards::now_ms(), None, Some(value.as_bytes()), &[]);
        let correlation = self.next();
        let r: ProduceResponse = crate::common::wire::call(
            &mut self.c,
            kafka_protocol::messages::ApiKey::Produce,
            8,
            correlation,
            &ProduceRequest::default()
                .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(super::s(
                    self.topic,
                ))))
                .with_acks(-1)
                .with_timeout_ms(5000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(super::s(self.topic)))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(bytes::Bytes::from(b.finish(0))))])]),
        );
        let p = &r.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    }

    fn end(&mut self, commit: bool) {
        use kafka_protocol::messages::{
            EndTxnRequest, EndTxnResponse, ProducerId, TransactionalId,
        };
        let correlation = self.next();
        let r: EndTxnResponse = crate::common::wire::call(
            &mut self.c,
            kafka_protocol::messages::ApiKey::EndTxn,
            3,
            correlation,
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(super::s(self.topic)))
                .with_producer_id(ProducerId(self.producer_id))
                .with_producer_epoch(self.epoch)
                .with_committed(commit),
        );
        assert_eq!(r.error_code, 0, "{r:?}");
    }
}

/// A record written in a transaction whose acknowledgement was lost, then aborted: the client
/// sends its next record with the same sequence number (librdkafka purges the record and reuses
/// it). After a `kill -9` and restart (the producer state rebuilt from the log), that next record
/// is appended at a new offset and committed, never acknowledged as a duplicate of the aborted one.
#[test]
fn a_sequence_number_reused_after_an_abort_is_a_new_record() {
    let (dir, shoal, listen, mut session) = RawSession::on_one_core("reuse");
    assert_eq!(session.produce(0, "purged"), (0, 0));
    session.end(false);
    let shoal = restart(shoal, dir.path(), &listen, &[]);
    let mut session = session.reconnect(shoal.ports[0]);
    session.add_partition();
    let (code, offset) = session.produce(0, "kept");
    assert_eq!(code, 0);
    assert_eq!(offset, 2, "after the record (0) and the abort marker (1)");
    // Its retry is a duplicate, at its own offset.
    assert_eq!(session.produce(0, "kept"), (0, 2));
    session.end(true);
    assert_eq!(committed_values(&listen, "reuse"), ["kept"]);
    shoal.stop();
}

/// A partition an open transaction added, with no batch of it yet, when the broker is killed:
/// the producer's batch sent the moment the broker is back is accepted (the coordinator
/// registers its open transactions again before such a batch is checked), and committed.
#[test]
fn a_partition_added_before_a_kill_9_accepts_the_transaction_at_once_after() {
    let (dir, shoal, listen, session) = RawSession::on_one_core("window");
    let shoal = restart(shoal, dir.path(), &listen, &[]);
    let mut session = session.reconnect(shoal.ports[0]);
    assert_eq!(session.produce(0, "at once"), (0, 0));
    session.end(true);
    assert_eq!(committed_values(&listen, "window"), ["at once"]);
    shoal.stop();
}

/// Topic changes that reach core 0 over the mesh (through core 1) while core 0 still opens its
/// 1,000 partitions after a `kill -9`: the created topic is served on both cores, the deleted
/// one is gone with its files, and both stay so over a clean restart.
#[test]
fn topics_created_and_deleted_during_a_start_are_applied() {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{
        ApiKey, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
        DeleteTopicsResponse, TopicName,
    };
    let dir = tempfile::tempdir().unwrap();
    let (shoal, listen) = start(dir.path(), 2, &[]);
    load_one_core(&listen, 1, 1000);
    let doomed = leaders(&listen)
        .into_keys()
        .find(|(t, _)| t.starts_with("bulk-"))
        .unwrap()
        .0;
    let shoal = restart(shoal, dir.path(), &listen, &[]);
    let mut c = crate::common::wire::connect(shoal.ports[1]);
    let created: CreateTopicsResponse = crate::common::wire::call(
        &mut c,
        ApiKey::CreateTopics,
        5,
        1,
        &CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(super::s("fresh")))
                .with_num_partitions(2)
                .with_replication_factor(1)]),
    );
    assert_eq!(created.topics[0].error_code, 0, "{created:?}");
    let deleted: DeleteTopicsResponse = crate::common::wire::call(
        &mut c,
        ApiKey::DeleteTopics,
        5,
        2,
        &DeleteTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topic_names(vec![TopicName(super::s(&doomed))]),
    );
    assert_eq!(deleted.responses[0].error_code, 0, "{deleted:?}");
    drop(c);
    let mut shoal = Some(shoal);
    for run in 0..2 {
        let shown = leaders(&listen);
        assert!(
            !shown.contains_key(&(doomed.clone(), 0)),
            "{doomed} deleted"
        );
        assert!(!dir.path().join("topics").join(&doomed).exists());
        assert_eq!(shown.keys().filter(|(t, _)| t == "fresh").count(), 2);
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &listen)
            .create()
            .unwrap();
        let records: Vec<(i32, String)> =
            (0..4).map(|k| (k % 2, format!("run{run}-{k}"))).collect();
        send(&p, "fresh", &records).expect("produced");
        let ends = settled(&listen, "fresh", 2);
        let read: BTreeSet<String> = read_all(&listen, "fresh", &ends, "read_uncommitted")
            .into_iter()
            .map(|r| r.2)
            .filter(|v| v.starts_with(&format!("run{run}-")))
            .collect();
        assert_eq!(read, records.into_iter().map(|r| r.1).collect());
        if run == 0 {
            // Over a clean restart the table stays as the changes left it.
            let _ports_free_meanwhile = crate::common::ports_lock();
            shoal.take().unwrap().stop();
            shoal = Some(Shoal::start_on(dir.path(), 2, &listen, &[]));
        }
    }
    shoal.unwrap().stop();
}
