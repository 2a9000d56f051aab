//! The fetch coalescer with a read function that counts its calls.

mod common;

use bytes::Bytes;
use common::run;
use shards::coalescer::{CoalesceKey, FetchCoalescer, ResponseMemory, SharedRead};
use shards::{Error, LogRead, Records};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

fn key(offset: i64) -> CoalesceKey {
    CoalesceKey {
        log: 1,
        layout: 0,
        offset,
        read_committed: false,
        max_bytes: 1000,
        obligatory: true,
    }
}

/// A read result of `len` bytes covering offsets `first..=last`, seen at high watermark `hw`.
fn fake_read(first: i64, last: i64, len: usize, hw: i64) -> LogRead {
    let records = if len == 0 {
        Records::empty()
    } else {
        Records {
            parts: vec![Bytes::from(vec![first as u8; len])],
            len,
            batches: 1,
            records: (last - first + 1) as u64,
            first_offset: first,
            last_offset: last,
        }
    };
    LogRead {
        records,
        high_watermark: hw,
        log_start_offset: 0,
        from_cache: true,
        upstream_txns: None,
    }
}

/// A read function that counts calls and returns `result` after `delay`.
fn counted(
    calls: &Rc<Cell<u32>>,
    delay: Duration,
    result: Result<LogRead, Error>,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<LogRead, Error>>>> {
    let calls = calls.clone();
    move || {
        calls.set(calls.get() + 1);
        Box::pin(async move {
            if !delay.is_zero() {
                glommio::timer::sleep(delay).await;
            }
            result
        })
    }
}

const NOW: Duration = Duration::ZERO;

#[test]
fn a_second_reader_at_the_same_bound_shares_the_result() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        let a = c
            .read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
            )
            .await
            .unwrap();
        let b = c
            .read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
            )
            .await
            .unwrap();
        assert_eq!(calls.get(), 1);
        assert!(Rc::ptr_eq(&a, &b));
        let s = c.stats();
        assert_eq!(
            (s.insertions, s.ready_hits, s.reads, s.cached_bytes),
            (1, 1, 1, 100)
        );
    });
}

#[test]
fn every_key_field_keeps_reads_apart() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        let base = key(0);
        let keys = [
            base,
            CoalesceKey { offset: 1, ..base },
            CoalesceKey {
                max_bytes: 999,
                ..base
            },
            CoalesceKey {
                read_committed: true,
                ..base
            },
            CoalesceKey {
                obligatory: false,
                ..base
            },
            CoalesceKey { log: 2, ..base },
        ];
        for k in keys {
            c.read(k, 10, counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))))
                .await
                .unwrap();
        }
        assert_eq!(calls.get(), keys.len() as u32);
        for k in keys {
            c.read(k, 10, counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))))
                .await
                .unwrap();
        }
        assert_eq!(calls.get(), keys.len() as u32, "all cached now");
    });
}

#[test]
fn concurrent_readers_wait_on_the_read_in_flight() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (c, calls) = (c.clone(), calls.clone());
                glommio::spawn_local(async move {
                    let f = counted(
                        &calls,
                        Duration::from_millis(20),
                        Ok(fake_read(0, 9, 100, 10)),
                    );
                    c.read(key(0), 10, f).await.unwrap()
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await);
        }
        assert_eq!(calls.get(), 1);
        assert!(results.iter().all(|r| Rc::ptr_eq(r, &results[0])));
        assert_eq!(c.stats().inflight_hits, 7);
    });
}

#[test]
fn a_moved_visible_end_forces_a_reread_whose_result_is_then_shared() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        // The read reached the end (9 of hw 10): new data would change it.
        c.read(
            key(0),
            10,
            counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
        )
        .await
        .unwrap();
        let b = c
            .read(
                key(0),
                12,
                counted(&calls, NOW, Ok(fake_read(0, 11, 120, 12))),
            )
            .await
            .unwrap();
        assert_eq!(calls.get(), 2);
        assert_eq!(b.read.records.last_offset, 11);
        let d = c
            .read(
                key(0),
                12,
                counted(&calls, NOW, Ok(fake_read(0, 11, 120, 12))),
            )
            .await
            .unwrap();
        assert_eq!(calls.get(), 2);
        assert!(Rc::ptr_eq(&b, &d));
        let s = c.stats();
        assert_eq!((s.insertions, s.reinsertions, s.cached_bytes), (1, 1, 120));
    });
}

#[test]
fn a_result_cut_by_max_bytes_stays_fresh_as_data_arrives() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        // Offsets 0..=4 of a log ending at 10: cut short by max_bytes.
        let a = c
            .read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 4, 100, 10))),
            )
            .await
            .unwrap();
        let b = c
            .read(
                key(0),
                500,
                counted(&calls, NOW, Ok(fake_read(0, 4, 100, 500))),
            )
            .await
            .unwrap();
        assert_eq!(calls.get(), 1);
        assert!(Rc::ptr_eq(&a, &b));
    });
}

