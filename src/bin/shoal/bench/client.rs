//! The load generator's own Kafka client, built to be cheap per byte.
//!
//! Two halves:
//! - a blocking client on `std::net::TcpStream` for the few set-up calls (ApiVersions, Metadata,
//!   CreateTopics, ListOffsets, DeleteTopics), with bodies encoded and decoded by `kafka-protocol`;
//! - the hot path's requests: Fetch requests are encoded once and only their offset and correlation
//!   id are patched ([`FetchTemplate`]); uncompressed produce requests likewise ([`ProduceFrame`]):
//!   the batch sits in the request frame and only its timestamps (with an idempotent producer, its
//!   producer fields and sequence) and CRC are rewritten before each send. Fetch responses are read
//!   by `shoal::wire::fetch::decode`.
//!
//! Batches are built and read with `shards::batch`, and compressed with `shards::split`.

use crate::client::{pick_version, request_frame, resolve, SyncConn};
use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, FetchRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, ProduceRequest, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use shards::batch::{self, BatchHeader, HEADER_LEN};
use shoal::wire::requests::list_offsets_request;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Kafka error codes the client reacts to.
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;

/// `ListOffsets` timestamps.
pub const LATEST: i64 = -1;
pub const EARLIEST: i64 = -2;

fn other(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// The API versions this client speaks, intersected with the broker's.
#[derive(Debug, Clone, Copy)]
pub struct Negotiated {
    pub produce: i16,
    pub fetch: i16,
    pub metadata: i16,
    pub list_offsets: i16,
    pub create_topics: i16,
    /// None where the broker does not serve DeleteTopics: the bench's topics then stay.
    pub delete_topics: Option<i16>,
    /// What idempotent and transactional producers need; None where the broker does not serve it.
    pub producer_ids: ProducerIdVersions,
}

/// The versions of the APIs behind `--idempotent` and `--transactional`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerIdVersions {
    pub init_producer_id: Option<i16>,
    /// v1 to v3: one key per request (v4 asks for several).
    pub find_coordinator: Option<i16>,
    /// Up to v3: v4 is the brokers' batched form.
    pub add_partitions_to_txn: Option<i16>,
    /// Up to v3: v4 answers with a new producer id and epoch (KIP-890).
    pub end_txn: Option<i16>,
}

/// (key, lowest, highest) of the producer id APIs.
const WANTED_PRODUCER_IDS: [(ApiKey, i16, i16); 4] = [
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::FindCoordinator, 1, 3),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
];

/// (key, lowest, highest) this client can use. Fetch stops at 12: v13 names topics by id.
const WANTED: [(ApiKey, i16, i16); 5] = [
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::CreateTopics, 2, 7),
];

impl Negotiated {
    fn negotiate(r: &ApiVersionsResponse) -> io::Result<Negotiated> {
        let mut chosen = HashMap::new();
        for (key, lo, hi) in WANTED {
            chosen.insert(key as i16, pick_version(r, key, lo, hi)?);
        }
        let optional = |key: ApiKey| {
            let (_, lo, hi) = WANTED_PRODUCER_IDS
                .into_iter()
                .find(|w| w.0 == key)
                .expect("a wanted key");
            pick_version(r, key, lo, hi).ok()
        };
        Ok(Negotiated {
            producer_ids: ProducerIdVersions {
                init_producer_id: optional(ApiKey::InitProducerId),
                find_coordinator: optional(ApiKey::FindCoordinator),
                add_partitions_to_txn: optional(ApiKey::AddPartitionsToTxn),
                end_txn: optional(ApiKey::EndTxn),
            },
            produce: chosen[&(ApiKey::Produce as i16)],
            fetch: chosen[&(ApiKey::Fetch as i16)],
            metadata: chosen[&(ApiKey::Metadata as i16)],
            list_offsets: chosen[&(ApiKey::ListOffsets as i16)],
            create_topics: chosen[&(ApiKey::CreateTopics as i16)],
            delete_topics: pick_version(r, ApiKey::DeleteTopics, 1, 6).ok(),
        })
    }
}

