//! The partition log against a real file system: round trips, restarts, recovery from damage,
//! retention, read limits, rejected input and group commit.

mod common;

use bytes::Bytes;
use common::*;
use shards::batch::{self, BatchHeader};
use shards::{AppendOptions, Error, Log, LogConfig};
use std::path::{Path, PathBuf};
use std::time::Duration;

const NON_DURABLE: AppendOptions = AppendOptions { durable: false };
const DURABLE: AppendOptions = AppendOptions { durable: true };

/// Appends `n` batches of varying sizes and returns (base offset, expected bytes) per batch.
async fn fill(log: &Log, n: usize, seed: u64) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..n {
        let b = batch(1 + i % 4, 50 + (i * 37) % 400, seed + i as u64);
        let r = log.append(b.clone(), NON_DURABLE).await.unwrap();
        out.push((r.base_offset, with_offset(&b, r.base_offset)));
    }
    out
}

/// Reads the whole log from `from` in small steps and returns the concatenated bytes.
async fn read_all(log: &Log, from: i64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = from;
    while at < log.high_watermark() {
        let r = log.read(at, 3000, true).await.unwrap();
        assert!(!r.records.is_empty(), "no progress at {at}");
        let bytes = r.records.to_vec();
        // The first batch may start before `at` only when `at` is inside it.
        assert!(r.records.first_offset <= at && r.records.last_offset >= at);
        out.extend_from_slice(&bytes);
        at = r.records.last_offset + 1;
    }
    out
}

fn concat(batches: &[(i64, Vec<u8>)]) -> Vec<u8> {
    batches.iter().flat_map(|(_, b)| b.clone()).collect()
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

#[test]
fn round_trip_from_cache_and_from_disk() {
    run(|| async {
        for cache in [cache(), no_cache()] {
            let dir = tempfile::tempdir().unwrap();
            let log = Log::open(dir.path(), small_config(), cache).await.unwrap();
            let batches = fill(&log, 60, 1).await;
            assert!(
                log.stats().segments > 3,
                "small segments should have rolled"
            );
            assert_eq!(read_all(&log, 0).await, concat(&batches));
            // Reading from the middle of a batch returns that whole batch first.
            let (base, bytes) = &batches[10];
            let hdr = BatchHeader::parse(bytes).unwrap();
            let r = log
                .read(base + hdr.last_offset_delta as i64, 1, true)
                .await
                .unwrap();
            assert_eq!(r.records.to_vec(), *bytes);
            // Decoding what we read gives back the records we wrote.
            let recs = batch::records(bytes).unwrap();
            assert_eq!(recs[0].offset, *base);
            assert!(recs[0].key.unwrap().starts_with(b"key-11-"));
            log.close().await.unwrap();
        }
    });
}

#[test]
fn tail_reads_come_from_the_cache_and_share_memory() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogConfig::default(), cache())
            .await
            .unwrap();
        let batches = fill(&log, 20, 2).await;
        let a = log.read(batches[5].0, 1 << 20, false).await.unwrap();
        let b = log.read(batches[5].0, 1 << 20, false).await.unwrap();
        assert!(a.from_cache && b.from_cache);
        assert_eq!(a.records.to_vec(), concat(&batches[5..]));
        // Two reads of the same range hand out the same memory, not copies.
        assert_eq!(a.records.parts[0].as_ptr(), b.records.parts[0].as_ptr());
        assert_eq!(log.stats().disk_reads, 0);
        log.close().await.unwrap();
    });
}

#[test]
fn offsets_and_data_survive_restart() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        let mut batches = fill(&log, 30, 3).await;
        let hw = log.high_watermark();
        log.close().await.unwrap();

        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), hw);
        assert_eq!(log.durable_offset(), hw);
        let more = fill(&log, 5, 100).await;
        assert_eq!(more[0].0, hw, "offsets continue where they stopped");
        batches.extend(more);
        assert_eq!(read_all(&log, 0).await, concat(&batches));
        // A restart without a clean close (the process died) keeps what was written too.
        let hw = log.high_watermark();
        drop(log);
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), hw);
        assert_eq!(read_all(&log, 0).await, concat(&batches));
        log.close().await.unwrap();
    });
}

