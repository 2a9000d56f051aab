//! One partition's log: segments on disk, offsets, durability (group commit), the tail cache, recovery
//! at open, retention and deletion.
//!
//! What each durability mode can lose on a crash:
//! - a **durable** append (Kafka `acks=all`) is acknowledged only after an fsync that covers it: a crash of
//!   the process or the machine loses nothing acknowledged;
//! - a **non-durable** append (`acks=1`, `acks=0`) is acknowledged once written to the page cache: a crash
//!   of the process loses nothing (the kernel still has it), a crash of the machine (power, kernel) loses
//!   what was appended since the last fsync, at most about `flush_interval` of data (never a partial
//!   batch: recovery cuts the log at the first torn batch).
//!
//! Appends to one log are serialized by an async permit (never a thread lock): offsets are assigned,
//! the bytes written and the high watermark advanced in order. Fsyncs run outside it, in a detached
//! task, so every durable append that arrives while one fsync runs shares the next one.

use crate::batch::{self, BatchHeader};
use crate::config::LogConfig;
use crate::error::{Error, InvalidBatch, Result};
use crate::index::{SegmentMeta, SparseIndex};
use crate::monitor::OffsetMonitor;
use crate::records::{LogRead, Records};
use crate::segment::{index_file_name, now_ms, Segment, MAX_RELATIVE_OFFSET};
use crate::storage_health::StorageEpisode;
use crate::tail_cache::{LogId, TailCache};
use bytes::Bytes;
use glommio::sync::Semaphore;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How an append wants to be acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// Return only after the batches are fsynced (shared with concurrent durable appends).
    pub durable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendResult {
    pub base_offset: i64,
    pub last_offset: i64,
    pub high_watermark: i64,
    /// The time stamped into the batches for LogAppendTime logs, else `-1`.
    pub log_append_time: i64,
    pub log_start_offset: i64,
}

/// Counters of one log, as a plain snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub appended_batches: u64,
    pub appended_bytes: u64,
    /// Writes to disk; fewer than appends when concurrent appends were written together.
    pub append_writes: u64,
    pub fsyncs: u64,
    pub cache_reads: u64,
    pub disk_reads: u64,
    pub disk_read_bytes: u64,
    pub segments: usize,
    pub size_bytes: u64,
    /// Storage operations that failed (writes, fsyncs, segment rolls, index writes).
    pub storage_errors: u64,
}

/// A partition log. Cheap to clone (`Rc`); all clones are the same log. `!Send`: it lives on one core.
#[derive(Debug, Clone)]
pub struct Log {
    inner: Rc<Inner>,
}

#[derive(Debug)]
struct Inner {
    id: u64,
    dir: PathBuf,
    config: RefCell<LogConfig>,
    cache: Rc<TailCache>,
    cache_id: LogId,
    /// Oldest first; the last one is the active segment. Never empty while open.
    segments: RefCell<Vec<Rc<Segment>>>,
    /// The next offset to assign: everything below is written and readable.
    high_watermark: OffsetMonitor,
    /// Everything below is fsynced. Closed when the log fails or closes.
    durable: OffsetMonitor,
    /// Held by whoever changes the segment list or writes: the writer task, retention, close.
    append_permit: Semaphore,
    /// Validated appends waiting for the writer task, in arrival order.
    queue: RefCell<VecDeque<PendingAppend>>,
    writing: Cell<bool>,
    syncing: Cell<bool>,
    /// The highest offset someone asked to be durable (a durable append, a flush tick, close).
    sync_target: Cell<i64>,
    /// Set when an fsync failed: the page cache may have dropped data, so appends stop until restart.
    failure: RefCell<Option<String>>,
    /// Storage failures, logged once per episode and counted.
    storage: StorageEpisode,
    closed: Cell<bool>,
    stats: Cell<LogStats>,
}

/// Most bytes written by one write of grouped appends.
const MAX_GROUP_BYTES: u64 = 8 << 20;

/// An append waiting for the writer task.
#[derive(Debug)]
struct PendingAppend {
    blob: Bytes,
    headers: Vec<BatchHeader>,
    /// Offsets the batches take (the sum of their `lastOffsetDelta + 1`).
    offsets: i64,
    done: Rc<Slot<Result<AppendResult>>>,
}

