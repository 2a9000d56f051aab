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
//! Reads keep going through the page cache (`BufferedFile` on the same file): the kernel keeps the two
//! coherent, and the tail cache serves what was just written anyway.

use crate::error::{Error, Result};
use glommio::io::{DmaFile, OpenOptions};
use std::cell::{Cell, RefCell};
use std::path::Path;

/// The write handle of an active segment written with Direct I/O.
#[derive(Debug)]
pub(crate) struct DirectWriter {
    file: DmaFile,
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
}

/// How far ahead of the logical end the file is allocated, in one `fallocate`.
pub(crate) const ALLOCATE_STEP: u64 = 8 << 20;

impl DirectWriter {
    /// Opens `path` for Direct I/O writes, with no partial block yet (see [`Self::set_tail`]).
    /// Read access too: glommio probes the device with a read at the first open (the log has run
    /// [`probe_device`] on its directory before).
    /// `None` when the file system does not take `O_DIRECT` (the caller writes buffered).
    /// `segment_bytes` caps the allocation step: a small segment is not padded to megabytes, which
    /// every recovery scan would then read back.
    pub(crate) async fn open(path: &Path, segment_bytes: u64) -> Result<Option<Self>> {
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
        Ok(Some(Self {
            file,
            dsync: RefCell::new(None),
            path: path.to_path_buf(),
            tail: RefCell::new(Vec::new()),
            allocated: Cell::new(0),
            allocate_ahead: Cell::new(true),
            allocate_step: segment_bytes.next_multiple_of(64 << 10).min(ALLOCATE_STEP),
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
        if end > self.allocated.get() && self.allocate_ahead.get() {
            let to = end.next_multiple_of(self.allocate_step);
            match self.file.pre_allocate(to, false).await {
                Ok(()) => self.allocated.set(to),
                // Only an optimisation: a nearly full disk may still take the write itself (and
                // if not, the write says why); a file system without `fallocate` never will.
                Err(glommio::GlommioError::IoError(e))
                    if e.kind() == std::io::ErrorKind::Unsupported =>
                {
                    self.allocate_ahead.set(false)
                }
                Err(_) => {}
            }
        }
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
        let file = dsync.as_deref().unwrap_or(&self.file);
        let n = file.write_at(buf, start).await.inspect_err(|_| {
            // The caller cuts the file back to `pos`: allocate again next time.
            self.allocated.set(0);
        })?;
        if n < padded {
            self.allocated.set(0);
            return Ok(n.saturating_sub(tail_len).min(len));
        }
        *self.tail.borrow_mut() = new_tail;
        Ok(len)
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
        self.file
            .truncate(size)
            .await
            .map_err(|e| Error::storage(&self.path, e))
    }
}

thread_local! {
    /// Devices (`st_dev`) whose I/O polling support glommio has probed on this thread.
    static PROBED: RefCell<std::collections::HashSet<u64>> = RefCell::default();
}

/// Makes sure glommio's first Direct I/O open on this thread for `device` (the one holding `dir`,
/// a log's directory) probes a file with data in it; the log calls it at open, before any Direct
/// I/O open there. glommio 0.9 decides once per device and thread whether to use its polled
/// ring by reading the first file opened there; the read of an empty file (a segment just created)
/// succeeds without reaching the device, so polling is wrongly taken as supported, and every later
/// Direct I/O read then fails with `EOPNOTSUPP` on devices without poll queues. The probe file is
/// 4 KiB in `dir`, removed at once. If it cannot be made the device is probed again at the next
/// log's open (a failing directory fails its writes anyway).
pub(crate) async fn probe_device(dir: &Path, dev: u64) {
    if PROBED.with(|p| p.borrow().contains(&dev)) {
        return;
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
        }
        Err(e) => log::debug!("direct I/O probe in {}: {e}", dir.display()),
    }
}
