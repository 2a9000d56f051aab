//! Kafka requests as raw wire bytes over a plain `std::net::TcpStream`, for the tests that check
//! framing, ordering, closing and error codes exactly as a client sees them: frames are written and
//! read with `shoal::wire` (bodies by `kafka-protocol`, or by hand: [`raw_frame`]), and every
//! failure panics with what went wrong.

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable};
use shoal::wire::frame::{self, FrameError};
use shoal::wire::header;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Longest any read or write of a test connection may block.
const IO_TIMEOUT: Duration = Duration::from_secs(20);

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to shoal");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A whole request frame: size, header (in the version the API uses), body.
pub fn request_frame<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation: i32,
    body: &R,
) -> Vec<u8> {
    request_frame_as("shoal-tests", key, version, correlation, body)
}

/// Same, from a client with the given client id.
pub fn request_frame_as<R: Encodable>(
    client_id: &str,
    key: ApiKey,
    version: i16,
    correlation: i32,
    body: &R,
) -> Vec<u8> {
    header::encode_request(client_id, key, version, correlation, body)
        .unwrap_or_else(|e| panic!("{e}"))
        .to_vec()
}

/// A frame with a hand-written v1 header (v2 when `flexible`: plus an empty tagged-field section)
/// and the given body bytes, for requests `kafka-protocol` will not encode.
pub fn raw_frame(
    api_key: i16,
    version: i16,
    correlation: i32,
    flexible: bool,
    body: &[u8],
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&api_key.to_be_bytes());
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&correlation.to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes()); // client id: null
    if flexible {
        b.push(0); // no tagged fields
    }
    b.extend_from_slice(body);
    let mut frame = (b.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&b);
    frame
}

pub fn send<R: Encodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    correlation: i32,
    body: &R,
) {
    s.write_all(&request_frame(key, version, correlation, body))
        .expect("write request");
}

/// Reads one response frame (without its size prefix); `None` when the server closed the
/// connection before a frame started. Panics on a timeout or a frame cut short.
pub fn recv(s: &mut TcpStream) -> Option<Bytes> {
    match frame::read_blocking(s, i32::MAX as usize) {
        Ok(body) => Some(body),
        Err(FrameError::Eof) => None,
        Err(e) => panic!("reading a response frame: {e}"),
    }
}

/// Decodes a response frame: checks the correlation id and that the body is consumed exactly.
pub fn decode<R: Decodable>(key: ApiKey, version: i16, correlation: i32, frame: Bytes) -> R {
    header::decode_response(key, version, correlation, frame).unwrap_or_else(|e| panic!("{e}"))
}

/// Decodes a response frame (without its size prefix) as `key`'s response at `version`, for any API
/// shoal serves: the header, then the body, which must use every byte.
pub fn decode_any_response(key: ApiKey, version: i16, frame: Bytes) -> Result<(), String> {
    use kafka_protocol::messages::*;
    fn body<R: Decodable>(mut buf: Bytes, version: i16) -> Result<(), String> {
        R::decode(&mut buf, version).map_err(|e| e.to_string())?;
        if buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} bytes after the body", buf.len()))
        }
    }
    let mut buf = frame;
    ResponseHeader::decode(&mut buf, key.response_header_version(version))
        .map_err(|e| format!("header: {e}"))?;
    let v = version;
    match key {
        ApiKey::Produce => body::<ProduceResponse>(buf, v),
        ApiKey::Fetch => body::<FetchResponse>(buf, v),
        ApiKey::ListOffsets => body::<ListOffsetsResponse>(buf, v),
        ApiKey::Metadata => body::<MetadataResponse>(buf, v),
        ApiKey::ApiVersions => body::<ApiVersionsResponse>(buf, v),
        ApiKey::CreateTopics => body::<CreateTopicsResponse>(buf, v),
        ApiKey::CreatePartitions => body::<CreatePartitionsResponse>(buf, v),
        ApiKey::DescribeConfigs => body::<DescribeConfigsResponse>(buf, v),
        ApiKey::AlterConfigs => body::<AlterConfigsResponse>(buf, v),
        ApiKey::IncrementalAlterConfigs => body::<IncrementalAlterConfigsResponse>(buf, v),
        ApiKey::DeleteTopics => body::<DeleteTopicsResponse>(buf, v),
        ApiKey::DeleteRecords => body::<DeleteRecordsResponse>(buf, v),
        ApiKey::OffsetDelete => body::<OffsetDeleteResponse>(buf, v),
        ApiKey::ConsumerGroupHeartbeat => body::<ConsumerGroupHeartbeatResponse>(buf, v),
        ApiKey::ConsumerGroupDescribe => body::<ConsumerGroupDescribeResponse>(buf, v),
        ApiKey::InitProducerId => body::<InitProducerIdResponse>(buf, v),
        ApiKey::FindCoordinator => body::<FindCoordinatorResponse>(buf, v),
        ApiKey::JoinGroup => body::<JoinGroupResponse>(buf, v),
        ApiKey::SyncGroup => body::<SyncGroupResponse>(buf, v),
        ApiKey::Heartbeat => body::<HeartbeatResponse>(buf, v),
        ApiKey::LeaveGroup => body::<LeaveGroupResponse>(buf, v),
        ApiKey::OffsetCommit => body::<OffsetCommitResponse>(buf, v),
        ApiKey::OffsetFetch => body::<OffsetFetchResponse>(buf, v),
        ApiKey::ListGroups => body::<ListGroupsResponse>(buf, v),
        ApiKey::DescribeGroups => body::<DescribeGroupsResponse>(buf, v),
        ApiKey::DeleteGroups => body::<DeleteGroupsResponse>(buf, v),
        ApiKey::DescribeLogDirs => body::<DescribeLogDirsResponse>(buf, v),
        ApiKey::SaslHandshake => body::<SaslHandshakeResponse>(buf, v),
        ApiKey::SaslAuthenticate => body::<SaslAuthenticateResponse>(buf, v),
        ApiKey::CreateAcls => body::<CreateAclsResponse>(buf, v),
        ApiKey::DescribeAcls => body::<DescribeAclsResponse>(buf, v),
        ApiKey::DeleteAcls => body::<DeleteAclsResponse>(buf, v),
        ApiKey::DescribeUserScramCredentials => {
            body::<DescribeUserScramCredentialsResponse>(buf, v)
        }
        ApiKey::AlterUserScramCredentials => body::<AlterUserScramCredentialsResponse>(buf, v),
        ApiKey::AddPartitionsToTxn => body::<AddPartitionsToTxnResponse>(buf, v),
        ApiKey::AddOffsetsToTxn => body::<AddOffsetsToTxnResponse>(buf, v),
        ApiKey::EndTxn => body::<EndTxnResponse>(buf, v),
        ApiKey::DescribeTransactions => body::<DescribeTransactionsResponse>(buf, v),
        ApiKey::ListTransactions => body::<ListTransactionsResponse>(buf, v),
        ApiKey::TxnOffsetCommit => body::<TxnOffsetCommitResponse>(buf, v),
        other => Err(format!(
            "an answer to {other:?}, which shoal does not serve"
        )),
    }
}

