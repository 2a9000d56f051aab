//! Idempotent producers: per producer id, the epoch, the next expected sequence number and the last
//! five batches written, so a retried batch is acknowledged without being appended twice and a gap is
//! refused. One `ProducerStates` per partition; the front end checks a request's batches before
//! queueing its append (reserving their sequence numbers, so pipelined requests from one producer are
//! checked in order; a refused request leaves the state exactly as it was) and confirms or releases
//! the reservation when the append completes.
//!
//! State is bounded like Kafka's: a producer idle for [`ProducerConfig::expiration`] (Kafka
//! `producer.id.expiration.ms`) is forgotten, and at most [`ProducerConfig::max_producers`] are kept,
//! the longest idle dropped first. A forgotten producer's next batch gets `UNKNOWN_PRODUCER_ID` unless
//! it starts a new sequence at 0.

use crate::batch::BatchHeader;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Batches remembered per producer for duplicate detection (Kafka's `max.in.flight` limit for
/// idempotence is 5).
const RECENT: usize = 5;

/// Most time between two expiry scans.
const MAX_EXPIRY_CHECK_MS: i64 = 60_000;

/// How much producer state a partition keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerConfig {
    /// A producer with no batch for this long is forgotten (Kafka `producer.id.expiration.ms`).
    pub expiration: Duration,
    /// Producers kept per partition; beyond it the longest idle is forgotten.
    pub max_producers: usize,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            expiration: Duration::from_millis(86_400_000),
            max_producers: 10_000,
        }
    }
}

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
    /// When its last batch was reserved or written (ms since the epoch): what expiry measures.
    last_ms: i64,
    /// The batches in `recent` belong to a transaction that has ended (a marker at this epoch
    /// followed them): none of them can be retried any more, and the producer's next batch may
    /// start at one of their first sequence numbers (see [`ProducerStates::end_transaction`]).
    ended: bool,
}

impl Producer {
    fn new(h: &BatchHeader, now_ms: i64) -> Self {
        Self {
            epoch: h.producer_epoch,
            next_seq: seq_add(last_seq(h), 1),
            recent: VecDeque::from([(h.base_sequence, last_seq(h), -1)]),
            last_ms: now_ms,
            ended: false,
        }
    }
    /// No append of it is in flight.
    fn is_idle(&self) -> bool {
        self.recent.iter().all(|r| r.2 >= 0)
    }
}

#[derive(Debug, Default, Clone)]
pub struct ProducerStates {
    producers: HashMap<i64, Producer>,
    config: ProducerConfig,
    /// Wall-clock ms at or after which the next expiry scan runs.
    next_expiry_ms: i64,
}

/// Equal when they hold the same producers under the same limits (whenever they last scanned).
impl PartialEq for ProducerStates {
    fn eq(&self, other: &Self) -> bool {
        self.producers == other.producers && self.config == other.config
    }
}
impl Eq for ProducerStates {}

fn last_seq(h: &BatchHeader) -> i32 {
    seq_add(h.base_sequence, h.last_offset_delta)
}

/// `seq + n` in sequence numbers' arithmetic: after `i32::MAX` comes 0 (Kafka's
/// `DefaultRecordBatch.incrementSequence`).
pub fn seq_add(seq: i32, n: i32) -> i32 {
    ((i64::from(seq) + i64::from(n)) & i64::from(i32::MAX)) as i32
}

/// Whether a batch carries idempotence fields.
pub fn is_idempotent(h: &BatchHeader) -> bool {
    h.producer_id >= 0 && h.base_sequence >= 0
}

impl ProducerStates {
    pub fn new(config: ProducerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }
    pub fn config(&self) -> ProducerConfig {
        self.config
    }
    /// Changes the limits; they apply from the next check.
    pub fn set_config(&mut self, config: ProducerConfig) {
        self.config = config;
        self.next_expiry_ms = 0;
    }
    pub fn len(&self) -> usize {
        self.producers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }
    /// Whether state for the producer is kept.
    pub fn contains(&self, producer_id: i64) -> bool {
        self.producers.contains_key(&producer_id)
    }

