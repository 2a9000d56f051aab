//! The core's budget of open files. Every descriptor the logs of a core hold (a segment's handles
//! for reads, fsyncs and writes, an active segment's Direct I/O writer, a read replica's borrowed
//! descriptors, the small files a log writes whole) holds a permit of the core's budget while it
//! is open, so a core with many partitions stays within the process's open files limit.
//!
//! A segment's handles (`Handles`) are opened on first use (through io_uring, like every other
//! open) and kept while they are used. When a permit is wanted and none is left, the segments
//! used least recently give theirs back: read handles close at once, and an active segment's
//! Direct I/O writer is finished by its log, which first waits for the write it may be doing (the
//! next append opens it again). An open that finds no permit within `WAIT` fails with an error
//! that names the budget; the log and the core carry on.
//!
//! Descriptors that cannot be opened again by path are pinned and never closed by the budget: a
//! segment compaction is replacing (its path names the new file) and a read replica's
//! descriptors (duplicates of the owner's). They still count.

use crate::error::{Error, Result};
use glommio::io::{BufferedFile, DmaFile, OpenOptions};
use glommio::sync::{Semaphore, StaticPermit};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// How long an open waits for a permit before it fails.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// The budget of a core that was given none: unlimited in practice.
const UNLIMITED: u64 = 1 << 40;

/// A descriptor and the budget permit it holds; the permit returns when the last `Rc` of it drops
/// (reads in flight keep theirs until they finish).
pub(crate) struct Counted<T> {
    file: T,
    _permit: StaticPermit,
}

impl<T> Deref for Counted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.file
    }
}

impl<T> std::fmt::Debug for Counted<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counted")
    }
}

impl<T> Counted<T> {
    pub(crate) fn new(file: T, permit: StaticPermit) -> Self {
        Self {
            file,
            _permit: permit,
        }
    }
}

struct Budget {
    permits: Rc<Semaphore>,
    limit: Cell<u64>,
    /// Segments holding handles the budget may close, by their last use (oldest first).
    lru: RefCell<BTreeMap<u64, (Weak<Handles>, Instant)>>,
    clock: Cell<u64>,
    evictions: Cell<u64>,
    refusals: Cell<u64>,
}

thread_local! {
    static BUDGET: Budget = Budget {
        permits: Rc::new(Semaphore::new(UNLIMITED)),
        limit: Cell::new(UNLIMITED),
        lru: RefCell::default(),
        clock: Cell::new(0),
        evictions: Cell::new(0),
        refusals: Cell::new(0),
    };
}

/// The open files budget of this core (thread) and how it is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFiles {
    pub limit: u64,
    /// Descriptors held now.
    pub open: u64,
    /// Segments whose handles the budget closed to make room.
    pub evictions: u64,
    /// Opens that failed because the budget stayed full.
    pub refusals: u64,
}

/// Sets this core's budget (at its start, before its logs open). Descriptors already held keep
/// their permits; a smaller budget takes effect as they close.
pub fn set_open_files_limit(limit: u64) {
    let limit = limit.max(1);
    BUDGET.with(|b| {
        let old = b.limit.replace(limit);
        if limit > old {
            b.permits.signal(limit - old);
        } else {
            // Units taken here never return: the budget is smaller from now on.
            let mut left = old - limit;
            while left > 0 {
                let take = left.min(b.permits.available());
                if take == 0 || !b.permits.try_acquire(take).unwrap_or(false) {
                    break;
                }
                left -= take;
            }
            if left > 0 {
                log::warn!(
                    "open files budget lowered to {limit} while {left} more are open; it applies as they close"
                );
                b.limit.set(limit + left);
            }
        }
    });
}

/// This core's budget and how it is used now.
pub fn open_files() -> OpenFiles {
    BUDGET.with(|b| OpenFiles {
        limit: b.limit.get(),
        open: b.limit.get().saturating_sub(b.permits.available()),
        evictions: b.evictions.get(),
        refusals: b.refusals.get(),
    })
}

/// A permit for one descriptor about to be opened for `path`, making room if the budget is full
/// and waiting up to [`WAIT`] for it.
pub(crate) async fn permit(path: &Path) -> Result<StaticPermit> {
    permits(path, 1).await
}

