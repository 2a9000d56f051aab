//! Sharded views over a real log: every record lands in its shard exactly once (null keys in all),
//! offsets and order are the source's, consumers of one shard share the reader from their own
//! offsets, a stalled or far-behind consumer neither stalls nor rewinds the shared reader, and
//! only committed records are published.

mod common;

use bytes::Bytes;
use common::*;
use shards::batch::compress_batch;
use shards::batch::{self, BatchBuilder};
use shards::partitioner::shard_of;
use shards::view_reader::{ViewConfig, ViewReader, ViewReaders};
use shards::{AppendOptions, Log};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// (offset, key, value) of a record.
type Rec = (i64, Option<Vec<u8>>, Vec<u8>);

/// (key, value) of each record of a batch, in order.
type KeyValues = Vec<(Option<Vec<u8>>, Vec<u8>)>;

/// Batch `b` of 10 records (`b * 10..`, keys from `key_of`), compressed with `codec`, and its
/// records' (key, value) pairs.
fn batch_of(b: usize, codec: i16, key_of: impl Fn(usize) -> Option<String>) -> (Bytes, KeyValues) {
    let mut builder = BatchBuilder::new(1_000);
    let mut recs = Vec::new();
    for r in 0..10 {
        let i = b * 10 + r;
        let key = key_of(i);
        let value = format!("value-{i}").into_bytes();
        builder.push(
            1_000 + i as i64,
            key.as_deref().map(str::as_bytes),
            Some(&value),
            &[],
        );
        recs.push((key.map(String::into_bytes), value));
    }
    (Bytes::from(compress_batch(&builder.finish(0), codec)), recs)
}

/// Appends `batches` batches of 10 records: keyed, with every 7th key null, every 3rd batch
/// compressed with a different codec. Returns the records.
async fn fill(log: &Log, batches: usize, key_of: impl Fn(usize) -> Option<String>) -> Vec<Rec> {
    let mut out = Vec::new();
    for b in 0..batches {
        let codec = if b % 3 == 2 {
            (b / 3 % 4 + 1) as i16
        } else {
            0
        };
        let (blob, recs) = batch_of(b, codec, &key_of);
        let r = log.append(blob, AppendOptions::default()).await.unwrap();
        for (j, (k, v)) in recs.into_iter().enumerate() {
            out.push((r.base_offset + j as i64, k, v));
        }
    }
    out
}

/// A log in `dir` with small segments ([`small_config`]).
async fn small_log(dir: &std::path::Path) -> Log {
    Log::open(dir, small_config(), cache()).await.unwrap()
}

/// A log in `dir` of `batches` batches with [`default_keys`] (see [`fill`]), and a shared reader of
/// it for `shards` shards (not started).
async fn filled_with_reader(
    dir: &std::path::Path,
    batches: usize,
    shards: u32,
) -> (Log, Vec<Rec>, ViewReaders, Rc<ViewReader>) {
    let log = small_log(dir).await;
    let all = fill(&log, batches, default_keys).await;
    let views = ViewReaders::new(ViewConfig::default());
    let reader = views.reader(&log, shards);
    (log, all, views, reader)
}

fn default_keys(i: usize) -> Option<String> {
    (i % 7 != 0).then(|| format!("key-{i}"))
}

/// Reads shard `shard` from `from` to the last stable offset (the high watermark, without open
/// transactions) the way a consumer does: fetch, and when nothing is there yet, wait for the reader.
async fn consume(
    reader: &Rc<ViewReader>,
    log: &Log,
    shard: u32,
    from: i64,
    max_bytes: usize,
) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut at = from;
    let deadline = Instant::now() + Duration::from_secs(20);
    while at < log.last_stable_offset() {
        assert!(Instant::now() < deadline, "shard {shard} stuck at {at}");
        let read = reader.fetch(shard, at, max_bytes, true).await.unwrap();
        if read.records.is_empty() {
            let wait = reader.progress_monitor().wait_for(at + 1);
            futures_lite::future::or(
                async {
                    wait.await;
                },
                glommio::timer::sleep(Duration::from_millis(20)),
            )
            .await;
            continue;
        }
        for part in &read.records.parts {
            let mut pos = 0;
            while pos < part.len() {
                let len = batch::peek_total_len(&part[pos..]).unwrap();
                let b = &part[pos..pos + len];
                let h = batch::BatchHeader::parse(b).unwrap();
                assert_eq!(crc32c::crc32c(&b[21..]), h.crc);
                for r in batch::records(b).unwrap() {
                    if r.offset >= at {
                        out.push((
                            r.offset,
                            r.key.map(<[u8]>::to_vec),
                            r.value.unwrap().to_vec(),
                        ));
                    }
                }
                at = at.max(h.last_offset() + 1);
                pos += len;
            }
        }
    }
    out
}