    /// Checks a request's batches for one partition, all or nothing: either every idempotent batch
    /// should be appended (their sequence numbers are then reserved) or the state is left exactly as
    /// it was and the first refused batch's index and outcome are returned.
    pub fn check_and_reserve_all(
        &mut self,
        headers: &[BatchHeader],
        now_ms: i64,
    ) -> Result<(), (usize, SequenceCheck)> {
        self.expire_if_due(now_ms);
        // Each producer's state before the request touched it (None: unknown before), kept only
        // when a later batch could be refused after an earlier one was reserved: a refused batch
        // itself changes nothing, so a request of one idempotent batch (the usual case) needs no
        // copy.
        let several = headers.iter().filter(|h| is_idempotent(h)).nth(1).is_some();
        let mut before: Vec<(i64, Option<Producer>)> = Vec::new();
        for (i, h) in headers.iter().enumerate() {
            if !is_idempotent(h) {
                continue;
            }
            if several && !before.iter().any(|(id, _)| *id == h.producer_id) {
                before.push((h.producer_id, self.producers.get(&h.producer_id).cloned()));
            }
            let outcome = self.reserve(h, now_ms);
            if outcome != SequenceCheck::Append {
                for (id, p) in before {
                    match p {
                        Some(p) => self.producers.insert(id, p),
                        None => self.producers.remove(&id),
                    };
                }
                return Err((i, outcome));
            }
        }
        self.enforce_limit();
        Ok(())
    }

    /// Checks one batch and, when it should be appended, reserves its sequence numbers.
    pub fn check_and_reserve(&mut self, h: &BatchHeader, now_ms: i64) -> SequenceCheck {
        match self.check_and_reserve_all(std::slice::from_ref(h), now_ms) {
            Ok(()) => SequenceCheck::Append,
            Err((_, outcome)) => outcome,
        }
    }