/// One partition of the topic under test and where its leader listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLeader {
    pub partition: i32,
    pub leader: SocketAddr,
    /// The leader's node id (a shoal core's index); -1 where there is none (the raw baseline).
    pub leader_id: i32,
}

/// The brokers of the cluster by node id (a shoal core's index), where a consumer can be sent by
/// a fetch response's preferred read replica.
pub type Brokers = HashMap<i32, SocketAddr>;

/// The cluster as seen from the bootstrap address: versions, brokers.
#[derive(Debug)]
pub struct Cluster {
    pub versions: Negotiated,
    bootstrap: SocketAddr,
}

impl Cluster {
    pub fn connect(bootstrap: SocketAddr) -> io::Result<Cluster> {
        let mut c = SyncConn::connect(bootstrap)?;
        // v0 is served by every broker and carries all the ranges this client needs.
        let r: ApiVersionsResponse =
            c.call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?;
        if r.error_code != 0 {
            return Err(other(format!("ApiVersions: error {}", r.error_code)));
        }
        Ok(Cluster {
            versions: Negotiated::negotiate(&r)?,
            bootstrap,
        })
    }

    fn metadata(&self, topic: &str) -> io::Result<MetadataResponse> {
        let mut c = SyncConn::connect(self.bootstrap)?;
        let mut req = MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(topic))),
        ]));
        if self.versions.metadata >= 4 {
            req = req.with_allow_auto_topic_creation(false);
        }
        c.call(ApiKey::Metadata, self.versions.metadata, &req)
    }

    /// Creates the topic if it does not exist (replication factor: the broker's default), waits for
    /// every partition to have a leader, and returns the leaders. An existing topic must have
    /// `partitions` partitions.
    pub fn ensure_topic(&self, topic: &str, partitions: i32) -> io::Result<Vec<PartitionLeader>> {
        let created = self.create_topic(topic, partitions)?;
        self.await_topic(topic, partitions, !created)
    }

    /// Creates the topic unless it exists; true if this call created it.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> io::Result<bool> {
        let m = self.metadata(topic)?;
        let exists = m
            .topics
            .first()
            .is_some_and(|t| t.error_code == 0 && !t.partitions.is_empty());
        if exists {
            return Ok(false);
        }
        let mut c = SyncConn::connect(self.controller(&m)?)?;
        // v4+ take -1 for "the broker's default replication factor" (KIP-464).
        let rf = if self.versions.create_topics >= 4 {
            -1
        } else {
            1
        };
        let r: CreateTopicsResponse = c.call(
            ApiKey::CreateTopics,
            self.versions.create_topics,
            &CreateTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(name(topic))
                    .with_num_partitions(partitions)
                    .with_replication_factor(rf)]),
        )?;
        let mut created = true;
        for t in &r.topics {
            match t.error_code {
                0 => {}
                TOPIC_ALREADY_EXISTS => created = false,
                code => {
                    return Err(other(format!(
                        "creating topic {topic}: error {code} {}",
                        t.error_message.as_deref().unwrap_or("")
                    )))
                }
            }
        }
        Ok(created)
    }

    /// Deletes the topic (asked of the controller).
    pub fn delete_topic(&self, topic: &str) -> io::Result<()> {
        let version = self
            .versions
            .delete_topics
            .ok_or_else(|| other("the broker does not serve DeleteTopics"))?;
        let mut req = DeleteTopicsRequest::default().with_timeout_ms(30_000);
        // v6 names topics in `topics` (by name or id); before, in `topic_names`.
        if version >= 6 {
            req = req.with_topics(vec![
                DeleteTopicState::default().with_name(Some(name(topic)))
            ]);
        } else {
            req = req.with_topic_names(vec![name(topic)]);
        }
        let m = self.metadata(topic)?;
        let mut c = SyncConn::connect(self.controller(&m)?)?;
        let r: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, version, &req)?;
        match r.responses.iter().find(|t| t.error_code != 0) {
            Some(t) => Err(other(format!(
                "deleting topic {topic}: error {} {}",
                t.error_code,
                t.error_message.as_deref().unwrap_or("")
            ))),
            None => Ok(()),
        }
    }

    /// The controller the metadata `m` names (the bootstrap broker if it names none).
    fn controller(&self, m: &MetadataResponse) -> io::Result<SocketAddr> {
        Ok(m.brokers
            .iter()
            .find(|b| b.node_id == m.controller_id)
            .map(|b| resolve(&format!("{}:{}", b.host, b.port)))
            .transpose()?
            .unwrap_or(self.bootstrap))
    }

    /// Waits (30 s at most) until the topic has `partitions` partitions, each with a leader, and
    /// returns them; `exists`: a topic with another count is an error rather than a wait.
    pub fn await_topic(
        &self,
        topic: &str,
        partitions: i32,
        exists: bool,
    ) -> io::Result<Vec<PartitionLeader>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let m = self.metadata(topic)?;
            match self.leaders(&m, topic) {
                Ok(leaders) if leaders.len() == partitions as usize => return Ok(leaders),
                Ok(leaders) if !leaders.is_empty() && exists => {
                    return Err(other(format!(
                        "topic {topic} exists with {} partitions, not {partitions}: pick another \
                         --topic",
                        leaders.len()
                    )))
                }
                Ok(_) | Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Ok(l) => {
                    return Err(other(format!(
                        "topic {topic}: {} of {partitions} partitions have a leader after 30 s",
                        l.len()
                    )))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every broker the metadata lists, by node id (those whose address does not resolve left out).
    pub fn brokers(&self, topic: &str) -> io::Result<Brokers> {
        let m = self.metadata(topic)?;
        Ok(m.brokers
            .iter()
            .filter_map(|b| {
                let addr = resolve(&format!("{}:{}", b.host, b.port)).ok()?;
                Some((b.node_id.0, addr))
            })
            .collect())
    }

    fn leaders(&self, m: &MetadataResponse, topic: &str) -> io::Result<Vec<PartitionLeader>> {
        let t = m
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .ok_or_else(|| other(format!("topic {topic} missing from metadata")))?;
        if t.error_code != 0 {
            return Err(other(format!(
                "metadata for {topic}: error {}",
                t.error_code
            )));
        }
        let brokers: HashMap<i32, String> = m
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
            .collect();
        let mut out = Vec::new();
        for p in &t.partitions {
            if p.error_code != 0 || p.leader_id.0 < 0 {
                return Ok(Vec::new());
            }
            let addr = brokers.get(&p.leader_id.0).ok_or_else(|| {
                other(format!(
                    "{topic}/{}: leader {} not among the brokers",
                    p.partition_index, p.leader_id.0
                ))
            })?;
            out.push(PartitionLeader {
                partition: p.partition_index,
                leader: resolve(addr)?,
                leader_id: p.leader_id.0,
            });
        }
        out.sort_by_key(|p| p.partition);
        Ok(out)
    }

    /// ListOffsets for every partition (`LATEST` or `EARLIEST`), asked of each partition's leader.
    pub fn offsets(
        &self,
        topic: &str,
        leaders: &[PartitionLeader],
        timestamp: i64,
    ) -> io::Result<Vec<i64>> {
        let mut conns: HashMap<SocketAddr, SyncConn> = HashMap::new();
        let mut out = Vec::with_capacity(leaders.len());
        for p in leaders {
            let c = match conns.entry(p.leader) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(SyncConn::connect(p.leader)?)
                }
            };
            let mut req = list_offsets_request(topic, &[(p.partition, timestamp)]);
            if self.versions.list_offsets >= 2 {
                req = req.with_isolation_level(0);
            }
            let r: ListOffsetsResponse =
                c.call(ApiKey::ListOffsets, self.versions.list_offsets, &req)?;
            let part = r
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .ok_or_else(|| other("ListOffsets: empty answer"))?;
            if part.error_code != 0 {
                return Err(other(format!(
                    "ListOffsets {topic}/{}: error {}",
                    p.partition, part.error_code
                )));
            }
            out.push(part.offset);
        }
        Ok(out)
    }
}

