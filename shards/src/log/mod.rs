//! One partition's log: segments on disk, offsets, durability (group commit), the tail cache, recovery
//! at open, retention and deletion.
//!
//! Design notes: `docs/engine.md`.
//!
//! ## Layout, top layer first
//! - `recovery`     — recovery at open: the last segment scanned, the index rebuilt where needed.
//! - `writer`       — the writer task: appends grouped into one write and one fsync (group commit).
//! - `compact`      — compaction of a compacted log: a pass over its sealed segments.
//! - `start`        — the log start offset DeleteRecords moves, and the segments it deletes.
//! - `segment`      — one segment file (`<base_offset:020>.log`): writes, reads, the recovery scan.
//! - `index`        — the sparse offset index and its file, which also marks a sealed segment clean.
//! - `direct_write` — the active segment's writes with Direct I/O: whole blocks from DMA buffers,
//!   the last partial block rewritten, zero padding cut when the segment is sealed.
//! - `readahead`    — windows read ahead of a sequential Direct I/O reader of a segment.
//! - `replica`      — a read replica of the log on another core, fed by the owner's hand-overs.
//! - `open_files`   — the core's budget of open files: segment handles opened on demand, those
//!   used least recently closed when it is full.
//! - `group_bytes`  — the bytes of one write of grouped appends: the producers' batches with their
//!   final offsets, copied into a DMA buffer or handed to a page cache `pwritev` as they lie.

use crate::batch::{self, BatchHeader};
use crate::config::LogConfig;
use crate::decoded::DecodedRecords;
use crate::error::{Error, InvalidBatch, Result};
use crate::log::index::{SegmentMeta, SparseIndex};
use crate::log::segment::{index_file_name, now_ms, Segment, MAX_RELATIVE_OFFSET};
use crate::monitor::OffsetMonitor;
use crate::records::{LogRead, Records};
use crate::storage_health::StorageEpisode;
use crate::tail_cache::{LogId, TailCache};
use crate::transactions::{encode_marker, AbortedTxn, Marker, OpenTransactions};
use bytes::Bytes;
use glommio::sync::Semaphore;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

mod compact;
pub(crate) mod direct_write;
mod group_bytes;
mod index;
pub mod open_files;
mod readahead;
mod recovery;
mod replica;
pub(crate) mod segment;
mod start;
mod writer;

