//! Checks of whole batches: integrity (length, magic, CRC-32C), a producer's header rules, a
//! produced or mirrored blob of batches, keys for a compacted log.

use crate::batch::decode::{record_spans, records_section};
use crate::batch::header::{be_i32, BatchHeader, CRC_START, HEADER_LEN, LOG_OVERHEAD};
use crate::batch::walk::{check_records_within, Decompressed};
use crate::error::InvalidBatch;
use bytes::Bytes;

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
    let mut h = h;
    if !h.is_log_append_time() {
        // The header's max timestamp is the records' (some clients send -1 there): as Kafka does,
        // the broker takes it from the records, and the batch is restamped before it is appended
        // ([`restamp_max_timestamps`]).
        h.max_timestamp = h.base_timestamp + used.max_timestamp_delta;
    }
    Ok((h, used))
}

/// `blob` (a Produce request's batches, validated) with each batch's max timestamp made the one
/// `headers` (its validation) found in its records, and its CRC computed again where it changed;
/// `blob` itself, uncopied, where every batch's was right.
pub fn restamp_max_timestamps(blob: Bytes, headers: &[BatchHeader]) -> Bytes {
    let stated =
        |at: usize| i64::from_be_bytes(blob[at + 35..at + 43].try_into().expect("8 bytes"));
    let mut at = 0;
    let mut wrong = Vec::new();
    for h in headers {
        if stated(at) != h.max_timestamp {
            wrong.push((at, h));
        }
        at += h.total_len();
    }
    if wrong.is_empty() {
        return blob;
    }
    let mut fixed = bytes::BytesMut::from(&blob[..]);
    for (at, h) in wrong {
        crate::batch::header::set_max_timestamp(
            &mut fixed[at..at + h.total_len()],
            h.max_timestamp,
        );
    }
    fixed.freeze()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::tests::sample;
    use crate::batch::{compress_batch, BatchBuilder};

    #[test]
    fn the_max_timestamp_is_the_records_and_a_wrong_one_is_restamped() {
        let mut b = BatchBuilder::new(1_000);
        b.push(1_000, None, Some(b"a"), &[]);
        b.push(1_500, None, Some(b"b"), &[]);
        b.push(1_200, None, Some(b"c"), &[]);
        let right = b.finish(0);
        let mut wrong = compress_batch(&right, 1);
        crate::batch::set_max_timestamp(&mut wrong, -1);
        let blob = Bytes::from([right.clone(), wrong].concat());
        let headers = validate_all(&blob, usize::MAX).unwrap();
        assert!(headers.iter().all(|h| h.max_timestamp == 1_500));
        let fixed = restamp_max_timestamps(blob.clone(), &headers);
        let second = &fixed[right.len()..];
        assert_eq!(
            check_integrity(second, usize::MAX).unwrap().max_timestamp,
            1_500
        );
        // Nothing wrong: the very same bytes, not a copy.
        let good = Bytes::from(right);
        let headers = validate_all(&good, usize::MAX).unwrap();
        let same = restamp_max_timestamps(good.clone(), &headers);
        assert_eq!(same.as_ptr(), good.as_ptr());
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
}
