//! Raw-bytes tests of the Kafka front end against the real `shoal` binary: requests are written to a
//! plain `std::net::TcpStream` (bodies built with `kafka-protocol`, malformed ones by hand) and the
//! response frames are read and decoded by hand, so framing, ordering, closing and error codes are
//! checked exactly as a client sees them.

use crate::common;

mod walk;

use bytes::{Bytes, BytesMut};
use common::wire::{
    call, connect, decode, expect_closed, raw_frame, record_values, recv, request_frame, send,
};
use common::Shoal;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest,
    CreateTopicsResponse, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use shards::batch::BatchBuilder;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// Kafka error codes.
const NONE: i16 = 0;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const CORRUPT_MESSAGE: i16 = 2;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
const UNSUPPORTED_VERSION: i16 = 35;
const TOPIC_ALREADY_EXISTS: i16 = 36;
const INVALID_REPLICATION_FACTOR: i16 = 38;

// Versions used when a test does not care.
const PRODUCE_V: i16 = 9;
const FETCH_V: i16 = 12;
const LIST_OFFSETS_V: i16 = 7;
const METADATA_V: i16 = 12;
const CREATE_TOPICS_V: i16 = 7;
const API_VERSIONS_V: i16 = 3;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

// ---------------------------------------------------------------------------------------------------
// Requests.

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// One RecordBatch v2 holding `values`, base offset 0.
pub(crate) fn batch(values: &[&str]) -> Vec<u8> {
    let ts = now_ms();
    let mut b = BatchBuilder::new(ts);
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        b.push(ts, Some(key.as_bytes()), Some(v.as_bytes()), &[]);
    }
    b.finish(0)
}

fn produce_req(topic: &str, partition: i32, records: Vec<u8>, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(records)))])])
}

fn fetch_req(
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
    min_bytes: i32,
) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

fn list_offsets_req(topic: &str, partition: i32, timestamp: i64) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(timestamp)])])
}

fn metadata_req(topics: &[&str]) -> MetadataRequest {
    MetadataRequest::default().with_topics(Some(
        topics
            .iter()
            .map(|t| MetadataRequestTopic::default().with_name(Some(name(t))))
            .collect(),
    ))
}

fn create_req(topic: &str, partitions: i32, replication_factor: i16) -> CreateTopicsRequest {
    CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)])
}

fn api_versions_req() -> ApiVersionsRequest {
    ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("kafka-raw-test"))
        .with_client_software_version(StrBytes::from_static_str("1.0"))
}

/// The one partition response of a single-partition Produce response.
fn only_partition(r: &ProduceResponse) -> &PartitionProduceResponse {
    assert_eq!(r.responses.len(), 1);
    assert_eq!(r.responses[0].partition_responses.len(), 1);
    &r.responses[0].partition_responses[0]
}

/// Creates a topic (through core 0) and asserts it worked.
pub(crate) fn create_topic(shoal: &Shoal, topic: &str, partitions: i32) {
    let mut s = connect(shoal.ports[0]);
    let r: CreateTopicsResponse = call(
        &mut s,
        ApiKey::CreateTopics,
        CREATE_TOPICS_V,
        1,
        &create_req(topic, partitions, 1),
    );
    assert_eq!(r.topics.len(), 1);
    assert_eq!(
        r.topics[0].error_code, NONE,
        "create {topic}: {:?}",
        r.topics[0].error_message
    );
}

/// The core leading a partition, from Metadata; checks the advertised port is that core's.
fn leader(shoal: &Shoal, topic: &str, partition: i32) -> usize {
    let mut s = connect(shoal.ports[0]);
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        METADATA_V,
        1,
        &metadata_req(&[topic]).with_allow_auto_topic_creation(false),
    );
    assert_eq!(r.topics.len(), 1);
    assert_eq!(r.topics[0].error_code, NONE, "metadata for {topic}");
    let p = r.topics[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)
        .unwrap_or_else(|| panic!("{topic}/{partition} not in metadata"));
    let id = p.leader_id.0;
    let broker = r
        .brokers
        .iter()
        .find(|b| b.node_id.0 == id)
        .expect("leader is a broker");
    let core = usize::try_from(id).expect("leader id is a core index");
    assert_eq!(
        broker.port,
        i32::from(shoal.ports[core]),
        "advertised port of core {core}"
    );
    core
}

/// ListOffsets (v7) on `port` for one partition: (error code, offset).
fn list_offset(port: u16, topic: &str, partition: i32, timestamp: i64) -> (i16, i64) {
    let mut s = connect(port);
    let r: ListOffsetsResponse = call(
        &mut s,
        ApiKey::ListOffsets,
        LIST_OFFSETS_V,
        7,
        &list_offsets_req(topic, partition, timestamp),
    );
    let p = &r.topics[0].partitions[0];
    (p.error_code, p.offset)
}

pub(crate) fn produce(
    port: u16,
    topic: &str,
    partition: i32,
    records: Vec<u8>,
) -> PartitionProduceResponse {
    let mut s = connect(port);
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        PRODUCE_V,
        3,
        &produce_req(topic, partition, records, 1),
    );
    only_partition(&r).clone()
}

/// Sorted (key, min, max) triples.
fn ranges(keys: &[ApiVersion]) -> Vec<(i16, i16, i16)> {
    let mut v: Vec<_> = keys
        .iter()
        .map(|k| (k.api_key, k.min_version, k.max_version))
        .collect();
    v.sort_unstable();
    v
}

fn expected_ranges() -> Vec<(i16, i16, i16)> {
    let mut v = vec![
        (ApiKey::Produce as i16, 3, 13),
        (ApiKey::Fetch as i16, 4, 18),
        (ApiKey::ListOffsets as i16, 1, 10),
        (ApiKey::Metadata as i16, 0, 13),
        (ApiKey::ApiVersions as i16, 0, 3),
        (ApiKey::CreateTopics as i16, 2, 7),
        (ApiKey::CreatePartitions as i16, 0, 3),
        (ApiKey::DescribeConfigs as i16, 1, 4),
        (ApiKey::AlterConfigs as i16, 0, 2),
        (ApiKey::IncrementalAlterConfigs as i16, 0, 1),
        (ApiKey::DeleteTopics as i16, 1, 6),
        (ApiKey::DeleteRecords as i16, 0, 2),
        (ApiKey::InitProducerId as i16, 0, 5),
        (ApiKey::FindCoordinator as i16, 0, 4),
        (ApiKey::JoinGroup as i16, 0, 9),
        (ApiKey::SyncGroup as i16, 0, 5),
        (ApiKey::Heartbeat as i16, 0, 4),
        (ApiKey::LeaveGroup as i16, 0, 5),
        (ApiKey::OffsetCommit as i16, 2, 9),
        (ApiKey::OffsetFetch as i16, 1, 9),
        (ApiKey::OffsetDelete as i16, 0, 0),
        (ApiKey::ListGroups as i16, 0, 5),
        (ApiKey::DescribeGroups as i16, 0, 5),
        (ApiKey::DeleteGroups as i16, 0, 2),
        (ApiKey::DescribeLogDirs as i16, 1, 4),
        (ApiKey::SaslHandshake as i16, 0, 1),
        (ApiKey::SaslAuthenticate as i16, 0, 2),
        (ApiKey::CreateAcls as i16, 1, 3),
        (ApiKey::DescribeAcls as i16, 1, 3),
        (ApiKey::DeleteAcls as i16, 1, 3),
        (ApiKey::DescribeUserScramCredentials as i16, 0, 0),
        (ApiKey::AlterUserScramCredentials as i16, 0, 0),
        (ApiKey::TxnOffsetCommit as i16, 0, 3),
        (ApiKey::AddPartitionsToTxn as i16, 0, 3),
        (ApiKey::AddOffsetsToTxn as i16, 0, 4),
        (ApiKey::EndTxn as i16, 0, 4),
        (ApiKey::DescribeTransactions as i16, 0, 0),
        (ApiKey::ListTransactions as i16, 0, 1),
        (ApiKey::ConsumerGroupHeartbeat as i16, 0, 1),
        (ApiKey::ConsumerGroupDescribe as i16, 0, 1),
    ];
    v.sort_unstable();
    v
}

/// ApiVersions (v3) works on `s`.
fn api_versions_ok(s: &mut TcpStream, correlation: i32) {
    let r: ApiVersionsResponse = call(
        s,
        ApiKey::ApiVersions,
        API_VERSIONS_V,
        correlation,
        &api_versions_req(),
    );
    assert_eq!(r.error_code, NONE);
    assert_eq!(ranges(&r.api_keys), expected_ranges());
}

// ---------------------------------------------------------------------------------------------------
// 1. ApiVersions.

#[test]
fn api_versions_every_version_and_kip511_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let mut s = connect(shoal.ports[0]);
    for version in 0..=3 {
        let r: ApiVersionsResponse = call(
            &mut s,
            ApiKey::ApiVersions,
            version,
            100 + i32::from(version),
            &api_versions_req(),
        );
        assert_eq!(r.error_code, NONE, "v{version}");
        assert_eq!(ranges(&r.api_keys), expected_ranges(), "v{version}");
    }

    // v4 is not served: KIP-511 says answer in v0 with UNSUPPORTED_VERSION and the ranges.
    send(&mut s, ApiKey::ApiVersions, 4, 104, &api_versions_req());
    let frame = recv(&mut s).expect("a KIP-511 response, not a closed connection");
    let r: ApiVersionsResponse = decode(ApiKey::ApiVersions, 0, 104, frame);
    assert_eq!(r.error_code, UNSUPPORTED_VERSION);
    assert_eq!(ranges(&r.api_keys), expected_ranges());

    // A version newer than any this side knows, with the flexible header a new client sends, and
    // a negative version: the same fallback.
    for (version, flexible, correlation) in [(5i16, true, 107), (-1, false, 108)] {
        s.write_all(&raw_frame(18, version, correlation, flexible, &[0, 0, 0]))
            .unwrap();
        let frame = recv(&mut s).unwrap_or_else(|| panic!("ApiVersions v{version}: closed"));
        let r: ApiVersionsResponse = decode(ApiKey::ApiVersions, 0, correlation, frame);
        assert_eq!(r.error_code, UNSUPPORTED_VERSION, "v{version}");
        assert_eq!(ranges(&r.api_keys), expected_ranges(), "v{version}");
    }

    // The same connection stays usable: the client retries with a version we serve.
    api_versions_ok(&mut s, 105);
    let r: MetadataResponse = call(&mut s, ApiKey::Metadata, 1, 106, &metadata_req(&[]));
    assert_eq!(r.brokers.len(), 1);
    drop(s);
    shoal.stop();
}