use compact::{finish_interrupted, read_checkpoint, CompactionState};
pub use compact::{CompactionStats, MAP_BYTES};
pub use open_files::{open_files, set_open_files_limit, OpenFiles};
use recovery::{list_segments, recover};
use replica::Replication;
pub use replica::{Appended, Handover, LogEvent, LogSnapshot, ReplicationHook};
use writer::{start_housekeeping, write_index, PendingAppend};

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
    /// Compaction passes finished, bytes of segments they rewrote, and bytes those became.
    pub compactions: u64,
    pub compaction_read_bytes: u64,
    pub compaction_written_bytes: u64,
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
    /// The last stable offset: the first offset of the oldest open transaction, or the high
    /// watermark when none is open. A read_committed reader reads only below it.
    last_stable: OffsetMonitor,
    /// The producers' open transactions, as the batches written so far left them.
    transactions: RefCell<OpenTransactions>,
    /// Everything below is fsynced. Closed when the log fails or closes.
    durable: OffsetMonitor,
    /// Counts the sync task's rounds (each seals the segments rolled before it started): what
    /// `wait_sealed` waits on, since `durable` can pass a rolled segment's end before its seal.
    /// Closed with `durable`.
    sync_rounds: OffsetMonitor,
    /// Held by whoever changes the segment list or writes: the writer task, retention, close.
    append_permit: Semaphore,
    /// Validated appends waiting for the writer task, in arrival order.
    queue: RefCell<VecDeque<PendingAppend>>,
    writing: Cell<bool>,
    syncing: Cell<bool>,
    /// The highest offset someone asked to be durable (a durable append, a flush tick, close).
    sync_target: Cell<i64>,
    /// Segments rolled whose seal (fsync, index file) the sync task has not finished yet.
    unsealed: RefCell<Vec<Rc<Segment>>>,
    /// Segments created (directory entries added) so far, and how many of them the last
    /// directory fsync covered.
    dir_changes: Cell<u64>,
    dir_synced: Cell<u64>,
    /// When the housekeeping task last flushed the log and checked its retention.
    housekept: Cell<(Instant, Instant)>,
    /// (base offset, size) of the active segment at its last checkpoint (see
    /// [`writer::CHECKPOINT_BYTES`]).
    checkpointed: Cell<(i64, u64)>,
    /// Set when an fsync failed: the page cache may have dropped data, so appends stop until restart.
    failure: RefCell<Option<String>>,
    /// Storage failures, logged once per episode and counted.
    storage: StorageEpisode,
    closed: Cell<bool>,
    stats: Cell<LogStats>,
    /// Compaction: the checkpoint, whether a pass runs (see `compact`).
    compaction: RefCell<CompactionState>,
    /// Changes when compaction replaces segments ([`Log::layout`]).
    layout: Cell<u64>,
    /// View readers running on this log: while there are any, appends keep what checking their
    /// compressed batches decompressed, in `decoded`, for the readers to split.
    view_readers: Cell<u32>,
    decoded: RefCell<DecodedRecords>,
    /// The log start offset DeleteRecords set (see `start`), where it lies above the first
    /// segment's base; 0 when none did.
    start_floor: Cell<i64>,
    /// A read replica of another core's log (see `replica`): nothing is written, only read.
    replica: bool,
    /// The owner's: told of every change its read replicas must follow.
    replication: Replication,
}

/// An append on its way to the queue (see [`writer::PendingAppend`]).
struct NewAppend {
    blob: Bytes,
    headers: Vec<BatchHeader>,
    decoded: Vec<Option<Bytes>>,
    offsets: i64,
    keep_offsets: bool,
}

/// A handle that does not keep a log open (the registry of the core's open logs; a replication
/// hook that must not keep its own log alive).
#[derive(Debug, Clone)]
pub struct WeakLog(Weak<Inner>);

thread_local! {
    /// The logs opened on this core (thread) and not yet dropped, in the order they were opened.
    static OPEN_LOGS: RefCell<Vec<WeakLog>> = const { RefCell::new(Vec::new()) };
}

/// The logs open on this core now (each log adds itself when it opens): what the core's
/// compactor looks through.
pub fn open_logs() -> Vec<Log> {
    OPEN_LOGS.with(|logs| {
        let mut logs = logs.borrow_mut();
        logs.retain(WeakLog::is_alive);
        logs.iter().filter_map(WeakLog::upgrade).collect()
    })
}

