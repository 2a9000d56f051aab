//! Benchmarks of the partition log (`shards::Log`), each checked against a baseline measured in
//! the same run so the verdict does not depend on the machine:
//!
//! 1. durable appends with group commit vs plain file writes on one thread while another calls
//!    `sync_data` as many times, each on the next equal share of the writes (the writes of one share
//!    ahead overlap each fsync, as the log's next group of appends overlaps its fsync);
//! 2. tail-cache reads of 1 MiB vs 1 KiB (a read shares memory: its cost must not grow with size);
//! 3. opening a cleanly closed log of 16 segments vs one of 1 segment (sealed segments are not
//!    scanned).
//!
//! `cargo bench --bench log` runs the full sizes (a few minutes at most, ~4.5 GiB of disk);
//! `cargo bench --bench log -- --quick` shrinks them for a smoke run. Results are printed, one
//! line per measurement ending in PASS or FAIL; the process does not fail on a missed target.
//!
//! Data lives under `target/` rather than the system temp dir, which may be tmpfs: fsync must
//! reach a disk.

use bytes::Bytes;
use glommio::LocalExecutorBuilder;
use shards::batch::BatchBuilder;
use shards::{AppendOptions, Log, LogConfig, LogStats, TailCache};
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Sizes of one run; `--quick` shrinks the ones that cost time or disk.
#[derive(Debug, Clone, Copy)]
struct Scale {
    append_total: usize,
    append_tasks: usize,
    append_rounds: usize,
    cached_total: usize,
    read_iters: usize,
    read_rounds: usize,
    segment_bytes: usize,
    many_segments: usize,
    open_repeats: usize,
}

impl Scale {
    fn new(quick: bool) -> Self {
        let full = Self {
            append_total: 256 * MIB,
            append_tasks: 16,
            append_rounds: 3,
            cached_total: 64 * MIB,
            read_iters: 200_000,
            read_rounds: 7,
            segment_bytes: 256 * MIB,
            many_segments: 16,
            open_repeats: 3,
        };
        if quick {
            Self {
                append_total: 16 * MIB,
                cached_total: 16 * MIB,
                read_iters: 20_000,
                segment_bytes: 16 * MIB,
                ..full
            }
        } else {
            full
        }
    }
}

fn main() {
    // `cargo bench` also passes `--bench`; only `--quick` matters here.
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = Scale::new(quick);
    std::fs::create_dir_all("target").expect("create target/");
    let scratch = tempfile::Builder::new()
        .prefix("bench-log-")
        .tempdir_in("target")
        .expect("scratch dir in target/");
    println!(
        "log benchmarks ({}), data in {}",
        if quick { "quick" } else { "full" },
        scratch.path().display()
    );

    durable_append(scratch.path(), &scale);
    tail_cache_reads(scratch.path(), &scale);
    startup_after_clean_close(scratch.path(), &scale);
    // `scratch` removes whatever is left when dropped.
}

// -------------------------------------------------------------------------------------------------
// 1. Durable append throughput with group commit

fn durable_append(scratch: &Path, scale: &Scale) {
    let batch = batch_of_len(16 * KIB);
    let batches = scale.append_total / batch.len();
    let tasks = scale.append_tasks;

    // fsync latency on a shared or virtual disk swings a lot from second to second, so the log and
    // the baseline alternate and the round with the median ratio is reported.
    let mut rounds: Vec<AppendRound> = (0..scale.append_rounds)
        .map(|round| {
            let dir = scratch.join(format!("durable-{round}"));
            let (log_time, stats) = durable_appends_to_log(&dir, &batch, batches, tasks);
            remove_dir(&dir);
            assert_eq!(
                stats.appended_batches, batches as u64,
                "every append must have landed"
            );
            let fsyncs = stats.fsyncs.max(1) as usize;
            // The baseline pays the same number of fsyncs for the same bytes, overlapped with the
            // writes as the log overlaps them with appends, so the ratio isolates the log's own
            // overhead (copies, cache inserts, task hops, io_uring) from the disk's fsync latency.
            let path = scratch.join(format!("durable-baseline-{round}.dat"));
            let (base_time, base_fsyncs) =
                overlapped_writes_and_syncs(&path, &batch, batches, fsyncs);
            let _ = std::fs::remove_file(&path);
            let bytes = batches * batch.len();
            AppendRound {
                log_mbs: mb_per_s(bytes, log_time),
                fsyncs,
                base_mbs: mb_per_s(bytes, base_time),
                base_fsyncs,
            }
        })
        .collect();
    rounds.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    let all: Vec<String> = rounds.iter().map(|r| format!("{:.2}", r.ratio())).collect();
    let r = rounds[rounds.len() / 2];
    let ratio = r.ratio();
    report(
        "1/3 durable append",
        &format!(
            "{tasks} tasks x {} batches, {}, median of {} rounds (ratios {}): \
             log {:.1} MB/s ({} fsyncs, {:.1} batches/fsync) vs \
             std::fs writes on one thread + sync_data on another {:.1} MB/s ({} fsyncs)",
            size_label(batch.len()),
            size_label(batches * batch.len()),
            rounds.len(),
            all.join(" "),
            r.log_mbs,
            r.fsyncs,
            batches as f64 / r.fsyncs as f64,
            r.base_mbs,
            r.base_fsyncs,
        ),
        ratio,
        ">= 0.80",
        ratio >= 0.8,
    );
}

