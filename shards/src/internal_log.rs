//! An internal log on a core, compacted: keyed records in a [`crate::Log`] (so the same
//! CRC-checked recovery and group-committed fsyncs as partitions), appended durably, replayed at
//! start, and compacted by rewriting the live entries into the next generation (`log-<n>`, named
//! by `CURRENT`). The groups' committed offsets and the transaction coordinator's states each keep
//! one per core; they own their keys, values and locking.

use crate::batch::{records, BatchBuilder};
use crate::files::write_atomically;
use crate::now_ms;
use crate::{AppendOptions, Log, LogConfig, TailCache};
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// A record to write: key and value (`None`: a tombstone).
pub type KeyedRecord = (Vec<u8>, Option<Vec<u8>>);

/// Records per batch written to the log (keeps each batch well under the log's batch limit).
const BATCH_BYTES: usize = 256 << 10;

/// Why a write failed.
pub type StoreResult<T> = Result<T, String>;

/// The settings of an internal log.
fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 << 20,
        segment_age: None,
        flush_interval: Some(Duration::from_secs(1)),
        // Live entries never age out of the log: compaction is what shrinks it.
        retention_bytes: None,
        retention_age: None,
        max_batch_bytes: 16 << 20,
        ..LogConfig::default()
    }
}

fn log_dir_name(generation: u64) -> String {
    format!("log-{generation:020}")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> StoreResult<T> {
    glommio::executor()
        .spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())
}

/// A bounds-checked reader of the owners' encodings (bytes from disk are never trusted).
#[derive(Debug)]
pub struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    pub fn string(&mut self) -> Option<String> {
        let n = u32::from_be_bytes(self.take(4)?.try_into().ok()?) as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

/// Encodes (key, value) records as back-to-back batches of at most about `BATCH_BYTES` each.
fn encode_batches(recs: &[KeyedRecord]) -> Bytes {
    let now = now_ms();
    let mut out = Vec::new();
    let mut b = BatchBuilder::new(now);
    for (k, v) in recs {
        if !b.is_empty() && b.size() + k.len() + v.as_ref().map_or(0, Vec::len) > BATCH_BYTES {
            out.extend_from_slice(&std::mem::replace(&mut b, BatchBuilder::new(now)).finish(0));
        }
        b.push(now, Some(k), v.as_deref(), &[]);
    }
    if !b.is_empty() {
        out.extend_from_slice(&b.finish(0));
    }
    Bytes::from(out)
}

/// Reads an internal log from its start and hands each record's key and value (`None`: a
/// tombstone) to `apply`, in log order; unreadable batches are skipped with a warning. Returns the
/// number of records read.
async fn replay_records(
    log: &Log,
    root: &Path,
    mut apply: impl FnMut(Option<&[u8]>, Option<&[u8]>),
) -> StoreResult<u64> {
    let mut at = log.log_start_offset();
    let mut n = 0u64;
    while at < log.high_watermark() {
        let read = log
            .read(at, 4 << 20, true)
            .await
            .map_err(|e| e.to_string())?;
        if read.records.is_empty() {
            break;
        }
        for (_, batch) in read.records.batches() {
            let recs = match records(&batch) {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("{}: skipping an unreadable batch: {e}", root.display());
                    continue;
                }
            };
            for r in recs {
                n += 1;
                apply(r.key, r.value);
            }
        }
        at = read.records.last_offset + 1;
    }
    Ok(n)
}

/// Opens the live generation of an internal log kept under `root` (created if missing): the one
/// `CURRENT` names (0 without it); leftovers of an interrupted compaction are removed first.
async fn open_generation(root: &Path, cache: Rc<TailCache>) -> StoreResult<(Log, u64)> {
    let generation = {
        let root = root.to_path_buf();
        blocking(move || {
            crate::files::create_dir_all_durable(&root)?;
            let generation = match std::fs::read_to_string(root.join("CURRENT")) {
                Ok(s) => s
                    .trim()
                    .strip_prefix("log-")
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| {
                        std::io::Error::other(format!("{}: bad CURRENT {s:?}", root.display()))
                    })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(e) => return Err(e),
            };
            let live = log_dir_name(generation);
            for e in std::fs::read_dir(&root)? {
                let e = e?;
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with("log-") && name != live {
                    std::fs::remove_dir_all(e.path())?;
                }
            }
            Ok(generation)
        })
        .await?
    };
    let log = Log::open(root.join(log_dir_name(generation)), log_config(), cache)
        .await
        .map_err(|e| e.to_string())?;
    Ok((log, generation))
}

/// Writes `recs` (the live entries) into generation `next` of the internal log under `root` and
/// makes it the live one (`CURRENT` names it once its files are durable). The caller swaps it in
/// and deletes the old generation; on an error nothing changed.
async fn write_generation(
    root: &Path,
    cache: Rc<TailCache>,
    next: u64,
    recs: &[KeyedRecord],
) -> StoreResult<Log> {
    let name = log_dir_name(next);
    let dir = root.join(&name);
    {
        let dir = dir.clone();
        blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await?;
    }
    let fresh = Log::open(dir.clone(), log_config(), cache)
        .await
        .map_err(|e| e.to_string())?;
    let written = async {
        if !recs.is_empty() {
            fresh
                .append(encode_batches(recs), AppendOptions { durable: true })
                .await
                .map_err(|e| e.to_string())?;
        }
        let current = root.join("CURRENT");
        blocking(move || {
            // The new log's files must be durable before CURRENT names it.
            std::fs::File::open(&dir)?.sync_all()?;
            write_atomically(&current, name.as_bytes())
        })
        .await
    }
    .await;
    match written {
        Ok(()) => Ok(fresh),
        Err(e) => {
            let _ = fresh.delete().await;
            Err(e)
        }
    }
}

