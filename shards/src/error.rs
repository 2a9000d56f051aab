//! The shard layer's one error type. The Kafka front end maps each variant to a Kafka error code in
//! one place; nothing here knows about the wire.

use std::path::PathBuf;

/// Why a batch handed to [`crate::Log::append`] was refused. Every variant means nothing was appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBatch {
    #[error("records blob is empty")]
    Empty,
    #[error("truncated batch: need {needed} bytes, {available} left")]
    Truncated { needed: usize, available: usize },
    #[error("batch length {0} is below the RecordBatch v2 header size")]
    LengthTooSmall(i32),
    #[error("unsupported magic byte {0} (only RecordBatch v2 is accepted)")]
    Magic(i8),
    #[error("CRC-32C mismatch: header says {stored:#010x}, bytes give {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("record count {0} must be at least 1")]
    RecordCount(i32),
    #[error("last offset delta {last_offset_delta} does not fit record count {records}")]
    OffsetDelta {
        last_offset_delta: i32,
        records: i32,
    },
    #[error("timestamps out of range: base {base}, max {max}")]
    Timestamp { base: i64, max: i64 },
    #[error("batch of {size} bytes exceeds the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("control or transactional batches are not supported")]
    Unsupported,
    #[error("cannot read the records: {0}")]
    Decompress(String),
    /// A mirrored batch starts at or before the end of the one before it (or of the log).
    #[error("a batch at offset {base_offset} overlaps what precedes it (up to {previous_last})")]
    OffsetsOverlap {
        base_offset: i64,
        previous_last: i64,
    },
    /// One append would span more offsets than a segment can index.
    #[error("the batches span {offsets} offsets, more than the {limit} one segment holds")]
    TooManyOffsets { offsets: i64, limit: i64 },
    /// The records section does not match the header (Kafka: `INVALID_RECORD`).
    #[error("records do not match the header's record count {count}: {why}")]
    Records { count: i32, why: String },
    /// A compacted log keeps the latest record per key, so every record needs one (Kafka:
    /// `INVALID_RECORD`).
    #[error("{} record(s) without a key (the first at index {}): a compacted topic only takes records with keys", .indexes.len(), .indexes.first().copied().unwrap_or(0))]
    MissingKey {
        /// Each keyless record's index in its batch (the first batch that has any), as Kafka's
        /// produce response lists them (`record_errors`).
        indexes: Vec<i32>,
    },
}

/// Errors of the shard-local engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The batch was refused; nothing was appended (Kafka: `CORRUPT_MESSAGE`, or `MESSAGE_TOO_LARGE`).
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] InvalidBatch),
    /// The offset is outside `[log_start_offset, high_watermark]` (Kafka: `OFFSET_OUT_OF_RANGE`).
    #[error("offset {offset} out of range [{log_start_offset}, {high_watermark}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start_offset: i64,
        high_watermark: i64,
    },
    /// The disk refused a read, write or sync (Kafka: `KAFKA_STORAGE_ERROR`). After a failed sync the log
    /// refuses appends until restart, since the kernel may have dropped the dirty pages.
    #[error("storage error on {path}: {message}")]
    Storage { path: PathBuf, message: String },
    /// The core's open files budget stayed in use (Kafka: `KAFKA_STORAGE_ERROR`, retriable):
    /// nothing failed on the disk, and the log carries on.
    #[error(
        "cannot open {path}: the core's {limit} open files are all in use (raise \
         --max-open-files-per-core, and the process's open files limit with it)"
    )]
    OpenFiles { path: PathBuf, limit: u64 },
    /// The log was closed or deleted while the operation waited.
    #[error("log is closed")]
    Closed,
    /// The log is a read replica of another core's (Kafka: `NOT_LEADER_OR_FOLLOWER`): only its
    /// owner writes it; or it fell out of step with the owner and waits for a fresh snapshot.
    #[error("read replica: only the owner core writes this log")]
    ReadReplica,
}

impl Error {
    pub(crate) fn storage(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Error::Storage {
            path: path.into(),
            message: err.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
