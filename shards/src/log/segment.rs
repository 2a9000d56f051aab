//! One segment file: `<base_offset:020>.log`, RecordBatch v2 bytes back to back, plus its sparse index.
//!
//! The active segment is written with Direct I/O where the log asks for it and the file system
//! allows it (`direct_write`: whole blocks, the last one rewritten; acks=0/1 appends through the
//! page cache), else through glommio's `BufferedFile` (io_uring over the page cache). Reads of a
//! segment written with Direct I/O use Direct I/O too, with read-ahead (`readahead`); the others,
//! a segment retired by compaction and another core's replica read through the page cache.
//! Fsyncs and recovery go through the `BufferedFile`. Nothing here blocks the executor thread.
//!
//! Every descriptor is opened on first use and counts in the core's open files budget, which
//! closes those of segments used least recently (`open_files`).

use crate::batch::{self, BatchHeader, HEADER_LEN, LOG_OVERHEAD};
use crate::config::DirectOptions;
use crate::error::{Error, Result};
use crate::log::direct_write::DirectWriter;
use crate::log::group_bytes::GroupBytes;
use crate::log::index::{SegmentMeta, SparseIndex};
use crate::log::open_files::{self, Counted, Handles};
use crate::log::readahead::{self, ReadAhead};
use crate::records::Records;
use crate::transactions::{parse_marker, txn_index_file_name, OpenTransactions, SegmentTxns};
use bytes::Bytes;
use glommio::io::{BufferedFile, DmaFile, OpenOptions};
use glommio::sync::StaticPermit;
use std::cell::{Cell, RefCell};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Smallest read when walking batch headers on disk.
const HEADER_WINDOW: usize = 64 << 10;
/// Read size when scanning a segment at recovery.
const SCAN_CHUNK: usize = 4 << 20;

/// Most a segment's last offset may exceed its base offset. The index keeps offsets relative to the
/// segment's base as `u32`; like Kafka (whose relative offsets are `i32`), a segment rolls before any
/// offset would pass `i32::MAX`, whatever the batches claim.
pub(crate) const MAX_RELATIVE_OFFSET: i64 = i32::MAX as i64;

pub(crate) fn segment_file_name(base_offset: i64) -> String {
    format!("{base_offset:020}.log")
}
pub(crate) fn index_file_name(base_offset: i64) -> String {
    format!("{base_offset:020}.index")
}

#[derive(Debug)]
pub(crate) struct Segment {
    pub base_offset: i64,
    pub path: PathBuf,
    /// Its descriptors, opened on demand (see `open_files`).
    pub files: Rc<Handles>,
    /// Bytes of whole, written batches; the file may be longer after a failed write.
    pub size: Cell<u64>,
    pub next_offset: Cell<i64>,
    pub max_timestamp: Cell<i64>,
    pub first_timestamp: Cell<i64>,
    /// Wall-clock ms of the last append (or the file's mtime at start-up): the age of a segment whose
    /// records carry no timestamps.
    pub last_modified_ms: Cell<i64>,
    /// Wall-clock ms the segment was created (or its file's mtime at start-up): the age of a segment
    /// whose records carry no timestamps, for rolling.
    pub created_ms: i64,
    pub index: RefCell<SparseIndex>,
    /// Its index file is on disk and matches it: the segment is clean and immutable.
    pub sealed: Cell<bool>,
    /// The Direct I/O write handle while this is the active segment and the log writes with Direct
    /// I/O; `None`: writes go through `file` (the page cache).
    direct: RefCell<Option<Rc<DirectWriter>>>,
    /// The budget's permits of the Direct I/O writer's descriptors (its handle and its `O_DSYNC`
    /// one), held while it is open.
    direct_permits: RefCell<Option<StaticPermit>>,
    /// How the writer was opened, kept while the budget has it closed: the next append opens it
    /// again.
    direct_options: Cell<Option<DirectOptions>>,
    /// Read from disk with Direct I/O too (the log writes with it, so the page cache does not hold
    /// what was written: a buffered read would add a copy into it, and page-cache work, per byte).
    direct_reads: Cell<bool>,
    /// Windows read ahead of a sequential reader (Direct I/O reads have no kernel read-ahead).
    readahead: ReadAhead,
    /// The transactions its markers aborted, and those open at its end (once rolled).
    pub txns: RefCell<SegmentTxns>,
}