    fn reserve(&mut self, h: &BatchHeader, now_ms: i64) -> SequenceCheck {
        let first = h.base_sequence;
        let last = last_seq(h);
        let Some(p) = self.producers.get_mut(&h.producer_id) else {
            if first != 0 {
                return SequenceCheck::UnknownProducer;
            }
            self.producers
                .insert(h.producer_id, Producer::new(h, now_ms));
            return SequenceCheck::Append;
        };
        if h.producer_epoch < p.epoch {
            return SequenceCheck::Fenced;
        }
        if h.producer_epoch > p.epoch {
            if first != 0 {
                return SequenceCheck::OutOfOrder { expected: 0 };
            }
            *p = Producer::new(h, now_ms);
            return SequenceCheck::Append;
        }
        if p.ended {
            // The first batch after a transaction's marker: a new run of sequence numbers, from
            // where the producer expects it or from one the ended transaction's batches took.
            if first != p.next_seq && !p.recent.iter().any(|r| r.0 == first) {
                return SequenceCheck::OutOfOrder {
                    expected: p.next_seq,
                };
            }
            p.recent.clear();
            p.ended = false;
            p.next_seq = first;
        } else if let Some(&(_, _, offset)) = p.recent.iter().find(|r| r.0 == first && r.1 == last)
        {
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
        p.next_seq = seq_add(last, 1);
        p.last_ms = p.last_ms.max(now_ms);
        p.recent.push_back((first, last, -1));
        if p.recent.len() > RECENT {
            p.recent.pop_front();
        }
        SequenceCheck::Append
    }

    /// The reserved batch was written at `base_offset`.
    pub fn confirm(&mut self, h: &BatchHeader, base_offset: i64, now_ms: i64) {
        if let Some(p) = self.producers.get_mut(&h.producer_id) {
            if let Some(r) = p
                .recent
                .iter_mut()
                .find(|r| r.0 == h.base_sequence && r.1 == last_seq(h))
            {
                r.2 = base_offset;
                p.last_ms = p.last_ms.max(now_ms);
            }
        }
    }

    /// The reserved batch was not written: forget it so a retry is accepted.
    pub fn release(&mut self, h: &BatchHeader) {
        if let Some(p) = self.producers.get_mut(&h.producer_id) {
            if p.epoch == h.producer_epoch {
                p.recent
                    .retain(|r| !(r.0 == h.base_sequence && r.1 == last_seq(h)));
                // Only backwards (sequences wrap at i32::MAX): releasing a later batch after an
                // earlier one must leave the producer expecting the earlier one.
                let behind = p.next_seq.wrapping_sub(h.base_sequence) & i32::MAX;
                if behind > 0 && behind < 1 << 30 {
                    p.next_seq = h.base_sequence;
                }
            }
        }
    }

    /// The reserved batches of one append were not written: released last to first, so each
    /// producer next expects the first of its batches again.
    pub fn release_all(&mut self, headers: &[BatchHeader]) {
        for h in headers.iter().rev().filter(|h| is_idempotent(h)) {
            self.release(h);
        }
    }

    /// Whether a transaction marker at `epoch` may be written for the producer: not when it has
    /// moved on to a later epoch (the marker comes from a coordinator that was fenced).
    pub fn may_end_transaction(&self, producer_id: i64, epoch: i16) -> bool {
        self.producers
            .get(&producer_id)
            .is_none_or(|p| epoch >= p.epoch)
    }

    /// A transaction marker at `epoch` was written for the producer. A later epoch than the
    /// producer's (the coordinator bumped it: KIP-360) fences the old one, and the producer starts
    /// the new epoch at sequence 0. At the same epoch its sequence numbers go on, but the ended
    /// transaction's batches are no longer duplicates of anything: a client never retries a
    /// batch after its transaction ended, while one that aborted a transaction without knowing
    /// whether its last batches were written (their acknowledgements lost) sends its next batch
    /// with their sequence numbers again, a new record that must not be acknowledged at the
    /// aborted one's offset (as a duplicate, it would be lost). A producer not known is kept from
    /// then on at that epoch (as Kafka does), so its older epoch is fenced too.
    pub fn end_transaction(&mut self, producer_id: i64, epoch: i16, now_ms: i64) {
        let p = self.producers.entry(producer_id).or_insert(Producer {
            epoch,
            next_seq: 0,
            recent: VecDeque::new(),
            last_ms: now_ms,
            ended: false,
        });
        if epoch > p.epoch {
            p.epoch = epoch;
            p.next_seq = 0;
            p.recent.clear();
        }
        p.ended = !p.recent.is_empty();
        p.last_ms = p.last_ms.max(now_ms);
        if self.producers.len() > self.config.max_producers {
            self.enforce_limit();
        }
    }

    /// Rebuilds state from a batch already in the log (start-up replay). Its last activity is the
    /// batch's newest timestamp (the broker's clock for LogAppendTime, the producer's otherwise),
    /// or `now_ms` if it has none or one in the future: replay may keep a producer longer than the
    /// live broker would have, never shorter.
    pub fn replay(&mut self, h: &BatchHeader, now_ms: i64) {
        let ts = if (0..=now_ms).contains(&h.max_timestamp) {
            h.max_timestamp
        } else {
            now_ms
        };
        if h.is_control() && h.producer_id >= 0 {
            self.end_transaction(h.producer_id, h.producer_epoch, ts);
            return;
        }
        if !is_idempotent(h) {
            return;
        }
        let fresh = Producer {
            epoch: h.producer_epoch,
            next_seq: 0,
            recent: VecDeque::new(),
            last_ms: ts,
            ended: false,
        };
        let p = self.producers.entry(h.producer_id).or_insert(fresh.clone());
        if h.producer_epoch > p.epoch {
            *p = fresh;
        } else if h.producer_epoch < p.epoch {
            return;
        }
        if p.ended {
            p.recent.clear();
            p.ended = false;
        }
        p.next_seq = seq_add(last_seq(h), 1);
        p.last_ms = p.last_ms.max(ts);
        p.recent
            .push_back((h.base_sequence, last_seq(h), h.base_offset));
        if p.recent.len() > RECENT {
            p.recent.pop_front();
        }
        if self.producers.len() > self.config.max_producers {
            self.enforce_limit();
        }
    }

    /// Forgets idle producers whose last batch is at least `expiration` old; returns how many.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let expiration = self.config.expiration.as_millis().min(i64::MAX as u128) as i64;
        let before = self.producers.len();
        self.producers
            .retain(|_, p| !(p.is_idle() && now_ms.saturating_sub(p.last_ms) >= expiration));
        self.next_expiry_ms = now_ms.saturating_add(expiration.clamp(1, MAX_EXPIRY_CHECK_MS));
        before - self.producers.len()
    }

    /// Runs [`Self::expire`] if a scan is due: every `expiration` or minute, whichever is shorter.
    pub fn expire_if_due(&mut self, now_ms: i64) -> usize {
        if now_ms < self.next_expiry_ms {
            return 0;
        }
        self.expire(now_ms)
    }