/// What the broker advertises in ApiVersions v3: (API, min, max), in its order. An API key
/// kafka-protocol does not know fails: no request for it could be built.
fn advertised(s: &mut TcpStream) -> Vec<(ApiKey, i16, i16)> {
    let r: ApiVersionsResponse = call(
        s,
        ApiKey::ApiVersions,
        API_VERSIONS_V,
        0,
        &api_versions_req(),
    );
    assert_eq!(r.error_code, NONE);
    r.api_keys
        .iter()
        .map(|k| {
            let key = ApiKey::try_from(k.api_key).unwrap_or_else(|_| {
                panic!(
                    "advertised API key {}: unknown to kafka-protocol",
                    k.api_key
                )
            });
            (key, k.min_version, k.max_version)
        })
        .collect()
}

/// The versions of `key` in `apis`; panics if it is not advertised.
fn versions(apis: &[(ApiKey, i16, i16)], key: ApiKey) -> std::ops::RangeInclusive<i16> {
    let (_, min, max) = apis
        .iter()
        .find(|(k, _, _)| *k == key)
        .unwrap_or_else(|| panic!("{key:?} is not advertised"));
    *min..=*max
}

/// Sends `request` (a whole frame of `key` at `version`) and reads its answer: a frame with the
/// request's correlation id whose body decodes as `key`'s response at `version`; otherwise what
/// went wrong, naming the API and version. The socket's timeouts (`wire::connect`) bound the wait.
fn answer(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    correlation: i32,
    request: &[u8],
) -> Result<Bytes, String> {
    let what = format!("{key:?} v{version}");
    s.write_all(request)
        .map_err(|e| format!("{what}: the request could not be written: {e}"))?;
    let frame = match shoal::wire::frame::read_blocking(s, i32::MAX as usize) {
        Ok(frame) => frame,
        Err(shoal::wire::frame::FrameError::Eof) => {
            return Err(format!("{what}: the connection closed without an answer"))
        }
        Err(e) => return Err(format!("{what}: no answer: {e}")),
    };
    let answered = frame
        .get(..4)
        .map(|b| i32::from_be_bytes(b.try_into().unwrap()));
    if answered != Some(correlation) {
        return Err(format!(
            "{what}: answered with correlation id {answered:?}, not {correlation}"
        ));
    }
    common::wire::decode_any_response(key, version, frame.clone())
        .map_err(|e| format!("{what}: the answer does not decode as its response: {e}"))?;
    Ok(frame)
}

/// Every version of every API the broker advertises in ApiVersions is answered: for each, a
/// sensible request (`kafka_raw/walk.rs`) gets one frame back with its correlation id, which
/// decodes as that API's response at that version (error codes allowed: a version served is one
/// answered in its own format). The ranges are the broker's own, so a version added is walked
/// too; one advertised but not served (the connection closed, no answer, another correlation id,
/// a body that does not decode) fails with the API and version. ListOffsets v1-v3 are among them:
/// `leader_epoch` is a v4+ field, and setting it once took a core down. The SASL listener's
/// exchange is walked there, before authentication.
#[test]
fn every_advertised_version_answers() {
    let dir = tempfile::tempdir().unwrap();
    common::add_user(dir.path(), walk::USER, walk::PASSWORD);
    let shoal = Shoal::start(
        dir.path(),
        1,
        &[
            "--listener",
            "PLAINTEXT://127.0.0.1:0",
            "--listener",
            "SASL_PLAINTEXT://127.0.0.1:0",
            "--sasl-mechanisms",
            "PLAIN",
            "--group-initial-rebalance-delay-ms",
            "0",
        ],
    );
    let names: Vec<&str> = shoal.listeners.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["PLAINTEXT", "SASL_PLAINTEXT"]);
    let (plain, sasl) = (shoal.listeners[0].1[0], shoal.listeners[1].1[0]);
    let mut s = connect(plain);
    let apis = advertised(&mut s);
    let walk = walk::Walk::prepare(plain);
    let mut failures = Vec::new();
    let mut correlation = 0;
    let mut answered = 0;
    for &(key, min, max) in &apis {
        for version in min..=max {
            correlation += 1;
            let Some(request) = walk.request(key, version, correlation) else {
                failures.push(format!(
                    "{key:?} v{version}: advertised, and kafka_raw/walk.rs has no request for it"
                ));
                continue;
            };
            match answer(&mut s, key, version, correlation, &request) {
                Ok(_) => answered += 1,
                Err(why) => {
                    failures.push(why);
                    s = connect(plain);
                }
            }
        }
    }
    failures.extend(sasl_exchange_at_every_version(sasl, &apis));
    assert!(
        failures.is_empty(),
        "{} of the advertised versions are not answered:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let total: usize = apis.iter().map(|(_, a, b)| (b - a + 1) as usize).sum();
    assert_eq!(answered, total);
    drop(s);
    shoal.stop();
}

/// On a SASL listener, what a client sends before it is authenticated, at every advertised
/// version: ApiVersions; SaslHandshake naming PLAIN, which is offered; SaslAuthenticate with the
/// right PLAIN token after a handshake, which authenticates (a Metadata is answered after it).
/// Each handshake on a connection of its own (one per connection is the protocol). Returns what
/// failed.
fn sasl_exchange_at_every_version(port: u16, apis: &[(ApiKey, i16, i16)]) -> Vec<String> {
    use kafka_protocol::messages::{
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse,
    };
    use shoal::wire::header::decode_response;
    let handshake = |s: &mut TcpStream, version: i16| -> Result<(), String> {
        let req =
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"));
        let key = ApiKey::SaslHandshake;
        let frame = answer(s, key, version, 1, &request_frame(key, version, 1, &req))?;
        let r: SaslHandshakeResponse = decode_response(key, version, 1, frame)?;
        match r.error_code {
            NONE => Ok(()),
            code => Err(format!("SaslHandshake v{version}: error {code}")),
        }
    };
    let authenticate = |version: i16| -> Result<(), String> {
        let mut s = connect(port);
        handshake(&mut s, *versions(apis, ApiKey::SaslHandshake).end())?;
        let req = SaslAuthenticateRequest::default().with_auth_bytes(walk::plain_token());
        let key = ApiKey::SaslAuthenticate;
        let frame = answer(
            &mut s,
            key,
            version,
            2,
            &request_frame(key, version, 2, &req),
        )?;
        let r: SaslAuthenticateResponse = decode_response(key, version, 2, frame)?;
        if r.error_code != NONE {
            return Err(format!(
                "SaslAuthenticate v{version}: error {} ({:?})",
                r.error_code, r.error_message
            ));
        }
        let key = ApiKey::Metadata;
        let req = request_frame(key, METADATA_V, 3, &metadata_req(&[]));
        answer(&mut s, key, METADATA_V, 3, &req)
            .map(drop)
            .map_err(|e| format!("after SaslAuthenticate v{version}: {e}"))
    };
    let mut failures = Vec::new();
    let mut s = connect(port);
    for version in versions(apis, ApiKey::ApiVersions) {
        let key = ApiKey::ApiVersions;
        let req = request_frame(key, version, 10 + i32::from(version), &api_versions_req());
        if let Err(e) = answer(&mut s, key, version, 10 + i32::from(version), &req) {
            failures.push(format!("SASL listener, before authentication: {e}"));
            s = connect(port);
        }
    }
    for version in versions(apis, ApiKey::SaslHandshake) {
        let done = handshake(&mut connect(port), version);
        failures.extend(done.err().map(|e| format!("SASL listener: {e}")));
    }
    // After SaslHandshake v0 the token travels as a bare frame, and the answer too (empty for
    // PLAIN), as old clients expect.
    let legacy = || -> Result<(), String> {
        let mut s = connect(port);
        handshake(&mut s, 0)?;
        let token = walk::plain_token();
        let mut frame = (token.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&token);
        s.write_all(&frame).map_err(|e| e.to_string())?;
        let mut size = [0u8; 4];
        std::io::Read::read_exact(&mut s, &mut size)
            .map_err(|e| format!("no answer to the v0 token: {e}"))?;
        if size != [0; 4] {
            return Err(format!("the v0 PLAIN answer is {size:?}, not empty"));
        }
        let key = ApiKey::Metadata;
        let req = request_frame(key, METADATA_V, 3, &metadata_req(&[]));
        answer(&mut s, key, METADATA_V, 3, &req)
            .map(drop)
            .map_err(|e| format!("after a SaslHandshake v0 exchange: {e}"))
    };
    failures.extend(legacy().err().map(|e| format!("SASL listener: {e}")));
    for version in versions(apis, ApiKey::SaslAuthenticate) {
        let done = authenticate(version);
        failures.extend(done.err().map(|e| format!("SASL listener: {e}")));
    }
    failures
}

