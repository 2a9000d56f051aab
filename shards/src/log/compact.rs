//! Compaction of one log (Kafka's log cleaner): the latest record per key is kept, older records of
//! the same key, expired tombstones and records without a key are removed, and offsets never change
//! (removed records leave gaps, as in Kafka).
//!
//! A pass, run by the core's compactor (`crate::compactor`) when the log is due:
//! 1. **Plan.** The compactable segments are the sealed ones before the active segment whose newest
//!    record is older than `min.compaction.lag.ms`. Those below the cleaner checkpoint (the first
//!    dirty offset, kept in `cleaner-offset-checkpoint`) are clean; the rest are dirty.
//! 2. **Map.** One read of the compactable segments records the last batch of every idempotent
//!    producer, and the dirty segments' records give the latest offset of every key (bounded by
//!    [`MAP_BYTES`]; the pass then stops at the last segment that fitted).
//! 3. **Rewrite.** The mapped segments are grouped (a group fits one segment) and each group is
//!    written to `<base>.log.cleaned` (and its index to `<base>.index.cleaned`) with only the
//!    records to keep. A batch keeps its base offset and last offset delta, so offsets and an
//!    idempotent producer's sequence numbers survive; a producer's last batch is kept even when
//!    none of its records is, as an empty batch, so its state can be rebuilt from the log.
//! 4. **Swap**, crash-safe: `<base>.log.cleaned` is renamed `<base>.<end>.swap` and the directory
//!    fsynced (the commit point); the group's old files are removed; the swap file is renamed
//!    `<base>.log`. Recovery removes `*.cleaned` files and finishes any `.swap` it finds (see
//!    [`finish_interrupted`]). In memory, the new segment replaces the group in one step (no await),
//!    the old segments are retired (reads in flight finish on their open files), the tail cache
//!    forgets what it held below the group's end, and [`Log::layout`] changes, so the fetch
//!    coalescer does not serve results read before.
//!
//! Nothing here takes the append permit: appends and the sync task touch only the active and
//! unsealed segments, which compaction never does, and retention waits while a pass runs.

use super::*;
use crate::batch::{rebuild, record_spans, records_section, BatchHeader};
use std::collections::HashMap;

/// The file holding the first dirty offset (everything below it was compacted).
const CHECKPOINT: &str = "cleaner-offset-checkpoint";
/// Memory for one pass's key map (key bytes plus about 48 bytes per key).
pub const MAP_BYTES: usize = 64 << 20;
/// One read of a pass, one at a time and without read-ahead: a pass never queues more than this
/// on the device ahead of the core's appends.
const READ_BYTES: usize = 256 << 10;
const WRITE_BYTES: usize = 1 << 20;
/// CPU a pass takes before it lets the core's other task queues run.
const SLICE: Duration = Duration::from_micros(500);
/// How long it then steps aside.
const PAUSE: Duration = Duration::from_micros(20);
/// After a failed pass, the log is not tried again for this long.
const RETRY_AFTER_MS: i64 = 60_000;

/// Compaction state of one log.
#[derive(Debug, Default)]
pub(super) struct CompactionState {
    /// Everything below was compacted at least once.
    pub(super) first_dirty: i64,
    /// When the earliest tombstone kept by the last pass expires (a pass is due then).
    pub(super) tombstone_horizon: Option<i64>,
    /// A pass is running: retention waits, and no second pass starts.
    pub(super) running: bool,
    /// No pass before this wall-clock time (after a failure).
    pub(super) not_before: i64,
}

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactionStats {
    pub segments_before: usize,
    pub segments_after: usize,
    /// Bytes of the segments rewritten (what was cleaned).
    pub read_bytes: u64,
    /// Bytes of the segments that replaced them.
    pub written_bytes: u64,
    pub records_removed: u64,
    pub tombstones_removed: u64,
    /// Transaction markers removed: their transaction's records all gone, and older than
    /// `delete.retention.ms`.
    pub markers_removed: u64,
    /// The first dirty offset after the pass.
    pub cleaned_to: i64,
}

