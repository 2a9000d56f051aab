//! The disk baseline (`--disk-baseline`): what the embedded broker's device takes, measured in the
//! same run, beside what the broker ingested.
//!
//! One thread per partition (at most [`MAX_WRITERS`]) writes a file of its own in the broker's
//! data directory, sequentially, with Direct I/O writes of [`WRITE_BYTES`] into space allocated
//! ahead (the pattern of shoal's appends at their best: no page cache, no small writes), for
//! [`PHASE`]. That is the device's
//! limit for the run's data, as the raw TCP baseline is the wire's. Then the same again while
//! another thread `fdatasync`s each file every flush interval (the broker's `--flush-ms`), as the
//! broker's flush does: on a device whose cache flushes stall the writes queued behind them (a VM
//! disk whose host writes its cache back on each flush), this shows the stall that no broker
//! writing to that device can hide from acks=1 producers, beside the broker's publish latency.

use super::stats::{new_histogram, record, Latency};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes per write: big enough that the device, not the system call, sets the rate.
pub const WRITE_BYTES: usize = 1 << 20;
/// How long each phase writes in a bench run.
pub const PHASE: Duration = Duration::from_secs(3);
/// Each file is allocated ahead in steps of this, and wraps (is overwritten) past `FILE_BYTES`:
/// at most `MAX_WRITERS` GiB of the disk is taken, for the length of the baseline.
const ALLOCATE_STEP: u64 = 16 << 20;
const FILE_BYTES: u64 = 1 << 30;
/// Writers at most, whatever the partitions: a few keep a device busy, and each costs a file.
pub const MAX_WRITERS: usize = 16;

/// The writers for a run of `partitions`: one each, within 1..=[`MAX_WRITERS`].
pub fn writers_for(partitions: usize) -> usize {
    partitions.clamp(1, MAX_WRITERS)
}
/// Direct I/O wants buffers, offsets and lengths aligned to the logical block size; 4 KiB covers it.
const ALIGN: usize = 4096;

/// The device's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DiskBaseline {
    pub dir: PathBuf,
    pub writers: usize,
    pub write_bytes: usize,
    /// Writes alone.
    pub plain: Phase,
    /// Writes while each file is fdatasynced every `flush_interval_ms` (none without a flush
    /// interval).
    pub flushed: Option<Flushed>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub mb_per_s: f64,
    pub write_latency_us: Option<Latency>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Flushed {
    pub flush_interval_ms: u64,
    pub writes: Phase,
    pub fdatasync_latency_us: Option<Latency>,
}

/// A zero-initialised, `ALIGN`-aligned buffer of `len` bytes (`len` a multiple of `ALIGN`).
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("a valid layout");
        // SAFETY: the layout has a non-zero size (WRITE_BYTES).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Aligned { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` initialised bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Measures the device under `dir`; `None` (and a line saying why) where its file system does not
/// take Direct I/O (tmpfs, some overlays).
pub fn measure(
    dir: &Path,
    writers: usize,
    flush_interval: Option<Duration>,
    phase_length: Duration,
) -> io::Result<Option<DiskBaseline>> {
    let writers = writers_for(writers);
    let mut files = Vec::new();
    let mut paths = Vec::new();
    for i in 0..writers {
        let path = dir.join(format!("disk-baseline-{}-{i}", std::process::id()));
        let opened = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        match opened {
            Ok(f) => {
                files.push(Arc::new(f));
                paths.push(path);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                println!(
                    "disk baseline    skipped: {} does not take Direct I/O (O_DIRECT: {e})",
                    dir.display()
                );
                remove(&paths);
                return Ok(None);
            }
            Err(e) => {
                remove(&paths);
                return Err(io::Error::new(
                    e.kind(),
                    format!("disk baseline: {}: {e}", path.display()),
                ));
            }
        }
    }
    let result = (|| {
        let plain = phase(&files, None, phase_length)?.0;
        let flushed = match flush_interval.filter(|i| !i.is_zero()) {
            Some(interval) => {
                let (writes, syncs) = phase(&files, Some(interval), phase_length)?;
                Some(Flushed {
                    flush_interval_ms: interval.as_millis() as u64,
                    writes,
                    fdatasync_latency_us: syncs.as_ref().and_then(Latency::of),
                })
            }
            None => None,
        };
        Ok(DiskBaseline {
            dir: dir.to_path_buf(),
            writers,
            write_bytes: WRITE_BYTES,
            plain,
            flushed,
        })
    })();
    remove(&paths);
    result.map(Some)
}

