//! The fetch read coalescer: on each core, one read-and-serialize per
//! (partition, offset, isolation, max_bytes, obligatory) serves every fetch that asks for it, both at
//! the same moment (in-flight sharing) and shortly after (a small cache of fresh results). Results are
//! shared by `Rc`: every response holds the same record bytes.
//!
//! Design notes: `docs/engine.md`.

use crate::error::Error;
use crate::fast_map::{FastMap, FastSet};
use crate::records::LogRead;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// What makes two fetches ask for the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoalesceKey {
    /// [`crate::Log::id`] of the partition's log.
    pub log: u64,
    /// [`crate::Log::layout`]: changes when compaction rewrites segments, so results read
    /// before it are not served after it.
    pub layout: u64,
    pub offset: i64,
    pub read_committed: bool,
    pub max_bytes: usize,
    pub obligatory: bool,
}

/// A finished read, shared by every response that serves it.
#[derive(Debug)]
pub struct SharedRead {
    pub read: LogRead,
    /// Responses currently holding it (see [`ResponseMemory`]).
    holders: Cell<usize>,
}

impl SharedRead {
    pub fn new(read: LogRead) -> Rc<Self> {
        Rc::new(Self {
            read,
            holders: Cell::new(0),
        })
    }
}

/// The coalescer's counters, as a plain snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalescerStats {
    /// Results cached under a key not cached before.
    pub insertions: u64,
    /// Results that replaced a stale result under the same key.
    pub reinsertions: u64,
    /// Fetches served by a fresh cached result.
    pub ready_hits: u64,
    /// Fetches that waited for a read another fetch had started.
    pub inflight_hits: u64,
    pub evictions: u64,
    pub cached_bytes: u64,
    pub cached_entries: u64,
    /// Reads actually run against the log.
    pub reads: u64,
}

#[derive(Debug)]
struct Entry {
    value: Rc<SharedRead>,
    end_seen: i64,
    cut_short: bool,
    bytes: usize,
    freq: u8,
    in_main: bool,
    generation: u64,
}

impl Entry {
    fn is_fresh(&self, visible_end: i64) -> bool {
        self.cut_short || visible_end == self.end_seen
    }
}

/// S3-FIFO over byte sizes. Queues hold (key, generation); entries replaced or removed leave stale
/// queue slots that are skipped when they reach the front.
#[derive(Debug, Default)]
struct Cache {
    capacity: usize,
    entries: FastMap<CoalesceKey, Entry>,
    small: VecDeque<(CoalesceKey, u64)>,
    main: VecDeque<(CoalesceKey, u64)>,
    small_bytes: usize,
    main_bytes: usize,
    ghost: FastSet<CoalesceKey>,
    ghost_order: VecDeque<CoalesceKey>,
    next_generation: u64,
    /// Per log, the latest visible end a cached read saw, and the keys of cached results that
    /// stay fresh only while the visible end is where they saw it (not cut short). Once a read of
    /// that log has seen a later end they can never be fresh again (the end only moves forward),
    /// and they are dropped at once rather than when eviction reaches them, or not cached at all
    /// if they finish after it: at the tail a result is a few KiB but its bytes are slices of the
    /// tail cache's 1 MiB chunks, so dead results would otherwise pin chunks the tail cache has
    /// already let go.
    /// Keyed by log and isolation: a read_committed read's end (the last stable offset) may stay
    /// behind the high watermark read_uncommitted reads see, and is not superseded by it.
    uncut: FastMap<(u64, bool), (i64, Vec<CoalesceKey>)>,
}

impl Cache {
    fn bytes(&self) -> usize {
        self.small_bytes + self.main_bytes
    }

