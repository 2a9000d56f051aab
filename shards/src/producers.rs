//! Idempotent producers: per producer id, the epoch, the next expected sequence number and the last
//! five batches written, so a retried batch is acknowledged without being appended twice and a gap is
//! refused. One `ProducerStates` per partition; the front end checks a batch before queueing its append
//! (reserving its sequence numbers, so pipelined requests from one producer are checked in order) and
//! confirms or releases the reservation when the append completes.

use crate::batch::BatchHeader;
use std::collections::{HashMap, VecDeque};

/// Batches remembered per producer for duplicate detection (Kafka's `max.in.flight` limit for
/// idempotence is 5).
const RECENT: usize = 5;

/// What to do with a batch from an idempotent producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Append it (its sequence numbers are now reserved).
    Append,
    /// Already written at `base_offset` (a retry): acknowledge without appending.
    Duplicate { base_offset: i64 },
    /// Already seen but its append has not completed yet: the client should retry.
    InFlight,
    /// A gap or a reordering (Kafka: `OUT_OF_ORDER_SEQUENCE_NUMBER`).
    OutOfOrder { expected: i32 },
    /// An older epoch of a producer that has moved on (Kafka: `INVALID_PRODUCER_EPOCH`).
    Fenced,
    /// A sequence other than 0 from a producer we know nothing of (Kafka: `UNKNOWN_PRODUCER_ID`).
    UnknownProducer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Producer {
    epoch: i16,
    next_seq: i32,
    /// (first sequence, last sequence, base offset or -1 while in flight), oldest first.
    recent: VecDeque<(i32, i32, i64)>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProducerStates {
    producers: HashMap<i64, Producer>,
}

fn last_seq(h: &BatchHeader) -> i32 {
    h.base_sequence.wrapping_add(h.last_offset_delta)
}

/// Whether a batch carries idempotence fields.
pub fn is_idempotent(h: &BatchHeader) -> bool {
    h.producer_id >= 0 && h.base_sequence >= 0
}

impl ProducerStates {
    pub fn len(&self) -> usize {
        self.producers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Checks a batch and, when it should be appended, reserves its sequence numbers.
    pub fn check_and_reserve(&mut self, h: &BatchHeader) -> SequenceCheck {
        let first = h.base_sequence;
        let last = last_seq(h);
        let Some(p) = self.producers.get_mut(&h.producer_id) else {
            if first != 0 {
                return SequenceCheck::UnknownProducer;
            }
            let recent = VecDeque::from([(first, last, -1)]);
            self.producers.insert(
                h.producer_id,
                Producer {
                    epoch: h.producer_epoch,
                    next_seq: last.wrapping_add(1),
                    recent,
                },
            );
            return SequenceCheck::Append;
        };
        if h.producer_epoch < p.epoch {
            return SequenceCheck::Fenced;
        }
        if h.producer_epoch > p.epoch {
            if first != 0 {
                return SequenceCheck::OutOfOrder { expected: 0 };
            }
            *p = Producer {
                epoch: h.producer_epoch,
                next_seq: last.wrapping_add(1),
                recent: VecDeque::from([(first, last, -1)]),
            };
            return SequenceCheck::Append;
        }
        if let Some(&(_, _, offset)) = p.recent.iter().find(|r| r.0 == first && r.1 == last) {
            return if offset >= 0 {
                SequenceCheck::Duplicate {
                    base_offset: offset,
                }
            } else {
                SequenceCheck::InFlight
            };
        }
        if first != p.next_seq {
            return SequenceCheck::OutOfOrder {
                expected: p.next_seq,
            };
        }
        p.next_seq = last.wrapping_add(1);
        p.recent.push_back((first, last, -1));
        if p.recent.len() > RECENT {
            p.recent.pop_front();
        }
        SequenceCheck::Append
    }

    /// The reserved batch was written at `base_offset`.
    pub fn confirm(&mut self, h: &BatchHeader, base_offset: i64) {
        if let Some(p) = self.producers.get_mut(&h.producer_id) {
            if let Some(r) = p
                .recent
                .iter_mut()
                .find(|r| r.0 == h.base_sequence && r.1 == last_seq(h))
            {
                r.2 = base_offset;
            }
        }
    }

    /// The reserved batch was not written: forget it so a retry is accepted.
    pub fn release(&mut self, h: &BatchHeader) {
        if let Some(p) = self.producers.get_mut(&h.producer_id) {
            if p.epoch == h.producer_epoch {
                p.recent
                    .retain(|r| !(r.0 == h.base_sequence && r.1 == last_seq(h)));
                p.next_seq = h.base_sequence;
            }
        }
    }

    /// Rebuilds state from a batch already in the log (start-up replay).
    pub fn replay(&mut self, h: &BatchHeader) {
        if !is_idempotent(h) {
            return;
        }
        let p = self.producers.entry(h.producer_id).or_insert(Producer {
            epoch: h.producer_epoch,
            next_seq: 0,
            recent: VecDeque::new(),
        });
        if h.producer_epoch > p.epoch {
            *p = Producer {
                epoch: h.producer_epoch,
                next_seq: 0,
                recent: VecDeque::new(),
            };
        } else if h.producer_epoch < p.epoch {
            return;
        }
        p.next_seq = last_seq(h).wrapping_add(1);
        p.recent
            .push_back((h.base_sequence, last_seq(h), h.base_offset));
        if p.recent.len() > RECENT {
            p.recent.pop_front();
        }
    }

    /// Serializes the confirmed state (in-flight reservations are dropped: they were never written).
    pub fn encode(&self, log_end_offset: i64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"SHPS");
        b.extend_from_slice(&log_end_offset.to_be_bytes());
        b.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        for (id, p) in &self.producers {
            let done: Vec<_> = p.recent.iter().filter(|r| r.2 >= 0).collect();
            // The first batch still in flight was never written: the next sequence starts there.
            let next = p
                .recent
                .iter()
                .find(|r| r.2 < 0)
                .map_or(p.next_seq, |r| r.0);
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&p.epoch.to_be_bytes());
            b.extend_from_slice(&next.to_be_bytes());
            b.push(done.len() as u8);
            for r in done {
                b.extend_from_slice(&r.0.to_be_bytes());
                b.extend_from_slice(&r.1.to_be_bytes());
                b.extend_from_slice(&r.2.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Parses a snapshot: the state and the log end offset it covers. `None` if damaged.
    pub fn decode(b: &[u8]) -> Option<(Self, i64)> {
        if b.len() < 20 || &b[..4] != b"SHPS" {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = body;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, rest) = r.split_at_checked(n)?;
            r = rest;
            Some(head)
        };
        let _magic = take(4)?;
        let end = i64::from_be_bytes(take(8)?.try_into().ok()?);
        let n = u32::from_be_bytes(take(4)?.try_into().ok()?);
        let mut states = Self::default();
        for _ in 0..n {
            let id = i64::from_be_bytes(take(8)?.try_into().ok()?);
            let epoch = i16::from_be_bytes(take(2)?.try_into().ok()?);
            let next_seq = i32::from_be_bytes(take(4)?.try_into().ok()?);
            let k = take(1)?[0] as usize;
            let mut recent = VecDeque::with_capacity(k.min(RECENT));
            for _ in 0..k {
                let first = i32::from_be_bytes(take(4)?.try_into().ok()?);
                let last = i32::from_be_bytes(take(4)?.try_into().ok()?);
                let off = i64::from_be_bytes(take(8)?.try_into().ok()?);
                recent.push_back((first, last, off));
            }
            states.producers.insert(
                id,
                Producer {
                    epoch,
                    next_seq,
                    recent,
                },
            );
        }
        Some((states, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pid: i64, epoch: i16, seq: i32, n: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: 100,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: n - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: n,
        }
    }

    #[test]
    fn sequences_duplicates_gaps_and_epochs() {
        let mut s = ProducerStates::default();
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 5, 1)),
            SequenceCheck::UnknownProducer
        );
        assert_eq!(s.check_and_reserve(&h(7, 0, 0, 10)), SequenceCheck::Append);
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 0, 10)),
            SequenceCheck::InFlight
        );
        s.confirm(&h(7, 0, 0, 10), 100);
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 0, 10)),
            SequenceCheck::Duplicate { base_offset: 100 }
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 11, 1)),
            SequenceCheck::OutOfOrder { expected: 10 }
        );
        assert_eq!(s.check_and_reserve(&h(7, 0, 10, 5)), SequenceCheck::Append);
        s.release(&h(7, 0, 10, 5)); // the write failed: a retry is accepted
        assert_eq!(s.check_and_reserve(&h(7, 0, 10, 5)), SequenceCheck::Append);
        s.confirm(&h(7, 0, 10, 5), 110);
        assert_eq!(
            s.check_and_reserve(&h(7, 1, 3, 1)),
            SequenceCheck::OutOfOrder { expected: 0 }
        );
        assert_eq!(s.check_and_reserve(&h(7, 1, 0, 1)), SequenceCheck::Append);
        assert_eq!(s.check_and_reserve(&h(7, 0, 15, 1)), SequenceCheck::Fenced);
    }

    #[test]
    fn snapshot_round_trip_and_replay_agree() {
        let mut live = ProducerStates::default();
        let mut replayed = ProducerStates::default();
        for (i, seq) in [0, 3, 6, 9, 12, 15, 18].into_iter().enumerate() {
            let mut b = h(1, 2, seq, 3);
            assert_eq!(live.check_and_reserve(&b), SequenceCheck::Append);
            b.base_offset = i as i64 * 3;
            live.confirm(&b, b.base_offset);
            replayed.replay(&b);
        }
        assert_eq!(live, replayed);
        let (decoded, end) = ProducerStates::decode(&live.encode(21)).unwrap();
        assert_eq!((decoded, end), (live.clone(), 21));
        let mut bad = live.encode(21);
        bad[10] ^= 1;
        assert!(ProducerStates::decode(&bad).is_none());
        // A reservation still in flight at snapshot time was never written: a retry is accepted.
        let mut pending = ProducerStates::default();
        assert_eq!(
            pending.check_and_reserve(&h(9, 0, 0, 2)),
            SequenceCheck::Append
        );
        let (mut restored, _) = ProducerStates::decode(&pending.encode(0)).unwrap();
        assert_eq!(
            restored.check_and_reserve(&h(9, 0, 0, 2)),
            SequenceCheck::Append
        );
        let mut live2 = live;
        assert_eq!(
            live2.check_and_reserve(&h(1, 2, 18, 3)),
            SequenceCheck::Duplicate { base_offset: 18 }
        );
        assert_eq!(
            live2.check_and_reserve(&h(1, 2, 21, 1)),
            SequenceCheck::Append
        );
    }
}
