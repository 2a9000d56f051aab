//! # shoal — a Kafka-compatible broker for high fan-out reads
//!
//! Thread-per-core on glommio: every core is a Kafka broker with its own port, owns a share of the
//! partitions, and serves them without locks. Storage and everything else shard-local lives in the
//! `shards` crate; this crate is the process around it. The `shoal` binary (`main.rs`, `cli.rs`, `units.rs`
//! and the load generator `bench/`, none of them part of this library) runs it through [`server`].
//!
//! ## Layout
//! - [`config`]      — the broker settings every core runs with (`BrokerConfig`).
//! - [`wire`]        — the Kafka wire format shared with the load generator and the tests: frames,
//!   headers, the FetchResponse codec, the shared TCP stream.
//! - [`server`]      — start-up: listeners, one pinned executor per core, the core mesh, orderly stop.
//! - [`core`]        — one core's state: topic table copy, owned partitions, tail cache, metrics.
//! - [`router`]      — the topic table and the partition -> core mapping; topic names and configs.
//! - [`mesh`]        — the messages cores send each other and a core's end of the channels.
//! - [`control`]     — the control plane: create/delete topics via core 0, persisted and broadcast.
//! - [`partition`]   — a partition on its core: the log plus idempotent-producer state.
//! - [`groups`]      — consumer groups: the per-core coordinator, the group state machine, committed
//!   offsets in a compacted internal log.
//! - [`kafka`]       — the Kafka front end: connections, one handler per API.
//! - [`admin`]       — admin HTTP on its own thread (`/metrics`, `/v1/status`, live settings), asking
//!   core 0 by message.
//! - [`metrics`]     — per-core counters and the Prometheus rendering.
//! - [`alloc_guard`] — the global allocator that defuses allocation bombs in request decoding.

pub mod admin;
pub mod alloc_guard;
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
pub mod wire;
