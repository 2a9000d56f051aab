//! One core's state: its copy of the topic table, the partitions it owns, its tail cache, its metrics
//! and its end of the control plane. `!Send`: created on the core's executor and never leaves it.

use crate::cores::config::BrokerConfig;
use crate::cores::fetch_sessions::FetchSessions;
use crate::cores::load::CoreLoad;
use crate::cores::mesh::{HandedStream, Mesh};
use crate::replicas::{ReplicaMsg, Replicas};
use crate::stats::kafka::FrontEndStats;
use crate::stats::{CoreSnapshot, PartitionSnapshot};
use crate::table::configs::ReplicaPolicy;
use crate::table::{apply_topic_configs, parse_view_name, TopicIds, TopicTable, ViewName};
use glommio::channels::local_channel::LocalSender;
use glommio::{Latency, Shares, TaskQueueHandle};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;
use shards::partition::Partition;
use shards::view_reader::ViewReaders;
use shards::{FetchCoalescer, OffsetMonitor, ResponseMemory, TailCache};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// Partitions a core opens (or closes) at once at start (or when a topic is created): their
/// recoveries' reads, opens and fsyncs overlap.
const OPEN_AT_ONCE: usize = 64;

/// The partitions holding the data of `partitions` (a view's are its source's).
fn sources(partitions: impl Iterator<Item = (String, i32)>) -> impl Iterator<Item = (String, i32)> {
    partitions.map(|(topic, index)| {
        let source = crate::table::source_topic(&topic).map(str::to_string);
        (source.unwrap_or(topic), index)
    })
}

/// Runs `futures` together on this task until all are done.
async fn join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut futures: Vec<Option<std::pin::Pin<Box<F>>>> =
        futures.map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in &mut futures {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
}

/// The task queues a core's request handlers run in (with the writes of their responses), so that
/// a flood of fetches cannot starve the rest: every queue but fetch is latency-sensitive, and
/// glommio preempts a run of fetch tasks within [`PREEMPT_FETCH_WITHIN`] when one of them has work.
#[derive(Debug, Clone, Copy)]
pub struct TaskQueues {
    pub produce: TaskQueueHandle,
    pub fetch: TaskQueueHandle,
    /// Everything else (metadata, groups, admin): small and latency-sensitive.
    pub other: TaskQueueHandle,
    /// The connections' readers (one per connection: reads a frame, starts its handler). Cheap,
    /// and latency-sensitive: a producer's request waits here before it reaches its queue.
    pub readers: TaskQueueHandle,
}

/// How soon work in the other queues preempts fetch work.
pub const PREEMPT_FETCH_WITHIN: Duration = Duration::from_millis(1);

impl TaskQueues {
    /// Creates the queues on the current executor, with equal shares.
    pub fn create() -> Self {
        let ex = glommio::executor();
        let queue = |latency, name| ex.create_task_queue(Shares::default(), latency, name);
        let urgent = Latency::Matters(PREEMPT_FETCH_WITHIN);
        Self {
            produce: queue(urgent, "produce"),
            fetch: queue(Latency::NotImportant, "fetch"),
            other: queue(urgent, "requests"),
            readers: queue(urgent, "readers"),
        }
    }

    /// The queue a request of this API runs in.
    pub fn for_api(&self, api_key: i16) -> TaskQueueHandle {
        match ApiKey::try_from(api_key) {
            Ok(ApiKey::Produce) => self.produce,
            Ok(ApiKey::Fetch) => self.fetch,
            _ => self.other,
        }
    }
}

/// One Kafka listener: its security, and each core's port on it (index = core = broker id).
#[derive(Debug, Clone)]
pub struct Listener {
    pub protocol: crate::auth::SecurityProtocol,
    pub ports: Vec<u16>,
}

/// How clients reach the cores: every listener with each core's port on it, and the host name
/// they are told (Metadata, FindCoordinator).
#[derive(Debug)]
pub struct Cluster {
    /// Every listener; a client is told the ports of the one it connected to.
    pub listeners: Vec<Listener>,
    pub advertised_host: String,
}

