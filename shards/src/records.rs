//! What a log read returns: whole batches as shared byte slices, with the counts a fetch response and
//! its metrics need. Cloning a `Records` clones reference counts, never bytes.

use bytes::Bytes;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    /// Whole batches back to back, split only where the underlying memory is (tail-cache chunks,
    /// segment files). Written to a socket in order, they are the `records` field of a fetch response.
    pub parts: Vec<Bytes>,
    /// Sum of the parts' lengths.
    pub len: usize,
    pub batches: u32,
    pub records: u64,
    /// Base offset of the first batch (may be below the offset asked for) and last offset of the last
    /// batch; both `-1` when empty.
    pub first_offset: i64,
    pub last_offset: i64,
}

impl Records {
    pub fn empty() -> Self {
        Self {
            first_offset: -1,
            last_offset: -1,
            ..Default::default()
        }
    }
    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    /// The whole batches at the start of `bytes` (another broker's fetch response may end with a
    /// partial one, cut at its size limit): a shared slice, not a copy.
    pub fn whole_batches(bytes: Bytes) -> Records {
        let mut out = Records::empty();
        let mut at = 0;
        while let Ok(h) = crate::batch::BatchHeader::parse(&bytes[at..]) {
            let len = h.total_len();
            let Some(end) = at
                .checked_add(len)
                .filter(|&e| e <= bytes.len() && len >= crate::batch::HEADER_LEN)
            else {
                break;
            };
            if out.is_empty() {
                out.first_offset = h.base_offset;
            }
            out.last_offset = h.last_offset();
            out.batches += 1;
            out.records += h.record_count.max(0) as u64;
            at = end;
        }
        if at > 0 {
            out.parts = vec![bytes.slice(..at)];
            out.len = at;
        }
        out
    }
    /// The offset a consumer fetches next after these records.
    pub fn next_offset(&self) -> Option<i64> {
        (!self.is_empty()).then_some(self.last_offset + 1)
    }

    /// Appends `other`, which must start after `self` (right after it, or after a gap that
    /// compaction left).
    pub(crate) fn extend(&mut self, other: Records) {
        if other.is_empty() {
            return;
        }
        if self.is_empty() {
            *self = other;
            return;
        }
        debug_assert!(other.first_offset > self.last_offset);
        self.parts.extend(other.parts);
        self.len += other.len;
        self.batches += other.batches;
        self.records += other.records;
        self.last_offset = other.last_offset;
    }

    /// The batches that end below `end` (a read_committed fetch stops at the last stable offset,
    /// which is always a batch's base offset or the high watermark): shared slices, not copies.
    pub fn before(&self, end: i64) -> Records {
        if self.is_empty() || self.last_offset < end {
            return self.clone();
        }
        let mut out = Records::empty();
        'parts: for part in &self.parts {
            let mut at = 0;
            while let Ok(h) = crate::batch::BatchHeader::parse(part.get(at..).unwrap_or_default()) {
                let Some(next) = at.checked_add(h.total_len()).filter(|&e| e <= part.len()) else {
                    break;
                };
                if h.last_offset() >= end {
                    if at > 0 {
                        out.parts.push(part.slice(..at));
                        out.len += at;
                    }
                    break 'parts;
                }
                if out.batches == 0 {
                    out.first_offset = h.base_offset;
                }
                out.last_offset = h.last_offset();
                out.batches += 1;
                out.records += h.record_count.max(0) as u64;
                at = next;
            }
            out.parts.push(part.clone());
            out.len += part.len();
        }
        out
    }

    /// Every whole batch, in order: its header and its bytes (a shared slice, not a copy).
    pub fn batches(&self) -> impl Iterator<Item = (crate::batch::BatchHeader, Bytes)> + '_ {
        self.parts.iter().flat_map(|part| {
            let mut at = 0;
            std::iter::from_fn(move || {
                let h = crate::batch::BatchHeader::parse(part.get(at..)?).ok()?;
                let end = at.checked_add(h.total_len()).filter(|&e| e <= part.len())?;
                let bytes = part.slice(at..end);
                at = end;
                Some((h, bytes))
            })
        })
    }

    /// The header of every batch, in order.
    pub fn batch_headers(&self) -> impl Iterator<Item = crate::batch::BatchHeader> + '_ {
        self.batches().map(|(h, _)| h)
    }

    /// All bytes in one buffer (tests and tools; the serving path writes `parts` directly).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for p in &self.parts {
            v.extend_from_slice(p);
        }
        v
    }
}

/// The result of one log read: the records and the partition's state the read saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRead {
    pub records: Records,
    /// The next offset to be assigned when the read ran.
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// Served from the tail cache, with no disk I/O.
    pub from_cache: bool,
    /// Read from another broker (shoal edge's read-through) at read_committed: that broker's last
    /// stable offset and the aborted transactions of the records, which this log cannot know.
    pub upstream_txns: Option<UpstreamTxns>,
}

/// What a read_committed read from another broker said of its transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTxns {
    pub last_stable_offset: i64,
    /// (producer id, first offset) of each aborted transaction in the records' range.
    pub aborted: Vec<(i64, i64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_before_an_offset_keep_whole_batches_below_it() {
        let batch = |base: i64, n: usize| {
            let mut b = crate::batch::BatchBuilder::new(0);
            for _ in 0..n {
                b.push(0, Some(b"k"), Some(b"v"), &[]);
            }
            b.finish(base)
        };
        // Two parts: batches 0..=1 and 2..=4 in the first, 5 in the second.
        let mut first = batch(0, 2);
        first.extend(batch(2, 3));
        let mut r = Records::whole_batches(Bytes::from(first.clone()));
        r.extend(Records::whole_batches(Bytes::from(batch(5, 1))));
        assert_eq!(r.before(100), r);
        let cut = r.before(5);
        assert_eq!(
            (cut.first_offset, cut.last_offset, cut.batches, cut.records),
            (0, 4, 2, 5)
        );
        assert_eq!(cut.to_vec(), first);
        let cut = r.before(2);
        assert_eq!(
            (cut.last_offset, cut.batches, cut.len),
            (1, 1, batch(0, 2).len())
        );
        assert!(r.before(0).is_empty() && r.before(0).parts.is_empty());
    }
}
