//! The durable state of the transactional ids a core coordinates: each change of an id's state is
//! a record in an internal log on that core (`shards::internal_log`, as the groups' committed
//! offsets are), keyed by the transactional id, its value the state in a versioned encoding, a tombstone
//! once the id is Dead. Replaying the log gives back the latest state of every id.
//!
//! Format: `docs/transactions.md`.

use super::state::{Markers, TopicPartition, Transition, TxnMetadata, TxnState};
use kafka_protocol::error::ResponseError;
use shards::internal_log::{Cursor, InternalLog, KeyedRecord, StoreResult};
use shards::TailCache;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

/// The record key's first byte: what kind of record it is (only transactional ids so far).
const KIND_TRANSACTIONAL_ID: u8 = 1;
/// The value encoding's version.
const VALUE_VERSION: u8 = 0;

/// Why a state could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnLogError {
    /// Another change of the same transactional id is being written.
    Concurrent,
    /// The log is closed (the core stops).
    Closed,
    /// The append failed.
    Io(String),
}

impl TxnLogError {
    /// The Kafka error a client gets: retriable either way.
    pub fn code(&self) -> ResponseError {
        match self {
            TxnLogError::Concurrent => ResponseError::ConcurrentTransactions,
            TxnLogError::Closed | TxnLogError::Io(_) => ResponseError::CoordinatorNotAvailable,
        }
    }
}

pub fn encode_key(transactional_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + transactional_id.len());
    k.push(KIND_TRANSACTIONAL_ID);
    put_str(&mut k, transactional_id);
    k
}

pub fn decode_key(k: &[u8]) -> Option<String> {
    let mut c = Cursor(k);
    if c.u8()? != KIND_TRANSACTIONAL_ID {
        return None;
    }
    let id = c.string()?;
    c.0.is_empty().then_some(id)
}

fn put_str(v: &mut Vec<u8>, s: &str) {
    v.extend_from_slice(&(s.len() as u32).to_be_bytes());
    v.extend_from_slice(s.as_bytes());
}

pub fn encode_value(m: &TxnMetadata) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.push(VALUE_VERSION);
    v.extend_from_slice(&m.producer_id.to_be_bytes());
    v.extend_from_slice(&m.last_producer_id.to_be_bytes());
    v.extend_from_slice(&m.epoch.to_be_bytes());
    v.extend_from_slice(&m.last_epoch.to_be_bytes());
    v.extend_from_slice(&m.timeout_ms.to_be_bytes());
    v.push(m.state.code());
    v.extend_from_slice(&m.start_ms.to_be_bytes());
    v.extend_from_slice(&m.last_update_ms.to_be_bytes());
    v.extend_from_slice(&(m.partitions.len() as u32).to_be_bytes());
    for (topic, partition) in &m.partitions {
        put_str(&mut v, topic);
        v.extend_from_slice(&partition.to_be_bytes());
    }
    v.extend_from_slice(&(m.groups.len() as u32).to_be_bytes());
    for g in &m.groups {
        put_str(&mut v, g);
    }
    v
}

/// Decodes a value; `None` for an unknown version or any malformed byte. Counts are never trusted
/// for allocation: each element is read from the bytes actually there.
pub fn decode_value(v: &[u8]) -> Option<TxnMetadata> {
    let mut c = Cursor(v);
    if c.u8()? != VALUE_VERSION {
        return None;
    }
    let producer_id = c.i64()?;
    let last_producer_id = c.i64()?;
    let epoch = c.i16()?;
    let last_epoch = c.i16()?;
    let timeout_ms = c.i32()?;
    let state = TxnState::from_code(c.u8()?)?;
    let start_ms = c.i64()?;
    let last_update_ms = c.i64()?;
    let mut partitions: BTreeSet<TopicPartition> = BTreeSet::new();
    for _ in 0..c.u32()? {
        let topic = c.string()?;
        partitions.insert((topic, c.i32()?));
    }
    let mut groups = BTreeSet::new();
    for _ in 0..c.u32()? {
        groups.insert(c.string()?);
    }
    c.0.is_empty().then_some(TxnMetadata {
        producer_id,
        last_producer_id,
        epoch,
        last_epoch,
        timeout_ms,
        state,
        partitions,
        groups,
        start_ms,
        last_update_ms,
    })
}