fn expected(all: &[Rec], shard: u32, n: u32, from: i64) -> Vec<Rec> {
    all.iter()
        .filter(|r| r.0 >= from && shard_of(r.1.as_deref(), n).is_none_or(|s| s == shard))
        .cloned()
        .collect()
}

fn small_window() -> ViewConfig {
    ViewConfig {
        window_bytes: 64 << 10,
        max_delta_for_fanout: 1_000,
        idle_stop: Duration::from_millis(200),
        read_bytes: 8 << 10,
        shared: true,
    }
}

#[test]
fn every_shard_holds_exactly_its_records_for_4_and_7_shards() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let all = fill(&log, 30, default_keys).await;
        let views = ViewReaders::new(ViewConfig::default());
        for n in [4u32, 7] {
            let reader = views.reader(&log, n);
            let mut union = Vec::new();
            for shard in 0..n {
                let got = consume(&reader, &log, shard, 0, 4096).await;
                assert_eq!(got, expected(&all, shard, n, 0), "shard {shard} of {n}");
                union.extend(got.into_iter().filter(|r| r.1.is_some()));
            }
            union.sort();
            let keyed: Vec<_> = all.iter().filter(|r| r.1.is_some()).cloned().collect();
            assert_eq!(union, keyed, "keyed records are in exactly one shard");
        }
        let s = views.stats();
        // One reader per n decoded each of the 30 source batches once, for all its shards.
        assert_eq!(
            (s.source_batches_decoded, s.catch_up_reads, s.decode_errors),
            (60, 0, 0),
            "{s:?}"
        );
    });
}

#[test]
fn consumers_of_one_shard_from_different_offsets_share_the_reader() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (log, all, views, reader) = filled_with_reader(dir.path(), 20, 4).await;
        for from in [50, 10, 30] {
            assert_eq!(
                consume(&reader, &log, 1, from, 2048).await,
                expected(&all, 1, 4, from),
                "from {from}"
            );
        }
        // The reader started at 50; the consumer from 10 decoded 10..50 once into the window's front,
        // and the one from 30 found it there: each batch from 10 on decoded exactly once.
        let s = views.stats();
        assert_eq!(
            s.source_batches_decoded, 19,
            "each source batch decoded once"
        );
        assert_eq!(s.catch_up_reads, 0);
    });
}

#[test]
fn a_shard_without_records_in_a_long_stretch_reaches_the_end() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        // All keys hash to one shard except the last batch's.
        let lonely = (0..1000)
            .map(|i| format!("k{i}"))
            .find(|k| shard_of(Some(k.as_bytes()), 4) == Some(3))
            .unwrap();
        let busy = (0..1000)
            .map(|i| format!("k{i}"))
            .find(|k| shard_of(Some(k.as_bytes()), 4) == Some(0))
            .unwrap();
        let all = fill(&log, 40, |i| {
            Some(if i >= 395 {
                lonely.clone()
            } else {
                busy.clone()
            })
        })
        .await;
        let views = ViewReaders::new(ViewConfig::default());
        let reader = views.reader(&log, 4);
        let got = consume(&reader, &log, 3, 0, 1024).await;
        assert_eq!(got, expected(&all, 3, 4, 0));
        assert_eq!(got.len(), 5);
    });
}

#[test]
fn a_stalled_or_far_behind_consumer_neither_stalls_nor_rewinds_the_reader() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let mut all = fill(&log, 5, default_keys).await;
        let views = ViewReaders::new(ViewConfig {
            window_bytes: 4 << 10,
            max_delta_for_fanout: 100,
            ..small_window()
        });
        let reader = views.reader(&log, 4);
        // A consumer attaches at 0 and then stalls (never fetches again).
        let _ = reader.fetch(2, 0, 1024, true).await.unwrap();
        // Lots more data; an active consumer tails it.
        all.extend(fill(&log, 60, default_keys).await);
        let got = consume(&reader, &log, 1, 0, 4096).await;
        assert_eq!(got, expected(&all, 1, 4, 0));
        assert_eq!(
            reader.position(),
            log.high_watermark(),
            "the reader kept going"
        );
        let decoded = views.stats().source_batches_decoded;
        // The stalled consumer comes back: far behind the window, it gets its own read.
        let before = views.stats().catch_up_reads;
        let r = reader.fetch(2, 0, 1024, true).await.unwrap();
        assert!(!r.records.is_empty());
        assert!(views.stats().catch_up_reads > before);
        assert_eq!(
            reader.position(),
            log.high_watermark(),
            "and the shared reader was not rewound"
        );
        assert_eq!(
            consume(&reader, &log, 2, 0, 4096).await,
            expected(&all, 2, 4, 0)
        );
        assert!(
            views.stats().source_batches_decoded > decoded,
            "catch-up reads decode for themselves"
        );
    });
}

