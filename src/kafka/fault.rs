//! Fault injection for the end-to-end tests, which run the real binary: built only with the cargo
//! feature `fault-injection`, which the integration tests turn on (the crate's dev-dependency on
//! itself). Then, when the environment variable `SHOAL_TEST_PANIC_CLIENT_ID` is set, every request
//! whose client id equals it panics inside its handler task after its first yield. Without the
//! feature, `panic_if_asked` does nothing and the variable is never read.

use crate::wire::header::Request;

#[cfg(feature = "fault-injection")]
const VAR: &str = "SHOAL_TEST_PANIC_CLIENT_ID";

/// Panics, after a yield to the executor, if `req` comes from the client id in `VAR`.
#[cfg(feature = "fault-injection")]
pub async fn panic_if_asked(req: &Request) {
    use std::sync::OnceLock;
    static CLIENT_ID: OnceLock<Option<String>> = OnceLock::new();
    let Some(id) = CLIENT_ID.get_or_init(|| std::env::var(VAR).ok()) else {
        return;
    };
    if req.header.client_id.as_deref() == Some(id.as_str()) {
        glommio::executor().yield_task_queue_now().await;
        panic!("injected by {VAR}");
    }
}

#[cfg(not(feature = "fault-injection"))]
pub async fn panic_if_asked(_: &Request) {}
