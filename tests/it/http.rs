//! Topics streamed over HTTP (`--http-listen`) to real clients: Server-Sent Events read by a
//! reader written here on a plain socket and by `curl -N`, WebSocket by Python's `websockets`;
//! exactness, resuming after `kill -9`, read_committed, the shared frames, the slow rule and
//! bad input.

use crate::common;
use crate::transactions::{send_values, transactional_producer};
use common::{create_topics, Shoal};
use rdkafka::producer::Producer;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One SSE event as a browser's `EventSource` sees it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Event {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// An open SSE stream.
struct Sse {
    reader: BufReader<TcpStream>,
}

impl Sse {
    /// Opens `path` on `addr` with extra request headers; panics unless answered 200.
    fn open(addr: &str, path: &str, headers: &[(&str, &str)]) -> Sse {
        let (status, reader) = request(addr, path, headers);
        assert!(status.starts_with("HTTP/1.1 200"), "{path}: {status}");
        Sse { reader }
    }

    /// The next `n` events (comments skipped), within `within`.
    fn events(&mut self, n: usize, within: Duration) -> Vec<Event> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        let mut cur = Event::default();
        let mut has_data = false;
        while out.len() < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} events within {within:?}",
                out.len()
            );
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => panic!("the stream ended after {} of {n} events", out.len()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(e) => panic!("reading the stream: {e}"),
            }
            let line = line.trim_end_matches('\n');
            if line.is_empty() {
                if has_data {
                    out.push(std::mem::take(&mut cur));
                }
                has_data = false;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "" => {} // a comment (heartbeat)
                "id" => cur.id = Some(value.to_string()),
                "event" => cur.event = Some(value.to_string()),
                "data" => {
                    if has_data {
                        cur.data.push('\n');
                    }
                    cur.data.push_str(value);
                    has_data = true;
                }
                other => panic!("unexpected field {other:?}"),
            }
        }
        out
    }

    /// Whether any event arrives within `wait` (heartbeats aside).
    fn quiet_for(&mut self, wait: Duration) -> bool {
        self.reader.get_ref().set_read_timeout(Some(wait)).unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            match self.reader.read_line(&mut line) {
                Ok(0) => return true,
                Ok(_) if line.trim().is_empty() || line.starts_with(':') => continue,
                Ok(_) => return false,
                Err(_) => return true,
            }
        }
    }
}

/// Sends a GET with `headers` and reads the answer's head: (status line, the rest).
fn request(addr: &str, path: &str, headers: &[(&str, &str)]) -> (String, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    (status.trim_end().to_string(), reader)
}

