//! Kafka RecordBatch v2: reading and checking the 61-byte header, assigning offsets, and building batches.
//!
//! Layout (all big-endian), offsets into the batch:
//! ```text
//!  0 baseOffset i64        8 batchLength i32      12 partitionLeaderEpoch i32   16 magic i8
//! 17 crc u32              21 attributes i16      23 lastOffsetDelta i32        27 baseTimestamp i64
//! 35 maxTimestamp i64     43 producerId i64      51 producerEpoch i16          53 baseSequence i32
//! 57 recordCount i32      61 records...
//! ```
//! The CRC-32C covers bytes 21.. (attributes to the end), so the base offset and the leader epoch can be
//! rewritten without touching it; stamping LogAppendTime changes covered bytes and recomputes it.

use crate::error::InvalidBatch;
use bytes::Bytes;
use std::borrow::Cow;

pub const HEADER_LEN: usize = 61;
/// `baseOffset` + `batchLength`: the bytes not counted by `batchLength`.
pub const LOG_OVERHEAD: usize = 12;
const CRC_START: usize = 21;
/// The timestamp-type bit of the attributes (set: LogAppendTime).
pub const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
/// The transactional bit: the batch belongs to its producer's open transaction.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
/// The control bit: the batch is a marker (commit or abort), written by the broker, not a producer.
pub const ATTR_CONTROL: i16 = 0x20;
const ATTR_COMPRESSION: i16 = 0x07;

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// The fields of a batch header that the log and its readers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes after the first 12 (`baseOffset` and `batchLength` themselves).
    pub batch_length: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `b` without checking anything but that 61 bytes are there.
    pub fn parse(b: &[u8]) -> Result<Self, InvalidBatch> {
        if b.len() < HEADER_LEN {
            return Err(InvalidBatch::Truncated {
                needed: HEADER_LEN,
                available: b.len(),
            });
        }
        Ok(Self {
            base_offset: be_i64(b, 0),
            batch_length: be_i32(b, 8),
            magic: b[16] as i8,
            crc: u32::from_be_bytes(b[17..21].try_into().unwrap()),
            attributes: be_i16(b, 21),
            last_offset_delta: be_i32(b, 23),
            base_timestamp: be_i64(b, 27),
            max_timestamp: be_i64(b, 35),
            producer_id: be_i64(b, 43),
            producer_epoch: be_i16(b, 51),
            base_sequence: be_i32(b, 53),
            record_count: be_i32(b, 57),
        })
    }

    /// Whole size of the batch on disk and on the wire.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + self.batch_length.max(0) as usize
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    /// Offsets the batch occupies (`lastOffsetDelta + 1`; equals the record count for producer batches).
    pub fn offset_count(&self) -> i64 {
        self.last_offset_delta as i64 + 1
    }
    pub fn compression(&self) -> u8 {
        (self.attributes & ATTR_COMPRESSION) as u8
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_TIMESTAMP_TYPE != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }
}

/// Reads the length of the batch starting at `b` from its first 12 bytes, if they are there.
pub fn peek_total_len(b: &[u8]) -> Option<usize> {
    (b.len() >= LOG_OVERHEAD).then(|| LOG_OVERHEAD + be_i32(b, 8).max(0) as usize)
}

/// Checks that the batch at the start of `b` is whole and intact: length, magic and CRC. This is all
/// recovery may ask of a batch already in the log (the broker may have stamped LogAppendTime, so a
/// producer's timestamp rules need not hold any more).
pub fn check_integrity(b: &[u8], max_batch_bytes: usize) -> Result<BatchHeader, InvalidBatch> {
    if b.len() < LOG_OVERHEAD {
        return Err(InvalidBatch::Truncated {
            needed: LOG_OVERHEAD,
            available: b.len(),
        });
    }
    let batch_length = be_i32(b, 8);
    if batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Err(InvalidBatch::LengthTooSmall(batch_length));
    }
    let total = LOG_OVERHEAD + batch_length as usize;
    if total > max_batch_bytes {
        return Err(InvalidBatch::TooLarge {
            size: total,
            limit: max_batch_bytes,
        });
    }
    if b.len() < total {
        return Err(InvalidBatch::Truncated {
            needed: total,
            available: b.len(),
        });
    }
    let h = BatchHeader::parse(b)?;
    if h.magic != 2 {
        return Err(InvalidBatch::Magic(h.magic));
    }
    let computed = crc32c::crc32c(&b[CRC_START..total]);
    if computed != h.crc {
        return Err(InvalidBatch::Crc {
            stored: h.crc,
            computed,
        });
    }
    Ok(h)
}

