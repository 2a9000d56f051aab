//! Interpretation of one source batch for sharded views: decompress it once, route each record to
//! its shard by key (Kafka's default partitioner; null keys go to every shard), and encode one
//! uncompressed batch per shard.
//!
//! Every shard batch covers the source batch's whole offset range (same base offset and
//! `lastOffsetDelta`), so offsets stay the source's and a shard with no records in the range still
//! gets a batch (with zero records, as Kafka writes after compaction) that moves its consumers past
//! it. Records are copied verbatim: their offset and timestamp deltas are relative to the batch base,
//! which the shard batch keeps, so keys, values, headers and timestamps are exactly the source's.

use crate::batch::{self, BatchHeader, Reader, ATTR_TIMESTAMP_TYPE, HEADER_LEN};
use crate::error::InvalidBatch;
use crate::partitioner::shard_of;
use std::borrow::Cow;
use std::io::Read;

/// Largest decompressed records section accepted (a guard against decompression bombs).
pub const MAX_DECOMPRESSED: usize = 256 << 20;

const XERIAL_MAGIC: &[u8] = &[0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];

fn bad(why: impl Into<String>) -> InvalidBatch {
    InvalidBatch::Decompress(why.into())
}

/// The records section of a whole batch, decompressed if needed.
pub fn records_section<'a>(
    h: &BatchHeader,
    batch: &'a [u8],
) -> Result<Cow<'a, [u8]>, InvalidBatch> {
    let body = batch
        .get(HEADER_LEN..h.total_len())
        .ok_or(InvalidBatch::Truncated {
            needed: h.total_len(),
            available: batch.len(),
        })?;
    let read_all = |mut r: Box<dyn Read + '_>| -> Result<Cow<'a, [u8]>, InvalidBatch> {
        let mut out = Vec::new();
        r.by_ref()
            .take(MAX_DECOMPRESSED as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| bad(e.to_string()))?;
        if out.len() > MAX_DECOMPRESSED {
            return Err(bad("decompressed records exceed the limit"));
        }
        Ok(Cow::Owned(out))
    };
    match h.compression() {
        0 => Ok(Cow::Borrowed(body)),
        1 => read_all(Box::new(flate2::read::GzDecoder::new(body))),
        2 => snappy(body).map(Cow::Owned),
        3 => read_all(Box::new(lz4_flex::frame::FrameDecoder::new(body))),
        4 => read_all(Box::new(
            zstd::stream::read::Decoder::new(body).map_err(|e| bad(e.to_string()))?,
        )),
        c => Err(bad(format!("unknown compression codec {c}"))),
    }
}

/// Kafka's snappy: the Java client's xerial framing (magic, versions, then length-prefixed raw
/// blocks), or a raw snappy block as some clients write.
fn snappy(body: &[u8]) -> Result<Vec<u8>, InvalidBatch> {
    let mut dec = snap::raw::Decoder::new();
    let mut raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), InvalidBatch> {
        let n = snap::raw::decompress_len(block).map_err(|e| bad(e.to_string()))?;
        if out.len() + n > MAX_DECOMPRESSED {
            return Err(bad("decompressed records exceed the limit"));
        }
        let at = out.len();
        out.resize(at + n, 0);
        dec.decompress(block, &mut out[at..])
            .map_err(|e| bad(e.to_string()))?;
        Ok(())
    };
    let mut out = Vec::new();
    if !body.starts_with(XERIAL_MAGIC) {
        raw(body, &mut out)?;
        return Ok(out);
    }
    let mut at = XERIAL_MAGIC.len() + 8; // version and compatible version
    while at < body.len() {
        let len = body
            .get(at..at + 4)
            .ok_or_else(|| bad("truncated snappy block length"))?;
        let len = u32::from_be_bytes(len.try_into().unwrap()) as usize;
        let block = body
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| bad("truncated snappy block"))?;
        raw(block, &mut out)?;
        at += 4 + len;
    }
    Ok(out)
}

/// `plain` (an uncompressed batch) with its records section compressed by `codec` (1 gzip, 2 snappy
/// in the Java client's xerial framing, 3 lz4 frame, 4 zstd), as a producer would send it.
pub fn compress_batch(plain: &[u8], codec: i16) -> Vec<u8> {
    use std::io::Write;
    let body = &plain[HEADER_LEN..];
    let packed = match codec {
        1 => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(body).expect("in-memory write");
            e.finish().expect("in-memory write")
        }
        2 => {
            let block = snap::raw::Encoder::new()
                .compress_vec(body)
                .expect("snappy block");
            let mut v = XERIAL_MAGIC.to_vec();
            v.extend_from_slice(&1i32.to_be_bytes());
            v.extend_from_slice(&1i32.to_be_bytes());
            v.extend_from_slice(&(block.len() as u32).to_be_bytes());
            v.extend_from_slice(&block);
            v
        }
        3 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(body).expect("in-memory write");
            e.finish().expect("in-memory write")
        }
        4 => zstd::stream::encode_all(body, 3).expect("in-memory write"),
        _ => return plain.to_vec(),
    };
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&packed);
    let h = BatchHeader::parse(plain).expect("a whole batch");
    batch::write_header(
        &mut out,
        &BatchHeader {
            attributes: (h.attributes & !0x07) | codec,
            ..h
        },
    );
    out
}

