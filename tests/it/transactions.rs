//! Transactions. The coordinator does not exist yet: a transaction coordinator lookup is refused
//! with an error clients do not retry, so a transactional producer fails at once instead of
//! hanging (raw FindCoordinator requests, then librdkafka's `init_transactions`). The partition
//! side does: a log written with transactions (offline, through the engine, until a coordinator
//! writes markers) is served to read_committed consumers up to its last stable offset, with the
//! aborted transactions of each fetch (raw Fetch and ListOffsets, then librdkafka).

use crate::common;
mod restart;

use bytes::Bytes;
use common::wire::{call, connect, record_values};
use common::{create_topics, Shoal};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse,
    ListOffsetsRequest, ListOffsetsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use shards::batch::BatchBuilder;
use std::path::Path;
use std::time::{Duration, Instant};

const NONE: i16 = 0;
const INVALID_REQUEST: i16 = 42;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// FindCoordinator for a transactional id names the core its hash picks, on every version; v4
/// answers per key, beside group keys; an unknown key type is an invalid request.
#[test]
fn a_transaction_coordinator_is_found_per_id() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let mut c = connect(shoal.ports[0]);
    let mut cores_seen = std::collections::BTreeSet::new();
    for (i, id) in ["tx-1", "tx-2", "tx-3", "tx-4", "tx-5", "tx-6"]
        .iter()
        .enumerate()
    {
        for v in 1..=3 {
            let r: FindCoordinatorResponse = call(
                &mut c,
                ApiKey::FindCoordinator,
                v,
                (i * 10) as i32 + i32::from(v),
                &FindCoordinatorRequest::default()
                    .with_key(s(id))
                    .with_key_type(1),
            );
            assert_eq!(r.error_code, NONE, "v{v}");
            assert_eq!(r.port, i32::from(shoal.ports[r.node_id.0 as usize]));
            cores_seen.insert(r.node_id.0);
        }
    }
    assert_eq!(cores_seen.len(), 2, "ids spread over both cores");
    for (key_type, expected) in [(1, NONE), (0, NONE), (2, INVALID_REQUEST)] {
        let r: FindCoordinatorResponse = call(
            &mut c,
            ApiKey::FindCoordinator,
            4,
            100 + i32::from(key_type),
            &FindCoordinatorRequest::default()
                .with_coordinator_keys(vec![s("a"), s("b")])
                .with_key_type(key_type),
        );
        assert_eq!(r.coordinators.len(), 2);
        for k in &r.coordinators {
            assert_eq!(k.error_code, expected, "key type {key_type}: {k:?}");
        }
    }
}

pub(crate) fn transactional_producer(
    bootstrap: &str,
    id: &str,
    extra: &[(&str, &str)],
) -> BaseProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", id)
        .set("linger.ms", "5");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    let p: BaseProducer = config.create().unwrap();
    p.init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    p
}

pub(crate) fn send_values(p: &BaseProducer, topic: &str, values: &[String]) {
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        let mut record = rdkafka::producer::BaseRecord::to(topic)
            .key(&key)
            .payload(v);
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((e, r)) => {
                    assert!(
                        matches!(
                            e.rdkafka_error_code(),
                            Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ),
                        "produce failed: {e}"
                    );
                    record = r;
                    p.poll(Duration::from_millis(10));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).expect("flush");
}

