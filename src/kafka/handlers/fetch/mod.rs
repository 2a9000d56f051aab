//! Fetch, in parts with one job each: the request's plan (which partitions, which budget), its
//! execution (reads, and long polling on the partitions' offset monitors until `min_bytes` or
//! `max_wait_ms`), and the response, encoded by the hand-written [`crate::wire::fetch::encode`], which
//! writes the log's shared record bytes to the socket without copying them.
//!
//! From v7 a fetch may be in a fetch session (KIP-227, [`session`]): a session's request lists only
//! the partitions whose fetch position changed, the fetch reads every partition of the session, and
//! its response carries only those that changed. Sessions decide which partitions are read and
//! answered; the reads (coalesced, or steered to read replicas) are the same. From v13 topics are
//! named by id, looked up in the core's map of the topic table's ids; a session keeps the names or
//! the ids its first request used.
//!
//! ## Layout
//! - [`session`] — which partitions a request reads and which results its response carries.

use super::{count_errors, HandlerResult, Reply, Versions};
use crate::cores::Core;
use crate::kafka::errors::code_of;
use crate::kafka::leaders;
use crate::kafka::session::Session;
use crate::kafka::upstream::{self, Wanted};
use crate::replicas::Steer;
use crate::table::acl::Operation;
use crate::wire::fetch::encode::{
    self, encode_fetch_response, AbortedTransactions, NodeEndpoint, PartitionResult, TopicResult,
};
use crate::wire::header::{decode, Request};
use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, FetchRequest};
use session::{AskedPartition, AskedTopic};
use shards::partition::Partition;
use shards::view_reader::ViewReader;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub mod session;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::Fetch,
    min: encode::MIN_VERSION,
    max: encode::MAX_VERSION,
};

/// Longest a fetch may wait, whatever it asks.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Most record bytes one response carries, whatever the request and `--fetch-response-budget-bytes`
/// allow: a response frame's size is an `i32`. The other GiB holds the rest with room to spare: the
/// one batch by which the first partition may exceed the limit (at most a request's size), and the
/// per-partition fields, a few times the size of the request that listed the partitions.
const MAX_RESPONSE_RECORDS: usize = 1 << 30;

/// The record bytes a response may carry: what the request asks (`max_bytes` of 0 or less: no limit
/// of its own), within the response memory available now and [`MAX_RESPONSE_RECORDS`].
fn response_limit(asked: i32, available: usize) -> usize {
    let asked = usize::try_from(asked)
        .ok()
        .filter(|&a| a > 0)
        .unwrap_or(usize::MAX);
    asked.min(available).min(MAX_RESPONSE_RECORDS)
}

/// One partition of the request, resolved against this core.
struct PlannedPartition {
    index: i32,
    offset: i64,
    max_bytes: usize,
    target: Result<ReadSource, ResponseError>,
    /// The owner answers with no records and another core to fetch from (KIP-392).
    redirect: Option<i32>,
}

/// What a planned partition reads: a partition's log (through the coalescer), or a view shard
/// (through the source partition's shared view reader).
struct ReadSource {
    part: Rc<Partition>,
    view: Option<(Rc<ViewReader>, u32)>,
}

impl ReadSource {
    /// What a fetch waiting for more data watches: a running shared view reader's progress, else the
    /// partition's high watermark, or its last stable offset for a read_committed fetch (which
    /// wakes when a transaction ends, not when uncommitted data arrives).
    fn monitor(&self, read_committed: bool) -> shards::OffsetMonitor {
        match &self.view {
            Some((reader, _)) if reader.is_running() => reader.progress_monitor(),
            _ if read_committed => self.part.log.last_stable_monitor().clone(),
            _ => self.part.log.high_watermark_monitor().clone(),
        }
    }
}

struct PlannedTopic {
    name: Bytes,
    id: [u8; 16],
    partitions: Vec<PlannedPartition>,
}

/// The request's budget and deadline, and the partitions it reads.
struct Plan {
    topics: Vec<PlannedTopic>,
    max_bytes: usize,
    min_bytes: usize,
    deadline: Instant,
    read_committed: bool,
}