/// A request that is refused: (status line, body).
fn refused(addr: &str, raw: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// A query value as a form encodes it: `+` for spaces, `%XX` escapes.
fn unescape(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Produces `values` to partition `p` of `topic` with librdkafka, pausing `pause` after every
/// 1,000 (paced), and waits for them all.
fn produce_values(
    bootstrap: &str,
    topic: &str,
    p: i32,
    values: impl IntoIterator<Item = String>,
    pause: Duration,
) {
    let producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
    for (i, value) in values.into_iter().enumerate() {
        let record = rdkafka::producer::BaseRecord::<(), _, ()>::to(topic)
            .partition(p)
            .payload(&value);
        common::send_retrying(&producer, record);
        if i % 1000 == 999 && !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// The JSON record of an event.
fn record(e: &Event) -> Value {
    serde_json::from_str(&e.data).unwrap_or_else(|err| panic!("{e:?}: {err}"))
}

/// Checks that `events` are partition `p`'s records `from..from+len`, each with the value
/// `value(offset)`.
fn assert_exact(events: &[Event], p: i32, from: i64, value: impl Fn(i64) -> String) {
    for (i, e) in events.iter().enumerate() {
        let offset = from + i as i64;
        assert_eq!(
            e.id.as_deref(),
            Some(format!("{p}:{offset}").as_str()),
            "{e:?}"
        );
        let r = record(e);
        assert_eq!(r["partition"], p);
        assert_eq!(r["offset"], offset);
        assert_eq!(r["value"], value(offset), "{e:?}");
    }
}

/// `websockets` reading `count` messages of `url`: one JSON object per message.
fn websocket(url: &str, count: usize) -> Vec<Value> {
    let out = common::python::run_script("ws_stream.py", &[url, &count.to_string(), "60"]);
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn start(dir: &std::path::Path, cores: usize, extra: &[&str]) -> (Shoal, String) {
    let shoal = Shoal::start(
        dir,
        cores,
        &[&["--http-listen", "127.0.0.1:0"], extra].concat(),
    );
    let http = shoal
        .http
        .clone()
        .expect("the http address in the listening line");
    (shoal, http)
}

#[test]
fn sse_websocket_and_curl_read_every_record_exactly_and_resume_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("ticks", 2)]);
    // Values "record 0".."record 999" on partition 0, "record 1000".. on partition 1.
    common::cli::produce(&b, "ticks", &[1000, 1000]);
    let first = |o: i64| format!("record {o}");
    // Whichever core a connection lands on, it reads the partition (served there, or handed to
    // its owner core).
    for p in [0, 1] {
        let mut sse = Sse::open(
            &http,
            &format!("/v1/topics/ticks/partitions/{p}/stream?offset=earliest"),
            &[],
        );
        let events = sse.events(1000, Duration::from_secs(30));
        assert_exact(&events, p, 0, |o| {
            format!("record {}", o + 1000 * i64::from(p))
        });
        assert!(
            sse.quiet_for(Duration::from_millis(300)),
            "nothing after the last record"
        );
    }
    // WebSocket, JSON: every record of partition 1 once, in order.
    let messages = websocket(
        &format!("ws://{http}/v1/topics/ticks/partitions/1/stream?offset=earliest"),
        1000,
    );
    assert_eq!(messages.len(), 1000);
    for (i, m) in messages.iter().enumerate() {
        let r: Value = serde_json::from_str(m["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            (r["offset"].as_i64(), r["value"].as_str()),
            (
                Some(i as i64),
                Some(format!("record {}", 1000 + i).as_str())
            )
        );
    }
    // curl, values as SSE text from offset 990.
    let curl = std::process::Command::new("curl")
        .args([
            "-sN",
            "--max-time",
            "2",
            &format!("http://{http}/v1/topics/ticks/partitions/0/stream?offset=990&format=value"),
        ])
        .output()
        .expect("curl runs");
    let body = String::from_utf8_lossy(&curl.stdout);
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(
        data,
        (990..1000)
            .map(|o| format!("record {o}"))
            .collect::<Vec<_>>()
    );
    // A subscriber reads 600 events, then the broker is killed and restarted.
    let mut sse = Sse::open(
        &http,
        "/v1/topics/ticks/partitions/0/stream?offset=earliest",
        &[],
    );
    let events = sse.events(600, Duration::from_secs(30));
    let last_id = events.last().unwrap().id.clone().unwrap();
    assert_eq!(last_id, "0:599");
    drop(sse);
    shoal.kill_hard();
    let (shoal, http) = start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    // 100 more records, "record 0".."record 99" at offsets 1000..1099.
    common::cli::produce(&b, "ticks", &[100, 0]);
    let then = |o: i64| {
        if o < 1000 {
            first(o)
        } else {
            format!("record {}", o - 1000)
        }
    };
    // The browser's reconnect: Last-Event-ID names the last event; exactly what follows comes.
    let mut sse = Sse::open(
        &http,
        "/v1/topics/ticks/partitions/0/stream",
        &[("Last-Event-ID", &last_id)],
    );
    let events = sse.events(500, Duration::from_secs(30));
    assert_exact(&events, 0, 600, then);
    assert!(
        sse.quiet_for(Duration::from_millis(300)),
        "nothing repeated or extra"
    );
    // WebSocket resumes with ?resume= the same way.
    let messages = websocket(
        &format!("ws://{http}/v1/topics/ticks/partitions/0/stream?resume=0:1049&format=value"),
        50,
    );
    let values: Vec<&str> = messages
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        values,
        (50..100).map(|i| format!("record {i}")).collect::<Vec<_>>()
    );
    assert!(shoal.metric("shoal_http_subscribers_total") >= 2);
    shoal.stop();
}

#[test]
fn read_committed_streams_leave_out_aborted_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 1, &[]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("orders", 1)]);
    let p = transactional_producer(&b, "http-txn", &[]);
    for (prefix, commit) in [("a", true), ("b", false), ("c", true)] {
        p.begin_transaction().unwrap();
        let values: Vec<String> = (0..10).map(|i| format!("{prefix}{i}")).collect();
        send_values(&p, "orders", &values);
        if commit {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    let values = |isolation: &str, n: usize| -> Vec<String> {
        let path =
            format!("/v1/topics/orders/partitions/0/stream?offset=earliest&isolation={isolation}");
        let mut sse = Sse::open(&http, &path, &[]);
        let events = sse.events(n, Duration::from_secs(30));
        assert!(
            sse.quiet_for(Duration::from_millis(300)),
            "{isolation}: only {n} records"
        );
        events
            .iter()
            .map(|e| record(e)["value"].as_str().unwrap().to_string())
            .collect()
    };
    let committed = values("read_committed", 20);
    let expected: Vec<String> = ["a", "c"]
        .iter()
        .flat_map(|p| (0..10).map(move |i| format!("{p}{i}")))
        .collect();
    assert_eq!(committed, expected);
    // read_uncommitted sees the aborted records too (never the markers).
    assert_eq!(values("read_uncommitted", 30).len(), 30);
    shoal.stop();
}

#[test]
fn subscribers_on_a_core_share_one_encoded_frame_per_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 1, &[]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("scores", 1)]);
    let subscribers = 40;
    let mut streams: Vec<Sse> = (0..subscribers)
        .map(|_| Sse::open(&http, "/v1/topics/scores/partitions/0/stream", &[]))
        .collect();
    // All at the tail before anything is produced.
    std::thread::sleep(Duration::from_millis(300));
    common::cli::produce(&b, "scores", &[200]);
    for s in &mut streams {
        let events = s.events(200, Duration::from_secs(30));
        assert_exact(&events, 0, 0, |o| format!("record {o}"));
    }
    let encoded = shoal.metric("shoal_http_frames_encoded_total");
    let sent = shoal.metric("shoal_http_frames_sent_total");
    assert!(encoded > 0);
    // Every batch was encoded once and sent to every subscriber.
    assert_eq!(
        sent,
        encoded * subscribers,
        "encoded {encoded}, sent {sent}"
    );
    assert_eq!(shoal.metric("shoal_http_subscribers"), subscribers);
    // The same figures in /v1/status.
    let (_, status) = shoal.admin_get("/v1/status");
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["cores"][0]["streams"]["subscribers"], subscribers);
    assert_eq!(status["cores"][0]["streams"]["frames_sent"], sent);
    // By topic too: in /metrics, /v1/status and the console's topic row.
    let by_topic = shoal.metric_with("shoal_http_topic_subscribers", "topic=\"scores\"");
    assert_eq!(by_topic, subscribers);
    let topics = &status["cores"][0]["streams"]["topics"];
    assert_eq!(topics[0]["topic"], "scores");
    assert_eq!(topics[0]["subscribers"], subscribers);
    let (_, console) = shoal.admin_get("/v1/console");
    let console: Value = serde_json::from_str(&console).unwrap();
    let row = console["topics"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "scores")
        .cloned()
        .unwrap();
    assert_eq!(row["stream_subscribers"], subscribers);
    drop(streams);
    // Closed streams are no longer counted.
    let deadline = Instant::now() + Duration::from_secs(20);
    while shoal.metric("shoal_http_subscribers") > 0 {
        assert!(Instant::now() < deadline, "streams still counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, metrics) = shoal.admin_get("/metrics");
    assert!(
        !metrics.contains("shoal_http_topic_subscribers{"),
        "no topic without streams"
    );
    shoal.stop();
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn a_subscriber_that_does_not_read_is_dropped_and_the_others_keep_up() {
    let dir = tempfile::tempdir().unwrap();
    // The buffer is larger than the whole stream: no reader is dropped for reading slowly (the
    // readers here are a hundred threads of a debug build); the stuck one is dropped because its
    // writes stop (5 s).
    let (shoal, http) = start(
        dir.path(),
        1,
        &[
            "--http-heartbeat-ms",
            "500",
            "--http-stream-buffer-bytes",
            "16MiB",
        ],
    );
    let b = shoal.bootstrap();
    create_topics(&b, &[("feed", 1)]);
    let before = rss(shoal.pid());
    // Connects, asks, and never reads again.
    let mut stuck = TcpStream::connect(&http).unwrap();
    stuck
        .write_all(b"GET /v1/topics/feed/partitions/0/stream HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let count = 20_000;
    let readers: Vec<_> = (0..100)
        .map(|_| {
            let mut sse = Sse::open(&http, "/v1/topics/feed/partitions/0/stream", &[]);
            std::thread::spawn(move || sse.events(count, Duration::from_secs(120)).len())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // 20,000 records of about 300 bytes (6 MB of events), paced: more than the kernel holds for
    // the stuck client.
    let payload = "x".repeat(300);
    let values = (0..count).map(|_| payload.clone());
    produce_values(&b, "feed", 0, values, Duration::from_millis(50));
    for r in readers {
        assert_eq!(
            r.join().unwrap(),
            count,
            "a reading subscriber got every record"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while shoal.metric("shoal_http_slow_disconnects_total") == 0 {
        assert!(
            Instant::now() < deadline,
            "the stuck subscriber was not dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        shoal.metric("shoal_http_slow_disconnects_total"),
        1,
        "only the stuck one"
    );
    // No queue per subscriber: the broker grew by about the records themselves (in its tail
    // cache) and the shared frames (at most 32 MiB), not by what the stuck one missed.
    let grown = rss(shoal.pid()).saturating_sub(before);
    assert!(grown < 128 << 20, "the broker grew {} MiB", grown >> 20);
    // Its connection ends once what the kernel held is read.
    stuck
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match stuck.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    assert_eq!(shoal.metric("shoal_http_subscribers"), 0);
    shoal.stop();
}

/// Raises this process's open-files limit to its hard limit; returns the limit now.
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid struct have no other preconditions.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

#[test]
fn ten_thousand_idle_subscribers_cost_under_16_kib_each() {
    const TEST: &str = "http::ten_thousand_idle_subscribers_cost_under_16_kib_each";
    let limit = raise_open_files();
    let n = 10_000.min(limit.saturating_sub(1_000) as usize);
    if n < 2_000 {
        return shards::testing::skipped(TEST, "thousands of idle streams", "open-files limit");
    }
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 1, &["--http-heartbeat-ms", "60000"]);
    create_topics(&shoal.bootstrap(), &[("quiet", 1)]);
    // One stream first, so that what every core sets up once is not counted per subscriber.
    let first = Sse::open(&http, "/v1/topics/quiet/partitions/0/stream", &[]);
    let before = rss(shoal.pid());
    let request =
        "GET /v1/topics/quiet/partitions/0/stream HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n";
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(&http).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        idle.push(s);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while shoal.metric("shoal_http_subscribers") < n as u64 + 1 {
        assert!(
            Instant::now() < deadline,
            "{} of {} streams open",
            shoal.metric("shoal_http_subscribers"),
            n + 1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let per = rss(shoal.pid()).saturating_sub(before) / n as u64;
    println!("{n} idle subscribers: {per} bytes each");
    assert!(per < 16 << 10, "{per} bytes per idle subscriber");
    drop(idle);
    drop(first);
    shoal.stop();
}

#[test]
fn bad_requests_get_a_status_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(
        dir.path(),
        1,
        &["--http-allowed-origins", "https://app.example"],
    );
    create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let get = |path: &str, extra: &str| {
        refused(
            &http,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n"),
        )
    };
    for (path, extra, status) in [
        ("/v1/topics/nope/partitions/0/stream", "", "404"),
        ("/v1/topics/t/partitions/5/stream", "", "404"),
        ("/v1/topics/t/partitions/0/stream?offset=99", "", "400"),
        ("/v1/topics/t/partitions/0/stream?offset=soon", "", "400"),
        ("/v1/topics/t/partitions/0/stream?format=xml", "", "400"),
        ("/v1/topics/t/partitions/0/stream", "Last-Event-ID: 3:1\r\n", "400"),
        ("/v1/topics/t/partitions/0/stream", "Accept: application/json\r\n", "406"),
        ("/v1/topics/t/partitions/0/stream", "Origin: https://evil.example\r\n", "403"),
        ("/v1/topics/t/partitions/0/stream", "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: a\r\nSec-WebSocket-Version: 8\r\n", "426"),
        ("/elsewhere", "", "404"),
    ] {
        let (line, body) = get(path, extra);
        assert!(line.starts_with(&format!("HTTP/1.1 {status}")), "{path} {extra:?}: {line}");
        assert!(!body.trim().is_empty(), "{path}: a reason");
    }
    let (line, _) = refused(
        &http,
        "POST /v1/topics/t/partitions/0/stream HTTP/1.1\r\n\r\n",
    );
    assert!(line.starts_with("HTTP/1.1 405"), "{line}");
    let many: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
    assert!(get("/v1/topics/t/partitions/0/stream", &many)
        .0
        .starts_with("HTTP/1.1 431"));
    let (line, _) = refused(&http, "\x16\x03\x01 not http at all\r\n\r\n");
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");
    // An allowed origin streams, with CORS.
    let (status, _) = request(
        &http,
        "/v1/topics/t/partitions/0/stream",
        &[("Origin", "https://app.example")],
    );
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // A WebSocket frame that breaks the RFC (unmasked) closes that connection with 1002.
    let mut ws = TcpStream::connect(&http).unwrap();
    ws.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ws.write_all(b"GET /v1/topics/t/partitions/0/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOrigin: https://app.example\r\n\r\n").unwrap();
    let mut reader = BufReader::new(ws.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");
    let mut head = String::new();
    while line != "\r\n" {
        line.clear();
        reader.read_line(&mut line).unwrap();
        head.push_str(&line);
    }
    assert!(
        head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "{head}"
    );
    ws.write_all(&[0x81, 0x02, b'h', b'i']).unwrap();
    let mut close = Vec::new();
    let _ = reader.read_to_end(&mut close);
    assert_eq!(
        &close[..4],
        &[0x88, close[1], 0x03, 0xea],
        "close 1002: {close:?}"
    );
    // The server goes on serving everyone else.
    let mut sse = Sse::open(
        &http,
        "/v1/topics/t/partitions/0/stream?offset=earliest",
        &[],
    );
    common::cli::produce(&shoal.bootstrap(), "t", &[3]);
    assert_eq!(sse.events(3, Duration::from_secs(30)).len(), 3);
    assert!(shoal.metric("shoal_http_refused_total") >= 13);
    shoal.stop();
}

#[test]
fn with_acls_streams_need_a_token_of_a_user_allowed_to_read_or_an_anonymous_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let extra = [
        "--authorizer",
        "acl",
        "--super-users",
        "User:alice",
        "--http-anonymous-read",
        "public.",
    ];
    // The Kafka listener stays open (no SASL): topics are created as ANONYMOUS, which ACLs would
    // refuse, so the table is written before the ACLs are enforced.
    let (shoal, _) = start(dir.path(), 1, &[]);
    create_topics(
        &shoal.bootstrap(),
        &[("public.prices", 1), ("private.ledger", 1)],
    );
    shoal.stop();
    let (shoal, http) = start(dir.path(), 1, &extra);
    let ledger = "/v1/topics/private.ledger/partitions/0/stream";
    let (line, body) = refused(&http, &format!("GET {ledger} HTTP/1.1\r\n\r\n"));
    assert!(line.starts_with("HTTP/1.1 401"), "{line}");
    assert!(body.contains("--http-anonymous-read"), "{body}");
    let (status, _) = request(&http, "/v1/topics/public.prices/partitions/0/stream", &[]);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // A password is never taken in plaintext.
    let (line, body) = refused(
        &http,
        &format!("GET {ledger} HTTP/1.1\r\nAuthorization: Basic YWxpY2U6cHc=\r\n\r\n"),
    );
    assert!(
        line.starts_with("HTTP/1.1 401") && body.contains("over TLS only"),
        "{line} {body}"
    );
    // Tokens made while the server runs: alice may read everything, bob nothing.
    let token = |user: &str| {
        let run = common::cli::shoal(&["user", "token", "create", user, "--data-dir", data], &[]);
        assert!(run.ok, "{}", run.stderr);
        run.stdout.trim().to_string()
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let (status, _) = request(&http, &format!("{ledger}?access_token={alice}"), &[]);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let bearer = format!("Bearer {alice}");
    let (status, _) = request(&http, ledger, &[("Authorization", &bearer)]);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let (line, body) = refused(
        &http,
        &format!("GET {ledger}?access_token={bob} HTTP/1.1\r\n\r\n"),
    );
    assert!(
        line.starts_with("HTTP/1.1 403") && body.contains("User:bob"),
        "{line} {body}"
    );
    let (line, _) = refused(
        &http,
        &format!("GET {ledger}?access_token=shoal_forged HTTP/1.1\r\n\r\n"),
    );
    assert!(line.starts_with("HTTP/1.1 401"), "{line}");
    // Revoked: refused from the next request on, and a stream open with it ends.
    let mut open = Sse::open(&http, &format!("{ledger}?access_token={alice}"), &[]);
    let listed = common::cli::shoal(&["user", "token", "list", "--data-dir", data], &[]);
    assert_eq!(
        listed.stdout.matches("alice").count(),
        1,
        "{}",
        listed.stdout
    );
    let revoked = common::cli::shoal(
        &["user", "token", "revoke", "alice", "--data-dir", data],
        &[],
    );
    assert!(revoked.ok, "{}", revoked.stderr);
    let (line, _) = refused(
        &http,
        &format!("GET {ledger}?access_token={alice} HTTP/1.1\r\n\r\n"),
    );
    assert!(line.starts_with("HTTP/1.1 401"), "{line}");
    let ended = open.events(1, Duration::from_secs(20)).remove(0);
    assert_eq!(ended.event.as_deref(), Some("error"), "{ended:?}");
    assert!(open.quiet_for(Duration::from_secs(5)), "the stream ended");
    shoal.stop();
}

#[test]
fn a_slow_subscriber_that_asks_to_skip_gets_a_gap_event_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(
        dir.path(),
        1,
        &[
            "--http-heartbeat-ms",
            "2000",
            "--http-stream-buffer-bytes",
            "64KiB",
        ],
    );
    let b = shoal.bootstrap();
    create_topics(&b, &[("burst", 1)]);
    let mut sse = Sse::open(
        &http,
        "/v1/topics/burst/partitions/0/stream?slow=skip&format=value",
        &[],
    );
    common::cli::produce(&b, "burst", &[10]);
    assert_eq!(sse.events(10, Duration::from_secs(30)).len(), 10);
    // 40 MB arrive at about 20 MB/s, far more than its socket and its buffer hold, while it
    // reads at about 5 MB/s: its lag grows.
    let producer = {
        let (b, big) = (b.clone(), "y".repeat(1000));
        std::thread::spawn(move || {
            let values = (0..40_000).map(|_| big.clone());
            produce_values(&b, "burst", 0, values, Duration::from_millis(50))
        })
    };
    // Records, then one gap, then the rest: nothing twice, nothing missing but the gap's range.
    let mut next = 10i64;
    let mut gap = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while next < 40_010 {
        assert!(Instant::now() < deadline, "at offset {next}");
        let e = sse.events(1, Duration::from_secs(30)).remove(0);
        if e.event.as_deref() == Some("gap") {
            let g = record(&e);
            assert!(gap.is_none(), "one gap: {e:?}");
            assert_eq!(g["from"], next, "{e:?}");
            next = g["to"].as_i64().unwrap() + 1;
            gap = Some(g);
            continue;
        }
        assert_eq!(e.id, Some(format!("0:{next}")), "{e:?}");
        next += 1;
        // Until it is skipped, it reads slower than the records come (about 5 MB/s).
        if gap.is_none() && next % 10 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    producer.join().unwrap();
    assert!(gap.is_some(), "the slow subscriber was skipped forward");
    assert!(shoal.metric("shoal_http_gaps_total") >= 1);
    assert_eq!(shoal.metric("shoal_http_slow_disconnects_total"), 0);
    shoal.stop();
}

#[test]
fn an_edge_streams_its_upstreams_topics_from_the_start_and_at_the_tail() {
    let (up_dir, edge_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let upstream = common::edge::start_upstream(up_dir.path(), "127.0.0.1:0");
    let ub = upstream.bootstrap();
    create_topics(&ub, &[("feed", 2)]);
    common::cli::produce(&ub, "feed", &[300, 300]);
    let flags = [
        "--edge-metadata-refresh-ms",
        "500",
        "--http-listen",
        "127.0.0.1:0",
    ];
    let cmd = common::edge::edge_command(edge_dir.path(), 2, &ub, &flags);
    let edge = Shoal::spawn(cmd, edge_dir.path());
    common::edge::wait_for_topic(&edge, "feed", 2);
    let http = edge.http.clone().expect("the edge's http address");
    let first = |p: i64, o: i64| format!("record {}", 300 * p + o);
    // From the start: what the edge does not hold is read through from upstream, then its feed
    // brings the rest.
    let mut one = Sse::open(
        &http,
        "/v1/topics/feed/partitions/1/stream?offset=earliest",
        &[],
    );
    assert_exact(&one.events(300, Duration::from_secs(30)), 1, 0, |o| {
        first(1, o)
    });
    let mut merged = Sse::open(&http, "/v1/topics/feed/stream?offset=earliest", &[]);
    let (records, _) = merged_records(&merged.batches(600, Duration::from_secs(30)));
    assert_partitions(&records, &[0, 0], &[300, 300], first);
    // At the tail: records produced upstream now reach both streams.
    common::cli::produce(&ub, "feed", &[100, 100]);
    let then = |p: i64, o: i64| format!("record {}", 100 * p + o - 300);
    assert_exact(&one.events(100, Duration::from_secs(30)), 1, 300, |o| {
        then(1, o)
    });
    let (records, last_id) = merged_records(&merged.batches(200, Duration::from_secs(30)));
    assert_partitions(&records, &[300, 300], &[400, 400], then);
    assert_eq!(last_id, "0:399,1:399");
    // Resumed at the edge from an id: exactly what follows, from the upstream's offsets.
    let mut resumed = Sse::open(
        &http,
        "/v1/topics/feed/stream",
        &[("Last-Event-ID", "0:349,1:-1")],
    );
    let (records, _) = merged_records(&resumed.batches(450, Duration::from_secs(30)));
    let value = |p: i64, o: i64| if o < 300 { first(p, o) } else { then(p, o) };
    assert_partitions(&records, &[350, 0], &[400, 400], value);
    assert!(resumed.quiet_for(Duration::from_millis(300)));
    edge.stop();
    upstream.stop();
}

/// The page the browser test opens: it reads `count` records of partition 0 of `topic` with
/// `EventSource` and `count` of partition 1 with `WebSocket` (reconnecting as a page would, with
/// `?resume=` its last event), checks every offset and value, and reports what it saw to
/// `report` (a GET with the figures in its query).
fn browser_page(http: &str, topic: &str, count: usize, report: &str, view_count: usize) -> String {
    format!(
        r#"<!doctype html><html><body><div id="out" data-result="running"></div><script>
const base = "http://{http}/v1/topics/{topic}/partitions/";
const out = document.getElementById("out");
const seen = {{ sse: 0, ws: 0, bad: [] }};
let finished = 0;
const view = {{ count: 0, sum: 0, seen: new Set(), last: {{}} }};
function finish() {{
  if (++finished < 3) return;
  out.setAttribute("data-sse", seen.sse);
  out.setAttribute("data-ws", seen.ws);
  out.setAttribute("data-bad", seen.bad.slice(0, 5).join(" | ") || "none");
  out.setAttribute("data-result", "done");
  const q = new URLSearchParams({{ sse: seen.sse, ws: seen.ws, view: view.count, view_sum: view.sum,
    bad: seen.bad.slice(0, 5).join(" | ") || "none" }});
  fetch("http://{report}/report?" + q, {{ mode: "no-cors" }});
}}
function check(kind, r, want) {{
  if (r.offset !== want || r.value !== "record " + (r.partition * 1000000 + r.offset)) {{
    seen.bad.push(kind + " wanted " + want + " got " + JSON.stringify(r));
  }}
}}
const sse = new EventSource(base + "0/stream?offset=earliest");
sse.onmessage = (e) => {{
  check("sse", JSON.parse(e.data), seen.sse);
  if (++seen.sse === {count}) {{ sse.close(); finish(); }}
}};
let last = -1;
function ws() {{
  const from = last < 0 ? "offset=earliest" : "resume=1:" + last;
  const socket = new WebSocket("ws://{http}/v1/topics/{topic}/partitions/1/stream?" + from);
  socket.onmessage = (e) => {{
    const r = JSON.parse(e.data);
    check("ws", r, last + 1);
    last = r.offset;
    if (++seen.ws === {count}) {{ socket.close(); finish(); }}
  }};
  socket.onclose = () => {{ if (seen.ws < {count}) setTimeout(ws, 200); }};
}}
ws();
// A view's shard, every partition merged: each event a batch, its id every partition's position.
const vs = new EventSource("http://{http}/v1/topics/keyed.shard-1-of-2/stream?offset=earliest");
vs.onmessage = (e) => {{
  for (const r of JSON.parse(e.data)) {{
    const i = Number(r.value.slice(1));
    if (view.seen.has(i) || (view.last[r.partition] ?? -1) >= r.offset) {{
      seen.bad.push("view repeated " + r.value);
    }}
    view.seen.add(i); view.last[r.partition] = r.offset; view.count++; view.sum += i;
  }}
  if (view.count >= {view_count}) {{ vs.close(); finish(); }}
}};
</script></body></html>"#
    )
}

#[test]
fn a_browser_reads_with_eventsource_and_websocket_and_resumes_by_itself_after_kill_9() {
    const TEST: &str =
        "http::a_browser_reads_with_eventsource_and_websocket_and_resumes_by_itself_after_kill_9";
    if common::browser::chromium().is_err() {
        return shards::testing::skipped(TEST, "streams in a headless browser", "no chromium");
    }
    let dir = tempfile::tempdir().unwrap();
    let _ports = common::ports_lock();
    let port = common::free_port_run(1);
    let listen = format!("127.0.0.1:{port}");
    // A page opened from a file has the origin "null".
    let flags = [
        "--http-listen",
        listen.as_str(),
        "--http-allowed-origins",
        "null",
    ];
    let shoal = Shoal::start(dir.path(), 2, &flags);
    let http = shoal.http.clone().unwrap();
    let b = shoal.bootstrap();
    create_topics(&b, &[("live", 2)]);
    // Values "record P*1000000+O", so that the page can check each one.
    let produce = |bootstrap: &str, p: i32, offsets: std::ops::Range<i64>| {
        let values = offsets.map(|o| format!("record {}", i64::from(p) * 1_000_000 + o));
        produce_values(bootstrap, "live", p, values, Duration::ZERO);
    };
    produce(&b, 0, 0..5000);
    produce(&b, 1, 0..5000);
    // Keyed records "v{i}" (key "k{i}") for a view: half now, half after the restart.
    create_topics(&b, &[("keyed", 2)]);
    produce_keyed(&b, "keyed", 0..1000, 2);
    let in_shard: Vec<usize> = (0..2000)
        .filter(|i| shards::partitioner::shard_of(Some(format!("k{i}").as_bytes()), 2) == Some(1))
        .collect();
    // The page reports here when it is done.
    let reports = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let report_addr = reports.local_addr().unwrap().to_string();
    let page = dir.path().join("page.html");
    let page_text = browser_page(&http, "live", 10_000, &report_addr, in_shard.len());
    std::fs::write(&page, page_text).unwrap();
    let url = format!("file://{}", page.display());
    let Some(_browser) = common::browser::open_page(TEST, &url) else {
        return;
    };
    // Once both streams have delivered the first half, the broker is killed and comes back on the
    // same HTTP address; the second half is produced after.
    let deadline = Instant::now() + Duration::from_secs(60);
    while shoal.metric("shoal_http_records_sent_total") < 10_000 {
        assert!(
            Instant::now() < deadline,
            "the page read {} records",
            shoal.metric("shoal_http_records_sent_total")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    shoal.kill_hard();
    // The same HTTP address (the page reconnects there); Kafka anywhere.
    let shoal = Shoal::start(dir.path(), 2, &flags);
    let b = shoal.bootstrap();
    produce(&b, 0, 5000..10_000);
    produce(&b, 1, 5000..10_000);
    produce_keyed(&b, "keyed", 1000..2000, 2);
    reports.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut conn = loop {
        match reports.accept() {
            Ok((conn, _)) => break conn,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("the page did not report within 90 s: {e}"),
        }
    };
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).unwrap();
    let _ = conn.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
    let query = line
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.split_once('?'))
        .map(|(_, q)| q.to_string())
        .unwrap_or_default();
    let field = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map(unescape)
            .unwrap_or_default()
    };
    assert_eq!(field("bad"), "none", "{line}");
    assert_eq!(
        (field("sse"), field("ws")),
        ("10000".to_string(), "10000".to_string()),
        "{line}"
    );
    // The shard's keys, each once (no repeats, checked by the page), and only those.
    let sum: usize = in_shard.iter().sum();
    assert_eq!(
        (field("view"), field("view_sum")),
        (in_shard.len().to_string(), sum.to_string()),
        "{line}"
    );
    shoal.stop();
}

#[test]
fn without_a_list_of_origins_only_same_origin_websockets_and_no_cors() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let upgrade = |origin: &str| {
        refused(
            &http,
            &format!(
                "GET /v1/topics/t/partitions/0/stream HTTP/1.1\r\nHost: {http}\r\nOrigin: {origin}\r\n\
                 Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 Sec-WebSocket-Version: 13\r\n\r\n"
            ),
        )
        .0
    };
    assert!(upgrade("https://evil.example").starts_with("HTTP/1.1 403"));
    // The page's own origin: the connection is upgraded (the read ends at the test's timeout).
    let mut s = TcpStream::connect(&http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /v1/topics/t/partitions/0/stream HTTP/1.1\r\nHost: {http}\r\nOrigin: http://{http}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");
    // SSE from another origin is served, with no CORS answer: the browser keeps the page out.
    let mut sse = TcpStream::connect(&http).unwrap();
    sse.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sse.write_all(
        b"GET /v1/topics/t/partitions/0/stream HTTP/1.1\r\nOrigin: https://evil.example\r\n\r\n",
    )
    .unwrap();
    let mut head = String::new();
    let mut reader = BufReader::new(&sse);
    loop {
        let mut l = String::new();
        reader.read_line(&mut l).unwrap();
        if l == "\r\n" || l.is_empty() {
            break;
        }
        head.push_str(&l);
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.contains("Access-Control-Allow-Origin"), "{head}");
    shoal.stop();
}

#[test]
fn a_deleted_topic_ends_its_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 1, &[]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("gone", 1)]);
    common::cli::produce(&b, "gone", &[3]);
    let mut sse = Sse::open(
        &http,
        "/v1/topics/gone/partitions/0/stream?offset=earliest",
        &[],
    );
    assert_eq!(sse.events(3, Duration::from_secs(30)).len(), 3);
    let run = common::cli::topic(&b, &["delete", "gone"]);
    assert!(run.ok, "{}", run.stderr);
    // The stream ends (the client would resume where the topic is served again).
    sse.reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = String::new();
    let ended = sse.reader.read_to_string(&mut rest);
    assert!(ended.is_ok(), "the stream ended: {ended:?}");
    assert_eq!(shoal.metric("shoal_http_subscribers"), 0);
    shoal.stop();
}

/// A merged stream's records, (partition, offset, value) in arrival order, from events that
/// each hold a batch; checks every event's id names, for its own partition, at least the last
/// offset in it. Returns them and the last event's id.
fn merged_records(events: &[Event]) -> (Vec<(i64, i64, String)>, String) {
    let mut out = Vec::new();
    for e in events {
        let batch: Vec<Value> =
            serde_json::from_str(&e.data).unwrap_or_else(|err| panic!("{e:?}: {err}"));
        let id = e.id.clone().expect("every merged event has an id");
        let last = batch.last().expect("no empty batch event");
        // The id names at least its last record (a view's batch may cover later offsets of
        // other keys).
        let (p, o) = (
            last["partition"].as_i64().unwrap(),
            last["offset"].as_i64().unwrap(),
        );
        let named = id
            .split(',')
            .find_map(|e| e.strip_prefix(&format!("{p}:")))
            .map(|o| o.parse::<i64>().unwrap());
        assert!(
            named.is_some_and(|n| n >= o),
            "id {id}, last record {p}:{o}"
        );
        for r in &batch {
            let value = r["value"].as_str().unwrap().to_string();
            out.push((
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
                value,
            ));
        }
    }
    (
        out,
        events.last().and_then(|e| e.id.clone()).unwrap_or_default(),
    )
}

impl Sse {
    /// Events of a merged stream until they held `records` records.
    fn batches(&mut self, records: usize, within: Duration) -> Vec<Event> {
        let deadline = Instant::now() + within;
        let mut events = Vec::new();
        let mut held = 0;
        while held < records {
            let left = deadline.saturating_duration_since(Instant::now());
            let e = self.events(1, left).remove(0);
            held += serde_json::from_str::<Vec<Value>>(&e.data).map_or(0, |b| b.len());
            events.push(e);
        }
        events
    }
}

/// Checks that `records` hold, per partition, exactly the offsets `from[p]..to[p]` in order,
/// with `value(p, offset)`.
fn assert_partitions(
    records: &[(i64, i64, String)],
    from: &[i64],
    to: &[i64],
    value: impl Fn(i64, i64) -> String,
) {
    for p in 0..from.len() as i64 {
        let got: Vec<(i64, &str)> = records
            .iter()
            .filter(|r| r.0 == p)
            .map(|r| (r.1, r.2.as_str()))
            .collect();
        let want: Vec<(i64, String)> = (from[p as usize]..to[p as usize])
            .map(|o| (o, value(p, o)))
            .collect();
        let want: Vec<(i64, &str)> = want.iter().map(|(o, v)| (*o, v.as_str())).collect();
        assert_eq!(got, want, "partition {p}");
    }
}

#[test]
fn a_topic_streams_merged_where_each_client_lands_and_resumes_from_its_id_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("board", 4)]);
    // "record i": partition p holds i = 250p + offset.
    common::cli::produce(&b, "board", &[250; 4]);
    let first = |p: i64, o: i64| format!("record {}", 250 * p + o);
    // Several clients, so both cores get some: each reads every partition, exactly, from the
    // core it landed on (the other core's partitions from read replicas it asked for).
    for _ in 0..4 {
        let mut sse = Sse::open(&http, "/v1/topics/board/stream?offset=earliest", &[]);
        let (records, last_id) = merged_records(&sse.batches(1000, Duration::from_secs(30)));
        assert_partitions(&records, &[0; 4], &[250; 4], first);
        assert_eq!(last_id, "0:249,1:249,2:249,3:249");
        assert!(sse.quiet_for(Duration::from_millis(300)));
    }
    assert_eq!(shoal.metric("shoal_http_handed_over_total"), 0);
    assert!(shoal.metric("shoal_replica_snapshots_total") >= 1);
    // Python's httpx-sse, from PyPI: the same, and the id a browser would resume with.
    let url = format!("http://{http}/v1/topics/board/stream?offset=earliest");
    let out = common::python::run_script("sse_stream.py", &[&url, "records:1000", "60"]);
    let events: Vec<Event> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Event {
                id: v["id"]
                    .as_str()
                    .map(str::to_string)
                    .filter(|i| !i.is_empty()),
                event: Some(v["event"].as_str().unwrap().to_string()),
                data: v["data"].as_str().unwrap().to_string(),
            }
        })
        .collect();
    let (records, last_id) = merged_records(&events);
    assert_partitions(&records, &[0; 4], &[250; 4], first);
    assert_eq!(last_id, "0:249,1:249,2:249,3:249");
    // WebSocket: a message per batch, {"records":[...],"id":...}.
    let out = common::python::run_script(
        "ws_stream.py",
        &[
            &format!("ws://{http}/v1/topics/board/stream?offset=earliest"),
            "records:1000",
            "60",
        ],
    );
    let mut records = Vec::new();
    for line in out.lines() {
        let m: Value = serde_json::from_str(line).unwrap();
        let msg: Value = serde_json::from_str(m["text"].as_str().unwrap()).unwrap();
        assert!(msg["id"].as_str().unwrap().contains(','), "{msg}");
        for r in msg["records"].as_array().unwrap() {
            let v = r["value"].as_str().unwrap().to_string();
            records.push((
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
                v,
            ));
        }
    }
    assert_partitions(&records, &[0; 4], &[250; 4], first);
    // A reader stops part way; the broker is killed and restarted; 50 more per partition.
    let mut sse = Sse::open(&http, "/v1/topics/board/stream?offset=earliest", &[]);
    let (seen, id) = merged_records(&sse.batches(300, Duration::from_secs(30)));
    drop(sse);
    let at: Vec<i64> = (0..4)
        .map(|p| seen.iter().filter(|r| r.0 == p).count() as i64)
        .collect();
    shoal.kill_hard();
    let (shoal, http) = start(dir.path(), 2, &[]);
    common::cli::produce(&shoal.bootstrap(), "board", &[50; 4]);
    let then = |p: i64, o: i64| {
        if o < 250 {
            first(p, o)
        } else {
            format!("record {}", 50 * p + o - 250)
        }
    };
    // The browser's reconnect: exactly what follows the id, in every partition.
    let mut sse = Sse::open(&http, "/v1/topics/board/stream", &[("Last-Event-ID", &id)]);
    let left = 1200 - seen.len();
    let (records, last_id) = merged_records(&sse.batches(left, Duration::from_secs(30)));
    assert_partitions(&records, &at, &[300; 4], then);
    assert_eq!(last_id, "0:299,1:299,2:299,3:299");
    assert!(
        sse.quiet_for(Duration::from_millis(300)),
        "nothing repeated"
    );
    shoal.stop();
}

/// Produces records `i` of `range` keyed `k{i}` with values `v{i}`, record i to partition
/// i % partitions.
fn produce_keyed(bootstrap: &str, topic: &str, range: std::ops::Range<usize>, partitions: i32) {
    let producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
    for i in range {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        let record = rdkafka::producer::BaseRecord::<_, _, ()>::to(topic)
            .partition(i as i32 % partitions)
            .key(&key)
            .payload(&value);
        common::send_retrying(&producer, record);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn a_view_shard_streams_exactly_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("keyed", 2)]);
    produce_keyed(&b, "keyed", 0..600, 2);
    let shard_of =
        |i: usize| shards::partitioner::shard_of(Some(format!("k{i}").as_bytes()), 3).unwrap();
    for shard in 0..3u32 {
        let want: Vec<usize> = (0..600).filter(|&i| shard_of(i) == shard).collect();
        // Merged: every partition's records of the shard's keys.
        let mut sse = Sse::open(
            &http,
            &format!("/v1/topics/keyed.shard-{shard}-of-3/stream?offset=earliest"),
            &[],
        );
        let (records, _) = merged_records(&sse.batches(want.len(), Duration::from_secs(30)));
        let mut got: Vec<usize> = records
            .iter()
            .map(|r| r.2.strip_prefix('v').unwrap().parse().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, want, "shard {shard}");
        // Record i is offset i / 2 of partition i % 2: offsets are the source's.
        for r in &records {
            let i: i64 = r.2[1..].parse().unwrap();
            assert_eq!((r.0, r.1), (i % 2, i / 2));
        }
        assert!(sse.quiet_for(Duration::from_millis(300)), "no other key");
        // One partition of the shard, per record.
        let mut sse = Sse::open(
            &http,
            &format!("/v1/topics/keyed.shard-{shard}-of-3/partitions/1/stream?offset=earliest"),
            &[],
        );
        let odd: Vec<usize> = want.iter().copied().filter(|i| i % 2 == 1).collect();
        let events = sse.events(odd.len(), Duration::from_secs(30));
        let got: Vec<usize> = events
            .iter()
            .map(|e| record(e)["value"].as_str().unwrap()[1..].parse().unwrap())
            .collect();
        assert_eq!(got, odd, "shard {shard}, partition 1");
        assert_eq!(
            events[0].id.as_deref(),
            Some(format!("1:{}", odd[0] / 2).as_str())
        );
    }
    shoal.stop();
}