/// Answers every append of `group` with `e` (the same error, not a re-worded one).
fn fail_all(group: Vec<PendingAppend>, e: &Error) {
    group.into_iter().for_each(|p| p.done.set(Err(e.clone())));
}

/// A one-shot result the writer task fills in and the appender awaits.
#[derive(Debug)]
struct Slot<T> {
    value: RefCell<Option<T>>,
    waker: RefCell<Option<Waker>>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self {
            value: RefCell::new(None),
            waker: RefCell::new(None),
        }
    }
}

impl<T> Slot<T> {
    fn set(&self, value: T) {
        *self.value.borrow_mut() = Some(value);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

struct SlotWait<T>(Rc<Slot<T>>);

impl<T> Future for SlotWait<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.0.value.borrow_mut().take() {
            Some(v) => Poll::Ready(v),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A segment file found at open.
#[derive(Debug)]
struct Found {
    base_offset: i64,
    path: PathBuf,
    len: u64,
    mtime_ms: i64,
    index: Option<(SparseIndex, SegmentMeta)>,
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering it: sealed segments with an intact index are
    /// trusted, the last one and any other without are scanned and cut at the first bad batch.
    pub async fn open(
        dir: impl Into<PathBuf>,
        config: LogConfig,
        cache: Rc<TailCache>,
    ) -> Result<Log> {
        // glommio opens files and directories relative to no directory at all (a relative path
        // fails with EBADF), so the log works on an absolute path whatever its caller passes.
        let dir = dir.into();
        let dir = std::path::absolute(&dir).map_err(|e| Error::storage(&dir, e))?;
        let config = config.sanitized();
        let listing = {
            let dir = dir.clone();
            glommio::executor()
                .spawn_blocking(move || list_segments(&dir))
                .await
        }
        .map_err(|e| Error::storage(&dir, e))?;
        let segments = recover(&dir, &config, listing).await?;
        let next = segments
            .last()
            .expect("recover leaves a segment")
            .next_offset
            .get();
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let inner = Rc::new(Inner {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cache_id: cache.register(),
            cache,
            dir,
            config: RefCell::new(config),
            segments: RefCell::new(segments),
            high_watermark: OffsetMonitor::new(next),
            durable: OffsetMonitor::new(next),
            append_permit: Semaphore::new(1),
            queue: RefCell::new(VecDeque::new()),
            writing: Cell::new(false),
            syncing: Cell::new(false),
            sync_target: Cell::new(next),
            failure: RefCell::new(None),
            storage: StorageEpisode::default(),
            closed: Cell::new(false),
            stats: Cell::new(LogStats::default()),
        });
        spawn_background(Rc::downgrade(&inner));
        Ok(Log { inner })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
    /// Identifies this open log among all logs ever opened by the process (a re-created topic's
    /// partition gets a new id), for keys of per-core caches such as the fetch coalescer.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    pub fn high_watermark(&self) -> i64 {
        self.inner.high_watermark.value()
    }
    /// Closed or deleted: nothing more will be appended or read.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.get()
    }
    /// The watermark long-polling fetches wait on.
    pub fn high_watermark_monitor(&self) -> &OffsetMonitor {
        &self.inner.high_watermark
    }
    pub fn log_start_offset(&self) -> i64 {
        self.inner.log_start_offset()
    }
    /// Offsets below this are fsynced.
    pub fn durable_offset(&self) -> i64 {
        self.inner.durable.value()
    }
    /// Largest batch this log accepts.
    pub fn max_batch_bytes(&self) -> usize {
        self.inner.config.borrow().max_batch_bytes
    }
    pub fn config(&self) -> LogConfig {
        self.inner.config.borrow().clone()
    }
    /// Changes settings (topic config updates); they apply from the next append or check.
    pub fn set_config(&self, config: LogConfig) {
        *self.inner.config.borrow_mut() = config.sanitized();
    }
    pub fn stats(&self) -> LogStats {
        let segs = self.inner.segments.borrow();
        LogStats {
            segments: segs.len(),
            size_bytes: segs.iter().map(|s| s.size.get()).sum(),
            storage_errors: self.inner.storage.errors(),
            ..self.inner.stats.get()
        }
    }
    /// The storage failure this log is in the middle of, as first logged: `None` once an append
    /// succeeded after it (a failed fsync lasts until restart).
    pub fn storage_failure(&self) -> Option<String> {
        self.inner.storage.current()
    }
    /// Base offsets of the segments, oldest first.
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.inner
            .segments
            .borrow()
            .iter()
            .map(|s| s.base_offset)
            .collect()
    }

    /// Validates and appends one or more batches (a Produce request's records for this partition).
    /// All or nothing: a refused batch appends nothing. The append is queued to the log's writer task
    /// and runs to completion even if the caller stops waiting, so a disconnecting producer cannot leave
    /// a half-done append behind. Appends queued while a write or fsync is in progress are written
    /// together (one write, then one fsync for all of them: group commit).
    pub async fn append(&self, blob: Bytes, opts: AppendOptions) -> Result<AppendResult> {
        let headers = batch::validate_all(&blob, self.inner.config.borrow().max_batch_bytes)?;
        self.append_validated(blob, headers, opts).await
    }

    /// Appends batches already checked with [`batch::validate_all`] (`headers` are its result). The
    /// append is queued when this is called, not when the future is first polled, so appends issued
    /// one after another are written in that order even if their futures are awaited together.
    pub fn append_validated(
        &self,
        blob: Bytes,
        headers: Vec<BatchHeader>,
        opts: AppendOptions,
    ) -> impl Future<Output = Result<AppendResult>> + 'static {
        let inner = self.inner.clone();
        let offsets: i64 = headers.iter().map(BatchHeader::offset_count).sum();
        let queued = inner.check_writable().and_then(|()| {
            // One append goes into one segment, so it may not span more offsets than a segment holds.
            if offsets - 1 > MAX_RELATIVE_OFFSET {
                return Err(Error::InvalidBatch(InvalidBatch::TooManyOffsets {
                    offsets,
                    limit: MAX_RELATIVE_OFFSET + 1,
                }));
            }
            let done = Rc::new(Slot::default());
            inner.queue.borrow_mut().push_back(PendingAppend {
                blob,
                headers,
                offsets,
                done: done.clone(),
            });
            inner.start_writer();
            Ok(done)
        });
        async move {
            let res = SlotWait(queued?).await?;
            if opts.durable {
                inner.sync_to(res.high_watermark).await?;
            }
            Ok(res)
        }
    }

