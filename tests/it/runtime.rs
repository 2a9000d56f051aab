//! What shoal relies on from its runtime (the patched glommio in `vendor/glommio`): its rings take
//! no interrupt per completion (`IORING_SETUP_COOP_TASKRUN`), so a completion is posted when the
//! thread next enters the kernel (a system call, or the scheduler tick's return to user space),
//! and the scheduler's preemption is a deadline that `need_preempt` checks against the clock, not
//! a timeout request in the ring. A task queue that spins without a system call must still be
//! preempted, so other queues run (produce and the connections' readers preempt fetch work this
//! way). Were preemption never noticed without a system call, the timer below would wait for the
//! spinner's 3 s. So must a ring's depth of completions waiting on the main ring (glommio 0.9 armed
//! a counting timeout for that; the patch reads the ring's head and tail instead).

use glommio::{Latency, LocalExecutorBuilder, Placement, Shares};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[test]
fn a_latency_queue_preempts_a_busy_queue_that_makes_no_system_call() {
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(|| async {
            let ex = glommio::executor();
            let busy = ex.create_task_queue(Shares::default(), Latency::NotImportant, "busy");
            let urgent = ex.create_task_queue(
                Shares::default(),
                Latency::Matters(Duration::from_millis(1)),
                "urgent",
            );
            let started = Instant::now();
            let woke: Rc<Cell<Option<Duration>>> = Rc::default();
            let w = woke.clone();
            let timer = glommio::spawn_local_into(
                async move {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                    w.set(Some(started.elapsed()));
                },
                urgent,
            )
            .unwrap();
            let w = woke.clone();
            let spinner = glommio::spawn_local_into(
                async move {
                    // CPU only (the clock is read through the vDSO): the only way out before the
                    // deadline is the scheduler's preemption.
                    let mut x = 0u64;
                    while w.get().is_none() && started.elapsed() < Duration::from_secs(3) {
                        for i in 0..1000 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                        }
                        glommio::yield_if_needed().await;
                    }
                    x
                },
                busy,
            )
            .unwrap();
            spinner.await;
            timer.await;
            woke.get().unwrap()
        })
        .unwrap();
    let woke = handle.join().unwrap();
    // 5 ms asked, noticed at the next preemption (glommio's timer: 100 ms); never the spinner's 3 s.
    assert!(
        woke < Duration::from_millis(1000),
        "the timer ran after {woke:?}"
    );
    eprintln!("the 5 ms timer ran after {woke:?}");
}

/// A ring's depth of completions on the main ring preempts the running task queue, whatever the
/// deadline: here 10 s away, so only the completions can make `need_preempt` say yes. The task
/// submits 1.5 rings' depth of file writes (glommio submits writes at once) and then spins without
/// a system call; the kernel posts their completions inline or at the next scheduler tick. Were the
/// count not read, it would spin to its 3 s cap.
#[test]
fn a_ring_depth_of_main_ring_completions_preempts_a_busy_queue() {
    const DEPTH: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("writes");
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .ring_depth(DEPTH)
        .preempt_timer(Duration::from_secs(10))
        .spawn(move || async move {
            let file = glommio::io::BufferedFile::create(&path).await.unwrap();
            type Write<'a> = Pin<Box<dyn Future<Output = glommio::Result<usize, ()>> + 'a>>;
            let mut writes: Vec<Write<'_>> = (0..DEPTH * 3 / 2)
                .map(|i| Box::pin(file.write_at(vec![7u8; 512], i as u64 * 512)) as Write<'_>)
                .collect();
            // One poll each: every write is in the kernel's hands before the spin starts.
            for w in &mut writes {
                assert!(futures_lite::future::poll_once(w).await.is_none());
            }
            let started = Instant::now();
            let mut x = 0u64;
            while !glommio::executor().need_preempt() && started.elapsed() < Duration::from_secs(3)
            {
                for i in 0..1000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
            }
            let preempted = started.elapsed();
            for w in writes {
                assert_eq!(w.await.unwrap(), 512);
            }
            std::hint::black_box(x);
            preempted
        })
        .unwrap();
    let preempted = handle.join().unwrap();
    assert!(
        preempted < Duration::from_millis(1000),
        "need_preempt said yes only after {preempted:?}"
    );
    eprintln!("the main ring's completions preempted after {preempted:?}");
}
