//! The live console (`GET /console`, polling `GET /v1/console`) in a real browser: Debian's
//! chromium, headless, against `shoal serve` with a hot partition read by consumers on both cores
//! (read replicas), a wider topic and records produced by librdkafka. The page, once its scripts
//! ran, shows the broker's numbers: every core, each topic's partitions, high watermarks,
//! consumers and replicated partitions, one topic's partitions with leader and replica cores, a
//! lagging group's lag with its sparkline. And
//! the console under an admin token: the login page without it, the token from a cookie for reads
//! only.

use crate::common;

use common::browser::{attribute, chromium, dump_dom};
use common::cli::produce;
use common::Shoal;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Consumers of `topic`'s partition 0 from the beginning, polling until `stop` (librdkafka follows
/// the owner's preferred read replica).
fn tail_readers(
    bootstrap: &str,
    topic: &str,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (bootstrap, topic, stop) = (bootstrap.to_string(), topic.to_string(), stop.clone());
            std::thread::spawn(move || {
                let c: BaseConsumer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", &bootstrap)
                    .set("group.id", "console-readers-unused")
                    .set("enable.auto.commit", "false")
                    .set("fetch.wait.max.ms", "200")
                    .create()
                    .unwrap();
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&topic, 0, Offset::Beginning)
                    .unwrap();
                c.assign(&tpl).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let _ = c.poll(Duration::from_millis(100));
                }
            })
        })
        .collect()
}

fn console(shoal: &Shoal, query: &str) -> Value {
    let (status, body) = shoal.admin_get(&format!("/v1/console{query}"));
    assert!(status.contains("200"), "{status}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn topic_row<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["topics"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no topic {name}: {c}"))
}