#[test]
fn empty_and_failed_results_are_not_kept() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        for _ in 0..2 {
            let r = c
                .read(
                    key(10),
                    10,
                    counted(&calls, NOW, Ok(fake_read(10, 9, 0, 10))),
                )
                .await
                .unwrap();
            assert!(r.read.records.is_empty());
        }
        let storage = || Err(Error::Closed);
        for _ in 0..2 {
            assert!(c
                .read(key(3), 10, counted(&calls, NOW, storage()))
                .await
                .is_err());
        }
        assert_eq!(calls.get(), 4);
        assert_eq!(c.stats().cached_entries, 0);
    });
}

#[test]
fn a_failed_read_reaches_every_waiter_and_is_not_kept() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (c, calls) = (c.clone(), calls.clone());
                glommio::spawn_local(async move {
                    c.read(
                        key(0),
                        10,
                        counted(&calls, Duration::from_millis(10), Err(Error::Closed)),
                    )
                    .await
                })
            })
            .collect();
        for t in tasks {
            assert!(matches!(t.await, Err(Error::Closed)));
        }
        assert_eq!(calls.get(), 1);
        c.read(
            key(0),
            10,
            counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
        )
        .await
        .unwrap();
        assert_eq!(calls.get(), 2, "the failure was not cached");
    });
}

#[test]
fn switching_off_clears_the_cache_and_reads_every_time() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        c.read(
            key(0),
            10,
            counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
        )
        .await
        .unwrap();
        c.set_enabled(false);
        assert_eq!(c.stats().cached_bytes, 0);
        for _ in 0..3 {
            c.read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
            )
            .await
            .unwrap();
        }
        assert_eq!(calls.get(), 4);
        c.set_enabled(true);
        c.read(
            key(0),
            10,
            counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
        )
        .await
        .unwrap();
        c.read(
            key(0),
            10,
            counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
        )
        .await
        .unwrap();
        assert_eq!(calls.get(), 5);
    });
}

#[test]
fn the_initiating_fetch_going_away_does_not_fail_the_waiters() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        // The first fetch starts the read, then times out (its future is dropped).
        {
            let f = counted(
                &calls,
                Duration::from_millis(30),
                Ok(fake_read(0, 9, 100, 10)),
            );
            let first = c.read(key(0), 10, f);
            let timed_out = futures_lite::future::or(async { Some(first.await) }, async {
                glommio::timer::sleep(Duration::from_millis(5)).await;
                None
            })
            .await;
            assert!(timed_out.is_none());
        }
        let second = c
            .read(key(0), 10, counted(&calls, NOW, Err(Error::Closed)))
            .await
            .unwrap();
        assert_eq!(
            calls.get(),
            1,
            "the second fetch joined the first one's read"
        );
        assert_eq!(second.read.records.len, 100);
    });
}

#[test]
fn eviction_never_invalidates_bytes_a_response_holds() {
    run(|| async {
        let c = FetchCoalescer::new(1000, true);
        let calls = Rc::new(Cell::new(0));
        let held = c
            .read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 9, 400, 10))),
            )
            .await
            .unwrap();
        let bytes = held.read.records.parts[0].clone();
        for off in 1..20 {
            c.read(
                key(off),
                100,
                counted(&calls, NOW, Ok(fake_read(off, off, 300, 100))),
            )
            .await
            .unwrap();
        }
        let s = c.stats();
        assert!(s.evictions > 0 && s.cached_bytes <= 1000, "{s:?}");
        // The held result left the cache (asking again reads again) ...
        let before = calls.get();
        let again = c
            .read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 9, 400, 10))),
            )
            .await
            .unwrap();
        assert_eq!(calls.get(), before + 1, "the held result was evicted");
        assert!(!Rc::ptr_eq(&again, &held));
        // ... and the response holding it still has its bytes.
        assert_eq!(held.read.records.parts[0], bytes);
        assert!(held.read.records.parts[0].iter().all(|&b| b == 0));
    });
}

#[test]
fn a_stale_result_replaced_by_one_too_big_to_cache_leaves_nothing_behind() {
    run(|| async {
        let c = FetchCoalescer::new(1000, true);
        let calls = Rc::new(Cell::new(0));
        c.read(
            key(0),
            10,
            counted(&calls, NOW, Ok(fake_read(0, 9, 100, 10))),
        )
        .await
        .unwrap();
        // The visible end moved; the new result is over half the cache, so it is not kept.
        c.read(
            key(0),
            20,
            counted(&calls, NOW, Ok(fake_read(0, 19, 600, 20))),
        )
        .await
        .unwrap();
        let s = c.stats();
        assert_eq!(
            (s.cached_entries, s.cached_bytes, s.reinsertions),
            (0, 0, 0),
            "{s:?}"
        );
    });
}

