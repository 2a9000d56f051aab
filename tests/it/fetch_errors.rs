//! Fetch errors as Kafka writes them, at every Fetch version shoal serves (4-18): records empty and
//! never null, watermarks and log start offset -1, aborted transactions null for errors found by the
//! read and empty for unknown topics (or topic ids, v13+) or partitions. Raw requests check the bytes at each version;
//! librdkafka checks what matters to a consumer, mirroring librdkafka's own test `0034_offset_reset`:
//! a consumer assigned past the end of a partition resets to the earliest or latest offset (or
//! reports the reset error) within a bounded time, at each version (a proxy in front of shoal lowers
//! the Fetch version shoal advertises, since librdkafka picks the highest); and a consumer misled to
//! the wrong core (NOT_LEADER_OR_FOLLOWER) moves to the right one.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::wire::{call, connect};
use common::{create_topics, send_retrying, Shoal};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, FetchRequest, FetchResponse, FindCoordinatorResponse,
    MetadataResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOPIC: &str = "data";
/// The newest Fetch librdkafka speaks (2.12: v16, topics by id from v13).
const MAX_LIBRDKAFKA_FETCH: i16 = 16;
/// Records produced to partition 0, as in 0034 (`test_quick`).
const MESSAGES: i64 = 20;

const OFFSET_OUT_OF_RANGE: i16 = 1;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const UNKNOWN_TOPIC_ID: i16 = 100;

/// Produces `MESSAGES` records (values "0".."19") to partition 0 and waits for them.
fn produce(bootstrap: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .create()
        .expect("producer");
    for i in 0..MESSAGES {
        let value = i.to_string();
        send_retrying(
            &producer,
            BaseRecord::<(), _>::to(TOPIC).partition(0).payload(&value),
        );
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("all messages acknowledged");
}

/// The core leading each partition of `TOPIC`, from librdkafka's metadata.
fn leaders(bootstrap: &str) -> Vec<usize> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("client");
    let md = consumer
        .fetch_metadata(Some(TOPIC), Duration::from_secs(10))
        .expect("metadata");
    let mut partitions: Vec<_> = md.topics()[0]
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader() as usize))
        .collect();
    partitions.sort_unstable();
    partitions.into_iter().map(|(_, leader)| leader).collect()
}

fn fetch(parts: &[(&str, i32, i64)], max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(
            parts
                .iter()
                .map(|(topic, partition, offset)| {
                    FetchTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                        .with_partitions(vec![FetchPartition::default()
                            .with_partition(*partition)
                            .with_fetch_offset(*offset)
                            .with_partition_max_bytes(1 << 20)])
                })
                .collect(),
        )
}

/// Checks one errored partition against what Kafka sends.
fn check_error(version: i16, p: &PartitionData, code: i16, aborted_null: bool, what: &str) {
    let at = format!("v{version} {what}");
    assert_eq!(p.error_code, code, "{at}");
    assert_eq!(
        (p.high_watermark, p.last_stable_offset, p.log_start_offset),
        (-1, -1, -1),
        "{at}: watermarks"
    );
    assert_eq!(
        p.records,
        Some(Bytes::new()),
        "{at}: records must be empty, not null"
    );
    let aborted = if aborted_null { None } else { Some(vec![]) };
    assert_eq!(
        p.aborted_transactions, aborted,
        "{at}: aborted transactions"
    );
    assert_eq!(p.preferred_read_replica.0, -1, "{at}");
}

