//! Sharded views: one interpreting reader per (source partition, number of shards) on the owning core.
//!
//! The reader reads each source batch once, splits it per shard once ([`crate::split`]) and keeps
//! the shard batches as shared `Bytes` in a bounded window (those split together lie in one buffer,
//! each shard's back to back, so a response of consecutive batches is one part). A consumer of
//! shard `i` is served from its own offset: inside the window it gets the very same buffers as every
//! other consumer of that shard; behind the window (or too far ahead of the reader) it gets its own
//! catch-up read, which never moves or blocks the shared reader. The reader is pull-free: it
//! decodes ahead up to the last stable offset whatever the consumers do, so a slow or stalled
//! consumer delays nobody; it just falls out of the window. A reader with no consumer for
//! `idle_stop` stops and frees its window; the next fetch starts it again. Views publish committed
//! records only: nothing at or past the last stable offset, and the records of aborted
//! transactions and the markers become empty batches (their offsets stay, as compaction's gaps).

use crate::batch::{self, BatchHeader};
use crate::error::{Error, InvalidBatch, Result};
use crate::fast_map::FastMap;
use crate::log::Log;
use crate::monitor::OffsetMonitor;
use crate::records::{LogRead, Records};
use crate::split::{Routing, MAX_SPLIT_BYTES};
use crate::transactions::AbortedTxn;
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Settings shared by a core's view readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewConfig {
    /// Memory for one reader's window of shard batches.
    pub window_bytes: usize,
    /// A consumer this many offsets or fewer ahead of the reader waits for it; further away (or
    /// behind the window) it is served by its own catch-up read.
    pub max_delta_for_fanout: i64,
    /// A reader with no fetch for this long stops and frees its window.
    pub idle_stop: Duration,
    /// Bytes of source batches a reader (or a catch-up read) takes per log read.
    pub read_bytes: usize,
    /// Off: no shared reader; every view fetch reads and splits for itself (the baseline that
    /// benchmarks compare against).
    pub shared: bool,
}

impl Default for ViewConfig {
    fn default() -> Self {
        Self {
            window_bytes: 32 << 20,
            max_delta_for_fanout: 100_000,
            idle_stop: Duration::from_secs(30),
            read_bytes: 1 << 20,
            shared: true,
        }
    }
}

/// Counters of all view readers on a core.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ViewStats {
    pub readers: u64,
    pub source_batches_decoded: u64,
    pub shard_batches_encoded: u64,
    pub fetches_served: u64,
    pub catch_up_reads: u64,
    pub decode_errors: u64,
    /// Compressed source batches split from the records the produce path decompressed (kept by
    /// the log while a reader runs), not decompressed a second time.
    pub decompressions_saved: u64,
    /// View fetches served by another fetch's catch-up read of the same offset and size, of any
    /// shard (in flight, or finished within [`CATCH_UP_FRESH`]), not by a read of their own.
    pub catch_up_reads_shared: u64,
}

/// One source batch, split: a batch per shard, all covering `base..=last`. Shard `i`'s batch is
/// `run[ranges[i]]`: the shard batches of consecutive source batches split together lie in one
/// buffer, each shard's back to back, so a fetch of consecutive batches sends them as one part.
#[derive(Debug)]
struct SplitBatch {
    base: i64,
    last: i64,
    run: Bytes,
    ranges: Vec<(u32, u32)>,
    records: Vec<u32>,
    bytes: usize,
}

/// A split stops once its shard batches pass this together (the rest of the read is left for the
/// next one), so one read costs at most this and one source batch's shard batches (at most
/// [`crate::split::MAX_SPLIT_BYTES`]) whatever its batches decompress to.
const RUN_BYTES: usize = 16 << 20;

/// Source batches are routed and then copied into one buffer in groups whose shard batches take
/// about this much together: the records routed are still in cache when they are copied, and a
/// large read does not hold all its decompressed batches at once. (A group is one buffer: a fetch
/// sends a group's batches of its shard as one part.)
const GROUP_BYTES: usize = 256 << 10;

