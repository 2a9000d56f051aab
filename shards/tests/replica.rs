//! Read replicas across real threads: the owner's log on one executor, its replica on another,
//! fed the owner's hand-overs and reading the owner's files. After every change of the owner
//! (appends across segment rolls, a compaction swap, retention) the replica reads exactly what the
//! owner reads, at every offset.

mod common;

use bytes::Bytes;
use common::{batch, cache, no_cache, run, small_config};
use shards::batch::BatchBuilder;
use shards::{AppendOptions, Error, Handover, Log, LogConfig, LogEvent, TailCache};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

/// What the owner's thread asks the replica's thread.
enum Ask {
    Start(shards::LogSnapshot, bool),
    Apply(Handover),
    /// Every batch from the log start to the high watermark, as the replica reads them.
    Contents(mpsc::Sender<Contents>),
    /// What an append to the replica, and a hand-over out of step, answer.
    Refusals(mpsc::Sender<(String, String)>),
    /// Waits (up to 5 s) until the replica's high watermark passes `offset`, through its monitor.
    WaitPast(i64, mpsc::Sender<bool>),
    Delete(mpsc::Sender<()>),
}

/// A log's readable state: (log start, high watermark, every batch's base offset and bytes, and
/// what read_committed readers see: the last stable offset and the aborted transactions).
type Contents = (i64, i64, Vec<(i64, Bytes)>, Committed);
type Committed = (i64, Vec<shards::transactions::AbortedTxn>);

async fn contents(log: &Log) -> Contents {
    let (start, hw) = (log.log_start_offset(), log.high_watermark());
    let mut batches = Vec::new();
    let mut at = start;
    while at < hw {
        let read = log.read(at, 1 << 20, true).await.expect("read");
        for (h, bytes) in read.records.batches() {
            batches.push((h.base_offset, bytes));
        }
        at = read
            .records
            .next_offset()
            .expect("a read below hw returns a batch");
    }
    let committed = (
        log.last_stable_offset(),
        log.aborted_transactions(start, hw),
    );
    (start, hw, batches, committed)
}

/// The replica's thread: its own executor and tail cache, serving `Ask`s in order.
fn replica_thread(rx: mpsc::Receiver<Ask>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        glommio::LocalExecutor::default().run(async move {
            let mut log: Option<Log> = None;
            loop {
                // Polled, so the long polls spawned below run between asks.
                let ask = match rx.try_recv() {
                    Ok(ask) => ask,
                    Err(mpsc::TryRecvError::Empty) => {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    Err(mpsc::TryRecvError::Disconnected) => break,
                };
                match ask {
                    Ask::Start(snapshot, cached) => {
                        let cache: Rc<TailCache> = if cached { cache() } else { no_cache() };
                        log = Some(Log::replica(snapshot, small_config(), cache).expect("replica"));
                    }
                    Ask::Apply(h) => log.as_ref().unwrap().apply(h).expect("apply"),
                    Ask::Contents(tx) => {
                        let _ = tx.send(contents(log.as_ref().unwrap()).await);
                    }
                    Ask::Refusals(tx) => {
                        let log = log.as_ref().unwrap();
                        let append = log.append(batch(1, 10, 1), Default::default()).await;
                        let hw = log.high_watermark();
                        let stray = log.apply(Handover::Appended(shards::Appended {
                            records: shards::Records::whole_batches(batch(1, 10, 2)),
                            from: hw + 5,
                            high_watermark: hw + 6,
                        }));
                        let _ = tx.send((format!("{append:?}"), format!("{stray:?}")));
                    }
                    Ask::WaitPast(offset, tx) => {
                        let monitor = log.as_ref().unwrap().high_watermark_monitor().clone();
                        glommio::spawn_local(async move {
                            let waited =
                                futures_lite::future::or(monitor.wait_for(offset + 1), async {
                                    glommio::timer::sleep(Duration::from_secs(5)).await;
                                    false
                                });
                            let _ = tx.send(waited.await);
                        })
                        .detach();
                    }
                    Ask::Delete(tx) => {
                        log.take().unwrap().delete().await.expect("delete");
                        let _ = tx.send(());
                    }
                }
            }
        })
    })
}

