//! `shoal produce` and `shoal consume` against the real binary: lines and `key<TAB>value` lines
//! with headers, in each compression, read back by librdkafka exactly (keys, values, headers, the
//! key's partition as Kafka's default partitioner picks it), to a chosen partition with acks 1
//! and 0; records produced by librdkafka printed by `shoal consume` exactly, from the beginning,
//! an offset, a timestamp (the first record at or after it) or a group's committed offset. (A
//! closed port: with the others in tests/it/tools.rs.)

use crate::common;

use common::cli::{librdkafka_read, shoal, shoal_input, topic};
use common::Shoal;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const PARTITIONS: u32 = 3;

/// What `shoal produce` is given: keyed lines, then lines without the delimiter (no key).
fn input() -> (String, Vec<(Option<String>, String)>) {
    let mut text = String::new();
    let mut records = Vec::new();
    for i in 0..30 {
        text += &format!("key-{i}\tvalue {i}\n");
        records.push((Some(format!("key-{i}")), format!("value {i}")));
    }
    for i in 0..6 {
        text += &format!("plain {i}\n");
        records.push((None, format!("plain {i}")));
    }
    (text, records)
}

#[test]
fn produced_lines_in_each_compression_are_what_librdkafka_reads() {
    let dir = tempfile::tempdir().unwrap();
    let server = Shoal::start(dir.path(), 2, &["--auto-create-topics", "false"]);
    let b = server.bootstrap();
    let (text, records) = input();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let name = format!("io-{codec}");
        let partitions = PARTITIONS.to_string();
        topic(&b, &["create", &name, "--partitions", &partitions]).json();
        let run = shoal_input(
            &[
                "produce",
                &name,
                "-b",
                &b,
                "--key-delimiter",
                "\\t",
                "-H",
                "source=cli",
                "-H",
                "empty=",
                "--compression",
                codec,
                "--batch-records",
                "7",
                "--format",
                "json",
            ],
            &[],
            text.as_bytes(),
        );
        let sent = run.json();
        assert_eq!(sent["records"], records.len(), "{codec}: {sent}");

        let read = librdkafka_read(&b, &name, records.len(), &json!({}));
        assert_eq!(read["ok"], true, "{codec}: {read}");
        let got = read["records"].as_array().unwrap();
        assert_eq!(got.len(), records.len(), "{codec}: {read}");
        // Per partition, in offset order: every record as produced, its headers included, keyed
        // ones in the partition Kafka's default partitioner picks.
        let mut by_partition: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
        for r in got {
            assert_eq!(
                r["headers"],
                json!([["source", "cli"], ["empty", ""]]),
                "{codec}: {r}"
            );
            if let Some(k) = r["key"].as_str() {
                let p = shards::partitioner::shard_of(Some(k.as_bytes()), PARTITIONS).unwrap();
                assert_eq!(r["partition"], p, "{codec}: {r}");
            }
            by_partition
                .entry(r["partition"].as_i64().unwrap())
                .or_default()
                .push(r);
        }
        let mut seen = Vec::new();
        for (p, rs) in &by_partition {
            let reported = sent["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["partition"] == *p)
                .unwrap_or_else(|| panic!("{codec}: partition {p} not reported: {sent}"));
            assert_eq!(reported["records"], rs.len(), "{codec}: {sent}");
            // Offsets from 0, and the records in the order they were given.
            let order: Vec<usize> = rs
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    assert_eq!(r["offset"], i, "{codec}: {r}");
                    let rec = (
                        r["key"].as_str().map(String::from),
                        r["value"].as_str().unwrap().to_string(),
                    );
                    records.iter().position(|x| *x == rec).unwrap()
                })
                .collect();
            assert!(order.windows(2).all(|w| w[0] < w[1]), "{codec}: {order:?}");
            seen.extend(order);
        }
        seen.sort();
        assert_eq!(seen, (0..records.len()).collect::<Vec<_>>(), "{codec}");
    }

    // --partition and --acks 1: both lines to partition 1, after what is there.
    let before = librdkafka_read(&b, "io-none", records.len(), &json!({}));
    let in_p1 = before["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["partition"] == 1)
        .count();
    let sent = shoal_input(
        &[
            "produce",
            "io-none",
            "-b",
            &b,
            "--partition",
            "1",
            "--acks",
            "1",
            "--format",
            "json",
        ],
        &[],
        b"x\ny\n",
    )
    .json();
    assert_eq!(
        sent["partitions"],
        json!([{"partition": 1, "records": 2, "first_offset": in_p1, "last_offset": in_p1 + 1}])
    );
    let after = librdkafka_read(&b, "io-none", records.len() + 2, &json!({}));
    let p1: Vec<&Value> = after["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["partition"] == 1)
        .collect();
    assert_eq!(p1.len(), in_p1 + 2, "{after}");
    assert_eq!(p1[in_p1]["value"], "x");
    assert_eq!(p1[in_p1 + 1]["value"], "y");
    assert_eq!(p1[in_p1]["key"], Value::Null);

    // --acks 0: no answer, so no offsets; the record lands all the same.
    let sent = shoal_input(
        &[
            "produce",
            "io-none",
            "-b",
            &b,
            "--partition",
            "2",
            "--acks",
            "0",
            "--format",
            "json",
        ],
        &[],
        b"fire-and-forget\n",
    )
    .json();
    assert_eq!(
        sent["partitions"],
        json!([{"partition": 2, "records": 1, "first_offset": null, "last_offset": null}])
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let tail = consume(
            &b,
            "io-none",
            &["-p", "2", "--offset", "beginning", "--exit"],
        );
        if tail.ends_with("fire-and-forget\n") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not there: {tail}");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.stop();
}

/// `shoal consume TOPIC ARGS... -b BOOTSTRAP`: its standard output, the command having succeeded.
fn consume(b: &str, name: &str, args: &[&str]) -> String {
    let mut all = vec!["consume", name, "-b", b];
    all.extend_from_slice(args);
    let run = shoal(&all, &[]);
    assert!(run.ok, "{args:?}: {}", run.stderr);
    run.stdout
}

fn lines(range: std::ops::Range<i64>, f: impl Fn(i64) -> String) -> String {
    range.map(|i| f(i) + "\n").collect()
}

#[test]
fn records_librdkafka_produced_are_printed_by_consume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let server = Shoal::start(dir.path(), 2, &["--auto-create-topics", "false"]);
    let b = server.bootstrap();
    topic(&b, &["create", "made", "--partitions", "2"]).json();
    // Ten records a second apart on partition 0, five on partition 1.
    let t0 = 1_700_000_000_000i64;
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &b)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for i in 0..10i64 {
        let (k, v, n) = (format!("k{i}"), format!("v{i}"), i.to_string());
        let headers = OwnedHeaders::new().insert(Header {
            key: "n",
            value: Some(&n),
        });
        common::send_retrying(
            &producer,
            BaseRecord::to("made")
                .partition(0)
                .key(&k)
                .payload(&v)
                .timestamp(t0 + i * 1000)
                .headers(headers),
        );
    }
    for i in 0..5 {
        let (k, v) = (format!("q{i}"), format!("w{i}"));
        common::send_retrying(
            &producer,
            BaseRecord::to("made").partition(1).key(&k).payload(&v),
        );
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    // The whole topic: fifteen lines, each partition's in order.
    let all = consume(
        &b,
        "made",
        &[
            "--offset",
            "beginning",
            "--count",
            "15",
            "--format",
            "%k=%s\\n",
        ],
    );
    let of = |prefix: char| -> String {
        all.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    assert_eq!(all.lines().count(), 15, "{all}");
    assert_eq!(of('k'), lines(0..10, |i| format!("k{i}=v{i}")));
    assert_eq!(of('q'), lines(0..5, |i| format!("q{i}=w{i}")));

    // JSON: every field, as librdkafka produced it.
    let json_lines = consume(
        &b,
        "made",
        &[
            "-p",
            "0",
            "--offset",
            "beginning",
            "--exit",
            "--format",
            "json",
        ],
    );
    let parsed: Vec<Value> = json_lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(parsed.len(), 10, "{json_lines}");
    for (i, r) in parsed.iter().enumerate() {
        let expected = json!({
            "topic": "made", "partition": 0, "offset": i, "timestamp": t0 + i as i64 * 1000,
            "key": format!("k{i}"), "value": format!("v{i}"),
            "headers": [{"key": "n", "value": i.to_string()}],
        });
        assert_eq!(*r, expected);
    }
    let template = consume(
        &b,
        "made",
        &[
            "-p",
            "1",
            "--offset",
            "beginning",
            "--count",
            "1",
            "--format",
            "%t|%p|%o|%k|%s|%K|%S|%h\\n",
        ],
    );
    assert_eq!(template, "made|1|0|q0|w0|2|2|\n");

    // From a timestamp: the first record at or after it; after every record, nothing.
    let offsets = |from: &str| {
        consume(
            &b,
            "made",
            &["-p", "0", "--offset", from, "--exit", "--format", "%o\\n"],
        )
    };
    assert_eq!(
        offsets(&format!("@{}", t0 + 3000)),
        lines(3..10, |i| i.to_string())
    );
    assert_eq!(
        offsets(&format!("@{}", t0 + 3500)),
        lines(4..10, |i| i.to_string())
    );
    assert_eq!(offsets(&format!("@{}", t0 + 60_000)), "");
    // From an offset, and from the end.
    assert_eq!(offsets("8"), "8\n9\n");
    assert_eq!(offsets("end"), "");

    // With a group: committed as it goes, and the next run starts there.
    let group = |args: &[&str]| {
        let mut all = vec!["-p", "0", "--group", "g1"];
        all.extend_from_slice(args);
        consume(&b, "made", &all)
    };
    assert_eq!(
        group(&["--offset", "beginning", "--count", "4"]),
        lines(0..4, |i| format!("v{i}"))
    );
    assert_eq!(group(&["--count", "3"]), lines(4..7, |i| format!("v{i}")));
    assert_eq!(group(&["--exit"]), lines(7..10, |i| format!("v{i}")));
    assert_eq!(group(&["--exit"]), "");

    // A partition the topic lacks.
    let run = shoal(&["consume", "made", "-b", &b, "-p", "7", "--exit"], &[]);
    assert!(
        !run.ok && run.stderr.contains("UnknownTopicOrPartition"),
        "{}",
        run.stderr
    );
    server.stop();
}