/// A Fetch request for one partition, encoded once; each send patches the offset and correlation id.
#[derive(Debug, Clone)]
pub struct FetchTemplate {
    frame: Vec<u8>,
    offset_at: usize,
}

/// Correlation ids sit after the size (4), api key (2) and api version (2).
const CORRELATION_AT: usize = 8;
const OFFSET_SENTINEL: i64 = 0x5EED_F00D_CAFE_B0BA;

impl FetchTemplate {
    pub fn new(
        topic: &str,
        partition: i32,
        version: i16,
        max_wait: Duration,
        max_bytes: i32,
        isolation_level: i8,
    ) -> io::Result<FetchTemplate> {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait.as_millis().min(i32::MAX as u128) as i32)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_isolation_level(isolation_level)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(OFFSET_SENTINEL)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(max_bytes)])]);
        let frame = request_frame(ApiKey::Fetch, version, 0, &req)?.to_vec();
        let sentinel = OFFSET_SENTINEL.to_be_bytes();
        let offset_at = frame
            .windows(8)
            .position(|w| w == sentinel)
            .ok_or_else(|| other("fetch template: offset not found"))?;
        Ok(FetchTemplate { frame, offset_at })
    }

    /// The request frame for `offset`.
    pub fn frame(&mut self, correlation: i32, offset: i64) -> &[u8] {
        self.frame[CORRELATION_AT..CORRELATION_AT + 4].copy_from_slice(&correlation.to_be_bytes());
        self.frame[self.offset_at..self.offset_at + 8].copy_from_slice(&offset.to_be_bytes());
        &self.frame
    }
}