#[test]
fn an_idle_reader_stops_and_a_new_consumer_restarts_it() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let all = fill(&log, 10, default_keys).await;
        let views = ViewReaders::new(small_window());
        let reader = views.reader(&log, 2);
        assert_eq!(
            consume(&reader, &log, 0, 0, 4096).await,
            expected(&all, 0, 2, 0)
        );
        assert_eq!(views.stats().readers, 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while reader.is_running() {
            assert!(Instant::now() < deadline, "the reader never stopped");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(views.stats().readers, 0);
        assert_eq!(
            consume(&reader, &log, 1, 0, 4096).await,
            expected(&all, 1, 2, 0)
        );
        assert!(reader.is_running());
    });
}

#[test]
fn a_batch_that_cannot_be_decoded_is_skipped_for_views() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let mut all = fill(&log, 2, default_keys).await;
        // A gzip batch whose compressed bytes are garbage, with a right CRC. A produce would be
        // refused (its records are checked); one written before that check, or by a path that
        // trusts its batches, goes in by `append_validated`.
        let mut b = BatchBuilder::new(0);
        b.push(0, Some(b"x"), Some(b"y"), &[]);
        let mut bad = compress_batch(&b.finish(0), 1);
        let n = bad.len();
        bad[70..n].fill(0x55);
        let h = batch::BatchHeader::parse(&bad).unwrap();
        batch::write_header(&mut bad, &h);
        assert!(batch::validate(&bad, usize::MAX).is_err());
        let h = batch::check_integrity(&bad, usize::MAX).unwrap();
        log.append_validated(Bytes::from(bad), vec![h], AppendOptions::default())
            .await
            .unwrap();
        all.extend(fill(&log, 2, default_keys).await);
        let views = ViewReaders::new(ViewConfig::default());
        let reader = views.reader(&log, 3);
        let good: Vec<_> = all.clone();
        for shard in 0..3 {
            assert_eq!(
                consume(&reader, &log, shard, 0, 4096).await,
                expected(&good, shard, 3, 0)
            );
        }
        assert_eq!(views.stats().decode_errors, 1);
        // The source itself is untouched.
        assert_eq!(
            log.read(20, 1 << 20, true).await.unwrap().records.batches,
            3
        );
    });
}

