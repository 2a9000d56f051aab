//! One partition a subscriber reads: the partition's own log or one shard of a view of it, where
//! its next offset is, how far it may read, and what it waits on. In edge mode (`shoal edge`) a
//! lane keeps the partition's upstream feed going, reads offsets the edge does not hold through
//! from upstream (shared by the core's coalescer), and starts where the upstream says.

use super::request::{Refusal, Start};
use crate::cores::Core;
use crate::edge::read::EdgeRead;
use crate::edge::{EdgeCore, Standing};
use kafka_protocol::error::ResponseError;
use shards::batch::BatchHeader;
use shards::partition::Partition;
use shards::transactions::AbortedTxn;
use shards::view_reader::ViewReader;
use shards::{LogRead, OffsetMonitor, Records};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long an edge lane keeps its partition wanted after it last asked (it asks at least once a
/// tick while its stream runs).
const EDGE_WANTED_FOR: Duration = Duration::from_secs(3);

/// One partition of a stream, and the next offset to send from it.
#[derive(Debug)]
pub struct Lane {
    pub part: Rc<Partition>,
    /// A view's reader, shard and shard count: the shard's records, not the partition's.
    pub view: Option<(Rc<ViewReader>, u32, u32)>,
    /// Edge mode: the core's view of the upstream.
    pub edge: Option<Rc<EdgeCore>>,
    pub next: i64,
}

/// One read of a lane: the records, and how far the stream may read after it.
#[derive(Debug)]
pub struct LaneRead {
    pub read: LogRead,
    pub end: i64,
    /// Which of its transactional batches belong to aborted transactions.
    pub aborts: Aborts,
}

impl Lane {
    /// `topic`'s partition `index` as this core serves it (owned, or a read replica), as a lane
    /// at offset 0; `NotLeaderOrFollower` when it is served elsewhere.
    pub fn here(core: &Core, topic: &str, index: i32) -> Result<Lane, ResponseError> {
        let (part, view) = core.fetch_partition(topic, index)?;
        let view = view.map(|v| {
            (
                core.reads.views.reader(&part.log, v.shards),
                v.shard,
                v.shards,
            )
        });
        Ok(Lane {
            part,
            view,
            edge: core.upstream().cloned(),
            next: 0,
        })
    }

    pub fn index(&self) -> i32 {
        self.part.index
    }

    /// Whether only committed records are read: at read_committed, and always from a view
    /// (views publish committed records only).
    fn committed(&self, read_committed: bool) -> bool {
        read_committed || self.view.is_some()
    }

    /// Where the stream can read up to now in the local log.
    pub fn end(&self, read_committed: bool) -> i64 {
        let log = &self.part.log;
        if self.committed(read_committed) {
            log.last_stable_offset().min(log.high_watermark())
        } else {
            log.high_watermark()
        }
    }

    /// What a lane caught up waits on.
    pub fn monitor(&self, read_committed: bool) -> OffsetMonitor {
        let log = &self.part.log;
        if self.committed(read_committed) {
            log.last_stable_monitor().clone()
        } else {
            log.high_watermark_monitor().clone()
        }
    }

    /// Edge mode: the upstream feed kept going for this lane's reader (started at its offset if
    /// it is not running), and where its offset stands; `Local` outside edge mode, and for a
    /// read replica, whose owner keeps the feed (it counts this stream as a consumer).
    fn stand(&self) -> Standing {
        match &self.edge {
            Some(edge) if !self.part.log.is_replica() => {
                let until = Instant::now() + EDGE_WANTED_FOR;
                let (log, topic) = (&self.part.log, &self.part.topic);
                edge.want(log, topic, self.part.index, self.next, until)
            }
            Some(_) if self.view.is_none() && self.next < self.part.log.log_start_offset() => {
                Standing::Upstream
            }
            _ => Standing::Local,
        }
    }

    /// Whether there is something to read now (in edge mode, also keeps the feed going).
    pub fn pending(&self, read_committed: bool) -> bool {
        let standing = self.stand();
        (standing == Standing::Upstream && self.view.is_none())
            || self.next < self.end(read_committed)
    }

    /// Whether the log's start passed the lane (retention, DeleteRecords): the lane is told what it
    /// missed. At the edge, the upstream's start decides (a read-through's OFFSET_OUT_OF_RANGE).
    pub fn passed(&self) -> bool {
        self.edge.is_none() && self.next < self.part.log.log_start_offset()
    }

    /// At most `budget` bytes from the lane's next offset: from the local log, the view's
    /// reader, or in edge mode through from upstream where the edge does not hold them.
    pub async fn read(
        &self,
        core: &Core,
        budget: usize,
        read_committed: bool,
    ) -> shards::Result<LaneRead> {
        let local = |read: LogRead| {
            let aborts = Aborts::local(self, &read, read_committed);
            LaneRead {
                read,
                end: self.end(read_committed),
                aborts,
            }
        };
        if let Some((reader, shard, _)) = &self.view {
            if let Some(edge) = self.edge.as_ref().filter(|_| !self.part.log.is_replica()) {
                self.keep_fed(edge, budget);
            }
            return Ok(local(reader.fetch(*shard, self.next, budget, true).await?));
        }
        if let Some(edge) = &self.edge {
            if let Some(through) = self.read_through(core, edge, budget, read_committed).await {
                return through;
            }
        }
        Ok(local(self.part.log.read(self.next, budget, true).await?))
    }

    fn edge_read(&self, budget: usize, read_committed: bool) -> EdgeRead<'_> {
        EdgeRead {
            log: &self.part.log,
            topic: &self.part.topic,
            partition: self.part.index,
            offset: self.next,
            max_bytes: budget,
            obligatory: true,
            deadline: Instant::now() + Duration::from_secs(1),
            read_committed,
        }
    }

    fn keep_fed(&self, edge: &Rc<EdgeCore>, budget: usize) {
        edge.keep_fed(self.edge_read(budget, false));
    }

    /// Edge mode: the read through from upstream where the edge does not hold the lane's offset
    /// (`None`: the local log serves it).
    async fn read_through(
        &self,
        core: &Core,
        edge: &Rc<EdgeCore>,
        budget: usize,
        read_committed: bool,
    ) -> Option<shards::Result<LaneRead>> {
        let r = self.edge_read(budget, read_committed);
        let coalescer = &core.reads.coalescer;
        let shared = if self.part.log.is_replica() {
            if self.next >= self.part.log.log_start_offset() {
                return None;
            }
            edge.read_upstream(coalescer, r).await
        } else {
            edge.read(coalescer, r).await?
        };
        Some(shared.map(|shared| match shared {
            Some(shared) => {
                let read = shared.read.clone();
                let end = match (&read.upstream_txns, read_committed) {
                    (Some(t), true) => t.last_stable_offset,
                    _ => read.high_watermark,
                };
                let aborts = Aborts::upstream(&read);
                LaneRead { read, end, aborts }
            }
            // Nothing yet: the upstream cannot be reached, or the fetcher brings it.
            None => LaneRead {
                read: LogRead {
                    records: Records::default(),
                    high_watermark: self.part.log.high_watermark(),
                    log_start_offset: self.part.log.log_start_offset(),
                    from_cache: true,
                    upstream_txns: None,
                },
                end: self.next,
                aborts: Aborts::None,
            },
        }))
    }

    /// The first offset to send for `start`, or why it is refused. In edge mode the upstream
    /// answers for the log's ends and times.
    pub async fn start_offset(&self, start: Start, read_committed: bool) -> Result<i64, Refusal> {
        if let Some(edge) = &self.edge {
            let at = match start {
                Start::Earliest => -2,
                Start::Latest => -1,
                Start::Time(ms) => ms,
                Start::At(n) => return Ok(n),
                Start::After(n) => return Ok(n.saturating_add(1)),
            };
            let (log, topic) = (&self.part.log, &self.part.topic);
            let view = self.view.is_some();
            return match edge.list_offset(log, topic, self.index(), at, view).await {
                Ok((offset, _)) if offset >= 0 => Ok(offset),
                Ok(_) => Ok(self.end(read_committed)),
                Err(code) => Err(Refusal::new(
                    "503 Service Unavailable",
                    format!(
                        "the upstream answered ListOffsets for partition {} with error code \
                         {code}; try again",
                        self.index()
                    ),
                )),
            };
        }
        let log = &self.part.log;
        let end = self.end(read_committed);
        let past_end = |n: i64| {
            let why = format!(
                "offset {n} is past the end of partition {} ({end})",
                self.index()
            );
            Refusal::new("400 Bad Request", why)
        };
        match start {
            Start::Earliest => Ok(log.log_start_offset()),
            Start::Latest => Ok(end),
            Start::At(n) if n > log.high_watermark() => Err(past_end(n)),
            Start::At(n) => Ok(n),
            Start::After(n) if n >= log.high_watermark() => Err(past_end(n.saturating_add(1))),
            Start::After(n) => Ok(n + 1),
            Start::Time(ms) => match log.offset_for_timestamp(ms).await {
                Ok(Some((offset, _))) => Ok(offset),
                Ok(None) => Ok(end),
                Err(e) => Err(Refusal::new(
                    "500 Internal Server Error",
                    format!("finding offset for time {ms}: {e}"),
                )),
            },
        }
    }
}