/// Splits the batches of `read` that start before `until`, in order, until their shard batches pass
/// [`RUN_BYTES`] (at least one; the caller goes on after the last one returned). A batch that cannot
/// be decoded (or split within [`crate::split::MAX_SPLIT_BYTES`]) gets an empty batch per shard, so
/// consumers still move past it. With `only: Some(i)`, each [`SplitBatch`] holds shard i's batch
/// alone (at index 0).
///
/// Each batch is decoded (unless the log kept its records) and its records routed; once a group of
/// them holds about [`GROUP_BYTES`] of shard batches, every shard batch of the group is copied into
/// one buffer of exactly their size (one allocation per group, not one per shard grown as records
/// arrive).
fn split_all(
    log: Option<&Log>,
    read: &Records,
    aborted: &[AbortedTxn],
    shards: u32,
    only: Option<u32>,
    until: i64,
    stats: &Cell<ViewStats>,
) -> Vec<SplitBatch> {
    let outputs = if only.is_some() { 1 } else { shards as usize };
    let mut split = Vec::new();
    let mut group = Group::new(outputs);
    for (h, source) in read.batches().take_while(|(h, _)| h.base_offset < until) {
        if group.total >= RUN_BYTES {
            break;
        }
        // Markers and aborted records are no view's records: an empty batch keeps the offsets.
        if h.is_control() || is_aborted(&h, aborted) {
            group.skip(h);
            continue;
        }
        let mut s = stats.get();
        // Decompressed when it was produced, if the log kept that for its view readers.
        let decoded = log
            .and_then(|l| l.decoded(&h))
            .filter(|_| h.compression() != 0);
        if decoded.is_some() {
            s.decompressions_saved += 1;
        }
        if let Err(e) = group.route(h, &source, decoded, shards, only) {
            log::warn!(
                "view: skipping source batch at offset {}: {e}",
                h.base_offset
            );
            s.decode_errors += 1;
            group.skip(h);
        }
        s.source_batches_decoded += 1;
        s.shard_batches_encoded += outputs as u64;
        stats.set(s);
        if group.bytes >= GROUP_BYTES {
            group.write(&mut split);
        }
    }
    group.write(&mut split);
    split
}

/// Whether `h` is a batch of one of the `aborted` transactions.
fn is_aborted(h: &BatchHeader, aborted: &[AbortedTxn]) -> bool {
    h.is_transactional()
        && aborted.iter().any(|a| {
            a.producer_id == h.producer_id
                && a.first_offset <= h.base_offset
                && h.base_offset < a.last_offset
        })
}

/// Where a routed batch's records section is: shared (kept by the log, or the uncompressed source
/// itself), or decompressed into the group's scratch buffer (`start..end`).
enum Section {
    Shared(Bytes),
    Scratch(usize, usize),
}

