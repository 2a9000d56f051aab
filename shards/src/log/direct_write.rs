//! Writes at the end of the active segment with Direct I/O (`O_DIRECT` through glommio's `DmaFile`).
//!
//! Buffered writes cost the broker a copy into the page cache per byte (the largest single cost of
//! ingest in the profile) and leave dirty pages behind for write-back, which the periodic `fdatasync`
//! then waits on while appends queue behind it. Direct writes go from a DMA buffer straight to the
//! device: the batches are copied once, into that buffer, and the data is on the device when the
//! write completes (an `fdatasync` then only flushes the device cache and the file size).
//!
//! Direct I/O wants whole aligned blocks. The file's last, partial block is kept in memory (`tail`)
//! and written again, followed by the new batches and zero padding to the next block boundary, by the
//! next write. The file on disk can therefore be up to one block longer than the segment's batches;
//! sealing a segment (or closing the log) cuts it to its logical size, and recovery treats zeros
//! after the last batch as padding, not damage.
//!
//! Space is allocated ahead (`fallocate`), but on ext4 allocated space is *unwritten* until data
//! lands in it, and a Direct I/O write there converts extents: the kernel will not do that from the
//! submitting thread, so every such write would go to an io_uring worker thread. A background task therefore writes zeros ahead
//! of the data, 256 KiB at a time from one shared zero buffer, so that the appends land in written
//! blocks and are issued inline. The zeros are what the allocated space already read as, so
//! nothing changes on disk for recovery; a data write never overlaps a zero write in flight (it
//! waits for it), and sealing, closing or a failed write wait for it too before cutting the file.
//! A writer dropped without [`DirectWriter::finish`] (the log was dropped, not closed) leaves at most
//! one zero write in flight on its own descriptor, past the data: a segment is only reopened by a
//! log that was closed, or by a new process.
//!
//! Writes that need not be durable (acks=0/1) go through the page cache instead
//! ([`DirectWriter::write_buffered`]): a `pwritev` of the batches as they lie, complete once the
//! kernel holds them, which outlives the process (Kafka's acks=1 promise), without waiting for the
//! device, and without a device request per write from the core (write-back sends large ones from
//! the kernel's threads). The same file then holds both: a Direct I/O write first writes back and
//! drops the page cache over its range (the kernel keeps the two coherent), the partial block kept
//! in `tail` follows either kind of write, zero writes never start below the end of either, and an
//! `O_DSYNC` write is taken as making the file durable only if no page cache write since the last
//! `fdatasync` may still be unwritten ([`DirectWriter::unsynced_page_cache`]).
//!
//! Reads are the segment's (`Segment::read_exact`): Direct I/O with read-ahead on a segment written
//! this way, and the tail cache serves what was just written anyway.

use crate::config::DirectOptions;
use crate::error::{Error, Result};
use crate::log::group_bytes::GroupBytes;
use crate::monitor::OffsetMonitor;
use glommio::io::{DmaBuffer, DmaFile, OpenOptions};
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;

/// The write handle of an active segment written with Direct I/O.
#[derive(Debug)]
pub(crate) struct DirectWriter {
    file: Rc<DmaFile>,
    /// Zeros written ahead of the data (see the module's documentation).
    zeros: Rc<ZeroAhead>,
    /// The same file opened `O_DSYNC`, for writes that carry a durable (`acks=all`) append: the
    /// kernel completes such a write only once it and the file's metadata are on stable storage
    /// (an `fdatasync` in the same operation). Opened at the first such write.
    dsync: RefCell<Option<std::rc::Rc<DmaFile>>>,
    path: std::path::PathBuf,
    /// Bytes of the block the segment's logical end falls in (`size % alignment` of them), as on disk.
    tail: RefCell<Vec<u8>>,
    /// The file's length: blocks up to here are allocated (`fallocate`), so a write below it is an
    /// overwrite, which the kernel issues asynchronously from the submitting thread; a write past it
    /// would extend the file, which ext4 does synchronously in an io_uring worker thread.
    allocated: Cell<u64>,
    /// False once the file system said it cannot allocate ahead.
    allocate_ahead: Cell<bool>,
    /// How far ahead to allocate: [`ALLOCATE_STEP`], or less for small segments.
    allocate_step: u64,
    /// Page cache writes made so far, and how many of them an `fdatasync` that completed has covered.
    page_cache_writes: Cell<u64>,
    page_cache_synced: Cell<u64>,
}

/// How far ahead of the logical end the file is allocated, in one `fallocate`.
pub(crate) const ALLOCATE_STEP: u64 = 8 << 20;

/// One zero write: the shared zero buffer's size. Zeros are written ahead only in files allocated
/// in steps at least this large (smaller writes would each go to a worker thread themselves).
/// Appends queue behind a zero write on the device, so it is kept small.
const ZERO_CHUNK: u64 = 256 << 10;
/// How far past the end of the last data write zeros are kept written.
const ZEROS_AHEAD: u64 = 4 << 20;

