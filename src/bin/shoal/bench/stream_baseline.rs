//! The raw sender baseline for the HTTP streams (`--raw-baseline` with `--protocol sse|ws`): the
//! machine's practical limit for the same delivery over SSE or WebSocket.
//!
//! As many threads as the broker has cores listen on one address (`SO_REUSEPORT`, as shoal's
//! cores do). A connection's request names its partition, offset and protocol; the answer's head
//! is shoal's, then the batches of the in-memory ring ([`super::baseline::Ring`], the producers'
//! batches) follow from that offset, each encoded once per thread, partition and protocol by
//! shoal's own encoder (`shoal::http::encode`) and written from that one buffer to every
//! connection, what is ready in one vectored write. No log, no frames cache eviction, no slow
//! rule, no heartbeats. Paced (`--rate`), batches become available at the run's rate, as for the
//! Kafka baseline; unpaced, a connection is written as fast as it reads.

use super::baseline::{accept_until, spawn_servers, Pace, Ring, Threads};
use bytes::Bytes;
use futures_lite::AsyncReadExt;
use glommio::net::{TcpListener, TcpStream};
use shoal::http::encode::{encode_batch, Encoding, Protocol};
use shoal::http::request::Format;
use shoal::wire::SharedStream;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Most bytes of frames one write takes.
const WRITE_BYTES: usize = 1 << 20;

/// The running raw stream server.
#[derive(Debug)]
pub struct RawStreamServer {
    pub addr: SocketAddr,
    threads: Threads,
}

impl RawStreamServer {
    /// Starts `threads` threads on one address of 127.0.0.1 (thread i on CPU i where there are
    /// enough); with `pace`, one new batch per partition every `pace`.
    pub fn start(threads: usize, ring: Arc<Ring>, pace: Option<Duration>) -> io::Result<Self> {
        let listeners = bind_shared(threads.max(1))?;
        let addr = listeners[0].local_addr()?;
        let threads = spawn_servers(listeners, &ring, pace, accept)?;
        Ok(Self { addr, threads })
    }

    pub fn stop(self) {
        self.threads.stop();
    }
}

/// `n` listening sockets on one free port of 127.0.0.1, sharing it (`SO_REUSEPORT`).
fn bind_shared(n: usize) -> io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Socket, Type};
    let mut addr: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        let l: std::net::TcpListener = s.into();
        addr = l.local_addr()?;
        out.push(l);
    }
    Ok(out)
}

/// A thread's frames: each ring batch encoded once per (protocol, partition).
struct FrameCache {
    ring: Arc<Ring>,
    frames: RefCell<HashMap<(Protocol, i32, usize), Bytes>>,
}

impl FrameCache {
    fn new(ring: Arc<Ring>) -> Self {
        Self {
            ring,
            frames: RefCell::default(),
        }
    }

    /// The frame of the ring's batch at `offset` (wrapping) for `partition` over `protocol`.
    fn frame(&self, protocol: Protocol, partition: i32, offset: i64) -> Bytes {
        let index = (offset.rem_euclid(self.ring.period()) / self.ring.records_per_batch) as usize;
        let key = (protocol, partition, index);
        if let Some(f) = self.frames.borrow().get(&key) {
            return f.clone();
        }
        let records = self.ring.records(offset, 1, i64::MAX);
        let batch = &records.parts[0][..self.ring.batch_len];
        let h = shards::batch::BatchHeader::parse(batch).expect("a ring batch");
        let enc = Encoding {
            protocol,
            format: Format::Json,
            whole_batches: false,
        };
        let mut out = Vec::with_capacity(batch.len() * 2);
        encode_batch(enc, partition, &h, batch, h.base_offset, &mut out).expect("a ring batch");
        let frame = Bytes::from(out);
        self.frames.borrow_mut().insert(key, frame.clone());
        frame
    }
}

async fn accept(listener: TcpListener, ring: Arc<Ring>, stop: Arc<AtomicBool>, pace: Option<Pace>) {
    let frames = Rc::new(FrameCache::new(ring));
    let serve_one = |s| serve(s, frames.clone(), pace);
    accept_until(listener, &stop, "raw stream baseline", serve_one).await;
}

/// What a request asks: the protocol, partition, first offset and (WebSocket) key.
fn parse_request(head: &str) -> Option<(Protocol, i32, i64, String)> {
    let target = head.lines().next()?.split(' ').nth(1)?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let partition = path.split('/').nth(5)?.parse().ok()?;
    let offset = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("offset="))
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let websocket = header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let protocol = if websocket {
        Protocol::WebSocket
    } else {
        Protocol::Sse
    };
    Some((
        protocol,
        partition,
        offset,
        header("sec-websocket-key").unwrap_or_default(),
    ))
}

async fn serve(mut stream: TcpStream, frames: Rc<FrameCache>, pace: Option<Pace>) {
    let _ = stream.set_nodelay(true);
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 16 << 10 {
            return;
        }
    }
    let Some((protocol, partition, mut next, key)) = parse_request(&String::from_utf8_lossy(&head))
    else {
        return;
    };
    let answer = match protocol {
        Protocol::WebSocket => shoal::http::websocket::handshake_response(&key),
        Protocol::Sse => {
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
                .to_vec()
        }
    };
    let mut out = SharedStream::new(stream);
    if out.write_chunks(&[Bytes::from(answer)]).await.is_err() {
        return;
    }
    let per_batch = frames.ring.records_per_batch;
    loop {
        let end = match pace {
            None => i64::MAX,
            Some(p) => p.wait_past(next, Duration::from_secs(1)).await,
        };
        let mut chunks = Vec::new();
        let mut bytes = 0;
        while next < end && bytes < WRITE_BYTES {
            let frame = frames.frame(protocol, partition, next);
            bytes += frame.len();
            chunks.push(frame);
            next += per_batch;
        }
        if !chunks.is_empty() && out.write_chunks(&chunks).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_partition_offset_and_protocol() {
        let ws = "GET /v1/topics/t/partitions/3/stream?offset=40&format=json HTTP/1.1\r\n\
                  Upgrade: websocket\r\nSec-WebSocket-Key: abc\r\n\r\n";
        assert_eq!(
            parse_request(ws),
            Some((Protocol::WebSocket, 3, 40, "abc".to_string()))
        );
        let sse =
            "GET /v1/topics/t/partitions/0/stream HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n";
        assert_eq!(
            parse_request(sse),
            Some((Protocol::Sse, 0, 0, String::new()))
        );
    }
}
