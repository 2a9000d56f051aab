//! The transaction coordinator (KIP-98), per core as the group coordinator is: a transactional id
//! belongs to the core its hash names, which keeps its state and writes every change to an internal
//! log on that core.
//!
//! ## Layout, top layer first
//! - [`coordinator`] — one core's coordinator: the checks of each request, the next state made
//!   durable, the markers to write; what the ticker must carry out (timeouts, recovery, expiry).
//! - `reshard` — moving transactional ids to their new coordinators when `--cores` changes
//!   ([`reshard()`]).
//! - [`log`]   — the durable state: a record per change in an internal log per core, replayed at
//!   start.
//! - [`state`] — one transactional id's state machine, pure and synchronous: the next state and
//!   the markers to write, or Kafka's error code.
//!
//! The markers are written on the partitions' owner cores by `crate::cores::transaction_markers`.
//!
//! Design notes: `docs/transactions.md`.

pub mod coordinator;
pub mod log;
mod reshard;
pub mod state;

pub use reshard::reshard;

use std::path::{Path, PathBuf};

/// The core that coordinates `transactional_id` among `cores` (hashed as group ids are).
pub fn coordinator_core(transactional_id: &str, cores: usize) -> usize {
    crate::groups::coordinator_core(transactional_id, cores)
}

/// Where core `core`'s transaction log lives.
pub fn log_dir(data_dir: &Path, core: usize) -> PathBuf {
    data_dir.join("__transactions").join(format!("core-{core}"))
}

/// What a transaction coordinator asks of another core (over the mesh), and the same work done
/// on its own core.
#[derive(Debug, Clone)]
pub enum TxnAsk {
    /// AddPartitionsToTxn: these partitions (owned by the asked core) accept the producer's
    /// transactional batches at `epoch` until its next marker.
    Register {
        producer_id: i64,
        epoch: i16,
        partitions: Vec<state::TopicPartition>,
    },
    /// EndTxn (or an abort by the coordinator): write a commit or abort marker on each partition.
    Markers {
        producer_id: i64,
        epoch: i16,
        commit: bool,
        partitions: Vec<state::TopicPartition>,
    },
    /// EndTxn: the groups' transactional offsets of the producer become committed, or are
    /// dropped (asked of each group's coordinator core).
    Offsets {
        producer_id: i64,
        epoch: i16,
        commit: bool,
        groups: Vec<String>,
    },
}
