//! Segments written with Direct I/O against a real file system (durable appends, `O_DSYNC`) and
//! through the page cache (the other appends of the same logs): the files hold exactly what a log
//! written only through the page cache holds, space allocated ahead and the zero padding of the last
//! block are cut when a segment is sealed or the log closes, and after a crash recovery treats them
//! as padding: nothing is lost, nothing is logged as damage, no segment is set aside. Checks the
//! file system cannot support (FIEMAP, `O_DIRECT`) print a `SKIPPED` line.

mod common;

use common::*;
use shards::testing::skipped;
use shards::{AppendOptions, Log, LogConfig};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const NON_DURABLE: AppendOptions = AppendOptions { durable: false };
const DURABLE: AppendOptions = AppendOptions { durable: true };

/// Which appends of a fill are durable (by index).
type Durability = fn(usize) -> bool;

/// Every append durable: all of them written with Direct I/O.
fn all_durable(_: usize) -> bool {
    true
}

/// Durable and not in turns of uneven length: Direct I/O and page cache writes of one file mixed.
fn mixed(i: usize) -> bool {
    i % 5 < 2
}

fn config(direct_io: bool) -> LogConfig {
    LogConfig {
        direct_io,
        ..small_config()
    }
}

/// Appends `n` batches of uneven sizes (so writes end inside blocks), the `i`th durable if
/// `durable(i)`, and returns the bytes the log must hold.
async fn fill(log: &Log, n: usize, seed: u64, durable: Durability) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let b = batch(1 + i % 3, 30 + (i * 53) % 700, seed + i as u64);
        let opts = if durable(i) { DURABLE } else { NON_DURABLE };
        let r = log.append(b.clone(), opts).await.unwrap();
        out.extend(with_offset(&b, r.base_offset));
    }
    out
}

async fn read_all(log: &Log) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    while at < log.high_watermark() {
        let r = log.read(at, 5000, true).await.unwrap();
        out.extend(r.records.to_vec());
        at = r.records.last_offset + 1;
    }
    out
}

/// The directory's files (name, bytes), sorted by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v.into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// The active segment's file, and its logical size: the log's bytes less the sealed segments'.
fn active_segment(dir: &Path, log: &Log) -> (PathBuf, u64) {
    let bases = log.segment_base_offsets();
    let file = |b: &i64| dir.join(format!("{b:020}.log"));
    let sealed: u64 = bases[..bases.len() - 1].iter().map(|b| len(&file(b))).sum();
    (file(bases.last().unwrap()), log.stats().size_bytes - sealed)
}

/// Direct I/O with segments allocated ahead in steps big enough for zeros to be written ahead.
fn big_segments(zero_ahead: bool) -> LogConfig {
    LogConfig {
        direct_io: true,
        zero_ahead,
        segment_bytes: 6 << 20,
        ..small_config()
    }
}

#[test]
fn direct_and_buffered_logs_write_the_same_files() {
    run(|| async {
        let dirs = [(); 3].map(|()| tempfile::tempdir().unwrap());
        let [direct, mixed_dir, buffered] = &dirs;
        let mut logs = Vec::new();
        let runs: [(&Path, bool, Durability); 3] = [
            (direct.path(), true, all_durable),
            (mixed_dir.path(), true, mixed),
            (buffered.path(), false, all_durable),
        ];
        for (dir, on, durable) in runs {
            let log = Log::open(dir, config(on), no_cache()).await.unwrap();
            let expected = fill(&log, 60, 7, durable).await;
            assert!(log.segment_base_offsets().len() > 3, "the test rolls");
            assert_eq!(read_all(&log).await, expected, "direct_io={on}");
            logs.push((log, expected));
        }
        let active = |dir: &Path| {
            let (name, _) = files(dir)
                .into_iter()
                .rfind(|(n, _)| n.ends_with(".log"))
                .unwrap();
            dir.join(name)
        };
        // While open, the direct log's active file is allocated ahead of its batches.
        assert!(len(&active(direct.path())) > len(&active(buffered.path())));
        for (log, _) in logs {
            log.close().await.unwrap();
        }
        let b = files(buffered.path());
        for a in [files(direct.path()), files(mixed_dir.path())] {
            assert_eq!(
                a.iter().map(|(n, d)| (n, d.len())).collect::<Vec<_>>(),
                b.iter().map(|(n, d)| (n, d.len())).collect::<Vec<_>>(),
                "same files, same lengths"
            );
            assert!(a == b, "same bytes in every file");
        }
    });
}

