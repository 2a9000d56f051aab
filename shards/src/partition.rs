//! A partition on its owning core: the log plus the idempotent-producer state that must stay in step
//! with it. The producer state is saved at clean shutdown and rebuilt from the log's batch headers
//! after a crash, so duplicates are still recognised after a restart.
//!
//! Expiry and restarts, as in Kafka: the snapshot holds only the producers kept at shutdown and the
//! offset it covers, and only batches after that offset are replayed, so a producer dropped (expired
//! or over the limit) stays dropped across a clean restart. Without a snapshot (a crash) the whole log
//! is replayed: a producer is then re-learned from its batches, with their timestamps as its last
//! activity, and expiry and the limit apply again at once, so only producers whose batches are recent
//! enough come back, which is what Kafka's replay of the log after its last snapshot does too.

use crate::batch::{self, BatchHeader};
use crate::files::write_atomically;
use crate::producers::{is_idempotent, ProducerConfig, ProducerStates, SequenceCheck};
use crate::{AppendOptions, AppendResult, Log, LogConfig, TailCache};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// A produce's batches as they will be appended: the bytes, their headers, and what checking them
/// decompressed (kept for view readers).
type Checked = (Bytes, Vec<BatchHeader>, Vec<Option<Bytes>>);

const SNAPSHOT: &str = "producers.snapshot";

#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub index: i32,
    pub topic_id: [u8; 16],
    pub log: Log,
    /// Changed only by [`Partition::produce`] (reserve, then confirm or release) and at open/close.
    producers: RefCell<ProducerStates>,
    /// Producers whose transaction the coordinator added this partition to (AddPartitionsToTxn),
    /// with the epoch: their transactional batches are accepted until the transaction's marker.
    in_transaction: RefCell<HashMap<i64, i16>>,
}

/// A produce the partition accepted.
#[derive(Debug)]
pub enum Produced {
    /// Queued for appending (in call order); the task settles the producers' sequence numbers.
    Appending(Appending),
    /// A retry of the one batch already written at `base_offset`: acknowledged without appending.
    Duplicate { base_offset: i64 },
}

/// Why a produce was refused; nothing was appended and no producer's state changed.
#[derive(Debug)]
pub enum Refused {
    /// The batches are invalid for this log (corrupt, too large, a compacted topic's missing key).
    Batch(crate::Error),
    /// An idempotent batch's sequence check: which batch, its first sequence number, and why.
    Sequence {
        batch: usize,
        base_sequence: i32,
        check: SequenceCheck,
    },
    /// A transactional batch from a producer whose transaction does not include this partition
    /// (no AddPartitionsToTxn, or the transaction ended).
    NotInTransaction { producer_id: i64, epoch: i16 },
}

/// Why a transaction marker was not written.
#[derive(Debug)]
pub enum MarkerRefused {
    /// The producer has a later epoch than the marker's (Kafka: `INVALID_PRODUCER_EPOCH`).
    Fenced,
    /// The log could not write it.
    Log(crate::Error),
}

/// An append queued by [`Partition::produce`]. It runs as a detached task, so a request dropped
/// mid-append (its client gone) still confirms or releases its producers' sequence numbers.
#[derive(Debug)]
pub struct Appending(glommio::task::JoinHandle<Option<crate::Result<AppendResult>>>);

impl Appending {
    /// The append's result; `None` if finishing it panicked (logged).
    pub async fn finished(self) -> Option<crate::Result<AppendResult>> {
        self.0.await.flatten()
    }
}

pub fn partition_dir(data_dir: &Path, topic: &str, index: i32) -> PathBuf {
    data_dir.join("topics").join(topic).join(index.to_string())
}

impl Partition {
    pub async fn open(
        data_dir: &Path,
        topic: &str,
        index: i32,
        topic_id: [u8; 16],
        config: LogConfig,
        producer_config: ProducerConfig,
        cache: Rc<TailCache>,
    ) -> crate::Result<Partition> {
        let dir = partition_dir(data_dir, topic, index);
        let log = Log::open(&dir, config, cache).await?;
        let producers = load_producer_state(&log, producer_config).await?;
        Ok(Partition {
            topic: topic.to_string(),
            index,
            topic_id,
            log,
            producers: RefCell::new(producers),
            in_transaction: RefCell::default(),
        })
    }

