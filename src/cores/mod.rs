//! What one core is and what cores say to each other: a core's state ([`Core`]), the settings it
//! runs with, how busy it is, the messages of the core-to-core mesh and the loop that receives
//! them, and the cross-core halves of features whose local half lives in its own room (groups'
//! lag, transactions' markers, read replicas' traffic).
//!
//! ## Layout, top layer first
//! Each module uses only those below it.
//! - [`receive`]     — a core's receive loop: one task per peer core acting on its messages.
//! - [`every_core`]  — asking every core at once: statistics gathered, a live setting applied.
//! - [`replica_link`] — read replicas' messages sent over the mesh in order, and the policy tick.
//! - [`group_lag`]   — the cross-core half of consumer group lag: the coordinator's rounds asking
//!   each owner core for its partitions' ends, and the owner's answer (the lag itself is
//!   [`crate::groups::lag`]).
//! - [`transaction_markers`] — the cross-core half of transactions: a coordinator core registers
//!   partitions with their owners, has markers written and groups' transactional offsets ended
//!   over the mesh; its ticker (recovery, timeouts, idle ids). The coordinator's state machine is
//!   [`crate::transactions`].
//! - [`state`]       — one core ([`Core`]): its topic table copy and owned partitions, the read
//!   path (tail cache, coalescer, view readers, pacing, fetch sessions), security, the group coordinator, the
//!   front end's counters, its start-up stage, its end of the mesh and, in edge mode, its upstream.
//! - [`config`]      — the broker settings every core runs with ([`config::BrokerConfig`]),
//!   composed of each layer's own settings (log, groups, ACLs, auth, pacing, edge).
//! - [`mesh`]        — the messages cores send each other and a core's end of the channels.
//! - [`opening`]     — the partitions a core is still opening, those requests wait for first.
//! - [`load`]        — how busy a core is, and the fetch pacing derived from it.
//! - [`fetch_sessions`] — the core's incremental fetch sessions (KIP-227): ids, epochs, each
//!   session's partitions and what it last answered, the bounded cache and its evictions.

pub mod config;
pub mod every_core;
pub mod fetch_sessions;
pub mod group_lag;
pub mod load;
pub mod mesh;
pub mod opening;
pub mod receive;
pub mod replica_link;
pub mod state;
pub mod transaction_markers;

pub use state::{Core, Listener, TaskQueues};