#[test]
fn after_a_crash_padding_and_space_allocated_ahead_are_cut_not_taken_for_damage() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), config(true), cache()).await.unwrap();
        let expected = fill(&log, 45, 11, all_durable).await;
        let hw = log.high_watermark();
        let bases = log.segment_base_offsets();
        let (active, logical) = active_segment(dir.path(), &log);
        assert!(len(&active) > logical, "allocated ahead while open");
        // Rolled segments are sealed in the background: let the middle one's finish (its index
        // file written) before the crash, so that the crash below, not timing, removes it.
        let middle = bases[bases.len() / 2];
        let middle_index = dir.path().join(format!("{middle:020}.index"));
        wait_until(
            std::time::Duration::from_secs(20),
            std::time::Duration::from_millis(10),
            "the rolled segment is not sealed",
            || middle_index.exists(),
        )
        .await;
        drop(log); // the process died: no seal of the active segment, no truncation

        // A sealed-looking older segment that died before its seal: padding and no index file.
        let middle_log = dir.path().join(format!("{middle:020}.log"));
        let middle_len = len(&middle_log);
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&middle_log)
            .unwrap();
        f.set_len(middle_len + 3000).unwrap();
        std::fs::remove_file(&middle_index).unwrap();

        let log = Log::open(dir.path(), config(true), no_cache())
            .await
            .unwrap();
        assert_eq!(log.high_watermark(), hw, "nothing lost");
        assert_eq!(log.segment_base_offsets(), bases, "no segment set aside");
        assert_eq!(read_all(&log).await, expected);
        assert_eq!(len(&middle_log), middle_len, "the padding is cut");
        assert_eq!(
            len(&active),
            logical,
            "the active segment is cut to its batches"
        );
        assert!(
            !files(dir.path()).iter().any(|(n, _)| n.contains("corrupt")),
            "nothing is set aside"
        );
        // Appends go on from the partial block recovery read back.
        let more = fill(&log, 10, 99, mixed).await;
        log.close().await.unwrap();
        let log = Log::open(dir.path(), config(true), no_cache())
            .await
            .unwrap();
        assert_eq!(read_all(&log).await, [expected, more].concat());
        log.close().await.unwrap();
    });
}

/// Reads from disk go through the read-ahead windows (big sequential reads start them, reads
/// inside them top them up): whatever the order of the reads, each returns exactly the batches
/// written, and a reader that jumps around gets the same bytes as one that streams.
#[test]
fn sequential_and_scattered_reads_from_disk_return_exactly_the_batches() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_bytes: 64 << 20,
            ..config(true)
        };
        let log = Log::open(dir.path(), config.clone(), no_cache())
            .await
            .unwrap();
        // About 20 MiB in batches of uneven sizes, with each batch's offsets and bytes.
        let mut batches = Vec::new();
        for i in 0..1500u64 {
            let b = batch(1 + (i % 16) as usize, 200 + (i as usize * 97) % 1500, i);
            let r = log.append(b.clone(), NON_DURABLE).await.unwrap();
            batches.push((r.base_offset, r.last_offset, with_offset(&b, r.base_offset)));
        }
        log.close().await.unwrap();
        let log = Log::open(dir.path(), config, no_cache()).await.unwrap();
        // Which I/O mode the reads run in, seen from the page cache: the segments' pages are
        // dropped from it, and Direct I/O reads leave them out, buffered reads bring them back.
        let direct = takes_o_direct(dir.path());
        let segments: Vec<PathBuf> = files(dir.path())
            .into_iter()
            .filter(|(n, _)| n.ends_with(".log"))
            .map(|(n, _)| dir.path().join(n))
            .collect();
        segments.iter().for_each(|p| evict(p));
        let expected_from = |offset: i64, len: usize| -> Vec<u8> {
            let first = batches.iter().position(|b| b.1 >= offset).unwrap();
            let all: Vec<u8> = batches[first..].iter().flat_map(|b| b.2.clone()).collect();
            all[..len].to_vec()
        };
        // A stream of 1 MiB reads, as a catch-up consumer does.
        let mut at = 0;
        let mut streamed = Vec::new();
        while at < log.high_watermark() {
            let r = log.read(at, 1 << 20, true).await.unwrap();
            assert!(!r.records.is_empty());
            streamed.extend(r.records.to_vec());
            at = r.records.last_offset + 1;
        }
        let all: Vec<u8> = batches.iter().flat_map(|b| b.2.clone()).collect();
        assert!(streamed == all, "the stream returns the log");
        let total: u64 = segments.iter().map(|p| len(p)).sum();
        let cached: u64 = segments.iter().map(|p| cached_bytes(p)).sum();
        if direct {
            assert!(
                cached < total / 10,
                "Direct I/O reads: {cached} of {total} bytes of the segments in the page cache"
            );
        } else {
            skipped(
                "sequential_and_scattered_reads_from_disk_return_exactly_the_batches",
                "Direct I/O reads",
                "the file system refuses O_DIRECT; checked buffered reads instead",
            );
            assert!(
                cached > total / 2,
                "buffered reads: {cached} of {total} bytes of the segments in the page cache"
            );
        }
        // Scattered reads, big and small, some inside windows read ahead, some not.
        for (i, &(offset, budget)) in [
            (5000, 1 << 20),
            (5100, 64 << 10),
            (20, 3000),
            (9000, 2 << 20),
            (9001, 100),
            (1, 1 << 20),
        ]
        .iter()
        .enumerate()
        {
            let offset = offset.min(log.high_watermark() - 1);
            let r = log.read(offset, budget, true).await.unwrap();
            let got = r.records.to_vec();
            assert!(
                got == expected_from(offset, got.len()),
                "read {i} at {offset}"
            );
        }
        log.close().await.unwrap();
    });
}