impl WeakLog {
    pub fn upgrade(&self) -> Option<Log> {
        self.0.upgrade().map(|inner| Log { inner })
    }
    fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
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
        let ((listing, device), first_dirty, start) = {
            let dir = dir.clone();
            glommio::executor()
                .spawn_blocking(move || {
                    crate::files::create_dir_all_durable(&dir)?;
                    finish_interrupted(&dir)?;
                    let (listing, checkpoint) = (list_segments(&dir)?, read_checkpoint(&dir));
                    Ok::<_, std::io::Error>((listing, checkpoint, start::read_start(&dir)))
                })
                .await
        }
        .map_err(|e| Error::storage(&dir, e))?;
        // Before any Direct I/O open in this directory (recovery may create a segment).
        let direct_ok =
            config.direct_io && crate::log::direct_write::probe_device(&dir, device).await;
        let (segments, transactions) = recover(&dir, &config, listing).await?;
        let active = segments.last().expect("recover leaves a segment");
        if let Some(options) = config.direct_options().filter(|_| direct_ok) {
            // Opened at the first append: an idle partition holds no descriptor.
            active.defer_direct(options);
        }
        // Where the file system took Direct I/O for writes, reads use it too.
        let direct = active.writes_direct();
        for seg in &segments {
            seg.set_direct_reads(direct);
        }
        let next = segments
            .last()
            .expect("recover leaves a segment")
            .next_offset
            .get();
        let inner = Inner::new(
            dir,
            config,
            cache,
            segments,
            next,
            transactions,
            first_dirty,
            false,
        );
        // A start past what recovery kept (a disk that lost fsynced data) is the end; the file goes,
        // so that records written from here on are not hidden by it after another restart.
        if start > next {
            log::warn!(
                "{}: the saved log start {start} is past the recovered end {next}; starting at {next}",
                inner.dir.display()
            );
            start::forget(&inner.dir).await;
        }
        inner.start_floor.set(start.min(next));
        OPEN_LOGS.with(|logs| {
            let mut logs = logs.borrow_mut();
            // Now and then, not at every open: a core opens many thousands at start.
            if logs.len().is_power_of_two() {
                logs.retain(WeakLog::is_alive);
            }
            logs.push(WeakLog(Rc::downgrade(&inner)));
        });
        start_housekeeping();
        Ok(Log { inner })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
    /// A handle that does not keep the log open.
    pub fn downgrade(&self) -> WeakLog {
        WeakLog(Rc::downgrade(&self.inner))
    }
    /// Identifies this open log among all logs ever opened by the process (a re-created topic's
    /// partition gets a new id), for keys of per-core caches such as the fetch coalescer.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    pub fn high_watermark(&self) -> i64 {
        self.inner.high_watermark.value()
    }
    /// Whether an append should keep the decompressed records of its compressed batches (see
    /// [`Log::append_keeping`]): a view reader runs on the log and would decompress them again.
    pub fn keeps_decoded(&self) -> bool {
        self.inner.view_readers.get() > 0
    }
    /// A view reader starts (true) or stops (false) reading this log.
    pub(crate) fn view_reader_running(&self, running: bool) {
        let n = &self.inner.view_readers;
        if running {
            n.set(n.get() + 1);
        } else {
            n.set(n.get().saturating_sub(1));
            if n.get() == 0 {
                self.inner.decoded.borrow_mut().clear();
            }
        }
    }
    /// The records of batch `h` as decompressed when it was appended, if they were kept.
    pub(crate) fn decoded(&self, h: &BatchHeader) -> Option<Bytes> {
        self.inner.decoded.borrow().get(h)
    }
    /// Closed or deleted: nothing more will be appended or read.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.get()
    }
    /// The watermark long-polling fetches wait on.
    pub fn high_watermark_monitor(&self) -> &OffsetMonitor {
        &self.inner.high_watermark
    }
    /// The last stable offset: read_committed readers read only below it (the first offset of the
    /// oldest open transaction, or the high watermark when none is open).
    pub fn last_stable_offset(&self) -> i64 {
        self.inner.last_stable.value()
    }
    /// The watermark read_committed long polls wait on: it moves when a marker closes the oldest
    /// open transaction, or when the high watermark moves with none open.
    pub fn last_stable_monitor(&self) -> &OffsetMonitor {
        &self.inner.last_stable
    }
    /// How many transactions are open (metrics).
    pub fn open_transaction_count(&self) -> usize {
        self.inner.transactions.borrow().len()
    }
    /// The first offset of `producer_id`'s open transaction, if it has one (the produce path's
    /// check of a producer's transaction state: the log, not a producer snapshot, keeps it).
    pub fn open_transaction(&self, producer_id: i64) -> Option<i64> {
        self.inner.transactions.borrow().first_offset(producer_id)
    }
    /// (producer id, first offset) of every open transaction, oldest first.
    pub fn open_transactions(&self) -> Vec<(i64, i64)> {
        self.inner.transactions.borrow().iter().collect()
    }
    /// The aborted transactions holding records in `from..to`, by the offset of their markers: what
    /// a read_committed fetch of that range returns for the consumer to drop their records. Starts
    /// at the segment holding `from` (a transaction's marker comes after its records) and stops at
    /// the first entry aborted once every transaction still open began at or after `to`.
    pub fn aborted_transactions(&self, from: i64, to: i64) -> Vec<AbortedTxn> {
        let segs = self.inner.segments.borrow();
        let first = segs
            .partition_point(|s| s.base_offset <= from)
            .saturating_sub(1);
        let mut out = Vec::new();
        for seg in &segs[first..] {
            for a in &seg.txns.borrow().aborted {
                if a.intersects(from, to) {
                    out.push(*a);
                }
                if a.ends_search_before(to) {
                    return out;
                }
            }
        }
        out
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
    /// What appends do to the producers' compression (the topic's `compression.type`).
    pub fn compression(&self) -> crate::config::Compression {
        self.inner.config.borrow().compression
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
    /// About how many record bytes lie from `offset` to the high watermark: the offsets between
    /// them times the active segment's bytes per offset (an estimate: batches differ in size; 0
    /// when the active segment is still empty). Constant time: fetch pacing asks it per fetch.
    pub fn estimated_bytes_from(&self, offset: i64) -> u64 {
        let hw = self.high_watermark();
        let behind = hw.saturating_sub(offset).max(0) as u64;
        let active = self.inner.active();
        let offsets = hw.saturating_sub(active.base_offset);
        if behind == 0 || offsets <= 0 {
            return 0;
        }
        (behind as u128 * active.size.get() as u128 / offsets as u128) as u64
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
        self.check_keys(&blob, &headers)?;
        self.append_validated(blob, headers, opts).await
    }

    /// Appends batches already checked with [`batch::validate_all`] (`headers` are its result) and
    /// [`Log::check_keys`]. The
    /// append is queued when this is called, not when the future is first polled, so appends issued
    /// one after another are written in that order even if their futures are awaited together.
    pub fn append_validated(
        &self,
        blob: Bytes,
        headers: Vec<BatchHeader>,
        opts: AppendOptions,
    ) -> impl Future<Output = Result<AppendResult>> + 'static {
        self.append_keeping(blob, headers, Vec::new(), opts)
    }

    /// [`Log::append_validated`] with the decompressed records of its compressed batches
    /// ([`batch::validate_all_keeping`]; empty, or one per batch), which the log keeps a short
    /// while for its view readers once the batches are written.
    pub fn append_keeping(
        &self,
        blob: Bytes,
        headers: Vec<BatchHeader>,
        decoded: Vec<Option<Bytes>>,
        opts: AppendOptions,
    ) -> impl Future<Output = Result<AppendResult>> + 'static {
        let offsets: i64 = headers.iter().map(BatchHeader::offset_count).sum();
        let append = NewAppend {
            blob,
            headers,
            decoded,
            offsets,
            keep_offsets: false,
        };
        self.enqueue(append, opts)
    }

    /// Appends batches that another broker already numbered, keeping their offsets byte for byte
    /// (shoal edge mirrors an upstream partition so). They are checked with
    /// [`batch::validate_mirrored`] (with no size limit of this log's: the other broker took
    /// them) and must start at or past the high watermark; offsets they skip (compaction upstream)
    /// are gaps, as in a compacted log. Not durable: the upstream is.
    pub async fn append_mirrored(&self, blob: Bytes) -> Result<AppendResult> {
        let headers = batch::validate_mirrored(&blob, i32::MAX as usize)?;
        let hw = self.high_watermark();
        let (first, last) = (
            headers[0].base_offset,
            headers.last().unwrap().last_offset(),
        );
        if first < hw {
            return Err(Error::InvalidBatch(InvalidBatch::OffsetsOverlap {
                base_offset: first,
                previous_last: hw - 1,
            }));
        }
        // The span from the high watermark, gaps included, is what one segment must index.
        let Some(offsets) = last.checked_add(1).map(|end| end - hw) else {
            return Err(Error::InvalidBatch(InvalidBatch::TooManyOffsets {
                offsets: i64::MAX,
                limit: MAX_RELATIVE_OFFSET + 1,
            }));
        };
        let opts = AppendOptions { durable: false };
        let append = NewAppend {
            blob,
            headers,
            decoded: Vec::new(),
            offsets,
            keep_offsets: true,
        };
        self.enqueue(append, opts).await
    }

    /// Writes a transaction marker (a control batch: COMMIT or ABORT) for `producer_id` and returns
    /// its offset, once durable (like an `acks=all` append). It closes the producer's open
    /// transaction, if it has one; an ABORT adds the transaction to the aborted index. What the
    /// transaction coordinator asks of each partition it wrote to.
    pub async fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<i64> {
        let marker = Marker {
            commit,
            coordinator_epoch,
        };
        let bytes = encode_marker(producer_id, producer_epoch, marker, now_ms());
        let h = BatchHeader::parse(&bytes)?;
        let append = NewAppend {
            blob: Bytes::from(bytes),
            headers: vec![h],
            decoded: Vec::new(),
            offsets: 1,
            keep_offsets: false,
        };
        let r = self
            .enqueue(append, AppendOptions { durable: true })
            .await?;
        Ok(r.base_offset)
    }

    /// Empties the log and starts it again at `offset`, at or past the high watermark: every
    /// segment is deleted and an empty one begins there, so the log start and the high watermark
    /// both become `offset`. For a mirror (shoal edge) that must jump ahead of what it holds;
    /// readers holding the old segments finish with them.
    pub async fn restart_at(&self, offset: i64) -> Result<()> {
        let inner = &self.inner;
        let _permit = inner.permit().await?;
        inner.check_writable()?;
        let hw = inner.high_watermark.value();
        if offset < hw {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start_offset: inner.log_start_offset(),
                high_watermark: hw,
            });
        }
        if offset == hw && inner.log_start_offset() == hw {
            return Ok(());
        }
        let active = inner.active();
        let reuse_active = offset == hw && active.base_offset == hw && active.size.get() == 0;
        // Let the sync task finish sealing rolled segments before their files go.
        inner.wait_sealed().await?;
        let new = if reuse_active {
            // An empty active segment already begins there: only the older ones go.
            active
        } else {
            if let Err(e) = active.stop_direct().await {
                return Err(inner.storage.failed(&inner.dir, e, false));
            }
            let new = inner.create_segment(offset).await?;
            new.set_direct_reads(new.writes_direct());
            Rc::new(new)
        };
        let mut old = std::mem::replace(&mut *inner.segments.borrow_mut(), vec![new.clone()]);
        old.retain(|s| !Rc::ptr_eq(s, &new));
        inner.dir_changes.set(inner.dir_changes.get() + 1);
        inner.cache.forget(inner.cache_id);
        inner.layout.set(inner.layout.get() + 1);
        inner.high_watermark.advance(offset);
        // The transactions open in what was dropped cannot end in what follows.
        inner.set_transactions(OpenTransactions::default());
        inner.request_sync(offset);
        inner.segments_changed();
        for seg in &old {
            seg.retire();
            remove_segment_files(seg).await;
        }
        log::debug!("{}: restarted at offset {offset}", inner.dir.display());
        Ok(())
    }

    /// Queues an append for the writer task (see [`Log::append_validated`]).
    fn enqueue(
        &self,
        append: NewAppend,
        opts: AppendOptions,
    ) -> impl Future<Output = Result<AppendResult>> + 'static {
        let NewAppend {
            blob,
            headers,
            decoded,
            offsets,
            keep_offsets,
        } = append;
        let inner = self.inner.clone();
        let queued = inner.check_writable().and_then(|()| {
            // One append goes into one segment, so it may not span more offsets than a segment holds.
            if offsets - 1 > MAX_RELATIVE_OFFSET {
                return Err(Error::InvalidBatch(InvalidBatch::TooManyOffsets {
                    offsets,
                    limit: MAX_RELATIVE_OFFSET + 1,
                }));
            }
            let (done, result) = crate::oneshot::channel();
            inner.queue.borrow_mut().push_back(PendingAppend {
                blob,
                headers,
                decoded,
                offsets,
                durable: opts.durable,
                keep_offsets,
                done,
            });
            inner.start_writer();
            Ok(result)
        });
        async move {
            // A writer that drops an append unanswered has stopped: the log is closed.
            let res = queued?.await.unwrap_or(Err(Error::Closed))?;
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
            upstream_txns: None,
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
            // Compaction leaves gaps, even whole segments without batches: offsets below a
            // segment's base that the segments before did not hold are gone.
            at = at.max(seg.base_offset);
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
        // Records below the log start (DeleteRecords moved it inside a batch) are not answered.
        let floor = self.log_start_offset();
        let mut at = start.max(floor);
        while at < self.high_watermark() {
            let read = self.read(at, 1 << 20, true).await?;
            for (h, bytes) in read.records.batches() {
                if h.max_timestamp < timestamp {
                    continue;
                }
                // The first record at or after the time, as Kafka answers, inside compressed
                // batches too; a LogAppendTime batch's records all carry its time.
                if !h.is_log_append_time() {
                    match first_record_at(&h, &bytes, |r| r.timestamp >= timestamp) {
                        Some(found) if found.0 >= floor => return Ok(Some(found)),
                        Some(_) => {
                            let wanted = |r: &batch::Record<'_>| {
                                r.timestamp >= timestamp && r.offset >= floor
                            };
                            match first_record_at(&h, &bytes, wanted) {
                                Some(found) => return Ok(Some(found)),
                                None => continue,
                            }
                        }
                        None => {}
                    }
                }
                return Ok(Some((h.base_offset.max(floor), h.max_timestamp)));
            }
            match read.records.next_offset() {
                Some(next) => at = next,
                None => break,
            }
        }
        Ok(None)
    }

    /// The timestamp of the record a consumer at `offset` gets next: the first record at or after
    /// it (the log start, if `offset` is below it). `None` at the high watermark, or where a control
    /// batch comes next. Reads one batch, from the tail cache when it is recent: consumer group lag
    /// asks this of each lagging group's committed offset, to tell how old its backlog is. A
    /// LogAppendTime batch gives its append time.
    pub async fn timestamp_at(&self, offset: i64) -> Result<Option<i64>> {
        let at = offset.max(self.log_start_offset());
        if at >= self.high_watermark() {
            return Ok(None);
        }
        let read = self.read(at, 1, true).await?;
        let Some((h, bytes)) = read.records.batches().find(|(h, _)| h.last_offset() >= at) else {
            return Ok(None);
        };
        if h.is_control() {
            return Ok(None);
        }
        if h.is_log_append_time() {
            return Ok(Some(h.max_timestamp));
        }
        let exact = first_record_at(&h, &bytes, |r| r.offset >= at).map(|(_, ts)| ts);
        Ok(Some(exact.unwrap_or(h.base_timestamp)))
    }

    /// Deletes whole old segments beyond the retention limits (never the active one) and returns how many.
    pub async fn enforce_retention(&self) -> Result<usize> {
        let inner = &self.inner;
        let _permit = inner.permit().await?;
        inner.check_open_owner()?;
        // A compacted-only log keeps its segments; while a compaction pass rewrites segments,
        // retention waits for the next check.
        if !inner.config.borrow().cleanup_delete || inner.compaction.borrow().running {
            return Ok(0);
        }
        // Segments rolled a moment ago are being sealed in the background: wait for that (no
        // append can roll another while this holds the permit), so they can go too.
        inner.wait_sealed().await?;
        let (max_bytes, max_age) = {
            let c = inner.config.borrow();
            (c.retention_bytes, c.retention_age)
        };
        let cutoff = max_age.map(|a| now_ms() - a.as_millis() as i64);
        let mut total: u64 = inner.segments.borrow().iter().map(|s| s.size.get()).sum();
        let deleted = inner
            .delete_leading("retention", |s| {
                let over_size = max_bytes.is_some_and(|m| total - s.size.get() >= m);
                let too_old = cutoff.is_some_and(|c| s.retention_timestamp() < c);
                total -= s.size.get();
                over_size || too_old
            })
            .await;
        Ok(deleted)
    }

    /// Flushes, marks every sealed segment clean and closes the files. Appends still waiting fail with
    /// `Closed`; durable appends already written are synced first.
    pub async fn close(self) -> Result<()> {
        if self.inner.replica {
            self.close_replica();
            return Ok(());
        }
        let inner = self.inner;
        let permit = inner.permit().await?;
        inner.closed.set(true);
        drop(permit);
        inner.append_permit.close();
        if let Err(e) = inner.active().stop_direct().await {
            inner.storage.failed(&inner.dir, e, false);
        }
        let result = if inner.failure.borrow().is_none() {
            inner.sync_to(inner.high_watermark.value()).await
        } else {
            Ok(())
        };
        let segments = std::mem::take(&mut *inner.segments.borrow_mut());
        let last = segments.len().saturating_sub(1);
        for (i, seg) in segments.into_iter().enumerate() {
            // The active segment's index too, once all of it is durable: the next open trusts
            // it and scans nothing.
            let clean_end = i == last && result.is_ok() && inner.failure.borrow().is_none();
            if clean_end {
                seg.txns.borrow_mut().open_at_end = inner.transactions.borrow().clone();
            }
            if (i < last || clean_end) && !seg.sealed.get() {
                if let Err(e) = write_index(&seg).await {
                    inner.storage.index_write_failed(&e);
                }
            }
            seg.files.close();
        }
        inner.cache.forget(inner.cache_id);
        inner.high_watermark.close();
        inner.last_stable.close();
        inner.durable.close();
        inner.sync_rounds.close();
        result
    }

    /// Deletes the whole partition: its files and its directory (a read replica only closes: the
    /// files are its owner's).
    pub async fn delete(self) -> Result<()> {
        if self.inner.replica {
            self.close_replica();
            return Ok(());
        }
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
    /// A log's state over `segments` (oldest first, not empty), written up to `next`, with the
    /// transactions open there.
    #[allow(clippy::too_many_arguments)]
    fn new(
        dir: PathBuf,
        config: LogConfig,
        cache: Rc<TailCache>,
        segments: Vec<Rc<Segment>>,
        next: i64,
        transactions: OpenTransactions,
        first_dirty: i64,
        replica: bool,
    ) -> Rc<Inner> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let stable = transactions.first_unstable().map_or(next, |f| f.min(next));
        Rc::new(Inner {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cache_id: cache.register(),
            cache,
            dir,
            config: RefCell::new(config),
            segments: RefCell::new(segments),
            high_watermark: OffsetMonitor::new(next),
            last_stable: OffsetMonitor::new(stable),
            transactions: RefCell::new(transactions),
            durable: OffsetMonitor::new(next),
            sync_rounds: OffsetMonitor::new(0),
            append_permit: Semaphore::new(1),
            queue: RefCell::new(VecDeque::new()),
            writing: Cell::new(false),
            syncing: Cell::new(false),
            sync_target: Cell::new(next),
            unsealed: RefCell::new(Vec::new()),
            dir_changes: Cell::new(0),
            dir_synced: Cell::new(0),
            checkpointed: Cell::new((-1, 0)),
            housekept: Cell::new((Instant::now(), Instant::now())),
            failure: RefCell::new(None),
            storage: StorageEpisode::default(),
            closed: Cell::new(false),
            stats: Cell::new(LogStats::default()),
            compaction: RefCell::new(CompactionState {
                first_dirty,
                ..CompactionState::default()
            }),
            layout: Cell::new(0),
            view_readers: Cell::new(0),
            decoded: RefCell::default(),
            start_floor: Cell::new(0),
            replica,
            replication: Replication::default(),
        })
    }

    /// The first segment's base offset, or the start DeleteRecords set inside it; a closed log
    /// (no segments) reports its end.
    fn log_start_offset(&self) -> i64 {
        self.segments
            .borrow()
            .first()
            .map_or(self.high_watermark.value(), |s| {
                s.base_offset.max(self.start_floor.get())
            })
    }

    fn active(&self) -> Rc<Segment> {
        self.segments
            .borrow()
            .last()
            .expect("an open log has a segment")
            .clone()
    }

    /// The last stable offset the open transactions and the high watermark make now.
    fn stable_offset(&self) -> i64 {
        let hw = self.high_watermark.value();
        self.transactions
            .borrow()
            .first_unstable()
            .map_or(hw, |first| first.min(hw))
    }

    /// Replaces the open transactions (at open, at a restart, from a snapshot) and moves the last
    /// stable offset to match.
    fn set_transactions(&self, open: OpenTransactions) {
        *self.transactions.borrow_mut() = open;
        self.last_stable.advance(self.stable_offset());
    }

    /// Follows the batches of one write, at their final offsets, in `segment` (`blob` the batches
    /// described by `headers`): opens and closes transactions and indexes the aborted ones.
    fn follow_transactions(&self, segment: &Segment, blob: &[u8], headers: &[BatchHeader]) {
        let mut at = 0;
        for h in headers {
            let len = h.total_len();
            if h.is_transactional() {
                let bytes = blob.get(at..at + len).unwrap_or_default();
                if let Some(aborted) = self.transactions.borrow_mut().apply(h, bytes) {
                    segment.txns.borrow_mut().aborted.push(aborted);
                }
            }
            at += len;
        }
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
        if self.replica {
            return Err(Error::ReadReplica);
        }
        match &*self.failure.borrow() {
            Some(why) => Err(Error::storage(&self.dir, why)),
            None => Ok(()),
        }
    }
}