/// Damages the last segment with `damage`, reopens, and checks that exactly the batches before the
/// damage survive and that the log takes appends again at the right offset.
/// (base offset, bytes) of each batch appended.
type Batches = [(i64, Vec<u8>)];

fn recovery_case(damage: fn(&Path, &Batches, u64)) {
    run(move || async move {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        let mut batches = fill(&log, 25, 4).await;
        for i in 0..3 {
            let b = batch(1, 10, 40 + i);
            let r = log.append(b.clone(), NON_DURABLE).await.unwrap();
            batches.push((r.base_offset, with_offset(&b, r.base_offset)));
        }
        let segs = log.segment_base_offsets();
        log.close().await.unwrap();
        let last_base = *segs.last().unwrap();
        let last_file = segment_files(dir.path()).pop().unwrap();
        // The damage comes with a crash, which leaves the active segment without the index file a
        // clean close writes (the next open would trust that and scan nothing).
        std::fs::remove_file(last_file.with_extension("index")).unwrap();
        let in_last: Vec<_> = batches
            .iter()
            .filter(|(b, _)| *b >= last_base)
            .cloned()
            .collect();
        assert!(
            in_last.len() >= 2,
            "the test needs two batches in the last segment"
        );
        damage(
            &last_file,
            &in_last,
            std::fs::metadata(&last_file).unwrap().len(),
        );

        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        let kept = &batches[..batches.len() - 1];
        let expected_hw = batches.last().unwrap().0;
        assert_eq!(
            log.high_watermark(),
            expected_hw,
            "only the damaged batch is lost"
        );
        assert_eq!(read_all(&log, 0).await, concat(kept));
        let r = log.append(batch(1, 10, 9), DURABLE).await.unwrap();
        assert_eq!(r.base_offset, expected_hw);
        log.close().await.unwrap();
    });
}

#[test]
fn recovery_cuts_a_torn_last_batch() {
    recovery_case(|file, _, len| {
        let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
        f.set_len(len - 7).unwrap(); // the last batch loses its last 7 bytes
    });
}

#[test]
fn recovery_cuts_a_corrupt_last_batch() {
    recovery_case(|file, in_last, len| {
        let last_len = in_last.last().unwrap().1.len() as u64;
        let mut bytes = std::fs::read(file).unwrap();
        let at = (len - last_len + 40) as usize; // inside the CRC-covered header
        bytes[at] ^= 0x10;
        std::fs::write(file, bytes).unwrap();
    });
}

#[test]
fn recovery_cuts_garbage_after_the_last_batch() {
    // Garbage after a whole batch: the valid batches all survive. Here the "damage" is appended and the
    // last real batch is cut too, so the shared checks apply; a pure-garbage case follows below.
    recovery_case(|file, _, len| {
        let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
        f.set_len(len - 1).unwrap();
        let mut bytes = std::fs::read(file).unwrap();
        bytes.extend_from_slice(&[0xAB; 333]);
        std::fs::write(file, bytes).unwrap();
    });
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        let batches = fill(&log, 10, 5).await;
        log.close().await.unwrap();
        let last = segment_files(dir.path()).pop().unwrap();
        let mut bytes = std::fs::read(&last).unwrap();
        let clean_len = bytes.len();
        bytes.extend((0..1000u32).map(|i| (i * 7) as u8));
        std::fs::write(&last, bytes).unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert_eq!(read_all(&log, 0).await, concat(&batches));
        assert_eq!(
            std::fs::metadata(&last).unwrap().len() as usize,
            clean_len,
            "the garbage is cut"
        );
        log.close().await.unwrap();
    });
}

