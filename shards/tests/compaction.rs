//! Compacted logs against a real file system: the latest record per key is kept at its offset,
//! tombstones go after `delete.retention.ms`, records without keys are refused, compressed and
//! idempotent batches are rewritten correctly, appends and reads go on during a pass, a swap
//! interrupted at any step is finished or undone at the next open, a log closed while a pass runs
//! keeps every key's latest record, and the core's compactor runs passes by itself.

mod common;

use bytes::Bytes;
use common::*;
use shards::batch::{self, BatchBuilder, BatchHeader};
use shards::{AppendOptions, Error, InvalidBatch, Log, LogConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NON_DURABLE: AppendOptions = AppendOptions { durable: false };
const DURABLE: AppendOptions = AppendOptions { durable: true };

fn compacted() -> LogConfig {
    LogConfig {
        cleanup_compact: true,
        cleanup_delete: false,
        delete_retention: Duration::from_secs(3600),
        ..small_config()
    }
}

/// One record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

/// A batch of `(key, value)` records stamped `ts`, compressed with `codec`.
fn kv_batch(records: &[(&str, Option<String>)], ts: i64, codec: i16) -> Bytes {
    let mut b = BatchBuilder::new(ts);
    for (k, v) in records {
        b.push(ts, Some(k.as_bytes()), v.as_deref().map(str::as_bytes), &[]);
    }
    Bytes::from(batch::compress_batch(&b.finish(0), codec))
}

/// Every record of the log from its start, checking batches on the way: intact (CRC), offsets
/// growing, each batch after the last.
async fn read_records(log: &Log) -> (Vec<Rec>, Vec<BatchHeader>) {
    let mut out = Vec::new();
    let mut headers = Vec::new();
    let mut at = log.log_start_offset();
    let mut end = at;
    while at < log.high_watermark() {
        let r = log.read(at, 4000, true).await.unwrap();
        if r.records.is_empty() {
            break;
        }
        for (h, bytes) in r.records.batches() {
            batch::check_integrity(&bytes, usize::MAX).unwrap();
            assert!(
                h.base_offset >= end,
                "batch at {} after {end}",
                h.base_offset
            );
            end = h.last_offset() + 1;
            let plain = batch::records_section(&h, &bytes).unwrap();
            // The same batch uncompressed, to decode with the plain decoder.
            let mut b = bytes[..batch::HEADER_LEN].to_vec();
            b.extend_from_slice(&plain);
            let len = (b.len() - 12) as i32;
            b[8..12].copy_from_slice(&len.to_be_bytes());
            b[21..23].copy_from_slice(&(h.attributes & !7).to_be_bytes());
            for r in batch::records(&b).unwrap() {
                assert!(r.offset <= h.last_offset());
                out.push(Rec {
                    offset: r.offset,
                    key: r.key.map(<[u8]>::to_vec),
                    value: r.value.map(<[u8]>::to_vec),
                });
            }
            headers.push(h);
        }
        at = r.records.last_offset + 1;
    }
    (out, headers)
}

/// Compares record lists, reporting the first difference (not the whole lists).
fn same(got: &[Rec], want: &[Rec], ctx: &str) {
    let show = |r: Option<&Rec>| {
        r.map(|r| {
            let s =
                |b: &Option<Vec<u8>>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
            format!(
                "{} {:?}={:?}",
                r.offset,
                s(&r.key),
                s(&r.value).map(|v| v.chars().take(20).collect::<String>())
            )
        })
    };
    if let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
        panic!(
            "{ctx}: {} records, {} expected; first difference at {i}: got {:?}, expected {:?}",
            got.len(),
            want.len(),
            show(got.get(i)),
            show(want.get(i))
        );
    }
}

/// What compaction must leave: the last record of each key (tombstones included), by offset.
fn latest(all: &[Rec]) -> Vec<Rec> {
    let mut by_key: BTreeMap<Vec<u8>, Rec> = BTreeMap::new();
    for r in all {
        by_key.insert(r.key.clone().unwrap(), r.clone());
    }
    let mut v: Vec<Rec> = by_key.into_values().collect();
    v.sort_by_key(|r| r.offset);
    v
}

