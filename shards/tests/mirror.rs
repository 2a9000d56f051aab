//! A mirrored log (shoal edge): batches keep the offsets another broker gave them, gaps included,
//! and the log can start again further on.

mod common;

use bytes::Bytes;
use common::*;
use shards::{Error, Log, TailCache};
use std::rc::Rc;

fn cache() -> Rc<TailCache> {
    Rc::new(TailCache::new(1 << 20, 4096))
}

/// A batch of `records` records numbered from `base`, as an upstream broker stores it.
fn numbered(base: i64, records: usize, seed: u64) -> Vec<u8> {
    with_offset(&batch(records, 50, seed), base)
}

#[test]
fn mirrored_batches_keep_their_offsets_and_gaps_across_a_reopen() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        log.restart_at(1000).await.unwrap();
        assert_eq!((log.log_start_offset(), log.high_watermark()), (1000, 1000));
        let a = numbered(1000, 3, 1);
        let b = numbered(1010, 2, 2); // offsets 1003..1009 were compacted away upstream
        let mut blob = a.clone();
        blob.extend_from_slice(&b);
        let r = log.append_mirrored(Bytes::from(blob)).await.unwrap();
        assert_eq!(
            (r.base_offset, r.last_offset, r.high_watermark),
            (1000, 1011, 1012)
        );
        // Bytes come back as the upstream sent them, from the cache and from disk.
        let read = log.read(1005, 1 << 20, true).await.unwrap();
        assert_eq!(read.records.to_vec(), b);
        // Overlapping what is there is refused and changes nothing.
        let again = log.append_mirrored(Bytes::from(numbered(1011, 1, 3))).await;
        assert!(matches!(again, Err(Error::InvalidBatch(_))), "{again:?}");
        assert_eq!(log.high_watermark(), 1012);
        log.close().await.unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert_eq!((log.log_start_offset(), log.high_watermark()), (1000, 1012));
        let all = log.read(1000, 1 << 20, true).await.unwrap();
        assert_eq!(all.records.to_vec(), [a, b].concat());
        log.close().await.unwrap();
    });
}

#[test]
fn a_restart_drops_what_the_log_held_and_never_moves_back() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        // Enough to roll several small segments.
        for i in 0..40 {
            log.append_mirrored(Bytes::from(numbered(i * 5, 5, i as u64)))
                .await
                .unwrap();
        }
        assert!(log.segment_base_offsets().len() > 1);
        let back = log.restart_at(100).await;
        assert!(
            matches!(back, Err(Error::OffsetOutOfRange { .. })),
            "{back:?}"
        );
        log.restart_at(5000).await.unwrap();
        assert_eq!(log.segment_base_offsets(), [5000]);
        assert!(matches!(
            log.read(100, 1000, true).await,
            Err(Error::OffsetOutOfRange { .. })
        ));
        let c = numbered(5000, 2, 99);
        log.append_mirrored(Bytes::from(c.clone())).await.unwrap();
        assert_eq!(
            log.read(5000, 1000, true).await.unwrap().records.to_vec(),
            c
        );
        let files = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "log")
            })
            .count();
        assert_eq!(files, 1, "the old segments' files are gone");
        log.close().await.unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert_eq!((log.log_start_offset(), log.high_watermark()), (5000, 5002));
        log.close().await.unwrap();
    });
}

#[test]
fn a_restart_at_the_high_watermark_keeps_an_empty_active_segment_there() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        for i in 0..20 {
            log.append_mirrored(Bytes::from(numbered(i * 5, 5, i as u64)))
                .await
                .unwrap();
        }
        let hw = log.high_watermark();
        log.close().await.unwrap();
        // A crash right after a roll leaves an empty active segment at the high watermark.
        std::fs::File::create(dir.path().join(format!("{hw:020}.log"))).unwrap();
        let log = Log::open(dir.path(), small_config(), cache())
            .await
            .unwrap();
        assert!(log.segment_base_offsets().len() > 1);
        log.restart_at(hw).await.unwrap();
        assert_eq!(log.segment_base_offsets(), [hw]);
        assert_eq!((log.log_start_offset(), log.high_watermark()), (hw, hw));
        let c = numbered(hw, 2, 7);
        log.append_mirrored(Bytes::from(c.clone())).await.unwrap();
        assert_eq!(log.read(hw, 1000, true).await.unwrap().records.to_vec(), c);
        log.close().await.unwrap();
    });
}