/// Which transactional batches of a read belong to aborted transactions.
#[derive(Debug)]
pub enum Aborts {
    None,
    /// The local log's aborted transactions overlapping the read.
    Local(Vec<AbortedTxn>),
    /// A read through from upstream: its aborted transactions as (producer id, first offset),
    /// each aborted from its first offset to its producer's next marker, as a Kafka consumer
    /// reads them; `open` holds the producers inside one now.
    Upstream {
        aborted: Vec<(i64, i64)>,
        open: Vec<i64>,
    },
}

impl Aborts {
    fn local(lane: &Lane, read: &LogRead, read_committed: bool) -> Aborts {
        if !read_committed || lane.view.is_some() || read.records.batches == 0 {
            return Aborts::None;
        }
        // The end is exclusive: the last batch's own transaction counts.
        let (first, last) = (read.records.first_offset, read.records.last_offset);
        Aborts::Local(lane.part.log.aborted_transactions(first, last + 1))
    }

    fn upstream(read: &LogRead) -> Aborts {
        match &read.upstream_txns {
            Some(t) if !t.aborted.is_empty() => {
                let mut aborted = t.aborted.clone();
                aborted.sort_by_key(|a| std::cmp::Reverse(a.1));
                Aborts::Upstream {
                    aborted,
                    open: Vec::new(),
                }
            }
            _ => Aborts::None,
        }
    }