    fn remove(&mut self, key: &CoalesceKey) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        if e.in_main {
            self.main_bytes -= e.bytes;
        } else {
            self.small_bytes -= e.bytes;
        }
        Some(e)
    }

    /// Inserts (unless the result is too big to cache: it would flush most of the cache) and
    /// returns whether it did and how many entries were evicted to make room or because they can
    /// no longer be fresh.
    fn insert(&mut self, key: CoalesceKey, mut entry: Entry) -> (bool, u64) {
        let (latest, superseded) =
            self.drop_superseded((key.log, key.read_committed), entry.end_seen);
        let dead = !entry.cut_short && entry.end_seen < latest;
        if dead || entry.bytes > self.capacity / 2 {
            return (false, superseded);
        }
        self.remove(&key);
        if !entry.cut_short {
            let (_, keys) = self
                .uncut
                .entry((key.log, key.read_committed))
                .or_insert((latest, Vec::new()));
            keys.push(key);
        }
        self.next_generation += 1;
        entry.generation = self.next_generation;
        entry.in_main = self.ghost.remove(&key);
        if entry.in_main {
            self.main_bytes += entry.bytes;
            self.main.push_back((key, entry.generation));
        } else {
            self.small_bytes += entry.bytes;
            self.small.push_back((key, entry.generation));
        }
        self.entries.insert(key, entry);
        let mut evicted = superseded;
        while self.bytes() > self.capacity {
            if self.small_bytes > self.capacity / 10 || self.main.is_empty() {
                evicted += self.evict_small();
            } else {
                evicted += self.evict_main();
            }
        }
        // Removed entries leave their queue slots behind; when the cache is not full, eviction
        // never reaches them, so they are swept here once they outnumber the live ones.
        if self.small.len() + self.main.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            let live =
                |(k, g): &(CoalesceKey, u64)| entries.get(k).is_some_and(|e| e.generation == *g);
            self.small.retain(live);
            self.main.retain(live);
            // Logs whose results have all left (an idle or deleted partition) are forgotten.
            self.uncut.retain(|_, (_, keys)| {
                keys.retain(|k| entries.get(k).is_some_and(|e| !e.cut_short));
                !keys.is_empty()
            });
        }
        (true, evicted)
    }

    /// A read of `log` saw the visible end at `end_seen`: drops the log's results that are not cut
    /// short and saw an earlier end. Returns the latest end seen for the log and how many were
    /// dropped.
    fn drop_superseded(&mut self, log: (u64, bool), end_seen: i64) -> (i64, u64) {
        let Some((latest, mut keys)) = self.uncut.remove(&log) else {
            return (end_seen, 0);
        };
        let latest = latest.max(end_seen);
        let mut dropped = 0;
        keys.retain(|k| match self.entries.get(k) {
            Some(e) if e.cut_short => false,
            Some(e) if e.end_seen < latest => {
                self.remove(k);
                dropped += 1;
                false
            }
            Some(_) => true,
            None => false,
        });
        self.uncut.insert(log, (latest, keys));
        (latest, dropped)
    }

    fn live(&self, key: &CoalesceKey, generation: u64) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.generation == generation)
    }

    fn evict_small(&mut self) -> u64 {
        while let Some((key, generation)) = self.small.pop_front() {
            if !self.live(&key, generation) || self.entries[&key].in_main {
                continue;
            }
            let e = self.entries.get_mut(&key).unwrap();
            if e.freq > 0 {
                // Asked for again while young: promote.
                e.freq = 0;
                e.in_main = true;
                self.small_bytes -= e.bytes;
                self.main_bytes += e.bytes;
                self.main.push_back((key, generation));
                return 0;
            }
            self.remove(&key);
            self.ghost.insert(key);
            self.ghost_order.push_back(key);
            while self.ghost_order.len() > self.entries.len().max(64) {
                if let Some(old) = self.ghost_order.pop_front() {
                    self.ghost.remove(&old);
                }
            }
            return 1;
        }
        0
    }

    fn evict_main(&mut self) -> u64 {
        while let Some((key, generation)) = self.main.pop_front() {
            if !self.live(&key, generation) {
                continue;
            }
            let e = self.entries.get_mut(&key).unwrap();
            if e.freq > 0 {
                e.freq -= 1;
                self.main.push_back((key, generation));
                continue;
            }
            self.remove(&key);
            return 1;
        }
        0
    }
}

