//! Transactions in one partition's log (Kafka's KIP-98, the partition's part): control batches
//! (commit and abort markers), the producers' open transactions, the last stable offset they hold
//! back, and the aborted-transaction index of each segment (what Kafka keeps in `.txnindex`).
//!
//! A transactional batch opens a transaction for its producer unless one is open; a marker closes
//! it. The **last stable offset** is the first offset of the oldest open transaction, or the high
//! watermark when none is open: a read_committed reader stops there. An ABORT marker adds an entry
//! to its segment's index, so a read_committed fetch learns which records of its range to drop.
//! Each segment's file also holds the transactions still open at the segment's end, so recovery
//! rebuilds the state from the last trusted segment and the batches after it (see `log::recovery`).
//!
//! Design notes: `docs/engine.md` (Transactions).

use crate::batch::{self, BatchBuilder, BatchHeader, ATTR_CONTROL, ATTR_TRANSACTIONAL};
use std::collections::{BTreeSet, HashMap};

/// A control record's type: Kafka's `ControlRecordType` (0 ABORT, 1 COMMIT).
const ABORT: i16 = 0;
const COMMIT: i16 = 1;

/// What a control batch says: a transaction's end, as its coordinator decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// A control batch in Kafka's format: control and transactional attributes, base sequence -1, the
/// producer's id and epoch, and one record whose key is (version 0, type) and whose value is
/// (version 0, coordinator epoch). Its base offset is 0: the log assigns the real one.
pub fn encode_marker(
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    timestamp: i64,
) -> Vec<u8> {
    let kind = if marker.commit { COMMIT } else { ABORT };
    let mut key = [0u8; 4];
    key[2..].copy_from_slice(&kind.to_be_bytes());
    let mut value = [0u8; 6];
    value[2..].copy_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let mut b = BatchBuilder::new(timestamp).producer(producer_id, producer_epoch, -1);
    b.push(timestamp, Some(&key), Some(&value), &[]);
    let mut bytes = b.finish(0);
    let mut h = BatchHeader::parse(&bytes).expect("a batch just built");
    h.attributes |= ATTR_CONTROL | ATTR_TRANSACTIONAL;
    batch::write_header(&mut bytes, &h);
    bytes
}

/// The marker a control batch (`bytes`, whole) carries; `None` if it is not a control batch or
/// its record is not a marker this broker knows (Kafka skips unknown control types too).
pub fn parse_marker(h: &BatchHeader, bytes: &[u8]) -> Option<Marker> {
    if !h.is_control() {
        return None;
    }
    let records = batch::records(bytes).ok()?;
    let r = records.first()?;
    let key = r.key?;
    if key.len() < 4 || i16::from_be_bytes([key[0], key[1]]) < 0 {
        return None;
    }
    let kind = i16::from_be_bytes([key[2], key[3]]);
    let coordinator_epoch = r
        .value
        .and_then(|v| v.get(2..6)?.try_into().ok())
        .map_or(-1, i32::from_be_bytes);
    match kind {
        ABORT | COMMIT => Some(Marker {
            commit: kind == COMMIT,
            coordinator_epoch,
        }),
        _ => None,
    }
}

/// One aborted transaction, as Kafka's transaction index keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// Its first batch's base offset.
    pub first_offset: i64,
    /// Its ABORT marker's offset.
    pub last_offset: i64,
    /// The last stable offset once it was aborted: no transaction aborted later began below it,
    /// which bounds the search of the index (see [`AbortedTxn::ends_search_before`]).
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    /// Whether it holds records in `from..to`.
    pub fn intersects(&self, from: i64, to: i64) -> bool {
        self.last_offset >= from && self.first_offset < to
    }
    /// No transaction aborted after this one holds a record below `to`.
    pub fn ends_search_before(&self, to: i64) -> bool {
        self.last_stable_offset >= to
    }
}

/// The producers with an open transaction in one log, and the order their transactions began.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenTransactions {
    /// Producer id -> the first offset of its open transaction.
    by_producer: HashMap<i64, i64>,
    /// (first offset, producer id), oldest first: the first one holds the last stable offset back.
    by_first: BTreeSet<(i64, i64)>,
}

