//! The live console (`GET /console`, polling `GET /v1/console`) in a real browser: Debian's
//! chromium, headless, against `shoal serve` with a hot partition read by consumers on both cores
//! (read replicas), a wider topic and records produced by librdkafka. The page, once its scripts
//! ran, shows the broker's numbers: every core, each topic's partitions, high watermarks,
//! consumers and replicated partitions, one topic's partitions with leader and replica cores, a
//! lagging group's lag with its sparkline. And
//! the console under an admin token: the login page without it, the token from a cookie for reads
//! only.

mod common;

use common::browser::{attribute, dump_dom};
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
        &["--read-replicas", "all", "--group-lag-interval-ms", "200"],
    );
    let b = shoal.bootstrap();
    common::create_topics(&b, &[("hot", 1), ("wide", 3)]);
    produce(&b, "hot", &[40]);
    produce(&b, "wide", &[5, 6, 7]);
    // A stopped group committed at the start of "wide": it lags by all 18 records.
    let seek = common::cli::shoal(
        &[
            "group",
            "seek",
            "lagger",
            "--topic",
            "wide",
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

    let url = format!("http://{}/console?topic=hot", shoal.admin);
    let dom = dump_dom(&url, Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    readers.into_iter().for_each(|r| r.join().unwrap());

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
    let wide = "data-topic=\"wide\"";
    assert_eq!(attribute(&dom, wide, "data-partitions"), "3");
    assert_eq!(attribute(&dom, wide, "data-hw"), "18");
    assert_eq!(attribute(&dom, wide, "data-replicated"), "3");
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