#[test]
fn unclean_sealed_segments_are_scanned_and_their_index_rebuilt() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        let batches = fill(&log, 40, 6).await;
        log.close().await.unwrap();
        // Remove one index and damage another: both segments must be scanned, not trusted.
        let mut indexes: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "index"))
            .collect();
        indexes.sort();
        assert!(indexes.len() >= 3);
        std::fs::remove_file(&indexes[0]).unwrap();
        let mut ix = std::fs::read(&indexes[1]).unwrap();
        ix[20] ^= 1;
        std::fs::write(&indexes[1], ix).unwrap();

        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        // Every batch start is found through the rebuilt index.
        for (base, bytes) in &batches {
            let r = log.read(*base, bytes.len(), false).await.unwrap();
            assert_eq!(&r.records.to_vec(), bytes, "batch at {base}");
        }
        log.close().await.unwrap();
        // The clean close wrote the rebuilt indexes back.
        assert!(indexes[0].exists());
    });
}

#[test]
fn obligatory_and_strict_reads() {
    run(|| async {
        for cache in [cache(), no_cache()] {
            let dir = tempfile::tempdir().unwrap();
            let log = Log::open(dir.path(), LogConfig::default(), cache)
                .await
                .unwrap();
            let big = batch(3, 2000, 1);
            let small = batch(1, 10, 2);
            log.append(big.clone(), NON_DURABLE).await.unwrap();
            log.append(small.clone(), NON_DURABLE).await.unwrap();
            // Strict: a batch larger than max_bytes is not returned.
            let r = log.read(0, 100, false).await.unwrap();
            assert!(r.records.is_empty());
            // Obligatory (KIP-74): the first batch comes back whole even when it is larger.
            let r = log.read(0, 100, true).await.unwrap();
            assert_eq!((r.records.batches, r.records.len), (1, big.len()));
            // Exactly enough for both.
            let r = log.read(1, big.len() + small.len(), false).await.unwrap();
            assert_eq!(
                (
                    r.records.batches,
                    r.records.first_offset,
                    r.records.last_offset
                ),
                (2, 0, 3)
            );
            // One byte less: only the first.
            let r = log
                .read(0, big.len() + small.len() - 1, false)
                .await
                .unwrap();
            assert_eq!(r.records.batches, 1);
            // At the high watermark: empty, not an error. Past it, or below the start: out of range.
            let r = log.read(4, 100, true).await.unwrap();
            assert!(r.records.is_empty());
            assert_eq!(r.high_watermark, 4);
            assert!(matches!(
                log.read(5, 100, true).await,
                Err(Error::OffsetOutOfRange { offset: 5, .. })
            ));
            assert!(matches!(
                log.read(-1, 100, true).await,
                Err(Error::OffsetOutOfRange { .. })
            ));
            log.close().await.unwrap();
        }
    });
}

#[test]
fn reads_cross_segment_boundaries() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        let batches = fill(&log, 40, 7).await;
        let bases = log.segment_base_offsets();
        assert!(bases.len() >= 4);
        // Start one batch before the second segment and ask for plenty: the read continues into the next
        // segments as far as max_bytes allows.
        let i = batches.iter().position(|(b, _)| *b == bases[1]).unwrap() - 1;
        let want: usize = batches[i..i + 6].iter().map(|(_, b)| b.len()).sum();
        let r = log.read(batches[i].0, want, false).await.unwrap();
        assert_eq!(r.records.to_vec(), concat(&batches[i..i + 6]));
        assert!(r.records.parts.len() >= 2, "the read spans segments");
        log.close().await.unwrap();
    });
}

#[test]
fn rejected_batches_leave_the_log_unchanged() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            max_batch_bytes: 10_000,
            ..small_config()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        let batches = fill(&log, 5, 8).await;
        let hw = log.high_watermark();
        let size = log.stats().size_bytes;
        let good = batch(2, 20, 1);
        let mut corrupt = good.to_vec();
        *corrupt.last_mut().unwrap() ^= 1;
        let mut bad_magic = good.to_vec();
        bad_magic[16] = 1;
        let too_big = batch(1, 20_000, 1);
        // A valid batch followed by a corrupt one: all or nothing.
        let mut mixed = good.to_vec();
        mixed.extend_from_slice(&corrupt);
        let truncated = good.slice(..good.len() - 3);
        for bad in [
            Bytes::from(corrupt),
            Bytes::from(bad_magic),
            too_big,
            Bytes::from(mixed),
            truncated,
            Bytes::new(),
        ] {
            let err = log.append(bad, DURABLE).await.unwrap_err();
            assert!(matches!(err, Error::InvalidBatch(_)), "{err}");
        }
        assert_eq!(log.high_watermark(), hw);
        assert_eq!(log.stats().size_bytes, size);
        assert_eq!(read_all(&log, 0).await, concat(&batches));
        let r = log.append(good, NON_DURABLE).await.unwrap();
        assert_eq!(r.base_offset, hw);
        log.close().await.unwrap();
    });
}