fn values(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Every value in `topic` (all partitions) a consumer at `isolation` reads, until `want` values
/// or 20 s, then 500 ms more (anything more would be a record it should not see).
fn consume_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: &str,
    want: usize,
) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{isolation}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("fetch.wait.max.ms", "50")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut values = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut quiet_until = None;
    while Instant::now() < deadline && quiet_until.is_none_or(|q| Instant::now() < q) {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("fetch succeeds");
            values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
        if values.len() >= want && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + Duration::from_millis(500));
        }
    }
    values.sort();
    values
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// librdkafka's transactional producer over two cores and four partitions: a committed
/// transaction, an aborted one, another committed. read_committed consumers see exactly the
/// committed records; read_uncommitted ones see all; the coordinator's counters and every
/// partition's last stable offset say the same.
#[test]
fn a_transactional_producer_commits_and_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topics(&shoal.bootstrap(), &[("out", 4)]);
    let p = transactional_producer(&shoal.bootstrap(), "tx-commit-abort", &[]);
    p.begin_transaction().unwrap();
    send_values(&p, "out", &values("first", 20));
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    p.begin_transaction().unwrap();
    send_values(&p, "out", &values("aborted", 20));
    p.abort_transaction(Duration::from_secs(30)).unwrap();
    p.begin_transaction().unwrap();
    send_values(&p, "out", &values("second", 10));
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    let committed = consume_topic(&shoal.bootstrap(), "out", 4, "read_committed", 30);
    let mut want = values("first", 20);
    want.extend(values("second", 10));
    assert_eq!(committed, sorted(want));
    let all = consume_topic(&shoal.bootstrap(), "out", 4, "read_uncommitted", 50);
    assert_eq!(all.len(), 50);
    assert_eq!(shoal.metric("shoal_transactions_committed_total"), 2);
    assert_eq!(shoal.metric("shoal_transactions_aborted_total"), 1);
    assert_eq!(shoal.metric("shoal_transactions_open"), 0);
    assert_eq!(shoal.metric("shoal_open_transactions"), 0);
    assert_eq!(shoal.metric("shoal_log_last_stable_offset_lag"), 0);
    drop(p);
    shoal.stop();
}

const TOPIC: &str = "txn";
/// The first record's timestamp: in 2100, after any marker's.
const FIRST_TIMESTAMP: i64 = 4_102_444_800_000;

/// The offsets of what [`write_transactions`] wrote.
struct Written {
    /// Where the transaction left open begins: the last stable offset.
    open_from: i64,
    /// The aborted transaction's producer and first offset.
    aborted: (i64, i64),
    high_watermark: i64,
}

/// Appends to partition 0's log, through the engine, with the server stopped: a plain record, a
/// transaction of producer 1 that commits, one of producer 2 interleaved with it that aborts,
/// another plain record, and a transaction of producer 3 left open.
fn write_transactions(data_dir: &Path) -> Written {
    let dir = data_dir.join("topics").join(TOPIC).join("0");
    let (tx, rx) = std::sync::mpsc::channel();
    shards::testing::run(move || async move {
        let config = shards::LogConfig {
            direct_io: false,
            ..Default::default()
        };
        let cache = std::rc::Rc::new(shards::TailCache::new(1 << 20, 4096));
        let log = shards::Log::open(&dir, config, cache).await.unwrap();
        // Each record a millisecond after the one before (ListOffsets by time), all after the
        // markers' (stamped with the clock).
        let clock = std::cell::Cell::new(FIRST_TIMESTAMP);
        let append = |pid: i64, seq: i32, value: &str| {
            let ts = clock.replace(clock.get() + 1);
            let mut b = BatchBuilder::new(ts).producer(pid, 0, seq);
            if pid >= 0 {
                b = b.transactional();
            }
            b.push(ts, Some(b"k"), Some(value.as_bytes()), &[]);
            let log = log.clone();
            async move {
                let r = log.append(Bytes::from(b.finish(0)), Default::default());
                r.await.unwrap().base_offset
            }
        };
        append(-1, -1, "plain-1").await;
        append(1, 0, "committed-1").await;
        let aborted = append(2, 0, "aborted-1").await;
        append(1, 1, "committed-2").await;
        append(2, 1, "aborted-2").await;
        log.append_marker(2, 0, false, 0).await.unwrap();
        log.append_marker(1, 0, true, 0).await.unwrap();
        append(-1, -1, "plain-2").await;
        let open_from = append(3, 0, "open-1").await;
        append(-1, -1, "plain-3").await;
        assert_eq!(log.last_stable_offset(), open_from);
        let written = Written {
            open_from,
            aborted: (2, aborted),
            high_watermark: log.high_watermark(),
        };
        log.close().await.unwrap();
        tx.send(written).unwrap();
    });
    rx.recv().unwrap()
}

