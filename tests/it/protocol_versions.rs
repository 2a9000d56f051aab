//! The newest versions of the data-path APIs, as raw requests against the real binary: Fetch v13+
//! and Produce v13 name topics by id (KIP-516), Metadata v12+ may ask for topics by id, ListOffsets
//! v9+ knows the earliest-local and latest-tiered timestamps. A fetch by id answers what the same
//! fetch by name answers; an id no topic has is `UNKNOWN_TOPIC_ID`, never a closed connection.

use crate::common;

use bytes::Bytes;
use common::wire::{call, connect, record_values};
use common::Shoal;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, ProduceRequest,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use shards::batch::BatchBuilder;
use std::net::TcpStream;
use uuid::Uuid;

const NONE: i16 = 0;
const UNKNOWN_TOPIC_ID: i16 = 100;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn batch(values: &[String]) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000);
    for (i, v) in values.iter().enumerate() {
        let key = format!("key-{i}");
        b.push(
            1_700_000_000_000,
            Some(key.as_bytes()),
            Some(v.as_bytes()),
            &[],
        );
    }
    Bytes::from(b.finish(0))
}

/// Metadata v12 for `topics` by name: (leader of partition 0, topic id) of each.
fn ids(s: &mut TcpStream, topics: &[&str]) -> Vec<(i32, Uuid)> {
    let req = MetadataRequest::default().with_topics(Some(
        topics
            .iter()
            .map(|t| MetadataRequestTopic::default().with_name(Some(name(t))))
            .collect(),
    ));
    let r: MetadataResponse = call(s, ApiKey::Metadata, 12, 1, &req);
    r.topics
        .iter()
        .map(|t| {
            assert_eq!(t.error_code, NONE, "{:?}", t.name);
            assert!(!t.topic_id.is_nil());
            (t.partitions[0].leader_id.0, t.topic_id)
        })
        .collect()
}

/// A fetch of partition 0 of each topic from offset 0: by name below v13, by id from v13.
fn fetch(s: &mut TcpStream, version: i16, topics: &[(&str, Uuid)]) -> FetchResponse {
    let req = FetchRequest::default()
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(
            topics
                .iter()
                .map(|(topic, id)| {
                    FetchTopic::default()
                        .with_topic(name(topic))
                        .with_topic_id(*id)
                        .with_partitions(vec![FetchPartition::default()
                            .with_partition(0)
                            .with_fetch_offset(0)
                            .with_partition_max_bytes(1 << 20)])
                })
                .collect(),
        );
    call(s, ApiKey::Fetch, version, 2, &req)
}

fn values(p: &PartitionData) -> Vec<String> {
    record_values(p.records.as_deref().unwrap_or_default())
}

fn produce(
    s: &mut TcpStream,
    version: i16,
    topic: &str,
    id: Uuid,
    values: &[String],
) -> (i16, i64, Uuid) {
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_topic_id(id)
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch(values)))])]);
    let r: ProduceResponse = call(s, ApiKey::Produce, version, 3, &req);
    assert_eq!(r.responses.len(), 1);
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset, r.responses[0].topic_id)
}

#[test]
fn api_versions_offers_the_newest_data_path_versions() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let mut s = connect(shoal.ports[0]);
    let r: ApiVersionsResponse = call(
        &mut s,
        ApiKey::ApiVersions,
        3,
        1,
        &ApiVersionsRequest::default(),
    );
    let max = |key: ApiKey| {
        r.api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| k.max_version)
    };
    assert_eq!(max(ApiKey::Fetch), Some(18));
    assert_eq!(max(ApiKey::Produce), Some(13));
    assert_eq!(max(ApiKey::ListOffsets), Some(10));
    assert_eq!(max(ApiKey::Metadata), Some(13));
    drop(s);
    shoal.stop();
}

#[test]
fn fetch_by_topic_id_answers_as_fetch_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    common::create_topics(&shoal.bootstrap(), &[("by-id", 1)]);
    let mut any = connect(shoal.ports[0]);
    let (leader, id) = ids(&mut any, &["by-id"])[0];
    let mut s = connect(shoal.ports[leader as usize]);
    let sent: Vec<String> = (0..20).map(|i| format!("value-{i}")).collect();
    let (code, base, _) = produce(&mut s, 13, "", id, &sent);
    assert_eq!((code, base), (NONE, 0), "Produce v13 by id");

    let by_name = fetch(&mut s, 12, &[("by-id", Uuid::nil())]);
    let want = &by_name.responses[0].partitions[0];
    assert_eq!(want.error_code, NONE);
    assert_eq!(values(want), sent);
    for v in 13..=18 {
        let r = fetch(&mut s, v, &[("", id)]);
        assert_eq!(r.responses.len(), 1, "v{v}");
        assert_eq!(r.responses[0].topic_id, id, "v{v}");
        let got = &r.responses[0].partitions[0];
        assert_eq!(got.error_code, NONE, "v{v}");
        assert_eq!(got.high_watermark, want.high_watermark, "v{v}");
        assert_eq!(
            got.records, want.records,
            "Fetch v{v} by id: the same bytes as by name"
        );
    }

    // An id no topic has, beside one that exists: that topic's partitions only are refused.
    let unknown = Uuid::from_bytes([0x5a; 16]);
    for v in [13, 16, 18] {
        let r = fetch(&mut s, v, &[("", unknown), ("", id), ("", Uuid::nil())]);
        let codes: Vec<(Uuid, i16)> = r
            .responses
            .iter()
            .map(|t| (t.topic_id, t.partitions[0].error_code))
            .collect();
        assert_eq!(
            codes,
            [
                (unknown, UNKNOWN_TOPIC_ID),
                (id, NONE),
                (Uuid::nil(), UNKNOWN_TOPIC_ID)
            ],
            "v{v}"
        );
        let p = &r.responses[0].partitions[0];
        assert_eq!((p.high_watermark, p.log_start_offset), (-1, -1));
        assert_eq!(p.records.as_deref(), Some(&[][..]), "empty, not null");
        assert_eq!(values(&r.responses[1].partitions[0]), sent);
    }
    drop((s, any));
    shoal.stop();
}