/// The topic and data-path APIs do their work at every version the broker advertises: CreateTopics
/// creates, Produce appends (by topic id from v13) at the offsets expected, ListOffsets finds them
/// (every special timestamp), Metadata and Fetch (by id from v13) see the topic and its records,
/// InitProducerId hands out ids, DeleteTopics deletes.
#[test]
fn topic_and_data_apis_do_their_work_at_every_advertised_version() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use kafka_protocol::messages::{
        DeleteTopicsRequest, DeleteTopicsResponse, InitProducerIdRequest, InitProducerIdResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut shoal = Shoal::start(dir.path(), 1, &[]);
    let mut s = connect(shoal.ports[0]);
    let apis = advertised(&mut s);
    let mut c = 0;
    let mut next = || {
        c += 1;
        c
    };
    for v in versions(&apis, ApiKey::CreateTopics) {
        let r: CreateTopicsResponse = call(
            &mut s,
            ApiKey::CreateTopics,
            v,
            next(),
            &create_req(&format!("ct{v}"), 1, 1),
        );
        assert_eq!(
            r.topics[0].error_code, NONE,
            "CreateTopics v{v}: {:?}",
            r.topics[0].error_message
        );
        assert_eq!(leader(&shoal, &format!("ct{v}"), 0), 0, "CreateTopics v{v}");
    }
    create_topic(&shoal, "data", 1);
    // Produce v13 and Fetch v13+ name the topic by id.
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        METADATA_V,
        next(),
        &metadata_req(&["data"]),
    );
    let id = r.topics[0].topic_id;
    assert!(!id.is_nil());
    let mut produced = 0;
    for v in versions(&apis, ApiKey::Produce) {
        let mut req = produce_req("data", 0, batch(&["x", "y"]), 1);
        req.topic_data[0].topic_id = id;
        let r: ProduceResponse = call(&mut s, ApiKey::Produce, v, next(), &req);
        let p = only_partition(&r);
        assert_eq!(
            (p.error_code, p.base_offset),
            (NONE, produced),
            "Produce v{v}"
        );
        produced += 2;
    }
    for v in versions(&apis, ApiKey::ListOffsets) {
        for (ts, want) in [(-1, produced), (-2, 0), (0, 0), (-4, 0), (-5, -1)] {
            let c = next();
            send(
                &mut s,
                ApiKey::ListOffsets,
                v,
                c,
                &list_offsets_req("data", 0, ts),
            );
            let f = recv(&mut s).unwrap_or_else(|| {
                panic!(
                    "ListOffsets v{v} timestamp {ts}: connection closed (server running: {})",
                    shoal.is_running()
                )
            });
            let r: ListOffsetsResponse = decode(ApiKey::ListOffsets, v, c, f);
            let p = &r.topics[0].partitions[0];
            assert_eq!(
                (p.error_code, p.offset),
                (NONE, want),
                "ListOffsets v{v} timestamp {ts}"
            );
        }
    }
    for v in versions(&apis, ApiKey::Metadata) {
        let r: MetadataResponse = call(
            &mut s,
            ApiKey::Metadata,
            v,
            next(),
            &metadata_req(&["data"]),
        );
        assert_eq!(r.topics[0].error_code, NONE, "Metadata v{v}");
        assert_eq!(r.topics[0].partitions.len(), 1, "Metadata v{v}");
    }
    for v in versions(&apis, ApiKey::Fetch) {
        let mut req = fetch_req("data", 0, 0, 0, 1);
        req.topics[0].topic_id = id;
        let r: FetchResponse = call(&mut s, ApiKey::Fetch, v, next(), &req);
        let p = &r.responses[0].partitions[0];
        assert_eq!(
            (p.error_code, p.high_watermark),
            (NONE, produced),
            "Fetch v{v}"
        );
        assert!(
            p.records.as_ref().is_some_and(|r| !r.is_empty()),
            "Fetch v{v}"
        );
    }
    for v in versions(&apis, ApiKey::InitProducerId) {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000);
        let r: InitProducerIdResponse = call(&mut s, ApiKey::InitProducerId, v, next(), &req);
        assert_eq!(r.error_code, NONE, "InitProducerId v{v}");
        assert!(r.producer_id.0 >= 0, "InitProducerId v{v}");
    }
    for v in versions(&apis, ApiKey::DeleteTopics) {
        let topic = format!("dt{v}");
        create_topic(&shoal, &topic, 1);
        let req = DeleteTopicsRequest::default().with_timeout_ms(10_000);
        let req = if v >= 6 {
            req.with_topics(vec![
                DeleteTopicState::default().with_name(Some(name(&topic)))
            ])
        } else {
            req.with_topic_names(vec![name(&topic)])
        };
        let r: DeleteTopicsResponse = call(&mut s, ApiKey::DeleteTopics, v, next(), &req);
        assert_eq!(r.responses[0].error_code, NONE, "DeleteTopics v{v}");
        let r: MetadataResponse = call(
            &mut s,
            ApiKey::Metadata,
            METADATA_V,
            next(),
            &metadata_req(&[&topic]).with_allow_auto_topic_creation(false),
        );
        assert_eq!(
            r.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION,
            "DeleteTopics v{v}: {topic} is gone"
        );
    }
    drop(s);
    shoal.stop();
}

// ---------------------------------------------------------------------------------------------------
// 2. Pipelining.

#[derive(Debug, Clone, Copy)]
enum Pipelined {
    ApiVersions(i16),
    Metadata(i16),
    Create(&'static str, i16),
    Produce(usize),
    ListOffsets,
}

#[test]
fn pipelined_requests_answer_in_order() {
    use Pipelined::*;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "pipe", 1);
    let lead = leader(&shoal, "pipe", 0);
    let plan = [
        ApiVersions(3),
        Metadata(12),
        Create("pipe-b", 0),
        Produce(0),
        Produce(1),
        ListOffsets,
        Produce(2),
        ApiVersions(0),
        Produce(3),
        Metadata(1),
        Produce(4),
        Create("pipe", TOPIC_ALREADY_EXISTS),
        Produce(5),
        ListOffsets,
        Produce(6),
        Produce(7),
        ApiVersions(3),
        Produce(8),
        ListOffsets,
        Metadata(12),
    ];
    assert_eq!(plan.len(), 20);
    let produced = plan.iter().filter(|p| matches!(p, Produce(_))).count() as i64;
    let correlation = |i: usize| 5000 + 13 * i as i32;

    let mut s = connect(shoal.ports[lead]);
    let mut wire = Vec::new();
    for (i, p) in plan.iter().enumerate() {
        let c = correlation(i);
        wire.extend(match *p {
            ApiVersions(v) => request_frame(ApiKey::ApiVersions, v, c, &api_versions_req()),
            Metadata(v) => request_frame(ApiKey::Metadata, v, c, &metadata_req(&["pipe"])),
            Create(t, _) => request_frame(
                ApiKey::CreateTopics,
                CREATE_TOPICS_V,
                c,
                &create_req(t, 1, 1),
            ),
            Produce(n) => request_frame(
                ApiKey::Produce,
                PRODUCE_V,
                c,
                &produce_req("pipe", 0, batch(&[&format!("value-{n}")]), 1),
            ),
            ListOffsets => request_frame(
                ApiKey::ListOffsets,
                LIST_OFFSETS_V,
                c,
                &list_offsets_req("pipe", 0, -1),
            ),
        });
    }
    // All 20 requests in one write, before reading anything.
    s.write_all(&wire).unwrap();

    for (i, p) in plan.iter().enumerate() {
        let c = correlation(i);
        let frame =
            recv(&mut s).unwrap_or_else(|| panic!("response {i} ({p:?}): connection closed"));
        let got = i32::from_be_bytes(frame[..4].try_into().unwrap());
        assert_eq!(got, c, "response {i} ({p:?}) out of order");
        match *p {
            ApiVersions(v) => {
                let r: ApiVersionsResponse = decode(ApiKey::ApiVersions, v, c, frame);
                assert_eq!(r.error_code, NONE);
                assert_eq!(ranges(&r.api_keys), expected_ranges());
            }
            Metadata(v) => {
                let r: MetadataResponse = decode(ApiKey::Metadata, v, c, frame);
                assert_eq!(r.brokers.len(), 2);
                assert_eq!(r.topics.len(), 1);
                assert_eq!(r.topics[0].error_code, NONE);
                assert_eq!(r.topics[0].partitions[0].leader_id.0, lead as i32);
            }
            Create(t, want) => {
                let r: CreateTopicsResponse =
                    decode(ApiKey::CreateTopics, CREATE_TOPICS_V, c, frame);
                assert_eq!(r.topics.len(), 1);
                assert_eq!(r.topics[0].name.0.as_str(), t);
                assert_eq!(r.topics[0].error_code, want, "create {t}");
            }
            Produce(n) => {
                let r: ProduceResponse = decode(ApiKey::Produce, PRODUCE_V, c, frame);
                let part = only_partition(&r);
                assert_eq!(part.error_code, NONE, "produce {n}");
                // Pipelined produces are appended in request order.
                assert_eq!(part.base_offset, n as i64, "produce {n}");
            }
            ListOffsets => {
                let r: ListOffsetsResponse = decode(ApiKey::ListOffsets, LIST_OFFSETS_V, c, frame);
                let part = &r.topics[0].partitions[0];
                assert_eq!(part.error_code, NONE);
                assert!((0..=produced).contains(&part.offset), "{}", part.offset);
            }
        }
    }
    assert_eq!(
        list_offset(shoal.ports[lead], "pipe", 0, -1),
        (NONE, produced)
    );
    // pipe-b was created by the pipelined CreateTopics.
    leader(&shoal, "pipe-b", 0);
    drop(s);
    shoal.stop();
}

/// Far more pipelined requests than the server handles at once: it stops reading while responses
/// drain, and still answers every one, in order.
#[test]
fn deep_pipeline_beyond_the_in_flight_limit() {
    const N: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "deep", 1);
    let port = shoal.ports[leader(&shoal, "deep", 0)];
    let mut s = connect(port);
    let mut wire = Vec::new();
    for i in 0..N {
        wire.extend(if i % 2 == 0 {
            let v = format!("deep-{i}");
            request_frame(
                ApiKey::Produce,
                PRODUCE_V,
                i as i32,
                &produce_req("deep", 0, batch(&[&v]), 1),
            )
        } else {
            request_frame(
                ApiKey::ApiVersions,
                API_VERSIONS_V,
                i as i32,
                &api_versions_req(),
            )
        });
    }
    // Written by another thread, so neither side's socket buffers can deadlock the test.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&wire));
    for i in 0..N {
        let f = recv(&mut s).unwrap_or_else(|| panic!("response {i}: connection closed"));
        if i % 2 == 0 {
            let r: ProduceResponse = decode(ApiKey::Produce, PRODUCE_V, i as i32, f);
            let p = only_partition(&r);
            assert_eq!(
                (p.error_code, p.base_offset),
                (NONE, i as i64 / 2),
                "produce {i}"
            );
        } else {
            let r: ApiVersionsResponse = decode(ApiKey::ApiVersions, API_VERSIONS_V, i as i32, f);
            assert_eq!(r.error_code, NONE);
        }
    }
    writer.join().unwrap().unwrap();
    assert_eq!(list_offset(port, "deep", 0, -1), (NONE, N as i64 / 2));
    drop(s);
    shoal.stop();
}