fn fetch(isolation_level: i8) -> FetchRequest {
    fetch_at(isolation_level, 0, 0)
}

/// A fetch of partition 0 from `offset` that long-polls up to `max_wait_ms` for a byte.
fn fetch_at(isolation_level: i8, offset: i64, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(isolation_level)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(s(TOPIC)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

/// The values of the data records (not markers) in a fetch's records.
fn data_values(records: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        let n = shards::batch::peek_total_len(rest).expect("whole batches");
        let h = shards::batch::BatchHeader::parse(rest).unwrap();
        if !h.is_control() {
            out.extend(record_values(&rest[..n]));
        }
        rest = &rest[n..];
    }
    out
}

/// ListOffsets latest (-1), max timestamp (-3) or by time, for partition 0: the offset.
fn list_offset(c: &mut std::net::TcpStream, isolation_level: i8, timestamp: i64) -> i64 {
    let r: ListOffsetsResponse = call(
        c,
        ApiKey::ListOffsets,
        5,
        7,
        &ListOffsetsRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_isolation_level(isolation_level)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(timestamp)])]),
    );
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, NONE);
    p.offset
}

/// What librdkafka's consumer at `isolation` reads from the start, until `want` values or 20 s.
fn consume(bootstrap: &str, isolation: &str, want: usize) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("txn-{isolation}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("fetch.wait.max.ms", "50")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut values = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    // A little past the count wanted: anything more would be a record that should not be seen.
    let mut quiet_until = None;
    while Instant::now() < deadline && quiet_until.is_none_or(|q| Instant::now() < q) {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("fetch succeeds");
            values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
        if values.len() >= want && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + Duration::from_millis(500));
        }
    }
    values
}

