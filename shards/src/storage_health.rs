//! Storage failures, told once: a log's failed writes, fsyncs and segment rolls open a
//! *failure episode*, logged once (with the path and the OS error) and closed, with one more line, by
//! the next successful append. Every failure is counted, and the counts of all logs on a thread (a
//! core: every log lives on its core's thread) are kept here for the core's metrics, so they survive
//! the logs themselves (a deleted partition) and cover every log (partitions and group stores alike).
//! A failed index file write is counted and logged as a warning, without an episode: appends go on.

use crate::error::Error;
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::time::Instant;

/// The storage figures of every log on the calling thread (one core), as a plain snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageHealth {
    /// Storage operations that failed: writes, fsyncs, segment rolls, index writes.
    pub errors: u64,
    /// Logs in a failure episode now: their last storage operation failed and no append has
    /// succeeded since (after a failed fsync, until restart).
    pub failing_logs: u64,
}

thread_local! {
    static HEALTH: Cell<StorageHealth> = const { Cell::new(StorageHealth { errors: 0, failing_logs: 0 }) };
}

/// The storage figures of every log opened on this thread (this core).
pub fn storage_health() -> StorageHealth {
    HEALTH.with(Cell::get)
}

fn update(f: impl FnOnce(&mut StorageHealth)) {
    HEALTH.with(|h| {
        let mut v = h.get();
        f(&mut v);
        h.set(v);
    });
}

/// One log's failure episode, if one is open.
#[derive(Debug, Default)]
pub(crate) struct StorageEpisode {
    open: RefCell<Option<Episode>>,
    /// Failures over the log's life.
    errors: Cell<u64>,
}

#[derive(Debug)]
struct Episode {
    /// The failure that opened the episode, as logged.
    first: String,
    since: Instant,
    errors: u64,
}

impl StorageEpisode {
    /// Counts a failure of `dir`'s log; logs it if it opens an episode, or if it is `fatal` (the log
    /// refuses appends until restart, which an operator must hear even inside an episode). Returns
    /// the error, to pass it on.
    pub(crate) fn failed(&self, dir: &Path, e: Error, fatal: bool) -> Error {
        self.errors.set(self.errors.get() + 1);
        update(|h| h.errors += 1);
        let mut open = self.open.borrow_mut();
        match &mut *open {
            Some(ep) => {
                ep.errors += 1;
                if fatal {
                    log::error!("{}: {e}", dir.display());
                }
            }
            None => {
                let first = e.to_string();
                if fatal {
                    log::error!("{}: {first}", dir.display());
                } else {
                    log::error!(
                        "{}: {first}; appends to this log fail until the storage accepts writes again (further failures are counted, not logged)",
                        dir.display()
                    );
                }
                *open = Some(Episode {
                    first,
                    since: Instant::now(),
                    errors: 1,
                });
                update(|h| h.failing_logs += 1);
            }
        }
        e
    }

    /// An append reached the disk: closes the episode, if one is open, with one line.
    pub(crate) fn succeeded(&self, dir: &Path) {
        let closed = self.open.borrow_mut().take();
        if let Some(ep) = closed {
            update(|h| h.failing_logs -= 1);
            log::warn!(
                "{}: storage works again, appends resume ({} failed operations in {:.1} s)",
                dir.display(),
                ep.errors,
                ep.since.elapsed().as_secs_f64(),
            );
        }
    }

    /// A segment's index file could not be written: counted and logged, but no episode (appends
    /// go on; the segment is only scanned at the next start-up).
    pub(crate) fn index_write_failed(&self, e: &Error) {
        self.errors.set(self.errors.get() + 1);
        update(|h| h.errors += 1);
        log::warn!("{e}; the segment will be scanned at start-up");
    }

    /// The failure that opened the current episode.
    pub(crate) fn current(&self) -> Option<String> {
        self.open.borrow().as_ref().map(|ep| ep.first.clone())
    }

    pub(crate) fn errors(&self) -> u64 {
        self.errors.get()
    }
}

impl Drop for StorageEpisode {
    fn drop(&mut self) {
        if self.open.get_mut().is_some() {
            update(|h| h.failing_logs -= 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_full() -> Error {
        Error::storage(
            "/data/t/0/00000000000000000000.log",
            "No space left on device",
        )
    }

    /// Counts per thread: each test runs on its own thread, so the figures start at zero.
    #[test]
    fn an_episode_opens_once_counts_every_failure_and_closes_on_success() {
        let dir = Path::new("/data/t/0");
        let a = StorageEpisode::default();
        let b = StorageEpisode::default();
        a.succeeded(dir); // nothing open: nothing happens
        assert_eq!(storage_health(), StorageHealth::default());
        for _ in 0..3 {
            a.failed(dir, disk_full(), false);
        }
        b.failed(dir, disk_full(), true);
        assert_eq!(
            storage_health(),
            StorageHealth {
                errors: 4,
                failing_logs: 2
            }
        );
        assert_eq!(a.errors(), 3);
        assert!(a.current().unwrap().contains("No space left on device"));
        a.succeeded(dir);
        a.succeeded(dir);
        assert_eq!(a.current(), None);
        assert_eq!(storage_health().failing_logs, 1);
        // A log dropped in the middle of an episode no longer counts as failing.
        drop(b);
        assert_eq!(
            storage_health(),
            StorageHealth {
                errors: 4,
                failing_logs: 0
            }
        );
        // A new failure opens a new episode.
        a.failed(dir, disk_full(), false);
        assert_eq!(storage_health().failing_logs, 1);
        assert_eq!(a.errors(), 4);
    }
}