    /// Forgets producers beyond `max_producers`, the longest idle first (one with an append in
    /// flight only if no idle one is left).
    fn enforce_limit(&mut self) {
        let excess = self
            .producers
            .len()
            .saturating_sub(self.config.max_producers);
        if excess == 0 {
            return;
        }
        let key = |p: &Producer| (!p.is_idle(), p.last_ms);
        let mut doomed: Vec<(bool, i64, i64)> = self
            .producers
            .iter()
            .map(|(id, p)| {
                let (busy, last) = key(p);
                (busy, last, *id)
            })
            .collect();
        if excess < doomed.len() {
            doomed.select_nth_unstable(excess);
        }
        for (_, _, id) in doomed.into_iter().take(excess) {
            self.producers.remove(&id);
        }
    }

    /// Serializes the confirmed state (in-flight reservations are dropped: they were never written).
    pub fn encode(&self, log_end_offset: i64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
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
            b.extend_from_slice(&p.last_ms.to_be_bytes());
            b.push(u8::from(p.ended));
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

    /// Parses a snapshot: the state (with the default config) and the log end offset it covers.
    /// `None` if damaged or of an older format (the log is then replayed instead).
    pub fn decode(b: &[u8]) -> Option<(Self, i64)> {
        if b.len() < 20 || &b[..4] != MAGIC {
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
            let last_ms = i64::from_be_bytes(take(8)?.try_into().ok()?);
            let ended = take(1)?[0] != 0;
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
                    last_ms,
                    ended,
                },
            );
        }
        Some((states, end))
    }
}

