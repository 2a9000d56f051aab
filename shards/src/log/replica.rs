//! Read replicas: a log served on a core other than its owner's.
//!
//! The owner's log tells a hook ([`Log::set_replication`]) of every change, synchronously, as it
//! happens: the batches of each write with their final offsets ([`LogEvent::Appended`]: a shared
//! slice of the owner's tail cache, no copy), and any other change of its segment list
//! ([`LogEvent::SegmentsChanged`]: a roll, a compaction swap, retention, a restart). Whoever holds
//! the hook (the front end, which owns the cores' channels) carries them to the replica cores in
//! order, as [`Handover`]s: the appended batches, or a fresh [`LogSnapshot`] after a change of the
//! segments.
//!
//! A replica ([`Log::replica`]) reads the owner's files itself: the snapshot holds a duplicate of
//! the owner's descriptor of every segment, so a replica never opens a path (compaction may put
//! another file at one at any moment) and a segment that retention or compaction removed stays
//! readable to reads already under way until the next snapshot drops it. Sealed segments never
//! change; the active one is read only below the high watermark the replica was told, and the
//! batches handed over extend its index and go into the replica core's own tail cache, so reads at
//! the tail touch no disk. A replica never writes, never fsyncs and never deletes a file.

use super::*;
use crate::log::open_files::{self, Handles};
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};

/// What the owner's log tells its replication hook as it changes.
#[derive(Debug, Clone)]
pub enum LogEvent {
    /// One write's batches, readable now.
    Appended(Appended),
    /// The segment list changed: replicas need a fresh [`LogSnapshot`] ([`Log::snapshot`]).
    SegmentsChanged,
}

/// Batches one write appended, and the log's state right after it.
#[derive(Debug, Clone)]
pub struct Appended {
    /// Whole batches with their final offsets (shared slices, not copies).
    pub records: Records,
    /// The high watermark before them: where a replica must stand to take them.
    pub from: i64,
    pub high_watermark: i64,
}

/// What the owner's log is made of at one moment, for a replica on another core: the segments'
/// descriptors (duplicates; `Send`), their indexes and sizes, and the high watermark.
#[derive(Debug)]
pub struct LogSnapshot {
    dir: PathBuf,
    segments: Vec<SharedSegment>,
    high_watermark: i64,
    /// The start DeleteRecords set, where it lies inside the first segment (0 when none did).
    start_floor: i64,
    /// The open transactions at the high watermark (a replica's last stable offset follows them).
    transactions: OpenTransactions,
}

#[derive(Debug)]
struct SharedSegment {
    base_offset: i64,
    path: PathBuf,
    fd: OwnedFd,
    /// The segment's sparse index and meta, in the index file's form.
    index: Vec<u8>,
    last_modified_ms: i64,
    sealed: bool,
    txns: crate::transactions::SegmentTxns,
}

impl LogSnapshot {
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }
    /// Bytes of the segments it describes.
    pub fn size_bytes(&self) -> u64 {
        self.segments
            .iter()
            .filter_map(|s| SparseIndex::decode(&s.index).map(|(_, m)| m.size))
            .sum()
    }
}

/// What a replica core is handed, in the order the owner's log changed.
#[derive(Debug)]
pub enum Handover {
    Appended(Appended),
    Snapshot(LogSnapshot),
}

/// What the owner's log calls with each [`LogEvent`].
pub type ReplicationHook = Rc<dyn Fn(LogEvent)>;

/// The owner's replication hook, if any.
#[derive(Default)]
pub(super) struct Replication {
    hook: RefCell<Option<ReplicationHook>>,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication")
            .field("hooked", &self.hook.borrow().is_some())
            .finish()
    }
}

impl Replication {
    fn tell(&self, event: impl FnOnce() -> Option<LogEvent>) {
        // Cloned out, so the hook may set another hook or ask the log anything.
        let hook = self.hook.borrow().clone();
        if let Some(hook) = hook {
            if let Some(event) = event() {
                hook(event);
            }
        }
    }
    pub(super) fn is_hooked(&self) -> bool {
        self.hook.borrow().is_some()
    }
}

