//! Kafka's default partitioner: murmur2 of the key bytes, made positive with `& 0x7fffffff`, modulo
//! the number of partitions. Sharded views use it to decide which shard a record belongs to, so a
//! view shard holds exactly what a Kafka producer would have sent to that partition.

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ len as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The shard (partition) of `key` among `n`; `None` for a null key, which belongs to every shard.
pub fn shard_of(key: Option<&[u8]>, n: u32) -> Option<u32> {
    key.map(|k| (murmur2(k) & 0x7fff_ffff) as u32 % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_kafkas_murmur2() {
        // Vectors from Kafka's UtilsTest, also checked against kafka-python's implementation.
        let cases: [(&[u8], i32); 7] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
            (b"", 275646681),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{:?}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn shards() {
        assert_eq!(shard_of(None, 4), None);
        assert_eq!(shard_of(Some(b"abc"), 4), Some(479470107 % 4));
        assert_eq!(
            shard_of(Some(b"21"), 7),
            Some(((-973932308i32) & 0x7fff_ffff) as u32 % 7)
        );
    }
}