#[test]
fn read_committed_consumers_stop_at_the_last_stable_offset_and_skip_aborted_records() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 1)]);
    shoal.stop();
    let w = write_transactions(dir.path());
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let mut c = connect(shoal.ports[0]);
    for version in [4, 11, 12] {
        let r: FetchResponse = call(&mut c, ApiKey::Fetch, version, 1, &fetch(1));
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, NONE, "v{version}");
        assert_eq!(
            (p.high_watermark, p.last_stable_offset),
            (w.high_watermark, w.open_from),
            "v{version}"
        );
        let aborted: Vec<(i64, i64)> = p
            .aborted_transactions
            .iter()
            .flatten()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect();
        assert_eq!(aborted, [w.aborted], "v{version}");
        // Every record below the last stable offset (the client drops the aborted ones), none
        // from the open transaction or after it.
        let values = data_values(p.records.as_deref().unwrap_or_default());
        assert_eq!(
            values,
            [
                "plain-1",
                "committed-1",
                "aborted-1",
                "committed-2",
                "aborted-2",
                "plain-2"
            ],
            "v{version}"
        );
        // read_uncommitted: everything, and no aborted list.
        let r: FetchResponse = call(&mut c, ApiKey::Fetch, version, 2, &fetch(0));
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.last_stable_offset, w.open_from, "v{version}");
        assert!(p.aborted_transactions.iter().flatten().next().is_none());
        let values = data_values(p.records.as_deref().unwrap_or_default());
        assert_eq!(values.len(), 8, "v{version}: {values:?}");
    }
    // At the last stable offset a read_committed long poll waits out its time: the records past
    // it are not committed; a read_uncommitted fetch there gets them at once.
    let start = Instant::now();
    let r: FetchResponse = call(&mut c, ApiKey::Fetch, 12, 3, &fetch_at(1, w.open_from, 400));
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, NONE);
    assert!(p.records.as_deref().unwrap_or_default().is_empty());
    assert!(
        start.elapsed() >= Duration::from_millis(350),
        "{:?}",
        start.elapsed()
    );
    let start = Instant::now();
    let r: FetchResponse = call(
        &mut c,
        ApiKey::Fetch,
        12,
        4,
        &fetch_at(0, w.open_from, 5_000),
    );
    let values = data_values(r.responses[0].partitions[0].records.as_deref().unwrap());
    assert_eq!(values, ["open-1", "plain-3"]);
    assert!(start.elapsed() < Duration::from_secs(4));
    // Two read_committed fetches at one offset share one read (the coalescer keys on the
    // isolation and keeps the result fresh while the last stable offset stays).
    let reads = shoal.metric("shoal_fetch_coalescer_reads_total");
    for correlation in [5, 6] {
        let r: FetchResponse = call(&mut c, ApiKey::Fetch, 12, correlation, &fetch_at(1, 1, 0));
        assert_eq!(
            r.responses[0].partitions[0]
                .aborted_transactions
                .iter()
                .flatten()
                .count(),
            1
        );
    }
    assert_eq!(shoal.metric("shoal_fetch_coalescer_reads_total"), reads + 1);
    assert_eq!(
        shoal.metric("shoal_log_last_stable_offset_lag"),
        (w.high_watermark - w.open_from) as u64
    );
    assert_eq!(shoal.metric("shoal_open_transactions"), 1);
    assert_eq!(list_offset(&mut c, 1, -1), w.open_from);
    assert_eq!(list_offset(&mut c, 0, -1), w.high_watermark);
    // By time: the newest record lies past the last stable offset, not there yet for
    // read_committed; the first record is found by both.
    assert_eq!(list_offset(&mut c, 1, -3), -1);
    assert_eq!(list_offset(&mut c, 0, -3), w.high_watermark - 1);
    assert_eq!(list_offset(&mut c, 1, FIRST_TIMESTAMP), 0);
    assert_eq!(list_offset(&mut c, 0, FIRST_TIMESTAMP), 0);
    // librdkafka drops the aborted records and stops before the open transaction.
    let committed = consume(&shoal.bootstrap(), "read_committed", 4);
    assert_eq!(
        committed,
        ["plain-1", "committed-1", "committed-2", "plain-2"]
    );
    let uncommitted = consume(&shoal.bootstrap(), "read_uncommitted", 8);
    assert_eq!(uncommitted.len(), 8, "{uncommitted:?}");
    shoal.stop();
}

/// Two producers with one transactional id: the second's InitProducerId aborts the first's open
/// transaction and fences it; the first cannot commit, and none of its records are ever seen by
/// read_committed consumers.
#[test]
fn a_second_producer_with_the_same_id_fences_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topics(&shoal.bootstrap(), &[("fenced", 2)]);
    let zombie = transactional_producer(&shoal.bootstrap(), "tx-shared", &[]);
    zombie.begin_transaction().unwrap();
    send_values(&zombie, "fenced", &values("zombie", 10));
    let live = transactional_producer(&shoal.bootstrap(), "tx-shared", &[]);
    let e = zombie
        .commit_transaction(Duration::from_secs(30))
        .expect_err("the zombie is fenced");
    assert!(
        matches!(
            e.rdkafka_error_code(),
            Some(rdkafka::types::RDKafkaErrorCode::ProducerFenced)
                | Some(rdkafka::types::RDKafkaErrorCode::InvalidProducerEpoch)
                | Some(rdkafka::types::RDKafkaErrorCode::Fenced)
        ),
        "{e}"
    );
    live.begin_transaction().unwrap();
    send_values(&live, "fenced", &values("live", 10));
    live.commit_transaction(Duration::from_secs(30)).unwrap();
    let seen = consume_topic(&shoal.bootstrap(), "fenced", 2, "read_committed", 10);
    assert_eq!(seen, sorted(values("live", 10)));
    assert!(shoal.metric("shoal_transactions_producers_fenced_total") >= 1);
    assert_eq!(shoal.metric("shoal_transactions_aborted_total"), 1);
    assert_eq!(shoal.metric("shoal_log_last_stable_offset_lag"), 0);
    drop((zombie, live));
    shoal.stop();
}

