//! What a consumer's fetch asks of the edge: keep the partition's fetcher running, and serve an
//! offset the edge does not hold by one read-through fetch from upstream, shared through the
//! core's coalescer by every consumer asking for the same bytes.

use super::{EdgeCore, Standing};
use crate::wire::fetch::encode::{AbortedTransactions, PartitionResult};
use shards::{CoalesceKey, FetchCoalescer, Log, LogRead, SharedRead};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Marks a coalescer key as a read-through's (log ids are small counters): read-throughs have a
/// key space of their own, since their results carry the upstream's watermarks.
const READ_THROUGH: u64 = 1 << 63;

/// A read-through may take this long even when its fetch's own wait is shorter (or zero).
const MIN_READ_THROUGH_WAIT: Duration = Duration::from_secs(1);

/// One consumer's read of a partition at the edge.
#[derive(Debug, Clone, Copy)]
pub struct EdgeRead<'a> {
    pub log: &'a Log,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub max_bytes: usize,
    /// The first partition of a response with data may exceed `max_bytes` by one batch (KIP-74).
    pub obligatory: bool,
    /// The fetch's deadline: the partition stays wanted while it long-polls.
    pub deadline: Instant,
    /// A read_committed fetch: a read-through asks the upstream at read_committed too, and
    /// passes on its last stable offset and aborted transactions.
    pub read_committed: bool,
}

impl EdgeCore {
    /// Serves a consumer's read where the edge differs from `serve`: `None` when the local log
    /// serves it as usual; `Some(Ok(None))` when there is nothing yet (past what the edge holds,
    /// within the upstream's range: the fetcher brings it, or the upstream cannot be reached);
    /// else the read-through's shared result, or the upstream's OFFSET_OUT_OF_RANGE.
    pub async fn read(
        self: &Rc<Self>,
        coalescer: &Rc<FetchCoalescer>,
        r: EdgeRead<'_>,
    ) -> Option<shards::Result<Option<Rc<SharedRead>>>> {
        match self.want(r.log, r.topic, r.partition, r.offset, r.deadline) {
            Standing::Local if r.offset >= r.log.high_watermark() => Some(Ok(None)),
            Standing::Local => None,
            Standing::Upstream => {
                let limit = r
                    .deadline
                    .saturating_duration_since(Instant::now())
                    .max(MIN_READ_THROUGH_WAIT);
                // Boxed: the read-through is large and rare; inline, every fetch's future would
                // carry (and copy) its state.
                Some(Box::pin(self.shared_read_through(coalescer, r, limit)).await)
            }
        }
    }

    /// A read-through from upstream that keeps no feed: for a read replica's reader, whose owner
    /// keeps the partition fed. The shared result, nothing (the upstream cannot be reached), or
    /// the upstream's OFFSET_OUT_OF_RANGE.
    pub async fn read_upstream(
        self: &Rc<Self>,
        coalescer: &Rc<FetchCoalescer>,
        r: EdgeRead<'_>,
    ) -> shards::Result<Option<Rc<SharedRead>>> {
        let limit = r
            .deadline
            .saturating_duration_since(Instant::now())
            .max(MIN_READ_THROUGH_WAIT);
        Box::pin(self.shared_read_through(coalescer, r, limit)).await
    }

    /// One fetch from upstream for a consumer outside what the edge holds, shared through the
    /// coalescer. The upstream's OFFSET_OUT_OF_RANGE is passed on; if the upstream cannot be
    /// reached, nothing is returned (the fetch ends as a long poll that found no data).
    async fn shared_read_through(
        self: &Rc<Self>,
        coalescer: &Rc<FetchCoalescer>,
        r: EdgeRead<'_>,
        limit: Duration,
    ) -> shards::Result<Option<Rc<SharedRead>>> {
        let offset = r.offset;
        let key = CoalesceKey {
            log: r.log.id() | READ_THROUGH,
            layout: r.log.layout(),
            offset,
            read_committed: r.read_committed,
            max_bytes: r.max_bytes,
            obligatory: r.obligatory,
        };
        let (edge, topic, index, budget, committed) = (
            self.clone(),
            r.topic.to_string(),
            r.partition,
            r.max_bytes,
            r.read_committed,
        );
        let read = move || async move {
            match edge
                .read_through(&topic, index, offset, budget, committed, limit)
                .await
            {
                Ok(Ok(read)) => Ok(read),
                Ok(Err((log_start_offset, high_watermark))) => {
                    Err(shards::Error::OffsetOutOfRange {
                        offset,
                        log_start_offset,
                        high_watermark,
                    })
                }
                Err(why) => {
                    edge.error(
                        &format!("read-through of {topic}-{index} at {offset}"),
                        &why,
                    );
                    Err(shards::Error::Closed)
                }
            }
        };
        match coalescer.read(key, r.log.high_watermark(), read).await {
            Ok(shared) => Ok(Some(shared)),
            Err(shards::Error::Closed) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A view's consumer reads the view reader's window; its source partition is fed from
    /// upstream like any other.
    pub fn keep_fed(self: &Rc<Self>, r: EdgeRead<'_>) {
        self.want(r.log, r.topic, r.partition, r.offset, r.deadline);
    }

    /// A read's result carries the upstream's watermarks (a read-through's), which may lie beyond
    /// (high watermark) or before (log start) what the edge holds: the consumer is told those,
    /// and at read_committed the upstream's last stable offset and aborted transactions.
    pub fn upstream_watermarks(&self, result: &mut PartitionResult, read: &LogRead) {
        if read.high_watermark > result.high_watermark {
            result.high_watermark = read.high_watermark;
            result.last_stable_offset = read.high_watermark;
        }
        if read.log_start_offset < result.log_start_offset {
            result.log_start_offset = read.log_start_offset;
        }
        if let Some(t) = &read.upstream_txns {
            result.last_stable_offset = t.last_stable_offset;
            result.aborted_transactions = if t.aborted.is_empty() {
                AbortedTransactions::Empty
            } else {
                AbortedTransactions::List(t.aborted.clone())
            };
        }
    }
}
