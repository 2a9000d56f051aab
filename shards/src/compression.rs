//! Kafka's record compression codecs (attributes bits 0-2: 1 gzip, 2 snappy, 3 lz4, 4 zstd) over a
//! records section, with a bound on what decompression may produce (a guard against decompression
//! bombs). Batch-level helpers are in [`crate::batch`].

use crate::error::InvalidBatch;
use std::borrow::Cow;
use std::io::Read;

/// Largest decompressed records section accepted.
pub const MAX_DECOMPRESSED: usize = 256 << 20;

const XERIAL_MAGIC: &[u8] = &[0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];

fn bad(why: impl Into<String>) -> InvalidBatch {
    InvalidBatch::Decompress(why.into())
}

/// A decompressing reader over `body` for the stream codecs (gzip, lz4, zstd); `None` for
/// uncompressed (0) and snappy (2), whose blocks are decompressed whole by [`decompress`].
pub fn stream_decoder<'a>(
    codec: u8,
    body: &'a [u8],
) -> Result<Option<Box<dyn Read + 'a>>, InvalidBatch> {
    Ok(Some(match codec {
        0 | 2 => return Ok(None),
        1 => Box::new(flate2::read::GzDecoder::new(body)),
        3 => Box::new(crate::lz4_frame::Lz4FrameReader::new(body)),
        4 => Box::new(zstd::stream::read::Decoder::new(body).map_err(|e| bad(e.to_string()))?),
        c => return Err(bad(format!("unknown compression codec {c}"))),
    }))
}

/// `body` decompressed with `codec` (borrowed when uncompressed), at most [`MAX_DECOMPRESSED`].
pub fn decompress(codec: u8, body: &[u8]) -> Result<Cow<'_, [u8]>, InvalidBatch> {
    decompress_within(codec, body, MAX_DECOMPRESSED)
}

/// [`decompress`], at most `limit` bytes.
pub fn decompress_within(
    codec: u8,
    body: &[u8],
    limit: usize,
) -> Result<Cow<'_, [u8]>, InvalidBatch> {
    let too_big = || bad("decompressed records exceed the limit");
    if codec == 0 {
        return Ok(Cow::Borrowed(body));
    }
    if codec == 2 {
        let out = snappy(body)?;
        return match out.len() > limit {
            true => Err(too_big()),
            false => Ok(Cow::Owned(out)),
        };
    }
    if codec == 3 {
        let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(1 << 20).min(limit));
        crate::lz4_frame::Lz4FrameReader::new(body)
            .read_all(&mut out, limit)
            .map_err(|e| bad(e.to_string()))?;
        return Ok(Cow::Owned(out));
    }
    let mut r = stream_decoder(codec, body)?.expect("a stream codec");
    let mut out = Vec::new();
    r.by_ref()
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| bad(e.to_string()))?;
    if out.len() > limit {
        return Err(too_big());
    }
    Ok(Cow::Owned(out))
}

/// [`decompress_within`], appending to `out` (at most `limit` bytes appended); on error nothing is
/// appended. lz4 appends each block to `out` as it decodes it (no output buffer of its own per call).
pub fn decompress_append(
    codec: u8,
    body: &[u8],
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<(), InvalidBatch> {
    let start = out.len();
    let appended = if codec == 3 {
        crate::lz4_frame::Lz4FrameReader::new(body)
            .read_all(out, start.saturating_add(limit))
            .map_err(|e| bad(e.to_string()))
    } else {
        decompress_within(codec, body, limit).map(|d| out.extend_from_slice(&d))
    };
    if appended.is_err() {
        out.truncate(start);
    }
    appended
}

/// Kafka's snappy: the Java client's xerial framing (magic, versions, then length-prefixed raw
/// blocks), or a raw snappy block as some clients write.
fn snappy(body: &[u8]) -> Result<Vec<u8>, InvalidBatch> {
    let mut dec = snap::raw::Decoder::new();
    let mut raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), InvalidBatch> {
        let n = snap::raw::decompress_len(block).map_err(|e| bad(e.to_string()))?;
        // The length is the block's claim: snappy expands at most about 22x (a 3-byte copy of 64
        // bytes), so a larger claim is a lie, refused before allocating for it.
        if n > block.len().saturating_mul(24).saturating_add(64) {
            return Err(bad(format!(
                "a {}-byte snappy block claims {n} bytes",
                block.len()
            )));
        }
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

/// `body` compressed with `codec` (snappy in the Java client's xerial framing, lz4 as a frame), as a
/// producer would send it; `None` for an unknown codec or 0.
pub fn compress(codec: i16, body: &[u8]) -> Option<Vec<u8>> {
    compress_at(codec, body, None)
}

/// [`compress`] at `level` where the codec has levels (gzip 1-9, zstd; out of range: clamped;
/// `None` or -1: the codec's default). LZ4 is written at its one level.
pub fn compress_at(codec: i16, body: &[u8], level: Option<i32>) -> Option<Vec<u8>> {
    use std::io::Write;
    let level = level.filter(|&l| l != -1);
    Some(match codec {
        1 => {
            let level = level.map_or(flate2::Compression::default(), |l| {
                flate2::Compression::new(l.clamp(1, 9) as u32)
            });
            let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
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
        4 => {
            let level = level.map_or(3, |l| l.clamp(-131_072, 22));
            zstd::stream::encode_all(body, level).expect("in-memory write")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_lying_snappy_blocks() {
        let body: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect();
        for codec in 1..=4 {
            let packed = compress(codec, &body).unwrap();
            assert_eq!(
                decompress(codec as u8, &packed).unwrap()[..],
                body[..],
                "{codec}"
            );
        }
        assert!(compress(0, &body).is_none());
        // A raw snappy block claiming 200 MiB in a few bytes is refused before allocating.
        let mut lie = Vec::new();
        let mut n = 200u64 << 20;
        while n >= 0x80 {
            lie.push((n as u8) | 0x80);
            n >>= 7;
        }
        lie.push(n as u8);
        lie.extend_from_slice(&[0u8; 16]);
        let e = decompress(2, &lie).unwrap_err();
        assert!(format!("{e}").contains("claims"), "{e}");
    }
}
