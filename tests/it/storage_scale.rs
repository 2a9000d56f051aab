//! Many partitions on one broker: 20,000 written and read back by a librdkafka consumer within an
//! open files budget of 1,000 (the descriptors under the data directory counted from
//! `/proc/<pid>/fd` all along), and 10,000 under acks=all load through `kill -9`, with the hot
//! partition fetched while the others are still being opened after the restart.

use crate::common;

use common::{free_port_run, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Descriptors process `pid` holds on files or directories under `dir`.
fn fds_under(pid: u32, dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Samples [`fds_under`] every 20 ms until stopped; the largest count seen.
struct FdWatch {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdWatch {
    fn start(pid: u32, dir: &Path) -> Self {
        let (stop, most) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let thread = std::thread::spawn({
            let (stop, most, dir) = (stop.clone(), most.clone(), dir.to_path_buf());
            move || {
                while !stop.load(Ordering::SeqCst) {
                    most.fetch_max(fds_under(pid, &dir), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        Self {
            stop,
            most,
            thread: Some(thread),
        }
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

impl Drop for FdWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads every partition of `topics` (`partitions` each) from its start until at least `want`
/// records arrived and then none for `quiet`; (topic, partition, offset) -> value.
fn read_all(
    bootstrap: &str,
    topics: &[&str],
    partitions: i32,
    want: usize,
    quiet: Duration,
) -> BTreeMap<(String, i32, i64), String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "scale-reader")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
    }
    c.assign(&tpl).unwrap();
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = Instant::now();
    while got.len() < want || last.elapsed() < quiet {
        assert!(
            Instant::now() < deadline,
            "read {} of {want} records within 300 s",
            got.len()
        );
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            let v = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            let key = (m.topic().to_string(), m.partition(), m.offset());
            assert!(got.insert(key, v).is_none(), "{m:?} read twice");
            last = Instant::now();
        }
    }
    got
}

const BUDGET_PER_CORE: u64 = 500;

#[test]
fn twenty_thousand_partitions_within_an_open_files_budget_of_one_thousand() {
    const PARTITIONS: i32 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let data = std::fs::canonicalize(dir.path()).unwrap();
    let budget = BUDGET_PER_CORE.to_string();
    let shoal = Shoal::start(&data, 2, &["--max-open-files-per-core", &budget]);
    let watch = FdWatch::start(shoal.pid(), &data);
    // Two topics of 10,000 partitions (the most one topic may have).
    let topics = ["wide-0", "wide-1"];
    let half = PARTITIONS / 2;
    common::create_topics(&shoal.bootstrap(), &[(topics[0], half), (topics[1], half)]);
    let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", shoal.bootstrap())
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    for topic in topics {
        for p in 0..half {
            let v = format!("{topic}/{p}");
            let mut record = BaseRecord::<(), str>::to(topic).partition(p).payload(&v);
            while let Err((_, r)) = producer.send(record) {
                record = r;
                producer.poll(Duration::from_millis(10));
            }
        }
    }
    producer.flush(Duration::from_secs(300)).unwrap();
    let quiet = Duration::from_secs(1);
    let got = read_all(
        &shoal.bootstrap(),
        &topics,
        half,
        PARTITIONS as usize,
        quiet,
    );
    for topic in topics {
        for p in 0..half {
            let want = format!("{topic}/{p}");
            assert_eq!(got.get(&(topic.to_string(), p, 0)), Some(&want));
        }
    }
    assert_eq!(
        got.len(),
        PARTITIONS as usize,
        "nothing but the records written"
    );
    // The budget covers the logs' files; what the blocking threads list while partitions open
    // (a directory each, four threads per core) comes on top.
    let most = watch.most();
    assert!(
        most as u64 <= 2 * BUDGET_PER_CORE + 8,
        "{most} descriptors under the data directory, over the budget of {}",
        2 * BUDGET_PER_CORE
    );
    assert!(shoal.metric("shoal_open_file_evictions_total") > 0);
    assert_eq!(shoal.metric("shoal_open_file_refusals_total"), 0);
    println!("20,000 partitions: at most {most} descriptors under the data directory");
    drop(watch);
    shoal.stop();
}

/// Records the (partition, value) of each produce acknowledged.
#[derive(Clone, Default)]
struct Acked(Arc<Mutex<BTreeSet<(i32, String)>>>);

impl ClientContext for Acked {}

impl ProducerContext for Acked {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Ok(m) = result {
            let v = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            self.0.lock().unwrap().insert((m.partition(), v));
        }
    }
}

#[test]
fn kill_9_under_load_with_ten_thousand_partitions_keeps_every_acknowledged_record() {
    const PARTITIONS: i32 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port_run(2));
    let shoal = Shoal::start_on(dir.path(), 2, &listen, &[]);
    common::create_topics(&listen, &[("many", PARTITIONS)]);
    let acked = Acked::default();
    let producer: ThreadedProducer<Acked> = ClientConfig::new()
        .set("bootstrap.servers", &listen)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "120000")
        .set("queue.buffering.max.messages", "1000000")
        .create_with_context(acked.clone())
        .expect("producer");
    // Every partition gets records; partition 0, the hot one, one in every ten. The first
    // round is flushed (every partition holds records); the rest is in flight at the kill.
    let mut sent = 0u64;
    let send = |n: u64| {
        let p = if n % 10 == 0 {
            0
        } else {
            (n % PARTITIONS as u64) as i32
        };
        let v = format!("r{n}");
        common::send_retrying(
            &producer,
            BaseRecord::<(), str>::to("many").partition(p).payload(&v),
        );
    };
    while sent < 2 * PARTITIONS as u64 {
        send(sent);
        sent += 1;
    }
    producer.flush(Duration::from_secs(120)).unwrap();
    let flushed = acked.0.lock().unwrap().len();
    assert!(
        flushed >= 2 * PARTITIONS as usize - 1,
        "{flushed} acknowledged"
    );
    while acked.0.lock().unwrap().len() < flushed + PARTITIONS as usize {
        for _ in 0..500 {
            send(sent);
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    shoal.kill_hard();
    let kept: BTreeSet<(i32, String)> = acked.0.lock().unwrap().clone();
    drop(producer);

    let started = Instant::now();
    let shoal = Shoal::start_on(dir.path(), 2, &listen, &[]);
    let listening = started.elapsed();
    // The hot partition's first fetch, from a client connecting as the listener comes up.
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &listen)
        .set("group.id", "hot-reader")
        .set("enable.auto.commit", "false")
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "50")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("many", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "no record from the hot partition: {:?} {:?}",
            c.fetch_watermarks("many", 0, Duration::from_secs(10)),
            c.position()
        );
        match c.poll(Duration::from_millis(10)) {
            Some(Ok(_)) => break,
            Some(Err(e)) => eprintln!("hot partition: {e} after {:?}", started.elapsed()),
            None => {}
        }
    }
    let first_fetch = started.elapsed() - listening;
    println!(
        "restart after kill -9 with {PARTITIONS} partitions: listening after {listening:?}, the \
         hot partition's first record {first_fetch:?} later"
    );
    drop(c);
    // Every acknowledged record is there (and records written but not acknowledged may be).
    let quiet = Duration::from_secs(3);
    let got = read_all(&listen, &["many"], PARTITIONS, kept.len(), quiet);
    let read: BTreeSet<(i32, String)> = got.into_iter().map(|((_, p, _), v)| (p, v)).collect();
    let lost: Vec<_> = kept.difference(&read).take(5).collect();
    assert!(lost.is_empty(), "acknowledged records lost: {lost:?}");
    shoal.stop();
}
