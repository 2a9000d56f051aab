//! A consumer: one connection, fetches from its own offset, walks batch headers, checks offsets
//! follow on, and samples end-to-end latency. It fetches from its partition's leader, or from the
//! read replica a response prefers ([`Route`]), moving its connection there with its offset.

use super::plan::{connect, setup_over, ClientCfg, ConsumerPlan, DoneOnDrop, Reporter};
use super::route::{Move, Route, Why};
use crate::bench::client;
use crate::bench::client::{embedded_timestamp, embedded_timestamp_compressed, FetchTemplate};
use crate::bench::stats::{now_us, record, ConsumerStats, Hists, Phase, Shared};
use futures_lite::AsyncWriteExt;
use shards::batch::BatchHeader;
use shoal::wire::fetch::decode::{read_fetch_response, BatchVisitor, FetchOutcome, FrameReader};
use shoal::wire::SharedStream;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Walks the batches of one consumer's fetch responses.
pub(super) struct Visitor {
    pub(super) next: i64,
    pub(super) modulus: Option<i64>,
    pub(super) records: u64,
    pub(super) bytes: u64,
    pub(super) gaps: u64,
    pub(super) gap_offsets: u64,
    /// Offsets of control batches (transaction markers): they hold no records.
    pub(super) control_offsets: u64,
    pub(super) sample_latency: bool,
    pub(super) measuring: bool,
    /// A compressed batch was already decompressed for a sample in this response.
    pub(super) sampled_compressed: bool,
    pub(super) epoch_us: u64,
    pub(super) hists: Rc<RefCell<Hists>>,
}

impl Visitor {
    pub(super) fn sample(&self, ts: u64) {
        // Batches from before this run (an old topic read from the start) tell nothing.
        if ts < self.epoch_us {
            return;
        }
        let lat = now_us().saturating_sub(ts);
        let mut h = self.hists.borrow_mut();
        record(&mut h.e2e_interval, lat);
        if self.measuring {
            record(&mut h.e2e, lat);
        }
    }
}

impl BatchVisitor for Visitor {
    fn batch(&mut self, h: &BatchHeader, head: &[u8]) -> bool {
        let total = h.total_len() as u64;
        match self.modulus {
            Some(m) => {
                // Raw baseline: the server's memory holds offsets 0..m and wraps.
                if h.base_offset.rem_euclid(m) != self.next.rem_euclid(m) {
                    self.gaps += 1;
                }
                self.next += h.offset_count();
                self.records += h.record_count.max(0) as u64;
            }
            None => {
                let last = h.last_offset();
                if last < self.next {
                    return false; // an older batch (the fetch offset was inside it or before)
                }
                if h.base_offset > self.next {
                    self.gaps += 1;
                    self.gap_offsets += (h.base_offset - self.next) as u64;
                }
                if h.is_control() {
                    self.control_offsets += (last - h.base_offset.max(self.next) + 1) as u64;
                } else {
                    self.records += if h.base_offset < self.next {
                        (last - self.next + 1) as u64
                    } else {
                        h.record_count.max(0) as u64
                    };
                }
                self.next = last + 1;
            }
        }
        self.bytes += total;
        if !self.sample_latency || h.is_control() {
            return false;
        }
        if h.compression() == 0 {
            if let Some(ts) = embedded_timestamp(head) {
                self.sample(ts);
            }
            false
        } else if !self.sampled_compressed {
            self.sampled_compressed = true;
            true
        } else {
            false
        }
    }

    fn whole_batch(&mut self, h: &BatchHeader, batch: &[u8]) {
        if let Some(ts) = embedded_timestamp_compressed(batch, h) {
            self.sample(ts);
        }
    }
}