impl Inner {
    /// Tells the hook the segment list changed (call with no borrow of `segments` held).
    pub(super) fn segments_changed(&self) {
        self.replication.tell(|| Some(LogEvent::SegmentsChanged));
    }

    /// Tells the hook a write appended `first..high_watermark` on top of `from` (call right after
    /// the batches went into the tail cache). Should the cache not hold them all (a batch larger
    /// than the cache), replicas get a snapshot instead and read them from the file.
    pub(super) fn appended(&self, from: i64, first: i64, high_watermark: i64) {
        self.replication.tell(|| {
            let records = self
                .cache
                .peek(self.cache_id, first, usize::MAX)
                .filter(|r| r.first_offset == first && r.next_offset() == Some(high_watermark));
            Some(match records {
                Some(records) => LogEvent::Appended(Appended {
                    records,
                    from,
                    high_watermark,
                }),
                None => LogEvent::SegmentsChanged,
            })
        });
    }

    pub(super) fn check_open_owner(&self) -> Result<()> {
        if self.closed.get() {
            return Err(Error::Closed);
        }
        if self.replica {
            return Err(Error::ReadReplica);
        }
        Ok(())
    }
}

impl Log {
    /// Owner: sets (or, with `None`, removes) the hook told of every change read replicas must
    /// follow. It runs on the writer's path: it must only queue what it is given.
    pub fn set_replication(&self, hook: Option<ReplicationHook>) {
        *self.inner.replication.hook.borrow_mut() = hook;
    }

    /// Whether a replication hook is set.
    pub fn is_replicated(&self) -> bool {
        self.inner.replication.is_hooked()
    }

