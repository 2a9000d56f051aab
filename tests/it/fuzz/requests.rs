//! Valid requests of every API the fuzzer knows, at any version, built with `kafka-protocol` (their
//! responses are decoded by `common::wire::decode_any_response`).
//!
//! "Valid" means well-formed for the version, not sensible: names, partitions, offsets, timestamps,
//! producer ids and record batches are drawn from pools that mix the ordinary with the hostile (a view
//! name, partition -1, a batch whose timestamps are far apart, with its CRC right).

use super::mutate::Rng;
use crate::common::wire::request_frame;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use shards::batch::{BatchBuilder, BatchHeader};

/// The topic the fuzzer's requests read and write: created at start, two partitions, with records.
pub const DATA_TOPIC: &str = "fz-data";
/// The topic only the health checks use (one partition).
pub const HEALTH_TOPIC: &str = "fz-health";
/// The data topic's id, for requests that name topics by id (Fetch v13+, Produce v13): noted at
/// start; fuzzed requests may delete and re-create the topic, and then it names no topic.
pub static DATA_TOPIC_ID: std::sync::RwLock<uuid::Uuid> = std::sync::RwLock::new(uuid::Uuid::nil());
/// Topics the fuzzed CreateTopics and DeleteTopics requests create and delete.
pub const POOL: [&str; 3] = ["fz-pool-0", "fz-pool-1", "fz-pool-2"];

/// Every API this module builds requests for.
pub const KNOWN: &[ApiKey] = &[
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ListOffsets,
    ApiKey::Metadata,
    ApiKey::ApiVersions,
    ApiKey::CreateTopics,
    ApiKey::CreatePartitions,
    ApiKey::DescribeConfigs,
    ApiKey::AlterConfigs,
    ApiKey::IncrementalAlterConfigs,
    ApiKey::DeleteTopics,
    ApiKey::DeleteRecords,
    ApiKey::InitProducerId,
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
    ApiKey::OffsetDelete,
    ApiKey::ConsumerGroupHeartbeat,
    ApiKey::ConsumerGroupDescribe,
    ApiKey::ListGroups,
    ApiKey::DescribeGroups,
    ApiKey::DeleteGroups,
    ApiKey::DescribeLogDirs,
    ApiKey::SaslHandshake,
    ApiKey::SaslAuthenticate,
    ApiKey::CreateAcls,
    ApiKey::DescribeAcls,
    ApiKey::DeleteAcls,
    ApiKey::DescribeUserScramCredentials,
    ApiKey::AlterUserScramCredentials,
    ApiKey::AddPartitionsToTxn,
    ApiKey::AddOffsetsToTxn,
    ApiKey::EndTxn,
    ApiKey::DescribeTransactions,
    ApiKey::ListTransactions,
    // Built only when the broker advertises it (inputs draw from the advertised APIs alone).
    ApiKey::TxnOffsetCommit,
];

fn s(v: impl AsRef<str>) -> StrBytes {
    StrBytes::from_string(v.as_ref().to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A topic name: mostly the data topic, else a pool topic, a view of the data topic (valid or not),
/// an unknown name, or an invalid one.
fn topic(rng: &mut Rng) -> String {
    match rng.below(14) {
        0..=5 => DATA_TOPIC.into(),
        6 | 7 => rng.pick(&POOL).to_string(),
        8 => format!("{DATA_TOPIC}.shard-{}-of-2", rng.below(2)),
        9 => format!("{DATA_TOPIC}.shard-{}-of-{}", rng.below(9), rng.below(9)),
        10 => "fz-unknown".into(),
        11 => String::new(),
        12 => "bad name/..".into(),
        _ => "x".repeat(250),
    }
}

/// A topic the fuzzed CreatePartitions and config changes may change: never the data or health
/// topics (their partitions and retention are what the fuzzer's checks rely on).
fn config_target(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => "fz-unknown".to_string(),
        1 => format!("{}.shard-0-of-2", rng.pick(&POOL)),
        _ => rng.pick(&POOL).to_string(),
    }
}

/// A resource of DescribeConfigs / AlterConfigs: topics (2) mostly, brokers (4), an unknown type.
fn resource(rng: &mut Rng) -> (i8, String) {
    match rng.below(6) {
        0 => (4, rng.pick(&["0", "1", "", "99", "x"]).to_string()),
        1 => (*rng.pick(&[0, 8, -1, 127]), "fz-pool-0".to_string()),
        2 => (2, DATA_TOPIC.to_string()),
        _ => (2, config_target(rng)),
    }
}

/// A resource to change configs of: as [`resource`], never the data topic.
fn alter_resource(rng: &mut Rng) -> (i8, String) {
    match resource(rng) {
        (2, t) if t == DATA_TOPIC => (2, config_target(rng)),
        other => other,
    }
}

/// A topic config and a value, sensible or not (`None`: no value).
fn config_value(rng: &mut Rng) -> (&'static str, Option<&'static str>) {
    let key = *rng.pick(&[
        "retention.ms",
        "segment.bytes",
        "cleanup.policy",
        "max.message.bytes",
        "message.timestamp.type",
        "nope",
    ]);
    let value = *rng.pick(&[
        Some("604800000"),
        Some("-1"),
        Some("x"),
        Some("delete"),
        Some("compact"),
        Some("LogAppendTime"),
        Some("9223372036854775807"),
        None,
    ]);
    (key, value)
}

fn name(rng: &mut Rng) -> TopicName {
    TopicName(s(topic(rng)))
}

/// A topic id: mostly the data topic's, else one no topic has, or nil.
fn topic_id(rng: &mut Rng) -> uuid::Uuid {
    let data = *DATA_TOPIC_ID.read().unwrap();
    *rng.pick(&[
        data,
        data,
        uuid::Uuid::from_bytes([0x42; 16]),
        uuid::Uuid::nil(),
    ])
}

fn partition(rng: &mut Rng) -> i32 {
    *rng.pick(&[0, 0, 0, 1, 1, 2, -1, 10_000, i32::MAX])
}

fn offset(rng: &mut Rng) -> i64 {
    match rng.below(8) {
        0..=3 => rng.below(64) as i64,
        4 => -1,
        5 => i64::MAX,
        6 => 1 << 32,
        _ => i64::MIN,
    }
}

fn max_bytes(rng: &mut Rng) -> i32 {
    *rng.pick(&[1 << 20, 1 << 20, 100, 1, 0, -1, i32::MAX])
}

/// A ListOffsets timestamp: the special values, or a time before, among or after the records'.
fn timestamp(rng: &mut Rng) -> i64 {
    match rng.below(9) {
        0 => -1,
        1 => -2,
        2 => -3,
        3 => -4,
        4 => 0,
        5 => now_ms() - rng.below(100_000) as i64,
        6 => now_ms() + 1_000_000,
        7 => i64::MAX,
        _ => i64::MIN,
    }
}

/// Groups with committed offsets are kept for good (as offsets never expire): the fuzzer's own group
/// ids are this many at most, so that what the broker keeps for them stays bounded.
pub const OWN_GROUPS: u64 = 10_000;

/// A group id: one of a few shared groups, the empty id, or one of this input's own (shared only
/// with inputs [`OWN_GROUPS`] apart).
fn group(rng: &mut Rng, index: u64) -> String {
    match rng.below(6) {
        0 | 1 => format!("fz-group-{}", rng.below(3)),
        2 => String::new(),
        _ => format!("fz-own-{}", index % OWN_GROUPS),
    }
}

fn member(rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => String::new(),
        1 => "fz-member".into(),
        _ => format!("fz-member-{}", rng.below(1000)),
    }
}

