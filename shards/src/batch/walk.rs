//! A batch's records section checked record by record against its header, from memory or from a
//! decompressing stream, within a decompression budget.

use crate::batch::decode::{records_error, records_section, Reader};
use crate::batch::header::{BatchHeader, HEADER_LEN};
use crate::error::InvalidBatch;

/// What checking a batch's records decompressed: how many bytes, and (when asked to keep them) the
/// records themselves; and the largest timestamp delta of its records.
pub(super) struct Decompressed {
    pub(super) bytes: usize,
    pub(super) kept: Option<Vec<u8>>,
    pub(super) max_timestamp_delta: i64,
}

/// Smallest encoded record: its length, attributes, timestamp delta, offset delta, key length, value
/// length and header count, one byte each.
const MIN_RECORD_LEN: usize = 7;

/// Checks the records section of a whole batch (`b` is exactly the batch) against its header, as
/// Kafka's broker does: exactly `recordCount` records, each one whole within the section, its fields
/// adding up to its declared length, its offset delta equal to its position (so `lastOffsetDelta`,
/// already checked to be `recordCount - 1`, is the last record's), and nothing after the last one.
/// A compressed section is decompressed as a stream (nothing kept) up to
/// [`crate::compression::MAX_DECOMPRESSED`] bytes.
pub fn check_records(h: &BatchHeader, b: &[u8]) -> Result<(), InvalidBatch> {
    check_records_within(h, b, crate::compression::MAX_DECOMPRESSED, false).map(|_| ())
}

/// [`check_records`], decompressing at most `limit` bytes; returns how many it decompressed, and
/// with `keep` what (a compressed section is then decompressed whole and walked in memory).
pub(super) fn check_records_within(
    h: &BatchHeader,
    b: &[u8],
    limit: usize,
    keep: bool,
) -> Result<Decompressed, InvalidBatch> {
    let section = b.get(HEADER_LEN..).unwrap_or_default();
    // A header that claims more records than the bytes could hold is refused before any work.
    let room = if h.compression() == 0 {
        section.len()
    } else {
        limit
    };
    if (h.record_count.max(0) as usize).saturating_mul(MIN_RECORD_LEN) > room {
        return Err(records_error(
            h,
            format!("{room} bytes of records cannot hold that many"),
        ));
    }
    if keep && h.compression() != 0 {
        let plain = crate::compression::decompress_within(h.compression(), section, limit)?;
        let max_timestamp_delta = walk_records(h, &mut Reader { b: &plain, at: 0 })?;
        return Ok(Decompressed {
            bytes: plain.len(),
            kept: Some(plain.into_owned()),
            max_timestamp_delta,
        });
    }
    match crate::compression::stream_decoder(h.compression(), section)? {
        Some(decoder) => {
            let mut s = Stream::new(decoder, limit);
            let max_timestamp_delta = walk_records(h, &mut s)?;
            Ok(Decompressed {
                bytes: s.at,
                kept: None,
                max_timestamp_delta,
            })
        }
        // Uncompressed, or snappy, whose blocks carry their decompressed length (bounded by the
        // codec's ratio): walked in memory.
        None => {
            let plain = records_section(h, b)?;
            let used = if h.compression() == 0 { 0 } else { plain.len() };
            if used > limit {
                return Err(InvalidBatch::Decompress(
                    "decompressed records exceed the limit".into(),
                ));
            }
            let max_timestamp_delta = walk_records(h, &mut Reader { b: &plain, at: 0 })?;
            Ok(Decompressed {
                bytes: used,
                kept: None,
                max_timestamp_delta,
            })
        }
    }
}

/// Bytes of a records section, read one record field at a time: a slice ([`Reader`]) or a
/// decompressing stream ([`Stream`]).
trait RecordSource {
    fn byte(&mut self) -> Result<Option<u8>, InvalidBatch>;
    /// Skips `n` bytes; `Ok(false)` if the section ends first.
    fn skip(&mut self, n: usize) -> Result<bool, InvalidBatch>;
    /// Bytes consumed so far.
    fn position(&self) -> usize;
}

impl RecordSource for Reader<'_> {
    fn byte(&mut self) -> Result<Option<u8>, InvalidBatch> {
        let b = self.b.get(self.at).copied();
        self.at += b.is_some() as usize;
        Ok(b)
    }
    fn skip(&mut self, n: usize) -> Result<bool, InvalidBatch> {
        Ok(self.take(n).is_some())
    }
    fn position(&self) -> usize {
        self.at
    }
}

/// A decompressing reader consumed without keeping what it yields, refused past `limit` bytes.
struct Stream<R> {
    inner: std::io::BufReader<R>,
    at: usize,
    limit: usize,
}

impl<R: std::io::Read> Stream<R> {
    fn new(inner: R, limit: usize) -> Self {
        Self {
            inner: std::io::BufReader::with_capacity(16 << 10, inner),
            at: 0,
            limit,
        }
    }
}

fn decompress_error(e: std::io::Error) -> InvalidBatch {
    InvalidBatch::Decompress(e.to_string())
}

