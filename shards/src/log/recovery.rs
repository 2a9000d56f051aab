//! Recovery at open: segment files are listed, sealed ones with an intact index trusted, the rest
//! scanned and cut at the first bad batch; damaged files are set aside, never deleted. The open
//! transactions are rebuilt on the way: a trusted segment's transaction index says which were open
//! at its end, and the transactional batches of each scanned segment are replayed from there, which
//! also rebuilds that segment's aborted index.

use super::*;
use crate::log::open_files::{self, Handles};
use crate::log::segment::ScanFrom;
use crate::transactions::{txn_index_file_name, SegmentTxns};

/// A segment file found at open.
#[derive(Debug)]
pub(super) struct Found {
    base_offset: i64,
    path: PathBuf,
    len: u64,
    mtime_ms: i64,
    index: Option<(SparseIndex, SegmentMeta)>,
    /// Its transaction index: empty without a file, `None` if the file is damaged or another
    /// segment's (the segment is then scanned).
    txns: Option<SegmentTxns>,
}

/// Lists `<base:020>.log` files, oldest first, with their index files if intact, and the device
/// (`st_dev`) holding the directory (blocking; run off the executor thread).
pub(super) fn list_segments(dir: &Path) -> std::io::Result<(Vec<Found>, u64)> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(dir)?.dev();
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
        // Written with the index, for the same size (the whole segment, or a prefix of the
        // active one).
        let size = index.as_ref().map_or(md.len(), |(_, m)| m.size);
        let txns = match std::fs::read(dir.join(txn_index_file_name(base_offset))) {
            Ok(b) => SegmentTxns::decode(&b, base_offset, size),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(SegmentTxns::default()),
            Err(_) => None,
        };
        found.push(Found {
            base_offset,
            path: entry.path(),
            len: md.len(),
            mtime_ms,
            index,
            txns,
        });
    }
    found.sort_by_key(|f| f.base_offset);
    Ok((found, device))
}