pub(super) async fn consumer(
    cfg: Arc<ClientCfg>,
    shared: Arc<Shared>,
    plan: ConsumerPlan,
    hists: Rc<RefCell<Hists>>,
) {
    let stats = &shared.consumers[plan.id];
    let _done = DoneOnDrop(&stats.done);
    let report = Reporter::consumer(&shared, &plan, "consumer");
    let part = plan.partition as usize;
    let stream = connect(plan.leader).await;
    // Counted whether it connected or not: the run waits for every consumer's attempt.
    shared.consumers_ready.fetch_add(1, Relaxed);
    let mut conn = match stream {
        Ok(stream) => Conn::new(stream, &cfg, &plan, stats),
        Err(e) => return report.fail(e),
    };
    let mut template = match FetchTemplate::new(
        &plan.topic,
        plan.partition,
        cfg.fetch_version,
        cfg.fetch_max_wait,
        cfg.fetch_max_bytes,
        cfg.isolation_level,
    ) {
        Ok(t) => t,
        Err(e) => return report.fail(e),
    };
    let mut scratch = Vec::new();
    let mut v = Visitor {
        next: stats.start_offset.load(Relaxed),
        modulus: cfg.modulus,
        records: 0,
        bytes: 0,
        gaps: 0,
        gap_offsets: 0,
        control_offsets: 0,
        sample_latency: cfg.sample_latency,
        measuring: false,
        sampled_compressed: false,
        epoch_us: shared.epoch_us,
        hists,
    };
    setup_over(&shared).await;
    let mut correlation = 0i32;
    loop {
        let phase = shared.phase();
        if phase == Phase::Stop || v.next >= shared.drain_target[part].load(Relaxed) {
            break;
        }
        correlation = correlation.wrapping_add(1);
        v.measuring = phase == Phase::Measure;
        v.sampled_compressed = false;
        let (records, bytes) = (v.records, v.bytes);
        let outcome = conn
            .fetch(
                template.frame(correlation, v.next),
                &cfg,
                correlation,
                &mut v,
                &mut scratch,
            )
            .await;
        stats.records.fetch_add(v.records - records, Relaxed);
        stats.bytes.fetch_add(v.bytes - bytes, Relaxed);
        stats.position.store(v.next, Relaxed);
        stats.gaps.store(v.gaps, Relaxed);
        stats.gap_offsets.store(v.gap_offsets, Relaxed);
        stats.control_offsets.store(v.control_offsets, Relaxed);
        let next = match outcome {
            Err(e) if conn.route.at_replica() => {
                report.error(format!("broker {}: {e}", conn.route.at));
                conn.route.after_connection_failure()
            }
            Err(e) => {
                report.fail(e);
                break;
            }
            Ok(o) => {
                stats.fetches.fetch_add(1, Relaxed);
                if cfg.modulus.is_none() && o.high_watermark >= 0 {
                    shared.note_end(part, o.high_watermark);
                }
                let Some(m) = answered(&conn.route, &o, v.next, stats, &report) else {
                    break;
                };
                if m == Move::Stay && o.error_code != 0 {
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
                m
            }
        };
        if next != Move::Stay && !conn.go(next, &cfg, &plan, stats, &report).await {
            break;
        }
    }
}

/// What the consumer does after response `o` from where `route` says it fetches (at offset
/// `next`): where it fetches next, or None when it stops on an error from the leader.
fn answered(
    route: &Route,
    o: &FetchOutcome,
    next: i64,
    stats: &ConsumerStats,
    report: &Reporter,
) -> Option<Move> {
    if o.preferred_read_replica >= 0 && o.preferred_read_replica != route.at {
        stats.redirects.fetch_add(1, Relaxed);
    }
    let m = route.after_response(o.preferred_read_replica, o.error_code);
    match (m, o.error_code) {
        (Move::ToLeader(Why::Failed), code) => {
            report.error(format!("fetch error {code} from broker {}", route.at));
        }
        (Move::Stay, client::OFFSET_OUT_OF_RANGE) => {
            report.fail(format!("offset {next} out of range"));
            return None;
        }
        // At the leader, NOT_LEADER_OR_FOLLOWER and the like: leaders do not move under an
        // embedded shoal; counted, and retried after a pause.
        (Move::Stay, code) if code != 0 => report.error(format!("fetch error {code}")),
        _ => {}
    }
    Some(m)
}

/// The consumer's connection to the broker it fetches from.
struct Conn {
    stream: SharedStream,
    reader: FrameReader,
    route: Route,
}

impl Conn {
    fn new(
        stream: SharedStream,
        cfg: &ClientCfg,
        plan: &ConsumerPlan,
        stats: &ConsumerStats,
    ) -> Conn {
        let route = Route::at_leader(plan.leader_id, cfg.follow_replicas);
        stats.broker.store(route.at, Relaxed);
        Conn {
            stream,
            reader: FrameReader::new(cfg.receive_buffer),
            route,
        }
    }

    /// Sends one fetch request (`frame`) and reads its response through `v`.
    async fn fetch(
        &mut self,
        frame: &[u8],
        cfg: &ClientCfg,
        correlation: i32,
        v: &mut Visitor,
        scratch: &mut Vec<u8>,
    ) -> Result<FetchOutcome, String> {
        let sent = match self.stream.write_all(frame).await {
            Ok(()) => self.stream.flush().await,
            Err(e) => Err(e),
        };
        sent.map_err(|e| format!("sending a fetch: {e}"))?;
        read_fetch_response(
            &mut self.reader,
            &mut self.stream,
            cfg.fetch_version,
            correlation,
            v,
            scratch,
        )
        .await
        .map_err(|e| format!("reading a fetch response: {e}"))
    }

    /// Carries out `m` (not `Stay`): a new connection to where it leads, the old one dropped.
    /// Returns false when the consumer cannot go on (the leader cannot be reached).
    async fn go(
        &mut self,
        mut m: Move,
        cfg: &ClientCfg,
        plan: &ConsumerPlan,
        stats: &ConsumerStats,
        report: &Reporter<'_>,
    ) -> bool {
        loop {
            // After a failure, a pause before the next attempt (or before fetching again where it
            // is: the leader may prefer the replica that just failed again).
            if matches!(m, Move::Stay | Move::ToLeader(Why::Failed)) {
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }
            let node = self.route.to(m);
            let addr = match m {
                Move::Stay => return true,
                Move::ToLeader(_) => Some(plan.leader),
                Move::ToReplica(n) => cfg.brokers.get(&n).copied(),
            };
            let Some(addr) = addr else {
                report.error(format!(
                    "preferred read replica {node} is not a broker of the metadata"
                ));
                m = self.route.after_connection_failure();
                continue;
            };
            match connect(addr).await {
                Ok(stream) => {
                    self.stream = stream;
                    self.reader = FrameReader::new(cfg.receive_buffer);
                    self.route.at = node;
                    stats.broker.store(node, Relaxed);
                    let moves = if self.route.at_replica() {
                        &stats.to_replica
                    } else {
                        &stats.to_leader
                    };
                    moves.fetch_add(1, Relaxed);
                    return true;
                }
                Err(e) if node == self.route.leader => {
                    report.fail(format!("back to the leader: {e}"));
                    return false;
                }
                Err(e) => {
                    report.error(format!("read replica {node}: {e}"));
                    m = self.route.after_connection_failure();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::{Brokers, Codec, NOT_LEADER_OR_FOLLOWER};
    use crate::bench::stats::ConsumerStats;
    use bytes::Bytes;
    use glommio::net::TcpListener;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse};
    use shards::batch::BatchBuilder;
    use shoal::wire::header;
    use std::cell::Cell;
    use std::net::SocketAddr;

    /// What a fake broker answers to its `n`-th fetch (from 0, over all its connections).
    #[derive(Debug, Clone, Copy)]
    enum Answer {
        /// The batch at the offset asked (one record a batch), or nothing past the end.
        Records,
        /// No records; fetch from this node instead.
        Prefer(i32),
        Error(i16),
    }

    const RECORDS: i64 = 8;

    /// The answer to a fetch at `offset` for one partition of RECORDS records.
    fn response(offset: i64, answer: Answer) -> FetchResponse {
        let mut p = PartitionData::default()
            .with_partition_index(0)
            .with_high_watermark(RECORDS);
        p = match answer {
            Answer::Records if offset < RECORDS => {
                let mut b = BatchBuilder::new(1);
                b.push(1, None, Some(&[7u8; 16]), &[]);
                let mut batch = b.finish(0);
                shards::batch::set_base_offset(&mut batch, offset);
                p.with_records(Some(Bytes::from(batch)))
            }
            Answer::Records => p.with_records(Some(Bytes::new())),
            Answer::Prefer(node) => p
                .with_preferred_read_replica(BrokerId(node))
                .with_records(Some(Bytes::new())),
            Answer::Error(code) => p.with_error_code(code).with_records(None),
        };
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(kafka_protocol::messages::TopicName(
                kafka_protocol::protocol::StrBytes::from_static_str("t"),
            ))
            .with_partitions(vec![p])])
    }

    /// A fake broker on an ephemeral port: every connection's fetches are answered by `answer`.
    fn fake_broker(answer: fn(usize) -> Answer) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fetches = Rc::new(Cell::new(0usize));
        glommio::spawn_local(async move {
            while let Ok(s) = listener.accept().await {
                let fetches = fetches.clone();
                glommio::spawn_local(async move {
                    let mut s = SharedStream::new(s);
                    let mut r = FrameReader::new(4096);
                    while let Ok(frame) = r.read_frame(&mut s, 1 << 20).await {
                        let req = header::parse(frame).unwrap();
                        let fetch: FetchRequest = header::decode(&req).unwrap();
                        let offset = fetch.topics[0].partitions[0].fetch_offset;
                        let n = fetches.replace(fetches.get() + 1);
                        let body = response(offset, answer(n));
                        let out = header::encode(ApiKey::Fetch, 12, req.correlation_id, &body);
                        if s.write_all(&out.unwrap()).await.is_err() {
                            break;
                        }
                    }
                })
                .detach();
            }
        })
        .detach();
        addr
    }

    /// One consumer of partition 0 (leader: node 0 at `leader`; node 1, a read replica, at
    /// `replica`) from offset 0 to RECORDS; its counters at the end.
    async fn consume(leader: SocketAddr, replica: SocketAddr, follow: bool) -> Arc<Shared> {
        let mut shared = Shared::new(0, vec![ConsumerStats::new(0, 0)], 1, 1, 0);
        shared.drain_target[0] = RECORDS.into();
        shared.set_phase(Phase::Drain);
        let shared = Arc::new(shared);
        let cfg = ClientCfg {
            topic: "t".into(),
            produce_version: 9,
            fetch_version: 12,
            acks: 1,
            compression: Codec::None,
            message_bytes: 16,
            records_per_batch: 1,
            views: None,
            batch_interval: 0.0,
            max_in_flight: 1,
            fetch_max_wait: Duration::from_millis(10),
            isolation_level: 0,
            fetch_max_bytes: 1 << 20,
            receive_buffer: 4096,
            modulus: None,
            sample_latency: false,
            follow_replicas: follow,
            brokers: Brokers::from([(0, leader), (1, replica)]),
            producer_mode: Default::default(),
            stream: None,
            producer_ids: Default::default(),
            transactional_prefix: String::new(),
        };
        let plan = ConsumerPlan {
            id: 0,
            topic: "t".into(),
            partition: 0,
            leader,
            leader_id: 0,
        };
        let hists = Rc::new(RefCell::new(Hists::default()));
        consumer(Arc::new(cfg), shared.clone(), plan, hists).await;
        shared
    }

    /// The consumer received every record once, in order, and its counters.
    fn received_all(shared: &Shared) -> (u64, u64, u64, i32, u64) {
        let c = &shared.consumers[0];
        assert_eq!(c.records.load(Relaxed), RECORDS as u64);
        assert_eq!(c.position.load(Relaxed), RECORDS);
        assert_eq!(c.gaps.load(Relaxed), 0);
        assert!(!c.failed.load(Relaxed));
        assert_eq!(c.errors.load(Relaxed), 0, "{:?}", shared.error_messages());
        (
            c.redirects.load(Relaxed),
            c.to_replica.load(Relaxed),
            c.to_leader.load(Relaxed),
            c.broker.load(Relaxed),
            c.fetches.load(Relaxed),
        )
    }

    #[test]
    fn a_consumer_moves_to_the_preferred_replica_and_back_without_losing_a_record() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                // The leader prefers the replica once; the replica serves three records and then
                // is one no longer; the leader serves the rest.
                let leader = fake_broker(|n| match n {
                    0 => Answer::Prefer(1),
                    _ => Answer::Records,
                });
                let replica = fake_broker(|n| match n {
                    0..=2 => Answer::Records,
                    _ => Answer::Error(NOT_LEADER_OR_FOLLOWER),
                });
                let shared = consume(leader, replica, true).await;
                // 1 redirect + 3 records at the replica + its refusal + 5 records at the leader.
                assert_eq!(received_all(&shared), (1, 1, 1, 0, 10));

                // Following off: the redirect is counted, and the consumer stays.
                let leader = fake_broker(|n| match n {
                    0 => Answer::Prefer(1),
                    _ => Answer::Records,
                });
                let shared = consume(leader, replica, false).await;
                assert_eq!(received_all(&shared), (1, 0, 0, 0, 9));
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