async fn sync_dir(dir: &Path) -> Result<()> {
    let _permit = open_files::permit(dir).await?;
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| Error::storage(dir, e))?;
    d.sync().await.map_err(|e| Error::storage(dir, e))?;
    let _ = d.close().await;
    Ok(())
}

async fn remove_segment_files(seg: &Segment) {
    for path in [seg.path.clone(), seg.index_path(), seg.txn_index_path()] {
        if let Err(e) = glommio::io::remove(&path).await {
            if !matches!(&e, glommio::GlommioError::IoError(io) if io.kind() == std::io::ErrorKind::NotFound)
            {
                log::warn!("could not remove {}: {e}", path.display());
            }
        }
    }
}

/// The (offset, timestamp) of the first record of batch `h` (`bytes`, compressed or not) that
/// `wanted` takes; `None` if none does or the batch cannot be decoded.
fn first_record_at(
    h: &batch::BatchHeader,
    bytes: &[u8],
    wanted: impl Fn(&batch::Record<'_>) -> bool,
) -> Option<(i64, i64)> {
    let plain = batch::records_section(h, bytes).ok()?;
    let records = batch::section_records(h, &plain).ok()?;
    let r = records.into_iter().find(|r| wanted(r))?;
    Some((r.offset, r.timestamp))
}