/// Where a recovery scan starts: at the beginning of the file, or after a prefix an index file
/// (written once that prefix was fsynced) describes.
#[derive(Debug)]
pub(crate) struct ScanFrom {
    pub index: SparseIndex,
    pub meta: SegmentMeta,
    pub txns: SegmentTxns,
}

impl ScanFrom {
    /// The beginning of a segment, with the transactions `open` at its start.
    pub(crate) fn start(base_offset: i64, index_interval: u32, open: OpenTransactions) -> Self {
        Self {
            index: SparseIndex::new(index_interval),
            meta: SegmentMeta {
                size: 0,
                next_offset: base_offset,
                max_timestamp: -1,
                first_timestamp: -1,
            },
            txns: SegmentTxns {
                aborted: Vec::new(),
                open_at_end: open,
            },
        }
    }
}

/// Permits of the open files budget taken for a write ([`Segment::reserve_write_files`]).
#[derive(Debug, Default)]
pub(crate) struct WriteFiles {
    buffered: Option<StaticPermit>,
    writer: Option<StaticPermit>,
}

/// What a recovery scan found.
#[derive(Debug)]
pub(crate) struct Scan {
    pub valid_len: u64,
    pub meta: SegmentMeta,
    pub index: SparseIndex,
    /// Why the scan stopped before the end of the file, if it did.
    pub damage: Option<String>,
    /// The segment's transactions, rebuilt from its transactional batches on top of those open
    /// at its start: the ones its markers aborted, and those open at its end.
    pub txns: SegmentTxns,
}