/// Appends `n` batches of updates to `keys` keys (a few records each), the last one durable so
/// every rolled segment is sealed. Returns every record written.
async fn updates(log: &Log, n: usize, keys: usize, codec: i16) -> Vec<Rec> {
    let mut all = Vec::new();
    for i in 0..n {
        let recs: Vec<(String, Option<String>)> = (0..3)
            .map(|j| {
                let k = (i * 7 + j * 13) % keys;
                (
                    format!("key-{k}"),
                    Some(format!("value-{i}-{j}-{}", "x".repeat(i % 40))),
                )
            })
            .collect();
        let refs: Vec<(&str, Option<String>)> =
            recs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let opts = if i + 1 == n { DURABLE } else { NON_DURABLE };
        let r = log
            .append(kv_batch(&refs, shards::now_ms(), codec), opts)
            .await
            .unwrap();
        for (j, (k, v)) in recs.into_iter().enumerate() {
            all.push(Rec {
                offset: r.base_offset + j as i64,
                key: Some(k.into_bytes()),
                value: v.map(String::into_bytes),
            });
        }
    }
    all
}

/// Opens the closed log in `dir` twice, first trusting its index files, then without them (the
/// recovery scan): each time it holds `want`, and nothing is set aside as damaged.
async fn reopen_both_ways(dir: &Path, want: &[Rec]) {
    for scan in [false, true] {
        if scan {
            for f in files(dir, ".index") {
                std::fs::remove_file(f).unwrap();
            }
        }
        let log = Log::open(dir, compacted(), no_cache()).await.unwrap();
        same(
            &read_records(&log).await.0,
            want,
            &format!("reopened, scan {scan}"),
        );
        assert!(files(dir, ".corrupt").is_empty(), "nothing set aside");
        log.close().await.unwrap();
    }
}

/// Records of the segments at and after `from` (an offset) in the active segment are not
/// compacted yet: the expected content is the latest per key below it, everything from it on.
fn expected(all: &[Rec], from: i64) -> Vec<Rec> {
    let below: Vec<Rec> = all.iter().filter(|r| r.offset < from).cloned().collect();
    let mut v = latest(&below);
    // A key updated again later may still be in the compacted part: compaction below `from`
    // only knew keys below it.
    v.extend(all.iter().filter(|r| r.offset >= from).cloned());
    v
}

#[test]
fn the_latest_record_per_key_is_kept_at_its_offset_across_restarts() {
    for codec in [0, 4] {
        run(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let log = Log::open(dir.path(), compacted(), cache()).await.unwrap();
            let all = updates(&log, 400, 50, codec).await;
            let (hw, start) = (log.high_watermark(), log.log_start_offset());
            let before = log.stats();
            let s = log.compact_now().await.unwrap();
            assert!(
                s.records_removed > 0 && s.read_bytes > s.written_bytes,
                "{s:?}"
            );
            assert_eq!((log.high_watermark(), log.log_start_offset()), (hw, start));
            let active = *log.segment_base_offsets().last().unwrap();
            assert_eq!(s.cleaned_to, active);
            let want = expected(&all, active);
            same(
                &read_records(&log).await.0,
                &want,
                &format!("codec {codec}"),
            );
            // A second pass has nothing left to remove, and merges the segments the first one
            // shrank (groups are made by size before the pass).
            let again = log.compact_now().await.unwrap();
            assert_eq!(again.records_removed, 0, "{again:?}");
            let after = log.stats();
            assert!(after.segments < before.segments / 2, "{before:?} {after:?}");
            same(
                &read_records(&log).await.0,
                &want,
                &format!("codec {codec}"),
            );
            // Appends go on at the high watermark; a restart reads the same (from the index, then
            // without it: the recovery scan accepts the gaps).
            let more = updates(&log, 5, 50, codec).await;
            assert_eq!(more[0].offset, hw);
            log.close().await.unwrap();
            let mut want = want.clone();
            want.extend(more.iter().cloned());
            reopen_both_ways(dir.path(), &want).await;
        });
    }
}

#[test]
fn a_log_whose_compacted_segments_end_before_the_next_begins_reopens_whole() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), compacted(), cache()).await.unwrap();
        // Few keys over many segments: most segments lose their last batches (and whole
        // segments become empty), leaving gaps at segment ends.
        let all = updates(&log, 400, 5, 0).await;
        let s = log.compact_now().await.unwrap();
        let want = expected(&all, s.cleaned_to);
        same(&read_records(&log).await.0, &want, "after the pass");
        log.close().await.unwrap();
        assert!(
            files(dir.path(), ".corrupt").is_empty(),
            "nothing set aside"
        );
        reopen_both_ways(dir.path(), &want).await;
    });
}