/// The first dirty offset saved by the last pass (0 when none was).
pub(super) fn read_checkpoint(dir: &Path) -> i64 {
    std::fs::read_to_string(dir.join(CHECKPOINT))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Finishes what a crash interrupted (blocking; at open, before the segments are listed):
/// `*.cleaned` files are removed (the pass had not committed), and each `<base>.<end>.swap` file
/// replaces the segments it covers (`base <= offset < end`), as its pass had committed to.
pub(super) fn finish_interrupted(dir: &Path) -> std::io::Result<()> {
    let mut changed = false;
    let mut swaps = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".cleaned") {
            log::warn!("recovery: removing {name}, left by an interrupted compaction");
            std::fs::remove_file(entry.path())?;
            changed = true;
        } else if let Some(stem) = name.strip_suffix(".swap") {
            let range = stem
                .split_once('.')
                .and_then(|(b, e)| Some((b.parse::<i64>().ok()?, e.parse::<i64>().ok()?)));
            match range {
                Some((base, end)) if base < end => swaps.push((base, end, entry.path())),
                _ => log::warn!("recovery: ignoring {name}: not a compaction swap file"),
            }
        }
    }
    for (base, end, swap) in swaps {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((stem, ext)) = name.split_once('.') else {
                continue;
            };
            let covered = stem.len() == 20
                && matches!(ext, "log" | "index" | "txnindex")
                && stem.parse::<i64>().is_ok_and(|o| base <= o && o < end);
            if covered {
                std::fs::remove_file(entry.path())?;
            }
        }
        std::fs::rename(
            &swap,
            dir.join(crate::log::segment::segment_file_name(base)),
        )?;
        log::warn!(
            "recovery: finished the compaction of offsets {base}..{end} in {}",
            dir.display()
        );
        changed = true;
    }
    if changed {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The rewritten group, on disk under temporary names.
struct Cleaned {
    path: PathBuf,
    index_path: PathBuf,
    /// The group's transaction index (written only when not empty).
    txn_index_path: PathBuf,
    txns: crate::transactions::SegmentTxns,
    file: crate::log::open_files::Counted<glommio::io::BufferedFile>,
    index: SparseIndex,
    meta: SegmentMeta,
}

/// What the map pass learnt.
#[derive(Default)]
struct KeyMap {
    /// The latest offset of each key in the mapped dirty segments.
    latest: HashMap<Box<[u8]>, i64>,
    bytes: usize,
    /// The base offset of each idempotent producer's last batch in the compactable segments.
    last_batch: HashMap<i64, i64>,
    /// Each producer's aborted transactions (first offset, marker offset), from the whole log's
    /// aborted index: their records are removed, and never count as a key's latest value.
    aborted: HashMap<i64, Vec<(i64, i64)>>,
}

impl KeyMap {
    /// Whether batch `h` belongs to an aborted transaction.
    fn is_aborted(&self, h: &BatchHeader) -> bool {
        h.is_transactional()
            && !h.is_control()
            && self.aborted.get(&h.producer_id).is_some_and(|ranges| {
                ranges
                    .iter()
                    .any(|&(first, last)| first <= h.base_offset && h.base_offset < last)
            })
    }
}

impl Cleaned {
    /// Batch `h` is written at `pos` of the cleaned segment (based at `base`): indexed, and its
    /// timestamps and offsets counted in.
    fn add(&mut self, h: &BatchHeader, base: i64, pos: u64) {
        self.index
            .maybe_add((h.base_offset - base) as u32, pos as u32);
        if self.meta.first_timestamp < 0 {
            self.meta.first_timestamp = h.max_timestamp;
        }
        self.meta.max_timestamp = self.meta.max_timestamp.max(h.max_timestamp);
        self.meta.next_offset = h.last_offset() + 1;
    }
}

/// What compaction does with a transaction marker (Kafka's rule): kept while any record of its
/// transaction is; once none is, kept for `delete.retention.ms` after it was written (a consumer
/// part way through the transaction still sees it end), then removed.
enum MarkerFate {
    Keep,
    KeepUntil(i64),
    Remove,
}

/// Transactions followed through a pass's groups, in log order from the log's start.
struct TxnWalk {
    /// Per producer: whether the transaction being walked through kept a record.
    kept: HashMap<i64, bool>,
    delete_ms: i64,
    now: i64,
}

impl TxnWalk {
    /// The fate of batch `h` (`Keep` for all but markers), of which records were kept if
    /// `kept_records`; a producer's last batch is kept whatever it is (its epoch fences).
    fn fate(
        &mut self,
        h: &BatchHeader,
        kept_records: bool,
        last_of_producer: bool,
        seg: &Segment,
    ) -> MarkerFate {
        if !h.is_control() {
            if h.is_transactional() {
                *self.kept.entry(h.producer_id).or_default() |= kept_records;
            }
            return MarkerFate::Keep;
        }
        if self.kept.remove(&h.producer_id).unwrap_or(false) || last_of_producer {
            return MarkerFate::Keep;
        }
        let written_at = if h.max_timestamp >= 0 {
            h.max_timestamp
        } else {
            seg.last_modified_ms.get()
        };
        let expires = written_at.saturating_add(self.delete_ms);
        if expires <= self.now {
            MarkerFate::Remove
        } else {
            MarkerFate::KeepUntil(expires)
        }
    }
}

/// Moves `horizon` (when the next pass has something to remove) to `t` if earlier.
fn earliest(horizon: &mut Option<i64>, t: i64) {
    *horizon = Some(horizon.map_or(t, |h| h.min(t)));
}

/// Lets other task queues run after each [`SLICE`] of work.
struct Slicer(Instant);

impl Slicer {
    async fn pause(&mut self) {
        if self.0.elapsed() >= SLICE {
            // A short sleep, not a yield: glommio runs a queue that yields again at once if no
            // other queue is runnable, without polling for completed I/O or timers, so the tasks
            // those would wake (an append's write completing, a long poll's timer) would wait
            // until the pass awaits I/O. A timer makes the executor poll.
            glommio::timer::sleep(PAUSE).await;
            self.0 = Instant::now();
        }
    }
}

impl Log {
    /// Whether a compaction pass is due now, and if so how dirty the log is (the share of the
    /// compactable bytes not compacted yet): the log is compacted, not closed or failed, and its
    /// dirty share reached `min.cleanable.dirty.ratio`, or its oldest dirty record is older than
    /// `max.compaction.lag.ms`, or a kept tombstone expired.
    pub fn compaction_due(&self, now_ms: i64) -> Option<f64> {
        let inner = &self.inner;
        let c = inner.config.borrow();
        let state = inner.compaction.borrow();
        if !c.cleanup_compact
            || state.running
            || now_ms < state.not_before
            || inner.closed.get()
            || inner.failure.borrow().is_some()
        {
            return None;
        }
        let segs = inner.compactable(now_ms, &c);
        let (mut clean, mut dirty) = (0u64, 0u64);
        let mut oldest_dirty = None;
        for s in &segs {
            if s.next_offset.get() <= state.first_dirty {
                clean += s.size.get();
            } else {
                dirty += s.size.get();
                oldest_dirty.get_or_insert(s.first_timestamp.get().max(0));
            }
        }
        let ratio = dirty as f64 / (clean + dirty).max(1) as f64;
        let by_ratio = dirty > 0 && ratio >= c.min_cleanable_dirty_ratio;
        let overdue = c
            .max_compaction_lag
            .is_some_and(|lag| oldest_dirty.is_some_and(|t| t <= now_ms - lag.as_millis() as i64));
        let tombstones = !segs.is_empty() && state.tombstone_horizon.is_some_and(|h| h <= now_ms);
        (by_ratio || overdue || tombstones).then_some(ratio)
    }

    /// Runs one compaction pass over whatever is compactable now, due or not (the compactor calls
    /// it for logs that are due; tests and benchmarks call it directly).
    pub async fn compact_now(&self) -> Result<CompactionStats> {
        let inner = &self.inner;
        inner.check_open_owner()?;
        {
            // Retention holds the permit while it deletes: start between two of its runs.
            let _permit = inner.permit().await?;
            let mut state = inner.compaction.borrow_mut();
            if state.running {
                return Ok(CompactionStats::default());
            }
            state.running = true;
        }
        struct Running<'a>(&'a Inner);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.compaction.borrow_mut().running = false;
            }
        }
        let _running = Running(inner);
        let result = inner.compact_pass(now_ms()).await;
        match &result {
            Ok(s) => inner.bump(|st| {
                st.compactions += 1;
                st.compaction_read_bytes += s.read_bytes;
                st.compaction_written_bytes += s.written_bytes;
            }),
            Err(e) if !inner.closed.get() => {
                inner.compaction.borrow_mut().not_before = now_ms() + RETRY_AFTER_MS;
                log::warn!(
                    "compaction of {} failed (next try in {} s): {e}",
                    inner.dir.display(),
                    RETRY_AFTER_MS / 1000
                );
            }
            Err(_) => {}
        }
        result
    }

    /// Changes whenever compaction replaces segments: results read before a change may hold
    /// records compacted away since (see [`crate::CoalesceKey::layout`]).
    pub fn layout(&self) -> u64 {
        self.inner.layout.get()
    }

    /// The first offset not compacted yet (everything below was compacted at least once).
    pub fn first_dirty_offset(&self) -> i64 {
        self.inner
            .compaction
            .borrow()
            .first_dirty
            .max(self.log_start_offset())
    }

    /// Refuses batches a compacted log cannot keep (records without a key); other logs take
    /// anything. `headers` are [`batch::validate_all`]'s result for `blob`.
    pub fn check_keys(&self, blob: &[u8], headers: &[BatchHeader]) -> Result<()> {
        if self.inner.config.borrow().cleanup_compact {
            batch::check_keys(blob, headers)?;
        }
        Ok(())
    }
}