    /// Whole batches from the one holding `offset`: at most `max_bytes`, or at least one batch when
    /// `obligatory` (KIP-74: the first partition of a fetch must make progress). Empty at the high
    /// watermark; `OffsetOutOfRange` below the log start or above the high watermark.
    pub async fn read(&self, offset: i64, max_bytes: usize, obligatory: bool) -> Result<LogRead> {
        let inner = &self.inner;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        let high_watermark = inner.high_watermark.value();
        let log_start_offset = self.log_start_offset();
        if offset < log_start_offset || offset > high_watermark {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start_offset,
                high_watermark,
            });
        }
        let done = |records, from_cache| LogRead {
            records,
            high_watermark,
            log_start_offset,
            from_cache,
        };
        if offset == high_watermark {
            return Ok(done(Records::empty(), true));
        }
        if let Some(records) = inner
            .cache
            .read(inner.cache_id, offset, max_bytes, obligatory)
        {
            inner.bump(|s| s.cache_reads += 1);
            return Ok(done(records, true));
        }
        let segments: Vec<Rc<Segment>> = {
            let segs = inner.segments.borrow();
            let first = segs
                .partition_point(|s| s.base_offset <= offset)
                .saturating_sub(1);
            segs[first..].to_vec()
        };
        let mut out = Records::empty();
        let mut at = offset;
        for seg in segments {
            if at >= high_watermark {
                break;
            }
            let budget = max_bytes.saturating_sub(out.len);
            let part = seg.read(at, budget, obligatory && out.is_empty()).await?;
            inner.bump(|s| {
                s.disk_reads += 1;
                s.disk_read_bytes += part.len as u64;
            });
            let reached_end = part.next_offset() == Some(seg.next_offset.get());
            if let Some(next) = part.next_offset() {
                at = next;
            }
            let empty = part.is_empty();
            out.extend(part);
            if !(reached_end || empty && at >= seg.next_offset.get()) {
                break;
            }
        }
        Ok(done(out, false))
    }

    /// The largest record timestamp in the log, if any record carries one.
    pub fn max_timestamp(&self) -> Option<i64> {
        self.inner
            .segments
            .borrow()
            .iter()
            .map(|s| s.max_timestamp.get())
            .max()
            .filter(|&t| t >= 0)
    }

    /// The first offset whose record timestamp is at least `timestamp`, with that record's timestamp
    /// (Kafka ListOffsets by time). `None` if every record is older. Segments are skipped by their
    /// largest timestamp; within one, batches by theirs; within an uncompressed batch, records.
    pub async fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(i64, i64)>> {
        let start = {
            let segs = self.inner.segments.borrow();
            match segs.iter().find(|s| s.max_timestamp.get() >= timestamp) {
                Some(s) => s.base_offset,
                None => return Ok(None),
            }
        };
        let mut at = start;
        while at < self.high_watermark() {
            let read = self.read(at, 1 << 20, true).await?;
            for (h, bytes) in read.records.batches() {
                if h.max_timestamp < timestamp {
                    continue;
                }
                if h.compression() == 0 && !h.is_log_append_time() {
                    if let Ok(records) = batch::records(&bytes) {
                        if let Some(r) = records.iter().find(|r| r.timestamp >= timestamp) {
                            return Ok(Some((r.offset, r.timestamp)));
                        }
                    }
                }
                return Ok(Some((h.base_offset, h.max_timestamp)));
            }
            match read.records.next_offset() {
                Some(next) => at = next,
                None => break,
            }
        }
        Ok(None)
    }

    /// Deletes whole old segments beyond the retention limits (never the active one) and returns how many.
    pub async fn enforce_retention(&self) -> Result<usize> {
        let inner = &self.inner;
        let _permit = inner
            .append_permit
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        let (max_bytes, max_age) = {
            let c = inner.config.borrow();
            (c.retention_bytes, c.retention_age)
        };
        let cutoff = max_age.map(|a| now_ms() - a.as_millis() as i64);
        let doomed: Vec<Rc<Segment>> = {
            let mut segs = inner.segments.borrow_mut();
            let mut total: u64 = segs.iter().map(|s| s.size.get()).sum();
            let mut n = 0;
            for s in &segs[..segs.len() - 1] {
                let over_size = max_bytes.is_some_and(|m| total - s.size.get() >= m);
                let too_old = cutoff.is_some_and(|c| s.retention_timestamp() < c);
                if !(over_size || too_old) {
                    break;
                }
                total -= s.size.get();
                n += 1;
            }
            segs.drain(..n).collect()
        };
        for seg in &doomed {
            log::info!(
                "retention: deleting {} (offsets {}..{}, {} bytes)",
                seg.path.display(),
                seg.base_offset,
                seg.next_offset.get(),
                seg.size.get()
            );
            remove_segment_files(seg).await;
        }
        Ok(doomed.len())
    }

    /// Flushes, marks every sealed segment clean and closes the files. Appends still waiting fail with
    /// `Closed`; durable appends already written are synced first.
    pub async fn close(self) -> Result<()> {
        let inner = self.inner;
        let permit = inner
            .append_permit
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)?;
        inner.closed.set(true);
        drop(permit);
        inner.append_permit.close();
        let result = if inner.failure.borrow().is_none() {
            inner.sync_to(inner.high_watermark.value()).await
        } else {
            Ok(())
        };
        let segments = std::mem::take(&mut *inner.segments.borrow_mut());
        let last = segments.len().saturating_sub(1);
        for (i, seg) in segments.into_iter().enumerate() {
            if i < last && !seg.sealed.get() {
                if let Err(e) = write_index(&seg).await {
                    log::warn!("{e}; the segment will be scanned at start-up");
                }
            }
            if let Ok(seg) = Rc::try_unwrap(seg) {
                let _ = seg.file.close().await;
            }
        }
        inner.cache.forget(inner.cache_id);
        inner.high_watermark.close();
        inner.durable.close();
        result
    }

    /// Deletes the whole partition: its files and its directory.
    pub async fn delete(self) -> Result<()> {
        let dir = self.inner.dir.clone();
        let _ = self.close().await;
        glommio::executor()
            .spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::storage(&dir, e)),
                _ => Ok(()),
            })
            .await
    }
}