#[test]
fn retention_by_bytes_deletes_whole_old_segments() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        let batches = fill(&log, 60, 9).await;
        let before = log.stats();
        log.set_config(LogConfig {
            retention_bytes: Some(20 << 10),
            ..small_config()
        });
        let deleted = log.enforce_retention().await.unwrap();
        let after = log.stats();
        assert!(deleted > 0);
        assert_eq!(after.segments, before.segments - deleted);
        assert!(
            after.size_bytes >= 20 << 10,
            "retention keeps at least retention_bytes"
        );
        assert!(
            after.size_bytes < (20 << 10) + (8 << 10) + 1024,
            "and deletes everything older"
        );
        let start = log.log_start_offset();
        assert_eq!(start, log.segment_base_offsets()[0]);
        assert!(
            batches.iter().any(|(b, _)| *b == start),
            "the log starts at a batch boundary"
        );
        assert_eq!(
            segment_files(dir.path()).len(),
            after.segments,
            "files are gone"
        );
        assert!(matches!(
            log.read(start - 1, 100, true).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        let kept: Vec<_> = batches
            .iter()
            .filter(|(b, _)| *b >= start)
            .cloned()
            .collect();
        assert_eq!(read_all(&log, start).await, concat(&kept));
        log.close().await.unwrap();
        // The log start survives a restart.
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert_eq!(log.log_start_offset(), start);
        log.close().await.unwrap();
    });
}

#[test]
fn retention_by_time_deletes_segments_with_only_old_records() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        // Records from 2023 (the helper's timestamps), then fresh ones.
        fill(&log, 30, 10).await;
        let old_end = log.high_watermark();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let mut fresh = shards::batch::BatchBuilder::new(now);
        fresh.push(now, Some(b"k"), Some(&[7; 5000]), &[]);
        let fresh = Bytes::from(fresh.finish(0));
        log.append(fresh.clone(), NON_DURABLE).await.unwrap();
        log.append(batch(1, 10, 1).slice(..), NON_DURABLE)
            .await
            .ok(); // an old one after the fresh one
        log.set_config(LogConfig {
            retention_age: Some(Duration::from_secs(3600)),
            ..small_config()
        });
        let deleted = log.enforce_retention().await.unwrap();
        assert!(deleted > 0);
        // Every segment holding only old records is gone; the fresh batch's segment stays.
        assert_eq!(log.log_start_offset(), old_end);
        let r = log.read(old_end, 1 << 20, true).await.unwrap();
        let got = r.records.to_vec();
        assert!(
            got.len() >= fresh.len() && got[12..fresh.len()] == fresh[12..],
            "the fresh batch is kept"
        );
        log.close().await.unwrap();
    });
}

#[test]
fn retention_runs_in_the_background() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            retention_bytes: Some(10 << 10),
            retention_check_interval: Duration::from_millis(20),
            ..small_config()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        fill(&log, 60, 11).await;
        wait_until(
            Duration::from_secs(10),
            Duration::from_millis(10),
            "background retention never ran",
            || log.log_start_offset() > 0,
        )
        .await;
        log.close().await.unwrap();
    });
}

