//! Committed offsets: start-up time after many commits, against a baseline measured in the same
//! run.
//!
//! A group commits the offsets of a 100-partition topic over and over through librdkafka (async
//! commits, as a consumer with `enable.auto.commit` does), on a 1-core shoal whose coordinator
//! keeps them in its internal log. Then the server is restarted and the time until a new client
//! gets the committed offsets back is measured (process start, the store's load, one OffsetFetch):
//!
//! - baseline: after 20 commits (2,000 offset records, below the compaction threshold);
//! - measured: after 5,000 commits (500,000 offset records);
//! - for contrast: the same 5,000 commits with compaction off (a threshold it never reaches).
//!
//! Target: the second start-up takes at most 1.5x the first (the store is compacted, so start-up
//! reads the live offsets, not every commit ever made). Also printed: commits per second.
//!
//! `cargo bench --bench groups` (about 30 s); `-- --quick` for a smoke run (200 commits).

#[path = "../tests/it/common/mod.rs"]
mod common;

use common::Shoal;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::path::Path;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 100;
const TOPIC: &str = "bench-groups";
const GROUP: &str = "bench-group";
/// Start-ups measured per case; the median is kept.
const STARTS: usize = 5;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (small, large) = if quick { (20, 200) } else { (20, 5_000) };
    std::fs::create_dir_all("target").expect("create target/");
    println!(
        "group offsets benchmark ({}): start-up after {small} vs {large} commits of \
         {PARTITIONS} offsets each, 1-core shoal",
        if quick { "quick" } else { "full" },
    );
    let (base, _) = case(small, &[]);
    let (after, rate) = case(large, &[]);
    let (uncompacted, _) = case(
        large,
        &["--group-offsets-compact-min-records", "1000000000000"],
    );
    println!(
        "[commits] {large} commits of {PARTITIONS} offsets: {rate:.0} commits/s \
         ({:.0} offsets/s)",
        rate * PARTITIONS as f64
    );
    println!(
        "[start-up] after {small} commits: {:.1} ms; after {large} commits: {:.1} ms; \
         ratio {:.2}x (target <= 1.5x)",
        base.as_secs_f64() * 1e3,
        after.as_secs_f64() * 1e3,
        after.as_secs_f64() / base.as_secs_f64()
    );
    println!(
        "[start-up] after {large} commits without compaction: {:.1} ms ({:.2}x the baseline)",
        uncompacted.as_secs_f64() * 1e3,
        uncompacted.as_secs_f64() / base.as_secs_f64()
    );
}

/// Commits `commits` times on a fresh server started with `extra` flags, restarts it STARTS times,
/// and returns the median start-up time and the commit rate.
fn case(commits: usize, extra: &[&str]) -> (Duration, f64) {
    let scratch = tempfile::Builder::new()
        .prefix("bench-groups-")
        .tempdir_in("target")
        .expect("scratch dir in target/");
    let mut flags = vec!["--group-initial-rebalance-delay-ms", "0"];
    flags.extend_from_slice(extra);
    let shoal = Shoal::start(scratch.path(), 1, &flags);
    common::create_topics(&shoal.bootstrap(), &[(TOPIC, PARTITIONS)]);
    let rate = commit(&shoal.bootstrap(), commits);
    let records = shoal.metric("shoal_group_offset_commits_total");
    shoal.stop();
    println!(
        "  {commits} commits ({records} offsets committed); log on disk: {}",
        size_label(dir_bytes(&scratch.path().join("__groups")))
    );
    let mut starts: Vec<Duration> = (0..STARTS)
        .map(|_| {
            // Until a client gets the committed offsets back: the listening sockets open before
            // the cores have loaded their stores.
            let t = Instant::now();
            let s = Shoal::start(scratch.path(), 1, &flags);
            check_resumes(&s.bootstrap(), commits);
            let took = t.elapsed();
            s.stop();
            took
        })
        .collect();
    starts.sort();
    (starts[STARTS / 2], rate)
}

fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// `commits` async commits of every partition's offset (commit i sets offset i + 1), then one sync
/// commit that waits for all of them; commits per second.
fn commit(bootstrap: &str, commits: usize) -> f64 {
    let c = consumer(bootstrap);
    let started = Instant::now();
    for i in 0..commits {
        let tpl = offsets(i as i64 + 1);
        // librdkafka queues async commits; keep polling so their callbacks are served.
        c.commit(&tpl, CommitMode::Async).expect("async commit");
        let _ = c.poll(Duration::ZERO);
    }
    c.commit(&offsets(commits as i64), CommitMode::Sync)
        .expect("final commit");
    commits as f64 / started.elapsed().as_secs_f64()
}

fn offsets(offset: i64) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Offset(offset))
            .expect("offset");
    }
    tpl
}

/// After a restart the group still has its last commit for every partition.
fn check_resumes(bootstrap: &str, commits: usize) {
    let c = consumer(bootstrap);
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(TOPIC, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(30))
        .expect("committed offsets");
    for e in got.elements() {
        assert_eq!(
            e.offset(),
            Offset::Offset(commits as i64),
            "partition {} after restart",
            e.partition()
        );
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
