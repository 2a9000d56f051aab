//! End-to-end throughput of the real `shoal` binary with librdkafka, against a baseline measured in
//! the same run so the figures can be read without knowing the machine:
//!
//! 1. produce 1 KiB messages to a 4-partition topic on a 2-core server, with acks=1 and acks=all;
//! 2. fetch one of those topics back from the beginning with an `assign`ed consumer;
//! 3. baseline: the same byte count blasted over a loopback TCP socket between two threads.
//!
//! Each figure is printed with its ratio to the baseline. The baseline is the ceiling of what a
//! single client connection could move on this machine without Kafka framing, logging or disk, so
//! the ratios say how much of the loopback bandwidth the broker path keeps. Client, server and
//! baseline all share the machine's CPUs, as they would in a one-box deployment.
//!
//! `cargo bench --bench broker` runs the full sizes (about 10 s here, ~1 GiB of disk);
//! `cargo bench --bench broker -- --quick` shrinks them for a smoke run. The server's own warnings
//! go to stderr; `RUST_LOG` overrides their level.
//!
//! Data lives under `target/` rather than the system temp dir, which may be tmpfs: acks=all must
//! pay for a real fsync.

#[path = "../tests/it/common/mod.rs"]
mod common;

use common::Shoal;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

const CORES: usize = 2;
const PARTITIONS: i32 = 4;
const MESSAGE_BYTES: usize = KIB;
/// Both the producer's batch limit and the baseline's write size: the largest unit either side
/// hands to the kernel at once.
const CHUNK_BYTES: usize = MIB;
/// Generous bound on any one phase, so a stalled server fails the run instead of hanging it.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);

fn main() {
    // `cargo bench` also passes `--bench`; only `--quick` matters here.
    let quick = std::env::args().any(|a| a == "--quick");
    let total = if quick { 32 * MIB } else { 512 * MIB };
    let messages = total / MESSAGE_BYTES;
    std::fs::create_dir_all("target").expect("create target/");
    let scratch = tempfile::Builder::new()
        .prefix("bench-broker-")
        .tempdir_in("target")
        .expect("scratch dir in target/");
    println!(
        "broker benchmarks ({}): {} of {} messages per run, {PARTITIONS} partitions on a \
         {CORES}-core shoal, data in {}",
        if quick { "quick" } else { "full" },
        size_label(total),
        size_label(MESSAGE_BYTES),
        scratch.path().display()
    );

    // The baseline goes first, before the server's page cache and threads compete with it.
    let raw = raw_tcp_mbs(total);
    println!(
        "[raw tcp] {} in {} writes over loopback, median of 3: {raw:.1} MB/s",
        size_label(total),
        size_label(CHUNK_BYTES)
    );

    let shoal = Shoal::start(scratch.path(), CORES, &[]);
    let bootstrap = shoal.bootstrap();
    // A topic per acks setting, so each produce run starts from empty partitions.
    let topics = [("1", "bench-acks-1"), ("all", "bench-acks-all")];
    common::create_topics(&bootstrap, &topics.map(|(_, t)| (t, PARTITIONS)));

    for (acks, topic) in topics {
        let took = produce(&bootstrap, topic, acks, messages);
        report(&format!("produce acks={acks}"), messages, took, raw);
    }

    // The topic written last: its newest data may still be in the tail cache, as for a consumer
    // catching up on recent data. The cache counters below say how much of it was.
    let before = Counters::read(&shoal);
    let (took, fetched) = fetch(&bootstrap, topics[1].1, messages);
    let after = Counters::read(&shoal);
    assert_eq!(
        fetched, messages,
        "the consumer must read back exactly what was produced"
    );
    report("fetch", messages, took, raw);
    println!(
        "[fetch] tail cache during the fetch: {} hits, {} misses",
        after.cache_hits - before.cache_hits,
        after.cache_misses - before.cache_misses
    );

    // Sanity check: the server's byte counters include Kafka framing and metadata traffic, so
    // they should be a little above the payload moved, never below it.
    let produced = (topics.len() * total) as u64;
    println!(
        "[metrics] bytes_in {} (payload produced {produced}: {}), bytes_out {} (payload fetched \
         {total}: {}), protocol errors {}",
        after.bytes_in,
        at_least(after.bytes_in, produced),
        after.bytes_out,
        at_least(after.bytes_out, total as u64),
        after.protocol_errors
    );
    shoal.stop();
}

/// Prints one throughput line with its ratio to the raw TCP baseline.
fn report(name: &str, messages: usize, took: Duration, raw_mbs: f64) {
    let mbs = mb_per_s(messages * MESSAGE_BYTES, took);
    println!(
        "[{name}] {messages} messages in {:.2} s: {mbs:.1} MB/s, {:.0} msgs/s \
         -> {:.3}x raw tcp",
        took.as_secs_f64(),
        messages as f64 / took.as_secs_f64(),
        mbs / raw_mbs
    );
}

// -------------------------------------------------------------------------------------------------
// Kafka clients

/// Fetches `topic`'s metadata so the client knows every partition's leader before the clock
/// starts. Without it a consumer's first offset lookup finds no leader and retries on a timer,
/// which alone added ~0.5 s to every fetch run.
fn learn_leaders<C: ClientContext>(client: &Client<C>, topic: &str) {
    client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
}

/// Counts delivery reports: librdkafka reports a failed message only here, so without it a run
/// that lost messages would still look fast.
#[derive(Debug, Default)]
struct Deliveries {
    ok: AtomicUsize,
    first_error: Mutex<Option<KafkaError>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.first_error.lock().unwrap().get_or_insert(e.clone());
            }
        }
    }
}