#[test]
fn concurrent_durable_appends_share_fsyncs() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(
            dir.path(),
            LogConfig {
                flush_interval: None,
                ..LogConfig::default()
            },
            cache(),
        )
        .await
        .unwrap();
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let log = log.clone();
                glommio::spawn_local(
                    async move { log.append(batch(2, 100, i), DURABLE).await.unwrap() },
                )
            })
            .collect();
        let mut offsets = Vec::new();
        for t in tasks {
            let r = t.await;
            assert!(
                log.durable_offset() >= r.high_watermark,
                "acknowledged before its fsync"
            );
            offsets.push(r.base_offset);
        }
        offsets.sort();
        assert_eq!(offsets, (0..64).map(|i| i * 2).collect::<Vec<_>>());
        // The appends are written in a group or two, and an fsync or two covers them all.
        let stats = log.stats();
        assert!(
            (1..=2).contains(&stats.append_writes),
            "{} writes for 64 concurrent appends",
            stats.append_writes
        );
        assert!(
            (1..=2).contains(&stats.fsyncs),
            "{} fsyncs for 64 concurrent durable appends",
            stats.fsyncs
        );
        log.close().await.unwrap();
    });
}

#[test]
fn non_durable_appends_are_flushed_on_the_interval() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            flush_interval: Some(Duration::from_millis(20)),
            ..LogConfig::default()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        let r = log.append(batch(1, 10, 1), NON_DURABLE).await.unwrap();
        assert!(log.durable_offset() < r.high_watermark);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while log.durable_offset() < r.high_watermark {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        assert!(log.stats().fsyncs >= 1);
        log.close().await.unwrap();
    });
}

#[test]
fn log_append_time_is_stamped() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            log_append_time: true,
            ..LogConfig::default()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        let r = log.append(batch(3, 10, 1), NON_DURABLE).await.unwrap();
        assert!(r.log_append_time > 1_700_000_000_000);
        for cache_read in [true, false] {
            let bytes = if cache_read {
                log.read(0, 1 << 20, true).await.unwrap().records.to_vec()
            } else {
                let hw = log.high_watermark();
                log.clone().close().await.unwrap();
                let log = Log::open(dir.path(), LogConfig::default(), no_cache())
                    .await
                    .unwrap();
                assert_eq!(log.high_watermark(), hw);
                log.read(0, 1 << 20, true).await.unwrap().records.to_vec()
            };
            let h = batch::validate(&bytes, usize::MAX).unwrap();
            assert!(h.is_log_append_time());
            assert!(batch::records(&bytes)
                .unwrap()
                .iter()
                .all(|rec| rec.timestamp == r.log_append_time));
        }
    });
}

#[test]
fn deleting_a_partition_removes_its_directory() {
    run(|| async {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("topic").join("0");
        let log = Log::open(&dir, small_config(), cache()).await.unwrap();
        fill(&log, 20, 12).await;
        let waiter = log.high_watermark_monitor().wait_for(1_000_000);
        log.clone().delete().await.unwrap();
        assert!(!dir.exists());
        assert!(
            !waiter.await,
            "long pollers are released when the log goes away"
        );
        assert!(matches!(
            log.append(batch(1, 1, 1), NON_DURABLE).await,
            Err(Error::Closed)
        ));
        // A request still holding the deleted log gets an error, never a panic.
        assert!(matches!(log.read(0, 100, true).await, Err(Error::Closed)));
        assert_eq!(log.log_start_offset(), log.high_watermark());
    });
}

#[test]
fn offsets_by_timestamp() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        // batch(n, _, seed) stamps record i with 1_700_000_000_000 + seed + i.
        for seed in [0u64, 100, 200, 300] {
            log.append(batch(3, 500, seed), NON_DURABLE).await.unwrap();
        }
        let t0 = 1_700_000_000_000i64;
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some((0, t0)));
        assert_eq!(
            log.offset_for_timestamp(t0 + 101).await.unwrap(),
            Some((4, t0 + 101))
        );
        assert_eq!(
            log.offset_for_timestamp(t0 + 150).await.unwrap(),
            Some((6, t0 + 200))
        );
        assert_eq!(
            log.offset_for_timestamp(t0 + 302).await.unwrap(),
            Some((11, t0 + 302))
        );
        assert_eq!(log.offset_for_timestamp(t0 + 303).await.unwrap(), None);
        log.close().await.unwrap();
    });
}