/// Consumers that fell behind the window together share their catch-up reads: one read (one
/// decode, split for every shard) for fetches of the same offset and size, of any shard, in flight
/// at once or within `CATCH_UP_FRESH`; a different size, or a later fetch, reads again; unshared
/// views never share.
#[test]
fn consumers_behind_the_window_share_their_catch_up_reads() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let all = fill(&log, 60, default_keys).await;
        let config = ViewConfig {
            window_bytes: 4 << 10,
            max_delta_for_fanout: 100,
            ..small_window()
        };
        let views = ViewReaders::new(config);
        let reader = views.reader(&log, 4);
        // A consumer tails shard 1 to the end: the window is far past offset 0.
        assert_eq!(
            consume(&reader, &log, 1, 0, 4096).await,
            expected(&all, 1, 4, 0)
        );
        let s0 = views.stats();
        let (a, b) = futures_lite::future::zip(
            reader.fetch(2, 0, 1024, true),
            reader.fetch(2, 0, 1024, true),
        )
        .await;
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(!a.records.is_empty());
        assert_eq!(a.records, b.records, "the same records");
        let s1 = views.stats();
        assert_eq!(
            (
                s1.catch_up_reads - s0.catch_up_reads,
                s1.catch_up_reads_shared - s0.catch_up_reads_shared
            ),
            (1, 1),
            "one read served both"
        );
        let one_read = s1.source_batches_decoded - s0.source_batches_decoded;
        assert!(one_read > 0);
        // Just after: still served by it, nothing decoded; so is another shard at the same offset
        // (the read was split for every shard).
        let c = reader.fetch(2, 0, 1024, true).await.unwrap();
        assert_eq!(c.records, a.records);
        let other_shard = reader.fetch(3, 0, 1024, true).await.unwrap();
        let s2 = views.stats();
        assert_eq!(s2.catch_up_reads_shared - s1.catch_up_reads_shared, 2);
        assert_eq!(s2.catch_up_reads, s1.catch_up_reads);
        assert_eq!(s2.source_batches_decoded, s1.source_batches_decoded);
        // Another size is another read; so is the same one once it is stale.
        reader.fetch(2, 0, 2048, true).await.unwrap();
        assert_eq!(views.stats().catch_up_reads - s2.catch_up_reads, 1);
        glommio::timer::sleep(shards::view_reader::CATCH_UP_FRESH + Duration::from_millis(50))
            .await;
        let d = reader.fetch(2, 0, 1024, true).await.unwrap();
        assert_eq!(d.records, a.records, "a stale result is read again, alike");
        let s3 = views.stats();
        assert_eq!(s3.catch_up_reads - s2.catch_up_reads, 2);
        assert_eq!(s3.catch_up_reads_shared, s2.catch_up_reads_shared);
        // Every record of shard 2 from 0 still arrives, in order, exactly once.
        assert_eq!(
            consume(&reader, &log, 2, 0, 4096).await,
            expected(&all, 2, 4, 0)
        );

        // Unshared views: each fetch reads for itself.
        let unshared = ViewReaders::new(ViewConfig {
            shared: false,
            ..config
        });
        let reader = unshared.reader(&log, 4);
        let (a, b) = futures_lite::future::zip(
            reader.fetch(3, 0, 1024, true),
            reader.fetch(3, 0, 1024, true),
        )
        .await;
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.records, b.records);
        let s = unshared.stats();
        assert_eq!((s.catch_up_reads, s.catch_up_reads_shared), (2, 0));
        // A read split for all shards gives shard 3 exactly what its own read gives it.
        assert_eq!(other_shard.records, a.records);
    });
}

#[test]
fn without_sharing_every_fetch_decodes_for_itself() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let all = fill(&log, 10, default_keys).await;
        let views = ViewReaders::new(ViewConfig {
            shared: false,
            ..ViewConfig::default()
        });
        let reader = views.reader(&log, 2);
        for shard in 0..2 {
            assert_eq!(
                consume(&reader, &log, shard, 0, 1 << 20).await,
                expected(&all, shard, 2, 0)
            );
        }
        let s = views.stats();
        assert_eq!(
            (s.readers, s.source_batches_decoded),
            (0, 20),
            "no reader; each consumer decoded all 10"
        );
    });
}

#[test]
fn a_shards_batches_from_one_read_go_out_as_one_part() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let (log, all, _views, reader) = filled_with_reader(dir.path(), 30, 4).await;
        // The first fetch starts the reader, which decodes all 30 batches in one read.
        reader.fetch(2, 0, 1 << 20, true).await.unwrap();
        reader_caught_up(&reader, &log).await;
        let read = reader.fetch(2, 0, 1 << 20, true).await.unwrap();
        assert_eq!(read.records.batches, 30);
        assert_eq!(
            read.records.parts.len(),
            1,
            "shard batches back to back in one buffer are one part"
        );
        let cut = reader.fetch(2, 0, 3 * 1024, true).await.unwrap();
        assert!(cut.records.len <= 3 * 1024 && cut.records.batches < 30);
        assert_eq!(cut.records.parts.len(), 1);
        assert_eq!(
            consume(&reader, &log, 2, 0, 3 * 1024).await,
            expected(&all, 2, 4, 0)
        );
    });
}

