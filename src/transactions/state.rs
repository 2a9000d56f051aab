//! One transactional id's state machine (KIP-98, KIP-360), pure and synchronous: every operation
//! takes the current state and gives back either a [`Transition`] (the next state, to be made
//! durable before it is installed, and the markers to write after that) or Kafka's error code.
//! Nothing here does I/O or reads the clock: the caller passes `now` (ms).
//!
//! The coordinator's epoch fence (Kafka's PrepareEpochFence) is not a state of its own here: the
//! bumped epoch and PrepareAbort are written as one record, so no state sits between them.

use kafka_protocol::error::ResponseError;
use std::collections::BTreeSet;

/// (topic, partition)
pub type TopicPartition = (String, i32);

/// No producer id (Kafka's `RecordBatch.NO_PRODUCER_ID`).
pub const NO_PRODUCER_ID: i64 = -1;
/// No epoch (Kafka's `RecordBatch.NO_PRODUCER_EPOCH`).
pub const NO_EPOCH: i16 = -1;

/// An epoch this high is not bumped again: the producer gets a new producer id instead, so the
/// epoch never wraps (Kafka's `isEpochExhausted`).
pub fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// Kafka's transaction states, with their codes in the log (and in DescribeTransactions' names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    /// A producer id is assigned and no transaction is open.
    Empty,
    /// Partitions or offsets were added: a transaction is open.
    Ongoing,
    /// EndTxn(commit) accepted: commit markers are being written.
    PrepareCommit,
    /// EndTxn(abort), a timeout or a new producer: abort markers are being written.
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    /// The transactional id expired: its record is a tombstone.
    Dead,
}

impl TxnState {
    pub fn code(self) -> u8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            _ => return None,
        })
    }

    /// Kafka's name (DescribeTransactions, ListTransactions' state filter).
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
        }
    }

    fn preparing(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// What the coordinator keeps per transactional id (Kafka's `TransactionMetadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMetadata {
    pub producer_id: i64,
    /// The producer id before the last rotation (epoch exhaustion), so a retried InitProducerId
    /// that lost its answer is recognised.
    pub last_producer_id: i64,
    pub epoch: i16,
    /// The epoch a producer may still present after the coordinator moved on without it: the one
    /// before a client's own epoch bump, or the one a timeout abort fenced (KIP-360).
    pub last_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// Partitions in the open (or ending) transaction.
    pub partitions: BTreeSet<TopicPartition>,
    /// Groups whose offsets the transaction commits (AddOffsetsToTxn).
    pub groups: BTreeSet<String>,
    /// When the open transaction began (-1: none open); its timeout counts from here.
    pub start_ms: i64,
    pub last_update_ms: i64,
}

/// Markers to write once the transition is durable: one control batch per partition (and the
/// groups' transactional offsets made visible or dropped), then [`TxnMetadata::markers_written`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    pub partitions: Vec<TopicPartition>,
    pub groups: Vec<String>,
}

/// The next state and what to do once it is durable. `next` equal to the current state means
/// nothing changed (a retry): nothing to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub next: TxnMetadata,
    pub markers: Option<Markers>,
}

/// What InitProducerId leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitOutcome {
    /// Answer with `next`'s producer id and epoch once it is durable.
    Ready(Transition),
    /// An open transaction must be aborted first: carry the transition out and answer
    /// CONCURRENT_TRANSACTIONS; the client retries and gets the epoch bumped once more.
    AbortFirst(Transition),
}

/// A producer id and epoch presented by a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdAndEpoch {
    pub producer_id: i64,
    pub epoch: i16,
}

/// Kafka's answer to a fenced producer is PRODUCER_FENCED since it exists (InitProducerId v4,
/// AddPartitionsToTxn v2, AddOffsetsToTxn v2, EndTxn v2); older clients get INVALID_PRODUCER_EPOCH.
pub fn for_client(e: ResponseError, knows_producer_fenced: bool) -> ResponseError {
    match e {
        ResponseError::ProducerFenced if !knows_producer_fenced => {
            ResponseError::InvalidProducerEpoch
        }
        e => e,
    }
}

/// A new producer's state (Kafka creates it with no epoch, then bumps it to 0).
fn fresh(producer_id: i64, timeout_ms: i32, now: i64) -> TxnMetadata {
    TxnMetadata {
        producer_id,
        last_producer_id: NO_PRODUCER_ID,
        epoch: 0,
        last_epoch: NO_EPOCH,
        timeout_ms,
        state: TxnState::Empty,
        partitions: BTreeSet::new(),
        groups: BTreeSet::new(),
        start_ms: -1,
        last_update_ms: now,
    }
}