#[test]
fn the_console_shows_the_brokers_numbers_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(
        dir.path(),
        2,
        &[
            "--read-replicas",
            "all",
            "--group-lag-interval-ms",
            "200",
            "--metrics-per-partition",
        ],
    );
    let b = shoal.bootstrap();
    common::create_topics(&b, &[("hot", 1), ("wide", 3), ("orders", 2)]);
    produce(&b, "hot", &[40]);
    produce(&b, "wide", &[5, 6, 7]);
    produce(&b, "orders", &[8, 10]);
    // A stopped group committed at the start of "orders": it lags by all 18 records.
    let seek = common::cli::shoal(
        &[
            "group",
            "seek",
            "lagger",
            "--topic",
            "orders",
            "--to-earliest",
            "-b",
            &b,
        ],
        &[],
    );
    assert!(seek.ok, "{}", seek.stderr);
    let stop = Arc::new(AtomicBool::new(false));
    let readers = tail_readers(&b, "hot", 4, &stop);

    // Wait (bounded) until the broker counts the four readers, spread over both cores, and the
    // hot partition's replica. A reader sent to the replica core still counts on the owner until
    // it has not fetched there for 10 s, so the count settles at 4 only then.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut settled = 0;
    while settled < 3 {
        let c = console(&shoal, "?topic=hot");
        let hot = topic_row(&c, "hot");
        let cores = c["partitions"]["items"][0]["consumers_by_core"]
            .as_object()
            .map_or(0, |m| m.len());
        let lagger = c["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == "lagger");
        let ready = hot["consumers"] == 4
            && hot["replicated_partitions"] == 1
            && cores == 2
            && lagger.is_some_and(|g| g["lag_sum"] == 18);
        settled = if ready { settled + 1 } else { 0 };
        assert!(
            Instant::now() < deadline,
            "readers or replica not settled: {c}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // A producer writes to "wide" while the page is open: its rate and high watermarks move.
    // One client sending all along, so that appends go on between any two of the page's polls
    // (under the browser's virtual time they can be milliseconds apart in real time).
    let producing = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
            let p: BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &b)
                .set("linger.ms", "1")
                .create()
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                let record = BaseRecord::<(), str>::to("wide")
                    .partition(2)
                    .payload("live");
                if p.send(record).is_err() {
                    p.poll(Duration::from_millis(10));
                }
                p.poll(Duration::from_millis(1));
            }
            p.flush(Duration::from_secs(10))
                .expect("the records are acknowledged");
        })
    };
    let url = format!("http://{}/console?topic=hot", shoal.admin);
    let dom = dump_dom(
        "the_console_shows_the_brokers_numbers_in_a_browser",
        &url,
        Duration::from_secs(6),
    );
    stop.store(true, Ordering::Relaxed);
    readers.into_iter().for_each(|r| r.join().unwrap());
    producing.join().unwrap();
    let Some(dom) = dom else { return };

    // The page polled at least once and drew every core.
    let polls: u32 = attribute(&dom, "id=\"status\"", "data-polls")
        .parse()
        .unwrap();
    assert!(polls >= 1, "the page's script never polled");
    for core in 0..2 {
        attribute(&dom, &format!("data-core=\"{core}\""), "data-busy");
    }
    assert!(!dom.contains("data-core=\"2\""));
    // Topics: partitions, high watermarks as produced, consumers, the replicated partition.
    let hot = "data-topic=\"hot\"";
    assert_eq!(attribute(&dom, hot, "data-partitions"), "1");
    assert_eq!(attribute(&dom, hot, "data-hw"), "40");
    assert_eq!(attribute(&dom, hot, "data-consumers"), "4");
    assert_eq!(attribute(&dom, hot, "data-replicated"), "1");
    let hw_metric = shoal.metric_with("shoal_log_high_watermark", "topic=\"hot\"");
    assert_eq!(hw_metric, 40);
    let wide = "data-topic=\"wide\"";
    assert_eq!(attribute(&dom, wide, "data-partitions"), "3");
    assert_eq!(attribute(&dom, wide, "data-replicated"), "3");
    // Updated while the producer ran: more than the 18 records before it, produced bytes/s shown.
    let wide_hw: u64 = attribute(&dom, wide, "data-hw").parse().unwrap();
    assert!(
        wide_hw > 18,
        "the page did not follow the producer: {wide_hw}"
    );
    let rate: u64 = attribute(&dom, wide, "data-produced-rate").parse().unwrap();
    assert!(rate > 0, "no produce rate shown");
    // The hot topic's partition: its leader, and the other core holding its replica.
    let leader: usize = attribute(&dom, "data-partition=\"0\"", "data-leader")
        .parse()
        .unwrap();
    assert!(leader < 2);
    assert_eq!(
        attribute(&dom, "data-partition=\"0\"", "data-replicas"),
        (1 - leader).to_string()
    );
    assert_eq!(attribute(&dom, "data-partition=\"0\"", "data-hw"), "40");
    // The lagging group: no members, all 18 records behind, with its lag over time drawn.
    let lagger = "data-group=\"lagger\"";
    assert_eq!(attribute(&dom, lagger, "data-lag"), "18");
    // The same as the operator command's figure.
    let described = common::cli::shoal(
        &["group", "describe", "lagger", "-b", &b, "--format", "json"],
        &[],
    )
    .json();
    assert_eq!(described["total_lag"], 18, "{described}");
    assert_eq!(attribute(&dom, lagger, "data-members"), "0");
    let row = &dom[dom.find(lagger).unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("Empty") && row.contains("<polyline"), "{row}");
    shoal.stop();
}

/// The console JSON pages topics and partitions: a page never holds more than its limit, and the
/// pages together hold every topic once.
#[test]
fn the_console_json_pages_topics_and_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let names: Vec<String> = (0..7).map(|i| format!("t{i}")).collect();
    let topics: Vec<(&str, i32)> = names.iter().map(|n| (n.as_str(), 4)).collect();
    common::create_topics(&shoal.bootstrap(), &topics);
    let mut seen = Vec::new();
    let mut from = 0;
    loop {
        let c = console(&shoal, &format!("?topics_limit=3&topics_from={from}&q=t"));
        assert_eq!(c["topics"]["total"], 7);
        let items = c["topics"]["items"].as_array().unwrap();
        assert!(items.len() <= 3);
        if items.is_empty() {
            break;
        }
        seen.extend(
            items
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_string()),
        );
        from += 3;
    }
    seen.sort();
    assert_eq!(seen, names);
    let c = console(&shoal, "?topic=t3&from=1&limit=2");
    let parts = &c["partitions"];
    assert_eq!(parts["total"], 4);
    let indexes: Vec<i64> = parts["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["partition"].as_i64().unwrap())
        .collect();
    assert_eq!(indexes, [1, 2]);
    // A filter that matches nothing, and an unknown topic.
    assert_eq!(console(&shoal, "?q=nothing")["topics"]["total"], 0);
    assert_eq!(
        console(&shoal, "?topic=nope")["partitions"]["error"],
        "no such topic"
    );
    shoal.stop();
}

