//! What the groups' unit tests share: an executor to run on and a small tail cache for stores.

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

/// Runs `f`'s future on a fresh glommio executor; a hang fails the test after 60 s instead of
/// stalling CI.
pub fn run<F: Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            glommio::LocalExecutor::default().run(f());
        }));
        let _ = tx.send(outcome);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("test did not finish within 60 s"),
    }
}

/// A tail cache for an offsets store under test.
pub fn cache() -> Rc<shards::TailCache> {
    Rc::new(shards::TailCache::new(1 << 20, 1 << 16))
}
