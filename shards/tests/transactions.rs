//! Transactions in the log: the last stable offset, commit and abort markers, the aborted index
//! queried over any range (across segment rolls), and all of it rebuilt after a crash, kept by a
//! clean restart and removed with its segment by retention.

mod common;

use bytes::Bytes;
use common::*;
use futures_lite::future::{block_on, poll_once};
use shards::batch::BatchBuilder;
use shards::transactions::{encode_marker, AbortedTxn, Marker};
use shards::{AppendOptions, Error, InvalidBatch, Log, LogConfig};
use std::collections::BTreeMap;

const NON_DURABLE: AppendOptions = AppendOptions { durable: false };

/// A transactional batch of `records` records from `producer_id`.
fn txn_batch(producer_id: i64, base_sequence: i32, records: usize, value_len: usize) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000)
        .producer(producer_id, 0, base_sequence)
        .transactional();
    for i in 0..records {
        let key = format!("tx-{producer_id}-{base_sequence}-{i}");
        b.push(
            1_700_000_000_000 + i as i64,
            Some(key.as_bytes()),
            Some(&vec![b'v'; value_len]),
            &[],
        );
    }
    Bytes::from(b.finish(0))
}

/// Opens the log in `dir` with small segments (they roll every few dozen batches).
async fn open(dir: &std::path::Path) -> Log {
    Log::open(dir, small_config(), cache()).await.unwrap()
}

/// What the log should know of its transactions, kept beside it by the tests.
#[derive(Debug, Default, Clone)]
struct Model {
    /// Producer id -> first offset of its open transaction.
    open: BTreeMap<i64, i64>,
    /// Every transaction aborted, in marker order.
    aborted: Vec<AbortedTxn>,
    sequences: BTreeMap<i64, i32>,
}

impl Model {
    async fn data(&mut self, log: &Log, pid: i64, records: usize) -> i64 {
        let seq = self.sequences.entry(pid).or_default();
        let r = log
            .append(txn_batch(pid, *seq, records, 180), NON_DURABLE)
            .await
            .unwrap();
        *seq += records as i32;
        self.open.entry(pid).or_insert(r.base_offset);
        r.base_offset
    }

    async fn end(&mut self, log: &Log, pid: i64, commit: bool) -> i64 {
        let offset = log.append_marker(pid, 0, commit, 1).await.unwrap();
        assert!(log.durable_offset() > offset, "a marker is durable");
        if let Some(first) = self.open.remove(&pid) {
            if !commit {
                let lso = self.open.values().min().copied().unwrap_or(offset + 1);
                self.aborted.push(AbortedTxn {
                    producer_id: pid,
                    first_offset: first,
                    last_offset: offset,
                    last_stable_offset: lso,
                });
            }
        }
        offset
    }

    fn last_stable_offset(&self, log: &Log) -> i64 {
        self.open
            .values()
            .min()
            .copied()
            .unwrap_or(log.high_watermark())
    }

    /// The log agrees with the model: open transactions, the last stable offset, and the aborted
    /// transactions of ranges starting and ending everywhere (inside transactions, at markers,
    /// across segments), of those whose markers are still in the log.
    fn check(&self, log: &Log, what: &str) {
        let mut open: Vec<(i64, i64)> = self.open.iter().map(|(&p, &f)| (p, f)).collect();
        open.sort_by_key(|&(p, f)| (f, p));
        assert_eq!(log.open_transactions(), open, "{what}: open transactions");
        assert_eq!(
            log.last_stable_offset(),
            self.last_stable_offset(log),
            "{what}: last stable offset"
        );
        let (start, hw) = (log.log_start_offset(), log.high_watermark());
        for from in (start..=hw).step_by(3) {
            for to in (from..=hw + 1).step_by(7) {
                let expected: Vec<AbortedTxn> = self
                    .aborted
                    .iter()
                    .filter(|a| a.last_offset >= start && a.intersects(from, to))
                    .copied()
                    .collect();
                assert_eq!(
                    log.aborted_transactions(from, to),
                    expected,
                    "{what}: aborted in {from}..{to}"
                );
            }
        }
    }
}

