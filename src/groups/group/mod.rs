//! One consumer group's state machine (Kafka's classic group protocol), with no I/O and no timers of
//! its own: every call takes `now`, and the coordinator's tick calls [`Group::tick`] so deadlines
//! (session timeouts, rebalance timeouts, the initial rebalance delay, unanswered member ids) fire.
//! That keeps it testable synchronously and lock-free: it lives on its coordinator core only.
//!
//! Design notes: `docs/groups.md`.

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use shards::oneshot::{self as answer, Receiver, Sender};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    pub const ALL: [GroupState; 5] = [
        GroupState::Empty,
        GroupState::PreparingRebalance,
        GroupState::CompletingRebalance,
        GroupState::Stable,
        GroupState::Dead,
    ];

    /// The name Kafka uses in ListGroups and DescribeGroups.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// Settings every group of a core shares.
#[derive(Debug, Clone, Copy)]
pub struct GroupConfig {
    /// How long a rebalance of an empty group waits for more members (Kafka
    /// `group.initial.rebalance.delay.ms`); each new member extends it, up to the rebalance timeout.
    pub initial_rebalance_delay: Duration,
}

/// A JoinGroup request, decoded and validated by the handler.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    /// (name, metadata), in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a member without an id first gets `MEMBER_ID_REQUIRED` and its new id.
    pub require_known_member_id: bool,
    /// JoinGroup v9+: the client understands `skip_assignment`. A restarted static leader of a
    /// stable group that does not is told the old leader id and no members, so it acts as a
    /// follower and does not compute an assignment the stable group would never hand out.
    pub supports_skip_assignment: bool,
}

/// What a JoinGroup is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinAnswer {
    pub error: Option<ResponseError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member and its metadata for the chosen protocol; only the leader gets them.
    pub members: Vec<JoinedMember>,
    /// A static leader rejoining a stable group: it must not compute a new assignment (v9+).
    pub skip_assignment: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Bytes,
}

impl JoinAnswer {
    fn error(e: ResponseError, member_id: &str) -> Self {
        JoinAnswer {
            error: Some(e),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
            skip_assignment: false,
        }
    }
}

