//! Two durability promises of `shoal serve`, checked against real files and librdkafka producers
//! under load:
//!
//! - a record acknowledged to an `acks=all` producer survives a power cut: the data directory is
//!   ext4 on a disk that drops every write not yet flushed (`common::volatile_disk`), the power is
//!   cut while producers are still producing, and after a "reboot" (journal replay, broker
//!   restart) every acknowledged record is read back at its acknowledged partition and offset.
//!   `acks=1` records produced in the same run are counted, not checked: `acks=1` promises nothing
//!   across a power cut;
//! - a record acknowledged to an `acks=1` producer survives `kill -9` of the broker (the machine
//!   stays up, so what the broker wrote is in the kernel's hands), three kills in a row.
//!
//! The broker runs with its default flags (Direct I/O on).

use crate::common;

use common::volatile_disk::{is_root, signal, VolatileDisk};
use common::{create_topics, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig, ThreadedProducer,
};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;
/// Every value is padded to this many bytes, so that a few seconds of load are a few hundred
/// thousand records (which the test reads back in seconds), not millions.
const VALUE_BYTES: usize = 512;

/// The value of record `id`: the id, `|`, padding to [`VALUE_BYTES`].
fn value_of(id: &str) -> String {
    format!(
        "{id}|{}",
        ".".repeat(VALUE_BYTES.saturating_sub(id.len() + 1))
    )
}

/// The id a value carries ([`value_of`]'s inverse); a value not of that shape is its own id.
fn id_of(value: &[u8]) -> String {
    let value = String::from_utf8_lossy(value);
    value.split('|').next().unwrap_or_default().to_string()
}

/// The acknowledged records of one topic.
#[derive(Clone, Default)]
struct Acked(Arc<Mutex<AckedState>>);

#[derive(Default)]
struct AckedState {
    /// (partition, offset) → the id of the value acknowledged there (the first one, if two were).
    at: BTreeMap<(i32, i64), String>,
    /// Records acknowledged at a (partition, offset) that an earlier acknowledgement already
    /// named: (where, the id acknowledged first, this one's id). The broker gave one offset twice.
    twice: Vec<((i32, i64), String, String)>,
}

impl Acked {
    fn len(&self) -> usize {
        self.0.lock().unwrap().at.len()
    }

    /// The acknowledged records so far; asserts no offset was acknowledged for two records.
    fn snapshot(&self) -> BTreeMap<(i32, i64), String> {
        let state = self.0.lock().unwrap();
        assert!(
            state.twice.is_empty(),
            "{} offsets acknowledged for two different records, e.g. {:?}",
            state.twice.len(),
            state.twice.iter().take(5).collect::<Vec<_>>()
        );
        state.at.clone()
    }
}

/// A producer's context: every acknowledged record into [`Acked`].
#[derive(Clone)]
struct Recorder(Acked);

impl ClientContext for Recorder {}

impl ProducerContext for Recorder {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Ok(m) = result {
            let id = id_of(m.payload().unwrap_or_default());
            let at = (m.partition(), m.offset());
            let mut state = self.0 .0.lock().unwrap();
            match state.at.get(&at) {
                Some(first) if *first != id => {
                    let first = first.clone();
                    state.twice.push((at, first, id));
                }
                Some(_) => {}
                None => {
                    state.at.insert(at, id);
                }
            }
        }
    }
}

/// One producer of a [`Load`]: its name (a prefix of its values), topic, settings and record.
struct Spec<'a> {
    name: &'a str,
    topic: &'a str,
    config: &'a [(&'a str, &'a str)],
    acked: Acked,
}

/// Producers sending as fast as they can, each from a thread of its own, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    producers: Vec<Arc<ThreadedProducer<Recorder>>>,
}

impl Load {
    fn start(bootstrap: &str, specs: Vec<Spec<'_>>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut load = Load {
            stop: stop.clone(),
            threads: Vec::new(),
            producers: Vec::new(),
        };
        for spec in specs {
            let mut config = ClientConfig::new();
            config
                .set("bootstrap.servers", bootstrap)
                .set("message.timeout.ms", "30000");
            for (k, v) in spec.config {
                config.set(*k, *v);
            }
            let producer: ThreadedProducer<Recorder> = config
                .create_with_context(Recorder(spec.acked))
                .expect("producer");
            let producer = Arc::new(producer);
            load.producers.push(producer.clone());
            let (stop, name, topic) = (stop.clone(), spec.name.to_string(), spec.topic.to_string());
            load.threads.push(std::thread::spawn(move || {
                send_until(&producer, &stop, &name, &topic)
            }));
        }
        load
    }

    /// Stops sending and drops what was not acknowledged yet (the broker is gone by now).
    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        for p in self.producers {
            p.purge(PurgeConfig::default().queue().inflight());
        }
    }
}