/// [`permit`] for `units` descriptors at once.
pub(crate) async fn permits(path: &Path, units: u64) -> Result<StaticPermit> {
    let sem = BUDGET.with(|b| b.permits.clone());
    if let Ok(p) = sem.try_acquire_static_permit(units) {
        return Ok(p);
    }
    let deadline = Instant::now() + WAIT;
    loop {
        make_room(units);
        let wait = glommio::timer::sleep(Duration::from_millis(50));
        let got = futures_lite::future::or(
            async { sem.acquire_static_permit(units).await.ok() },
            async {
                wait.await;
                None
            },
        )
        .await;
        if let Some(p) = got {
            return Ok(p);
        }
        if Instant::now() >= deadline {
            return Err(refused(path));
        }
    }
}

/// A permit now or never: read handles are closed to make room, nothing is waited for.
pub(crate) fn try_permits(path: &Path, units: u64) -> Result<StaticPermit> {
    let sem = BUDGET.with(|b| b.permits.clone());
    if let Ok(p) = sem.try_acquire_static_permit(units) {
        return Ok(p);
    }
    make_room(units);
    sem.try_acquire_static_permit(units)
        .map_err(|_| refused(path))
}

fn refused(path: &Path) -> Error {
    let limit = BUDGET.with(|b| {
        b.refusals.set(b.refusals.get() + 1);
        b.limit.get()
    });
    Error::OpenFiles {
        path: path.to_path_buf(),
        limit,
    }
}

/// Closes the handles of the segments used least recently until `units` permits are free or
/// coming back (writers finish in the background).
fn make_room(units: u64) {
    let mut coming = 0;
    loop {
        let next = BUDGET.with(|b| {
            if b.permits.available() + coming >= units {
                return None;
            }
            b.lru.borrow_mut().pop_first()
        });
        let Some((_, (weak, _))) = next else { return };
        let Some(h) = weak.upgrade() else { continue };
        h.listed.set(None);
        BUDGET.with(|b| b.evictions.set(b.evictions.get() + 1));
        coming += h.evict();
    }
}

/// Closes the handles of segments unused for `idle`, every `idle / 4`, for as long as the core
/// runs: a partition nobody reads or writes holds no file for long, whatever the budget.
pub fn close_idle_files(idle: Duration) {
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(idle / 4).await;
            close_unused_for(idle);
        }
    })
    .detach();
}

fn close_unused_for(idle: Duration) {
    let now = Instant::now();
    loop {
        let next = BUDGET.with(|b| {
            let mut lru = b.lru.borrow_mut();
            let (_, (_, used)) = lru.first_key_value()?;
            if now.duration_since(*used) < idle {
                return None;
            }
            lru.pop_first()
        });
        let Some((_, (weak, _))) = next else { return };
        if let Some(h) = weak.upgrade() {
            h.listed.set(None);
            h.evict();
        }
    }
}

/// The descriptors of one segment file, opened on demand and closed by the budget.
pub(crate) struct Handles {
    path: PathBuf,
    /// Its key in the budget's list while it holds handles the budget may close.
    listed: Cell<Option<u64>>,
    buffered: RefCell<Option<Rc<Counted<BufferedFile>>>>,
    dma: RefCell<Option<Rc<Counted<DmaFile>>>>,
    /// Never closed by the budget and never opened by path again (see the module's documentation).
    pinned: Cell<bool>,
    /// While the segment's Direct I/O writer is open: asks its log to finish it.
    writer: RefCell<Option<Rc<dyn Fn()>>>,
    /// The writer was asked to finish and has not yet.
    writer_asked: Cell<bool>,
}

impl std::fmt::Debug for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handles")
            .field("path", &self.path)
            .field("buffered", &self.buffered.borrow().is_some())
            .field("dma", &self.dma.borrow().is_some())
            .field("pinned", &self.pinned.get())
            .finish()
    }
}

impl Handles {
    /// Nothing open yet.
    pub(crate) fn new(path: PathBuf) -> Rc<Self> {
        Rc::new(Self {
            path,
            listed: Cell::new(None),
            buffered: RefCell::new(None),
            dma: RefCell::new(None),
            pinned: Cell::new(false),
            writer: RefCell::new(None),
            writer_asked: Cell::new(false),
        })
    }