impl Segment {
    /// Creates an empty segment file; with `direct`, its writes use Direct I/O where the file
    /// system allows it.
    pub(crate) async fn create(
        dir: &Path,
        base_offset: i64,
        index_interval: u32,
        direct: Option<DirectOptions>,
    ) -> Result<Self> {
        let path = dir.join(segment_file_name(base_offset));
        let permit = open_files::permit(&path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .buffered_open(&path)
            .await
            .map_err(|e| Error::storage(&path, e))?;
        let files = Handles::with_buffered(path.clone(), Counted::new(file, permit));
        let seg = Self::with_meta(
            path,
            files,
            base_offset,
            SparseIndex::new(index_interval),
            SegmentMeta {
                size: 0,
                next_offset: base_offset,
                max_timestamp: -1,
                first_timestamp: -1,
            },
            now_ms(),
        );
        if let Some(options) = direct {
            seg.start_direct(options).await?;
        }
        seg.set_direct_reads(seg.writes_direct());
        Ok(seg)
    }

    /// Switches this segment's writes to Direct I/O (the active segment of a log that writes so),
    /// unless the file system refuses it. The partial block at the end is read back for the next
    /// write to rewrite. The file is allocated ahead in steps no larger than the segment size.
    pub(crate) async fn start_direct(&self, options: DirectOptions) -> Result<()> {
        self.start_direct_with(options, None).await
    }

    /// [`Self::start_direct`] with the budget's permits for the writer's two descriptors taken
    /// beforehand (else waited for).
    async fn start_direct_with(
        &self,
        options: DirectOptions,
        permits: Option<StaticPermit>,
    ) -> Result<()> {
        if self.direct.borrow().is_some() {
            return Ok(());
        }
        let size = self.size.get();
        let permits = match permits {
            Some(p) => p,
            None => open_files::permits(&self.path, 2).await?,
        };
        let mut writer = DirectWriter::open(&self.path, options).await?;
        if let Some(w) = &mut writer {
            let start = size - size % w.alignment();
            // Through the buffered handle the writer's caller has open (a Direct I/O read
            // handle would want a permit of its own).
            let tail = self.read_buffered(start, (size - start) as usize).await?;
            let file_len = self
                .files
                .buffered()
                .await?
                .file_size()
                .await
                .map_err(|e| Error::storage(&self.path, e))?;
            w.set_tail(tail.to_vec(), file_len);
        }
        if writer.is_some() {
            *self.direct_permits.borrow_mut() = Some(permits);
            self.direct_options.set(Some(options));
        }
        *self.direct.borrow_mut() = writer.map(Rc::new);
        Ok(())
    }

    /// The budget's permits for what the next write of this segment must open (its buffered
    /// handle, its Direct I/O writer), taken by the writer task before it takes the append
    /// permit: it never waits for the budget while holding that (see `open_files`).
    pub(crate) async fn reserve_write_files(&self) -> WriteFiles {
        let buffered = match self.files.buffered_if_open() {
            Some(_) => None,
            None => open_files::permit(&self.path).await.ok(),
        };
        let writer_closed = self.direct_options.get().is_some() && self.direct.borrow().is_none();
        let writer = match writer_closed {
            true => open_files::permits(&self.path, 2).await.ok(),
            false => None,
        };
        WriteFiles { buffered, writer }
    }

    /// Opens what a write needs with `reserved` permits, or permits free now, never waiting:
    /// the buffered handle (else an error) and the Direct I/O writer (else this write goes
    /// through the page cache).
    pub(crate) async fn open_for_write(&self, reserved: WriteFiles) -> Result<()> {
        self.files.buffered_with(reserved.buffered).await?;
        let Some(options) = self.direct_options.get() else {
            return Ok(());
        };
        if self.direct.borrow().is_some() {
            return Ok(());
        }
        let permits = match reserved.writer {
            Some(p) => p,
            None => match open_files::try_permits(&self.path, 2) {
                Ok(p) => p,
                Err(_) => return Ok(()),
            },
        };
        match self.start_direct_with(options, Some(permits)).await {
            Err(e) => log::debug!(
                "{}: Direct I/O writer not reopened: {e}",
                self.path.display()
            ),
            // The file system refused O_DIRECT: the page cache from now on.
            Ok(()) if self.direct.borrow().is_none() => self.direct_options.set(None),
            Ok(()) => {}
        }
        Ok(())
    }

    /// Writes with Direct I/O from the next append on, which opens the writer.
    pub(crate) fn defer_direct(&self, options: DirectOptions) {
        self.direct_options.set(Some(options));
    }

    /// Whether the writer is open and `release` (how the budget asks for it back) is to be set.
    pub(crate) fn writer_open(&self) -> bool {
        self.direct.borrow().is_some()
    }

    /// Whether writes go through Direct I/O (asked for, and the file system takes it), the
    /// writer open or closed by the open files budget for now.
    pub(crate) fn writes_direct(&self) -> bool {
        self.direct_options.get().is_some()
    }

    /// Reads from disk with Direct I/O from now on (or through the page cache).
    pub(crate) fn set_direct_reads(&self, on: bool) {
        self.direct_reads.set(on);
    }

    /// Marks the segment replaced by compaction (its path now names another file, so nothing may
    /// be opened by path any more; reads still in flight finish on the handles already open):
    /// reads from now on go through the open buffered handle.
    pub(crate) fn retire(&self) {
        self.files.pin_open();
        self.direct_reads.set(false);
    }

    /// This segment as one of another core's log, read through `file` (a duplicate of the owner's
    /// descriptor) by a read replica: it is never opened by path (compaction may put another file
    /// there at any moment) and never written.
    pub(crate) fn borrowed(self) -> Self {
        self.retire();
        self
    }

    /// Ends Direct I/O writes (the segment is sealed or the log closes): the zero padding after the
    /// last batch is cut, so the file holds exactly the batches.
    pub(crate) async fn stop_direct(&self) -> Result<()> {
        self.direct_options.set(None);
        self.pause_direct().await
    }

    /// Ends Direct I/O writes for now (the open files budget wants the descriptors back): as
    /// [`Self::stop_direct`], but the next append opens the writer again.
    pub(crate) async fn pause_direct(&self) -> Result<()> {
        let writer = self.direct.borrow_mut().take();
        self.files.set_writer(None);
        let res = match writer {
            Some(w) => w.finish(self.size.get()).await,
            None => Ok(()),
        };
        self.direct_permits.borrow_mut().take();
        res
    }

    pub(crate) fn with_meta(
        path: PathBuf,
        files: Rc<Handles>,
        base_offset: i64,
        index: SparseIndex,
        meta: SegmentMeta,
        last_modified_ms: i64,
    ) -> Self {
        Self {
            base_offset,
            path,
            files,
            size: Cell::new(meta.size),
            next_offset: Cell::new(meta.next_offset),
            max_timestamp: Cell::new(meta.max_timestamp),
            first_timestamp: Cell::new(meta.first_timestamp),
            last_modified_ms: Cell::new(last_modified_ms),
            created_ms: last_modified_ms,
            index: RefCell::new(index),
            sealed: Cell::new(false),
            direct: RefCell::new(None),
            direct_permits: RefCell::new(None),
            direct_options: Cell::new(None),
            direct_reads: Cell::new(false),
            readahead: ReadAhead::default(),
            txns: RefCell::default(),
        }
    }

    pub(crate) fn meta(&self) -> SegmentMeta {
        SegmentMeta {
            size: self.size.get(),
            next_offset: self.next_offset.get(),
            max_timestamp: self.max_timestamp.get(),
            first_timestamp: self.first_timestamp.get(),
        }
    }

    pub(crate) fn index_path(&self) -> PathBuf {
        self.path.with_file_name(index_file_name(self.base_offset))
    }
    pub(crate) fn txn_index_path(&self) -> PathBuf {
        self.path
            .with_file_name(txn_index_file_name(self.base_offset))
    }

    /// The timestamp retention by time compares: the newest record's, or the last write's if the
    /// records carry none.
    pub(crate) fn retention_timestamp(&self) -> i64 {
        let ts = self.max_timestamp.get();
        if ts >= 0 {
            ts
        } else {
            self.last_modified_ms.get()
        }
    }

    /// Whether offsets up to `last_offset` fit this segment's relative offsets.
    pub(crate) fn can_hold(&self, last_offset: i64) -> bool {
        last_offset - self.base_offset <= MAX_RELATIVE_OFFSET
    }

    /// Writes `bytes` (whole batches with final offsets, described by their headers) at the end. On
    /// error nothing is counted as written and the file is cut back to the last whole batch, best
    /// effort (recovery cuts it anyway).
    ///
    /// With `sync` and Direct I/O the write goes to the device `O_DSYNC`: then `true` if it made
    /// the file durable up to its end (no page cache write before it is still unwritten). Without
    /// `sync` it goes to the device too (not flushed) while the device keeps up, else through the
    /// page cache, complete once the kernel holds the batches (`direct_write`'s rule).
    pub(crate) async fn append(&self, bytes: &GroupBytes<'_>, sync: bool) -> Result<bool> {
        let pos = self.size.get();
        let len = bytes.len();
        let direct = self.direct.borrow().clone();
        let file = self.files.buffered().await?;
        let fd = file.as_raw_fd();
        let res = match (&direct, sync) {
            (Some(w), sync) if sync || w.unsynced_goes_direct() => {
                match w.write(pos, len, |b| bytes.fill(b), sync).await {
                    Ok(n) if n == len => Ok(()),
                    Ok(n) => Err(self.short_write(pos, n, len).await),
                    Err(e) => Err(Error::storage(&self.path, e)),
                }
            }
            (Some(w), _) => w
                .write_buffered(fd, pos, bytes)
                .await
                .map_err(|e| Error::storage(&self.path, e)),
            (None, _) => bytes
                .write_at(fd, pos)
                .map_err(|e| Error::storage(&self.path, e)),
        };
        if let Err(e) = res {
            if let Err(t) = file.truncate(pos).await {
                log::warn!(
                    "could not cut {} back to {pos} after a failed write: {t}",
                    self.path.display()
                );
            }
            return Err(e);
        }
        self.note_written(bytes.parts.iter().flat_map(|(_, headers)| headers.iter()));
        Ok(sync && direct.is_some_and(|w| !w.unsynced_page_cache()))
    }

    /// `fdatasync`s the file (what was written through either handle).
    pub(crate) async fn fdatasync(&self) -> Result<()> {
        let direct = self.direct.borrow().clone();
        let mark = direct.as_ref().map(|w| w.page_cache_mark());
        let file = self.files.buffered().await?;
        file.fdatasync()
            .await
            .map_err(|e| Error::storage(&self.path, e))?;
        if let (Some(w), Some(mark)) = (direct, mark) {
            w.synced_page_cache(mark);
        }
        Ok(())
    }

    /// Counts batches described by `headers` as written at the end of the file: size, index,
    /// offsets and timestamps (the owner after its write; a read replica when the owner hands
    /// the batches over).
    pub(crate) fn note_written<'h>(&self, headers: impl IntoIterator<Item = &'h BatchHeader>) {
        let mut at = self.size.get();
        let mut index = self.index.borrow_mut();
        for h in headers {
            debug_assert!(self.can_hold(h.last_offset()), "the log rolls first");
            index.maybe_add((h.base_offset - self.base_offset) as u32, at as u32);
            at += h.total_len() as u64;
            self.note_timestamps(h);
            self.next_offset.set(h.last_offset() + 1);
        }
        self.size.set(at);
        self.last_modified_ms.set(now_ms());
    }