/// Pipelined produce requests answered by one group write go back in one write to the socket, not
/// one each (`shoal_response_writes_total`), in order and each with its own offset.
#[test]
fn pipelined_replies_that_are_ready_together_go_out_in_one_write() {
    const N: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "together", 1);
    let mut s = connect(shoal.ports[leader(&shoal, "together", 0)]);
    // Settle the connection's first request (and the metric) before the pipelined ones.
    s.write_all(&request_frame(
        ApiKey::ApiVersions,
        API_VERSIONS_V,
        1,
        &api_versions_req(),
    ))
    .unwrap();
    recv(&mut s).unwrap();
    let before = shoal.metric("shoal_response_writes_total");
    let mut wire = Vec::new();
    for i in 0..N {
        let v = format!("together-{i}");
        wire.extend(request_frame(
            ApiKey::Produce,
            PRODUCE_V,
            100 + i as i32,
            &produce_req("together", 0, batch(&[&v]), 1),
        ));
    }
    s.write_all(&wire).unwrap();
    for i in 0..N {
        let f = recv(&mut s).unwrap_or_else(|| panic!("response {i}: connection closed"));
        let r: ProduceResponse = decode(ApiKey::Produce, PRODUCE_V, 100 + i as i32, f);
        let p = only_partition(&r);
        assert_eq!(
            (p.error_code, p.base_offset),
            (NONE, i as i64),
            "produce {i}"
        );
    }
    let writes = shoal.metric("shoal_response_writes_total") - before;
    // One group write answers them all: one write, or two should the first append be written
    // alone before the others were queued.
    assert!(
        (1..=2).contains(&writes),
        "{N} pipelined replies took {writes} writes"
    );
    drop(s);
    shoal.stop();
}

// ---------------------------------------------------------------------------------------------------
// 3. Bad input closes only its own connection.

/// Deterministic garbage (xorshift64*).
fn garbage(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// The bad inputs: a name and the bytes written on a fresh connection.
fn bad_inputs() -> Vec<(&'static str, Vec<u8>)> {
    // A Produce body valid at v3, sent as v2.
    let mut produce_body = BytesMut::new();
    produce_req("t", 0, batch(&["x"]), 1)
        .encode(&mut produce_body, 3)
        .unwrap();
    // A Fetch body valid at v18 (the newest served), sent as v19.
    let mut fetch_body = BytesMut::new();
    fetch_req("t", 0, 0, 0, 0)
        .encode(&mut fetch_body, 18)
        .unwrap();
    // The start of a TLS 1.3 ClientHello: record header, handshake header, version, random, ...
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03,
    ];
    hello.extend(garbage(32, 0x7e5));
    hello.extend([0x00, 0x00, 0x04, 0x13, 0x01, 0x13, 0x02, 0x01, 0x00]);
    vec![
        // (a) 2^30 > --max-request-bytes, and no body at all.
        (
            "frame size 2^30 over the limit",
            (1i32 << 30).to_be_bytes().to_vec(),
        ),
        // (b) negative sizes.
        ("frame size -1", (-1i32).to_be_bytes().to_vec()),
        ("frame size i32::MIN", i32::MIN.to_be_bytes().to_vec()),
        // Sizes too small for a request header (api key, version, correlation id), body included.
        ("frame size 0", 0i32.to_be_bytes().to_vec()),
        (
            "frame size 7",
            [&7i32.to_be_bytes()[..], &[0, 18, 0, 0, 0, 0, 1]].concat(),
        ),
        // A request header whose client id claims more bytes than the frame has.
        (
            "truncated header",
            [
                &10i32.to_be_bytes()[..],
                &[0, 18, 0, 0, 0, 0, 0, 9, 0x7f, 0xff],
            ]
            .concat(),
        ),
        // (c) Metadata v1 whose topics array claims 5 topics, then nothing.
        (
            "truncated Metadata v1",
            raw_frame(3, 1, 11, false, &5i32.to_be_bytes()),
        ),
        // (d) garbage after valid headers (a non-flexible and a flexible one).
        (
            "garbage Produce v3 body",
            raw_frame(0, 3, 12, false, &garbage(64, 0x5eed)),
        ),
        (
            "garbage CreateTopics v7 body",
            raw_frame(19, 7, 13, true, &garbage(48, 0xfeed)),
        ),
        // (e) unknown API key.
        ("unknown API key 999", raw_frame(999, 0, 14, false, &[])),
        // (f) unsupported versions, with bodies that would be valid in a served version.
        ("Produce v2", raw_frame(0, 2, 15, false, &produce_body)),
        ("Fetch v19", raw_frame(1, 19, 16, true, &fetch_body)),
        // (g) allocation bombs: ~16-byte requests claiming 2^31-1 and 2^32-2 topics.
        (
            "Metadata v1 with 0x7fffffff topics",
            raw_frame(3, 1, 17, false, &0x7fff_ffffi32.to_be_bytes()),
        ),
        (
            "Metadata v9 with compact count 0xffffffff",
            raw_frame(3, 9, 18, true, &[0xff, 0xff, 0xff, 0xff, 0x0f]),
        ),
        // (h) TLS on the plaintext port.
        ("TLS ClientHello", hello),
    ]
}

#[test]
fn bad_input_closes_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut shoal = Shoal::start(dir.path(), 2, &["--max-request-bytes", "1048576"]);
    let cases = bad_inputs();
    // Unrelated connections opened before any bad input, one per core.
    let mut old: Vec<TcpStream> = shoal.ports.iter().map(|&p| connect(p)).collect();
    for s in &mut old {
        api_versions_ok(s, 1);
    }
    let mut correlation = 2;
    for (what, bytes) in &cases {
        for (core, &port) in shoal.ports.iter().enumerate() {
            let what = format!("{what} (core {core})");
            let mut s = connect(port);
            s.write_all(bytes).unwrap();
            expect_closed(&mut s, &what);
            correlation += 1;
            let mut fresh = connect(port);
            api_versions_ok(&mut fresh, correlation);
            for o in &mut old {
                api_versions_ok(o, correlation);
            }
        }
    }
    for core in 0..shoal.ports.len() {
        let label = format!("core=\"{core}\"");
        let errors = shoal.metric_with("shoal_protocol_errors_total", &label);
        assert_eq!(
            errors,
            cases.len() as u64,
            "protocol errors counted on core {core}"
        );
    }
    assert!(shoal.is_running());
    drop(old);
    shoal.stop();
}

/// A bad request closes its connection only after the responses to the requests before it.
#[test]
fn responses_before_a_bad_request_are_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &["--max-request-bytes", "1048576"]);
    create_topic(&shoal, "before", 1);
    let endings: [(&str, Vec<u8>); 3] = [
        ("frame size 2^30", (1i32 << 30).to_be_bytes().to_vec()),
        ("unknown API key", raw_frame(999, 0, 4, false, &[])),
        (
            "Metadata v1 bomb",
            raw_frame(3, 1, 4, false, &0x7fff_ffffi32.to_be_bytes()),
        ),
    ];
    for (round, (what, ending)) in endings.iter().enumerate() {
        let mut s = connect(shoal.ports[0]);
        let mut wire = request_frame(ApiKey::ApiVersions, API_VERSIONS_V, 1, &api_versions_req());
        let value = format!("round {round}");
        wire.extend(request_frame(
            ApiKey::Produce,
            PRODUCE_V,
            2,
            &produce_req("before", 0, batch(&[&value]), 1),
        ));
        wire.extend(request_frame(
            ApiKey::Fetch,
            FETCH_V,
            3,
            &fetch_req("before", 0, round as i64, 5000, 1),
        ));
        wire.extend(ending);
        s.write_all(&wire).unwrap();
        let f = recv(&mut s).unwrap_or_else(|| panic!("{what}: ApiVersions response"));
        let r: ApiVersionsResponse = decode(ApiKey::ApiVersions, API_VERSIONS_V, 1, f);
        assert_eq!(r.error_code, NONE);
        let f = recv(&mut s).unwrap_or_else(|| panic!("{what}: Produce response"));
        let r: ProduceResponse = decode(ApiKey::Produce, PRODUCE_V, 2, f);
        assert_eq!(only_partition(&r).base_offset, round as i64, "{what}");
        let f = recv(&mut s).unwrap_or_else(|| panic!("{what}: Fetch response"));
        let r: FetchResponse = decode(ApiKey::Fetch, FETCH_V, 3, f);
        let p = &r.responses[0].partitions[0];
        assert_eq!(
            (p.error_code, p.high_watermark),
            (NONE, round as i64 + 1),
            "{what}"
        );
        let records = p.records.as_ref().expect("records");
        assert!(
            records.windows(value.len()).any(|w| w == value.as_bytes()),
            "{what}"
        );
        expect_closed(&mut s, what);
    }
    shoal.stop();
}

// ---------------------------------------------------------------------------------------------------
// 4. Kafka error codes.

#[test]
fn create_topics_error_codes() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "exists", 1);
    // Through both cores: core 1 forwards to core 0.
    for (core, &port) in shoal.ports.iter().enumerate() {
        let mut s = connect(port);
        for bad in ["bad/name", "", ".."] {
            let r: CreateTopicsResponse = call(
                &mut s,
                ApiKey::CreateTopics,
                CREATE_TOPICS_V,
                1,
                &create_req(bad, 1, 1),
            );
            assert_eq!(r.topics[0].name.0.as_str(), bad);
            assert_eq!(
                r.topics[0].error_code, INVALID_TOPIC_EXCEPTION,
                "{bad:?} on core {core}"
            );
        }
        let r: CreateTopicsResponse = call(
            &mut s,
            ApiKey::CreateTopics,
            CREATE_TOPICS_V,
            2,
            &create_req(&format!("rf3-{core}"), 1, 3),
        );
        assert_eq!(r.topics[0].error_code, INVALID_REPLICATION_FACTOR);
        let r: CreateTopicsResponse = call(
            &mut s,
            ApiKey::CreateTopics,
            2, // oldest served version too
            3,
            &create_req("exists", 1, 1),
        );
        assert_eq!(r.topics[0].error_code, TOPIC_ALREADY_EXISTS);
    }
    // None of the refused topics exist.
    let mut s = connect(shoal.ports[0]);
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        METADATA_V,
        4,
        &MetadataRequest::default().with_topics(None),
    );
    let names: Vec<&str> = r
        .topics
        .iter()
        .map(|t| t.name.as_ref().unwrap().0.as_str())
        .collect();
    assert_eq!(names, ["exists"]);
    drop(s);
    shoal.stop();
}

