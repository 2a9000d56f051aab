//! What tests of every crate share: an executor with a guard against hangs, and a way to say that
//! a check was skipped.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

/// How long [`run`] waits for a test's future before failing the test.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `f`'s future on a fresh glommio executor on a thread of its own; a panic in it fails the
/// test, and so does a hang, after [`TIMEOUT`], instead of stalling CI.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            glommio::LocalExecutor::default().run(f());
        }));
        let _ = tx.send(outcome);
    });
    match rx.recv_timeout(TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("test did not finish within {TIMEOUT:?}"),
    }
}

/// Says, in the test run's own output, that `test` skipped `what` and why: one line
/// `SKIPPED <test>: <what>: <why>`. Written to stderr directly, not through `eprintln!`, so the
/// test harness does not capture it and it shows beside the test's `ok`.
pub fn skipped(test: &str, what: &str, why: &str) {
    let line = format!("SKIPPED {test}: {what}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