/// Under `--admin-token-file` the console is guarded like the rest of the admin API: without the
/// token `/console` answers the login page (no data) and `/v1/console` 401; the token is taken as
/// a bearer header or, for reads only, from the login page's cookie.
#[test]
fn the_console_needs_the_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret/+token-of-some-length\n").unwrap();
    let data = dir.path().join("data");
    let shoal = Shoal::start(
        &data,
        1,
        &["--admin-token-file", token_file.to_str().unwrap()],
    );
    let (status, body) = shoal.admin_get("/console");
    assert!(status.contains("401"), "{status}");
    assert!(
        body.contains("shoal_admin_token") && !body.contains("/v1/console"),
        "{body}"
    );
    let (status, _) = shoal.admin_get("/v1/console");
    assert!(status.contains("401"), "{status}");
    let bearer = "Authorization: Bearer s3cret/+token-of-some-length\r\n";
    let (status, body) = shoal.admin_request_with("GET", "/console", bearer, "");
    assert!(
        status.contains("200") && body.contains("/v1/console"),
        "{status}"
    );
    // The cookie as the login page writes it (encodeURIComponent).
    let cookie = "Cookie: other=1; shoal_admin_token=s3cret%2F%2Btoken-of-some-length\r\n";
    let (status, body) = shoal.admin_request_with("GET", "/v1/console", cookie, "");
    assert!(status.contains("200"), "{status}: {body}");
    let wrong = "Cookie: shoal_admin_token=nope\r\n";
    let (status, _) = shoal.admin_request_with("GET", "/v1/console", wrong, "");
    assert!(status.contains("401"), "{status}");
    // A cookie does not change a setting.
    let (status, _) = shoal.admin_request_with("PUT", "/v1/config/fetch_coalescing", cookie, "off");
    assert!(status.contains("401"), "{status}");
    shoal.stop();
}

/// A stand-in for the admin address between the browser and the broker: passes requests through,
/// and holds the `hold_from`-th console poll (and later ones) until `release` is set, then passes
/// it on (to a broker that may be gone: the browser then sees the connection close unanswered).
/// While a request is held the browser's virtual time stands still.
struct Proxy {
    addr: String,
    polls: Arc<std::sync::atomic::AtomicUsize>,
    release: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: String, hold_from: usize) -> Proxy {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let release = Arc::new(AtomicBool::new(false));
        let (p, r) = (polls.clone(), release.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let (upstream, polls, release) = (upstream.clone(), p.clone(), r.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if conn.read(&mut byte).unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    if String::from_utf8_lossy(&head).contains(" /v1/console") {
                        let n = polls.fetch_add(1, Ordering::SeqCst) + 1;
                        let deadline = Instant::now() + Duration::from_secs(60);
                        while n >= hold_from && !release.load(Ordering::SeqCst) {
                            assert!(Instant::now() < deadline, "the proxy was never released");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    let Ok(mut broker) = std::net::TcpStream::connect(&upstream) else {
                        return; // the broker is gone: closed unanswered
                    };
                    let mut answer = Vec::new();
                    if broker.write_all(&head).is_ok() && broker.read_to_end(&mut answer).is_ok() {
                        let _ = conn.write_all(&answer);
                    }
                });
            }
        });
        Proxy {
            addr,
            polls,
            release,
        }
    }
}

