//! A broker's restart with many partitions, after a clean stop and after `kill -9`:
//!
//! 1. a 2-core `shoal serve` with one topic of N partitions, one 1 KiB record in each (acks=all),
//!    and a consumer that has read partition 0 (the hot one) to its end;
//! 2. figures of the idle broker: its open files (the `shoal_open_files` gauges and
//!    `/proc/<pid>/fd`) and resident memory, against the same broker with no partitions;
//! 3. a clean stop and a start, then `kill -9` and a start; each time, from the start of the
//!    process: when its listeners are bound, when the first fetch of partition 0 is answered (a
//!    consumer connecting as the listener comes up), and when every partition is served
//!    (`shoal_partitions`).
//!
//! `cargo bench --bench restart`; `PARTITIONS=1000,10000,100000` (the default: 1000,10000).
//! Data lives under `target/`.

#[path = "../tests/it/common/mod.rs"]
mod common;

use common::Shoal;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::path::Path;
use std::time::{Duration, Instant};

/// Topics of at most this many partitions (the most one topic may have): `restart-0`, ...
const PER_TOPIC: i32 = 10_000;

/// The topics holding `partitions` partitions: (name, partitions).
fn topics(partitions: i32) -> Vec<(String, i32)> {
    (0..(partitions + PER_TOPIC - 1) / PER_TOPIC)
        .map(|t| {
            (
                format!("restart-{t}"),
                (partitions - t * PER_TOPIC).min(PER_TOPIC),
            )
        })
        .collect()
}

/// (descriptors, resident KiB) of process `pid`.
fn process_figures(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (fds, rss)
}

/// CPU seconds process `pid` has used (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// The share of one CPU process `pid` uses over `d`, idle as it is.
fn idle_cpu(pid: u32, d: Duration) -> f64 {
    let before = cpu_seconds(pid);
    std::thread::sleep(d);
    (cpu_seconds(pid) - before) / d.as_secs_f64()
}

/// Reads partition 0 from its start until a record arrives; how long that took.
fn first_fetch(bootstrap: &str) -> Duration {
    let t = Instant::now();
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "restart-bench")
        .set("enable.auto.commit", "false")
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "50")
        .set("topic.metadata.refresh.interval.ms", "100")
        .set("fetch.error.backoff.ms", "10")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("restart-0", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(Instant::now() < deadline, "no record from partition 0");
        if let Some(Ok(_)) = c.poll(Duration::from_millis(10)) {
            return t.elapsed();
        }
    }
}

/// Starts the broker and measures its start: (broker, listening, first fetch, all served).
fn timed_start(dir: &Path, listen: &str, partitions: u64) -> (Shoal, [Duration; 3]) {
    let t = Instant::now();
    let shoal = Shoal::start_on(dir, 2, listen, &[]);
    let listening = t.elapsed();
    let bootstrap = shoal.bootstrap();
    let fetch = std::thread::spawn(move || first_fetch(&bootstrap));
    let deadline = Instant::now() + Duration::from_secs(600);
    while shoal.metric_or_zero("shoal_partitions", "") < partitions {
        assert!(Instant::now() < deadline, "partitions never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let served = t.elapsed();
    let fetched = listening + fetch.join().unwrap();
    (shoal, [listening, fetched, served])
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn run(root: &Path, partitions: i32) {
    let dir = tempfile::tempdir_in(root).unwrap();
    let listen = format!("127.0.0.1:{}", common::free_port_run(2));
    let shoal = Shoal::start_on(dir.path(), 2, &listen, &[]);
    std::thread::sleep(Duration::from_millis(500));
    let (_, empty_rss) = process_figures(shoal.pid());
    let t = Instant::now();
    let topics = topics(partitions);
    let named: Vec<(&str, i32)> = topics.iter().map(|(t, n)| (t.as_str(), *n)).collect();
    common::create_topics(&listen, &named);
    let created = t.elapsed();
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &listen)
        .set("linger.ms", "20")
        .set("acks", "all")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let value = vec![b'x'; 1024];
    for (topic, n) in &topics {
        for i in 0..*n {
            common::send_polling(&p, topic, i, &value);
        }
    }
    p.flush(Duration::from_secs(300)).unwrap();
    drop(p);
    let idle = idle_cpu(shoal.pid(), Duration::from_secs(5));
    let (fds, rss) = process_figures(shoal.pid());
    let open = shoal.metric_or_zero("shoal_open_files", "");
    let limit = shoal.metric_or_zero("shoal_open_files_limit", "");
    println!(
        "{partitions} partitions: created in {}; written, idle: {open} files held by the logs \
         (budget {limit} over both cores), {fds} descriptors in all, RSS {} MiB ({:.1} KiB per \
         partition over the empty broker's {} MiB), idle CPU {:.1}% of a core",
        ms(created),
        rss / 1024,
        (rss.saturating_sub(empty_rss)) as f64 / partitions as f64,
        empty_rss / 1024,
        idle * 100.0,
    );
    shoal.stop();
    let (shoal, [listening, fetched, served]) = timed_start(dir.path(), &listen, partitions as u64);
    println!(
        "{partitions} partitions, clean restart: listening after {}, first fetch of partition 0 \
         answered after {}, every partition served after {}",
        ms(listening),
        ms(fetched),
        ms(served)
    );
    shoal.kill_hard();
    let (shoal, [listening, fetched, served]) = timed_start(dir.path(), &listen, partitions as u64);
    println!(
        "{partitions} partitions, restart after kill -9: listening after {}, first fetch of \
         partition 0 answered after {}, every partition served after {}",
        ms(listening),
        ms(fetched),
        ms(served)
    );
    std::thread::sleep(Duration::from_secs(2));
    let idle = idle_cpu(shoal.pid(), Duration::from_secs(5));
    let (fds, rss) = process_figures(shoal.pid());
    println!(
        "{partitions} partitions after the restart: {} files held by the logs, {fds} descriptors \
         in all, RSS {} MiB, idle CPU {:.1}% of a core",
        shoal.metric_or_zero("shoal_open_files", ""),
        rss / 1024,
        idle * 100.0
    );
    shoal.stop();
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-restart");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let counts = std::env::var("PARTITIONS").unwrap_or_else(|_| "1000,10000".into());
    for n in counts
        .split(',')
        .filter_map(|n| n.trim().parse::<i32>().ok())
    {
        run(&root, n);
    }
    let _ = std::fs::remove_dir_all(&root);
}
