//! Compacted topics through librdkafka against the real binary: a topic created with
//! `cleanup.policy=compact` takes a million updates of ten thousand keys (lz4-compressed batches)
//! and some deletes, and a new consumer reading it from the start gets exactly the latest value of
//! every live key, the deleted keys gone after `delete.retention.ms`; records without a key are
//! refused with INVALID_RECORD; and a broker killed with SIGKILL again and again inside a compaction
//! pass (its files on disk) has the pass finished or undone at restart and loses nothing.

use crate::common;

use common::{send_retrying, Shoal};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, DeliveryResult, Producer, ProducerContext, ThreadedProducer,
};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn create_compacted(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let mut t =
        NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in futures_lite::future::block_on(admin.create_topics([&t], &opts)).expect("answered") {
        r.expect("topic created");
    }
}

fn producer(bootstrap: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "262144")
        .set("compression.type", "lz4")
        .set("acks", "all")
        .set("queue.buffering.max.messages", "200000")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer")
}

/// Every record of partition 0 of `topic`, from the start to the high watermark, folded into the
/// latest value per key (`None`: a tombstone), with how many records were read.
fn read_latest(bootstrap: &str, topic: &str) -> (BTreeMap<String, Option<String>>, usize) {
    read_records(bootstrap, topic, None)
}

/// [`read_latest`], stopping at the high watermark or, for a view (whose last offsets may hold
/// records of other shards only), once `until_count` records came and a poll brings no more.
fn read_records(
    bootstrap: &str,
    topic: &str,
    until_count: Option<usize>,
) -> (BTreeMap<String, Option<String>>, usize) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "compaction-reader")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "4194304")
        .create()
        .expect("consumer");
    let (_, high) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("watermarks");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut latest = BTreeMap::new();
    let mut read = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next = 0;
    while next < high {
        assert!(
            Instant::now() < deadline,
            "read up to {next} of {high} in 120 s"
        );
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            if until_count.is_some_and(|n| read >= n) {
                break;
            }
            continue;
        };
        let m = m.expect("fetch succeeds");
        assert!(m.offset() >= next, "offsets only grow");
        next = m.offset() + 1;
        read += 1;
        let key = String::from_utf8(m.key().expect("every record has a key").to_vec()).unwrap();
        let value = m.payload().map(|v| String::from_utf8(v.to_vec()).unwrap());
        latest.insert(key, value);
    }
    (latest, read)
}

#[test]
fn a_new_consumer_reads_the_latest_value_of_every_key() {
    const KEYS: usize = 10_000;
    const UPDATES: usize = 1_000_000;
    const DELETED: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = format!("127.0.0.1:{}", shoal.ports[0]);
    create_compacted(
        &bootstrap,
        "state",
        &[
            ("segment.bytes", "1048576"),
            ("segment.ms", "2000"),
            ("min.cleanable.dirty.ratio", "0.1"),
            ("delete.retention.ms", "1000"),
        ],
    );
    let p = producer(&bootstrap);
    let mut expected = BTreeMap::new();
    for i in 0..UPDATES {
        let key = format!("key-{}", (i * 7919) % KEYS);
        let value = format!("{i}");
        send_retrying(&p, BaseRecord::to("state").key(&key).payload(&value));
        expected.insert(key, Some(value));
    }
    for k in 0..DELETED {
        let key = format!("key-{k}");
        send_retrying(&p, BaseRecord::<String, (), ()>::to("state").key(&key));
        expected.remove(&key);
    }
    p.flush(Duration::from_secs(60)).expect("all acknowledged");
    // segment.ms later, one more record rolls the segment: everything above is compactable.
    std::thread::sleep(Duration::from_millis(2200));
    send_retrying(&p, BaseRecord::to("state").key("end").payload("marker"));
    p.flush(Duration::from_secs(10)).unwrap();
    expected.insert("end".into(), Some("marker".into()));

    // A read that overlaps a compaction pass may see an older value whose later ones and
    // tombstone that pass removed (a consumer reading from the start must finish within
    // delete.retention.ms to see every delete, as in Kafka): once compaction settles, a read
    // gets exactly the latest value of every live key.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (latest, read) = read_latest(&bootstrap, "state");
        let live: BTreeMap<String, Option<String>> =
            latest.into_iter().filter(|(_, v)| v.is_some()).collect();
        if live == expected && read == expected.len() {
            break;
        }
        let wrong = expected
            .iter()
            .filter(|(k, v)| live.get(*k) != Some(*v))
            .count();
        assert!(
            Instant::now() < deadline,
            "after 90 s: {read} records for {} keys, {wrong} keys without their latest value",
            expected.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // A sharded view of the compacted topic: each shard holds exactly the latest value of its
    // keys (read through the view reader, after compaction).
    for shard in 0..2u32 {
        let view = format!("state.shard-{shard}-of-2");
        let want_count = expected
            .keys()
            .filter(|k| shards::partitioner::shard_of(Some(k.as_bytes()), 2) == Some(shard))
            .count();
        let (latest, read) = read_records(&bootstrap, &view, Some(want_count));
        let want: BTreeMap<String, Option<String>> = expected
            .iter()
            .filter(|(k, _)| shards::partitioner::shard_of(Some(k.as_bytes()), 2) == Some(shard))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert!(
            read == want.len() && latest == want,
            "view {view}: {read} records, {} keys expected",
            want.len()
        );
    }
}

/// Delivery errors of a producer.
#[derive(Default, Clone)]
struct Errors(Arc<Mutex<Vec<RDKafkaErrorCode>>>);

impl ClientContext for Errors {}

impl ProducerContext for Errors {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = r {
            let code = e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown);
            self.0.lock().unwrap().push(code);
        }
    }
}