/// A produce request around one uncompressed batch, encoded once. Before each send the batch's
/// timestamps (header and the first record's value), its producer fields and sequence (an
/// idempotent producer's) and its CRC are rewritten in place.
#[derive(Debug)]
pub struct ProduceFrame {
    frame: Vec<u8>,
    batch_at: usize,
    batch_len: usize,
    /// Where, inside the batch, the values to stamp start (the first record's, or the first
    /// records' with `--views`).
    value_ats: Vec<usize>,
}

/// Where the first record's value starts in an uncompressed batch (with at least 8 bytes of it).
pub fn first_value_at(batch: &[u8]) -> Option<usize> {
    value_at(batch, HEADER_LEN)
}

/// Where the values of the first `k` records of an uncompressed batch start (each at least 8
/// bytes long): the producers stamp the send time into each of them, so that every view shard's
/// first record carries it (`--views`).
pub fn value_positions(batch: &[u8], k: usize) -> Option<Vec<usize>> {
    let mut out = Vec::with_capacity(k);
    let mut r = batch::Reader {
        b: batch,
        at: HEADER_LEN,
    };
    for _ in 0..k {
        let start = r.at;
        let len = usize::try_from(r.varint()?).ok()?;
        out.push(value_at(batch, start)?);
        r.at = r.at.checked_add(len).filter(|e| *e <= batch.len())?;
    }
    Some(out)
}

/// The same for the first record starting at `at` in `b`.
fn value_at(b: &[u8], at: usize) -> Option<usize> {
    let mut r = batch::Reader { b, at };
    r.varint()?; // record length
    r.take(1)?; // attributes
    r.varlong()?; // timestamp delta
    r.varint()?; // offset delta
    r.bytes()?; // key
    let value = r.varint()?;
    (value >= 8 && r.at + 8 <= b.len()).then_some(r.at)
}

