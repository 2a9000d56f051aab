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
//! Writes that need not be durable (acks=0/1) are complete once the broker process no longer holds
//! the bytes (Kafka's acks=1 promise: they outlive a `kill -9`), and go where that costs least
//! while the device keeps up: with Direct I/O on the plain handle, without `O_DSYNC` (one copy, no
//! page-cache insertion, no write-back; the data is on the device when the write completes, and no
//! flush is waited for). A device that stalls (a VM disk holding writes behind a cache flush) would
//! hold them for the stall, so while it stalls they go through the page cache
//! ([`DirectWriter::write_buffered`]: one `pwrite` of whole blocks, complete once the kernel holds
//! the bytes). The rule is a [`DeviceWatch`]'s, one per core and device: page cache while an
//! `fdatasync` of an active segment there is in flight (a flush is what a stalling device stalls
//! behind) or a Direct I/O write (data or zeros) has been in flight past its limit, and for a hold
//! of [`HOLD_MIN`] after a stall was seen: a Direct I/O write slower than its limit
//! ([`WRITE_STALL`], [`FLUSH_STALL`] with `O_DSYNC`), or an `fdatasync` slower than [`FLUSH_STALL`]
//! that had at most [`FLUSH_EVIDENCE_BYTES`] of page cache to write back (else its time is the
//! write-back's). A stall within a hold of the return to Direct I/O doubles the next hold, up to
//! [`HOLD_MAX`]. A page cache write, or an `fdatasync` in flight, stops the zeros written ahead
//! until the next Direct I/O write (a data write reaching a zero write stuck in a stall would wait
//! for it). The same file then holds both kinds of write: a Direct I/O write first writes back and
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
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

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
    /// The same in bytes: how much write-back an `fdatasync` that starts now has to wait for.
    page_cache_bytes: Cell<u64>,
    page_cache_bytes_synced: Cell<u64>,
    /// How the device's writes and flushes have gone lately: whether writes that need not be
    /// durable go with Direct I/O now.
    watch: Rc<DeviceWatch>,
}

/// How far ahead of the logical end the file is allocated, in one `fallocate`.
pub(crate) const ALLOCATE_STEP: u64 = 8 << 20;

/// One zero write: the shared zero buffer's size. Zeros are written ahead only in files allocated
/// in steps at least this large (smaller writes would each go to a worker thread themselves).
/// Appends queue behind a zero write on the device, so it is kept small.
const ZERO_CHUNK: u64 = 256 << 10;
/// How far past the end of the last data write zeros are kept written.
const ZEROS_AHEAD: u64 = 4 << 20;

/// A Direct I/O write without `O_DSYNC` in flight longer than this means the device stalls: it
/// completes in well under a millisecond on a device that keeps up, and a few ms under load.
pub(crate) const WRITE_STALL: Duration = Duration::from_millis(50);
/// An `fdatasync`, or a Direct I/O write with `O_DSYNC` (a flush in the same operation), taking
/// longer than this means the device stalls behind its flushes.
pub(crate) const FLUSH_STALL: Duration = Duration::from_millis(200);
/// Most page cache bytes an `fdatasync` may have to write back and still tell a stall by its time.
pub(crate) const FLUSH_EVIDENCE_BYTES: u64 = 4 << 20;
/// How long writes that need not be durable go through the page cache after a stall was seen.
pub(crate) const HOLD_MIN: Duration = Duration::from_secs(30);
/// The longest hold: each stall within a hold of the last return to Direct I/O doubles it.
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(300);

thread_local! {
    /// This thread's watch of each device (`st_dev`) its active segments are written on.
    static WATCHES: RefCell<HashMap<u64, Rc<DeviceWatch>>> = RefCell::default();
}

/// Where a core's writes that need not be durable go on one device: with Direct I/O while the
/// device keeps up, through the page cache while it stalls (the rule is in the module's
/// documentation). The methods take the time, so the rule is tested without waiting.
#[derive(Debug)]
pub(crate) struct DeviceWatch {
    /// Direct I/O data writes in flight: when each would count as a stall, and an id.
    writes: RefCell<BTreeSet<(Instant, u64)>>,
    /// Ids of the `fdatasync`s of active segments in flight.
    flushes: RefCell<BTreeSet<u64>>,
    next_id: Cell<u64>,
    /// The device counts as stalling until then.
    stalled_until: Cell<Option<Instant>>,
    /// When the last hold ended: a stall soon after it doubles the next hold.
    released: Cell<Option<Instant>>,
    /// The last hold given.
    hold: Cell<Duration>,
    hold_min: Duration,
    hold_max: Duration,
}