#[test]
fn produce_error_codes() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "errs", 1);
    let lead = leader(&shoal, "errs", 0);
    let other = 1 - lead;
    let port = shoal.ports[lead];

    assert_eq!(
        produce(port, "no-such-topic", 0, batch(&["a"])).error_code,
        UNKNOWN_TOPIC_OR_PARTITION
    );
    assert_eq!(
        produce(port, "errs", 99, batch(&["a"])).error_code,
        UNKNOWN_TOPIC_OR_PARTITION
    );

    // One good record first, so "unchanged" is not just "still zero".
    let ok = produce(port, "errs", 0, batch(&["first"]));
    assert_eq!((ok.error_code, ok.base_offset), (NONE, 0));
    assert_eq!(list_offset(port, "errs", 0, -1), (NONE, 1));

    // Flip one byte under the CRC (offset 21 onwards).
    let good = batch(&["v1", "v2", "v3"]);
    for at in [21, 40, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        let r = produce(port, "errs", 0, bad);
        assert_eq!(r.error_code, CORRUPT_MESSAGE, "byte {at} flipped");
        assert_eq!(
            list_offset(port, "errs", 0, -1),
            (NONE, 1),
            "byte {at} flipped: nothing appended"
        );
    }

    // The core that does not lead the partition refuses produce and fetch.
    assert_eq!(
        produce(shoal.ports[other], "errs", 0, batch(&["a"])).error_code,
        NOT_LEADER_OR_FOLLOWER
    );
    let mut s = connect(shoal.ports[other]);
    let r: FetchResponse = call(
        &mut s,
        ApiKey::Fetch,
        FETCH_V,
        5,
        &fetch_req("errs", 0, 0, 0, 1),
    );
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, NOT_LEADER_OR_FOLLOWER);
    assert!(p.records.as_ref().is_none_or(Bytes::is_empty));
    assert_eq!(
        list_offset(shoal.ports[other], "errs", 0, -1).0,
        NOT_LEADER_OR_FOLLOWER
    );
    assert_eq!(list_offset(port, "errs", 0, -1), (NONE, 1));
    drop(s);
    shoal.stop();
}

/// A batch whose header lies about its records is refused with INVALID_RECORD, as Kafka refuses it,
/// even with its CRC recomputed, and nothing is appended: the record count of a one-record batch set
/// to 2^31-1 (which once advanced the partition by 2^31 offsets), counts one too high and one too
/// low, a record longer than the batch, and the same lie inside a compressed batch.
#[test]
fn produce_of_batches_lying_about_their_records_is_refused() {
    const INVALID_RECORD: i16 = 87;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "lies", 1);
    let port = shoal.ports[0];
    // Produce v3, acks=1, as an old client would send it.
    let produce_v3 = |records: Vec<u8>| -> PartitionProduceResponse {
        let mut s = connect(port);
        let r: ProduceResponse = call(
            &mut s,
            ApiKey::Produce,
            3,
            9,
            &produce_req("lies", 0, records, 1),
        );
        only_partition(&r).clone()
    };
    let ok = produce_v3(batch(&["first"]));
    assert_eq!((ok.error_code, ok.base_offset), (NONE, 0));

    // Rewrites a header field (count at 57, lastOffsetDelta at 23) and recomputes the CRC.
    let lie = |mut b: Vec<u8>, count: i32, last_offset_delta: i32| -> Vec<u8> {
        b[23..27].copy_from_slice(&last_offset_delta.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    };
    let mut long_record = batch(&["abc"]);
    long_record[61] = 0x7e; // the record's length varint: 63 bytes, past the batch's end
    let crc = crc32c::crc32c(&long_record[21..]);
    long_record[17..21].copy_from_slice(&crc.to_be_bytes());
    let compressed = shards::batch::compress_batch(&batch(&["a", "b"]), 3);
    let cases = [
        ("count 2^31-1", lie(batch(&["one"]), i32::MAX, i32::MAX - 1)),
        ("count one too high", lie(batch(&["a", "b"]), 3, 2)),
        ("count one too low", lie(batch(&["a", "b"]), 1, 0)),
        ("record longer than the batch", long_record),
        ("lz4 count one too high", lie(compressed.clone(), 3, 2)),
        ("lz4 count one too low", lie(compressed, 1, 0)),
    ];
    for (what, records) in cases {
        let r = produce_v3(records);
        assert_eq!(
            r.error_code, INVALID_RECORD,
            "{what}: {:?}",
            r.error_message
        );
        assert_eq!(
            list_offset(port, "lies", 0, -1),
            (NONE, 1),
            "{what}: the high watermark moved"
        );
    }
    let ok = produce_v3(batch(&["second"]));
    assert_eq!((ok.error_code, ok.base_offset), (NONE, 1));
    shoal.stop();
}

#[test]
fn fetch_returns_exact_batches_and_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "data", 1);
    let lead = leader(&shoal, "data", 0);
    let port = shoal.ports[lead];

    let a = batch(&["one", "two", "three"]);
    let b = batch(&["four", "five"]);
    assert_eq!(produce(port, "data", 0, a.clone()).base_offset, 0);
    assert_eq!(produce(port, "data", 0, b.clone()).base_offset, 3);
    // What the log holds: the same bytes with the base offset rewritten (outside the CRC).
    let mut want = a.clone();
    let mut b_stored = b.clone();
    b_stored[..8].copy_from_slice(&3i64.to_be_bytes());
    want.extend_from_slice(&b_stored);

    let mut s = connect(port);
    for (version, correlation) in [(12, 21), (4, 22)] {
        let r: FetchResponse = call(
            &mut s,
            ApiKey::Fetch,
            version,
            correlation,
            &fetch_req("data", 0, 0, 0, 1),
        );
        assert_eq!(r.responses.len(), 1);
        assert_eq!(r.responses[0].topic.0.as_str(), "data");
        let p = &r.responses[0].partitions[0];
        assert_eq!((p.error_code, p.high_watermark), (NONE, 5), "v{version}");
        assert_eq!(
            p.records.as_deref(),
            Some(&want[..]),
            "v{version}: record bytes"
        );
        // From the middle batch's offset: that batch only.
        let r: FetchResponse = call(
            &mut s,
            ApiKey::Fetch,
            version,
            correlation + 10,
            &fetch_req("data", 0, 3, 0, 1),
        );
        let p = &r.responses[0].partitions[0];
        assert_eq!(
            p.records.as_deref(),
            Some(&b_stored[..]),
            "v{version}: from offset 3"
        );
    }

    // Past the high watermark: OFFSET_OUT_OF_RANGE, as Kafka sends it: offsets -1, records empty
    // (tests/it/fetch_errors.rs checks every error at every version).
    for (version, offset) in [(12, 6), (4, 1000)] {
        let r: FetchResponse = call(
            &mut s,
            ApiKey::Fetch,
            version,
            30,
            &fetch_req("data", 0, offset, 0, 1),
        );
        let p = &r.responses[0].partitions[0];
        assert_eq!(
            (p.error_code, p.high_watermark),
            (OFFSET_OUT_OF_RANGE, -1),
            "v{version} offset {offset}"
        );
        assert_eq!(p.records, Some(Bytes::new()), "v{version}: empty, not null");
    }
    drop(s);
    shoal.stop();
}

#[test]
fn fetch_waits_max_wait_on_an_empty_partition() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "empty", 1);
    let port = shoal.ports[leader(&shoal, "empty", 0)];
    let mut s = connect(port);
    let start = Instant::now();
    let r: FetchResponse = call(
        &mut s,
        ApiKey::Fetch,
        FETCH_V,
        40,
        &fetch_req("empty", 0, 0, 300, 1),
    );
    let took = start.elapsed();
    assert!(
        (Duration::from_millis(250)..Duration::from_secs(5)).contains(&took),
        "an empty fetch with max_wait_ms 300 took {took:?}"
    );
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (NONE, 0));
    assert!(
        p.records.as_ref().is_none_or(Bytes::is_empty),
        "{:?}",
        p.records
    );
    drop(s);
    shoal.stop();
}

#[test]
fn long_poll_fetch_is_woken_by_a_produce() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "wake", 1);
    let port = shoal.ports[leader(&shoal, "wake", 0)];
    let records = batch(&["wake up"]);

    let mut s = connect(port);
    let start = Instant::now();
    send(
        &mut s,
        ApiKey::Fetch,
        FETCH_V,
        50,
        &fetch_req("wake", 0, 0, 10_000, 1),
    );
    let producer = {
        let records = records.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            produce(port, "wake", 0, records)
        })
    };
    let frame = recv(&mut s).expect("fetch response");
    let took = start.elapsed();
    let r: FetchResponse = decode(ApiKey::Fetch, FETCH_V, 50, frame);
    let produced = producer.join().unwrap();
    assert_eq!((produced.error_code, produced.base_offset), (NONE, 0));
    assert!(
        (Duration::from_millis(150)..Duration::from_secs(3)).contains(&took),
        "the long poll answered after {took:?}"
    );
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (NONE, 1));
    assert_eq!(p.records.as_deref(), Some(&records[..]));
    drop(s);
    shoal.stop();
}