impl OpenTransactions {
    pub fn len(&self) -> usize {
        self.by_producer.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_producer.is_empty()
    }
    /// The first offset of `producer_id`'s open transaction.
    pub fn first_offset(&self, producer_id: i64) -> Option<i64> {
        self.by_producer.get(&producer_id).copied()
    }
    /// The first offset of the oldest open transaction: the last stable offset when there is one.
    pub fn first_unstable(&self) -> Option<i64> {
        self.by_first.first().map(|&(first, _)| first)
    }
    /// (producer id, first offset) of every open transaction, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.by_first.iter().map(|&(first, pid)| (pid, first))
    }

    /// Opens a transaction at `first_offset` for `producer_id` unless it has one.
    fn open(&mut self, producer_id: i64, first_offset: i64) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.by_producer.entry(producer_id) {
            e.insert(first_offset);
            self.by_first.insert((first_offset, producer_id));
        }
    }

    /// Follows one batch written at its final offsets (`bytes` the whole batch, needed only for a
    /// control batch): a transactional data batch opens its producer's transaction, a marker closes
    /// it. An ABORT of an open transaction returns what the segment's index must keep. A marker for
    /// a producer with no open transaction changes nothing (Kafka writes it all the same).
    pub fn apply(&mut self, h: &BatchHeader, bytes: &[u8]) -> Option<AbortedTxn> {
        if !h.is_transactional() {
            return None;
        }
        self.follow(h, parse_marker(h, bytes))
    }

    /// [`OpenTransactions::apply`] for a transactional batch whose marker, if it is a control
    /// batch, was parsed already (`None` for a data batch or an unknown control record).
    pub fn follow(&mut self, h: &BatchHeader, marker: Option<Marker>) -> Option<AbortedTxn> {
        if !h.is_transactional() || h.producer_id < 0 {
            return None;
        }
        if !h.is_control() {
            self.open(h.producer_id, h.base_offset);
            return None;
        }
        let marker = marker?;
        let first_offset = self.by_producer.remove(&h.producer_id)?;
        self.by_first.remove(&(first_offset, h.producer_id));
        if marker.commit {
            return None;
        }
        Some(AbortedTxn {
            producer_id: h.producer_id,
            first_offset,
            last_offset: h.base_offset,
            last_stable_offset: self.first_unstable().unwrap_or(h.base_offset + 1),
        })
    }
}

/// What one segment keeps about transactions: the transactions aborted by its markers, in offset
/// order, and those still open at its end (filled in when the segment is rolled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SegmentTxns {
    pub aborted: Vec<AbortedTxn>,
    pub open_at_end: OpenTransactions,
}

const MAGIC: &[u8; 4] = b"SHTX";

impl SegmentTxns {
    /// Drops the aborted transaction whose ABORT marker (at `marker`) compaction removes: a
    /// reader told of an aborted transaction skips the producer's records until its marker.
    pub(crate) fn forget_aborted(&mut self, producer_id: i64, marker: i64) {
        self.aborted
            .retain(|a| a.producer_id != producer_id || a.last_offset != marker);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.aborted.is_empty() && self.open_at_end.is_empty()
    }

    /// The file form (`<base>.txnindex`), naming the segment's base offset and size so a file left
    /// from another segment at the same base is never taken for this one's.
    pub(crate) fn encode(&self, base_offset: i64, segment_size: u64) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + 32 * self.aborted.len() + 16 * self.open_at_end.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&base_offset.to_be_bytes());
        b.extend_from_slice(&segment_size.to_be_bytes());
        b.extend_from_slice(&(self.aborted.len() as u32).to_be_bytes());
        for a in &self.aborted {
            for v in [
                a.producer_id,
                a.first_offset,
                a.last_offset,
                a.last_stable_offset,
            ] {
                b.extend_from_slice(&v.to_be_bytes());
            }
        }
        b.extend_from_slice(&(self.open_at_end.len() as u32).to_be_bytes());
        for (pid, first) in self.open_at_end.iter() {
            b.extend_from_slice(&pid.to_be_bytes());
            b.extend_from_slice(&first.to_be_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Parses a file written by [`SegmentTxns::encode`] for the segment at `base_offset` of
    /// `segment_size` bytes; `None` if damaged or another segment's.
    pub(crate) fn decode(b: &[u8], base_offset: i64, segment_size: u64) -> Option<Self> {
        let (body, crc) = b.split_at_checked(b.len().checked_sub(4)?)?;
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = body;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, rest) = r.split_at_checked(n)?;
            r = rest;
            Some(head)
        };
        let i64_at = |b: &[u8]| i64::from_be_bytes(b.try_into().expect("8 bytes"));
        if take(4)? != MAGIC
            || i64_at(take(8)?) != base_offset
            || i64_at(take(8)?) as u64 != segment_size
        {
            return None;
        }
        let mut out = Self::default();
        let n = u32::from_be_bytes(take(4)?.try_into().ok()?);
        for _ in 0..n {
            let e = take(32)?;
            out.aborted.push(AbortedTxn {
                producer_id: i64_at(&e[..8]),
                first_offset: i64_at(&e[8..16]),
                last_offset: i64_at(&e[16..24]),
                last_stable_offset: i64_at(&e[24..]),
            });
        }
        let m = u32::from_be_bytes(take(4)?.try_into().ok()?);
        for _ in 0..m {
            let e = take(16)?;
            out.open_at_end.open(i64_at(&e[..8]), i64_at(&e[8..]));
        }
        (take(1).is_none()).then_some(out)
    }
}