/// Snapshot format 3 (format 2, `SHP2`, had no ended-transaction flag; format 1, `SHPS`, no
/// last-activity times): an older snapshot is not read, the log is replayed instead.
const MAGIC: &[u8; 4] = b"SHP3";

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

    /// Reserves and confirms `b` at `now` as the front end does for a written batch.
    fn write(s: &mut ProducerStates, b: &BatchHeader, offset: i64, now: i64) {
        assert_eq!(s.check_and_reserve(b, now), SequenceCheck::Append);
        s.confirm(b, offset, now);
    }

    /// Sequence numbers wrap from `i32::MAX` to 0, as Kafka's producers wrap them.
    #[test]
    fn sequences_wrap_to_zero_after_i32_max() {
        assert_eq!(seq_add(i32::MAX, 1), 0);
        assert_eq!(seq_add(i32::MAX - 1, 3), 1);
        let mut s = ProducerStates::default();
        write(&mut s, &h(3, 0, 0, 1), 0, 0);
        // Jump the producer near the end (as if it had written that many).
        s.producers.get_mut(&3).unwrap().next_seq = i32::MAX - 1;
        write(&mut s, &h(3, 0, i32::MAX - 1, 3), 10, 0); // MAX-1, MAX, 0
        assert_eq!(
            s.check_and_reserve(&h(3, 0, 5, 1), 0),
            SequenceCheck::OutOfOrder { expected: 1 }
        );
        write(&mut s, &h(3, 0, 1, 2), 13, 0);
        assert_eq!(
            s.check_and_reserve(&h(3, 0, i32::MAX - 1, 3), 0),
            SequenceCheck::Duplicate { base_offset: 10 }
        );
    }

    #[test]
    fn sequences_duplicates_gaps_and_epochs() {
        let mut s = ProducerStates::default();
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 5, 1), 0),
            SequenceCheck::UnknownProducer
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 0, 10), 0),
            SequenceCheck::Append
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 0, 10), 0),
            SequenceCheck::InFlight
        );
        s.confirm(&h(7, 0, 0, 10), 100, 0);
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 0, 10), 0),
            SequenceCheck::Duplicate { base_offset: 100 }
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 11, 1), 0),
            SequenceCheck::OutOfOrder { expected: 10 }
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 10, 5), 0),
            SequenceCheck::Append
        );
        s.release(&h(7, 0, 10, 5)); // the write failed: a retry is accepted
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 10, 5), 0),
            SequenceCheck::Append
        );
        s.confirm(&h(7, 0, 10, 5), 110, 0);
        assert_eq!(
            s.check_and_reserve(&h(7, 1, 3, 1), 0),
            SequenceCheck::OutOfOrder { expected: 0 }
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 1, 0, 1), 0),
            SequenceCheck::Append
        );
        assert_eq!(
            s.check_and_reserve(&h(7, 0, 15, 1), 0),
            SequenceCheck::Fenced
        );
    }

    #[test]
    fn a_refused_request_leaves_the_state_exactly_as_before() {
        // Sequences 0-4, 5-9 and then 20 in one request, from a producer never seen before: the gap
        // refuses the request, and the producer stays unknown.
        let request = [h(3, 0, 0, 5), h(3, 0, 5, 5), h(3, 0, 20, 1)];
        let mut s = ProducerStates::default();
        assert_eq!(
            s.check_and_reserve_all(&request, 0),
            Err((2, SequenceCheck::OutOfOrder { expected: 10 }))
        );
        assert_eq!(s, ProducerStates::default());
        assert!(!s.contains(3));
        // The retry of sequence 0 succeeds.
        assert_eq!(
            s.check_and_reserve(&h(3, 0, 0, 5), 0),
            SequenceCheck::Append
        );

        // A known producer with five batches remembered (a reservation pushes the oldest out) and
        // one of another epoch (a reservation at a new epoch resets it): both restored.
        let mut s = ProducerStates::default();
        for i in 0..5 {
            write(&mut s, &h(1, 0, i * 2, 2), i as i64 * 2, 10);
        }
        write(&mut s, &h(2, 0, 0, 1), 10, 10);
        let before = s.clone();
        let request = [
            h(1, 0, 10, 5),
            h(2, 1, 0, 1),
            h(1, 0, 15, 5),
            h(1, 0, 30, 1),
        ];
        assert_eq!(
            s.check_and_reserve_all(&request, 20),
            Err((3, SequenceCheck::OutOfOrder { expected: 20 }))
        );
        assert_eq!(s, before);
        assert_eq!(
            s.check_and_reserve(&h(1, 0, 0, 2), 20),
            SequenceCheck::Duplicate { base_offset: 0 }
        );
        assert_eq!(
            s.check_and_reserve(&h(2, 0, 1, 1), 20),
            SequenceCheck::Append
        );
    }

    #[test]
    fn a_failed_append_releases_back_to_its_first_batch() {
        let mut s = ProducerStates::default();
        let request = [h(4, 0, 0, 5), h(4, 0, 5, 5)];
        assert_eq!(s.check_and_reserve_all(&request, 0), Ok(()));
        s.release_all(&request);
        assert_eq!(s.check_and_reserve_all(&request, 0), Ok(()));
        // Two pipelined requests failed by one write are released first to first: the producer
        // still expects the first one's sequence, not the second's.
        let (a, b) = (h(4, 0, 10, 5), h(4, 0, 15, 5));
        s.release_all(&request);
        assert_eq!(s.check_and_reserve_all(&request, 0), Ok(()));
        assert_eq!(s.check_and_reserve_all(&[a], 0), Ok(()));
        assert_eq!(s.check_and_reserve_all(&[b], 0), Ok(()));
        s.release_all(&[a]);
        s.release_all(&[b]);
        assert_eq!(s.check_and_reserve_all(&[a], 0), Ok(()));
    }

    #[test]
    fn idle_producers_expire_and_busy_ones_do_not() {
        let config = ProducerConfig {
            expiration: Duration::from_millis(1_000),
            max_producers: 100,
        };
        let mut s = ProducerStates::new(config);
        write(&mut s, &h(1, 0, 0, 5), 0, 5_000);
        assert_eq!(
            s.check_and_reserve(&h(2, 0, 0, 1), 5_000),
            SequenceCheck::Append
        ); // in flight
        assert_eq!(s.expire(5_999), 0);
        assert_eq!(s.expire(6_000), 1);
        assert!(!s.contains(1) && s.contains(2));
        // Forgotten: its next sequence is refused, a new one from 0 starts over.
        assert_eq!(
            s.check_and_reserve(&h(1, 0, 5, 1), 6_000),
            SequenceCheck::UnknownProducer
        );
        assert_eq!(
            s.check_and_reserve(&h(1, 0, 0, 1), 6_000),
            SequenceCheck::Append
        );
        // A scan is not due on every check: the next one runs a full period after the last.
        s.confirm(&h(1, 0, 0, 1), 9, 6_000);
        s.confirm(&h(2, 0, 0, 1), 10, 6_000);
        assert_eq!(s.expire_if_due(6_999), 0);
        assert_eq!(s.expire_if_due(7_000), 2);
        assert!(s.is_empty());
    }

    #[test]
    fn the_limit_drops_the_longest_idle_first() {
        let config = ProducerConfig {
            expiration: Duration::from_secs(3_600),
            max_producers: 3,
        };
        let mut s = ProducerStates::new(config);
        // Producer 1 is the oldest but has an append in flight; 2 is the oldest idle one.
        assert_eq!(
            s.check_and_reserve(&h(1, 0, 0, 1), 10),
            SequenceCheck::Append
        );
        write(&mut s, &h(2, 0, 0, 1), 0, 20);
        write(&mut s, &h(3, 0, 0, 1), 1, 30);
        write(&mut s, &h(4, 0, 0, 1), 2, 40);
        assert_eq!(s.len(), 3);
        assert!(s.contains(1) && !s.contains(2) && s.contains(3) && s.contains(4));
        // Activity makes a producer young again: 3 writes, so 1 (now idle) goes next.
        s.confirm(&h(1, 0, 0, 1), 3, 10);
        write(&mut s, &h(3, 0, 1, 1), 4, 50);
        write(&mut s, &h(5, 0, 0, 1), 5, 60);
        let kept: Vec<bool> = (1..=5).map(|id| s.contains(id)).collect();
        assert_eq!(kept, [false, false, true, true, true]);
    }

    #[test]
    fn snapshot_round_trip_and_replay_agree() {
        let mut live = ProducerStates::default();
        let mut replayed = ProducerStates::default();
        for (i, seq) in [0, 3, 6, 9, 12, 15, 18].into_iter().enumerate() {
            let mut b = h(1, 2, seq, 3);
            b.max_timestamp = 1_000 + i as i64;
            b.base_offset = i as i64 * 3;
            write(&mut live, &b, b.base_offset, b.max_timestamp);
            replayed.replay(&b, 2_000);
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
            pending.check_and_reserve(&h(9, 0, 0, 2), 0),
            SequenceCheck::Append
        );
        let (mut restored, _) = ProducerStates::decode(&pending.encode(0)).unwrap();
        assert_eq!(
            restored.check_and_reserve(&h(9, 0, 0, 2), 0),
            SequenceCheck::Append
        );
        let mut live2 = live;
        assert_eq!(
            live2.check_and_reserve(&h(1, 2, 18, 3), 2_000),
            SequenceCheck::Duplicate { base_offset: 18 }
        );
        assert_eq!(
            live2.check_and_reserve(&h(1, 2, 21, 1), 2_000),
            SequenceCheck::Append
        );
    }

    #[test]
    fn a_marker_at_a_bumped_epoch_fences_the_old_one_live_and_in_replay() {
        // Replay takes a batch's timestamp as the producer's last activity: as live, here.
        let marker = |pid: i64, epoch: i16, ts: i64| BatchHeader {
            attributes: crate::batch::ATTR_CONTROL | crate::batch::ATTR_TRANSACTIONAL,
            base_sequence: -1,
            max_timestamp: ts,
            ..h(pid, epoch, 0, 1)
        };
        let data = BatchHeader {
            max_timestamp: 10,
            ..h(1, 0, 0, 3)
        };
        let mut live = ProducerStates::default();
        let mut replayed = ProducerStates::default();
        write(&mut live, &data, 0, 10);
        replayed.replay(&data, 10);
        // At the same epoch sequences go on across transactions, and the ended transaction's
        // batches are no longer duplicates: its sequence numbers may be sent again.
        assert!(live.may_end_transaction(1, 0));
        live.end_transaction(1, 0, 10);
        replayed.replay(&marker(1, 0, 10), 10);
        assert_eq!(live, replayed);
        assert_eq!(
            live.check_and_reserve(&h(1, 0, 0, 3), 10),
            SequenceCheck::Append
        );
        // The coordinator bumps the epoch (a timed-out transaction aborted): the old epoch is
        // fenced, and a marker from it refused; the new epoch starts at 0.
        live.end_transaction(1, 1, 20);
        replayed.replay(&marker(1, 1, 20), 20);
        assert_eq!(live, replayed);
        assert!(!live.may_end_transaction(1, 0));
        assert_eq!(
            live.check_and_reserve(&h(1, 0, 3, 1), 20),
            SequenceCheck::Fenced
        );
        assert_eq!(
            live.check_and_reserve(&h(1, 1, 0, 1), 20),
            SequenceCheck::Append
        );
        // A producer never seen may end a transaction; its epoch is kept from then on.
        assert!(live.may_end_transaction(9, 2));
        live.end_transaction(9, 2, 20);
        assert!(!live.may_end_transaction(9, 1));
        assert_eq!(
            live.check_and_reserve(&h(9, 2, 0, 1), 20),
            SequenceCheck::Append
        );
    }

    /// A transactional producer that aborts without knowing whether its last batches were
    /// written (their acknowledgements lost in a crash) sends its next record with their sequence
    /// numbers: a new record after the marker, never a duplicate acknowledged at the aborted
    /// batch's offset. Live, after a snapshot and in replay alike; sequences that neither go on
    /// nor restart an ended batch are still out of order, and the new run dedups its own retries.
    #[test]
    fn after_a_marker_the_ended_transactions_sequences_may_be_sent_again() {
        let marker = |pid: i64, epoch: i16| BatchHeader {
            attributes: crate::batch::ATTR_CONTROL | crate::batch::ATTR_TRANSACTIONAL,
            base_sequence: -1,
            ..h(pid, epoch, 0, 1)
        };
        let mut live = ProducerStates::default();
        let mut replayed = ProducerStates::default();
        for (seq, offset) in [(0, 0), (1, 1)] {
            write(&mut live, &h(7, 3, seq, 1), offset, 10);
            replayed.replay(
                &BatchHeader {
                    base_offset: offset,
                    ..h(7, 3, seq, 1)
                },
                10,
            );
        }
        // Before the marker a retry of the last batch is a duplicate.
        assert_eq!(
            live.check_and_reserve(&h(7, 3, 1, 1), 10),
            SequenceCheck::Duplicate { base_offset: 1 }
        );
        live.end_transaction(7, 3, 10);
        replayed.replay(&marker(7, 3), 10);
        let (mut decoded, _) = ProducerStates::decode(&live.encode(3)).unwrap();
        decoded.set_config(live.config());
        for s in [&mut live, &mut replayed, &mut decoded] {
            assert_eq!(
                s.check_and_reserve(&h(7, 3, 5, 1), 20),
                SequenceCheck::OutOfOrder { expected: 2 }
            );
            // Sequence 1 again (the client never saw it acknowledged): appended anew.
            assert_eq!(
                s.check_and_reserve(&h(7, 3, 1, 1), 20),
                SequenceCheck::Append
            );
            s.confirm(&h(7, 3, 1, 1), 4, 20);
            assert_eq!(
                s.check_and_reserve(&h(7, 3, 1, 1), 20),
                SequenceCheck::Duplicate { base_offset: 4 }
            );
            assert_eq!(
                s.check_and_reserve(&h(7, 3, 2, 1), 20),
                SequenceCheck::Append
            );
        }
        // A marker after batches that went on as expected: the next sequence follows them.
        let mut on = ProducerStates::default();
        write(&mut on, &h(8, 0, 0, 2), 0, 10);
        on.end_transaction(8, 0, 10);
        assert_eq!(
            on.check_and_reserve(&h(8, 0, 2, 1), 20),
            SequenceCheck::Append
        );
    }

    #[test]
    fn expiry_survives_the_snapshot_and_replay_uses_batch_times() {
        let config = ProducerConfig {
            expiration: Duration::from_millis(1_000),
            max_producers: 2,
        };
        let mut s = ProducerStates::new(config);
        write(&mut s, &h(1, 0, 0, 1), 0, 100);
        write(&mut s, &h(2, 0, 0, 1), 1, 900);
        // The snapshot keeps each producer's last activity: after decoding, expiry is where it was.
        let (mut d, _) = ProducerStates::decode(&s.encode(2)).unwrap();
        d.set_config(config);
        assert_eq!(d.expire(1_100), 1);
        assert!(!d.contains(1) && d.contains(2));

        // Replay takes a batch's timestamp as its producer's last activity (the clock for batches
        // without one or from the future), and keeps the limit.
        let mut r = ProducerStates::new(config);
        let at = |pid, ts| BatchHeader {
            max_timestamp: ts,
            ..h(pid, 0, 0, 1)
        };
        r.replay(&at(1, 100), 5_000);
        r.replay(&at(2, -1), 5_000);
        r.replay(&at(3, 99_999), 5_000);
        assert!(
            !r.contains(1) && r.contains(2) && r.contains(3),
            "limit of 2"
        );
        assert_eq!(r.expire(5_999), 0);
        assert_eq!(r.expire(6_000), 2);
    }
}
