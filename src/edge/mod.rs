//! Edge mode (`shoal edge --upstream ...`): the same cores, router, coalescer and view readers as
//! `serve`, fed by one upstream fetcher per partition instead of producers.
//!
//! ## Layout, top layer first
//! - [`feed`]     — a partition's upstream fetcher: it mirrors the upstream partition, byte for byte
//!   and with the upstream's offsets, into the partition's local log (which the tail cache, the
//!   coalescer and the view readers serve from as in `serve`).
//! - [`read`]     — what a consumer's fetch asks of the edge: keep the fetcher running, read
//!   through to upstream for offsets the edge does not hold.
//! - [`mirror`]   — the upstream's topic list, as core 0 mirrors it into the topic table.
//! - [`groups`]   — the requests the edge answers itself instead of the front end's handlers
//!   (group requests forwarded, ListGroups merged from every upstream broker).
//! - [`forward`]  — consumer-group requests passed to the upstream's group coordinator over a
//!   connection of the client connection's own.
//! - [`upstream`] — a client connection to an upstream broker.
//! - [`stats`]    — the edge's counters, their snapshot and their `/metrics` families.
//!
//! Each core has an [`EdgeCore`]: its view of the upstream cluster (brokers, partition leaders,
//! refreshed on demand), a small pool of connections for its own requests (metadata, list offsets,
//! read-through fetches, coordinator lookups), its feeds and its counters. Cores share nothing:
//! each asks the upstream what it needs. Core 0 also mirrors the upstream's topic list into the
//! topic table ([`mirror`], applied by `control::mirror_upstream`).

pub mod feed;
pub mod forward;
pub mod groups;
pub mod mirror;
pub mod read;
pub mod stats;
pub mod upstream;

use crate::metrics::add;
use crate::wire::requests::list_offsets_request;
use feed::Feed;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use shards::{Log, LogRead, OffsetMonitor, Records};
pub use stats::{EdgeMetrics, EdgeStats, FeedStatus};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::rc::Rc;
use std::time::{Duration, Instant};
pub use upstream::UpstreamError;
use upstream::{within, Conn};

/// What `shoal edge` adds to the server's settings.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Bootstrap addresses of the upstream cluster.
    pub upstream: Vec<String>,
    /// On-disk bytes kept per partition (the local log's retention by size).
    pub cache_bytes: u64,
    /// A fetcher with no consumer for this long stops.
    pub idle: Duration,
    /// How often core 0 re-reads the upstream's topics.
    pub metadata_refresh: Duration,
    /// Most record bytes one upstream fetch asks for per partition.
    pub fetch_bytes: i32,
    /// How long an upstream fetch waits for new data (a long poll).
    pub fetch_wait: Duration,
}

impl EdgeConfig {
    pub fn new(upstream: Vec<String>) -> Self {
        Self {
            upstream,
            cache_bytes: 256 << 20,
            idle: Duration::from_secs(30),
            metadata_refresh: Duration::from_secs(5),
            fetch_bytes: 4 << 20,
            fetch_wait: Duration::from_millis(500),
        }
    }

    /// Why a topic change is refused at the edge (logged here): its topics are the upstream's.
    /// `what`: the change, as a verb ("create", "delete", ...).
    pub fn refuse_topic_change(&self, what: &str, names: &[String]) -> String {
        let upstream = self.upstream_list();
        log::warn!(
            "refused to {what} {}: shoal edge is read-only, its topics are the upstream's; do it on the upstream cluster at {upstream}",
            names.join(", ")
        );
        format!(
            "shoal edge is read-only: its topics are the upstream's; do this on the upstream cluster at {upstream}"
        )
    }

    /// The upstream bootstrap list as one string, for log lines and errors.
    pub fn upstream_list(&self) -> String {
        self.upstream.join(",")
    }
}

/// ListOffsets' special timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

/// Longest an upstream request of the edge's own (not a long-polling fetch) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A coordinator found upstream is asked again after this long.
const COORDINATOR_TTL: Duration = Duration::from_secs(30);
/// Groups whose coordinator is kept; past it, expired entries go.
const MAX_COORDINATORS_KEPT: usize = 10_000;
/// Metadata is not re-read more often than this on errors.
const MIN_REFRESH: Duration = Duration::from_millis(500);