/// A seeded mix of plain batches, transactional batches of four producers, commits and aborts
/// (some for producers with nothing open), `steps` long.
async fn workload(log: &Log, model: &mut Model, steps: usize, seed: u64) {
    let mut x = seed;
    for i in 0..steps {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pid = 1 + (x >> 33) as i64 % 4;
        match (x >> 40) % 10 {
            0..=2 => {
                log.append(batch(2, 150, seed + i as u64), NON_DURABLE)
                    .await
                    .unwrap();
            }
            3..=6 => {
                model.data(log, pid, 1 + (x >> 50) as usize % 3).await;
            }
            7 | 8 => {
                model.end(log, pid, x >> 60 & 1 == 0).await;
            }
            _ => {
                model.end(log, pid, false).await;
            }
        }
    }
}

#[test]
fn the_last_stable_offset_follows_interleaved_producers() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path()).await;
        let mut m = Model::default();
        log.append(batch(1, 10, 1), NON_DURABLE).await.unwrap(); // 0
        assert_eq!(log.last_stable_offset(), 1);
        assert_eq!(m.data(&log, 1, 1).await, 1);
        assert_eq!(m.data(&log, 2, 2).await, 2); // 2..=3
        log.append(batch(1, 10, 2), NON_DURABLE).await.unwrap(); // 4
        assert_eq!(m.data(&log, 1, 1).await, 5);
        assert_eq!((log.last_stable_offset(), log.high_watermark()), (1, 6));
        m.check(&log, "two open");
        // A read_committed long poll at the high watermark waits for the last stable offset.
        let mut waiter = Box::pin(log.last_stable_monitor().wait_for(6));
        assert_eq!(block_on(poll_once(&mut waiter)), None);
        assert_eq!(m.end(&log, 1, true).await, 6);
        assert_eq!(
            log.last_stable_offset(),
            2,
            "producer 2's transaction is older"
        );
        assert_eq!(
            (log.open_transaction(1), log.open_transaction(2)),
            (None, Some(2))
        );
        assert_eq!(block_on(poll_once(&mut waiter)), None);
        assert_eq!(m.end(&log, 2, false).await, 7);
        assert_eq!(log.last_stable_offset(), 8);
        assert_eq!(block_on(poll_once(&mut waiter)), Some(true));
        assert_eq!(
            log.aborted_transactions(0, 8),
            [AbortedTxn {
                producer_id: 2,
                first_offset: 2,
                last_offset: 7,
                last_stable_offset: 8
            }]
        );
        // Ranges that end before it, start inside it, end inside it, start at its marker.
        assert!(log.aborted_transactions(0, 2).is_empty());
        assert_eq!(log.aborted_transactions(3, 4).len(), 1);
        assert_eq!(log.aborted_transactions(0, 3).len(), 1);
        assert_eq!(log.aborted_transactions(7, 8).len(), 1);
        assert!(log.aborted_transactions(8, 20).is_empty());
        // A marker for a producer with nothing open is written and changes nothing else.
        assert_eq!(m.end(&log, 9, false).await, 8);
        assert_eq!(log.last_stable_offset(), 9);
        m.check(&log, "after the markers");
        // With nothing open, the last stable offset moves with the high watermark.
        log.append(batch(3, 10, 3), NON_DURABLE).await.unwrap();
        assert_eq!(log.last_stable_offset(), log.high_watermark());
        log.close().await.unwrap();
    });
}

#[test]
fn producers_may_not_write_control_batches_or_transactions_without_a_producer_id() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path()).await;
        let marker = Marker {
            commit: true,
            coordinator_epoch: 0,
        };
        let control = Bytes::from(encode_marker(5, 0, marker, 0));
        let anonymous = {
            let mut b = BatchBuilder::new(0).transactional();
            b.push(0, Some(b"k"), Some(b"v"), &[]);
            Bytes::from(b.finish(0))
        };
        for refused in [control, anonymous] {
            assert!(matches!(
                log.append(refused, NON_DURABLE).await,
                Err(Error::InvalidBatch(InvalidBatch::Unsupported))
            ));
        }
        assert_eq!(log.high_watermark(), 0);
        log.close().await.unwrap();
    });
}