/// InitProducerId for a transactional id: `current` is its state (`None` or Dead: unknown),
/// `expected` the producer id and epoch the request carries (KIP-360), if any; `allocate` hands
/// out a new producer id.
pub fn init_producer_id(
    current: Option<&TxnMetadata>,
    timeout_ms: i32,
    max_timeout_ms: i32,
    expected: Option<ProducerIdAndEpoch>,
    now: i64,
    allocate: &mut dyn FnMut() -> i64,
) -> Result<InitOutcome, ResponseError> {
    if timeout_ms <= 0 || timeout_ms > max_timeout_ms {
        return Err(ResponseError::InvalidTransactionTimeout);
    }
    let m = match current {
        Some(m) if m.state != TxnState::Dead => m,
        _ => {
            return Ok(InitOutcome::Ready(Transition {
                next: fresh(allocate(), timeout_ms, now),
                markers: None,
            }))
        }
    };
    if let Some(e) = expected {
        let known = e.producer_id == m.producer_id
            || (e.producer_id == m.last_producer_id && epoch_exhausted(e.epoch));
        if !known {
            return Err(ResponseError::ProducerFenced);
        }
    }
    match m.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort => {
            Err(ResponseError::ConcurrentTransactions)
        }
        // A new producer fences the old one: abort its transaction under a bumped epoch the old
        // producer never learns (so it cannot recover from it).
        TxnState::Ongoing => Ok(InitOutcome::AbortFirst(m.abort_with_fence(NO_EPOCH, now))),
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort | TxnState::Dead => {
            let rotate = epoch_exhausted(m.epoch) && expected.is_none_or(|e| e.epoch == m.epoch);
            let mut next = m.ended(now);
            next.timeout_ms = timeout_ms;
            if rotate {
                next.last_producer_id = m.producer_id;
                next.producer_id = allocate();
                next.epoch = 0;
                next.last_epoch = if expected.is_some() {
                    m.epoch
                } else {
                    NO_EPOCH
                };
            } else {
                let (epoch, last_epoch) = match expected {
                    None => (m.epoch + 1, NO_EPOCH),
                    Some(e) if e.epoch == m.epoch => (m.epoch + 1, m.epoch),
                    // A retry whose answer was lost, or the producer a timeout abort fenced
                    // (KIP-360): it gets the current epoch, not bumped again.
                    Some(e) if e.epoch == m.last_epoch => (m.epoch, m.last_epoch),
                    Some(_) => return Err(ResponseError::ProducerFenced),
                };
                next.epoch = epoch;
                next.last_epoch = last_epoch;
            }
            Ok(InitOutcome::Ready(Transition {
                next,
                markers: None,
            }))
        }
    }
}

impl TxnMetadata {
    /// The common checks of a client's transactional request.
    fn check_producer(&self, producer_id: i64, epoch: i16) -> Result<(), ResponseError> {
        if self.state == TxnState::Dead || producer_id != self.producer_id {
            Err(ResponseError::InvalidProducerIdMapping)
        } else if epoch != self.epoch {
            Err(ResponseError::ProducerFenced)
        } else if self.state.preparing() {
            Err(ResponseError::ConcurrentTransactions)
        } else {
            Ok(())
        }
    }

    /// This state with no transaction open (after a completion, or for a new epoch).
    fn ended(&self, now: i64) -> TxnMetadata {
        TxnMetadata {
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: now,
            ..self.clone()
        }
    }

    /// This state with the transaction open (begun now if none was).
    fn ongoing(&self, now: i64) -> TxnMetadata {
        let mut next = if self.state == TxnState::Ongoing {
            self.clone()
        } else {
            TxnMetadata {
                start_ms: now,
                ..self.ended(now)
            }
        };
        next.state = TxnState::Ongoing;
        next.last_update_ms = now;
        next
    }

    fn markers(&self, commit: bool) -> Markers {
        Markers {
            producer_id: self.producer_id,
            epoch: self.epoch,
            commit,
            partitions: self.partitions.iter().cloned().collect(),
            groups: self.groups.iter().cloned().collect(),
        }
    }

    fn prepare(&self, commit: bool, now: i64) -> Transition {
        let next = TxnMetadata {
            state: if commit {
                TxnState::PrepareCommit
            } else {
                TxnState::PrepareAbort
            },
            last_update_ms: now,
            ..self.clone()
        };
        let markers = Some(next.markers(commit));
        Transition { next, markers }
    }