    /// A read replica of another core's partition (the `shoal` crate's read replicas): its log is a
    /// [`Log::replica`], and it keeps no producer state (produces go to the owner).
    pub fn replica(topic: &str, index: i32, topic_id: [u8; 16], log: Log) -> Partition {
        Partition {
            topic: topic.to_string(),
            index,
            topic_id,
            log,
            producers: RefCell::default(),
            in_transaction: RefCell::default(),
        }
    }

    /// Saves the producer state and closes the log cleanly (requests still holding the partition get
    /// `Closed` from then on). A replica only closes its log: the files are its owner's.
    pub async fn close(&self) -> crate::Result<()> {
        if self.log.is_replica() {
            return self.log.clone().close().await;
        }
        let snapshot = self.producers.borrow().encode(self.log.high_watermark());
        let path = self.log.dir().join(SNAPSHOT);
        let written = glommio::executor()
            .spawn_blocking(move || write_atomically(&path, &snapshot))
            .await;
        if let Err(e) = written {
            log::warn!(
                "could not save producer state of {}-{}: {e}",
                self.topic,
                self.index
            );
        }
        self.log.clone().close().await
    }

    pub async fn delete(&self) -> crate::Result<()> {
        self.log.clone().delete().await
    }

    /// Validates `blob`'s batches, checks and reserves their idempotent producers' sequence numbers
    /// (all or nothing) and queues the append; once it is written (or fsynced, when `durable`) the
    /// reservations are confirmed, or released if it failed. Runs up to the queueing without
    /// awaiting, so produces are appended in the order of the calls.
    pub fn produce(self: &Rc<Self>, blob: Bytes, durable: bool) -> Result<Produced, Refused> {
        // While view readers run on the log, what checking compressed batches decompresses is kept
        // for them (else they would decompress each batch again to split it).
        let keep = self.log.keeps_decoded();
        let (headers, decoded) =
            batch::validate_all_keeping(&blob, self.log.max_batch_bytes(), keep)
                .map_err(|e| Refused::Batch(e.into()))?;
        let blob = batch::restamp_max_timestamps(blob, &headers);
        let (blob, headers, decoded) = self.recompressed(blob, headers, decoded)?;
        self.log
            .check_keys(&blob, &headers)
            .map_err(Refused::Batch)?;
        // A transactional batch only from a producer whose transaction includes this partition:
        // else no marker would ever close it (and the last stable offset would stay behind it).
        if let Some((batch, h)) = headers
            .iter()
            .enumerate()
            .find(|(_, h)| h.is_transactional() && !self.accepts_transaction(h))
        {
            // A producer fenced by a newer epoch is told so first (clients make a fatal error of
            // it), as the sequence check would.
            if !self
                .producers
                .borrow()
                .may_end_transaction(h.producer_id, h.producer_epoch)
            {
                return Err(Refused::Sequence {
                    batch,
                    base_sequence: h.base_sequence,
                    check: SequenceCheck::Fenced,
                });
            }
            return Err(Refused::NotInTransaction {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
            });
        }
        let idempotent = headers.iter().any(is_idempotent);
        if idempotent {
            let reserved = self
                .producers
                .borrow_mut()
                .check_and_reserve_all(&headers, crate::now_ms());
            match reserved {
                Ok(()) => {}
                Err((_, SequenceCheck::Duplicate { base_offset })) if headers.len() == 1 => {
                    return Ok(Produced::Duplicate { base_offset })
                }
                Err((batch, check)) => {
                    return Err(Refused::Sequence {
                        batch,
                        base_sequence: headers[batch].base_sequence,
                        check,
                    })
                }
            }
        }
        // Only idempotent batches need their headers once the append is done.
        let settle = if idempotent {
            headers.clone()
        } else {
            Vec::new()
        };
        let append = self
            .log
            .append_keeping(blob, headers, decoded, AppendOptions { durable });
        let partition = self.clone();
        let finished = std::panic::AssertUnwindSafe(async move {
            let result = append.await;
            partition.settle(&settle, &result);
            result
        });
        let task = glommio::spawn_local(async move {
            use futures_lite::FutureExt;
            let outcome = finished.catch_unwind().await;
            if outcome.is_err() {
                log::error!("finishing an append to a partition panicked");
            }
            outcome.ok()
        });
        Ok(Produced::Appending(Appending(task.detach())))
    }