thread_local! {
    /// The zero buffer the zero writes of this thread's writers share (never written after it is
    /// filled).
    static ZERO_BUFFER: RefCell<Option<Rc<DmaBuffer>>> = const { RefCell::new(None) };
}

/// The zeros written ahead of one file's data.
#[derive(Debug)]
struct ZeroAhead {
    /// Off for small allocation steps, for a file system without `fallocate`, after a failed zero
    /// write, and once the writer is finished.
    on: Cell<bool>,
    /// Blocks from `data_end` up to here hold zeros written by this writer.
    zeroed: Cell<u64>,
    /// End of the last data write issued: zero writes start at or after it.
    data_end: Cell<u64>,
    /// How far the zeros should reach (within `allocated`).
    target: Cell<u64>,
    /// The zero write in flight, `[from, from + ZERO_CHUNK)`.
    in_flight: Cell<Option<u64>>,
    /// Counts finished zero writes: waiters for the one in flight wait for the next count.
    done: OffsetMonitor,
    /// Whether the task that writes them is running.
    running: Cell<bool>,
}

impl ZeroAhead {
    fn new(on: bool) -> Self {
        Self {
            on: Cell::new(on),
            zeroed: Cell::new(0),
            data_end: Cell::new(0),
            target: Cell::new(0),
            in_flight: Cell::new(None),
            done: OffsetMonitor::new(0),
            running: Cell::new(false),
        }
    }

    /// Waits until no zero write in flight overlaps `start..end` (with `end` = `u64::MAX`: until
    /// none is in flight).
    async fn settle(&self, start: u64, end: u64) {
        while let Some(from) = self.in_flight.get() {
            if from >= end || from + ZERO_CHUNK <= start {
                return;
            }
            self.done.wait_for(self.done.value() + 1).await;
        }
    }

    /// Where the next zero write starts, if one is due: after the data and what is zeroed, ending
    /// within `target`.
    fn next_chunk(&self) -> Option<u64> {
        let from = self.zeroed.get().max(self.data_end.get());
        (from + ZERO_CHUNK <= self.target.get()).then_some(from)
    }

    /// Writes zeros up to `target` (one chunk at a time, each after the data's end) until there
    /// is nothing left to do.
    async fn run(self: Rc<Self>, file: Rc<DmaFile>) {
        while self.on.get() {
            let Some(from) = self.next_chunk() else {
                break;
            };
            let buf = ZERO_BUFFER.with(|z| {
                z.borrow_mut()
                    .get_or_insert_with(|| {
                        let mut b = file.alloc_dma_buffer(ZERO_CHUNK as usize);
                        b.as_bytes_mut().fill(0);
                        Rc::new(b)
                    })
                    .clone()
            });
            self.in_flight.set(Some(from));
            let written = file.write_rc_at(buf, from).await;
            self.in_flight.set(None);
            match written {
                Ok(n) if n as u64 == ZERO_CHUNK => self.zeroed.set(from + ZERO_CHUNK),
                // Only an optimisation: data writes go to unwritten space, as without it.
                _ => self.on.set(false),
            }
            self.done.advance(self.done.value() + 1);
        }
        self.running.set(false);
    }
}

impl DirectWriter {
    /// Opens `path` for Direct I/O writes, with no partial block yet (see [`Self::set_tail`]).
    /// Read access too: glommio probes the device with a read at the first open (the log has run
    /// [`probe_device`] on its directory before).
    /// `None` when the file system does not take `O_DIRECT` (the caller writes buffered).
    /// The segment size caps the allocation step: a small segment is not padded to megabytes, which
    /// every recovery scan would then read back.
    pub(crate) async fn open(path: &Path, options: DirectOptions) -> Result<Option<Self>> {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(path)
            .await
        {
            Ok(f) => f,
            Err(glommio::GlommioError::IoError(e))
                if e.kind() == std::io::ErrorKind::InvalidInput =>
            {
                log::warn!(
                    "{}: the file system refuses O_DIRECT ({e}); writing through the page cache",
                    path.display()
                );
                return Ok(None);
            }
            Err(e) => return Err(Error::storage(path, e)),
        };
        let allocate_step = options
            .segment_bytes
            .next_multiple_of(64 << 10)
            .min(ALLOCATE_STEP);
        Ok(Some(Self {
            file: Rc::new(file),
            zeros: Rc::new(ZeroAhead::new(
                options.zero_ahead && allocate_step >= ZERO_CHUNK,
            )),
            dsync: RefCell::new(None),
            path: path.to_path_buf(),
            tail: RefCell::new(Vec::new()),
            allocated: Cell::new(0),
            allocate_ahead: Cell::new(true),
            allocate_step,
            page_cache_writes: Cell::new(0),
            page_cache_synced: Cell::new(0),
        }))
    }