/// A view's id (as Metadata gives it) fetches the view, as its name does.
#[test]
fn a_view_is_fetched_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    common::create_topics(&shoal.bootstrap(), &[("src", 1)]);
    let mut s = connect(shoal.ports[0]);
    let view = "src.shard-1-of-2";
    let got = ids(&mut s, &["src", view]);
    let (source_id, view_id) = (got[0].1, got[1].1);
    assert_ne!(source_id, view_id);
    let sent: Vec<String> = (0..40).map(|i| format!("v{i}")).collect();
    assert_eq!(produce(&mut s, 9, "src", Uuid::nil(), &sent).0, NONE);

    // The view's reader may still be catching up: read by name until it answers the same twice.
    let mut by_name = Vec::new();
    for _ in 0..50 {
        let r = fetch(&mut s, 12, &[(view, Uuid::nil())]);
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, NONE);
        let now = values(p);
        if !now.is_empty() && now == by_name {
            break;
        }
        by_name = now;
    }
    assert!(
        !by_name.is_empty() && by_name.len() < sent.len(),
        "{by_name:?}"
    );
    let r = fetch(&mut s, 13, &[("", view_id)]);
    assert_eq!(r.responses[0].topic_id, view_id);
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, NONE);
    assert_eq!(values(p), by_name);
    drop(s);
    shoal.stop();
}

#[test]
fn produce_v13_by_id_and_an_unknown_id() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    common::create_topics(&shoal.bootstrap(), &[("p13", 1)]);
    let mut s = connect(shoal.ports[0]);
    let (_, id) = ids(&mut s, &["p13"])[0];
    let one = vec!["a".to_string(), "b".to_string()];
    assert_eq!(produce(&mut s, 13, "", id, &one), (NONE, 0, id));
    // v10-v12: by name, as before.
    for (v, base) in [(10, 2), (11, 4), (12, 6)] {
        let (code, got, _) = produce(&mut s, v, "p13", Uuid::nil(), &one);
        assert_eq!((code, got), (NONE, base), "Produce v{v}");
    }
    let unknown = Uuid::from_bytes([3; 16]);
    let (code, base, echoed) = produce(&mut s, 13, "", unknown, &one);
    assert_eq!((code, base, echoed), (UNKNOWN_TOPIC_ID, -1, unknown));
    // The connection stays usable, and nothing was appended for the unknown id.
    let r = fetch(&mut s, 13, &[("", id)]);
    assert_eq!(r.responses[0].partitions[0].high_watermark, 8);
    drop(s);
    shoal.stop();
}

#[test]
fn metadata_by_topic_id() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    common::create_topics(&shoal.bootstrap(), &[("meta-a", 2)]);
    let mut s = connect(shoal.ports[0]);
    let (_, id) = ids(&mut s, &["meta-a"])[0];
    let unknown = Uuid::from_bytes([9; 16]);
    for v in [12, 13] {
        let req = MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default()
                .with_name(None)
                .with_topic_id(id),
            // An empty name with an id asks for the topic by id too.
            MetadataRequestTopic::default()
                .with_name(Some(name("")))
                .with_topic_id(unknown),
        ]));
        let r: MetadataResponse = call(&mut s, ApiKey::Metadata, v, 4, &req);
        assert_eq!(r.error_code, NONE, "v{v}");
        assert_eq!(r.topics.len(), 2, "v{v}");
        let known = &r.topics[0];
        assert_eq!(
            (
                known.error_code,
                known.name.as_ref().map(|n| n.0.to_string()),
                known.topic_id
            ),
            (NONE, Some("meta-a".to_string()), id),
            "v{v}"
        );
        assert_eq!(known.partitions.len(), 2);
        let other = &r.topics[1];
        assert_eq!(
            (other.error_code, other.name.is_none(), other.topic_id),
            (UNKNOWN_TOPIC_ID, true, unknown),
            "v{v}"
        );
    }
    drop(s);
    shoal.stop();
}