fn generation(rng: &mut Rng) -> i32 {
    *rng.pick(&[-1, 0, 1, 2, i32::MAX])
}

fn blob(rng: &mut Rng) -> Bytes {
    let n = *rng.pick(&[0usize, 1, 16, 200]);
    Bytes::from(rng.bytes(n))
}

/// A producer id: none, one of a few, one shaped like the broker's (its clock in the high bits,
/// a core in the low ones: see `init_producer_id.rs`), an extreme or an arbitrary one. Real ones
/// are learned in transaction sessions (see [`txn_session`]).
fn producer_id(rng: &mut Rng) -> i64 {
    match rng.below(8) {
        0..=2 => -1,
        3 => 1000 + rng.below(4) as i64,
        4 => (now_ms() << 12) | rng.below(2) as i64,
        5 => *rng.pick(&[0, i64::MAX, i64::MIN, -2]),
        _ => rng.next_u64() as i64 >> 1,
    }
}

fn producer_epoch(rng: &mut Rng) -> i16 {
    *rng.pick(&[-1, 0, 0, 1, 5, i16::MAX - 1, i16::MAX, i16::MIN])
}

/// The broker's `--transaction-max-timeout-ms` here: a fuzzed transaction left open on the data
/// topic holds its last stable offset back this long at most (then the coordinator aborts it).
pub const TXN_MAX_TIMEOUT_MS: i32 = 10_000;

/// A transaction timeout: short valid ones mostly, else hostile (0, -1, just over the broker's
/// maximum, `i32::MAX`).
fn txn_timeout(rng: &mut Rng) -> i32 {
    *rng.pick(&[
        1,
        1000,
        3000,
        TXN_MAX_TIMEOUT_MS,
        0,
        -1,
        TXN_MAX_TIMEOUT_MS + 1,
        i32::MAX,
    ])
}

/// A transactional id: one of a few shared ones mostly, else a hostile one (empty, long, unicode,
/// control characters). A fixed set, so what the broker keeps for them stays bounded.
pub fn transactional_id(rng: &mut Rng) -> String {
    match rng.below(10) {
        0..=5 => format!("fz-tx-{}", rng.below(3)),
        6 => String::new(),
        // Long; under the 32767 bytes a non-flexible string may hold.
        7 => "t".repeat(*rng.pick(&[249, 250, 5000, 32_000])),
        8 => "fz-tx-\u{fc}-\u{1f980}-\u{65e5}\u{672c}".into(),
        _ => "fz-tx-\u{0}\n\u{7f}".into(),
    }
}

/// Transactional ids of transaction sessions are this many at most (as [`OWN_GROUPS`]).
pub const OWN_TXNS: u64 = 1000;

/// One record batch (or several back to back): plain, compressed, or with header fields a producer
/// would not send (CRC recomputed, so they reach the broker's checks beyond the CRC).
fn records(rng: &mut Rng) -> Bytes {
    let now = now_ms();
    let count = 1 + rng.below(3);
    match rng.below(6) {
        0 | 1 => {
            let mut b = BatchBuilder::new(now);
            let pid = producer_id(rng);
            if pid >= 0 {
                b = b.producer(pid, producer_epoch(rng).max(0), rng.below(8) as i32);
                if rng.one_in(3) {
                    // Of no transaction the broker knows of (sessions send the real ones).
                    b = b.transactional();
                }
            }
            for i in 0..count {
                let key = format!("k{i}");
                b.push(
                    now + i as i64,
                    Some(key.as_bytes()),
                    Some(b"fuzz value"),
                    &[],
                );
            }
            Bytes::from(b.finish(0))
        }
        2 => {
            let compression = *rng.pick(&[
                Compression::None,
                Compression::Gzip,
                Compression::Snappy,
                Compression::Lz4,
                Compression::Zstd,
            ]);
            let recs: Vec<Record> = (0..count)
                .map(|i| Record {
                    transactional: false,
                    control: false,
                    delete_horizon: false,
                    partition_leader_epoch: -1,
                    producer_id: -1,
                    producer_epoch: -1,
                    timestamp_type: TimestampType::Creation,
                    offset: i as i64,
                    sequence: -1,
                    timestamp: now,
                    key: None,
                    value: Some(Bytes::from(vec![b'z'; 1 + rng.below(300)])),
                    headers: Default::default(),
                })
                .collect();
            let mut buf = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut buf,
                &recs,
                &RecordEncodeOptions {
                    version: 2,
                    compression,
                },
            )
            .expect("records encode");
            buf.freeze()
        }
        3 => {
            let mut blob = Vec::new();
            for _ in 0..2 + rng.below(3) {
                let mut b = BatchBuilder::new(now);
                b.push(now, None, Some(b"one of several"), &[]);
                blob.extend_from_slice(&b.finish(0));
            }
            Bytes::from(blob)
        }
        _ => Bytes::from(hostile_batch(rng, count)),
    }
}

/// A batch every broker accepts.
fn plain_records(rng: &mut Rng) -> Bytes {
    let now = now_ms();
    let mut b = BatchBuilder::new(now);
    for i in 0..1 + rng.below(3) {
        b.push(now, None, Some(format!("plain {i}").as_bytes()), &[]);
    }
    Bytes::from(b.finish(0))
}

/// A batch with extreme header fields and record deltas, its CRC right.
fn hostile_batch(rng: &mut Rng, count: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(0);
    let ts: i64 = *rng.pick(&[0, 1, i64::MAX, i64::MAX / 2, -1]);
    for i in 0..count {
        let delta = if rng.one_in(3) {
            *rng.pick(&[-1, i32::MAX, i32::MIN, 7])
        } else {
            i as i32
        };
        b.push_with_delta(delta, ts, None, Some(b"hostile"), &[]);
    }
    let mut bytes = b.finish(0);
    let mut h = BatchHeader::parse(&bytes).expect("own batch");
    match rng.below(7) {
        0 => {
            h.base_timestamp = *rng.pick(&[0, 100, i64::MAX - 1, -1]);
            h.max_timestamp = *rng.pick(&[i64::MAX, 100, -1]);
        }
        1 => h.base_offset = *rng.pick(&[-1, i64::MAX, i64::MIN]),
        2 => {
            h.record_count = *rng.pick(&[0, -1, i32::MAX, 2]);
            h.last_offset_delta = h.record_count.wrapping_sub(1);
        }
        3 => h.attributes = *rng.pick(&[0x08, 0x10, 0x20, 0x01, 0x07, 0x05, -1]),
        4 => {
            h.producer_id = *rng.pick(&[0, 1000, i64::MAX]);
            h.producer_epoch = *rng.pick(&[0, -1, i16::MAX]);
            h.base_sequence = *rng.pick(&[0, i32::MAX, i32::MAX - 1, -1]);
        }
        5 => {
            // Record bytes that do not parse, under a valid CRC.
            let from = shards::batch::HEADER_LEN;
            for _ in 0..1 + rng.below(4) {
                let at = from + rng.below(bytes.len() - from);
                bytes[at] = rng.next_u64() as u8;
            }
        }
        _ => {}
    }
    shards::batch::write_header(&mut bytes, &h);
    bytes
}

