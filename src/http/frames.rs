//! The frames a core shares: each batch of a partition, once encoded for a protocol and a format,
//! is kept as one buffer that every subscriber on the core writes from its own position; a
//! subscriber holds only its next offset and the `Bytes` handles it is writing. Bounded in bytes,
//! oldest out first: a subscriber that asks for a batch after it left encodes it again.

use super::encode::{encode_batch, Encoding};
use crate::stats::http::HttpStats;
use bytes::Bytes;
use shards::batch::BatchHeader;
use shards::{FastMap, InvalidBatch};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// What a stream reads: a partition's log, or one shard of a view of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    /// The partition's [`shards::Log::id`].
    pub log: u64,
    /// A view's (shard, shards); (0, 0) for the partition itself.
    pub view: (u32, u32),
}

/// One batch of one source, in one encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    source: Source,
    encoding: Encoding,
    base_offset: i64,
}

/// A batch's frame: its bytes (empty for a batch with nothing to send) and its record count.
#[derive(Debug, Clone)]
pub struct Frame {
    pub bytes: Bytes,
    pub records: u32,
}

/// A core's shared frames.
#[derive(Debug)]
pub struct Frames {
    map: RefCell<FastMap<Key, Frame>>,
    order: RefCell<VecDeque<(Key, usize)>>,
    bytes: Cell<usize>,
    budget: usize,
}

impl Frames {
    /// Frames of at most `budget` bytes in all.
    pub fn new(budget: usize) -> Self {
        Frames {
            map: RefCell::default(),
            order: RefCell::default(),
            bytes: Cell::new(0),
            budget,
        }
    }

    /// The frame of batch `h` (`batch`) of `source` in `encoding`: the shared one, or encoded now
    /// and kept. A subscriber that starts inside the batch (`from` past its base offset) gets a
    /// frame of its own, not kept.
    #[allow(clippy::too_many_arguments)]
    pub fn frame(
        &self,
        stats: &HttpStats,
        source: Source,
        encoding: Encoding,
        partition: i32,
        h: &BatchHeader,
        batch: &[u8],
        from: i64,
    ) -> Result<Frame, InvalidBatch> {
        if from > h.base_offset {
            let mut out = Vec::new();
            let records = encode_batch(encoding, partition, h, batch, from, &mut out)?;
            crate::metrics::add(&stats.frames_private, 1);
            return Ok(Frame {
                bytes: out.into(),
                records,
            });
        }
        let key = Key {
            source,
            encoding,
            base_offset: h.base_offset,
        };
        if let Some(f) = self.map.borrow().get(&key) {
            return Ok(f.clone());
        }
        let mut out = Vec::with_capacity(h.total_len() * 2);
        let records = encode_batch(encoding, partition, h, batch, from, &mut out)?;
        crate::metrics::add(&stats.frames_encoded, 1);
        let frame = Frame {
            bytes: out.into(),
            records,
        };
        self.keep(key, frame.clone());
        Ok(frame)
    }

    fn keep(&self, key: Key, frame: Frame) {
        let size = frame.bytes.len() + 64;
        if size > self.budget {
            return;
        }
        let mut order = self.order.borrow_mut();
        let mut map = self.map.borrow_mut();
        while self.bytes.get() + size > self.budget {
            let Some((old, old_size)) = order.pop_front() else {
                break;
            };
            map.remove(&old);
            self.bytes.set(self.bytes.get() - old_size);
        }
        map.insert(key, frame);
        order.push_back((key, size));
        self.bytes.set(self.bytes.get() + size);
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.bytes.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::encode::Protocol;
    use crate::http::request::Format;
    use shards::batch::BatchBuilder;

    fn batch(base: i64, value: &[u8]) -> (BatchHeader, Vec<u8>) {
        let mut b = BatchBuilder::new(1);
        b.push(1, None, Some(value), &[]);
        b.push(2, None, Some(value), &[]);
        let bytes = b.finish(base);
        (BatchHeader::parse(&bytes).unwrap(), bytes)
    }

    const SSE: Encoding = Encoding {
        protocol: Protocol::Sse,
        format: Format::Value,
        whole_batches: false,
    };

    fn log(id: u64) -> Source {
        Source {
            log: id,
            view: (0, 0),
        }
    }

    #[test]
    fn a_batch_is_encoded_once_per_encoding_and_shared() {
        let frames = Frames::new(1 << 20);
        let stats = HttpStats::default();
        let (h, b) = batch(10, b"v");
        let one = frames.frame(&stats, log(7), SSE, 0, &h, &b, 10).unwrap();
        let two = frames.frame(&stats, log(7), SSE, 0, &h, &b, 10).unwrap();
        assert_eq!(one.bytes.as_ptr(), two.bytes.as_ptr(), "the same buffer");
        assert_eq!(one.records, 2);
        assert_eq!(stats.frames_encoded.get(), 1);
        let ws = Encoding {
            protocol: Protocol::WebSocket,
            format: Format::Json,
            whole_batches: false,
        };
        frames.frame(&stats, log(7), ws, 0, &h, &b, 10).unwrap();
        assert_eq!(stats.frames_encoded.get(), 2);
        // Joined in the middle: a frame of its own, from the offset asked.
        let mid = frames.frame(&stats, log(7), SSE, 0, &h, &b, 11).unwrap();
        assert_eq!(mid.records, 1);
        assert_eq!(&mid.bytes[..], b"id: 0:11\ndata: v\n\n");
        assert_eq!(stats.frames_private.get(), 1);
    }

    #[test]
    fn the_budget_drops_the_oldest() {
        let (h1, b1) = batch(0, &[b'a'; 300]);
        let (h2, b2) = batch(2, &[b'b'; 300]);
        let frames = Frames::new(800);
        let stats = HttpStats::default();
        frames.frame(&stats, log(1), SSE, 0, &h1, &b1, 0).unwrap();
        frames.frame(&stats, log(1), SSE, 0, &h2, &b2, 2).unwrap();
        assert!(frames.used() <= 800);
        frames.frame(&stats, log(1), SSE, 0, &h2, &b2, 2).unwrap();
        assert_eq!(stats.frames_encoded.get(), 2, "the newest is kept");
        frames.frame(&stats, log(1), SSE, 0, &h1, &b1, 0).unwrap();
        assert_eq!(stats.frames_encoded.get(), 3, "the oldest was dropped");
    }
}