#[test]
fn the_aborted_index_spans_segment_rolls() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path()).await;
        let mut m = Model::default();
        // A long transaction from producer 1 across many segments, with others inside it.
        m.data(&log, 1, 2).await;
        workload(&log, &mut m, 150, 7).await;
        m.data(&log, 1, 1).await;
        m.end(&log, 1, false).await;
        workload(&log, &mut m, 150, 8).await;
        assert!(log.stats().segments >= 5, "small segments roll");
        assert!(m.aborted.len() >= 10, "aborted: {}", m.aborted.len());
        assert!(m
            .aborted
            .iter()
            .any(|a| a.producer_id == 1 && a.first_offset == 0));
        m.check(&log, "live");
        log.close().await.unwrap();
    });
}

#[test]
fn a_crash_rebuilds_open_transactions_and_aborted_indexes_exactly() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Model::default();
        let log = open(dir.path()).await;
        m.data(&log, 4, 1).await; // open across every segment, never ended
        workload(&log, &mut m, 250, 11).await;
        m.data(&log, 3, 1).await;
        assert!(!m.open.is_empty());
        m.check(&log, "before the crash");
        // The process dies: nothing is closed, the last segment and any unsealed one are scanned.
        drop(log);
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        m.check(&log, "after the crash");
        // The rebuilt state goes on: producer 4's transaction aborts from its first offset.
        m.end(&log, 4, false).await;
        workload(&log, &mut m, 60, 12).await;
        m.check(&log, "after the crash, appending");
        log.close().await.unwrap();
        // A clean restart trusts the sealed segments' transaction indexes.
        let log = open(dir.path()).await;
        m.check(&log, "after a clean restart");
        log.close().await.unwrap();
        // A damaged transaction index makes its segment scanned, and its index rebuilt.
        let files = files(dir.path(), ".txnindex");
        assert!(files.len() >= 2, "{files:?}");
        for f in &files[..2] {
            let mut b = std::fs::read(f).unwrap();
            b[13] ^= 1;
            std::fs::write(f, b).unwrap();
        }
        let log = open(dir.path()).await;
        m.check(&log, "after damage to transaction indexes");
        log.close().await.unwrap();
    });
}

#[test]
fn retention_removes_a_segments_aborted_index_with_it() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Model::default();
        let log = open(dir.path()).await;
        m.data(&log, 1, 1).await;
        m.end(&log, 1, false).await;
        workload(&log, &mut m, 200, 21).await;
        // Close all open transactions so retention is the only thing moving the log start.
        for pid in 1..=4 {
            m.end(&log, pid, true).await;
        }
        log.close().await.unwrap();
        let first = files(dir.path(), ".txnindex")[0].clone();
        assert!(first.ends_with(format!("{:020}.txnindex", 0)), "{first:?}");
        let log = Log::open(
            dir.path(),
            LogConfig {
                retention_bytes: Some(20 << 10),
                ..small_config()
            },
            cache(),
        )
        .await
        .unwrap();
        assert!(log.enforce_retention().await.unwrap() > 0);
        assert!(!first.exists(), "the index went with its segment");
        let start = log.log_start_offset();
        assert!(m.aborted.iter().any(|a| a.last_offset < start));
        assert!(log
            .aborted_transactions(0, start)
            .iter()
            .all(|a| a.last_offset >= start));
        m.check(&log, "after retention");
        log.close().await.unwrap();
    });
}