/// Every error a fetch can meet, at every version, through kafka-protocol's decoder: past the end
/// (OFFSET_OUT_OF_RANGE), a topic or partition that does not exist (UNKNOWN_TOPIC_OR_PARTITION),
/// and a partition of the other core (NOT_LEADER_OR_FOLLOWER); errors answer at once even with a
/// long max_wait, and a good partition in the same request still gets its records.
#[test]
fn fetch_errors_at_every_version_are_encoded_as_kafka_does() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 4)]);
    produce(&shoal.bootstrap());
    let leaders = leaders(&shoal.bootstrap());
    let (p0, other) = (leaders[0], 1 - leaders[0]);
    // A partition the other core leads (partitions are spread over the cores).
    let not_here = (0..4)
        .find(|&p| leaders[p as usize] == other)
        .expect("4 partitions on 2 cores: some on each");

    let mut s = connect(shoal.ports[p0]);
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        12,
        1,
        &kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str(TOPIC)))),
        ])),
    );
    let id = r.topics[0].topic_id;
    // From v13 topics go by id: the data topic's, and one no topic has for "no-such-topic".
    let by_id = |mut req: FetchRequest| {
        for t in req.topics.iter_mut() {
            t.topic_id = if t.topic.0.as_str() == TOPIC {
                id
            } else {
                uuid::Uuid::from_bytes([0x33; 16])
            };
        }
        req
    };
    for version in 4..=18i16 {
        let corr = i32::from(version);
        let unknown_topic = if version >= 13 {
            UNKNOWN_TOPIC_ID
        } else {
            UNKNOWN_TOPIC_OR_PARTITION
        };
        let parts = [
            (TOPIC, 0, MESSAGES + 5),
            (TOPIC, 7, 0),
            ("no-such-topic", 0, 0),
            (TOPIC, not_here, 0),
        ];
        let started = Instant::now();
        let req = by_id(fetch(&parts, 10_000));
        let r: FetchResponse = call(&mut s, ApiKey::Fetch, version, corr, &req);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "v{version}: a fetch of errors waited {:?}",
            started.elapsed()
        );
        assert_eq!(r.responses.len(), parts.len(), "v{version}");
        let p = |i: usize| &r.responses[i].partitions[0];
        check_error(version, p(0), OFFSET_OUT_OF_RANGE, true, "past the end");
        check_error(
            version,
            p(1),
            UNKNOWN_TOPIC_OR_PARTITION,
            false,
            "unknown partition",
        );
        check_error(version, p(2), unknown_topic, false, "unknown topic");
        check_error(version, p(3), NOT_LEADER_OR_FOLLOWER, true, "other core");

        // An error beside data: the data comes whole, the error as above.
        let r: FetchResponse = call(
            &mut s,
            ApiKey::Fetch,
            version,
            corr + 100,
            &by_id(fetch(&[("no-such-topic", 0, 0), (TOPIC, 0, 0)], 0)),
        );
        check_error(
            version,
            &r.responses[0].partitions[0],
            unknown_topic,
            false,
            "unknown topic beside data",
        );
        let ok = &r.responses[1].partitions[0];
        assert_eq!(
            (ok.error_code, ok.high_watermark, ok.log_start_offset),
            (0, MESSAGES, if version >= 5 { 0 } else { -1 }),
            "v{version}"
        );
        // The good partition's records are all of it, in order, whatever its neighbour's error.
        let values = common::wire::record_values(ok.records.as_ref().expect("records"));
        let expected: Vec<String> = (0..MESSAGES).map(|i| i.to_string()).collect();
        assert_eq!(values, expected, "v{version}");
    }
    drop(s);
    shoal.stop();
}

/// What a consumer saw, as counted by 0034.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    messages: usize,
    eofs: usize,
    errors: usize,
    resets: usize,
}

/// 0034's `do_test_reset`: a consumer assigned to partition 0 at `offset` (past the end), with
/// `auto.offset.reset=reset` and partition EOFs on, must see exactly `want` with no gap of 10 s.
/// Received messages must be the partition's, in order.
fn do_test_reset(bootstrap: &str, reset: &str, offset: i64, want: Seen, at: &str) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "offset-reset")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", reset)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(offset))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut seen = Seen::default();
    while seen != want {
        let m = consumer
            .poll(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{at} {reset}: no message for 10 s: {seen:?} of {want:?}"));
        match m {
            Ok(m) => {
                assert_eq!(m.offset(), seen.messages as i64, "{at} {reset}: in order");
                let value = m.payload().map(|v| String::from_utf8_lossy(v).to_string());
                assert_eq!(value, Some(m.offset().to_string()), "{at} {reset}");
                seen.messages += 1;
            }
            Err(KafkaError::PartitionEOF(_)) => seen.eofs += 1,
            Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) => {
                seen.resets += 1
            }
            Err(e) => {
                eprintln!("{at} {reset}: consume error: {e}");
                seen.errors += 1;
            }
        }
        assert!(
            seen.messages <= want.messages
                && seen.eofs <= want.eofs
                && seen.errors <= want.errors
                && seen.resets <= want.resets,
            "{at} {reset}: unexpected: {seen:?}, want {want:?}"
        );
    }
}

/// 0034's main test: 20 records, then a consumer at offset 25 with each reset policy.
fn offset_reset_0034(bootstrap: &str, at: &str) {
    let past = MESSAGES + 5;
    let none = Seen::default();
    // latest: straight to the end, one EOF, no message.
    do_test_reset(bootstrap, "latest", past, Seen { eofs: 1, ..none }, at);
    // earliest: every message from the start, then one EOF.
    let all = Seen {
        messages: MESSAGES as usize,
        eofs: 1,
        ..none
    };
    do_test_reset(bootstrap, "earliest", past, all, at);
    // error: the reset is reported to the application.
    do_test_reset(bootstrap, "error", past, Seen { resets: 1, ..none }, at);
}