/// One source batch split into `shards` batches: every shard's (`only` None; index = shard), or
/// only shard `i`'s (`only` Some(i); what a fetch that reads for itself needs, the other shards'
/// batches are not built).
pub fn split_batch(
    source: &[u8],
    shards: u32,
    only: Option<u32>,
) -> Result<Vec<Vec<u8>>, InvalidBatch> {
    assert!(shards > 0 && only.is_none_or(|i| i < shards));
    let h = BatchHeader::parse(source)?;
    let records = records_section(&h, source)?;
    let outputs = if only.is_some() { 1 } else { shards as usize };
    let mut bodies: Vec<Vec<u8>> = (0..outputs).map(|_| vec![0u8; HEADER_LEN]).collect();
    let mut counts = vec![0i32; outputs];
    let mut r = Reader { b: &records, at: 0 };
    let malformed = || InvalidBatch::Decompress("malformed record".into());
    for _ in 0..h.record_count {
        let start = r.at;
        let len = usize::try_from(r.varint().ok_or_else(malformed)?).map_err(|_| malformed())?;
        let body_start = r.at;
        let end = body_start
            .checked_add(len)
            .filter(|&e| e <= records.len())
            .ok_or_else(malformed)?;
        r.take(1).ok_or_else(malformed)?; // attributes
        r.varlong().ok_or_else(malformed)?; // timestamp delta
        r.varint().ok_or_else(malformed)?; // offset delta
        let key = r.bytes().ok_or_else(malformed)?;
        let whole = &records[start..end];
        match (shard_of(key, shards), only) {
            (Some(s), Some(o)) if s != o => {}
            (Some(s), o) => {
                let i = if o.is_some() { 0 } else { s as usize };
                bodies[i].extend_from_slice(whole);
                counts[i] += 1;
            }
            (None, _) => {
                for (b, c) in bodies.iter_mut().zip(counts.iter_mut()) {
                    b.extend_from_slice(whole);
                    *c += 1;
                }
            }
        }
        r.at = end;
    }
    for (b, count) in bodies.iter_mut().zip(counts) {
        let header = BatchHeader {
            attributes: h.attributes & ATTR_TIMESTAMP_TYPE,
            record_count: count,
            ..h
        };
        batch::write_header(b, &header);
    }
    Ok(bodies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{records, BatchBuilder};

    /// A source batch with keyed and null-key records, base offset 100.
    fn source() -> Vec<u8> {
        let mut b = BatchBuilder::new(5_000);
        for i in 0..40 {
            let key = format!("key-{i}");
            let key = (i % 9 != 0).then_some(key.as_bytes());
            let value = format!("value-{i}");
            b.push(
                5_000 + i,
                key,
                Some(value.as_bytes()),
                &[(b"h", Some(b"x"))],
            );
        }
        b.finish(100)
    }

    fn compressed(codec: i16) -> Vec<u8> {
        compress_batch(&source(), codec)
    }

    fn check_split(source: &[u8], n: u32) {
        let plain = self::source();
        let all = records(&plain).unwrap();
        let shards = split_batch(source, n, None).unwrap();
        assert_eq!(shards.len(), n as usize);
        for (i, b) in shards.iter().enumerate() {
            let alone = split_batch(source, n, Some(i as u32)).unwrap();
            assert_eq!(alone, std::slice::from_ref(b), "shard {i} alone");
        }
        let mut seen = 0;
        for (i, b) in shards.iter().enumerate() {
            let h = batch::validate(b, usize::MAX).ok();
            let h = h.unwrap_or_else(|| BatchHeader::parse(b).unwrap()); // empty batches fail validate
            assert_eq!(
                (h.base_offset, h.last_offset_delta, h.compression()),
                (100, 39, 0)
            );
            assert_eq!(crc32c::crc32c(&b[21..]), h.crc, "shard {i}: CRC");
            let got = records(b).unwrap();
            let want: Vec<_> = all
                .iter()
                .filter(|r| shard_of(r.key, n).is_none_or(|s| s == i as u32))
                .cloned()
                .collect();
            assert_eq!(got, want, "shard {i} of {n}");
            seen += got.iter().filter(|r| r.key.is_some()).count();
        }
        assert_eq!(
            seen,
            all.iter().filter(|r| r.key.is_some()).count(),
            "every keyed record in one shard"
        );
    }

    #[test]
    fn uncompressed_batches_split_exactly() {
        for n in [1, 2, 4, 7, 64] {
            check_split(&source(), n);
        }
    }

    #[test]
    fn every_codec_is_decompressed_once_and_split() {
        for codec in 1..=4 {
            check_split(&compressed(codec), 4);
            check_split(&compressed(codec), 7);
        }
    }

    #[test]
    fn a_shard_without_records_still_gets_a_batch_over_the_range() {
        let mut b = BatchBuilder::new(0);
        b.push(0, Some(b"abc"), Some(b"v"), &[]);
        let shards = split_batch(&b.finish(7), 4, None).unwrap();
        let mine = shard_of(Some(b"abc"), 4).unwrap() as usize;
        for (i, s) in shards.iter().enumerate() {
            let h = BatchHeader::parse(s).unwrap();
            assert_eq!((h.base_offset, h.last_offset()), (7, 7));
            assert_eq!(h.record_count, (i == mine) as i32);
        }
    }

    #[test]
    fn damaged_compressed_data_is_an_error_not_a_panic() {
        for codec in 1..=4 {
            let mut b = compressed(codec);
            let at = b.len() / 2 + 3;
            b[at] ^= 0xff;
            b.truncate(b.len() - 2);
            let _ = split_batch(&b, 4, None);
        }
    }
}