#[derive(Debug, Clone, Copy)]
struct AppendRound {
    log_mbs: f64,
    fsyncs: usize,
    base_mbs: f64,
    base_fsyncs: usize,
}

impl AppendRound {
    fn ratio(&self) -> f64 {
        self.log_mbs / self.base_mbs
    }
}

/// `tasks` concurrent writers append `batches` copies of `batch` durably to a new log in `dir`.
/// Returns the time until the last is acknowledged and the log's counters.
fn durable_appends_to_log(
    dir: &Path,
    batch: &Bytes,
    batches: usize,
    tasks: usize,
) -> (Duration, LogStats) {
    let (dir, batch) = (dir.to_path_buf(), batch.clone());
    on_executor(move || async move {
        let log = Log::open(&dir, log_config(256 * MIB), small_cache())
            .await
            .unwrap();
        let start = Instant::now();
        let writers: Vec<_> = (0..tasks)
            .map(|t| {
                let (log, batch) = (log.clone(), batch.clone());
                // Spread the remainder so exactly `batches` are appended.
                let mine = batches / tasks + usize::from(t < batches % tasks);
                glommio::spawn_local(async move {
                    for _ in 0..mine {
                        log.append(batch.clone(), AppendOptions { durable: true })
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await;
        }
        let elapsed = start.elapsed();
        let stats = log.stats();
        log.close().await.unwrap();
        (elapsed, stats)
    })
}

/// Writes `batch` `n` times to a new file on this thread while a second thread calls `sync_data`
/// `syncs` times, each covering the next of `syncs` equal groups of writes: sync k starts once group
/// k is written (the last after the final write). As with group commit, where a task appends again
/// only once its last append is durable, the writes of the next group overlap sync k but those of
/// the group after wait for it. Returns the time until the last sync returned and the number of
/// syncs done.
fn overlapped_writes_and_syncs(
    path: &Path,
    batch: &[u8],
    n: usize,
    syncs: usize,
) -> (Duration, usize) {
    let mut f = std::fs::File::create(path).expect("create baseline file");
    let syncer_file = f.try_clone().expect("clone the baseline file");
    // Batch i (from 1) is in group ceil(i * syncs / n); group k ends at batch ceil(k * n / syncs).
    let group_of = |i: usize| (i * syncs).div_ceil(n);
    let (written, synced) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let writer = std::thread::current();
    let start = Instant::now();
    let done = std::thread::scope(|scope| {
        let syncer = scope.spawn(|| {
            for k in 1..=syncs {
                let due = (k * n).div_ceil(syncs);
                while written.load(Ordering::Acquire) < due {
                    std::thread::park();
                }
                syncer_file.sync_data().expect("baseline sync");
                synced.store(k, Ordering::Release);
                writer.unpark();
            }
            syncs
        });
        for i in 1..=n {
            while synced.load(Ordering::Acquire) + 2 < group_of(i) {
                std::thread::park();
            }
            f.write_all(batch).expect("baseline write");
            written.store(i, Ordering::Release);
            if i == n || group_of(i + 1) > group_of(i) {
                syncer.thread().unpark(); // group complete: its sync is due
            }
        }
        syncer.join().expect("the baseline syncer failed")
    });
    (start.elapsed(), done)
}

// -------------------------------------------------------------------------------------------------
// 2. Tail-cache read cost does not grow with the size read

fn tail_cache_reads(scratch: &Path, scale: &Scale) {
    const CHUNK: usize = MIB;
    const BIG_READ: usize = MIB;
    const SMALL_READ: usize = KIB;
    let big = batch_of_len(16 * KIB);
    let small = batch_of_len(SMALL_READ);
    let big_count = scale.cached_total / big.len();
    let small_count = MIB / small.len();
    let (iters, rounds) = (scale.read_iters, scale.read_rounds);
    let dir = scratch.join("cached");

    let result = on_executor({
        let (dir, big, small) = (dir.clone(), big.clone(), small.clone());
        move || async move {
            // Large enough that nothing appended here is evicted.
            let cache = Rc::new(TailCache::new(256 * MIB, CHUNK));
            let log = Log::open(&dir, log_config(256 * MIB), cache.clone())
                .await
                .unwrap();
            // One record per batch, so offset == batch index: the 16 KiB batches are offsets
            // 0..big_count, the 1 KiB ones follow.
            append_n(&log, &big, big_count).await;
            append_n(&log, &small, small_count).await;
            assert_eq!(
                cache.stats().evicted_chunks,
                0,
                "the tail cache must hold everything appended"
            );

            // A chunk holds exactly CHUNK / 16 KiB batches, so reads starting at a multiple of that
            // begin at a chunk boundary, as a consumer reading the tail in 1 MiB steps does.
            let per_chunk = (CHUNK / big.len()) as i64;
            let big_offsets: Vec<i64> = (0..big_count as i64 - per_chunk)
                .step_by(per_chunk as usize)
                .collect();
            let small_offsets: Vec<i64> =
                (big_count as i64..(big_count + small_count) as i64).collect();

            let (mut best_small, mut best_big) = (f64::MAX, f64::MAX);
            // The shapes of every round's reads, checked together below.
            let (mut small_shape, mut big_shape) = (ReadShape::new(), ReadShape::new());
            // Alternate the two cases so drift (frequency scaling, neighbours) hits both alike.
            for _ in 0..rounds {
                let (ns, shape) = time_reads(&log, &small_offsets, SMALL_READ, iters).await;
                best_small = best_small.min(ns);
                small_shape.merge(shape);
                let (ns, shape) = time_reads(&log, &big_offsets, BIG_READ, iters).await;
                best_big = best_big.min(ns);
                big_shape.merge(shape);
            }
            let zero_copy = shares_memory(&log, big_offsets[0], BIG_READ).await
                && shares_memory(&log, small_offsets[0], SMALL_READ).await;
            log.close().await.unwrap();
            (best_small, small_shape, best_big, big_shape, zero_copy)
        }
    });
    remove_dir(&dir);
    let (small_ns, small_shape, big_ns, big_shape, zero_copy) = result;

    assert!(
        small_shape.all_cached && big_shape.all_cached,
        "every read must be served from the tail cache"
    );
    assert_eq!(
        small_shape.min_len,
        small.len(),
        "a 1 KiB read must return one 1 KiB batch: {small_shape:?}"
    );
    assert!(
        big_shape.min_len >= BIG_READ - big.len(),
        "a 1 MiB read returned too little: {big_shape:?}"
    );

    let ratio = big_ns / small_ns;
    report(
        "2/3 tail-cache read",
        &format!(
            "best of {rounds} x {iters} reads: 1 MiB read {big_ns:.0} ns ({} in {}) vs \
             1 KiB read {small_ns:.0} ns ({} in {}); repeated reads share memory: {}",
            counted(big_shape.batches as usize, "batch", "batches"),
            counted(big_shape.parts, "part", "parts"),
            counted(small_shape.batches as usize, "batch", "batches"),
            counted(small_shape.parts, "part", "parts"),
            if zero_copy { "yes" } else { "NO" },
        ),
        ratio,
        "<= 2.00",
        ratio <= 2.0 && zero_copy,
    );
}

/// What the reads of one or more timing loops returned (checked after timing, so the loop stays
/// lean).
#[derive(Debug, Clone, Copy)]
struct ReadShape {
    all_cached: bool,
    min_len: usize,
    /// Where the shortest read started, so a failed check says where to look.
    min_len_offset: i64,
    /// Of the first read.
    batches: u32,
    parts: usize,
}

impl ReadShape {
    /// No reads yet.
    fn new() -> Self {
        Self {
            all_cached: true,
            min_len: usize::MAX,
            min_len_offset: -1,
            batches: 0,
            parts: 0,
        }
    }

    /// Adds the reads of `later`: all of them must have been cached, the shortest counts.
    fn merge(&mut self, later: ReadShape) {
        if self.min_len == usize::MAX {
            (self.batches, self.parts) = (later.batches, later.parts);
        }
        self.all_cached &= later.all_cached;
        if later.min_len < self.min_len {
            (self.min_len, self.min_len_offset) = (later.min_len, later.min_len_offset);
        }
    }
}

/// Reads `iters` times, cycling over `offsets`, and returns the mean ns per read.
async fn time_reads(
    log: &Log,
    offsets: &[i64],
    max_bytes: usize,
    iters: usize,
) -> (f64, ReadShape) {
    let mut shape = ReadShape::new();
    let start = Instant::now();
    for i in 0..iters {
        let offset = offsets[i % offsets.len()];
        let read = log.read(offset, max_bytes, false).await.unwrap();
        shape.all_cached &= read.from_cache;
        if read.records.len < shape.min_len {
            (shape.min_len, shape.min_len_offset) = (read.records.len, offset);
        }
        if i == 0 {
            (shape.batches, shape.parts) = (read.records.batches, read.records.parts.len());
        }
        // Dropping the records (their `Bytes` and part list) is part of the cost a fetch pays.
        drop(std::hint::black_box(read));
    }
    (start.elapsed().as_nanos() as f64 / iters as f64, shape)
}

/// Whether two reads of the same range return the same memory: the tail cache hands out views of
/// its chunks instead of copies.
async fn shares_memory(log: &Log, offset: i64, max_bytes: usize) -> bool {
    let first = log.read(offset, max_bytes, false).await.unwrap().records;
    let second = log.read(offset, max_bytes, false).await.unwrap().records;
    !first.parts.is_empty()
        && first.parts.len() == second.parts.len()
        && first
            .parts
            .iter()
            .zip(&second.parts)
            .all(|(a, b)| a.as_ptr() == b.as_ptr())
}

// -------------------------------------------------------------------------------------------------
// 3. Start-up after a clean shutdown does not scan old segments

fn startup_after_clean_close(scratch: &Path, scale: &Scale) {
    let batch = batch_of_len(64 * KIB);
    let segment_bytes = scale.segment_bytes;
    // Batches exactly divide a segment and a segment rolls only when the next batch would not fit,
    // so every segment of both logs, the last included, ends exactly full: the one segment open
    // scans (the last) is the same size in both.
    let per_segment = segment_bytes / batch.len();
    let many = scale.many_segments;
    let needed = (1 + many) as u64 * segment_bytes as u64 + (512 * MIB) as u64;
    match free_bytes(scratch) {
        Some(free) if free < needed => {
            println!(
                "[3/3 start-up] SKIPPED: needs {} of free disk, {} available",
                size_label(needed as usize),
                size_label(free as usize)
            );
            return;
        }
        None => println!("[3/3 start-up] could not check free disk space (df); going ahead"),
        Some(_) => {}
    }

    let (one, several) = (scratch.join("open-1"), scratch.join(format!("open-{many}")));
    let config = log_config(segment_bytes);
    let repeats = scale.open_repeats;
    let (one_opens, several_opens) = on_executor({
        let (one, several, config) = (one.clone(), several.clone(), config.clone());
        move || async move {
            for (dir, segments) in [(&one, 1), (&several, many)] {
                let log = Log::open(dir, config.clone(), small_cache()).await.unwrap();
                append_n(&log, &batch, segments * per_segment).await;
                assert_eq!(
                    log.stats().segments,
                    segments,
                    "batches per segment miscounted"
                );
                log.close().await.unwrap();
            }
            // Alternate the two logs so neither benefits from running second every time.
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..repeats {
                a.push(time_open(&one, &config).await);
                b.push(time_open(&several, &config).await);
            }
            (a, b)
        }
    });
    remove_dir(&one);
    remove_dir(&several);

    let describe = |opens: &[(Duration, LogStats)]| {
        let s = opens[0].1;
        let median = median(opens.iter().map(|o| o.0).collect());
        (
            median,
            format!(
                "{} ({})",
                counted(s.segments, "segment", "segments"),
                size_label(s.size_bytes as usize)
            ),
        )
    };
    let (a_time, a_desc) = describe(&one_opens);
    let (b_time, b_desc) = describe(&several_opens);
    let ratio = b_time.as_secs_f64() / a_time.as_secs_f64();
    report(
        "3/3 start-up",
        &format!(
            "median of {repeats} opens: {b_desc} {:.1} ms vs {a_desc} {:.1} ms",
            ms(b_time),
            ms(a_time)
        ),
        ratio,
        "<= 1.50",
        ratio <= 1.5,
    );
}

/// Opens the log, timing only `Log::open`, and closes it cleanly again.
async fn time_open(dir: &Path, config: &LogConfig) -> (Duration, LogStats) {
    let cache = small_cache();
    let start = Instant::now();
    let log = Log::open(dir, config.clone(), cache).await.unwrap();
    let elapsed = start.elapsed();
    let stats = log.stats();
    log.close().await.unwrap();
    (elapsed, stats)
}

/// Bytes available to unprivileged users on the file system holding `path`, from `df`.
fn free_bytes(path: &Path) -> Option<u64> {
    let out = std::process::Command::new("df")
        .arg("-Pk")
        .arg(path)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let kib: u64 = text
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

// -------------------------------------------------------------------------------------------------
// Shared helpers

/// Default settings, but with no timed flush: only durable appends and rolls fsync, so the fsync
/// count of part 1 is all group commit and the appends of parts 2 and 3 stay in the page cache.
fn log_config(segment_bytes: usize) -> LogConfig {
    LogConfig {
        flush_interval: None,
        segment_bytes: segment_bytes as u64,
        ..LogConfig::default()
    }
}

/// A cache for logs whose reads are not measured: appends still fill it, as in the broker.
fn small_cache() -> Rc<TailCache> {
    Rc::new(TailCache::new(32 * MIB, MIB))
}

/// A one-record RecordBatch v2 of exactly `len` bytes, stamped now as a producer would: retention
/// by record time would treat a zero timestamp as long expired.
fn batch_of_len(len: usize) -> Bytes {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let build = |value_len: usize| {
        let mut b = BatchBuilder::new(now);
        b.push(now, None, Some(&vec![0x5a; value_len]), &[]);
        b
    };
    // The record's varint lengths depend on the value's length; a couple of corrections settle it.
    let mut value_len = len.saturating_sub(shards::batch::HEADER_LEN);
    for _ in 0..8 {
        let b = build(value_len);
        if b.size() == len {
            return Bytes::from(b.finish(0));
        }
        value_len = (value_len + len)
            .checked_sub(b.size())
            .expect("batch length too small");
    }
    panic!("no one-record batch is exactly {len} bytes long");
}

/// Appends `batch` `n` times, one after the other, acknowledged from the page cache.
async fn append_n(log: &Log, batch: &Bytes, n: usize) {
    for _ in 0..n {
        log.append(batch.clone(), AppendOptions { durable: false })
            .await
            .unwrap();
    }
}

/// Runs `make()`'s future on a fresh glommio executor thread and returns its output.
fn on_executor<T, F, G>(make: G) -> T
where
    G: FnOnce() -> F + Send + 'static,
    F: Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::default()
        .name("bench-log")
        .spawn(make)
        .expect("start a glommio executor (io_uring)")
        .join()
        .expect("the benchmark executor failed")
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("could not remove {}: {e}", dir.display());
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64()
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}

fn size_label(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{:.0} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.0} KiB", bytes as f64 / KIB as f64)
    }
}

fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One result line: the figures, the ratio against the same-run baseline, the target, the verdict.
fn report(name: &str, figures: &str, ratio: f64, target: &str, pass: bool) {
    println!(
        "[{name}] {figures} -> ratio {ratio:.2} (target {target}) {}",
        if pass { "PASS" } else { "FAIL" }
    );
}