fn remove(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// One phase: every file written by a thread of its own for `length`, and with `flush` a further
/// thread fdatasyncing each file that often. The write rate, the writes' latencies and the
/// fdatasyncs' latencies.
fn phase(
    files: &[Arc<File>],
    flush: Option<Duration>,
    length: Duration,
) -> io::Result<(Phase, Option<Histogram<u64>>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = files
        .iter()
        .map(|f| {
            let (f, stop) = (f.clone(), stop.clone());
            std::thread::spawn(move || write_until(&f, &stop))
        })
        .collect();
    let syncer = flush.map(|interval| {
        let (files, stop) = (files.to_vec(), stop.clone());
        std::thread::spawn(move || sync_every(&files, interval, &stop))
    });
    std::thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let mut latencies = new_histogram();
    let mut bytes = 0u64;
    let mut failure = None;
    for t in threads {
        match t.join().expect("a disk baseline writer does not panic") {
            Ok((h, written)) => {
                latencies.add(&h).expect("histograms of the same bounds");
                bytes += written;
            }
            Err(e) => failure = Some(e),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let syncs = match syncer.map(|t| t.join().expect("the syncer does not panic")) {
        Some(Ok(h)) => Some(h),
        Some(Err(e)) => return Err(e),
        None => None,
    };
    if let Some(e) = failure {
        return Err(e);
    }
    Ok((
        Phase {
            mb_per_s: bytes as f64 / secs / 1e6,
            write_latency_us: Latency::of(&latencies),
        },
        syncs,
    ))
}

/// Writes `f` sequentially from offset 0 until `stop`: the latencies and the bytes written.
fn write_until(f: &File, stop: &AtomicBool) -> io::Result<(Histogram<u64>, u64)> {
    let mut buf = Aligned::new(WRITE_BYTES);
    buf.bytes().fill(0x5a);
    let mut h = new_histogram();
    let (mut at, mut allocated, mut written) = (0u64, 0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        if at + WRITE_BYTES as u64 > allocated && allocated < FILE_BYTES {
            // SAFETY: fallocate(2) on an open descriptor of ours.
            let r = unsafe {
                libc::fallocate(
                    f.as_raw_fd(),
                    0,
                    allocated as libc::off_t,
                    ALLOCATE_STEP as libc::off_t,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            allocated += ALLOCATE_STEP;
        }
        let t = Instant::now();
        f.write_all_at(buf.bytes(), at)?;
        record(&mut h, t.elapsed().as_micros() as u64);
        written += WRITE_BYTES as u64;
        at = (at + WRITE_BYTES as u64) % FILE_BYTES;
    }
    Ok((h, written))
}

/// fdatasyncs each file every `interval` until `stop`: their latencies.
fn sync_every(
    files: &[Arc<File>],
    interval: Duration,
    stop: &AtomicBool,
) -> io::Result<Histogram<u64>> {
    let mut h = new_histogram();
    let mut next = Instant::now() + interval;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(10)));
            continue;
        }
        next += interval;
        for f in files {
            let t = Instant::now();
            f.sync_data()?;
            record(&mut h, t.elapsed().as_micros() as u64);
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_per_partition_within_bounds() {
        assert_eq!(writers_for(0), 1);
        assert_eq!(writers_for(4), 4);
        assert_eq!(writers_for(1024), MAX_WRITERS);
    }

    #[test]
    fn measures_a_real_file_system_or_says_it_cannot() {
        // A directory in the checkout, on the file system the project builds on (tmpfs is also
        // fine: then the baseline says it is skipped).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let flush = Some(Duration::from_millis(200));
        let Some(b) = measure(dir.path(), 2, flush, Duration::from_millis(700)).unwrap() else {
            return;
        };
        assert_eq!(b.writers, 2);
        assert!(b.plain.mb_per_s > 0.0);
        let w = b.plain.write_latency_us.expect("writes were timed");
        assert!(w.samples > 0 && w.p50 <= w.max);
        let f = b.flushed.expect("a flush interval was given");
        assert_eq!(f.flush_interval_ms, 200);
        assert!(f.fdatasync_latency_us.expect("fdatasyncs ran").samples >= 2);
        // Nothing is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
