//! Consumer groups: the per-core group coordinator.
//!
//! ## Layout, top layer first
//! - [`lag`]     — consumer group lag computed from committed offsets and partitions' ends, the
//!   latest figures kept for the statistics, and their `/metrics` families.
//! - `reshard`   — moving committed offsets when `--cores` changes ([`reshard()`]).
//! - `consumer_coordinator` — the coordinator's consumer-protocol groups: heartbeats, a group's
//!   move between the protocols, their checks of offset commits and fetches.
//! - [`offsets`] — committed offsets and pending transactional ones: in memory, durable in an
//!   internal log per core, compacted.
//! - `stats`     — what the coordinator reports ([`GroupStats`]) and its `/metrics` families.
//! - [`group`]   — one group's state machine (Kafka's classic protocol), pure and synchronous.
//! - [`consumer`] — one group of the consumer group protocol (KIP-848): epochs, server-side
//!   assignors, reconciliation; pure and synchronous.
//!
//! Design notes: `docs/groups.md`.

pub mod consumer;
mod consumer_coordinator;
pub mod group;
pub mod lag;
pub mod offsets;
mod reshard;
mod stats;
#[cfg(test)]
pub(crate) mod testing;

use group::{
    Answer, Group, GroupConfig, GroupState, JoinAnswer, JoinRequest, SyncAnswer, SyncRequest,
};
use kafka_protocol::error::ResponseError;
use offsets::{Committed, OffsetStore, PendingOffset, TopicPartition};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

pub use reshard::reshard;
pub use stats::{GroupStats, GroupSummary};

/// One group as ListGroups lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub protocol_type: String,
    pub state: &'static str,
    /// A group of the consumer group protocol (type `consumer`), else `classic`.
    pub consumer_protocol: bool,
}

/// How often each core checks its groups' deadlines.
pub const TICK: Duration = Duration::from_millis(50);

/// Largest `committed_metadata` string accepted (Kafka `offset.metadata.max.bytes`).
pub const MAX_OFFSET_METADATA_BYTES: usize = 4096;

/// Largest protocol metadata or assignment blob a member may send; larger ones are refused before
/// they are copied (the request's bytes are only sliced, never allocated by a claimed length).
pub const MAX_MEMBER_BLOB_BYTES: usize = 1 << 20;

/// The core that coordinates `group_id` among `cores`.
pub fn coordinator_core(group_id: &str, cores: usize) -> usize {
    (shards::partitioner::murmur2(group_id.as_bytes()) & 0x7fff_ffff) as usize % cores.max(1)
}

/// Where core `core`'s committed offsets live.
pub fn store_dir(data_dir: &Path, core: usize) -> PathBuf {
    data_dir.join("__groups").join(format!("core-{core}"))
}

/// Settings from the command line.
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorConfig {
    pub initial_rebalance_delay: Duration,
    pub min_session_timeout: Duration,
    pub max_session_timeout: Duration,
    /// Compact a core's offsets log once it holds at least this many records (and more than twice
    /// the live ones).
    pub compact_min_records: u64,
    pub lag: lag::LagConfig,
    /// Groups of the consumer group protocol.
    pub consumer: consumer::ConsumerConfig,
}

/// One core's groups and their committed offsets.
#[derive(Debug)]
pub struct Coordinator {
    core: usize,
    cores: usize,
    pub config: CoordinatorConfig,
    groups: RefCell<HashMap<String, Group>>,
    /// Groups of the consumer group protocol (never the id of one in `groups`).
    consumer: RefCell<HashMap<String, consumer::ConsumerGroup>>,
    /// Where a clean stop saves the consumer-protocol groups (set once the store is loaded).
    saved_path: RefCell<Option<PathBuf>>,
    /// Groups the tick must visit: those that are not idle (see [`Coordinator::tick`]).
    active: RefCell<HashSet<String>>,
    offsets: RefCell<Option<Rc<OffsetStore>>>,
    /// Rebalances of groups since forgotten (live groups count their own).
    retired_rebalances: Cell<u64>,
    offset_commits: Cell<u64>,
    /// Set by [`Coordinator::stop`]: no new JoinGroup or SyncGroup may wait.
    stopped: Cell<bool>,
    /// The groups' lag as last computed (by `crate::cores::group_lag`).
    lag: lag::LagFigures,
}

impl Coordinator {
    pub fn new(core: usize, cores: usize, config: CoordinatorConfig) -> Self {
        Coordinator {
            core,
            cores,
            config,
            groups: RefCell::new(HashMap::new()),
            consumer: RefCell::new(HashMap::new()),
            saved_path: RefCell::new(None),
            active: RefCell::new(HashSet::new()),
            offsets: RefCell::new(None),
            retired_rebalances: Cell::new(0),
            offset_commits: Cell::new(0),
            stopped: Cell::new(false),
            lag: lag::LagFigures::new(config.lag),
        }
    }

    /// Opens this core's offset store and creates an (empty) group for every group with offsets.
    pub async fn load(&self, data_dir: &Path, cache: Rc<shards::TailCache>) -> Result<(), String> {
        let store = OffsetStore::open(
            &store_dir(data_dir, self.core),
            cache,
            self.config.compact_min_records,
        )
        .await?;
        // Offsets of groups another core coordinates are stale copies (a reshard that crashed
        // before dropping them): dropped, so no later reshard can prefer them to the live ones.
        for g in store.groups() {
            let owner = coordinator_core(&g, self.cores);
            if owner != self.core {
                log::warn!(
                    "core {}: dropping a stale copy of the offsets of group {g} (core {owner} \
                     coordinates it)",
                    self.core
                );
                store.delete_group(&g).await?;
            }
        }
        let now = Instant::now();
        let mut groups = self.groups.borrow_mut();
        for g in store.groups() {
            groups
                .entry(g.clone())
                .or_insert_with(|| Group::new(&g, self.group_config(), now));
        }
        drop(groups);
        *self.offsets.borrow_mut() = Some(Rc::new(store));
        self.load_consumer_groups(&store_dir(data_dir, self.core));
        Ok(())
    }