/// Versions of the requests the edge itself sends. Fetch stops at v11, the last before tagged
/// fields: the edge uses none of v12's, and brokers differ in which they send at which version
/// (tansu 0.6 sends one at v12 that the protocol defines from v16, which a strict decoder refuses).
pub const METADATA_VERSIONS: RangeInclusive<i16> = 1..=12;
pub const LIST_OFFSETS_VERSIONS: RangeInclusive<i16> = 1..=7;
pub const FETCH_VERSIONS: RangeInclusive<i16> = 4..=11;
const FIND_COORDINATOR_VERSIONS: RangeInclusive<i16> = 0..=3;

/// Kafka error codes the edge reacts to.
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
const NOT_COORDINATOR_CODES: [i16; 2] = [15, 16];

/// A topic as the upstream lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTopic {
    pub id: [u8; 16],
    /// The leader's broker id per partition (-1: none now).
    pub leaders: Vec<i32>,
}

/// This core's view of the upstream cluster.
#[derive(Debug, Default)]
struct Cluster {
    brokers: HashMap<i32, String>,
    topics: BTreeMap<String, UpstreamTopic>,
    refreshed: Option<Instant>,
}

/// A pooled connection: one request at a time.
#[derive(Debug)]
struct Pooled {
    conn: RefCell<Option<Conn>>,
    turn: glommio::sync::Semaphore,
}

/// Where a consumer's offset stands against what the edge holds of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Within the local log, or past its end within the upstream's range (waiting for the
    /// fetcher): served locally.
    Local,
    /// Before the local log, or past everything the edge knows the upstream to hold: a
    /// read-through fetch, whose answer (records, or the upstream's OFFSET_OUT_OF_RANGE) the
    /// consumer gets. The edge never decides an offset is out of range on what it saw earlier.
    Upstream,
}

#[derive(Debug)]
pub struct EdgeCore {
    pub config: EdgeConfig,
    core: usize,
    client_id: String,
    cluster: RefCell<Cluster>,
    refreshing: glommio::sync::Semaphore,
    pool: RefCell<HashMap<String, Rc<Pooled>>>,
    /// Feeds by the local log's id (a re-created partition has a new log, so a new feed).
    feeds: RefCell<HashMap<u64, Rc<Feed>>>,
    coordinators: RefCell<HashMap<String, (String, Instant)>>,
    pub metrics: EdgeMetrics,
    refusal_logged: Cell<Option<Instant>>,
    error_logged: Cell<Option<Instant>>,
    errors_unlogged: Cell<u64>,
    /// Moves to 1 when the server stops: fetchers end.
    shutdown: OffsetMonitor,
}