#[test]
fn with_read_replicas_off_a_partition_stream_goes_to_its_owner_and_a_merged_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (shoal, http) = start(dir.path(), 2, &["--read-replicas", "off"]);
    let b = shoal.bootstrap();
    create_topics(&b, &[("solo", 2)]);
    common::cli::produce(&b, "solo", &[10, 10]);
    // Twenty connections: the kernel puts some on the core that does not own their partition
    // (each lands there with even odds), and those are handed to the owner.
    for i in 0..20 {
        let p = i % 2;
        let path = format!("/v1/topics/solo/partitions/{p}/stream?offset=earliest");
        let events = Sse::open(&http, &path, &[]).events(10, Duration::from_secs(20));
        assert_exact(&events, p, 0, |o| {
            format!("record {}", o + 10 * i64::from(p))
        });
    }
    assert!(shoal.metric("shoal_http_handed_over_total") >= 1);
    assert_eq!(shoal.metric("shoal_replica_snapshots_total"), 0);
    // A merged stream needs every partition on one core: refused with the reason, wherever it
    // lands (on the core that owns both it would be served, but each core owns one here).
    for _ in 0..4 {
        let (status, body) = refused(
            &http,
            &format!(
                "GET /v1/topics/solo/stream HTTP/1.1\r\nHost: {http}\r\nAccept: text/event-stream\r\n\r\n"
            ),
        );
        assert!(status.contains("503"), "{status}");
        assert!(body.contains("read replicas are off"), "{body}");
    }
    shoal.stop();
}

