//! The writer: appends queued on a log are written in groups, in order, by one task; fsyncs are
//! shared by every durable append waiting for them (group commit); a background task flushes and
//! checks retention.

use super::*;
use crate::log::group_bytes::GroupBytes;
use crate::oneshot;

/// Most bytes written by one write of grouped appends.
pub(super) const MAX_GROUP_BYTES: u64 = 8 << 20;

/// An append waiting for the writer task.
#[derive(Debug)]
pub(super) struct PendingAppend {
    pub(super) blob: Bytes,
    pub(super) headers: Vec<BatchHeader>,
    /// The decompressed records of its compressed batches, kept for the log's view readers (empty,
    /// or one per batch).
    pub(super) decoded: Vec<Option<Bytes>>,
    /// Offsets the batches take (the sum of their `lastOffsetDelta + 1`).
    pub(super) offsets: i64,
    /// Acknowledged only once durable (`acks=all`).
    pub(super) durable: bool,
    /// The batches keep the offsets they carry (a mirror of another log), else they get the next.
    pub(super) keep_offsets: bool,
    pub(super) done: oneshot::Sender<Result<AppendResult>>,
}

/// Answers every append of `group` with `e` (the same error, not a re-worded one).
pub(super) fn fail_all(group: Vec<PendingAppend>, e: &Error) {
    group.into_iter().for_each(|p| p.done.send(Err(e.clone())));
}

impl Inner {
    /// Starts the writer task unless it runs: it drains the append queue in groups, in order.
    pub(super) fn start_writer(self: &Rc<Self>) {
        if self.writing.replace(true) {
            return;
        }
        let inner = self.clone();
        glommio::spawn_local(async move {
            // The permit is taken per group, so retention and close get their turn under load.
            while !inner.queue.borrow().is_empty() {
                // Outside the append permit: see `Segment::reserve_write_files`.
                let reserved = inner.active().reserve_write_files().await;
                let Ok(permit) = inner.append_permit.acquire_permit(1).await else {
                    inner.fail_queued(&Error::Closed);
                    break;
                };
                let group = inner.next_group().await;
                if group.is_empty() {
                    break;
                }
                inner.write_group(group, reserved).await;
                drop(permit);
                // Let a waiting retention or close take the permit before the next group.
                futures_lite::future::yield_now().await;
            }
            inner.writing.set(false);
        })
        .detach();
    }

    /// Takes the next appends to write together: as many as fit in the active segment (rolling it
    /// first if the oldest does not) and in `MAX_GROUP_BYTES`.
    pub(super) async fn next_group(self: &Rc<Self>) -> Vec<PendingAppend> {
        let stamp = self.config.borrow().log_append_time;
        let Some((first_len, first_ts, first_offsets)) = self.queue.borrow().front().map(|p| {
            let ts = if stamp {
                now_ms()
            } else {
                p.headers
                    .iter()
                    .map(|h| h.max_timestamp)
                    .max()
                    .unwrap_or(-1)
            };
            (p.blob.len() as u64, ts, p.offsets)
        }) else {
            return Vec::new();
        };
        if let Err(e) = self
            .roll_if_needed(first_len, first_ts, first_offsets)
            .await
        {
            self.fail_queued(&e);
            return Vec::new();
        }
        let active = self.active();
        let segment_bytes = self.config.borrow().segment_bytes;
        let room = segment_bytes
            .saturating_sub(active.size.get())
            .min(MAX_GROUP_BYTES)
            .max(first_len);
        let mut queue = self.queue.borrow_mut();
        let mut total = 0;
        let mut next_offset = self.high_watermark.value();
        let mut group = Vec::new();
        while let Some(p) = queue.front() {
            let len = p.blob.len() as u64;
            let fits_offsets = active.can_hold(next_offset + p.offsets - 1);
            if !group.is_empty() && (total + len > room || !fits_offsets) {
                break;
            }
            total += len;
            next_offset += p.offsets;
            group.push(queue.pop_front().unwrap());
        }
        group
    }

