//! Every transition of one transactional id, and every error Kafka answers with.

use super::*;

const MAX_TIMEOUT: i32 = 900_000;

/// An allocator handing out 1000, 1001, ...
fn ids() -> impl FnMut() -> i64 {
    let mut next = 1000;
    move || {
        next += 1;
        next - 1
    }
}

fn ready(o: Result<InitOutcome, ResponseError>) -> TxnMetadata {
    match o {
        Ok(InitOutcome::Ready(t)) => {
            assert_eq!(t.markers, None);
            t.next
        }
        other => panic!("expected Ready, got {other:?}"),
    }
}

fn init(m: Option<&TxnMetadata>, expected: Option<(i64, i16)>, now: i64) -> TxnMetadata {
    ready(init_producer_id(
        m,
        60_000,
        MAX_TIMEOUT,
        expected.map(|(producer_id, epoch)| ProducerIdAndEpoch { producer_id, epoch }),
        now,
        &mut ids(),
    ))
}

fn tp(t: &str, p: i32) -> TopicPartition {
    (t.to_string(), p)
}

/// A producer with a transaction open on t-0 and t-1 since `now` = 10.
fn ongoing() -> TxnMetadata {
    let m = init(None, None, 0);
    m.add_partitions(1000, 0, &[tp("t", 0), tp("t", 1)], 10)
        .unwrap()
        .next
}

#[test]
fn a_new_transactional_id_gets_a_fresh_producer_id_and_epoch_0() {
    let m = init(None, None, 5);
    assert_eq!(
        (m.producer_id, m.epoch, m.state),
        (1000, 0, TxnState::Empty)
    );
    assert_eq!(m.last_update_ms, 5);
    assert_eq!(m.timeout_ms, 60_000);
    let dead = TxnMetadata {
        state: TxnState::Dead,
        ..m
    };
    assert_eq!(
        init(Some(&dead), None, 6).epoch,
        0,
        "Dead counts as unknown"
    );
}

#[test]
fn timeouts_beyond_the_broker_maximum_are_refused() {
    for t in [0, -1, MAX_TIMEOUT + 1] {
        assert_eq!(
            init_producer_id(None, t, MAX_TIMEOUT, None, 0, &mut ids()),
            Err(ResponseError::InvalidTransactionTimeout)
        );
    }
}

#[test]
fn an_existing_id_bumps_the_epoch_and_fences_the_old_producer() {
    let m = init(None, None, 0);
    let again = init(Some(&m), None, 1);
    assert_eq!((again.producer_id, again.epoch), (1000, 1));
    assert_eq!(again.last_epoch, NO_EPOCH, "a new producer cannot recover");
    assert_eq!(
        again.add_partitions(1000, 0, &[tp("t", 0)], 2),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        for_client(ResponseError::ProducerFenced, false),
        ResponseError::InvalidProducerEpoch
    );
    assert_eq!(
        for_client(ResponseError::ProducerFenced, true),
        ResponseError::ProducerFenced
    );
}