/// A durable append is written `O_DSYNC` (durable when the write completes), but its
/// acknowledgement still waits for everything below it: after a roll, for the old segment's seal
/// (its fsync and index file), which runs in the background.
#[test]
fn durable_appends_after_a_roll_wait_for_the_old_segment_to_be_sealed() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), config(true), no_cache())
            .await
            .unwrap();
        let durable = AppendOptions { durable: true };
        let mut rolls = 0;
        for i in 0..60u64 {
            let before = log.segment_base_offsets().len();
            let r = log.append(batch(2, 300, i), durable).await.unwrap();
            assert!(
                log.durable_offset() >= r.high_watermark,
                "acknowledged before durable"
            );
            let bases = log.segment_base_offsets();
            rolls += bases.len() - before;
            for b in &bases[..bases.len() - 1] {
                let index = dir.path().join(format!("{b:020}.index"));
                assert!(index.exists(), "acknowledged before segment {b} was sealed");
            }
        }
        assert!(rolls >= 3, "the test rolls ({rolls})");
        // One sync per durable write, none of them a separate fsync of the active segment.
        let s = log.stats();
        assert!(s.fsyncs >= s.append_writes, "{s:?}");
        log.close().await.unwrap();
    });
}

/// Whether the file system of `dir` takes `O_DIRECT`, as the log asks it to (`EINVAL`: it does
/// not, and the log writes and reads through the page cache).
fn takes_o_direct(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("o_direct.probe");
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let _ = std::fs::remove_file(&path);
    match opened {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
        Err(e) => panic!("cannot open {}: {e}", path.display()),
    }
}

/// Drops `path`'s clean pages from the page cache.
fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: an advice on an open file descriptor; it touches no memory of ours.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise on {}", path.display());
}

/// Bytes of `path` in the page cache (`mincore` over a mapping of the whole file).
fn cached_bytes(path: &Path) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let len = len(path) as usize;
    if len == 0 {
        return 0;
    }
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: a new read-only shared mapping of the file, which nothing reads through and which
    // is unmapped below.
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
    assert_ne!(addr, libc::MAP_FAILED, "mmap {}", path.display());
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: `resident` has one byte for each page of the mapping, which is live until munmap.
    let r = unsafe { libc::mincore(addr, len, resident.as_mut_ptr()) };
    let error = std::io::Error::last_os_error();
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(r, 0, "mincore {}: {error}", path.display());
    resident.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64
}

/// The extents of `path` the file system reports as allocated but unwritten (FIEMAP), as
/// `(start, end)` byte ranges; `None` where FIEMAP is not supported.
fn unwritten_extents(path: &Path) -> Option<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
    const EXTENTS: usize = 512;
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped: u32,
        count: u32,
        reserved: u32,
        extents: [Extent; EXTENTS],
    }
    let f = std::fs::File::open(path).unwrap();
    let mut m = Box::new(Fiemap {
        start: 0,
        length: u64::MAX,
        flags: FIEMAP_FLAG_SYNC,
        mapped: 0,
        count: EXTENTS as u32,
        reserved: 0,
        extents: [Extent::default(); EXTENTS],
    });
    // SAFETY: FS_IOC_FIEMAP reads and fills a `struct fiemap` followed by `count` extents, which
    // `m` is, laid out as the kernel's (repr(C), the same field sizes).
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, &mut *m as *mut Fiemap) } != 0 {
        return None;
    }
    Some(
        m.extents[..m.mapped as usize]
            .iter()
            .filter(|e| e.flags & FIEMAP_EXTENT_UNWRITTEN != 0)
            .map(|e| (e.logical, e.logical + e.length))
            .collect(),
    )
}

