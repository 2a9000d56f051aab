//! A randomized test: long seeded sequences of append / read / restart / crash / cut-the-tail run
//! against the real log and against a plain in-memory model, and every read must agree.
//! Reproduce a failure with `SHOAL_MODEL_SEED=<seed> cargo test -p shards --test model`.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::{AppendOptions, Error, Log, LogConfig, TailCache};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The model: every batch the log should hold, with its final bytes.
#[derive(Default)]
struct Model {
    batches: Vec<(i64, i64, Vec<u8>)>, // (base offset, last offset, bytes)
    start: usize,                      // index of the first batch still in the log
}

impl Model {
    fn high_watermark(&self) -> i64 {
        self.batches.last().map_or(0, |b| b.1 + 1)
    }
    fn log_start(&self) -> i64 {
        self.batches
            .get(self.start)
            .map_or(self.high_watermark(), |b| b.0)
    }
    /// What a read must return: whole batches from the one holding `offset`, within `max_bytes`
    /// (at least one when obligatory).
    fn read(&self, offset: i64, max_bytes: usize, obligatory: bool) -> Result<Vec<u8>, ()> {
        if offset < self.log_start() || offset > self.high_watermark() {
            return Err(());
        }
        let mut out = Vec::new();
        for (_, last, bytes) in &self.batches[self.start..] {
            if *last < offset {
                continue;
            }
            if out.len() + bytes.len() > max_bytes && !(obligatory && out.is_empty()) {
                break;
            }
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }
}

fn config(rng: &mut StdRng) -> LogConfig {
    LogConfig {
        segment_bytes: rng.gen_range(4096..16384),
        index_interval_bytes: rng.gen_range(64..2048),
        flush_interval: None,
        retention_age: None,
        ..LogConfig::default()
    }
}

fn last_segment(dir: &Path) -> (i64, std::path::PathBuf) {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    let p = v.pop().unwrap();
    let base = p.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    (base, p)
}

async fn run_seed(seed: u64, ops: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let new_cache = |rng: &mut StdRng| -> Rc<TailCache> {
        // Sometimes no cache at all, sometimes a tiny one that evicts constantly.
        Rc::new(TailCache::new(
            *[0usize, 8192, 1 << 20][..]
                .get(rng.gen_range(0..3))
                .unwrap(),
            4096,
        ))
    };
    let mut cfg = config(&mut rng);
    let mut log = Log::open(dir.path(), cfg.clone(), new_cache(&mut rng))
        .await
        .unwrap();
    let mut model = Model::default();
    for op in 0..ops {
        let ctx = format!("seed {seed} op {op}");
        match rng.gen_range(0..100) {
            0..=44 => {
                // Append one to three batches as one blob.
                let n = rng.gen_range(1..=3);
                let mut blob = Vec::new();
                let mut parts = Vec::new();
                for _ in 0..n {
                    let b = batch(
                        rng.gen_range(1..6),
                        rng.gen_range(0..600),
                        rng.gen_range(0..1_000_000),
                    );
                    parts.push(b.clone());
                    blob.extend_from_slice(&b);
                }
                let durable = rng.gen_bool(0.3);
                let r = log
                    .append(blob.into(), AppendOptions { durable })
                    .await
                    .unwrap();
                assert_eq!(r.base_offset, model.high_watermark(), "{ctx}");
                let mut at = r.base_offset;
                for b in parts {
                    let h = shards::batch::BatchHeader::parse(&b).unwrap();
                    model
                        .batches
                        .push((at, at + h.last_offset_delta as i64, with_offset(&b, at)));
                    at += h.offset_count();
                }
                assert_eq!(r.high_watermark, model.high_watermark(), "{ctx}");
            }
            45..=84 => {
                let hw = model.high_watermark();
                let lo = model.log_start();
                let offset = if rng.gen_bool(0.05) {
                    hw + rng.gen_range(1..5)
                } else {
                    rng.gen_range(lo..=hw)
                };
                // Often exactly the size of the next k batches (or one byte less): the edges of max_bytes.
                let max_bytes = if rng.gen_bool(0.4) {
                    let k = rng.gen_range(1..5);
                    let exact: usize = model
                        .batches
                        .iter()
                        .filter(|b| b.1 >= offset)
                        .take(k)
                        .map(|b| b.2.len())
                        .sum();
                    exact.saturating_sub(rng.gen_range(0..2))
                } else {
                    rng.gen_range(0..5000)
                };
                let obligatory = rng.gen_bool(0.5);
                let got = log.read(offset, max_bytes, obligatory).await;
                match (model.read(offset, max_bytes, obligatory), got) {
                    (Ok(want), Ok(got)) => {
                        assert_eq!(got.high_watermark, hw, "{ctx}");
                        assert!(
                            got.records.to_vec() == want,
                            "{ctx}: read({offset}, {max_bytes}, {obligatory}) differs"
                        );
                    }
                    (Err(()), Err(Error::OffsetOutOfRange { .. })) => {}
                    (want, got) => panic!("{ctx}: model {want:?} vs log {got:?}"),
                }
            }
            85..=89 => {
                // Clean restart, maybe with new settings.
                log.close().await.unwrap();
                if rng.gen_bool(0.5) {
                    cfg = config(&mut rng);
                }
                log = Log::open(dir.path(), cfg.clone(), new_cache(&mut rng))
                    .await
                    .unwrap();
                assert_eq!(log.high_watermark(), model.high_watermark(), "{ctx}");
            }
            90..=94 => {
                // The process dies: nothing closed, nothing flushed by us.
                drop(log);
                log = Log::open(dir.path(), cfg.clone(), new_cache(&mut rng))
                    .await
                    .unwrap();
                assert_eq!(log.high_watermark(), model.high_watermark(), "{ctx}");
            }
            _ => {
                // The process dies and the tail of the last segment is damaged: cut at a random byte.
                drop(log);
                let (base, path) = last_segment(dir.path());
                let len = std::fs::metadata(&path).unwrap().len();
                let cut = rng.gen_range(0..=len);
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(cut)
                    .unwrap();
                // Batches of the last segment survive if they end at or before the cut.
                let mut pos = 0u64;
                let first = model
                    .batches
                    .iter()
                    .position(|b| b.0 >= base)
                    .unwrap_or(model.batches.len());
                let mut keep = first;
                for b in &model.batches[first..] {
                    pos += b.2.len() as u64;
                    if pos > cut {
                        break;
                    }
                    keep += 1;
                }
                model.batches.truncate(keep);
                log = Log::open(dir.path(), cfg.clone(), new_cache(&mut rng))
                    .await
                    .unwrap();
                assert_eq!(
                    log.high_watermark(),
                    model.high_watermark(),
                    "{ctx}: after cutting at {cut}"
                );
            }
        }
        assert_eq!(log.log_start_offset(), model.log_start(), "{ctx}");
    }
    // Finally the whole log reads back equal to the model.
    let all = log.read(0, usize::MAX, true).await.unwrap();
    assert_eq!(
        all.records.to_vec(),
        model.read(0, usize::MAX, true).unwrap(),
        "seed {seed}: full read"
    );
    log.close().await.unwrap();
}

#[test]
fn log_agrees_with_a_model_under_random_operations() {
    let seeds: Vec<u64> = match std::env::var("SHOAL_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("SHOAL_MODEL_SEED is a number")],
        Err(_) => (1..=6).collect(),
    };
    for seed in seeds {
        // Printed with the output of a failure (a timeout's message cannot name the seed).
        println!("model: seed {seed}");
        run(move || async move {
            let start = Instant::now();
            run_seed(seed, 1500).await;
            assert!(
                start.elapsed() < Duration::from_secs(50),
                "seed {seed} took too long"
            );
        });
    }
}
