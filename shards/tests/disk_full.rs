//! A full disk: appends fail with a typed storage error, the log stays readable, and after space is
//! freed and the log reopened no partial batch is visible and appends work again. The failure is
//! logged once per episode per log, counted, and its end logged once.
//!
//! Uses a real size-limited tmpfs, which needs root (CI and the development machines run as root).

mod common;
#[path = "support/mount.rs"]
mod mount;

use common::*;
use mount::tmpfs_or_skip;
use shards::{storage_health, AppendOptions, Error, Log, LogConfig, StorageHealth};
use std::sync::Mutex;

/// Every log line of the test process, kept for the assertions on what the logs say.
static LINES: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = record.args().to_string();
        eprintln!("{} {line}", record.level());
        LINES.lock().unwrap().push((record.level(), line));
    }
    fn flush(&self) {}
}

/// Installs [`Capture`] unless a test of this binary already did (before `run` installs env_logger).
fn capture_logs() {
    if log::set_boxed_logger(Box::new(Capture)).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// The lines logged so far that mention `what`, with their level.
fn lines_about(what: &str) -> Vec<(log::Level, String)> {
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, l)| l.contains(what))
        .cloned()
        .collect()
}

#[test]
fn a_full_disk_fails_appends_cleanly() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let Some(mount) = tmpfs_or_skip(dir.path(), "300k", "a_full_disk_fails_appends_cleanly") else {
        return;
    };
    let path = dir.path().join("p0");
    run(move || async move {
        let config = LogConfig {
            segment_bytes: 1 << 20,
            flush_interval: None,
            ..LogConfig::default()
        };
        let log = Log::open(&path, config.clone(), no_cache()).await.unwrap();
        let mut acked = Vec::new();
        let err = loop {
            let b = batch(1, 16 << 10, acked.len() as u64);
            match log.append(b.clone(), AppendOptions { durable: true }).await {
                Ok(r) => acked.push(with_offset(&b, r.base_offset)),
                Err(e) => break e,
            }
            assert!(
                acked.len() < 100,
                "300 KiB should fill up long before 100 x 16 KiB"
            );
        };
        assert!(
            matches!(err, Error::Storage { .. }),
            "a full disk is a storage error, got {err}"
        );
        assert!(!acked.is_empty());
        let expected: Vec<u8> = acked.concat();
        let hw = log.high_watermark();
        assert_eq!(hw, acked.len() as i64, "the failed append took no offset");
        // Still readable, from disk, with nothing of the failed batch.
        let r = log.read(0, usize::MAX, true).await.unwrap();
        assert_eq!(r.records.to_vec(), expected);
        // A small append may still fit; a big one keeps failing the same way, and the log stays whole.
        let again = log
            .append(batch(1, 64 << 10, 999), AppendOptions { durable: false })
            .await;
        assert!(matches!(again, Err(Error::Storage { .. })));
        assert_eq!(log.high_watermark(), hw);
        drop(log); // as if the broker stopped

        mount.resize("4m");
        let log = Log::open(&path, config, no_cache()).await.unwrap();
        assert_eq!(log.high_watermark(), hw, "no partial batch became visible");
        let r = log.read(0, usize::MAX, true).await.unwrap();
        assert_eq!(r.records.to_vec(), expected);
        let r = log
            .append(batch(2, 100, 1), AppendOptions { durable: true })
            .await
            .unwrap();
        assert_eq!(r.base_offset, hw);
        log.close().await.unwrap();
    });
}

/// Two partitions on one full disk: each logs its failure once (however many appends fail), with
/// its path and the OS error; the core's counters see every failure and both partitions failing;
/// once the file system grows, the next append of each succeeds, without a restart, and each logs
/// once that its storage works again.
#[test]
fn storage_failures_are_logged_once_per_episode_and_counted() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let Some(mount) = tmpfs_or_skip(dir.path(), "300k", "storage_failures_are_logged_once") else {
        return;
    };
    let root = dir.path().to_path_buf();
    run(move || async move {
        let config = LogConfig {
            segment_bytes: 1 << 20,
            flush_interval: None,
            ..LogConfig::default()
        };
        let (path_a, path_b) = (root.join("a-0"), root.join("b-0"));
        let a = Log::open(&path_a, config.clone(), no_cache())
            .await
            .unwrap();
        let b = Log::open(&path_b, config.clone(), no_cache())
            .await
            .unwrap();
        let at_start = storage_health();
        assert_eq!(at_start, StorageHealth::default());
        let ack = AppendOptions { durable: true };
        // Fill the disk through `a`.
        let mut appended = 0;
        let first = loop {
            match a.append(batch(1, 16 << 10, appended), ack).await {
                Ok(_) => appended += 1,
                Err(e) => break e,
            }
            assert!(
                appended < 100,
                "300 KiB should fill up long before 100 x 16 KiB"
            );
        };
        assert!(matches!(first, Error::Storage { .. }), "{first}");
        assert_eq!(
            storage_health(),
            StorageHealth {
                errors: 1,
                failing_logs: 1
            }
        );
        let failure = a.storage_failure().expect("a is failing");
        assert!(failure.contains("No space left on device"), "{failure}");
        assert!(b.storage_failure().is_none(), "b has not failed yet");
        // More failures in the same episode, and the first of b's.
        for i in 0..5 {
            let r = a.append(batch(1, 64 << 10, 1000 + i), ack).await;
            assert!(matches!(r, Err(Error::Storage { .. })), "{r:?}");
        }
        for i in 0..3 {
            let r = b.append(batch(1, 64 << 10, 2000 + i), ack).await;
            assert!(matches!(r, Err(Error::Storage { .. })), "{r:?}");
        }
        assert_eq!(
            storage_health(),
            StorageHealth {
                errors: 9,
                failing_logs: 2
            }
        );
        assert_eq!((a.stats().storage_errors, b.stats().storage_errors), (6, 3));
        assert_eq!(
            a.storage_failure(),
            Some(failure),
            "the episode keeps its first failure"
        );
        for path in [&path_a, &path_b] {
            let lines = lines_about(&path.display().to_string());
            assert_eq!(lines.len(), 1, "one line per episode per log: {lines:?}");
            let (level, line) = &lines[0];
            assert_eq!(*level, log::Level::Error, "{line}");
            assert!(
                line.contains("No space left on device (os error 28)"),
                "the OS error: {line}"
            );
            let file = path.join("00000000000000000000.log");
            assert!(
                line.contains(&file.display().to_string()),
                "the file: {line}"
            );
        }

        // Space again, with both logs still open: the next append of each succeeds and ends its episode.
        mount.resize("4m");
        let r = a.append(batch(1, 100, 1), ack).await.unwrap();
        assert_eq!(
            r.base_offset, appended as i64,
            "failed appends took no offset"
        );
        assert_eq!(
            storage_health(),
            StorageHealth {
                errors: 9,
                failing_logs: 1
            }
        );
        assert!(a.storage_failure().is_none());
        b.append(batch(1, 100, 2), ack).await.unwrap();
        assert_eq!(
            storage_health(),
            StorageHealth {
                errors: 9,
                failing_logs: 0
            }
        );
        b.append(batch(1, 100, 3), ack).await.unwrap();
        for path in [&path_a, &path_b] {
            let lines = lines_about(&path.display().to_string());
            assert_eq!(
                lines.len(),
                2,
                "the failure and its end, once each: {lines:?}"
            );
            let (level, line) = &lines[1];
            assert_eq!(*level, log::Level::Warn, "{line}");
            assert!(line.contains("storage works again"), "{line}");
        }
        a.close().await.unwrap();
        b.close().await.unwrap();
    });
}
