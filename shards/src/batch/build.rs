//! Writing batches: the builder of uncompressed batches, compressing a built one, and rebuilding
//! one with only the records compaction keeps.

use crate::batch::decode::RecordHeader;
use crate::batch::header::{
    write_header, BatchHeader, ATTR_COMPRESSION, ATTR_TRANSACTIONAL, HEADER_LEN,
};

/// Builds uncompressed RecordBatch v2 batches. Used by the view reader to encode shard batches, by the
/// load generator's producers, and by tests.
#[derive(Debug)]
pub struct BatchBuilder {
    buf: Vec<u8>,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
    last_offset_delta: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    attributes: i16,
}

impl BatchBuilder {
    /// A builder whose records' timestamps are relative to `base_timestamp` (milliseconds).
    pub fn new(base_timestamp: i64) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.resize(HEADER_LEN, 0);
        Self {
            buf,
            base_timestamp,
            max_timestamp: base_timestamp,
            count: 0,
            last_offset_delta: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            attributes: 0,
        }
    }

    /// Marks the batch as idempotent: the producer id, epoch and first sequence number.
    pub fn producer(mut self, id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Marks the batch as part of its producer's transaction (with [`BatchBuilder::producer`]).
    pub fn transactional(mut self) -> Self {
        self.attributes |= ATTR_TRANSACTIONAL;
        self
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn len(&self) -> usize {
        self.count as usize
    }
    /// Bytes the finished batch will have.
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// Appends a record with the next offset delta.
    pub fn push(
        &mut self,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[RecordHeader<'_>],
    ) {
        let delta = self.count;
        self.push_with_delta(delta, timestamp, key, value, headers);
    }

    /// Appends a record with an explicit offset delta (deltas must increase; gaps are allowed, as in a
    /// compacted or filtered batch).
    pub fn push_with_delta(
        &mut self,
        offset_delta: i32,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[RecordHeader<'_>],
    ) {
        let mut body =
            Vec::with_capacity(16 + key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len));
        body.push(0); // record attributes
        put_varlong(&mut body, timestamp - self.base_timestamp);
        put_varint(&mut body, offset_delta);
        put_bytes(&mut body, key);
        put_bytes(&mut body, value);
        put_varint(&mut body, headers.len() as i32);
        for (k, v) in headers {
            put_bytes(&mut body, Some(k));
            put_bytes(&mut body, *v);
        }
        put_varint(&mut self.buf, body.len() as i32);
        self.buf.extend_from_slice(&body);
        self.max_timestamp = self.max_timestamp.max(timestamp);
        self.last_offset_delta = offset_delta;
        self.count += 1;
    }

    /// Finishes the batch with the given base offset (the log rewrites it on append anyway).
    pub fn finish(mut self, base_offset: i64) -> Vec<u8> {
        assert!(self.count > 0, "a RecordBatch holds at least one record");
        let header = BatchHeader {
            base_offset,
            batch_length: 0, // computed by write_header
            magic: 2,
            crc: 0,
            attributes: self.attributes,
            last_offset_delta: self.last_offset_delta,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_timestamp,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            record_count: self.count,
        };
        write_header(&mut self.buf, &header);
        self.buf
    }
}

/// `plain` (an uncompressed batch) with its records section compressed by `codec` (1 gzip, 2 snappy,
/// 3 lz4, 4 zstd), as a producer would send it; unchanged for 0 or an unknown codec.
pub fn compress_batch(plain: &[u8], codec: i16) -> Vec<u8> {
    let Some(packed) = crate::compression::compress(codec, &plain[HEADER_LEN..]) else {
        return plain.to_vec();
    };
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&packed);
    let h = BatchHeader::parse(plain).expect("a whole batch");
    write_header(
        &mut out,
        &BatchHeader {
            attributes: (h.attributes & !ATTR_COMPRESSION) | codec,
            ..h
        },
    );
    out
}

/// The batch `h` rewritten to hold only the records `keep` (spans of its plain records section
/// `plain`, in order), as compaction leaves it: the same base offset and last offset delta (so the
/// next batch still follows on, and an idempotent producer's sequence numbers are still known),
/// the same producer fields, timestamps and codec. With nothing kept it is an empty batch (no
/// records, uncompressed), which Kafka's cleaner leaves to keep a producer's last sequence number.
pub fn rebuild(h: &BatchHeader, plain: &[u8], keep: &[std::ops::Range<usize>]) -> Vec<u8> {
    let mut section = Vec::with_capacity(keep.iter().map(|r| r.len()).sum());
    for r in keep {
        section.extend_from_slice(&plain[r.clone()]);
    }
    let mut attributes = h.attributes;
    if keep.is_empty() {
        attributes &= !ATTR_COMPRESSION;
    } else if let Some(packed) = crate::compression::compress(h.compression() as i16, &section) {
        section = packed;
    }
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&section);
    write_header(
        &mut out,
        &BatchHeader {
            attributes,
            record_count: keep.len() as i32,
            ..*h
        },
    );
    out
}

