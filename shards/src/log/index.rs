//! The sparse offset index of one segment, and its on-disk form, which doubles as the segment's
//! "clean" mark: a sealed segment whose index file is intact and names the segment's exact size is
//! trusted at start-up without a scan.

/// An entry every `interval` bytes: (offset - segment base, byte position of the batch with that base).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SparseIndex {
    entries: Vec<(u32, u32)>,
    interval: u32,
    last_pos: Option<u32>,
}

/// What a segment knows about itself beyond its bytes, saved with the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentMeta {
    pub size: u64,
    pub next_offset: i64,
    /// Largest record timestamp in the segment, `-1` if none carried one.
    pub max_timestamp: i64,
    /// Max timestamp of the first batch (what age-based rolling measures), `-1` if empty.
    pub first_timestamp: i64,
}

const MAGIC: &[u8; 4] = b"SHIX";
const VERSION: u16 = 1;
const FIXED: usize = 4 + 2 + 2 + 8 + 8 + 8 + 8 + 4 + 4;

impl SparseIndex {
    pub(crate) fn new(interval: u32) -> Self {
        Self {
            entries: Vec::new(),
            interval: interval.max(1),
            last_pos: None,
        }
    }

    /// Records the batch with relative offset `rel` at `pos` if it is far enough from the last entry.
    pub(crate) fn maybe_add(&mut self, rel: u32, pos: u32) {
        if self.last_pos.is_none_or(|last| pos - last >= self.interval) {
            self.entries.push((rel, pos));
            self.last_pos = Some(pos);
        }
    }

    /// Position of a batch at or before the one holding relative offset `rel`.
    pub(crate) fn lookup(&self, rel: u32) -> u32 {
        let i = self.entries.partition_point(|&(r, _)| r <= rel);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].1
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn encode(&self, meta: &SegmentMeta) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + 8 * self.entries.len() + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&meta.size.to_be_bytes());
        b.extend_from_slice(&meta.next_offset.to_be_bytes());
        b.extend_from_slice(&meta.max_timestamp.to_be_bytes());
        b.extend_from_slice(&meta.first_timestamp.to_be_bytes());
        b.extend_from_slice(&self.interval.to_be_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        for (r, p) in &self.entries {
            b.extend_from_slice(&r.to_be_bytes());
            b.extend_from_slice(&p.to_be_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Parses an index file; `None` if it is damaged in any way (the segment is then scanned).
    pub(crate) fn decode(b: &[u8]) -> Option<(Self, SegmentMeta)> {
        if b.len() < FIXED + 4 || &b[0..4] != MAGIC {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let u16_at = |at: usize| u16::from_be_bytes(body[at..at + 2].try_into().unwrap());
        let u32_at = |at: usize| u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_be_bytes(body[at..at + 8].try_into().unwrap());
        if u16_at(4) != VERSION {
            return None;
        }
        let meta = SegmentMeta {
            size: u64_at(8),
            next_offset: u64_at(16) as i64,
            max_timestamp: u64_at(24) as i64,
            first_timestamp: u64_at(32) as i64,
        };
        let interval = u32_at(40);
        let n = u32_at(44) as usize;
        if body.len() != FIXED + 8 * n {
            return None;
        }
        let entries: Vec<(u32, u32)> = (0..n)
            .map(|i| (u32_at(FIXED + 8 * i), u32_at(FIXED + 8 * i + 4)))
            .collect();
        if entries
            .windows(2)
            .any(|w| w[0].0 >= w[1].0 || w[0].1 >= w[1].1)
        {
            return None;
        }
        let last_pos = entries.last().map(|e| e.1);
        Some((
            Self {
                entries,
                interval: interval.max(1),
                last_pos,
            },
            meta,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_entries_and_lookup() {
        let mut ix = SparseIndex::new(100);
        for i in 0..10u32 {
            ix.maybe_add(i * 5, i * 40); // a batch of 5 offsets every 40 bytes
        }
        assert_eq!(ix.len(), 4); // positions 0, 120, 240, 360
        assert_eq!(ix.lookup(0), 0);
        assert_eq!(ix.lookup(14), 0);
        assert_eq!(ix.lookup(15), 120);
        assert_eq!(ix.lookup(1000), 360);
    }

    #[test]
    fn round_trip_and_damage() {
        let mut ix = SparseIndex::new(1);
        ix.maybe_add(0, 0);
        ix.maybe_add(7, 900);
        let meta = SegmentMeta {
            size: 1234,
            next_offset: 42,
            max_timestamp: 5,
            first_timestamp: 1,
        };
        let b = ix.encode(&meta);
        assert_eq!(SparseIndex::decode(&b), Some((ix, meta)));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(SparseIndex::decode(&c).is_none(), "damage at {i} accepted");
        }
        assert!(SparseIndex::decode(&b[..b.len() - 1]).is_none());
    }
}
