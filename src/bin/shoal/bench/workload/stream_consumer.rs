//! A consumer of shoal's HTTP streams (`--protocol sse|ws`): one connection to the broker's
//! `--http-listen` address reading its partition's stream (JSON records) from its start offset;
//! it counts records and bytes, checks offsets follow on, and samples end-to-end latency from
//! each record's timestamp (milliseconds, so coarser than the Kafka consumers' samples).

use super::plan::{setup_over, ClientCfg, ConsumerPlan, DoneOnDrop, Reporter};
use crate::bench::args::Protocol;
use crate::bench::stats::{now_us, record, Hists, Phase, Shared};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// What the stream has delivered so far.
#[derive(Debug, Default)]
struct Progress {
    next: i64,
    records: u64,
    gaps: u64,
    gap_offsets: u64,
    /// The raw baseline's offsets wrap here.
    modulus: Option<i64>,
}

impl Progress {
    /// One record at `offset`, stamped `timestamp_ms`.
    fn record(
        &mut self,
        offset: i64,
        timestamp_ms: i64,
        sample: Option<(&RefCell<Hists>, bool, u64)>,
    ) {
        let expected = self.modulus.map_or(self.next, |m| self.next.rem_euclid(m));
        if offset != expected {
            self.gaps += 1;
            self.gap_offsets += offset.abs_diff(expected);
        }
        self.next = offset + 1;
        self.records += 1;
        if let Some((hists, measuring, epoch_us)) = sample {
            let ts = (timestamp_ms.max(0) as u64) * 1000;
            if ts >= epoch_us {
                let lat = now_us().saturating_sub(ts);
                let mut h = hists.borrow_mut();
                record(&mut h.e2e_interval, lat);
                if measuring {
                    record(&mut h.e2e, lat);
                }
            }
        }
    }
}

pub(super) async fn stream_consumer(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ConsumerPlan,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.consumers[plan.id];
    let _done = DoneOnDrop(&stats.done);
    let report = Reporter::consumer(&shared, &plan, "stream consumer");
    let (protocol, addr) = cfg.stream.expect("a stream consumer has a stream address");
    let part = plan.partition as usize;
    let start = stats.start_offset.load(Relaxed);
    let opened = open(protocol, addr, &plan.topic, plan.partition, start).await;
    shared.consumers_ready.fetch_add(1, Relaxed);
    let mut conn = match opened {
        Ok(conn) => conn,
        Err(e) => return report.fail(e),
    };
    setup_over(&shared).await;
    let mut progress = Progress {
        next: start,
        modulus: cfg.modulus,
        ..Progress::default()
    };
    let mut parser = Parser::new(protocol);
    let mut buf = vec![0u8; cfg.receive_buffer.max(4096)];
    loop {
        let phase = shared.phase();
        if phase == Phase::Stop || progress.next >= shared.drain_target[part].load(Relaxed) {
            break;
        }
        let read = futures_lite::future::or(async { Some(conn.read(&mut buf).await) }, async {
            glommio::timer::sleep(Duration::from_millis(100)).await;
            None
        })
        .await;
        let n = match read {
            None => continue,
            Some(Ok(0)) => return report.fail("the stream ended"),
            Some(Err(e)) => return report.fail(format!("reading the stream: {e}")),
            Some(Ok(n)) => n,
        };
        let (records, gaps, gap_offsets) = (progress.records, progress.gaps, progress.gap_offsets);
        let sample =
            cfg.sample_latency
                .then_some((&*hists, phase == Phase::Measure, shared.epoch_us));
        let pongs = match parser.feed(&buf[..n], &mut progress, sample) {
            Ok(pongs) => pongs,
            Err(e) => return report.fail(e),
        };
        for pong in pongs {
            if let Err(e) = conn.write_all(&pong).await {
                return report.fail(format!("answering a ping: {e}"));
            }
        }
        stats.records.fetch_add(progress.records - records, Relaxed);
        stats.bytes.fetch_add(n as u64, Relaxed);
        stats.position.store(progress.next, Relaxed);
        stats.gaps.fetch_add(progress.gaps - gaps, Relaxed);
        stats
            .gap_offsets
            .fetch_add(progress.gap_offsets - gap_offsets, Relaxed);
        stats.fetches.fetch_add(1, Relaxed);
    }
}

/// Connects and asks for the stream; returns once the answer's head has been read.
async fn open(
    protocol: Protocol,
    addr: std::net::SocketAddr,
    topic: &str,
    partition: i32,
    start: i64,
) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    let path =
        format!("/v1/topics/{topic}/partitions/{partition}/stream?offset={start}&format=json");
    let head = match protocol {
        Protocol::Ws => format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: c2hvYWwtYmVuY2gtc3RyZWFt\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ),
        _ => format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"),
    };
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("asking for the stream: {e}"))?;
    // The answer's head, a byte at a time: nothing of the stream is read past it.
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => answer.push(byte[0]),
            _ => return Err("the broker closed the connection before answering".into()),
        }
        if answer.len() > 16 << 10 {
            return Err("the answer's head is too long".into());
        }
    }
    let status = String::from_utf8_lossy(&answer);
    let ok = if protocol == Protocol::Ws {
        " 101 "
    } else {
        " 200 "
    };
    if !status.lines().next().is_some_and(|l| l.contains(ok)) {
        return Err(format!("the stream was refused: {}", status.trim()));
    }
    Ok(s)
}

