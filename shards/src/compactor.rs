//! The compactor of one core: a task in a task queue of its own (few shares, latency not
//! important) that, every [`TICK`], finds the core's compacted logs that are due and compacts the
//! dirtiest, one pass at a time. A pass yields the core every half millisecond of work
//! (`log::compact`), so appends and reads on the core wait for it at most about that long.
//!
//! It looks through every log open on the core ([`crate::log::open_logs`]; a log's cleanup policy
//! can change while it is open). The server starts the compactor on each core ([`start`]). It is
//! per thread, which is per core in shoal (one glommio executor per thread); a new executor on the
//! same thread gets a new task.

use crate::log::{open_logs, Log};
use std::cell::Cell;
use std::time::Duration;

/// How often the compactor looks for logs that are due.
pub const TICK: Duration = Duration::from_millis(250);
/// The compactor's share of the core against the default task queue's 1000, when both have work.
const SHARES: usize = 100;

thread_local! {
    /// The executor this thread's compactor task runs on, once started.
    static STARTED_ON: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Starts this core's compactor unless it runs: the server does at each core's start. Logs are
/// compacted only by explicit [`Log::compact_now`] calls until then (tests that need control).
pub fn start() {
    let executor = glommio::executor().id();
    let started = STARTED_ON.with(|s| s.replace(Some(executor)) == Some(executor));
    if started {
        return;
    }
    match glommio::spawn_local_into(run(), task_queue()) {
        Ok(task) => drop(task.detach()),
        Err(e) => {
            log::error!("could not start the compactor: {e}");
            STARTED_ON.with(|s| s.set(None));
        }
    }
}

/// A new task queue with the compactor's settings (few shares, latency not important): the
/// compactor runs in one; benchmarks run a pass in one to measure what the core's other work sees.
pub fn task_queue() -> glommio::TaskQueueHandle {
    glommio::executor().create_task_queue(
        glommio::Shares::Static(SHARES),
        glommio::Latency::NotImportant,
        "shoal-compactor",
    )
}

/// The logs due now, dirtiest first.
fn due(now_ms: i64) -> Vec<Log> {
    let mut due: Vec<(f64, Log)> = open_logs()
        .into_iter()
        .filter_map(|log| Some((log.compaction_due(now_ms)?, log)))
        .collect();
    due.sort_by(|a, b| b.0.total_cmp(&a.0));
    due.into_iter().map(|(_, log)| log).collect()
}

async fn run() {
    loop {
        glommio::timer::sleep(TICK).await;
        for log in due(crate::now_ms()) {
            // Failures are logged and retried later by the pass itself.
            let _ = log.compact_now().await;
        }
    }
}