    /// With `file` open already (recovery's scan, compaction's output, a replica's descriptor).
    pub(crate) fn with_buffered(path: PathBuf, file: Counted<BufferedFile>) -> Rc<Self> {
        let h = Self::new(path);
        *h.buffered.borrow_mut() = Some(Rc::new(file));
        h.touch();
        h
    }

    /// The buffered handle, opened if it is closed.
    pub(crate) async fn buffered(self: &Rc<Self>) -> Result<Rc<Counted<BufferedFile>>> {
        if let Some(f) = self.buffered_in_use() {
            return Ok(f);
        }
        self.check_reopen()?;
        let permit = permit(&self.path).await?;
        self.buffered_with(Some(permit)).await
    }

    /// The buffered handle, opened if it is closed with `permit` (taken beforehand), else with a
    /// permit free now: what a log's writer does while it holds its append permit, on which other
    /// logs' writers (finishing to give their permits back) may wait.
    pub(crate) async fn buffered_with(
        self: &Rc<Self>,
        permit: Option<StaticPermit>,
    ) -> Result<Rc<Counted<BufferedFile>>> {
        if let Some(f) = self.buffered_in_use() {
            return Ok(f);
        }
        self.check_reopen()?;
        let permit = match permit {
            Some(p) => p,
            None => try_permits(&self.path, 1)?,
        };
        let f = Rc::new(open_buffered_with(&self.path, permit).await?);
        // Another task may have opened it meanwhile: keep one.
        let f = self.buffered.borrow_mut().get_or_insert(f).clone();
        self.touch();
        Ok(f)
    }

    /// The buffered handle if it is open, marked used.
    fn buffered_in_use(self: &Rc<Self>) -> Option<Rc<Counted<BufferedFile>>> {
        let f = self.buffered.borrow().clone()?;
        self.touch();
        Some(f)
    }

    /// The Direct I/O read handle, opened if it is closed; `None` for a pinned segment without
    /// one (its path may name another file).
    pub(crate) async fn dma(self: &Rc<Self>) -> Result<Option<Rc<Counted<DmaFile>>>> {
        if let Some(f) = self.dma.borrow().clone() {
            self.touch();
            return Ok(Some(f));
        }
        if self.pinned.get() {
            return Ok(None);
        }
        let permit = permit(&self.path).await?;
        let f = OpenOptions::new()
            .read(true)
            .dma_open(&self.path)
            .await
            .map_err(|e| Error::storage(&self.path, e))?;
        let f = Rc::new(Counted::new(f, permit));
        let f = self.dma.borrow_mut().get_or_insert(f).clone();
        self.touch();
        Ok(Some(f))
    }

    /// The buffered handle if it is open (no I/O).
    pub(crate) fn buffered_if_open(&self) -> Option<Rc<Counted<BufferedFile>>> {
        self.buffered.borrow().clone()
    }