/// With segments allocated ahead in big steps, zeros are written ahead of the data in the
/// background, so that appends land in written blocks (on ext4, a Direct I/O write into unwritten
/// space goes to a worker thread). The log holds exactly its batches across rolls, a crash and a
/// close, and the zeros never outrun what was allocated nor land on data.
#[test]
fn zeros_written_ahead_of_the_data_change_nothing_but_the_extents() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = big_segments(true);
        let log = Log::open(dir.path(), config.clone(), cache())
            .await
            .unwrap();
        // Batches of 2-20 KiB: about 9 MiB, so the log rolls once.
        let mut expected = Vec::new();
        for i in 0..900 {
            let b = batch(1 + i % 4, 2_000 + (i * 977) % 3_000, i as u64);
            let r = log.append(b.clone(), DURABLE).await.unwrap();
            expected.extend(with_offset(&b, r.base_offset));
        }
        assert!(log.segment_base_offsets().len() >= 2, "the test rolls");
        let (active, size) = active_segment(dir.path(), &log);
        let allocated = len(&active);
        assert!(allocated > size, "allocated ahead");
        // The zero writes run in the background, up to 4 MiB past the data (within what is
        // allocated), 256 KiB at a time, and stop short of a chunk past that: wait (bounded) until
        // the last one has landed, so that none is in flight when the log is dropped below.
        let last_chunk_from = (size + (4 << 20)).min(allocated) - (256 << 10);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let Some(unwritten) = unwritten_extents(&active) else {
                skipped(
                    "zeros_written_ahead_of_the_data_change_nothing_but_the_extents",
                    "the unwritten extents",
                    "the file system does not answer FIEMAP; the data and the cut still checked",
                );
                glommio::timer::sleep(std::time::Duration::from_secs(1)).await;
                break;
            };
            let written_to = unwritten.iter().map(|e| e.0).min().unwrap_or(allocated);
            if written_to > last_chunk_from {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "unwritten from {written_to}, data ends at {size}: {unwritten:?}"
            );
            glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(read_all(&log).await, expected);
        drop(log); // a crash: nothing sealed, the zeros stay
        let log = Log::open(dir.path(), config.clone(), no_cache())
            .await
            .unwrap();
        assert_eq!(read_all(&log).await, expected, "after the crash");
        assert_eq!(len(&active), size, "the zeros are cut like padding");
        assert!(
            !files(dir.path()).iter().any(|(n, _)| n.contains("corrupt")),
            "nothing is set aside"
        );
        for i in 0..200 {
            let b = batch(2, 4_000 + i * 7, 5_000 + i as u64);
            let r = log.append(b.clone(), DURABLE).await.unwrap();
            expected.extend(with_offset(&b, r.base_offset));
        }
        log.close().await.unwrap();
        let log = Log::open(dir.path(), config, no_cache()).await.unwrap();
        assert_eq!(read_all(&log).await, expected, "after a close");
        log.close().await.unwrap();
    });
}

/// `zero_ahead: false` (`--direct-io-zero-ahead false`): nothing is written past the data; the
/// space allocated ahead stays unwritten.
#[test]
fn without_zero_ahead_the_space_allocated_ahead_stays_unwritten() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), big_segments(false), cache())
            .await
            .unwrap();
        for i in 0..100 {
            log.append(batch(2, 3_000, i), DURABLE).await.unwrap();
        }
        let (active, size) = active_segment(dir.path(), &log);
        glommio::timer::sleep(std::time::Duration::from_millis(200)).await;
        match unwritten_extents(&active) {
            Some(unwritten) => {
                let from = unwritten.iter().map(|e| e.0).min().unwrap_or(u64::MAX);
                assert!(
                    from < size + 4096,
                    "unwritten from {from}, data ends at {size}: {unwritten:?}"
                );
            }
            None => skipped(
                "without_zero_ahead_the_space_allocated_ahead_stays_unwritten",
                "the whole test",
                "the file system does not answer FIEMAP",
            ),
        }
        log.close().await.unwrap();
    });
}