impl Inner {
    /// The segments a pass may rewrite now, oldest first: every segment before the active one that
    /// is sealed, and whose newest record is older than `min.compaction.lag.ms`, up to the first
    /// that is not.
    fn compactable(&self, now_ms: i64, c: &LogConfig) -> Vec<Rc<Segment>> {
        let lag = c.min_compaction_lag.as_millis() as i64;
        let segs = self.segments.borrow();
        let unsealed = self.unsealed.borrow();
        segs[..segs.len().saturating_sub(1)]
            .iter()
            .take_while(|s| {
                // Not past the last stable offset: an open transaction's records may still be
                // aborted, and must not replace a key's committed value (Kafka's cleaner stops
                // there too).
                s.sealed.get()
                    && !unsealed.iter().any(|u| Rc::ptr_eq(u, s))
                    && s.retention_timestamp() <= now_ms - lag
                    && s.next_offset.get() <= self.last_stable.value()
            })
            .cloned()
            .collect()
    }

    async fn compact_pass(self: &Rc<Self>, now: i64) -> Result<CompactionStats> {
        let config = self.config.borrow().clone();
        let segs = self.compactable(now, &config);
        // Where the segment after them starts. Only compaction replaces segments before the
        // active one, and retention waits while it runs, so this stays true during the pass.
        let after = self.segments.borrow()[segs.len()].base_offset;
        let mut stats = CompactionStats {
            segments_before: self.segments.borrow().len(),
            ..CompactionStats::default()
        };
        let first_dirty = self.compaction.borrow().first_dirty;
        let mut slicer = Slicer(Instant::now());
        // 1. The key map over the dirty segments, and producers' last batches over all.
        let mut map = KeyMap::default();
        for seg in self.segments.borrow().iter() {
            for a in &seg.txns.borrow().aborted {
                map.aborted
                    .entry(a.producer_id)
                    .or_default()
                    .push((a.first_offset, a.last_offset));
            }
        }
        let mut mapped = 0;
        for seg in &segs {
            let dirty = seg.next_offset.get() > first_dirty;
            if dirty && map.bytes >= MAP_BYTES && mapped > 0 {
                break;
            }
            let mut at = seg.base_offset;
            while let Some(read) = next_batches(seg, &mut at).await? {
                for (h, bytes) in read.batches() {
                    if h.producer_id >= 0 {
                        map.last_batch.insert(h.producer_id, h.base_offset);
                    }
                    // Markers' control records and aborted records are no key's value.
                    if dirty && !h.is_control() && !map.is_aborted(&h) {
                        let plain = records_section(&h, &bytes)?;
                        for r in record_spans(&h, &plain)? {
                            if let Some(k) = r.key {
                                let offset = h.base_offset + r.offset_delta as i64;
                                if map.latest.insert(plain[k.clone()].into(), offset).is_none() {
                                    map.bytes += k.len() + 48;
                                }
                            }
                        }
                    }
                    slicer.pause().await;
                }
            }
            mapped += 1;
        }
        // 2. Groups of consecutive segments that fit one segment, each rewritten and swapped in.
        let mut groups: Vec<Vec<Rc<Segment>>> = Vec::new();
        for seg in &segs[..mapped] {
            match groups.last_mut() {
                Some(g)
                    if g.iter().map(|s| s.size.get()).sum::<u64>() + seg.size.get()
                        <= config.segment_bytes
                        && seg.next_offset.get() - 1 - g[0].base_offset
                            <= crate::log::segment::MAX_RELATIVE_OFFSET =>
                {
                    g.push(seg.clone())
                }
                _ => groups.push(vec![seg.clone()]),
            }
        }
        let cleaned_to = segs.get(mapped).map_or(after, |s| s.base_offset);
        let mut horizon = None;
        // The groups are walked in order from the log's start: per producer, whether the
        // transaction being walked through kept a record (which decides its marker's fate).
        let mut txns_walked = TxnWalk {
            kept: HashMap::new(),
            delete_ms: config.delete_retention.as_millis() as i64,
            now,
        };
        for (i, group) in groups.iter().enumerate() {
            let end = groups
                .get(i + 1)
                .map_or(cleaned_to, |g: &Vec<Rc<Segment>>| g[0].base_offset);
            let cleaned = self
                .clean_group(
                    group,
                    &map,
                    &config,
                    now,
                    &mut stats,
                    &mut horizon,
                    &mut txns_walked,
                    &mut slicer,
                )
                .await?;
            let read: u64 = group.iter().map(|s| s.size.get()).sum();
            if group.len() == 1 && cleaned.meta.size == read {
                // Nothing removed: the segment stays as it is.
                discard(&cleaned).await;
                continue;
            }
            stats.read_bytes += read;
            stats.written_bytes += cleaned.meta.size;
            if !self.swap(group, cleaned, end).await? {
                return Err(Error::Closed);
            }
        }
        // 3. Everything mapped is compacted now.
        {
            let mut state = self.compaction.borrow_mut();
            state.first_dirty = state.first_dirty.max(cleaned_to);
            state.tombstone_horizon = horizon;
        }
        let path = self.dir.join(CHECKPOINT);
        let text = cleaned_to.to_string();
        glommio::executor()
            .spawn_blocking(move || crate::files::write_atomically(&path, text.as_bytes()))
            .await
            .map_err(|e| Error::storage(self.dir.join(CHECKPOINT), e))?;
        stats.segments_after = self.segments.borrow().len();
        stats.cleaned_to = cleaned_to;
        if stats.read_bytes > 0 {
            log::info!(
                "compacted {}: {} segments -> {}, {} bytes -> {}, {} records and {} tombstones removed, clean up to offset {cleaned_to}",
                self.dir.display(),
                stats.segments_before,
                stats.segments_after,
                stats.read_bytes,
                stats.written_bytes,
                stats.records_removed,
                stats.tombstones_removed,
            );
        }
        Ok(stats)
    }