    /// The batches in the topic's `compression.type` codec: those in another rewritten (Kafka
    /// recompresses them on append), the others as they came. What validation kept decompressed
    /// is dropped with a rewrite (view readers then decompress for themselves).
    fn recompressed(
        &self,
        blob: Bytes,
        headers: Vec<BatchHeader>,
        decoded: Vec<Option<Bytes>>,
    ) -> Result<Checked, Refused> {
        let c = self.log.compression();
        let Some(codec) = c.codec else {
            return Ok((blob, headers, decoded));
        };
        let limit = self.log.max_batch_bytes();
        match batch::recompress_all(&blob, &headers, codec, c.level(codec), limit) {
            Ok(None) => Ok((blob, headers, decoded)),
            Ok(Some((rewritten, headers))) => Ok((Bytes::from(rewritten), headers, Vec::new())),
            Err(e) => Err(Refused::Batch(e.into())),
        }
    }

    /// Whether a transactional batch's producer is in a transaction with this partition: added
    /// by the coordinator at this epoch, or (after a restart, which forgets what was added) with
    /// a transaction already open in the log (an older epoch is then fenced by the sequence
    /// check).
    fn accepts_transaction(&self, h: &BatchHeader) -> bool {
        match self.in_transaction.borrow().get(&h.producer_id) {
            Some(&epoch) => epoch == h.producer_epoch,
            None => self.log.open_transaction(h.producer_id).is_some(),
        }
    }

    /// The coordinator added this partition to the producer's transaction at `epoch`
    /// (AddPartitionsToTxn): its transactional batches are accepted until the next marker.
    pub fn add_to_transaction(&self, producer_id: i64, epoch: i16) {
        self.in_transaction.borrow_mut().insert(producer_id, epoch);
    }

    /// Confirms the reserved sequence numbers of an append that succeeded, or releases them.
    fn settle(&self, headers: &[BatchHeader], result: &crate::Result<AppendResult>) {
        if headers.is_empty() {
            return;
        }
        let mut states = self.producers.borrow_mut();
        match result {
            Ok(r) => {
                let now = crate::now_ms();
                let mut base = r.base_offset;
                for h in headers {
                    if is_idempotent(h) {
                        states.confirm(h, base, now);
                    }
                    base += h.offset_count();
                }
            }
            Err(_) => states.release_all(headers),
        }
    }

    /// Writes a transaction marker (commit or abort) for `producer_id` at `epoch`, as the transaction
    /// coordinator asks of each partition of a transaction that ends, and returns its offset once
    /// durable. A marker from an epoch older than the producer's is refused (the coordinator that
    /// sent it was fenced); a later one fences the producer's older epoch.
    pub async fn write_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<i64, MarkerRefused> {
        if !self
            .producers
            .borrow()
            .may_end_transaction(producer_id, epoch)
        {
            return Err(MarkerRefused::Fenced);
        }
        let offset = self
            .log
            .append_marker(producer_id, epoch, commit, coordinator_epoch)
            .await
            .map_err(MarkerRefused::Log)?;
        {
            let mut added = self.in_transaction.borrow_mut();
            if added.get(&producer_id).is_some_and(|&e| e <= epoch) {
                added.remove(&producer_id);
            }
        }
        self.producers
            .borrow_mut()
            .end_transaction(producer_id, epoch, crate::now_ms());
        Ok(offset)
    }

    /// Idempotent producers whose state is kept, after forgetting the expired ones if a scan is due.
    pub fn producer_ids(&self) -> usize {
        let mut states = self.producers.borrow_mut();
        states.expire_if_due(crate::now_ms());
        states.len()
    }
}

