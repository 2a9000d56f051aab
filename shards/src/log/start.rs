//! The log start offset DeleteRecords sets: above the first segment's base where it falls inside a
//! segment, kept in `log-start-offset` (written atomically) so that a restart reads from it too, and
//! the whole segments below it deleted at once.

use super::*;

/// The file that keeps the log start offset DeleteRecords set.
const START_FILE: &str = "log-start-offset";

/// The log start offset DeleteRecords set last (0 when it never did); blocking, at open.
pub(super) fn read_start(dir: &Path) -> i64 {
    std::fs::read_to_string(dir.join(START_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&o: &i64| o >= 0)
        .unwrap_or(0)
}

/// Removes the saved log start.
pub(super) async fn forget(dir: &Path) {
    let path = dir.join(START_FILE);
    if let Err(e) = glommio::io::remove(&path).await {
        log::warn!("could not remove {}: {e}", path.display());
    }
}

impl Log {
    /// Moves the log start offset to `offset` (Kafka's DeleteRecords; `-1`: the high watermark):
    /// reads and ListOffsets' earliest start there at once, the start is saved before this returns,
    /// and whole segments below it are deleted (never the active one). Returns the log start
    /// offset after it, which an offset at or below the current start leaves alone.
    /// `OffsetOutOfRange` past the high watermark or below -1.
    pub async fn delete_records(&self, offset: i64) -> Result<i64> {
        let inner = &self.inner;
        let _permit = inner.permit().await?;
        inner.check_writable()?;
        let hw = inner.high_watermark.value();
        let target = if offset == -1 { hw } else { offset };
        if !(0..=hw).contains(&target) {
            return Err(Error::OffsetOutOfRange {
                offset,
                log_start_offset: inner.log_start_offset(),
                high_watermark: hw,
            });
        }
        if target <= inner.log_start_offset() {
            return Ok(inner.log_start_offset());
        }
        // The records below a saved start are durable first: a crash can then not recover an
        // end below the start (which would hide the records written after the restart).
        inner.sync_to(target).await?;
        let path = inner.dir.join(START_FILE);
        let (file, text) = (path.clone(), target.to_string());
        glommio::executor()
            .spawn_blocking(move || crate::files::write_atomically(&file, text.as_bytes()))
            .await
            .map_err(|e| {
                inner
                    .storage
                    .failed(&inner.dir, Error::storage(path, e), false)
            })?;
        inner.start_floor.set(target);
        // The change reaches read replicas before any segment file goes.
        inner.segments_changed();
        // The start has moved; should the segments not go now, retention takes them later.
        if let Err(e) = inner.wait_sealed().await {
            log::warn!(
                "{}: whole segments below {target} stay for now: {e}",
                inner.dir.display()
            );
            return Ok(inner.log_start_offset());
        }
        let deleted = inner
            .delete_leading("records deleted", |s| s.next_offset.get() <= target)
            .await;
        log::info!(
            "deleted records below offset {target} of {} ({deleted} whole segments)",
            inner.dir.display()
        );
        Ok(inner.log_start_offset())
    }
}

impl Inner {
    /// Deletes the oldest sealed segments (never the active one, nor one still being sealed) as
    /// long as `doomed` takes them, telling read replicas; returns how many went. Hold the permit.
    pub(super) async fn delete_leading(
        &self,
        why: &str,
        mut doomed: impl FnMut(&Segment) -> bool,
    ) -> usize {
        let gone: Vec<Rc<Segment>> = {
            let mut segs = self.segments.borrow_mut();
            let unsealed = self.unsealed.borrow();
            let n = segs[..segs.len() - 1]
                .iter()
                .take_while(|s| !unsealed.iter().any(|u| Rc::ptr_eq(u, s)) && doomed(s))
                .count();
            segs.drain(..n).collect()
        };
        if gone.is_empty() {
            return 0;
        }
        self.segments_changed();
        for seg in &gone {
            log::info!(
                "{why}: deleting {} (offsets {}..{}, {} bytes)",
                seg.path.display(),
                seg.base_offset,
                seg.next_offset.get(),
                seg.size.get()
            );
            remove_segment_files(seg).await;
        }
        gone.len()
    }
}