/// What a SyncGroup is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncAnswer {
    pub error: Option<ResponseError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncAnswer {
    fn error(e: ResponseError) -> Self {
        SyncAnswer {
            error: Some(e),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// An answer now, or one to wait for.
#[derive(Debug)]
pub enum Answer<T> {
    Now(T),
    Later(Receiver<T>),
}

impl<T> Answer<T> {
    /// The answer if it is already there (tests).
    pub fn ready(self) -> Option<T> {
        match self {
            Answer::Now(t) => Some(t),
            Answer::Later(rx) => rx.try_take(),
        }
    }
}

/// A SyncGroup request's identity fields.
#[derive(Debug, Clone, Default)]
pub struct SyncRequest {
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's assignment: (member id, assignment).
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    /// A JoinGroup waiting for the rebalance to complete.
    join: Option<Sender<JoinAnswer>>,
    /// A SyncGroup waiting for the leader's assignment.
    sync: Option<Sender<SyncAnswer>>,
    /// The last join, sync, heartbeat or commit; the session expires `session_timeout` after it.
    last_seen: Instant,
    /// Order of arrival: the earliest member still present leads.
    seq: u64,
}

impl Member {
    fn metadata(&self, protocol: &str) -> Option<&Bytes> {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m)
    }
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug)]
pub struct Group {
    pub id: String,
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Member ids handed out with `MEMBER_ID_REQUIRED`, and until when they may join with them.
    pending: HashMap<String, Instant>,
    /// group.instance.id -> member id.
    statics: HashMap<String, String>,
    /// When the current rebalance started (PreparingRebalance).
    rebalance_started: Instant,
    /// A rebalance of a group that was empty completes no earlier than this.
    join_ready_at: Option<Instant>,
    /// Members of the current generation that have not sent SyncGroup yet, and when they are
    /// removed if they still have not (set when a join completes).
    pending_sync: HashSet<String>,
    sync_deadline: Option<Instant>,
    next_seq: u64,
    /// Rebalances started, for metrics.
    pub rebalances: u64,
    config: GroupConfig,
}

impl Group {
    pub fn new(id: &str, config: GroupConfig, now: Instant) -> Self {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: HashMap::new(),
            statics: HashMap::new(),
            rebalance_started: now,
            join_ready_at: None,
            pending_sync: HashSet::new(),
            sync_deadline: None,
            next_seq: 0,
            rebalances: 0,
            config,
        }
    }

    pub fn state(&self) -> GroupState {
        self.state
    }
    pub fn generation(&self) -> i32 {
        self.generation
    }
    pub fn member_count(&self) -> usize {
        self.members.len()
    }
    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }
    /// No members and nobody about to join: the group may be forgotten if it has no offsets.
    pub fn is_idle(&self) -> bool {
        self.state == GroupState::Empty && self.pending.is_empty()
    }

    pub fn members(&self) -> Vec<MemberDescription> {
        let protocol = self.protocol.as_deref().unwrap_or("");
        self.members
            .iter()
            .map(|(id, m)| MemberDescription {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: m.metadata(protocol).cloned().unwrap_or_default(),
                assignment: m.assignment.clone(),
            })
            .collect()
    }

    /// The topics the members subscribe to, from the consumer protocol's subscription each sent
    /// with each of its protocols (OffsetDelete refuses those topics while the group has members).
    /// Empty for a group of another protocol type; a subscription that does not decode names none.
    pub fn subscribed_topics(&self) -> HashSet<String> {
        use kafka_protocol::messages::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::Decodable;
        let mut topics = HashSet::new();
        if self.protocol_type.as_deref() != Some("consumer") {
            return topics;
        }
        for (_, metadata) in self.members.values().flat_map(|m| &m.protocols) {
            let mut b = metadata.clone();
            if b.len() < 2 {
                continue;
            }
            let version = bytes::Buf::get_i16(&mut b);
            // Newer subscriptions than the schema knows still begin with the same fields.
            let version = version.clamp(0, 3);
            if let Ok(sub) = ConsumerProtocolSubscription::decode(&mut b, version) {
                topics.extend(sub.topics.iter().map(|t| t.to_string()));
            }
        }
        topics
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        self.next_seq += 1;
        let prefix = if client_id.is_empty() {
            "member"
        } else {
            client_id
        };
        format!("{prefix}-{nanos:x}-{}", self.next_seq)
    }

    /// Whether some protocol of `protocols` is supported by every current member.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)], except: &str) -> bool {
        if self.members.keys().all(|k| k == except) {
            return true;
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        protocols.iter().any(|(name, _)| {
            self.members
                .iter()
                .filter(|(k, _)| *k != except)
                .all(|(_, m)| m.metadata(name).is_some())
        })
    }

    /// JoinGroup.
    pub fn join(&mut self, req: JoinRequest, now: Instant) -> Answer<JoinAnswer> {
        let me = req.member_id.clone();
        if self.state == GroupState::Dead {
            return Answer::Now(JoinAnswer::error(
                ResponseError::CoordinatorNotAvailable,
                &me,
            ));
        }
        if req.protocol_type.is_empty()
            || req.protocols.is_empty()
            || !self.supports(&req.protocol_type, &req.protocols, &me)
        {
            return Answer::Now(JoinAnswer::error(
                ResponseError::InconsistentGroupProtocol,
                &me,
            ));
        }
        if me.is_empty() {
            if let Some(instance) = req.instance_id.clone() {
                if let Some(old) = self.statics.get(&instance).cloned() {
                    return self.replace_static(old, req, now);
                }
                let id = self.new_member_id(&req.client_id);
                return self.add_member(id, req, now);
            }
            let id = self.new_member_id(&req.client_id);
            if req.require_known_member_id {
                self.pending.insert(id.clone(), now + req.session_timeout);
                return Answer::Now(JoinAnswer::error(ResponseError::MemberIdRequired, &id));
            }
            return self.add_member(id, req, now);
        }
        if self.pending.remove(&me).is_some() {
            return self.add_member(me, req, now);
        }
        if let Err(e) = self.check_instance(&me, req.instance_id.as_deref()) {
            return Answer::Now(JoinAnswer::error(e, &me));
        }
        if !self.members.contains_key(&me) {
            return Answer::Now(JoinAnswer::error(ResponseError::UnknownMemberId, &me));
        }
        let unchanged = self.members[&me].protocols == req.protocols;
        match self.state {
            GroupState::CompletingRebalance if unchanged => {
                // The member lost its join answer: the same answer again.
                self.touch(&me, now);
                Answer::Now(self.current_answer(&me, false))
            }
            GroupState::Stable if unchanged && self.leader.as_deref() != Some(&me) => {
                self.touch(&me, now);
                Answer::Now(self.current_answer(&me, false))
            }
            _ => {
                let rx = self.update_member(&me, &req, now);
                self.prepare_rebalance(now);
                self.maybe_complete_join(now);
                Answer::Later(rx)
            }
        }
    }

    /// A fenced static member: `member_id` is not the one its instance id now maps to.
    fn check_instance(&self, member_id: &str, instance: Option<&str>) -> Result<(), ResponseError> {
        match instance.and_then(|i| self.statics.get(i)) {
            Some(current) if current != member_id => Err(ResponseError::FencedInstanceId),
            _ => Ok(()),
        }
    }

    fn touch(&mut self, member_id: &str, now: Instant) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_seen = now;
        }
    }

    /// Records a member's (re)join and returns where its answer will come.
    fn update_member(&mut self, id: &str, req: &JoinRequest, now: Instant) -> Receiver<JoinAnswer> {
        let (tx, rx) = answer::channel();
        let m = self.members.get_mut(id).expect("known member");
        m.protocols = req.protocols.clone();
        m.session_timeout = req.session_timeout;
        m.rebalance_timeout = req.rebalance_timeout;
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        m.last_seen = now;
        if let Some(old) = m.join.replace(tx) {
            // A retried JoinGroup supersedes the earlier one.
            old.send(JoinAnswer::error(ResponseError::RebalanceInProgress, id));
        }
        rx
    }

    fn add_member(&mut self, id: String, req: JoinRequest, now: Instant) -> Answer<JoinAnswer> {
        let (tx, rx) = answer::channel();
        self.next_seq += 1;
        if let Some(instance) = &req.instance_id {
            self.statics.insert(instance.clone(), id.clone());
        }
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        self.members.insert(
            id,
            Member {
                instance_id: req.instance_id,
                client_id: req.client_id,
                client_host: req.client_host,
                session_timeout: req.session_timeout,
                rebalance_timeout: req.rebalance_timeout,
                protocols: req.protocols,
                assignment: Bytes::new(),
                join: Some(tx),
                sync: None,
                last_seen: now,
                seq: self.next_seq,
            },
        );
        if self.state == GroupState::PreparingRebalance {
            if let Some(ready) = self.join_ready_at {
                // Initial delay: every new member buys the others a little more time, within the
                // rebalance timeout.
                let limit = self.rebalance_started + self.max_rebalance_timeout();
                self.join_ready_at = Some(
                    ready
                        .max(now + self.config.initial_rebalance_delay)
                        .min(limit),
                );
            }
        }
        self.prepare_rebalance(now);
        self.maybe_complete_join(now);
        Answer::Later(rx)
    }

    fn replace_static(
        &mut self,
        old: String,
        req: JoinRequest,
        now: Instant,
    ) -> Answer<JoinAnswer> {
        let new = self.new_member_id(&req.client_id);
        // Captured before the replacement: a leader that cannot skip the assignment is told this.
        let old_leader = self.leader.clone();
        let Some(mut m) = self.members.remove(&old) else {
            self.statics
                .remove(req.instance_id.as_deref().unwrap_or(""));
            return self.add_member(new, req, now);
        };
        if let Some(tx) = m.join.take() {
            tx.send(JoinAnswer::error(ResponseError::FencedInstanceId, &old));
        }
        if let Some(tx) = m.sync.take() {
            tx.send(SyncAnswer::error(ResponseError::FencedInstanceId));
        }
        let protocol = self.protocol.clone().unwrap_or_default();
        let changed = m.metadata(&protocol)
            != req
                .protocols
                .iter()
                .find(|(n, _)| *n == protocol)
                .map(|(_, b)| b);
        self.members.insert(new.clone(), m);
        if let Some(instance) = &req.instance_id {
            self.statics.insert(instance.clone(), new.clone());
        }
        if self.leader.as_deref() == Some(&old) {
            self.leader = Some(new.clone());
        }
        if self.pending_sync.remove(&old) {
            self.pending_sync.insert(new.clone());
        }
        if self.state == GroupState::Stable && !changed {
            let m = self.members.get_mut(&new).expect("just inserted");
            m.protocols = req.protocols;
            m.session_timeout = req.session_timeout;
            m.rebalance_timeout = req.rebalance_timeout;
            m.client_id = req.client_id;
            m.client_host = req.client_host;
            m.last_seen = now;
            let leads = self.leader.as_deref() == Some(&new);
            if leads && !req.supports_skip_assignment {
                // Kafka's answer to a pre-v9 client: the old leader id (which is not the new
                // member id) and no members, so it syncs as a follower and keeps the assignment.
                let mut a = self.current_answer(&new, false);
                a.leader = old_leader.unwrap_or_default();
                a.members = Vec::new();
                return Answer::Now(a);
            }
            return Answer::Now(self.current_answer(&new, leads));
        }
        let rx = self.update_member(&new, &req, now);
        self.prepare_rebalance(now);
        self.maybe_complete_join(now);
        Answer::Later(rx)
    }

    /// The current generation's join answer for `member_id` (the leader gets the member list).
    fn current_answer(&self, member_id: &str, skip_assignment: bool) -> JoinAnswer {
        let leads = self.leader.as_deref() == Some(member_id);
        JoinAnswer {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if leads {
                self.joined_members()
            } else {
                Vec::new()
            },
            skip_assignment,
        }
    }

    fn joined_members(&self) -> Vec<JoinedMember> {
        let protocol = self.protocol.as_deref().unwrap_or("");
        let mut v: Vec<(&u64, JoinedMember)> = self
            .members
            .iter()
            .map(|(id, m)| {
                (
                    &m.seq,
                    JoinedMember {
                        member_id: id.clone(),
                        instance_id: m.instance_id.clone(),
                        metadata: m.metadata(protocol).cloned().unwrap_or_default(),
                    },
                )
            })
            .collect();
        v.sort_by_key(|(seq, _)| **seq);
        v.into_iter().map(|(_, m)| m).collect()
    }

    fn max_rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default()
    }

    fn prepare_rebalance(&mut self, now: Instant) {
        match self.state {
            GroupState::PreparingRebalance | GroupState::Dead => return,
            GroupState::CompletingRebalance => {
                for m in self.members.values_mut() {
                    if let Some(tx) = m.sync.take() {
                        tx.send(SyncAnswer::error(ResponseError::RebalanceInProgress));
                    }
                }
            }
            GroupState::Empty | GroupState::Stable => {}
        }
        self.pending_sync.clear();
        self.sync_deadline = None;
        let delay = self.config.initial_rebalance_delay;
        self.join_ready_at =
            (self.state == GroupState::Empty && !delay.is_zero()).then(|| now + delay);
        self.state = GroupState::PreparingRebalance;
        self.rebalance_started = now;
        self.rebalances += 1;
    }

    fn maybe_complete_join(&mut self, now: Instant) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined = self.pending.is_empty() && self.members.values().all(|m| m.join.is_some());
        let ready = self.join_ready_at.is_none_or(|t| now >= t);
        let timed_out = now >= self.rebalance_started + self.max_rebalance_timeout();
        if (all_joined && ready) || timed_out {
            self.complete_join(now);
        }
    }

    fn complete_join(&mut self, now: Instant) {
        // Dynamic members that did not rejoin are gone; static ones keep their slot until their
        // session expires (Kafka's onCompleteJoin).
        let absent: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.join.is_none() && m.instance_id.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in absent {
            self.remove_member(&id, ResponseError::UnknownMemberId);
        }
        if self.members.is_empty() {
            self.generation += 1;
            self.join_ready_at = None;
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
            return;
        }
        // The leader must be a member that rejoined (Kafka's maybeElectNewJoinedLeader).
        let leader_joined = self
            .leader
            .as_ref()
            .and_then(|l| self.members.get(l))
            .is_some_and(|m| m.join.is_some());
        if !leader_joined {
            let joined = self
                .members
                .iter()
                .filter(|(_, m)| m.join.is_some())
                .min_by_key(|(_, m)| m.seq)
                .map(|(id, _)| id.clone());
            match joined {
                Some(id) => self.leader = Some(id),
                None => {
                    // Only static members that did not rejoin are left: wait another rebalance
                    // timeout; their sessions expire them meanwhile if they do not come back.
                    log::warn!(
                        "group {}: no member rejoined; the rebalance waits for the static members",
                        self.id
                    );
                    self.rebalance_started = now;
                    self.join_ready_at = None;
                    return;
                }
            }
        }
        self.generation += 1;
        self.join_ready_at = None;
        self.protocol = self.select_protocol();
        self.state = GroupState::CompletingRebalance;
        self.pending_sync = self.members.keys().cloned().collect();
        self.sync_deadline = Some(now + self.max_rebalance_timeout());
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let answer = self.current_answer(&id, false);
            let m = self.members.get_mut(&id).expect("member");
            m.last_seen = now;
            m.assignment = Bytes::new();
            if let Some(tx) = m.join.take() {
                tx.send(answer);
            }
        }
    }

    /// The protocol every member supports that most members prefer (ties: the leader's order).
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().min_by_key(|m| m.seq)?;
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| self.members.values().all(|m| m.metadata(n).is_some()))
            .collect();
        let mut votes: HashMap<&str, usize> = HashMap::new();
        for m in self.members.values() {
            if let Some((n, _)) = m
                .protocols
                .iter()
                .find(|(n, _)| candidates.contains(&n.as_str()))
            {
                *votes.entry(n.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max()?;
        candidates
            .into_iter()
            .find(|c| votes.get(c) == Some(&best))
            .map(str::to_string)
    }

    /// Removes a member, answering its waiting requests with `why`.
    fn remove_member(&mut self, id: &str, why: ResponseError) {
        if let Some(mut m) = self.members.remove(id) {
            if let Some(tx) = m.join.take() {
                tx.send(JoinAnswer::error(why, id));
            }
            if let Some(tx) = m.sync.take() {
                tx.send(SyncAnswer::error(why));
            }
            if let Some(instance) = &m.instance_id {
                if self.statics.get(instance).is_some_and(|cur| cur == id) {
                    self.statics.remove(instance);
                }
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        self.pending_sync.remove(id);
        if self.pending_sync.is_empty() {
            self.sync_deadline = None;
        }
    }

    fn remove_member_and_rebalance(&mut self, id: &str, now: Instant) {
        self.remove_member(id, ResponseError::UnknownMemberId);
        if matches!(
            self.state,
            GroupState::Stable | GroupState::CompletingRebalance
        ) {
            self.prepare_rebalance(now);
        }
        self.maybe_complete_join(now);
    }

    /// Checks a request's member id, instance id and generation.
    fn check_member(
        &self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<(), ResponseError> {
        self.check_instance(member_id, instance)?;
        if !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// SyncGroup.
    pub fn sync(&mut self, req: SyncRequest, now: Instant) -> Answer<SyncAnswer> {
        if matches!(self.state, GroupState::Dead | GroupState::Empty) {
            return Answer::Now(SyncAnswer::error(ResponseError::UnknownMemberId));
        }
        if let Err(e) =
            self.check_member(&req.member_id, req.instance_id.as_deref(), req.generation)
        {
            return Answer::Now(SyncAnswer::error(e));
        }
        let mismatch = |ours: &Option<String>, theirs: &Option<String>| {
            theirs.as_ref().is_some_and(|t| ours.as_ref() != Some(t))
        };
        if mismatch(&self.protocol_type, &req.protocol_type)
            || mismatch(&self.protocol, &req.protocol_name)
        {
            return Answer::Now(SyncAnswer::error(ResponseError::InconsistentGroupProtocol));
        }
        self.touch(&req.member_id, now);
        if matches!(
            self.state,
            GroupState::CompletingRebalance | GroupState::Stable
        ) {
            self.pending_sync.remove(&req.member_id);
            if self.pending_sync.is_empty() {
                self.sync_deadline = None;
            }
        }
        match self.state {
            GroupState::PreparingRebalance => {
                Answer::Now(SyncAnswer::error(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => Answer::Now(self.assignment_of(&req.member_id)),
            GroupState::CompletingRebalance => {
                let (tx, rx) = answer::channel();
                let m = self.members.get_mut(&req.member_id).expect("checked");
                if let Some(old) = m.sync.replace(tx) {
                    old.send(SyncAnswer::error(ResponseError::RebalanceInProgress));
                }
                if self.leader.as_deref() == Some(req.member_id.as_str()) {
                    let mut given: HashMap<String, Bytes> = req.assignments.into_iter().collect();
                    for (id, m) in self.members.iter_mut() {
                        m.assignment = given.remove(id).unwrap_or_default();
                    }
                    self.state = GroupState::Stable;
                    let ids: Vec<String> = self.members.keys().cloned().collect();
                    for id in ids {
                        let answer = self.assignment_of(&id);
                        let m = self.members.get_mut(&id).expect("member");
                        if let Some(tx) = m.sync.take() {
                            // Its session starts over with its assignment (Kafka's
                            // propagateAssignment), however long the leader took.
                            m.last_seen = now;
                            tx.send(answer);
                        }
                    }
                }
                Answer::Later(rx)
            }
            GroupState::Empty | GroupState::Dead => unreachable!("checked above"),
        }
    }

    fn assignment_of(&self, member_id: &str) -> SyncAnswer {
        SyncAnswer {
            error: None,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self
                .members
                .get(member_id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    /// Heartbeat: `None` is success.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Option<ResponseError> {
        if matches!(self.state, GroupState::Dead | GroupState::Empty) {
            return Some(ResponseError::UnknownMemberId);
        }
        if let Err(e) = self.check_member(member_id, instance, generation) {
            return Some(e);
        }
        self.touch(member_id, now);
        match self.state {
            GroupState::PreparingRebalance => Some(ResponseError::RebalanceInProgress),
            _ => None,
        }
    }

    /// LeaveGroup for one member (by member id, or by instance id for static members).
    pub fn leave(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        now: Instant,
    ) -> Option<ResponseError> {
        let id = match instance {
            Some(instance) => match self.statics.get(instance) {
                None => return Some(ResponseError::UnknownMemberId),
                Some(cur) if !member_id.is_empty() && cur != member_id => {
                    return Some(ResponseError::FencedInstanceId)
                }
                Some(cur) => cur.clone(),
            },
            None => member_id.to_string(),
        };
        if self.pending.remove(&id).is_some() {
            self.maybe_complete_join(now);
            return None;
        }
        if !self.members.contains_key(&id) {
            return Some(ResponseError::UnknownMemberId);
        }
        self.remove_member_and_rebalance(&id, now);
        None
    }

    /// Whether an OffsetCommit from this member may be written now.
    pub fn check_commit(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        match self.state {
            GroupState::Empty if generation < 0 => return Ok(()),
            GroupState::Dead => return Err(ResponseError::CoordinatorNotAvailable),
            GroupState::CompletingRebalance => {
                // A valid member of this generation that commits before it has its assignment.
                self.check_member(member_id, instance, generation)?;
                return Err(ResponseError::RebalanceInProgress);
            }
            _ => {}
        }
        self.check_member(member_id, instance, generation)?;
        self.touch(member_id, now);
        Ok(())
    }

    /// Whether a TxnOffsetCommit from this member is allowed (Kafka's KIP-447 checks): a static
    /// instance owned by another member id is fenced, a member id given must be known, and a
    /// generation given (>= 0) must be the current one. Generation -1 with no member id is what
    /// clients before KIP-447 send, and is allowed in any state but `Dead`. Unlike OffsetCommit,
    /// a rebalance in progress does not refuse it (the transaction is already under way).
    pub fn check_txn_commit(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        self.check_instance(member_id, instance)?;
        if !member_id.is_empty() && !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation >= 0 && generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        self.touch(member_id, now);
        Ok(())
    }

    /// Expires sessions, unanswered member ids and rebalances that ran out of time.
    pub fn tick(&mut self, now: Instant) {
        let before = self.pending.len();
        self.pending.retain(|_, deadline| *deadline > now);
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.join.is_none() && m.sync.is_none() && now >= m.last_seen + m.session_timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            log::info!("group {}: member {id} expired (session timeout)", self.id);
            self.remove_member_and_rebalance(id, now);
        }
        if self.pending.len() != before {
            log::debug!("group {}: unanswered member ids expired", self.id);
        }
        if self.sync_deadline.is_some_and(|d| now >= d)
            && matches!(
                self.state,
                GroupState::CompletingRebalance | GroupState::Stable
            )
        {
            let mut late: Vec<String> = self.pending_sync.drain().collect();
            late.sort();
            self.sync_deadline = None;
            for id in &late {
                log::info!(
                    "group {}: member {id} removed (no SyncGroup within the rebalance timeout)",
                    self.id
                );
                self.remove_member_and_rebalance(id, now);
            }
        }
        self.maybe_complete_join(now);
    }

    /// Answers every waiting request with `why` (the core is stopping, the group is deleted).
    pub fn cancel_waiters(&mut self, why: ResponseError) {
        for (id, m) in self.members.iter_mut() {
            if let Some(tx) = m.join.take() {
                tx.send(JoinAnswer::error(why, id));
            }
            if let Some(tx) = m.sync.take() {
                tx.send(SyncAnswer::error(why));
            }
        }
    }

    /// Marks the group deleted (DeleteGroups: only an empty group may be deleted).
    pub fn mark_dead(&mut self) {
        self.cancel_waiters(ResponseError::CoordinatorNotAvailable);
        self.state = GroupState::Dead;
    }
}

#[cfg(test)]
mod tests;
