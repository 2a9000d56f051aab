//! # shoal — a Kafka-compatible broker for high fan-out reads
//!
//! Thread-per-core on glommio: every core is a Kafka broker with its own port, owns a share of the
//! partitions, and serves them without locks. Storage and everything else shard-local lives in the
//! `shards` crate; this crate is the process around it.
//!
//! ## Layout
//! - [`cli`]         — `shoal` command line and every tunable flag.
//! - [`config`]      — the broker settings every core runs with (`BrokerConfig`).
//! - [`units`]       — sizes with units, the same for every flag.
//! - [`server`]      — start-up: listeners, one pinned executor per core, the core mesh, orderly stop.
//! - [`core`]        — one core's state: topic table copy, owned partitions, tail cache, metrics.
//! - [`router`]      — the topic table and the partition -> core mapping; topic names and configs.
//! - [`mesh`]        — the messages cores send each other and a core's end of the channels.
//! - [`control`]     — the control plane: create/delete topics via core 0, persisted and broadcast.
//! - [`partition`]   — a partition on its core: the log plus idempotent-producer state.
//! - [`groups`]      — consumer groups: the per-core coordinator, the group state machine, committed
//!   offsets in a compacted internal log.
//! - [`kafka`]       — the Kafka front end: framing, connections, headers, one handler per API.
//! - [`admin`]       — admin HTTP on its own thread (`/metrics`, `/v1/status`, live settings), asking
//!   core 0 by message.
//! - [`metrics`]     — per-core counters and the Prometheus rendering.
//! - [`alloc_guard`] — the global allocator that defuses allocation bombs in request decoding.
//! - [`bench`]       — `shoal bench fanout`: the fan-out load generator, its Kafka client and baseline.

pub mod admin;
pub mod alloc_guard;
pub mod bench;
pub mod cli;
pub mod config;
pub mod control;
pub mod core;
pub mod groups;
pub mod kafka;
pub mod mesh;
pub mod metrics;
pub mod partition;
pub mod router;
pub mod server;
pub mod units;