#[test]
fn the_timestamp_a_consumer_at_an_offset_gets_next() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        // batch(n, _, seed) stamps record i with 1_700_000_000_000 + seed + i.
        for seed in [0u64, 100] {
            log.append(batch(3, 500, seed), NON_DURABLE).await.unwrap();
        }
        let t0 = 1_700_000_000_000i64;
        assert_eq!(log.timestamp_at(-5).await.unwrap(), Some(t0));
        assert_eq!(log.timestamp_at(1).await.unwrap(), Some(t0 + 1));
        assert_eq!(log.timestamp_at(3).await.unwrap(), Some(t0 + 100));
        assert_eq!(log.timestamp_at(5).await.unwrap(), Some(t0 + 102));
        assert_eq!(log.timestamp_at(6).await.unwrap(), None, "caught up");
        assert_eq!(log.timestamp_at(60).await.unwrap(), None);
        log.close().await.unwrap();
    });
}

/// A producer whose clock is ahead of the broker's: LogAppendTime stamping leaves the batch's max
/// timestamp below its base timestamp. That is no damage, and recovery must keep the batch.
#[test]
fn log_append_time_batches_from_a_clock_ahead_survive_recovery() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            log_append_time: true,
            ..small_config()
        };
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        let future = 4_000_000_000_000i64; // year 2096
        let mut b = shards::batch::BatchBuilder::new(future);
        b.push(future, Some(b"k"), Some(b"v"), &[]);
        log.append(Bytes::from(b.finish(0)), DURABLE).await.unwrap();
        log.append(batch(1, 10, 1), DURABLE).await.unwrap();
        let hw = log.high_watermark();
        drop(log); // unclean: the last segment is scanned
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        assert_eq!(log.high_watermark(), hw, "recovery kept every batch");
        log.close().await.unwrap();
    });
}

/// Under steady non-durable traffic the flush interval bounds the fsyncs: one per tick, not one
/// after another for as long as appends keep coming.
#[test]
fn steady_non_durable_traffic_fsyncs_once_per_flush_interval() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            flush_interval: Some(Duration::from_millis(50)),
            ..LogConfig::default()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        let start = std::time::Instant::now();
        let mut i = 0;
        while start.elapsed() < Duration::from_millis(500) {
            log.append(batch(1, 100, i), NON_DURABLE).await.unwrap();
            i += 1;
        }
        let fsyncs = log.stats().fsyncs;
        assert!(
            (1..=15).contains(&fsyncs),
            "{fsyncs} fsyncs for {i} appends in 500 ms at a 50 ms interval"
        );
        log.close().await.unwrap();
    });
}

/// Retention gets its turn while producers keep the writer busy.
#[test]
fn retention_runs_under_continuous_appends() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            retention_bytes: Some(32 << 10),
            retention_check_interval: Duration::from_millis(20),
            ..small_config()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        let stop = std::rc::Rc::new(std::cell::Cell::new(false));
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let (log, stop) = (log.clone(), stop.clone());
                glommio::spawn_local(async move {
                    let mut i = 0;
                    while !stop.get() {
                        log.append(batch(2, 300, p * 1_000_000 + i), NON_DURABLE)
                            .await
                            .unwrap();
                        i += 1;
                    }
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while log.log_start_offset() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "retention never ran while appends continued"
            );
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        stop.set(true);
        for p in producers {
            p.await;
        }
        log.close().await.unwrap();
    });
}