    /// Rolls the active segment unless the next append (`next_len` bytes, `next_offsets` offsets,
    /// newest timestamp `next_ts`) fits it: by size, by age, and by relative offsets.
    pub(super) async fn roll_if_needed(
        self: &Rc<Self>,
        next_len: u64,
        next_ts: i64,
        next_offsets: i64,
    ) -> Result<()> {
        self.check_writable()?;
        let (segment_bytes, segment_age) = {
            let c = self.config.borrow();
            (c.segment_bytes, c.segment_age)
        };
        let active = self.active();
        let full = active.size.get() + next_len > segment_bytes
            || !active.can_hold(self.high_watermark.value() + next_offsets - 1);
        let old = segment_age.is_some_and(|age| active.is_older_than(age, next_ts));
        if active.size.get() > 0 && (full || old) {
            self.roll().await?;
        }
        Ok(())
    }

    /// Assigns offsets to a group of appends, writes them with one write and completes each.
    pub(super) async fn write_group(
        self: &Rc<Self>,
        group: Vec<PendingAppend>,
        reserved: crate::log::segment::WriteFiles,
    ) {
        if let Err(e) = self.check_writable() {
            fail_all(group, &e);
            return;
        }
        let stamp = self.config.borrow().log_append_time;
        let now = now_ms();
        let from = self.high_watermark.value();
        let (group, next) = number(group, from, stamp.then_some(now));
        if group.is_empty() {
            return;
        }
        // The producers' bytes as they came, with their offsets put in on the way (see GroupBytes).
        let bytes = GroupBytes {
            parts: group
                .iter()
                .map(|p| (&p.blob[..], &p.headers[..]))
                .collect(),
            stamp: stamp.then_some(now),
        };
        // A durable append makes the write itself durable (Direct I/O, O_DSYNC): no fsync of its
        // own, and every append in the group shares it. Others are written with Direct I/O too
        // while the device keeps up, through the page cache while it stalls (`direct_write`).
        let sync = group.iter().any(|p| p.durable);
        let active = self.active();
        let written = self.write_bytes(&active, reserved, &bytes, sync).await;
        drop(bytes);
        let synced = match written {
            Ok(synced) => synced,
            Err(e) => {
                let e = self.storage.failed(&self.dir, e, false);
                fail_all(group, &e);
                // Appends queued behind a failed write fail too: one written without the batches
                // before it would reorder a producer's records (its retry of those would land after).
                self.fail_queued(&e);
                return;
            }
        };
        self.storage.succeeded(&self.dir);
        let log_start_offset = self.log_start_offset();
        let active = self.active();
        for p in &group {
            self.follow_transactions(&active, &p.blob, &p.headers);
        }
        // Nothing awaits from here on: readers see the new watermark and the cached batches together.
        self.high_watermark.advance(next);
        self.request_checkpoint(&active, next);
        self.last_stable.advance(self.stable_offset());
        // Durable with everything before it in this segment; earlier segments and the new file's
        // directory entry are the sync task's, and while any waits, `durable` waits with them.
        if synced
            && self.unsealed.borrow().is_empty()
            && self.dir_synced.get() == self.dir_changes.get()
        {
            self.bump(|s| s.fsyncs += 1);
            self.durable.advance(next);
        }
        let mut batches = 0;
        let mut bytes = 0;
        let first = group[0].headers[0].base_offset;
        for mut p in group {
            let mut at = 0;
            if !stamp && self.view_readers.get() > 0 {
                // Stamping rewrites the CRC the records are filed under: those are not kept.
                let mut decoded = self.decoded.borrow_mut();
                for (h, records) in p.headers.iter().zip(std::mem::take(&mut p.decoded)) {
                    if let Some(records) = records {
                        decoded.insert(h, records);
                    }
                }
            }
            for h in &p.headers {
                let len = h.total_len();
                let fix = |b: &mut [u8]| {
                    batch::set_base_offset(b, h.base_offset);
                    if stamp {
                        batch::stamp_log_append_time(b, now);
                    }
                };
                let (first, last) = (h.base_offset, h.last_offset());
                self.cache.insert(
                    self.cache_id,
                    &p.blob[at..at + len],
                    fix,
                    first,
                    last,
                    h.record_count as u64,
                );
                at += len;
            }
            batches += p.headers.len() as u64;
            bytes += p.blob.len() as u64;
            let first = p.headers[0].base_offset;
            let end = p.headers.last().unwrap().last_offset() + 1;
            p.done.send(Ok(AppendResult {
                base_offset: first,
                last_offset: end - 1,
                high_watermark: next,
                log_append_time: if stamp { now } else { -1 },
                log_start_offset,
            }));
        }
        self.bump(|s| {
            s.appended_batches += batches;
            s.appended_bytes += bytes;
            s.append_writes += 1;
        });
        self.appended(from, first, next);
    }

