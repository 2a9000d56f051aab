//! Consumer groups: the per-core group coordinator.
//!
//! Every group has one coordinator core, `murmur2(group id) % cores` ([`coordinator_core`]), the same
//! across restarts with the same core count. FindCoordinator names that core's broker, and every
//! other group request that reaches another core gets `NOT_COORDINATOR`, so a group's state is only
//! ever touched by one core and needs no lock: the [`Coordinator`] lives in `Core`, its groups in a
//! `RefCell`, and request handlers that must wait (JoinGroup until the rebalance completes, SyncGroup
//! until the leader's assignment) simply await an [`answer`] from the state machine.
//!
//! - [`group`]   — one group's state machine (Kafka's classic protocol), pure and synchronous.
//! - [`offsets`] — committed offsets: in memory, durable in an internal log per core, compacted.
//! - [`answer`]  — the one-shot answer a waiting handler awaits.
//!
//! Time: deadlines (session and rebalance timeouts, the initial rebalance delay) are checked by one
//! ticker task per core every [`TICK`], so they fire up to one tick late. It visits only groups
//! with members or pending member ids; groups that only hold offsets cost nothing per tick.
//!
//! Changing `--cores` moves groups to other cores. Each core's offsets live in
//! `DATA/__groups/core-<i>/`, and `DATA/__groups/cores` records the count they were written with;
//! when it differs at start-up, [`reshard`] rewrites every stored offset into the store of its new
//! coordinator before any core starts, so committed offsets survive the change.

pub mod answer;
pub mod group;
pub mod offsets;

use crate::metrics::GroupStats;
use group::{
    Answer, Group, GroupConfig, GroupState, JoinAnswer, JoinRequest, SyncAnswer, SyncRequest,
};
use kafka_protocol::error::ResponseError;
use offsets::{Committed, OffsetStore, TopicPartition};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

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
}

/// One core's groups and their committed offsets.
#[derive(Debug)]
pub struct Coordinator {
    core: usize,
    cores: usize,
    pub config: CoordinatorConfig,
    groups: RefCell<HashMap<String, Group>>,
    /// Groups the tick must visit: those that are not idle (see [`Coordinator::tick`]).
    active: RefCell<HashSet<String>>,
    offsets: RefCell<Option<Rc<OffsetStore>>>,
    /// Rebalances of groups since forgotten (live groups count their own).
    retired_rebalances: Cell<u64>,
    offset_commits: Cell<u64>,
}