/// A log opened under a relative path (the default `./shoal-data` of `shoal serve`) creates its
/// directory, rolls segments (which syncs the directory) and reopens, with no absolute path given.
#[test]
fn a_log_under_a_relative_path_is_created_rolled_and_reopened() {
    // `tempdir_in(".")` names the directory relative to the working directory; the partition
    // directory below it does not exist yet, as for a topic created while the server runs.
    // The path goes up and back down (`../<this dir>/<tmp>`), as a user's `--data-dir` may.
    let base = tempfile::tempdir_in(".").unwrap();
    let cwd = std::env::current_dir().unwrap();
    let dir = Path::new("..")
        .join(cwd.file_name().unwrap())
        .join(base.path().strip_prefix(&cwd).unwrap())
        .join("topics")
        .join("t1")
        .join("0");
    assert!(dir.is_relative(), "{}", dir.display());
    let dir2 = dir.clone();
    run(move || async move {
        let mut config = small_config();
        config.segment_bytes = 4096;
        let log = Log::open(&dir2, config.clone(), cache()).await.unwrap();
        let written = fill(&log, 60, 7).await;
        log.append(batch(1, 10, 1), DURABLE).await.unwrap();
        assert!(
            segment_files(&dir2).len() > 1,
            "the test must roll segments"
        );
        log.close().await.unwrap();
        let log = Log::open(&dir2, config, cache()).await.unwrap();
        assert_eq!(
            read_all(&log, 0).await[..concat(&written).len()],
            concat(&written)[..]
        );
        log.close().await.unwrap();
    });
    assert!(dir.join(format!("{:020}.log", 0)).exists());
}

/// What fetch pacing asks to tell a consumer behind from one at the tail: the bytes from an offset
/// to the end, estimated from the active segment, and nothing at or past the end.
#[test]
fn bytes_from_an_offset_are_estimated_from_the_active_segment() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), LogConfig::default(), cache())
            .await
            .unwrap();
        assert_eq!(log.estimated_bytes_from(0), 0, "an empty log");
        // Equal batches: the estimate is exact.
        let mut sizes = Vec::new();
        for i in 0..10 {
            let b = batch(4, 100, i);
            sizes.push(b.len() as u64);
            log.append(b, NON_DURABLE).await.unwrap();
        }
        assert!(sizes.windows(2).all(|w| w[0] == w[1]));
        let total: u64 = sizes.iter().sum();
        assert_eq!(log.high_watermark(), 40);
        assert_eq!(log.estimated_bytes_from(0), total);
        assert_eq!(log.estimated_bytes_from(20), total / 2);
        assert_eq!(log.estimated_bytes_from(40), 0);
        assert_eq!(log.estimated_bytes_from(1000), 0);
        // Offsets a client may send, far before the log: all of it, no overflow.
        assert!(log.estimated_bytes_from(i64::MIN) >= total);
        log.close().await.unwrap();
    });
}

#[test]
fn delete_records_moves_the_start_inside_a_segment_and_keeps_it_across_a_restart() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        let batches = fill(&log, 60, 3).await;
        let segments = log.segment_base_offsets();
        assert!(segments.len() > 3, "the helper's batches roll segments");
        // An offset inside the third segment's first batch, not at a batch boundary.
        let target = segments[2] + 1;
        assert_eq!(log.delete_records(target).await.unwrap(), target);
        assert_eq!(log.log_start_offset(), target);
        assert_eq!(
            log.segment_base_offsets()[0],
            segments[2],
            "the whole segments below went, the one holding the start stays"
        );
        assert_eq!(segment_files(dir.path()).len(), segments.len() - 2);
        assert!(matches!(
            log.read(target - 1, 100, true).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        let read = log.read(target, 100, true).await.unwrap();
        assert_eq!(read.log_start_offset, target);
        assert!(read.records.first_offset <= target);
        // Below the start: nothing to do; past the high watermark: refused.
        assert_eq!(log.delete_records(1).await.unwrap(), target);
        let hw = log.high_watermark();
        assert!(matches!(
            log.delete_records(hw + 1).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        // Offsets by time answer the start for a time before every record.
        let (offset, _) = log.offset_for_timestamp(0).await.unwrap().unwrap();
        assert_eq!(offset, target);
        log.close().await.unwrap();

        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert_eq!(log.log_start_offset(), target, "the start is kept");
        let kept = read_all(&log, target).await;
        assert!(!kept.is_empty());
        // -1: the high watermark, which empties the log but for the active segment.
        assert_eq!(log.delete_records(-1).await.unwrap(), hw);
        assert_eq!(log.log_start_offset(), hw);
        assert_eq!(log.segment_base_offsets().len(), 1);
        assert!(batches.last().unwrap().0 < hw);
        log.close().await.unwrap();
    });
}
