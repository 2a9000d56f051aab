//! The broker's state the fuzzer builds on, and the checks of its health between inputs.

use super::requests::{self, DATA_TOPIC, HEALTH_TOPIC, POOL};
use crate::common::wire::{call, connect, create_topic_request, produce_request};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use shards::batch::BatchBuilder;
use std::net::TcpStream;

pub fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// VmRSS of a process, in bytes.
pub fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// The APIs and versions the broker advertises.
pub fn advertised(port: u16) -> Vec<(ApiKey, i16)> {
    let mut s = connect(port);
    let r: ApiVersionsResponse = call(
        &mut s,
        ApiKey::ApiVersions,
        3,
        1,
        &ApiVersionsRequest::default(),
    );
    let mut out = Vec::new();
    for k in &r.api_keys {
        let key = ApiKey::try_from(k.api_key).expect("a known API key");
        assert!(
            requests::KNOWN.contains(&key),
            "the broker serves {key:?}, which the fuzzer has no requests for: add them to tests/it/fuzz/requests.rs"
        );
        out.extend((k.min_version..=k.max_version).map(|v| (key, v)));
    }
    out
}

pub fn create_topic(port: u16, topic: &str, partitions: i32) {
    let mut s = connect(port);
    let r: CreateTopicsResponse = call(
        &mut s,
        ApiKey::CreateTopics,
        7,
        1,
        &create_topic_request(topic, partitions),
    );
    assert_eq!(r.topics[0].error_code, 0, "create {topic}");
}

/// The core leading `topic`/`partition`.
pub fn leader(port: u16, topic: &str, partition: i32) -> Result<usize, String> {
    let mut s = connect(port);
    let r: MetadataResponse = call(&mut s, ApiKey::Metadata, 12, 1, &metadata_of(&[topic]));
    let p = r.topics[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)
        .ok_or_else(|| format!("{topic}/{partition} is not in Metadata"))?;
    Ok(p.leader_id.0 as usize)
}

/// Produces one batch; returns its base offset.
pub fn produce(port: u16, topic: &str, partition: i32, batch: Vec<u8>) -> Result<i64, String> {
    let mut s = connect(port);
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        1,
        &produce_request(topic, partition, batch, -1),
    );
    let p = &r.responses[0].partition_responses[0];
    match p.error_code {
        0 => Ok(p.base_offset),
        e => Err(format!("produce to {topic}/{partition}: error {e}")),
    }
}

/// The broker's state the fuzzer builds on: the health checks' topic (which no fuzzed request
/// names), and the data topic; returns the port of the health topic's leader.
pub fn set_up(ports: &[u16]) -> u16 {
    create_topic(ports[0], HEALTH_TOPIC, 1);
    let restored = restore_data_topic(ports);
    assert_eq!(restored, Ok(true), "the data topic is created");
    let mut s = connect(ports[0]);
    let r: MetadataResponse = call(&mut s, ApiKey::Metadata, 12, 1, &metadata_of(&[DATA_TOPIC]));
    *requests::DATA_TOPIC_ID.write().unwrap() = r.topics[0].topic_id;
    ports[leader(ports[0], HEALTH_TOPIC, 0).expect("the health topic's leader")]
}

/// Makes sure the data topic exists with its two partitions: fuzzed requests may delete it (a splice
/// can make a valid DeleteTopics naming it) and re-create it with one (auto-creation, which may win
/// the race again: a few tries). A topic it creates gets ordinary records and records whose
/// timestamps are extreme. Returns whether it had to act.
pub fn restore_data_topic(ports: &[u16]) -> Result<bool, String> {
    let mut s = connect(ports[0]);
    for attempt in 0..5 {
        let r: MetadataResponse =
            call(&mut s, ApiKey::Metadata, 12, 1, &metadata_of(&[DATA_TOPIC]));
        match (r.topics[0].error_code, r.topics[0].partitions.len()) {
            (0, 2) => return Ok(attempt > 0),
            (0, _) => {
                let r: DeleteTopicsResponse = call(
                    &mut s,
                    ApiKey::DeleteTopics,
                    6,
                    2,
                    &DeleteTopicsRequest::default()
                        .with_timeout_ms(30_000)
                        .with_topics(vec![
                            DeleteTopicState::default().with_name(Some(name(DATA_TOPIC)))
                        ]),
                );
                if !matches!(r.responses[0].error_code, 0 | 3) {
                    return Err(format!(
                        "deleting the data topic: error {}",
                        r.responses[0].error_code
                    ));
                }
            }
            _ => {}
        }
        let r: CreateTopicsResponse = call(
            &mut s,
            ApiKey::CreateTopics,
            7,
            3,
            &create_topic_request(DATA_TOPIC, 2),
        );
        match r.topics[0].error_code {
            0 => {
                seed_data_topic(ports);
                return Ok(true);
            }
            36 => continue, // created meanwhile (auto-creation): look again
            e => return Err(format!("creating the data topic: error {e}")),
        }
    }
    Ok(true)
}