/// A transaction left open past its timeout is aborted by the coordinator: the partitions' last
/// stable offset moves past it (read_committed readers go on), DescribeTransactions says so, and
/// the producer's late commit fails.
#[test]
fn an_open_transaction_past_its_timeout_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(
        dir.path(),
        2,
        &["--transaction-timeout-check-interval-ms", "100"],
    );
    create_topics(&shoal.bootstrap(), &[("slow", 2)]);
    let p = transactional_producer(
        &shoal.bootstrap(),
        "tx-slow",
        &[
            ("transaction.timeout.ms", "1500"),
            ("socket.timeout.ms", "1500"),
        ],
    );
    p.begin_transaction().unwrap();
    send_values(&p, "slow", &values("late", 10));
    assert_eq!(shoal.metric("shoal_transactions_open"), 1);
    assert!(shoal.metric("shoal_log_last_stable_offset_lag") > 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while shoal.metric("shoal_transactions_timed_out_total") == 0 {
        assert!(Instant::now() < deadline, "no timeout abort");
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while shoal.metric("shoal_log_last_stable_offset_lag") > 0 {
        assert!(Instant::now() < deadline, "markers not written");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(shoal.metric("shoal_transactions_open"), 0);
    let (state, _) = describe_transaction(&shoal, "tx-slow");
    assert_eq!(state, "CompleteAbort");
    assert!(p.commit_transaction(Duration::from_secs(10)).is_err());
    let seen = consume_topic(&shoal.bootstrap(), "slow", 2, "read_committed", 0);
    assert!(seen.is_empty(), "{seen:?}");
    drop(p);
    shoal.stop();
}

/// The state of `id` at its coordinator (FindCoordinator, then DescribeTransactions there), and
/// its partitions.
fn describe_transaction(shoal: &Shoal, id: &str) -> (String, Vec<(String, i32)>) {
    use kafka_protocol::messages::{DescribeTransactionsRequest, DescribeTransactionsResponse};
    let mut c = connect(shoal.ports[0]);
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        3,
        1,
        &FindCoordinatorRequest::default()
            .with_key(s(id))
            .with_key_type(1),
    );
    let mut c = connect(r.port as u16);
    let r: DescribeTransactionsResponse = call(
        &mut c,
        ApiKey::DescribeTransactions,
        0,
        2,
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![kafka_protocol::messages::TransactionalId(s(id))]),
    );
    let t = &r.transaction_states[0];
    assert_eq!(t.error_code, NONE);
    let partitions = t
        .topics
        .iter()
        .flat_map(|tp| tp.partitions.iter().map(|p| (tp.topic.to_string(), *p)))
        .collect();
    (t.transaction_state.to_string(), partitions)
}

/// A read_committed consumer parked behind an open transaction gets nothing while it is open and
/// wakes when it commits (the long poll waits on the last stable offset).
#[test]
fn a_read_committed_consumer_behind_an_open_transaction_wakes_at_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topics(&shoal.bootstrap(), &[("parked", 1)]);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", shoal.bootstrap())
        .set("group.id", "parked")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "500")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("parked", 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let p = transactional_producer(&shoal.bootstrap(), "tx-parked", &[]);
    p.begin_transaction().unwrap();
    send_values(&p, "parked", &values("held", 5));
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            panic!(
                "an uncommitted record was delivered: {:?}",
                m.map(|m| m.offset())
            );
        }
    }
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    let committed = Instant::now();
    let mut got = Vec::new();
    while got.len() < 5 {
        assert!(committed.elapsed() < Duration::from_secs(10), "{got:?}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("fetch succeeds");
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    assert_eq!(sorted(got), sorted(values("held", 5)));
    drop((p, consumer));
    shoal.stop();
}

/// A transactional batch from a producer whose transaction does not include the partition is
/// refused with INVALID_TXN_STATE, and nothing is appended.
#[test]
fn a_transactional_batch_outside_a_transaction_is_refused() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
    const INVALID_TXN_STATE: i16 = 48;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 1)]);
    let mut b = BatchBuilder::new(1_700_000_000_000)
        .producer(77, 0, 0)
        .transactional();
    b.push(1_700_000_000_000, Some(b"k"), Some(b"v"), &[]);
    let mut c = connect(shoal.ports[0]);
    let r: ProduceResponse = call(
        &mut c,
        ApiKey::Produce,
        8,
        1,
        &ProduceRequest::default()
            .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(s("tx-x"))))
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(b.finish(0))))])]),
    );
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, INVALID_TXN_STATE, "{p:?}");
    assert_eq!(list_offset(&mut c, 0, -1), 0, "nothing appended");
    shoal.stop();
}