fn plan(
    core: &Core,
    request: &FetchRequest,
    asked: &[AskedTopic],
    version: i16,
    who: &Session,
) -> Plan {
    // v15 moved the fetching replica's id into replica_state.
    let replica_id = if version >= 15 {
        request.replica_state.replica_id
    } else {
        request.replica_id
    };
    let steering = Steering {
        // Only consumers (not brokers' replica fetches) of Fetch v11+ know preferred_read_replica.
        may_redirect: version >= 11 && replica_id.0 < 0,
        busy: core.reads.load.busy(),
        now: Instant::now(),
        who,
    };
    let by_id = version >= encode::FIRST_TOPIC_ID_VERSION;
    let topics = asked
        .iter()
        .map(|t| {
            // By name: the request's own bytes (a slice of the frame the fetch holds anyway) or the
            // session's. By id (v13+): the name the topic table has for it, shared, if it has one.
            let name = if by_id {
                core.topic_name(&t.id).map(Bytes::from)
            } else {
                Some(t.name.clone())
            };
            let known = name.as_ref().map(|n| {
                let n = std::str::from_utf8(n).unwrap_or_default();
                (n, who.may_topic(core, Operation::Read, n))
            });
            PlannedTopic {
                name: name.clone().unwrap_or_default(),
                id: t.id,
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| plan_partition(core, &steering, known, p))
                    .collect(),
            }
        })
        .collect();
    let wait = Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    Plan {
        topics,
        // Under memory pressure a fetch returns what fits: at least one batch (KIP-74), never waiting.
        max_bytes: response_limit(request.max_bytes, core.reads.response_memory.available()),
        min_bytes: request.min_bytes.max(0) as usize,
        deadline: Instant::now() + wait,
        read_committed: request.isolation_level == 1,
    }
}

/// What steering a fetch's partitions to read replicas goes by: whether its client may be
/// steered, how busy the core is, and which connection it is.
struct Steering<'a> {
    may_redirect: bool,
    busy: f64,
    now: Instant,
    who: &'a Session,
}

/// One partition resolved against this core: `known` is its topic's name and whether the client
/// may read it (`None`: no such topic).
fn plan_partition(
    core: &Core,
    steering: &Steering,
    known: Option<(&str, bool)>,
    p: &AskedPartition,
) -> PlannedPartition {
    let target = known
        .ok_or(ResponseError::UnknownTopicId)
        .and_then(|(name, readable)| {
            readable
                .then_some(name)
                .ok_or(ResponseError::TopicAuthorizationFailed)
        })
        .and_then(|name| core.fetch_partition(name, p.index))
        .map(|(part, view)| {
            let view = view.map(|v| (core.reads.views.reader(&part.log, v.shards), v.shard));
            ReadSource { part, view }
        });
    let redirect = target.as_ref().ok().and_then(|t| {
        let steered = (steering.may_redirect && !t.part.log.is_replica()).then(|| {
            core.replicas
                .steer(&t.part, steering.who.id, steering.busy, steering.now)
        });
        match steered {
            Some(Steer::To(c)) => Some(c),
            _ => {
                // Served here: one of this core's fetch connections of it.
                core.replicas
                    .note_fetch(&t.part, steering.who.id, steering.now);
                None
            }
        }
    });
    PlannedPartition {
        index: p.index,
        offset: p.offset,
        max_bytes: p.max_bytes.max(0) as usize,
        target,
        redirect,
    }
}

