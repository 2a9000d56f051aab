//! Edge mode's counters on one core, what `/v1/status` shows of them, and their `/metrics`
//! families.

use crate::metrics::{Exposition, Family};
use std::cell::Cell;

/// The edge's counters on one core.
#[derive(Debug, Default)]
pub struct EdgeMetrics {
    pub upstream_fetches: Cell<u64>,
    pub upstream_bytes: Cell<u64>,
    pub read_through: Cell<u64>,
    pub read_through_bytes: Cell<u64>,
    pub upstream_errors: Cell<u64>,
}

/// What the admin endpoint shows of edge mode on one core.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EdgeStats {
    pub upstream: String,
    pub fetch_streams: u64,
    pub upstream_fetches: u64,
    pub upstream_bytes: u64,
    pub read_through: u64,
    pub read_through_bytes: u64,
    pub upstream_errors: u64,
}

/// One partition's upstream position, for `/v1/status`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct FeedStatus {
    pub fetching: bool,
    /// The next offset the fetcher asks for (the local high watermark).
    pub position: i64,
    /// The upstream's log start and high watermark as last seen (-1: not known).
    pub upstream_log_start_offset: i64,
    pub upstream_high_watermark: i64,
    pub last_error: Option<String>,
}

/// One core's edge figures for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct EdgeFigures {
    /// The upstream fetchers' counters; none on a core not in edge mode.
    pub stats: Option<EdgeStats>,
    /// Bytes of the partitions the core keeps on disk (upstream partitions, at an edge).
    pub cache_bytes: u64,
}

const FAMILIES: [Family<EdgeFigures>; 7] = [
    ("upstream_fetch_streams", "gauge", "Upstream fetchers running (one per partition being read at this edge).", |e| e.stats.as_ref().map_or(0, |s| s.fetch_streams)),
    ("upstream_fetches_total", "counter", "Fetches the upstream fetchers made.", |e| e.stats.as_ref().map_or(0, |s| s.upstream_fetches)),
    ("upstream_bytes_total", "counter", "Record bytes the upstream fetchers brought in (compare shoal_fetch_response_bytes_total: the fan-out saving).", |e| e.stats.as_ref().map_or(0, |s| s.upstream_bytes)),
    ("read_through_total", "counter", "Upstream fetches for consumers behind what the edge holds (each shared by every consumer asking).", |e| e.stats.as_ref().map_or(0, |s| s.read_through)),
    ("read_through_bytes_total", "counter", "Record bytes read-through fetches brought in.", |e| e.stats.as_ref().map_or(0, |s| s.read_through_bytes)),
    ("upstream_errors_total", "counter", "Upstream requests that failed (connects, timeouts, error codes).", |e| e.stats.as_ref().map_or(0, |s| s.upstream_errors)),
    ("cache_bytes", "gauge", "Bytes of upstream partitions kept on disk at the edge.", |e| e.cache_bytes),
];

impl EdgeFigures {
    /// The edge families for every core, written only when some core is in edge mode.
    pub fn write_prometheus(out: &mut Exposition, cores: &[(usize, EdgeFigures)]) {
        if cores.iter().any(|(_, e)| e.stats.is_some()) {
            let cores: Vec<(usize, &EdgeFigures)> = cores.iter().map(|(c, e)| (*c, e)).collect();
            out.per_core("shoal_edge_", &FAMILIES, &cores);
        }
    }
}