/// kill -9 with one transaction open and another decided: after the restart the coordinator
/// finds both in its log; the open one goes on (its producer adds more and commits) and every
/// committed record is read exactly once by read_committed consumers, none of the aborted ones.
#[test]
fn transactions_survive_kill_9_of_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--transaction-timeout-check-interval-ms", "100"];
    let (shoal, listen) = restart::start(dir.path(), 2, &args);
    create_topics(&listen, &[("crash", 4)]);
    let aborted = transactional_producer(&listen, "tx-crash-abort", &[]);
    aborted.begin_transaction().unwrap();
    send_values(&aborted, "crash", &values("aborted", 8));
    aborted.abort_transaction(Duration::from_secs(30)).unwrap();
    let p = transactional_producer(&listen, "tx-crash", &[]);
    p.begin_transaction().unwrap();
    send_values(&p, "crash", &values("before", 8));
    let shoal = restart::restart(shoal, dir.path(), &listen, &args);
    // The same transaction goes on over the restart: more records, then the commit.
    send_values(&p, "crash", &values("after", 8));
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    let mut want = values("before", 8);
    want.extend(values("after", 8));
    let seen = consume_topic(&listen, "crash", 4, "read_committed", 16);
    assert_eq!(seen, sorted(want));
    let (state, _) = describe_transaction(&shoal, "tx-crash");
    assert_eq!(state, "CompleteCommit");
    assert_eq!(shoal.metric("shoal_log_last_stable_offset_lag"), 0);
    drop((p, aborted));
    shoal.stop();
}

/// Changing `--cores` moves every transactional id to its new coordinator core: each is found
/// there with its producer id and state, from 2 cores to 1 and then to 3, and an open
/// transaction is still open (and ends by timeout, its records never seen read_committed).
#[test]
fn transactional_ids_move_with_the_core_count() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topics(&shoal.bootstrap(), &[("moved", 2)]);
    let ids: Vec<String> = (0..6).map(|i| format!("tx-moved-{i}")).collect();
    let mut before = Vec::new();
    for id in &ids {
        let p = transactional_producer(&shoal.bootstrap(), id, &[]);
        p.begin_transaction().unwrap();
        send_values(&p, "moved", &values(id, 2));
        p.commit_transaction(Duration::from_secs(30)).unwrap();
        before.push(describe_full(&shoal, id));
    }
    let open = transactional_producer(
        &shoal.bootstrap(),
        "tx-moved-open",
        &[
            ("transaction.timeout.ms", "4000"),
            ("socket.timeout.ms", "4000"),
        ],
    );
    open.begin_transaction().unwrap();
    send_values(&open, "moved", &values("open", 2));
    drop(open);
    shoal.stop();
    for cores in [1, 3] {
        let shoal = Shoal::start(
            dir.path(),
            cores,
            &["--transaction-timeout-check-interval-ms", "100"],
        );
        for (id, b) in ids.iter().zip(&before) {
            assert_eq!(&describe_full(&shoal, id), b, "{id} on {cores} cores");
        }
        if cores == 1 {
            let (state, partitions) = describe_transaction(&shoal, "tx-moved-open");
            assert!(state == "Ongoing" || state == "CompleteAbort", "{state}");
            assert!(state == "CompleteAbort" || !partitions.is_empty());
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while describe_transaction(&shoal, "tx-moved-open").0 != "CompleteAbort" {
            assert!(
                Instant::now() < deadline,
                "the open transaction never timed out"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let seen = consume_topic(&shoal.bootstrap(), "moved", 2, "read_committed", 12);
        assert_eq!(seen.len(), 12, "{seen:?}");
        assert!(!seen.iter().any(|v| v.starts_with("open")));
        shoal.stop();
    }
    assert!(dir.path().join("__transactions").join("core-2").exists());
}

/// An id's producer id, epoch and state at its coordinator.
fn describe_full(shoal: &Shoal, id: &str) -> (i64, i16, String) {
    use kafka_protocol::messages::{DescribeTransactionsRequest, DescribeTransactionsResponse};
    let mut c = connect(shoal.ports[0]);
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        3,
        1,
        &FindCoordinatorRequest::default()
            .with_key(s(id))
            .with_key_type(1),
    );
    assert_eq!(r.error_code, NONE);
    let mut c = connect(r.port as u16);
    let r: DescribeTransactionsResponse = call(
        &mut c,
        ApiKey::DescribeTransactions,
        0,
        2,
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![kafka_protocol::messages::TransactionalId(s(id))]),
    );
    let t = &r.transaction_states[0];
    assert_eq!(t.error_code, NONE, "{id}");
    (
        t.producer_id.0,
        t.producer_epoch,
        t.transaction_state.to_string(),
    )
}