/// Reads every partition once, within the response budget; the first partition that has data may
/// exceed its limits by one batch (KIP-74) so a consumer always makes progress. Reads go through the
/// core's coalescer, so fetches asking for the same bytes share one read and one buffer; the
/// per-response fields (watermarks) are taken fresh for each response.
async fn execute(core: &Rc<Core>, plan: &Plan) -> Execution {
    let mut total = 0usize;
    let mut holds = Vec::new();
    let mut topics = Vec::with_capacity(plan.topics.len());
    for t in &plan.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            partitions.push(match &p.target {
                Err(e) => PartitionResult::error(p.index, e.code()),
                Ok(ReadSource { part, .. }) if p.redirect.is_some() => PartitionResult {
                    preferred_read_replica: p.redirect.unwrap_or(-1),
                    ..ok_result(p.index, part, shards::Records::empty())
                },
                Ok(ReadSource { part, view }) => {
                    let budget = p.max_bytes.min(plan.max_bytes.saturating_sub(total));
                    let obligatory = total == 0;
                    // A view's records are window buffers shared by all its consumers (bounded by the
                    // window): only coalesced log reads are counted against response memory.
                    let read = match view {
                        Some((reader, shard)) => {
                            let wanted = Wanted {
                                offset: p.offset,
                                max_bytes: budget,
                                obligatory,
                                read_committed: false,
                                deadline: plan.deadline,
                            };
                            upstream::keep_fed(core, part, wanted);
                            reader
                                .fetch(*shard, p.offset, budget, obligatory)
                                .await
                                .map(|r| (r.records, None))
                        }
                        None => read_partition(
                            core,
                            part,
                            p.offset,
                            budget,
                            obligatory,
                            plan.read_committed,
                            plan.deadline,
                        )
                        .await
                        .map(|shared| match shared {
                            Some(s) => (s.read.records.clone(), Some(s)),
                            None => (shards::Records::empty(), None),
                        }),
                    };
                    match read {
                        Ok((records, shared)) => {
                            total += records.len;
                            let aborted = (plan.read_committed && view.is_none())
                                .then(|| aborted_in(part, &records));
                            let mut result = ok_result(p.index, part, records);
                            if let Some(aborted) = aborted {
                                result.aborted_transactions = aborted;
                            }
                            if let Some(s) = shared {
                                upstream::upstream_watermarks(core, part, &mut result, &s);
                                holds.push(core.reads.response_memory.hold(&s));
                            }
                            result
                        }
                        Err(e) => PartitionResult::error(p.index, code_of(&e).code()),
                    }
                }
            });
        }
        topics.push(TopicResult {
            topic: t.name.clone(),
            topic_id: t.id,
            partitions,
        });
    }
    Execution {
        topics,
        total,
        holds,
    }
}

struct Execution {
    topics: Vec<TopicResult>,
    total: usize,
    holds: Vec<shards::ResponseHold>,
}

/// One partition's records from `offset`: `None` at the high watermark (nothing to read, nothing to
/// share), an error outside the log's range, else the shared result of a (possibly coalesced) read.
async fn read_partition(
    core: &Rc<Core>,
    part: &Partition,
    offset: i64,
    budget: usize,
    obligatory: bool,
    read_committed: bool,
    deadline: Instant,
) -> shards::Result<Option<Rc<shards::SharedRead>>> {
    let log = part.log.clone();
    let wanted = Wanted {
        offset,
        max_bytes: budget,
        obligatory,
        read_committed,
        deadline,
    };
    if let Some(served) = upstream::read_through(core, part, wanted).await {
        return served;
    }
    let high_watermark = log.high_watermark();
    let log_start_offset = log.log_start_offset();
    // A read replica may be a hand-over behind the owner, whose high watermark the consumer may
    // have seen: it waits (a long poll) until the deadline before calling the offset out of range.
    if log.is_replica() && offset > high_watermark && Instant::now() < deadline {
        return Ok(None);
    }
    // Edge mode reads older data through from upstream on the owner only: back to the leader.
    if log.is_replica() && core.is_edge() && offset < log_start_offset {
        return Err(shards::Error::ReadReplica);
    }
    if offset < log_start_offset || offset > high_watermark {
        return Err(shards::Error::OffsetOutOfRange {
            offset,
            log_start_offset,
            high_watermark,
        });
    }
    // A read_committed fetch reads below the last stable offset only: what lies between it and
    // the high watermark waits for its transactions to end.
    let visible_end = if read_committed {
        log.last_stable_offset().min(high_watermark)
    } else {
        high_watermark
    };
    if offset >= visible_end {
        return Ok(None);
    }
    let key = shards::CoalesceKey {
        log: log.id(),
        layout: log.layout(),
        offset,
        read_committed,
        max_bytes: budget,
        obligatory,
    };
    let counter = core.clone();
    // The log read (a disk read on a miss of the tail cache) is boxed, allocated only when the
    // coalescer has no read to share: the fetch future stays small.
    let read = move || async move {
        let mut r = Box::pin(log.read(offset, budget, obligatory)).await;
        if let Ok(r) = &mut r {
            if read_committed {
                // The batch holding the last stable offset begins there: whole batches below it.
                r.records = r.records.before(visible_end);
                r.high_watermark = visible_end;
            }
            crate::metrics::add(&counter.metrics.fetch_log_read_bytes, r.records.len as u64);
        }
        r
    };
    core.reads
        .coalescer
        .read(key, visible_end, read)
        .await
        .map(Some)
}

