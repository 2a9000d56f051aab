//! # shards — shoal's shard-local engine
//!
//! Everything one core needs to store and serve its partitions, with no sockets, no Kafka request
//! types and no CLI: those live in the `shoal` crate above, and this crate never depends on them.
//! State here is `!Send` (`Rc`, `RefCell`, `Cell`): each core owns its own, and nothing takes a lock.
//!
//! ## Layout, top layer first
//! Each module uses only those below it; `python3 .ci/modgraph.py --check shards/src` checks it.
//! - [`partition`]  — a partition on its owning core: the log plus the idempotent-producer state
//!   kept in step with it (snapshots at clean shutdown, rebuilt from batch headers after a crash).
//! - [`internal_log`] — an internal compacted log per core (keyed records, durable appends, replay,
//!   rewrite into a new generation, re-sharding when the core count changes), kept by the groups'
//!   offsets and the transaction coordinator.
//! - [`view_reader`] — sharded views: one interpreting reader per (partition, shard count), a shared
//!   window of per-shard batches, catch-up reads for consumers outside it.
//! - [`compactor`]  — one per core: compacts the core's compacted logs that are due, in a task queue
//!   of its own (the pass itself is `log::compact`).
//! - [`coalescer`]  — the fetch read coalescer (one read per key serves every fetch; fresh S3-FIFO
//!   cache) and the response-memory budget.
//! - [`log`]        — one partition's log: append (offsets, group commit), read, recovery, retention,
//!   compaction, delete; read replicas of it on other cores (fed by the owner's hand-overs,
//!   reading the owner's files through duplicated descriptors). Its storage rooms, used by it
//!   alone, are inside it: segment files, their index, Direct I/O writes, read-ahead.
//! - [`tail_cache`] — the per-core cache of recent batches that makes tail reads copy-free and I/O-free.
//! - `chunk`        — the append-only memory behind the tail cache, shared as `Bytes` without copying.
//! - `decoded`      — compressed batches' records as decompressed at produce, kept a short while for
//!   the log's view readers (so a batch is decompressed once, not again to be split).
//! - [`producers`]  — idempotent producer state per partition: duplicates, gaps, epochs, snapshots.
//! - [`transactions`] — transactions in a log: commit/abort markers (control batches), the open
//!   transactions that hold the last stable offset back, each segment's aborted-transaction index.
//! - [`split`]      — one source batch decompressed once, routed by key and encoded once per view shard.
//! - [`partitioner`] — Kafka's default partitioner (murmur2), which decides a record's view shard.
//! - [`records`]    — what a read returns: whole batches as shared slices, plus counts.
//! - [`batch`]      — Kafka RecordBatch v2: header parsing, validation (CRC-32C), offset assignment,
//!   LogAppendTime stamping, and a builder/decoder for uncompressed batches.
//! - [`compression`] — Kafka's record codecs (gzip, snappy, lz4, zstd), bounded decompression.
//! - `lz4_frame`    — an LZ4 frame decoder that reuses its block buffers (no allocation per batch).
//! - [`storage_health`](mod@storage_health) — storage failures: logged once per episode per log, counted per core.
//! - [`latency`]    — latency histograms, and the device's write and fsync latencies per core.
//! - [`monitor`]    — the offset monitor: wait until a watermark reaches an offset (group commit,
//!   long polling).
//! - [`oneshot`]    — a one-shot value from one task to another on the core (append results,
//!   group answers).
//! - [`config`]     — per-log settings (segment size, flush interval, retention, ...).
//! - [`files`]      — small files written whole (checkpoints, snapshots); directories created durably.
//! - [`error`]      — the crate's one error type, mapped to Kafka error codes by the front end.
//! - [`testing`]    — for the tests of this crate and the ones above: an executor guarded by a
//!   timeout, and the line that says a check was skipped.
//! - [`fast_map`]   — the hash map of per-request paths: hashbrown with foldhash, seeded from the OS.

pub mod batch;
mod chunk;
pub mod coalescer;
pub mod compactor;
pub mod compression;
pub mod config;
mod decoded;
pub mod error;
pub mod fast_map;
pub mod files;
pub mod internal_log;
pub mod latency;
pub mod log;
mod lz4_frame;
pub mod monitor;
pub mod oneshot;
pub mod partition;
pub mod partitioner;
pub mod producers;
pub mod records;
pub mod split;
pub mod storage_health;
pub mod tail_cache;
pub mod testing;
pub mod transactions;
pub mod view_reader;

pub use crate::coalescer::{CoalesceKey, FetchCoalescer, ResponseHold, ResponseMemory, SharedRead};
pub use crate::config::{Compression, LogConfig};
pub use crate::error::{Error, InvalidBatch, Result};
pub use crate::fast_map::{FastMap, FastSet};
pub use crate::latency::{device_latency, DeviceLatency, DurationHistogram, DurationSnapshot};
pub use crate::log::segment::now_ms;
pub use crate::log::{
    open_files, set_open_files_limit, AppendOptions, AppendResult, Appended, CompactionStats,
    Handover, Log, LogEvent, LogSnapshot, LogStats, OpenFiles, WeakLog,
};
pub use crate::monitor::OffsetMonitor;
pub use crate::records::{LogRead, Records, UpstreamTxns};
pub use crate::storage_health::{storage_health, StorageHealth};
pub use crate::tail_cache::{TailCache, TailCacheStats};