/// A long poll over several partitions wakes when any one of them gets data (here the last), and
/// answers every partition with its own watermark.
#[test]
fn a_long_poll_over_three_partitions_is_woken_by_a_produce_to_any() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "wake3", 3);
    let port = shoal.ports[0];
    let records = batch(&["the third"]);
    let mut req = fetch_req("wake3", 0, 0, 10_000, 1);
    let partition = req.topics[0].partitions[0].clone();
    for p in [1, 2] {
        req.topics[0]
            .partitions
            .push(partition.clone().with_partition(p));
    }
    let mut s = connect(port);
    let start = Instant::now();
    send(&mut s, ApiKey::Fetch, FETCH_V, 51, &req);
    let producer = {
        let records = records.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            produce(port, "wake3", 2, records)
        })
    };
    let frame = recv(&mut s).expect("fetch response");
    let took = start.elapsed();
    let r: FetchResponse = decode(ApiKey::Fetch, FETCH_V, 51, frame);
    assert_eq!(producer.join().unwrap().error_code, NONE);
    assert!(
        (Duration::from_millis(150)..Duration::from_secs(3)).contains(&took),
        "the long poll answered after {took:?}"
    );
    let parts = &r.responses[0].partitions;
    let watermarks: Vec<_> = parts
        .iter()
        .map(|p| (p.partition_index, p.error_code, p.high_watermark))
        .collect();
    assert_eq!(watermarks, [(0, NONE, 0), (1, NONE, 0), (2, NONE, 1)]);
    assert_eq!(parts[2].records.as_deref(), Some(&records[..]));
    drop(s);
    shoal.stop();
}

/// Responses go out in request order even when the first request is the slowest and the later ones
/// run in other task queues: a long-poll Fetch pipelined before ApiVersions, Metadata and the
/// Produce that wakes it is answered first, with the produced record.
#[test]
fn a_long_poll_pipelined_before_faster_requests_is_answered_first() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "turns", 1);
    let records = batch(&["after the long poll"]);
    let mut wire = request_frame(
        ApiKey::Fetch,
        FETCH_V,
        1,
        &fetch_req("turns", 0, 0, 2_000, 1),
    );
    wire.extend(request_frame(
        ApiKey::ApiVersions,
        API_VERSIONS_V,
        2,
        &api_versions_req(),
    ));
    wire.extend(request_frame(
        ApiKey::Metadata,
        METADATA_V,
        3,
        &metadata_req(&["turns"]),
    ));
    wire.extend(request_frame(
        ApiKey::Produce,
        PRODUCE_V,
        4,
        &produce_req("turns", 0, records.clone(), 1),
    ));
    let mut s = connect(shoal.ports[0]);
    s.write_all(&wire).unwrap();
    let r: FetchResponse = decode(ApiKey::Fetch, FETCH_V, 1, recv(&mut s).expect("fetch"));
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (NONE, 1));
    assert_eq!(p.records.as_deref(), Some(&records[..]));
    let r: ApiVersionsResponse = decode(
        ApiKey::ApiVersions,
        API_VERSIONS_V,
        2,
        recv(&mut s).expect("api versions"),
    );
    assert_eq!(r.error_code, NONE);
    let r: MetadataResponse = decode(
        ApiKey::Metadata,
        METADATA_V,
        3,
        recv(&mut s).expect("metadata"),
    );
    assert_eq!(r.topics[0].error_code, NONE);
    let r: ProduceResponse = decode(
        ApiKey::Produce,
        PRODUCE_V,
        4,
        recv(&mut s).expect("produce"),
    );
    assert_eq!(only_partition(&r).base_offset, 0);
    drop(s);
    shoal.stop();
}

/// Fetch pacing engages on a busy core (here: any core busier than 1%) and loses nothing: a
/// consumer long-polling the tail of a partition under a steady producer reads every record, in
/// order; with pacing off, no fetch is paced.
#[test]
fn fetch_pacing_holds_fetches_on_a_busy_core_and_loses_nothing() {
    for (flags, paced) in [
        (&["--fetch-pacing-target-busy-percent", "1"][..], true),
        (&["--fetch-pacing-max-ms", "0"][..], false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let shoal = Shoal::start(dir.path(), 1, flags);
        create_topic(&shoal, "paced", 1);
        let port = shoal.ports[0];
        const N: usize = 400;
        let producer = std::thread::spawn(move || {
            let mut s = connect(port);
            for i in 0..N {
                let v = format!("v{i}");
                let r: ProduceResponse = call(
                    &mut s,
                    ApiKey::Produce,
                    PRODUCE_V,
                    i as i32,
                    &produce_req("paced", 0, batch(&[&v]), 1),
                );
                assert_eq!(only_partition(&r).error_code, NONE);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let mut s = connect(port);
        let mut values = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while values.len() < N && Instant::now() < deadline {
            let offset = values.len() as i64;
            let r: FetchResponse = call(
                &mut s,
                ApiKey::Fetch,
                FETCH_V,
                7,
                &fetch_req("paced", 0, offset, 500, 1),
            );
            let p = &r.responses[0].partitions[0];
            assert_eq!(p.error_code, NONE);
            values.extend(record_values(p.records.as_deref().unwrap_or_default()));
        }
        producer.join().unwrap();
        let expected: Vec<String> = (0..N).map(|i| format!("v{i}")).collect();
        assert_eq!(values, expected, "{flags:?}");
        let count = shoal.metric("shoal_fetch_paced_total");
        if paced {
            assert!(count > 0, "no fetch was paced on a core busier than 1%");
            assert!(shoal.metric("shoal_fetch_paced_microseconds_total") > 0);
        } else {
            assert_eq!(count, 0, "{flags:?}");
        }
        drop(s);
        shoal.stop();
    }
}

// ---------------------------------------------------------------------------------------------------
// 5. acks=0.

#[test]
fn acks_zero_produce_gets_no_response() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "fire", 1);
    let port = shoal.ports[leader(&shoal, "fire", 0)];
    let mut s = connect(port);
    let mut wire = request_frame(
        ApiKey::Produce,
        PRODUCE_V,
        60,
        &produce_req("fire", 0, batch(&["and forget"]), 0),
    );
    wire.extend(request_frame(
        ApiKey::ApiVersions,
        API_VERSIONS_V,
        61,
        &api_versions_req(),
    ));
    s.write_all(&wire).unwrap();
    let frame = recv(&mut s).expect("the ApiVersions response");
    let correlation = i32::from_be_bytes(frame[..4].try_into().unwrap());
    assert_eq!(
        correlation, 61,
        "the first response must be ApiVersions'; acks=0 is never answered"
    );
    let r: ApiVersionsResponse = decode(ApiKey::ApiVersions, API_VERSIONS_V, 61, frame);
    assert_eq!(r.error_code, NONE);
    assert_eq!(list_offset(port, "fire", 0, -1), (NONE, 1));
    // Still nothing else on the connection: another request gets the next frame.
    api_versions_ok(&mut s, 62);
    drop(s);
    shoal.stop();
}

/// One idempotent batch: producer `pid`, epoch 0, first sequence `seq`, `n` records.
fn idempotent_batch(pid: i64, seq: i32, n: usize) -> Vec<u8> {
    let ts = now_ms();
    let mut b = BatchBuilder::new(ts).producer(pid, 0, seq);
    for i in 0..n {
        b.push(ts, Some(format!("k{i}").as_bytes()), Some(b"v"), &[]);
    }
    b.finish(0)
}

/// Duplicates are acknowledged with their first offset and not appended again, gaps are refused, and
/// both still hold after a clean restart and after a crash (the state is rebuilt from the log).
#[test]
fn idempotent_producer_state_survives_restarts() {
    const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    let dir = tempfile::tempdir().unwrap();
    let pid = 4242;
    let check = |shoal: &Shoal, next_seq: i32, appended: i64| {
        let port = shoal.ports[leader(shoal, "idem", 0)];
        // The batch at sequence 0 again: a duplicate, answered with its original offset.
        let dup = produce(port, "idem", 0, idempotent_batch(pid, 0, 3));
        assert_eq!((dup.error_code, dup.base_offset), (NONE, 0));
        // A gap is refused.
        let gap = produce(port, "idem", 0, idempotent_batch(pid, next_seq + 5, 1));
        assert_eq!(gap.error_code, OUT_OF_ORDER_SEQUENCE_NUMBER);
        assert_eq!(
            list_offset(port, "idem", 0, -1),
            (NONE, appended),
            "nothing re-appended"
        );
    };
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "idem", 1);
    let port = shoal.ports[leader(&shoal, "idem", 0)];
    assert_eq!(
        produce(port, "idem", 0, idempotent_batch(pid, 0, 3)).base_offset,
        0
    );
    assert_eq!(
        produce(port, "idem", 0, idempotent_batch(pid, 3, 2)).base_offset,
        3
    );
    check(&shoal, 5, 5);
    shoal.stop(); // clean: the state is saved in a snapshot

    let shoal = Shoal::start(dir.path(), 2, &[]);
    check(&shoal, 5, 5);
    let port = shoal.ports[leader(&shoal, "idem", 0)];
    assert_eq!(
        produce(port, "idem", 0, idempotent_batch(pid, 5, 1)).base_offset,
        5
    );
    drop(shoal); // SIGTERM too, but then the snapshot is removed to mimic a crash
    let snapshot = dir.path().join("topics/idem/0/producers.snapshot");
    std::fs::remove_file(&snapshot).expect("a clean stop writes the snapshot");

    let shoal = Shoal::start(dir.path(), 2, &[]);
    check(&shoal, 6, 6);
    shoal.stop();
}

/// One request carrying sequences 0-4, 5-9 and then 20 of one producer is refused as a whole, and
/// leaves the producer's state as it was: its retry from sequence 0 is accepted.
#[test]
fn a_refused_produce_request_leaves_sequences_as_they_were() {
    const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "seqs", 1);
    let port = shoal.ports[leader(&shoal, "seqs", 0)];
    let pid = 77;
    let request = |parts: &[(i32, usize)]| -> Vec<u8> {
        parts
            .iter()
            .flat_map(|&(seq, n)| idempotent_batch(pid, seq, n))
            .collect()
    };
    let refused = produce(port, "seqs", 0, request(&[(0, 5), (5, 5), (20, 1)]));
    assert_eq!(refused.error_code, OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(
        list_offset(port, "seqs", 0, -1),
        (NONE, 0),
        "nothing appended"
    );
    // The producer retries the same batches without the bad one: accepted from sequence 0.
    let retry = produce(port, "seqs", 0, request(&[(0, 5), (5, 5)]));
    assert_eq!((retry.error_code, retry.base_offset), (NONE, 0));
    let next = produce(port, "seqs", 0, request(&[(10, 1)]));
    assert_eq!((next.error_code, next.base_offset), (NONE, 10));
    // The same for a producer already known: a refused request moves nothing.
    let refused = produce(port, "seqs", 0, request(&[(11, 2), (13, 2), (99, 1)]));
    assert_eq!(refused.error_code, OUT_OF_ORDER_SEQUENCE_NUMBER);
    let retry = produce(port, "seqs", 0, request(&[(11, 2)]));
    assert_eq!((retry.error_code, retry.base_offset), (NONE, 11));
    assert_eq!(list_offset(port, "seqs", 0, -1), (NONE, 13));
    shoal.stop();
}

/// Producer state is bounded per partition (the longest idle producer goes first) and expires; the
/// gauge counts what is kept, and a dropped producer stays dropped across a clean restart.
#[test]
fn producer_state_is_bounded_and_expires() {
    const UNKNOWN_PRODUCER_ID: i16 = 59;
    let dir = tempfile::tempdir().unwrap();
    let limit = ["--max-producers-per-partition", "2"];
    let shoal = Shoal::start(dir.path(), 1, &limit);
    create_topic(&shoal, "pids", 1);
    let port = shoal.ports[0];
    for pid in [10, 11, 12] {
        let r = produce(port, "pids", 0, idempotent_batch(pid, 0, 1));
        assert_eq!(r.error_code, NONE);
        std::thread::sleep(Duration::from_millis(5)); // distinct last-activity times
    }
    assert_eq!(shoal.metric_with("shoal_producer_ids", "core=\"0\""), 2);
    // 10 was the longest idle: forgotten, so its next sequence is unknown; 11 and 12 are kept.
    let r = produce(port, "pids", 0, idempotent_batch(10, 1, 1));
    assert_eq!(r.error_code, UNKNOWN_PRODUCER_ID);
    assert_eq!(
        produce(port, "pids", 0, idempotent_batch(11, 1, 1)).error_code,
        NONE
    );
    shoal.stop();

    let shoal = Shoal::start(dir.path(), 1, &limit);
    let port = shoal.ports[0];
    assert_eq!(shoal.metric("shoal_producer_ids"), 2);
    let r = produce(port, "pids", 0, idempotent_batch(10, 1, 1));
    assert_eq!(
        r.error_code, UNKNOWN_PRODUCER_ID,
        "still dropped after a restart"
    );
    assert_eq!(
        produce(port, "pids", 0, idempotent_batch(12, 1, 1)).error_code,
        NONE
    );
    shoal.stop();

    // Expiry: a producer idle longer than --producer-id-expiration-ms is forgotten.
    let shoal = Shoal::start(dir.path(), 1, &["--producer-id-expiration-ms", "300"]);
    let port = shoal.ports[0];
    let r = produce(port, "pids", 0, idempotent_batch(20, 0, 1));
    assert_eq!(r.error_code, NONE);
    assert!(shoal.metric("shoal_producer_ids") >= 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while shoal.metric("shoal_producer_ids") > 0 {
        assert!(Instant::now() < deadline, "producer state did not expire");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = produce(port, "pids", 0, idempotent_batch(20, 1, 1));
    assert_eq!(r.error_code, UNKNOWN_PRODUCER_ID);
    let r = produce(port, "pids", 0, idempotent_batch(20, 0, 1));
    assert_eq!(r.error_code, NONE, "a new sequence from 0 is accepted");
    shoal.stop();
}

/// acks=0 has no response to carry an error, so a refused produce closes the connection (as Kafka
/// does) and the producer refreshes its metadata instead of losing records silently.
#[test]
fn acks_zero_errors_close_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "quiet", 1);
    let wrong = 1 - leader(&shoal, "quiet", 0);
    let mut s = connect(shoal.ports[wrong]);
    send(
        &mut s,
        ApiKey::Produce,
        PRODUCE_V,
        1,
        &produce_req("quiet", 0, batch(&["x"]), 0),
    );
    expect_closed(&mut s, "acks=0 produce to the wrong core");
    let mut ok = connect(shoal.ports[1 - wrong]);
    send(
        &mut ok,
        ApiKey::Produce,
        PRODUCE_V,
        2,
        &produce_req("quiet", 0, batch(&["x"]), 0),
    );
    api_versions_ok(&mut ok, 3);
    shoal.stop();
}

/// Views exist on request when their source does; malformed view names and unknown sources get
/// Kafka's error codes, and views refuse produces.
#[test]
fn view_names_resolve_or_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    create_topic(&shoal, "t", 3);
    let mut s = connect(shoal.ports[0]);
    let names = [
        "t.shard-1-of-4",
        "t.shard-9-of-4",
        "t.shard-0-of-1025",
        "nosuch.shard-0-of-2",
    ];
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        METADATA_V,
        1,
        &metadata_req(&names).with_allow_auto_topic_creation(true),
    );
    let codes: Vec<i16> = r.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(
        codes,
        [
            NONE,
            INVALID_TOPIC_EXCEPTION,
            INVALID_TOPIC_EXCEPTION,
            UNKNOWN_TOPIC_OR_PARTITION
        ]
    );
    assert_eq!(
        r.topics[0].partitions.len(),
        3,
        "a view has its source's partitions"
    );
    let source_leader = leader(&shoal, "t", 0) as i32;
    let view_leader = r.topics[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == 0)
        .unwrap()
        .leader_id
        .0;
    assert_eq!(view_leader, source_leader, "and its leaders");
    // Nothing was auto-created for the view-shaped names.
    let all: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        1,
        2,
        &MetadataRequest::default().with_topics(None),
    );
    assert_eq!(all.topics.len(), 1);

    let port = shoal.ports[source_leader as usize];
    assert_eq!(
        produce(port, "t.shard-1-of-4", 0, batch(&["x"])).error_code,
        INVALID_TOPIC_EXCEPTION
    );
    for (topic, code) in [
        ("nosuch.shard-0-of-2", UNKNOWN_TOPIC_OR_PARTITION),
        ("t.shard-5-of-2", INVALID_TOPIC_EXCEPTION),
    ] {
        let mut f = connect(port);
        let r: FetchResponse = call(
            &mut f,
            ApiKey::Fetch,
            FETCH_V,
            3,
            &fetch_req(topic, 0, 0, 0, 1),
        );
        assert_eq!(r.responses[0].partitions[0].error_code, code, "{topic}");
    }
    assert_eq!(
        list_offset(port, "t.shard-1-of-4", 0, -1),
        (NONE, 0),
        "a view's offsets are its source's"
    );
    shoal.stop();
}