#[test]
fn an_open_transaction_is_aborted_first_and_the_client_retries() {
    let m = ongoing();
    let t = match init_producer_id(Some(&m), 60_000, MAX_TIMEOUT, None, 20, &mut ids()) {
        Ok(InitOutcome::AbortFirst(t)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!(t.next.state, TxnState::PrepareAbort);
    assert_eq!(t.next.epoch, 1);
    let markers = t.markers.clone().unwrap();
    assert!(!markers.commit);
    assert_eq!(markers.epoch, 1, "the markers fence epoch 0");
    assert_eq!(markers.partitions, vec![tp("t", 0), tp("t", 1)]);
    // While the markers are written, the retry waits.
    assert_eq!(
        init_producer_id(Some(&t.next), 60_000, MAX_TIMEOUT, None, 21, &mut ids()),
        Err(ResponseError::ConcurrentTransactions)
    );
    let done = t.next.markers_written(1, 22).unwrap().next;
    assert_eq!(done.state, TxnState::CompleteAbort);
    assert!(done.partitions.is_empty());
    let retried = init(Some(&done), None, 23);
    assert_eq!((retried.epoch, retried.state), (2, TxnState::Empty));
}

#[test]
fn an_exhausted_epoch_gets_a_new_producer_id() {
    let mut m = init(None, None, 0);
    m.epoch = i16::MAX - 2;
    let m = init(Some(&m), None, 1);
    assert_eq!((m.producer_id, m.epoch), (1000, i16::MAX - 1));
    let mut next_id = || 77;
    let rotated = ready(init_producer_id(
        Some(&m),
        1000,
        MAX_TIMEOUT,
        Some(ProducerIdAndEpoch {
            producer_id: 1000,
            epoch: i16::MAX - 1,
        }),
        2,
        &mut next_id,
    ));
    assert_eq!((rotated.producer_id, rotated.epoch), (77, 0));
    assert_eq!(rotated.last_producer_id, 1000);
    assert_eq!(rotated.timeout_ms, 1000);
    // An open transaction at the last usable epoch is still fenced by its abort, and the next
    // producer gets a new id.
    let open = m
        .add_partitions(1000, i16::MAX - 1, &[tp("t", 0)], 2)
        .unwrap()
        .next;
    let abort = match init_producer_id(Some(&open), 1000, MAX_TIMEOUT, None, 2, &mut ids()) {
        Ok(InitOutcome::AbortFirst(t)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!(abort.markers.unwrap().epoch, i16::MAX);
    let aborted = abort.next.markers_written(i16::MAX, 3).unwrap().next;
    let mut other_id = || 88;
    let fresh = ready(init_producer_id(
        Some(&aborted),
        1000,
        MAX_TIMEOUT,
        None,
        4,
        &mut other_id,
    ));
    assert_eq!((fresh.producer_id, fresh.epoch), (88, 0));
    // The retry of that call (its answer lost) carries the old id: known, and not bumped again.
    let retry = init(Some(&rotated), Some((1000, i16::MAX - 1)), 3);
    assert_eq!((retry.producer_id, retry.epoch), (77, 0));
}

#[test]
fn kip_360_a_producer_resumes_with_its_id_and_epoch() {
    let m = init(None, None, 0);
    // The producer bumps its own epoch (after an abortable error).
    let bumped = init(Some(&m), Some((1000, 0)), 1);
    assert_eq!((bumped.epoch, bumped.last_epoch), (1, 0));
    // Its answer was lost: the retry gets the same epoch.
    let retry = init(Some(&bumped), Some((1000, 0)), 2);
    assert_eq!((retry.epoch, retry.last_epoch), (1, 0));
    // A wrong producer id, or an epoch neither current nor last, is fenced.
    for (id, epoch) in [(999, 1), (1000, 5)] {
        assert_eq!(
            init_producer_id(
                Some(&bumped),
                60_000,
                MAX_TIMEOUT,
                Some(ProducerIdAndEpoch {
                    producer_id: id,
                    epoch
                }),
                3,
                &mut ids()
            ),
            Err(ResponseError::ProducerFenced)
        );
    }
}

#[test]
fn kip_360_after_an_abort_by_timeout_the_old_epoch_is_accepted_once() {
    let m = ongoing();
    assert_eq!(m.expire(10 + 60_000), None, "not yet past its timeout");
    let t = m.expire(10 + 60_001).unwrap();
    assert_eq!((t.next.state, t.next.epoch), (TxnState::PrepareAbort, 1));
    let markers = t.markers.unwrap();
    assert_eq!((markers.commit, markers.epoch), (false, 1));
    let aborted = t.next.markers_written(1, 60_020).unwrap().next;
    // The old producer's requests with epoch 0 are fenced...
    assert_eq!(
        aborted.end_txn(1000, 0, true, 60_030),
        Err(ResponseError::ProducerFenced)
    );
    // ...until it re-initialises with its id and epoch: accepted, at the fencing epoch.
    let resumed = init(Some(&aborted), Some((1000, 0)), 60_040);
    assert_eq!((resumed.producer_id, resumed.epoch), (1000, 1));
    assert_eq!(resumed.state, TxnState::Empty);
    resumed
        .add_partitions(1000, 1, &[tp("t", 0)], 60_050)
        .unwrap();
    // Had another producer taken the id meanwhile, the old one would stay fenced.
    let other = init(Some(&aborted), None, 60_040);
    assert_eq!(other.epoch, 2);
    assert_eq!(
        init_producer_id(
            Some(&other),
            60_000,
            MAX_TIMEOUT,
            Some(ProducerIdAndEpoch {
                producer_id: 1000,
                epoch: 0
            }),
            60_041,
            &mut ids()
        ),
        Err(ResponseError::ProducerFenced)
    );
}

#[test]
fn add_partitions_opens_the_transaction_and_accumulates() {
    let m = init(None, None, 0);
    let t = m.add_partitions(1000, 0, &[tp("a", 0)], 10).unwrap();
    assert_eq!(t.markers, None);
    let o = t.next;
    assert_eq!(
        (o.state, o.start_ms, o.last_update_ms),
        (TxnState::Ongoing, 10, 10)
    );
    let o2 = o.add_partitions(1000, 0, &[tp("b", 1)], 20).unwrap().next;
    assert_eq!(o2.start_ms, 10, "the timeout counts from the first add");
    assert_eq!(o2.partitions.len(), 2);
    // Adding partitions already in the transaction changes nothing (nothing to write).
    let same = o2.add_partitions(1000, 0, &[tp("a", 0)], 30).unwrap();
    assert_eq!(same.next, o2);
}

#[test]
fn add_partitions_errors() {
    let o = ongoing();
    assert_eq!(
        o.add_partitions(999, 0, &[tp("t", 2)], 20),
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        o.add_partitions(1000, 1, &[tp("t", 2)], 20),
        Err(ResponseError::ProducerFenced)
    );
    let preparing = o.end_txn(1000, 0, true, 20).unwrap().next;
    assert_eq!(
        preparing.add_partitions(1000, 0, &[tp("t", 2)], 21),
        Err(ResponseError::ConcurrentTransactions)
    );
    let dead = TxnMetadata {
        state: TxnState::Dead,
        ..o
    };
    assert_eq!(
        dead.add_partitions(1000, 0, &[tp("t", 2)], 20),
        Err(ResponseError::InvalidProducerIdMapping)
    );
}

#[test]
fn a_completed_transaction_starts_the_next_one_afresh() {
    let o = ongoing();
    let done = o
        .end_txn(1000, 0, true, 20)
        .unwrap()
        .next
        .markers_written(0, 21)
        .unwrap()
        .next;
    let next = done
        .add_partitions(1000, 0, &[tp("u", 0)], 30)
        .unwrap()
        .next;
    assert_eq!(
        next.partitions.len(),
        1,
        "t-0 and t-1 belonged to the last one"
    );
    assert_eq!(next.start_ms, 30);
}

#[test]
fn add_offsets_records_the_group_and_its_markers_carry_it() {
    let o = ongoing();
    let with = o.add_offsets(1000, 0, "g", 20).unwrap().next;
    assert!(with.groups.contains("g"));
    assert_eq!(with.add_offsets(1000, 0, "g", 21).unwrap().next, with);
    assert_eq!(
        o.add_offsets(1000, 1, "g", 20),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        o.add_offsets(7, 0, "g", 20),
        Err(ResponseError::InvalidProducerIdMapping)
    );
    let markers = with.end_txn(1000, 0, true, 30).unwrap().markers.unwrap();
    assert_eq!(markers.groups, vec!["g".to_string()]);
    // Offsets alone open a transaction too.
    let only = init(None, None, 0)
        .add_offsets(1000, 0, "g", 5)
        .unwrap()
        .next;
    assert_eq!((only.state, only.start_ms), (TxnState::Ongoing, 5));
}

#[test]
fn end_txn_commit_and_abort_write_markers_then_complete() {
    for commit in [true, false] {
        let o = ongoing();
        let t = o.end_txn(1000, 0, commit, 20).unwrap();
        let prepare = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        assert_eq!(t.next.state, prepare);
        assert_eq!(t.next.epoch, 0, "a client's EndTxn keeps the epoch");
        let m = t.markers.unwrap();
        assert_eq!((m.producer_id, m.epoch, m.commit), (1000, 0, commit));
        assert_eq!(m.partitions, vec![tp("t", 0), tp("t", 1)]);
        // A retry while the markers are written; the other outcome is refused.
        assert_eq!(
            t.next.end_txn(1000, 0, commit, 21),
            Err(ResponseError::ConcurrentTransactions)
        );
        assert_eq!(
            t.next.end_txn(1000, 0, !commit, 21),
            Err(ResponseError::InvalidTxnState)
        );
        let done = t.next.markers_written(0, 22).unwrap().next;
        let complete = if commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        assert_eq!(done.state, complete);
        assert!(done.partitions.is_empty() && done.groups.is_empty());
        assert_eq!(done.start_ms, -1);
        // A retry after completion is answered without a change; the other outcome is refused.
        assert_eq!(done.end_txn(1000, 0, commit, 23).unwrap().next, done);
        assert_eq!(
            done.end_txn(1000, 0, !commit, 23),
            Err(ResponseError::InvalidTxnState)
        );
    }
}

#[test]
fn end_txn_errors() {
    let o = ongoing();
    assert_eq!(
        o.end_txn(1, 0, true, 20),
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        o.end_txn(1000, 3, true, 20),
        Err(ResponseError::ProducerFenced)
    );
    let empty = init(None, None, 0);
    assert_eq!(
        empty.end_txn(1000, 0, true, 1),
        Err(ResponseError::InvalidTxnState),
        "nothing to end"
    );
}

#[test]
fn markers_written_only_completes_its_own_prepare() {
    let o = ongoing();
    assert_eq!(
        o.markers_written(0, 20),
        Err(ResponseError::InvalidTxnState)
    );
    let p = o.end_txn(1000, 0, false, 20).unwrap().next;
    assert_eq!(
        p.markers_written(7, 21),
        Err(ResponseError::ProducerFenced),
        "an older round's completion"
    );
}

#[test]
fn recovery_rewrites_prepare_markers_and_aborts_late_transactions() {
    let o = ongoing();
    let commit = o.end_txn(1000, 0, true, 20).unwrap().next;
    let r = commit.recover(1_000_000).unwrap();
    assert_eq!(
        r.next, commit,
        "the state stays until the markers are written"
    );
    assert!(r.markers.unwrap().commit);
    let abort = o.end_txn(1000, 0, false, 20).unwrap().next;
    assert!(!abort.recover(30).unwrap().markers.unwrap().commit);
    assert_eq!(o.recover(30), None, "within its timeout: left open");
    let late = o.recover(10 + 60_001).unwrap();
    assert_eq!(
        (late.next.state, late.next.epoch),
        (TxnState::PrepareAbort, 1)
    );
    let done = abort.markers_written(0, 40).unwrap().next;
    assert_eq!(done.recover(1_000_000), None);
    assert_eq!(init(None, None, 0).recover(1_000_000), None);
}

#[test]
fn idle_transactional_ids_expire_and_open_ones_do_not() {
    let m = init(None, None, 0);
    assert_eq!(m.expire_id(99, 100), None);
    assert_eq!(m.expire_id(100, 100).unwrap().next.state, TxnState::Dead);
    assert_eq!(ongoing().expire_id(1_000_000, 100), None);
}

#[test]
fn state_codes_round_trip() {
    for code in 0..7 {
        let s = TxnState::from_code(code).unwrap();
        assert_eq!(s.code(), code);
        assert!(!s.name().is_empty());
    }
    assert_eq!(TxnState::from_code(7), None);
}

/// Two producers share a transactional id; the second fences the first mid-transaction, and the
/// first can neither add, commit nor re-initialise with its old epoch.
#[test]
fn two_producers_sharing_an_id_the_older_is_fenced() {
    let mut alloc = ids();
    let init_with = |m: Option<&TxnMetadata>, now, alloc: &mut dyn FnMut() -> i64| {
        init_producer_id(m, 60_000, MAX_TIMEOUT, None, now, alloc)
    };
    // Producer A: init, a committed transaction, then a second one left open.
    let a = ready(init_with(None, 0, &mut alloc));
    let (pid, a_epoch) = (a.producer_id, a.epoch);
    let s = a
        .add_partitions(pid, a_epoch, &[tp("in", 0)], 1)
        .unwrap()
        .next;
    let s = s.add_offsets(pid, a_epoch, "g", 2).unwrap().next;
    let t = s.end_txn(pid, a_epoch, true, 3).unwrap();
    assert!(t.markers.as_ref().unwrap().commit);
    let s = t.next.markers_written(a_epoch, 4).unwrap().next;
    assert_eq!(s.state, TxnState::CompleteCommit);
    let s = s
        .add_partitions(pid, a_epoch, &[tp("out", 3)], 5)
        .unwrap()
        .next;
    // Producer B starts with the same id: A's transaction is aborted under a new epoch first.
    let abort = match init_with(Some(&s), 6, &mut alloc) {
        Ok(InitOutcome::AbortFirst(t)) => t,
        other => panic!("{other:?}"),
    };
    let markers = abort.markers.clone().unwrap();
    assert_eq!(markers.partitions, vec![tp("out", 3)]);
    assert!(markers.epoch > a_epoch && !markers.commit);
    // A, still running, is refused while the abort is under way and fenced after it.
    assert_eq!(
        abort.next.end_txn(pid, a_epoch, true, 7),
        Err(ResponseError::ProducerFenced)
    );
    let s = abort.next.markers_written(markers.epoch, 8).unwrap().next;
    // B retries and gets an epoch above the fencing one.
    let b = ready(init_with(Some(&s), 9, &mut alloc));
    assert_eq!(b.producer_id, pid, "the same producer id, a newer epoch");
    let b_epoch = b.epoch;
    assert!(b_epoch > markers.epoch);
    // A is fenced everywhere; its KIP-360 re-initialisation is refused too.
    assert_eq!(
        b.add_partitions(pid, a_epoch, &[tp("out", 0)], 10),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        b.add_offsets(pid, a_epoch, "g", 10),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        init_producer_id(
            Some(&b),
            60_000,
            MAX_TIMEOUT,
            Some(ProducerIdAndEpoch {
                producer_id: pid,
                epoch: a_epoch
            }),
            10,
            &mut alloc
        ),
        Err(ResponseError::ProducerFenced)
    );
    // B's transaction runs to its commit.
    let s = b
        .add_partitions(pid, b_epoch, &[tp("out", 0)], 11)
        .unwrap()
        .next;
    let t = s.end_txn(pid, b_epoch, true, 12).unwrap();
    assert_eq!(t.markers.as_ref().unwrap().epoch, b_epoch);
    let s = t.next.markers_written(b_epoch, 13).unwrap().next;
    assert_eq!(s.state, TxnState::CompleteCommit);
}
