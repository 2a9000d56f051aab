//! Committed offsets of the groups a core coordinates, and the pending transactional offsets
//! (TxnOffsetCommit) waiting for their transaction to end: in-memory maps, made durable in an
//! internal log on that core (`shards::internal_log`).
//!
//! Design notes: `docs/groups.md`.

pub use shards::internal_log::StoreResult;
use shards::internal_log::{Cursor, InternalLog, KeyedRecord};
use shards::oneshot::{self as answer, Sender};
use shards::TailCache;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::rc::Rc;

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_timestamp: i64,
}

/// (topic, partition)
pub type TopicPartition = (String, i32);

/// Offsets to write (`None`: delete).
pub type Changes = Vec<(TopicPartition, Option<Committed>)>;

/// An offset a transactional producer committed (TxnOffsetCommit) and whose transaction has not
/// ended: invisible to OffsetFetch and lag until the transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOffset {
    /// The producer's epoch when it sent the offset: a marker of an older epoch does not end it.
    pub producer_epoch: i16,
    pub value: Committed,
}

/// Pending offsets to write, per (producer id, partition) (`None`: resolved or dropped).
pub type PendingChanges = Vec<(i64, TopicPartition, Option<PendingOffset>)>;

/// What [`OffsetStore::end_transaction`] did with the producer's pending offsets of the group.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Made committed offsets (commit) or dropped (abort).
    pub resolved: usize,
    /// Left pending: written at a newer epoch than the marker's (the marker is stale for them).
    pub newer_kept: usize,
}

/// The first byte of a record key: what the record holds.
const KIND_COMMITTED: u8 = 0;
const KIND_PENDING: u8 = 1;

#[derive(Debug)]
struct Entry<T> {
    /// Order of the write that set it: a commit applied late never overwrites a newer one.
    seq: u64,
    value: T,
}

/// One group's pending offsets: per producer id, per partition.
type GroupPending = HashMap<i64, HashMap<TopicPartition, Entry<PendingOffset>>>;

/// One record of a write, applied to memory once the write is durable.
#[derive(Debug)]
enum Update {
    Offset(TopicPartition, Option<Committed>),
    Pending(i64, TopicPartition, Option<PendingOffset>),
}

impl Update {
    fn record(&self, group: &str) -> KeyedRecord {
        match self {
            Update::Offset((t, p), c) => (encode_key(group, t, *p), c.as_ref().map(encode_value)),
            Update::Pending(id, (t, p), v) => (
                encode_pending_key(group, *id, t, *p),
                v.as_ref().map(encode_pending_value),
            ),
        }
    }
}

#[derive(Debug)]
pub struct OffsetStore {
    /// Commits and tombstones; its record count drives the compaction decision.
    log: InternalLog,
    entries: RefCell<HashMap<String, HashMap<TopicPartition, Entry<Committed>>>>,
    /// Per group, the pending transactional offsets (never in `entries` until committed).
    pending: RefCell<HashMap<String, GroupPending>>,
    next_seq: Cell<u64>,
    compact_min: u64,
    compacting: Cell<bool>,
    lock: glommio::sync::RwLock<()>,
    /// Per group: writes begun and not yet applied (or failed), and who waits for none.
    in_flight: RefCell<HashMap<String, PendingWrites>>,
}

#[derive(Debug, Default)]
struct PendingWrites {
    /// Number of the next write of the group.
    next: u64,
    /// Writes begun and not yet finished.
    open: BTreeSet<u64>,
    /// Fetches waiting until every write numbered below theirs has finished.
    waiters: Vec<(u64, Sender<()>)>,
}

/// One write of a group in flight, from before its first await until it is applied or failed.
struct Flight<'a> {
    store: &'a OffsetStore,
    group: &'a str,
    number: u64,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let ready = {
            let mut all = self.store.in_flight.borrow_mut();
            let f = all.get_mut(self.group).expect("counted");
            f.open.remove(&self.number);
            let oldest = f.open.first().copied().unwrap_or(u64::MAX);
            let (ready, waiting) = std::mem::take(&mut f.waiters)
                .into_iter()
                .partition(|(bound, _)| *bound <= oldest);
            f.waiters = waiting;
            if f.open.is_empty() {
                all.remove(self.group);
            }
            ready
        };
        let ready: Vec<(u64, Sender<()>)> = ready;
        for (_, w) in ready {
            w.send(());
        }
    }
}