#[test]
fn tombstones_stay_for_delete_retention_then_go() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            delete_retention: Duration::from_millis(300),
            ..compacted()
        };
        let log = Log::open(dir.path(), config, cache()).await.unwrap();
        let mut all = updates(&log, 100, 20, 0).await;
        // Delete keys 0..5, then enough updates of the others to roll past the tombstones.
        let dead: Vec<(String, Option<String>)> =
            (0..5).map(|k| (format!("key-{k}"), None)).collect();
        let refs: Vec<(&str, Option<String>)> =
            dead.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let r = log
            .append(kv_batch(&refs, shards::now_ms(), 0), NON_DURABLE)
            .await
            .unwrap();
        for (j, (k, _)) in dead.iter().enumerate() {
            all.push(Rec {
                offset: r.base_offset + j as i64,
                key: Some(k.clone().into_bytes()),
                value: None,
            });
        }
        for i in 0..60 {
            let k = format!("key-{}", 5 + i % 15);
            let v = Some(format!("later-{i}-{}", "y".repeat(200)));
            let opts = if i == 59 { DURABLE } else { NON_DURABLE };
            let r = log
                .append(kv_batch(&[(&k, v.clone())], shards::now_ms(), 0), opts)
                .await
                .unwrap();
            all.push(Rec {
                offset: r.base_offset,
                key: Some(k.into_bytes()),
                value: v.map(String::into_bytes),
            });
        }
        let active = || async { *log.segment_base_offsets().last().unwrap() };
        log.compact_now().await.unwrap();
        let (recs, _) = read_records(&log).await;
        same(&recs, &expected(&all, active().await), "first pass");
        let tombstones = recs.iter().filter(|r| r.value.is_none()).count();
        assert_eq!(
            tombstones, 5,
            "tombstones are readable within delete.retention.ms"
        );
        // Not due again until the tombstones expire (nothing new is dirty).
        assert_eq!(log.compaction_due(shards::now_ms()), None);
        glommio::timer::sleep(Duration::from_millis(400)).await;
        assert!(
            log.compaction_due(shards::now_ms()).is_some(),
            "due once they expire"
        );
        let s = log.compact_now().await.unwrap();
        assert_eq!(s.tombstones_removed, 5, "{s:?}");
        let (recs, _) = read_records(&log).await;
        assert!(recs.iter().all(|r| r.value.is_some()));
        let want: Vec<Rec> = expected(&all, active().await)
            .into_iter()
            .filter(|r| r.value.is_some())
            .collect();
        same(&recs, &want, "second pass");
        log.close().await.unwrap();
    });
}

#[test]
fn records_without_keys_are_refused_by_compacted_logs_only() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path().join("c"), compacted(), cache())
            .await
            .unwrap();
        let mut b = BatchBuilder::new(1);
        b.push(1, Some(b"k"), Some(b"v"), &[]);
        b.push(1, None, Some(b"no key"), &[]);
        let keyless = Bytes::from(batch::compress_batch(&b.finish(0), 1));
        match log.append(keyless.clone(), NON_DURABLE).await {
            Err(Error::InvalidBatch(InvalidBatch::MissingKey { indexes })) if indexes == [1] => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(log.high_watermark(), 0, "nothing appended");
        let plain = Log::open(dir.path().join("d"), small_config(), cache())
            .await
            .unwrap();
        plain.append(keyless, NON_DURABLE).await.unwrap();
        log.close().await.unwrap();
        plain.close().await.unwrap();
    });
}

