//! Settings of one partition log. Every field is a `shoal serve` flag (and, where Kafka has one, a topic
//! config); the defaults follow Kafka's where they make sense for a single-node broker.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Roll to a new segment when the active one would grow past this (Kafka `segment.bytes`).
    pub segment_bytes: u64,
    /// Roll when the active segment's first batch is older than this (Kafka `segment.ms`).
    pub segment_age: Option<Duration>,
    /// Bytes between entries of the sparse offset index (Kafka `index.interval.bytes`).
    pub index_interval_bytes: u32,
    /// Non-durable appends are fsynced at least this often (`None`: only by the OS or a durable append).
    /// A crash of the machine loses at most this much of acknowledged `acks=1` data.
    pub flush_interval: Option<Duration>,
    /// Delete whole old segments while the log would stay at least this big (Kafka `retention.bytes`).
    pub retention_bytes: Option<u64>,
    /// Delete whole old segments whose newest record is older than this (Kafka `retention.ms`).
    pub retention_age: Option<Duration>,
    /// How often the log checks retention on its own.
    pub retention_check_interval: Duration,
    /// Largest batch accepted (Kafka `message.max.bytes`).
    pub max_batch_bytes: usize,
    /// Stamp every appended batch with the broker's clock (Kafka `message.timestamp.type=LogAppendTime`).
    pub log_append_time: bool,
    /// Write the active segment's durable (acks=all) appends with Direct I/O (`O_DIRECT`,
    /// `O_DSYNC`) where the file system allows it; the others, and all of them when false, go
    /// through the page cache.
    pub direct_io: bool,
    /// With Direct I/O, keep zeros written ahead of the data so that appends overwrite written
    /// blocks (on ext4, appends into allocated but unwritten space go to a kernel worker thread).
    /// Costs a second device write of every block.
    pub zero_ahead: bool,
    /// Retention deletes old segments (Kafka `cleanup.policy` holds `delete`).
    pub cleanup_delete: bool,
    /// The log is compacted: the latest record per key is kept (Kafka `cleanup.policy` holds
    /// `compact`). Appends must then give every record a key.
    pub cleanup_compact: bool,
    /// Compact once the dirty part (not compacted yet) is at least this share of the compactable
    /// part (Kafka `min.cleanable.dirty.ratio`).
    pub min_cleanable_dirty_ratio: f64,
    /// Records stay uncompacted at least this long (Kafka `min.compaction.lag.ms`).
    pub min_compaction_lag: Duration,
    /// Records stay uncompacted at most about this long, whatever the dirty ratio (Kafka
    /// `max.compaction.lag.ms`; `None`: no limit).
    pub max_compaction_lag: Option<Duration>,
    /// A tombstone (a record with a key and no value) stays readable at least this long after it
    /// was written, so a consumer reading from the start sees the delete (Kafka
    /// `delete.retention.ms`). Then compaction removes it.
    pub delete_retention: Duration,
    /// What appends do to the producers' compression (Kafka `compression.type` and its levels).
    pub compression: Compression,
}

/// The codec a log stores its batches in (Kafka's `compression.type` topic config), and the level
/// of each codec that has one (`compression.gzip.level`, `.lz4.level`, `.zstd.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    /// `None`: each batch keeps the producer's codec (`producer`); else the codec (0 for
    /// `uncompressed`, 1 gzip, 2 snappy, 3 lz4, 4 zstd) every batch is stored in, recompressed
    /// where the producer used another.
    pub codec: Option<i16>,
    /// gzip's level, 1-9, or -1 for zlib's default (6).
    pub gzip_level: i32,
    /// LZ4's level, 1-17. Accepted as Kafka accepts it; shoal's LZ4 encoder has one level.
    pub lz4_level: i32,
    /// zstd's level, -131072 to 22.
    pub zstd_level: i32,
}

impl Default for Compression {
    fn default() -> Self {
        Self {
            codec: None,
            gzip_level: -1,
            lz4_level: 9,
            zstd_level: 3,
        }
    }
}

impl Compression {
    /// The level the codec is written at, where it has one.
    pub fn level(&self, codec: i16) -> Option<i32> {
        match codec {
            1 => Some(self.gzip_level),
            3 => Some(self.lz4_level),
            4 => Some(self.zstd_level),
            _ => None,
        }
    }
}

/// Kafka caps `segment.bytes` at `i32::MAX`; we need positions to fit the index's `u32`.
pub const MAX_SEGMENT_BYTES: u64 = i32::MAX as u64;

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 256 << 20,
            segment_age: Some(Duration::from_secs(7 * 24 * 3600)),
            index_interval_bytes: 4096,
            flush_interval: Some(Duration::from_secs(1)),
            retention_bytes: None,
            retention_age: Some(Duration::from_secs(7 * 24 * 3600)),
            retention_check_interval: Duration::from_secs(300),
            max_batch_bytes: 1_048_588,
            log_append_time: false,
            direct_io: true,
            zero_ahead: true,
            cleanup_delete: true,
            cleanup_compact: false,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag: Duration::ZERO,
            max_compaction_lag: None,
            delete_retention: Duration::from_secs(24 * 3600),
            compression: Compression::default(),
        }
    }
}

/// How an active segment is written with Direct I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirectOptions {
    /// The log's segment size: the file is allocated ahead in steps no larger.
    pub segment_bytes: u64,
    /// Zeros are written ahead of the data ([`LogConfig::zero_ahead`]).
    pub zero_ahead: bool,
}

impl LogConfig {
    /// How active segments are written with Direct I/O; `None` without it.
    pub(crate) fn direct_options(&self) -> Option<DirectOptions> {
        self.direct_io.then_some(DirectOptions {
            segment_bytes: self.segment_bytes,
            zero_ahead: self.zero_ahead,
        })
    }

    /// Clamps values that would break the log's invariants.
    pub(crate) fn sanitized(mut self) -> Self {
        self.segment_bytes = self.segment_bytes.clamp(4096, MAX_SEGMENT_BYTES);
        self.index_interval_bytes = self.index_interval_bytes.max(1);
        self.max_batch_bytes = self.max_batch_bytes.min(self.segment_bytes as usize);
        if !self.min_cleanable_dirty_ratio.is_finite() {
            self.min_cleanable_dirty_ratio = 0.5;
        }
        self.min_cleanable_dirty_ratio = self.min_cleanable_dirty_ratio.clamp(0.0, 1.0);
        self
    }
}