/// Sends records `name-0`, `name-1`, … ([`value_of`]) to the partitions of `topic` in turn until `stop`, waiting while
/// the producer's queue is full. Stops early on any other error (an idempotent producer's fatal
/// error once its broker is gone): what it sent until then is what it checks.
fn send_until(producer: &ThreadedProducer<Recorder>, stop: &AtomicBool, name: &str, topic: &str) {
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("{name}-{i}");
        let value = value_of(&id);
        let partition = (i % PARTITIONS as u64) as i32;
        let record = BaseRecord::to(topic)
            .partition(partition)
            .key(&id)
            .payload(&value);
        match producer.send(record) {
            Ok(()) => i += 1,
            Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => {
                eprintln!("{name}: stops sending: {e}");
                return;
            }
        }
    }
}

/// Waits (at most 30 s) until `acked` holds at least `n` records.
fn wait_for_acks(acked: &Acked, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.len() < n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} records acknowledged within 30 s",
            acked.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lets the load run for `run`, then waits (at most 10 s) for a moment when every topic has had
/// records acknowledged in the last 250 ms, and returns then: the cut or kill that follows lands
/// while the producers are producing and the broker is acknowledging. (On two CPUs shared by the
/// broker, the producers and the FUSE daemon, the broker can pause for a second or so.)
fn run_load(acked: &[&Acked], run: Duration) {
    std::thread::sleep(run);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before: Vec<usize> = acked.iter().map(|a| a.len()).collect();
        std::thread::sleep(Duration::from_millis(250));
        if acked.iter().zip(&before).all(|(a, b)| a.len() > *b) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the load was not acknowledged on every topic within 10 s"
        );
    }
}

/// What a read of a topic found of the acknowledged records.
#[derive(Debug, Default)]
struct Found {
    /// Acknowledged records at their acknowledged partition and offset.
    intact: usize,
    /// Acknowledged (partition, offset)s beyond the partition's end after the restart.
    missing: Vec<(i32, i64)>,
    /// Acknowledged (partition, offset)s holding another record: (where, acknowledged, found).
    wrong: Vec<((i32, i64), String, String)>,
}