    /// Writes a group's bytes at the end of `active`, opening what the write needs first.
    async fn write_bytes(
        self: &Rc<Self>,
        active: &Segment,
        reserved: crate::log::segment::WriteFiles,
        bytes: &GroupBytes<'_>,
        sync: bool,
    ) -> Result<bool> {
        self.open_writer(active, reserved).await?;
        crate::latency::write(active.append(bytes, sync)).await
    }

    /// Opens the active segment's Direct I/O writer again if the open files budget closed it, and
    /// tells the budget how to ask for it back: a task that takes the append permit (after the
    /// write in progress) and finishes the writer, if that segment is still the active one.
    pub(super) async fn open_writer(
        self: &Rc<Self>,
        active: &Segment,
        reserved: crate::log::segment::WriteFiles,
    ) -> Result<()> {
        active.open_for_write(reserved).await?;
        if !active.writer_open() || active.files.watches_writer() {
            return Ok(());
        }
        let weak = Rc::downgrade(self);
        let base = active.base_offset;
        active.files.set_writer(Some(Rc::new(move || {
            let weak = weak.clone();
            glommio::spawn_local(async move {
                let Some(inner) = weak.upgrade() else { return };
                let Ok(_permit) = inner.permit().await else {
                    return;
                };
                let active = inner.active();
                if active.base_offset == base {
                    if let Err(e) = active.pause_direct().await {
                        inner.storage.failed(&inner.dir, e, false);
                    }
                }
            })
            .detach();
        })));
        Ok(())
    }

    /// Answers every queued append with `e`.
    pub(super) fn fail_queued(&self, e: &Error) {
        let queued: Vec<_> = self.queue.borrow_mut().drain(..).collect();
        fail_all(queued, e);
    }

    /// Starts a new active segment at the high watermark. Nothing here waits for the disk beyond a
    /// file create (and, with Direct I/O, cutting the old segment's padding): the old segment is
    /// sealed (fsync, index file) and the new file's directory entry made durable by the sync task,
    /// in the background, and `durable` passes the old segment's end only once both are done.
    pub(super) async fn roll(self: &Rc<Self>) -> Result<()> {
        let old = self.active();
        if let Err(e) = old.stop_direct().await {
            return Err(self.storage.failed(&self.dir, e, false));
        }
        let new = self.create_segment(old.next_offset.get()).await?;
        log::debug!(
            "rolled {} at offset {}",
            self.dir.display(),
            new.base_offset
        );
        old.txns.borrow_mut().open_at_end = self.transactions.borrow().clone();
        self.segments.borrow_mut().push(Rc::new(new));
        self.unsealed.borrow_mut().push(old.clone());
        self.dir_changes.set(self.dir_changes.get() + 1);
        self.request_sync(old.next_offset.get());
        self.segments_changed();
        Ok(())
    }