/// One core's transactional ids: their states in memory, each change durable in the log first.
#[derive(Debug)]
pub struct TxnLog {
    log: InternalLog,
    states: RefCell<HashMap<String, TxnMetadata>>,
    /// Ids with a change being written: a second change of one waits for none and is refused
    /// with CONCURRENT_TRANSACTIONS (Kafka's pending state).
    writing: RefCell<HashSet<String>>,
    /// Compact once the log holds at least this many records (and more than twice the live ids).
    compact_min: u64,
    /// Writes hold it shared, compaction exclusive: no write lands in a log being replaced.
    lock: glommio::sync::RwLock<()>,
}

/// Clears an id's `writing` mark however the write ends.
struct Writing<'a>(&'a TxnLog, &'a str);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.writing.borrow_mut().remove(self.1);
    }
}

impl TxnLog {
    /// Opens the log under `root` (created if missing) and replays it.
    pub async fn open(root: &Path, cache: Rc<TailCache>, compact_min: u64) -> StoreResult<Self> {
        let log = InternalLog::open(root, cache).await?;
        let mut states = HashMap::new();
        let n = log
            .replay(|key, value| {
                let Some(id) = key.and_then(decode_key) else {
                    log::warn!("{}: skipping a record with a bad key", root.display());
                    return;
                };
                match value.map(decode_value) {
                    None => {
                        states.remove(&id);
                    }
                    Some(Some(m)) if m.state == TxnState::Dead => {
                        states.remove(&id);
                    }
                    Some(Some(m)) => {
                        states.insert(id, m);
                    }
                    Some(None) => {
                        log::warn!("{}: skipping a record with a bad value", root.display())
                    }
                }
            })
            .await?;
        log::info!(
            "{}: {} transactional ids from {n} records",
            root.display(),
            states.len()
        );
        Ok(TxnLog {
            log,
            states: RefCell::new(states),
            writing: RefCell::new(HashSet::new()),
            compact_min,
            lock: glommio::sync::RwLock::new(()),
        })
    }

    /// The state of `transactional_id` (`None`: unknown or expired).
    pub fn get(&self, transactional_id: &str) -> Option<TxnMetadata> {
        self.states.borrow().get(transactional_id).cloned()
    }