    /// The error for a write of `len` bytes at `pos` that wrote only `n`. The kernel tells why (a
    /// full disk: ENOSPC) only when asked again, so the rest is written once more, as zeros: the
    /// append fails and is cut back either way, and the operator gets the OS error.
    async fn short_write(&self, pos: u64, n: usize, len: usize) -> Error {
        let file = match self.files.buffered().await {
            Ok(f) => f,
            Err(e) => return e,
        };
        let why = match file.write_at(vec![0; len - n], pos + n as u64).await {
            Err(e) => e.to_string(),
            Ok(_) => "the disk may be full".to_string(),
        };
        Error::storage(
            &self.path,
            format!("short write: {n} of {len} bytes: {why}"),
        )
    }

    /// Whether a batch with max timestamp `incoming_ts` should go to a new segment because this one is
    /// older than `age`. As in Kafka, time is measured between record timestamps when they exist (so a
    /// producer replaying old data does not roll on every batch), else by the wall clock.
    pub(crate) fn is_older_than(&self, age: std::time::Duration, incoming_ts: i64) -> bool {
        let age = age.as_millis() as i64;
        let first = self.first_timestamp.get();
        if first >= 0 && incoming_ts >= 0 {
            incoming_ts - first >= age
        } else {
            now_ms() - self.created_ms >= age
        }
    }

