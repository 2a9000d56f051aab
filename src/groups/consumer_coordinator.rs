//! The coordinator's consumer-protocol groups (KIP-848) beside its classic ones: heartbeats, the
//! move of an empty group from one protocol to the other, and what the offset APIs check of a
//! consumer group's members. A group id names at most one group of either kind on its core.

use super::consumer::{
    Answer, ConsumerConfig, ConsumerGroup, Heartbeat, Refusal, SavedGroups, Topics,
};
use super::group::GroupState;
use super::{coordinator_core, Coordinator};
use kafka_protocol::error::ResponseError;
use std::path::Path;
use std::time::Instant;

impl Coordinator {
    /// ConsumerGroupHeartbeat. A classic group without members becomes a consumer group (its
    /// committed offsets stay); one with members refuses (`GROUP_ID_NOT_FOUND`, as Kafka's
    /// coordinator answers a consumer member of a classic group it cannot convert).
    pub fn consumer_heartbeat(
        &self,
        group_id: &str,
        hb: Heartbeat,
        topics: &Topics,
    ) -> Result<Answer, Refusal> {
        if self.stopped.get() {
            return Err((ResponseError::NotCoordinator, "the core is stopping".into()));
        }
        self.check_membership(group_id)
            .map_err(|e| (e, String::new()))?;
        // Only a joining member (epoch 0) creates a group or takes over a classic one.
        if hb.member_epoch != 0 && !self.consumer.borrow().contains_key(group_id) {
            return Err((
                ResponseError::UnknownMemberId,
                format!("group {group_id} has no member {}", hb.member_id),
            ));
        }
        let leaving = hb.member_epoch < 0;
        {
            let mut classic = self.groups.borrow_mut();
            match classic.get(group_id) {
                Some(g) if g.state() == GroupState::Empty && !leaving => {
                    log::info!(
                        "core {}: group {group_id} moves from the classic protocol to the consumer protocol",
                        self.core
                    );
                    let g = classic.remove(group_id).expect("present");
                    self.retired_rebalances
                        .set(self.retired_rebalances.get() + g.rebalances);
                }
                Some(_) => {
                    return Err((
                        ResponseError::GroupIdNotFound,
                        format!("group {group_id} is a classic group with members"),
                    ))
                }
                None => {}
            }
        }
        let mut groups = self.consumer.borrow_mut();
        let g = groups
            .entry(group_id.to_string())
            .or_insert_with(|| ConsumerGroup::new(group_id));
        let answer = g.heartbeat(hb, topics, &self.config.consumer, Instant::now());
        drop(groups);
        self.mark_active(group_id);
        answer
    }

    /// A classic JoinGroup for a group the consumer protocol has: one without members goes back
    /// to the classic protocol (its offsets stay); one with members refuses
    /// (`INCONSISTENT_GROUP_PROTOCOL`).
    pub(super) fn classic_join_allowed(&self, group_id: &str) -> Result<(), ResponseError> {
        let mut groups = self.consumer.borrow_mut();
        match groups.get(group_id) {
            Some(g) if g.is_empty() => {
                log::info!(
                    "core {}: group {group_id} moves from the consumer protocol to the classic protocol",
                    self.core
                );
                let g = groups.remove(group_id).expect("present");
                self.retired_rebalances
                    .set(self.retired_rebalances.get() + g.rebalances);
                Ok(())
            }
            Some(_) => Err(ResponseError::InconsistentGroupProtocol),
            None => Ok(()),
        }
    }

    /// Runs `f` on a consumer-protocol group if this core has it.
    pub fn with_consumer_group<T>(
        &self,
        group_id: &str,
        f: impl FnOnce(&ConsumerGroup) -> T,
    ) -> Option<T> {
        self.consumer.borrow().get(group_id).map(f)
    }

    /// What an OffsetCommit, TxnOffsetCommit or OffsetFetch (v9+) of a consumer-protocol group
    /// must pass: `None` for a group of the classic protocol (its own checks apply). A member id
    /// must be a member's and the epoch its current one; without a member id (an admin's commit)
    /// only a group without members takes it.
    pub(super) fn consumer_commit_check(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
    ) -> Option<Result<(), ResponseError>> {
        self.with_consumer_group(group_id, |g| {
            // An admin's commit (no epoch) only to a group without members.
            if epoch < 0 {
                return if g.is_empty() {
                    Ok(())
                } else {
                    Err(ResponseError::UnknownMemberId)
                };
            }
            g.check_member_epoch(member_id, epoch)
        })
    }

