//! # shoal — a Kafka-compatible broker for high fan-out reads
//!
//! Thread-per-core on glommio: every core is a Kafka broker with its own port, owns a share of the
//! partitions, and serves them without locks. Storage and everything else shard-local lives in the
//! `shards` crate; this crate is the process around it. The `shoal` binary (`src/bin/shoal/`: the
//! CLI, the operator commands and their Kafka client, the load generator; none of it part of this
//! library) runs it through [`server`].
//!
//! ## Layout, top layer first
//! Each module uses only those below it; `python3 .ci/modgraph.py --check src` checks it (CI runs it),
//! and inside each room the order its own layout doc writes.
//! - [`server`]      — start-up: listeners, one pinned executor per core, the core mesh, the
//!   cores' background tasks (in edge mode the upstream's topic mirror), orderly stop.
//! - [`admin`]       — admin HTTP on its own thread (`/metrics`, `/v1/status`, live settings), asking
//!   core 0 by message over its link.
//! - [`console`]     — the live console: its page (compiled in) and the JSON it polls, built from
//!   the cores' snapshots and the topic table, with the last 15 minutes sampled for its charts.
//! - [`kafka`]       — the Kafka front end: connections, one handler per API.
//! - [`http`]        — topics streamed to browsers and devices: Server-Sent Events and WebSocket
//!   on every core, one encoded frame per batch shared by every subscriber on the core.
//! - [`control`]     — the control plane: topic changes (create, grow, configure, delete, ACLs,
//!   mirrored topics) decided by core 0, persisted and applied by every core.
//! - [`cores`]       — what one core is and what cores say to each other: `Core`, its settings and
//!   load, the mesh's messages and receive loop, and the cross-core halves of groups' lag,
//!   transactions' markers and read replicas' traffic.
//! - [`stats`]       — what a core reports (`CoreSnapshot`, each component's snapshot) and
//!   `/metrics` composed from each component's families; the front end's counters; the `shards`
//!   engine's families.
//! - [`replicas`]    — read replicas of hot partitions on the other cores (KIP-392 between
//!   cores): the owner's hand-overs, the replicas a core holds, steering consumers by
//!   `preferred_read_replica`, when replicas start and stop.
//! - [`edge`]        — edge mode (`shoal edge`), all of it: a core's view of the upstream cluster,
//!   one upstream fetcher per partition mirroring it into the local log, read-through, the topic
//!   mirror, group requests forwarded upstream, and its counters. The rest asks
//!   `Core::upstream()` (absent in `serve`) through a few narrow methods.
//! - [`transactions`] — the transaction coordinator per core: a transactional id's state machine,
//!   the checks of each request, its states in a durable internal log per core.
//! - [`groups`]      — consumer groups: the per-core coordinator, the group state machine, committed
//!   offsets in a compacted internal log, lag from the ends owners report.
//! - [`table`]       — the table every core holds a copy of: topics, the partition -> core mapping,
//!   view names, the names by topic id; its ACLs (Kafka's model, the authorizer's decision) and
//!   the topic and broker configs as Kafka's admin APIs describe them.
//! - [`metrics`]     — the Prometheus text writer and the counter cell components count with.
//! - [`auth`]        — who a connection is: listeners' security protocols, TLS (rustls), SASL (PLAIN,
//!   SCRAM-SHA-256/512), the users file.
//! - [`wire`]        — the Kafka wire format shared with the load generator and the tests: frames,
//!   headers, the FetchResponse codec, the shared TCP stream and kernel TLS under it.
//! - [`alloc_guard`] — the global allocator that defuses allocation bombs in request decoding.

pub mod admin;
pub mod alloc_guard;
pub mod auth;
pub mod console;
pub mod control;
pub mod cores;
pub mod edge;
pub mod groups;
pub mod http;
pub mod kafka;
pub mod metrics;
pub mod replicas;
pub mod server;
pub mod stats;
pub mod table;
pub mod transactions;
pub mod wire;