    fn note_timestamps(&self, h: &BatchHeader) {
        if self.first_timestamp.get() < 0 {
            self.first_timestamp.set(if h.max_timestamp >= 0 {
                h.max_timestamp
            } else {
                now_ms()
            });
        }
        self.max_timestamp
            .set(self.max_timestamp.get().max(h.max_timestamp));
    }

    /// Reads exactly `len` bytes at `pos` (the region must be below `size`).
    async fn read_exact(&self, pos: u64, len: usize, ahead: bool) -> Result<Bytes> {
        if self.direct_reads.get() {
            return self.read_direct(pos, len, ahead).await;
        }
        self.read_buffered(pos, len).await
    }

    /// [`Self::read_exact`] through the page cache.
    async fn read_buffered(&self, pos: u64, len: usize) -> Result<Bytes> {
        let file = self.files.buffered().await?;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let at = pos + out.len() as u64;
            let r = file
                .read_at(at, len - out.len())
                .await
                .map_err(|e| Error::storage(&self.path, e))?;
            if r.is_empty() {
                return Err(Error::storage(
                    &self.path,
                    format!("unexpected end of file at {at}"),
                ));
            }
            out.extend_from_slice(&r);
        }
        Ok(Bytes::from(out))
    }

    /// Reads `pos..pos + len` with Direct I/O: from the read-ahead windows as far as they hold it,
    /// the rest from the device (kept as a window too: the next read of a sequential reader starts
    /// inside it, at the first batch it could not take whole); then keeps a sequential reader's
    /// windows ahead of it.
    async fn read_direct(&self, pos: u64, len: usize, ahead: bool) -> Result<Bytes> {
        let end = pos + len as u64;
        let mut parts = Vec::new();
        let mut at = pos;
        let mut from_windows = false;
        while at < end {
            match self.readahead.get(at, end).await {
                Some(part) => {
                    from_windows = true;
                    let part = part?;
                    at += part.len() as u64;
                    parts.push(part);
                }
                None => {
                    let Some(file) = self.files.dma().await? else {
                        parts.push(self.read_buffered(at, (end - at) as usize).await?);
                        break;
                    };
                    let part =
                        direct_read(file, self.path.clone(), at, (end - at) as usize).await?;
                    self.readahead.keep(at, part.clone());
                    parts.push(part);
                    at = end;
                }
            }
        }
        let starts = if ahead {
            self.readahead.next_starts(pos, end, from_windows)
        } else {
            Vec::new()
        };
        for start in starts {
            let stop = self.size.get().min(start + readahead::WINDOW_BYTES as u64);
            if stop <= start {
                break;
            }
            let Some(file) = self.files.dma().await? else {
                break;
            };
            let read = direct_read(file, self.path.clone(), start, (stop - start) as usize);
            self.readahead.start(start, (stop - start) as usize, read);
        }
        Ok(match parts.len() {
            1 => parts.pop().unwrap(),
            _ => Bytes::from(parts.concat()),
        })
    }

    /// Whole batches from the one holding `offset`: at most `budget` bytes, or at least one batch if
    /// `obligatory`. Empty if `offset` is past this segment.
    pub(crate) async fn read(
        &self,
        offset: i64,
        budget: usize,
        obligatory: bool,
    ) -> Result<Records> {
        self.read_with(offset, budget, obligatory, true).await
    }

    /// [`Self::read`], with read-ahead only if `ahead`: compaction reads without it, so its reads
    /// never fill the device's queue ahead of the core's appends.
    pub(crate) async fn read_with(
        &self,
        offset: i64,
        budget: usize,
        obligatory: bool,
        ahead: bool,
    ) -> Result<Records> {
        let size = self.size.get();
        if offset >= self.next_offset.get() || size == 0 {
            return Ok(Records::empty());
        }
        let rel = (offset.max(self.base_offset) - self.base_offset) as u32;
        let mut pos = self.index.borrow().lookup(rel) as u64;
        let mut window = Window::default();
        // Walk headers from the index entry to the batch holding `offset`.
        let first = loop {
            if pos >= size {
                return Ok(Records::empty());
            }
            let h = self
                .header_at(&mut window, pos, size, HEADER_WINDOW, ahead)
                .await?;
            if h.last_offset() >= offset {
                break h;
            }
            pos += h.total_len() as u64;
        };
        // Then collect whole batches; the first window read usually holds the whole answer.
        let start = pos;
        let span = ((size - start) as usize).min(budget.max(HEADER_LEN));
        if window.slice(start, span).is_none() {
            window.start = start;
            window.data = self.read_exact(start, span, ahead).await?;
        }
        let mut end = pos;
        let mut out = Records {
            first_offset: first.base_offset,
            ..Records::empty()
        };
        while end < size {
            let h = self
                .header_at(
                    &mut window,
                    end,
                    size,
                    budget.saturating_sub((end - start) as usize),
                    ahead,
                )
                .await?;
            let t = h.total_len() as u64;
            let fits = (end - start + t) as usize <= budget;
            if !(fits || obligatory && out.batches == 0) {
                break;
            }
            end += t;
            out.batches += 1;
            out.records += h.record_count as u64;
            out.last_offset = h.last_offset();
        }
        if out.batches == 0 {
            return Ok(Records::empty());
        }
        let len = (end - start) as usize;
        let bytes = match window.slice(start, len) {
            Some(b) => b,
            None => self.read_exact(start, len, ahead).await?,
        };
        out.len = len;
        out.parts.push(bytes);
        Ok(out)
    }

    /// The header of the batch at `pos`, reading at least `want` bytes from there if the window misses.
    async fn header_at(
        &self,
        window: &mut Window,
        pos: u64,
        size: u64,
        want: usize,
        ahead: bool,
    ) -> Result<BatchHeader> {
        if window.slice(pos, HEADER_LEN).is_none() {
            let len = (size - pos).min(want.max(HEADER_WINDOW) as u64) as usize;
            if len < HEADER_LEN {
                return Err(Error::storage(
                    &self.path,
                    format!("batch header past the end at {pos}"),
                ));
            }
            window.start = pos;
            window.data = self.read_exact(pos, len, ahead).await?;
        }
        let b = window
            .slice(pos, HEADER_LEN)
            .expect("window holds the header");
        let h = BatchHeader::parse(&b).map_err(|e| Error::storage(&self.path, e))?;
        if h.total_len() < HEADER_LEN || pos + h.total_len() as u64 > size {
            return Err(Error::storage(
                &self.path,
                format!("inconsistent batch length at {pos}"),
            ));
        }
        Ok(h)
    }

    /// Reads the file batch by batch from where `from` ends, checking each CRC and that offsets
    /// grow, and goes on with `from`'s index and transaction state. Stops at the first torn or
    /// corrupt batch.
    pub(crate) async fn scan(
        file: &BufferedFile,
        path: &Path,
        base_offset: i64,
        from: ScanFrom,
    ) -> Result<Scan> {
        let file_len = file
            .file_size()
            .await
            .map_err(|e| Error::storage(path, e))?;
        let ScanFrom {
            mut index,
            mut meta,
            mut txns,
        } = from;
        let mut pos = meta.size;
        let mut buf_start = pos;
        let mut buf: Vec<u8> = Vec::new();
        let damage = loop {
            if pos == file_len {
                break None;
            }
            // Make sure the buffer holds the 12-byte prefix, then the whole batch.
            let mut need = LOG_OVERHEAD;
            let total = loop {
                let have = (buf_start + buf.len() as u64).saturating_sub(pos) as usize;
                let in_buf = pos >= buf_start;
                if in_buf && have >= need {
                    let at = (pos - buf_start) as usize;
                    if need == LOG_OVERHEAD {
                        need = batch::peek_total_len(&buf[at..]).unwrap();
                        if need == LOG_OVERHEAD && zeros_to_end(file, path, pos, file_len).await? {
                            // Padding of a Direct I/O write (or blocks a crash left unwritten).
                            break Ok(0);
                        }
                        if need < HEADER_LEN {
                            break Err(format!("batch length field {need} too small"));
                        }
                        continue;
                    }
                    break Ok(need);
                }
                if pos + need as u64 > file_len {
                    break Err(format!(
                        "torn batch: needs {need} bytes, {} left",
                        file_len - pos
                    ));
                }
                let len = (file_len - pos).min(SCAN_CHUNK.max(need) as u64) as usize;
                let r = file
                    .read_at(pos, len)
                    .await
                    .map_err(|e| Error::storage(path, e))?;
                if r.is_empty() {
                    break Err("file shrank while scanning".to_string());
                }
                buf.clear();
                buf.extend_from_slice(&r);
                buf_start = pos;
            };
            let total = match total {
                Ok(0) => break None,
                Ok(t) => t,
                Err(why) => break Some(why),
            };
            let at = (pos - buf_start) as usize;
            let h = match batch::check_integrity(&buf[at..at + total], usize::MAX) {
                Ok(h) => h,
                Err(e) => break Some(e.to_string()),
            };
            // Offsets only grow; compaction leaves gaps where it removed whole batches.
            if h.base_offset < meta.next_offset {
                break Some(format!(
                    "batch base offset {} below the end {} of the batches before it",
                    h.base_offset, meta.next_offset
                ));
            }
            if h.is_transactional() {
                let marker = parse_marker(&h, &buf[at..at + total]);
                txns.aborted.extend(txns.open_at_end.follow(&h, marker));
            }
            index.maybe_add((h.base_offset - base_offset) as u32, pos as u32);
            if meta.first_timestamp < 0 {
                meta.first_timestamp = h.max_timestamp;
            }
            meta.max_timestamp = meta.max_timestamp.max(h.max_timestamp);
            meta.next_offset = h.last_offset() + 1;
            pos += total as u64;
            meta.size = pos;
        };
        Ok(Scan {
            valid_len: pos,
            meta,
            index,
            damage,
            txns,
        })
    }
}

