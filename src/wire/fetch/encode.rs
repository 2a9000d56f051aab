//! Hand-written FetchResponse encoder for the serving hot path.
//!
//! A fetch response is mostly record bytes that already sit in memory as shared [`Bytes`] (tail-cache
//! chunks, segment reads). Going through `kafka_protocol`'s generic encoder would copy all of them into
//! one buffer; this encoder instead returns the frame as a short list of chunks to be written to the
//! socket in order (vectored writes):
//!
//! * all the small fields (size prefix, response header, per-topic and per-partition fields) are written
//!   into a single allocation, sized exactly up front, and split into one chunk per stretch between two
//!   record runs;
//! * every non-empty record part is the caller's own [`Bytes`] (same pointer, only its reference count is
//!   bumped); empty parts are left out.
//!
//! Versions 4 through 18 are supported ([`MIN_VERSION`]..=[`MAX_VERSION`]). Version 12 is the first
//! flexible version (compact strings/arrays/bytes, tagged-field sections, response header v1); version
//! 13 replaces topic names with topic ids. From v16 a partition answered `NOT_LEADER_OR_FOLLOWER`
//! carries its current leader, and the response the leaders' endpoints (KIP-951). Versions 14, 15,
//! 17 and 18 change the request only.
//!
//! Field layout per version (FetchResponse.json):
//!
//! ```text
//! throttle_time_ms        i32     v1+
//! error_code              i16     v7+
//! session_id              i32     v7+
//! responses               [ ]
//!   topic                 string  v0-12
//!   topic_id              uuid    v13+
//!   partitions            [ ]
//!     partition_index     i32
//!     error_code          i16
//!     high_watermark      i64
//!     last_stable_offset  i64     v4+
//!     log_start_offset    i64     v5+
//!     aborted_transactions [ ]    v4+, nullable v4+ (read_committed: those in the records' range)
//!       producer_id       i64
//!       first_offset      i64
//!       (tagged: none; v12+)
//!     preferred_read_replica i32  v11+ (-1 unless another core should serve it)
//!     records             nullable bytes (never written null: see below)
//!     (tagged: current_leader (tag 1) v16+ when known: leader_id i32, leader_epoch i32;
//!      diverging_epoch, snapshot_id: never written)
//!   (tagged: node_endpoints (tag 0) v16+ when not empty: node_id i32, host string, port i32,
//!    rack nullable string (written null))
//! ```
//!
//! A partition with an error is written as Kafka writes it ([`PartitionResult::error`]): watermarks
//! and log start offset -1, records empty but not null. Clients parse the records of every partition
//! before looking at its error code, and librdkafka rejects the whole response on null records
//! ("invalid MessageSetSize -1"), so one errored partition would stall every partition of the fetch.

use bytes::{BufMut, Bytes, BytesMut};
use shards::Records;

/// Lowest FetchResponse version [`encode_fetch_response`] writes.
pub const MIN_VERSION: i16 = 4;
/// Highest FetchResponse version [`encode_fetch_response`] writes.
pub const MAX_VERSION: i16 = 18;
/// First version using compact encodings and tagged fields (and response header v1).
const FIRST_FLEXIBLE_VERSION: i16 = 12;
/// First version naming topics by id (KIP-516) instead of by name.
pub const FIRST_TOPIC_ID_VERSION: i16 = 13;

/// What a partition's `aborted_transactions` holds: for a read_committed fetch, the aborted
/// transactions in the range of its records, as (producer id, first offset); otherwise nothing,
/// written null or as an empty array as Kafka does depending on where the answer was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortedTransactions {
    Empty,
    Null,
    List(Vec<(i64, i64)>),
}

/// One partition of a fetch response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResult {
    pub partition: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub aborted_transactions: AbortedTransactions,
    /// v11+: the broker (core) the consumer should fetch this partition from instead (KIP-392);
    /// -1: none.
    pub preferred_read_replica: i32,
    /// v16+: the leader (core) of a partition answered `NOT_LEADER_OR_FOLLOWER` (KIP-951), at leader
    /// epoch 0 as Metadata tells it; -1: none.
    pub current_leader: i32,
    /// Never null on the wire: an error carries empty records, as in Kafka.
    pub records: Records,
}