/// librdkafka as it connects: the highest Fetch version shoal offers (12).
#[test]
fn librdkafka_offset_reset_like_0034() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 1)]);
    produce(&shoal.bootstrap());
    offset_reset_0034(&shoal.bootstrap(), "Fetch v12");
    shoal.stop();
}

/// The same at every lower version librdkafka can be made to speak.
#[test]
fn librdkafka_offset_reset_like_0034_at_every_fetch_version() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 1)]);
    produce(&shoal.bootstrap());
    for version in 4..=MAX_LIBRDKAFKA_FETCH {
        let proxy = Proxy::start(&shoal.ports, version, false);
        offset_reset_0034(&proxy.bootstrap(), &format!("Fetch v{version}"));
        let used = proxy.fetch_versions();
        assert_eq!(used, vec![version], "librdkafka spoke Fetch {used:?}");
    }
    shoal.stop();
}

/// NOT_LEADER_OR_FOLLOWER end to end, at every version: a 2-core server behind a proxy whose first
/// Metadata answers name the wrong core as partition 0's leader, so librdkafka's first fetches go
/// there. The error must send it to refresh its metadata and fetch from the right core, and every
/// record must arrive within a bounded time.
#[test]
fn librdkafka_follows_not_leader_to_the_right_core_at_every_fetch_version() {
    let dir = tempfile::tempdir().unwrap();
    // Without read replicas: with them the other core would serve the partition, not refuse it.
    let shoal = Shoal::start(dir.path(), 2, &["--read-replicas", "off"]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, 1)]);
    produce(&shoal.bootstrap());
    for version in 4..=MAX_LIBRDKAFKA_FETCH {
        let proxy = Proxy::start(&shoal.ports, version, true);
        let at = format!("Fetch v{version}");
        let all = Seen {
            messages: MESSAGES as usize,
            eofs: 1,
            ..Seen::default()
        };
        do_test_reset(&proxy.bootstrap(), "error", 0, all, &at);
        assert_eq!(proxy.fetch_versions(), vec![version], "{at}");
        let codes = proxy.fetch_error_codes();
        assert!(
            codes.contains(&NOT_LEADER_OR_FOLLOWER),
            "{at}: the first fetch should have met the wrong core: {codes:?}"
        );
    }
    shoal.stop();
}

/// A TCP proxy in front of shoal's cores (one listener per core) that advertises at most Fetch
/// `max_fetch` in ApiVersions (librdkafka then uses that version) and itself as the brokers in
/// Metadata and FindCoordinator (so every connection goes through it). With `mislead`, Metadata
/// names the wrong core as every partition's leader until a Fetch response says
/// NOT_LEADER_OR_FOLLOWER. It records the
/// Fetch versions clients use and the partition error codes of the Fetch responses.
struct Proxy {
    ports: Vec<u16>,
    state: Arc<ProxyState>,
}

struct ProxyState {
    ports: Vec<u16>,
    max_fetch: i16,
    mislead: std::sync::atomic::AtomicBool,
    fetch_versions: Mutex<Vec<i16>>,
    fetch_error_codes: Mutex<Vec<i16>>,
}

/// Request (API key, version) by correlation id, per connection.
type Asked = Arc<Mutex<HashMap<i32, (i16, i16)>>>;