/// What a core's fetches share: the tail cache under the logs, the coalescer and the response
/// memory it is bounded by, the view readers, the fetch pacing derived from the core's load, and
/// the fetch sessions.
#[derive(Debug)]
pub struct ReadPath {
    pub tail_cache: Rc<TailCache>,
    pub coalescer: Rc<FetchCoalescer>,
    pub response_memory: Rc<ResponseMemory>,
    pub views: ViewReaders,
    /// How busy this core is (sampled), and the fetch pacing derived from it.
    pub load: Rc<CoreLoad>,
    /// The incremental fetch sessions of the clients fetching from this core.
    pub sessions: RefCell<FetchSessions>,
}

/// Who may connect to this core and how: the users, failed attempts, and TLS.
#[derive(Debug)]
pub struct Security {
    /// The users who may authenticate (read again when the file changes).
    pub users: crate::auth::users::Users,
    /// The HTTP streams' bearer tokens (read again when the file changes).
    pub tokens: crate::auth::tokens::Tokens,
    /// Failed authentications per source address on this core.
    pub auth_failures: crate::auth::sasl::FailureLimiter,
    /// The listener's TLS, if it has any (the server checked the files at start; if they cannot
    /// be read now, connections are refused, never served in plaintext).
    pub tls: Option<Result<std::sync::Arc<futures_rustls::rustls::ServerConfig>, String>>,
    /// TLS connections hand their keys to the kernel after the handshake (`--tls-kernel auto` on
    /// a kernel that offers it); turned off for good on this core the first time the kernel
    /// refuses a connection's keys (an older kernel without TLS 1.3 or a cipher).
    pub kernel_tls: Cell<bool>,
}

/// How far a core's start has come: watermarks that only move forward, so that whoever waits
/// for a stage is woken once it is reached.
#[derive(Debug, Default)]
struct StartUp {
    /// 1 once the core holds its partitions, groups and transactions ([`Core::mark_opened`]).
    opened: OffsetMonitor,
    /// How many cores have registered their open transactions again after the start.
    transactions_registered: OffsetMonitor,
}

/// One core: what its requests need, reached through the sub-structs (`cluster`, `reads`,
/// `security`, `metrics`) and the methods below.
#[derive(Debug)]
pub struct Core {
    id: usize,
    cores: usize,
    config: Rc<BrokerConfig>,
    pub cluster: Cluster,
    topics: RefCell<Rc<TopicTable>>,
    /// The table's topic names by id, installed with it.
    topic_ids: RefCell<TopicIds>,
    /// Owned partitions by topic, then index (looked up by `&str`, with no allocation per request).
    partitions: RefCell<HashMap<String, HashMap<i32, Rc<Partition>>>>,
    /// Table changes are applied one at a time (start-up, broadcasts): two applies must not open
    /// the same partition twice.
    applying: glommio::sync::Semaphore,
    pub reads: ReadPath,
    mesh: Mesh,
    /// The front end's counters.
    pub metrics: FrontEndStats,
    queues: TaskQueues,
    /// The consumer groups this core coordinates and their committed offsets.
    groups: crate::groups::Coordinator,
    /// The transactional ids this core coordinates.
    transactions: crate::transactions::coordinator::TxnCoordinator,
    /// Moves from 0 to 1 when the server is asked to stop.
    shutdown: OffsetMonitor,
    /// How far this core and the others have come since the process started.
    start_up: StartUp,
    /// The partitions this core owns and is still opening.
    opening: crate::cores::opening::OpenQueue,
    pub security: Security,
    /// Edge mode: the upstream cluster as this core sees it, and its partitions' fetchers.
    edge: Option<Rc<crate::edge::EdgeCore>>,
    /// Read replicas: this core's partitions fed to other cores, the replicas it holds of
    /// theirs, and where consumers are steered.
    pub replicas: Replicas,
    /// The HTTP stream front end's counters.
    pub http: crate::stats::http::HttpStats,
    /// Where stream connections other cores hand to this one go: the HTTP front end's inbox on
    /// this core, once it serves.
    stream_inbox: RefCell<Option<LocalSender<HandedStream>>>,
}