impl PartitionResult {
    /// A partition answered with `error_code`, shaped as Kafka shapes it: high watermark, last
    /// stable offset and log start offset -1, empty (non-null) records. Errors Kafka finds before
    /// reading (the topic or partition is not in its metadata: `UNKNOWN_TOPIC_OR_PARTITION`,
    /// `UNKNOWN_TOPIC_ID`, `INVALID_TOPIC_EXCEPTION`) carry an empty aborted-transactions array;
    /// errors from the read itself (`OFFSET_OUT_OF_RANGE`, `NOT_LEADER_OR_FOLLOWER`,
    /// `KAFKA_STORAGE_ERROR`, ...) carry null.
    pub fn error(partition: i32, error_code: i16) -> Self {
        use kafka_protocol::error::ResponseError::{
            InvalidTopicException, UnknownTopicId, UnknownTopicOrPartition,
        };
        let aborted_transactions = if error_code == UnknownTopicOrPartition.code()
            || error_code == UnknownTopicId.code()
            || error_code == InvalidTopicException.code()
        {
            AbortedTransactions::Empty
        } else {
            AbortedTransactions::Null
        };
        PartitionResult {
            partition,
            error_code,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            aborted_transactions,
            preferred_read_replica: -1,
            current_leader: -1,
            records: Records::empty(),
        }
    }
}

/// A broker (core) named as a partition's `current_leader`, for the `node_endpoints` of a v16+
/// response, so that the client reaches it without asking Metadata first (KIP-951).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEndpoint {
    pub node_id: i32,
    /// UTF-8 host name.
    pub host: Bytes,
    pub port: i32,
}

/// One topic of a fetch response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicResult {
    /// UTF-8 topic name, written up to v12.
    pub topic: Bytes,
    /// Topic id (UUID bytes), written from v13 in place of the name.
    pub topic_id: [u8; 16],
    pub partitions: Vec<PartitionResult>,
}

/// A complete response frame as chunks to be written to the socket in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchResponseParts {
    pub chunks: Vec<Bytes>,
    /// Sum of the chunks' lengths, size prefix included.
    pub total_len: usize,
}

/// Encodes a complete response frame: 4-byte size prefix, response header (v0 = correlation id for
/// versions < 12; v1 = correlation id + empty tagged fields for v12+), then the FetchResponse body.
///
/// # Panics
///
/// If `version` is outside [`MIN_VERSION`]..=[`MAX_VERSION`] (the request path must answer other
/// versions with UNSUPPORTED_VERSION before getting here), or if the frame would not fit the protocol's
/// `i32` lengths. `node_endpoints` are written from v16 only.
pub fn encode_fetch_response(
    version: i16,
    correlation_id: i32,
    throttle_time_ms: i32,
    error_code: i16,
    session_id: i32,
    topics: &[TopicResult],
    node_endpoints: &[NodeEndpoint],
) -> FetchResponseParts {
    assert!(
        (MIN_VERSION..=MAX_VERSION).contains(&version),
        "FetchResponse v{version} is not supported by this encoder"
    );
    let l = Layout::new(version);
    let node_endpoints = if l.leaders() { node_endpoints } else { &[] };

    // Pass 1: exact sizes, so the size prefix can go first and the small fields take one allocation.
    let mut small_len = 4
        + l.header_size()
        + l.top_level_fixed_size()
        + l.array_len_size(topics.len())
        + l.endpoints_size(node_endpoints);
    let mut records_total = 0usize;
    // Non-empty record parts, and partitions with at least one (each ends a small-field chunk).
    let mut record_parts = 0usize;
    let mut record_runs = 0usize;
    for t in topics {
        small_len += l.topic_size(t.topic.len()) + l.array_len_size(t.partitions.len());
        small_len += l.tags_size();
        for p in &t.partitions {
            let len = records_len(&p.records);
            small_len += l.partition_fixed_size(p) + l.bytes_len_size(len);
            records_total += len;
            if len > 0 {
                record_runs += 1;
                record_parts += p.records.parts.iter().filter(|b| !b.is_empty()).count();
            }
        }
    }
    let total_len = small_len + records_total;
    let frame_len =
        i32::try_from(total_len - 4).expect("fetch response larger than i32::MAX bytes");

    // Pass 2: write the small fields, splitting them off wherever record bytes go.
    let mut buf = BytesMut::with_capacity(small_len);
    let mut chunks = Vec::with_capacity(record_parts + record_runs + 1);
    buf.put_i32(frame_len);
    buf.put_i32(correlation_id);
    l.put_tags(&mut buf); // response header v1 (flexible versions)
    buf.put_i32(throttle_time_ms);
    if version >= 7 {
        buf.put_i16(error_code);
        buf.put_i32(session_id);
    }
    l.put_array_len(&mut buf, topics.len());
    for t in topics {
        l.put_topic(&mut buf, t);
        l.put_array_len(&mut buf, t.partitions.len());
        for p in &t.partitions {
            buf.put_i32(p.partition);
            buf.put_i16(p.error_code);
            buf.put_i64(p.high_watermark);
            buf.put_i64(p.last_stable_offset);
            if version >= 5 {
                buf.put_i64(p.log_start_offset);
            }
            // aborted_transactions: nullable in every version written here (v4+).
            l.put_aborted_transactions(&mut buf, &p.aborted_transactions);
            if version >= 11 {
                buf.put_i32(p.preferred_read_replica);
            }
            let len = records_len(&p.records);
            l.put_bytes_len(&mut buf, len);
            if len > 0 {
                // Shares the allocation: `buf` keeps the remaining capacity, nothing is copied.
                chunks.push(buf.split().freeze());
                chunks.extend(p.records.parts.iter().filter(|b| !b.is_empty()).cloned());
            }
            l.put_partition_tags(&mut buf, p);
        }
        l.put_tags(&mut buf); // topic
    }
    l.put_endpoints(&mut buf, node_endpoints); // the response's tagged fields
    if !buf.is_empty() {
        chunks.push(buf.freeze());
    }
    debug_assert_eq!(chunks.iter().map(Bytes::len).sum::<usize>(), total_len);
    FetchResponseParts { chunks, total_len }
}