/// Opens the segments found, scanning the ones not known clean, and cuts the log at the first damage.
/// Whatever lies after the damage is renamed aside (`.corrupt`), never deleted. Returns the segments
/// and the transactions open at the end of the last one.
pub(super) async fn recover(
    dir: &Path,
    config: &LogConfig,
    found: Vec<Found>,
) -> Result<(Vec<Rc<Segment>>, OpenTransactions)> {
    let mut open = OpenTransactions::default();
    let interval = config.index_interval_bytes;
    let first_base = found.first().map_or(0, |f| f.base_offset);
    let mut segments: Vec<Rc<Segment>> = Vec::new();
    let n = found.len();
    let mut rest = found.into_iter().enumerate();
    while let Some((i, mut f)) = rest.next() {
        let is_last = i + 1 == n;
        // A segment may start after the one before it ends (compaction removed the batches
        // between), never before.
        let expected = segments.last().map(|s| s.next_offset.get());
        if expected.is_some_and(|e| f.base_offset < e) {
            log::error!(
                "{}: starts at offset {} but the log before it ends at {}; setting it and later segments aside",
                f.path.display(),
                f.base_offset,
                expected.unwrap()
            );
            set_aside(std::iter::once(f).chain(rest.map(|(_, f)| f))).await;
            break;
        }
        let (from, stale_index) = match trusted(&mut f, is_last, interval, &open) {
            Trusted::Whole(seg) => {
                open = seg.txns.borrow().open_at_end.clone();
                segments.push(Rc::new(seg));
                continue;
            }
            Trusted::From(from, stale_index) => (from, stale_index),
        };
        let file = match open_files::open_buffered(&f.path).await {
            Ok(file) => file,
            // No room in the open files budget says nothing of the file: the open fails.
            Err(e @ Error::OpenFiles { .. }) => return Err(e),
            Err(e) => {
                log::error!(
                    "{}: cannot be opened ({e}); setting it and later segments aside",
                    f.path.display()
                );
                set_aside(std::iter::once(f).chain(rest.map(|(_, f)| f))).await;
                break;
            }
        };
        let scan = Segment::scan(&file, &f.path, f.base_offset, from).await;
        let scan = match scan {
            Ok(scan) => scan,
            Err(e) => {
                log::error!(
                    "{}: cannot be read ({e}); setting it and later segments aside",
                    f.path.display()
                );
                drop(file);
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
        }
        cut_and_sync(&file, &f, scan.valid_len, damaged).await?;
        let files = Handles::with_buffered(f.path.clone(), file);
        let seg = Segment::with_meta(
            f.path,
            files,
            f.base_offset,
            scan.index,
            scan.meta,
            f.mtime_ms,
        );
        open = scan.txns.open_at_end.clone();
        *seg.txns.borrow_mut() = scan.txns;
        if stale_index {
            if let Err(e) = super::writer::write_index(&seg).await {
                log::warn!("recovery: {e}; removing the stale index");
                let _ = glommio::io::remove(seg.index_path()).await;
            }
            seg.sealed.set(!is_last);
        }
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
        segments.push(Rc::new(
            Segment::create(dir, first_base, interval, None).await?,
        ));
        sync_dir(dir).await?;
    }
    Ok((segments, open))
}

/// What recovery takes from a segment's index file (see [`recover`]).
enum Trusted {
    /// The whole segment, opened when it is first read.
    Whole(Segment),
    /// Where its scan starts; with `true`, an index file was there and not taken.
    From(ScanFrom, bool),
}

/// An index file describes the segment up to its size, fsynced before it was written: the whole
/// of a sealed segment (or of the active one at a clean close), a prefix of the active one at a
/// checkpoint. Only what follows is scanned. An index file not taken may describe bytes a cut
/// removed, which appends would replace: it is written again once the scan is done.
fn trusted(f: &mut Found, is_last: bool, interval: u32, open: &OpenTransactions) -> Trusted {
    let had_index = f.index.is_some();
    let prefix = match (f.index.take(), f.txns.take()) {
        (Some((index, meta)), Some(txns)) if meta.size <= f.len => Some((index, meta, txns)),
        _ => None,
    };
    match prefix {
        Some((index, meta, txns)) if meta.size == f.len => {
            let files = Handles::new(f.path.clone());
            let seg = Segment::with_meta(
                f.path.clone(),
                files,
                f.base_offset,
                index,
                meta,
                f.mtime_ms,
            );
            // The active segment is written on: its index file no longer matches it then.
            seg.sealed.set(!is_last);
            *seg.txns.borrow_mut() = txns;
            Trusted::Whole(seg)
        }
        Some((index, meta, txns)) => Trusted::From(ScanFrom { index, meta, txns }, false),
        None => Trusted::From(
            ScanFrom::start(f.base_offset, interval, open.clone()),
            had_index,
        ),
    }
}

/// Cuts `file` (found as `f`) to `valid_len` if it is longer (damage, or zero padding), then
/// makes it durable: whatever survived a crash may sit only in the page cache.
async fn cut_and_sync(
    file: &glommio::io::BufferedFile,
    f: &Found,
    valid_len: u64,
    damaged: bool,
) -> Result<()> {
    if valid_len < f.len {
        if !damaged {
            log::debug!(
                "recovery: cutting {} bytes of zero padding from {}",
                f.len - valid_len,
                f.path.display()
            );
        }
        file.truncate(valid_len)
            .await
            .map_err(|e| Error::storage(&f.path, e))?;
    }
    file.fdatasync()
        .await
        .map_err(|e| Error::storage(&f.path, e))
}

pub(super) async fn set_aside(found: impl Iterator<Item = Found>) {
    for f in found {
        let mut aside = f.path.with_extension("log.corrupt");
        if aside.exists() {
            aside = f.path.with_extension(format!("log.corrupt.{}", now_ms()));
        }
        match glommio::io::rename(&f.path, &aside).await {
            Ok(()) => log::error!("set aside {} as {}", f.path.display(), aside.display()),
            Err(e) => log::error!("could not set aside {}: {e}", f.path.display()),
        }
        for name in [
            index_file_name(f.base_offset),
            txn_index_file_name(f.base_offset),
        ] {
            let _ = glommio::io::remove(f.path.with_file_name(name)).await;
        }
    }
}
