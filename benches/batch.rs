//! What checking a produced batch costs: `batch::validate` (header, CRC-32C and the record-by-record
//! walk of the records section, decompressing compressed ones) against the baseline measured in the
//! same run, `batch::check_integrity` (header and CRC-32C only: what the broker checked before the
//! records walk). Printed per record size and codec, in microseconds per MiB of records (before
//! compression) and as the walk's share on top of the baseline. The values are a short repeating
//! pattern, so they compress far better than real data: the compressed rows show the cost of
//! decompressing, per MiB decompressed. The `text` rows have values of words drawn at random from a
//! 64-word vocabulary, like `shoal bench`'s (about 0.4x with lz4, as text logs): short matches, the
//! decoders' slow case.
//!
//! `cargo bench --bench batch` (about 10 s); `-- --quick` for a smoke run.

use shards::batch::{self, BatchBuilder};
use std::hint::black_box;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// A batch of about 1 MiB of records of `record` value bytes, compressed with `codec`; and its
/// uncompressed size.
fn batch_of(record: usize, codec: i16, text: bool) -> (Vec<u8>, usize) {
    let mut b = BatchBuilder::new(1_700_000_000_000);
    let mut value: Vec<u8> = (0..record).map(|i| (i * 31 % 251) as u8).collect();
    let vocabulary: Vec<String> = (0..64u32)
        .map(|w| {
            format!(
                "{}{}",
                ["ka", "lo", "mi", "ne"][w as usize % 4],
                w * 37 % 101
            )
        })
        .collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut n = 0;
    while n < MIB {
        if text {
            value.clear();
            while value.len() < record {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                value.extend_from_slice(vocabulary[(x % 64) as usize].as_bytes());
            }
            value.truncate(record);
        }
        let key = format!("key-{n}");
        b.push(1_700_000_000_000, Some(key.as_bytes()), Some(&value), &[]);
        n += record + key.len() + 8;
    }
    let plain = b.finish(0);
    (batch::compress_batch(&plain, codec), plain.len())
}

/// Microseconds per call of `f`, the best of `rounds` rounds of at least `min` each.
fn time(rounds: usize, min: Duration, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        let mut calls = 0u32;
        while start.elapsed() < min {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    best
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, min) = if quick {
        (1, Duration::from_millis(20))
    } else {
        (5, Duration::from_millis(200))
    };
    println!("batch check cost, per MiB of records (best of {rounds} rounds)");
    println!(
        "{:>8} {:>6} {:>5} {:>10} {:>18} {:>16} {:>10}",
        "record", "codec", "text", "sent KiB", "crc+header us/MiB", "validate us/MiB", "walk adds"
    );
    for (record, codec, name, text) in [
        (10, 0, "none", false),
        (100, 0, "none", false),
        (1024, 0, "none", false),
        (1024, 3, "lz4", false),
        (1024, 4, "zstd", false),
        (1024, 1, "gzip", false),
        (1024, 2, "snappy", false),
        (1024, 3, "lz4", true),
        (1024, 4, "zstd", true),
        (1024, 2, "snappy", true),
    ] {
        let (b, plain) = batch_of(record, codec, text);
        let per_mib = MIB as f64 / plain as f64;
        let base = time(rounds, min, || {
            black_box(batch::check_integrity(black_box(&b), usize::MAX).unwrap());
        }) * per_mib;
        let full = time(rounds, min, || {
            black_box(batch::validate(black_box(&b), usize::MAX).unwrap());
        }) * per_mib;
        println!(
            "{record:>8} {name:>6} {:>5} {:>10} {base:>18.1} {full:>16.1} {:>9.0}%",
            if text { "yes" } else { "no" },
            b.len() / 1024,
            (full - base) / base * 100.0
        );
    }
}