    /// [`Self::consumer_commit_check`] for a TxnOffsetCommit: one without member fields (clients
    /// before KIP-447, `sendOffsetsToTransaction` with a group id alone) is taken, as Kafka
    /// takes it.
    pub(super) fn consumer_txn_commit_check(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
    ) -> Option<Result<(), ResponseError>> {
        if member_id.is_empty() && epoch == -1 {
            return self.with_consumer_group(group_id, |_| Ok(()));
        }
        self.consumer_commit_check(group_id, member_id, epoch)
    }

    /// OffsetFetch v9+ of a member: its epoch must be current (no member id: no check).
    pub fn check_fetch_member(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        epoch: i32,
    ) -> Result<(), ResponseError> {
        match member_id.filter(|m| !m.is_empty()) {
            None => Ok(()),
            Some(m) => self
                .consumer_commit_check(group_id, m, epoch)
                .unwrap_or(Ok(())),
        }
    }

    /// Ticks the consumer groups in `ids` (members whose session or revocation timed out are
    /// removed); returns those left without members.
    pub(super) fn tick_consumer(&self, ids: &[String], now: Instant) -> Vec<String> {
        let mut groups = self.consumer.borrow_mut();
        let mut empty = Vec::new();
        for id in ids {
            if let Some(g) = groups.get_mut(id) {
                for gone in g.tick(now) {
                    log::info!(
                        "core {}: group {id}: member {gone} removed (its session or revocation timed out)",
                        self.core
                    );
                }
                if g.is_empty() {
                    empty.push(id.clone());
                }
            }
        }
        empty
    }

    /// The consumer-protocol settings.
    pub fn consumer_config(&self) -> ConsumerConfig {
        self.config.consumer
    }

    /// Loads the consumer-protocol groups the last clean stop saved in `dir` (this core's groups
    /// directory), those this core still coordinates, and removes the file: after a crash later
    /// on, members rejoin rather than find a stale state. Blocking; at start-up.
    pub(super) fn load_consumer_groups(&self, dir: &Path) {
        let path = dir.join(super::consumer::SAVED_FILE);
        *self.saved_path.borrow_mut() = Some(path.clone());
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let saved: SavedGroups = match serde_json::from_str(&text) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("core {}: ignoring {}: {e}", self.core, path.display());
                Vec::new()
            }
        };
        let now = Instant::now();
        let timeout = self.config.consumer.session_timeout;
        let mut restored = 0;
        for g in saved {
            let Some(g) = ConsumerGroup::restore(g, timeout, now) else {
                continue;
            };
            if coordinator_core(&g.id, self.cores) != self.core {
                continue;
            }
            self.groups.borrow_mut().remove(&g.id);
            self.mark_active(&g.id);
            self.consumer.borrow_mut().insert(g.id.clone(), g);
            restored += 1;
        }
        if restored > 0 {
            log::info!(
                "core {}: {restored} consumer-protocol groups carry on from the last stop",
                self.core
            );
        }
        if let Err(e) = std::fs::remove_file(&path) {
            log::warn!(
                "core {}: could not remove {}: {e}",
                self.core,
                path.display()
            );
        }
        *self.saved_path.borrow_mut() = Some(path);
    }

    /// Saves the consumer-protocol groups with members for the next start (a clean stop).
    pub(super) async fn save_consumer_groups(&self) {
        let Some(path) = self.saved_path.borrow().clone() else {
            return;
        };
        let saved: SavedGroups = self
            .consumer
            .borrow()
            .values()
            .filter(|g| !g.is_empty())
            .map(ConsumerGroup::save)
            .collect();
        if saved.is_empty() {
            return;
        }
        let text = serde_json::to_vec(&saved).expect("plain data serializes");
        let written = glommio::executor()
            .spawn_blocking(move || shards::files::write_atomically(&path, &text).map(|()| path))
            .await;
        if let Err(e) = written {
            log::warn!(
                "core {}: could not save its consumer groups: {e}",
                self.core
            );
        }
    }
}