    /// The append permit: held by whoever changes the segment list or writes (`Closed` once the
    /// log is closed).
    pub(super) async fn permit(&self) -> Result<glommio::sync::Permit<'_>> {
        self.append_permit
            .acquire_permit(1)
            .await
            .map_err(|_| Error::Closed)
    }

    /// Creates an empty segment at `base` with the log's settings (a failure is a storage error of
    /// the log's).
    pub(super) async fn create_segment(&self, base: i64) -> Result<Segment> {
        let (interval, direct) = {
            let c = self.config.borrow();
            (c.index_interval_bytes, c.direct_options())
        };
        Segment::create(&self.dir, base, interval, direct)
            .await
            .map_err(|e| self.storage.failed(&self.dir, e, false))
    }

    /// Waits until the segments rolled so far are sealed by the sync task. Not `sync_to` their end:
    /// a round that started before a roll makes everything written durable, the rolled segment's
    /// end included, without sealing it; the round after it does.
    pub(super) async fn wait_sealed(self: &Rc<Self>) -> Result<()> {
        loop {
            let sealing_to = self
                .unsealed
                .borrow()
                .iter()
                .map(|s| s.next_offset.get())
                .max();
            let Some(end) = sealing_to else {
                return Ok(());
            };
            let round = self.sync_rounds.value();
            // The task runs rounds while any segment is unsealed.
            self.request_sync(end);
            if !self.sync_rounds.wait_for(round + 1).await {
                return Err(self.sync_stopped());
            }
        }
    }

    pub(super) fn fail(&self, path: &Path, err: impl std::fmt::Display) -> Error {
        let why = format!(
            "fsync of {} failed: {err}; appends are refused until restart",
            path.display()
        );
        *self.failure.borrow_mut() = Some(why.clone());
        self.durable.close();
        self.sync_rounds.close();
        self.storage
            .failed(&self.dir, Error::storage(path, why), true)
    }

    /// Waits until everything below `target` is fsynced, starting a group-commit fsync if none runs.
    pub(super) async fn sync_to(self: &Rc<Self>, target: i64) -> Result<()> {
        if self.durable.value() >= target {
            return Ok(());
        }
        self.request_sync(target);
        if self.durable.wait_for(target).await {
            return Ok(());
        }
        Err(self.sync_stopped())
    }

    /// Why a wait on the sync task ended unanswered: the log failed (with why) or closed.
    fn sync_stopped(&self) -> Error {
        match &*self.failure.borrow() {
            Some(why) => Error::storage(&self.dir, why),
            None => Error::Closed,
        }
    }

    /// Asks for everything below `target` to be fsynced, starting the group-commit task unless it
    /// runs. Each fsync covers all that is written when it starts, so appends that arrive during one
    /// fsync share the next; the task stops once the highest target asked for is durable, so steady
    /// non-durable traffic does not keep it fsyncing.
    pub(super) fn request_sync(self: &Rc<Self>, target: i64) {
        self.sync_target.set(self.sync_target.get().max(target));
        if self.syncing.replace(true) {
            return;
        }
        let inner = self.clone();
        glommio::spawn_local(async move {
            while inner.failure.borrow().is_none()
                && (inner.durable.value() < inner.sync_target.get()
                    || !inner.unsealed.borrow().is_empty())
            {
                // What is written now lies in the segments rolled and not yet sealed, and the active one.
                let written = inner.high_watermark.value();
                // They stay listed as unsealed until sealed: a durable write meanwhile must wait.
                let sealing = inner.unsealed.borrow().clone();
                let dir_changes = inner.dir_changes.get();
                let seg = inner.active();
                let synced = inner.sync_once(&sealing, dir_changes, &seg).await;
                if synced {
                    inner.durable.advance(written);
                }
                inner.sync_rounds.advance(inner.sync_rounds.value() + 1);
                if !synced && inner.failure.borrow().is_none() {
                    // The open files budget had no room this round: try again shortly.
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                }
            }
            inner.syncing.set(false);
        })
        .detach();
    }

    /// One round of the sync task: seals the segments rolled since the last round (fsync, index
    /// file), makes new directory entries durable, then fsyncs the active segment. False when a step
    /// failed (the log is then failed), or found no room in the open files budget (nothing failed:
    /// the next round tries again).
    async fn sync_once(&self, sealing: &[Rc<Segment>], dir_changes: u64, active: &Segment) -> bool {
        for old in sealing {
            if let Err(e) = crate::latency::fsync(old.fdatasync()).await {
                self.fail_sync(&old.path, e);
                return false;
            }
            self.bump(|s| s.fsyncs += 1);
            if let Err(e) = write_index(old).await {
                self.storage.index_write_failed(&e);
            }
            self.unsealed.borrow_mut().retain(|u| !Rc::ptr_eq(u, old));
        }
        if dir_changes > self.dir_synced.get() {
            if let Err(e) = crate::latency::fsync(sync_dir(&self.dir)).await {
                self.fail_sync(&self.dir, e);
                return false;
            }
            self.dir_synced.set(self.dir_synced.get().max(dir_changes));
        }
        // What a checkpoint would record is taken before the fsync, which makes all of it durable.
        let checkpoint = self
            .checkpoint_due(active)
            .then(|| self.checkpoint_of(active));
        match crate::latency::fsync(active.fdatasync()).await {
            Ok(()) => {
                self.bump(|s| s.fsyncs += 1);
                if let Some(c) = checkpoint {
                    self.write_checkpoint(active, c).await;
                }
                true
            }
            Err(e) => {
                self.fail_sync(&active.path, e);
                false
            }
        }
    }

    /// A sync step failed: the log fails, unless the open files budget had no room for the file
    /// (logged once in a while; the step is tried again).
    fn fail_sync(&self, path: &Path, e: Error) {
        match e {
            Error::OpenFiles { .. } => log::debug!("sync deferred: {e}"),
            e => {
                self.fail(path, e);
            }
        }
    }
}