/// At the edge, a read_committed consumer sees what it would see upstream: transactions older
/// than what the edge holds are read through from the upstream at read_committed (its last
/// stable offset and aborted transactions passed on), newer ones are mirrored with their markers
/// (the edge's log keeps its own last stable offset and aborted index).
#[test]
fn read_committed_consumers_at_the_edge_see_only_committed_records() {
    use common::edge::{start_edge, start_upstream, wait_for_topic};
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = start_upstream(dirs[0].path(), "127.0.0.1:0");
    create_topics(&upstream.bootstrap(), &[("etxn", 1)]);
    let p = transactional_producer(&upstream.bootstrap(), "tx-edge", &[]);
    for (prefix, n, commit) in [
        ("old-c", 20, true),
        ("old-a", 20, false),
        ("old-c2", 10, true),
    ] {
        p.begin_transaction().unwrap();
        send_values(&p, "etxn", &values(prefix, n));
        if commit {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    let edge = start_edge(dirs[1].path(), &upstream.bootstrap());
    wait_for_topic(&edge, "etxn", 1);
    // A consumer at the tail starts the edge's fetcher there.
    let tail: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", edge.bootstrap())
        .set("group.id", "tail")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("etxn", 0, Offset::End).unwrap();
    tail.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while edge.metric("shoal_edge_upstream_fetch_streams") == 0 {
        assert!(Instant::now() < deadline, "no fetcher at the edge");
        tail.poll(Duration::from_millis(50));
    }
    for (prefix, n, commit) in [("new-c", 10, true), ("new-a", 10, false)] {
        p.begin_transaction().unwrap();
        send_values(&p, "etxn", &values(prefix, n));
        if commit {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    let upstream_hw = upstream.metric("shoal_log_high_watermark");
    let deadline = Instant::now() + Duration::from_secs(20);
    while edge.metric("shoal_log_high_watermark") < upstream_hw {
        assert!(
            Instant::now() < deadline,
            "the edge did not mirror the new transactions"
        );
        tail.poll(Duration::from_millis(50));
    }
    let mut want = values("old-c", 20);
    want.extend(values("old-c2", 10));
    want.extend(values("new-c", 10));
    let committed = consume_topic(&edge.bootstrap(), "etxn", 1, "read_committed", want.len());
    assert_eq!(committed, sorted(want));
    assert!(edge.metric("shoal_edge_read_through_total") > 0);
    let all = consume_topic(&edge.bootstrap(), "etxn", 1, "read_uncommitted", 70);
    assert_eq!(all.len(), 70);
    drop((p, tail));
    edge.stop();
    upstream.stop();
}
