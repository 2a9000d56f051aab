//! The per-core tail cache: the most recent batches of every partition on the core, in memory, so reads
//! at or near the tail do no disk I/O and copy nothing.
//!
//! Each partition's cached range is contiguous and ends at its high watermark: appends add to the end,
//! eviction removes from the front. Memory is held in chunks (default 1 MiB) of back-to-back batches;
//! a read returns one `Bytes` per chunk it spans, so its cost does not grow with the number of batches.
//! Eviction is FIFO over chunks across all partitions of the core: the tail is by definition the newest
//! data, so insertion order is the order in which data stops being the tail.
//!
//! An evicted chunk that no reader still holds is kept (up to [`SPARE_CHUNKS`] of them) and written
//! again as the next new chunk: its memory stays mapped and warm, where a fresh 1 MiB allocation is
//! an `mmap`, a page fault per 4 KiB on first write and a `munmap` when it goes.

use crate::chunk::ChunkWriter;
use crate::fast_map::FastMap;
use crate::records::Records;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// Identifies one partition log within a core's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogId(u64);

#[derive(Debug)]
struct Entry {
    base_offset: i64,
    last_offset: i64,
    /// Where the batch ends in its chunk; it starts where the previous one ends (or at 0).
    end: usize,
    /// Records in this chunk up to and including this batch.
    cum_records: u64,
}

#[derive(Debug)]
struct CachedChunk {
    seq: u64,
    writer: ChunkWriter,
    entries: Vec<Entry>,
}

impl CachedChunk {
    fn start_of(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.entries[i - 1].end
        }
    }
    fn records_before(&self, i: usize) -> u64 {
        if i == 0 {
            0
        } else {
            self.entries[i - 1].cum_records
        }
    }
    /// Copies one batch in (the caller checked it fits) and indexes it.
    fn push(
        &mut self,
        batch: &[u8],
        fix: impl FnOnce(&mut [u8]),
        offsets: (i64, i64),
        records: u64,
    ) {
        let cum = self.entries.last().map_or(0, |e| e.cum_records) + records;
        self.writer.push_with(batch, fix);
        self.entries.push(Entry {
            base_offset: offsets.0,
            last_offset: offsets.1,
            end: self.writer.len(),
            cum_records: cum,
        });
    }
}

#[derive(Debug, Default)]
struct PartitionTail {
    chunks: VecDeque<CachedChunk>,
}

impl PartitionTail {
    fn first_offset(&self) -> Option<i64> {
        self.chunks
            .front()
            .and_then(|c| c.entries.first())
            .map(|e| e.base_offset)
    }
    fn next_offset(&self) -> Option<i64> {
        self.chunks
            .back()
            .and_then(|c| c.entries.last())
            .map(|e| e.last_offset + 1)
    }
}

/// A plain snapshot of the cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TailCacheStats {
    pub capacity_bytes: usize,
    pub used_bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub evicted_chunks: u64,
    /// New chunks written in the memory of an evicted one (see the module's documentation).
    pub reused_chunks: u64,
}

/// Evicted chunks kept for reuse, at most: memory beyond the cache's capacity.
pub const SPARE_CHUNKS: usize = 4;

#[derive(Debug)]
struct Inner {
    partitions: FastMap<LogId, PartitionTail>,
    /// Chunks in allocation order, for eviction.
    fifo: VecDeque<(LogId, u64)>,
    used: usize,
    /// Dropped chunks of the usual size that no reader holds, emptied, for the next new chunks.
    spare: Vec<ChunkWriter>,
}

impl Inner {
    /// Takes a chunk out of the cache's memory: kept as a spare when nobody holds it and there is
    /// room, else freed (when its last reader lets go).
    fn retire(&mut self, chunk: CachedChunk, chunk_bytes: usize) {
        self.used -= chunk.writer.capacity();
        if self.spare.len() >= SPARE_CHUNKS || chunk.writer.capacity() != chunk_bytes {
            return;
        }
        if let Some(w) = chunk.writer.recycle() {
            self.spare.push(w);
        }
    }
}

