//! The `/metrics` families of the `shards` engine's figures on each core (the engine crate knows
//! nothing of Prometheus).

use super::CoreSnapshot;
use crate::metrics::{core_label, DurationSnapshot, Exposition, Family};

/// Which of a core's device histograms a family renders.
type DeviceHistogram = fn(&shards::DeviceLatency) -> &DurationSnapshot;

const DEVICE: [(&str, &str, DeviceHistogram); 2] = [
    (
        "shoal_log_write_duration_seconds",
        "Time each write of grouped appends took, from issue to completion: into the page \
         cache for acks=0/1 groups, to the storage device (O_DSYNC) for acks=all groups.",
        |d| &d.writes,
    ),
    (
        "shoal_log_fsync_duration_seconds",
        "Time each fsync of the logs took: the periodic flush, group commit, a rolled \
         segment's seal, index files, directories.",
        |d| &d.fsyncs,
    ),
];

const STORAGE: [Family<CoreSnapshot>; 9] = [
    ("storage_errors_total", "counter", "Storage operations that failed (log writes, fsyncs, segment rolls, index writes).", |c| c.storage.errors),
    ("partitions_storage_failing", "gauge", "Logs (partitions, group stores) whose last storage operation failed: appends fail until one succeeds.", |c| c.storage.failing_logs),
    ("tail_cache_bytes", "gauge", "Memory held by the tail cache.", |c| c.tail_cache.used_bytes as u64),
    ("tail_cache_hits_total", "counter", "Reads served from the tail cache.", |c| c.tail_cache.hits),
    ("tail_cache_misses_total", "counter", "Reads that went to disk.", |c| c.tail_cache.misses),
    ("open_files", "gauge", "Files the core's logs hold open (segments, Direct I/O writers, files being written); idle partitions hold none.", |c| c.open_files.open),
    ("open_files_limit", "gauge", "The core's open files budget (--max-open-files-per-core).", |c| c.open_files.limit),
    ("open_file_evictions_total", "counter", "Segments whose files the core closed to stay within its budget (the least recently used first).", |c| c.open_files.evictions),
    ("open_file_refusals_total", "counter", "Opens that failed because the core's budget stayed in use (raise --max-open-files-per-core).", |c| c.open_files.refusals),
];

const COALESCER: [Family<CoreSnapshot>; 8] = [
    (
        "reads_total",
        "counter",
        "Reads run against the log for fetches.",
        |c| c.coalescer.reads,
    ),
    (
        "insertions_total",
        "counter",
        "Results cached under a new key.",
        |c| c.coalescer.insertions,
    ),
    (
        "reinsertions_total",
        "counter",
        "Stale results replaced by a new read.",
        |c| c.coalescer.reinsertions,
    ),
    (
        "ready_hits_total",
        "counter",
        "Fetches served from a fresh cached result.",
        |c| c.coalescer.ready_hits,
    ),
    (
        "inflight_hits_total",
        "counter",
        "Fetches that joined a read in flight.",
        |c| c.coalescer.inflight_hits,
    ),
    (
        "evictions_total",
        "counter",
        "Results that left the cache: for space, or because they can never be fresh again.",
        |c| c.coalescer.evictions,
    ),
    (
        "cached_bytes",
        "gauge",
        "Record bytes held by the cache.",
        |c| c.coalescer.cached_bytes,
    ),
    ("enabled", "gauge", "1 when fetch coalescing is on.", |c| {
        c.coalescing as u64
    }),
];

const FETCH: [Family<CoreSnapshot>; 3] = [
    ("fetch_pacing_delay_microseconds", "gauge", "The core's current fetch pacing delay (capped per fetch by its partition's waiters and its max wait).", |c| c.fetch_pacing_delay_us),
    ("core_busy_percent", "gauge", "Smoothed share of the core's time spent running tasks.", |c| c.busy_percent),
    ("fetch_response_memory_bytes", "gauge", "Record bytes held by fetch responses not yet written (shared results counted once).", |c| c.response_memory_bytes),
];

const VIEWS: [Family<CoreSnapshot>; 9] = [
    ("readers", "gauge", "Live view readers.", |c| c.views.readers),
    ("sharing_enabled", "gauge", "1 when view readers are shared (0: each view fetch decodes for itself).", |c| c.view_sharing as u64),
    ("source_batches_decoded_total", "counter", "Source batches decoded and split for views.", |c| c.views.source_batches_decoded),
    ("shard_batches_encoded_total", "counter", "Shard batches encoded for views.", |c| c.views.shard_batches_encoded),
    ("fetches_served_total", "counter", "Fetches of view partitions served.", |c| c.views.fetches_served),
    ("catch_up_reads_total", "counter", "View fetches served by their own read.", |c| c.views.catch_up_reads),
    ("catch_up_reads_shared_total", "counter", "View fetches served by another fetch's catch-up read of the same offset and size (any shard).", |c| c.views.catch_up_reads_shared),
    ("decode_errors_total", "counter", "Source batches views could not decode (skipped).", |c| c.views.decode_errors),
    ("decompressions_saved_total", "counter", "Compressed source batches split from the records decompressed when they were produced.", |c| c.views.decompressions_saved),
];

pub(super) fn write_prometheus(out: &mut Exposition, cores: &[CoreSnapshot]) {
    for (name, help, of) in DEVICE {
        out.header(name, "histogram", help);
        for c in cores {
            out.duration(name, &core_label(c.core), of(&c.device));
        }
    }
    let cores: Vec<_> = cores.iter().map(|c| (c.core, c)).collect();
    out.per_core("shoal_", &STORAGE, &cores);
    out.per_core("shoal_fetch_coalescer_", &COALESCER, &cores);
    out.per_core("shoal_", &FETCH, &cores);
    out.per_core("shoal_view_", &VIEWS, &cores);
}