impl Inner {
    /// The first segment's base offset; a closed log (no segments) reports its end.
    fn log_start_offset(&self) -> i64 {
        self.segments
            .borrow()
            .first()
            .map_or(self.high_watermark.value(), |s| s.base_offset)
    }

    fn active(&self) -> Rc<Segment> {
        self.segments
            .borrow()
            .last()
            .expect("an open log has a segment")
            .clone()
    }

    fn bump(&self, f: impl FnOnce(&mut LogStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    fn check_writable(&self) -> Result<()> {
        if self.closed.get() {
            return Err(Error::Closed);
        }
        match &*self.failure.borrow() {
            Some(why) => Err(Error::storage(&self.dir, why)),
            None => Ok(()),
        }
    }

    /// Starts the writer task unless it runs: it drains the append queue in groups, in order.
    fn start_writer(self: &Rc<Self>) {
        if self.writing.replace(true) {
            return;
        }
        let inner = self.clone();
        glommio::spawn_local(async move {
            // The permit is taken per group, so retention and close get their turn under load.
            while !inner.queue.borrow().is_empty() {
                let Ok(permit) = inner.append_permit.acquire_permit(1).await else {
                    let closed: Vec<_> = inner.queue.borrow_mut().drain(..).collect();
                    closed
                        .into_iter()
                        .for_each(|p| p.done.set(Err(Error::Closed)));
                    break;
                };
                let group = inner.next_group().await;
                if group.is_empty() {
                    break;
                }
                inner.write_group(group).await;
                drop(permit);
                // Let a waiting retention or close take the permit before the next group.
                futures_lite::future::yield_now().await;
            }
            inner.writing.set(false);
        })
        .detach();
    }

    /// Takes the next appends to write together: as many as fit in the active segment (rolling it
    /// first if the oldest does not) and in `MAX_GROUP_BYTES`.
    async fn next_group(&self) -> Vec<PendingAppend> {
        let stamp = self.config.borrow().log_append_time;
        let Some((first_len, first_ts, first_offsets)) = self.queue.borrow().front().map(|p| {
            let ts = if stamp {
                now_ms()
            } else {
                p.headers
                    .iter()
                    .map(|h| h.max_timestamp)
                    .max()
                    .unwrap_or(-1)
            };
            (p.blob.len() as u64, ts, p.offsets)
        }) else {
            return Vec::new();
        };
        if let Err(e) = self
            .roll_if_needed(first_len, first_ts, first_offsets)
            .await
        {
            let failed: Vec<_> = self.queue.borrow_mut().drain(..).collect();
            fail_all(failed, &e);
            return Vec::new();
        }
        let active = self.active();
        let segment_bytes = self.config.borrow().segment_bytes;
        let room = segment_bytes
            .saturating_sub(active.size.get())
            .min(MAX_GROUP_BYTES)
            .max(first_len);
        let mut queue = self.queue.borrow_mut();
        let mut total = 0;
        let mut next_offset = self.high_watermark.value();
        let mut group = Vec::new();
        while let Some(p) = queue.front() {
            let len = p.blob.len() as u64;
            let fits_offsets = active.can_hold(next_offset + p.offsets - 1);
            if !group.is_empty() && (total + len > room || !fits_offsets) {
                break;
            }
            total += len;
            next_offset += p.offsets;
            group.push(queue.pop_front().unwrap());
        }
        group
    }

    /// Rolls the active segment unless the next append (`next_len` bytes, `next_offsets` offsets,
    /// newest timestamp `next_ts`) fits it: by size, by age, and by relative offsets.
    async fn roll_if_needed(&self, next_len: u64, next_ts: i64, next_offsets: i64) -> Result<()> {
        self.check_writable()?;
        let (segment_bytes, segment_age) = {
            let c = self.config.borrow();
            (c.segment_bytes, c.segment_age)
        };
        let active = self.active();
        let full = active.size.get() + next_len > segment_bytes
            || !active.can_hold(self.high_watermark.value() + next_offsets - 1);
        let old = segment_age.is_some_and(|age| active.is_older_than(age, next_ts));
        if active.size.get() > 0 && (full || old) {
            self.roll().await?;
        }
        Ok(())
    }

    /// Assigns offsets to a group of appends, writes them with one write and completes each.
    async fn write_group(&self, mut group: Vec<PendingAppend>) {
        if let Err(e) = self.check_writable() {
            fail_all(group, &e);
            return;
        }
        let stamp = self.config.borrow().log_append_time;
        let now = now_ms();
        let base = self.high_watermark.value();
        let mut data = Vec::with_capacity(group.iter().map(|p| p.blob.len()).sum());
        let mut next = base;
        for p in &mut group {
            let mut at = data.len();
            data.extend_from_slice(&p.blob);
            for h in p.headers.iter_mut() {
                batch::set_base_offset(&mut data[at..], next);
                if stamp {
                    batch::stamp_log_append_time(&mut data[at..], now);
                    h.max_timestamp = now;
                }
                h.base_offset = next;
                next += h.offset_count();
                at += h.total_len();
            }
        }
        let headers: Vec<BatchHeader> = group
            .iter()
            .flat_map(|p| p.headers.iter().copied())
            .collect();
        if let Err(e) = self.active().append(data, &headers).await {
            let e = self.storage.failed(&self.dir, e, false);
            fail_all(group, &e);
            return;
        }
        self.storage.succeeded(&self.dir);
        let log_start_offset = self.log_start_offset();
        // Nothing awaits from here on: readers see the new watermark and the cached batches together.
        self.high_watermark.advance(next);
        let mut batches = 0;
        let mut bytes = 0;
        for p in group {
            let mut at = 0;
            for h in &p.headers {
                let len = h.total_len();
                let fix = |b: &mut [u8]| {
                    batch::set_base_offset(b, h.base_offset);
                    if stamp {
                        batch::stamp_log_append_time(b, now);
                    }
                };
                let (first, last) = (h.base_offset, h.last_offset());
                self.cache.insert(
                    self.cache_id,
                    &p.blob[at..at + len],
                    fix,
                    first,
                    last,
                    h.record_count as u64,
                );
                at += len;
            }
            batches += p.headers.len() as u64;
            bytes += p.blob.len() as u64;
            let first = p.headers[0].base_offset;
            let end = p.headers.last().unwrap().last_offset() + 1;
            p.done.set(Ok(AppendResult {
                base_offset: first,
                last_offset: end - 1,
                high_watermark: next,
                log_append_time: if stamp { now } else { -1 },
                log_start_offset,
            }));
        }
        self.bump(|s| {
            s.appended_batches += batches;
            s.appended_bytes += bytes;
            s.append_writes += 1;
        });
    }

    /// Seals the active segment (fsync, index file) and starts a new one at the high watermark.
    async fn roll(&self) -> Result<()> {
        let old = self.active();
        if let Err(e) = old.file.fdatasync().await {
            return Err(self.fail(&old.path, e));
        }
        self.bump(|s| s.fsyncs += 1);
        self.durable.advance(old.next_offset.get());
        if let Err(e) = write_index(&old).await {
            self.storage.failed(&self.dir, e, false);
        }
        let interval = self.config.borrow().index_interval_bytes;
        let failed = |e| self.storage.failed(&self.dir, e, false);
        let new = Segment::create(&self.dir, old.next_offset.get(), interval)
            .await
            .map_err(failed)?;
        sync_dir(&self.dir).await.map_err(failed)?;
        log::debug!(
            "rolled {} at offset {}",
            self.dir.display(),
            new.base_offset
        );
        self.segments.borrow_mut().push(Rc::new(new));
        Ok(())
    }

    fn fail(&self, path: &Path, err: impl std::fmt::Display) -> Error {
        let why = format!(
            "fsync of {} failed: {err}; appends are refused until restart",
            path.display()
        );
        *self.failure.borrow_mut() = Some(why.clone());
        self.durable.close();
        self.storage
            .failed(&self.dir, Error::storage(path, why), true)
    }

    /// Waits until everything below `target` is fsynced, starting a group-commit fsync if none runs.
    async fn sync_to(self: &Rc<Self>, target: i64) -> Result<()> {
        self.request_sync(target);
        if self.durable.wait_for(target).await {
            return Ok(());
        }
        match &*self.failure.borrow() {
            Some(why) => Err(Error::storage(&self.dir, why)),
            None => Err(Error::Closed),
        }
    }

    /// Asks for everything below `target` to be fsynced, starting the group-commit task unless it
    /// runs. Each fsync covers all that is written when it starts, so appends that arrive during one
    /// fsync share the next; the task stops once the highest target asked for is durable, so steady
    /// non-durable traffic does not keep it fsyncing.
    fn request_sync(self: &Rc<Self>, target: i64) {
        self.sync_target.set(self.sync_target.get().max(target));
        if self.syncing.replace(true) {
            return;
        }
        let inner = self.clone();
        glommio::spawn_local(async move {
            while inner.failure.borrow().is_none()
                && inner.durable.value() < inner.sync_target.get()
            {
                let written = inner.high_watermark.value();
                let seg = inner.active();
                match seg.file.fdatasync().await {
                    Ok(()) => {
                        inner.bump(|s| s.fsyncs += 1);
                        inner.durable.advance(written);
                    }
                    Err(e) => {
                        inner.fail(&seg.path, e);
                    }
                }
            }
            inner.syncing.set(false);
        })
        .detach();
    }
}

/// Flushes on `flush_interval` and checks retention on `retention_check_interval`, until the log closes.
fn spawn_background(weak: Weak<Inner>) {
    glommio::spawn_local(async move {
        let start = Instant::now();
        let mut last_flush = start;
        let mut last_retention = start;
        loop {
            let tick = {
                let Some(inner) = weak.upgrade() else { return };
                let c = inner.config.borrow();
                c.flush_interval
                    .unwrap_or(c.retention_check_interval)
                    .min(c.retention_check_interval)
            };
            glommio::timer::sleep(tick.max(Duration::from_millis(1))).await;
            let Some(inner) = weak.upgrade() else { return };
            if inner.closed.get() {
                return;
            }
            let (flush, retention) = {
                let c = inner.config.borrow();
                (c.flush_interval, c.retention_check_interval)
            };
            if flush.is_some_and(|f| last_flush.elapsed() >= f) {
                last_flush = Instant::now();
                inner.request_sync(inner.high_watermark.value());
            }
            if last_retention.elapsed() >= retention {
                last_retention = Instant::now();
                if let Err(e) = (Log { inner }).enforce_retention().await {
                    log::warn!("retention check failed: {e}");
                }
            }
        }
    })
    .detach();
}

/// Saves a sealed segment's index, which also marks it clean. A failure only costs a scan at start-up.
async fn write_index(seg: &Segment) -> Result<()> {
    let path = seg.index_path();
    let bytes = seg.index.borrow().encode(&seg.meta());
    let res = async {
        let f = glommio::io::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .buffered_open(&path)
            .await?;
        let len = bytes.len();
        let n = f.write_at(bytes, 0).await?;
        if n != len {
            return Err(glommio::GlommioError::IoError(std::io::Error::other(
                "short write",
            )));
        }
        f.fdatasync().await?;
        f.close().await
    }
    .await;
    res.map_err(|e| Error::storage(&path, e))?;
    seg.sealed.set(true);
    Ok(())
}

async fn sync_dir(dir: &Path) -> Result<()> {
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| Error::storage(dir, e))?;
    d.sync().await.map_err(|e| Error::storage(dir, e))?;
    let _ = d.close().await;
    Ok(())
}

async fn remove_segment_files(seg: &Segment) {
    for path in [seg.path.clone(), seg.index_path()] {
        if let Err(e) = glommio::io::remove(&path).await {
            if !matches!(&e, glommio::GlommioError::IoError(io) if io.kind() == std::io::ErrorKind::NotFound)
            {
                log::warn!("could not remove {}: {e}", path.display());
            }
        }
    }
}

/// Lists `<base:020>.log` files, oldest first, with their index files if intact (blocking; run off the
/// executor thread).
fn list_segments(dir: &Path) -> std::io::Result<Vec<Found>> {
    std::fs::create_dir_all(dir)?;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".log") else {
            continue;
        };
        let Ok(base_offset) = stem.parse::<i64>() else {
            continue;
        };
        if stem.len() != 20 || base_offset < 0 {
            continue;
        }
        let md = entry.metadata()?;
        let mtime_ms = md
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or_else(now_ms, |d| d.as_millis() as i64);
        let index = std::fs::read(dir.join(index_file_name(base_offset)))
            .ok()
            .and_then(|b| SparseIndex::decode(&b));
        found.push(Found {
            base_offset,
            path: entry.path(),
            len: md.len(),
            mtime_ms,
            index,
        });
    }
    found.sort_by_key(|f| f.base_offset);
    Ok(found)
}