impl<R: std::io::Read> RecordSource for Stream<R> {
    fn byte(&mut self) -> Result<Option<u8>, InvalidBatch> {
        use std::io::BufRead;
        let buf = self.inner.fill_buf().map_err(decompress_error)?;
        let Some(&b) = buf.first() else {
            return Ok(None);
        };
        // Reaching the limit is fine; going past it is not.
        if self.at >= self.limit {
            return Err(InvalidBatch::Decompress(
                "decompressed records exceed the limit".into(),
            ));
        }
        self.inner.consume(1);
        self.at += 1;
        Ok(Some(b))
    }
    fn skip(&mut self, mut n: usize) -> Result<bool, InvalidBatch> {
        use std::io::BufRead;
        if self.at.saturating_add(n) > self.limit {
            return Err(InvalidBatch::Decompress(
                "decompressed records exceed the limit".into(),
            ));
        }
        while n > 0 {
            let buf = self.inner.fill_buf().map_err(decompress_error)?;
            if buf.is_empty() {
                return Ok(false);
            }
            let k = buf.len().min(n);
            self.inner.consume(k);
            self.at += k;
            n -= k;
        }
        Ok(true)
    }
    fn position(&self) -> usize {
        self.at
    }
}

fn read_varlong(s: &mut impl RecordSource) -> Result<Option<i64>, InvalidBatch> {
    read_var(s, 10)
}

/// A zigzag varint of at most `max_bytes` bytes (5 for an int, 10 for a long: Java's readers refuse
/// longer encodings, so a batch holding one would poison the partition for Java consumers); `None`
/// if the section ends first or the encoding is longer.
fn read_var(s: &mut impl RecordSource, max_bytes: usize) -> Result<Option<i64>, InvalidBatch> {
    let mut v = 0u64;
    for shift in (0..7 * max_bytes).step_by(7) {
        let Some(byte) = s.byte()? else {
            return Ok(None);
        };
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Ok(Some((v >> 1) as i64 ^ -((v & 1) as i64)));
        }
    }
    Ok(None)
}

fn read_varint(s: &mut impl RecordSource) -> Result<Option<i32>, InvalidBatch> {
    Ok(read_var(s, 5)?.and_then(|v| i32::try_from(v).ok()))
}