impl Core {
    pub fn new(id: usize, config: Rc<BrokerConfig>, listeners: Vec<Listener>, mesh: Mesh) -> Self {
        let cores = listeners[0].ports.len();
        let shutdown = OffsetMonitor::new(0);
        let edge = config
            .edge
            .clone()
            .map(|c| Rc::new(crate::edge::EdgeCore::new(id, c, shutdown.clone())));
        Self {
            edge,
            id,
            cores,
            cluster: Cluster {
                listeners,
                advertised_host: config.advertised_host.clone(),
            },
            reads: ReadPath {
                tail_cache: Rc::new(TailCache::new(config.tail_cache_bytes, 1 << 20)),
                coalescer: FetchCoalescer::new(config.fetch_cache_bytes, config.fetch_coalescing),
                response_memory: ResponseMemory::new(config.fetch_response_budget_bytes),
                views: ViewReaders::new(config.views),
                load: Rc::new(CoreLoad::new(config.fetch_pacing)),
                sessions: RefCell::new(FetchSessions::new(config.fetch_sessions)),
            },
            groups: crate::groups::Coordinator::new(id, cores, config.groups),
            transactions: crate::transactions::coordinator::TxnCoordinator::new(
                id,
                cores,
                config.transactions,
            ),
            replicas: Replicas::new(id, cores, config.replicas),
            queues: TaskQueues::create(),
            security: Security {
                users: crate::auth::users::users(&config.data_dir),
                tokens: crate::auth::tokens::tokens(&config.data_dir),
                auth_failures: Default::default(),
                tls: config
                    .auth
                    .tls
                    .as_ref()
                    .map(crate::auth::tls::server_config),
                kernel_tls: Cell::new(
                    config.auth.tls.as_ref().is_some_and(|t| t.kernel)
                        && crate::wire::ktls::available(),
                ),
            },
            config,
            topics: RefCell::new(Rc::new(TopicTable::default())),
            topic_ids: RefCell::new(TopicIds::default()),
            partitions: RefCell::new(HashMap::new()),
            applying: glommio::sync::Semaphore::new(1),
            mesh,
            metrics: FrontEndStats::default(),
            shutdown,
            start_up: StartUp::default(),
            opening: Default::default(),
            http: Default::default(),
            stream_inbox: RefCell::new(None),
        }
    }

    /// Installs this core's inbox of stream connections handed over by other cores.
    pub fn serve_handed_streams(&self, inbox: LocalSender<HandedStream>) {
        *self.stream_inbox.borrow_mut() = Some(inbox);
    }

