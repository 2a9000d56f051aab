//! Sharded views end to end with librdkafka: a source topic written with keyed, null-key and
//! compressed batches; consumers of every shard of `<topic>.shard-<i>-of-<n>` (n = 4 and 7), with no
//! special settings, get exactly their records with the source's offsets, keys, values and headers,
//! move past long stretches where their shard has nothing, and the broker decodes each source batch
//! once per n.

use crate::common;

use common::{send_retrying, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use shards::partitioner::shard_of;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 2;

/// (partition, offset) -> (key, value, header value)
type Log = BTreeMap<(i32, i64), (Option<Vec<u8>>, Vec<u8>, Vec<u8>)>;

fn produce(bootstrap: &str, codec: &str, keys: impl Iterator<Item = Option<String>>, tag: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("linger.ms", "20")
        .create()
        .unwrap();
    for (i, key) in keys.enumerate() {
        let value = format!("{tag}-{i}");
        let headers = OwnedHeaders::new().insert(Header {
            key: "tag",
            value: Some(tag.as_bytes()),
        });
        let mut rec = BaseRecord::<String, String>::to("src")
            .partition(i as i32 % PARTITIONS)
            .payload(&value)
            .headers(headers);
        if let Some(k) = &key {
            rec = rec.key(k);
        }
        send_retrying(&producer, rec);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Everything in `topic` (all partitions) from the beginning, read with plain librdkafka settings.
fn consume_all(bootstrap: &str, topic: &str, expected: usize) -> Log {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("views-{topic}"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Log::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < expected {
        assert!(
            Instant::now() < deadline,
            "{topic}: got {} of {expected} records",
            out.len()
        );
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.unwrap_or_else(|e| panic!("{topic}: {e}"));
        let header = m
            .headers()
            .map(|h| h.get(0).value.unwrap().to_vec())
            .unwrap_or_default();
        let prev = out.insert(
            (m.partition(), m.offset()),
            (
                m.key().map(<[u8]>::to_vec),
                m.payload().unwrap().to_vec(),
                header,
            ),
        );
        assert!(
            prev.is_none(),
            "{topic}: offset {} delivered twice",
            m.offset()
        );
    }
    assert!(
        consumer.poll(Duration::from_millis(300)).is_none(),
        "{topic}: more than expected"
    );
    out
}

#[test]
fn librdkafka_reads_every_shard_of_4_and_7_shard_views() {
    let dir = tempfile::tempdir().unwrap();
    // One core's reader per view (with read replicas each core holding one runs its own, and the
    // decode count below would be per core).
    let shoal = Shoal::start(
        dir.path(),
        2,
        &["--default-partitions", "2", "--read-replicas", "off"],
    );
    let bootstrap = shoal.bootstrap();
    // Keyed and null-key records, in batches compressed three ways; then a long stretch with a single
    // key (every other shard sees only empty batches); then one record for every shard of 4 and 7.
    produce(
        &bootstrap,
        "lz4",
        (0..600).map(|i| (i % 5 != 0).then(|| format!("key-{i}"))),
        "lz4",
    );
    produce(
        &bootstrap,
        "gzip",
        (0..300).map(|i| Some(format!("g-{i}"))),
        "gzip",
    );
    produce(
        &bootstrap,
        "snappy",
        (0..300).map(|i| (i % 3 != 0).then(|| format!("s-{i}"))),
        "snappy",
    );
    produce(
        &bootstrap,
        "none",
        (0..400).map(|_| Some("same".to_string())),
        "same",
    );
    let tail_keys: Vec<String> = (0..28)
        .map(|k| {
            (0..10_000)
                .map(|i| format!("tail-{i}"))
                .find(|c| {
                    shard_of(Some(c.as_bytes()), 4) == Some(k % 4)
                        && shard_of(Some(c.as_bytes()), 7) == Some(k % 7)
                })
                .unwrap()
        })
        .collect();
    produce(
        &bootstrap,
        "none",
        tail_keys.iter().cloned().map(Some),
        "tail",
    );
    let total = 600 + 300 + 300 + 400 + tail_keys.len();
    let source = consume_all(&bootstrap, "src", total);

    for n in [4u32, 7] {
        let mut keyed = 0;
        let mut decodes_after_first_shard = 0;
        for shard in 0..n {
            let want: Log = source
                .iter()
                .filter(|(_, (k, _, _))| shard_of(k.as_deref(), n).is_none_or(|s| s == shard))
                .map(|(at, r)| (*at, r.clone()))
                .collect();
            let got = consume_all(&bootstrap, &format!("src.shard-{shard}-of-{n}"), want.len());
            assert!(
                got == want,
                "shard {shard} of {n}: records, offsets, keys, values and headers match the source"
            );
            keyed += got.values().filter(|r| r.0.is_some()).count();
            if shard == 0 {
                decodes_after_first_shard = shoal.metric("shoal_view_source_batches_decoded_total");
            }
        }
        assert_eq!(
            keyed,
            source.values().filter(|r| r.0.is_some()).count(),
            "n={n}: each keyed record in one shard"
        );
        // The first shard's consumer had the reader decode every source batch; the other shards were
        // served from the same decoded batches.
        assert_eq!(
            shoal.metric("shoal_view_source_batches_decoded_total"),
            decodes_after_first_shard,
            "n={n}: one decode per source batch"
        );
        assert_eq!(shoal.metric("shoal_view_catch_up_reads_total"), 0);
    }

    // Views are read-only: librdkafka's produce to one is refused by the broker.
    let refused_before = shoal.metric_with("shoal_kafka_request_errors_total", "api=\"Produce\"");
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("message.timeout.ms", "500")
        .create()
        .unwrap();
    producer
        .send(
            BaseRecord::<(), str>::to("src.shard-0-of-4")
                .partition(0)
                .payload("x"),
        )
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    let refused = shoal.metric_with("shoal_kafka_request_errors_total", "api=\"Produce\"");
    assert!(
        refused > refused_before,
        "the produce to a view was refused"
    );
    assert_eq!(
        shoal.metric("shoal_log_high_watermark"),
        source.len() as u64,
        "nothing was appended"
    );
    shoal.stop();
}
