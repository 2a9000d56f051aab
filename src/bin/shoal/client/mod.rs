//! The binary's Kafka client plumbing, shared by the load generator (`bench`) and the operator
//! commands (`tools`): request and response frames through `shoal::wire`, a blocking connection
//! with timeouts, TLS ([`tls`]) and SASL ([`sasl`]) set once per process, and version negotiation.
//!
//! ## Layout, top layer first
//! - [`sasl`] — SASL (PLAIN, SCRAM) on a connection, after TLS.
//! - [`tls`]  — the client TLS configuration and handshake.

pub mod sasl;
pub mod tls;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use kafka_protocol::protocol::{Decodable, Encodable};
use shoal::wire::{frame, header};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

const CLIENT_ID: &str = "shoal";

fn other(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// A whole request frame: size, header (in the version the API uses), body.
pub fn request_frame<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation: i32,
    body: &R,
) -> io::Result<BytesMut> {
    header::encode_request(CLIENT_ID, key, version, correlation, body).map_err(other)
}

/// Decodes a response frame (without its size): header, then body; checks the correlation id.
pub fn decode_response<R: Decodable>(
    key: ApiKey,
    version: i16,
    correlation: i32,
    frame: Bytes,
) -> io::Result<R> {
    header::decode_response(key, version, correlation, frame).map_err(other)
}

/// Resolves `host:port` to one socket address.
pub fn resolve(addr: &str) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))?
        .next()
        .ok_or_else(|| other(format!("{addr}: no address")))
}

/// The highest version of `key` in `lo..=hi` that the broker (its ApiVersions answer) serves.
pub fn pick_version(r: &ApiVersionsResponse, key: ApiKey, lo: i16, hi: i16) -> io::Result<i16> {
    let k = r
        .api_keys
        .iter()
        .find(|k| k.api_key == key as i16)
        .ok_or_else(|| other(format!("the broker does not serve {key:?}")))?;
    shoal::wire::common_version((k.min_version, k.max_version), (lo, hi)).ok_or_else(|| {
        other(format!(
            "no common {key:?} version: the broker serves {}..={}, this client {lo}..={hi}",
            k.min_version, k.max_version
        ))
    })
}

/// A blocking connection for control-plane calls.
#[derive(Debug)]
pub struct SyncConn {
    stream: tls::SyncStream,
    correlation: i32,
}

impl SyncConn {
    /// Connects within 10 s; each later read or write waits 30 s at most.
    pub fn connect(addr: SocketAddr) -> io::Result<SyncConn> {
        Self::connect_within(addr, Duration::from_secs(10), Duration::from_secs(30))
    }

    /// Connects within `connect` (then TLS and SASL, when enabled); each read or write waits `io`
    /// at most, so an unreachable or silent broker is an error rather than a hang.
    pub fn connect_within(
        addr: SocketAddr,
        connect: Duration,
        io: Duration,
    ) -> io::Result<SyncConn> {
        let stream = TcpStream::connect_timeout(&addr, connect)
            .map_err(|e| io::Error::new(e.kind(), format!("connecting to {addr}: {e}")))?;
        stream.set_read_timeout(Some(io))?;
        stream.set_write_timeout(Some(io))?;
        stream.set_nodelay(true)?;
        let mut stream = tls::SyncStream::wrap(stream, addr)?;
        sasl::authenticate_sync(&mut stream)
            .map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))?;
        Ok(SyncConn {
            stream,
            correlation: 0,
        })
    }

    /// Sends a request without waiting for an answer: for one that gets none (Produce with
    /// acks=0), and the first half of [`call`](Self::call).
    pub fn send<Req: Encodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> io::Result<()> {
        self.correlation += 1;
        let frame = request_frame(key, version, self.correlation, body)?;
        self.stream.write_all(&frame)?;
        self.stream.flush()
    }

    pub fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> io::Result<Resp> {
        self.send(key, version, body)?;
        let body = frame::read_blocking(&mut self.stream, 64 << 20).map_err(|e| {
            // The kind stays, so that a caller can tell a timeout from a closed connection.
            let e = io::Error::from(e);
            io::Error::new(e.kind(), format!("{key:?} response: {e}"))
        })?;
        decode_response(key, version, self.correlation, body)
    }
}