/// One per core, shared (`Rc`) by every log on it.
#[derive(Debug)]
pub struct TailCache {
    capacity: usize,
    chunk_bytes: usize,
    inner: RefCell<Inner>,
    next_id: Cell<u64>,
    next_seq: Cell<u64>,
    hits: Cell<u64>,
    misses: Cell<u64>,
    evicted: Cell<u64>,
    reused: Cell<u64>,
}

impl TailCache {
    /// `capacity` bounds the memory of all chunks together; `chunk_bytes` is the allocation unit.
    pub fn new(capacity: usize, chunk_bytes: usize) -> Self {
        Self {
            capacity,
            chunk_bytes: chunk_bytes.max(4096),
            inner: RefCell::new(Inner {
                partitions: FastMap::default(),
                fifo: VecDeque::new(),
                used: 0,
                spare: Vec::new(),
            }),
            next_id: Cell::new(0),
            next_seq: Cell::new(0),
            hits: Cell::new(0),
            misses: Cell::new(0),
            evicted: Cell::new(0),
            reused: Cell::new(0),
        }
    }

    pub(crate) fn register(&self) -> LogId {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        LogId(id)
    }

    pub fn stats(&self) -> TailCacheStats {
        TailCacheStats {
            capacity_bytes: self.capacity,
            used_bytes: self.inner.borrow().used,
            hits: self.hits.get(),
            misses: self.misses.get(),
            evicted_chunks: self.evicted.get(),
            reused_chunks: self.reused.get(),
        }
    }

    /// Drops everything cached for a log (truncation, close, delete).
    pub(crate) fn forget(&self, id: LogId) {
        let mut inner = self.inner.borrow_mut();
        if let Some(pt) = inner.partitions.remove(&id) {
            pt.chunks
                .into_iter()
                .for_each(|c| inner.retire(c, self.chunk_bytes));
        }
    }

    /// Drops the cached chunks of log `id` that begin below `end` (compaction rewrote the log below
    /// it): reads there go to the rewritten segments. What is kept still ends at the high watermark.
    pub(crate) fn forget_below(&self, id: LogId, end: i64) {
        let mut inner = self.inner.borrow_mut();
        let Some(pt) = inner.partitions.get_mut(&id) else {
            return;
        };
        let mut dropped = Vec::new();
        while pt
            .chunks
            .front()
            .is_some_and(|c| c.entries.first().is_some_and(|e| e.base_offset < end))
        {
            dropped.push(pt.chunks.pop_front().unwrap());
        }
        if pt.chunks.is_empty() {
            inner.partitions.remove(&id);
        }
        // Their eviction slots stay queued and are skipped (their sequence is gone).
        dropped
            .into_iter()
            .for_each(|c| inner.retire(c, self.chunk_bytes));
    }

    /// Caches one batch (already carrying its final offsets) appended at the end of log `id`.
    /// `fix` rewrites the cached copy in place (the log assigns offsets to the producer's bytes).
    pub(crate) fn insert(
        &self,
        id: LogId,
        batch: &[u8],
        fix: impl FnOnce(&mut [u8]),
        base_offset: i64,
        last_offset: i64,
        records: u64,
    ) {
        if batch.len() > self.capacity {
            self.forget(id);
            return;
        }
        // The usual case, one lookup: the batch follows on and fits the partition's last chunk.
        let contiguous = {
            let mut inner = self.inner.borrow_mut();
            match inner.partitions.get_mut(&id) {
                Some(pt) if pt.next_offset().is_none_or(|n| n == base_offset) => {
                    if let Some(chunk) = pt
                        .chunks
                        .back_mut()
                        .filter(|c| c.writer.remaining() >= batch.len())
                    {
                        chunk.push(batch, fix, (base_offset, last_offset), records);
                        return;
                    }
                    true
                }
                Some(_) => false,
                None => true,
            }
        };
        if !contiguous {
            self.forget(id);
        }
        // A new chunk, after evicting the oldest chunks of any partition to make room.
        let mut inner = self.inner.borrow_mut();
        let cap = self.chunk_bytes.max(batch.len());
        while inner.used + cap > self.capacity {
            let Some((victim, seq)) = inner.fifo.pop_front() else {
                break;
            };
            let Some(pt) = inner.partitions.get_mut(&victim) else {
                continue;
            };
            if pt.chunks.front().is_some_and(|c| c.seq == seq) {
                let c = pt.chunks.pop_front().unwrap();
                if pt.chunks.is_empty() {
                    inner.partitions.remove(&victim);
                }
                inner.retire(c, self.chunk_bytes);
                self.evicted.set(self.evicted.get() + 1);
            }
        }
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        let spare = (cap == self.chunk_bytes)
            .then(|| inner.spare.pop())
            .flatten();
        if spare.is_some() {
            self.reused.set(self.reused.get() + 1);
        }
        let mut chunk = CachedChunk {
            seq,
            writer: spare.unwrap_or_else(|| ChunkWriter::new(cap)),
            entries: Vec::new(),
        };
        chunk.push(batch, fix, (base_offset, last_offset), records);
        inner.used += chunk.writer.capacity();
        inner.fifo.push_back((id, seq));
        inner
            .partitions
            .entry(id)
            .or_default()
            .chunks
            .push_back(chunk);
    }