#[test]
fn list_offsets_v10() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    common::create_topics(&shoal.bootstrap(), &[("lo", 1)]);
    let mut s = connect(shoal.ports[0]);
    let three: Vec<String> = (0..3).map(|i| i.to_string()).collect();
    assert_eq!(produce(&mut s, 9, "lo", Uuid::nil(), &three).0, NONE);
    for v in 8..=10 {
        for (ts, want) in [(-1, 3), (-2, 0), (-3, 0), (-4, 0), (-5, -1)] {
            let req = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_timeout_ms(if v >= 10 { 1000 } else { 0 })
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(name("lo"))
                    .with_partitions(vec![ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(ts)])]);
            let r: ListOffsetsResponse = call(&mut s, ApiKey::ListOffsets, v, 5, &req);
            let p = &r.topics[0].partitions[0];
            assert_eq!(
                (p.error_code, p.offset),
                (NONE, want),
                "v{v} timestamp {ts}"
            );
        }
    }
    drop(s);
    shoal.stop();
}

/// KIP-951: a fetch (v16+) or produce (v10+) sent to a core that does not lead the partition is
/// answered `NOT_LEADER_OR_FOLLOWER` with the leader and its endpoint; older versions get the error
/// alone.
#[test]
fn not_leader_answers_name_the_leader() {
    const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    common::create_topics(&shoal.bootstrap(), &[("elsewhere", 1)]);
    let mut any = connect(shoal.ports[0]);
    let (leader, id) = ids(&mut any, &["elsewhere"])[0];
    let other = 1 - leader as usize;
    let mut s = connect(shoal.ports[other]);
    let port = i32::from(shoal.ports[leader as usize]);
    for v in [15, 16, 18] {
        let r = fetch(&mut s, v, &[("", id)]);
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, NOT_LEADER_OR_FOLLOWER, "v{v}");
        let told = (p.current_leader.leader_id.0, p.current_leader.leader_epoch);
        let endpoints: Vec<(i32, i32)> = r
            .node_endpoints
            .iter()
            .map(|e| (e.node_id.0, e.port))
            .collect();
        if v >= 16 {
            assert_eq!(told, (leader, 0), "Fetch v{v}");
            assert_eq!(endpoints, [(leader, port)], "Fetch v{v}");
        } else {
            assert_eq!(told, (-1, -1), "Fetch v{v}");
            assert!(endpoints.is_empty(), "Fetch v{v}");
        }
    }
    let one = vec!["x".to_string()];
    for v in [9, 10, 13] {
        let req = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(name("elsewhere"))
                .with_topic_id(id)
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch(&one)))])]);
        let r: ProduceResponse = call(&mut s, ApiKey::Produce, v, 6, &req);
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, NOT_LEADER_OR_FOLLOWER, "Produce v{v}");
        let told = (p.current_leader.leader_id.0, p.current_leader.leader_epoch);
        let endpoints: Vec<(i32, i32)> = r
            .node_endpoints
            .iter()
            .map(|e| (e.node_id.0, e.port))
            .collect();
        if v >= 10 {
            assert_eq!(told, (leader, 0), "Produce v{v}");
            assert_eq!(endpoints, [(leader, port)], "Produce v{v}");
        } else {
            assert!(endpoints.is_empty(), "Produce v{v}");
        }
    }
    drop((s, any));
    shoal.stop();
}

/// By id, a topic the client may not describe or read is refused as by name, and Metadata does not
/// tell its name.
#[test]
fn a_refused_topic_asked_for_by_id_is_not_named() {
    use kafka_protocol::messages::CreateTopicsResponse;
    const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    let dir = tempfile::tempdir().unwrap();
    for u in ["admin", "bob"] {
        common::add_user(dir.path(), u, &format!("{u}-pw"));
    }
    let shoal = Shoal::start(
        dir.path(),
        1,
        &[
            "--sasl-mechanisms",
            "PLAIN",
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
        ],
    );
    let mut admin = connect(shoal.ports[0]);
    assert_eq!(
        common::wire::sasl_plain(&mut admin, "admin", "admin-pw").0,
        0
    );
    let r: CreateTopicsResponse = call(
        &mut admin,
        ApiKey::CreateTopics,
        7,
        1,
        &common::wire::create_topic_request("secret", 1),
    );
    assert_eq!(r.topics[0].error_code, NONE);
    let (_, id) = ids(&mut admin, &["secret"])[0];

    let mut bob = connect(shoal.ports[0]);
    assert_eq!(common::wire::sasl_plain(&mut bob, "bob", "bob-pw").0, 0);
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
        .with_name(None)
        .with_topic_id(id)]));
    let r: MetadataResponse = call(&mut bob, ApiKey::Metadata, 12, 2, &req);
    let t = &r.topics[0];
    assert_eq!(
        (t.error_code, t.name.is_none(), t.topic_id),
        (TOPIC_AUTHORIZATION_FAILED, true, id)
    );
    assert!(t.partitions.is_empty());
    let r = fetch(&mut bob, 16, &[("", id)]);
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        TOPIC_AUTHORIZATION_FAILED
    );
    drop((admin, bob));
    shoal.stop();
}