thread_local! {
    /// The scratch buffer of this thread's last [`Group`], kept for the next (a buffer allocated
    /// afresh per split faulted its pages in again each time: the allocator hands freed large
    /// buffers back to the kernel).
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Largest scratch buffer kept for the next split (one that grew past it, for a huge batch, is
/// freed).
const SCRATCH_KEPT: usize = 4 << 20;

/// Source batches routed and not yet copied: each one's header, records section and routing (None:
/// it could not be decoded or split), their shard batches' size together, and the records of the
/// compressed ones decompressed here, back to back. `total` counts the shard batches of every
/// group of the split so far, this one's included.
struct Group {
    /// Shard batches per source batch: every shard's, or one.
    outputs: usize,
    batches: Vec<(BatchHeader, Section, Option<Routing>)>,
    bytes: usize,
    total: usize,
    scratch: Vec<u8>,
}

impl Group {
    fn new(outputs: usize) -> Self {
        Self {
            outputs,
            batches: Vec::new(),
            bytes: 0,
            total: 0,
            scratch: SCRATCH.with(Cell::take),
        }
    }

    fn records<'a>(&'a self, section: &'a Section) -> &'a [u8] {
        match section {
            Section::Shared(b) => b,
            Section::Scratch(a, z) => &self.scratch[*a..*z],
        }
    }

    /// Routes batch `h` (`source`; its records `decoded` when the log kept them) and adds it. On
    /// error nothing is added.
    fn route(
        &mut self,
        h: BatchHeader,
        source: &Bytes,
        decoded: Option<Bytes>,
        shards: u32,
        only: Option<u32>,
    ) -> Result<(), InvalidBatch> {
        let start = self.scratch.len();
        let section = match decoded {
            Some(records) => Section::Shared(records),
            None if h.compression() == 0 => {
                Section::Shared(source.slice_ref(&batch::records_section(&h, source)?))
            }
            None => {
                batch::decompress_records_into(&h, source, &mut self.scratch)?;
                Section::Scratch(start, self.scratch.len())
            }
        };
        let routed = Routing::route(&h, self.records(&section), shards, only, MAX_SPLIT_BYTES);
        let routing = match routed {
            Ok(r) => r,
            Err(e) => {
                self.scratch.truncate(start);
                return Err(e);
            }
        };
        let bytes = routing.bytes();
        self.add(h, section, Some(routing), bytes);
        Ok(())
    }

    /// Adds batch `h` as one that could not be decoded (an empty batch per output).
    fn skip(&mut self, h: BatchHeader) {
        let bytes = self.outputs * batch::HEADER_LEN;
        self.add(h, Section::Shared(Bytes::new()), None, bytes);
    }

    fn add(&mut self, h: BatchHeader, section: Section, routing: Option<Routing>, bytes: usize) {
        self.batches.push((h, section, routing));
        self.bytes += bytes;
        self.total += bytes;
    }

    /// Copies every shard batch of the group into one buffer, each output's back to back, appends
    /// the group's batches to `split`, and empties the group.
    fn write(&mut self, split: &mut Vec<SplitBatch>) {
        let outputs = self.outputs;
        if self.batches.is_empty() {
            return;
        }
        let mut all = Vec::with_capacity(self.bytes);
        let mut ranges: Vec<Vec<(u32, u32)>> = (0..self.batches.len())
            .map(|_| Vec::with_capacity(outputs))
            .collect();
        for i in 0..outputs {
            for ((h, section, routing), ranges) in self.batches.iter().zip(&mut ranges) {
                let start = all.len() as u32;
                match routing {
                    Some(routing) => routing.write(i, self.records(section), &mut all),
                    None => all.extend_from_slice(&empty_batch(h)),
                }
                ranges.push((start, all.len() as u32));
            }
        }
        let run = Bytes::from(all);
        split.extend(
            self.batches
                .drain(..)
                .zip(ranges)
                .map(|((h, _, routing), ranges)| SplitBatch {
                    base: h.base_offset,
                    last: h.last_offset(),
                    records: (0..outputs)
                        .map(|i| routing.as_ref().map_or(0, |r| r.count(i) as u32))
                        .collect(),
                    bytes: ranges.iter().map(|&(a, z)| (z - a) as usize).sum(),
                    run: run.clone(),
                    ranges,
                }),
        );
        self.bytes = 0;
        self.scratch.clear();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let mut scratch = std::mem::take(&mut self.scratch);
        if scratch.capacity() <= SCRATCH_KEPT {
            scratch.clear();
            SCRATCH.with(|s| s.set(scratch));
        }
    }
}

fn empty_batch(h: &BatchHeader) -> Vec<u8> {
    let mut b = vec![0u8; batch::HEADER_LEN];
    let header = BatchHeader {
        attributes: h.attributes & batch::ATTR_TIMESTAMP_TYPE,
        record_count: 0,
        ..*h
    };
    batch::write_header(&mut b, &header);
    b
}

/// Shard `shard`'s batches of `batches` from the one holding `offset`, within `max_bytes` (at least
/// one when `obligatory`). Batches back to back in one run go out as one part.
fn collect<'a>(
    batches: impl Iterator<Item = &'a SplitBatch>,
    shard: usize,
    offset: i64,
    max_bytes: usize,
    obligatory: bool,
) -> Records {
    let mut out = Records::empty();
    // The part being extended: its run and range.
    let mut part: Option<(&Bytes, u32, u32)> = None;
    for b in batches.skip_while(|b| b.last < offset) {
        let (start, end) = b.ranges[shard];
        let len = (end - start) as usize;
        if out.len + len > max_bytes && !(obligatory && out.is_empty()) {
            break;
        }
        if out.is_empty() {
            out.first_offset = b.base;
        }
        part = match part {
            Some((run, a, z)) if same_buffer(run, &b.run) && z == start => Some((run, a, end)),
            other => {
                if let Some((run, a, z)) = other {
                    out.parts.push(run.slice(a as usize..z as usize));
                }
                Some((&b.run, start, end))
            }
        };
        out.len += len;
        out.batches += 1;
        out.records += b.records[shard] as u64;
        out.last_offset = b.last;
    }
    if let Some((run, a, z)) = part {
        out.parts.push(run.slice(a as usize..z as usize));
    }
    out
}

/// Whether two runs are the same buffer (both are alive, so equal addresses are the same buffer).
fn same_buffer(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

/// The shared reader of one source partition for views with `shards` shards.
#[derive(Debug)]
pub struct ViewReader {
    log: Log,
    shards: u32,
    config: Rc<Cell<ViewConfig>>,
    stats: Rc<Cell<ViewStats>>,
    window: RefCell<VecDeque<SplitBatch>>,
    window_bytes: Cell<usize>,
    /// The next source offset the reader decodes; the monitor wakes consumers waiting for it. A
    /// restarted reader gets a new monitor (a monitor only moves forward).
    progress: RefCell<OffsetMonitor>,
    last_fetch: Cell<Instant>,
    running: Cell<bool>,
    /// A fetch is extending the window backwards; others behind it read for themselves meanwhile.
    filling: Cell<bool>,
    /// Catch-up reads in flight or just finished, shared by fetches asking for the same.
    catch_ups: RefCell<FastMap<CatchUpKey, Rc<CatchUp>>>,
}

/// What makes two catch-up reads the same. Every shard is split from the read, so consumers of
/// all shards share it (each shard batch covers its source batch's whole offset range: consumers
/// of different shards fetch the same offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CatchUpKey {
    /// The source offset the read starts at.
    offset: i64,
    /// How much source it reads at most.
    max_bytes: usize,
    /// The log's layout when it read ([`Log::layout`]): compaction rewrites what an offset range
    /// holds.
    layout: u64,
}

/// How long a finished catch-up read still serves fetches asking for the same: consumers that fell
/// behind together stay close, but not at the same instant.
pub const CATCH_UP_FRESH: Duration = Duration::from_millis(100);
/// Most catch-up reads kept (in flight ones are never dropped), and most shard batch bytes the
/// finished ones keep together.
const CATCH_UPS_KEPT: usize = 16;
const CATCH_UP_BYTES: usize = 16 << 20;

/// One catch-up read: its shard batches once there, and a monitor that moves to 1 when it is done
/// (or was given up: its fetch dropped it, and waiters then read for themselves).
#[derive(Debug)]
struct CatchUp {
    result: RefCell<Option<Result<Rc<Vec<SplitBatch>>>>>,
    done: OffsetMonitor,
    finished: Cell<Option<Instant>>,
}

impl CatchUp {
    /// Shard batch bytes it holds.
    fn bytes(&self) -> usize {
        match &*self.result.borrow() {
            Some(Ok(split)) => split.iter().map(|b| b.bytes).sum(),
            _ => 0,
        }
    }

    /// Whether a fetch may still take its result (or wait for it): in flight, or finished (with a
    /// result: one given up is forgotten) within [`CATCH_UP_FRESH`].
    fn usable(&self, now: Instant) -> bool {
        self.finished
            .get()
            .is_none_or(|at| now.duration_since(at) < CATCH_UP_FRESH)
    }
}

/// Finishes a catch-up read when dropped, read or not: wakes its waiters, and forgets it unless it
/// has a result to share.
struct CatchUpDone<'a> {
    map: &'a RefCell<FastMap<CatchUpKey, Rc<CatchUp>>>,
    key: CatchUpKey,
    slot: Rc<CatchUp>,
}