/// The page shows an error state when the broker stops: it polled the live broker, then the broker
/// stopped and the next polls failed.
#[test]
fn the_console_shows_when_the_broker_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    common::create_topics(&shoal.bootstrap(), &[("t", 1)]);
    let proxy = Proxy::start(shoal.admin.clone(), 3);
    let url = format!("http://{}/console", proxy.addr);
    const TEST: &str = "the_console_shows_when_the_broker_is_gone";
    if let Err(why) = chromium() {
        shards::testing::skipped(TEST, "the console in a headless browser", &why);
        return;
    }
    let browser = std::thread::spawn(move || dump_dom(TEST, &url, Duration::from_secs(10)));
    // Two polls answered by the live broker; the third held while the broker stops.
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.polls.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < deadline,
            "the page never polled three times"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    shoal.stop();
    proxy.release.store(true, Ordering::SeqCst);
    let dom = browser.join().unwrap().expect("chromium is there");
    let polls: u32 = attribute(&dom, "id=\"status\"", "data-polls")
        .parse()
        .unwrap();
    assert_eq!(polls, 2, "two polls answered before the broker stopped");
    assert_eq!(attribute(&dom, "id=\"status\"", "class"), "stale");
    assert!(dom.contains("cannot reach the broker"), "no error shown");
    // What the page showed last is still there.
    attribute(&dom, "data-topic=\"t\"", "data-hw");
}