    /// Writes the records of `group` that compaction keeps into `<base>.log.cleaned`, fsynced,
    /// with its index in `<base>.index.cleaned`.
    #[allow(clippy::too_many_arguments)]
    async fn clean_group(
        &self,
        group: &[Rc<Segment>],
        map: &KeyMap,
        config: &LogConfig,
        now: i64,
        stats: &mut CompactionStats,
        horizon: &mut Option<i64>,
        txns_walked: &mut TxnWalk,
        slicer: &mut Slicer,
    ) -> Result<Cleaned> {
        let base = group[0].base_offset;
        let path = self.dir.join(format!("{base:020}.log.cleaned"));
        let index_path = self.dir.join(format!("{base:020}.index.cleaned"));
        let txn_index_path = self.dir.join(format!("{base:020}.txnindex.cleaned"));
        // The group's aborted transactions are carried over (their offsets do not change), and
        // the transactions open at its end are those open at its last segment's.
        let mut txns = crate::transactions::SegmentTxns::default();
        for seg in group {
            let t = seg.txns.borrow();
            txns.aborted.extend_from_slice(&t.aborted);
            txns.open_at_end = t.open_at_end.clone();
        }
        let file = create_counted(&path).await?;
        let mut out = Cleaned {
            path,
            index_path,
            txn_index_path,
            txns,
            file,
            index: SparseIndex::new(config.index_interval_bytes),
            meta: SegmentMeta {
                size: 0,
                next_offset: base,
                max_timestamp: -1,
                first_timestamp: -1,
            },
        };
        let result = async {
            let delete_ms = config.delete_retention.as_millis() as i64;
            let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BYTES + (64 << 10));
            let mut written = 0u64;
            for seg in group {
                let mut at = seg.base_offset;
                while let Some(read) = next_batches(seg, &mut at).await? {
                    for (h, bytes) in read.batches() {
                        let plain = records_section(&h, &bytes)?;
                        let spans = record_spans(&h, &plain)?;
                        let mut keep = Vec::with_capacity(spans.len());
                        let aborted = map.is_aborted(&h);
                        for r in &spans {
                            let offset = h.base_offset + r.offset_delta as i64;
                            if aborted {
                                stats.records_removed += 1;
                                continue;
                            }
                            // Records without a key cannot be compacted: Kafka's cleaner drops them too.
                            let Some(k) = &r.key else {
                                stats.records_removed += 1;
                                continue;
                            };
                            if map
                                .latest
                                .get(&plain[k.clone()])
                                .is_some_and(|&l| l > offset)
                            {
                                stats.records_removed += 1;
                                continue;
                            }
                            if r.tombstone {
                                let written_at = if h.max_timestamp >= 0 {
                                    h.max_timestamp
                                } else {
                                    seg.last_modified_ms.get()
                                };
                                let expires = written_at.saturating_add(delete_ms);
                                if expires <= now {
                                    stats.tombstones_removed += 1;
                                    continue;
                                }
                                earliest(horizon, expires);
                            }
                            keep.push(r.span.clone());
                        }
                        let last_of_producer = h.producer_id >= 0
                            && map.last_batch.get(&h.producer_id) == Some(&h.base_offset);
                        match txns_walked.fate(&h, !keep.is_empty(), last_of_producer, seg) {
                            MarkerFate::Remove => {
                                stats.markers_removed += 1;
                                out.txns.forget_aborted(h.producer_id, h.base_offset);
                                continue;
                            }
                            MarkerFate::KeepUntil(expires) => earliest(horizon, expires),
                            MarkerFate::Keep => {}
                        }
                        let whole =
                            h.is_control() || !spans.is_empty() && keep.len() == spans.len();
                        let batch: std::borrow::Cow<[u8]> = if whole {
                            bytes[..].into()
                        } else if !keep.is_empty() || last_of_producer {
                            rebuild(&h, &plain, &keep).into()
                        } else {
                            continue;
                        };
                        out.add(&h, base, written + buf.len() as u64);
                        buf.extend_from_slice(&batch);
                        if buf.len() >= WRITE_BYTES {
                            written += write_all(&out, std::mem::take(&mut buf), written).await?;
                            buf.reserve(WRITE_BYTES);
                        }
                        slicer.pause().await;
                    }
                }
            }
            if !buf.is_empty() {
                written += write_all(&out, buf, written).await?;
            }
            out.meta.size = written;
            out.file
                .fdatasync()
                .await
                .map_err(|e| Error::storage(&out.path, e))?;
            if !out.txns.is_empty() {
                let txns = out.txns.encode(base, out.meta.size);
                writer::write_file(&out.txn_index_path, txns).await?;
            }
            let index = out.index.encode(&out.meta);
            writer::write_file(&out.index_path, index).await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(out),
            Err(e) => {
                discard(&out).await;
                Err(e)
            }
        }
    }

    /// Puts a rewritten group in place of `group` (whose successor starts at `end`), on disk
    /// (crash-safe: see the module docs) and in memory. False if the log closed meanwhile (the
    /// swap is then finished on disk by the next open, or was not started).
    async fn swap(&self, group: &[Rc<Segment>], cleaned: Cleaned, end: i64) -> Result<bool> {
        if self.closed.get() {
            discard(&cleaned).await;
            return Ok(false);
        }
        // Readers still holding the group's segments go on reading their files once the paths
        // name the new one: their handles are opened now and kept.
        for s in group {
            if let Err(e) = s.files.pin(true).await {
                discard(&cleaned).await;
                return Err(e);
            }
        }
        let base = group[0].base_offset;
        let swap_path = self.dir.join(format!("{base:020}.{end:020}.swap"));
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |e| Error::storage(p, e)
        };
        glommio::io::rename(&cleaned.path, &swap_path)
            .await
            .map_err(io(&cleaned.path))?;
        sync_dir(&self.dir).await?;
        // Committed: from here on a restart finishes the swap whatever happens.
        for s in group {
            remove_segment_files(s).await;
        }
        let final_path = self.dir.join(crate::log::segment::segment_file_name(base));
        glommio::io::rename(&swap_path, &final_path)
            .await
            .map_err(io(&swap_path))?;
        // The transaction index before the index, which marks the segment clean (see
        // `write_index`); without it in place the segment is scanned at the next open.
        let txns_in_place = cleaned.txns.is_empty()
            || glommio::io::rename(
                &cleaned.txn_index_path,
                self.dir
                    .join(crate::transactions::txn_index_file_name(base)),
            )
            .await
            .is_ok();
        let index_in_place = txns_in_place
            && glommio::io::rename(
                &cleaned.index_path,
                self.dir.join(crate::log::segment::index_file_name(base)),
            )
            .await
            .is_ok();
        let files =
            crate::log::open_files::Handles::with_buffered(final_path.clone(), cleaned.file);
        let seg = Segment::with_meta(
            final_path,
            files,
            base,
            cleaned.index,
            cleaned.meta,
            group.last().map_or(now_ms(), |s| s.last_modified_ms.get()),
        );
        seg.sealed.set(index_in_place);
        *seg.txns.borrow_mut() = cleaned.txns;
        // In memory, in one step: readers see either the old segments or the new one.
        {
            let mut segs = self.segments.borrow_mut();
            let Some(i) = segs.iter().position(|s| Rc::ptr_eq(s, &group[0])) else {
                // Only a closing log loses its segments (all of them, the active one too); the
                // disk holds the swap.
                return Ok(false);
            };
            let active = segs.last().expect("the log holds the group, so a segment");
            seg.set_direct_reads(active.writes_direct());
            debug_assert!(group
                .iter()
                .enumerate()
                .all(|(k, g)| Rc::ptr_eq(&segs[i + k], g)));
            segs.splice(i..i + group.len(), [Rc::new(seg)]);
        }
        for s in group {
            s.retire();
        }
        self.layout.set(self.layout.get() + 1);
        self.cache.forget_below(self.cache_id, end);
        self.segments_changed();
        Ok(true)
    }
}