/// Checks one whole batch from a producer at the start of `b` (which may hold more after it) and
/// returns its header: integrity, then everything a producer could get wrong (counts, timestamps).
pub fn validate(b: &[u8], max_batch_bytes: usize) -> Result<BatchHeader, InvalidBatch> {
    validate_within(
        b,
        max_batch_bytes,
        crate::compression::MAX_DECOMPRESSED,
        false,
    )
    .map(|(h, _)| h)
}

/// [`validate`], decompressing at most `decompress_budget` bytes; also returns how many it did,
/// and with `keep` the decompressed records of a compressed batch.
fn validate_within(
    b: &[u8],
    max_batch_bytes: usize,
    decompress_budget: usize,
    keep: bool,
) -> Result<(BatchHeader, Decompressed), InvalidBatch> {
    let h = check_integrity(b, max_batch_bytes)?;
    if h.record_count < 1 {
        return Err(InvalidBatch::RecordCount(h.record_count));
    }
    // Producers number records densely; a gap would also make offsets unbounded within a segment.
    if h.last_offset_delta != h.record_count - 1 {
        return Err(InvalidBatch::OffsetDelta {
            last_offset_delta: h.last_offset_delta,
            records: h.record_count,
        });
    }
    let ts_ok = |t: i64| t >= -1;
    if !ts_ok(h.base_timestamp)
        || !ts_ok(h.max_timestamp)
        || (h.base_timestamp >= 0 && h.max_timestamp >= 0 && h.max_timestamp < h.base_timestamp)
    {
        return Err(InvalidBatch::Timestamp {
            base: h.base_timestamp,
            max: h.max_timestamp,
        });
    }
    let used = check_records_within(&h, &b[..h.total_len()], decompress_budget, keep)?;
    Ok((h, used))
}