#[test]
fn records_without_a_key_are_refused_with_invalid_record() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let bootstrap = format!("127.0.0.1:{}", shoal.ports[0]);
    create_compacted(&bootstrap, "keyed", &[]);
    let errors = Errors::default();
    let p: ThreadedProducer<Errors> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("retries", "0")
        .set("message.timeout.ms", "10000")
        .create_with_context(errors.clone())
        .expect("producer");
    send_retrying(&p, BaseRecord::<(), str, ()>::to("keyed").payload("no key"));
    p.flush(Duration::from_secs(10)).unwrap();
    send_retrying(&p, BaseRecord::to("keyed").key("k").payload("keyed"));
    p.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(*errors.0.lock().unwrap(), [RDKafkaErrorCode::InvalidRecord]);
    let (latest, read) = read_latest(&bootstrap, "keyed");
    assert_eq!(
        (read, latest.get("k").cloned()),
        (1, Some(Some("keyed".into())))
    );
}

/// The files of a compaction pass in progress in `dir`: `<base>.log.cleaned` (and its index) while
/// it rewrites, `<base>.<end>.swap` once it committed, until the swap is renamed.
fn pass_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap"))
        .collect()
}

/// Whether a compaction pass has files in `dir` within `wait`, looking every millisecond.
fn pass_seen_within(dir: &Path, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while pass_files(dir).is_empty() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[test]
fn a_broker_killed_while_compacting_loses_nothing() {
    const KEYS: usize = 2_000;
    const ROUNDS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let partition = dir.path().join("topics").join("state").join("0");
    // Lines of recovery finishing or undoing an interrupted pass, over all starts.
    let recovered = Arc::new(AtomicUsize::new(0));
    let start = |recovered: &Arc<AtomicUsize>| {
        let recovered = recovered.clone();
        Shoal::start_watching_log(dir.path(), 1, &[], move |line| {
            if line.contains("recovery: finished the compaction")
                || line.contains("left by an interrupted compaction")
            {
                recovered.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut shoal = start(&recovered);
    let mut bootstrap = format!("127.0.0.1:{}", shoal.ports[0]);
    // A segment becomes compactable a second after its newest record: the segments a round
    // writes last are compacted by a pass that starts after the round's last acknowledgement.
    create_compacted(
        &bootstrap,
        "state",
        &[
            ("segment.bytes", "262144"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("min.compaction.lag.ms", "1000"),
        ],
    );
    let mut expected = BTreeMap::new();
    let mut i = 0usize;
    let mut interrupted = Vec::new();
    for round in 0..ROUNDS {
        // Every update of the round acknowledged (acks=all), then the broker is killed as soon as
        // a compaction pass has files on disk.
        let p = producer(&bootstrap);
        {
            let mut write = |n: usize| {
                for _ in 0..n {
                    let key = format!("key-{}", (i * 7919) % KEYS);
                    let value = format!("{i}-{}", "v".repeat(i % 50));
                    send_retrying(&p, BaseRecord::to("state").key(&key).payload(&value));
                    expected.insert(key, Some(value));
                    i += 1;
                }
                p.flush(Duration::from_secs(60)).expect("all acknowledged");
            };
            write(60_000);
            // A pass starts once the segments closed last are a second old, unless a pass during
            // the round already took them (a slow round rolls its last segment early): then more
            // updates roll another segment, until a pass is seen.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !pass_seen_within(&partition, Duration::from_secs(4)) {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: no compaction pass started within 60 s of the last \
                     acknowledgement"
                );
                write(10_000);
            }
        }
        shoal.kill_hard();
        drop(p);
        // What the killed broker left shows whether the kill landed inside the pass (it may have
        // finished between the look and the kill).
        let left = pass_files(&partition);
        let before = recovered.load(Ordering::Relaxed);
        shoal = start(&recovered);
        bootstrap = format!("127.0.0.1:{}", shoal.ports[0]);
        if !left.is_empty() {
            interrupted.push(round);
            let deadline = Instant::now() + Duration::from_secs(10);
            while recovered.load(Ordering::Relaxed) == before {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the kill left {left:?}, and recovery logged neither \
                     finishing nor undoing the pass within 10 s"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    // The pass may finish between the look and the kill: one round of six may miss.
    eprintln!("the kill interrupted a compaction pass in rounds {interrupted:?} of {ROUNDS}");
    assert!(
        interrupted.len() >= ROUNDS - 1,
        "the kill landed inside a pass in rounds {interrupted:?} only, of {ROUNDS}"
    );
    let (latest, _) = read_latest(&bootstrap, "state");
    let lost: Vec<&String> = expected
        .iter()
        .filter(|(k, v)| latest.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .take(5)
        .collect();
    assert!(
        lost.is_empty() && latest.len() == expected.len(),
        "{} keys read for {}; first wrong or missing: {lost:?}",
        latest.len(),
        expected.len()
    );
}