fn records_len(r: &Records) -> usize {
    let len = r.parts.iter().map(Bytes::len).sum();
    debug_assert_eq!(len, r.len, "Records::len disagrees with its parts");
    len
}

fn uvarint_size(v: u64) -> usize {
    // 7 bits per byte, at least one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_uvarint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8(v as u8 | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// How the version-dependent parts are encoded.
#[derive(Debug, Clone, Copy)]
struct Layout {
    version: i16,
    flexible: bool,
}

impl Layout {
    fn new(version: i16) -> Self {
        Self {
            version,
            flexible: version >= FIRST_FLEXIBLE_VERSION,
        }
    }

    /// Correlation id, plus the header's tagged-field section in flexible versions.
    fn header_size(self) -> usize {
        4 + self.tags_size()
    }

    /// throttle_time_ms, error_code and session_id (the body's tagged fields: `endpoints_size`).
    fn top_level_fixed_size(self) -> usize {
        4 + if self.version >= 7 { 2 + 4 } else { 0 }
    }

    /// Every partition field except the records' length prefix (and the records themselves).
    fn partition_fixed_size(self, p: &PartitionResult) -> usize {
        let log_start_offset = if self.version >= 5 { 8 } else { 0 };
        let preferred_read_replica = if self.version >= 11 { 4 } else { 0 };
        4 + 2
            + 8
            + 8
            + log_start_offset
            + self.aborted_transactions_size(&p.aborted_transactions)
            + preferred_read_replica
            + self.partition_tags_size(p)
    }

    /// Whether partitions carry their current leader, and the response the leaders' endpoints.
    fn leaders(self) -> bool {
        self.version >= 16
    }

    /// A partition's tagged fields: none, or its current leader (tag 1, 9 bytes: leader id,
    /// leader epoch, no tags of its own).
    fn partition_tags_size(self, p: &PartitionResult) -> usize {
        if self.leaders() && p.current_leader >= 0 {
            1 + 1 + 1 + 9
        } else {
            self.tags_size()
        }
    }

    fn put_partition_tags(self, buf: &mut BytesMut, p: &PartitionResult) {
        if !(self.leaders() && p.current_leader >= 0) {
            return self.put_tags(buf);
        }
        buf.put_u8(1); // one tagged field
        buf.put_u8(1); // current_leader
        buf.put_u8(9); // its size
        buf.put_i32(p.current_leader);
        buf.put_i32(0); // leader epoch
        buf.put_u8(0); // no tagged fields
    }

    /// The node_endpoints array (tag 0) without its tag and size.
    fn endpoints_array_size(endpoints: &[NodeEndpoint]) -> usize {
        uvarint_size(endpoints.len() as u64 + 1)
            + endpoints
                .iter()
                .map(|e| 4 + uvarint_size(e.host.len() as u64 + 1) + e.host.len() + 4 + 1 + 1)
                .sum::<usize>()
    }

    /// The response's tagged fields: none, or the node endpoints.
    fn endpoints_size(self, endpoints: &[NodeEndpoint]) -> usize {
        if endpoints.is_empty() {
            return self.tags_size();
        }
        let array = Self::endpoints_array_size(endpoints);
        1 + 1 + uvarint_size(array as u64) + array
    }

    fn put_endpoints(self, buf: &mut BytesMut, endpoints: &[NodeEndpoint]) {
        if endpoints.is_empty() {
            return self.put_tags(buf);
        }
        buf.put_u8(1); // one tagged field
        buf.put_u8(0); // node_endpoints
        put_uvarint(buf, Self::endpoints_array_size(endpoints) as u64);
        put_uvarint(buf, endpoints.len() as u64 + 1);
        for e in endpoints {
            buf.put_i32(e.node_id);
            put_uvarint(buf, e.host.len() as u64 + 1);
            buf.put_slice(&e.host);
            buf.put_i32(e.port);
            buf.put_u8(0); // rack: null
            buf.put_u8(0); // no tagged fields
        }
    }

    fn tags_size(self) -> usize {
        usize::from(self.flexible)
    }

    fn put_tags(self, buf: &mut BytesMut) {
        if self.flexible {
            buf.put_u8(0); // no tagged fields
        }
    }

    fn array_len_size(self, n: usize) -> usize {
        if self.flexible {
            uvarint_size(n as u64 + 1)
        } else {
            4
        }
    }

    fn put_array_len(self, buf: &mut BytesMut, n: usize) {
        if self.flexible {
            put_uvarint(buf, n as u64 + 1);
        } else {
            buf.put_i32(i32::try_from(n).expect("array too long"));
        }
    }

    /// A topic's name (a string of `name_len` bytes) or, from v13, its id.
    fn topic_size(self, name_len: usize) -> usize {
        if self.version >= FIRST_TOPIC_ID_VERSION {
            16
        } else if self.flexible {
            uvarint_size(name_len as u64 + 1) + name_len
        } else {
            2 + name_len
        }
    }

    fn put_topic(self, buf: &mut BytesMut, t: &TopicResult) {
        if self.version >= FIRST_TOPIC_ID_VERSION {
            buf.put_slice(&t.topic_id);
            return;
        }
        let s = &t.topic;
        if self.flexible {
            put_uvarint(buf, s.len() as u64 + 1);
        } else {
            buf.put_i16(i16::try_from(s.len()).expect("string too long"));
        }
        buf.put_slice(s);
    }

    /// An empty or null array (compact null is 0, compact empty 1; both one byte), or the
    /// entries: two i64 each, and an empty tag section in flexible versions.
    fn aborted_transactions_size(self, aborted: &AbortedTransactions) -> usize {
        match aborted {
            AbortedTransactions::List(list) => {
                self.array_len_size(list.len()) + list.len() * (16 + self.tags_size())
            }
            _ => self.array_len_size(0),
        }
    }

    fn put_aborted_transactions(self, buf: &mut BytesMut, aborted: &AbortedTransactions) {
        match (aborted, self.flexible) {
            (AbortedTransactions::Empty, _) => self.put_array_len(buf, 0),
            (AbortedTransactions::Null, true) => put_uvarint(buf, 0),
            (AbortedTransactions::Null, false) => buf.put_i32(-1),
            (AbortedTransactions::List(list), _) => {
                self.put_array_len(buf, list.len());
                for &(producer_id, first_offset) in list {
                    buf.put_i64(producer_id);
                    buf.put_i64(first_offset);
                    self.put_tags(buf);
                }
            }
        }
    }

    /// Length prefix of (non-null) bytes.
    fn bytes_len_size(self, len: usize) -> usize {
        if self.flexible {
            uvarint_size(len as u64 + 1)
        } else {
            4
        }
    }

    fn put_bytes_len(self, buf: &mut BytesMut, len: usize) {
        if self.flexible {
            put_uvarint(buf, len as u64 + 1);
        } else {
            buf.put_i32(i32::try_from(len).expect("records too long"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{BrokerId, FetchResponse, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    fn records(parts: &[Vec<u8>]) -> Records {
        let parts: Vec<Bytes> = parts.iter().map(|p| Bytes::from(p.clone())).collect();
        Records {
            len: parts.iter().map(Bytes::len).sum(),
            batches: parts.len() as u32,
            records: 10 * parts.len() as u64,
            first_offset: 100,
            last_offset: 100 + 10 * parts.len() as i64 - 1,
            parts,
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn partition(partition: i32, records: Records) -> PartitionResult {
        PartitionResult {
            partition,
            error_code: 0,
            high_watermark: 1000 + i64::from(partition),
            last_stable_offset: 900 + i64::from(partition),
            log_start_offset: 5 + i64::from(partition),
            aborted_transactions: AbortedTransactions::Empty,
            // Every other partition names another core to fetch from.
            preferred_read_replica: if partition % 2 == 1 { 3 } else { -1 },
            current_leader: -1,
            records,
        }
    }

    /// The same list in kafka-protocol's types.
    fn kafka_aborted(
        a: &AbortedTransactions,
    ) -> Option<Vec<kafka_protocol::messages::fetch_response::AbortedTransaction>> {
        use kafka_protocol::messages::fetch_response::AbortedTransaction;
        use kafka_protocol::messages::ProducerId;
        match a {
            AbortedTransactions::Empty => Some(vec![]),
            AbortedTransactions::Null => None,
            AbortedTransactions::List(list) => Some(
                list.iter()
                    .map(|&(pid, first)| {
                        AbortedTransaction::default()
                            .with_producer_id(ProducerId(pid))
                            .with_first_offset(first)
                    })
                    .collect(),
            ),
        }
    }

    fn sample() -> Vec<TopicResult> {
        vec![
            TopicResult {
                topic: Bytes::from_static(b"alpha"),
                topic_id: [0xa1; 16],
                partitions: vec![
                    // Two parts, the second long enough for a 3-byte compact length.
                    partition(0, records(&[pattern(200, 1), pattern(20_000, 2)])),
                    partition(1, Records::empty()),
                    // NOT_LEADER_OR_FOLLOWER, with the leader to ask instead (v16+).
                    PartitionResult {
                        current_leader: 1,
                        ..PartitionResult::error(2, 6)
                    },
                    partition(3, records(&[pattern(7, 3)])),
                    PartitionResult::error(7, 3), // UNKNOWN_TOPIC_OR_PARTITION
                ],
            },
            TopicResult {
                topic: Bytes::from_static("bêta-topic.with_chars".as_bytes()),
                topic_id: *b"0123456789abcdef",
                partitions: vec![
                    PartitionResult::error(9, 1), // OFFSET_OUT_OF_RANGE
                    PartitionResult {
                        aborted_transactions: AbortedTransactions::List(vec![(7, 3), (9, 12)]),
                        ..partition(4, records(&[pattern(90, 7)]))
                    },
                    // Records last: for non-flexible versions nothing follows them.
                    partition(
                        5,
                        records(&[pattern(130, 4), pattern(1, 5), pattern(64, 6)]),
                    ),
                ],
            },
        ]
    }

    fn concat(parts: &FetchResponseParts) -> Bytes {
        let mut v = Vec::with_capacity(parts.total_len);
        for c in &parts.chunks {
            v.extend_from_slice(c);
        }
        Bytes::from(v)
    }

    fn endpoints() -> Vec<NodeEndpoint> {
        vec![
            NodeEndpoint {
                node_id: 1,
                host: Bytes::from_static(b"broker-1.example"),
                port: 9093,
            },
            NodeEndpoint {
                node_id: 300,
                host: Bytes::from(vec![b'h'; 130]),
                port: 19092,
            },
        ]
    }

    /// Checks the frame and header, decodes the body and compares it with `topics` (and, from
    /// v16, the sample endpoints).
    fn check(version: i16, topics: &[TopicResult]) {
        let (corr, throttle, err, session) = (0x1234_5678, 17, 3, 0x0bad_cafe);
        let endpoints = endpoints();
        let parts =
            encode_fetch_response(version, corr, throttle, err, session, topics, &endpoints);
        let frame = concat(&parts);
        assert_eq!(frame.len(), parts.total_len, "v{version}");
        assert!(
            parts.chunks.iter().all(|c| !c.is_empty()),
            "v{version}: empty chunk"
        );

        // Size prefix.
        let size = i32::from_be_bytes(frame[..4].try_into().unwrap());
        assert_eq!(size as usize, parts.total_len - 4, "v{version}");
        let mut buf = frame.slice(4..);

        // Header: correlation id, then (v12+) one empty tagged-field section.
        assert_eq!(&buf[..4], &corr.to_be_bytes(), "v{version}");
        let header_version = if version >= 12 { 1 } else { 0 };
        if version >= 12 {
            assert_eq!(buf[4], 0, "v{version}: header tagged fields");
        }
        let header = ResponseHeader::decode(&mut buf, header_version).unwrap();
        assert_eq!(header.correlation_id, corr);
        assert!(header.unknown_tagged_fields.is_empty());

        // Body.
        let body = buf.clone();
        let resp = FetchResponse::decode(&mut buf, version).unwrap();
        assert!(buf.is_empty(), "v{version}: {} trailing bytes", buf.len());
        assert_eq!(resp.throttle_time_ms, throttle);
        if version >= 7 {
            assert_eq!(resp.error_code, err);
            assert_eq!(resp.session_id, session);
        } else {
            assert_eq!((resp.error_code, resp.session_id), (0, 0));
        }
        assert!(resp.unknown_tagged_fields.is_empty());
        let got_endpoints: Vec<(i32, String, i32, bool)> = resp
            .node_endpoints
            .iter()
            .map(|e| (e.node_id.0, e.host.to_string(), e.port, e.rack.is_none()))
            .collect();
        let want_endpoints: Vec<(i32, String, i32, bool)> = if version >= 16 {
            endpoints
                .iter()
                .map(|e| {
                    (
                        e.node_id,
                        String::from_utf8(e.host.to_vec()).unwrap(),
                        e.port,
                        true,
                    )
                })
                .collect()
        } else {
            vec![]
        };
        assert_eq!(got_endpoints, want_endpoints, "v{version}");
        assert_eq!(resp.responses.len(), topics.len());
        for (got, want) in resp.responses.iter().zip(topics) {
            if version >= FIRST_TOPIC_ID_VERSION {
                assert_eq!(got.topic_id.as_bytes(), &want.topic_id, "v{version}");
                assert!(got.topic.0.is_empty(), "v{version}");
            } else {
                assert_eq!(got.topic.0.as_bytes(), &want.topic[..]);
                assert!(got.topic_id.is_nil(), "v{version}");
            }
            assert!(got.unknown_tagged_fields.is_empty());
            assert_eq!(got.partitions.len(), want.partitions.len());
            for (gp, wp) in got.partitions.iter().zip(&want.partitions) {
                assert_eq!(gp.partition_index, wp.partition);
                assert_eq!(gp.error_code, wp.error_code);
                assert_eq!(gp.high_watermark, wp.high_watermark);
                assert_eq!(gp.last_stable_offset, wp.last_stable_offset);
                let log_start = if version >= 5 {
                    wp.log_start_offset
                } else {
                    -1
                };
                assert_eq!(gp.log_start_offset, log_start);
                let aborted = kafka_aborted(&wp.aborted_transactions);
                assert_eq!(gp.aborted_transactions, aborted, "v{version}");
                let preferred = if version >= 11 {
                    wp.preferred_read_replica
                } else {
                    -1
                };
                assert_eq!(gp.preferred_read_replica.0, preferred, "v{version}");
                assert_eq!(gp.diverging_epoch, Default::default());
                let leader = if version >= 16 && wp.current_leader >= 0 {
                    (wp.current_leader, 0)
                } else {
                    (-1, -1)
                };
                let got = (
                    gp.current_leader.leader_id.0,
                    gp.current_leader.leader_epoch,
                );
                assert_eq!(got, leader, "v{version}");
                assert_eq!(gp.snapshot_id, Default::default());
                assert!(gp.unknown_tagged_fields.is_empty());
                // Never null, errors included: clients reject null records.
                let want_records = Some(Bytes::from(wp.records.to_vec()));
                assert_eq!(gp.records, want_records, "v{version} p{}", wp.partition);
                if wp.error_code != 0 {
                    assert_eq!(
                        (
                            gp.high_watermark,
                            gp.last_stable_offset,
                            gp.log_start_offset
                        ),
                        (-1, -1, -1),
                        "v{version}: an error's offsets are -1, as in Kafka"
                    );
                }
            }
        }

        // The same body as kafka_protocol's own encoder writes for the same response.
        assert_eq!(
            body,
            reference_body(version, throttle, err, session, topics, &endpoints),
            "v{version}"
        );

        // Zero copy: every non-empty input part is in `chunks` as the very same memory, in order.
        let input: Vec<&Bytes> = topics
            .iter()
            .flat_map(|t| &t.partitions)
            .flat_map(|p| &p.records.parts)
            .filter(|b| !b.is_empty())
            .collect();
        let mut found = parts
            .chunks
            .iter()
            .filter(|c| input.iter().any(|b| b.as_ptr() == c.as_ptr()));
        for b in &input {
            let c = found.next().expect("record part missing from chunks");
            assert_eq!((c.as_ptr(), c.len()), (b.as_ptr(), b.len()), "v{version}");
        }
        assert!(found.next().is_none());
        // One small chunk per stretch between record runs, at most.
        let runs = topics
            .iter()
            .flat_map(|t| &t.partitions)
            .filter(|p| p.records.len > 0)
            .count();
        assert!(
            parts.chunks.len() <= input.len() + runs + 1,
            "v{version}: {} chunks",
            parts.chunks.len()
        );
    }

    fn reference_body(
        version: i16,
        throttle: i32,
        err: i16,
        session: i32,
        topics: &[TopicResult],
        endpoints: &[NodeEndpoint],
    ) -> Bytes {
        use kafka_protocol::messages::fetch_response::{LeaderIdAndEpoch, NodeEndpoint as Node};
        let responses = topics
            .iter()
            .map(|t| {
                let name = StrBytes::from_utf8(t.topic.clone()).unwrap();
                FetchableTopicResponse::default()
                    .with_topic(TopicName(name))
                    .with_topic_id(uuid::Uuid::from_bytes(t.topic_id))
                    .with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| {
                                PartitionData::default()
                                    .with_partition_index(p.partition)
                                    .with_error_code(p.error_code)
                                    .with_high_watermark(p.high_watermark)
                                    .with_last_stable_offset(p.last_stable_offset)
                                    .with_log_start_offset(if version >= 5 {
                                        p.log_start_offset
                                    } else {
                                        -1
                                    })
                                    .with_aborted_transactions(kafka_aborted(
                                        &p.aborted_transactions,
                                    ))
                                    .with_preferred_read_replica(BrokerId(if version >= 11 {
                                        p.preferred_read_replica
                                    } else {
                                        -1
                                    }))
                                    .with_records(Some(Bytes::from(p.records.to_vec())))
                                    .with_current_leader(
                                        if version >= 16 && p.current_leader >= 0 {
                                            LeaderIdAndEpoch::default()
                                                .with_leader_id(BrokerId(p.current_leader))
                                                .with_leader_epoch(0)
                                        } else {
                                            LeaderIdAndEpoch::default()
                                        },
                                    )
                            })
                            .collect(),
                    )
            })
            .collect();
        let mut resp = FetchResponse::default()
            .with_throttle_time_ms(throttle)
            .with_responses(responses);
        if version >= 7 {
            resp = resp.with_error_code(err).with_session_id(session);
        }
        if version >= 16 {
            resp = resp.with_node_endpoints(
                endpoints
                    .iter()
                    .map(|e| {
                        Node::default()
                            .with_node_id(BrokerId(e.node_id))
                            .with_host(StrBytes::from_utf8(e.host.clone()).unwrap())
                            .with_port(e.port)
                            .with_rack(None)
                    })
                    .collect(),
            );
        }
        let mut out = BytesMut::new();
        resp.encode(&mut out, version).unwrap();
        out.freeze()
    }

    #[test]
    fn every_version_round_trips() {
        let topics = sample();
        for version in MIN_VERSION..=MAX_VERSION {
            check(version, &topics);
        }
    }

    #[test]
    fn no_topics_round_trips() {
        for version in MIN_VERSION..=MAX_VERSION {
            check(version, &[]);
            let parts = encode_fetch_response(version, 1, 0, 0, 0, &[], &[]);
            assert_eq!(parts.chunks.len(), 1);
        }
    }

    #[test]
    fn topics_without_records_take_one_chunk() {
        let topics = vec![TopicResult {
            topic: Bytes::from_static(b"t"),
            topic_id: [7; 16],
            partitions: vec![
                partition(0, Records::empty()),
                PartitionResult::error(1, 3),
                PartitionResult::error(2, 1),
            ],
        }];
        for version in MIN_VERSION..=MAX_VERSION {
            check(version, &topics);
            assert_eq!(
                encode_fetch_response(version, 1, 0, 0, 0, &topics, &[])
                    .chunks
                    .len(),
                1
            );
        }
    }

    #[test]
    fn many_partitions_and_long_arrays() {
        // More than 127 partitions: multi-byte compact array lengths.
        let topics = vec![TopicResult {
            topic: Bytes::from(vec![b'x'; 200]),
            topic_id: [1; 16],
            partitions: (0..300)
                .map(|i| match i % 3 {
                    0 => PartitionResult::error(i, [1, 3, 6][i as usize % 9 / 3]),
                    1 => partition(i, Records::empty()),
                    _ => partition(i, records(&[pattern(i as usize, i as u8)])),
                })
                .collect(),
        }];
        for version in MIN_VERSION..=MAX_VERSION {
            check(version, &topics);
        }
    }

    #[test]
    fn small_fields_share_one_allocation() {
        let topics = sample();
        let parts = encode_fetch_response(12, 1, 0, 0, 0, &topics, &[]);
        let input: Vec<*const u8> = topics
            .iter()
            .flat_map(|t| &t.partitions)
            .flat_map(|p| &p.records.parts)
            .map(|b| b.as_ptr())
            .collect();
        let small: Vec<&Bytes> = parts
            .chunks
            .iter()
            .filter(|c| !input.contains(&c.as_ptr()))
            .collect();
        // Consecutive small chunks are adjacent slices of one buffer.
        for w in small.windows(2) {
            assert_eq!(w[0].as_ptr().wrapping_add(w[0].len()), w[1].as_ptr());
        }
    }

    /// The bytes librdkafka choked on: an errored partition's records length must be 0 (an empty
    /// array), never -1 / compact 0 (null).
    #[test]
    fn an_error_has_empty_records_on_the_wire() {
        let topics = vec![TopicResult {
            topic: Bytes::from_static(b"t"),
            topic_id: [7; 16],
            partitions: vec![PartitionResult::error(0, 1)],
        }];
        for version in MIN_VERSION..=MAX_VERSION {
            let frame = concat(&encode_fetch_response(version, 1, 0, 0, 0, &topics, &[]));
            // The frame ends: ... aborted_transactions, [preferred_read_replica], records length,
            // then (flexible) the partition's, topic's and response's tagged fields.
            let tail: &[u8] = if version >= 12 {
                // aborted null (0), replica -1, records empty (compact 1), three empty tag sections.
                &[0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]
            } else if version >= 11 {
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]
            } else {
                &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]
            };
            assert!(frame.ends_with(tail), "v{version}: {:?}", &frame[..]);
        }
    }

    #[test]
    fn uvarint_sizes() {
        for v in [
            0u64,
            1,
            127,
            128,
            16_383,
            16_384,
            2_097_151,
            2_097_152,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut b = BytesMut::new();
            put_uvarint(&mut b, v);
            assert_eq!(b.len(), uvarint_size(v), "{v}");
        }
    }

    #[test]
    #[should_panic(expected = "not supported")]
    fn rejects_version_19() {
        encode_fetch_response(19, 1, 0, 0, 0, &[], &[]);
    }
}
