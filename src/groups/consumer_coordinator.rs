//! The coordinator's consumer-protocol groups (KIP-848) beside its classic ones: heartbeats, the
//! move of an empty group from one protocol to the other, and what the offset APIs check of a
//! consumer group's members. A group id names at most one group of either kind on its core.

use super::consumer::{Answer, ConsumerConfig, ConsumerGroup, Heartbeat, Refusal, Topics};
use super::group::GroupState;
use super::Coordinator;
use kafka_protocol::error::ResponseError;
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
        if leaving && !groups.contains_key(group_id) {
            return Err((
                ResponseError::UnknownMemberId,
                format!("group {group_id} has no member {}", hb.member_id),
            ));
        }
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
            if member_id.is_empty() && epoch < 0 {
                return if g.is_empty() {
                    Ok(())
                } else {
                    Err(ResponseError::UnknownMemberId)
                };
            }
            g.check_member_epoch(member_id, epoch)
        })
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
}
