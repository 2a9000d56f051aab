//! Committed offsets of the groups a core coordinates: an in-memory map, made durable in an internal
//! log on that core (`crate::internal_log`).
//!
//! Design notes: `docs/groups.md`.

pub use crate::internal_log::StoreResult;
use crate::internal_log::{Cursor, InternalLog, KeyedRecord};
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

#[derive(Debug)]
struct Entry {
    /// Order of the write that set it: a commit applied late never overwrites a newer one.
    seq: u64,
    value: Committed,
}

#[derive(Debug)]
pub struct OffsetStore {
    /// Commits and tombstones; its record count drives the compaction decision.
    log: InternalLog,
    entries: RefCell<HashMap<String, HashMap<TopicPartition, Entry>>>,
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

/// The record key of a committed offset.
pub fn encode_key(group: &str, topic: &str, partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + group.len() + topic.len());
    k.push(0); // kind: committed offset
    k.extend_from_slice(&(group.len() as u32).to_be_bytes());
    k.extend_from_slice(group.as_bytes());
    k.extend_from_slice(&(topic.len() as u32).to_be_bytes());
    k.extend_from_slice(topic.as_bytes());
    k.extend_from_slice(&partition.to_be_bytes());
    k
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
    if c.u8()? != 0 {
        return None;
    }
    let group = c.string()?;
    let topic = c.string()?;
    let partition = c.i32()?;
    c.0.is_empty().then_some((group, topic, partition))
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

impl OffsetStore {
    /// Opens the store under `root` (created if missing) and replays it.
    pub async fn open(root: &Path, cache: Rc<TailCache>, compact_min: u64) -> StoreResult<Self> {
        let store = OffsetStore {
            log: InternalLog::open(root, cache).await?,
            entries: RefCell::new(HashMap::new()),
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
            .replay(|key, value| {
                let Some((group, topic, partition)) = key.and_then(decode_key) else {
                    log::warn!("{}: skipping a record with a bad key", root.display());
                    return;
                };
                let value = value.map(decode_value);
                if let Some(None) = value {
                    log::warn!("{}: skipping a record with a bad value", root.display());
                    return;
                }
                self.apply(&group, (topic, partition), value.flatten(), self.take_seq());
            })
            .await?;
        log::info!(
            "{}: {} committed offsets from {n} records",
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

    fn apply(&self, group: &str, tp: TopicPartition, value: Option<Committed>, seq: u64) {
        let mut entries = self.entries.borrow_mut();
        match value {
            Some(value) => {
                let g = entries.entry(group.to_string()).or_default();
                match g.get_mut(&tp) {
                    Some(e) if e.seq > seq => {}
                    Some(e) => *e = Entry { seq, value },
                    None => {
                        g.insert(tp, Entry { seq, value });
                    }
                }
            }
            None => {
                if let Some(g) = entries.get_mut(group) {
                    if g.get(&tp).is_some_and(|e| e.seq < seq) {
                        g.remove(&tp);
                    }
                    if g.is_empty() {
                        entries.remove(group);
                    }
                }
            }
        }
    }

    /// Live entries (committed offsets of all groups).
    pub fn live(&self) -> usize {
        self.entries.borrow().values().map(HashMap::len).sum()
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

    pub fn has_group(&self, group: &str) -> bool {
        self.entries.borrow().contains_key(group)
    }

    pub fn groups(&self) -> Vec<String> {
        self.entries.borrow().keys().cloned().collect()
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
        if changes.is_empty() {
            return Ok(());
        }
        let _flight = self.begin(group);
        let _shared = self.lock.read().await.map_err(|e| e.to_string())?;
        self.append_and_apply(group, changes).await
    }

    /// Appends and applies under a lock the caller holds (shared for commits, exclusive for
    /// deletes). The sequence number is taken right before the append is queued, with no await
    /// between them, so the order writes apply in memory is their order in the log.
    async fn append_and_apply(&self, group: &str, changes: Changes) -> StoreResult<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let recs: Vec<KeyedRecord> = changes
            .iter()
            .map(|((t, p), c)| (encode_key(group, t, *p), c.as_ref().map(encode_value)))
            .collect();
        let seq = self.take_seq();
        self.log.append(&recs).await?;
        for (tp, c) in changes {
            self.apply(group, tp, c, seq);
        }
        Ok(())
    }

    /// Deletes every committed offset of `group`, which must already refuse new commits (the
    /// coordinator marks it dead first): the group's commits in flight are applied first, then
    /// the offsets left are read and tombstoned. Under the shared lock, like a commit: the lock
    /// does not favour waiting writers, so the exclusive side would wait for as long as any
    /// group on the core keeps committing.
    pub async fn delete_group(&self, group: &str) -> StoreResult<()> {
        self.settled(group).await;
        let _flight = self.begin(group);
        let _shared = self.lock.read().await.map_err(|e| e.to_string())?;
        let changes = self
            .group_offsets(group)
            .into_iter()
            .map(|(tp, _)| (tp, None))
            .collect();
        self.append_and_apply(group, changes).await
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
        let recs: Vec<KeyedRecord> = self
            .entries
            .borrow()
            .iter()
            .flat_map(|(g, parts)| {
                parts
                    .iter()
                    .map(move |((t, p), e)| (encode_key(g, t, *p), Some(encode_value(&e.value))))
            })
            .collect();
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