    /// The block size writes are aligned to: the device's, and at least the file system's usual
    /// 4 KiB. ext4 issues a write to allocated space without blocking only when it covers whole file
    /// system blocks; a 512-byte aligned one waits for an exclusive inode lock in a worker thread.
    pub(crate) fn alignment(&self) -> u64 {
        self.file.alignment().max(4096)
    }

    /// Sets the bytes of the partial block at the logical end (read back from the file at open) and
    /// the file's length.
    pub(crate) fn set_tail(&mut self, tail: Vec<u8>, file_len: u64) {
        *self.tail.get_mut() = tail;
        self.allocated.set(file_len);
    }

    /// Writes `len` bytes that `fill` puts in place at logical position `pos` (the segment's end),
    /// rewriting the partial block before them. Returns the logical bytes written (`len` unless the
    /// write was short).
    ///
    /// With `sync`, the write goes through the `O_DSYNC` handle: when it completes, everything
    /// written to the file so far is durable.
    pub(crate) async fn write(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        sync: bool,
    ) -> std::result::Result<usize, glommio::GlommioError<()>> {
        let align = self.alignment();
        let start = pos - pos % align;
        let tail_len = (pos - start) as usize;
        let total = tail_len + len;
        let padded = (total as u64).next_multiple_of(align) as usize;
        let end = start + padded as u64;
        self.allocate_for(end).await;
        // Zero writes start at or after `data_end` from now on; one in flight over this write's
        // blocks is waited for.
        self.zeros.data_end.set(end);
        self.zeros.settle(start, end).await;
        let mut buf = self.file.alloc_dma_buffer(padded);
        let new_tail = {
            let b = buf.as_bytes_mut();
            b[..tail_len].copy_from_slice(&self.tail.borrow());
            fill(&mut b[tail_len..total]);
            b[total..].fill(0);
            let end = pos + len as u64;
            let keep = (end % align) as usize;
            b[total - keep..total].to_vec()
        };
        let dsync = match sync {
            true => Some(self.dsync_handle().await?),
            false => None,
        };
        let file = dsync.as_deref().unwrap_or(&*self.file);
        let written = file.write_at(buf, start).await;
        if !matches!(written, Ok(n) if n == padded) {
            self.forget_after_failed_write().await;
            return written.map(|n| n.saturating_sub(tail_len).min(len));
        }
        *self.tail.borrow_mut() = new_tail;
        self.zero_ahead(end);
        Ok(len)
    }

    /// Allocates the file ahead (in `allocate_step`s) unless it reaches `end` already.
    async fn allocate_for(&self, end: u64) {
        if end > self.allocated.get() && self.allocate_ahead.get() {
            let to = end.next_multiple_of(self.allocate_step);
            match self.file.pre_allocate(to, false).await {
                Ok(()) => self.allocated.set(to),
                // Only an optimisation: a nearly full disk may still take the write itself (and
                // if not, the write says why); a file system without `fallocate` never will.
                Err(glommio::GlommioError::IoError(e))
                    if e.kind() == std::io::ErrorKind::Unsupported =>
                {
                    self.allocate_ahead.set(false);
                    self.zeros.on.set(false);
                }
                Err(_) => {}
            }
        }
    }

    /// Writes `bytes` at logical position `pos` (the segment's end) through the page cache, on
    /// `fd` (a descriptor of the same file without `O_DIRECT`): complete once the kernel holds them.
    /// A zero write in flight over these blocks is waited for first.
    pub(crate) async fn write_buffered(
        &self,
        fd: std::os::fd::RawFd,
        pos: u64,
        bytes: &GroupBytes<'_>,
    ) -> std::io::Result<()> {
        let align = self.alignment();
        let start = pos - pos % align;
        let end = pos + bytes.len() as u64;
        let block_end = end.next_multiple_of(align);
        let z = &self.zeros;
        z.data_end.set(z.data_end.get().max(block_end));
        z.settle(start, block_end).await;
        self.page_cache_writes.set(self.page_cache_writes.get() + 1);
        if let Err(e) = bytes.write_at(fd, pos) {
            self.forget_after_failed_write().await;
            return Err(e);
        }
        // The partial block at the new end, for the next Direct I/O write to rewrite.
        let keep = end % align;
        let new_tail = if end - keep >= pos {
            bytes.suffix((end - keep - pos) as usize)
        } else {
            let mut t = std::mem::take(&mut *self.tail.borrow_mut());
            t.extend_from_slice(&bytes.suffix(0));
            t
        };
        *self.tail.borrow_mut() = new_tail;
        self.allocated.set(self.allocated.get().max(block_end));
        Ok(())
    }