/// The frame of a valid request for `key` at `version`, with `correlation` as its correlation id.
pub fn build(rng: &mut Rng, key: ApiKey, version: i16, correlation: i32, index: u64) -> Vec<u8> {
    let v = version;
    macro_rules! frame {
        ($body:expr) => {
            request_frame(key, version, correlation, &$body)
        };
    }
    match key {
        ApiKey::Produce => {
            let acks_zero = rng.one_in(8);
            let topics = if acks_zero {
                // acks=0 to the data topic; an error (the partition led by another core) closes the
                // connection, by design: see `may_close`.
                vec![produce_request::TopicProduceData::default()
                    .with_name(TopicName(s(DATA_TOPIC)))
                    .with_topic_id(*DATA_TOPIC_ID.read().unwrap())
                    .with_partition_data(vec![produce_request::PartitionProduceData::default()
                        .with_index(rng.below(2) as i32)
                        .with_records(Some(plain_records(rng)))])]
            } else {
                (0..1 + rng.below(2))
                    .map(|_| {
                        produce_request::TopicProduceData::default()
                            .with_name(name(rng))
                            .with_topic_id(topic_id(rng))
                            .with_partition_data(
                                (0..1 + rng.below(2))
                                    .map(|_| {
                                        produce_request::PartitionProduceData::default()
                                            .with_index(partition(rng))
                                            .with_records(if rng.one_in(10) {
                                                None
                                            } else {
                                                Some(records(rng))
                                            })
                                    })
                                    .collect(),
                            )
                    })
                    .collect()
            };
            let acks = if acks_zero {
                0
            } else {
                *rng.pick(&[1, -1, 1, 2])
            };
            frame!(ProduceRequest::default()
                .with_transactional_id(
                    (!acks_zero && rng.one_in(8))
                        .then(|| TransactionalId(s(transactional_id(rng)))),
                )
                .with_acks(acks)
                .with_timeout_ms(*rng.pick(&[1000, 0, -1, i32::MAX]))
                .with_topic_data(topics))
        }
        ApiKey::Fetch => {
            let topics = (0..1 + rng.below(2))
                .map(|_| {
                    let t = fetch_request::FetchTopic::default();
                    // v13+ name the topic by id.
                    let t = if v >= 13 {
                        t.with_topic_id(topic_id(rng))
                    } else {
                        t.with_topic(name(rng))
                    };
                    t.with_partitions(
                        (0..1 + rng.below(3))
                            .map(|_| {
                                let p = fetch_request::FetchPartition::default()
                                    .with_partition(partition(rng))
                                    .with_fetch_offset(offset(rng))
                                    .with_partition_max_bytes(max_bytes(rng));
                                let p = if v >= 5 {
                                    p.with_log_start_offset(*rng.pick(&[-1, 0, i64::MAX]))
                                } else {
                                    p
                                };
                                if v >= 9 {
                                    p.with_current_leader_epoch(*rng.pick(&[-1, 0, 5]))
                                } else {
                                    p
                                }
                            })
                            .collect(),
                    )
                })
                .collect();
            let replica = BrokerId(*rng.pick(&[-1, -1, 0, 1]));
            let mut r = FetchRequest::default();
            // v15 moved the replica id into replica_state.
            if v >= 15 {
                r.replica_state.replica_id = replica;
            } else {
                r.replica_id = replica;
            }
            let mut r = r
                .with_max_wait_ms(*rng.pick(&[0, 0, 10, 100, -1]))
                .with_min_bytes(*rng.pick(&[0, 1, 1, -1, 1 << 20]))
                .with_max_bytes(max_bytes(rng))
                .with_isolation_level(*rng.pick(&[0, 1]))
                .with_topics(topics);
            if v >= 7 {
                r = r
                    .with_session_id(*rng.pick(&[0, 0, 1, -1]))
                    .with_session_epoch(*rng.pick(&[-1, 0, 1]))
                    .with_forgotten_topics_data(if rng.one_in(4) {
                        let t = fetch_request::ForgottenTopic::default();
                        let t = if v >= 13 {
                            t.with_topic_id(topic_id(rng))
                        } else {
                            t.with_topic(name(rng))
                        };
                        vec![t.with_partitions(vec![partition(rng)])]
                    } else {
                        vec![]
                    });
            }
            if v >= 11 {
                r = r.with_rack_id(s("rack"));
            }
            frame!(r)
        }
        ApiKey::ListOffsets => {
            let topics = (0..1 + rng.below(2))
                .map(|_| {
                    list_offsets_request::ListOffsetsTopic::default()
                        .with_name(name(rng))
                        .with_partitions(
                            (0..1 + rng.below(3))
                                .map(|_| {
                                    let p = list_offsets_request::ListOffsetsPartition::default()
                                        .with_partition_index(partition(rng))
                                        .with_timestamp(timestamp(rng));
                                    if v >= 4 {
                                        p.with_current_leader_epoch(*rng.pick(&[-1, 0, 3]))
                                    } else {
                                        p
                                    }
                                })
                                .collect(),
                        )
                })
                .collect();
            let r = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(topics);
            let r = if v >= 2 {
                r.with_isolation_level(*rng.pick(&[0, 1]))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::Metadata => {
            let topics = if v >= 1 && rng.one_in(4) {
                None
            } else {
                Some(
                    (0..rng.below(3) + usize::from(v == 0))
                        .map(|_| {
                            metadata_request::MetadataRequestTopic::default()
                                .with_name(Some(name(rng)))
                        })
                        .collect(),
                )
            };
            let mut r = MetadataRequest::default().with_topics(topics);
            if v >= 4 {
                r = r.with_allow_auto_topic_creation(rng.one_in(2));
            }
            if (8..=10).contains(&v) {
                r = r.with_include_cluster_authorized_operations(rng.one_in(2));
            }
            if v >= 8 {
                r = r.with_include_topic_authorized_operations(rng.one_in(2));
            }
            frame!(r)
        }
        ApiKey::ApiVersions => {
            let r = ApiVersionsRequest::default();
            let r = if v >= 3 {
                r.with_client_software_name(s("shoal-fuzz"))
                    .with_client_software_version(s("1.0"))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::CreateTopics => {
            let topics = (0..1 + rng.below(2))
                .map(|_| {
                    let name = if rng.one_in(2) {
                        rng.pick(&POOL).to_string()
                    } else {
                        topic(rng)
                    };
                    let configs = match rng.below(4) {
                        0 => vec![create_topics_request::CreatableTopicConfig::default()
                            .with_name(s("retention.ms"))
                            .with_value(Some(s(rng.pick(&[
                                "1000",
                                "-1",
                                "x",
                                "9223372036854775807",
                            ]))))],
                        1 => vec![create_topics_request::CreatableTopicConfig::default()
                            .with_name(s(rng.pick(&["segment.bytes", "cleanup.policy", "nope"])))
                            .with_value(rng.one_in(4).then(|| s("1")))],
                        _ => vec![],
                    };
                    let assignments = if rng.one_in(6) {
                        vec![create_topics_request::CreatableReplicaAssignment::default()
                            .with_partition_index(0)
                            .with_broker_ids(vec![BrokerId(0)])]
                    } else {
                        vec![]
                    };
                    create_topics_request::CreatableTopic::default()
                        .with_name(TopicName(s(name)))
                        .with_num_partitions(*rng.pick(&[1, 2, 3, -1, 0, 10_001, i32::MAX]))
                        .with_replication_factor(*rng.pick(&[1, -1, 3]))
                        .with_assignments(assignments)
                        .with_configs(configs)
                })
                .collect();
            frame!(CreateTopicsRequest::default()
                .with_topics(topics)
                .with_timeout_ms(*rng.pick(&[10_000, 0, -1]))
                .with_validate_only(rng.one_in(2)))
        }
        ApiKey::CreatePartitions => {
            let topics = (0..1 + rng.below(2))
                .map(|_| {
                    let assignments = rng.one_in(4).then(|| {
                        vec![
                            create_partitions_request::CreatePartitionsAssignment::default()
                                .with_broker_ids(vec![BrokerId(*rng.pick(&[0, 1, 7]))]),
                        ]
                    });
                    create_partitions_request::CreatePartitionsTopic::default()
                        .with_name(TopicName(s(config_target(rng))))
                        .with_count(*rng.pick(&[1, 2, 3, 4, 0, -1, 10_001, i32::MAX]))
                        .with_assignments(assignments)
                })
                .collect();
            frame!(CreatePartitionsRequest::default()
                .with_topics(topics)
                .with_timeout_ms(10_000)
                .with_validate_only(rng.one_in(2)))
        }
        ApiKey::DescribeConfigs => {
            let resources = (0..1 + rng.below(3))
                .map(|_| {
                    let (resource_type, name) = resource(rng);
                    describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(s(name))
                        .with_configuration_keys(rng.one_in(2).then(|| {
                            vec![s(rng.pick(&["retention.ms", "nope", "log.segment.bytes"]))]
                        }))
                })
                .collect();
            frame!(DescribeConfigsRequest::default()
                .with_resources(resources)
                .with_include_synonyms(rng.one_in(2))
                .with_include_documentation(v >= 3 && rng.one_in(2)))
        }
        ApiKey::AlterConfigs => {
            let resources = (0..1 + rng.below(2))
                .map(|_| {
                    let (resource_type, name) = alter_resource(rng);
                    let configs = (0..rng.below(3))
                        .map(|_| {
                            let (k, v) = config_value(rng);
                            alter_configs_request::AlterableConfig::default()
                                .with_name(s(k))
                                .with_value(v.map(s))
                        })
                        .collect();
                    alter_configs_request::AlterConfigsResource::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(s(name))
                        .with_configs(configs)
                })
                .collect();
            frame!(AlterConfigsRequest::default()
                .with_resources(resources)
                .with_validate_only(rng.one_in(2)))
        }
        ApiKey::IncrementalAlterConfigs => {
            let resources = (0..1 + rng.below(2))
                .map(|_| {
                    let (resource_type, name) = alter_resource(rng);
                    let configs = (0..rng.below(3))
                        .map(|_| {
                            let (k, v) = config_value(rng);
                            incremental_alter_configs_request::AlterableConfig::default()
                                .with_name(s(k))
                                .with_config_operation(*rng.pick(&[0, 1, 2, 3, 9, -1]))
                                .with_value(v.map(s))
                        })
                        .collect();
                    incremental_alter_configs_request::AlterConfigsResource::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(s(name))
                        .with_configs(configs)
                })
                .collect();
            frame!(IncrementalAlterConfigsRequest::default()
                .with_resources(resources)
                .with_validate_only(rng.one_in(2)))
        }
        ApiKey::DeleteTopics => {
            let n = 1 + rng.below(2);
            let names: Vec<TopicName> = (0..n)
                .map(|_| {
                    if rng.one_in(2) {
                        TopicName(s(rng.pick(&POOL)))
                    } else {
                        TopicName(s(rng.pick(&["fz-unknown", "", "bad name/.."])))
                    }
                })
                .collect();
            let r = DeleteTopicsRequest::default().with_timeout_ms(10_000);
            let r = if v >= 6 {
                r.with_topics(
                    names
                        .into_iter()
                        .map(|n| {
                            let t = delete_topics_request::DeleteTopicState::default();
                            if rng.one_in(3) {
                                t.with_topic_id(uuid::Uuid::from_u64_pair(
                                    rng.next_u64(),
                                    rng.next_u64(),
                                ))
                            } else {
                                t.with_name(Some(n))
                            }
                        })
                        .collect(),
                )
            } else {
                r.with_topic_names(names)
            };
            frame!(r)
        }
        ApiKey::InitProducerId => {
            let r = InitProducerIdRequest::default()
                .with_transactional_id(
                    rng.one_in(2)
                        .then(|| TransactionalId(s(transactional_id(rng)))),
                )
                .with_transaction_timeout_ms(txn_timeout(rng));
            let r = if v >= 3 {
                r.with_producer_id(ProducerId(producer_id(rng)))
                    .with_producer_epoch(producer_epoch(rng))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::FindCoordinator => {
            let key_type = *rng.pick(&[0, 0, 1, 1, 2, -1]);
            let r = FindCoordinatorRequest::default();
            let r = if v >= 1 { r.with_key_type(key_type) } else { r };
            // Transactional ids for transaction coordinators, group ids else (or the other way).
            let key = |rng: &mut Rng| {
                if (key_type == 1) != rng.one_in(8) {
                    s(transactional_id(rng))
                } else {
                    s(group(rng, index))
                }
            };
            let r = if v >= 4 {
                r.with_coordinator_keys((0..rng.below(3)).map(|_| key(rng)).collect())
            } else {
                r.with_key(key(rng))
            };
            frame!(r)
        }
        ApiKey::JoinGroup => {
            // Its own group: a join into a shared group would wait for that group's rebalance.
            let r = JoinGroupRequest::default()
                .with_group_id(GroupId(s(format!("fz-join-{index}"))))
                .with_session_timeout_ms(*rng.pick(&[10_000, 6_000, 0, -1, i32::MAX]))
                .with_member_id(s(member(rng)))
                .with_protocol_type(s(rng.pick(&["consumer", "", "other"])))
                .with_protocols(
                    (0..rng.below(3))
                        .map(|i| {
                            join_group_request::JoinGroupRequestProtocol::default()
                                .with_name(s(format!("proto-{i}")))
                                .with_metadata(blob(rng))
                        })
                        .collect(),
                );
            let r = if v >= 1 {
                r.with_rebalance_timeout_ms(*rng.pick(&[1_000, 0, -1, 5_000]))
            } else {
                r
            };
            let r = if v >= 5 && rng.one_in(3) {
                r.with_group_instance_id(Some(s("fz-instance")))
            } else {
                r
            };
            let r = if v >= 8 {
                r.with_reason(Some(s("fuzz")))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::SyncGroup => {
            let r = SyncGroupRequest::default()
                .with_group_id(GroupId(s(group(rng, index))))
                .with_generation_id(generation(rng))
                .with_member_id(s(member(rng)))
                .with_assignments(
                    (0..rng.below(3))
                        .map(|_| {
                            sync_group_request::SyncGroupRequestAssignment::default()
                                .with_member_id(s(member(rng)))
                                .with_assignment(blob(rng))
                        })
                        .collect(),
                );
            let r = if v >= 3 && rng.one_in(3) {
                r.with_group_instance_id(Some(s("fz-instance")))
            } else {
                r
            };
            let r = if v >= 5 {
                r.with_protocol_type(Some(s("consumer")))
                    .with_protocol_name(Some(s("proto-0")))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::Heartbeat => {
            let r = HeartbeatRequest::default()
                .with_group_id(GroupId(s(group(rng, index))))
                .with_generation_id(generation(rng))
                .with_member_id(s(member(rng)));
            let r = if v >= 3 && rng.one_in(3) {
                r.with_group_instance_id(Some(s("fz-instance")))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::LeaveGroup => {
            let r = LeaveGroupRequest::default().with_group_id(GroupId(s(group(rng, index))));
            let r = if v >= 3 {
                r.with_members(
                    (0..rng.below(3))
                        .map(|_| {
                            let m = leave_group_request::MemberIdentity::default()
                                .with_member_id(s(member(rng)))
                                .with_group_instance_id(rng.one_in(3).then(|| s("fz-instance")));
                            if v >= 5 {
                                m.with_reason(Some(s("fuzz")))
                            } else {
                                m
                            }
                        })
                        .collect(),
                )
            } else {
                r.with_member_id(s(member(rng)))
            };
            frame!(r)
        }
        ApiKey::OffsetCommit => {
            let topics = (0..1 + rng.below(2))
                .map(|_| {
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(name(rng))
                        .with_partitions(
                            (0..1 + rng.below(3))
                                .map(|_| {
                                    let p = offset_commit_request::OffsetCommitRequestPartition::default()
                                        .with_partition_index(partition(rng))
                                        .with_committed_offset(offset(rng))
                                        .with_committed_metadata(match rng.below(3) {
                                            0 => None,
                                            1 => Some(s("meta")),
                                            _ => Some(s("m".repeat(5000))),
                                        });
                                    if v >= 6 {
                                        p.with_committed_leader_epoch(*rng.pick(&[-1, 0, 7]))
                                    } else {
                                        p
                                    }
                                })
                                .collect(),
                        )
                })
                .collect();
            let r = OffsetCommitRequest::default()
                .with_group_id(GroupId(s(group(rng, index))))
                .with_generation_id_or_member_epoch(*rng.pick(&[-1, -1, 0, 1]))
                .with_member_id(s(member(rng)))
                .with_topics(topics);
            let r = if v <= 4 {
                r.with_retention_time_ms(*rng.pick(&[-1, 0, i64::MAX]))
            } else {
                r
            };
            let r = if v >= 7 && rng.one_in(3) {
                r.with_group_instance_id(Some(s("fz-instance")))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::OffsetFetch => {
            let topics = |rng: &mut Rng| {
                (0..1 + rng.below(2))
                    .map(|_| {
                        (
                            name(rng),
                            (0..rng.below(3)).map(|_| partition(rng)).collect(),
                        )
                    })
                    .collect::<Vec<(TopicName, Vec<i32>)>>()
            };
            let r = OffsetFetchRequest::default();
            let r = if v >= 8 {
                r.with_groups(
                    (0..1 + rng.below(2))
                        .map(|_| {
                            let g = offset_fetch_request::OffsetFetchRequestGroup::default()
                                .with_group_id(GroupId(s(group(rng, index))));
                            if rng.one_in(3) {
                                g.with_topics(None)
                            } else {
                                g.with_topics(Some(
                                    topics(rng)
                                        .into_iter()
                                        .map(|(n, p)| {
                                            offset_fetch_request::OffsetFetchRequestTopics::default(
                                            )
                                            .with_name(n)
                                            .with_partition_indexes(p)
                                        })
                                        .collect(),
                                ))
                            }
                        })
                        .collect(),
                )
            } else {
                let r = r.with_group_id(GroupId(s(group(rng, index))));
                if v >= 2 && rng.one_in(3) {
                    r.with_topics(None)
                } else {
                    r.with_topics(Some(
                        topics(rng)
                            .into_iter()
                            .map(|(n, p)| {
                                offset_fetch_request::OffsetFetchRequestTopic::default()
                                    .with_name(n)
                                    .with_partition_indexes(p)
                            })
                            .collect(),
                    ))
                }
            };
            let r = if v >= 7 {
                r.with_require_stable(rng.one_in(2))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::ListGroups => {
            let r = ListGroupsRequest::default();
            let r = if v >= 4 {
                r.with_states_filter(
                    (0..rng.below(3))
                        .map(|_| s(rng.pick(&["Stable", "Empty", "dead", "nonsense"])))
                        .collect(),
                )
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::DescribeGroups => {
            let r = DescribeGroupsRequest::default().with_groups(
                (0..rng.below(3))
                    .map(|_| GroupId(s(group(rng, index))))
                    .collect(),
            );
            let r = if v >= 3 {
                r.with_include_authorized_operations(rng.one_in(2))
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::OffsetDelete => frame!(OffsetDeleteRequest::default()
            .with_group_id(GroupId(s(group(rng, index))))
            .with_topics(
                (0..rng.below(3))
                    .map(|_| {
                        offset_delete_request::OffsetDeleteRequestTopic::default()
                            .with_name(name(rng))
                            .with_partitions(
                                (0..1 + rng.below(3))
                                    .map(|_| {
                                        offset_delete_request::OffsetDeleteRequestPartition::default()
                                            .with_partition_index(partition(rng))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )),
        ApiKey::ConsumerGroupHeartbeat => frame!(ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s(group(rng, index))))
            .with_member_id(s(member(rng)))
            .with_member_epoch(*rng.pick(&[-2, -1, 0, 0, 1, 7, i32::MAX]))
            .with_instance_id(rng.one_in(3).then(|| s("fz-instance")))
            .with_rebalance_timeout_ms(*rng.pick(&[-1, 0, 30_000]))
            .with_subscribed_topic_names(if rng.one_in(4) {
                None
            } else {
                Some((0..rng.below(3)).map(|_| name(rng)).collect())
            })
            .with_subscribed_topic_regex(
                (v >= 1 && rng.one_in(3)).then(|| s(*rng.pick(&["fz.*", "(", ""])))
            )
            .with_server_assignor(rng.one_in(3).then(|| s(*rng.pick(&["uniform", "range", "x"]))))
            .with_topic_partitions(if rng.one_in(3) {
                None
            } else {
                Some(
                    (0..rng.below(3))
                        .map(|_| {
                            consumer_group_heartbeat_request::TopicPartitions::default()
                                .with_topic_id(topic_id(rng))
                                .with_partitions(vec![partition(rng)])
                        })
                        .collect(),
                )
            })),
        ApiKey::ConsumerGroupDescribe => frame!(ConsumerGroupDescribeRequest::default()
            .with_group_ids((0..rng.below(3)).map(|_| GroupId(s(group(rng, index)))).collect())
            .with_include_authorized_operations(rng.one_in(2))),
        ApiKey::DeleteGroups => frame!(DeleteGroupsRequest::default().with_groups_names(
            (0..rng.below(3))
                .map(|_| GroupId(s(group(rng, index))))
                .collect(),
        )),
        ApiKey::DescribeLogDirs => {
            // Null (every partition here) or some topics with partitions, some of them hostile.
            let topics = (!rng.one_in(3)).then(|| {
                (0..rng.below(3))
                    .map(|_| {
                        describe_log_dirs_request::DescribableLogDirTopic::default()
                            .with_topic(TopicName(s(topic(rng))))
                            .with_partitions((0..rng.below(4)).map(|_| partition(rng)).collect())
                    })
                    .collect()
            });
            frame!(DescribeLogDirsRequest::default().with_topics(topics))
        }
        ApiKey::SaslHandshake => frame!(SaslHandshakeRequest::default()
            .with_mechanism(s(*rng.pick(&["PLAIN", "SCRAM-SHA-256", "GSSAPI", ""])))),
        ApiKey::SaslAuthenticate => frame!(SaslAuthenticateRequest::default().with_auth_bytes(
            Bytes::from(
                (0..rng.below(64))
                    .map(|_| rng.next_u64() as u8)
                    .collect::<Vec<u8>>()
            )
        )),
        ApiKey::CreateAcls => frame!(CreateAclsRequest::default().with_creations(
            (0..rng.below(3))
                .map(|_| {
                    create_acls_request::AclCreation::default()
                        .with_resource_type(rng.below(8) as i8)
                        .with_resource_name(s(topic(rng)))
                        .with_resource_pattern_type(rng.below(6) as i8)
                        .with_principal(s(*rng.pick(&["User:fz", "User:*", "fz", "User:"])))
                        .with_host(s(*rng.pick(&["*", "127.0.0.1", ""])))
                        .with_operation(rng.below(14) as i8)
                        .with_permission_type(rng.below(5) as i8)
                })
                .collect(),
        )),
        ApiKey::DeleteRecords => frame!(DeleteRecordsRequest::default()
            .with_timeout_ms(*rng.pick(&[-1, 0, 1000]))
            .with_topics(
                (0..1 + rng.below(2))
                    .map(|_| {
                        delete_records_request::DeleteRecordsTopic::default()
                            .with_name(name(rng))
                            .with_partitions(
                                (0..1 + rng.below(3))
                                    .map(|_| {
                                        delete_records_request::DeleteRecordsPartition::default()
                                            .with_partition_index(partition(rng))
                                            .with_offset(*rng.pick(&[-2, -1, 0, 1, 5, i64::MAX]))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )),
        ApiKey::DescribeAcls => frame!(DescribeAclsRequest::default()
            .with_resource_type_filter(rng.below(8) as i8)
            .with_resource_name_filter(rng.one_in(2).then(|| s(topic(rng))))
            .with_pattern_type_filter(rng.below(6) as i8)
            .with_operation(rng.below(14) as i8)
            .with_permission_type(rng.below(5) as i8)),
        ApiKey::DeleteAcls => frame!(DeleteAclsRequest::default().with_filters(
            (0..rng.below(3))
                .map(|_| {
                    delete_acls_request::DeleteAclsFilter::default()
                        .with_resource_type_filter(rng.below(8) as i8)
                        .with_resource_name_filter(rng.one_in(2).then(|| s(topic(rng))))
                        .with_pattern_type_filter(rng.below(6) as i8)
                        .with_principal_filter(rng.one_in(2).then(|| s("User:fz")))
                        .with_operation(rng.below(14) as i8)
                        .with_permission_type(rng.below(5) as i8)
                })
                .collect(),
        )),
        ApiKey::DescribeUserScramCredentials => {
            frame!(
                DescribeUserScramCredentialsRequest::default().with_users(rng.one_in(2).then(
                    || {
                        (0..rng.below(3))
                            .map(|_| {
                                describe_user_scram_credentials_request::UserName::default()
                                    .with_name(s(*rng.pick(&["fz", "", "admin"])))
                            })
                            .collect()
                    }
                ))
            )
        }
        ApiKey::AlterUserScramCredentials => frame!(AlterUserScramCredentialsRequest::default()
            .with_deletions(
                (0..rng.below(2))
                    .map(|_| {
                        alter_user_scram_credentials_request::ScramCredentialDeletion::default()
                            .with_name(s("fz-user"))
                            .with_mechanism(rng.below(4) as i8)
                    })
                    .collect()
            )
            .with_upsertions(
                (0..rng.below(2))
                    .map(|_| {
                        alter_user_scram_credentials_request::ScramCredentialUpsertion::default()
                            .with_name(s(*rng.pick(&["fz-user", ""])))
                            .with_mechanism(rng.below(4) as i8)
                            .with_iterations(*rng.pick(&[0, 4096, 100_000, -1]))
                            .with_salt(Bytes::from_static(b"salt-salt"))
                            .with_salted_password(Bytes::from(vec![7u8; rng.below(70)]))
                    })
                    .collect()
            )),
        ApiKey::AddPartitionsToTxn => {
            // v0-3 carry one transaction; v4+ (broker to broker, KIP-890) a list of them.
            let topics =
                |rng: &mut Rng| -> Vec<add_partitions_to_txn_request::AddPartitionsToTxnTopic> {
                    (0..rng.below(3))
                        .map(|_| {
                            add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                                .with_name(name(rng))
                                .with_partitions(
                                    (0..rng.below(4)).map(|_| partition(rng)).collect(),
                                )
                        })
                        .collect()
                };
            let r = AddPartitionsToTxnRequest::default();
            let r = if v <= 3 {
                r.with_v3_and_below_transactional_id(TransactionalId(s(transactional_id(rng))))
                    .with_v3_and_below_producer_id(ProducerId(producer_id(rng)))
                    .with_v3_and_below_producer_epoch(producer_epoch(rng))
                    .with_v3_and_below_topics(topics(rng))
            } else {
                r.with_transactions(
                    (0..rng.below(3))
                        .map(|_| {
                            add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                                .with_transactional_id(TransactionalId(s(transactional_id(rng))))
                                .with_producer_id(ProducerId(producer_id(rng)))
                                .with_producer_epoch(producer_epoch(rng))
                                .with_verify_only(rng.one_in(2))
                                .with_topics(topics(rng))
                        })
                        .collect(),
                )
            };
            frame!(r)
        }
        ApiKey::AddOffsetsToTxn => frame!(AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s(transactional_id(rng))))
            .with_producer_id(ProducerId(producer_id(rng)))
            .with_producer_epoch(producer_epoch(rng))
            .with_group_id(GroupId(s(group(rng, index))))),
        ApiKey::EndTxn => frame!(EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(transactional_id(rng))))
            .with_producer_id(ProducerId(producer_id(rng)))
            .with_producer_epoch(producer_epoch(rng))
            .with_committed(rng.one_in(2))),
        ApiKey::DescribeTransactions => frame!(DescribeTransactionsRequest::default()
            .with_transactional_ids(
                (0..rng.below(4))
                    .map(|_| TransactionalId(s(transactional_id(rng))))
                    .collect()
            )),
        ApiKey::ListTransactions => {
            let states = [
                "Empty",
                "Ongoing",
                "PrepareCommit",
                "CompleteAbort",
                "Dead",
                "x",
                "",
            ];
            let r = ListTransactionsRequest::default()
                .with_state_filters((0..rng.below(3)).map(|_| s(*rng.pick(&states))).collect())
                .with_producer_id_filters(
                    (0..rng.below(3))
                        .map(|_| ProducerId(producer_id(rng)))
                        .collect(),
                );
            let r = if v >= 1 {
                r.with_duration_filter(*rng.pick(&[-1, 0, 1, 60_000, i64::MAX, i64::MIN]))
            } else {
                r
            };
            let r = if v >= 2 {
                r.with_transactional_id_pattern(
                    rng.one_in(2)
                        .then(|| s(*rng.pick(&["fz-tx-.*", "(", "", ".*"]))),
                )
            } else {
                r
            };
            frame!(r)
        }
        ApiKey::TxnOffsetCommit => {
            let (id, group) = (transactional_id(rng), group(rng, index));
            let (producer_id, epoch) = (producer_id(rng), producer_epoch(rng));
            frame!(txn_offset_commit(rng, v, &id, &group, producer_id, epoch))
        }
        other => panic!("the fuzzer has no request generator for {other:?}: add one"),
    }
}

/// A TxnOffsetCommit of offsets on the data topic (v3+: with a generation and member, here none).
fn txn_offset_commit(
    rng: &mut Rng,
    v: i16,
    id: &str,
    group: &str,
    producer_id: i64,
    epoch: i16,
) -> TxnOffsetCommitRequest {
    let r = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_topics(vec![
            txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(s(DATA_TOPIC)))
                .with_partitions(
                    (0..1 + rng.below(2))
                        .map(|_| {
                            let p = txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                                .with_partition_index(partition(rng))
                                .with_committed_offset(offset(rng))
                                .with_committed_metadata(rng.one_in(2).then(|| s("fz")));
                            if v >= 2 {
                                p.with_committed_leader_epoch(*rng.pick(&[-1, 0, 7]))
                            } else {
                                p
                            }
                        })
                        .collect(),
                ),
        ]);
    if v >= 3 {
        r.with_generation_id(generation(rng))
            .with_member_id(s(member(rng)))
            .with_group_instance_id(rng.one_in(4).then(|| s("fz-instance")))
    } else {
        r
    }
}

/// Whether a valid request may be answered by closing the connection: a Produce with acks=0 has no
/// response to carry an error in (a partition led by another core, or a topic deleted meanwhile).
pub fn may_close(frame: &[u8]) -> bool {
    let mut body = Bytes::copy_from_slice(&frame[4..]);
    let version = i16::from_be_bytes([frame[6], frame[7]]);
    i16::from_be_bytes([frame[4], frame[5]]) == ApiKey::Produce as i16
        && RequestHeader::decode(&mut body, ApiKey::Produce.request_header_version(version)).is_ok()
        && ProduceRequest::decode(&mut body, version).is_ok_and(|r| r.acks == 0)
}

/// A JoinGroup that a fresh group answers at once (with `--group-initial-rebalance-delay-ms 0`): the
/// first step of a consumer group session.
pub fn join(version: i16, correlation: i32, group: &str, member: &str) -> Vec<u8> {
    let r = JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(10_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default(
        )
        .with_name(s("range"))
        .with_metadata(Bytes::from_static(b"\0\0\0\0\0\x01\0\x07fz-data\0\0\0\0"))]);
    let r = if version >= 1 {
        r.with_rebalance_timeout_ms(5_000)
    } else {
        r
    };
    request_frame(ApiKey::JoinGroup, version, correlation, &r)
}

/// What a member of a group does after joining (member id and generation from the JoinGroup
/// answer): sync (the leader with an assignment), heartbeat, commit and fetch offsets, describe,
/// list, and leave last; a random subset, each at a random advertised version.
pub fn session(
    rng: &mut Rng,
    apis: &[(ApiKey, i16)],
    group: &str,
    member: &str,
    generation: i32,
    leader: bool,
) -> Vec<Vec<u8>> {
    let version =
        |rng: &mut Rng, key: ApiKey| advertised_version(rng, apis, key, 0..=i16::MAX).unwrap();
    let g = GroupId(s(group));
    let mut out = Vec::new();
    let mut correlation = 10;
    let mut push = |frame: Vec<u8>| out.push(frame);
    let steps = [
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::DescribeGroups,
        ApiKey::ListGroups,
        ApiKey::LeaveGroup,
    ];
    for key in steps {
        if key != ApiKey::SyncGroup && rng.one_in(3) {
            continue;
        }
        let v = version(rng, key);
        correlation += 1;
        let frame = match key {
            ApiKey::SyncGroup => {
                let r = SyncGroupRequest::default()
                    .with_group_id(g.clone())
                    .with_generation_id(generation)
                    .with_member_id(s(member))
                    .with_assignments(if leader {
                        vec![sync_group_request::SyncGroupRequestAssignment::default()
                            .with_member_id(s(member))
                            .with_assignment(blob(rng))]
                    } else {
                        vec![]
                    });
                let r = if v >= 5 {
                    r.with_protocol_type(Some(s("consumer")))
                        .with_protocol_name(Some(s("range")))
                } else {
                    r
                };
                request_frame(key, v, correlation, &r)
            }
            ApiKey::Heartbeat => request_frame(
                key,
                v,
                correlation,
                &HeartbeatRequest::default()
                    .with_group_id(g.clone())
                    .with_generation_id(generation)
                    .with_member_id(s(member)),
            ),
            ApiKey::OffsetCommit => {
                let r = OffsetCommitRequest::default()
                    .with_group_id(g.clone())
                    .with_generation_id_or_member_epoch(generation)
                    .with_member_id(s(member))
                    .with_topics(
                        vec![offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(DATA_TOPIC)))
                        .with_partitions(
                            (0..2)
                                .map(|p| {
                                    offset_commit_request::OffsetCommitRequestPartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset(rng))
                                        .with_committed_metadata(Some(s("")))
                                })
                                .collect(),
                        )],
                    );
                request_frame(key, v, correlation, &r)
            }
            ApiKey::OffsetFetch => {
                let r = OffsetFetchRequest::default();
                let r = if v >= 8 {
                    r.with_groups(vec![
                        offset_fetch_request::OffsetFetchRequestGroup::default()
                            .with_group_id(g.clone())
                            .with_topics(None),
                    ])
                } else {
                    r.with_group_id(g.clone()).with_topics(Some(vec![
                        offset_fetch_request::OffsetFetchRequestTopic::default()
                            .with_name(TopicName(s(DATA_TOPIC)))
                            .with_partition_indexes(vec![0, 1]),
                    ]))
                };
                request_frame(key, v, correlation, &r)
            }
            ApiKey::DescribeGroups => request_frame(
                key,
                v,
                correlation,
                &DescribeGroupsRequest::default().with_groups(vec![g.clone()]),
            ),
            ApiKey::ListGroups => request_frame(key, v, correlation, &ListGroupsRequest::default()),
            _ => {
                let r = LeaveGroupRequest::default().with_group_id(g.clone());
                let r = if v >= 3 {
                    r.with_members(vec![
                        leave_group_request::MemberIdentity::default().with_member_id(s(member))
                    ])
                } else {
                    r.with_member_id(s(member))
                };
                request_frame(key, v, correlation, &r)
            }
        };
        push(frame);
    }
    out
}

/// One of the versions of `key` the broker advertises within `range`, if any.
pub fn advertised_version(
    rng: &mut Rng,
    apis: &[(ApiKey, i16)],
    key: ApiKey,
    range: std::ops::RangeInclusive<i16>,
) -> Option<i16> {
    let vs: Vec<i16> = apis
        .iter()
        .filter(|(k, v)| *k == key && range.contains(v))
        .map(|(_, v)| *v)
        .collect();
    (!vs.is_empty()).then(|| *rng.pick(&vs))
}

/// The InitProducerId that opens a transaction session: a transactional id of its own, a short
/// valid timeout (a transaction it leaves open is aborted by the coordinator soon).
pub fn init_txn(version: i16, correlation: i32, id: &str, timeout_ms: i32) -> Vec<u8> {
    let r = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s(id))))
        .with_transaction_timeout_ms(timeout_ms);
    let r = if version >= 3 {
        r.with_producer_id(ProducerId(-1)).with_producer_epoch(-1)
    } else {
        r
    };
    request_frame(ApiKey::InitProducerId, version, correlation, &r)
}

/// What a transactional producer does once its InitProducerId is answered (producer id and epoch
/// from the answer): adds data topic partitions to its transaction, produces transactional batches
/// to them, adds a group's offsets and commits them (TxnOffsetCommit, where the broker serves it),
/// ends the transaction (commit or abort; one in four is left open, for the coordinator to abort at
/// its timeout), describes and lists transactions, and initialises again (fencing itself); a random
/// subset in that order, each at a random advertised version.
pub fn txn_session(
    rng: &mut Rng,
    apis: &[(ApiKey, i16)],
    id: &str,
    producer_id: i64,
    epoch: i16,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut correlation = 10;
    let tid = || TransactionalId(s(id));
    let pid = ProducerId(producer_id);
    let partitions: Vec<i32> = match rng.below(4) {
        0 => vec![0],
        1 => vec![1],
        _ => vec![0, 1],
    };
    let group = format!("fz-txn-group-{}", rng.below(3));
    let mut push = |key: ApiKey,
                    range: std::ops::RangeInclusive<i16>,
                    rng: &mut Rng,
                    build: &mut dyn FnMut(&mut Rng, i16, i32) -> Vec<u8>| {
        if let Some(v) = advertised_version(rng, apis, key, range) {
            correlation += 1;
            out.push(build(rng, v, correlation));
        }
    };
    // AddPartitionsToTxn v0-3: what clients send.
    push(ApiKey::AddPartitionsToTxn, 0..=3, rng, &mut |rng, v, c| {
        let mut topics = vec![
            add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                .with_name(TopicName(s(DATA_TOPIC)))
                .with_partitions(partitions.clone()),
        ];
        if rng.one_in(4) {
            topics.push(
                add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(s(*rng.pick(&POOL))))
                    .with_partitions(vec![0]),
            );
        }
        request_frame(
            ApiKey::AddPartitionsToTxn,
            v,
            c,
            &AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(tid())
                .with_v3_and_below_producer_id(pid)
                .with_v3_and_below_producer_epoch(epoch)
                .with_v3_and_below_topics(topics),
        )
    });
    // Transactional batches, sequence 0 on each partition: those this core leads are written
    // (the others answered NOT_LEADER_OR_FOLLOWER).
    push(ApiKey::Produce, 3..=i16::MAX, rng, &mut |rng, v, c| {
        let now = now_ms();
        let data = partitions
            .iter()
            .map(|&p| {
                let mut b = BatchBuilder::new(now)
                    .producer(producer_id, epoch, 0)
                    .transactional();
                for i in 0..1 + rng.below(3) {
                    b.push(
                        now,
                        Some(format!("tk{i}").as_bytes()),
                        Some(b"in a transaction"),
                        &[],
                    );
                }
                produce_request::PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(Bytes::from(b.finish(0))))
            })
            .collect();
        request_frame(
            ApiKey::Produce,
            v,
            c,
            &ProduceRequest::default()
                .with_transactional_id(Some(tid()))
                .with_acks(*rng.pick(&[-1, 1]))
                .with_timeout_ms(5000)
                .with_topic_data(vec![produce_request::TopicProduceData::default()
                    .with_name(TopicName(s(DATA_TOPIC)))
                    .with_partition_data(data)]),
        )
    });
    if rng.one_in(2) {
        push(
            ApiKey::AddOffsetsToTxn,
            0..=i16::MAX,
            rng,
            &mut |_, v, c| {
                request_frame(
                    ApiKey::AddOffsetsToTxn,
                    v,
                    c,
                    &AddOffsetsToTxnRequest::default()
                        .with_transactional_id(tid())
                        .with_producer_id(pid)
                        .with_producer_epoch(epoch)
                        .with_group_id(GroupId(s(&group))),
                )
            },
        );
        push(
            ApiKey::TxnOffsetCommit,
            0..=i16::MAX,
            rng,
            &mut |rng, v, c| {
                request_frame(
                    ApiKey::TxnOffsetCommit,
                    v,
                    c,
                    &txn_offset_commit(rng, v, id, &group, producer_id, epoch),
                )
            },
        );
    }
    if !rng.one_in(4) {
        push(ApiKey::EndTxn, 0..=i16::MAX, rng, &mut |rng, v, c| {
            request_frame(
                ApiKey::EndTxn,
                v,
                c,
                &EndTxnRequest::default()
                    .with_transactional_id(tid())
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_committed(rng.one_in(2)),
            )
        });
    }
    if rng.one_in(3) {
        push(
            ApiKey::DescribeTransactions,
            0..=i16::MAX,
            rng,
            &mut |_, v, c| {
                request_frame(
                    ApiKey::DescribeTransactions,
                    v,
                    c,
                    &DescribeTransactionsRequest::default().with_transactional_ids(vec![tid()]),
                )
            },
        );
        push(
            ApiKey::ListTransactions,
            0..=i16::MAX,
            rng,
            &mut |_, v, c| {
                request_frame(
                    ApiKey::ListTransactions,
                    v,
                    c,
                    &ListTransactionsRequest::default().with_producer_id_filters(vec![pid]),
                )
            },
        );
    }
    if rng.one_in(6) {
        push(
            ApiKey::InitProducerId,
            0..=i16::MAX,
            rng,
            &mut |rng, v, c| {
                let r = InitProducerIdRequest::default()
                    .with_transactional_id(Some(tid()))
                    .with_transaction_timeout_ms(txn_timeout(rng));
                let r = if v >= 3 {
                    r.with_producer_id(pid).with_producer_epoch(epoch)
                } else {
                    r
                };
                request_frame(ApiKey::InitProducerId, v, c, &r)
            },
        );
    }
    out
}