fn put_varint(out: &mut Vec<u8>, v: i32) {
    put_uvarint(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}
pub(super) fn put_varlong(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}
fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::batch::tests::sample;
    use crate::batch::{records, validate};

    #[test]
    fn built_batch_validates_and_decodes() {
        let b = sample();
        let h = validate(&b, usize::MAX).unwrap();
        assert_eq!(
            (h.record_count, h.last_offset_delta, h.max_timestamp),
            (3, 2, 1_005)
        );
        let recs = records(&b).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].key, Some(&b"k1"[..]));
        assert_eq!(recs[0].headers, vec![(&b"h"[..], Some(&b"x"[..]))]);
        assert_eq!(
            (recs[1].key, recs[1].offset, recs[1].timestamp),
            (None, 1, 1_005)
        );
        assert_eq!((recs[2].key, recs[2].value), (Some(&b""[..]), None));
    }
}

/// Batches rewritten by [`recompress_all`], back to back, and their headers.
pub type Rewritten = (Vec<u8>, Vec<BatchHeader>);

/// `blob` (validated batches back to back, `headers` theirs) with every batch of records whose
/// codec is not `codec` (0: uncompressed) rewritten in it, at `level` where the codec has one: the
/// same header fields but the codec, with a new length and CRC. Control batches stay as they are.
/// `None` when every batch already is in `codec`; `TooLarge` when a rewritten batch is larger
/// than `max_batch_bytes`, as Kafka refuses it.
pub fn recompress_all(
    blob: &[u8],
    headers: &[BatchHeader],
    codec: i16,
    level: Option<i32>,
    max_batch_bytes: usize,
) -> Result<Option<Rewritten>, crate::InvalidBatch> {
    let differs = |h: &BatchHeader| !h.is_control() && h.compression() as i16 != codec;
    if !headers.iter().any(differs) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(blob.len());
    let mut rewritten = Vec::with_capacity(headers.len());
    let mut at = 0;
    for h in headers {
        let bytes = blob
            .get(at..at + h.total_len())
            .ok_or(crate::InvalidBatch::Truncated {
                needed: h.total_len(),
                available: blob.len().saturating_sub(at),
            })?;
        at += h.total_len();
        if !differs(h) {
            out.extend_from_slice(bytes);
            rewritten.push(*h);
            continue;
        }
        let plain = crate::batch::records_section(h, bytes)?;
        let packed = crate::compression::compress_at(codec, &plain, level);
        let start = out.len();
        out.resize(start + HEADER_LEN, 0);
        out.extend_from_slice(packed.as_deref().unwrap_or(&plain));
        let size = out.len() - start;
        if size > max_batch_bytes {
            return Err(crate::InvalidBatch::TooLarge {
                size,
                limit: max_batch_bytes,
            });
        }
        let attributes =
            (h.attributes & !ATTR_COMPRESSION) | if packed.is_some() { codec } else { 0 };
        write_header(&mut out[start..], &BatchHeader { attributes, ..*h });
        rewritten.push(BatchHeader::parse(&out[start..])?);
    }
    Ok(Some((out, rewritten)))
}

#[cfg(test)]
mod recompress_tests {
    use super::*;

    fn plain_batch(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        for i in 0..n {
            let v = format!("value-{i}").repeat(20);
            b.push(1_000 + i as i64, Some(b"k"), Some(v.as_bytes()), &[]);
        }
        b.finish(0)
    }

    fn values(batch: &[u8]) -> Vec<Vec<u8>> {
        let h = BatchHeader::parse(batch).unwrap();
        let plain = crate::batch::records_section(&h, batch).unwrap();
        crate::batch::section_records(&h, &plain)
            .unwrap()
            .into_iter()
            .map(|r| r.value.unwrap().to_vec())
            .collect()
    }

    #[test]
    fn batches_in_another_codec_are_rewritten_and_keep_their_records() {
        let plain = plain_batch(50);
        let gzip = compress_batch(&plain_batch(3), 1);
        let blob = [plain.clone(), gzip.clone()].concat();
        let headers = crate::batch::validate_all(&blob, usize::MAX).unwrap();
        let (out, rewritten) = recompress_all(&blob, &headers, 4, Some(3), usize::MAX)
            .unwrap()
            .expect("both batches differ from zstd");
        assert_eq!(rewritten.len(), 2);
        assert!(rewritten.iter().all(|h| h.compression() == 4));
        let again =
            crate::batch::validate_all(&out, usize::MAX).expect("valid batches, CRCs right");
        assert_eq!(again, rewritten);
        let first = &out[..rewritten[0].total_len()];
        assert!(first.len() < plain.len(), "zstd made it smaller");
        assert_eq!(values(first), values(&plain));
        assert_eq!(values(&out[rewritten[0].total_len()..]), values(&gzip));
        for field in [
            |h: &BatchHeader| h.max_timestamp,
            |h: &BatchHeader| h.base_timestamp,
            |h: &BatchHeader| h.last_offset_delta as i64,
        ] {
            assert_eq!(field(&rewritten[0]), field(&headers[0]));
        }

        // Already in the codec: nothing to do. Back to uncompressed: the plain batch again.
        assert!(recompress_all(&out, &rewritten, 4, None, usize::MAX)
            .unwrap()
            .is_none());
        let (back, _) = recompress_all(&out, &rewritten, 0, None, usize::MAX)
            .unwrap()
            .unwrap();
        assert_eq!(&back[..plain.len()], &plain[..]);
        // A rewrite larger than the limit is refused.
        let limit = plain.len() - 1;
        let e = recompress_all(&out, &rewritten, 0, None, limit).unwrap_err();
        assert!(matches!(e, crate::InvalidBatch::TooLarge { .. }), "{e}");
    }
}