impl DeviceWatch {
    pub(crate) fn new(hold_min: Duration, hold_max: Duration) -> Self {
        Self {
            writes: RefCell::default(),
            flushes: RefCell::default(),
            next_id: Cell::new(0),
            stalled_until: Cell::new(None),
            released: Cell::new(None),
            hold: Cell::new(hold_min),
            hold_min,
            hold_max,
        }
    }

    /// This thread's watch of device `dev`.
    fn of_device(dev: u64) -> Rc<Self> {
        WATCHES.with(|w| {
            w.borrow_mut()
                .entry(dev)
                .or_insert_with(|| Rc::new(Self::new(HOLD_MIN, HOLD_MAX)))
                .clone()
        })
    }

    /// Makes `watch` this thread's watch of device `dev` (tests: short holds, a stall on demand).
    #[cfg(test)]
    pub(crate) fn install(dev: u64, watch: Rc<Self>) {
        WATCHES.with(|w| w.borrow_mut().insert(dev, watch));
    }

    /// Whether a write that need not be durable goes with Direct I/O at `now`.
    pub(crate) fn takes_direct(&self, now: Instant) -> bool {
        if self.flushing() {
            return false;
        }
        let overdue = self
            .writes
            .borrow()
            .first()
            .is_some_and(|&(due, _)| now >= due);
        if overdue {
            self.stall(now);
        }
        !self.stalled(now)
    }

    /// Whether an `fdatasync` of an active segment is in flight.
    fn flushing(&self) -> bool {
        !self.flushes.borrow().is_empty()
    }

    /// Whether a hold is on at `now` (noting when one ended).
    fn stalled(&self, now: Instant) -> bool {
        match self.stalled_until.get() {
            Some(until) if now < until => true,
            Some(until) => {
                self.stalled_until.set(None);
                self.released.set(Some(until));
                false
            }
            None => false,
        }
    }

    /// A stall was seen at `now`: a hold starts, or the one on is extended to a whole hold from
    /// now.
    pub(crate) fn stall(&self, now: Instant) {
        let hold = if self.stalled(now) {
            self.hold.get()
        } else if self
            .released
            .get()
            .is_some_and(|r| now.saturating_duration_since(r) < self.hold.get())
        {
            (self.hold.get() * 2).min(self.hold_max)
        } else {
            self.hold_min
        };
        self.hold.set(hold);
        let until = self
            .stalled_until
            .get()
            .map_or(now + hold, |u| u.max(now + hold));
        self.stalled_until.set(Some(until));
    }

    fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// A Direct I/O data write starts at `now`; it is a stall if still in flight after `limit`.
    pub(crate) fn write_started(&self, now: Instant, limit: Duration) -> (Instant, u64) {
        let key = (now + limit, self.next_id());
        self.writes.borrow_mut().insert(key);
        key
    }

    /// The write `key` (from [`Self::write_started`]) ended at `now`.
    pub(crate) fn write_ended(&self, key: (Instant, u64), now: Instant) {
        self.writes.borrow_mut().remove(&key);
        if now >= key.0 {
            self.stall(now);
        }
    }

    /// An `fdatasync` starts: writes that need not be durable take the page cache until it ends.
    pub(crate) fn flush_started(&self) -> u64 {
        let id = self.next_id();
        self.flushes.borrow_mut().insert(id);
        id
    }

    /// The `fdatasync` `id` ended after `took`; `telling`: its time tells a stall (it had little
    /// to write back).
    pub(crate) fn flush_ended(&self, id: u64, took: Duration, telling: bool, now: Instant) {
        self.flushes.borrow_mut().remove(&id);
        if telling && took >= FLUSH_STALL {
            self.stall(now);
        }
    }
}

/// A Direct I/O data write in flight, ended in the watch when dropped.
struct WriteInFlight {
    watch: Rc<DeviceWatch>,
    key: (Instant, u64),
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        self.watch.write_ended(self.key, Instant::now());
    }
}