    /// After a failed write the caller cuts the file back to its logical end: allocate again next
    /// time, and no zero write may land after that cut.
    async fn forget_after_failed_write(&self) {
        self.allocated.set(0);
        self.zeros.target.set(0);
        self.zeros.settle(0, u64::MAX).await;
        // After the settle: a zero write that was in flight would set it again on landing.
        self.zeros.zeroed.set(0);
    }

    /// The page cache writes made so far: an `fdatasync` that starts now covers them (see
    /// [`Self::synced_page_cache`]).
    pub(crate) fn page_cache_mark(&self) -> u64 {
        self.page_cache_writes.get()
    }

    /// An `fdatasync` that started at `mark` completed.
    pub(crate) fn synced_page_cache(&self, mark: u64) {
        self.page_cache_synced
            .set(self.page_cache_synced.get().max(mark));
    }

    /// Whether a page cache write may not be on the device yet (no `fdatasync` covered it).
    pub(crate) fn unsynced_page_cache(&self) -> bool {
        self.page_cache_writes.get() > self.page_cache_synced.get()
    }

    /// Keeps zeros written up to [`ZEROS_AHEAD`] past `end` (within the allocated space), starting
    /// the task that writes them if it is not running.
    fn zero_ahead(&self, end: u64) {
        let z = &self.zeros;
        if !z.on.get() {
            return;
        }
        z.target.set((end + ZEROS_AHEAD).min(self.allocated.get()));
        if !z.running.get() && z.next_chunk().is_some() {
            z.running.set(true);
            let task = z.clone().run(self.file.clone());
            glommio::spawn_local(task).detach();
        }
    }

    async fn dsync_handle(
        &self,
    ) -> std::result::Result<std::rc::Rc<DmaFile>, glommio::GlommioError<()>> {
        if let Some(f) = &*self.dsync.borrow() {
            return Ok(f.clone());
        }
        let f = std::rc::Rc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DSYNC)
                .dma_open(&self.path)
                .await?,
        );
        *self.dsync.borrow_mut() = Some(f.clone());
        Ok(f)
    }

    /// Cuts the zero padding after the logical end `size` (before a seal or a close).
    pub(crate) async fn finish(&self, size: u64) -> Result<()> {
        self.zeros.on.set(false);
        self.zeros.settle(0, u64::MAX).await;
        self.file
            .truncate(size)
            .await
            .map_err(|e| Error::storage(&self.path, e))
    }
}

thread_local! {
    /// Devices (`st_dev`) whose I/O polling support glommio has probed on this thread.
    static PROBED: RefCell<std::collections::HashSet<u64>> = RefCell::default();
    /// Devices whose file system refused `O_DIRECT` at the probe.
    static REFUSED: RefCell<std::collections::HashSet<u64>> = RefCell::default();
}

/// Makes sure glommio's first Direct I/O open on this thread for `device` (the one holding `dir`,
/// a log's directory) probes a file with data in it; the log calls it at open, before any Direct
/// I/O open there. glommio 0.9 decides once per device and thread whether to use its polled
/// ring by reading the first file opened there; the read of an empty file (a segment just created)
/// succeeds without reaching the device, so polling is wrongly taken as supported, and every later
/// Direct I/O read then fails with `EOPNOTSUPP` on devices without poll queues. The probe file is
/// 4 KiB in `dir`, removed at once. If it cannot be made the device is probed again at the next
/// log's open (a failing directory fails its writes anyway).
///
/// Returns whether the file system takes `O_DIRECT` there (a log then writes its active segment
/// so, opening the writer at its first append).
pub(crate) async fn probe_device(dir: &Path, dev: u64) -> bool {
    if PROBED.with(|p| p.borrow().contains(&dev)) {
        return true;
    }
    if REFUSED.with(|p| p.borrow().contains(&dev)) {
        return false;
    }
    let probe = dir.join(".shoal-direct-io-probe");
    let made = async {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .buffered_open(&probe)
            .await?;
        f.write_at(vec![0xA5; 4096], 0).await?;
        f.close().await?;
        let f = OpenOptions::new().read(true).dma_open(&probe).await?;
        f.close().await
    }
    .await;
    let _ = glommio::io::remove(&probe).await;
    match made {
        Ok(()) => {
            PROBED.with(|p| p.borrow_mut().insert(dev));
            true
        }
        Err(glommio::GlommioError::IoError(e)) if e.kind() == std::io::ErrorKind::InvalidInput => {
            log::warn!(
                "{}: the file system refuses O_DIRECT ({e}); writing through the page cache",
                dir.display()
            );
            REFUSED.with(|p| p.borrow_mut().insert(dev));
            false
        }
        Err(e) => {
            log::debug!("direct I/O probe in {}: {e}", dir.display());
            true
        }
    }
}
