//! A connection to an upstream Kafka broker, as a client: the edge's own requests (ApiVersions,
//! Metadata, ListOffsets, Fetch, FindCoordinator), encoded and decoded by `kafka-protocol`, and
//! requests forwarded byte for byte (consumer-group APIs). One request at a time; a connection
//! that failed or timed out mid-request is dropped by its owner, never reused.

use crate::wire::{frame, header};
use bytes::{BufMut, Bytes, BytesMut};
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use std::collections::HashMap;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

/// Longest a connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response frame taken from upstream: a fetch asks for 4 MiB, but its first batch may
/// be as large as the upstream's `max.message.bytes`.
const MAX_RESPONSE: usize = 128 << 20;

/// Why an upstream call failed, in words for logs and status.
pub type UpstreamError = String;

/// `fut`, or an error once `limit` has passed.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T, UpstreamError>>,
) -> Result<T, UpstreamError> {
    let expired = async {
        glommio::timer::sleep(limit).await;
        Err(format!("{what}: no answer within {} ms", limit.as_millis()))
    };
    futures_lite::future::or(fut, expired).await
}

/// Resolves `host:port` off the executor thread (a name lookup may block).
pub async fn resolve(addr: &str) -> Result<SocketAddr, UpstreamError> {
    let name = addr.to_string();
    glommio::executor()
        .spawn_blocking(move || name.to_socket_addrs().map(|mut a| a.next()))
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    pub addr: String,
    next_correlation: i32,
    /// The upstream's version range per API key.
    versions: HashMap<i16, (i16, i16)>,
    client_id: String,
}

impl Conn {
    /// Connects and learns the upstream's API versions.
    pub async fn connect(addr: &str, client_id: &str) -> Result<Conn, UpstreamError> {
        let sock = resolve(addr).await?;
        let stream = within(CONNECT_TIMEOUT, &format!("connect to {addr}"), async {
            TcpStream::connect(sock)
                .await
                .map_err(|e| format!("connect to {addr}: {e}"))
        })
        .await?;
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            addr: addr.to_string(),
            next_correlation: 1,
            versions: HashMap::new(),
            client_id: client_id.to_string(),
        };
        let versions: ApiVersionsResponse = conn
            .call(
                ApiKey::ApiVersions,
                0,
                &ApiVersionsRequest::default(),
                CONNECT_TIMEOUT,
            )
            .await?;
        if versions.error_code != 0 {
            return Err(format!(
                "{addr}: ApiVersions answered error {}",
                versions.error_code
            ));
        }
        conn.versions = versions
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(conn)
    }

    /// The highest version of `key` both sides speak within `ours`.
    pub fn version(&self, key: ApiKey, ours: RangeInclusive<i16>) -> Result<i16, UpstreamError> {
        let (min, max) = self
            .versions
            .get(&(key as i16))
            .copied()
            .ok_or_else(|| format!("{} does not offer {key:?}", self.addr))?;
        crate::wire::common_version((min, max), (*ours.start(), *ours.end())).ok_or_else(|| {
            format!(
                "{} speaks {key:?} v{min}-{max}, shoal edge v{}-{}",
                self.addr,
                ours.start(),
                ours.end()
            )
        })
    }

    /// Whether the upstream takes `key` at exactly `version` (forwarded requests keep theirs).
    pub fn takes(&self, key: i16, version: i16) -> bool {
        self.versions
            .get(&key)
            .is_some_and(|&(min, max)| (min..=max).contains(&version))
    }

    fn correlation(&mut self) -> i32 {
        let c = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1).max(1);
        c
    }

    /// Sends a request and decodes its response.
    pub async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        request: &Req,
        limit: Duration,
    ) -> Result<Resp, UpstreamError> {
        let correlation = self.correlation();
        let frame = header::encode_request(&self.client_id, key, version, correlation, request)?;
        let addr = self.addr.clone();
        let response = within(limit, &format!("{key:?} to {addr}"), async {
            self.exchange(&frame).await
        })
        .await?;
        // The upstream is trusted no more than a client: a decoder panic fails this call only.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            header::decode_response(key, version, correlation, response)
        }))
        .unwrap_or_else(|_| Err(format!("{key:?} v{version}: the decoder panicked")))
        .map_err(|e| format!("{addr}: {e}"))
    }

    /// Forwards a request's body as it came (its API key and version kept, the client's id named
    /// in the header) and returns the whole response frame: its correlation id (checked), the
    /// response header's tagged fields if the version has them, then the body.
    pub async fn forward(
        &mut self,
        key: ApiKey,
        version: i16,
        client_id: Option<&str>,
        body: &[u8],
        limit: Duration,
    ) -> Result<Bytes, UpstreamError> {
        let correlation = self.correlation();
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(client_id.map(|c| StrBytes::from_string(c.to_string())));
        let mut frame = BytesMut::with_capacity(64 + body.len());
        frame.put_i32(0);
        header
            .encode(&mut frame, key.request_header_version(version))
            .map_err(|e| format!("{key:?} v{version} header: {e}"))?;
        frame.extend_from_slice(body);
        let len = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        let addr = self.addr.clone();
        let response = within(limit, &format!("{key:?} to {addr}"), async {
            self.exchange(&frame).await
        })
        .await?;
        let mut head = response.clone();
        let answered = ResponseHeader::decode(&mut head, 0)
            .map_err(|e| format!("{addr}: {key:?} response header: {e}"))?
            .correlation_id;
        if answered != correlation {
            return Err(format!(
                "{addr}: correlation id {answered} answered where {correlation} was expected"
            ));
        }
        Ok(response)
    }

    async fn exchange(&mut self, frame: &[u8]) -> Result<Bytes, UpstreamError> {
        let addr = &self.addr;
        self.stream
            .write_all(frame)
            .await
            .map_err(|e| format!("{addr}: write: {e}"))?;
        frame::read_response(&mut self.stream, MAX_RESPONSE)
            .await
            .map_err(|e| format!("{addr}: {e}"))
    }
}