impl Proxy {
    fn start(upstreams: &[u16], max_fetch: i16, mislead: bool) -> Proxy {
        let listeners: Vec<TcpListener> = upstreams
            .iter()
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let state = Arc::new(ProxyState {
            ports: ports.clone(),
            max_fetch,
            mislead: mislead.into(),
            fetch_versions: Mutex::default(),
            fetch_error_codes: Mutex::default(),
        });
        for (listener, &upstream) in listeners.into_iter().zip(upstreams) {
            let state = state.clone();
            // Ends with the test process; each connection's threads end when either side closes.
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { return };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        continue;
                    };
                    let asked: Asked = Arc::default();
                    let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (a, st) = (asked.clone(), state.clone());
                    std::thread::spawn(move || forward_requests(c, s, a, &st));
                    let st = state.clone();
                    std::thread::spawn(move || forward_responses(server, client, asked, &st));
                }
            });
        }
        Proxy { ports, state }
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.ports[0])
    }

    /// The distinct Fetch versions requested through the proxy.
    fn fetch_versions(&self) -> Vec<i16> {
        let mut v = self.state.fetch_versions.lock().unwrap().clone();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The distinct partition error codes of the Fetch responses.
    fn fetch_error_codes(&self) -> Vec<i16> {
        let mut v = self.state.fetch_error_codes.lock().unwrap().clone();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// One frame's payload (without its size), or `None` when the stream ends or fails.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let mut frame = vec![0u8; usize::try_from(i32::from_be_bytes(size)).ok()?];
    s.read_exact(&mut frame).ok()?;
    Some(frame)
}

fn write_frame(s: &mut TcpStream, frame: &[u8]) -> std::io::Result<()> {
    s.write_all(&(frame.len() as i32).to_be_bytes())?;
    s.write_all(frame)
}

fn forward_requests(
    mut client: TcpStream,
    mut server: TcpStream,
    asked: Asked,
    state: &ProxyState,
) {
    while let Some(frame) = read_frame(&mut client) {
        if frame.len() < 8 {
            break;
        }
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        asked.lock().unwrap().insert(correlation, (key, version));
        if key == ApiKey::Fetch as i16 {
            state.fetch_versions.lock().unwrap().push(version);
        }
        if write_frame(&mut server, &frame).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}

fn forward_responses(
    mut server: TcpStream,
    mut client: TcpStream,
    asked: Asked,
    state: &ProxyState,
) {
    while let Some(frame) = read_frame(&mut server) {
        let correlation = i32::from_be_bytes(frame[..4].try_into().unwrap());
        let request = asked.lock().unwrap().remove(&correlation);
        let frame = match request {
            Some((key, version)) => rewrite(key, version, frame, state),
            None => frame,
        };
        if write_frame(&mut client, &frame).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// Lowers Fetch's max version in an ApiVersions response, points the brokers of Metadata and
/// FindCoordinator at the proxy (misleading about leaders if asked to), and notes Fetch error codes;
/// other responses (and any that does not decode, like an ApiVersions v0 fallback) pass unchanged.
fn rewrite(key: i16, version: i16, frame: Vec<u8>, state: &ProxyState) -> Vec<u8> {
    let Ok(api) = ApiKey::try_from(key) else {
        return frame;
    };
    let header_version = api.response_header_version(version);
    let mut buf = Bytes::from(frame.clone());
    let Ok(header) = ResponseHeader::decode(&mut buf, header_version) else {
        return frame;
    };
    let mut out = BytesMut::new();
    header.encode(&mut out, header_version).unwrap();
    let port =
        |node: i32| i32::from(state.ports[usize::try_from(node).unwrap_or(0) % state.ports.len()]);
    match api {
        ApiKey::ApiVersions => {
            let Ok(mut r) = ApiVersionsResponse::decode(&mut buf, version) else {
                return frame;
            };
            for k in r.api_keys.iter_mut() {
                if k.api_key == ApiKey::Fetch as i16 {
                    k.max_version = k.max_version.min(state.max_fetch);
                }
            }
            r.encode(&mut out, version).unwrap();
        }
        ApiKey::Metadata => {
            let Ok(mut r) = MetadataResponse::decode(&mut buf, version) else {
                return frame;
            };
            for b in r.brokers.iter_mut() {
                b.port = port(b.node_id.0);
            }
            if state.mislead.load(std::sync::atomic::Ordering::SeqCst) {
                let cores = state.ports.len() as i32;
                for p in r.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                    p.leader_id.0 = (p.leader_id.0 + 1) % cores;
                }
            }
            r.encode(&mut out, version).unwrap();
        }
        ApiKey::FindCoordinator => {
            let Ok(mut r) = FindCoordinatorResponse::decode(&mut buf, version) else {
                return frame;
            };
            r.port = port(r.node_id.0);
            for c in r.coordinators.iter_mut() {
                c.port = port(c.node_id.0);
            }
            r.encode(&mut out, version).unwrap();
        }
        ApiKey::Fetch => {
            if let Ok(r) = FetchResponse::decode(&mut buf, version) {
                let misled = r
                    .responses
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .any(|p| p.error_code == NOT_LEADER_OR_FOLLOWER);
                if misled {
                    // The misled fetch reached the wrong core: from now on Metadata tells the
                    // truth (set before the client sees the error and asks again).
                    state
                        .mislead
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                }
                let codes = r
                    .responses
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| p.error_code));
                state.fetch_error_codes.lock().unwrap().extend(codes);
            }
            return frame;
        }
        _ => return frame,
    }
    out.to_vec()
}