impl EdgeCore {
    pub fn new(core: usize, config: EdgeConfig, shutdown: OffsetMonitor) -> Self {
        Self {
            config,
            core,
            client_id: format!("shoal-edge-{core}"),
            cluster: RefCell::default(),
            refreshing: glommio::sync::Semaphore::new(1),
            pool: RefCell::default(),
            feeds: RefCell::default(),
            coordinators: RefCell::default(),
            metrics: EdgeMetrics::default(),
            refusal_logged: Cell::new(None),
            error_logged: Cell::new(None),
            errors_unlogged: Cell::new(0),
            shutdown,
        }
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Counts a failed upstream request and logs it, at most once a second per core (an
    /// unreachable upstream fails every fetcher's every retry).
    pub(crate) fn error(&self, what: &str, why: &str) {
        add(&self.metrics.upstream_errors, 1);
        let now = Instant::now();
        let last = self.error_logged.get();
        if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            self.error_logged.set(Some(now));
            let quiet = self.errors_unlogged.replace(0);
            let more = if quiet > 0 {
                format!(" ({quiet} more upstream errors since the last line)")
            } else {
                String::new()
            };
            log::warn!("core {}: upstream {what}: {why}{more}", self.core);
        } else {
            self.errors_unlogged.set(self.errors_unlogged.get() + 1);
        }
    }

    // ---- the upstream cluster ------------------------------------------------------------------

    /// Reads the upstream's brokers, topics and leaders again (from any broker that answers,
    /// brokers it named before first, then the bootstrap list), unless that happened within
    /// `MIN_REFRESH` and `force` is not set.
    pub async fn refresh(&self, force: bool) -> Result<(), UpstreamError> {
        let Ok(_one) = self.refreshing.acquire_permit(1).await else {
            return Err("closing".into());
        };
        let recent = self
            .cluster
            .borrow()
            .refreshed
            .is_some_and(|t| t.elapsed() < MIN_REFRESH);
        if recent && !force {
            return Ok(());
        }
        let mut last = String::from("no upstream address");
        for addr in self.candidates() {
            let request = |_v: i16| MetadataRequest::default().with_topics(None);
            match self
                .call::<_, MetadataResponse>(&addr, ApiKey::Metadata, METADATA_VERSIONS, request)
                .await
            {
                Ok(m) => {
                    self.install(m);
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        self.cluster.borrow_mut().refreshed = Some(Instant::now());
        Err(last)
    }

    fn install(&self, m: MetadataResponse) {
        let mut c = self.cluster.borrow_mut();
        c.brokers = m
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        c.topics = m
            .topics
            .iter()
            .filter(|t| t.error_code == 0 && !t.is_internal)
            .filter_map(|t| {
                let name = t.name.as_ref()?.0.to_string();
                // Names the edge could not serve (views are the edge's own) stay upstream.
                if crate::table::validate_topic_name(&name).is_err()
                    || crate::table::parse_view_name(&name).is_some()
                {
                    return None;
                }
                let count = t.partitions.iter().map(|p| p.partition_index + 1).max()?;
                let mut leaders = vec![-1; count.max(0) as usize];
                for p in &t.partitions {
                    if let Some(l) = leaders.get_mut(p.partition_index.max(0) as usize) {
                        *l = p.leader_id.0;
                    }
                }
                let mut id = *t.topic_id.as_bytes();
                if id == [0; 16] {
                    id = name_id(&name);
                }
                Some((name, UpstreamTopic { id, leaders }))
            })
            .collect();
        c.refreshed = Some(Instant::now());
    }

    /// Every upstream broker's address, as last read (the bootstrap list before the first read).
    pub fn brokers(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self.cluster.borrow().brokers.values().cloned().collect();
        if addrs.is_empty() {
            addrs = self.config.upstream.clone();
        }
        addrs.sort();
        addrs
    }

    /// The upstream's topics as last read.
    pub fn topics(&self) -> BTreeMap<String, UpstreamTopic> {
        self.cluster.borrow().topics.clone()
    }

    /// The address of a partition's upstream leader, reading metadata again if it is not known.
    pub async fn leader(&self, topic: &str, partition: i32) -> Result<String, UpstreamError> {
        for attempt in 0..2 {
            {
                let c = self.cluster.borrow();
                let leader = c
                    .topics
                    .get(topic)
                    .and_then(|t| t.leaders.get(partition.max(0) as usize).copied());
                if let Some(addr) = leader.and_then(|id| c.brokers.get(&id)) {
                    return Ok(addr.clone());
                }
            }
            if attempt == 0 {
                self.refresh(false).await?;
            }
        }
        Err(format!("no upstream leader known for {topic}-{partition}"))
    }

    // ---- the connection pool -------------------------------------------------------------------

    /// One request to `addr` over the pooled connection (made if there is none), at the highest
    /// version both sides speak within `versions`; `build` makes the request for that version.
    pub async fn call<Req: Encodable, Resp: Decodable>(
        &self,
        addr: &str,
        key: ApiKey,
        versions: RangeInclusive<i16>,
        build: impl FnOnce(i16) -> Req,
    ) -> Result<Resp, UpstreamError> {
        let pooled = self
            .pool
            .borrow_mut()
            .entry(addr.to_string())
            .or_insert_with(|| {
                Rc::new(Pooled {
                    conn: RefCell::new(None),
                    turn: glommio::sync::Semaphore::new(1),
                })
            })
            .clone();
        let Ok(_turn) = pooled.turn.acquire_permit(1).await else {
            return Err("closing".into());
        };
        let taken = pooled.conn.borrow_mut().take();
        let mut conn = match taken {
            Some(c) => c,
            None => Conn::connect(addr, &self.client_id).await?,
        };
        let version = conn.version(key, versions)?;
        let request = build(version);
        let response = conn.call(key, version, &request, REQUEST_TIMEOUT).await?;
        *pooled.conn.borrow_mut() = Some(conn);
        Ok(response)
    }

    /// The upstream's log start and high watermark of a partition, from its leader.
    pub async fn offsets(&self, topic: &str, partition: i32) -> Result<(i64, i64), UpstreamError> {
        let leader = self.leader(topic, partition).await?;
        let mut out = [0i64; 2];
        for (slot, timestamp) in [(0, -2), (1, -1)] {
            let request = |_v: i16| list_offsets_request(topic, &[(partition, timestamp)]);
            let r: ListOffsetsResponse = self
                .call(&leader, ApiKey::ListOffsets, LIST_OFFSETS_VERSIONS, request)
                .await?;
            let p = r
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .ok_or_else(|| format!("{leader}: ListOffsets answered no partition"))?;
            if p.error_code != 0 {
                return Err(format!(
                    "{leader}: ListOffsets {topic}-{partition}: error {}",
                    p.error_code
                ));
            }
            out[slot] = p.offset;
        }
        Ok((out[0], out[1]))
    }

    /// ListOffsets at the edge: the upstream leader's answer, except that "latest" is the edge's
    /// own end where it has seen more. With the upstream unreachable, "earliest" and "latest" are
    /// the ends of what the edge holds, if it holds anything (consumers keep reading it), and
    /// other lookups get LEADER_NOT_AVAILABLE (clients retry it). A view (`view`: the log is a
    /// view's source) is computed at the edge from what the edge holds: its earliest offset is
    /// where that begins (a view consumer before it would get OFFSET_OUT_OF_RANGE).
    pub async fn list_offset(
        self: &Rc<Self>,
        log: &Log,
        topic: &str,
        partition: i32,
        timestamp: i64,
        view: bool,
    ) -> Result<(i64, i64), i16> {
        let held = log.high_watermark() > log.log_start_offset();
        let answer = self.upstream_offset(log, topic, partition, timestamp).await;
        answer.map(|(offset, ts)| match timestamp {
            EARLIEST if view && held => (offset.max(log.log_start_offset()), ts),
            _ => (offset, ts),
        })
    }

    /// The upstream's answer to ListOffsets (see [`EdgeCore::list_offset`]).
    async fn upstream_offset(
        self: &Rc<Self>,
        log: &Log,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<(i64, i64), i16> {
        const LEADER_NOT_AVAILABLE: i16 = 5;
        let local_end = log.high_watermark();
        let asked = async {
            let leader = self.leader(topic, partition).await?;
            let request = |_v: i16| list_offsets_request(topic, &[(partition, timestamp)]);
            let r: ListOffsetsResponse = self
                .call(&leader, ApiKey::ListOffsets, LIST_OFFSETS_VERSIONS, request)
                .await?;
            r.topics
                .into_iter()
                .next()
                .and_then(|t| t.partitions.into_iter().next())
                .ok_or_else(|| format!("{leader}: ListOffsets answered no partition"))
        };
        match asked.await {
            Ok(p) if p.error_code != 0 => Err(p.error_code),
            Ok(p) if timestamp == LATEST => Ok((p.offset.max(local_end), p.timestamp)),
            Ok(p) => Ok((p.offset, p.timestamp)),
            Err(why) => {
                self.error(&format!("ListOffsets of {topic}-{partition}"), &why);
                self.refresh_later();
                let local_start = log.log_start_offset();
                match timestamp {
                    LATEST if local_end > local_start => Ok((local_end, -1)),
                    EARLIEST if local_end > local_start => Ok((local_start, -1)),
                    _ => Err(LEADER_NOT_AVAILABLE),
                }
            }
        }
    }

    // ---- read-through --------------------------------------------------------------------------

    /// One fetch from the partition's upstream leader at `offset`, for a consumer behind what the
    /// edge holds (the caller shares it through the coalescer). `Ok(Err(read))` carries the
    /// upstream's OFFSET_OUT_OF_RANGE with the range it reported.
    /// It gives up after `limit` (the consumer's fetch ends empty then, as a long poll would).
    pub async fn read_through(
        self: &Rc<Self>,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
        read_committed: bool,
        limit: Duration,
    ) -> Result<Result<LogRead, (i64, i64)>, UpstreamError> {
        let fetch = async {
            let leader = self.leader(topic, partition).await?;
            let limit = max_bytes.clamp(1, self.config.fetch_bytes as usize) as i32;
            let build = |_v: i16| {
                fetch_request(
                    topic,
                    partition,
                    offset,
                    limit,
                    Duration::ZERO,
                    0,
                    read_committed,
                )
            };
            let response: FetchResponse = self
                .call(&leader, ApiKey::Fetch, FETCH_VERSIONS, build)
                .await?;
            let p = fetched_partition(response, &leader, topic, partition)?;
            add(&self.metrics.read_through, 1);
            if p.error_code == OFFSET_OUT_OF_RANGE {
                return Ok(Err((p.log_start_offset, p.high_watermark)));
            }
            if p.error_code != 0 {
                return Err(format!(
                    "{leader}: fetch {topic}-{partition} at {offset}: error {}",
                    p.error_code
                ));
            }
            let records = Records::whole_batches(p.records.unwrap_or_default());
            add(&self.metrics.read_through_bytes, records.len as u64);
            // What the consumer needs to drop the aborted records, as the upstream said it.
            let upstream_txns = read_committed.then(|| shards::UpstreamTxns {
                last_stable_offset: p.last_stable_offset,
                aborted: p
                    .aborted_transactions
                    .iter()
                    .flatten()
                    .map(|a| (a.producer_id.0, a.first_offset))
                    .collect(),
            });
            Ok(Ok(LogRead {
                records,
                high_watermark: p.high_watermark,
                log_start_offset: p.log_start_offset,
                from_cache: false,
                upstream_txns,
            }))
        };
        let result = within(limit, "read-through", fetch).await;
        if result.is_err() {
            self.refresh_later();
        }
        result
    }

    /// Reads the upstream's metadata again in the background (a leader that moved or went away),
    /// so that no request waits for it.
    pub fn refresh_later(self: &Rc<Self>) {
        let edge = self.clone();
        glommio::spawn_local(async move {
            let _ = edge.refresh(false).await;
        })
        .detach();
    }

    /// The addresses to ask about the cluster: the brokers last listed, then the bootstrap list,
    /// each once.
    fn candidates(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self.cluster.borrow().brokers.values().cloned().collect();
        addrs.sort();
        for a in &self.config.upstream {
            if !addrs.contains(a) {
                addrs.push(a.clone());
            }
        }
        addrs
    }

    /// Why a produce to `topic` is refused at the edge (logged at most once a second per core).
    pub fn refuse_produce(&self, topic: &str, peer: &str) -> String {
        let upstream = self.config.upstream_list();
        let why = format!("shoal edge is read-only: produce to the upstream cluster at {upstream}");
        let now = Instant::now();
        if self
            .refusal_logged
            .get()
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.refusal_logged.set(Some(now));
            log::warn!("refused a produce to {topic} from {peer}: shoal edge is read-only; producers write to the upstream cluster at {upstream}");
        }
        why
    }

    // ---- group coordinators --------------------------------------------------------------------

    /// The address of the upstream coordinator of `group` (asked again after a while, or when
    /// `stale` says the last answer was wrong).
    pub async fn coordinator(&self, group: &str, stale: bool) -> Result<String, UpstreamError> {
        if stale {
            self.coordinators.borrow_mut().remove(group);
        }
        if let Some((addr, at)) = self.coordinators.borrow().get(group) {
            if at.elapsed() < COORDINATOR_TTL {
                return Ok(addr.clone());
            }
        }
        let mut last = String::from("no upstream address");
        for addr in self.candidates() {
            let build = |_v: i16| {
                FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.into()))
            };
            let r: Result<FindCoordinatorResponse, _> = self
                .call(
                    &addr,
                    ApiKey::FindCoordinator,
                    FIND_COORDINATOR_VERSIONS,
                    build,
                )
                .await;
            match r {
                Ok(r) if r.error_code == 0 => {
                    let found = format!("{}:{}", r.host.as_str(), r.port);
                    let mut known = self.coordinators.borrow_mut();
                    if known.len() >= MAX_COORDINATORS_KEPT {
                        known.retain(|_, (_, at)| at.elapsed() < COORDINATOR_TTL);
                    }
                    known.insert(group.to_string(), (found.clone(), Instant::now()));
                    return Ok(found);
                }
                Ok(r) => last = format!("{addr}: FindCoordinator error {}", r.error_code),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether an upstream error code says the group's coordinator moved.
    pub fn coordinator_moved(code: i16) -> bool {
        NOT_COORDINATOR_CODES.contains(&code)
    }

    // ---- feeds ---------------------------------------------------------------------------------

    /// Called for every consumer fetch of a partition at `offset`: keeps the partition's fetcher
    /// running (starting it if it is not) and says how to serve the offset.
    /// `until`: the fetch's deadline (the partition stays wanted while it long-polls).
    pub fn want(
        self: &Rc<Self>,
        log: &Log,
        topic: &str,
        partition: i32,
        offset: i64,
        until: Instant,
    ) -> Standing {
        let found = self.feeds.borrow().get(&log.id()).cloned();
        let feed = found.unwrap_or_else(|| {
            let mut feeds = self.feeds.borrow_mut();
            // Feeds of partitions deleted while their fetcher was stopped go now.
            feeds.retain(|_, f| f.is_running() || !f.log_is_closed());
            let feed = Rc::new(Feed::new(topic, partition, log.clone()));
            feeds.insert(log.id(), feed.clone());
            feed
        });
        feed.touch(until);
        if !feed.is_running() {
            feed.clone().start(self.clone(), offset);
        }
        feed.standing(offset)
    }

    /// Forgets feeds whose partition is gone (called when the fetcher ends).
    pub(crate) fn drop_feed(&self, log_id: u64) {
        self.feeds.borrow_mut().remove(&log_id);
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.value() > 0
    }

    pub(crate) fn shutdown(&self) -> &OffsetMonitor {
        &self.shutdown
    }

    /// The upstream position of the partition whose local log is `log_id`, if it has a feed.
    pub fn feed_status(&self, log_id: u64) -> Option<FeedStatus> {
        self.feeds.borrow().get(&log_id).map(|f| f.status())
    }

    pub fn stats(&self) -> EdgeStats {
        let m = &self.metrics;
        EdgeStats {
            upstream: self.config.upstream_list(),
            fetch_streams: self
                .feeds
                .borrow()
                .values()
                .filter(|f| f.is_running())
                .count() as u64,
            upstream_fetches: m.upstream_fetches.get(),
            upstream_bytes: m.upstream_bytes.get(),
            read_through: m.read_through.get(),
            read_through_bytes: m.read_through_bytes.get(),
            upstream_errors: m.upstream_errors.get(),
        }
    }
}

/// A topic id for an upstream that reports none (before Metadata v10): stable per name.
fn name_id(name: &str) -> [u8; 16] {
    let mut id = [0u8; 16];
    let h = shards::partitioner::murmur2(name.as_bytes()) as u32;
    let g = shards::partitioner::murmur2(format!("{name}/edge").as_bytes()) as u32;
    id[..4].copy_from_slice(&h.to_be_bytes());
    id[4..8].copy_from_slice(&g.to_be_bytes());
    id[8..12].copy_from_slice(&(name.len() as u32).to_be_bytes());
    id
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// A fetch of one partition as a consumer makes it (no session): read_uncommitted for the feed,
/// which mirrors markers and all; read_committed for a read-through that serves read_committed
/// consumers.
pub fn fetch_request(
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    wait: Duration,
    min_bytes: i32,
    read_committed: bool,
) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(wait.as_millis() as i32)
        .with_min_bytes(min_bytes)
        .with_max_bytes(max_bytes)
        .with_isolation_level(i8::from(read_committed))
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(max_bytes)])])
}

/// The one partition a single-partition fetch response carries, checked to be the one asked for.
pub fn fetched_partition(
    response: FetchResponse,
    from: &str,
    topic: &str,
    partition: i32,
) -> Result<kafka_protocol::messages::fetch_response::PartitionData, UpstreamError> {
    if response.error_code != 0 {
        return Err(format!("{from}: fetch error {}", response.error_code));
    }
    let t = response
        .responses
        .into_iter()
        .next()
        .ok_or_else(|| format!("{from}: fetch answered no topic"))?;
    if t.topic.0.as_str() != topic {
        return Err(format!(
            "{from}: fetch of {topic} answered {}",
            t.topic.0.as_str()
        ));
    }
    let p = t
        .partitions
        .into_iter()
        .next()
        .ok_or_else(|| format!("{from}: fetch answered no partition"))?;
    if p.partition_index != partition {
        return Err(format!(
            "{from}: fetch of {topic}-{partition} answered partition {}",
            p.partition_index
        ));
    }
    Ok(p)
}