impl Drop for CatchUpDone<'_> {
    fn drop(&mut self) {
        if self.slot.result.borrow().is_some() {
            self.slot.finished.set(Some(Instant::now()));
        } else {
            let mut map = self.map.borrow_mut();
            if map
                .get(&self.key)
                .is_some_and(|c| Rc::ptr_eq(c, &self.slot))
            {
                map.remove(&self.key);
            }
        }
        self.slot.done.advance(1);
    }
}

impl ViewReader {
    fn new(
        log: Log,
        shards: u32,
        config: Rc<Cell<ViewConfig>>,
        stats: Rc<Cell<ViewStats>>,
    ) -> Rc<Self> {
        Rc::new(Self {
            log,
            shards,
            config,
            stats,
            window: RefCell::new(VecDeque::new()),
            window_bytes: Cell::new(0),
            progress: RefCell::new(OffsetMonitor::new(0)),
            last_fetch: Cell::new(Instant::now()),
            running: Cell::new(false),
            filling: Cell::new(false),
            catch_ups: RefCell::default(),
        })
    }

    pub fn is_running(&self) -> bool {
        self.running.get()
    }

    /// Where the reader is: the next source offset it will decode.
    pub fn position(&self) -> i64 {
        self.progress.borrow().value()
    }

    /// What a fetch waits on when it is ahead of the reader.
    pub fn progress_monitor(&self) -> OffsetMonitor {
        self.progress.borrow().clone()
    }

