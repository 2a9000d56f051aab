//! Interpretation of one source batch for sharded views: decompress it once, route each record to
//! its shard by key (Kafka's default partitioner; null keys go to every shard), and encode one
//! uncompressed batch per shard. Routing ([`Routing::route`]) is one pass that copies nothing and
//! sizes every shard batch; writing ([`Routing::write`]) then copies each into a buffer with room
//! for it, so the view reader puts the shard batches of a group of source batches into one buffer
//! of exactly their size (one allocation per group, not one per shard grown record by record).
//!
//! Every shard batch covers the source batch's whole offset range (same base offset and
//! `lastOffsetDelta`), so offsets stay the source's and a shard with no records in the range still
//! gets a batch (with zero records, as Kafka writes after compaction) that moves its consumers past
//! it. Records are copied verbatim: their offset and timestamp deltas are relative to the batch base,
//! which the shard batch keeps, so keys, values, headers and timestamps are exactly the source's.

use crate::batch::{self, records_section, BatchHeader, Reader, ATTR_TIMESTAMP_TYPE, HEADER_LEN};
use crate::error::InvalidBatch;
use crate::partitioner::shard_of;

/// One source batch split into `shards` batches: every shard's (`only` None; index = shard), or
/// only shard `i`'s (`only` Some(i); what a fetch that reads for itself needs, the other shards'
/// batches are not built).
pub fn split_batch(
    source: &[u8],
    shards: u32,
    only: Option<u32>,
) -> Result<Vec<Vec<u8>>, InvalidBatch> {
    let outputs = if only.is_some() { 1 } else { shards as usize };
    // Empty: `split_batch_into` makes room for each shard's share.
    let mut outs = vec![Vec::new(); outputs];
    split_batch_into(source, shards, only, &mut outs)?;
    Ok(outs)
}

/// Most bytes the shard batches of one source batch may take together: what one batch may
/// decompress to. Null keys go to every shard, so a big batch split many ways would otherwise cost
/// its size times the shards.
pub const MAX_SPLIT_BYTES: usize = crate::compression::MAX_DECOMPRESSED;

/// [`split_batch`], appending each shard's batch to `outs[i]` (one buffer per output), so that the
/// shard batches of consecutive source batches lie back to back; returns each output's record count.
/// On error nothing is appended; a batch whose shard batches would pass [`MAX_SPLIT_BYTES`] is an
/// error (`TooLarge`).
pub fn split_batch_into(
    source: &[u8],
    shards: u32,
    only: Option<u32>,
    outs: &mut [Vec<u8>],
) -> Result<Vec<i32>, InvalidBatch> {
    split_within(source, shards, only, outs, MAX_SPLIT_BYTES)
}

/// [`split_batch_into`] with the shard batches together at most `limit` bytes.
pub fn split_batch_within(
    source: &[u8],
    shards: u32,
    only: Option<u32>,
    outs: &mut [Vec<u8>],
    limit: usize,
) -> Result<Vec<i32>, InvalidBatch> {
    split_within(source, shards, only, outs, limit)
}

fn split_within(
    source: &[u8],
    shards: u32,
    only: Option<u32>,
    outs: &mut [Vec<u8>],
    limit: usize,
) -> Result<Vec<i32>, InvalidBatch> {
    let outputs = if only.is_some() { 1 } else { shards as usize };
    assert_eq!(outs.len(), outputs);
    let h = BatchHeader::parse(source)?;
    let records = records_section(&h, source)?;
    let routing = Routing::route(&h, &records, shards, only, limit)?;
    for (i, b) in outs.iter_mut().enumerate() {
        b.reserve(routing.size(i));
        routing.write(i, &records, b);
    }
    Ok((0..outputs).map(|i| routing.count(i)).collect())
}

/// Output of a record with a null key: every output.
const EVERY: u32 = u32::MAX;

/// Where the records of one source batch go, found in one pass over them with nothing copied, so
/// that each shard batch can then be written into a buffer sized for it exactly (all of them into
/// one buffer, back to back), not grown record by record.
#[derive(Debug)]
pub struct Routing {
    header: BatchHeader,
    /// Each output's records' ranges in the records section, in order, output after output (a
    /// record with a null key is in every output's): output `i`'s end where `ends[i]` says.
    ranges: Vec<(u32, u32)>,
    ends: Vec<u32>,
    /// Each output's shard batch size, header included.
    sizes: Vec<usize>,
}