/// An owner log whose hand-overs go to a replica thread, in order, as the front end carries them:
/// the batches of each write, and a snapshot (taken at once, in the hook) after any other change.
struct Pair {
    owner: Log,
    tx: mpsc::Sender<Ask>,
    events: Rc<RefCell<Vec<&'static str>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pair {
    async fn open(dir: &std::path::Path, config: LogConfig, replica_cached: bool) -> Pair {
        let owner = Log::open(dir, config, cache()).await.unwrap();
        let (tx, rx) = mpsc::channel();
        let thread = replica_thread(rx);
        tx.send(Ask::Start(owner.snapshot().unwrap(), replica_cached))
            .unwrap();
        let events = Rc::new(RefCell::new(Vec::new()));
        let (weak, feed, seen) = (owner.downgrade(), tx.clone(), events.clone());
        owner.set_replication(Some(Rc::new(move |event: LogEvent| {
            let handover = match event {
                LogEvent::Appended(a) => {
                    seen.borrow_mut().push("appended");
                    Handover::Appended(a)
                }
                LogEvent::SegmentsChanged => {
                    seen.borrow_mut().push("segments");
                    let log = weak.upgrade().expect("the owner is open");
                    Handover::Snapshot(log.snapshot().expect("snapshot"))
                }
            };
            let _ = feed.send(Ask::Apply(handover));
        })));
        Pair {
            owner,
            tx,
            events,
            thread: Some(thread),
        }
    }

    fn replica_contents(&self) -> Contents {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Ask::Contents(tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).expect("replica")
    }

    /// The replica reads exactly what the owner reads.
    async fn assert_same(&self, what: &str) {
        let owner = contents(&self.owner).await;
        let replica = self.replica_contents();
        assert_eq!(
            (replica.0, replica.1),
            (owner.0, owner.1),
            "{what}: log start and high watermark"
        );
        assert_eq!(replica.2.len(), owner.2.len(), "{what}: batch count");
        for (r, o) in replica.2.iter().zip(&owner.2) {
            assert_eq!(r.0, o.0, "{what}: base offsets");
            assert!(r.1 == o.1, "{what}: the bytes of the batch at {}", o.0);
        }
        assert_eq!(
            replica.3, owner.3,
            "{what}: last stable offset, aborted transactions"
        );
    }

    fn stop(mut self) {
        // The hook holds a sender too: the replica's thread ends once both are gone.
        self.owner.set_replication(None);
        drop(self.tx);
        self.thread.take().unwrap().join().unwrap();
    }
}

async fn append_n(log: &Log, n: u64, seed: u64) {
    for i in 0..n {
        log.append(batch(3, 100, seed + i), Default::default())
            .await
            .unwrap();
    }
}

#[test]
fn a_replica_reads_what_its_owner_reads_across_rolls() {
    for cached in [true, false] {
        run(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let pair = Pair::open(dir.path(), small_config(), cached).await;
            append_n(&pair.owner, 60, 0).await;
            assert!(
                pair.owner.segment_base_offsets().len() >= 3,
                "the appends rolled segments"
            );
            pair.assert_same("after appends across rolls").await;
            let seen = pair.events.borrow().clone();
            assert!(seen.contains(&"segments") && seen.contains(&"appended"));
            pair.stop();
        });
    }
}

#[test]
fn a_replica_follows_retention_and_keeps_reading_what_it_holds() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            retention_bytes: Some(20 << 10),
            ..small_config()
        };
        let pair = Pair::open(dir.path(), config, false).await;
        append_n(&pair.owner, 80, 100).await;
        let before = pair.owner.log_start_offset();
        assert!(pair.owner.enforce_retention().await.unwrap() > 0);
        assert!(pair.owner.log_start_offset() > before);
        pair.assert_same("after retention").await;
        pair.stop();
    });
}