/// The aborted transactions in the range of a read_committed fetch's records, for the consumer to
/// drop their records (an empty list when none, or no records).
fn aborted_in(part: &Partition, records: &shards::Records) -> AbortedTransactions {
    let Some(end) = records.next_offset() else {
        return AbortedTransactions::Empty;
    };
    let aborted = part.log.aborted_transactions(records.first_offset, end);
    if aborted.is_empty() {
        return AbortedTransactions::Empty;
    }
    AbortedTransactions::List(
        aborted
            .iter()
            .map(|a| (a.producer_id, a.first_offset))
            .collect(),
    )
}

fn ok_result(partition: i32, part: &Partition, records: shards::Records) -> PartitionResult {
    let hw = part.log.high_watermark();
    PartitionResult {
        partition,
        error_code: 0,
        high_watermark: hw,
        last_stable_offset: part.log.last_stable_offset().min(hw),
        log_start_offset: part.log.log_start_offset(),
        aborted_transactions: AbortedTransactions::Empty,
        preferred_read_replica: -1,
        current_leader: -1,
        records,
    }
}

/// zstd in a batch's compression bits.
const ZSTD: u8 = 4;

/// A client of Fetch below v10 cannot read zstd (KIP-110): a partition whose records hold a zstd
/// batch is answered `UNSUPPORTED_COMPRESSION_TYPE` instead, as Kafka answers it.
fn refuse_zstd_below_v10(version: i16, topics: &mut [TopicResult]) {
    if version >= 10 {
        return;
    }
    for p in topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
        if p.records.batch_headers().any(|h| h.compression() == ZSTD) {
            *p = PartitionResult::error(
                p.partition,
                ResponseError::UnsupportedCompressionType.code(),
            );
        }
    }
}

/// Kafka answers `KAFKA_STORAGE_ERROR` only from Fetch v6 on; older clients get
/// `NOT_LEADER_OR_FOLLOWER`, which they know to retry.
fn down_convert_errors(version: i16, topics: &mut [TopicResult]) {
    if version >= 6 {
        return;
    }
    let storage = ResponseError::KafkaStorageError.code();
    for p in topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
        if p.error_code == storage {
            p.error_code = ResponseError::NotLeaderOrFollower.code();
        }
    }
}