#[test]
fn an_idempotent_producers_last_batch_survives_as_an_empty_batch() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), compacted(), cache()).await.unwrap();
        // Producer 7 writes keys a and b; everything it wrote is overwritten later by producer 8.
        let mut seq8 = 0;
        let now = shards::now_ms();
        for i in 0..3 {
            let mut b = BatchBuilder::new(now).producer(7, 0, i * 2);
            b.push(now, Some(b"a"), Some(b"1"), &[]);
            b.push(now, Some(b"b"), Some(b"1"), &[]);
            log.append(Bytes::from(b.finish(0)), NON_DURABLE)
                .await
                .unwrap();
        }
        for i in 0..200 {
            let mut b = BatchBuilder::new(now).producer(8, 0, seq8);
            for k in [&b"a"[..], b"b"] {
                b.push(
                    now,
                    Some(k),
                    Some(format!("{i}{}", "z".repeat(100)).as_bytes()),
                    &[],
                );
            }
            seq8 += 2;
            let opts = if i == 199 { DURABLE } else { NON_DURABLE };
            log.append(Bytes::from(b.finish(0)), opts).await.unwrap();
        }
        log.compact_now().await.unwrap();
        let (recs, headers) = read_records(&log).await;
        let of7: Vec<&BatchHeader> = headers.iter().filter(|h| h.producer_id == 7).collect();
        assert_eq!(of7.len(), 1, "only producer 7's last batch is kept");
        let h = of7[0];
        assert_eq!(
            (
                h.base_offset,
                h.last_offset_delta,
                h.base_sequence,
                h.record_count
            ),
            (4, 1, 4, 0)
        );
        assert!(recs.iter().all(|r| r.offset > 5), "its records are gone");
        // Rebuilding producer state from the log gives producer 7's next sequence number.
        let mut states =
            shards::producers::ProducerStates::new(shards::producers::ProducerConfig::default());
        headers
            .iter()
            .for_each(|h| states.replay(h, shards::now_ms()));
        let mut next = BatchBuilder::new(now).producer(7, 0, 6);
        next.push(now, Some(b"c"), Some(b"1"), &[]);
        let next = BatchHeader::parse(&next.finish(0)).unwrap();
        assert_eq!(
            states.check_and_reserve(&next, shards::now_ms()),
            shards::producers::SequenceCheck::Append
        );
        log.close().await.unwrap();
    });
}

#[test]
fn appends_and_reads_go_on_while_a_pass_runs() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), compacted(), no_cache())
            .await
            .unwrap();
        let mut all = updates(&log, 600, 40, 0).await;
        let compacting = glommio::spawn_local({
            let log = log.clone();
            async move { log.compact_now().await.unwrap() }
        });
        // Readers and a producer meanwhile: every read is whole and intact.
        let reader = glommio::spawn_local({
            let log = log.clone();
            async move {
                for _ in 0..5 {
                    read_records(&log).await;
                }
            }
        });
        // The first append completes while the pass still runs (it has not counted itself yet).
        all.extend(updates(&log, 1, 40, 0).await);
        let overlapped = log.stats().compactions == 0;
        all.extend(updates(&log, 99, 40, 0).await);
        let s = compacting.await;
        reader.await;
        assert!(overlapped, "the pass ended before the first append did");
        assert!(s.records_removed > 0);
        same(
            &read_records(&log).await.0,
            &expected(&all, s.cleaned_to),
            "after the pass",
        );
        log.close().await.unwrap();
    });
}

#[test]
fn a_log_closed_while_a_pass_runs_keeps_every_keys_latest_record() {
    run(|| async {
        // The close lands at different points of the pass: before it reads, while it writes,
        // during its renames, at the swap, or after it.
        for delay_us in [0u64, 100, 300, 1_000, 3_000, 10_000, 30_000] {
            let dir = tempfile::tempdir().unwrap();
            let log = Log::open(dir.path(), compacted(), no_cache())
                .await
                .unwrap();
            let all = updates(&log, 600, 40, 0).await;
            let compacting = glommio::spawn_local({
                let log = log.clone();
                async move { log.compact_now().await.map(|_| ()) }
            });
            glommio::timer::sleep(Duration::from_micros(delay_us)).await;
            log.close().await.unwrap();
            // Done or refused, never a panic.
            let _ = compacting.await;
            let log = Log::open(dir.path(), compacted(), no_cache())
                .await
                .unwrap();
            let got = read_records(&log).await.0;
            for want in latest(&all) {
                assert!(
                    got.contains(&want),
                    "closed after {delay_us} us: {want:?} lost"
                );
            }
            assert!(
                got.iter().all(|r| all.contains(r)),
                "closed after {delay_us} us: a record that was not written"
            );
            log.close().await.unwrap();
        }
    });
}

