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