    /// Owner: the log as it is now, for a replica to start from or to catch up with.
    pub fn snapshot(&self) -> Result<LogSnapshot> {
        let inner = &self.inner;
        inner.check_open_owner()?;
        let segments = inner
            .segments
            .borrow()
            .iter()
            .map(|seg| {
                let fd = match seg.files.buffered_if_open() {
                    // SAFETY: the segment's file stays open while it is borrowed here.
                    Some(f) => {
                        unsafe { BorrowedFd::borrow_raw(f.as_raw_fd()) }.try_clone_to_owned()
                    }
                    // Closed by the open files budget: its path names its file (compaction
                    // opens and keeps the handles of segments it replaces), opened here for the
                    // replica only (a short blocking open; the snapshot is sent at once).
                    None if !seg.files.is_pinned() => {
                        std::fs::File::open(&seg.path).map(OwnedFd::from)
                    }
                    None => Err(std::io::Error::other(
                        "closed, and its path names another file",
                    )),
                }
                .map_err(|e| Error::storage(&seg.path, e))?;
                Ok(SharedSegment {
                    base_offset: seg.base_offset,
                    path: seg.path.clone(),
                    fd,
                    index: seg.index.borrow().encode(&seg.meta()),
                    last_modified_ms: seg.last_modified_ms.get(),
                    sealed: seg.sealed.get(),
                    txns: seg.txns.borrow().clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LogSnapshot {
            dir: inner.dir.clone(),
            segments,
            high_watermark: inner.high_watermark.value(),
            start_floor: inner.start_floor.get(),
            transactions: inner.transactions.borrow().clone(),
        })
    }

    /// A read replica of another core's log, on this core, from `snapshot`; its reads of the tail
    /// are served from `cache` (this core's). It never writes: appends, retention, compaction and
    /// restarts are refused with [`Error::ReadReplica`], and `delete` only closes it.
    pub fn replica(snapshot: LogSnapshot, config: LogConfig, cache: Rc<TailCache>) -> Result<Log> {
        let dir = snapshot.dir.clone();
        let next = snapshot.high_watermark;
        let transactions = snapshot.transactions.clone();
        let start_floor = snapshot.start_floor;
        let segments = borrowed_segments(snapshot)?;
        let inner = Inner::new(
            dir,
            config.sanitized(),
            cache,
            segments,
            next,
            transactions,
            0,
            true,
        );
        inner.start_floor.set(start_floor);
        Ok(Log { inner })
    }

    /// Whether this log is a read replica of another core's.
    pub fn is_replica(&self) -> bool {
        self.inner.replica
    }

    /// Replica: follows the owner by one hand-over. Batches that do not start where this replica
    /// stands (a hand-over lost or reordered) are refused with [`Error::ReadReplica`]: the replica
    /// then needs a fresh snapshot, and serves what it has meanwhile.
    pub fn apply(&self, handover: Handover) -> Result<()> {
        let inner = &self.inner;
        if !inner.replica {
            return Err(Error::ReadReplica);
        }
        if inner.closed.get() {
            return Err(Error::Closed);
        }
        match handover {
            Handover::Snapshot(snapshot) => {
                let next = snapshot.high_watermark;
                let transactions = snapshot.transactions.clone();
                let start_floor = snapshot.start_floor;
                let segments = borrowed_segments(snapshot)?;
                *inner.segments.borrow_mut() = segments;
                inner.start_floor.set(start_floor);
                inner.layout.set(inner.layout.get() + 1);
                inner.cache.forget(inner.cache_id);
                inner.high_watermark.advance(next);
                inner.set_transactions(transactions);
                Ok(())
            }
            Handover::Appended(a) => {
                let hw = inner.high_watermark.value();
                if a.high_watermark <= hw {
                    // A snapshot taken after this write already holds it.
                    return Ok(());
                }
                if a.from != hw || a.records.is_empty() {
                    return Err(Error::ReadReplica);
                }
                let active = inner.active();
                let headers: Vec<BatchHeader> = a.records.batch_headers().collect();
                if headers.first().map(|h| h.base_offset) < Some(active.next_offset.get())
                    || !active.can_hold(a.records.last_offset)
                {
                    return Err(Error::ReadReplica);
                }
                active.note_written(&headers);
                for (h, bytes) in a.records.batches() {
                    inner.follow_transactions(&active, &bytes, std::slice::from_ref(&h));
                    inner.cache.insert(
                        inner.cache_id,
                        &bytes,
                        |_| {},
                        h.base_offset,
                        h.last_offset(),
                        h.record_count.max(0) as u64,
                    );
                }
                inner.high_watermark.advance(a.high_watermark);
                inner.last_stable.advance(inner.stable_offset());
                Ok(())
            }
        }
    }

    /// Replica: closes it, leaving the owner's files alone.
    pub(super) fn close_replica(self) {
        let inner = self.inner;
        inner.closed.set(true);
        inner.append_permit.close();
        inner.segments.borrow_mut().clear();
        inner.cache.forget(inner.cache_id);
        inner.high_watermark.close();
        inner.last_stable.close();
        inner.durable.close();
        inner.sync_rounds.close();
    }
}

/// The snapshot's segments as this core's, reading the owner's files through the duplicated
/// descriptors.
fn borrowed_segments(snapshot: LogSnapshot) -> Result<Vec<Rc<Segment>>> {
    if snapshot.segments.is_empty() {
        return Err(Error::storage(&snapshot.dir, "a snapshot without segments"));
    }
    snapshot
        .segments
        .into_iter()
        .map(|s| {
            let (index, meta) = SparseIndex::decode(&s.index)
                .ok_or_else(|| Error::storage(&s.path, "a snapshot's index does not decode"))?;
            // The descriptor counts in this core's budget; without room the replica is not made.
            let permit = open_files::try_permits(&s.path, 1)?;
            // SAFETY: the descriptor is ours (a duplicate made for this snapshot) and is handed
            // to the file, which closes it.
            let file = unsafe {
                <glommio::io::BufferedFile as std::os::fd::FromRawFd>::from_raw_fd(
                    s.fd.into_raw_fd(),
                )
            };
            let files =
                Handles::with_buffered(s.path.clone(), open_files::Counted::new(file, permit));
            let seg = Segment::with_meta(
                s.path,
                files,
                s.base_offset,
                index,
                meta,
                s.last_modified_ms,
            )
            .borrowed();
            seg.sealed.set(s.sealed);
            *seg.txns.borrow_mut() = s.txns;
            Ok(Rc::new(seg))
        })
        .collect()
}