/// Copies every file of `from` into `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_swap_interrupted_at_any_step_is_finished_or_undone_at_open() {
    run(|| async {
        let root = tempfile::tempdir().unwrap();
        let (orig, done) = (root.path().join("orig"), root.path().join("done"));
        let log = Log::open(&orig, compacted(), cache()).await.unwrap();
        let all = updates(&log, 300, 30, 0).await;
        log.close().await.unwrap();
        // The same log compacted, to take the rewritten segment from.
        copy_dir(&orig, &done);
        // Big segments: one group, so one swap covers every compactable segment.
        let one_group = LogConfig {
            segment_bytes: 1 << 20,
            ..compacted()
        };
        let log = Log::open(&done, one_group, cache()).await.unwrap();
        let s = log.compact_now().await.unwrap();
        let base = log.segment_base_offsets()[0];
        assert_eq!(log.segment_base_offsets()[1], s.cleaned_to, "one group");
        let compacted_recs = read_records(&log).await.0;
        log.close().await.unwrap();
        let rewritten = done.join(format!("{base:020}.log"));
        let covered: Vec<PathBuf> = files(&orig, ".log")
            .into_iter()
            .filter(|p| {
                let o: i64 = p.file_stem().unwrap().to_str().unwrap().parse().unwrap();
                o < s.cleaned_to
            })
            .collect();
        assert!(covered.len() > 2);
        let untouched = read_records_at(&orig).await;
        same(&untouched, &all, "copy");
        // Before the commit point: a half-written `.cleaned` file is removed, nothing changes.
        // After it: the swap file replaces the group, whichever old files were removed already.
        for step in 0..=covered.len() + 1 {
            let dir = root.path().join(format!("step{step}"));
            copy_dir(&orig, &dir);
            if step == 0 {
                std::fs::write(dir.join(format!("{base:020}.log.cleaned")), b"half").unwrap();
                std::fs::write(dir.join(format!("{base:020}.index.cleaned")), b"x").unwrap();
                same(&read_records_at(&dir).await, &all, "undone");
            } else {
                let swap = dir.join(format!("{base:020}.{:020}.swap", s.cleaned_to));
                std::fs::copy(&rewritten, swap).unwrap();
                for p in covered.iter().take(step - 1) {
                    let name = p.file_name().unwrap();
                    std::fs::remove_file(dir.join(name)).unwrap();
                }
                same(
                    &read_records_at(&dir).await,
                    &compacted_recs,
                    &format!("step {step}"),
                );
            }
            let left: Vec<PathBuf> = files(&dir, ".swap")
                .into_iter()
                .chain(files(&dir, ".cleaned"))
                .collect();
            assert!(left.is_empty(), "{left:?}");
        }
    });
}

async fn read_records_at(dir: &Path) -> Vec<Rec> {
    let log = Log::open(dir, compacted(), no_cache()).await.unwrap();
    let recs = read_records(&log).await.0;
    log.close().await.unwrap();
    recs
}

#[test]
fn the_cores_compactor_runs_passes_that_are_due() {
    run(|| async {
        shards::compactor::start();
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), compacted(), cache()).await.unwrap();
        let all = updates(&log, 300, 20, 0).await;
        wait_until(
            Duration::from_secs(20),
            Duration::from_millis(50),
            "no compaction pass",
            || log.stats().compactions > 0,
        )
        .await;
        let (recs, _) = read_records(&log).await;
        same(
            &recs,
            &expected(&all, log.first_dirty_offset()),
            "by the compactor",
        );
        // A log that is not compacted is left alone.
        let plain_dir = tempfile::tempdir().unwrap();
        let plain = Log::open(plain_dir.path(), small_config(), cache())
            .await
            .unwrap();
        updates(&plain, 100, 20, 0).await;
        glommio::timer::sleep(shards::compactor::TICK * 3).await;
        assert_eq!(plain.stats().compactions, 0);
        assert_eq!(plain.compaction_due(shards::now_ms()), None);
        log.close().await.unwrap();
        plain.close().await.unwrap();
    });
}

#[test]
fn a_view_consumer_in_a_gap_before_the_shared_window_is_served_from_it() {
    use shards::view_reader::{ViewConfig, ViewReaders};
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), compacted(), cache()).await.unwrap();
        // Five keys over many batches: compaction removes the first batches, so the log's first
        // batch starts well after its start offset.
        updates(&log, 300, 5, 0).await;
        log.compact_now().await.unwrap();
        let first = read_records(&log).await.1[0].base_offset;
        assert!(
            first > 0 && log.log_start_offset() == 0,
            "first batch at {first}"
        );
        let views = ViewReaders::new(ViewConfig::default());
        let reader = views.reader(&log, 2);
        // The first fetch starts the shared reader; its window begins at the first batch.
        let _ = reader.fetch(0, 0, 1 << 20, true).await.unwrap();
        reader_caught_up(&reader, &log).await;
        // A consumer at offset 0, in the gap before the window, gets the window's batches.
        for shard in 0..2 {
            let read = reader.fetch(shard, 0, 1 << 20, true).await.unwrap();
            assert!(
                !read.records.is_empty(),
                "shard {shard}: nothing at the gap"
            );
            assert_eq!(read.records.first_offset, first, "shard {shard}");
        }
        log.close().await.unwrap();
    });
}