/// The 8-byte big-endian value the producers put first in the first record of each batch
/// (microseconds since the Unix epoch), read from the head of an uncompressed batch.
pub fn embedded_timestamp(batch_head: &[u8]) -> Option<u64> {
    let at = first_value_at(batch_head)?;
    Some(u64::from_be_bytes(batch_head[at..at + 8].try_into().ok()?))
}

/// The embedded timestamp of a compressed batch: its records are decompressed (the whole batch is
/// needed, so consumers do this for a sample of batches only). An uncompressed batch is read as is.
pub fn embedded_timestamp_compressed(batch: &[u8], header: &BatchHeader) -> Option<u64> {
    let records = shards::batch::records_section(header, batch).ok()?;
    let at = value_at(&records, 0)?;
    Some(u64::from_be_bytes(records[at..at + 8].try_into().ok()?))
}

/// Record batch compression (`--compression`), through `shards::split`'s codecs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    /// The codec's id in a batch's attributes.
    pub fn id(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }

    /// `batch` (uncompressed, as built by `BatchBuilder`) with its records compressed by this codec;
    /// for `None`, a copy of it.
    pub fn compress_batch(self, batch: &[u8]) -> Vec<u8> {
        shards::batch::compress_batch(batch, self.id())
    }
}

/// A produce request for one partition carrying `records` (encoded by `kafka-protocol`); a
/// transactional producer's names its transactional id.
pub fn produce_request(
    topic: &str,
    partition: i32,
    acks: i16,
    transactional_id: Option<&str>,
    records: Bytes,
) -> ProduceRequest {
    ProduceRequest::default()
        .with_transactional_id(
            transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_string()))),
        )
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

impl ProduceFrame {
    /// `batch` must be uncompressed and start the values of its first `stamped` records with 8
    /// bytes to overwrite.
    pub fn new(
        topic: &str,
        partition: i32,
        acks: i16,
        transactional_id: Option<&str>,
        version: i16,
        batch: Vec<u8>,
        stamped: usize,
    ) -> io::Result<ProduceFrame> {
        let value_ats = value_positions(&batch, stamped.max(1)).ok_or_else(|| {
            other("produce template: no 8-byte value in each of the first records")
        })?;
        let batch_len = batch.len();
        let req = produce_request(
            topic,
            partition,
            acks,
            transactional_id,
            Bytes::from(batch.clone()),
        );
        let frame = request_frame(ApiKey::Produce, version, 0, &req)?.to_vec();
        let batch_at = (0..=frame.len() - batch_len)
            .rev()
            .find(|&at| frame[at..at + batch_len] == batch[..])
            .ok_or_else(|| other("produce template: batch not found in the frame"))?;
        Ok(ProduceFrame {
            frame,
            batch_at,
            batch_len,
            value_ats,
        })
    }

    pub fn batch_len(&self) -> usize {
        self.batch_len
    }

    /// Stamps the batch with `now_us` (microseconds since the epoch) and, for an idempotent
    /// producer, its producer fields and sequence; returns the frame to send.
    pub fn stamp(
        &mut self,
        correlation: i32,
        now_us: u64,
        producer: Option<ProducerStamp>,
    ) -> &[u8] {
        self.frame[CORRELATION_AT..CORRELATION_AT + 4].copy_from_slice(&correlation.to_be_bytes());
        let b = &mut self.frame[self.batch_at..self.batch_at + self.batch_len];
        stamp_batch(b, &self.value_ats, now_us, producer);
        &self.frame
    }
}

/// An idempotent producer's fields in a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerStamp {
    pub id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
    /// The batch belongs to a transaction (the attributes' transactional bit).
    pub transactional: bool,
}

/// The sequence number after a batch of `records` that starts at `sequence`: sequences wrap from
/// `i32::MAX` to 0, as Kafka's (`DefaultRecordBatch.incrementSequence`).
pub fn next_sequence(sequence: i32, records: i32) -> i32 {
    if sequence > i32::MAX - records {
        records - (i32::MAX - sequence) - 1
    } else {
        sequence + records
    }
}

