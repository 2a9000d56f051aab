//! Kafka RecordBatch v2: the unit a producer sends, the log stores and a fetch returns, whole. A
//! 61-byte header (offsets, counts, timestamps, producer fields, CRC) followed by its records
//! section, compressed as a whole by the codec the header names.
//!
//! Layout (all big-endian), offsets into the batch:
//! ```text
//!  0 baseOffset i64        8 batchLength i32      12 partitionLeaderEpoch i32   16 magic i8
//! 17 crc u32              21 attributes i16      23 lastOffsetDelta i32        27 baseTimestamp i64
//! 35 maxTimestamp i64     43 producerId i64      51 producerEpoch i16          53 baseSequence i32
//! 57 recordCount i32      61 records...
//! ```
//! The CRC-32C covers bytes 21.. (attributes to the end), so the base offset and the leader epoch can be
//! rewritten without touching it; stamping LogAppendTime changes covered bytes and recomputes it.
//!
//! ## Layout, top layer first
//! - `validate` — checks of whole batches: integrity (CRC-32C), producer rules, blobs, compacted keys.
//! - `walk`     — a records section checked record by record against its header, within a budget.
//! - `build`    — writing batches: the builder of uncompressed ones, compressing, recompressing to a
//!   topic's codec, compaction's rebuild.
//! - `decode`   — reading records back: the records section decompressed, the records, their spans.
//! - `header`   — the fixed header: field positions, parsing, writing, base offset and LogAppendTime.

mod build;
mod decode;
mod header;
mod validate;
mod walk;

pub use build::{compress_batch, rebuild, recompress_all, BatchBuilder};
pub use decode::{
    decompress_records_into, record_spans, records, records_section, section_records, Reader,
    Record, RecordHeader, RecordSpan,
};
pub use header::{
    peek_total_len, set_base_offset, set_max_timestamp, stamp_log_append_time, write_header,
    BatchHeader, ATTR_CONTROL, ATTR_TIMESTAMP_TYPE, ATTR_TRANSACTIONAL, HEADER_LEN, LOG_OVERHEAD,
};
pub use validate::{
    check_integrity, check_keys, restamp_max_timestamps, validate, validate_all,
    validate_all_keeping, validate_mirrored,
};
pub use walk::check_records;

#[cfg(test)]
mod tests {
    //! The batch the children's tests share.
    use super::BatchBuilder;

    /// Three records: a keyed one with a header, a keyless one with the latest timestamp, and one
    /// with an empty key and a null value.
    pub(super) fn sample() -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        b.push(1_000, Some(b"k1"), Some(b"v1"), &[(b"h", Some(b"x"))]);
        b.push(1_005, None, Some(b"v2"), &[]);
        b.push(1_003, Some(b""), None, &[]);
        b.finish(0)
    }
}