    /// From now on the budget never closes these handles and nothing opens the path again; the
    /// buffered handle is opened first if `open` (compaction pins a segment it is about to replace).
    pub(crate) async fn pin(self: &Rc<Self>, open: bool) -> Result<()> {
        if open {
            self.buffered().await?;
        }
        self.pinned.set(true);
        self.unlist();
        Ok(())
    }

    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned.get()
    }

    /// [`Self::pin`] of the handles open now, without opening any.
    pub(crate) fn pin_open(&self) {
        self.pinned.set(true);
        self.unlist();
    }

    /// The segment's Direct I/O writer opened (`Some`: how to ask its log to finish it) or
    /// finished (`None`).
    pub(crate) fn set_writer(self: &Rc<Self>, release: Option<Rc<dyn Fn()>>) {
        let open = release.is_some();
        *self.writer.borrow_mut() = release;
        self.writer_asked.set(false);
        if open {
            self.touch();
        }
    }

    /// Whether the budget knows how to ask for the segment's writer back.
    pub(crate) fn watches_writer(&self) -> bool {
        self.writer.borrow().is_some()
    }

    /// Marks a use: the budget closes the handles used least recently first.
    pub(crate) fn touch(self: &Rc<Self>) {
        if self.pinned.get() {
            return;
        }
        BUDGET.with(|b| {
            let tick = b.clock.get() + 1;
            b.clock.set(tick);
            let mut lru = b.lru.borrow_mut();
            if let Some(old) = self.listed.replace(Some(tick)) {
                lru.remove(&old);
            }
            lru.insert(tick, (Rc::downgrade(self), Instant::now()));
        });
    }

    /// Closes the read handles (their descriptors close once reads in flight finish) and, for an
    /// active segment, asks its log to finish the writer. Returns the permits that come back
    /// later: those of a writer being finished.
    fn evict(&self) -> u64 {
        self.buffered.borrow_mut().take();
        self.dma.borrow_mut().take();
        // Cloned out first: the task it spawns may start at once and finish the writer.
        let release = self.writer.borrow().clone();
        match release {
            Some(release) if !self.writer_asked.replace(true) => {
                release();
                2
            }
            _ => 0,
        }
    }

    /// Closes everything the budget may close and leaves its list (the log closes or the segment
    /// goes).
    pub(crate) fn close(&self) {
        self.buffered.borrow_mut().take();
        self.dma.borrow_mut().take();
        self.writer.borrow_mut().take();
        self.unlist();
    }

    fn unlist(&self) {
        if let Some(key) = self.listed.take() {
            let _ = BUDGET.try_with(|b| b.lru.borrow_mut().remove(&key));
        }
    }

    fn check_reopen(&self) -> Result<()> {
        match self.pinned.get() {
            true => Err(Error::storage(
                &self.path,
                "closed, and its path may name another file now",
            )),
            false => Ok(()),
        }
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        self.unlist();
    }
}

/// Opens `path` for reading and writing through the page cache, holding a permit.
pub(crate) async fn open_buffered(path: &Path) -> Result<Counted<BufferedFile>> {
    open_buffered_with(path, permit(path).await?).await
}

/// [`open_buffered`] with a permit taken beforehand.
async fn open_buffered_with(path: &Path, permit: StaticPermit) -> Result<Counted<BufferedFile>> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .buffered_open(path)
        .await
        .map_err(|e| Error::storage(path, e))?;
    Ok(Counted::new(f, permit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::run;

    #[test]
    fn the_least_recently_used_handles_close_when_the_budget_is_full() {
        run(|| async {
            let tmp = tempfile::tempdir().unwrap();
            set_open_files_limit(3);
            let mut all = Vec::new();
            for i in 0..5 {
                let p = tmp.path().join(format!("{i}"));
                std::fs::write(&p, [i as u8; 10]).unwrap();
                let h = Handles::new(p);
                h.buffered().await.unwrap();
                all.push(h);
                assert!(open_files().open <= 3, "{:?}", open_files());
            }
            // The two used first were closed; the last three are open.
            let open: Vec<bool> = all.iter().map(|h| h.buffered_if_open().is_some()).collect();
            assert_eq!(open, [false, false, true, true, true]);
            // A closed one opens again (and closes the least recently used: the third).
            let f = all[0].buffered().await.unwrap();
            assert_eq!(&f.read_at(0, 10).await.unwrap()[..], &[0u8; 10]);
            assert!(all[2].buffered_if_open().is_none());
            assert_eq!(open_files().open, 3);
            drop(f);
            // Handles unused for a while close whatever the budget.
            all[1].buffered().await.unwrap();
            close_unused_for(Duration::ZERO);
            assert!(all[1].buffered_if_open().is_none());
            assert_eq!(open_files().open, 0);
            // A pinned one is never closed; with all three pinned an open is refused, not a crash.
            for h in [&all[0], &all[3], &all[4]] {
                h.pin(true).await.unwrap();
            }
            let err = try_permits(tmp.path(), 1).unwrap_err();
            assert!(
                err.to_string().contains("--max-open-files-per-core"),
                "{err}"
            );
            assert!(all[3].buffered_if_open().is_some());
            // Closing returns the permits.
            for h in &all {
                h.close();
            }
            assert_eq!(open_files().open, 0);
            set_open_files_limit(UNLIMITED);
        });
    }
}