/// Walks exactly `h.record_count` records of `s` and checks that nothing follows them; returns the
/// largest timestamp delta among them.
fn walk_records<S: RecordSource>(h: &BatchHeader, s: &mut S) -> Result<i64, InvalidBatch> {
    let bad = |why: String| records_error(h, why);
    let mut max_delta = i64::MIN;
    for i in 0..h.record_count {
        let short = || {
            bad(format!(
                "record {i} is cut short or has an over-long varint"
            ))
        };
        let len = read_varint(s)?.ok_or_else(short)?;
        let len = usize::try_from(len).map_err(|_| bad(format!("record {i} has length {len}")))?;
        let start = s.position();
        let end = start.saturating_add(len);
        let too_long = || bad(format!("record {i} is longer than its length {len}"));
        // Skips a field of `n` bytes, which must end within the record.
        let field = |s: &mut S, n: usize| -> Result<(), InvalidBatch> {
            if s.position().saturating_add(n) > end {
                return Err(too_long());
            }
            if !s.skip(n)? {
                return Err(short());
            }
            Ok(())
        };
        s.byte()?.ok_or_else(short)?; // attributes
        let ts_delta = read_varlong(s)?.ok_or_else(short)?;
        // A record timestamp beyond i64 cannot be read back (timestamp lookups would fail on it).
        if h.base_timestamp.checked_add(ts_delta).is_none() {
            return Err(bad(format!("record {i} has timestamp delta {ts_delta}")));
        }
        max_delta = max_delta.max(ts_delta);
        let delta = read_varint(s)?.ok_or_else(short)?;
        if delta != i {
            return Err(bad(format!("record {i} has offset delta {delta}")));
        }
        // Key and value: a negative length is null, as Kafka reads it.
        for _ in 0..2 {
            let n = read_varint(s)?.ok_or_else(short)?;
            field(s, n.max(0) as usize)?;
        }
        let headers = read_varint(s)?.ok_or_else(short)?;
        if headers < 0 {
            return Err(bad(format!("record {i} has {headers} headers")));
        }
        for _ in 0..headers {
            // Each header takes at least two bytes: a long list is stopped by the record's length.
            if s.position() >= end {
                return Err(too_long());
            }
            let k = read_varint(s)?.ok_or_else(short)?;
            if k < 0 {
                return Err(bad(format!("record {i} has a header key of length {k}")));
            }
            field(s, k as usize)?;
            let v = read_varint(s)?.ok_or_else(short)?;
            field(s, v.max(0) as usize)?;
        }
        if s.position() != end {
            return Err(bad(format!(
                "record {i} holds {} bytes, not its length {len}",
                s.position() - start
            )));
        }
    }
    if s.byte()?.is_some() {
        return Err(bad("bytes follow the last record".into()));
    }
    Ok(max_delta.max(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build::put_varlong;
    use crate::batch::header::CRC_START;
    use crate::batch::tests::sample;
    use crate::batch::{compress_batch, records, validate, write_header, BatchBuilder};

    /// `b` with its record count and last offset delta rewritten and its CRC recomputed.
    fn lie(mut b: Vec<u8>, count: i32, last_offset_delta: i32) -> Vec<u8> {
        b[23..27].copy_from_slice(&last_offset_delta.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[CRC_START..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn is_records_error(r: Result<BatchHeader, InvalidBatch>) -> bool {
        matches!(r, Err(InvalidBatch::Records { .. }))
    }

    fn put_varlong_bytes(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        put_varlong(&mut out, v);
        out
    }

    #[test]
    fn records_must_match_the_header() {
        let one = {
            let mut b = BatchBuilder::new(0);
            b.push(0, None, Some(b"x"), &[]);
            b.finish(0)
        };
        // The header of a one-record batch claiming 2^31-1 records, CRC and all consistent.
        assert!(is_records_error(validate(
            &lie(one.clone(), i32::MAX, i32::MAX - 1),
            usize::MAX
        )));
        assert!(is_records_error(validate(&lie(sample(), 4, 3), usize::MAX)));
        assert!(is_records_error(validate(&lie(sample(), 2, 1), usize::MAX)));
        // Every record length from 0 to 127 but the true one is caught, with the CRC recomputed.
        let true_len = one[HEADER_LEN];
        for len in (0u8..0x80).filter(|&l| l != true_len) {
            let mut b = one.clone();
            b[HEADER_LEN] = len;
            let b = lie(b, 1, 0);
            assert!(
                is_records_error(validate(&b, usize::MAX)),
                "record length {len} accepted"
            );
        }
        // A record whose timestamp overflows i64 (found by the fuzzer on the read side).
        let mut late = BatchBuilder::new(100);
        late.push(i64::MAX, None, Some(b"t"), &[]);
        let mut late = late.finish(0);
        // The builder's delta is i64::MAX - 100; make it i64::MAX (a varlong of the same width).
        let at = HEADER_LEN + 2; // record length (1 byte), attributes
        assert_eq!(late[at..at + 10], put_varlong_bytes(i64::MAX - 100)[..]);
        late[at..at + 10].copy_from_slice(&put_varlong_bytes(i64::MAX));
        let late = lie(late, 1, 0);
        assert!(is_records_error(validate(&late, usize::MAX)));
        // Already in a log (written before this check), it decodes as malformed, never panics.
        assert!(records(&late).is_err());
        // A record length in an over-long (6-byte) varint: Java's readers refuse it.
        let long = {
            let mut b = one.clone();
            let first = b[HEADER_LEN];
            assert!(first < 0x80);
            b.splice(
                HEADER_LEN..HEADER_LEN + 1,
                [first | 0x80, 0x80, 0x80, 0x80, 0x80, 0x00],
            );
            let len = i32::from_be_bytes(b[8..12].try_into().unwrap()) + 5;
            b[8..12].copy_from_slice(&len.to_be_bytes());
            lie(b, 1, 0)
        };
        assert!(is_records_error(validate(&long, usize::MAX)));
        // A record whose offset delta is not its position.
        let mut gap = BatchBuilder::new(0);
        gap.push(0, None, Some(b"a"), &[]);
        gap.push_with_delta(5, 0, None, Some(b"b"), &[]);
        let gap = lie(gap.finish(0), 2, 1);
        assert!(is_records_error(validate(&gap, usize::MAX)));
        // A header list longer than the record.
        let mut headers = sample();
        let at = HEADER_LEN + 1 + 1 + 1 + 1 + 3 + 3; // first record: len, attrs, ts, delta, key, value
        assert_eq!(headers[at], 2, "one header, zigzag-encoded");
        headers[at] = 0x7e;
        assert!(is_records_error(validate(&lie(headers, 3, 2), usize::MAX)));
    }

    #[test]
    fn compressed_records_are_counted_too() {
        for codec in 1..=4 {
            let packed = compress_batch(&sample(), codec);
            let h = validate(&packed, usize::MAX).unwrap();
            assert_eq!((h.compression(), h.record_count), (codec as u8, 3));
            for (count, delta) in [(4, 3), (2, 1), (i32::MAX, i32::MAX - 1)] {
                assert!(
                    is_records_error(validate(&lie(packed.clone(), count, delta), usize::MAX)),
                    "codec {codec}: count {count} accepted"
                );
            }
            // Garbage instead of compressed data.
            let mut junk = packed.clone();
            junk.truncate(HEADER_LEN);
            junk.extend_from_slice(&[0xa5; 40]);
            let mut h = BatchHeader::parse(&packed).unwrap();
            h.batch_length = 0;
            write_header(&mut junk, &h);
            assert!(validate(&junk, usize::MAX).is_err(), "codec {codec}: junk");
        }
    }
}