pub async fn handle(core: &Rc<Core>, req: &Request, who: &Session) -> HandlerResult {
    let request: FetchRequest = decode(req)?;
    let _held = core.reads.load.hold_fetch();
    let (scope, asked) = match session::begin(core, &request, req.api_version) {
        Ok(begun) => begun,
        Err(e) => return Ok(refused(core, req, e)),
    };
    // Just after a start, partitions this core is still opening are opened first and waited for.
    core.wait_opening(asked.iter().flat_map(|t| {
        let name = match t.name.is_empty() {
            true => core
                .topic_name(&t.id)
                .map_or_else(String::new, |n| n.to_string()),
            false => String::from_utf8_lossy(&t.name).into_owned(),
        };
        t.partitions.iter().map(move |p| (name.clone(), p.index))
    }))
    .await;
    let plan = plan(core, &request, &asked, req.api_version, who);
    pace(core, &plan, Before::Read).await;
    let mut done = loop {
        let run = execute(core, &plan).await;
        // Errors and redirects are answered at once.
        let errors = run
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .any(|p| p.error_code != 0 || p.preferred_read_replica >= 0);
        if run.total >= plan.min_bytes
            || errors
            || Instant::now() >= plan.deadline
            || core.is_shutting_down()
        {
            break run;
        }
        drop(run);
        if !wait_for_data(core, &plan).await {
            break execute(core, &plan).await;
        }
        pace(core, &plan, Before::ReadAfterWait).await;
    };
    refuse_zstd_below_v10(req.api_version, &mut done.topics);
    let session_id = session::finish(core, scope, req.api_version, &asked, &mut done.topics);
    down_convert_errors(req.api_version, &mut done.topics);
    let endpoints = current_leaders(core, who, req.api_version, &mut done.topics);
    count_errors(
        core,
        req,
        done.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
    );
    crate::metrics::add(&core.metrics.fetch_response_bytes, done.total as u64);
    let parts = encode_fetch_response(
        req.api_version,
        req.correlation_id,
        0,
        0,
        session_id,
        &done.topics,
        &endpoints,
    );
    Ok(Reply::Fetch(parts.chunks, done.holds))
}

/// A session fetch the session cache refuses: the error alone, at once, with no partitions and
/// session id 0 (as Kafka answers it).
fn refused(core: &Core, req: &Request, e: ResponseError) -> Reply {
    count_errors(core, req, [e.code()]);
    let parts = encode_fetch_response(
        req.api_version,
        req.correlation_id,
        0,
        e.code(),
        0,
        &[],
        &[],
    );
    Reply::Fetch(parts.chunks, Vec::new())
}

/// From v16, each partition answered `NOT_LEADER_OR_FOLLOWER` names its leader, and the response
/// lists those leaders' endpoints (KIP-951, see [`crate::kafka::leaders`]).
fn current_leaders(
    core: &Core,
    who: &Session,
    version: i16,
    topics: &mut [TopicResult],
) -> Vec<NodeEndpoint> {
    let mut endpoints: Vec<NodeEndpoint> = Vec::new();
    if version < 16 {
        return endpoints;
    }
    let not_leader = ResponseError::NotLeaderOrFollower.code();
    for t in topics.iter_mut() {
        let name = std::str::from_utf8(&t.topic).unwrap_or_default();
        for p in t
            .partitions
            .iter_mut()
            .filter(|p| p.error_code == not_leader)
        {
            let Some(leader) = leaders::leader_of(core, name, p.partition) else {
                continue;
            };
            let Some((host, port)) = leaders::endpoint(core, who, leader) else {
                continue;
            };
            p.current_leader = leader;
            if !endpoints.iter().any(|e| e.node_id == leader) {
                endpoints.push(NodeEndpoint {
                    node_id: leader,
                    host: Bytes::copy_from_slice(host.as_bytes()),
                    port,
                });
            }
        }
    }
    endpoints
}

/// Whether some partition of the fetch already has about a full response waiting (the consumer is
/// behind): waiting would not make its response bigger.
fn fills_a_response(plan: &Plan) -> bool {
    plan.topics.iter().flat_map(|t| &t.partitions).any(|p| {
        p.target.as_ref().is_ok_and(|t| {
            t.view.is_none()
                && t.part.log.estimated_bytes_from(p.offset)
                    >= p.max_bytes.min(plan.max_bytes) as u64
        })
    })
}

/// When a fetch is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Before {
    /// Its first read: not when a full response is already waiting (the consumer is behind).
    Read,
    /// The read after its long poll was woken by new data.
    ReadAfterWait,
}

