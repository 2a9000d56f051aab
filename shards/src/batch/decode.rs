//! Reading records back out of a batch: its records section (decompressed), the records one by
//! one, and where each lies in the section.

use crate::batch::header::{BatchHeader, HEADER_LEN};
use crate::error::InvalidBatch;
use std::borrow::Cow;

/// A header of a record: key and value bytes.
pub type RecordHeader<'a> = (&'a [u8], Option<&'a [u8]>);

/// One decoded record of an uncompressed batch, borrowing from the batch bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<RecordHeader<'a>>,
}

/// Decodes the records of one uncompressed batch (`b` is exactly the batch). Malformed record bytes end
/// the iteration with an error instead of panicking: the bytes come from the wire or the disk.
pub fn records(b: &[u8]) -> Result<Vec<Record<'_>>, InvalidBatch> {
    let h = BatchHeader::parse(b)?;
    if h.compression() != 0 {
        return Err(InvalidBatch::Unsupported);
    }
    let total = h.total_len().min(b.len());
    section_records(&h, &b[HEADER_LEN..total]).map_err(|_| InvalidBatch::Truncated {
        needed: total,
        available: b.len(),
    })
}

/// Decodes the records of a plain records section (`plain`: the section of a batch with header
/// `h`, decompressed, as [`records_section`] gives it). Malformed bytes give an error, never a
/// panic.
pub fn section_records<'a>(
    h: &BatchHeader,
    plain: &'a [u8],
) -> Result<Vec<Record<'a>>, InvalidBatch> {
    let mut r = Reader { b: plain, at: 0 };
    let malformed = || records_error(h, "a record is malformed".to_string());
    let mut out = Vec::with_capacity((h.record_count.max(0) as usize).min(plain.len() / 7 + 1));
    for _ in 0..h.record_count {
        let len = r.varint().ok_or_else(malformed)?;
        let end =
            r.at.checked_add(usize::try_from(len).map_err(|_| malformed())?)
                .ok_or_else(malformed)?;
        if end > r.b.len() {
            return Err(malformed());
        }
        let _attributes = r.take(1).ok_or_else(malformed)?;
        let ts_delta = r.varlong().ok_or_else(malformed)?;
        let off_delta = r.varint().ok_or_else(malformed)?;
        let key = r.bytes().ok_or_else(malformed)?;
        let value = r.bytes().ok_or_else(malformed)?;
        let n_headers = r.varint().ok_or_else(malformed)?;
        let mut headers = Vec::new();
        for _ in 0..n_headers.max(0) {
            let k = r.bytes().ok_or_else(malformed)?.ok_or_else(malformed)?;
            let v = r.bytes().ok_or_else(malformed)?;
            headers.push((k, v));
        }
        if r.at != end {
            return Err(malformed());
        }
        // Deltas beyond i64 (a batch whose CRC is right and whose records are not) make it malformed.
        out.push(Record {
            offset: h
                .base_offset
                .checked_add(off_delta as i64)
                .ok_or_else(malformed)?,
            timestamp: if h.is_log_append_time() {
                h.max_timestamp
            } else {
                h.base_timestamp
                    .checked_add(ts_delta)
                    .ok_or_else(malformed)?
            },
            key,
            value,
            headers,
        });
    }
    Ok(out)
}

/// Where one record of a plain (uncompressed) records section lies, as compaction needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSpan {
    /// The whole record, its length prefix included: copied as is into a rewritten batch, so it
    /// keeps its offset and timestamp deltas.
    pub span: std::ops::Range<usize>,
    pub offset_delta: i32,
    /// The key's bytes; `None` for a record without a key.
    pub key: Option<std::ops::Range<usize>>,
    /// A null value: a delete marker for the key.
    pub tombstone: bool,
}

/// Locates the records of a plain records section (`plain`: the section of a batch with header
/// `h`, decompressed). Malformed bytes give an error, never a panic: they come from disk.
pub fn record_spans(h: &BatchHeader, plain: &[u8]) -> Result<Vec<RecordSpan>, InvalidBatch> {
    let bad = |i: i32| records_error(h, format!("record {i} is malformed"));
    let mut r = Reader { b: plain, at: 0 };
    let mut out = Vec::with_capacity((h.record_count.max(0) as usize).min(plain.len() / 7 + 1));
    for i in 0..h.record_count.max(0) {
        let start = r.at;
        let len = r
            .varint()
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| bad(i))?;
        let body = r.at;
        let end = body
            .checked_add(len)
            .filter(|&e| e <= plain.len())
            .ok_or_else(|| bad(i))?;
        r.take(1).ok_or_else(|| bad(i))?; // attributes
        r.varlong().ok_or_else(|| bad(i))?; // timestamp delta
        let offset_delta = r.varint().ok_or_else(|| bad(i))?;
        let key_len = r.varint().ok_or_else(|| bad(i))?;
        let key = match usize::try_from(key_len) {
            Ok(n) => {
                let from = r.at;
                r.take(n).ok_or_else(|| bad(i))?;
                Some(from..from + n)
            }
            Err(_) => None,
        };
        let tombstone = r.varint().ok_or_else(|| bad(i))? < 0;
        if r.at > end {
            return Err(bad(i));
        }
        r.at = end;
        out.push(RecordSpan {
            span: start..end,
            offset_delta,
            key,
            tombstone,
        });
    }
    Ok(out)
}

/// The records section of a whole batch, decompressed if needed (borrowed when it is not).
pub fn records_section<'a>(
    h: &BatchHeader,
    batch: &'a [u8],
) -> Result<Cow<'a, [u8]>, InvalidBatch> {
    crate::compression::decompress(h.compression(), records_body(h, batch)?)
}

/// The records section of batch `h` (`batch`), decompressed and appended to `out` (at most
/// [`crate::compression::MAX_DECOMPRESSED`] bytes); on error nothing is appended.
pub fn decompress_records_into(
    h: &BatchHeader,
    batch: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), InvalidBatch> {
    crate::compression::decompress_append(
        h.compression(),
        records_body(h, batch)?,
        out,
        crate::compression::MAX_DECOMPRESSED,
    )
}

/// The records section of batch `h` (`batch`) as it lies there (compressed or not).
fn records_body<'a>(h: &BatchHeader, batch: &'a [u8]) -> Result<&'a [u8], InvalidBatch> {
    batch
        .get(HEADER_LEN..h.total_len())
        .ok_or(InvalidBatch::Truncated {
            needed: h.total_len(),
            available: batch.len(),
        })
}

/// The error for records that do not match their batch's header `h`, saying `why`.
pub(super) fn records_error(h: &BatchHeader, why: String) -> InvalidBatch {
    InvalidBatch::Records {
        count: h.record_count,
        why,
    }
}

/// Reads a records section field by field from `at` (Kafka's zig-zag varints); `None` past the end.
#[derive(Debug)]
pub struct Reader<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = *self.b.get(self.at)?;
            self.at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    pub fn varlong(&mut self) -> Option<i64> {
        let u = self.uvarint()?;
        Some((u >> 1) as i64 ^ -((u & 1) as i64))
    }
    pub fn varint(&mut self) -> Option<i32> {
        i32::try_from(self.varlong()?).ok()
    }
    pub fn bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len < 0 {
            return Some(None);
        }
        self.take(len as usize).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::tests::sample;

    #[test]
    fn garbage_record_bytes_do_not_panic() {
        let mut b = sample();
        for i in HEADER_LEN..b.len() {
            b[i] = 0xff;
            let _ = records(&b);
        }
    }
}