    /// Aborts the open transaction under a bumped epoch (Kafka's epoch fence): the markers carry
    /// the new epoch, so the partitions refuse the old producer's writes from then on.
    fn abort_with_fence(&self, last_epoch: i16, now: i64) -> Transition {
        let bumped = TxnMetadata {
            // Up to i16::MAX: the next InitProducerId then rotates the producer id.
            epoch: self.epoch.saturating_add(1),
            last_epoch,
            ..self.clone()
        };
        bumped.prepare(false, now)
    }

    /// AddPartitionsToTxn: the partitions join the transaction (which opens if none is).
    pub fn add_partitions(
        &self,
        producer_id: i64,
        epoch: i16,
        partitions: &[TopicPartition],
        now: i64,
    ) -> Result<Transition, ResponseError> {
        self.check_producer(producer_id, epoch)?;
        if self.state == TxnState::Ongoing
            && partitions.iter().all(|tp| self.partitions.contains(tp))
        {
            return Ok(self.unchanged());
        }
        let mut next = self.ongoing(now);
        next.partitions.extend(partitions.iter().cloned());
        Ok(Transition {
            next,
            markers: None,
        })
    }

    /// AddOffsetsToTxn: `group`'s offsets are committed (or dropped) with the transaction.
    pub fn add_offsets(
        &self,
        producer_id: i64,
        epoch: i16,
        group: &str,
        now: i64,
    ) -> Result<Transition, ResponseError> {
        self.check_producer(producer_id, epoch)?;
        if self.state == TxnState::Ongoing && self.groups.contains(group) {
            return Ok(self.unchanged());
        }
        let mut next = self.ongoing(now);
        next.groups.insert(group.to_string());
        Ok(Transition {
            next,
            markers: None,
        })
    }

    /// EndTxn: commit or abort the open transaction. A retry of the same outcome is answered
    /// without a change (CONCURRENT_TRANSACTIONS while its markers are still being written); the
    /// other outcome is INVALID_TXN_STATE.
    pub fn end_txn(
        &self,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        now: i64,
    ) -> Result<Transition, ResponseError> {
        if self.state == TxnState::Dead || producer_id != self.producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if epoch != self.epoch {
            return Err(ResponseError::ProducerFenced);
        }
        match (self.state, commit) {
            (TxnState::Ongoing, _) => Ok(self.prepare(commit, now)),
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
                Ok(self.unchanged())
            }
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                Err(ResponseError::ConcurrentTransactions)
            }
            _ => Err(ResponseError::InvalidTxnState),
        }
    }

    /// Every marker of the Prepare state is written: the transaction is complete. `epoch` is the
    /// markers' epoch, so a late completion of an older round changes nothing.
    pub fn markers_written(&self, epoch: i16, now: i64) -> Result<Transition, ResponseError> {
        let state = match self.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return Err(ResponseError::InvalidTxnState),
        };
        if epoch != self.epoch {
            return Err(ResponseError::ProducerFenced);
        }
        Ok(Transition {
            next: TxnMetadata {
                state,
                ..self.ended(now)
            },
            markers: None,
        })
    }

    /// An Ongoing transaction open longer than its timeout is aborted by the coordinator with the
    /// epoch bumped (Kafka does so); the producer may come back with its old epoch (KIP-360).
    pub fn expire(&self, now: i64) -> Option<Transition> {
        let late = self.state == TxnState::Ongoing
            && now.saturating_sub(self.start_ms) > i64::from(self.timeout_ms);
        late.then(|| self.abort_with_fence(self.epoch, now))
    }

    /// After a restart: a Prepare state's markers are written again (a second marker where one
    /// was written closes nothing); an Ongoing transaction past its timeout is aborted. `None`:
    /// nothing to do.
    pub fn recover(&self, now: i64) -> Option<Transition> {
        match self.state {
            TxnState::PrepareCommit => Some(Transition {
                next: self.clone(),
                markers: Some(self.markers(true)),
            }),
            TxnState::PrepareAbort => Some(Transition {
                next: self.clone(),
                markers: Some(self.markers(false)),
            }),
            _ => self.expire(now),
        }
    }

    /// A transactional id idle (no transaction open) for `expiration_ms` is forgotten (Kafka's
    /// `transactional.id.expiration.ms`): the next state is Dead, written as a tombstone.
    pub fn expire_id(&self, now: i64, expiration_ms: i64) -> Option<Transition> {
        let idle = matches!(
            self.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        ) && now.saturating_sub(self.last_update_ms) >= expiration_ms;
        idle.then(|| Transition {
            next: TxnMetadata {
                state: TxnState::Dead,
                last_update_ms: now,
                ..self.clone()
            },
            markers: None,
        })
    }

    fn unchanged(&self) -> Transition {
        Transition {
            next: self.clone(),
            markers: None,
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
