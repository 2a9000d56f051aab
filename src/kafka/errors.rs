//! Maps the engine's errors to Kafka error codes, in one place.

use kafka_protocol::error::ResponseError;
use shards::{Error, InvalidBatch};

pub fn code_of(e: &Error) -> ResponseError {
    match e {
        Error::InvalidBatch(InvalidBatch::TooLarge { .. }) => ResponseError::MessageTooLarge,
        Error::InvalidBatch(InvalidBatch::Unsupported) => ResponseError::InvalidRecord,
        // A header whose counts do not match its records: Kafka's InvalidRecordException.
        Error::InvalidBatch(
            InvalidBatch::Records { .. }
            | InvalidBatch::RecordCount(_)
            | InvalidBatch::OffsetDelta { .. }
            | InvalidBatch::TooManyOffsets { .. }
            | InvalidBatch::MissingKey { .. },
        ) => ResponseError::InvalidRecord,
        Error::InvalidBatch(_) => ResponseError::CorruptMessage,
        Error::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        Error::Storage { .. } | Error::OpenFiles { .. } => ResponseError::KafkaStorageError,
        // The partition went away (topic deleted) while the request ran.
        Error::Closed | Error::ReadReplica => ResponseError::NotLeaderOrFollower,
    }
}

/// Wire code of an optional error.
pub fn code(e: Option<ResponseError>) -> i16 {
    e.map_or(0, |e| e.code())
}