/// `curl -s` over HTTPS (trusting `ca`) with `args`, for at most 3 s: (exit code, output with
/// the answer's head, `-i`).
fn curl_https(ca: &std::path::Path, url: &str, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new("curl")
        .args([
            "-sN",
            "-i",
            "--max-time",
            "3",
            "--cacert",
            ca.to_str().unwrap(),
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn streams_over_tls_take_a_token_a_scram_password_or_a_client_certificate() {
    use rcgen::DnType;
    let pki = common::pki::pki();
    let dir = pki.dir.path();
    let data = tempfile::tempdir().unwrap();
    let (cert, key) = (
        pki.server.0.to_str().unwrap(),
        pki.server.1.to_str().unwrap(),
    );
    let ca = pki.ca_pem.to_str().unwrap();
    let (shoal, http) = start(
        data.path(),
        1,
        &[
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-client-ca",
            ca,
            "--http-tls",
            "--authorizer",
            "acl",
            "--super-users",
            "User:CN=admin",
        ],
    );
    let person = |name: &str| {
        pki.ca
            .sign(dir, name, &[(DnType::CommonName, name)], false, false)
    };
    let (admin, dave, erin) = (person("admin"), person("dave"), person("erin"));
    let b = shoal.bootstrap();
    let as_admin = |args: &[&str], env: &[(&str, &str)], input: &[u8]| {
        let tls = [
            "-b",
            &b,
            "--tls-ca",
            ca,
            "--tls-cert",
            admin.0.to_str().unwrap(),
            "--tls-key",
            admin.1.to_str().unwrap(),
        ];
        let run = common::cli::shoal_input(&[args, &tls[..]].concat(), env, input);
        assert!(run.ok, "{args:?}: {}", run.stderr);
    };
    as_admin(
        &["topic", "create", "ledger", "--partitions", "1"],
        &[],
        b"",
    );
    as_admin(&["produce", "ledger"], &[], b"one\ntwo\nthree\n");
    as_admin(
        &["user", "create", "carol"],
        &[("SHOAL_NEW_PASSWORD", "carol-pw")],
        b"",
    );
    for who in ["User:carol", "User:CN=dave"] {
        as_admin(
            &[
                "acl",
                "create",
                "--allow-principal",
                who,
                "--operation",
                "read",
                "--topic",
                "ledger",
            ],
            &[],
            b"",
        );
    }
    let url =
        format!("https://{http}/v1/topics/ledger/partitions/0/stream?offset=earliest&format=value");
    let values = |out: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    };
    let want = ["one", "two", "three"];
    // HTTP Basic with carol's SCRAM password.
    let (_, out) = curl_https(&pki.ca_pem, &url, &["-u", "carol:carol-pw"]);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(values(&out), want);
    let (_, out) = curl_https(&pki.ca_pem, &url, &["-u", "carol:wrong"]);
    assert!(
        out.starts_with("HTTP/1.1 401") && out.contains("wrong user name or password"),
        "{out}"
    );
    // dave's client certificate names him; erin's names someone without READ.
    let with_cert = |(c, k): &(std::path::PathBuf, std::path::PathBuf)| {
        curl_https(
            &pki.ca_pem,
            &url,
            &["--cert", c.to_str().unwrap(), "--key", k.to_str().unwrap()],
        )
        .1
    };
    let out = with_cert(&dave);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(values(&out), want);
    let out = with_cert(&erin);
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("User:CN=erin"),
        "{out}"
    );
    // A token of carol's.
    let made = common::cli::shoal(
        &[
            "user",
            "token",
            "create",
            "carol",
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(made.ok, "{}", made.stderr);
    let (_, out) = curl_https(
        &pki.ca_pem,
        &format!("{url}&access_token={}", made.stdout.trim()),
        &[],
    );
    assert_eq!(values(&out), want, "{out}");
    // No identity: 401; plaintext on the TLS port: no answer, a failed handshake counted.
    let (_, out) = curl_https(&pki.ca_pem, &url, &[]);
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    let (code, _) = curl_https(&pki.ca_pem, &url.replace("https://", "http://"), &[]);
    assert_ne!(code, 0);
    assert!(shoal.metric("shoal_http_tls_failures_total") >= 1);
    shoal.stop();
}
