//! The transaction coordinator's core (KIP-98), per core as the group coordinator is: a
//! transactional id belongs to the core its hash names, which keeps its state and writes every
//! change to an internal log on that core. Not wired to the Kafka APIs yet: FindCoordinator for
//! transactions and transactional produce are still refused.
//!
//! - [`state`] — one transactional id's state machine, pure and synchronous: the next state and
//!   the markers to write, or Kafka's error code.
//! - [`log`]   — the durable state: a record per change in an internal log per core, replayed at
//!   start.
//!
//! Design notes: `docs/transactions.md`.

pub mod log;
pub mod state;

use std::path::{Path, PathBuf};

/// The core that coordinates `transactional_id` among `cores` (hashed as group ids are).
pub fn coordinator_core(transactional_id: &str, cores: usize) -> usize {
    crate::groups::coordinator_core(transactional_id, cores)
}

/// Where core `core`'s transaction log lives.
pub fn log_dir(data_dir: &Path, core: usize) -> PathBuf {
    data_dir.join("__transactions").join(format!("core-{core}"))
}
