//! The fixed 61-byte header: its fields' positions, reading and writing them, and the rewrites the
//! log makes in place (base offset, LogAppendTime).

use crate::error::InvalidBatch;

pub const HEADER_LEN: usize = 61;
/// `baseOffset` + `batchLength`: the bytes not counted by `batchLength`.
pub const LOG_OVERHEAD: usize = 12;
pub(super) const CRC_START: usize = 21;
/// The timestamp-type bit of the attributes (set: LogAppendTime).
pub const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
/// The transactional bit: the batch belongs to its producer's open transaction.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
/// The control bit: the batch is a marker (commit or abort), written by the broker, not a producer.
pub const ATTR_CONTROL: i16 = 0x20;
pub(super) const ATTR_COMPRESSION: i16 = 0x07;

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
pub(super) fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// The fields of a batch header that the log and its readers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes after the first 12 (`baseOffset` and `batchLength` themselves).
    pub batch_length: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `b` without checking anything but that 61 bytes are there.
    pub fn parse(b: &[u8]) -> Result<Self, InvalidBatch> {
        if b.len() < HEADER_LEN {
            return Err(InvalidBatch::Truncated {
                needed: HEADER_LEN,
                available: b.len(),
            });
        }
        Ok(Self {
            base_offset: be_i64(b, 0),
            batch_length: be_i32(b, 8),
            magic: b[16] as i8,
            crc: u32::from_be_bytes(b[17..21].try_into().unwrap()),
            attributes: be_i16(b, 21),
            last_offset_delta: be_i32(b, 23),
            base_timestamp: be_i64(b, 27),
            max_timestamp: be_i64(b, 35),
            producer_id: be_i64(b, 43),
            producer_epoch: be_i16(b, 51),
            base_sequence: be_i32(b, 53),
            record_count: be_i32(b, 57),
        })
    }

    /// Whole size of the batch on disk and on the wire.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + self.batch_length.max(0) as usize
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    /// Offsets the batch occupies (`lastOffsetDelta + 1`; equals the record count for producer batches).
    pub fn offset_count(&self) -> i64 {
        self.last_offset_delta as i64 + 1
    }
    pub fn compression(&self) -> u8 {
        (self.attributes & ATTR_COMPRESSION) as u8
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_TIMESTAMP_TYPE != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }
}

/// Reads the length of the batch starting at `b` from its first 12 bytes, if they are there.
pub fn peek_total_len(b: &[u8]) -> Option<usize> {
    (b.len() >= LOG_OVERHEAD).then(|| LOG_OVERHEAD + be_i32(b, 8).max(0) as usize)
}

/// Writes `h` into the first 61 bytes of `b` (a whole batch whose records follow the header), with
/// the batch length taken from `b` and the CRC computed over it.
pub fn write_header(b: &mut [u8], h: &BatchHeader) {
    let batch_length = (b.len() - LOG_OVERHEAD) as i32;
    b[0..8].copy_from_slice(&h.base_offset.to_be_bytes());
    b[8..12].copy_from_slice(&batch_length.to_be_bytes());
    b[12..16].copy_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    b[16] = 2;
    b[21..23].copy_from_slice(&h.attributes.to_be_bytes());
    b[23..27].copy_from_slice(&h.last_offset_delta.to_be_bytes());
    b[27..35].copy_from_slice(&h.base_timestamp.to_be_bytes());
    b[35..43].copy_from_slice(&h.max_timestamp.to_be_bytes());
    b[43..51].copy_from_slice(&h.producer_id.to_be_bytes());
    b[51..53].copy_from_slice(&h.producer_epoch.to_be_bytes());
    b[53..57].copy_from_slice(&h.base_sequence.to_be_bytes());
    b[57..61].copy_from_slice(&h.record_count.to_be_bytes());
    let crc = crc32c::crc32c(&b[CRC_START..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Sets the max timestamp of batch `b` (exactly the batch) and computes its CRC again.
pub fn set_max_timestamp(b: &mut [u8], max_timestamp: i64) {
    b[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = crc32c::crc32c(&b[CRC_START..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Sets the base offset of the batch at the start of `b` (not covered by the CRC).
pub fn set_base_offset(b: &mut [u8], base_offset: i64) {
    b[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Marks the batch as LogAppendTime with `now_ms` as its max timestamp, and recomputes the CRC.
pub fn stamp_log_append_time(b: &mut [u8], now_ms: i64) {
    let total = peek_total_len(b).expect("validated batch");
    let attrs = be_i16(b, 21) | ATTR_TIMESTAMP_TYPE;
    b[21..23].copy_from_slice(&attrs.to_be_bytes());
    b[35..43].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c(&b[CRC_START..total]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::tests::sample;
    use crate::batch::{records, validate};

    #[test]
    fn base_offset_is_outside_the_crc() {
        let mut b = sample();
        set_base_offset(&mut b, 12345);
        let h = validate(&b, usize::MAX).unwrap();
        assert_eq!(h.base_offset, 12345);
        assert_eq!(records(&b).unwrap()[2].offset, 12347);
    }

    #[test]
    fn log_append_time_recomputes_crc() {
        let mut b = sample();
        stamp_log_append_time(&mut b, 99_999);
        let h = validate(&b, usize::MAX).unwrap();
        assert!(h.is_log_append_time());
        assert!(records(&b).unwrap().iter().all(|r| r.timestamp == 99_999));
    }
}
