//! Nanoseconds per lookup in the engine's hash maps, for each key type they hold: std's `HashMap`
//! with SipHash-1-3 (the baseline, measured in the same run), std's map with `FastState`
//! (the same table: what the hasher alone changes) and `shards::FastMap` (hashbrown, foldhash).
//!
//! `cargo bench -p shards --bench hash_maps` (a few seconds). Each key type's map holds about as
//! many entries as it does on a busy core; lookups hit, in a random order, 2^20 per round; each
//! figure is the median of 7 rounds, the variants taking turns within a round.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::fast_map::FastState;
use shards::{CoalesceKey, FastMap};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::hint::black_box;
use std::time::Instant;

const LOOKUPS: usize = 1 << 20;
const ROUNDS: usize = 7;

/// ns per lookup of every key in `order` (indices into `keys`), all present in `map`.
fn time<K: Hash + Eq, S: BuildHasher>(
    map: &hashbrown::HashMap<K, u64, S>,
    keys: &[K],
    order: &[u32],
) -> f64 {
    let start = Instant::now();
    let mut sum = 0u64;
    for &i in order {
        sum = sum.wrapping_add(*map.get(black_box(&keys[i as usize])).unwrap());
    }
    black_box(sum);
    start.elapsed().as_nanos() as f64 / order.len() as f64
}

fn time_std<K: Hash + Eq, S: BuildHasher>(
    map: &HashMap<K, u64, S>,
    keys: &[K],
    order: &[u32],
) -> f64 {
    let start = Instant::now();
    let mut sum = 0u64;
    for &i in order {
        sum = sum.wrapping_add(*map.get(black_box(&keys[i as usize])).unwrap());
    }
    black_box(sum);
    start.elapsed().as_nanos() as f64 / order.len() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn row<K: Hash + Eq + Clone>(name: &str, keys: Vec<K>, rng: &mut StdRng) {
    let order: Vec<u32> = (0..LOOKUPS)
        .map(|_| rng.gen_range(0..keys.len() as u32))
        .collect();
    let sip: HashMap<K, u64> = keys.iter().cloned().zip(0..).collect();
    let std_fold: HashMap<K, u64, FastState> = keys.iter().cloned().zip(0..).collect();
    let fast: FastMap<K, u64> = keys.iter().cloned().zip(0..).collect();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        a.push(time_std(&sip, &keys, &order));
        b.push(time_std(&std_fold, &keys, &order));
        c.push(time(&fast, &keys, &order));
    }
    let (a, b, c) = (median(a), median(b), median(c));
    println!(
        "{name:<34} {:>7} {a:>10.2} {b:>12.2} {c:>9.2} {:>7.2}",
        keys.len(),
        c / a
    );
}

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    println!(
        "{:<34} {:>7} {:>10} {:>12} {:>9} {:>7}",
        "ns per lookup (hit)", "entries", "std SipHash", "std+foldhash", "FastMap", "ratio"
    );
    // The coalescer's `entries` (a few thousand results); `in_flight` holds the same keys.
    let coalesce: Vec<CoalesceKey> = (0..4096)
        .map(|_| CoalesceKey {
            log: rng.gen_range(0..64),
            layout: rng.gen_range(0..2),
            offset: rng.gen_range(0..1 << 40),
            read_committed: rng.gen(),
            max_bytes: [1 << 20, 50 << 20, rng.gen_range(1..1 << 24)][rng.gen_range(0..3)],
            obligatory: rng.gen(),
        })
        .collect();
    row("CoalesceKey (coalescer)", coalesce, &mut rng);
    // The tail cache's `partitions` and the coalescer's `uncut`: one per log on the core.
    row(
        "LogId / u64 (tail cache, uncut)",
        (0..512u64).collect(),
        &mut rng,
    );
    // The view readers: one per (source log, shard count).
    let readers: Vec<(u64, u32)> = (0..64u64).map(|i| (i, 1 << (i % 6))).collect();
    row("(u64, u32) (view readers)", readers, &mut rng);
    // A view reader's catch-up reads: (offset, max_bytes, layout), at most 16.
    let catch_ups: Vec<(i64, usize, u64)> = (0..16)
        .map(|_| (rng.gen_range(0..1 << 40), 1 << 20, 0))
        .collect();
    row("(i64, usize, u64) (catch-ups)", catch_ups, &mut rng);
    // Idempotent producers of one partition.
    let producers: Vec<i64> = (0..1024).map(|_| rng.gen_range(0..1 << 40)).collect();
    row("i64 (producer ids)", producers, &mut rng);
    // Compaction's key map: record keys, client bytes, many of them.
    let record_keys: Vec<Box<[u8]>> = (0..1 << 16)
        .map(|_| format!("user-{:016}", rng.gen::<u64>()).into_bytes().into())
        .collect();
    row("Box<[u8]> 21 B (compaction keys)", record_keys, &mut rng);
}