type ReadResult = Result<Rc<SharedRead>, Error>;

/// A read in progress and the fetches waiting for it.
#[derive(Debug, Default)]
struct PendingRead {
    result: RefCell<Option<ReadResult>>,
    wakers: RefCell<Vec<Waker>>,
}

struct PendingReadWait(Rc<PendingRead>);

impl Future for PendingReadWait {
    type Output = ReadResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReadResult> {
        if let Some(r) = &*self.0.result.borrow() {
            return Poll::Ready(r.clone());
        }
        self.0.wakers.borrow_mut().push(cx.waker().clone());
        Poll::Pending
    }
}

/// One per core.
#[derive(Debug)]
pub struct FetchCoalescer {
    enabled: Cell<bool>,
    in_flight: RefCell<FastMap<CoalesceKey, Rc<PendingRead>>>,
    cache: RefCell<Cache>,
    stats: Cell<CoalescerStats>,
}

impl FetchCoalescer {
    /// A coalescer whose cache holds at most `capacity_bytes` of results.
    pub fn new(capacity_bytes: usize, enabled: bool) -> Rc<Self> {
        Rc::new(Self {
            enabled: Cell::new(enabled),
            in_flight: RefCell::default(),
            cache: RefCell::new(Cache {
                capacity: capacity_bytes,
                ..Cache::default()
            }),
            stats: Cell::new(CoalescerStats::default()),
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.get()
    }

    /// Turns coalescing on or off; off drops every cached result (reads in flight finish for the
    /// fetches already waiting on them).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.set(on);
        if !on {
            let capacity = self.cache.borrow().capacity;
            *self.cache.borrow_mut() = Cache {
                capacity,
                ..Cache::default()
            };
        }
    }

    pub fn stats(&self) -> CoalescerStats {
        let cache = self.cache.borrow();
        CoalescerStats {
            cached_bytes: cache.bytes() as u64,
            cached_entries: cache.entries.len() as u64,
            ..self.stats.get()
        }
    }

    fn bump(&self, f: impl FnOnce(&mut CoalescerStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// The result for `key`: shared with a read in flight, taken from the cache if still fresh for
    /// `visible_end` (the partition's high watermark, or last stable offset for read_committed), or
    /// read with `read`, which then serves everyone who asks for `key` while it runs.
    pub async fn read<F, Fut>(
        self: &Rc<Self>,
        key: CoalesceKey,
        visible_end: i64,
        read: F,
    ) -> ReadResult
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<LogRead, Error>> + 'static,
    {
        if !self.enabled.get() {
            self.bump(|s| s.reads += 1);
            return read().await.map(SharedRead::new);
        }
        let in_flight = self.in_flight.borrow().get(&key).cloned();
        if let Some(flight) = in_flight {
            self.bump(|s| s.inflight_hits += 1);
            return PendingReadWait(flight).await;
        }
        let stale = {
            let mut cache = self.cache.borrow_mut();
            match cache.entries.get_mut(&key) {
                Some(e) if e.is_fresh(visible_end) => {
                    e.freq = (e.freq + 1).min(3);
                    let v = e.value.clone();
                    drop(cache);
                    self.bump(|s| s.ready_hits += 1);
                    return Ok(v);
                }
                Some(_) => true,
                None => false,
            }
        };
        self.bump(|s| s.reads += 1);
        // A read that needs no I/O (the tail cache) finishes on its first poll: it is done here,
        // with no task to spawn and wait for and no in-flight entry (nobody can join it
        // meanwhile). One that must wait goes on as a task of its own, detached from this fetch,
        // so that this fetch timing out or its client leaving cannot cancel it for the others.
        let mut fut = Box::pin(read());
        if let Some(result) = futures_lite::future::poll_once(&mut fut).await {
            let result = result.map(SharedRead::new);
            if let Ok(shared) = &result {
                self.keep(key, shared, stale);
            }
            return result;
        }
        let flight = Rc::new(PendingRead::default());
        self.in_flight.borrow_mut().insert(key, flight.clone());
        let this = self.clone();
        let done = flight.clone();
        glommio::spawn_local(async move {
            let result = fut.await.map(SharedRead::new);
            this.finish(key, &done, result, stale);
        })
        .detach();
        PendingReadWait(flight).await
    }

    /// A read for `key` is over: it leaves the in-flight table, its result is cached if worth it,
    /// and the fetches waiting on it get it.
    fn finish(&self, key: CoalesceKey, flight: &PendingRead, result: ReadResult, stale: bool) {
        self.in_flight.borrow_mut().remove(&key);
        if let Ok(shared) = &result {
            self.keep(key, shared, stale);
        }
        *flight.result.borrow_mut() = Some(result);
        flight.wakers.borrow_mut().drain(..).for_each(Waker::wake);
    }

    /// Caches a finished result if it is worth keeping.
    fn keep(&self, key: CoalesceKey, shared: &Rc<SharedRead>, stale: bool) {
        let mut cache = self.cache.borrow_mut();
        if stale {
            cache.remove(&key);
        }
        let records = &shared.read.records;
        if !self.enabled.get() || records.is_empty() {
            return;
        }
        let end_seen = shared.read.high_watermark;
        let entry = Entry {
            value: shared.clone(),
            end_seen,
            cut_short: records.last_offset + 1 < end_seen,
            bytes: records.len,
            freq: 0,
            in_main: false,
            generation: 0,
        };
        let (inserted, evicted) = cache.insert(key, entry);
        drop(cache);
        self.bump(|s| {
            if inserted && stale {
                s.reinsertions += 1;
            } else if inserted {
                s.insertions += 1;
            }
            s.evictions += evicted;
        });
    }
}

/// A per-core budget for the record bytes held by fetch responses not yet written. A result shared
/// by many responses is counted once, from the first response that holds it until the last one
/// releases it.
#[derive(Debug)]
pub struct ResponseMemory {
    budget: usize,
    used: Cell<usize>,
}

impl ResponseMemory {
    pub fn new(budget: usize) -> Rc<Self> {
        Rc::new(Self {
            budget,
            used: Cell::new(0),
        })
    }

    pub fn used(&self) -> usize {
        self.used.get()
    }

    /// Bytes a new fetch may still add; a fetch gets at least one batch of its first partition even
    /// when this is zero (KIP-74), so responses never wait for memory.
    pub fn available(&self) -> usize {
        self.budget.saturating_sub(self.used.get())
    }

    /// Counts `shared` as held by one more response until the returned guard is dropped.
    pub fn hold(self: &Rc<Self>, shared: &Rc<SharedRead>) -> ResponseHold {
        if shared.holders.get() == 0 {
            self.used.set(self.used.get() + shared.read.records.len);
        }
        shared.holders.set(shared.holders.get() + 1);
        ResponseHold {
            shared: shared.clone(),
            memory: self.clone(),
        }
    }
}

/// One response's hold on a shared result; dropping it (after the response is written) releases it.
#[derive(Debug)]
pub struct ResponseHold {
    shared: Rc<SharedRead>,
    memory: Rc<ResponseMemory>,
}

impl ResponseHold {
    pub fn read(&self) -> &LogRead {
        &self.shared.read
    }
}

impl Drop for ResponseHold {
    fn drop(&mut self) {
        let h = self.shared.holders.get() - 1;
        self.shared.holders.set(h);
        if h == 0 {
            let used = &self.memory.used;
            used.set(used.get() - self.shared.read.records.len);
        }
    }
}