    fn group_config(&self) -> GroupConfig {
        GroupConfig {
            initial_rebalance_delay: self.config.initial_rebalance_delay,
        }
    }

    /// `NOT_COORDINATOR` unless this core coordinates `group_id` (which may be empty: OffsetCommit,
    /// OffsetFetch, DescribeGroups and DeleteGroups accept the empty group id, as Kafka does).
    pub fn check(&self, group_id: &str) -> Result<(), ResponseError> {
        if coordinator_core(group_id, self.cores) != self.core {
            return Err(ResponseError::NotCoordinator);
        }
        if self.offsets.borrow().is_none() {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        Ok(())
    }

    /// [`Self::check`] for the membership APIs (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), which
    /// refuse the empty group id with `INVALID_GROUP_ID`.
    fn check_membership(&self, group_id: &str) -> Result<(), ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        self.check(group_id)
    }

    fn store(&self) -> Result<Rc<OffsetStore>, ResponseError> {
        self.offsets
            .borrow()
            .clone()
            .ok_or(ResponseError::CoordinatorNotAvailable)
    }

    pub fn join(&self, group_id: &str, req: JoinRequest) -> Answer<JoinAnswer> {
        let error = |e: ResponseError| {
            Answer::Now(JoinAnswer {
                error: Some(e),
                generation: -1,
                protocol_type: None,
                protocol_name: None,
                leader: String::new(),
                member_id: req.member_id.clone(),
                members: Vec::new(),
                skip_assignment: false,
            })
        };
        if self.stopped.get() {
            return error(ResponseError::NotCoordinator);
        }
        if let Err(e) = self
            .check_membership(group_id)
            .and_then(|()| self.classic_join_allowed(group_id))
        {
            return error(e);
        }
        if req.session_timeout < self.config.min_session_timeout
            || req.session_timeout > self.config.max_session_timeout
        {
            return error(ResponseError::InvalidSessionTimeout);
        }
        let now = Instant::now();
        let mut groups = self.groups.borrow_mut();
        if !groups.contains_key(group_id) {
            if !req.member_id.is_empty() {
                return error(ResponseError::UnknownMemberId);
            }
            groups.insert(
                group_id.to_string(),
                Group::new(group_id, self.group_config(), now),
            );
        }
        let answer = groups.get_mut(group_id).expect("present").join(req, now);
        drop(groups);
        self.mark_active(group_id);
        answer
    }

    pub fn sync(&self, group_id: &str, req: SyncRequest) -> Answer<SyncAnswer> {
        let error = |e: ResponseError| {
            Answer::Now(SyncAnswer {
                error: Some(e),
                protocol_type: None,
                protocol_name: None,
                assignment: bytes::Bytes::new(),
            })
        };
        if self.stopped.get() {
            return error(ResponseError::NotCoordinator);
        }
        if let Err(e) = self.check_membership(group_id) {
            return error(e);
        }
        match self.groups.borrow_mut().get_mut(group_id) {
            Some(g) => g.sync(req, Instant::now()),
            None => error(ResponseError::UnknownMemberId),
        }
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Option<ResponseError> {
        if let Err(e) = self.check_membership(group_id) {
            return Some(e);
        }
        match self.groups.borrow_mut().get_mut(group_id) {
            Some(g) => g.heartbeat(member_id, instance, generation, Instant::now()),
            None => Some(ResponseError::UnknownMemberId),
        }
    }

    /// LeaveGroup: per member (member id, instance id), its error.
    pub fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        self.check_membership(group_id)?;
        let now = Instant::now();
        let mut groups = self.groups.borrow_mut();
        let Some(g) = groups.get_mut(group_id) else {
            return Ok(vec![Some(ResponseError::UnknownMemberId); members.len()]);
        };
        Ok(members
            .iter()
            .map(|(id, instance)| g.leave(id, instance.as_deref(), now))
            .collect())
    }

    /// Whether a commit from this member is allowed now; creates the group for a simple commit.
    pub fn check_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<Rc<OffsetStore>, ResponseError> {
        self.check(group_id)?;
        let store = self.store()?;
        if let Some(checked) = self.consumer_commit_check(group_id, member_id, generation) {
            return checked.map(|()| store);
        }
        let now = Instant::now();
        let mut groups = self.groups.borrow_mut();
        match groups.get_mut(group_id) {
            Some(g) => g.check_commit(member_id, instance, generation, now)?,
            None if generation < 0 => {
                groups.insert(
                    group_id.to_string(),
                    Group::new(group_id, self.group_config(), now),
                );
                drop(groups);
                // Forgotten by the tick if the commit fails and leaves it without offsets.
                self.mark_active(group_id);
            }
            None => return Err(ResponseError::IllegalGeneration),
        }
        Ok(store)
    }