impl Coordinator {
    pub fn new(core: usize, cores: usize, config: CoordinatorConfig) -> Self {
        Coordinator {
            core,
            cores,
            config,
            groups: RefCell::new(HashMap::new()),
            active: RefCell::new(HashSet::new()),
            offsets: RefCell::new(None),
            retired_rebalances: Cell::new(0),
            offset_commits: Cell::new(0),
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
        let now = Instant::now();
        let mut groups = self.groups.borrow_mut();
        for g in store.groups() {
            if coordinator_core(&g, self.cores) != self.core {
                log::warn!(
                    "core {}: offsets of group {g} belong to core {}; ignored",
                    self.core,
                    coordinator_core(&g, self.cores)
                );
                continue;
            }
            groups
                .entry(g.clone())
                .or_insert_with(|| Group::new(&g, self.group_config(), now));
        }
        *self.offsets.borrow_mut() = Some(Rc::new(store));
        Ok(())
    }

    fn group_config(&self) -> GroupConfig {
        GroupConfig {
            initial_rebalance_delay: self.config.initial_rebalance_delay,
        }
    }

    /// `NOT_COORDINATOR` unless this core coordinates `group_id`.
    pub fn check(&self, group_id: &str) -> Result<(), ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        if coordinator_core(group_id, self.cores) != self.core {
            return Err(ResponseError::NotCoordinator);
        }
        if self.offsets.borrow().is_none() {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        Ok(())
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
        if let Err(e) = self.check(group_id) {
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
        if let Err(e) = self.check(group_id) {
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
        if let Err(e) = self.check(group_id) {
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
        self.check(group_id)?;
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

    /// Writes a commit's offsets (already checked) durably.
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

    /// Whether the group is in a rebalance (OffsetFetch with `require_stable` waits on it in Kafka
    /// only for pending transactional offsets, which shoal does not have).
    pub fn exists(&self, group_id: &str) -> bool {
        self.groups.borrow().contains_key(group_id)
    }

    /// (group id, protocol type, state) of every group of this core.
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        let mut v: Vec<_> = self
            .groups
            .borrow()
            .values()
            .map(|g| {
                (
                    g.id.clone(),
                    g.protocol_type().unwrap_or("").to_string(),
                    g.state(),
                )
            })
            .collect();
        v.sort();
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
                None => {}
            }
        }
        let written = store.delete_group(group_id).await;
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

    /// Checks the deadlines of the groups with members (or member ids handed out) and forgets
    /// those that became empty and have no offsets. Idle groups are not visited, so a core with
    /// many groups that only hold offsets pays nothing per tick for them.
    pub fn tick(&self) {
        let now = Instant::now();
        let store = self.offsets.borrow().clone();
        let mut retired = 0;
        let mut groups = self.groups.borrow_mut();
        self.active.borrow_mut().retain(|id| {
            let Some(g) = groups.get_mut(id) else {
                return false;
            };
            g.tick(now);
            if !g.is_idle() {
                return true;
            }
            if !store.as_ref().is_some_and(|s| s.has_group(id)) {
                retired += groups.remove(id).map_or(0, |g| g.rebalances);
            }
            false
        });
        drop(groups);
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
        for g in self.groups.borrow_mut().values_mut() {
            g.cancel_waiters(ResponseError::NotCoordinator);
        }
    }

    pub async fn close(&self) {
        let store = self.offsets.borrow_mut().take();
        if let Some(s) = store {
            s.close().await;
        }
    }

    pub fn stats(&self) -> GroupStats {
        let groups = self.groups.borrow();
        let mut by_state = [0u64; 5];
        for g in groups.values() {
            by_state[g.state() as usize] += 1;
        }
        GroupStats {
            by_state,
            members: groups.values().map(|g| g.member_count() as u64).sum(),
            rebalances: self.retired_rebalances.get()
                + groups.values().map(|g| g.rebalances).sum::<u64>(),
            offset_commits: self.offset_commits.get(),
        }
    }
}

/// Runs the core's deadline checks until it stops.
pub async fn run_ticker(core: Rc<crate::core::Core>) {
    loop {
        let stopped = futures_lite::future::or(
            async {
                glommio::timer::sleep(TICK).await;
                false
            },
            async {
                core.shutdown.wait_for(1).await;
                true
            },
        )
        .await;
        if stopped {
            return;
        }
        core.groups.tick();
    }
}

/// Moves committed offsets to their coordinators' stores when the core count changed since they
/// were written (see the module docs). Runs before the cores start, on an executor of its own.
pub fn reshard(data_dir: &Path, cores: usize) -> std::io::Result<()> {
    let root = data_dir.join("__groups");
    std::fs::create_dir_all(&root)?;
    let marker = root.join("cores");
    let previous = match std::fs::read_to_string(&marker) {
        Ok(s) => s.trim().parse::<usize>().ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let on_disk: Vec<usize> = std::fs::read_dir(&root)?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("core-")?
                .parse()
                .ok()
        })
        .collect();
    let old = previous.unwrap_or_else(|| on_disk.iter().map(|c| c + 1).max().unwrap_or(cores));
    if old == cores && on_disk.iter().all(|&c| c < cores) {
        return crate::partition::write_atomically(&marker, cores.to_string().as_bytes());
    }
    log::info!("re-sharding committed offsets from {old} to {cores} cores");
    let data_dir = data_dir.to_path_buf();
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("shoal-reshard")
        .spawn(move || async move { reshard_on_executor(&data_dir, on_disk, cores).await })
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    handle
        .join()
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    crate::partition::write_atomically(&marker, cores.to_string().as_bytes())
}

async fn reshard_on_executor(
    data_dir: &Path,
    old_cores: Vec<usize>,
    cores: usize,
) -> std::io::Result<()> {
    let cache = Rc::new(shards::TailCache::new(4 << 20, 1 << 20));
    let err = std::io::Error::other;
    let mut all: Vec<(String, TopicPartition, Committed)> = Vec::new();
    let mut stores = Vec::new();
    for &c in &old_cores {
        let s = OffsetStore::open(&store_dir(data_dir, c), cache.clone(), u64::MAX)
            .await
            .map_err(err)?;
        for g in s.groups() {
            for (tp, committed) in s.group_offsets(&g) {
                all.push((g.clone(), tp, committed));
            }
        }
        stores.push((c, s));
    }
    // Write each group's offsets to its new core's store first (a crash here leaves duplicates,
    // which are harmless: the same values), then drop them from stores that no longer own them.
    let mut targets: HashMap<usize, OffsetStore> = HashMap::new();
    for (c, s) in stores {
        targets.insert(c, s);
    }
    let mut by_group: HashMap<(usize, String), offsets::Changes> = HashMap::new();
    for (g, tp, committed) in &all {
        by_group
            .entry((coordinator_core(g, cores), g.clone()))
            .or_default()
            .push((tp.clone(), Some(committed.clone())));
    }
    for ((c, g), changes) in by_group {
        if let std::collections::hash_map::Entry::Vacant(e) = targets.entry(c) {
            let s = OffsetStore::open(&store_dir(data_dir, c), cache.clone(), u64::MAX)
                .await
                .map_err(err)?;
            e.insert(s);
        }
        let s = &targets[&c];
        let moved: Vec<_> = changes
            .into_iter()
            .filter(|((t, p), v)| s.get(&g, t, *p).as_ref() != v.as_ref())
            .collect();
        s.write(&g, moved).await.map_err(err)?;
    }
    for (&c, s) in &targets {
        for g in s.groups() {
            if coordinator_core(&g, cores) != c {
                s.delete_group(&g).await.map_err(err)?;
            }
        }
        s.compact().await.map_err(err)?;
    }
    for (c, s) in targets {
        s.close().await;
        if c >= cores {
            let dir = store_dir(data_dir, c);
            std::fs::remove_dir_all(&dir)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