/// Gives a group's batches their offsets from `from` (mirrored ones keep theirs) and, with
/// `stamp`, their LogAppendTime; returns the appends kept and the next offset. Mirrored batches
/// that would land below what is written are refused (checked in order: each append's batches
/// already rise among themselves).
fn number(group: Vec<PendingAppend>, from: i64, stamp: Option<i64>) -> (Vec<PendingAppend>, i64) {
    let mut next = from;
    let mut kept = Vec::with_capacity(group.len());
    for mut p in group {
        if p.keep_offsets && p.headers[0].base_offset < next {
            p.done
                .send(Err(Error::InvalidBatch(InvalidBatch::OffsetsOverlap {
                    base_offset: p.headers[0].base_offset,
                    previous_last: next - 1,
                })));
            continue;
        }
        for h in &mut p.headers {
            if !p.keep_offsets {
                h.base_offset = next;
            }
            if let Some(now) = stamp {
                h.max_timestamp = now;
            }
            next = h.base_offset + h.offset_count();
        }
        kept.push(p);
    }
    (kept, next)
}

/// Bytes the active segment grows by between checkpoints: after a crash, recovery scans at most
/// about this much of it (and a sealed segment not at all).
pub(super) const CHECKPOINT_BYTES: u64 = 8 << 20;

/// The active segment's state at a checkpoint: its index and size, and the transactions in it.
pub(super) struct Checkpoint {
    index: crate::log::index::SparseIndex,
    meta: crate::log::index::SegmentMeta,
    txns: crate::transactions::SegmentTxns,
}

impl Inner {
    /// Has the sync task run (and checkpoint the active segment) once it grew enough.
    fn request_checkpoint(self: &Rc<Self>, active: &Segment, written: i64) {
        if self.checkpoint_due(active) {
            self.request_sync(written);
        }
    }

    /// Whether the active segment grew by [`CHECKPOINT_BYTES`] since its last checkpoint.
    pub(super) fn checkpoint_due(&self, active: &Segment) -> bool {
        let (base, size) = self.checkpointed.get();
        let since = if base == active.base_offset { size } else { 0 };
        active.size.get() >= since + CHECKPOINT_BYTES
    }

    fn checkpoint_of(&self, active: &Segment) -> Checkpoint {
        Checkpoint {
            index: active.index.borrow().clone(),
            meta: active.meta(),
            txns: crate::transactions::SegmentTxns {
                aborted: active.txns.borrow().aborted.clone(),
                open_at_end: self.transactions.borrow().clone(),
            },
        }
    }

    /// Writes the active segment's index file for the prefix `c` describes (fsynced now): what
    /// recovery trusts after a crash, scanning only what follows. A failure only costs a longer
    /// scan.
    async fn write_checkpoint(&self, active: &Segment, c: Checkpoint) {
        self.checkpointed.set((active.base_offset, c.meta.size));
        let res = async {
            if !c.txns.is_empty() {
                let txns = c.txns.encode(active.base_offset, c.meta.size);
                write_file(&active.txn_index_path(), txns).await?;
            }
            write_file(&active.index_path(), c.index.encode(&c.meta)).await
        }
        .await;
        if let Err(e) = res {
            self.storage.index_write_failed(&e);
        }
    }
}

thread_local! {
    /// Whether this core's housekeeping task runs.
    static HOUSEKEEPING: Cell<bool> = const { Cell::new(false) };
}

/// Longest the housekeeping task sleeps between rounds.
const HOUSEKEEPING_MAX_TICK: Duration = Duration::from_secs(1);
/// Shortest it sleeps, unless a log asks to be flushed more often: logs that come due within it
/// wait for the same round (a round goes through every log of the core).
const HOUSEKEEPING_MIN_TICK: Duration = Duration::from_millis(100);