/// Exactly `pos..pos + len` of `file` (below the segment's size), read with Direct I/O.
async fn direct_read(
    file: Rc<Counted<DmaFile>>,
    path: PathBuf,
    pos: u64,
    len: usize,
) -> Result<Bytes> {
    let r = file
        .read_at(pos, len)
        .await
        .map_err(|e| Error::storage(&path, e))?;
    if r.len() < len {
        return Err(Error::storage(
            &path,
            format!("unexpected end of file at {}", pos + r.len() as u64),
        ));
    }
    Ok(Bytes::copy_from_slice(&r[..len]))
}

/// Zeros after the last batch that recovery reads to tell padding (of a Direct I/O write, or
/// space allocated ahead) from damage. Past the blocks the last write touched, a log only ever
/// has zeros (allocated ahead, or written ahead of the data), so a window of them is enough: a
/// crash with thousands of partitions' files allocated megabytes ahead reads this much of each.
const PADDING_CHECK: u64 = 64 << 10;

/// Whether the file holds zeros from `pos` on, to its end or for [`PADDING_CHECK`] bytes.
async fn zeros_to_end(file: &BufferedFile, path: &Path, pos: u64, file_len: u64) -> Result<bool> {
    let len = (file_len - pos).min(PADDING_CHECK);
    let rest = file
        .read_at(pos, len as usize)
        .await
        .map_err(|e| Error::storage(path, e))?;
    // Slices compared against a zero block run as `memcmp`, fast in debug builds too (a byte-wise
    // loop over megabytes of padding dominated every reopen of a test log).
    const ZEROS: [u8; 4096] = [0; 4096];
    Ok(rest.len() as u64 == len && rest.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()]))
}

/// A span of a segment file read into memory, so header walks and the final read share one I/O.
#[derive(Debug, Default)]
struct Window {
    start: u64,
    data: Bytes,
}

impl Window {
    fn slice(&self, pos: u64, len: usize) -> Option<Bytes> {
        let from = pos.checked_sub(self.start)? as usize;
        (from + len <= self.data.len()).then(|| self.data.slice(from..from + len))
    }
}

/// Wall-clock milliseconds since the Unix epoch (record timestamps, segment ages, producer expiry).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