/// Reads every partition of `topic` from the beginning to its high watermark (at most 30 s) and
/// compares what is there with `acked`.
fn read_back(bootstrap: &str, topic: &str, acked: &BTreeMap<(i32, i64), String>) -> Found {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "power-cut-check")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        let high = loop {
            match consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                Ok((_, high)) => break high,
                Err(e) => {
                    assert!(Instant::now() < deadline, "{topic}/{p}: no watermarks: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        ends.insert(p, high);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut found = Found::default();
    let mut next: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    while next.iter().any(|(p, o)| *o < ends[p]) {
        assert!(
            Instant::now() < deadline,
            "{topic}: not read to its end within 30 s: at {next:?} of {ends:?}"
        );
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("fetch");
        next.insert(m.partition(), m.offset() + 1);
        if let Some(value) = acked.get(&(m.partition(), m.offset())) {
            let there = id_of(m.payload().unwrap_or_default());
            if *value == there {
                found.intact += 1;
            } else {
                found
                    .wrong
                    .push(((m.partition(), m.offset()), value.clone(), there));
            }
        }
    }
    found.missing = acked
        .keys()
        .filter(|(p, o)| *o >= ends[p])
        .copied()
        .collect();
    found
}

/// Asserts that every acknowledged record of `topic` was read back where it was acknowledged.
fn assert_all_there(what: &str, topic: &str, acked: &BTreeMap<(i32, i64), String>, f: &Found) {
    assert!(
        f.missing.is_empty() && f.wrong.is_empty() && f.intact == acked.len(),
        "{what}: of {} records acknowledged on {topic}, {} read back intact; {} missing (e.g. \
         {:?}), {} overwritten (e.g. {:?})",
        acked.len(),
        f.intact,
        f.missing.len(),
        f.missing.iter().take(5).collect::<Vec<_>>(),
        f.wrong.len(),
        f.wrong.iter().take(5).collect::<Vec<_>>()
    );
}

/// Writes `data` to `path`, and with `sync` makes it durable (the file, then its directory).
fn write_file(path: &Path, data: &[u8], sync: bool) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    if sync {
        f.sync_all().unwrap();
        std::fs::File::open(path.parent().unwrap())
            .unwrap()
            .sync_all()
            .unwrap();
    }
}

/// 64 KiB that no file system invents: a file read back with these contents was written.
fn marker(seed: u8) -> Vec<u8> {
    (0..64 << 10)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect()
}

const DURABLE: &str = "durable";
const RELAXED: &str = "relaxed";

#[test]
fn acks_all_survives_a_power_cut() {
    const TEST: &str = "acks_all_survives_a_power_cut";
    if !is_root() {
        shards::testing::skipped(TEST, "the whole test", "loop devices and mounts need root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("stable.img");
    let mnt = tmp.path().join("ext4");
    std::fs::create_dir(&mnt).unwrap();
    let setup = |disk: Result<VolatileDisk, String>| {
        disk.unwrap_or_else(|e| panic!("{TEST}: running as root, but the volatile disk: {e}"))
    };
    let mut disk = setup(VolatileDisk::format(&image, &mnt));
    // The broker's directory, made durable before it starts (ext4's lost+found stays out of it).
    let data = mnt.join("shoal");
    std::fs::create_dir(&data).unwrap();
    std::fs::File::open(&mnt).unwrap().sync_all().unwrap();

    let shoal = Shoal::start(&data, 1, &[]);
    let bootstrap = shoal.bootstrap();
    create_topics(&bootstrap, &[(DURABLE, PARTITIONS), (RELAXED, PARTITIONS)]);
    let (durable, relaxed) = (Acked::default(), Acked::default());
    // Small queues: a few MB in flight per producer keeps the two CPUs (the FUSE daemon takes most
    // of one) from saturating.
    let queue = ("queue.buffering.max.messages", "10000");
    let all = [("acks", "all"), ("linger.ms", "5"), queue];
    let idempotent = [
        ("acks", "all"),
        ("enable.idempotence", "true"),
        ("linger.ms", "5"),
        queue,
    ];
    let one = [("acks", "1"), ("linger.ms", "5"), queue];
    let spec = |name, topic, config, acked: &Acked| Spec {
        name,
        topic,
        config,
        acked: acked.clone(),
    };
    let load = Load::start(
        &bootstrap,
        vec![
            spec("all-a", DURABLE, &all[..], &durable),
            spec("idem-b", DURABLE, &idempotent[..], &durable),
            spec("idem-c", DURABLE, &idempotent[..], &durable),
            spec("one-d", RELAXED, &one[..], &relaxed),
        ],
    );
    wait_for_acks(&durable, 100, "acks=all before the cut");
    wait_for_acks(&relaxed, 100, "acks=1 before the cut");
    write_file(&mnt.join("synced"), &marker(1), true);
    run_load(&[&durable, &relaxed], Duration::from_secs(3));
    // Written just before the cut and never flushed: the cut must take it.
    write_file(&mnt.join("unsynced"), &marker(2), false);

    // The power cut: the broker stops at once (no acknowledgement leaves it after this), the
    // disk loses what was not flushed, and only then is the broker killed (its dying writes,
    // like the kernel's, go nowhere).
    signal(shoal.pid(), libc::SIGSTOP);
    let cut = disk.cut_power();
    shoal.kill_hard();
    cut.expect("the power cut");
    load.stop();
    drop(disk);
    let (durable, relaxed) = (durable.snapshot(), relaxed.snapshot());

    let disk = setup(VolatileDisk::attach(&image, &mnt));
    // The harness is real: what was flushed is there, what was not is not.
    assert_eq!(
        std::fs::read(mnt.join("synced")).ok(),
        Some(marker(1)),
        "the file written and fsynced before the cut"
    );
    let unsynced = std::fs::read(mnt.join("unsynced")).ok();
    assert!(
        unsynced != Some(marker(2)),
        "a file written without fsync just before the cut survived it whole: the disk kept \
         writes that were never flushed"
    );
    let shoal = Shoal::start(&data, 1, &[]);
    let bootstrap = shoal.bootstrap();
    let found = read_back(&bootstrap, DURABLE, &durable);
    assert_all_there("after the power cut (acks=all)", DURABLE, &durable, &found);
    let relaxed_found = read_back(&bootstrap, RELAXED, &relaxed);
    eprintln!(
        "{TEST}: acks=all: {} of {} acknowledged records read back; acks=1 (not promised): {} of \
         {} survived ({} missing, {} overwritten)",
        found.intact,
        durable.len(),
        relaxed_found.intact,
        relaxed.len(),
        relaxed_found.missing.len(),
        relaxed_found.wrong.len()
    );
    shoal.stop();
    drop(disk);
}

#[test]
fn acks_1_survives_kill_9_of_the_broker() {
    const TOPIC: &str = "fast";
    const KILLS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let mut shoal = Shoal::start(dir.path(), 1, &[]);
    create_topics(&shoal.bootstrap(), &[(TOPIC, PARTITIONS)]);
    let acked = Acked::default();
    let config = [
        ("acks", "1"),
        ("batch.size", "16384"),
        ("linger.ms", "5"),
        ("queue.buffering.max.messages", "200000"),
    ];
    for round in 0..KILLS {
        // Each round's producers name their values apart from the other rounds'.
        let names = [format!("r{round}-p1"), format!("r{round}-p2")];
        let specs = names
            .iter()
            .map(|name| Spec {
                name,
                topic: TOPIC,
                config: &config[..],
                acked: acked.clone(),
            })
            .collect();
        let before = acked.len();
        let load = Load::start(&shoal.bootstrap(), specs);
        wait_for_acks(&acked, before + 100, &format!("round {round}"));
        run_load(&[&acked], Duration::from_secs(3));
        shoal.kill_hard();
        load.stop();
        let expected = acked.snapshot();
        shoal = Shoal::start(dir.path(), 1, &[]);
        let found = read_back(&shoal.bootstrap(), TOPIC, &expected);
        eprintln!(
            "kill {round}: {} acknowledged acks=1 records read back of {}",
            found.intact,
            expected.len()
        );
        assert_all_there(&format!("after kill {round}"), TOPIC, &expected, &found);
    }
    shoal.stop();
}