/// With 10,000 partitions (100 topics of 100 on 2 cores of a real broker; an idle partition holds
/// no open file) the page shows its first figures within a second of being opened: one page of 50
/// topics, aggregated, with the total, the topic being read among them with its figures summed
/// over its partitions.
#[test]
fn the_console_loads_within_a_second_with_ten_thousand_partitions() {
    const TEST: &str = "the_console_loads_within_a_second_with_ten_thousand_partitions";
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    let names: Vec<String> = (0..100).map(|i| format!("wide-{i:03}")).collect();
    let topics: Vec<(&str, i32)> = names.iter().map(|n| (n.as_str(), 100)).collect();
    common::create_topics_in_batches(&b, &topics, 10);
    // 10 records in each of the first 10 partitions of one topic, its partition 0 read by 3.
    produce(&b, "wide-042", &[10; 10]);
    let stop = Arc::new(AtomicBool::new(false));
    let readers = tail_readers(&b, "wide-042", 3, &stop);
    let deadline = Instant::now() + Duration::from_secs(60);
    let c = loop {
        let c = console(&shoal, "");
        if topic_row(&c, "wide-042")["consumers"] == 3 {
            break c;
        }
        assert!(Instant::now() < deadline, "readers not counted: {c}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(c["topics"]["total"], 100, "{}", c["topics"]["total"]);
    let opened: u64 = c["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["partitions"].as_u64().unwrap())
        .sum();
    assert_eq!(opened, 10_000, "every partition opened");
    let url = format!("http://{}/console", shoal.admin);
    let dom = dump_dom(TEST, &url, Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    readers.into_iter().for_each(|r| r.join().unwrap());
    let Some(dom) = dom else {
        return;
    };
    let shown: u64 = attribute(&dom, "id=\"status\"", "data-first-shown-ms")
        .parse()
        .unwrap();
    eprintln!("10,000 partitions: the page showed its first figures after {shown} ms");
    assert!(shown < 1000, "first figures after {shown} ms");
    assert_eq!(dom.matches("data-topic=\"wide-").count(), 50);
    assert!(dom.contains("1–50 of 100"), "no pager");
    assert_eq!(
        attribute(&dom, "data-topic=\"wide-042\"", "data-consumers"),
        "3"
    );
    assert_eq!(attribute(&dom, "data-topic=\"wide-042\"", "data-hw"), "100");
    shoal.stop();
}

/// `shoal edge`'s console: each upstream stream with its position and the upstream's range, and per
/// core the bytes fetched from upstream beside those served.
#[test]
fn an_edges_console_shows_its_upstream_streams() {
    const TEST: &str = "an_edges_console_shows_its_upstream_streams";
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let upstream = common::edge::start_upstream(dirs[0].path(), "127.0.0.1:0");
    common::create_topics(&upstream.bootstrap(), &[("feed", 1)]);
    produce(&upstream.bootstrap(), "feed", &[25]);
    let edge = common::edge::start_edge(dirs[1].path(), &upstream.bootstrap());
    common::edge::wait_for_topic(&edge, "feed", 1);
    let consumer = common::cli::group_consumer(&edge.bootstrap(), "edge-readers", "feed");
    common::cli::consume(&consumer, 25, Duration::from_secs(30));
    let url = format!("http://{}/console", edge.admin);
    let Some(dom) = dump_dom(TEST, &url, Duration::from_secs(3)) else {
        return;
    };
    let stream = "data-stream=\"feed/0\"";
    let row = &dom[dom.find(stream).expect("the stream is listed")..];
    let row = &row[..row.find("</tr>").unwrap()];
    // Position 25, the upstream's range 0..25, nothing behind.
    assert!(
        row.contains("<td>25</td>") && row.contains("<td>0</td>"),
        "{row}"
    );
    let fetched: u64 = attribute(&dom, "data-edge-core=\"0\"", "data-upstream-bytes")
        .parse()
        .unwrap();
    assert!(fetched > 0, "no bytes from upstream shown");
    assert_eq!(attribute(&dom, "data-edge-core=\"0\"", "data-streams"), "1");
    drop(consumer);
    edge.stop();
    upstream.stop();
}

/// A producer sending to `topic` all along until `stop`, so that every sample of the broker's
/// history sees bytes come in.
fn steady_producer(
    bootstrap: &str,
    topic: &str,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let (b, topic, stop) = (bootstrap.to_string(), topic.to_string(), stop.clone());
    std::thread::spawn(move || {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let p: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let payload = "x".repeat(200);
        while !stop.load(Ordering::Relaxed) {
            if p.send(BaseRecord::<(), str>::to(&topic).payload(&payload))
                .is_err()
            {
                p.poll(Duration::from_millis(10));
            }
            p.poll(Duration::from_millis(1));
        }
        p.flush(Duration::from_secs(10))
            .expect("the records are acknowledged");
    })
}

/// The broker's history until it holds at least `n` samples, the last with bytes in on some core
/// (bounded: 90 s).
fn history_with(shoal: &Shoal, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let c = console(shoal, "?history_since=0");
        let samples = c["history"]["samples"].as_array().unwrap();
        let bytes_in: f64 = samples.last().map_or(0.0, |s| {
            s["cores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|core| core[1].as_f64().unwrap_or(0.0))
                .sum()
        });
        if samples.len() >= n && bytes_in > 0.0 {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "no {n} samples with bytes in: {}",
            c["history"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The charts in a browser while a producer runs: the broker's samples appear in each chart, and
/// a page dumped again some samples later has more points, a later last sample and bytes coming
/// in; the summary shows the version, uptime and the data directory's free space.
#[test]
fn the_consoles_charts_grow_while_a_producer_runs() {
    const TEST: &str = "the_consoles_charts_grow_while_a_producer_runs";
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, &[]);
    let b = shoal.bootstrap();
    common::create_topics(&b, &[("load", 4)]);
    let stop = Arc::new(AtomicBool::new(false));
    let producing = steady_producer(&b, "load", &stop);
    let consuming = reading(&b, "load", 4, &stop);
    let c = history_with(&shoal, 3);
    assert_eq!(c["history"]["interval_ms"], 5000);
    let url = format!("http://{}/console", shoal.admin);
    let first = dump_dom(TEST, &url, Duration::from_secs(3));
    let samples = c["history"]["samples"].as_array().unwrap().len();
    history_with(&shoal, samples + 2);
    let second = dump_dom(TEST, &url, Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    producing.join().unwrap();
    consuming.join().unwrap();
    let (Some(first), Some(second)) = (first, second) else {
        return;
    };
    let chart = |dom: &str, id: &str, what: &str| -> f64 {
        attribute(dom, &format!("data-chart=\"{id}\""), what)
            .parse()
            .unwrap_or_else(|e| panic!("{id} {what}: {e}"))
    };
    for id in [
        "bytes_in",
        "bytes_out",
        "fetch_responses",
        "consumers",
        "produce_p99",
    ] {
        let (before, after) = (
            chart(&first, id, "data-points"),
            chart(&second, id, "data-points"),
        );
        assert!(before >= 2.0, "{id}: {before} points at first");
        assert!(after >= before + 2.0, "{id}: {before} then {after} points");
        assert!(
            chart(&second, id, "data-last-time") > chart(&first, id, "data-last-time"),
            "{id}: the last sample did not move"
        );
    }
    for dom in [&first, &second] {
        assert!(
            chart(dom, "bytes_in", "data-last") > 0.0,
            "no bytes in shown"
        );
        assert!(
            chart(dom, "produce_p99", "data-last") > 0.0,
            "no produce p99"
        );
        // The reader's connections and its fetches.
        for id in ["consumers", "fetch_responses", "bytes_out"] {
            assert!(chart(dom, id, "data-last") > 0.0, "{id}: nothing shown");
        }
        let svg = &dom[dom.find("data-chart=\"bytes_in\"").unwrap()..];
        let svg = &svg[..svg.find("</svg>").unwrap()];
        assert!(svg.contains("<polyline"), "no line drawn: {svg}");
        // The scale's labels carry their unit.
        assert!(svg.contains(" B/s</text>"), "no unit on the scale: {svg}");
    }
    let summary = "id=\"summary\"";
    assert_eq!(
        attribute(&second, summary, "data-version"),
        env!("CARGO_PKG_VERSION")
    );
    let uptime: u64 = attribute(&second, summary, "data-uptime").parse().unwrap();
    assert!(uptime >= 15, "uptime {uptime} s");
    let free: u64 = attribute(&second, summary, "data-disk-free")
        .parse()
        .unwrap();
    assert!(free > 0);
    assert_eq!(attribute(&second, summary, "data-errors"), "0");
    shoal.stop();
}

/// One librdkafka consumer of every partition of `topic` from the start, polling until `stop`.
fn reading(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let (b, topic, stop) = (bootstrap.to_string(), topic.to_string(), stop.clone());
    std::thread::spawn(move || {
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("group.id", "console-reader-unused")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "100")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let _ = c.poll(Duration::from_millis(50));
        }
    })
}

/// One consumer reading all twelve partitions of a topic is one consumer of the topic (one
/// connection), while each partition counts it once; the JSON carries the version, uptime, the
/// data directory's space and the error counters.
#[test]
fn one_consumer_of_many_partitions_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let b = shoal.bootstrap();
    common::create_topics(&b, &[("many", 12)]);
    produce(&b, "many", &[3; 12]);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = reading(&b, "many", 12, &stop);
    let deadline = Instant::now() + Duration::from_secs(60);
    let c = loop {
        let c = console(&shoal, "?topic=many&limit=100");
        let parts = c["partitions"]["items"].as_array().unwrap();
        if parts.iter().all(|p| p["consumers"] == 1) {
            break c;
        }
        assert!(Instant::now() < deadline, "not every partition read: {c}");
        std::thread::sleep(Duration::from_millis(300));
    };
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(topic_row(&c, "many")["consumers"], 1, "{c}");
    assert_eq!(c["cores"][0]["fetch_connections"], 1, "{c}");
    assert_eq!(c["version"], env!("CARGO_PKG_VERSION"));
    assert!(c["uptime_seconds"].is_u64(), "{c}");
    assert!(c["started_ms"].as_u64().unwrap() <= c["time_ms"].as_u64().unwrap());
    assert!(
        c["disk"]["free_bytes"].as_u64().unwrap() > 0,
        "{}",
        c["disk"]
    );
    assert!(
        c["disk"]["total_bytes"].as_u64().unwrap() >= c["disk"]["free_bytes"].as_u64().unwrap()
    );
    for counter in [
        "storage_errors",
        "failing_logs",
        "handler_panics",
        "authentication_failures",
        "tls_handshake_failures",
        "protocol_errors",
    ] {
        assert_eq!(c["errors"][counter], 0, "{counter}: {}", c["errors"]);
        assert_eq!(c["cores"][0][counter], 0, "{counter}");
    }
    assert_eq!(c["history"], Value::Null, "the history only when asked");
    shoal.stop();
}