    /// Whether batch `h` (taken in offset order) belongs to an aborted transaction.
    pub fn aborted(&mut self, h: &BatchHeader) -> bool {
        if !h.is_transactional() {
            return false;
        }
        match self {
            Aborts::None => false,
            Aborts::Local(aborted) => {
                !h.is_control()
                    && aborted.iter().any(|a| {
                        a.producer_id == h.producer_id
                            && a.first_offset <= h.base_offset
                            && h.base_offset < a.last_offset
                    })
            }
            Aborts::Upstream { aborted, open } => {
                // Sorted from the last first offset: those begun by now are at the end.
                while aborted.last().is_some_and(|a| a.1 <= h.base_offset) {
                    let (producer, _) = aborted.pop().expect("checked");
                    open.push(producer);
                }
                let inside = open.contains(&h.producer_id);
                if h.is_control() {
                    // A marker ends its producer's transaction.
                    open.retain(|p| *p != h.producer_id);
                    return false;
                }
                inside
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::batch::BatchBuilder;
    use shards::transactions::{encode_marker, Marker};

    fn data(producer: i64, base: i64) -> BatchHeader {
        let mut b = BatchBuilder::new(1)
            .producer(producer, 0, 0)
            .transactional();
        b.push(1, None, Some(b"v"), &[]);
        BatchHeader::parse(&b.finish(base)).unwrap()
    }

    fn abort(producer: i64, at: i64) -> BatchHeader {
        let marker = Marker {
            commit: false,
            coordinator_epoch: 0,
        };
        let mut h = BatchHeader::parse(&encode_marker(producer, 0, marker, 1)).unwrap();
        h.base_offset = at;
        h
    }

    #[test]
    fn an_upstreams_aborted_transactions_end_at_their_producers_marker() {
        // Producer 7 aborts its transaction begun at 10; producer 8's at 11 commits (not listed);
        // producer 7 begins another at 14, not aborted.
        let mut aborts = Aborts::Upstream {
            aborted: vec![(7, 10)],
            open: Vec::new(),
        };
        let mut aborts_sorted = Aborts::upstream(&LogRead {
            records: Records::default(),
            high_watermark: 20,
            log_start_offset: 0,
            from_cache: false,
            upstream_txns: Some(shards::UpstreamTxns {
                last_stable_offset: 20,
                aborted: vec![(9, 30), (7, 10)],
            }),
        });
        for a in [&mut aborts, &mut aborts_sorted] {
            assert!(a.aborted(&data(7, 10)));
            assert!(!a.aborted(&data(8, 11)));
            assert!(a.aborted(&data(7, 12)));
            assert!(!a.aborted(&abort(7, 13)), "a marker is never a record");
            assert!(
                !a.aborted(&data(7, 14)),
                "its next transaction is not aborted"
            );
        }
        assert!(aborts_sorted.aborted(&data(9, 30)));
    }
}