/// The snapshot if it matches the log, then the batches after it replayed from the log; expiry and
/// the limit apply to the result.
async fn load_producer_state(log: &Log, config: ProducerConfig) -> crate::Result<ProducerStates> {
    let path = log.dir().join(SNAPSHOT);
    let snapshot = {
        let path = path.clone();
        glommio::executor()
            .spawn_blocking(move || std::fs::read(&path).ok())
            .await
            .and_then(|b| ProducerStates::decode(&b))
    };
    let hw = log.high_watermark();
    // The state at `end`, kept across crashes: the log below `end` was fsynced at the clean close
    // that wrote it and never changes, so replaying from there gives the state a replay from the
    // start would. A snapshot past the end (a disk that lost data) or below the start goes: once
    // the log grew past it again, it would describe other batches.
    let (mut states, mut at) = match snapshot {
        Some((s, end)) if end <= hw && end >= log.log_start_offset() => (s, end),
        found => {
            if found.is_some() {
                let _ = glommio::executor()
                    .spawn_blocking(move || std::fs::remove_file(&path))
                    .await;
            }
            (ProducerStates::default(), log.log_start_offset())
        }
    };
    states.set_config(config);
    let now = crate::now_ms();
    states.expire(now);
    while at < hw {
        let read = log.read(at, 4 << 20, true).await?;
        read.records
            .batch_headers()
            .for_each(|h| states.replay(&h, now));
        match read.records.next_offset() {
            Some(next) => at = next,
            None => break,
        }
    }
    states.expire(now);
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;
    use crate::testing::run;

    fn cache() -> Rc<TailCache> {
        Rc::new(TailCache::new(1 << 20, 1 << 16))
    }

    fn batch(producer_id: i64, base_sequence: i32) -> Bytes {
        let mut b = BatchBuilder::new(1).producer(producer_id, 0, base_sequence);
        b.push(1, Some(b"k"), Some(b"v"), &[]);
        Bytes::from(b.finish(0))
    }

    async fn open(dir: &Path) -> Rc<Partition> {
        let config = LogConfig {
            direct_io: false,
            ..LogConfig::default()
        };
        let p = Partition::open(dir, "t", 0, [0; 16], config, Default::default(), cache());
        Rc::new(p.await.unwrap())
    }

    fn appending(p: Result<Produced, Refused>) -> Appending {
        match p {
            Ok(Produced::Appending(a)) => a,
            other => panic!("expected an append, got {other:?}"),
        }
    }

    #[test]
    fn produce_reserves_then_confirms_even_when_the_caller_stops_waiting() {
        run(|| async {
            let dir = tempfile::tempdir().unwrap();
            let p = open(dir.path()).await;
            // Durable (a Direct I/O write, completing later): a page cache write would complete
            // before `produce` returns.
            let first = appending(p.produce(batch(7, 0), true));
            // A retry while the first is being written is neither appended nor a duplicate yet.
            match p.produce(batch(7, 0), false) {
                Err(Refused::Sequence {
                    check: SequenceCheck::InFlight,
                    ..
                }) => {}
                other => panic!("expected in flight, got {other:?}"),
            }
            // The caller goes away; the detached append still confirms the sequence numbers.
            drop(first);
            let second = appending(p.produce(batch(7, 1), false));
            assert_eq!(second.finished().await.unwrap().unwrap().base_offset, 1);
            // The first is confirmed once its fsync completes (bounded wait).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let retry = loop {
                match p.produce(batch(7, 0), false) {
                    Err(Refused::Sequence {
                        check: SequenceCheck::InFlight,
                        ..
                    }) if std::time::Instant::now() < deadline => {
                        glommio::timer::sleep(std::time::Duration::from_millis(5)).await
                    }
                    other => break other,
                }
            };
            match retry {
                Ok(Produced::Duplicate { base_offset: 0 }) => {}
                other => panic!("expected a duplicate at 0, got {other:?}"),
            }
            match p.produce(batch(7, 5), false) {
                Err(Refused::Sequence {
                    batch: 0,
                    base_sequence: 5,
                    check: SequenceCheck::OutOfOrder { expected: 2 },
                }) => {}
                other => panic!("expected out of order, got {other:?}"),
            }
            // Nothing refused changed the state: the next sequence is still accepted.
            let third = appending(p.produce(batch(7, 2), false));
            assert_eq!(third.finished().await.unwrap().unwrap().base_offset, 2);
        });
    }

    #[test]
    fn a_clean_close_snapshot_outlives_a_crash_and_the_batches_after_it_are_replayed() {
        run(|| async {
            let dir = tempfile::tempdir().unwrap();
            let p = open(dir.path()).await;
            for seq in 0..3 {
                let a = appending(p.produce(batch(7, seq), false));
                a.finished().await.unwrap().unwrap();
            }
            p.close().await.unwrap();
            let snapshot = dir.path().join("topics/t/0").join(SNAPSHOT);
            let p = open(dir.path()).await;
            assert!(snapshot.exists(), "kept for a crash to start from");
            for seq in 3..5 {
                let a = appending(p.produce(batch(7, seq), false));
                a.finished().await.unwrap().unwrap();
            }
            // A crash: no close, the snapshot is the one of offset 3.
            drop(p);
            let p = open(dir.path()).await;
            // The last batch, from the replay after the snapshot, is a duplicate; the next is next.
            match p.produce(batch(7, 4), false) {
                Ok(Produced::Duplicate { base_offset: 4 }) => {}
                other => panic!("expected a duplicate at 4, got {other:?}"),
            }
            let a = appending(p.produce(batch(7, 5), false));
            assert_eq!(a.finished().await.unwrap().unwrap().base_offset, 5);
            p.close().await.unwrap();
        });
    }

    #[test]
    fn markers_end_transactions_and_fence_older_epochs_across_a_restart() {
        run(|| async {
            let dir = tempfile::tempdir().unwrap();
            let p = open(dir.path()).await;
            // A transactional batch is refused until the coordinator adds the partition to the
            // producer's transaction, then accepted.
            let mut b = BatchBuilder::new(1).producer(5, 0, 0).transactional();
            b.push(1, Some(b"k"), Some(b"v"), &[]);
            let txn = Bytes::from(b.finish(0));
            assert!(matches!(
                p.produce(txn.clone(), false),
                Err(Refused::NotInTransaction {
                    producer_id: 5,
                    epoch: 0
                })
            ));
            assert_eq!(p.log.high_watermark(), 0);
            p.add_to_transaction(5, 0);
            let added = appending(p.produce(txn.clone(), false));
            assert_eq!(added.finished().await.unwrap().unwrap().base_offset, 0);
            assert_eq!((p.log.last_stable_offset(), p.log.high_watermark()), (0, 1));
            // The coordinator bumped the epoch when the transaction timed out: it aborts.
            assert_eq!(p.write_marker(5, 1, false, 0).await.unwrap(), 1);
            assert_eq!(p.log.last_stable_offset(), 2);
            assert_eq!(p.log.aborted_transactions(0, 2).len(), 1);
            // The marker ended the producer's transaction here: its old epoch is fenced.
            assert!(matches!(
                p.produce(txn, false),
                Err(Refused::Sequence {
                    check: SequenceCheck::Fenced,
                    ..
                })
            ));
            assert!(matches!(
                p.write_marker(5, 0, true, 0).await,
                Err(MarkerRefused::Fenced)
            ));
            p.close().await.unwrap();
            // After a crash (no producer snapshot) the replayed marker still fences epoch 0.
            std::fs::remove_file(dir.path().join("topics/t/0").join(SNAPSHOT)).unwrap();
            let p = open(dir.path()).await;
            assert!(matches!(
                p.write_marker(5, 0, true, 0).await,
                Err(MarkerRefused::Fenced)
            ));
            assert_eq!(p.write_marker(5, 1, true, 0).await.unwrap(), 2);
            p.close().await.unwrap();
        });
    }

    #[test]
    fn a_corrupt_batch_is_refused_before_anything_is_reserved() {
        run(|| async {
            let dir = tempfile::tempdir().unwrap();
            let p = open(dir.path()).await;
            let mut bad = batch(9, 0).to_vec();
            let last = bad.len() - 1;
            bad[last] ^= 0xff; // the CRC no longer matches
            assert!(matches!(
                p.produce(Bytes::from(bad), false),
                Err(Refused::Batch(crate::Error::InvalidBatch(_)))
            ));
            let ok = appending(p.produce(batch(9, 0), false));
            assert_eq!(ok.finished().await.unwrap().unwrap().base_offset, 0);
        });
    }
}