#[test]
fn a_scan_does_not_push_out_results_in_demand() {
    run(|| async {
        let c = FetchCoalescer::new(10_000, true);
        let calls = Rc::new(Cell::new(0));
        // A hot result asked for twice (promoted to the main queue; cut short by max_bytes, so
        // fresh whatever the end) ...
        for _ in 0..2 {
            c.read(
                key(0),
                5000,
                counted(&calls, NOW, Ok(fake_read(0, 9, 400, 5000))),
            )
            .await
            .unwrap();
        }
        // ... survives a scan of 100 results read once each.
        for off in 1000..1100 {
            c.read(
                key(off),
                5000,
                counted(&calls, NOW, Ok(fake_read(off, off, 300, 5000))),
            )
            .await
            .unwrap();
        }
        let before = calls.get();
        c.read(
            key(0),
            5000,
            counted(&calls, NOW, Ok(fake_read(0, 9, 400, 5000))),
        )
        .await
        .unwrap();
        assert_eq!(calls.get(), before, "the hot result was still cached");
    });
}

#[test]
fn a_result_that_can_never_be_fresh_again_is_dropped_at_once() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        // A tail result (everything up to the end it saw) ...
        let tail = Rc::downgrade(
            &c.read(
                key(0),
                10,
                counted(&calls, NOW, Ok(fake_read(0, 9, 300, 10))),
            )
            .await
            .unwrap(),
        );
        // ... and one cut short by max_bytes, which stays fresh whatever the end.
        c.read(
            key(5),
            10,
            counted(&calls, NOW, Ok(fake_read(5, 7, 200, 10))),
        )
        .await
        .unwrap();
        assert_eq!(c.stats().cached_entries, 2);
        // A read of the same log saw the end at 20: the tail result can never be fresh again.
        // It leaves the cache now, releasing its bytes (at the tail, slices of the tail cache's
        // chunks), instead of waiting for eviction.
        c.read(
            key(10),
            20,
            counted(&calls, NOW, Ok(fake_read(10, 19, 300, 20))),
        )
        .await
        .unwrap();
        let s = c.stats();
        assert_eq!((s.cached_entries, s.evictions), (2, 1), "{s:?}");
        assert!(tail.upgrade().is_none(), "the dead result was released");
        // The cut-short result is still served from the cache.
        let before = calls.get();
        c.read(
            key(5),
            20,
            counted(&calls, NOW, Ok(fake_read(5, 7, 200, 20))),
        )
        .await
        .unwrap();
        assert_eq!(calls.get(), before);
        // A read that saw an older end but finished after it (a slow disk read) is not kept.
        c.read(
            key(3),
            15,
            counted(&calls, NOW, Ok(fake_read(3, 14, 300, 15))),
        )
        .await
        .unwrap();
        let s = c.stats();
        assert_eq!((s.cached_entries, s.insertions), (2, 3), "{s:?}");
        // Many tail reads in a row keep one live tail result, however many there were.
        for end in 21..2000 {
            c.read(
                key(end - 1),
                end,
                counted(&calls, NOW, Ok(fake_read(end - 1, end - 1, 100, end))),
            )
            .await
            .unwrap();
        }
        assert_eq!(c.stats().cached_entries, 2, "{:?}", c.stats());
    });
}

#[test]
fn response_memory_counts_a_shared_result_once() {
    let memory = ResponseMemory::new(1000);
    let shared = SharedRead::new(fake_read(0, 9, 300, 10));
    let other = SharedRead::new(fake_read(10, 19, 200, 20));
    let h1 = memory.hold(&shared);
    let h2 = memory.hold(&shared);
    let h3 = memory.hold(&other);
    assert_eq!((memory.used(), memory.available()), (500, 500));
    drop(h1);
    assert_eq!(memory.used(), 500, "still held by another response");
    drop(h2);
    assert_eq!(memory.used(), 200);
    drop(h3);
    assert_eq!(memory.used(), 0);
}

#[test]
fn read_committed_results_share_and_stay_fresh_behind_the_high_watermark() {
    run(|| async {
        let c = FetchCoalescer::new(1 << 20, true);
        let calls = Rc::new(Cell::new(0));
        let committed = |offset| CoalesceKey {
            read_committed: true,
            ..key(offset)
        };
        // A read_committed read up to the last stable offset (10) while the high watermark is 30.
        let read = counted(&calls, NOW, Ok(fake_read(0, 9, 300, 10)));
        c.read(committed(0), 10, read).await.unwrap();
        // A read_uncommitted read of the same log sees the end at 30 ...
        let read = counted(&calls, NOW, Ok(fake_read(0, 29, 300, 30)));
        c.read(key(0), 30, read).await.unwrap();
        // ... which does not make the read_committed result stale: a second read_committed
        // consumer at the same offset shares it while the last stable offset stays.
        let before = calls.get();
        let read = counted(&calls, NOW, Ok(fake_read(0, 9, 300, 10)));
        c.read(committed(0), 10, read).await.unwrap();
        assert_eq!(calls.get(), before, "shared");
        // Once the last stable offset moves, it is read again.
        let read = counted(&calls, NOW, Ok(fake_read(0, 19, 300, 20)));
        c.read(committed(0), 20, read).await.unwrap();
        assert_eq!(calls.get(), before + 1);
    });
}