/// One internal log: the live generation, and its counts for the compaction decision.
#[derive(Debug)]
pub struct InternalLog {
    root: PathBuf,
    cache: Rc<TailCache>,
    log: RefCell<Option<(Log, u64)>>,
    /// Records in the live generation (entries and tombstones).
    records: Cell<u64>,
    compactions: Cell<u64>,
}

impl InternalLog {
    /// Opens the live generation under `root` (created if missing); [`Self::replay`] reads it.
    pub async fn open(root: &Path, cache: Rc<TailCache>) -> StoreResult<Self> {
        let (log, generation) = open_generation(root, cache.clone()).await?;
        Ok(InternalLog {
            root: root.to_path_buf(),
            cache,
            log: RefCell::new(Some((log, generation))),
            records: Cell::new(0),
            compactions: Cell::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Hands every record's key and value to `apply`, in log order (see `replay_records`).
    pub async fn replay(
        &self,
        apply: impl FnMut(Option<&[u8]>, Option<&[u8]>),
    ) -> StoreResult<u64> {
        let log = self.live()?;
        let n = replay_records(&log, &self.root, apply).await?;
        self.records.set(n);
        Ok(n)
    }

    fn live(&self) -> StoreResult<Log> {
        match &*self.log.borrow() {
            Some((log, _)) => Ok(log.clone()),
            None => Err(format!("{}: closed", self.root.display())),
        }
    }

    pub fn is_open(&self) -> bool {
        self.log.borrow().is_some()
    }

    /// Appends `recs` durably. The append is queued at this call's first poll, so appends are in
    /// the log in the order they were called.
    pub async fn append(&self, recs: &[KeyedRecord]) -> StoreResult<()> {
        let log = self.live()?;
        log.append(encode_batches(recs), AppendOptions { durable: true })
            .await
            .map_err(|e| e.to_string())?;
        self.records.set(self.records.get() + recs.len() as u64);
        Ok(())
    }

    pub fn records(&self) -> u64 {
        self.records.get()
    }

    pub fn compactions(&self) -> u64 {
        self.compactions.get()
    }

    /// Replaces the log by a new generation holding `live` (every live entry) only. The caller
    /// keeps appends out while it runs.
    pub async fn rewrite(&self, live: &[KeyedRecord]) -> StoreResult<()> {
        let generation = match &*self.log.borrow() {
            Some((_, g)) => *g,
            None => return Err(format!("{}: closed", self.root.display())),
        };
        let next = generation + 1;
        let fresh = write_generation(&self.root, self.cache.clone(), next, live).await?;
        let old = self.log.borrow_mut().replace((fresh, next));
        if let Some((old, _)) = old {
            if let Err(e) = old.delete().await {
                log::warn!("{}: removing the compacted log: {e}", self.root.display());
            }
        }
        self.records.set(live.len() as u64);
        self.compactions.set(self.compactions.get() + 1);
        log::info!(
            "{}: compacted to {} entries ({})",
            self.root.display(),
            live.len(),
            log_dir_name(next)
        );
        Ok(())
    }

    /// Flushes and closes the log (clean shutdown).
    pub async fn close(&self) {
        let log = self.log.borrow_mut().take();
        if let Some((log, _)) = log {
            if let Err(e) = log.close().await {
                log::error!("{}: closing: {e}", self.root.display());
            }
        }
    }
}
/// The core count change an internal log kept per core under `root` (`root/core-<i>/`, the count
/// they were written with in `root/cores`) must follow: `None` when the count is `cores` and no
/// core's directory lies beyond it (the count is recorded); else the cores with a directory and
/// the count before (the recorded one, else one more than the highest core found), for the caller
/// to move the entries, then record `cores` with [`record_core_count`].
fn core_count_change(root: &Path, cores: usize) -> std::io::Result<Option<(Vec<usize>, usize)>> {
    crate::files::create_dir_all_durable(root)?;
    let previous = match std::fs::read_to_string(root.join("cores")) {
        Ok(s) => s.trim().parse::<usize>().ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let on_disk: Vec<usize> = std::fs::read_dir(root)?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("core-")?
                .parse()
                .ok()
        })
        .collect();
    let old = previous.unwrap_or_else(|| on_disk.iter().map(|c| c + 1).max().unwrap_or(cores));
    if old == cores && on_disk.iter().all(|&c| c < cores) {
        record_core_count(root, cores)?;
        return Ok(None);
    }
    Ok(Some((on_disk, old)))
}

/// Re-shards the per-core logs under `root` when the core count changed since they were written:
/// `move_entries(cores with a directory, the count before)` runs on an executor of its own named
/// `thread` (before any core starts) and moves every entry to its new core's log; then `cores` is
/// recorded. Nothing runs when the count did not change.
pub fn reshard<F, Fut>(
    root: &Path,
    cores: usize,
    thread: &str,
    what: &str,
    move_entries: F,
) -> std::io::Result<()>
where
    F: FnOnce(Vec<usize>, usize) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + 'static,
{
    let Some((on_disk, old)) = core_count_change(root, cores)? else {
        return Ok(());
    };
    log::info!("re-sharding {what} from {old} to {cores} cores");
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name(thread)
        .spawn(move || async move { move_entries(on_disk, old).await })
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    handle
        .join()
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    record_core_count(root, cores)
}

/// Records that the logs under `root` are kept for `cores` cores.
pub fn record_core_count(root: &Path, cores: usize) -> std::io::Result<()> {
    write_atomically(&root.join("cores"), cores.to_string().as_bytes())
}