#[test]
fn compaction_carries_the_aborted_index_and_open_transactions() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            cleanup_compact: true,
            cleanup_delete: false,
            ..small_config()
        };
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        let mut m = Model::default();
        m.data(&log, 4, 1).await; // open through every segment compaction rewrites
        for round in 0..40u64 {
            // Records of a few keys, overwritten round after round: compaction removes most.
            let mut b = BatchBuilder::new(1_700_000_000_000);
            for k in 0..3 {
                let key = format!("key-{k}");
                b.push(
                    1_700_000_000_000,
                    Some(key.as_bytes()),
                    Some(&[1; 200]),
                    &[],
                );
            }
            log.append(Bytes::from(b.finish(0)), NON_DURABLE)
                .await
                .unwrap();
            m.data(&log, 1 + round as i64 % 3, 1).await;
            if round % 3 == 2 {
                m.end(&log, 1 + round as i64 % 3, round % 2 == 0).await;
            }
        }
        m.check(&log, "before compaction");
        // Nothing is compacted past the last stable offset: producer 4's transaction is open
        // (the segments are sealed: a durable append returns after their seals).
        let durable = AppendOptions { durable: true };
        log.append(batch(1, 10, 3_000), durable).await.unwrap();
        assert!(log.stats().segments > 3);
        let stats = log.compact_now().await.unwrap();
        assert_eq!(stats.read_bytes, 0, "{stats:?}");
        m.end(&log, 4, false).await;
        for pid in 1..=3 {
            m.end(&log, pid, true).await;
        }
        // An aborted value written after a committed one does not replace it.
        let value = |v: &[u8]| {
            let mut b = BatchBuilder::new(1_700_000_000_000);
            b.push(1_700_000_000_000, Some(b"the-key"), Some(v), &[]);
            Bytes::from(b.finish(0))
        };
        let committed = log.append(value(b"committed"), NON_DURABLE).await.unwrap();
        let mut b = BatchBuilder::new(1_700_000_000_000)
            .producer(7, 0, 0)
            .transactional();
        b.push(1_700_000_000_000, Some(b"the-key"), Some(b"aborted"), &[]);
        let aborted = log
            .append(Bytes::from(b.finish(0)), NON_DURABLE)
            .await
            .unwrap();
        m.open.insert(7, aborted.base_offset);
        m.end(&log, 7, false).await;
        // Fill a segment more, so the key's records are in sealed segments.
        for i in 0..60 {
            log.append(batch(1, 200, 1_000 + i), NON_DURABLE)
                .await
                .unwrap();
        }
        // A durable append returns once the segments rolled before it are sealed: compactable.
        log.append(batch(1, 10, 2_000), durable).await.unwrap();
        // Segments written small are rewritten into fewer: their indexes are merged.
        log.set_config(LogConfig {
            segment_bytes: 64 << 10,
            ..config.clone()
        });
        let stats = log.compact_now().await.unwrap();
        assert!(stats.read_bytes > stats.written_bytes, "{stats:?}");
        assert!(stats.segments_after < stats.segments_before, "{stats:?}");
        m.check(&log, "after compaction");
        // The key's committed value is kept; the aborted one and the aborted transactions'
        // other records are gone from what was compacted.
        assert!(aborted.base_offset < stats.cleaned_to, "{stats:?}");
        let mut seen = Vec::new();
        let mut at = log.log_start_offset();
        while at < log.high_watermark() {
            let read = log.read(at, 1 << 20, true).await.unwrap();
            for (h, bytes) in read.records.batches() {
                if h.is_control() {
                    continue;
                }
                for r in shards::batch::records(&bytes).unwrap() {
                    assert!(
                        r.offset >= stats.cleaned_to
                            || !m.aborted.iter().any(|a| a.producer_id == h.producer_id
                                && a.first_offset <= r.offset
                                && r.offset < a.last_offset),
                        "aborted record at {} kept",
                        r.offset
                    );
                    if r.key == Some(&b"the-key"[..]) {
                        seen.push((r.offset, r.value.map(<[u8]>::to_vec)));
                    }
                }
            }
            at = read.records.next_offset().unwrap();
        }
        assert_eq!(seen, [(committed.base_offset, Some(b"committed".to_vec()))]);
        log.close().await.unwrap();
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        m.check(&log, "after compaction and a restart");
        drop(log);
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        m.check(&log, "after a crash");
        log.close().await.unwrap();
    });
}