pub(crate) fn txn_index_file_name(base_offset: i64) -> String {
    format!("{base_offset:020}.txnindex")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pid: i64, offset: i64) -> (BatchHeader, Vec<u8>) {
        let mut b = BatchBuilder::new(0).producer(pid, 0, 0).transactional();
        b.push(0, Some(b"k"), Some(b"v"), &[]);
        let bytes = b.finish(offset);
        (BatchHeader::parse(&bytes).unwrap(), bytes)
    }

    fn marker(pid: i64, offset: i64, commit: bool) -> (BatchHeader, Vec<u8>) {
        let mut bytes = encode_marker(
            pid,
            3,
            Marker {
                commit,
                coordinator_epoch: 7,
            },
            1_000,
        );
        batch::set_base_offset(&mut bytes, offset);
        (BatchHeader::parse(&bytes).unwrap(), bytes)
    }

    #[test]
    fn a_marker_is_a_valid_control_batch_in_kafkas_format() {
        let (h, bytes) = marker(42, 10, false);
        assert!(h.is_control() && h.is_transactional());
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (42, 3, -1)
        );
        assert_eq!(h.record_count, 1);
        batch::check_integrity(&bytes, usize::MAX).unwrap();
        let r = &batch::records(&bytes).unwrap()[0];
        assert_eq!(r.key, Some(&[0, 0, 0, 0][..]), "version 0, type 0 (ABORT)");
        assert_eq!(r.value, Some(&[0, 0, 0, 0, 0, 7][..]));
        let m = parse_marker(&h, &bytes).unwrap();
        assert_eq!((m.commit, m.coordinator_epoch), (false, 7));
        let (h, bytes) = marker(42, 10, true);
        assert!(parse_marker(&h, &bytes).unwrap().commit);
        // A data batch is no marker.
        let (h, bytes) = data(42, 0);
        assert_eq!(parse_marker(&h, &bytes), None);
    }

    #[test]
    fn interleaved_transactions_and_the_first_unstable_offset() {
        let mut open = OpenTransactions::default();
        let apply =
            |open: &mut OpenTransactions, (h, b): (BatchHeader, Vec<u8>)| open.apply(&h, &b);
        assert_eq!(apply(&mut open, data(1, 0)), None);
        assert_eq!(apply(&mut open, data(2, 1)), None);
        assert_eq!(apply(&mut open, data(1, 2)), None, "still the first");
        assert_eq!(open.first_unstable(), Some(0));
        assert_eq!(apply(&mut open, marker(1, 3, true)), None);
        assert_eq!(open.first_unstable(), Some(1));
        assert_eq!(apply(&mut open, data(1, 4)), None);
        // Producer 2 aborts while 1's new transaction (from 4) is open.
        assert_eq!(
            apply(&mut open, marker(2, 5, false)),
            Some(AbortedTxn {
                producer_id: 2,
                first_offset: 1,
                last_offset: 5,
                last_stable_offset: 4
            })
        );
        // A marker with nothing open changes nothing.
        assert_eq!(apply(&mut open, marker(9, 6, false)), None);
        assert_eq!(open.iter().collect::<Vec<_>>(), [(1, 4)]);
        assert_eq!(
            apply(&mut open, marker(1, 7, false)).map(|a| a.last_stable_offset),
            Some(8)
        );
        assert!(open.is_empty());
    }

    #[test]
    fn the_segment_file_round_trips_and_refuses_another_segments() {
        let mut t = SegmentTxns::default();
        t.aborted.push(AbortedTxn {
            producer_id: 5,
            first_offset: 100,
            last_offset: 120,
            last_stable_offset: 121,
        });
        t.open_at_end.open(6, 110);
        t.open_at_end.open(7, 115);
        let b = t.encode(100, 4096);
        assert_eq!(SegmentTxns::decode(&b, 100, 4096), Some(t.clone()));
        assert_eq!(SegmentTxns::decode(&b, 100, 4097), None);
        assert_eq!(SegmentTxns::decode(&b, 0, 4096), None);
        let mut bad = b.clone();
        bad[30] ^= 1;
        assert_eq!(SegmentTxns::decode(&bad, 100, 4096), None);
        assert_eq!(SegmentTxns::decode(&b[..3], 100, 4096), None);
    }
}