/// An `fdatasync` of the segment in flight: [`DirectWriter::page_cache_mark`] gives it, and
/// [`DirectWriter::synced_page_cache`] takes it once it completed. Dropped without that (it
/// failed), it only ends in the watch.
#[derive(Debug)]
pub(crate) struct FlushMark {
    /// The page cache writes, and bytes, made when it started.
    writes: u64,
    bytes: u64,
    /// Page cache bytes no `fdatasync` had covered when it started.
    unsynced_bytes: u64,
    started: Instant,
    id: u64,
    watch: Rc<DeviceWatch>,
}

impl Drop for FlushMark {
    fn drop(&mut self) {
        // Ended by `synced_page_cache` already when it completed (removing twice is harmless).
        self.watch.flushes.borrow_mut().remove(&self.id);
    }
}

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
    /// is nothing left to do, or an `fdatasync` is in flight (`watch`): a device stalls behind its
    /// flush, and a data write reaching a zero write stuck there would wait for it.
    async fn run(self: Rc<Self>, file: Rc<DmaFile>, watch: Rc<DeviceWatch>) {
        while self.on.get() {
            let Some(from) = self.next_chunk() else {
                break;
            };
            if watch.flushing() {
                break;
            }
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
            let in_flight = WriteInFlight {
                key: watch.write_started(Instant::now(), WRITE_STALL),
                watch: watch.clone(),
            };
            let written = file.write_rc_at(buf, from).await;
            drop(in_flight);
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
        let dev = device_of(&file).map_err(|e| Error::storage(path, e))?;
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
            page_cache_bytes: Cell::new(0),
            page_cache_bytes_synced: Cell::new(0),
            watch: DeviceWatch::of_device(dev),
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

    /// Whether a write that need not be durable goes with Direct I/O now ([`Self::write`] without
    /// `sync`), else through the page cache ([`Self::write_buffered`]): see the module's
    /// documentation.
    pub(crate) fn unsynced_goes_direct(&self) -> bool {
        self.watch.takes_direct(Instant::now())
    }

    /// Writes `len` bytes that `fill` puts in place at logical position `pos` (the segment's end),
    /// rewriting the partial block before them. Returns the logical bytes written (`len` unless the
    /// write was short).
    ///
    /// With `sync`, the write goes through the `O_DSYNC` handle: when it completes, everything
    /// written to the file so far is durable. Without, it is on the device when it completes (it
    /// outlives the process), not flushed from the device's cache.
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
        let limit = if sync { FLUSH_STALL } else { WRITE_STALL };
        let in_flight = WriteInFlight {
            key: self.watch.write_started(Instant::now(), limit),
            watch: self.watch.clone(),
        };
        let written = file.write_at(buf, start).await;
        drop(in_flight);
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
    /// Like a Direct I/O write it covers whole blocks, the partial one before the batches (`tail`)
    /// and zeros after them, copied into one buffer first: a write of part of a page whose block is
    /// on the device (written by Direct I/O, or zeros written ahead) has the kernel read that block
    /// first, on the executor thread, and a stalling device would hold the read. A zero write in
    /// flight over these blocks is waited for first.
    pub(crate) async fn write_buffered(
        &self,
        fd: std::os::fd::RawFd,
        pos: u64,
        bytes: &GroupBytes<'_>,
    ) -> std::io::Result<()> {
        use std::os::fd::FromRawFd;
        use std::os::unix::fs::FileExt;
        let align = self.alignment();
        let start = pos - pos % align;
        let tail_len = (pos - start) as usize;
        let len = bytes.len();
        let end = pos + len as u64;
        let block_end = end.next_multiple_of(align);
        let z = &self.zeros;
        z.data_end.set(z.data_end.get().max(block_end));
        // No more zeros until the next Direct I/O write: the device may stall, and a data write
        // reaching a zero write stuck in the stall would wait for it.
        z.target.set(0);
        z.settle(start, block_end).await;
        self.page_cache_writes.set(self.page_cache_writes.get() + 1);
        let written = self.page_cache_bytes.get() + len as u64;
        self.page_cache_bytes.set(written);
        let mut buf = vec![0; (block_end - start) as usize];
        buf[..tail_len].copy_from_slice(&self.tail.borrow());
        bytes.fill(&mut buf[tail_len..tail_len + len]);
        // SAFETY: `fd` is the segment's descriptor, open for the whole call; `ManuallyDrop` never
        // closes it.
        let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        if let Err(e) = file.write_all_at(&buf, start) {
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

    /// An `fdatasync` of the file starts: it covers the page cache writes made so far (see
    /// [`Self::synced_page_cache`]), and until it ends writes that need not be durable go through
    /// the page cache (the device may stall behind its flush).
    pub(crate) fn page_cache_mark(&self) -> FlushMark {
        FlushMark {
            writes: self.page_cache_writes.get(),
            bytes: self.page_cache_bytes.get(),
            unsynced_bytes: self.page_cache_bytes.get() - self.page_cache_bytes_synced.get(),
            started: Instant::now(),
            id: self.watch.flush_started(),
            watch: self.watch.clone(),
        }
    }

    /// The `fdatasync` that started at `mark` completed: its time tells the watch whether the
    /// device stalls, where it had little page cache to write back.
    pub(crate) fn synced_page_cache(&self, mark: FlushMark) {
        self.page_cache_synced
            .set(self.page_cache_synced.get().max(mark.writes));
        self.page_cache_bytes_synced
            .set(self.page_cache_bytes_synced.get().max(mark.bytes));
        let telling = mark.unsynced_bytes <= FLUSH_EVIDENCE_BYTES;
        let took = mark.started.elapsed();
        self.watch
            .flush_ended(mark.id, took, telling, Instant::now());
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
            let task = z.clone().run(self.file.clone(), self.watch.clone());
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

/// The device (`st_dev`) holding `file`.
fn device_of(file: &DmaFile) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fstat` fills `st` for an open descriptor of ours and touches nothing else.
    if unsafe { libc::fstat(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fstat` succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() }.st_dev)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;
    use crate::tail_cache::TailCache;
    use crate::{AppendOptions, Log, LogConfig};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    fn watch() -> DeviceWatch {
        DeviceWatch::new(30 * SEC, 120 * SEC)
    }

    #[test]
    fn a_steady_device_takes_direct_writes_and_a_flush_in_flight_sends_them_to_the_page_cache() {
        let w = watch();
        let t = Instant::now();
        assert!(w.takes_direct(t));
        let key = w.write_started(t, WRITE_STALL);
        assert!(w.takes_direct(t + MS), "a write in flight within its limit");
        w.write_ended(key, t + 2 * MS);
        assert!(w.takes_direct(t + 3 * MS));
        let flush = w.flush_started();
        assert!(!w.takes_direct(t + 4 * MS), "a flush in flight");
        w.flush_ended(flush, 5 * MS, true, t + 9 * MS);
        assert!(w.takes_direct(t + 10 * MS), "a quick flush is no stall");
    }

    #[test]
    fn a_slow_write_sends_writes_to_the_page_cache_for_a_hold_then_they_go_direct_again() {
        let w = watch();
        let t = Instant::now();
        let key = w.write_started(t, WRITE_STALL);
        let end = t + WRITE_STALL + MS;
        w.write_ended(key, end);
        assert!(!w.takes_direct(end));
        assert!(!w.takes_direct(end + 30 * SEC - MS));
        assert!(w.takes_direct(end + 30 * SEC));
    }

    #[test]
    fn a_write_in_flight_past_its_limit_sends_other_writes_to_the_page_cache_before_it_ends() {
        let w = watch();
        let t = Instant::now();
        let stuck = w.write_started(t, WRITE_STALL);
        assert!(w.takes_direct(t + WRITE_STALL - MS));
        assert!(!w.takes_direct(t + WRITE_STALL));
        let end = t + 500 * MS;
        w.write_ended(stuck, end);
        // The hold is a whole one from the write's end.
        assert!(!w.takes_direct(end + 30 * SEC - MS));
        assert!(w.takes_direct(end + 30 * SEC));
    }

    #[test]
    fn an_o_dsync_write_or_a_flush_tells_a_stall_only_past_the_flush_limit_with_little_write_back()
    {
        let w = watch();
        let t = Instant::now();
        let key = w.write_started(t, FLUSH_STALL);
        assert!(
            w.takes_direct(t + WRITE_STALL),
            "an O_DSYNC write has the flush's limit"
        );
        w.write_ended(key, t + FLUSH_STALL - MS);
        assert!(w.takes_direct(t + FLUSH_STALL));
        let flush = w.flush_started();
        w.flush_ended(flush, 2 * SEC, false, t + 3 * SEC);
        assert!(
            w.takes_direct(t + 3 * SEC),
            "a flush slow with write-back is no stall"
        );
        let flush = w.flush_started();
        w.flush_ended(flush, FLUSH_STALL, true, t + 4 * SEC);
        assert!(!w.takes_direct(t + 4 * SEC));
        assert!(w.takes_direct(t + 34 * SEC));
    }

    #[test]
    fn stalls_soon_after_each_return_double_the_hold_up_to_the_most_and_a_quiet_spell_resets_it() {
        let w = DeviceWatch::new(10 * SEC, 40 * SEC);
        let mut t = Instant::now();
        let mut holds = Vec::new();
        for _ in 0..4 {
            w.stall(t);
            let hold = w.hold.get();
            assert!(!w.takes_direct(t + hold - MS));
            assert!(w.takes_direct(t + hold));
            holds.push(hold.as_secs());
            // The next stall comes a second after the return to Direct I/O.
            t += hold + SEC;
        }
        assert_eq!(holds, [10, 20, 40, 40]);
        // A stall a whole hold after the return starts from the least again.
        t += 40 * SEC;
        w.stall(t);
        assert_eq!(w.hold.get(), 10 * SEC);
        // One during the hold extends it to a whole hold from then.
        w.stall(t + 5 * SEC);
        assert!(!w.takes_direct(t + 15 * SEC - MS));
        assert!(w.takes_direct(t + 15 * SEC));
    }

    #[test]
    fn a_flush_that_failed_is_no_longer_in_flight_and_tells_nothing() {
        let w = Rc::new(watch());
        let mark = FlushMark {
            writes: 0,
            bytes: 0,
            unsynced_bytes: 0,
            started: Instant::now(),
            id: w.flush_started(),
            watch: w.clone(),
        };
        assert!(!w.takes_direct(Instant::now()));
        drop(mark);
        assert!(w.takes_direct(Instant::now() + SEC));
    }

    /// One batch of one record of `value_len` bytes of `seed`.
    fn one_batch(value_len: usize, seed: u8) -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        b.push(1_000, None, Some(&vec![seed; value_len]), &[]);
        b.finish(0)
    }

    #[test]
    fn a_page_cache_write_covers_whole_blocks_and_finish_cuts_the_padding() {
        crate::testing::run(|| async {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("segment.log");
            std::fs::File::create(&path).unwrap();
            let options = DirectOptions {
                segment_bytes: 1 << 20,
                zero_ahead: false,
            };
            let Some(mut w) = DirectWriter::open(&path, options).await.unwrap() else {
                crate::testing::skipped(
                    "a_page_cache_write_covers_whole_blocks_and_finish_cuts_the_padding",
                    "page cache writes of a Direct I/O segment",
                    "the temporary directory's file system refuses O_DIRECT",
                );
                return;
            };
            w.set_tail(Vec::new(), 0);
            let fd = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let mut expected = Vec::new();
            for (i, value_len) in [900, 5000, 10].into_iter().enumerate() {
                let blob = one_batch(value_len, i as u8);
                let mut headers = [crate::batch::BatchHeader::parse(&blob).unwrap()];
                headers[0].base_offset = i as i64;
                let group = GroupBytes {
                    parts: vec![(&blob, &headers)],
                    stamp: None,
                };
                let pos = expected.len() as u64;
                w.write_buffered(fd.as_raw_fd(), pos, &group).await.unwrap();
                let at = expected.len();
                expected.resize(at + group.len(), 0);
                group.fill(&mut expected[at..]);
                let on_disk = std::fs::read(&path).unwrap();
                assert_eq!(on_disk.len() % 4096, 0, "whole blocks");
                assert_eq!(on_disk.len(), expected.len().next_multiple_of(4096));
                assert_eq!(on_disk[..expected.len()], expected[..]);
                assert!(
                    on_disk[expected.len()..].iter().all(|&b| b == 0),
                    "zeros after"
                );
            }
            w.finish(expected.len() as u64).await.unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), expected);
        });
    }

    /// Whether each 4 KiB page of `path` is in the page cache (`mincore` over a mapping of it).
    fn resident_pages(path: &Path) -> Vec<bool> {
        let f = std::fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a new read-only shared mapping of the file, which nothing reads through and
        // which is unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let mut resident = vec![0u8; len.div_ceil(4096)];
        // SAFETY: `resident` has a byte for each page of the mapping, live until the munmap.
        let r = unsafe { libc::mincore(addr, len, resident.as_mut_ptr()) };
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(addr, len) };
        assert_eq!(r, 0, "mincore");
        resident.iter().map(|&b| b & 1 != 0).collect()
    }

    /// Whether the file system of `dir` takes `O_DIRECT` (else the log writes through the page
    /// cache, whatever the watch says).
    fn takes_o_direct(dir: &Path) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("o_direct.probe");
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        let _ = std::fs::remove_file(&path);
        opened.is_ok()
    }

    /// Appends `n` batches of uneven sizes (writes end inside blocks), not durable, and adds the
    /// bytes the log must hold to `expected`.
    async fn fill(log: &Log, n: usize, seed: u64, expected: &mut Vec<u8>) {
        for i in 0..n {
            let mut b = BatchBuilder::new(1_700_000_000_000);
            let value = vec![(seed + i as u64) as u8; 300 + (i * 397) % 1500];
            b.push(1_700_000_000_000, None, Some(&value), &[]);
            let blob = bytes::Bytes::from(b.finish(0));
            let opts = AppendOptions { durable: false };
            let r = log.append(blob.clone(), opts).await.unwrap();
            let mut v = blob.to_vec();
            crate::batch::set_base_offset(&mut v, r.base_offset);
            expected.extend(v);
        }
    }

    async fn read_all(log: &Log) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = log.log_start_offset();
        while at < log.high_watermark() {
            let r = log.read(at, 64 << 10, true).await.unwrap();
            out.extend(r.records.to_vec());
            at = r.records.last_offset + 1;
        }
        out
    }

    #[test]
    fn unsynced_appends_go_direct_then_to_the_page_cache_during_a_hold_and_all_read_back_after_a_crash(
    ) {
        crate::testing::run(|| async {
            let dir = tempfile::tempdir().unwrap();
            if !takes_o_direct(dir.path()) {
                crate::testing::skipped(
                    "unsynced_appends_go_direct_then_to_the_page_cache_during_a_hold_and_all_read_back_after_a_crash",
                    "Direct I/O writes",
                    "the temporary directory's file system refuses O_DIRECT",
                );
                return;
            }
            let config = LogConfig {
                direct_io: true,
                segment_bytes: 6 << 20,
                index_interval_bytes: 512,
                flush_interval: None,
                retention_age: None,
                ..LogConfig::default()
            };
            let dev = std::fs::metadata(dir.path()).unwrap().dev();
            let w = Rc::new(DeviceWatch::new(2 * SEC, 4 * SEC));
            DeviceWatch::install(dev, w.clone());
            let cache = || Rc::new(TailCache::new(0, 4096));
            let log = Log::open(dir.path(), config.clone(), cache())
                .await
                .unwrap();
            let segment = dir.path().join(format!("{:020}.log", 0));
            let mut expected = Vec::new();
            fill(&log, 20, 1, &mut expected).await;
            let direct_end = expected.len();
            w.stall(Instant::now());
            fill(&log, 20, 2, &mut expected).await;
            let cached_end = expected.len();
            glommio::timer::sleep(2 * SEC + 100 * MS).await;
            fill(&log, 20, 3, &mut expected).await;
            let pages = resident_pages(&segment);
            let page = |at: usize| at / 4096;
            assert!(
                pages[..page(direct_end)].iter().all(|&r| !r),
                "before the stall: Direct I/O"
            );
            assert!(
                pages[page(direct_end)..page(cached_end)].iter().all(|&r| r),
                "during the hold: the page cache"
            );
            assert!(
                pages[page(cached_end)..=page(expected.len())]
                    .iter()
                    .all(|&r| !r),
                "after the hold: Direct I/O again (its first write dropped the partial page)"
            );
            assert_eq!(read_all(&log).await, expected);
            drop(log); // the process died: no seal, the padding stays
            let log = Log::open(dir.path(), config.clone(), cache())
                .await
                .unwrap();
            assert_eq!(read_all(&log).await, expected, "after a crash");
            fill(&log, 5, 4, &mut expected).await;
            log.close().await.unwrap();
            let log = Log::open(dir.path(), config, cache()).await.unwrap();
            assert_eq!(read_all(&log).await, expected, "after a close");
            log.close().await.unwrap();
        });
    }
}