/// Fetch pacing: on a saturated core, a fetch waits a little before it reads (never past its
/// deadline) so that its response carries more; see [`crate::cores::load`]. The delay is bounded (by
/// `--fetch-pacing-max-ms`, at most a second), so shutdown does not cut it short.
async fn pace(core: &Core, plan: &Plan, when: Before) {
    let delay = core
        .reads
        .load
        .fetch_delay()
        .min(plan.deadline.saturating_duration_since(Instant::now()));
    if delay.is_zero() || (when == Before::Read && fills_a_response(plan)) {
        return;
    }
    crate::metrics::add(&core.metrics.fetch_paced, 1);
    crate::metrics::add(&core.metrics.fetch_paced_us, delay.as_micros() as u64);
    glommio::timer::sleep(delay).await;
}

/// Waits until any planned partition gets more data than it has now; `false` at the deadline or on
/// shutdown.
async fn wait_for_data(core: &Core, plan: &Plan) -> bool {
    let mut watched = plan
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| {
            p.target.as_ref().ok().map(|t| {
                // Past what is there now, not past the fetch offset: with some data but less
                // than min_bytes, the latter is already true and the fetch would spin. (A read
                // replica long-polls for any offset past its end, up to `i64::MAX`.)
                let m = t.monitor(plan.read_committed);
                let after = m.value().max(p.offset).saturating_add(1);
                (m, after)
            })
        });
    let first = watched.next();
    // The common fetch watches one partition: its wait is awaited in place, with no list of
    // boxed waits to allocate (the rest is empty: no allocation either).
    let rest: Vec<_> = watched.collect();
    let remaining = plan.deadline.saturating_duration_since(Instant::now());
    let any = async {
        match first {
            None => std::future::pending().await,
            Some((m, after)) if rest.is_empty() => m.wait_for(after).await,
            Some(first) => {
                let waits = std::iter::once(first)
                    .chain(rest)
                    .map(|(m, after)| Box::pin(m.wait_for(after)))
                    .collect();
                AnyOf(waits).await
            }
        }
    };
    let timeout = async {
        glommio::timer::sleep(remaining).await;
        false
    };
    let woken = futures_lite::future::or(any, timeout);
    core.until_stopping(woken).await.unwrap_or(false)
}

/// Resolves when any of the futures does (true only if it resolved true).
struct AnyOf<F>(Vec<Pin<Box<F>>>);

impl<F: Future<Output = bool>> Future for AnyOf<F> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        if self.0.is_empty() {
            return Poll::Pending;
        }
        for f in self.0.iter_mut() {
            if let Poll::Ready(v) = f.as_mut().poll(cx) {
                return Poll::Ready(v);
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_errors_become_not_leader_before_v6() {
        let storage = ResponseError::KafkaStorageError.code();
        let topics = || {
            vec![TopicResult {
                topic: Bytes::from_static(b"t"),
                topic_id: [0; 16],
                partitions: vec![
                    PartitionResult::error(0, storage),
                    PartitionResult::error(1, ResponseError::OffsetOutOfRange.code()),
                ],
            }]
        };
        for version in encode::MIN_VERSION..=encode::MAX_VERSION {
            let mut t = topics();
            down_convert_errors(version, &mut t);
            let codes: Vec<i16> = t[0].partitions.iter().map(|p| p.error_code).collect();
            let first = if version >= 6 {
                storage
            } else {
                ResponseError::NotLeaderOrFollower.code()
            };
            assert_eq!(
                codes,
                [first, ResponseError::OffsetOutOfRange.code()],
                "v{version}"
            );
        }
    }

    #[test]
    fn a_response_never_outgrows_an_i32_frame() {
        let budget = 8usize << 30; // --fetch-response-budget-bytes 8GiB
        for asked in [i32::MAX, 0, -1, i32::MIN] {
            assert_eq!(
                response_limit(asked, budget),
                MAX_RESPONSE_RECORDS,
                "{asked}"
            );
        }
        assert_eq!(response_limit(1 << 20, budget), 1 << 20);
        assert_eq!(response_limit(i32::MAX, 5000), 5000);
        assert_eq!(response_limit(-1, 0), 0);
    }
}