/// Produces `messages` messages round robin over the partitions and returns the time until the
/// last is acknowledged.
fn produce(bootstrap: &str, topic: &str, acks: &str, messages: usize) -> Duration {
    let producer: ThreadedProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", acks)
        .set("linger.ms", "5")
        .set("batch.size", CHUNK_BYTES.to_string())
        .create_with_context(Deliveries::default())
        .expect("producer");
    learn_leaders(producer.client(), topic);
    // The content does not matter (no compression); only its size does.
    let payload = vec![0x5a_u8; MESSAGE_BYTES];
    let start = Instant::now();
    for i in 0..messages {
        // Explicit partitions keep all four partitions' batches filling at once; the default
        // sticky partitioner would feed one partition at a time.
        let record = BaseRecord::<(), [u8]>::to(topic)
            .partition(i as i32 % PARTITIONS)
            .payload(&payload[..]);
        // Waits while librdkafka's local queue is full.
        common::send_retrying(&producer, record);
    }
    // Not `flush`: rdkafka's waits in `poll(100 ms)` calls that always run their full timeout,
    // adding up to 100 ms to every run. The producer's own thread serves delivery reports, so
    // watching the queue drain is exact to a millisecond.
    while producer.in_flight_count() > 0 {
        assert!(
            start.elapsed() < PHASE_TIMEOUT,
            "{} messages to {topic} still unacknowledged",
            producer.in_flight_count()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = start.elapsed();
    let deliveries = producer.context();
    if let Some(e) = deliveries.first_error.lock().unwrap().take() {
        panic!("produce to {topic} failed: {e}");
    }
    assert_eq!(deliveries.ok.load(Ordering::Relaxed), messages);
    took
}

/// Reads `topic` from the beginning of every partition until `expected` messages have arrived;
/// returns the time taken and how many arrived, including any beyond `expected`.
fn fetch(bootstrap: &str, topic: &str, expected: usize) -> (Duration, usize) {
    // librdkafka insists on a group id even for `assign`; it is never used, as shoal serves no
    // consumer groups.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-broker")
        .set("enable.auto.commit", "false")
        // Reading from the tail cache outruns this one-thread poll loop, so librdkafka's local
        // queue fills (100k messages) and it then pauses the partition's fetches for
        // `fetch.queue.backoff.ms`, 1 s by default: runs showed 1 s stalls that cut the figure
        // several-fold (0.2 GB/s instead of ~2). A short backoff keeps fetches flowing.
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition added");
    }
    learn_leaders(consumer.client(), topic);
    let start = Instant::now();
    consumer.assign(&tpl).expect("assign");
    let mut seen = 0;
    while seen < expected {
        assert!(
            start.elapsed() < PHASE_TIMEOUT,
            "fetched only {seen} of {expected} messages in time"
        );
        if let Some(msg) = consumer.poll(Duration::from_millis(100)) {
            let msg = msg.expect("fetch succeeds");
            assert_eq!(msg.payload_len(), MESSAGE_BYTES, "offset {}", msg.offset());
            seen += 1;
        }
    }
    let took = start.elapsed();
    // Outside the timing: anything past what was produced would be a server bug.
    while consumer.poll(Duration::from_millis(500)).is_some() {
        seen += 1;
    }
    (took, seen)
}

// -------------------------------------------------------------------------------------------------
// Baseline

/// Median of three loopback blasts of `total` bytes: one thread writes `CHUNK_BYTES` chunks, this
/// one reads and counts. Three runs because loopback speed wobbles with scheduling on few cores.
fn raw_tcp_mbs(total: usize) -> f64 {
    let mut runs: Vec<f64> = (0..3)
        .map(|_| mb_per_s(total, raw_tcp_blast(total)))
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}

fn raw_tcp_blast(total: usize) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect loopback");
        let chunk = vec![0x5a_u8; CHUNK_BYTES];
        let mut left = total;
        while left > 0 {
            let n = left.min(CHUNK_BYTES);
            s.write_all(&chunk[..n]).expect("write loopback");
            left -= n;
        }
        // Dropping the stream closes it: the reader's end of file.
    });
    let (mut s, _) = listener.accept().expect("accept loopback");
    let mut buf = vec![0_u8; CHUNK_BYTES];
    let mut read = 0;
    loop {
        match s.read(&mut buf).expect("read loopback") {
            0 => break,
            n => read += n,
        }
    }
    let took = start.elapsed();
    writer.join().unwrap();
    assert_eq!(read, total);
    took
}

// -------------------------------------------------------------------------------------------------
// Helpers

/// Server-side counters, summed over cores, from `/metrics`.
#[derive(Debug, Clone, Copy)]
struct Counters {
    bytes_in: u64,
    bytes_out: u64,
    cache_hits: u64,
    cache_misses: u64,
    protocol_errors: u64,
}

impl Counters {
    fn read(shoal: &Shoal) -> Self {
        let total = |name: &str| shoal.metric(name);
        Self {
            bytes_in: total("shoal_bytes_in_total"),
            bytes_out: total("shoal_bytes_out_total"),
            cache_hits: total("shoal_tail_cache_hits_total"),
            cache_misses: total("shoal_tail_cache_misses_total"),
            protocol_errors: total("shoal_protocol_errors_total"),
        }
    }
}

fn at_least(value: u64, floor: u64) -> &'static str {
    if value >= floor {
        "ok"
    } else {
        "BELOW PAYLOAD"
    }
}

fn mb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64()
}

fn size_label(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}