/// Reads the next response frame, which must answer `correlation`, and decodes it.
pub fn recv_decoded<R: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    correlation: i32,
) -> R {
    let frame = recv(s).unwrap_or_else(|| panic!("{key:?} v{version}: connection closed"));
    decode(key, version, correlation, frame)
}

/// Sends a request and reads and decodes its response.
pub fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    correlation: i32,
    body: &Req,
) -> Resp {
    send(s, key, version, correlation, body);
    recv_decoded(s, key, version, correlation)
}

/// Asserts that the server closes the connection without sending a single byte.
pub fn expect_closed(s: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 256];
    let start = Instant::now();
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {}
        Ok(n) => panic!(
            "{what}: expected the connection closed, got {n} bytes: {:?}",
            &buf[..n]
        ),
        Err(e) => panic!(
            "{what}: expected the connection closed, got {e} after {:?}",
            start.elapsed()
        ),
    }
}

/// The values of the records in `records` (whole uncompressed batches back to back, as a Fetch
/// returns them), in order.
pub fn record_values(records: &[u8]) -> Vec<String> {
    let mut values = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        let n = shards::batch::peek_total_len(rest).expect("whole batches");
        for r in shards::batch::records(&rest[..n]).expect("uncompressed batches") {
            values.push(String::from_utf8(r.value.expect("a value").to_vec()).unwrap());
        }
        rest = &rest[n..];
    }
    values
}

/// A Produce request of one records blob to one partition.
pub fn produce_request(
    topic: &str,
    partition: i32,
    records: Vec<u8>,
    acks: i16,
) -> kafka_protocol::messages::ProduceRequest {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    kafka_protocol::messages::ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(records)))])])
}

/// A CreateTopics request for one topic (replication factor 1).
pub fn create_topic_request(
    topic: &str,
    partitions: i32,
) -> kafka_protocol::messages::CreateTopicsRequest {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    kafka_protocol::messages::CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(1)])
}

pub fn topic_name(topic: &str) -> kafka_protocol::messages::TopicName {
    kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_string(
        topic.to_string(),
    ))
}

/// A SASL/PLAIN exchange on `s` (SaslHandshake v1, SaslAuthenticate v2): the SaslAuthenticate error
/// code and message (0 and empty once authenticated).
pub fn sasl_plain(s: &mut TcpStream, user: &str, password: &str) -> (i16, String) {
    use kafka_protocol::messages::{
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse,
    };
    use kafka_protocol::protocol::StrBytes;
    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"));
    let r: SaslHandshakeResponse = call(s, ApiKey::SaslHandshake, 1, 9001, &hs);
    assert_eq!(r.error_code, 0, "PLAIN offered");
    let token = format!("\0{user}\0{password}");
    let auth = SaslAuthenticateRequest::default().with_auth_bytes(token.into_bytes().into());
    let r: SaslAuthenticateResponse = call(s, ApiKey::SaslAuthenticate, 2, 9002, &auth);
    (
        r.error_code,
        r.error_message.map(|m| m.to_string()).unwrap_or_default(),
    )
}