    /// Reads whole batches from the batch containing `offset`, at most `max_bytes` of them unless
    /// `obligatory` (then at least one). `None` when `offset` is not cached (the caller reads the disk);
    /// the caller has already checked `offset` is below the high watermark.
    pub(crate) fn read(
        &self,
        id: LogId,
        offset: i64,
        max_bytes: usize,
        obligatory: bool,
    ) -> Option<Records> {
        let read = self.lookup(id, offset, max_bytes, obligatory);
        let counter = if read.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.set(counter.get() + 1);
        read
    }

    /// [`Self::read`] of at least one batch, not counted as a hit or a miss (the log handing its
    /// new batches to its read replicas).
    pub(crate) fn peek(&self, id: LogId, offset: i64, max_bytes: usize) -> Option<Records> {
        self.lookup(id, offset, max_bytes, true)
    }

    fn lookup(
        &self,
        id: LogId,
        offset: i64,
        max_bytes: usize,
        obligatory: bool,
    ) -> Option<Records> {
        let inner = self.inner.borrow();
        let pt = inner
            .partitions
            .get(&id)
            .filter(|pt| pt.first_offset().is_some_and(|f| f <= offset))?;
        if pt.next_offset().is_none_or(|n| offset >= n) {
            return None;
        }
        // The chunk holding `offset`: the last one whose first batch starts at or before it.
        let ci = pt
            .chunks
            .partition_point(|c| c.entries[0].base_offset <= offset)
            - 1;
        let mut out = Records::empty();
        let mut budget = max_bytes;
        let mut must_take_one = obligatory;
        let mut start_entry = pt.chunks[ci]
            .entries
            .partition_point(|e| e.last_offset < offset);
        for chunk in pt.chunks.iter().skip(ci) {
            let start = chunk.start_of(start_entry);
            let limit = start.saturating_add(budget);
            let mut end_entry = chunk.entries.partition_point(|e| e.end <= limit);
            if end_entry <= start_entry {
                if !must_take_one {
                    break;
                }
                end_entry = start_entry + 1;
            }
            let end = chunk.entries[end_entry - 1].end;
            out.extend(Records {
                parts: vec![chunk.writer.view(start, end)],
                len: end - start,
                batches: (end_entry - start_entry) as u32,
                records: chunk.entries[end_entry - 1].cum_records
                    - chunk.records_before(start_entry),
                first_offset: chunk.entries[start_entry].base_offset,
                last_offset: chunk.entries[end_entry - 1].last_offset,
            });
            must_take_one = false;
            budget = budget.saturating_sub(end - start);
            if end_entry < chunk.entries.len() {
                break;
            }
            start_entry = 0;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_batch(len: usize, fill: u8) -> Vec<u8> {
        vec![fill; len]
    }

    #[test]
    fn reads_span_chunks_and_respect_budgets() {
        let cache = TailCache::new(1 << 20, 4096);
        let id = cache.register();
        // 10 batches of 1000 bytes, 10 offsets each: 4 per chunk.
        for i in 0..10 {
            cache.insert(
                id,
                &fake_batch(1000, i as u8),
                |_| {},
                i * 10,
                i * 10 + 9,
                10,
            );
        }
        let r = cache.read(id, 25, 10_000, false).unwrap();
        assert_eq!(
            (r.first_offset, r.last_offset, r.batches, r.len, r.records),
            (20, 99, 8, 8000, 80)
        );
        assert_eq!(r.parts.len(), 3); // chunk 0 (batches 2,3), chunk 1, chunk 2
        assert_eq!(r.to_vec()[0], 2);
        let r = cache.read(id, 25, 2500, false).unwrap();
        assert_eq!((r.batches, r.last_offset), (2, 39));
        let r = cache.read(id, 25, 999, false).unwrap();
        assert!(r.is_empty());
        let r = cache.read(id, 25, 999, true).unwrap();
        assert_eq!((r.batches, r.first_offset), (1, 20));
        assert!(cache.read(id, 100, 10, true).is_none());
    }

    #[test]
    fn eviction_is_fifo_and_bounded() {
        let cache = TailCache::new(3 * 4096, 4096);
        let a = cache.register();
        let b = cache.register();
        for i in 0..8 {
            cache.insert(a, &fake_batch(2000, 1), |_| {}, i, i, 1);
            cache.insert(b, &fake_batch(2000, 2), |_| {}, i, i, 1);
        }
        let s = cache.stats();
        assert!(s.used_bytes <= s.capacity_bytes);
        assert!(s.evicted_chunks > 0);
        assert!(cache.read(a, 0, 10, true).is_none());
        assert!(cache.read(b, 7, 10_000, true).is_some());
    }

    #[test]
    fn an_evicted_chunk_nobody_reads_is_written_again_and_a_held_one_is_not() {
        let cache = TailCache::new(2 * 4096, 4096);
        let id = cache.register();
        cache.insert(id, &fake_batch(4000, 1), |_| {}, 0, 0, 1);
        let first = cache.read(id, 0, 4096, true).unwrap().parts[0].as_ptr();
        cache.insert(id, &fake_batch(4000, 2), |_| {}, 1, 1, 1);
        let held = cache.read(id, 1, 4096, true).unwrap();
        // Evicts the first chunk (nobody reads it): the new batch lands in its memory.
        cache.insert(id, &fake_batch(4000, 3), |_| {}, 2, 2, 1);
        let third = cache.read(id, 2, 4096, true).unwrap();
        assert_eq!(third.parts[0].as_ptr(), first);
        assert_eq!(third.to_vec(), fake_batch(4000, 3));
        // Evicts the second chunk, which `held` still reads: new memory, `held` unchanged.
        cache.insert(id, &fake_batch(4000, 4), |_| {}, 3, 3, 1);
        let fourth = cache.read(id, 3, 4096, true).unwrap();
        assert_ne!(fourth.parts[0].as_ptr(), held.parts[0].as_ptr());
        assert_eq!(held.to_vec(), fake_batch(4000, 2));
        assert_eq!(fourth.to_vec(), fake_batch(4000, 4));
        let s = cache.stats();
        assert_eq!(
            (s.used_bytes, s.evicted_chunks, s.reused_chunks),
            (2 * 4096, 2, 1)
        );
    }

    #[test]
    fn a_gap_restarts_the_partition_range() {
        let cache = TailCache::new(1 << 20, 4096);
        let id = cache.register();
        cache.insert(id, &fake_batch(100, 1), |_| {}, 0, 4, 5);
        cache.insert(id, &fake_batch(100, 1), |b| b[0] = 7, 10, 14, 5);
        assert!(cache.read(id, 0, 1000, true).is_none());
        let r = cache.read(id, 10, 1000, true).unwrap();
        assert_eq!((r.batches, r.to_vec()[0], r.to_vec()[1]), (1, 7, 1));
    }
}