/// Takes records out of the bytes of an SSE stream or of WebSocket frames.
struct Parser {
    protocol: Protocol,
    buf: Vec<u8>,
}

impl Parser {
    fn new(protocol: Protocol) -> Parser {
        Parser {
            protocol,
            buf: Vec::new(),
        }
    }

    /// Feeds bytes read; returns the pongs to send (WebSocket pings are answered).
    fn feed(
        &mut self,
        bytes: &[u8],
        progress: &mut Progress,
        sample: Option<(&RefCell<Hists>, bool, u64)>,
    ) -> Result<Vec<Vec<u8>>, String> {
        self.buf.extend_from_slice(bytes);
        let mut pongs = Vec::new();
        let mut at = 0;
        match self.protocol {
            Protocol::Ws => {
                while let Some((op, payload, next)) = ws_frame(&self.buf[at..]) {
                    match op {
                        0x1 => json_record(payload, progress, sample)?,
                        0x9 => {
                            // Masked with a zero key, as a client's frames must be.
                            let mut pong = vec![0x8A, 0x80 | payload.len() as u8, 0, 0, 0, 0];
                            pong.extend_from_slice(payload);
                            pongs.push(pong);
                        }
                        0x8 => return Err("the broker closed the stream".into()),
                        _ => {}
                    }
                    at += next;
                }
            }
            _ => {
                while let Some(end) = find(&self.buf[at..], b"\n\n") {
                    let event = &self.buf[at..at + end];
                    if let Some(data) = event
                        .split(|&b| b == b'\n')
                        .find_map(|l| l.strip_prefix(b"data: "))
                    {
                        if event.starts_with(b"event: ") {
                            if event.starts_with(b"event: gap") || event.starts_with(b"event: slow")
                            {
                                return Err(format!(
                                    "the broker said {}",
                                    String::from_utf8_lossy(event)
                                ));
                            }
                        } else {
                            json_record(data, progress, sample)?;
                        }
                    }
                    at += end + 2;
                }
            }
        }
        self.buf.drain(..at);
        Ok(pongs)
    }
}

/// A server's WebSocket frame at the start of `b`: (opcode, payload, its whole length).
fn ws_frame(b: &[u8]) -> Option<(u8, &[u8], usize)> {
    if b.len() < 2 {
        return None;
    }
    let (len, at): (usize, usize) = match b[1] & 0x7f {
        126 => (
            u16::from_be_bytes(b.get(2..4)?.try_into().ok()?) as usize,
            4,
        ),
        127 => (
            u64::from_be_bytes(b.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    let payload = b.get(at..at.checked_add(len)?)?;
    Some((b[0] & 0x0f, payload, at + len))
}

/// A JSON record's offset and timestamp, read without parsing the rest.
fn json_record(
    json: &[u8],
    progress: &mut Progress,
    sample: Option<(&RefCell<Hists>, bool, u64)>,
) -> Result<(), String> {
    let number = |key: &[u8]| -> Option<i64> {
        let at = find(json, key)? + key.len();
        let digits = json[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'-')
            .count();
        std::str::from_utf8(&json[at..at + digits])
            .ok()?
            .parse()
            .ok()
    };
    let (Some(offset), Some(ts)) = (number(b"\"offset\":"), number(b"\"timestamp\":")) else {
        return Err(format!(
            "not a record: {}",
            String::from_utf8_lossy(&json[..json.len().min(200)])
        ));
    };
    progress.record(offset, ts, sample);
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_taken_from_sse_and_websocket_bytes_in_pieces() {
        let sse = b"id: 0:5\ndata: {\"partition\":0,\"offset\":5,\"timestamp\":1,\"value\":\"a\"}\n\n:\n\nid: 0:7\ndata: {\"partition\":0,\"offset\":7,\"timestamp\":1}\n\n";
        let mut p = Parser::new(Protocol::Sse);
        let mut progress = Progress {
            next: 5,
            ..Progress::default()
        };
        for chunk in sse.chunks(7) {
            p.feed(chunk, &mut progress, None).unwrap();
        }
        assert_eq!(
            (
                progress.records,
                progress.next,
                progress.gaps,
                progress.gap_offsets
            ),
            (2, 8, 1, 1)
        );
        let json = br#"{"partition":0,"offset":0,"timestamp":2}"#;
        let mut ws = vec![0x81, json.len() as u8];
        ws.extend_from_slice(json);
        ws.extend_from_slice(&[0x89, 1, b'p']);
        let mut p = Parser::new(Protocol::Ws);
        let mut progress = Progress::default();
        let mut pongs = Vec::new();
        for chunk in ws.chunks(5) {
            pongs.extend(p.feed(chunk, &mut progress, None).unwrap());
        }
        assert_eq!((progress.records, progress.next), (1, 1));
        assert_eq!(pongs, vec![vec![0x8A, 0x81, 0, 0, 0, 0, b'p']]);
    }
}