/// Kafka's rule for markers under compaction: a marker goes once none of its transaction's
/// records is kept and `delete.retention.ms` has passed (here 0), with its aborted-index entry; a
/// marker whose transaction kept a record stays, and so does a producer's last batch.
#[test]
fn compaction_removes_markers_of_transactions_with_nothing_left() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            cleanup_compact: true,
            cleanup_delete: false,
            delete_retention: std::time::Duration::ZERO,
            ..small_config()
        };
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        let keyed = |pid: i64, seq: i32, key: &str| {
            let mut b = BatchBuilder::new(1_700_000_000_000);
            if pid >= 0 {
                b = b.producer(pid, 0, seq).transactional();
            }
            b.push(1_700_000_000_000, Some(key.as_bytes()), Some(b"v"), &[]);
            Bytes::from(b.finish(0))
        };
        // Producer 1 commits key a (later overwritten), then key d (kept); producer 2 aborts
        // key b, then commits key e; producer 3 commits key c (kept), then key f.
        log.append(keyed(1, 0, "a"), NON_DURABLE).await.unwrap();
        let first_commit = log.append_marker(1, 0, true, 0).await.unwrap();
        log.append(keyed(2, 0, "b"), NON_DURABLE).await.unwrap();
        let abort = log.append_marker(2, 0, false, 0).await.unwrap();
        log.append(keyed(3, 0, "c"), NON_DURABLE).await.unwrap();
        let kept = log.append_marker(3, 0, true, 0).await.unwrap();
        log.append(keyed(-1, -1, "a"), NON_DURABLE).await.unwrap();
        log.append(keyed(1, 1, "d"), NON_DURABLE).await.unwrap();
        let last_1 = log.append_marker(1, 0, true, 0).await.unwrap();
        log.append(keyed(2, 1, "e"), NON_DURABLE).await.unwrap();
        let last_2 = log.append_marker(2, 0, true, 0).await.unwrap();
        log.append(keyed(3, 1, "f"), NON_DURABLE).await.unwrap();
        let last_3 = log.append_marker(3, 0, true, 0).await.unwrap();
        assert_eq!(log.aborted_transactions(0, log.high_watermark()).len(), 1);
        for i in 0..80 {
            log.append(batch(1, 200, 5_000 + i), NON_DURABLE)
                .await
                .unwrap();
        }
        log.append(batch(1, 10, 9_000), AppendOptions { durable: true })
            .await
            .unwrap();
        let stats = log.compact_now().await.unwrap();
        assert_eq!(stats.markers_removed, 2, "{stats:?}");
        let markers = |log: &Log| {
            let log = log.clone();
            async move {
                let mut found = Vec::new();
                let mut at = log.log_start_offset();
                while at < log.high_watermark() {
                    let read = log.read(at, 1 << 20, true).await.unwrap();
                    for (h, _) in read.records.batches() {
                        if h.is_control() {
                            found.push(h.base_offset);
                        }
                    }
                    at = read.records.next_offset().unwrap();
                }
                found
            }
        };
        let want = vec![kept, last_1, last_2, last_3];
        assert_eq!(markers(&log).await, want);
        assert!(![first_commit, abort].iter().any(|o| want.contains(o)));
        assert!(log.aborted_transactions(0, log.high_watermark()).is_empty());
        assert_eq!(log.last_stable_offset(), log.high_watermark());
        // The same after a restart and after a crash.
        log.close().await.unwrap();
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        assert_eq!(markers(&log).await, want);
        assert!(log.open_transactions().is_empty());
        assert!(log.aborted_transactions(0, log.high_watermark()).is_empty());
        drop(log);
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        assert!(log.open_transactions().is_empty());
        assert_eq!(log.last_stable_offset(), log.high_watermark());
        log.close().await.unwrap();
    });
}

#[test]
fn a_crash_after_a_checkpoint_recovers_the_transactions_from_it_and_the_tail() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        // One large segment: the active one passes several checkpoints.
        let config = LogConfig {
            segment_bytes: 64 << 20,
            ..small_config()
        };
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        let mut model = Model::default();
        // 1 opens before the first checkpoint and ends after it; 2 aborts before it; 3 stays open.
        model.data(&log, 1, 2).await;
        model.data(&log, 2, 2).await;
        model.end(&log, 2, false).await;
        model.data(&log, 3, 1).await;
        let mut seq = 0;
        while log.stats().size_bytes < 20 << 20 {
            let b = batch(50, 1000, seq);
            log.append(b, NON_DURABLE).await.unwrap();
            seq += 1;
        }
        model.end(&log, 1, true).await;
        model.data(&log, 4, 3).await;
        log.append(batch(5, 100, 7), NON_DURABLE).await.unwrap();
        model.check(&log, "before the crash");
        let hw = log.high_watermark();
        let index = dir.path().join("00000000000000000000.index");
        assert!(index.exists(), "the active segment has a checkpoint");
        // No close: a crash. What was written is in the page cache or on the device.
        drop(log);
        glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        assert_eq!(log.high_watermark(), hw);
        model.check(&log, "after the crash");
        // Every batch reads back whole.
        let mut at = 0;
        while at < hw {
            let r = log.read(at, 1 << 20, true).await.unwrap();
            at = r.records.last_offset + 1;
        }
        log.close().await.unwrap();
    });
}