    /// Writes a commit's offsets (already checked) durably. The write is in flight for the group
    /// from the first poll (see [`OffsetStore::settled`]), so the caller must await this at once,
    /// in the same poll as the check.
    pub async fn commit(
        &self,
        store: &OffsetStore,
        group_id: &str,
        offsets: Vec<(TopicPartition, Committed)>,
    ) -> Result<(), ResponseError> {
        let n = offsets.len() as u64;
        let changes = offsets.into_iter().map(|(tp, c)| (tp, Some(c))).collect();
        match store.write(group_id, changes).await {
            Ok(()) => {
                self.offset_commits.set(self.offset_commits.get() + n);
                Ok(())
            }
            Err(e) => {
                log::error!("core {}: committing offsets of {group_id}: {e}", self.core);
                Err(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// Whether a TxnOffsetCommit of this member and producer is allowed now (see
    /// [`Group::check_txn_commit`]); creates the group if it has none, as a simple commit does. A
    /// producer epoch older than that of the producer's pending offsets of the group is a zombie's
    /// and gets `INVALID_PRODUCER_EPOCH`, so it cannot replace offsets that a marker of the newer
    /// epoch would commit.
    pub fn check_txn_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
        producer: (i64, i16),
    ) -> Result<Rc<OffsetStore>, ResponseError> {
        self.check(group_id)?;
        let store = self.store()?;
        let (producer_id, producer_epoch) = producer;
        if producer_id < 0 || producer_epoch < 0 {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if let Some(checked) = self.consumer_txn_commit_check(group_id, member_id, generation) {
            checked?;
            let newer = store.pending_epoch(group_id, producer_id);
            if newer.is_some_and(|e| e > producer_epoch) {
                return Err(ResponseError::InvalidProducerEpoch);
            }
            return Ok(store);
        }
        let now = Instant::now();
        let mut groups = self.groups.borrow_mut();
        let g = match groups.entry(group_id.to_string()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let g = e.insert(Group::new(group_id, self.group_config(), now));
                // Forgotten by the tick if the check or the write fails and leaves it empty.
                self.mark_active(group_id);
                g
            }
        };
        g.check_txn_commit(member_id, instance, generation, now)?;
        if store
            .pending_epoch(group_id, producer_id)
            .is_some_and(|e| e > producer_epoch)
        {
            return Err(ResponseError::InvalidProducerEpoch);
        }
        Ok(store)
    }

    /// Writes a TxnOffsetCommit's offsets (already checked) durably as pending offsets of the
    /// producer. Like [`Self::commit`], the caller awaits it in the same poll as the check.
    pub async fn txn_commit(
        &self,
        store: &OffsetStore,
        group_id: &str,
        producer_id: i64,
        offsets: Vec<(TopicPartition, PendingOffset)>,
    ) -> Result<(), ResponseError> {
        let changes = offsets
            .into_iter()
            .map(|(tp, p)| (producer_id, tp, Some(p)))
            .collect();
        store.write_pending(group_id, changes).await.map_err(|e| {
            log::error!(
                "core {}: writing transactional offsets of {group_id}: {e}",
                self.core
            );
            ResponseError::CoordinatorNotAvailable
        })
    }

    /// Ends a transaction of `producer_id` for `group_id` (the transaction coordinator's marker,
    /// run on this core, the group's coordinator): on commit, its pending offsets become the
    /// group's committed offsets; on abort they are dropped; both in one durable append. Pending
    /// offsets written at a newer epoch than `producer_epoch` are left alone (a stale marker:
    /// logged, and Ok, as Kafka ignores them). Idempotent: with nothing pending it is Ok and
    /// writes nothing, so a coordinator's recovery may send it again. The group is created if
    /// this core has none (its committed offsets then show, as after a simple commit); a group
    /// being deleted is left to the delete, which drops its pending offsets.
    pub async fn end_transaction(
        &self,
        group_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<(), ResponseError> {
        self.check(group_id)?;
        let store = self.store()?;
        let live = || {
            if self.consumer.borrow().contains_key(group_id) {
                return true;
            }
            let mut groups = self.groups.borrow_mut();
            match groups.get(group_id) {
                Some(g) => g.state() != GroupState::Dead,
                None => {
                    let g = Group::new(group_id, self.group_config(), Instant::now());
                    groups.insert(group_id.to_string(), g);
                    // Forgotten by the tick if it is left without offsets.
                    self.mark_active(group_id);
                    true
                }
            }
        };
        let ended = store
            .end_transaction(group_id, producer_id, producer_epoch, commit, live)
            .await
            .map_err(|e| {
                log::error!(
                    "core {}: ending a transaction of producer {producer_id} for group \
                     {group_id}: {e}",
                    self.core
                );
                ResponseError::CoordinatorNotAvailable
            })?;
        if ended.newer_kept > 0 {
            log::warn!(
                "core {}: group {group_id}: a stale {} marker of producer {producer_id} (epoch \
                 {producer_epoch}) left {} pending offsets of a newer epoch",
                self.core,
                if commit { "commit" } else { "abort" },
                ended.newer_kept
            );
        }
        if commit {
            let n = ended.resolved as u64;
            self.offset_commits.set(self.offset_commits.get() + n);
        }
        Ok(())
    }

    /// Whether some producer's transaction holds a pending offset of the group for the
    /// partition (OffsetFetch with `require_stable` answers `UNSTABLE_OFFSET_COMMIT` for it).
    pub fn has_pending(&self, group_id: &str, topic: &str, partition: i32) -> bool {
        self.offsets
            .borrow()
            .as_ref()
            .is_some_and(|s| s.has_pending(group_id, topic, partition))
    }

    /// Waits until every commit of `group_id` begun before now has been applied, so a fetch sees
    /// the commits sent before it (Kafka runs a connection's requests one at a time). Commits to
    /// other groups are not waited for.
    pub async fn settled(&self, group_id: &str) {
        let store = self.offsets.borrow().clone();
        if let Some(store) = store {
            store.settled(group_id).await;
        }
    }

    /// A group's committed offset of one partition.
    pub fn fetch(&self, group_id: &str, topic: &str, partition: i32) -> Option<Committed> {
        self.offsets
            .borrow()
            .as_ref()?
            .get(group_id, topic, partition)
    }

    /// All of a group's committed offsets.
    pub fn fetch_all(&self, group_id: &str) -> Vec<(TopicPartition, Committed)> {
        self.offsets
            .borrow()
            .as_ref()
            .map(|s| s.group_offsets(group_id))
            .unwrap_or_default()
    }

    /// Every committed offset of every group, for the lag round: groups and partitions sorted.
    pub fn positions(&self) -> lag::Positions {
        let Some(store) = self.offsets.borrow().clone() else {
            return Vec::new();
        };
        let mut groups = store.groups();
        groups.sort();
        groups
            .into_iter()
            .map(|g| {
                let offsets = store.group_offsets(&g);
                let offsets = offsets.into_iter().map(|(tp, c)| (tp, c.offset));
                (g, offsets.filter(|(_, o)| *o >= 0).collect::<Vec<_>>())
            })
            .filter(|(_, offsets)| !offsets.is_empty())
            .collect()
    }

    /// The groups' lag as last computed, and its settings.
    pub fn lag(&self) -> &lag::LagFigures {
        &self.lag
    }

    /// Whether this core has the group (with members, or only offsets).
    pub fn exists(&self, group_id: &str) -> bool {
        self.groups.borrow().contains_key(group_id) || self.consumer.borrow().contains_key(group_id)
    }

    /// Every group of this core, by id.
    pub fn list(&self) -> Vec<Listed> {
        let mut v: Vec<Listed> = self
            .groups
            .borrow()
            .values()
            .map(|g| Listed {
                id: g.id.clone(),
                protocol_type: g.protocol_type().unwrap_or("").to_string(),
                state: g.state().name(),
                consumer_protocol: false,
            })
            .collect();
        v.extend(self.consumer.borrow().values().map(|g| Listed {
            id: g.id.clone(),
            protocol_type: "consumer".into(),
            state: g.state().name(),
            consumer_protocol: true,
        }));
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Each group here with its state and member count, by id.
    pub fn summaries(&self) -> Vec<GroupSummary> {
        let mut v: Vec<GroupSummary> = self
            .groups
            .borrow()
            .values()
            .map(|g| GroupSummary {
                group: g.id.clone(),
                state: g.state().name(),
                members: g.member_count() as u64,
                epoch: None,
            })
            .collect();
        v.extend(self.consumer.borrow().values().map(|g| GroupSummary {
            group: g.id.clone(),
            state: g.state().name(),
            members: g.member_count() as u64,
            epoch: Some(g.group_epoch),
        }));
        v.sort_by(|a, b| a.group.cmp(&b.group));
        v
    }

    /// Runs `f` on a group if this core has it.
    pub fn with_group<T>(&self, group_id: &str, f: impl FnOnce(&Group) -> T) -> Option<T> {
        self.groups.borrow().get(group_id).map(f)
    }

    /// DeleteGroups for one group: only a group without members; its offsets go with it.
    pub async fn delete(&self, group_id: &str) -> Result<(), ResponseError> {
        self.check(group_id)?;
        let store = self.store()?;
        let consumer_empty = self.consumer.borrow().get(group_id).map(|g| g.is_empty());
        match consumer_empty {
            Some(false) => return Err(ResponseError::NonEmptyGroup),
            Some(true) => {
                // An empty classic placeholder in its place: marked dead below, it refuses
                // commits while the offsets are deleted.
                let g = self
                    .consumer
                    .borrow_mut()
                    .remove(group_id)
                    .expect("present");
                self.retired_rebalances
                    .set(self.retired_rebalances.get() + g.rebalances);
                let placeholder = Group::new(group_id, self.group_config(), Instant::now());
                self.groups
                    .borrow_mut()
                    .insert(group_id.to_string(), placeholder);
            }
            None => {}
        }
        {
            let mut groups = self.groups.borrow_mut();
            match groups.get_mut(group_id) {
                None if !store.has_group(group_id) => return Err(ResponseError::GroupIdNotFound),
                Some(g) if g.state() == GroupState::Dead => {
                    return Err(ResponseError::GroupIdNotFound)
                }
                Some(g) if g.state() != GroupState::Empty => {
                    return Err(ResponseError::NonEmptyGroup)
                }
                Some(g) => g.mark_dead(),
                None => {
                    // Known only by its offsets: a dead placeholder refuses commits (a simple
                    // commit would recreate the group) while they are deleted.
                    let mut g = Group::new(group_id, self.group_config(), Instant::now());
                    g.mark_dead();
                    groups.insert(group_id.to_string(), g);
                }
            }
        }
        let written = store.delete_group(group_id).await;
        self.lag.forget(group_id);
        let removed = self.groups.borrow_mut().remove(group_id);
        if let Some(g) = removed {
            self.retired_rebalances
                .set(self.retired_rebalances.get() + g.rebalances);
        }
        written.map_err(|e| {
            log::error!("core {}: deleting group {group_id}: {e}", self.core);
            ResponseError::CoordinatorNotAvailable
        })
    }

    /// OffsetDelete for one group: the committed offsets of `partitions` go, but those of topics
    /// the members subscribe to while the group has members (`GROUP_SUBSCRIBED_TO_TOPIC` each), as
    /// in Kafka. A group with members of another protocol type than `consumer` refuses it all
    /// (`NON_EMPTY_GROUP`); an unknown one is `GROUP_ID_NOT_FOUND`. Returns each partition's
    /// refusal, in order.
    pub async fn delete_offsets(
        &self,
        group_id: &str,
        partitions: Vec<TopicPartition>,
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        self.check(group_id)?;
        let store = self.store()?;
        let consumer =
            self.with_consumer_group(group_id, |g| (!g.is_empty()).then(|| g.subscribed_names()));
        let subscribed = if let Some(members) = consumer {
            members.unwrap_or_default()
        } else {
            let groups = self.groups.borrow();
            match groups.get(group_id) {
                None if !store.has_group(group_id) => return Err(ResponseError::GroupIdNotFound),
                None => HashSet::new(),
                Some(g) if g.state() == GroupState::Dead => {
                    return Err(ResponseError::GroupIdNotFound)
                }
                Some(g) if g.state() == GroupState::Empty => HashSet::new(),
                Some(g) if g.protocol_type() != Some("consumer") => {
                    return Err(ResponseError::NonEmptyGroup)
                }
                Some(g) => g.subscribed_topics(),
            }
        };
        let refusals: Vec<Option<ResponseError>> = partitions
            .iter()
            .map(|(t, _)| {
                subscribed
                    .contains(t)
                    .then_some(ResponseError::GroupSubscribedToTopic)
            })
            .collect();
        let changes = partitions
            .into_iter()
            .zip(&refusals)
            .filter(|(tp, refused)| refused.is_none() && store.get(group_id, &tp.0, tp.1).is_some())
            .map(|(tp, _)| (tp, None))
            .collect();
        store.write(group_id, changes).await.map_err(|e| {
            log::error!("core {}: deleting offsets of {group_id}: {e}", self.core);
            ResponseError::CoordinatorNotAvailable
        })?;
        Ok(refusals)
    }

    /// Checks the deadlines of the groups with members (or member ids handed out) and forgets
    /// those that became empty and have no offsets. Idle groups are not visited, so a core with
    /// many groups that only hold offsets pays nothing per tick for them.
    pub fn tick(&self) {
        let now = Instant::now();
        let store = self.offsets.borrow().clone();
        let writing = |id: &str| store.as_ref().is_some_and(|s| s.writing(id));
        let mut retired = 0;
        let consumer_ids: Vec<String> = {
            let consumer = self.consumer.borrow();
            let active = self.active.borrow();
            active
                .iter()
                .filter(|id| consumer.contains_key(*id))
                .cloned()
                .collect()
        };
        // A consumer group left without members is kept while it has offsets, like a classic one.
        for id in self.tick_consumer(&consumer_ids, now) {
            let kept = writing(&id) || store.as_ref().is_some_and(|s| s.has_group(&id));
            if !kept {
                retired += self
                    .consumer
                    .borrow_mut()
                    .remove(&id)
                    .map_or(0, |g| g.rebalances);
            }
        }
        let consumer = self.consumer.borrow();
        let mut groups = self.groups.borrow_mut();
        self.active.borrow_mut().retain(|id| {
            if let Some(g) = consumer.get(id) {
                return !g.is_empty() || writing(id);
            }
            let Some(g) = groups.get_mut(id) else {
                return false;
            };
            g.tick(now);
            if !g.is_idle() {
                return true;
            }
            match &store {
                // A commit (maybe the group's first) is being written: look again once it lands.
                Some(s) if s.writing(id) => return true,
                Some(s) if s.has_group(id) => {}
                _ => retired += groups.remove(id).map_or(0, |g| g.rebalances),
            }
            false
        });
        drop((groups, consumer));
        self.retired_rebalances
            .set(self.retired_rebalances.get() + retired);
        if let Some(store) = store.filter(|s| s.needs_compaction()) {
            glommio::spawn_local(async move { store.maybe_compact().await }).detach();
        }
    }

    /// Has the tick watch `group_id` (it has members, or may soon).
    fn mark_active(&self, group_id: &str) {
        if !self.active.borrow().contains(group_id) {
            self.active.borrow_mut().insert(group_id.to_string());
        }
    }

    /// Answers every waiting JoinGroup/SyncGroup: the core is stopping and clients must find the
    /// coordinator again.
    pub fn stop(&self) {
        self.stopped.set(true);
        for g in self.groups.borrow_mut().values_mut() {
            g.cancel_waiters(ResponseError::NotCoordinator);
        }
    }

    pub async fn close(&self) {
        self.save_consumer_groups().await;
        let store = self.offsets.borrow_mut().take();
        if let Some(s) = store {
            s.close().await;
        }
    }

    /// Runs the deadline checks every [`TICK`] until `shutdown` moves past 0.
    pub async fn run_ticker(&self, shutdown: &shards::OffsetMonitor) {
        loop {
            let slept = shutdown
                .unless_reached(1, glommio::timer::sleep(TICK))
                .await;
            if slept.is_none() {
                return;
            }
            self.tick();
        }
    }

    pub fn stats(&self) -> GroupStats {
        let groups = self.groups.borrow();
        let mut by_state = [0u64; 5];
        for g in groups.values() {
            by_state[g.state() as usize] += 1;
        }
        let consumer = self.consumer.borrow();
        let mut consumer_by_state = [0u64; 4];
        for g in consumer.values() {
            consumer_by_state[g.state() as usize] += 1;
        }
        GroupStats {
            by_state,
            consumer_by_state,
            members: groups
                .values()
                .map(|g| g.member_count() as u64)
                .sum::<u64>()
                + consumer
                    .values()
                    .map(|g| g.member_count() as u64)
                    .sum::<u64>(),
            rebalances: self.retired_rebalances.get()
                + groups.values().map(|g| g.rebalances).sum::<u64>()
                + consumer.values().map(|g| g.rebalances).sum::<u64>(),
            offset_commits: self.offset_commits.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reshard::pick_copy;
    use super::testing::{cache, run};
    use super::*;

    #[test]
    fn coordinator_cores_are_stable_and_spread() {
        // Committed offsets are found by this mapping after a restart: it must never change.
        let cores: Vec<usize> = ["orders", "billing", "g-0", "g-1", "g-2", "g-3"]
            .iter()
            .map(|g| coordinator_core(g, 4))
            .collect();
        assert_eq!(cores, [0, 1, 0, 0, 3, 2]);
        let mut per_core = [0; 4];
        for i in 0..4000 {
            per_core[coordinator_core(&format!("group-{i}"), 4)] += 1;
        }
        assert!(per_core.iter().all(|&n| n > 800), "{per_core:?}");
        assert_eq!(coordinator_core("anything", 1), 0);
    }

    fn config() -> CoordinatorConfig {
        CoordinatorConfig {
            initial_rebalance_delay: Duration::ZERO,
            min_session_timeout: Duration::from_millis(1),
            max_session_timeout: Duration::from_secs(300),
            compact_min_records: 1000,
            lag: lag::LagConfig {
                interval: Duration::from_secs(5),
                per_partition: false,
                max_partition_series: 100,
            },
            consumer: consumer::ConsumerConfig {
                session_timeout: Duration::from_secs(45),
                heartbeat_interval: Duration::from_secs(5),
                default_assignor: "uniform",
            },
        }
    }

    fn committed(offset: i64, at: i64) -> Committed {
        Committed {
            offset,
            leader_epoch: -1,
            metadata: None,
            commit_timestamp: at,
        }
    }

    /// A group id coordinated by `a` of `na` cores and by `b` of `nb` cores.
    fn group_on(a: usize, na: usize, b: usize, nb: usize) -> String {
        (0..10_000)
            .map(|i| format!("g-{i}"))
            .find(|g| coordinator_core(g, na) == a && coordinator_core(g, nb) == b)
            .unwrap()
    }

    fn join_req(member: &str) -> JoinRequest {
        JoinRequest {
            member_id: member.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(10),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), bytes::Bytes::new())],
            require_known_member_id: false,
            supports_skip_assignment: true,
        }
    }

    #[test]
    fn after_stop_join_and_sync_answer_not_coordinator_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let mut cfg = config();
            cfg.initial_rebalance_delay = Duration::from_secs(60);
            let c = Coordinator::new(0, 1, cfg);
            c.load(&data, cache()).await.unwrap();
            let Answer::Later(waiting) = c.join("g", join_req("")) else {
                panic!("a first join waits for the initial rebalance delay")
            };
            c.stop();
            assert_eq!(
                waiting.await.unwrap().error,
                Some(ResponseError::NotCoordinator)
            );
            let Answer::Now(j) = c.join("g", join_req("")) else {
                panic!("a join after stop must not wait")
            };
            assert_eq!(j.error, Some(ResponseError::NotCoordinator));
            let Answer::Now(s) = c.sync("g", SyncRequest::default()) else {
                panic!("a sync after stop must not wait")
            };
            assert_eq!(s.error, Some(ResponseError::NotCoordinator));
            c.close().await;
        });
    }

    #[test]
    fn the_empty_group_id_is_refused_only_by_the_membership_apis() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            let Answer::Now(j) = c.join("", join_req("")) else {
                panic!()
            };
            assert_eq!(j.error, Some(ResponseError::InvalidGroupId));
            assert_eq!(
                c.heartbeat("", "m", None, 1),
                Some(ResponseError::InvalidGroupId)
            );
            assert_eq!(c.leave("", &[]).err(), Some(ResponseError::InvalidGroupId));
            assert_eq!(c.check(""), Ok(()));
            let store = c.check_commit("", "", None, -1).unwrap();
            c.commit(&store, "", vec![(("t".into(), 0), committed(4, 1))])
                .await
                .unwrap();
            assert_eq!(c.fetch("", "t", 0), Some(committed(4, 1)));
            assert_eq!(c.delete("").await, Ok(()));
            assert_eq!(c.fetch("", "t", 0), None);
            c.close().await;
        });
    }

    /// A consumer-protocol heartbeat that joins `member` to `group`, subscribed to topic `t`.
    fn consumer_join(member: &str) -> consumer::Heartbeat {
        consumer::Heartbeat {
            version: 1,
            member_id: member.into(),
            rebalance_timeout_ms: 30_000,
            subscribed_names: Some(vec!["t".into()]),
            owned: Some(consumer::Assignment::new()),
            ..consumer::Heartbeat::default()
        }
    }

    #[test]
    fn a_consumer_group_commits_by_epoch_is_deleted_once_empty_and_a_marker_leaves_it_alone() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            let topics: consumer::Topics =
                [("t".to_string(), (uuid::Uuid::from_bytes([1; 16]), 2))]
                    .into_iter()
                    .collect();
            let joined = c
                .consumer_heartbeat("g", consumer_join("m"), &topics)
                .unwrap();
            // A heartbeat of another epoch to a group that does not exist creates nothing.
            let mut stray = consumer_join("x");
            stray.member_epoch = 3;
            let e = c.consumer_heartbeat("h", stray, &topics).unwrap_err();
            assert_eq!(e.0, ResponseError::UnknownMemberId);
            assert!(!c.exists("h"));
            // Commits: at the member's epoch; an admin's commit or another epoch is refused.
            let store = c.check_commit("g", "m", None, joined.member_epoch).unwrap();
            c.commit(&store, "g", vec![(("t".into(), 0), committed(4, 1))])
                .await
                .unwrap();
            assert_eq!(
                c.check_commit("g", "", None, -1).err(),
                Some(ResponseError::UnknownMemberId)
            );
            assert_eq!(
                c.check_commit("g", "m", None, joined.member_epoch + 7)
                    .err(),
                Some(ResponseError::StaleMemberEpoch)
            );
            // A transactional commit without member fields is taken, and its marker creates no
            // classic group beside the consumer group.
            assert!(c.check_txn_commit("g", "", None, -1, (5, 0)).is_ok());
            c.end_transaction("g", 5, 0, true).await.unwrap();
            assert_eq!(c.list().len(), 1);
            assert_eq!(c.delete("g").await, Err(ResponseError::NonEmptyGroup));
            let mut leave = consumer_join("m");
            leave.member_epoch = -1;
            c.consumer_heartbeat("g", leave, &topics).unwrap();
            assert_eq!(c.delete("g").await, Ok(()));
            assert!(!c.exists("g"));
            assert_eq!(c.fetch("g", "t", 0), None);
            // The id is free again, for either protocol.
            c.consumer_heartbeat("g", consumer_join("m2"), &topics)
                .unwrap();
            c.close().await;
        });
    }

    #[test]
    fn the_tick_keeps_a_new_simple_commit_group_while_its_first_commit_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            use futures_lite::future::poll_once;
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            let store = c.check_commit("simple", "", None, -1).unwrap();
            let mut commit =
                Box::pin(c.commit(&store, "simple", vec![(("t".into(), 0), committed(9, 1))]));
            let first = poll_once(&mut commit).await;
            // The tick runs while the commit waits for its fsync.
            c.tick();
            assert!(
                c.exists("simple"),
                "forgotten while its first commit was in flight"
            );
            match first {
                Some(r) => r.unwrap(),
                None => commit.await.unwrap(),
            }
            c.tick();
            assert!(c.exists("simple"));
            assert_eq!(c.fetch("simple", "t", 0), Some(committed(9, 1)));
            // Without offsets an idle group is forgotten, as before.
            c.check_commit("none", "", None, -1).unwrap();
            c.tick();
            assert!(!c.exists("none"));
            c.close().await;
        });
    }

    #[test]
    fn a_stores_copy_of_a_group_it_does_not_coordinate_is_dropped_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let mine = group_on(0, 2, 0, 2);
            let foreign = group_on(1, 2, 1, 2);
            let s = OffsetStore::open(&store_dir(&data, 0), cache(), 1000)
                .await
                .unwrap();
            for g in [&mine, &foreign] {
                s.write(g, vec![(("t".into(), 0), Some(committed(3, 1)))])
                    .await
                    .unwrap();
            }
            s.close().await;
            let c = Coordinator::new(0, 2, config());
            c.load(&data, cache()).await.unwrap();
            assert_eq!(c.fetch(&mine, "t", 0), Some(committed(3, 1)));
            assert!(!c.exists(&foreign));
            c.close().await;
            let s = OffsetStore::open(&store_dir(&data, 0), cache(), 1000)
                .await
                .unwrap();
            assert!(s.has_group(&mine));
            assert!(!s.has_group(&foreign), "dropped on disk, not only ignored");
            s.close().await;
        });
    }

    #[test]
    fn a_reshard_after_a_crashed_one_keeps_the_old_coordinators_copy() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        // Coordinated by core 0 of 2 and core 2 of 4.
        let g = group_on(0, 2, 2, 4);
        {
            let data = data.clone();
            let g = g.clone();
            run(move || async move {
                // A reshard from 2 to 4 cores crashed after copying g to core 2 and before the
                // marker was rewritten; core 0 (g's coordinator on 2 cores) then moved on.
                let live = OffsetStore::open(&store_dir(&data, 0), cache(), 1000)
                    .await
                    .unwrap();
                live.write(&g, vec![(("t".into(), 0), Some(committed(50, 1_000)))])
                    .await
                    .unwrap();
                live.close().await;
                let stale = OffsetStore::open(&store_dir(&data, 2), cache(), 1000)
                    .await
                    .unwrap();
                // Stale, though stamped later (clocks are not to be trusted across a restart).
                stale
                    .write(
                        &g,
                        vec![
                            (("t".into(), 0), Some(committed(20, 2_000))),
                            (("t".into(), 1), Some(committed(7, 2_000))),
                        ],
                    )
                    .await
                    .unwrap();
                stale.close().await;
            });
        }
        std::fs::write(data.join("__groups").join("cores"), "2").unwrap();
        reshard(&data, 4).unwrap();
        let check = data.clone();
        run(move || async move {
            let s = OffsetStore::open(&store_dir(&check, 2), cache(), 1000)
                .await
                .unwrap();
            assert_eq!(
                s.group_offsets(&g),
                vec![(("t".to_string(), 0), committed(50, 1_000))],
                "the old coordinator's copy, without the stale copy's extra partition"
            );
            s.close().await;
            let s = OffsetStore::open(&store_dir(&check, 0), cache(), 1000)
                .await
                .unwrap();
            assert!(!s.has_group(&g));
            s.close().await;
        });
        assert_eq!(
            std::fs::read_to_string(data.join("__groups").join("cores")).unwrap(),
            "4"
        );
    }

    fn pending_at(offset: i64, epoch: i16) -> PendingOffset {
        PendingOffset {
            producer_epoch: epoch,
            value: committed(offset, 5),
        }
    }

    #[test]
    fn a_transactions_offsets_show_only_once_it_commits() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            let store = c.check_txn_commit("g", "", None, -1, (7, 1)).unwrap();
            let tp = ("t".to_string(), 0);
            c.txn_commit(&store, "g", 7, vec![(tp.clone(), pending_at(40, 1))])
                .await
                .unwrap();
            c.tick();
            assert!(c.exists("g"), "a group with only pending offsets is kept");
            assert!(c.has_pending("g", "t", 0));
            assert_eq!(c.fetch("g", "t", 0), None);
            assert!(c.positions().is_empty(), "pending offsets have no lag");
            // A zombie of the producer (an older epoch) cannot replace the pending offset.
            assert_eq!(
                c.check_txn_commit("g", "", None, -1, (7, 0)).err(),
                Some(ResponseError::InvalidProducerEpoch)
            );
            assert_eq!(
                c.check_txn_commit("g", "", None, -1, (-1, 0)).err(),
                Some(ResponseError::InvalidProducerIdMapping)
            );
            c.end_transaction("g", 7, 1, true).await.unwrap();
            assert!(!c.has_pending("g", "t", 0));
            assert_eq!(c.fetch("g", "t", 0), Some(committed(40, 5)));
            assert_eq!(c.stats().offset_commits, 1);
            // Sent again by a recovering transaction coordinator: Ok, nothing changes.
            c.end_transaction("g", 7, 1, true).await.unwrap();
            assert_eq!(c.fetch("g", "t", 0), Some(committed(40, 5)));
            assert_eq!(c.stats().offset_commits, 1);
            c.close().await;
        });
    }

    #[test]
    fn a_marker_for_a_group_this_core_forgot_creates_it_and_deleting_a_group_drops_pending() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            // Written to the store directly: the core has no group for it (as after its last
            // member left and the tick forgot it).
            let store = c.store().unwrap();
            let tp = ("t".to_string(), 1);
            store
                .write_pending("lone", vec![(9, tp.clone(), Some(pending_at(3, 0)))])
                .await
                .unwrap();
            assert!(!c.exists("lone"));
            c.end_transaction("lone", 9, 0, true).await.unwrap();
            assert!(c.exists("lone"));
            c.tick();
            assert!(c.exists("lone"), "kept: it has a committed offset now");
            assert_eq!(c.fetch("lone", "t", 1), Some(committed(3, 5)));
            // A marker for a group with nothing pending: Ok, and the group is forgotten again.
            c.end_transaction("never", 9, 0, false).await.unwrap();
            c.tick();
            assert!(!c.exists("never"));
            assert_eq!(
                c.end_transaction("x", 1, 0, true).await,
                Ok(()),
                "idempotent on an unknown group"
            );

            let store = c.check_txn_commit("doomed", "", None, -1, (4, 0)).unwrap();
            c.txn_commit(&store, "doomed", 4, vec![(tp.clone(), pending_at(1, 0))])
                .await
                .unwrap();
            assert_eq!(c.delete("doomed").await, Ok(()));
            assert!(!c.has_pending("doomed", "t", 1));
            c.end_transaction("doomed", 4, 0, true).await.unwrap();
            assert_eq!(c.fetch("doomed", "t", 1), None, "nothing left to commit");
            c.close().await;
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            assert!(!c.has_pending("doomed", "t", 1));
            assert_eq!(c.fetch("lone", "t", 1), Some(committed(3, 5)));
            c.close().await;
        });
    }

    #[test]
    fn kip_447_fencing_of_txn_offset_commits() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let c = Coordinator::new(0, 1, config());
            c.load(&data, cache()).await.unwrap();
            let Answer::Later(joined) = c.join("g", join_req("")) else {
                panic!("a first join waits for the rebalance")
            };
            let j = loop {
                c.tick();
                if let Some(j) = joined.try_take() {
                    break j;
                }
                glommio::timer::sleep(Duration::from_millis(5)).await;
            };
            assert_eq!(j.error, None);
            let check = |member: &str, generation| {
                c.check_txn_commit("g", member, None, generation, (1, 0))
                    .err()
            };
            assert_eq!(check(&j.member_id, j.generation), None);
            assert_eq!(check("", -1), None, "old clients send no member");
            assert_eq!(
                check(&j.member_id, j.generation + 1),
                Some(ResponseError::IllegalGeneration)
            );
            assert_eq!(check("stranger", -1), Some(ResponseError::UnknownMemberId));
            assert_eq!(
                check("", j.generation + 1),
                Some(ResponseError::IllegalGeneration)
            );
            c.close().await;
        });
    }

    #[test]
    fn a_reshard_moves_pending_offsets_to_the_new_coordinator() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        let g = group_on(1, 2, 3, 4);
        {
            let (data, g) = (data.clone(), g.clone());
            run(move || async move {
                let s = OffsetStore::open(&store_dir(&data, 1), cache(), 1000)
                    .await
                    .unwrap();
                let tp = ("t".to_string(), 0);
                s.write(&g, vec![(tp.clone(), Some(committed(1, 1)))])
                    .await
                    .unwrap();
                s.write_pending(&g, vec![(5, tp, Some(pending_at(2, 3)))])
                    .await
                    .unwrap();
                s.close().await;
            });
        }
        std::fs::write(data.join("__groups").join("cores"), "2").unwrap();
        reshard(&data, 4).unwrap();
        run(move || async move {
            let c = Coordinator::new(3, 4, config());
            c.load(&data, cache()).await.unwrap();
            assert!(c.has_pending(&g, "t", 0));
            assert_eq!(c.fetch(&g, "t", 0), Some(committed(1, 1)));
            c.end_transaction(&g, 5, 3, true).await.unwrap();
            assert_eq!(c.fetch(&g, "t", 0), Some(committed(2, 5)));
            c.close().await;
            let s = OffsetStore::open(&store_dir(&data, 1), cache(), 1000)
                .await
                .unwrap();
            assert!(!s.has_group(&g), "no copy left at the old coordinator");
            s.close().await;
        });
    }

    #[test]
    fn without_the_old_coordinators_copy_the_latest_commit_of_each_partition_wins() {
        let copies = vec![
            (
                1,
                vec![
                    (("t".to_string(), 0), committed(5, 10)),
                    (("t".to_string(), 1), committed(6, 30)),
                ],
            ),
            (2, vec![(("t".to_string(), 0), committed(8, 20))]),
        ];
        let g = group_on(0, 3, 0, 3);
        assert_eq!(
            pick_copy(&g, 3, copies),
            vec![
                (("t".to_string(), 0), committed(8, 20)),
                (("t".to_string(), 1), committed(6, 30)),
            ]
        );
    }
}