/// Opens the segments found, scanning the ones not known clean, and cuts the log at the first damage.
/// Whatever lies after the damage is renamed aside (`.corrupt`), never deleted.
async fn recover(dir: &Path, config: &LogConfig, found: Vec<Found>) -> Result<Vec<Rc<Segment>>> {
    let interval = config.index_interval_bytes;
    let first_base = found.first().map_or(0, |f| f.base_offset);
    let mut segments: Vec<Rc<Segment>> = Vec::new();
    let n = found.len();
    let mut rest = found.into_iter().enumerate();
    while let Some((i, mut f)) = rest.next() {
        let is_last = i + 1 == n;
        let expected = segments.last().map(|s| s.next_offset.get());
        if expected.is_some_and(|e| e != f.base_offset) {
            log::error!(
                "{}: starts at offset {} but the log before it ends at {}; setting it and later segments aside",
                f.path.display(),
                f.base_offset,
                expected.unwrap()
            );
            set_aside(std::iter::once(f).chain(rest.map(|(_, f)| f))).await;
            break;
        }
        let file = match Segment::open_file(&f.path).await {
            Ok(file) => file,
            Err(e) => {
                log::error!(
                    "{}: cannot be opened ({e}); setting it and later segments aside",
                    f.path.display()
                );
                set_aside(std::iter::once(f).chain(rest.map(|(_, f)| f))).await;
                break;
            }
        };
        if let Some((index, meta)) = f.index.take().filter(|(_, m)| !is_last && m.size == f.len) {
            let seg = Segment::with_meta(f.path, file, f.base_offset, index, meta, f.mtime_ms);
            seg.sealed.set(true);
            segments.push(Rc::new(seg));
            continue;
        }
        let scan = match Segment::scan(&file, &f.path, f.base_offset, interval).await {
            Ok(scan) => scan,
            Err(e) => {
                log::error!(
                    "{}: cannot be read ({e}); setting it and later segments aside",
                    f.path.display()
                );
                let _ = file.close().await;
                set_aside(std::iter::once(f).chain(rest.map(|(_, f)| f))).await;
                break;
            }
        };
        let damaged = scan.damage.is_some();
        if let Some(why) = &scan.damage {
            log::warn!(
                "recovery: cutting {} bytes from {} at position {} ({why})",
                f.len - scan.valid_len,
                f.path.display(),
                scan.valid_len
            );
            file.truncate(scan.valid_len)
                .await
                .map_err(|e| Error::storage(&f.path, e))?;
        }
        // Whatever survived a crash may sit only in the page cache: make it durable before counting it so.
        file.fdatasync()
            .await
            .map_err(|e| Error::storage(&f.path, e))?;
        let seg = Segment::with_meta(
            f.path,
            file,
            f.base_offset,
            scan.index,
            scan.meta,
            f.mtime_ms,
        );
        segments.push(Rc::new(seg));
        if damaged && !is_last {
            log::error!(
                "recovery: segments after the damage in {} are set aside",
                dir.display()
            );
            set_aside(rest.map(|(_, f)| f)).await;
            break;
        }
    }
    if segments.is_empty() {
        segments.push(Rc::new(Segment::create(dir, first_base, interval).await?));
        sync_dir(dir).await?;
    }
    Ok(segments)
}

async fn set_aside(found: impl Iterator<Item = Found>) {
    for f in found {
        let mut aside = f.path.with_extension("log.corrupt");
        if aside.exists() {
            aside = f.path.with_extension(format!("log.corrupt.{}", now_ms()));
        }
        match glommio::io::rename(&f.path, &aside).await {
            Ok(()) => log::error!("set aside {} as {}", f.path.display(), aside.display()),
            Err(e) => log::error!("could not set aside {}: {e}", f.path.display()),
        }
        let _ = glommio::io::remove(f.path.with_file_name(index_file_name(f.base_offset))).await;
    }
}