/// Writes the data topic's records (see [`restore_data_topic`]).
fn seed_data_topic(ports: &[u16]) {
    // Best effort: a fuzzed request may delete it again meanwhile (then the next call re-creates it).
    for partition in 0..2 {
        let Ok(core) = leader(ports[0], DATA_TOPIC, partition) else {
            return;
        };
        let port = ports[core];
        let now = now_ms();
        for i in 0..20 {
            let mut b = BatchBuilder::new(now - 100_000 + i * 1000);
            for r in 0..3 {
                b.push(
                    now - 100_000 + i * 1000 + r,
                    Some(format!("k{r}").as_bytes()),
                    Some(b"seed record"),
                    &[],
                );
            }
            if produce(port, DATA_TOPIC, partition, b.finish(0)).is_err() {
                return;
            }
        }
        // Timestamps at the edges of i64, deltas as large as they go (a record's timestamp is the
        // batch's base plus its delta: the first batch's overflows i64).
        for (base, ts, patched_base) in [
            (0, i64::MAX, Some(100)),
            (0, i64::MAX, None),
            (i64::MAX - 1, i64::MAX, None),
            (-1, -1, None),
            (0, 0, None),
        ] {
            let mut b = BatchBuilder::new(base);
            b.push(ts, None, Some(b"edge timestamp"), &[]);
            let mut batch = b.finish(0);
            if let Some(base) = patched_base {
                let mut h = shards::batch::BatchHeader::parse(&batch).unwrap();
                h.base_timestamp = base;
                shards::batch::write_header(&mut batch, &h);
            }
            if produce(port, DATA_TOPIC, partition, batch).is_err() {
                return;
            }
        }
    }
}

/// A Metadata request for `topics` that creates none.
fn metadata_of(topics: &[&str]) -> MetadataRequest {
    MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(Some(
            topics
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(name(t))))
                .collect(),
        ))
}

/// ApiVersions and Metadata on a long-lived connection.
pub fn check_served(s: &mut TcpStream, correlation: i32) -> Result<(), String> {
    let r: ApiVersionsResponse = call(
        s,
        ApiKey::ApiVersions,
        3,
        correlation,
        &ApiVersionsRequest::default(),
    );
    if r.error_code != 0 || r.api_keys.is_empty() {
        return Err(format!("ApiVersions answered {r:?}"));
    }
    let r: MetadataResponse = call(
        s,
        ApiKey::Metadata,
        12,
        correlation + 1,
        &metadata_of(&[HEALTH_TOPIC]),
    );
    let t = &r.topics[0];
    if (t.error_code, t.partitions.len()) != (0, 1) {
        return Err(format!(
            "Metadata of the health topic: error {}, {} partitions",
            t.error_code,
            t.partitions.len()
        ));
    }
    Ok(())
}

/// Produces a record to the health topic and fetches it back.
pub fn check_produce_fetch(port: u16, n: u64) -> Result<(), String> {
    let value = format!("probe {n}");
    let mut b = BatchBuilder::new(now_ms());
    b.push(now_ms(), None, Some(value.as_bytes()), &[]);
    let offset = produce(port, HEALTH_TOPIC, 0, b.finish(0))?;
    let mut s = connect(port);
    let fetch = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(HEALTH_TOPIC))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])]);
    let mut r: FetchResponse = call(&mut s, ApiKey::Fetch, 12, 1, &fetch);
    // With read replicas the owner may first name another core (KIP-392); this client does not
    // follow, so it asks again on the same connection and the owner serves it.
    if r.responses[0].partitions[0].preferred_read_replica.0 >= 0 {
        r = call(&mut s, ApiKey::Fetch, 12, 2, &fetch);
    }
    let p = &r.responses[0].partitions[0];
    let records = p.records.clone().unwrap_or_default();
    let found = shards::batch::records(&records).map_err(|e| format!("fetched batch: {e:?}"))?;
    match found.first() {
        Some(r) if r.offset == offset && r.value == Some(value.as_bytes()) => Ok(()),
        _ => Err(format!(
            "fetched at {offset} (error {}): {:?}, not the record produced",
            p.error_code,
            found.first()
        )),
    }
}

/// Deletes the topics fuzzed requests created (CreateTopics, auto-creation), so they cannot pile up.
pub fn prune_topics(port: u16) -> Result<(), String> {
    let mut s = connect(port);
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default().with_topics(None),
    );
    let extra: Vec<TopicName> = r
        .topics
        .iter()
        .filter_map(|t| t.name.clone())
        .filter(|n| {
            ![DATA_TOPIC, HEALTH_TOPIC].contains(&n.0.as_str()) && !POOL.contains(&n.0.as_str())
        })
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let r: DeleteTopicsResponse = call(
        &mut s,
        ApiKey::DeleteTopics,
        6,
        2,
        &DeleteTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(
                extra
                    .into_iter()
                    .map(|n| DeleteTopicState::default().with_name(Some(n)))
                    .collect(),
            ),
    );
    match r
        .responses
        .iter()
        .find(|t| t.error_code != 0 && t.error_code != 3)
    {
        Some(t) => Err(format!(
            "deleting fuzzed topic {:?}: error {}",
            t.name, t.error_code
        )),
        None => Ok(()),
    }
}

/// Runs `f`, turning a panic (a wire helper's timeout or assertion) into an error.
pub fn caught<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(p) => Err(format!(
            "{what}: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}