fn push_str(k: &mut Vec<u8>, s: &str) {
    k.extend_from_slice(&(s.len() as u32).to_be_bytes());
    k.extend_from_slice(s.as_bytes());
}

/// The record key of a committed offset (kind 0: group, topic, partition).
pub fn encode_key(group: &str, topic: &str, partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(13 + group.len() + topic.len());
    k.push(KIND_COMMITTED);
    push_str(&mut k, group);
    push_str(&mut k, topic);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// The record key of a pending transactional offset (kind 1: group, producer id, topic,
/// partition).
pub fn encode_pending_key(group: &str, producer_id: i64, topic: &str, partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(21 + group.len() + topic.len());
    k.push(KIND_PENDING);
    push_str(&mut k, group);
    k.extend_from_slice(&producer_id.to_be_bytes());
    push_str(&mut k, topic);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// The value of a pending offset: the producer epoch, then the committed offset's encoding.
pub fn encode_pending_value(p: &PendingOffset) -> Vec<u8> {
    let mut v = p.producer_epoch.to_be_bytes().to_vec();
    v.extend_from_slice(&encode_value(&p.value));
    v
}

pub fn encode_value(c: &Committed) -> Vec<u8> {
    let meta = c.metadata.as_deref().map(str::as_bytes);
    let mut v = Vec::with_capacity(25 + meta.map_or(0, <[u8]>::len));
    v.push(0); // version
    v.extend_from_slice(&c.offset.to_be_bytes());
    v.extend_from_slice(&c.leader_epoch.to_be_bytes());
    v.extend_from_slice(&c.commit_timestamp.to_be_bytes());
    match meta {
        None => v.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(m) => {
            v.extend_from_slice(&(m.len() as i32).to_be_bytes());
            v.extend_from_slice(m);
        }
    }
    v
}

pub fn decode_key(k: &[u8]) -> Option<(String, String, i32)> {
    let mut c = Cursor(k);
    if c.u8()? != KIND_COMMITTED {
        return None;
    }
    let group = c.string()?;
    let topic = c.string()?;
    let partition = c.i32()?;
    c.0.is_empty().then_some((group, topic, partition))
}

/// (group, producer id, topic, partition) of a pending offset's key.
pub fn decode_pending_key(k: &[u8]) -> Option<(String, i64, String, i32)> {
    let mut c = Cursor(k);
    if c.u8()? != KIND_PENDING {
        return None;
    }
    let group = c.string()?;
    let producer_id = c.i64()?;
    let topic = c.string()?;
    let partition = c.i32()?;
    c.0.is_empty()
        .then_some((group, producer_id, topic, partition))
}

pub fn decode_pending_value(v: &[u8]) -> Option<PendingOffset> {
    let mut c = Cursor(v);
    let producer_epoch = c.i16()?;
    Some(PendingOffset {
        producer_epoch,
        value: decode_value(c.0)?,
    })
}

pub fn decode_value(v: &[u8]) -> Option<Committed> {
    let mut c = Cursor(v);
    if c.u8()? != 0 {
        return None;
    }
    let offset = c.i64()?;
    let leader_epoch = c.i32()?;
    let commit_timestamp = c.i64()?;
    let n = c.i32()?;
    let metadata = if n < 0 {
        None
    } else {
        Some(String::from_utf8(c.take(n as usize)?.to_vec()).ok()?)
    };
    c.0.is_empty().then_some(Committed {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp,
    })
}

/// A record read back from the log as the update it wrote; `None` for a bad key or value.
fn decode_update(key: Option<&[u8]>, value: Option<&[u8]>) -> Option<(String, Update)> {
    let key = key?;
    match *key.first()? {
        KIND_COMMITTED => {
            let (group, topic, partition) = decode_key(key)?;
            // A value that does not decode makes a bad record, not a tombstone.
            let value = match value {
                None => None,
                Some(v) => Some(decode_value(v)?),
            };
            Some((group, Update::Offset((topic, partition), value)))
        }
        KIND_PENDING => {
            let (group, id, topic, partition) = decode_pending_key(key)?;
            // A value that does not decode makes a bad record, not a tombstone.
            let value = match value {
                None => None,
                Some(v) => Some(decode_pending_value(v)?),
            };
            Some((group, Update::Pending(id, (topic, partition), value)))
        }
        _ => None,
    }
}

/// Sets (or with `None` removes) one entry, unless it holds a newer write than `seq`.
fn put<T>(
    map: &mut HashMap<TopicPartition, Entry<T>>,
    tp: TopicPartition,
    value: Option<T>,
    seq: u64,
) {
    match (value, map.get_mut(&tp)) {
        (Some(_), Some(e)) if e.seq > seq => {}
        (Some(value), Some(e)) => *e = Entry { seq, value },
        (Some(value), None) => {
            map.insert(tp, Entry { seq, value });
        }
        (None, Some(e)) if e.seq < seq => {
            map.remove(&tp);
        }
        (None, _) => {}
    }
}

impl OffsetStore {
    /// Opens the store under `root` (created if missing) and replays it.
    pub async fn open(root: &Path, cache: Rc<TailCache>, compact_min: u64) -> StoreResult<Self> {
        let store = OffsetStore {
            log: InternalLog::open(root, cache).await?,
            entries: RefCell::new(HashMap::new()),
            pending: RefCell::new(HashMap::new()),
            next_seq: Cell::new(1),
            compact_min,
            compacting: Cell::new(false),
            lock: glommio::sync::RwLock::new(()),
            in_flight: RefCell::new(HashMap::new()),
        };
        store.replay().await?;
        Ok(store)
    }

    async fn replay(&self) -> StoreResult<()> {
        let root = self.log.root();
        let n = self
            .log
            .replay(|key, value| match decode_update(key, value) {
                Some((group, update)) => self.apply(&group, update, self.take_seq()),
                None => log::warn!(
                    "{}: skipping a record with a bad key or value",
                    root.display()
                ),
            })
            .await?;
        log::info!(
            "{}: {} committed and pending offsets from {n} records",
            root.display(),
            self.live()
        );
        Ok(())
    }

    fn take_seq(&self) -> u64 {
        let s = self.next_seq.get();
        self.next_seq.set(s + 1);
        s
    }

    fn apply(&self, group: &str, update: Update, seq: u64) {
        match update {
            Update::Offset(tp, value) => {
                let mut entries = self.entries.borrow_mut();
                let g = entries.entry(group.to_string()).or_default();
                put(g, tp, value, seq);
                if g.is_empty() {
                    entries.remove(group);
                }
            }
            Update::Pending(id, tp, value) => {
                let mut pending = self.pending.borrow_mut();
                let g = pending.entry(group.to_string()).or_default();
                let by_partition = g.entry(id).or_default();
                put(by_partition, tp, value, seq);
                if by_partition.is_empty() {
                    g.remove(&id);
                }
                if g.is_empty() {
                    pending.remove(group);
                }
            }
        }
    }

    /// Live entries (committed and pending offsets of all groups).
    pub fn live(&self) -> usize {
        let pending: usize = self
            .pending
            .borrow()
            .values()
            .flat_map(HashMap::values)
            .map(HashMap::len)
            .sum();
        pending
            + self
                .entries
                .borrow()
                .values()
                .map(HashMap::len)
                .sum::<usize>()
    }

    pub fn compactions(&self) -> u64 {
        self.log.compactions()
    }

    pub fn records_in_log(&self) -> u64 {
        self.log.records()
    }

    pub fn get(&self, group: &str, topic: &str, partition: i32) -> Option<Committed> {
        self.entries
            .borrow()
            .get(group)?
            .get(&(topic.to_string(), partition))
            .map(|e| e.value.clone())
    }

    /// Every committed offset of `group`, sorted.
    pub fn group_offsets(&self, group: &str) -> Vec<(TopicPartition, Committed)> {
        let mut v: Vec<_> = self
            .entries
            .borrow()
            .get(group)
            .map(|g| {
                g.iter()
                    .map(|(k, e)| (k.clone(), e.value.clone()))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Every pending offset of `group`: (producer id, partition, offset), sorted.
    pub fn group_pending(&self, group: &str) -> Vec<(i64, TopicPartition, PendingOffset)> {
        let mut v: Vec<_> = self
            .pending
            .borrow()
            .get(group)
            .map(|g| {
                g.iter()
                    .flat_map(|(id, parts)| {
                        parts
                            .iter()
                            .map(move |(tp, e)| (*id, tp.clone(), e.value.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        v
    }

    /// Whether some producer has a pending offset of `group` for the partition.
    pub fn has_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        let tp = (topic.to_string(), partition);
        self.pending
            .borrow()
            .get(group)
            .is_some_and(|g| g.values().any(|parts| parts.contains_key(&tp)))
    }

    /// The newest epoch among the producer's pending offsets of `group`.
    pub fn pending_epoch(&self, group: &str, producer_id: i64) -> Option<i16> {
        let pending = self.pending.borrow();
        let parts = pending.get(group)?.get(&producer_id)?;
        parts.values().map(|e| e.value.producer_epoch).max()
    }

    /// Whether `group` has committed or pending offsets.
    pub fn has_group(&self, group: &str) -> bool {
        self.entries.borrow().contains_key(group) || self.pending.borrow().contains_key(group)
    }

    /// The groups with committed or pending offsets.
    pub fn groups(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self.entries.borrow().keys().cloned().collect();
        all.extend(self.pending.borrow().keys().cloned());
        all.into_iter().collect()
    }

    fn begin<'a>(&'a self, group: &'a str) -> Flight<'a> {
        let mut all = self.in_flight.borrow_mut();
        let f = all.entry(group.to_string()).or_default();
        let number = f.next;
        f.next += 1;
        f.open.insert(number);
        Flight {
            store: self,
            group,
            number,
        }
    }

    /// Whether a write of `group` has begun and is not yet applied.
    pub fn writing(&self, group: &str) -> bool {
        self.in_flight.borrow().contains_key(group)
    }

    /// Waits until every write of `group` begun before this call has been applied (or failed).
    /// Writes begun later are not waited for, so a busy group cannot hold a fetch back forever.
    pub async fn settled(&self, group: &str) {
        let rx = {
            let mut all = self.in_flight.borrow_mut();
            let Some(f) = all.get_mut(group) else {
                return;
            };
            let (tx, rx) = answer::channel();
            f.waiters.push((f.next, tx));
            rx
        };
        rx.await;
    }

    /// Writes commits (`None`: delete) durably, then applies them. The write counts as in flight
    /// for `group` from this call (before its first await) until it is applied or fails.
    pub async fn write(&self, group: &str, changes: Changes) -> StoreResult<()> {
        let updates = changes
            .into_iter()
            .map(|(tp, c)| Update::Offset(tp, c))
            .collect();
        self.write_updates(group, updates).await
    }

    /// Writes pending transactional offsets (`None`: drop) durably, then applies them, as
    /// [`Self::write`] does. A producer's new pending offset of a partition replaces its old one.
    pub async fn write_pending(&self, group: &str, changes: PendingChanges) -> StoreResult<()> {
        let updates = changes
            .into_iter()
            .map(|(id, tp, v)| Update::Pending(id, tp, v))
            .collect();
        self.write_updates(group, updates).await
    }

    async fn write_updates(&self, group: &str, updates: Vec<Update>) -> StoreResult<()> {
        if updates.is_empty() {
            return Ok(());
        }
        let _flight = self.begin(group);
        let _shared = self.lock.read().await.map_err(|e| e.to_string())?;
        self.append_and_apply(group, updates).await
    }

    /// Appends and applies under the shared lock the caller holds. The sequence number is taken
    /// right before the append is queued, with no await between them, so the order writes apply
    /// in memory is their order in the log.
    async fn append_and_apply(&self, group: &str, updates: Vec<Update>) -> StoreResult<()> {
        if updates.is_empty() {
            return Ok(());
        }
        let recs: Vec<KeyedRecord> = updates.iter().map(|u| u.record(group)).collect();
        let seq = self.take_seq();
        self.log.append(&recs).await?;
        for u in updates {
            self.apply(group, u, seq);
        }
        Ok(())
    }

    /// Ends a transaction for `group`: the pending offsets of `producer_id` written at
    /// `producer_epoch` or before become committed offsets (`commit`) or are dropped, in one
    /// append (a kind-0 record and a kind-1 tombstone per partition on commit), so a crash
    /// cannot apply half of it. Pending offsets written at a newer epoch than the marker's belong
    /// to a later transaction of the producer and are kept. With nothing pending it writes
    /// nothing (a re-sent marker is a no-op). `proceed` is asked under the lock, right before the
    /// pending offsets are read: `false` (the group is being deleted) writes nothing.
    pub async fn end_transaction(
        &self,
        group: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        proceed: impl FnOnce() -> bool,
    ) -> StoreResult<Ended> {
        // Waits for the group's writes in flight, so a TxnOffsetCommit still being written is
        // part of the transaction it belongs to.
        self.settled(group).await;
        let _flight = self.begin(group);
        let _shared = self.lock.read().await.map_err(|e| e.to_string())?;
        if !proceed() {
            return Ok(Ended::default());
        }
        let mut ended = Ended::default();
        let mut updates = Vec::new();
        let mine = self
            .group_pending(group)
            .into_iter()
            .filter(|(id, _, _)| *id == producer_id);
        for (_, tp, p) in mine {
            if p.producer_epoch > producer_epoch {
                ended.newer_kept += 1;
                continue;
            }
            ended.resolved += 1;
            if commit {
                updates.push(Update::Offset(tp.clone(), Some(p.value)));
            }
            updates.push(Update::Pending(producer_id, tp, None));
        }
        self.append_and_apply(group, updates).await?;
        Ok(ended)
    }

    /// Deletes every committed and pending offset of `group`, which must already refuse new
    /// commits (the coordinator marks it dead first): the group's writes in flight are applied
    /// first, then the offsets left are read and tombstoned. Under the shared lock, like a
    /// commit: the lock does not favour waiting writers, so the exclusive side would wait for as
    /// long as any group on the core keeps committing.
    pub async fn delete_group(&self, group: &str) -> StoreResult<()> {
        self.settled(group).await;
        let _flight = self.begin(group);
        let _shared = self.lock.read().await.map_err(|e| e.to_string())?;
        let offsets = self.group_offsets(group).into_iter();
        let pending = self.group_pending(group).into_iter();
        let updates = offsets
            .map(|(tp, _)| Update::Offset(tp, None))
            .chain(pending.map(|(id, tp, _)| Update::Pending(id, tp, None)))
            .collect();
        self.append_and_apply(group, updates).await
    }

    /// Whether the log holds enough dead records to be worth compacting (and no compaction runs).
    pub fn needs_compaction(&self) -> bool {
        let n = self.log.records();
        !self.compacting.get() && n >= self.compact_min && n > 2 * self.live() as u64
    }

    /// Compacts if [`Self::needs_compaction`]. The coordinator runs it in a task of its own, so no
    /// commit waits for it except those written while it swaps the logs.
    pub async fn maybe_compact(&self) {
        if !self.needs_compaction() || !self.log.is_open() {
            return;
        }
        self.compacting.set(true);
        if let Err(e) = self.compact().await {
            log::error!("{}: compaction failed: {e}", self.log.root().display());
        }
        self.compacting.set(false);
    }

    /// Rewrites the live entries into a fresh log and switches to it atomically.
    pub async fn compact(&self) -> StoreResult<()> {
        let _exclusive = self.lock.write().await.map_err(|e| e.to_string())?;
        let mut recs: Vec<KeyedRecord> = self
            .entries
            .borrow()
            .iter()
            .flat_map(|(g, parts)| {
                parts
                    .iter()
                    .map(move |((t, p), e)| (encode_key(g, t, *p), Some(encode_value(&e.value))))
            })
            .collect();
        for (g, producers) in self.pending.borrow().iter() {
            for (id, parts) in producers {
                recs.extend(parts.iter().map(|((t, p), e)| {
                    let key = encode_pending_key(g, *id, t, *p);
                    (key, Some(encode_pending_value(&e.value)))
                }));
            }
        }
        self.log.rewrite(&recs).await
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
    use std::time::Duration;

    /// Partition `partition` of topic "t" committed at `offset`.
    fn at(partition: i32, offset: i64) -> Changes {
        vec![(("t".into(), partition), Some(committed(offset, None)))]
    }

    fn committed(offset: i64, meta: Option<&str>) -> Committed {
        Committed {
            offset,
            leader_epoch: -1,
            metadata: meta.map(str::to_string),
            commit_timestamp: 1_700_000_000_000,
        }
    }

    #[test]
    fn keys_and_values_round_trip_and_garbage_is_refused() {
        let k = encode_key("g", "t", 7);
        assert_eq!(decode_key(&k), Some(("g".into(), "t".into(), 7)));
        let c = committed(42, Some("meta"));
        assert_eq!(decode_value(&encode_value(&c)), Some(c));
        assert_eq!(
            decode_value(&encode_value(&committed(1, None))),
            Some(committed(1, None))
        );
        assert_eq!(decode_key(&k[..k.len() - 1]), None);
        let mut huge = vec![0u8];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_key(&huge), None, "a claimed length beyond the bytes");
        assert_eq!(decode_value(&[0, 1, 2]), None);
    }

    /// Producer 7's pending offset of partition `partition` of topic "t" at `offset`, epoch `epoch`.
    fn pending(partition: i32, offset: i64, epoch: i16) -> PendingChanges {
        vec![(
            7,
            ("t".into(), partition),
            Some(PendingOffset {
                producer_epoch: epoch,
                value: committed(offset, Some("tx")),
            }),
        )]
    }

    #[test]
    fn pending_keys_and_values_round_trip_and_kinds_do_not_mix() {
        let k = encode_pending_key("g", 7, "t", 3);
        assert_eq!(decode_pending_key(&k), Some(("g".into(), 7, "t".into(), 3)));
        assert_eq!(decode_key(&k), None, "a pending key is not a committed one");
        assert_eq!(decode_pending_key(&encode_key("g", "t", 3)), None);
        let p = PendingOffset {
            producer_epoch: 4,
            value: committed(9, Some("m")),
        };
        assert_eq!(decode_pending_value(&encode_pending_value(&p)), Some(p));
        assert_eq!(decode_pending_value(&[0]), None);
        assert_eq!(decode_pending_key(&k[..k.len() - 1]), None);
    }

    #[test]
    fn pending_offsets_are_invisible_replayed_and_committed_by_the_marker_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            s.write("g", at(0, 1)).await.unwrap();
            s.write_pending("g", pending(0, 5, 2)).await.unwrap();
            // A later TxnOffsetCommit of the same producer replaces its pending offset.
            s.write_pending("g", pending(0, 6, 2)).await.unwrap();
            s.write_pending("g", pending(1, 8, 2)).await.unwrap();
            assert_eq!(s.get("g", "t", 0), Some(committed(1, None)));
            assert_eq!(s.get("g", "t", 1), None);
            assert!(s.has_pending("g", "t", 0) && s.has_pending("g", "t", 1));
            assert!(!s.has_pending("g", "t", 2) && !s.has_pending("h", "t", 0));
            s.close().await;

            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(
                s.group_offsets("g"),
                vec![(("t".into(), 0), committed(1, None))]
            );
            assert_eq!(s.group_pending("g").len(), 2, "replayed");
            assert_eq!(s.pending_epoch("g", 7), Some(2));
            let ended = s.end_transaction("g", 7, 2, true, || true).await.unwrap();
            assert_eq!(
                ended,
                Ended {
                    resolved: 2,
                    newer_kept: 0
                }
            );
            assert_eq!(s.get("g", "t", 0), Some(committed(6, Some("tx"))));
            assert_eq!(s.get("g", "t", 1), Some(committed(8, Some("tx"))));
            assert!(!s.has_pending("g", "t", 0) && s.group_pending("g").is_empty());
            // The coordinator's recovery sends the marker again: nothing left, nothing written.
            let records = s.records_in_log();
            let again = s.end_transaction("g", 7, 2, true, || true).await.unwrap();
            assert_eq!(again, Ended::default());
            assert_eq!(s.records_in_log(), records);
            s.close().await;

            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(s.get("g", "t", 0), Some(committed(6, Some("tx"))));
            assert_eq!(s.get("g", "t", 1), Some(committed(8, Some("tx"))));
            assert!(
                s.group_pending("g").is_empty(),
                "the tombstones were replayed"
            );
            s.close().await;
        });
    }

    #[test]
    fn an_abort_drops_pending_offsets_and_a_stale_marker_keeps_newer_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            s.write("g", at(0, 1)).await.unwrap();
            s.write_pending("g", pending(0, 5, 3)).await.unwrap();
            // Another producer's pending offset is not touched by producer 7's markers.
            s.write_pending(
                "g",
                vec![(8, ("t".into(), 0), pending(0, 9, 1)[0].2.clone())],
            )
            .await
            .unwrap();
            // A marker of epoch 2 is older than the pending offsets (epoch 3): they stay.
            let stale = s.end_transaction("g", 7, 2, true, || true).await.unwrap();
            assert_eq!(
                stale,
                Ended {
                    resolved: 0,
                    newer_kept: 1
                }
            );
            assert_eq!(s.get("g", "t", 0), Some(committed(1, None)));
            // An abort at a newer epoch (the coordinator bumps it when fencing) drops them.
            let aborted = s.end_transaction("g", 7, 4, false, || true).await.unwrap();
            assert_eq!(
                aborted,
                Ended {
                    resolved: 1,
                    newer_kept: 0
                }
            );
            assert_eq!(s.get("g", "t", 0), Some(committed(1, None)));
            assert_eq!(s.pending_epoch("g", 7), None);
            assert_eq!(s.pending_epoch("g", 8), Some(1));
            // A group being deleted: the marker writes nothing.
            let refused = s.end_transaction("g", 8, 1, true, || false).await.unwrap();
            assert_eq!(refused, Ended::default());
            assert!(s.has_pending("g", "t", 0));
            s.close().await;
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(s.get("g", "t", 0), Some(committed(1, None)));
            assert_eq!(
                s.pending_epoch("g", 7),
                None,
                "the abort's tombstone was replayed"
            );
            assert!(s.has_pending("g", "t", 0));
            s.close().await;
        });
    }

    #[test]
    fn compaction_keeps_pending_offsets_and_a_delete_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let s = OffsetStore::open(&root, cache(), 10).await.unwrap();
            s.write_pending("only-pending", pending(0, 3, 0))
                .await
                .unwrap();
            s.write_pending("gone", pending(0, 4, 0)).await.unwrap();
            assert!(s.has_group("only-pending"));
            assert_eq!(
                s.groups(),
                vec!["gone".to_string(), "only-pending".to_string()]
            );
            s.delete_group("gone").await.unwrap();
            assert!(!s.has_group("gone"));
            for i in 0..50 {
                s.write("g", at(0, i)).await.unwrap();
            }
            assert!(s.needs_compaction());
            s.maybe_compact().await;
            assert_eq!(s.compactions(), 1);
            assert_eq!(
                s.records_in_log(),
                2,
                "one committed and one pending offset"
            );
            s.close().await;
            let s = OffsetStore::open(&root, cache(), 10).await.unwrap();
            assert_eq!(s.live(), 2);
            assert_eq!(s.get("g", "t", 0), Some(committed(49, None)));
            assert_eq!(
                s.group_pending("only-pending"),
                vec![(7, ("t".into(), 0), pending(0, 3, 0)[0].2.clone().unwrap())]
            );
            assert!(!s.has_group("gone"));
            s.close().await;
        });
    }

    #[test]
    fn commits_survive_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            s.write("g1", vec![(("t".into(), 0), Some(committed(5, Some("m"))))])
                .await
                .unwrap();
            s.write("g1", at(0, 9)).await.unwrap();
            s.write("g2", at(1, 3)).await.unwrap();
            s.delete_group("g2").await.unwrap();
            s.close().await;
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            assert_eq!(s.get("g1", "t", 0), Some(committed(9, None)));
            assert!(!s.has_group("g2"));
            assert_eq!(s.records_in_log(), 4);
            s.close().await;
        });
    }

    #[test]
    fn compaction_keeps_the_live_entries_and_shrinks_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let s = OffsetStore::open(&root, cache(), 50).await.unwrap();
            for i in 0..200 {
                s.write(
                    "g",
                    vec![
                        (("a".into(), 0), Some(committed(i, None))),
                        (
                            ("b".into(), i as i32 % 3),
                            Some(committed(i * 2, Some("x"))),
                        ),
                    ],
                )
                .await
                .unwrap();
                s.maybe_compact().await;
            }
            assert!(s.compactions() >= 1, "compaction ran");
            assert!(s.records_in_log() <= 100, "{} records", s.records_in_log());
            s.close().await;
            let s = OffsetStore::open(&root, cache(), 50).await.unwrap();
            assert_eq!(s.live(), 4);
            assert_eq!(s.get("g", "a", 0), Some(committed(199, None)));
            assert_eq!(s.get("g", "b", 199 % 3), Some(committed(398, Some("x"))));
            assert_eq!(s.get("g", "b", 197 % 3), Some(committed(394, Some("x"))));
            assert!(
                s.records_in_log() <= 100,
                "start-up read {}",
                s.records_in_log()
            );
            let dirs = std::fs::read_dir(&root)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with("log-")
                })
                .count();
            assert_eq!(dirs, 1, "old logs are removed");
            s.close().await;
        });
    }

    #[test]
    fn a_fetch_waits_for_the_groups_writes_in_flight_and_no_other_groups() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            use futures_lite::future::{poll_once, zip};
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            s.write("g", at(0, 1)).await.unwrap();
            s.write("h", at(0, 7)).await.unwrap();
            let mut commit = Box::pin(s.write("g", at(0, 2)));
            // Its first poll begins it (the fsync is still to come, or done but not yet seen).
            let first = poll_once(&mut commit).await;
            assert!(first.is_none() || s.get("g", "t", 0) == Some(committed(2, None)));
            if first.is_none() {
                assert!(s.writing("g"));
                assert!(!s.writing("h"));
                assert_eq!(
                    s.get("g", "t", 0),
                    Some(committed(1, None)),
                    "not yet applied"
                );
                // Another group's fetch does not wait.
                assert!(poll_once(s.settled("h")).await.is_some());
            }
            let fetch = async {
                s.settled("g").await;
                s.get("g", "t", 0)
            };
            let (written, fetched) = zip(
                async {
                    if let Some(r) = first {
                        r
                    } else {
                        commit.await
                    }
                },
                fetch,
            )
            .await;
            written.unwrap();
            assert_eq!(fetched, Some(committed(2, None)));
            assert!(!s.writing("g"));
            assert!(poll_once(s.settled("g")).await.is_some());
            s.close().await;
        });
    }

    #[test]
    fn a_delete_racing_a_commit_tombstones_it_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            use futures_lite::future::{poll_once, zip};
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            s.write("g", at(0, 1)).await.unwrap();
            // A commit to a partition the group had no offset for is in flight when the delete
            // starts: the delete must cover it.
            let mut commit = Box::pin(s.write("g", at(1, 5)));
            let first = poll_once(&mut commit).await;
            let (c, d) = zip(
                async {
                    if let Some(r) = first {
                        r
                    } else {
                        commit.await
                    }
                },
                s.delete_group("g"),
            )
            .await;
            c.unwrap();
            d.unwrap();
            assert!(!s.has_group("g"), "{:?}", s.group_offsets("g"));
            s.close().await;
            let s = OffsetStore::open(&root, cache(), 1000).await.unwrap();
            assert!(!s.has_group("g"), "{:?}", s.group_offsets("g"));
            s.close().await;
        });
    }

    #[test]
    fn a_delete_is_not_held_back_by_other_groups_committing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("core-0");
        run(move || async move {
            let s = Rc::new(OffsetStore::open(&root, cache(), 1_000_000).await.unwrap());
            s.write("gone", at(0, 1)).await.unwrap();
            // Two committers of another group overlap, so some commit is always in flight.
            let busy = Rc::new(Cell::new(true));
            let committers: Vec<_> = (0..2)
                .map(|i| {
                    let (s, busy) = (s.clone(), busy.clone());
                    glommio::spawn_local(async move {
                        let mut n = 0;
                        while busy.get() {
                            n += 1;
                            let c = committed(n, None);
                            s.write("busy", vec![(("t".into(), i), Some(c))])
                                .await
                                .unwrap();
                        }
                    })
                })
                .collect();
            glommio::timer::sleep(Duration::from_millis(20)).await;
            let deleted =
                futures_lite::future::or(async { Some(s.delete_group("gone").await) }, async {
                    glommio::timer::sleep(Duration::from_secs(10)).await;
                    None
                })
                .await;
            busy.set(false);
            for c in committers {
                c.await;
            }
            deleted.expect("the delete finished within 10 s").unwrap();
            assert!(!s.has_group("gone"));
            assert!(s.has_group("busy"));
        });
    }
}