/// Writes `now_us` into an uncompressed batch (base and max timestamps in ms, the values at
/// `value_ats` in µs) and, with `producer`, the producer id, epoch, base sequence and
/// transactional bit; then recomputes its CRC, once.
pub fn stamp_batch(
    b: &mut [u8],
    value_ats: &[usize],
    now_us: u64,
    producer: Option<ProducerStamp>,
) {
    for &at in value_ats {
        b[at..at + 8].copy_from_slice(&now_us.to_be_bytes());
    }
    let ms = (now_us / 1000) as i64;
    let mut h = BatchHeader::parse(b).expect("a whole batch");
    h.base_timestamp = ms;
    h.max_timestamp = ms;
    if let Some(p) = producer {
        h.producer_id = p.id;
        h.producer_epoch = p.epoch;
        h.base_sequence = p.base_sequence;
        if p.transactional {
            h.attributes |= batch::ATTR_TRANSACTIONAL;
        }
    }
    batch::write_header(b, &h);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, FetchableTopicResponse, LeaderIdAndEpoch, PartitionData,
    };
    use kafka_protocol::messages::{FetchResponse, ProducerId, RequestHeader, ResponseHeader};
    use kafka_protocol::protocol::{Decodable, Encodable};
    use shards::batch::BatchBuilder;
    use shoal::wire::fetch::decode::{read_fetch_response, BatchVisitor, FrameReader};

    fn sample_batch(records: usize, value: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(1);
        for _ in 0..records {
            b.push(1, None, Some(&vec![7u8; value]), &[]);
        }
        b.finish(0)
    }

    #[test]
    fn stamped_batch_validates_and_carries_the_timestamp() {
        let mut b = sample_batch(3, 100);
        let at = first_value_at(&b).unwrap();
        stamp_batch(&mut b, &[at], 1_700_000_000_123_456, None);
        let h = shards::batch::validate(&b, usize::MAX).unwrap();
        assert_eq!(h.base_timestamp, 1_700_000_000_123);
        assert_eq!(embedded_timestamp(&b), Some(1_700_000_000_123_456));
        let recs = shards::batch::records(&b).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(
            &recs[0].value.unwrap()[..8],
            &1_700_000_000_123_456u64.to_be_bytes()
        );
    }

    struct Collect(Vec<(i64, Option<u64>)>);

    impl BatchVisitor for Collect {
        fn batch(&mut self, h: &BatchHeader, head: &[u8]) -> bool {
            self.0.push((h.base_offset, embedded_timestamp(head)));
            false
        }
        fn whole_batch(&mut self, _: &BatchHeader, _: &[u8]) {}
    }

    /// A whole response frame (size, header, body) as a broker sends it, encoded by kafka-protocol.
    fn response_frame(response: &FetchResponse, version: i16, correlation: i32) -> Vec<u8> {
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        ResponseHeader::default()
            .with_correlation_id(correlation)
            .encode(&mut frame, ApiKey::Fetch.response_header_version(version))
            .unwrap();
        response.encode(&mut frame, version).unwrap();
        let len = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        frame.to_vec()
    }

    /// One partition's answer in a response for "topic".
    fn response_of(partitions: Vec<PartitionData>) -> FetchResponse {
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(name("topic"))
            .with_partitions(partitions)])
    }

    /// Two stamped batches (offsets 0-2 with timestamp 11, 3-5 with 22) and the head of a third cut
    /// short, as KIP-74 allows.
    fn two_batches_and_a_cut_one() -> Vec<u8> {
        let mut records = Vec::new();
        for (base, ts) in [(0i64, 11u64), (3, 22)] {
            let mut b = sample_batch(3, 300);
            let at = first_value_at(&b).unwrap();
            stamp_batch(&mut b, &[at], ts, None);
            shards::batch::set_base_offset(&mut b, base);
            records.extend_from_slice(&b);
        }
        records.extend_from_slice(&sample_batch(1, 20)[..30]);
        records
    }

    #[test]
    fn fetch_responses_of_every_version_stream_through_a_small_buffer() {
        let records = two_batches_and_a_cut_one();
        for version in 4..=12i16 {
            let response = response_of(vec![
                PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(6)
                    .with_aborted_transactions(Some(vec![AbortedTransaction::default()
                        .with_producer_id(ProducerId(9))
                        .with_first_offset(1)]))
                    .with_current_leader(
                        LeaderIdAndEpoch::default()
                            .with_leader_id(BrokerId(3))
                            .with_leader_epoch(1),
                    )
                    .with_records(Some(Bytes::from(records.clone()))),
                PartitionData::default()
                    .with_partition_index(1)
                    .with_error_code(NOT_LEADER_OR_FOLLOWER)
                    .with_high_watermark(42)
                    .with_records(None),
            ]);
            let frame = response_frame(&response, version, 7);
            // A second frame behind it must be left untouched.
            let mut wire = frame.clone();
            wire.extend_from_slice(&frame);
            let mut stream = futures_lite::io::Cursor::new(wire);
            let mut reader = FrameReader::new(256);
            let mut scratch = Vec::new();
            for _ in 0..2 {
                let mut seen = Collect(Vec::new());
                let out = futures_lite::future::block_on(read_fetch_response(
                    &mut reader,
                    &mut stream,
                    version,
                    7,
                    &mut seen,
                    &mut scratch,
                ))
                .unwrap_or_else(|e| panic!("v{version}: {e}"));
                // The batch cut short is skipped, not visited; the next frame still parses.
                assert_eq!(seen.0, vec![(0, Some(11)), (3, Some(22))], "v{version}");
                assert_eq!(out.error_code, NOT_LEADER_OR_FOLLOWER, "v{version}");
                assert_eq!(out.high_watermark, 42, "v{version}");
                assert_eq!(out.preferred_read_replica, -1, "v{version}");
            }
            assert!(reader.buffered().is_empty(), "v{version}");
        }
    }

    /// KIP-392: from v11 a partition's answer may name the broker to fetch it from instead, with
    /// no records (a leader steering the consumer away) or with some.
    #[test]
    fn the_preferred_read_replica_is_read_from_v11_on() {
        let records = two_batches_and_a_cut_one();
        for version in 4..=12i16 {
            let cases = [
                (2, Bytes::new(), vec![]),
                (
                    5,
                    Bytes::from(records.clone()),
                    vec![(0, Some(11)), (3, Some(22))],
                ),
                (-1, Bytes::new(), vec![]),
            ];
            for (preferred, records, batches) in cases {
                // Before v11 the field does not exist: the encoder refuses anything but -1.
                let sent = if version >= 11 { preferred } else { -1 };
                let response = response_of(vec![PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(6)
                    .with_preferred_read_replica(BrokerId(sent))
                    .with_records(Some(records))]);
                let mut stream =
                    futures_lite::io::Cursor::new(response_frame(&response, version, 9));
                let mut seen = Collect(Vec::new());
                let out = futures_lite::future::block_on(read_fetch_response(
                    &mut FrameReader::new(256),
                    &mut stream,
                    version,
                    9,
                    &mut seen,
                    &mut Vec::new(),
                ))
                .unwrap_or_else(|e| panic!("v{version}: {e}"));
                assert_eq!(out.preferred_read_replica, sent, "v{version}");
                assert_eq!((out.error_code, out.high_watermark), (0, 6), "v{version}");
                assert_eq!(seen.0, batches, "v{version}");
            }
        }
    }

    #[test]
    fn sequences_advance_by_the_records_and_wrap_to_zero_as_kafkas() {
        assert_eq!(next_sequence(0, 10), 10);
        assert_eq!(next_sequence(i32::MAX - 10, 10), i32::MAX);
        // i32::MAX - 5 ..= i32::MAX, then 0 ..= 3.
        assert_eq!(next_sequence(i32::MAX - 5, 10), 4);
        assert_eq!(next_sequence(i32::MAX, 1), 0);
    }

    /// The request a frame stamped for `producer` sends: its transactional id and its batch.
    fn stamped_request(
        p: &mut ProduceFrame,
        correlation: i32,
        producer: ProducerStamp,
    ) -> (Option<String>, Bytes) {
        let frame = p.stamp(correlation, 42_000_007, Some(producer)).to_vec();
        let mut body = Bytes::from(frame[4..].to_vec());
        RequestHeader::decode(&mut body, ApiKey::Produce.request_header_version(9)).unwrap();
        let req = ProduceRequest::decode(&mut body, 9).unwrap();
        let records = req.topic_data[0].partition_data[0].records.clone().unwrap();
        (req.transactional_id.map(|t| t.0.to_string()), records)
    }

    /// An idempotent producer's frame, stamped for sequence N after N - 1, carries its producer
    /// id, epoch and N, a valid CRC, and the transactional bit and id when it is transactional.
    #[test]
    fn frames_stamped_with_a_producer_and_sequence_validate() {
        for (transactional, tid) in [(false, None), (true, Some("shoal-bench-1-0"))] {
            let mut p = ProduceFrame::new("t", 1, -1, tid, 9, sample_batch(4, 64), 1).unwrap();
            let mut sequence = i32::MAX - 5;
            for correlation in 1..=3 {
                let stamp = ProducerStamp {
                    id: 4_000_000_001,
                    epoch: 7,
                    base_sequence: sequence,
                    transactional,
                };
                let (sent_tid, records) = stamped_request(&mut p, correlation, stamp);
                assert_eq!(sent_tid.as_deref(), tid);
                let headers = shards::batch::validate_all(&records, usize::MAX).unwrap();
                assert_eq!(headers.len(), 1);
                let h = &headers[0];
                assert_eq!(
                    (h.producer_id, h.producer_epoch, h.base_sequence),
                    (4_000_000_001, 7, sequence),
                    "batch {correlation}"
                );
                assert_eq!(h.is_transactional(), transactional);
                assert_eq!((h.record_count, h.compression()), (4, 0));
                assert_eq!(embedded_timestamp(&records), Some(42_000_007));
                assert_eq!(shards::batch::records(&records).unwrap().len(), 4);
                sequence = next_sequence(sequence, h.record_count);
            }
            // Three batches of 4 from i32::MAX - 5: the third starts after the wrap.
            assert_eq!(sequence, 6);
        }
    }

    #[test]
    fn templates_patch_the_right_bytes() {
        let mut f = FetchTemplate::new("t", 3, 12, Duration::from_millis(100), 1 << 20, 1).unwrap();
        let frame = f.frame(77, 12345).to_vec();
        let mut body = Bytes::from(frame[4..].to_vec());
        let h = RequestHeader::decode(&mut body, ApiKey::Fetch.request_header_version(12)).unwrap();
        assert_eq!(h.correlation_id, 77);
        let req = FetchRequest::decode(&mut body, 12).unwrap();
        assert_eq!(req.topics[0].partitions[0].fetch_offset, 12345);
        assert_eq!(req.topics[0].partitions[0].partition, 3);
        assert_eq!(req.isolation_level, 1);

        let mut p = ProduceFrame::new("t", 1, 1, None, 9, sample_batch(4, 64), 1).unwrap();
        let frame = p.stamp(5, 42_000_007, None).to_vec();
        let mut body = Bytes::from(frame[4..].to_vec());
        let h =
            RequestHeader::decode(&mut body, ApiKey::Produce.request_header_version(9)).unwrap();
        assert_eq!(h.correlation_id, 5);
        let req = ProduceRequest::decode(&mut body, 9).unwrap();
        let records = req.topic_data[0].partition_data[0].records.clone().unwrap();
        shards::batch::validate(&records, usize::MAX).unwrap();
        assert_eq!(embedded_timestamp(&records), Some(42_000_007));
    }
}