/// What checking a batch's records decompressed: how many bytes, and (when asked to keep them) the
/// records themselves.
struct Decompressed {
    bytes: usize,
    kept: Option<Vec<u8>>,
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
fn check_records_within(
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
        walk_records(h, &mut Reader { b: &plain, at: 0 })?;
        return Ok(Decompressed {
            bytes: plain.len(),
            kept: Some(plain.into_owned()),
        });
    }
    match crate::compression::stream_decoder(h.compression(), section)? {
        Some(decoder) => {
            let mut s = Stream::new(decoder, limit);
            walk_records(h, &mut s)?;
            Ok(Decompressed {
                bytes: s.at,
                kept: None,
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
            walk_records(h, &mut Reader { b: &plain, at: 0 })?;
            Ok(Decompressed {
                bytes: used,
                kept: None,
            })
        }
    }
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

/// The records section of a whole batch, decompressed if needed (borrowed when it is not).
pub fn records_section<'a>(
    h: &BatchHeader,
    batch: &'a [u8],
) -> Result<Cow<'a, [u8]>, InvalidBatch> {
    crate::compression::decompress(h.compression(), records_body(h, batch)?)
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

fn records_error(h: &BatchHeader, why: String) -> InvalidBatch {
    InvalidBatch::Records {
        count: h.record_count,
        why,
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

/// Walks exactly `h.record_count` records of `s` and checks that nothing follows them.
fn walk_records<S: RecordSource>(h: &BatchHeader, s: &mut S) -> Result<(), InvalidBatch> {
    let bad = |why: String| records_error(h, why);
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
    Ok(())
}

/// Checks a whole records blob (one or more batches back to back, as in a Produce request) and
/// returns each batch's header. Either every batch is valid or the blob is refused.
pub fn validate_all(blob: &[u8], max_batch_bytes: usize) -> Result<Vec<BatchHeader>, InvalidBatch> {
    validate_all_keeping(blob, max_batch_bytes, false).map(|(headers, _)| headers)
}

/// [`validate_all`]; with `keep`, also the decompressed records of each compressed batch (one entry
/// per batch, `None` for an uncompressed one; empty without `keep`), which checking them produced
/// anyway.
pub fn validate_all_keeping(
    blob: &[u8],
    max_batch_bytes: usize,
    keep: bool,
) -> Result<(Vec<BatchHeader>, Vec<Option<Bytes>>), InvalidBatch> {
    if blob.is_empty() {
        return Err(InvalidBatch::Empty);
    }
    let mut headers = Vec::new();
    let mut kept = Vec::new();
    let mut at = 0;
    // One decompression budget for all the batches of the blob, not one per batch: a request of
    // many small decompression bombs must not cost the core many times the limit.
    let mut budget = crate::compression::MAX_DECOMPRESSED;
    while at < blob.len() {
        let (h, used) = validate_within(&blob[at..], max_batch_bytes, budget, keep)?;
        budget -= used.bytes;
        // Control batches are the broker's own (markers); a transactional batch needs the
        // producer id and sequence numbers of an idempotent one.
        if h.is_control() || h.is_transactional() && (h.producer_id < 0 || h.base_sequence < 0) {
            return Err(InvalidBatch::Unsupported);
        }
        at += h.total_len();
        if keep {
            kept.push(used.kept.map(Bytes::from));
        }
        headers.push(h);
    }
    Ok((headers, kept))
}

/// Checks batches another broker already took and numbered (a mirror of its log: shoal edge):
/// framing, size and CRC-32C of each, and base offsets that rise with no overlap. Their records are
/// not checked against Kafka's producer rules, since compaction legitimately breaks them (fewer
/// records than `lastOffsetDelta + 1`, empty batches), and control and transactional batches are
/// kept as they are.
pub fn validate_mirrored(
    blob: &[u8],
    max_batch_bytes: usize,
) -> Result<Vec<BatchHeader>, InvalidBatch> {
    if blob.is_empty() {
        return Err(InvalidBatch::Empty);
    }
    let mut headers: Vec<BatchHeader> = Vec::new();
    let mut at = 0;
    while at < blob.len() {
        let h = check_integrity(&blob[at..], max_batch_bytes)?;
        if h.last_offset_delta < 0 {
            return Err(InvalidBatch::OffsetDelta {
                last_offset_delta: h.last_offset_delta,
                records: h.record_count,
            });
        }
        if let Some(prev) = headers.last() {
            if h.base_offset <= prev.last_offset() {
                return Err(InvalidBatch::OffsetsOverlap {
                    base_offset: h.base_offset,
                    previous_last: prev.last_offset(),
                });
            }
        }
        at += h.total_len();
        headers.push(h);
    }
    Ok(headers)
}

/// Sets the base offset of the batch at the start of `b` (not covered by the CRC).
pub fn set_base_offset(b: &mut [u8], base_offset: i64) {
    b[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Marks the batch as LogAppendTime with `now_ms` as its max timestamp, and recomputes the CRC.
pub fn stamp_log_append_time(b: &mut [u8], now_ms: i64) {
    let total = peek_total_len(b).expect("validated batch");
    let attrs = be_i16(b, 21) | ATTR_TIMESTAMP_TYPE;
    b[21..23].copy_from_slice(&attrs.to_be_bytes());
    b[35..43].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c(&b[CRC_START..total]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

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

/// A header of a record: key and value bytes.
pub type RecordHeader<'a> = (&'a [u8], Option<&'a [u8]>);

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

/// Writes `h` into the first 61 bytes of `b` (a whole batch whose records follow the header), with
/// the batch length taken from `b` and the CRC computed over it.
pub fn write_header(b: &mut [u8], h: &BatchHeader) {
    let batch_length = (b.len() - LOG_OVERHEAD) as i32;
    b[0..8].copy_from_slice(&h.base_offset.to_be_bytes());
    b[8..12].copy_from_slice(&batch_length.to_be_bytes());
    b[12..16].copy_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    b[16] = 2;
    b[21..23].copy_from_slice(&h.attributes.to_be_bytes());
    b[23..27].copy_from_slice(&h.last_offset_delta.to_be_bytes());
    b[27..35].copy_from_slice(&h.base_timestamp.to_be_bytes());
    b[35..43].copy_from_slice(&h.max_timestamp.to_be_bytes());
    b[43..51].copy_from_slice(&h.producer_id.to_be_bytes());
    b[51..53].copy_from_slice(&h.producer_epoch.to_be_bytes());
    b[53..57].copy_from_slice(&h.base_sequence.to_be_bytes());
    b[57..61].copy_from_slice(&h.record_count.to_be_bytes());
    let crc = crc32c::crc32c(&b[CRC_START..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn put_varint(out: &mut Vec<u8>, v: i32) {
    put_uvarint(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}
fn put_varlong(out: &mut Vec<u8>, v: i64) {
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
    let mut r = Reader {
        b: &b[HEADER_LEN..total],
        at: 0,
    };
    let malformed = || InvalidBatch::Truncated {
        needed: total,
        available: b.len(),
    };
    let mut out = Vec::with_capacity((h.record_count.max(0) as usize).min(total / 7));
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

/// Checks that every record of the batches (a Produce request's records, already validated) has a
/// key, as a compacted log requires (Kafka: `INVALID_RECORD`).
pub fn check_keys(blob: &[u8], headers: &[BatchHeader]) -> Result<(), InvalidBatch> {
    let mut at = 0;
    for h in headers {
        let b = &blob[at..at + h.total_len()];
        let plain = records_section(h, b)?;
        let indexes: Vec<i32> = record_spans(h, &plain)?
            .iter()
            .enumerate()
            .filter(|(_, r)| r.key.is_none())
            .map(|(i, _)| i as i32)
            .collect();
        if !indexes.is_empty() {
            return Err(InvalidBatch::MissingKey { indexes });
        }
        at += h.total_len();
    }
    Ok(())
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

    fn sample() -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        b.push(1_000, Some(b"k1"), Some(b"v1"), &[(b"h", Some(b"x"))]);
        b.push(1_005, None, Some(b"v2"), &[]);
        b.push(1_003, Some(b""), None, &[]);
        b.finish(0)
    }

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

    #[test]
    fn base_offset_is_outside_the_crc() {
        let mut b = sample();
        set_base_offset(&mut b, 12345);
        let h = validate(&b, usize::MAX).unwrap();
        assert_eq!(h.base_offset, 12345);
        assert_eq!(records(&b).unwrap()[2].offset, 12347);
    }

    #[test]
    fn log_append_time_recomputes_crc() {
        let mut b = sample();
        stamp_log_append_time(&mut b, 99_999);
        let h = validate(&b, usize::MAX).unwrap();
        assert!(h.is_log_append_time());
        assert!(records(&b).unwrap().iter().all(|r| r.timestamp == 99_999));
    }

    #[test]
    fn every_flipped_byte_from_magic_on_is_caught() {
        let b = sample();
        for i in 16..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(
                validate(&c, usize::MAX).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let b = sample();
        assert!(matches!(
            validate(&b[..30], usize::MAX),
            Err(InvalidBatch::Truncated { .. })
        ));
        assert!(matches!(
            validate(&b[..b.len() - 1], usize::MAX),
            Err(InvalidBatch::Truncated { .. })
        ));
        assert!(matches!(
            validate(&b, 10),
            Err(InvalidBatch::TooLarge { .. })
        ));
        let mut short = b.clone();
        short[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert_eq!(
            validate(&short, usize::MAX),
            Err(InvalidBatch::LengthTooSmall(10))
        );
        let mut magic = b.clone();
        magic[16] = 1;
        assert_eq!(validate(&magic, usize::MAX), Err(InvalidBatch::Magic(1)));
        assert_eq!(validate_all(&[], usize::MAX), Err(InvalidBatch::Empty));
        let mut two = b.clone();
        two.extend_from_slice(&b[..40]);
        assert!(validate_all(&two, usize::MAX).is_err());
        two.truncate(b.len());
        two.extend_from_slice(&b);
        assert_eq!(validate_all(&two, usize::MAX).unwrap().len(), 2);
    }

    #[test]
    fn count_and_timestamp_rules() {
        let fix_crc = |b: &mut Vec<u8>| {
            let crc = crc32c::crc32c(&b[CRC_START..]);
            b[17..21].copy_from_slice(&crc.to_be_bytes());
        };
        let mut zero = sample();
        zero[57..61].copy_from_slice(&0i32.to_be_bytes());
        fix_crc(&mut zero);
        assert_eq!(
            validate(&zero, usize::MAX),
            Err(InvalidBatch::RecordCount(0))
        );
        let mut delta = sample();
        delta[23..27].copy_from_slice(&1i32.to_be_bytes());
        fix_crc(&mut delta);
        assert!(matches!(
            validate(&delta, usize::MAX),
            Err(InvalidBatch::OffsetDelta { .. })
        ));
        let mut ts = sample();
        ts[35..43].copy_from_slice(&5i64.to_be_bytes());
        fix_crc(&mut ts);
        assert!(matches!(
            validate(&ts, usize::MAX),
            Err(InvalidBatch::Timestamp { .. })
        ));
    }

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
    fn one_decompression_budget_per_blob() {
        // Each batch alone is within the limit; the blob of all of them is not.
        let mut b = BatchBuilder::new(0);
        let value = vec![0u8; 1 << 20];
        for _ in 0..40 {
            b.push(0, None, Some(&value), &[]);
        }
        let big = compress_batch(&b.finish(0), 4);
        assert!(big.len() < 64 << 10, "zeros compress well: {}", big.len());
        let per_batch = 40 << 20;
        let n = crate::compression::MAX_DECOMPRESSED / per_batch + 1;
        assert!(validate(&big, usize::MAX).is_ok());
        let blob: Vec<u8> = (0..n).flat_map(|_| big.clone()).collect();
        assert!(matches!(
            validate_all(&blob, usize::MAX),
            Err(InvalidBatch::Decompress(_))
        ));
        let fits: Vec<u8> = (0..n - 1).flat_map(|_| big.clone()).collect();
        assert_eq!(validate_all(&fits, usize::MAX).unwrap().len(), n - 1);
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

    #[test]
    fn garbage_record_bytes_do_not_panic() {
        let mut b = sample();
        for i in HEADER_LEN..b.len() {
            b[i] = 0xff;
            let _ = records(&b);
        }
    }
}