#[test]
fn a_replica_follows_deleted_records() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let pair = Pair::open(dir.path(), small_config(), false).await;
        append_n(&pair.owner, 60, 200).await;
        let segments = pair.owner.segment_base_offsets();
        let target = segments[1] + 1;
        assert_eq!(pair.owner.delete_records(target).await.unwrap(), target);
        pair.assert_same("after DeleteRecords inside a segment")
            .await;
        pair.stop();
    });
}

#[test]
fn a_replica_follows_a_compaction_swap() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            cleanup_delete: false,
            cleanup_compact: true,
            ..small_config()
        };
        let pair = Pair::open(dir.path(), config, false).await;
        // The same few keys again and again: compaction keeps only the newest of each.
        // The last append durable: it waits for the rolled segments' seal, which compaction needs.
        for round in 0..40u64 {
            let durable = AppendOptions {
                durable: round == 39,
            };
            pair.owner
                .append(batch(3, 100, round % 3), durable)
                .await
                .unwrap();
        }
        pair.assert_same("before compaction").await;
        let stats = pair.owner.compact_now().await.unwrap();
        assert!(stats.read_bytes > 0, "a pass rewrote segments: {stats:?}");
        pair.assert_same("after the swap").await;
        append_n(&pair.owner, 5, 7).await;
        pair.assert_same("after appends following the swap").await;
        pair.stop();
    });
}

#[test]
fn a_replica_wakes_long_polls_refuses_writes_and_leaves_the_files_alone() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let pair = Pair::open(dir.path(), small_config(), true).await;
        append_n(&pair.owner, 2, 0).await;
        let hw = pair.owner.high_watermark();
        let (tx, rx) = mpsc::channel();
        pair.tx.send(Ask::WaitPast(hw, tx)).unwrap();
        append_n(&pair.owner, 1, 9).await;
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true));

        let (tx, rx) = mpsc::channel();
        pair.tx.send(Ask::Refusals(tx)).unwrap();
        let (append, stray) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let refused = format!("{:?}", Err::<(), _>(Error::ReadReplica));
        assert!(append.contains("ReadReplica"), "append: {append}");
        assert_eq!(stray, refused, "a hand-over out of step");
        pair.assert_same("after the refusals").await;

        let (tx, rx) = mpsc::channel();
        pair.tx.send(Ask::Delete(tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(
            pair.owner
                .segment_base_offsets()
                .iter()
                .all(|b| dir.path().join(format!("{b:020}.log")).exists()),
            "deleting a replica removed none of the owner's files"
        );
        assert_eq!(contents(&pair.owner).await.1, pair.owner.high_watermark());
        pair.stop();
    });
}

#[test]
fn a_replica_follows_the_owners_transactions() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let pair = Pair::open(dir.path(), small_config(), true).await;
        let owner = &pair.owner;
        let txn = |pid: i64, seq: i32| {
            let mut b = BatchBuilder::new(0).producer(pid, 0, seq).transactional();
            b.push(0, Some(b"k"), Some(&[7; 300]), &[]);
            Bytes::from(b.finish(0))
        };
        let mut seq = [0; 3];
        for round in 0..12 {
            for pid in 1..=2 {
                owner
                    .append(txn(pid, seq[pid as usize]), Default::default())
                    .await
                    .unwrap();
                seq[pid as usize] += 1;
            }
            append_n(owner, 2, round * 10).await;
            // Producer 1 commits, producer 2 aborts every other round: one stays open across rolls.
            owner.append_marker(1, 0, true, 0).await.unwrap();
            if round % 2 == 0 {
                owner.append_marker(2, 0, false, 0).await.unwrap();
            }
            pair.assert_same(&format!("round {round}")).await;
        }
        assert!(owner.segment_base_offsets().len() >= 3, "rolled");
        assert!(
            owner.last_stable_offset() < owner.high_watermark(),
            "one open"
        );
        assert!(!owner
            .aborted_transactions(0, owner.high_watermark())
            .is_empty());
        pair.stop();
    });
}