/// A fetch asking for more than is there (min_bytes) waits without holding its core: another
/// connection to the same core is answered at once, more data that is still not enough does not end
/// the wait, and at max_wait the fetch returns what there is.
#[test]
fn a_fetch_waiting_for_min_bytes_does_not_hold_its_core() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "mb", 1);
    let port = shoal.ports[0];
    assert_eq!(produce(port, "mb", 0, batch(&["one"])).error_code, NONE);
    let mut f = connect(port);
    let big_min = fetch_req("mb", 0, 0, 2000, 10 << 20);
    send(&mut f, ApiKey::Fetch, FETCH_V, 1, &big_min);
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    api_versions_ok(&mut connect(port), 2);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the core answered in {:?}",
        started.elapsed()
    );
    assert_eq!(produce(port, "mb", 0, batch(&["two"])).error_code, NONE);
    let r: FetchResponse = decode(
        ApiKey::Fetch,
        FETCH_V,
        1,
        recv(&mut f).expect("a fetch response"),
    );
    let waited = started.elapsed() + Duration::from_millis(100);
    assert!(
        waited >= Duration::from_millis(1800),
        "returned after {waited:?}, before max_wait"
    );
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (NONE, 2));
    let records = p.records.as_ref().expect("records");
    assert_eq!(
        shards::batch::BatchHeader::parse(records)
            .unwrap()
            .base_offset,
        0,
        "both batches, from 0"
    );
    shoal.stop();
}

/// Deleting a topic while a fetch long-polls on it: the fetch gets an error code, the core lives
/// on, and the server still stops cleanly.
#[test]
fn deleting_a_topic_under_a_waiting_fetch_keeps_the_core_alive() {
    use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse};
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "doomed", 1);
    let port = shoal.ports[0];
    assert_eq!(produce(port, "doomed", 0, batch(&["x"])).error_code, NONE);
    let mut f = connect(port);
    send(
        &mut f,
        ApiKey::Fetch,
        FETCH_V,
        1,
        &fetch_req("doomed", 0, 1, 5000, 1),
    );
    std::thread::sleep(Duration::from_millis(100));
    let req = DeleteTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topic_names(vec![name("doomed")]);
    let r: DeleteTopicsResponse = call(&mut connect(port), ApiKey::DeleteTopics, 4, 2, &req);
    assert_eq!(r.responses[0].error_code, NONE);
    let r: FetchResponse = decode(
        ApiKey::Fetch,
        FETCH_V,
        1,
        recv(&mut f).expect("the waiting fetch is answered"),
    );
    let code = r.responses[0].partitions[0].error_code;
    assert!(
        code == NOT_LEADER_OR_FOLLOWER || code == NONE,
        "fetch on a deleted topic: {code}"
    );
    api_versions_ok(&mut connect(port), 3);
    shoal.stop(); // asserts a clean exit: no core died
}

// ---------------------------------------------------------------------------------------------------
// 6. DescribeLogDirs.