impl Routing {
    /// Routes each record of `records` (the section of batch `h`) to its shard: every shard's
    /// (`only` None; output = shard) or only shard `i`'s (`only` Some(i); output 0). An error when a
    /// record is malformed, or when the shard batches would pass `limit` bytes together.
    pub fn route(
        h: &BatchHeader,
        records: &[u8],
        shards: u32,
        only: Option<u32>,
        limit: usize,
    ) -> Result<Self, InvalidBatch> {
        assert!(shards > 0 && only.is_none_or(|i| i < shards));
        let outputs = if only.is_some() { 1 } else { shards as usize };
        let malformed = || InvalidBatch::Decompress("malformed record".into());
        // Ranges are kept as u32: a records section is at most `MAX_DECOMPRESSED`.
        u32::try_from(records.len()).map_err(|_| malformed())?;
        // Each record's range and output ([`EVERY`] for a null key), in order; and each output's
        // record count and shard batch size.
        let mut routes = Vec::with_capacity(usize::try_from(h.record_count).unwrap_or(0).min(4096));
        let mut counts = vec![0u32; outputs];
        let mut sizes = vec![HEADER_LEN; outputs];
        let mut total = outputs * HEADER_LEN;
        let mut grow = |n: usize| {
            total = total.saturating_add(n);
            match total > limit {
                true => Err(InvalidBatch::TooLarge { size: total, limit }),
                false => Ok(()),
            }
        };
        grow(0)?;
        let mut r = Reader { b: records, at: 0 };
        for _ in 0..h.record_count {
            let start = r.at;
            let len =
                usize::try_from(r.varint().ok_or_else(malformed)?).map_err(|_| malformed())?;
            let end =
                r.at.checked_add(len)
                    .filter(|&e| e <= records.len())
                    .ok_or_else(malformed)?;
            r.take(1).ok_or_else(malformed)?; // attributes
            r.varlong().ok_or_else(malformed)?; // timestamp delta
            r.varint().ok_or_else(malformed)?; // offset delta
            let key = r.bytes().ok_or_else(malformed)?;
            let len = end - start;
            let output = match (shard_of(key, shards), only) {
                (Some(s), Some(o)) if s != o => None,
                (Some(_), Some(_)) => Some(0),
                (Some(s), None) => Some(s),
                (None, _) => Some(EVERY),
            };
            match output {
                None => {}
                Some(EVERY) => {
                    grow(len.saturating_mul(outputs))?;
                    counts.iter_mut().for_each(|c| *c += 1);
                    sizes.iter_mut().for_each(|s| *s += len);
                }
                Some(i) => {
                    grow(len)?;
                    counts[i as usize] += 1;
                    sizes[i as usize] += len;
                }
            }
            if let Some(o) = output {
                routes.push((start as u32, end as u32, o));
            }
            r.at = end;
        }
        // Each output's ranges together (a counting sort that keeps the records' order): writing
        // an output then reads its own records only, not every record once per output.
        let mut ends: Vec<u32> = counts
            .iter()
            .scan(0, |at, &c| {
                let start = *at;
                *at += c;
                Some(start)
            })
            .collect();
        let mut ranges = vec![(0, 0); counts.iter().sum::<u32>() as usize];
        for (a, z, o) in routes {
            let mut place = |i: usize| {
                ranges[ends[i] as usize] = (a, z);
                ends[i] += 1;
            };
            match o {
                EVERY => (0..outputs).for_each(&mut place),
                i => place(i as usize),
            }
        }
        Ok(Self {
            header: *h,
            ranges,
            ends,
            sizes,
        })
    }

    /// Output `i`'s records' ranges in the records section, in order.
    fn ranges(&self, i: usize) -> &[(u32, u32)] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.ranges[start as usize..self.ends[i] as usize]
    }

    /// Output `i`'s record count.
    pub fn count(&self, i: usize) -> i32 {
        self.ranges(i).len() as i32
    }

    /// Output `i`'s shard batch size, header included.
    pub fn size(&self, i: usize) -> usize {
        self.sizes[i]
    }

    /// Every output's shard batch size together, headers included.
    pub fn bytes(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Appends output `i`'s shard batch (over the source batch's whole offset range, with its
    /// records in order and no compression) to `out`; `records` is the section routed. Records
    /// that lie back to back are copied together.
    pub fn write(&self, i: usize, records: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + HEADER_LEN, 0);
        let mut ranges = self.ranges(i).iter().copied();
        if let Some((mut ra, mut rz)) = ranges.next() {
            for (a, z) in ranges {
                if a != rz {
                    out.extend_from_slice(&records[ra as usize..rz as usize]);
                    ra = a;
                }
                rz = z;
            }
            out.extend_from_slice(&records[ra as usize..rz as usize]);
        }
        let header = BatchHeader {
            attributes: self.header.attributes & ATTR_TIMESTAMP_TYPE,
            record_count: self.count(i),
            ..self.header
        };
        batch::write_header(&mut out[start..], &header);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{compress_batch, records, BatchBuilder};

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
        let mut appended = vec![Vec::new(); n as usize];
        let counts = split_batch_into(source, n, None, &mut appended).unwrap();
        let in_headers: Vec<i32> = shards
            .iter()
            .map(|b| BatchHeader::parse(b).unwrap().record_count)
            .collect();
        assert_eq!(counts, in_headers, "the counts returned are the headers'");
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
    fn shard_batches_past_the_limit_are_an_error_and_append_nothing() {
        let source = source();
        let whole: usize = split_batch(&source, 64, None)
            .unwrap()
            .iter()
            .map(Vec::len)
            .sum();
        let mut outs = vec![b"kept".to_vec(); 64];
        let err = split_batch_within(&source, 64, None, &mut outs, whole - 1).unwrap_err();
        assert!(matches!(err, InvalidBatch::TooLarge { limit, .. } if limit == whole - 1));
        assert!(outs.iter().all(|b| b == b"kept"), "nothing appended");
        split_batch_within(&source, 64, None, &mut outs, whole).unwrap();
        assert_eq!(outs.iter().map(Vec::len).sum::<usize>(), whole + 64 * 4);
    }

    #[test]
    fn damaged_compressed_data_is_an_error_not_a_panic() {
        for codec in 1..=4 {
            // Cut short: the records section ends before its compressed data does.
            let mut cut = compressed(codec);
            cut.truncate(cut.len() - 2);
            assert!(
                split_batch(&cut, 4, None).is_err(),
                "codec {codec} cut short"
            );
            // The batch length made to match: the compressed data still ends early.
            let len = (cut.len() - 12) as i32;
            cut[8..12].copy_from_slice(&len.to_be_bytes());
            assert!(
                split_batch(&cut, 4, None).is_err(),
                "codec {codec} truncated"
            );
            // A byte flipped inside the compressed data: an error or records that decode, never
            // a panic.
            let mut flipped = compressed(codec);
            let at = flipped.len() / 2 + 3;
            flipped[at] ^= 0xff;
            if let Ok(shards) = split_batch(&flipped, 4, None) {
                assert_eq!(shards.len(), 4);
            }
        }
    }
}