    /// Shard `shard`'s records from `offset`. Empty when the reader has not reached `offset` yet (the
    /// caller long-polls on [`Self::progress_monitor`]).
    pub async fn fetch(
        self: &Rc<Self>,
        shard: u32,
        offset: i64,
        max_bytes: usize,
        obligatory: bool,
    ) -> Result<LogRead> {
        assert!(shard < self.shards);
        self.last_fetch.set(Instant::now());
        let high_watermark = self.log.high_watermark();
        let log_start_offset = self.log.log_start_offset();
        if offset < log_start_offset || offset > high_watermark {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start_offset,
                high_watermark,
            });
        }
        let done = |records| LogRead {
            records,
            high_watermark,
            log_start_offset,
            from_cache: true,
            upstream_txns: None,
        };
        self.bump(|s| s.fetches_served += 1);
        let config = self.config.get();
        if config.shared && !self.running.get() {
            self.start(offset);
        }
        // Past the last stable offset nothing is published yet (at the high watermark, nothing is
        // there at all).
        if offset >= self.log.last_stable_offset().min(high_watermark) {
            return Ok(done(Records::empty()));
        }
        let position = self.position();
        let window_start = self.window.borrow().front().map_or(position, |b| b.base);
        let in_window = config.shared && offset >= window_start && offset < position;
        if config.shared && !in_window {
            if offset >= position && offset - position <= config.max_delta_for_fanout {
                return Ok(done(Records::empty())); // the reader is on its way
            }
            // Slightly behind: decode the gap once, answer from it, and put it in front of the
            // window for everyone behind there too. The reader's own position does not move.
            if offset < window_start
                && window_start - offset <= config.max_delta_for_fanout
                && !self.filling.get()
            {
                // Boxed, as the catch-up read below: log reads are large futures, and inline
                // every view fetch would carry (and copy) their state.
                let fill = Box::pin(self.fill_back(offset, window_start, max_bytes)).await?;
                if !fill.is_empty() {
                    let records =
                        collect(fill.iter(), shard as usize, offset, max_bytes, obligatory);
                    self.prepend(fill, window_start);
                    return Ok(done(records));
                }
                // No source batch before the window (compaction removed them): the window
                // answers, from its first batch on.
                let w = self.window.borrow();
                return Ok(done(collect(
                    w.iter(),
                    shard as usize,
                    offset,
                    max_bytes,
                    obligatory,
                )));
            }
        }
        if in_window {
            let w = self.window.borrow();
            let first = w.partition_point(|b| b.last < offset);
            return Ok(done(collect(
                w.range(first..),
                shard as usize,
                offset,
                max_bytes,
                obligatory,
            )));
        }
        // Behind the window, or far ahead of the reader: a read of its own, shared with the fetches
        // that ask for the same meanwhile. Unshared views (`shared` off): each fetch reads alone.
        if !config.shared {
            let split = Box::pin(self.read_split(offset, max_bytes, Some(shard))).await?;
            return Ok(done(collect(
                split.iter(),
                0,
                offset,
                max_bytes,
                obligatory,
            )));
        }
        Box::pin(self.catch_up_read(shard, offset, max_bytes, obligatory))
            .await
            .map(done)
    }

    /// A catch-up read of `max_bytes` of source from `offset`, split for every shard, shared with
    /// the fetches (of any shard) that ask for the same while it is in flight or within
    /// [`CATCH_UP_FRESH`] after; this fetch's records are shard `shard`'s. Consumers that fell behind
    /// the window together would otherwise each decode the same source batches.
    async fn catch_up_read(
        &self,
        shard: u32,
        offset: i64,
        max_bytes: usize,
        obligatory: bool,
    ) -> Result<Records> {
        let key = CatchUpKey {
            offset,
            max_bytes,
            layout: self.log.layout(),
        };
        let now = Instant::now();
        let take = |split: &[SplitBatch]| {
            collect(split.iter(), shard as usize, offset, max_bytes, obligatory)
        };
        let existing = self.catch_ups.borrow().get(&key).cloned();
        if let Some(c) = existing.filter(|c| c.usable(now)) {
            c.done.wait_for(1).await;
            if let Some(r) = &*c.result.borrow() {
                self.bump(|s| s.catch_up_reads_shared += 1);
                return r.as_ref().map(|split| take(split)).map_err(Clone::clone);
            }
            // Given up by the fetch that started it: read for this one.
        }
        let slot = Rc::new(CatchUp {
            result: RefCell::new(None),
            done: OffsetMonitor::new(0),
            finished: Cell::new(None),
        });
        {
            let mut map = self.catch_ups.borrow_mut();
            // Finished reads past their freshness go, then the oldest finished while too many.
            map.retain(|_, c| c.usable(now));
            let kept = |map: &FastMap<CatchUpKey, Rc<CatchUp>>| {
                map.values().map(|c| c.bytes()).sum::<usize>()
            };
            while map.len() >= CATCH_UPS_KEPT || kept(&map) > CATCH_UP_BYTES {
                let oldest = map
                    .iter()
                    .filter_map(|(k, c)| c.finished.get().map(|at| (at, *k)))
                    .min_by_key(|&(at, _)| at);
                let Some((_, k)) = oldest else { break };
                map.remove(&k);
            }
            map.insert(key, slot.clone());
        }
        let finish = CatchUpDone {
            map: &self.catch_ups,
            key,
            slot,
        };
        let read = self.read_split(offset, max_bytes, None).await.map(Rc::new);
        let records = read.as_ref().map(|split| take(split)).map_err(Clone::clone);
        *finish.slot.result.borrow_mut() = Some(read);
        drop(finish);
        records
    }

    /// A catch-up read: `max_bytes` of source from `offset`, split for every shard (`only` None) or
    /// for shard `only` alone (at index 0).
    async fn read_split(
        &self,
        offset: i64,
        max_bytes: usize,
        only: Option<u32>,
    ) -> Result<Vec<SplitBatch>> {
        self.bump(|s| s.catch_up_reads += 1);
        let (records, aborted) = self.committed_read(offset, max_bytes).await?;
        Ok(split_all(
            Some(&self.log),
            &records,
            &aborted,
            self.shards,
            only,
            i64::MAX,
            &self.stats,
        ))
    }

    /// The source's batches from `offset` that end below the last stable offset (about
    /// `max_bytes`, at least one if there is one), and the aborted transactions among them.
    async fn committed_read(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<(Records, Vec<AbortedTxn>)> {
        let stable = self.log.last_stable_offset();
        let records = self.log.read(offset, max_bytes, true).await?.records;
        let records = records.before(stable);
        let aborted = match records.next_offset() {
            Some(end) => self.log.aborted_transactions(records.first_offset, end),
            None => Vec::new(),
        };
        Ok((records, aborted))
    }

    /// Decodes source batches from `from` towards `until` (the window's first offset): all the way
    /// if the result can join the window, else only as far as `max_bytes` needs.
    async fn fill_back(&self, from: i64, until: i64, max_bytes: usize) -> Result<Vec<SplitBatch>> {
        self.filling.set(true);
        let config = self.config.get();
        let room = config.window_bytes.saturating_sub(self.window_bytes.get());
        let mut fill = Vec::new();
        let mut bytes = 0;
        let mut at = from;
        let result = async {
            while at < until && (bytes <= room || bytes < max_bytes) {
                let (records, aborted) = self.committed_read(at, config.read_bytes).await?;
                let split = split_all(
                    Some(&self.log),
                    &records,
                    &aborted,
                    self.shards,
                    None,
                    until,
                    &self.stats,
                );
                let Some(next) = split.last().map(|b| b.last + 1) else {
                    break;
                };
                for b in split {
                    bytes += b.bytes;
                    fill.push(b);
                }
                at = next;
            }
            Ok::<_, Error>(())
        }
        .await;
        self.filling.set(false);
        result.map(|()| fill)
    }

    /// Puts `fill` in front of the window if it reaches `until`, the window still starts there, and
    /// it fits the window's budget.
    fn prepend(&self, fill: Vec<SplitBatch>, until: i64) {
        let bytes: usize = fill.iter().map(|b| b.bytes).sum();
        let mut w = self.window.borrow_mut();
        let joins = fill.last().is_some_and(|b| b.last + 1 == until)
            && w.front().is_some_and(|b| b.base == until);
        if !joins || self.window_bytes.get() + bytes > self.config.get().window_bytes {
            return;
        }
        self.window_bytes.set(self.window_bytes.get() + bytes);
        for b in fill.into_iter().rev() {
            w.push_front(b);
        }
    }

    fn bump(&self, f: impl FnOnce(&mut ViewStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Starts the reader task at `from`.
    fn start(self: &Rc<Self>, from: i64) {
        self.running.set(true);
        self.log.view_reader_running(true);
        self.window.borrow_mut().clear();
        self.window_bytes.set(0);
        let old = self.progress.replace(OffsetMonitor::new(from));
        old.close();
        self.bump(|s| s.readers += 1);
        let this = self.clone();
        glommio::spawn_local(async move { this.run().await }).detach();
    }

    async fn run(self: Rc<Self>) {
        loop {
            let config = self.config.get();
            let idle = self.last_fetch.get().elapsed() >= config.idle_stop;
            if idle || !config.shared || self.log.is_closed() {
                break;
            }
            let progress = self.progress_monitor();
            let next = progress.value();
            if next >= self.log.last_stable_offset() {
                let more = self.log.last_stable_monitor().wait_for(next + 1);
                let idle = async {
                    glommio::timer::sleep(config.idle_stop.min(Duration::from_secs(1))).await;
                    false
                };
                futures_lite::future::or(more, idle).await;
                continue;
            }
            let (records, aborted) = match self.committed_read(next, config.read_bytes).await {
                Ok(r) => r,
                Err(Error::OffsetOutOfRange {
                    log_start_offset, ..
                }) if next < log_start_offset => {
                    // Retention moved the start past the reader: continue from there.
                    progress.advance(log_start_offset);
                    continue;
                }
                Err(e) => {
                    log::warn!("view reader of {}: {e}; stopping", self.log.dir().display());
                    break;
                }
            };
            let split = split_all(
                Some(&self.log),
                &records,
                &aborted,
                self.shards,
                None,
                i64::MAX,
                &self.stats,
            );
            // Where this split ended: the end of the read, or sooner when its shard batches grew
            // past [`RUN_BYTES`].
            let Some(end) = split.last().map(|b| b.last + 1) else {
                continue;
            };
            {
                let mut w = self.window.borrow_mut();
                for b in split {
                    self.window_bytes.set(self.window_bytes.get() + b.bytes);
                    w.push_back(b);
                }
                while self.window_bytes.get() > config.window_bytes && w.len() > 1 {
                    let old = w.pop_front().unwrap();
                    self.window_bytes.set(self.window_bytes.get() - old.bytes);
                }
            }
            progress.advance(end);
        }
        self.window.borrow_mut().clear();
        self.window_bytes.set(0);
        self.running.set(false);
        self.log.view_reader_running(false);
        self.bump(|s| s.readers -= 1);
    }
}

/// A core's view readers, by (source log id, shards).
#[derive(Debug, Default)]
pub struct ViewReaders {
    readers: RefCell<FastMap<(u64, u32), Rc<ViewReader>>>,
    config: Rc<Cell<ViewConfig>>,
    stats: Rc<Cell<ViewStats>>,
}

impl ViewReaders {
    pub fn new(config: ViewConfig) -> Self {
        Self {
            readers: RefCell::default(),
            config: Rc::new(Cell::new(config)),
            stats: Rc::default(),
        }
    }

    pub fn config(&self) -> ViewConfig {
        self.config.get()
    }
    pub fn set_config(&self, config: ViewConfig) {
        self.config.set(config);
    }
    pub fn stats(&self) -> ViewStats {
        self.stats.get()
    }

    /// Drops the readers of a log that is going away.
    pub fn forget(&self, log_id: u64) {
        self.readers.borrow_mut().retain(|(id, _), _| *id != log_id);
    }

    /// The reader of `log` for `shards` shards (created, not started, if none).
    pub fn reader(&self, log: &Log, shards: u32) -> Rc<ViewReader> {
        self.readers
            .borrow_mut()
            .entry((log.id(), shards))
            .or_insert_with(|| {
                ViewReader::new(log.clone(), shards, self.config.clone(), self.stats.clone())
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;

    /// `n` batches of 16 keyed records of `value` bytes, back to back, as a read.
    fn read_of(n: usize, value: usize) -> Records {
        let value = vec![b'v'; value];
        let mut all = Vec::new();
        for b in 0..n {
            let mut builder = BatchBuilder::new(0);
            for r in 0..16 {
                let key = format!("key-{b}-{r}");
                builder.push(0, Some(key.as_bytes()), Some(&value), &[]);
            }
            all.extend(builder.finish(b as i64 * 16));
        }
        Records::whole_batches(Bytes::from(all))
    }

    /// Batches back to back, split for every one of `shards` shards.
    fn split_bytes(batches: Vec<u8>, shards: u32, stats: &Cell<ViewStats>) -> Vec<SplitBatch> {
        let read = Records::whole_batches(Bytes::from(batches));
        split_all(None, &read, &[], shards, None, i64::MAX, stats)
    }

    /// The distinct buffers of `split`, in order, each with the bytes of the batches in it.
    fn runs(split: &[SplitBatch]) -> Vec<(Bytes, usize)> {
        let mut runs: Vec<(Bytes, usize)> = Vec::new();
        for b in split {
            match runs.last_mut() {
                Some((run, bytes)) if same_buffer(run, &b.run) => *bytes += b.bytes,
                _ => runs.push((b.run.clone(), b.bytes)),
            }
        }
        runs
    }

    #[test]
    fn small_batches_split_together_share_one_buffer_of_exactly_their_size() {
        // 100 batches of about 4 KiB: groups of about GROUP_BYTES.
        let read = read_of(100, 240);
        let stats = Cell::default();
        let split = split_all(None, &read, &[], 4, None, i64::MAX, &stats);
        assert_eq!(split.len(), 100);
        let runs = runs(&split);
        let groups = read.len.div_ceil(GROUP_BYTES);
        assert!(
            (groups..=groups + 1).contains(&runs.len()),
            "{} buffers for {} bytes",
            runs.len(),
            read.len
        );
        for (run, bytes) in &runs {
            assert_eq!(run.len(), *bytes, "a buffer of exactly its shard batches");
        }
        for b in &split {
            for &(start, end) in &b.ranges {
                assert!(start <= end && end as usize <= b.run.len());
            }
        }
        for shard in 0..4 {
            let got = collect(split.iter(), shard, 0, usize::MAX, true);
            assert_eq!(got.batches, 100);
            assert_eq!(got.parts.len(), runs.len(), "one part per buffer");
            let counted: u64 = got.batch_headers().map(|h| h.record_count as u64).sum();
            assert_eq!(counted, got.records);
        }
    }

    #[test]
    fn a_damaged_compressed_batch_between_good_ones_spoils_only_itself() {
        let stats = Cell::default();
        let batch = |b: i64| {
            let mut builder = BatchBuilder::new(0);
            for r in 0..16 {
                let key = format!("key-{b}-{r}");
                builder.push(0, Some(key.as_bytes()), Some(b"some value"), &[]);
            }
            batch::compress_batch(&builder.finish(b * 16), 3)
        };
        let (first, mut middle, last) = (batch(0), batch(1), batch(2));
        // Damaged after the header: its CRC no longer matters here, its lz4 frame fails.
        let at = batch::HEADER_LEN + 8;
        middle[at..at + 8].fill(0xff);
        let read = Records::whole_batches(Bytes::from([first, middle, last.clone()].concat()));
        let split = split_all(None, &read, &[], 4, None, i64::MAX, &stats);
        assert_eq!(split.len(), 3);
        assert_eq!(stats.get().decode_errors, 1);
        assert_eq!(
            split[1].records, [0; 4],
            "empty batches over the damaged one"
        );
        let alone = split_bytes(last, 4, &stats);
        for shard in 0..4 {
            let of = |b: &SplitBatch| {
                let (a, z) = b.ranges[shard];
                b.run.slice(a as usize..z as usize)
            };
            assert_eq!(
                of(&split[2]),
                of(&alone[0]),
                "shard {shard}: the batch after it"
            );
        }
        let records: u32 = split.iter().flat_map(|b| b.records.iter()).sum();
        assert_eq!(records, 32, "every record of the good batches in one shard");
    }

    #[test]
    fn a_split_stops_past_its_size_and_leaves_the_rest() {
        // 40 batches of about 1 MiB.
        let read = read_of(40, 64 << 10);
        assert_eq!(read.batches, 40);
        let stats = Cell::default();
        let split = split_all(None, &read, &[], 2, None, i64::MAX, &stats);
        // 40 MiB over 2 shards: the split stops once its shard batches pass 16 MiB together.
        assert!((16..=17).contains(&split.len()), "{} batches", split.len());
        for (run, bytes) in runs(&split) {
            assert_eq!(run.len(), bytes, "a buffer of exactly its shard batches");
        }
        let mut records = 0;
        for shard in 0..2 {
            let got = collect(split.iter(), shard, 0, usize::MAX, true);
            assert_eq!(got.batches as usize, split.len());
            let counted: u64 = got.batch_headers().map(|h| h.record_count as u64).sum();
            assert_eq!(counted, got.records);
            records += got.records;
        }
        assert_eq!(
            records,
            split.len() as u64 * 16,
            "every keyed record in one shard"
        );
        // The rest is split from where it stopped, a split at a time.
        let mut at = split.last().unwrap().last + 1;
        let mut batches = split.len();
        while batches < 40 {
            let rest: Vec<u8> = read
                .batches()
                .filter(|(h, _)| h.base_offset >= at)
                .flat_map(|(_, b)| b.to_vec())
                .collect();
            let rest = split_bytes(rest, 2, &stats);
            assert_eq!(rest.first().unwrap().base, at);
            at = rest.last().unwrap().last + 1;
            batches += rest.len();
        }
        assert_eq!((batches, at), (40, 40 * 16));
    }
}