    /// A stream connection another core handed to this one: into the HTTP front end's inbox; or,
    /// when this core serves no streams (yet) or its inbox is full, answered 503 and closed.
    pub fn take_handed_stream(&self, stream: HandedStream) {
        let refused = match &*self.stream_inbox.borrow() {
            Some(inbox) => inbox.try_send(stream).err().map(|e| match e {
                glommio::GlommioError::Closed(glommio::ResourceType::Channel(s))
                | glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(s)) => s,
                _ => unreachable!("a local channel's send fails with its item"),
            }),
            None => Some(stream),
        };
        if let Some(stream) = refused {
            // A few bytes on a fresh connection: the socket takes them at once, or they are lost
            // with it.
            let mut socket = std::net::TcpStream::from(stream.fd);
            let _ = std::io::Write::write_all(
                &mut socket,
                b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\
                  Connection: close\r\n\r\n",
            );
        }
    }

    /// This core's id: its broker id (node_id) in Metadata.
    pub fn id(&self) -> usize {
        self.id
    }
    /// How many cores (brokers) the server runs.
    pub fn cores(&self) -> usize {
        self.cores
    }
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }
    /// This core's copy of the topic table (topics, ACLs), as last broadcast.
    pub fn topics(&self) -> Rc<TopicTable> {
        self.topics.borrow().clone()
    }
    /// The name of the topic (or view) with this id in this core's copy of the topic table.
    pub fn topic_name(&self, id: &[u8; 16]) -> Option<kafka_protocol::protocol::StrBytes> {
        self.topic_ids.borrow().name(id)
    }
    /// This core's end of the channels to the other cores.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }
    /// The task queues its request handlers run in.
    pub fn queues(&self) -> &TaskQueues {
        &self.queues
    }
    /// The consumer groups this core coordinates.
    pub fn groups(&self) -> &crate::groups::Coordinator {
        &self.groups
    }
    /// The transactional ids this core coordinates.
    pub fn transactions(&self) -> &crate::transactions::coordinator::TxnCoordinator {
        &self.transactions
    }

    /// Moves from 0 to 1 when the server is asked to stop.
    pub fn shutdown(&self) -> &OffsetMonitor {
        &self.shutdown
    }

    /// `work`'s output, or `None` once the server is asked to stop.
    pub async fn until_stopping<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        self.shutdown.unless_reached(1, work).await
    }

    /// Sleeps for `d`; `false` if the server is asked to stop first.
    pub async fn pause(&self, d: Duration) -> bool {
        self.until_stopping(glommio::timer::sleep(d))
            .await
            .is_some()
    }

    /// This core has opened the partitions of the table it started with and loaded its groups'
    /// offsets and its transactions: from now on a partition it owns but does not hold could not
    /// be opened, rather than not opened yet.
    pub fn mark_opened(&self) {
        self.start_up.opened.advance(1);
    }

    /// Waits until [`Core::mark_opened`]; `false` if the core stops first. What other cores ask
    /// of its partitions, groups or transactions waits here at start.
    pub async fn until_opened(&self) -> bool {
        if self.start_up.opened.value() >= 1 {
            return true;
        }
        let opened = self.start_up.opened.wait_for(1);
        self.until_stopping(opened).await.unwrap_or(false)
    }

    /// One more core (this one or another) has registered its open transactions' partitions
    /// again with their owners after the start (or found none).
    pub fn transactions_registered_by(&self, core: usize) {
        log::debug!(
            "core {}: core {core} has registered its open transactions",
            self.id
        );
        let registered = &self.start_up.transactions_registered;
        registered.advance(registered.value() + 1);
    }

    /// Waits, up to `limit`, until every core has registered its open transactions again after
    /// the start, so that a transactional batch is never refused for a registration a restart
    /// forgot and its coordinator has not made again yet. Returns at once after that.
    pub async fn until_transactions_registered(&self, limit: Duration) {
        let all = self.cores as i64;
        let registered = &self.start_up.transactions_registered;
        if registered.value() >= all {
            return;
        }
        let waited = futures_lite::future::or(registered.wait_for(all), async {
            glommio::timer::sleep(limit).await;
            false
        });
        if self.until_stopping(waited).await != Some(true) {
            log::warn!(
                "core {}: open transactions are not registered again on every core after {} ms; \
                 a transactional batch is checked against what is",
                self.id,
                limit.as_millis()
            );
        }
    }
    /// Edge mode's upstream, as this core sees it; `None` for `shoal serve`.
    pub fn upstream(&self) -> Option<&Rc<crate::edge::EdgeCore>> {
        self.edge.as_ref()
    }

    /// Whether this core runs in edge mode (`shoal edge`).
    pub fn is_edge(&self) -> bool {
        self.edge.is_some()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.value() > 0
    }

    /// The partition if this core owns it.
    pub fn partition(&self, topic: &str, index: i32) -> Option<Rc<Partition>> {
        self.partitions.borrow().get(topic)?.get(&index).cloned()
    }

    /// The partition serving `topic`/`index` on this core, with the view if `topic` names one (then
    /// the partition is the view's source), or the error a request for it gets.
    pub fn local_partition(
        &self,
        topic: &str,
        index: i32,
    ) -> Result<(Rc<Partition>, Option<ViewName>), ResponseError> {
        let view = match parse_view_name(topic) {
            Some(Err(_)) => return Err(ResponseError::InvalidTopicException),
            Some(Ok(v)) => Some(v),
            None => None,
        };
        let source = view.as_ref().map_or(topic, |v| v.source.as_str());
        match self.partition(source, index) {
            Some(p) => Ok((p, view)),
            None if self.owner(source, index).is_some() => Err(ResponseError::NotLeaderOrFollower),
            None => Err(ResponseError::UnknownTopicOrPartition),
        }
    }

    /// [`Core::local_partition`] for a consumer's fetch: also a read replica this core holds of
    /// another core's partition.
    pub fn fetch_partition(
        &self,
        topic: &str,
        index: i32,
    ) -> Result<(Rc<Partition>, Option<ViewName>), ResponseError> {
        match self.local_partition(topic, index) {
            Err(ResponseError::NotLeaderOrFollower) => {
                let view = parse_view_name(topic).and_then(Result::ok);
                let source = view.as_ref().map_or(topic, |v| v.source.as_str());
                self.replicas
                    .held(source, index)
                    .map(|p| (p, view))
                    .ok_or(ResponseError::NotLeaderOrFollower)
            }
            other => other,
        }
    }

    /// Which core owns the partition holding the data of `name`'s partition `index` (a view's:
    /// its source's), if both exist.
    pub fn data_owner(&self, name: &str, index: i32) -> Option<usize> {
        self.owner(crate::table::source_topic(name)?, index)
    }

    /// Which core owns a partition, if the topic and partition exist.
    pub fn owner(&self, topic: &str, index: i32) -> Option<usize> {
        let table = self.topics.borrow();
        let meta = table.get(topic)?;
        (0..meta.partitions)
            .contains(&index)
            .then(|| table.owner(meta, index, self.cores))
    }

    /// Installs a new topic table: deletes partitions of topics that are gone (or were re-created),
    /// opens the ones this core now owns, and gives changed topic configs to their partitions. A
    /// topic the previous table had the same, with its partitions here all open, is not visited: a
    /// change costs what it changed, not what the table holds.
    pub async fn apply_table(&self, table: TopicTable) {
        let Ok(_one_at_a_time) = self.applying.acquire_permit(1).await else {
            return;
        };
        if table.revision < self.topics.borrow().revision {
            return;
        }
        let table = Rc::new(table);
        let previous = std::mem::replace(&mut *self.topics.borrow_mut(), table.clone());
        *self.topic_ids.borrow_mut() = TopicIds::of(&table);
        let gone: Vec<Rc<Partition>> = {
            let mut topics = self.partitions.borrow_mut();
            let mut gone = Vec::new();
            topics.retain(|name, parts| {
                let keep = parts
                    .values()
                    .next()
                    .is_some_and(|p| table.get(name).is_some_and(|m| m.id == p.topic_id));
                if !keep {
                    gone.extend(parts.drain().map(|(_, p)| p));
                }
                keep
            });
            gone
        };
        for p in &gone {
            self.replicas.forget_owned(p.log.id());
        }
        // Replicas of topics gone or re-created are dropped (their owners stop feeding them too).
        let gone = gone.into_iter().chain(self.replicas.drop_gone(|topic, id| {
            table
                .get(topic)
                .is_some_and(|m| id.is_none_or(|id| *id == m.id))
        }));
        for p in gone {
            // Requests still holding it get `Closed` (NOT_LEADER_OR_FOLLOWER) from now on.
            self.reads.views.forget(p.log.id());
            if let Err(e) = p.delete().await {
                log::error!("deleting partition {}-{}: {e}", p.topic, p.index);
            }
        }
        let mut to_open = Vec::new();
        for (topic, meta) in &table.topics {
            let owned: Vec<i32> = (0..meta.partitions)
                .filter(|&p| table.owner(meta, p, self.cores) == self.id)
                .collect();
            let open = self.partitions.borrow().get(topic).map_or(0, HashMap::len);
            if owned.is_empty() || (previous.get(topic) == Some(meta) && open == owned.len()) {
                continue;
            }
            let config = apply_topic_configs(&self.config.log, &meta.configs).unwrap_or_else(|e| {
                log::warn!("topic {topic}: {e}; using server defaults");
                self.config.log.clone()
            });
            for index in owned {
                if let Some(p) = self.partition(topic, index) {
                    // Changed topic configs (AlterConfigs) apply from the partition's next append
                    // or check, without reopening it.
                    self.replicas.set_log_config(p.log.id(), &config);
                    p.log.set_config(config.clone());
                    continue;
                }
                to_open.push((topic.clone(), index, meta.id, config.clone()));
            }
        }
        self.open_partitions(to_open).await;
    }

    /// Opens partitions (recovering their logs) [`OPEN_AT_ONCE`] at a time, so that their I/O
    /// overlaps, those requests wait for first (see [`crate::cores::opening`]); each is served
    /// as soon as it is open.
    async fn open_partitions(&self, to_open: Vec<crate::cores::opening::ToOpen>) {
        self.opening.push(to_open);
        let worker = || async {
            while let Some((topic, index, id, config)) = self.opening.next() {
                let (dir, producers) = (&self.config.data_dir, self.config.producers);
                let cache = self.reads.tail_cache.clone();
                match Partition::open(dir, &topic, index, id, config, producers, cache).await {
                    Ok(p) => {
                        self.partitions
                            .borrow_mut()
                            .entry(topic.clone())
                            .or_default()
                            .insert(index, Rc::new(p));
                    }
                    Err(e) => log::error!(
                        "core {}: cannot open partition {topic}-{index}: {e}",
                        self.id
                    ),
                }
                self.opening.done(&topic, index);
            }
        };
        join_all((0..OPEN_AT_ONCE).map(|_| worker())).await;
    }

    /// Waits until none of `partitions` (topic, index; a view's are its source's) is still being
    /// opened by this core, having them opened first; at once when none is. At most
    /// [`crate::cores::opening::OPEN_WAIT`].
    pub async fn wait_opening(&self, partitions: impl Iterator<Item = (String, i32)>) {
        if self.opening.is_busy() {
            self.opening.wait_for(sources(partitions)).await;
        }
    }

    /// Closes every partition cleanly (flush, clean marks, producer snapshots), and the replicas
    /// this core holds.
    pub async fn close_partitions(&self) {
        let parts: Vec<Rc<Partition>> = self
            .partitions
            .borrow_mut()
            .drain()
            .flat_map(|(_, parts)| parts.into_values())
            .chain(self.replicas.take_held())
            .collect();
        // [`OPEN_AT_ONCE`] at a time: each close ends in fsyncs (index, producer snapshot).
        let parts = RefCell::new(parts);
        let worker = || async {
            loop {
                let Some(p) = parts.borrow_mut().pop() else {
                    break;
                };
                if let Err(e) = p.close().await {
                    log::error!("closing partition {}-{}: {e}", p.topic, p.index);
                }
            }
        };
        join_all((0..OPEN_AT_ONCE).map(|_| worker())).await;
    }

    /// The live settings in effect on this core, in the order the admin API lists them.
    pub fn settings(&self) -> Vec<crate::cores::mesh::Setting> {
        use crate::cores::mesh::Setting;
        let views = self.reads.views.config();
        vec![
            Setting::FetchCoalescing(self.reads.coalescer.is_enabled()),
            Setting::ViewSharing(views.shared),
            Setting::MaxDeltaForFanout(views.max_delta_for_fanout),
            Setting::ReadReplicas(self.replicas.config().policy),
            Setting::GroupLagInterval(self.groups.lag().config().interval),
        ]
    }

    pub fn apply_setting(&self, setting: crate::cores::mesh::Setting) {
        match setting {
            crate::cores::mesh::Setting::ViewSharing(shared) => {
                self.reads
                    .views
                    .set_config(shards::view_reader::ViewConfig {
                        shared,
                        ..self.reads.views.config()
                    })
            }
            crate::cores::mesh::Setting::MaxDeltaForFanout(delta) => {
                self.reads
                    .views
                    .set_config(shards::view_reader::ViewConfig {
                        max_delta_for_fanout: delta.max(0),
                        ..self.reads.views.config()
                    })
            }
            crate::cores::mesh::Setting::ReadReplicas(policy) => self.replicas.set_policy(policy),
            crate::cores::mesh::Setting::GroupLagInterval(interval) => {
                self.groups.lag().set_interval(interval)
            }
            crate::cores::mesh::Setting::FetchCoalescing(on) => {
                if on != self.reads.coalescer.is_enabled() {
                    log::info!(
                        "core {}: fetch coalescing {}",
                        self.id,
                        if on { "on" } else { "off" }
                    );
                }
                self.reads.coalescer.set_enabled(on);
            }
        }
    }

    /// A read replica message from another core, handled as it arrives (in order).
    pub fn receive_replica(&self, msg: ReplicaMsg) {
        if let ReplicaMsg::Want {
            topic,
            partition,
            from,
        } = &msg
        {
            if let Some(p) = self.partition(topic, *partition) {
                self.replicas
                    .want(&p, *from, self.replica_policy(&self.topics(), topic));
            }
            return;
        }
        // Edge mode: a partition whose consumers read its replicas stays fed from upstream here.
        if let (
            Some(edge),
            ReplicaMsg::Load {
                of, connections, ..
            },
        ) = (&self.edge, &msg)
        {
            if let Some(p) = self
                .partition(&of.topic, of.partition)
                .filter(|_| *connections > 0)
            {
                let until = std::time::Instant::now() + 3 * crate::replicas::TICK;
                edge.want(&p.log, &p.topic, p.index, p.log.high_watermark(), until);
            }
        }
        if let Some(gone) = self.replicas.receive(msg, &self.reads.tail_cache) {
            self.reads.views.forget(gone.log.id());
            glommio::spawn_local(async move {
                let _ = gone.close().await;
            })
            .detach();
        }
    }

    /// Every [`crate::replicas::TICK`]: each partition this core owns gets the read replicas its
    /// topic's policy asks for now, and the replicas this core holds report their load.
    pub fn tick_replicas(&self) {
        let now = std::time::Instant::now();
        let busy = self.reads.load.busy();
        let table = self.topics();
        for p in self.owned_partitions() {
            let policy = self.replica_policy(&table, &p.topic);
            self.replicas.evaluate(&p, policy, busy, now);
        }
        self.replicas.report(busy, now);
    }

    /// The read replica policy of `topic`: its `shoal.read.replicas` config, else the server's.
    pub fn replica_policy(&self, table: &TopicTable, topic: &str) -> ReplicaPolicy {
        table
            .get(topic)
            .and_then(|m| ReplicaPolicy::of_topic(&m.configs))
            .unwrap_or(self.replicas.config().policy)
    }

    /// Every partition this core owns (not the read replicas it holds), in no order.
    pub fn owned_partitions(&self) -> Vec<Rc<Partition>> {
        self.partitions
            .borrow()
            .values()
            .flat_map(|parts| parts.values().cloned())
            .collect()
    }

    /// The core's figures; with `partitions`, each partition's too (the costly part with many:
    /// the console's charts go without).
    pub fn snapshot(&self, partitions: bool) -> CoreSnapshot {
        let mut partitions: Vec<PartitionSnapshot> = self
            .partitions
            .borrow()
            .values()
            .filter(|_| partitions)
            .flat_map(HashMap::values)
            .map(|p| {
                let s = p.log.stats();
                PartitionSnapshot {
                    topic: p.topic.clone(),
                    partition: p.index,
                    high_watermark: p.log.high_watermark(),
                    last_stable_offset: p.log.last_stable_offset(),
                    log_start_offset: p.log.log_start_offset(),
                    size_bytes: s.size_bytes,
                    segments: s.segments,
                    storage_failure: p.log.storage_failure(),
                    producer_ids: p.producer_ids() as u64,
                    open_transactions: p.log.open_transaction_count() as u64,
                    appended_bytes: s.appended_bytes,
                    writes: s.append_writes,
                    fsyncs: s.fsyncs,
                    compactions: s.compactions,
                    compacted_bytes: s.compaction_read_bytes,
                    compacted_to_bytes: s.compaction_written_bytes,
                    first_dirty_offset: p.log.first_dirty_offset(),
                    upstream: self.edge.as_ref().and_then(|e| e.feed_status(p.log.id())),
                }
            })
            .collect();
        partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        CoreSnapshot {
            core: self.id,
            kafka: self.metrics.snapshot(),
            http: self.http.snapshot(),
            device: shards::device_latency(),
            storage: shards::storage_health(),
            tail_cache: self.reads.tail_cache.stats(),
            open_files: shards::open_files(),
            coalescing: self.reads.coalescer.is_enabled(),
            coalescer: self.reads.coalescer.stats(),
            view_sharing: self.reads.views.config().shared,
            views: self.reads.views.stats(),
            response_memory_bytes: self.reads.response_memory.used() as u64,
            fetch_pacing_delay_us: self.reads.load.delay().as_micros() as u64,
            busy_percent: (self.reads.load.busy() * 100.0).round() as u64,
            groups: self.groups.stats(),
            transactions: self.transactions.stats(),
            group_lag: self.groups.lag().latest(),
            group_list: self.groups.summaries(),
            partitions,
            replicas: self.replicas.stats(std::time::Instant::now()),
            edge: self.edge.as_ref().map(|e| e.stats()),
        }
    }
}