    /// Every known transactional id and its state (recovery, ListTransactions), sorted by id.
    pub fn all(&self) -> Vec<(String, TxnMetadata)> {
        let mut v: Vec<_> = self
            .states
            .borrow()
            .iter()
            .map(|(k, m)| (k.clone(), m.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// What recovery after a restart must carry out, per id (see [`TxnMetadata::recover`]).
    pub fn recoveries(&self, now: i64) -> Vec<(String, Transition)> {
        self.due(|m| m.recover(now))
    }

    /// The open transactions past their timeout, to abort (see [`TxnMetadata::expire`]).
    pub fn timeouts(&self, now: i64) -> Vec<(String, Transition)> {
        self.due(|m| m.expire(now))
    }

    /// The idle ids to forget (see [`TxnMetadata::expire_id`]).
    pub fn expired_ids(&self, now: i64, expiration_ms: i64) -> Vec<(String, Transition)> {
        self.due(|m| m.expire_id(now, expiration_ms))
    }

    /// `f`'s transitions of the ids not being written, sorted by id.
    fn due(&self, f: impl Fn(&TxnMetadata) -> Option<Transition>) -> Vec<(String, Transition)> {
        let writing = self.writing.borrow();
        self.all()
            .into_iter()
            .filter(|(id, _)| !writing.contains(id))
            .filter_map(|(id, m)| f(&m).map(|t| (id, t)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.states.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.borrow().is_empty()
    }

    pub fn records_in_log(&self) -> u64 {
        self.log.records()
    }

    /// Whether a change of `transactional_id` is being written.
    pub fn writing(&self, transactional_id: &str) -> bool {
        self.writing.borrow().contains(transactional_id)
    }

    /// Makes `next` the state of `transactional_id`: durable (acks=all) first, then installed, so
    /// a state is never acted on before it would survive a crash. Dead is written as a tombstone.
    /// The state equal to the current one is not written again.
    pub async fn write(
        &self,
        transactional_id: &str,
        next: TxnMetadata,
    ) -> Result<(), TxnLogError> {
        if self.get(transactional_id).as_ref() == Some(&next) {
            return Ok(());
        }
        if !self
            .writing
            .borrow_mut()
            .insert(transactional_id.to_string())
        {
            return Err(TxnLogError::Concurrent);
        }
        let _writing = Writing(self, transactional_id);
        let value = (next.state != TxnState::Dead).then(|| encode_value(&next));
        let _shared = self.lock.read().await.map_err(|_| TxnLogError::Closed)?;
        if !self.log.is_open() {
            return Err(TxnLogError::Closed);
        }
        self.log
            .append(&[(encode_key(transactional_id), value)])
            .await
            .map_err(TxnLogError::Io)?;
        let mut states = self.states.borrow_mut();
        if next.state == TxnState::Dead {
            states.remove(transactional_id);
        } else {
            states.insert(transactional_id.to_string(), next);
        }
        Ok(())
    }

    pub fn compactions(&self) -> u64 {
        self.log.compactions()
    }

    /// Whether the log holds enough dead records to be worth compacting.
    pub fn needs_compaction(&self) -> bool {
        let n = self.log.records();
        n >= self.compact_min && n > 2 * self.len() as u64
    }

    /// Rewrites the live states into the log's next generation; writes wait while it runs. The
    /// coordinator runs it when [`Self::needs_compaction`] says so.
    pub async fn compact(&self) -> StoreResult<()> {
        let _exclusive = self.lock.write().await.map_err(|e| e.to_string())?;
        let live: Vec<KeyedRecord> = self
            .all()
            .iter()
            .map(|(id, m)| (encode_key(id), Some(encode_value(m))))
            .collect();
        self.log.rewrite(&live).await
    }

    /// Carries out the durable half of a transition: its next state written and installed; gives
    /// back the markers the caller must then write (before [`TxnMetadata::markers_written`]).
    pub async fn apply(
        &self,
        transactional_id: &str,
        t: Transition,
    ) -> Result<Option<Markers>, TxnLogError> {
        self.write(transactional_id, t.next).await?;
        Ok(t.markers)
    }

    /// Flushes and closes the log (clean shutdown).
    pub async fn close(&self) {
        let _exclusive = self.lock.write().await;
        self.log.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::testing::{cache, run};
    use crate::transactions::state::{
        init_producer_id, InitOutcome, ProducerIdAndEpoch, NO_EPOCH, NO_PRODUCER_ID,
    };

    fn state(producer_id: i64, epoch: i16, s: TxnState) -> TxnMetadata {
        TxnMetadata {
            producer_id,
            last_producer_id: NO_PRODUCER_ID,
            epoch,
            last_epoch: NO_EPOCH,
            timeout_ms: 60_000,
            state: s,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: 1_700_000_000_000,
        }
    }

    fn full() -> TxnMetadata {
        TxnMetadata {
            last_producer_id: 41,
            last_epoch: 6,
            start_ms: 1_700_000_000_001,
            partitions: [("t".to_string(), 0), ("ü-topic".to_string(), 17)].into(),
            groups: ["g1".to_string(), "g2".to_string()].into(),
            ..state(42, 7, TxnState::PrepareCommit)
        }
    }

    #[test]
    fn keys_and_values_round_trip_and_garbage_is_refused() {
        assert_eq!(decode_key(&encode_key("txn-1")), Some("txn-1".into()));
        assert_eq!(decode_key(&encode_key("")), Some(String::new()));
        for code in 0..7 {
            let s = TxnState::from_code(code).unwrap();
            let m = TxnMetadata { state: s, ..full() };
            assert_eq!(decode_value(&encode_value(&m)), Some(m));
        }
        let m = state(1, 0, TxnState::Empty);
        assert_eq!(decode_value(&encode_value(&m)), Some(m));
        // An offsets-store key is not a transactional id's.
        assert_eq!(
            decode_key(&crate::groups::offsets::encode_key("g", "t", 0)),
            None
        );
        let v = encode_value(&full());
        for cut in 0..v.len() {
            assert_eq!(decode_value(&v[..cut]), None, "truncated at {cut}");
        }
        let mut longer = v.clone();
        longer.push(0);
        assert_eq!(decode_value(&longer), None, "trailing bytes");
        let mut version = v.clone();
        version[0] = 9;
        assert_eq!(decode_value(&version), None, "unknown version");
        let mut bad_state = v;
        bad_state[1 + 8 + 8 + 2 + 2 + 4] = 99;
        assert_eq!(decode_value(&bad_state), None, "unknown state");
        // A count claiming more elements than there are bytes.
        let mut huge = encode_value(&state(1, 0, TxnState::Empty));
        let at = huge.len() - 8;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_value(&huge), None);
    }

    #[test]
    fn replay_after_a_crash_gives_back_the_states_written() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            assert!(l.is_empty());
            l.write("a", state(1, 0, TxnState::Empty)).await.unwrap();
            l.write("a", full()).await.unwrap();
            l.write("b", state(2, 3, TxnState::Ongoing)).await.unwrap();
            l.write("c", state(3, 0, TxnState::CompleteAbort))
                .await
                .unwrap();
            l.write("c", state(3, 0, TxnState::Dead)).await.unwrap();
            // The same state again is not written.
            l.write("b", state(2, 3, TxnState::Ongoing)).await.unwrap();
            assert_eq!(l.records_in_log(), 5);
            let before = l.all();
            // No clean close: the process dies with the log open.
            std::mem::forget(l);
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(l.all(), before);
            assert_eq!(l.get("a"), Some(full()));
            assert_eq!(l.get("b"), Some(state(2, 3, TxnState::Ongoing)));
            assert_eq!(l.get("c"), None, "a tombstone forgets the id");
            assert_eq!(l.records_in_log(), 5);
            l.close().await;
            assert_eq!(
                l.write("d", state(4, 0, TxnState::Empty)).await,
                Err(TxnLogError::Closed)
            );
        });
    }

    #[test]
    fn a_second_change_of_an_id_while_one_is_written_is_concurrent() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            use futures_lite::future::poll_once;
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            let mut first = Box::pin(l.write("a", state(1, 0, TxnState::Empty)));
            if poll_once(&mut first).await.is_none() {
                assert!(l.writing("a"));
                assert_eq!(
                    l.write("a", state(1, 1, TxnState::Empty)).await,
                    Err(TxnLogError::Concurrent)
                );
                assert_eq!(
                    TxnLogError::Concurrent.code(),
                    ResponseError::ConcurrentTransactions
                );
                // Other ids are not held back.
                l.write("b", state(2, 0, TxnState::Empty)).await.unwrap();
                first.await.unwrap();
            }
            assert!(!l.writing("a"));
            assert_eq!(l.get("a"), Some(state(1, 0, TxnState::Empty)));
            l.close().await;
        });
    }

    #[test]
    fn compaction_keeps_the_live_states_and_shrinks_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let l = TxnLog::open(&root, cache(), 20).await.unwrap();
            for i in 0..50i16 {
                l.write("a", state(1, i, TxnState::Empty)).await.unwrap();
                l.write("b", state(2, i, TxnState::Ongoing)).await.unwrap();
                if l.needs_compaction() {
                    l.compact().await.unwrap();
                }
            }
            l.write("gone", state(3, 0, TxnState::Empty)).await.unwrap();
            l.write("gone", state(3, 0, TxnState::Dead)).await.unwrap();
            assert!(l.compactions() >= 1, "compaction ran");
            assert!(l.records_in_log() < 20, "{} records", l.records_in_log());
            std::mem::forget(l);
            let l = TxnLog::open(&root, cache(), 20).await.unwrap();
            assert_eq!(l.get("a"), Some(state(1, 49, TxnState::Empty)));
            assert_eq!(l.get("b"), Some(state(2, 49, TxnState::Ongoing)));
            assert_eq!(l.get("gone"), None);
            assert_eq!(l.len(), 2);
            assert!(
                l.records_in_log() < 20,
                "start-up read {}",
                l.records_in_log()
            );
            l.close().await;
        });
    }

    /// The coordinator's loop over the log: every transition made durable, the log killed while
    /// a commit's markers are being written, and recovery finishing that commit.
    #[test]
    fn a_transaction_interrupted_by_a_crash_is_completed_by_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            let mut ids = || 500;
            let t = match init_producer_id(None, 1000, 900_000, None, 0, &mut ids).unwrap() {
                InitOutcome::Ready(t) => t,
                other => panic!("{other:?}"),
            };
            l.write("pipe", t.next.clone()).await.unwrap();
            let open = t
                .next
                .add_partitions(500, 0, &[("out".into(), 2)], 1)
                .unwrap();
            l.write("pipe", open.next.clone()).await.unwrap();
            // A second id left open: past its timeout by the time the core comes back.
            let other = state(9, 0, TxnState::Empty)
                .add_partitions(9, 0, &[("out".into(), 5)], 2)
                .unwrap();
            l.write("late", other.next).await.unwrap();
            let prepare = open.next.end_txn(500, 0, true, 3).unwrap();
            l.write("pipe", prepare.next.clone()).await.unwrap();
            let late: Vec<_> = l
                .timeouts(2 + 60_001)
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            assert_eq!(
                late,
                vec!["late".to_string()],
                "a Prepare state has no timeout"
            );
            assert!(l.timeouts(2 + 60_000).is_empty());
            std::mem::forget(l);
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            let now = 1_000_000;
            let mut rewritten = Vec::new();
            for (id, t) in l.recoveries(now) {
                l.write(&id, t.next.clone()).await.unwrap();
                let markers = t.markers.expect("recovery writes markers");
                rewritten.push((id.clone(), markers.commit, markers.partitions.clone()));
                let done = t.next.markers_written(markers.epoch, now).unwrap();
                l.write(&id, done.next).await.unwrap();
            }
            assert_eq!(
                rewritten,
                vec![
                    ("late".to_string(), false, vec![("out".to_string(), 5)]),
                    ("pipe".to_string(), true, vec![("out".to_string(), 2)]),
                ]
            );
            l.close().await;
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(l.get("pipe").unwrap().state, TxnState::CompleteCommit);
            let late = l.get("late").unwrap();
            assert_eq!((late.state, late.epoch), (TxnState::CompleteAbort, 1));
            assert!(l.recoveries(now).is_empty(), "nothing left to recover");
            assert!(l.timeouts(now).is_empty());
            let idle = l.expired_ids(now + 10, 10);
            assert_eq!(idle.len(), 2);
            for (id, t) in idle {
                l.write(&id, t.next).await.unwrap();
            }
            assert!(l.is_empty(), "expired ids are forgotten");
            l.close().await;
        });
    }

    /// InitProducerId against the log: its outcome made durable; `Err` carries the error the
    /// client gets and the markers the coordinator must write first, if any.
    async fn init(
        l: &TxnLog,
        id: &str,
        expected: Option<ProducerIdAndEpoch>,
        now: i64,
    ) -> Result<(i64, i16), (ResponseError, Option<Markers>)> {
        let mut next_id = || 700;
        let outcome = init_producer_id(
            l.get(id).as_ref(),
            60_000,
            900_000,
            expected,
            now,
            &mut next_id,
        )
        .map_err(|e| (e, None))?;
        match outcome {
            InitOutcome::Ready(t) => {
                let m = t.next.clone();
                l.apply(id, t).await.map_err(|e| (e.code(), None))?;
                Ok((m.producer_id, m.epoch))
            }
            InitOutcome::AbortFirst(t) => {
                let markers = l.apply(id, t).await.map_err(|e| (e.code(), None))?;
                Err((ResponseError::ConcurrentTransactions, markers))
            }
        }
    }

    /// The whole life of two producers sharing a transactional id, every state durable, the core
    /// killed while the older producer's transaction is being aborted: recovery finishes the
    /// abort, the newer producer goes on, the older stays fenced.
    #[test]
    fn two_producers_sharing_an_id_through_the_log_and_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            let (pid, a) = init(&l, "app", None, 0).await.unwrap();
            assert_eq!((pid, a), (700, 0));
            let m = l.get("app").unwrap();
            let t = m.add_partitions(pid, a, &[("out".into(), 0)], 1).unwrap();
            assert_eq!(l.apply("app", t).await.unwrap(), None);
            // Producer B starts: A's transaction must be aborted first.
            let (err, markers) = init(&l, "app", None, 2).await.unwrap_err();
            assert_eq!(err, ResponseError::ConcurrentTransactions);
            let markers = markers.expect("abort markers");
            assert!(!markers.commit && markers.epoch == a + 1);
            // The core dies before the markers are written.
            std::mem::forget(l);
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(l.get("app").unwrap().state, TxnState::PrepareAbort);
            let (err, _) = init(&l, "app", None, 3).await.unwrap_err();
            assert_eq!(err, ResponseError::ConcurrentTransactions, "still aborting");
            let redo = l.recoveries(3);
            assert_eq!(redo.len(), 1);
            let (id, t) = redo.into_iter().next().unwrap();
            assert_eq!(l.apply(&id, t).await.unwrap(), Some(markers.clone()));
            let done = l
                .get("app")
                .unwrap()
                .markers_written(markers.epoch, 4)
                .unwrap();
            l.apply("app", done).await.unwrap();
            // B's retry gets an epoch above the fencing one; A is fenced at every step.
            let (pid_b, b) = init(&l, "app", None, 5).await.unwrap();
            assert_eq!(pid_b, pid);
            assert!(b > markers.epoch);
            let m = l.get("app").unwrap();
            assert_eq!(
                m.add_partitions(pid, a, &[("out".into(), 1)], 6),
                Err(ResponseError::ProducerFenced)
            );
            assert_eq!(
                m.end_txn(pid, a, true, 6),
                Err(ResponseError::ProducerFenced)
            );
            let a_again = Some(ProducerIdAndEpoch {
                producer_id: pid,
                epoch: a,
            });
            let (err, _) = init(&l, "app", a_again, 6).await.unwrap_err();
            assert_eq!(err, ResponseError::ProducerFenced);
            // B commits.
            let t = m.add_partitions(pid, b, &[("out".into(), 1)], 7).unwrap();
            l.apply("app", t).await.unwrap();
            let t = l.get("app").unwrap().end_txn(pid, b, true, 8).unwrap();
            let markers = l.apply("app", t).await.unwrap().unwrap();
            assert!(markers.commit && markers.epoch == b);
            let done = l.get("app").unwrap().markers_written(b, 9).unwrap();
            l.apply("app", done).await.unwrap();
            l.close().await;
            let l = TxnLog::open(&root, cache(), 1000).await.unwrap();
            let m = l.get("app").unwrap();
            assert_eq!(
                (m.state, m.producer_id, m.epoch),
                (TxnState::CompleteCommit, pid, b)
            );
            l.close().await;
        });
    }
}
