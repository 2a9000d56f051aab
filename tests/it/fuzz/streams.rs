//! Fuzzes the HTTP stream listener of a running `shoal` (`--http-listen`): request heads and
//! WebSocket frames generated from valid ones (SSE and WebSocket stream requests, client frames
//! after an upgrade), mutated by `mutate.rs` and by HTTP-shaped changes (long or many headers,
//! odd methods and targets, extreme numbers and escapes in the query, bytes trickled), each on its
//! own connection. After each input the connection was answered (an HTTP status line, or a
//! WebSocket frame after `101`) or closed within a bounded time; all along the broker stays alive
//! with no panic or ERROR in its log, and a subscriber opened at the start keeps getting every
//! record produced, in order.

use super::mutate::{mutate, Rng};
use crate::common::{self, Shoal};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A valid request head, or a WebSocket upgrade followed by client frames.
fn valid(rng: &mut Rng) -> Vec<u8> {
    let offset = *rng.pick(&["earliest", "latest", "0", "3", "@0", "@99999999999999"]);
    let format = *rng.pick(&["json", "value"]);
    let partition = rng.below(3);
    let target =
        format!("/v1/topics/fz/partitions/{partition}/stream?offset={offset}&format={format}");
    if rng.one_in(2) {
        let mut out = format!(
            "GET {target} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .into_bytes();
        for _ in 0..rng.below(4) {
            out.extend(client_frame(rng));
        }
        out
    } else {
        format!("GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nLast-Event-ID: {partition}:{}\r\n\r\n", rng.below(5))
            .into_bytes()
    }
}

/// A client's WebSocket frame: masked (mostly), of any opcode and length field.
fn client_frame(rng: &mut Rng) -> Vec<u8> {
    let op = *rng.pick(&[0x1u8, 0x2, 0x8, 0x9, 0xA, 0x0, 0x3, 0xF]);
    let fin = if rng.one_in(5) { 0 } else { 0x80 };
    let len = *rng.pick(&[0usize, 1, 2, 125, 126, 300]);
    let payload = rng.bytes(len);
    let masked = if rng.one_in(6) { 0 } else { 0x80 };
    let mut out = vec![fin | op];
    match payload.len() {
        n if n < 126 => out.push(masked | n as u8),
        n => {
            out.push(masked | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    if masked != 0 {
        out.extend(rng.bytes(4));
    }
    out.extend(payload);
    if rng.one_in(8) {
        // A length that lies.
        out[1] = masked | 127;
        out.splice(2..2, u64::MAX.to_be_bytes());
    }
    out
}

/// HTTP-shaped changes the generic mutations do not make.
fn http_mutation(rng: &mut Rng, input: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8_lossy(&input).into_owned();
    match rng.below(8) {
        0 => text
            .replacen(
                "GET",
                rng.pick::<&str>(&["POST", "get", "", "GET GET", "\u{0}"]),
                1,
            )
            .into_bytes(),
        1 => {
            let many: String = (0..rng.below(200))
                .map(|i| format!("X-{i}: y\r\n"))
                .collect();
            text.replacen("Host: x\r\n", &format!("Host: x\r\n{many}"), 1)
                .into_bytes()
        }
        2 => text
            .replacen(
                "Host: x",
                &format!("Host: {}", "h".repeat(rng.below(40_000))),
                1,
            )
            .into_bytes(),
        3 => text
            .replacen(
                "/partitions/",
                rng.pick::<&str>(&[
                    "/partitions/-1/",
                    "/partitions/99999999999999999999/",
                    "/partitions/%ff/",
                    "//",
                ]),
                1,
            )
            .into_bytes(),
        4 => text
            .replacen(
                "offset=",
                rng.pick::<&str>(&[
                    "offset=-9223372036854775808&x=",
                    "offset=%",
                    "offset=@-1&offset=",
                    "resume=0:9223372036854775807&offset=",
                ]),
                1,
            )
            .into_bytes(),
        5 => text.replacen("\r\n\r\n", "\r\n", 1).into_bytes(),
        6 => text
            .replacen(
                "/v1/topics/fz/",
                rng.pick::<&str>(&[
                    "/v1/topics/fz.shard-0-of-2/",
                    "/v1/topics/%2e%2e/",
                    "/v1/topics//",
                    "/v1/topics/fz/stream/",
                ]),
                1,
            )
            .into_bytes(),
        _ => input,
    }
}

/// One input on its own connection: written (sometimes trickled), then read until the broker
/// answers and closes, or for at most 3 s. Whether the broker behaved: answered with an HTTP
/// status line, or closed.
fn send(addr: &str, input: &[u8], trickle: bool) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    if trickle {
        for chunk in input.chunks(7) {
            if s.write_all(chunk).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    } else {
        let _ = s.write_all(input);
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline && got.len() < 1 << 20 {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                // A stream that was accepted stays open: answered is enough.
                if got.starts_with(b"HTTP/1.1 ") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    if got.is_empty() || got.starts_with(b"HTTP/1.1 ") {
        Ok(())
    } else {
        Err(format!(
            "not an HTTP answer: {:?}",
            String::from_utf8_lossy(&got[..got.len().min(200)])
        ))
    }
}

#[test]
fn fuzz_the_http_streams() {
    let seed: u64 = std::env::var("SHOAL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(
        dir.path(),
        2,
        &["--http-listen", "127.0.0.1:0", "--http-heartbeat-ms", "500"],
    );
    let http = shoal.http.clone().unwrap();
    let b = shoal.bootstrap();
    common::create_topics(&b, &[("fz", 3)]);
    common::cli::produce(&b, "fz", &[5, 5, 5]);
    // A healthy subscriber from the start of partition 0.
    let mut healthy = TcpStream::connect(&http).unwrap();
    healthy
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    healthy
        .write_all(
            b"GET /v1/topics/fz/partitions/0/stream?offset=earliest&format=value HTTP/1.1\r\n\r\n",
        )
        .unwrap();
    let mut healthy = BufReader::new(healthy);
    let mut next_value = 0usize;
    let mut expect = |reader: &mut BufReader<TcpStream>, upto: usize| {
        while next_value < upto {
            let mut line = String::new();
            reader
                .read_line(&mut line)
                .expect("the healthy subscriber is served");
            if let Some(v) = line.strip_prefix("data: ") {
                assert_eq!(
                    v.trim_end(),
                    format!("record {next_value}"),
                    "the healthy subscriber's records in order"
                );
                next_value += 1;
            }
        }
    };
    expect(&mut healthy, 5);
    let budget = Duration::from_secs(
        std::env::var("SHOAL_FUZZ_HTTP_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8),
    );
    let started = Instant::now();
    let (mut index, mut produced) = (0u64, 5usize);
    let mut last_check = Instant::now();
    while started.elapsed() < budget {
        let mut rng = Rng::for_input(seed, index);
        let mut input = valid(&mut rng);
        if rng.below(10) > 0 {
            input = if rng.one_in(2) {
                let other = valid(&mut rng);
                mutate(&mut rng, &input, &other).0
            } else {
                http_mutation(&mut rng, input)
            };
        }
        let trickle = rng.one_in(10);
        if let Err(e) = send(&http, &input, trickle) {
            panic!(
                "seed {seed} input {index}: {e}; input {:?}",
                String::from_utf8_lossy(&input)
            );
        }
        index += 1;
        if last_check.elapsed() > Duration::from_millis(500) {
            last_check = Instant::now();
            let log = shoal.log_lines();
            assert!(
                !log.iter()
                    .any(|l| l.contains("panicked") || l.contains(" ERROR ")),
                "seed {seed} before input {index}: {:?}",
                log.iter().rev().take(5).collect::<Vec<_>>()
            );
            // The healthy subscriber gets what is produced now.
            common::cli::produce_records(&b, "fz", &[(0, None)]);
            produced += 1;
            // produce_records numbers its values from 0: the record is "record 0".
            let mut line = String::new();
            loop {
                line.clear();
                healthy
                    .read_line(&mut line)
                    .expect("the healthy subscriber is served");
                if line.starts_with("data: ") {
                    assert_eq!(line.trim_end(), "data: record 0", "seed {seed}");
                    break;
                }
            }
        }
    }
    println!(
        "http stream fuzz: {index} inputs in {:.1} s, seed {seed}, {produced} records produced",
        started.elapsed().as_secs_f64()
    );
    assert!(index > 100, "only {index} inputs");
    shoal.stop();
}
