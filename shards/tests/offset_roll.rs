//! Relative offsets: a segment rolls before its offsets outgrow what its index holds, whatever the
//! batches claim, and reads by offset still land on the right batch on either side of the roll.

mod common;

use bytes::Bytes;
use common::*;
use shards::batch::{self, BatchBuilder, BatchHeader};
use shards::{AppendOptions, Error, InvalidBatch, Log};

const NON_DURABLE: AppendOptions = AppendOptions { durable: false };
/// Offsets one gapped batch below takes: `lastOffsetDelta` is `i32::MAX - 1`.
const SPAN: i64 = i32::MAX as i64;

/// Two records at offset deltas 0 and `i32::MAX - 1`, as a compacted batch may legitimately keep
/// (producers cannot send it: their batches are dense and checked record by record).
fn gapped(seed: u8) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000);
    b.push_with_delta(0, 1_700_000_000_000, Some(&[seed]), Some(b"first"), &[]);
    b.push_with_delta(
        i32::MAX - 1,
        1_700_000_000_000,
        Some(&[seed]),
        Some(b"last"),
        &[],
    );
    Bytes::from(b.finish(0))
}

fn headers(blob: &[u8]) -> Vec<BatchHeader> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < blob.len() {
        let h = batch::check_integrity(&blob[at..], usize::MAX).unwrap();
        at += h.total_len();
        out.push(h);
    }
    out
}

/// The batch a read at `offset` starts with.
async fn first_batch_at(log: &Log, offset: i64) -> BatchHeader {
    let r = log.read(offset, 1, true).await.unwrap();
    let (h, _) = r.records.batches().next().expect("a batch");
    h
}

#[test]
fn segments_roll_before_relative_offsets_overflow() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        let first = gapped(1);
        let r = log
            .append_validated(first.clone(), headers(&first), NON_DURABLE)
            .await
            .unwrap();
        assert_eq!((r.base_offset, r.high_watermark), (0, SPAN));
        // Two more queued together: the writer must not put them in one group past the limit.
        let (second, third) = (gapped(2), gapped(3));
        let a = log.append_validated(second.clone(), headers(&second), NON_DURABLE);
        let b = log.append_validated(third.clone(), headers(&third), NON_DURABLE);
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!((a.base_offset, b.base_offset), (SPAN, 2 * SPAN));
        // A dense batch after them.
        let dense = batch(3, 10, 4);
        let d = log.append(dense, NON_DURABLE).await.unwrap();
        assert_eq!(d.base_offset, 3 * SPAN);
        // Each batch ends where the next segment starts: relative offsets stay within i32.
        let bases = log.segment_base_offsets();
        assert_eq!(bases, [0, SPAN, 2 * SPAN, 3 * SPAN]);

        let check = |log: Log| async move {
            for (i, base) in [0, SPAN, 2 * SPAN].into_iter().enumerate() {
                for at in [base, base + 1, base + SPAN / 2, base + SPAN - 1] {
                    let h = first_batch_at(&log, at).await;
                    assert_eq!(h.base_offset, base, "read at {at} (batch {i})");
                }
            }
            let h = first_batch_at(&log, 3 * SPAN + 2).await;
            assert_eq!((h.base_offset, h.record_count), (3 * SPAN, 3));
            assert_eq!(log.high_watermark(), 3 * SPAN + 3);
            log
        };
        let log = check(log).await;
        log.close().await.unwrap();
        // After a restart (sealed segments trusted by their index, the last one scanned).
        let log = Log::open(dir.path(), small_config(), no_cache())
            .await
            .unwrap();
        assert_eq!(log.segment_base_offsets(), [0, SPAN, 2 * SPAN, 3 * SPAN]);
        let log = check(log).await;
        log.close().await.unwrap();
    });
}

#[test]
fn one_append_spanning_more_than_a_segment_is_refused() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        log.append(batch(2, 10, 1), NON_DURABLE).await.unwrap();
        let mut blob = gapped(1).to_vec();
        blob.extend_from_slice(&gapped(2));
        let err = log
            .append_validated(Bytes::from(blob.clone()), headers(&blob), NON_DURABLE)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidBatch(InvalidBatch::TooManyOffsets { .. })
            ),
            "{err}"
        );
        assert_eq!(log.high_watermark(), 2);
        assert_eq!(
            log.append(batch(1, 10, 2), NON_DURABLE)
                .await
                .unwrap()
                .base_offset,
            2
        );
        log.close().await.unwrap();
    });
}

/// The lying batch of issue 11 through the log's own checks: refused, the log unchanged.
#[test]
fn a_batch_lying_about_its_count_leaves_the_log_unchanged() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        log.append(batch(2, 10, 1), NON_DURABLE).await.unwrap();
        let size = log.stats().size_bytes;
        let mut lie = batch(1, 10, 2).to_vec();
        lie[23..27].copy_from_slice(&(i32::MAX - 1).to_be_bytes());
        lie[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&lie[21..]);
        lie[17..21].copy_from_slice(&crc.to_be_bytes());
        for _ in 0..3 {
            let err = log
                .append(Bytes::from(lie.clone()), NON_DURABLE)
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::InvalidBatch(InvalidBatch::Records { .. })),
                "{err}"
            );
        }
        assert_eq!((log.high_watermark(), log.stats().size_bytes), (2, size));
        log.close().await.unwrap();
    });
}