/// While a reader runs, the produce path keeps what checking a compressed batch decompressed and
/// the reader splits that: every codec's batches reach each shard exactly as when the reader
/// decompresses them itself, and none is decompressed a second time. Once the reader stops, appends
/// keep nothing.
#[test]
fn a_running_reader_splits_what_the_produce_path_decompressed() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = small_log(dir.path()).await;
        let views = ViewReaders::new(small_window());
        let reader = views.reader(&log, 4);
        assert!(!log.keeps_decoded(), "no reader runs yet");
        // A first fetch starts the reader, at the end of the empty log.
        let first = reader.fetch(0, 0, 4096, true).await.unwrap();
        assert!(first.records.is_empty());
        assert!(log.keeps_decoded());
        let (mut all, mut compressed) = (Vec::new(), 0);
        for b in 0..15usize {
            // lz4, gzip, zstd, snappy, uncompressed in turn.
            let codec = [3i16, 1, 4, 2, 0][b % 5];
            compressed += usize::from(codec != 0);
            let (blob, recs) = batch_of(b, codec, default_keys);
            // As the produce handler does.
            let keep = log.keeps_decoded();
            let (headers, decoded) = batch::validate_all_keeping(&blob, 1 << 20, keep).unwrap();
            assert_eq!(
                decoded.len(),
                headers.len(),
                "one entry per batch while kept"
            );
            let kept = decoded.iter().flatten().count();
            assert_eq!(kept, usize::from(codec != 0), "batch {b}, codec {codec}");
            let r = log
                .append_keeping(blob, headers, decoded, AppendOptions::default())
                .await
                .unwrap();
            for (j, (k, v)) in recs.into_iter().enumerate() {
                all.push((r.base_offset + j as i64, k, v));
            }
        }
        for shard in 0..4 {
            assert_eq!(
                consume(&reader, &log, shard, 0, 4096).await,
                expected(&all, shard, 4, 0),
                "shard {shard}"
            );
        }
        let s = views.stats();
        assert_eq!(
            (s.source_batches_decoded, s.decompressions_saved),
            (15, compressed as u64),
            "{s:?}"
        );
        // The reader stops when idle: appends keep nothing from then on.
        let deadline = Instant::now() + Duration::from_secs(10);
        while reader.is_running() {
            assert!(Instant::now() < deadline, "the reader never stopped");
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        assert!(!log.keeps_decoded());
        let mut one = BatchBuilder::new(0);
        one.push(0, Some(b"k"), Some(b"v"), &[]);
        let blob = Bytes::from(compress_batch(&one.finish(0), 3));
        let (_, decoded) =
            batch::validate_all_keeping(&blob, 1 << 20, log.keeps_decoded()).unwrap();
        assert!(decoded.is_empty());
    });
}

#[test]
fn views_publish_committed_records_only() {
    for config in [
        small_window(),
        ViewConfig {
            shared: false,
            ..small_window()
        },
    ] {
        run(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let log = small_log(dir.path()).await;
            let mut committed = fill(&log, 4, default_keys).await;
            // A transaction's batch of 10 keyed records from `pid`; its records.
            let txn = |pid: i64, seq: i32| {
                let mut b = BatchBuilder::new(1_000)
                    .producer(pid, 0, seq)
                    .transactional();
                for i in 0..10 {
                    let key = format!("txn-{pid}-{seq}-{i}");
                    b.push(1_000, Some(key.as_bytes()), Some(key.as_bytes()), &[]);
                }
                Bytes::from(b.finish(0))
            };
            let append = |blob: Bytes| {
                let log = log.clone();
                async move {
                    let r = log.append(blob.clone(), AppendOptions::default()).await;
                    let base = r.unwrap().base_offset;
                    let mut v = blob.to_vec();
                    batch::set_base_offset(&mut v, base);
                    batch::records(&v)
                        .unwrap()
                        .into_iter()
                        .map(|r| {
                            (
                                r.offset,
                                r.key.map(<[u8]>::to_vec),
                                r.value.unwrap().to_vec(),
                            )
                        })
                        .collect::<Vec<Rec>>()
                }
            };
            committed.extend(append(txn(1, 0)).await);
            append(txn(2, 0)).await; // aborted below
            committed.extend(append(txn(1, 10)).await);
            log.append_marker(1, 0, true, 0).await.unwrap();
            log.append_marker(2, 0, false, 0).await.unwrap();
            let open = append(txn(3, 0)).await; // open: nothing from here is published
            let (later, _) = batch_of(9, 0, default_keys);
            let later = append(later).await;
            let stable = log.last_stable_offset();
            assert_eq!(stable, open[0].0);
            let views = ViewReaders::new(config);
            let reader = views.reader(&log, 3);
            for shard in 0..3 {
                let got = consume(&reader, &log, shard, 0, 4 << 10).await;
                assert_eq!(got, expected(&committed, shard, 3, 0), "shard {shard}");
                // At the last stable offset: nothing yet.
                let read = reader.fetch(shard, stable, 4 << 10, true).await.unwrap();
                assert!(read.records.is_empty());
            }
            // The transaction commits: its records and what follows are published.
            log.append_marker(3, 0, true, 0).await.unwrap();
            let rest: Vec<Rec> = open.into_iter().chain(later).collect();
            for shard in 0..3 {
                let got = consume(&reader, &log, shard, stable, 4 << 10).await;
                assert_eq!(got, expected(&rest, shard, 3, stable), "shard {shard}");
            }
            log.close().await.unwrap();
        });
    }
}
