//! Records sections decompressed when their batches were produced, kept a short while for the
//! log's view readers. A compressed batch is decompressed at produce (its records are checked
//! against its header); while a view reader runs on the log, the produce path keeps what it
//! decompressed and the writer files it here under the batch's assigned base offset, so the reader
//! splits it without decompressing it a second time.
//!
//! An entry is only used for the batch it was made from: base offset, CRC-32C and length must all
//! match the batch the reader holds (compaction may rewrite a batch at the same base offset).
//! Entries leave oldest first once they pass [`DecodedRecords::CAPACITY`] bytes: a reader that
//! falls behind decompresses for itself, as without them.

use bytes::Bytes;
use std::collections::VecDeque;

use crate::batch::BatchHeader;

/// One batch's decompressed records, and what identifies the batch.
#[derive(Debug)]
struct Entry {
    base_offset: i64,
    crc: u32,
    total_len: usize,
    records: Bytes,
}

/// A log's recently produced batches' decompressed records, oldest first.
#[derive(Debug, Default)]
pub(crate) struct DecodedRecords {
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl DecodedRecords {
    /// Most decompressed bytes kept per log: a few reads' worth of a view reader's (it reads 1 MiB
    /// of source at a time by default), far less than the tail cache it reads from.
    pub(crate) const CAPACITY: usize = 4 << 20;

    /// Keeps `records`, the decompressed records of the batch `h` (its base offset assigned).
    pub(crate) fn insert(&mut self, h: &BatchHeader, records: Bytes) {
        if records.len() > Self::CAPACITY {
            return;
        }
        self.bytes += records.len();
        self.entries.push_back(Entry {
            base_offset: h.base_offset,
            crc: h.crc,
            total_len: h.total_len(),
            records,
        });
        while self.bytes > Self::CAPACITY {
            let old = self.entries.pop_front().expect("bytes counted are held");
            self.bytes -= old.records.len();
        }
    }

    /// The decompressed records of batch `h`, if they were kept. They stay for the log's other
    /// view readers (one per shard count) until newer entries push them out.
    pub(crate) fn get(&self, h: &BatchHeader) -> Option<Bytes> {
        let at = self
            .entries
            .partition_point(|e| e.base_offset < h.base_offset);
        let e = self.entries.get(at)?;
        (e.base_offset == h.base_offset && e.crc == h.crc && e.total_len == h.total_len())
            .then(|| e.records.clone())
    }

    /// Drops everything (no view reader runs any more).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(base_offset: i64, crc: u32, batch_length: i32) -> BatchHeader {
        BatchHeader {
            base_offset,
            batch_length,
            magic: 2,
            crc,
            attributes: 3,
            last_offset_delta: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: 1,
        }
    }

    #[test]
    fn only_the_same_batch_gets_its_records_and_old_ones_leave_first() {
        let mut d = DecodedRecords::default();
        d.insert(&header(0, 7, 100), Bytes::from_static(b"zero"));
        d.insert(&header(1, 8, 100), Bytes::from_static(b"one"));
        assert_eq!(d.get(&header(1, 8, 100)).as_deref(), Some(&b"one"[..]));
        assert_eq!(d.get(&header(0, 7, 100)).as_deref(), Some(&b"zero"[..]));
        // Same base offset, another batch (compaction rewrote it): not served.
        assert_eq!(d.get(&header(1, 9, 100)), None);
        assert_eq!(d.get(&header(1, 8, 101)), None);
        assert_eq!(d.get(&header(2, 8, 100)), None);
        // Past the capacity, the oldest leave.
        let big = Bytes::from(vec![0u8; DecodedRecords::CAPACITY / 2]);
        d.insert(&header(2, 1, 100), big.clone());
        d.insert(&header(3, 1, 100), big.clone());
        assert_eq!(d.len(), 2);
        assert_eq!(d.get(&header(0, 7, 100)), None);
        assert!(d.get(&header(3, 1, 100)).is_some());
        d.insert(
            &header(4, 1, 100),
            Bytes::from(vec![0u8; DecodedRecords::CAPACITY + 1]),
        );
        assert_eq!(d.len(), 2, "too big to keep");
        d.clear();
        assert_eq!(d.get(&header(3, 1, 100)), None);
    }
}
