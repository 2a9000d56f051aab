//! One record as a Kafka client delivered it, with every field a test compares exactly: partition,
//! offset, key, value, headers (in order) and timestamp (with its type).

use rdkafka::message::{Headers, Message, Timestamp};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Timestamp,
}

impl Rec {
    /// What librdkafka delivered.
    pub fn of<M: Message>(m: &M) -> Rec {
        let headers = m.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        });
        Rec {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: m.timestamp(),
        }
    }
}