/// The next whole batches of `seg` from `*at` (about [`READ_BYTES`]), moving `*at` past them;
/// `None` at the segment's end.
async fn next_batches(seg: &Segment, at: &mut i64) -> Result<Option<Records>> {
    if *at >= seg.next_offset.get() {
        return Ok(None);
    }
    let read = seg.read_with(*at, READ_BYTES, true, false).await?;
    match read.next_offset() {
        Some(next) => {
            *at = next;
            Ok(Some(read))
        }
        None => Ok(None),
    }
}

/// Creates (or empties) the cleaned file at `path`, holding a permit of the open files budget.
async fn create_counted(
    path: &Path,
) -> Result<crate::log::open_files::Counted<glommio::io::BufferedFile>> {
    let permit = crate::log::open_files::permit(path).await?;
    let file = glommio::io::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .buffered_open(path)
        .await
        .map_err(|e| Error::storage(path, e))?;
    Ok(crate::log::open_files::Counted::new(file, permit))
}

/// Writes `buf` at `pos` of the cleaned file; returns its length.
async fn write_all(out: &Cleaned, buf: Vec<u8>, pos: u64) -> Result<u64> {
    let len = buf.len();
    let n = out
        .file
        .write_at(buf, pos)
        .await
        .map_err(|e| Error::storage(&out.path, e))?;
    if n != len {
        return Err(Error::storage(
            &out.path,
            format!("short write: {n} of {len} bytes (the disk may be full)"),
        ));
    }
    Ok(len as u64)
}

/// Removes a rewritten group that will not be swapped in.
async fn discard(c: &Cleaned) {
    for p in [&c.path, &c.index_path, &c.txn_index_path] {
        let _ = glommio::io::remove(p).await;
    }
}