/// DescribeLogDirs at every version: each core (a broker) answers for the partitions it leads, in
/// its data directory, with each one's size equal to the broker's own figure; partitions led by the
/// other core or unknown are left out; all of them when the topics are null; the file system's
/// total and usable bytes from v4.
#[test]
fn describe_log_dirs_answers_for_the_partitions_each_core_leads() {
    use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
    use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse};
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &["--metrics-per-partition"]);
    create_topic(&shoal, "sized", 4);
    let leaders: Vec<usize> = (0..4).map(|p| leader(&shoal, "sized", p)).collect();
    assert!(leaders.contains(&0) && leaders.contains(&1), "{leaders:?}");
    for (p, &core) in leaders.iter().enumerate() {
        let values: Vec<String> = (0..=p).map(|i| format!("value {i}")).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let r = produce(shoal.ports[core], "sized", p as i32, batch(&values));
        assert_eq!(r.error_code, NONE);
    }
    let size = |p: usize| {
        shoal.metric_with(
            "shoal_log_size_bytes",
            &format!("topic=\"sized\",partition=\"{p}\""),
        ) as i64
    };
    // (partition, size) of "sized" in an answer, checked to be one directory without error.
    let sized = |r: &DescribeLogDirsResponse| -> Vec<(i32, i64)> {
        assert_eq!(r.error_code, NONE);
        assert_eq!(r.results.len(), 1, "{r:?}");
        let d = &r.results[0];
        assert_eq!(d.error_code, NONE);
        assert_eq!(
            d.log_dir.as_str(),
            dir.path().canonicalize().unwrap().to_str().unwrap()
        );
        d.topics
            .iter()
            .filter(|t| t.name.0.as_str() == "sized")
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, p.partition_size))
            })
            .collect()
    };
    for v in 1..=4 {
        for (core, &port) in shoal.ports.iter().enumerate() {
            let mine: Vec<(i32, i64)> = (0..4)
                .filter(|&p| leaders[p] == core)
                .map(|p| (p as i32, size(p)))
                .collect();
            assert!(mine.iter().all(|&(_, bytes)| bytes > 0), "{mine:?}");
            // Null topics: every partition here.
            let all: DescribeLogDirsResponse = call(
                &mut connect(port),
                ApiKey::DescribeLogDirs,
                v,
                1,
                &DescribeLogDirsRequest::default().with_topics(None),
            );
            assert_eq!(sized(&all), mine, "v{v} core {core}");
            if v >= 4 {
                let d = &all.results[0];
                assert!(d.total_bytes > 0 && (0..=d.total_bytes).contains(&d.usable_bytes));
            }
            // Every partition asked for, one twice, one that does not exist, an unknown topic.
            let asked = DescribeLogDirsRequest::default().with_topics(Some(vec![
                DescribableLogDirTopic::default()
                    .with_topic(name("sized"))
                    .with_partitions(vec![0, 1, 2, 3, 3, 9]),
                DescribableLogDirTopic::default()
                    .with_topic(name("nope"))
                    .with_partitions(vec![0]),
            ]));
            let some: DescribeLogDirsResponse =
                call(&mut connect(port), ApiKey::DescribeLogDirs, v, 2, &asked);
            assert_eq!(sized(&some), mine, "v{v} core {core}");
            assert!(some.results[0]
                .topics
                .iter()
                .all(|t| t.name.0.as_str() == "sized"));
        }
    }
    shoal.stop();
}

#[test]
fn zstd_needs_produce_v7_and_fetch_v10_and_a_created_topic_has_no_error_message() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let mut s = connect(shoal.ports[0]);
    let created: CreateTopicsResponse = call(
        &mut s,
        ApiKey::CreateTopics,
        5,
        1,
        &common::wire::create_topic_request("z", 1),
    );
    assert_eq!(created.topics[0].error_code, 0);
    assert_eq!(created.topics[0].error_message, None, "null on success");
    // KIP-110: zstd is for Produce v7 and later; older requests get UNSUPPORTED_COMPRESSION_TYPE.
    let zstd = shards::batch::compress_batch(&batch(&["a", "b"]), 4);
    for (version, want) in [(3, 76), (6, 76), (7, 0), (9, 0)] {
        let r: ProduceResponse = call(
            &mut s,
            ApiKey::Produce,
            version,
            10 + i32::from(version),
            &produce_req("z", 0, zstd.clone(), 1),
        );
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, want, "v{version}: {:?}", p.error_message);
    }
    // And for Fetch v10 and later: an older fetch of the zstd batches gets the same error.
    for (version, want) in [(4, 76), (9, 76), (10, 0), (12, 0)] {
        let req = kafka_protocol::messages::FetchRequest::default()
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(common::wire::topic_name("z"))
                .with_partitions(vec![
                    FetchPartition::default().with_partition_max_bytes(1 << 20)
                ])]);
        let r: kafka_protocol::messages::FetchResponse = call(
            &mut s,
            ApiKey::Fetch,
            version,
            30 + i32::from(version),
            &req,
        );
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, want, "Fetch v{version}");
        assert_eq!(p.records.as_ref().is_some_and(|r| !r.is_empty()), want == 0);
    }
    shoal.stop();
}

#[test]
fn offsets_by_time_are_kafkas_whatever_the_codec_or_the_stated_max_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let mut s = connect(shoal.ports[0]);
    let t0 = now_ms() - 3_600_000;
    // One topic per codec: 100 records one second apart, in one batch whose header says -1 for
    // its max timestamp (as sarama writes it).
    for (codec, topic) in [
        (0, "none"),
        (1, "gzip"),
        (2, "snappy"),
        (3, "lz4"),
        (4, "zstd"),
    ] {
        let created: CreateTopicsResponse = call(
            &mut s,
            ApiKey::CreateTopics,
            5,
            1,
            &common::wire::create_topic_request(topic, 1),
        );
        assert_eq!(created.topics[0].error_code, 0, "{topic}");
        let mut b = BatchBuilder::new(t0);
        for i in 0..100 {
            let v = format!("v{i}");
            b.push(t0 + i * 1000, None, Some(v.as_bytes()), &[]);
        }
        let plain = b.finish(0);
        let mut batch = if codec == 0 {
            plain
        } else {
            shards::batch::compress_batch(&plain, codec)
        };
        shards::batch::set_max_timestamp(&mut batch, -1);
        let r: ProduceResponse = call(
            &mut s,
            ApiKey::Produce,
            9,
            2,
            &produce_req(topic, 0, batch, 1),
        );
        assert_eq!(
            r.responses[0].partition_responses[0].error_code, 0,
            "{topic}"
        );
        // Before, inside (between two records, and on one), at the last, after.
        for (asked, want) in [
            (t0 - 5, (0, t0)),
            (t0 + 50_500, (51, t0 + 51_000)),
            (t0 + 7_000, (7, t0 + 7_000)),
            (t0 + 99_000, (99, t0 + 99_000)),
            (t0 + 99_001, (-1, -1)),
        ] {
            for version in [1, 10] {
                let r: ListOffsetsResponse = call(
                    &mut s,
                    ApiKey::ListOffsets,
                    version,
                    3,
                    &list_offsets_req(topic, 0, asked),
                );
                let p = &r.topics[0].partitions[0];
                assert_eq!(
                    (p.offset, p.timestamp),
                    want,
                    "{topic} v{version} at t0+{}",
                    asked - t0
                );
            }
        }
        // The batch fetched back carries its records' max timestamp, under a CRC that holds.
        let f: FetchResponse = call(&mut s, ApiKey::Fetch, 11, 4, &fetch_req(topic, 0, 0, 0, 1));
        let records = f.responses[0].partitions[0].records.clone().unwrap();
        let h = shards::batch::check_integrity(&records, usize::MAX).unwrap();
        assert_eq!(h.max_timestamp, t0 + 99_000, "{topic}");
    }
    shoal.stop();
}

/// A partition an open transaction had added, but holding no batch of it yet, takes that
/// producer's batch right after a `kill -9` and restart (Kafka accepts it): the restarted broker
/// registers its open transactions before a transactional produce is served.
#[test]
fn a_transactional_batch_right_after_a_restart_is_taken() {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::{
        AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, InitProducerIdRequest,
        InitProducerIdResponse, ProducerId, TransactionalId,
    };
    let dir = tempfile::tempdir().unwrap();
    let _ports = common::ports_lock();
    let port = common::free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let shoal = Shoal::start_on(dir.path(), 2, &listen, &[]);
    let mut s = connect(shoal.ports[0]);
    let created: CreateTopicsResponse = call(
        &mut s,
        ApiKey::CreateTopics,
        5,
        1,
        &common::wire::create_topic_request("tx-restart", 2),
    );
    assert_eq!(created.topics[0].error_code, 0);
    // An id whose coordinator is core 0, the core this connection is to.
    let id = (0..)
        .map(|i| format!("tx-after-restart-{i}"))
        .find(|id| shoal::transactions::coordinator_core(id, 2) == 0)
        .unwrap();
    let id = TransactionalId(StrBytes::from_string(id));
    let init: InitProducerIdResponse = call(
        &mut s,
        ApiKey::InitProducerId,
        1,
        2,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(id.clone()))
            .with_transaction_timeout_ms(60_000),
    );
    assert_eq!(init.error_code, 0);
    let added: AddPartitionsToTxnResponse = call(
        &mut s,
        ApiKey::AddPartitionsToTxn,
        1,
        3,
        &AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(id.clone())
            .with_v3_and_below_producer_id(ProducerId(init.producer_id.0))
            .with_v3_and_below_producer_epoch(init.producer_epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(name("tx-restart"))
                .with_partitions(vec![0, 1])]),
    );
    let errors: Vec<i16> = added.results_by_topic_v3_and_below[0]
        .results_by_partition
        .iter()
        .map(|p| p.partition_error_code)
        .collect();
    assert_eq!(errors, [0, 0]);
    drop(s);
    shoal.kill_hard();
    let shoal = Shoal::start_on(dir.path(), 2, &listen, &[]);
    // At once, on both cores' partitions.
    for (i, &port) in shoal.ports.iter().enumerate() {
        let mut s = connect(port);
        let mut b = BatchBuilder::new(now_ms())
            .producer(init.producer_id.0, init.producer_epoch, 0)
            .transactional();
        b.push(now_ms(), None, Some(b"after the restart"), &[]);
        let mut req = produce_req("tx-restart", i as i32, b.finish(0), -1);
        req.transactional_id = Some(id.clone());
        let r: ProduceResponse = call(&mut s, ApiKey::Produce, 9, 4, &req);
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 0, "partition {i}: {:?}", p.error_message);
    }
    shoal.stop();
}
