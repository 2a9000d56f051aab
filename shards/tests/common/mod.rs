//! Helpers shared by the log tests: an executor per test, batch builders, small configs.
#![allow(dead_code)]

use bytes::Bytes;
use shards::batch::BatchBuilder;
use shards::{LogConfig, TailCache};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

/// [`shards::testing::run`] (a fresh executor, a hang fails the test), with the log shown for
/// failing tests.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let _ = env_logger::builder().is_test(true).try_init();
    shards::testing::run(f)
}

/// Waits (up to 10 s) until the shared view reader has split everything below `log`'s high watermark.
pub async fn reader_caught_up(reader: &shards::view_reader::ViewReader, log: &shards::Log) {
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(5),
        "the view reader did not reach the high watermark",
        || reader.position() >= log.high_watermark(),
    )
    .await;
}

/// Waits until `ready` holds, looking every `every`; fails the test with `what` after `limit`.
pub async fn wait_until(
    limit: Duration,
    every: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + limit;
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} (within {limit:?})"
        );
        glommio::timer::sleep(every).await;
    }
}

/// A batch of `records` records with `value_len`-byte values, keys and headers derived from `seed`.
pub fn batch(records: usize, value_len: usize, seed: u64) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000 + seed as i64);
    for i in 0..records {
        let key = format!("key-{seed}-{i}");
        let value: Vec<u8> = (0..value_len)
            .map(|j| (seed as usize + i * 31 + j) as u8)
            .collect();
        b.push(
            1_700_000_000_000 + seed as i64 + i as i64,
            Some(key.as_bytes()),
            Some(&value),
            &[(b"h", Some(b"v"))],
        );
    }
    Bytes::from(b.finish(0))
}

/// Small segments and a dense index, so a few KiB exercise rolling and index lookups.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 8 << 10,
        index_interval_bytes: 512,
        flush_interval: None,
        retention_age: None,
        ..LogConfig::default()
    }
}

pub fn cache() -> Rc<TailCache> {
    Rc::new(TailCache::new(64 << 20, 64 << 10))
}

/// A cache that holds nothing, so every read goes to disk.
pub fn no_cache() -> Rc<TailCache> {
    Rc::new(TailCache::new(0, 4096))
}

/// The files in `dir` whose names end with `suffix` (`.index`, `.corrupt`, ...), sorted.
pub fn files(dir: &std::path::Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// The bytes the log should hold for `batch` appended at `base_offset`.
pub fn with_offset(batch: &[u8], base_offset: i64) -> Vec<u8> {
    let mut v = batch.to_vec();
    shards::batch::set_base_offset(&mut v, base_offset);
    v
}