/// Starts this core's housekeeping task unless it runs: it flushes each open log on its
/// `flush_interval` and checks its retention on its `retention_check_interval`. One task goes
/// through the core's logs (a task and a timer per log would wake as many times a second as
/// there are partitions).
pub(super) fn start_housekeeping() {
    if HOUSEKEEPING.with(|h| h.replace(true)) {
        return;
    }
    glommio::spawn_local(async {
        loop {
            let tick = housekeeping_round();
            glommio::timer::sleep(tick).await;
        }
    })
    .detach();
}

/// One round: flushes and retention checks of the logs due; how long until the next is due.
fn housekeeping_round() -> Duration {
    let now = Instant::now();
    let mut next = HOUSEKEEPING_MAX_TICK;
    let mut shortest = HOUSEKEEPING_MIN_TICK;
    let (mut flush, mut retention) = (Vec::new(), Vec::new());
    OPEN_LOGS.with(|logs| {
        for weak in logs.borrow().iter() {
            let Some(inner) = weak.0.upgrade() else {
                continue;
            };
            if inner.closed.get() {
                continue;
            }
            let (flush_every, retention_every) = {
                let c = inner.config.borrow();
                (c.flush_interval, c.retention_check_interval)
            };
            let (flushed, checked) = inner.housekept.get();
            shortest = shortest.min(flush_every.unwrap_or(shortest));
            let mut due = |last: Instant, every: Duration, list: &mut Vec<Rc<Inner>>| {
                let at = last + every.max(Duration::from_millis(1));
                if at <= now {
                    list.push(inner.clone());
                    next = next.min(every);
                    true
                } else {
                    next = next.min(at - now);
                    false
                }
            };
            let flushed = match flush_every {
                Some(every) if due(flushed, every, &mut flush) => now,
                _ => flushed,
            };
            let checked = match due(checked, retention_every, &mut retention) {
                true => now,
                false => checked,
            };
            inner.housekept.set((flushed, checked));
        }
    });
    for inner in flush {
        let hw = inner.high_watermark.value();
        if inner.durable.value() < hw {
            inner.request_sync(hw);
        }
    }
    for inner in retention {
        glommio::spawn_local(async move {
            if let Err(e) = (Log { inner }).enforce_retention().await {
                log::warn!("retention check failed: {e}");
            }
        })
        .detach();
    }
    next.max(shortest).max(Duration::from_millis(1))
}

/// Saves a sealed segment's transaction index (when it has something to say) and then its index,
/// which marks it clean: a clean segment's transaction index is on disk, or empty. A failure only
/// costs a scan at start-up.
pub(super) async fn write_index(seg: &Segment) -> Result<()> {
    let txns = seg.txns.borrow().clone();
    if !txns.is_empty() {
        write_file(
            &seg.txn_index_path(),
            txns.encode(seg.base_offset, seg.size.get()),
        )
        .await?;
    } else if let Err(e) = glommio::io::remove(seg.txn_index_path()).await {
        // One written at a checkpoint, when transactions were open, is stale now.
        if !matches!(&e, glommio::GlommioError::IoError(io) if io.kind() == std::io::ErrorKind::NotFound)
        {
            return Err(Error::storage(seg.txn_index_path(), e));
        }
    }
    let bytes = seg.index.borrow().encode(&seg.meta());
    write_file(&seg.index_path(), bytes).await?;
    seg.sealed.set(true);
    Ok(())
}

/// Writes a whole small file and fdatasyncs it.
pub(super) async fn write_file(path: &Path, bytes: Vec<u8>) -> Result<()> {
    let _permit = super::open_files::permit(path).await?;
    let res = async {
        let f = glommio::io::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .buffered_open(path)
            .await?;
        let len = bytes.len();
        let n = f.write_at(bytes, 0).await?;
        if n != len {
            return Err(glommio::GlommioError::IoError(std::io::Error::other(
                "short write",
            )));
        }
        crate::latency::fsync(f.fdatasync()).await?;
        f.close().await
    }
    .await;
    res.map_err(|e| Error::storage(path, e))
}
