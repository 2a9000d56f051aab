//! Consumer groups of the consumer group protocol (KIP-848, `group.protocol=consumer`): members
//! heartbeat (ConsumerGroupHeartbeat) with their subscriptions and the partitions they own, and
//! the coordinator assigns. Pure and synchronous, like the classic group's state machine.
//!
//! The group epoch moves whenever what the assignment depends on changes: a member joins or
//! leaves, a subscription changes, a subscribed topic appears, goes or grows (regular expressions
//! are evaluated again as topics come and go). The target assignment is then computed again by the
//! group's assignor, at that epoch, and each member reconciles towards its part of it one
//! heartbeat at a time (see `reconcile`): partitions are revoked before they are given to another
//! member. Static members (`group.instance.id`) that leave with epoch -2 keep their partitions
//! until their session times out, and a new member with the same instance id takes them over
//! without a new assignment.
//!
//! ## Layout, top layer first
//! - `saved`     — a group as a clean stop saves it and the next start loads it.
//! - `reconcile` — one member's way to its target: revoke, then assign what others released.
//! - `assign`    — the server-side assignors, `uniform` and `range`.

mod assign;
mod reconcile;
mod saved;

pub use assign::ASSIGNORS;
pub use reconcile::MemberState;
pub use saved::{SavedGroup, SavedGroups, SAVED_FILE};

use kafka_protocol::error::ResponseError;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

/// A topic's id, as the protocol names topics in assignments.
pub type TopicId = uuid::Uuid;

/// Partitions by topic.
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// A heartbeat's refusal: its error code and message.
pub type Refusal = (ResponseError, String);

/// The coordinator's settings for consumer groups (broker flags).
#[derive(Debug, Clone, Copy)]
pub struct ConsumerConfig {
    /// A member that sends no heartbeat for this long is removed.
    pub session_timeout: Duration,
    /// How often members heartbeat.
    pub heartbeat_interval: Duration,
    /// The assignor of a group whose members ask for none.
    pub default_assignor: &'static str,
}

/// The topics a subscription may name: name -> (id, partition count).
pub type Topics = BTreeMap<String, (TopicId, i32)>;

/// One ConsumerGroupHeartbeat, as the coordinator takes it.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    pub version: i16,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_names: Option<Vec<String>>,
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns now (`None`: unchanged since its last heartbeat).
    pub owned: Option<Assignment>,
    /// The revision of the topic table `topics` shows, when every member sees the same one: the
    /// subscriptions are then matched against it again only when it or the group epoch moved.
    /// `None` (a view filtered by this member's ACLs): matched at every heartbeat.
    pub topics_revision: Option<u64>,
    pub client_id: String,
    pub client_host: String,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, when it changed (or the member must be told it again).
    pub assignment: Option<Assignment>,
}

/// One member of a consumer group.
#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout: Duration,
    pub names: Vec<String>,
    pub regex: Option<String>,
    compiled: Option<regex::Regex>,
    pub assignor: Option<String>,
    pub epoch: i32,
    previous_epoch: i32,
    /// Whether the member still has every partition it had at `previous_epoch` (it moved on
    /// without revoking).
    kept_all: bool,
    pub state: MemberState,
    pub assigned: Assignment,
    pub revoking: Assignment,
    session_deadline: Instant,
    revoke_deadline: Option<Instant>,
}

impl Member {
    /// The topics of `topics` this member subscribes to, by name or by its expression.
    fn subscribed<'a, 's>(
        &'s self,
        topics: &'a Topics,
    ) -> impl Iterator<Item = (&'a String, &'a (TopicId, i32))> + use<'a, 's> {
        let names: HashSet<&str> = self.names.iter().map(String::as_str).collect();
        let regex = self.compiled.clone();
        topics.iter().filter(move |(name, _)| {
            names.contains(name.as_str()) || regex.as_ref().is_some_and(|r| r.is_match(name))
        })
    }
}

/// A group's state as DescribeGroups, ListGroups and ConsumerGroupDescribe name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    Empty,
    Assigning,
    Reconciling,
    Stable,
}

impl ConsumerGroupState {
    pub const ALL: [Self; 4] = [
        Self::Empty,
        Self::Assigning,
        Self::Reconciling,
        Self::Stable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Assigning => "Assigning",
            Self::Reconciling => "Reconciling",
            Self::Stable => "Stable",
        }
    }
}

/// One consumer group.
#[derive(Debug)]
pub struct ConsumerGroup {
    pub id: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    /// group.instance.id -> member id.
    statics: HashMap<String, String>,
    /// Every member's target assignment at `assignment_epoch`.
    target: BTreeMap<String, Assignment>,
    /// The subscribed topics (name -> id, partitions) the target was computed for.
    subscribed: Topics,
    /// The topic table revision and group epoch `subscribed` was matched at (see
    /// [`Heartbeat::topics_revision`]).
    subscribed_at: Option<(u64, i32)>,
    /// The assignor the target was computed with.
    pub assignor: &'static str,
    /// Times the group epoch moved, for metrics.
    pub rebalances: u64,
}

impl ConsumerGroup {
    pub fn new(id: &str) -> Self {
        ConsumerGroup {
            id: id.to_string(),
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            statics: HashMap::new(),
            target: BTreeMap::new(),
            subscribed: Topics::new(),
            assignor: ASSIGNORS[0],
            rebalances: 0,
            subscribed_at: None,
        }
    }

    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.group_epoch > self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self.members.values().any(|m| {
            m.epoch >= 0 && (m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        }) {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// The names of the topics the members subscribe to.
    pub fn subscribed_names(&self) -> HashSet<String> {
        self.subscribed.keys().cloned().collect()
    }

    /// A member's target assignment.
    pub fn target_of(&self, member_id: &str) -> Assignment {
        self.target.get(member_id).cloned().unwrap_or_default()
    }

    /// Whether `member_id` may commit or fetch offsets at `epoch` (OffsetCommit v9+, OffsetFetch
    /// v9+): an unknown member is `UNKNOWN_MEMBER_ID`, another epoch `STALE_MEMBER_EPOCH`. The
    /// epoch before its current one is still taken when the member only gained partitions on the
    /// way (a member commits what it read before the answer that moved it on arrived): every
    /// partition it had then is still its own. After a revocation it is not: the old epoch is the
    /// one it owned the revoked partitions at.
    pub fn check_member_epoch(&self, member_id: &str, epoch: i32) -> Result<(), ResponseError> {
        match self.members.get(member_id) {
            None => Err(ResponseError::UnknownMemberId),
            Some(m) if epoch >= 0 && epoch == m.epoch => Ok(()),
            Some(m) if epoch >= 0 && epoch == m.previous_epoch && m.kept_all => Ok(()),
            Some(_) => Err(ResponseError::StaleMemberEpoch),
        }
    }

    fn bump(&mut self) {
        self.group_epoch += 1;
        self.rebalances += 1;
    }

    /// Handles one heartbeat. `topics` is every topic there is now.
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        topics: &Topics,
        config: &ConsumerConfig,
        now: Instant,
    ) -> Result<Answer, Refusal> {
        let (member_id, created) = match hb.member_epoch {
            -1 => return self.leave(&hb),
            -2 => return self.leave_for_now(&hb),
            0 => self.join(&hb, now)?,
            e if e > 0 => (self.check_epoch(&hb)?, false),
            e => return Err(invalid(format!("member epoch {e} is not valid"))),
        };
        let joined = hb.member_epoch == 0;
        // A new member, or a changed subscription, moves the group epoch (once).
        if self.update_member(&member_id, &hb, config, now)? || created {
            self.bump();
        }
        // Every member's subscription against every topic: only when something it depends on
        // moved, not at each heartbeat of each member.
        let at = hb.topics_revision.map(|r| (r, self.group_epoch));
        if at.is_none() || at != self.subscribed_at {
            let subscribed = self.subscribed_topics(topics);
            if subscribed != self.subscribed {
                self.subscribed = subscribed;
                self.bump();
            }
            self.subscribed_at = hb.topics_revision.map(|r| (r, self.group_epoch));
        }
        if self.group_epoch > self.assignment_epoch {
            self.compute_target(config);
        }
        let before = self.members[&member_id].assigned.clone();
        self.reconcile(&member_id, hb.owned.as_ref(), now);
        let m = &self.members[&member_id];
        let tell =
            joined || m.assigned != before || hb.owned.as_ref().is_some_and(|o| *o != m.assigned);
        Ok(Answer {
            member_id,
            member_epoch: m.epoch,
            heartbeat_interval_ms: config.heartbeat_interval.as_millis().min(i32::MAX as u128)
                as i32,
            assignment: tell.then(|| m.assigned.clone()),
        })
    }

    /// A member joins (epoch 0): a new one, one that joins again (its partitions are freed), or a
    /// static member taking over the partitions its instance had. Returns its id and whether it
    /// is a new member.
    fn join(&mut self, hb: &Heartbeat, now: Instant) -> Result<(String, bool), Refusal> {
        if hb.rebalance_timeout_ms <= 0 {
            return Err(invalid(
                "a joining member must give its rebalance timeout".into(),
            ));
        }
        if hb.subscribed_names.is_none() && hb.subscribed_regex.is_none() {
            return Err(invalid(
                "a joining member must give its subscription".into(),
            ));
        }
        if hb.owned.is_none() {
            return Err(invalid(
                "a joining member must give the partitions it owns".into(),
            ));
        }
        if hb.instance_id.as_deref() == Some("") || hb.rack_id.as_deref() == Some("") {
            return Err(invalid("an instance or rack id must not be empty".into()));
        }
        let id = match (hb.version, hb.member_id.is_empty()) {
            // v0: the coordinator names a new member; one fenced earlier keeps its id.
            (0, true) => uuid::Builder::from_random_bytes(rand::random())
                .into_uuid()
                .to_string(),
            (_, true) => return Err(invalid("a member must give its member id".into())),
            (_, false) if hb.member_id.len() > 255 => {
                return Err(invalid("the member id is too long".into()))
            }
            (_, false) => hb.member_id.clone(),
        };
        if let Some(m) = self.members.get(&id) {
            if hb.instance_id.is_some() && m.instance_id != hb.instance_id {
                return Err(fenced_instance(&id));
            }
        }
        if let Some(instance) = &hb.instance_id {
            match self.statics.get(instance).cloned() {
                Some(old) if old != id && self.members.contains_key(&old) => {
                    return self
                        .replace_static(&old, &id, instance)
                        .map(|()| (id, false));
                }
                // A stale entry (its member is gone): the instance starts over.
                Some(old) if old != id => {
                    self.statics.remove(instance);
                }
                _ => {}
            }
        }
        match self.members.get_mut(&id) {
            // Joining again: it starts over (what it had is free for others).
            Some(m) => {
                m.epoch = 0;
                m.previous_epoch = -1;
                m.kept_all = false;
                m.state = MemberState::Stable;
                m.assigned.clear();
                m.revoking.clear();
                m.revoke_deadline = None;
                Ok((id, false))
            }
            None => {
                self.members.insert(id.clone(), fresh_member(&id, hb, now));
                if let Some(instance) = &hb.instance_id {
                    self.statics.insert(instance.clone(), id.clone());
                }
                Ok((id, true))
            }
        }
    }

    /// A static member's new incarnation (`id`) takes over the old one's partitions, epoch and
    /// target, if the old one left (epoch -2); while it is still there: `UNRELEASED_INSTANCE_ID`.
    fn replace_static(&mut self, old: &str, id: &str, instance: &str) -> Result<(), Refusal> {
        if self.members.contains_key(id) {
            return Err(fenced_instance(id));
        }
        let left = self.members.get(old).is_none_or(|m| m.epoch == -2);
        if !left {
            return Err((
                ResponseError::UnreleasedInstanceId,
                format!("static member {instance} is still in the group as {old}"),
            ));
        }
        if let Some(mut m) = self.members.remove(old) {
            m.id = id.to_string();
            m.epoch = m.previous_epoch.max(0);
            self.members.insert(id.to_string(), m);
        }
        if let Some(t) = self.target.remove(old) {
            self.target.insert(id.to_string(), t);
        }
        self.statics.insert(instance.to_string(), id.to_string());
        Ok(())
    }

    /// An existing member's heartbeat at its epoch, or at its previous one when the answer that
    /// moved it on was lost (it then owns no more than it is assigned); else `FENCED_MEMBER_EPOCH`.
    fn check_epoch(&self, hb: &Heartbeat) -> Result<String, Refusal> {
        let Some(m) = self.members.get(&hb.member_id) else {
            return Err((
                ResponseError::UnknownMemberId,
                format!("member {} is not in group {}", hb.member_id, self.id),
            ));
        };
        // Fields that did not change are left out (null) of later heartbeats.
        if hb.instance_id.is_some() && m.instance_id != hb.instance_id {
            return Err(fenced_instance(&m.id));
        }
        if m.epoch == -2 {
            return Err((
                ResponseError::FencedMemberEpoch,
                format!("static member {} left; it must join again", m.id),
            ));
        }
        let lost_answer = hb.member_epoch == m.previous_epoch
            && hb.owned.as_ref().is_some_and(|o| {
                o.iter()
                    .all(|(t, ps)| m.assigned.get(t).is_some_and(|a| ps.is_subset(a)))
            });
        if hb.member_epoch != m.epoch && !lost_answer {
            return Err((
                ResponseError::FencedMemberEpoch,
                format!(
                    "member {} sent epoch {}; its epoch is {}",
                    m.id, hb.member_epoch, m.epoch
                ),
            ));
        }
        Ok(m.id.clone())
    }

    /// Takes what the heartbeat sets (fields it leaves null keep their value); true when the
    /// subscription or the assignor changed (the group epoch then moves).
    fn update_member(
        &mut self,
        id: &str,
        hb: &Heartbeat,
        config: &ConsumerConfig,
        now: Instant,
    ) -> Result<bool, Refusal> {
        if let Some(a) = hb.server_assignor.as_deref() {
            if !ASSIGNORS.contains(&a) {
                return Err((
                    ResponseError::UnsupportedAssignor,
                    format!("assignor {a} is not one of {}", ASSIGNORS.join(", ")),
                ));
            }
        }
        let compiled = match hb.subscribed_regex.as_deref() {
            Some("") | None => None,
            Some(r) => Some(compile(r)?),
        };
        let m = self.members.get_mut(id).expect("checked");
        m.session_deadline = now + config.session_timeout;
        m.client_id.clone_from(&hb.client_id);
        m.client_host.clone_from(&hb.client_host);
        if hb.rack_id.is_some() {
            m.rack_id.clone_from(&hb.rack_id);
        }
        if hb.rebalance_timeout_ms > 0 {
            m.rebalance_timeout = Duration::from_millis(hb.rebalance_timeout_ms as u64);
        }
        let mut changed = false;
        if let Some(names) = &hb.subscribed_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            changed |= names != m.names;
            m.names = names;
        }
        if let Some(r) = &hb.subscribed_regex {
            let r = (!r.is_empty()).then(|| r.clone());
            changed |= r != m.regex;
            m.regex = r;
            m.compiled = compiled;
        }
        if hb.server_assignor.is_some() && hb.server_assignor != m.assignor {
            m.assignor.clone_from(&hb.server_assignor);
            changed = true;
        }
        Ok(changed)
    }

    /// Every topic some member subscribes to.
    fn subscribed_topics(&self, topics: &Topics) -> Topics {
        let mut out = Topics::new();
        for m in self.members.values() {
            for (name, meta) in m.subscribed(topics) {
                out.insert(name.clone(), *meta);
            }
        }
        out
    }

    /// The target assignment at the group epoch: the assignor most members ask for (else the
    /// broker's default) over every member's subscribed topics.
    fn compute_target(&mut self, config: &ConsumerConfig) {
        let mut asked: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.assignor.as_deref() {
                *asked.entry(a).or_default() += 1;
            }
        }
        let assignor = asked
            .into_iter()
            .max_by_key(|&(a, n)| (n, std::cmp::Reverse(a)))
            .and_then(|(a, _)| ASSIGNORS.iter().find(|&&k| k == a).copied())
            .unwrap_or(config.default_assignor);
        let partitions: BTreeMap<TopicId, i32> = self.subscribed.values().copied().collect();
        let members: BTreeMap<String, BTreeSet<TopicId>> = self
            .members
            .values()
            .map(|m| {
                let ids = m
                    .subscribed(&self.subscribed)
                    .map(|(_, (id, _))| *id)
                    .collect();
                (m.id.clone(), ids)
            })
            .collect();
        let input = assign::Input {
            members: &members,
            partitions: &partitions,
            previous: &self.target,
        };
        self.target = assign::assign(assignor, &input);
        self.assignor = assignor;
        self.assignment_epoch = self.group_epoch;
    }

    /// Moves a member one step towards its target (see `reconcile`); `owned` is what it reports.
    fn reconcile(&mut self, id: &str, owned: Option<&Assignment>, now: Instant) {
        let target = self.target_of(id);
        let target_epoch = self.assignment_epoch;
        let m = &self.members[id];
        let waiting = match m.state {
            MemberState::UnrevokedPartitions => {
                !owned.is_some_and(|o| reconcile::released(o, &m.revoking))
            }
            MemberState::Stable => m.epoch == target_epoch,
            MemberState::UnreleasedPartitions => false,
        };
        if waiting {
            return;
        }
        let others: HashSet<(TopicId, i32)> = self
            .members
            .values()
            .filter(|o| o.id != id)
            .flat_map(|o| o.assigned.iter().chain(&o.revoking))
            .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
            .collect();
        let m = self.members.get_mut(id).expect("a member");
        let revoked = m.state == MemberState::UnrevokedPartitions;
        let step = reconcile::next_step(m.epoch, &m.assigned, &target, target_epoch, &others);
        if step.epoch != m.epoch {
            m.previous_epoch = m.epoch;
            m.kept_all = !revoked;
        }
        m.revoke_deadline = match step.state {
            MemberState::UnrevokedPartitions => Some(now + m.rebalance_timeout),
            _ => None,
        };
        m.state = step.state;
        m.epoch = step.epoch;
        m.assigned = step.assigned;
        m.revoking = step.revoking;
    }

    /// A member leaves (epoch -1): its partitions are free, and the group epoch moves.
    fn leave(&mut self, hb: &Heartbeat) -> Result<Answer, Refusal> {
        let id = match &hb.instance_id {
            Some(i) => match self.statics.get(i) {
                Some(m) if *m == hb.member_id => m.clone(),
                Some(_) => return Err(fenced_instance(&hb.member_id)),
                None => return Err(unknown(hb)),
            },
            None if self.members.contains_key(&hb.member_id) => hb.member_id.clone(),
            None => return Err(unknown(hb)),
        };
        self.remove(&id);
        Ok(Answer {
            member_id: hb.member_id.clone(),
            member_epoch: -1,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    /// A static member leaves for now (epoch -2): it keeps its partitions until its session times
    /// out or its instance joins again.
    fn leave_for_now(&mut self, hb: &Heartbeat) -> Result<Answer, Refusal> {
        if hb.instance_id.is_none() {
            return Err(invalid(
                "only a static member may leave with epoch -2".into(),
            ));
        }
        let m = self
            .members
            .get_mut(&hb.member_id)
            .ok_or_else(|| unknown(hb))?;
        if m.instance_id != hb.instance_id {
            return Err((
                ResponseError::FencedInstanceId,
                format!("member {} is not instance {:?}", m.id, hb.instance_id),
            ));
        }
        if m.epoch != -2 {
            m.previous_epoch = m.epoch;
        }
        m.epoch = -2;
        // What it was giving up is released: it owns nothing it was revoking any more.
        m.revoking.clear();
        m.revoke_deadline = None;
        if m.state == MemberState::UnrevokedPartitions {
            m.state = MemberState::Stable;
        }
        Ok(Answer {
            member_id: hb.member_id.clone(),
            member_epoch: -2,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    fn remove(&mut self, id: &str) {
        if let Some(m) = self.members.remove(id) {
            if let Some(i) = &m.instance_id {
                if self.statics.get(i).is_some_and(|s| s == id) {
                    self.statics.remove(i);
                }
            }
            self.target.remove(id);
            self.bump();
        }
    }

    /// Removes the members whose session timed out, or that did not revoke within their
    /// rebalance timeout; returns their ids.
    pub fn tick(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.session_deadline <= now || m.revoke_deadline.is_some_and(|d| d <= now))
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            self.remove(id);
        }
        expired
    }

    /// Whether it has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

fn invalid(why: String) -> Refusal {
    (ResponseError::InvalidRequest, why)
}

fn fenced_instance(member_id: &str) -> Refusal {
    (
        ResponseError::FencedInstanceId,
        format!("member {member_id} does not hold that instance id"),
    )
}

/// A member as its first heartbeat makes it (the heartbeat's fields are taken next).
fn fresh_member(id: &str, hb: &Heartbeat, now: Instant) -> Member {
    Member {
        id: id.to_string(),
        instance_id: hb.instance_id.clone(),
        rack_id: None,
        client_id: String::new(),
        client_host: String::new(),
        rebalance_timeout: Duration::ZERO,
        names: Vec::new(),
        regex: None,
        compiled: None,
        assignor: None,
        epoch: 0,
        previous_epoch: -1,
        kept_all: false,
        state: MemberState::Stable,
        assigned: Assignment::new(),
        revoking: Assignment::new(),
        session_deadline: now,
        revoke_deadline: None,
    }
}

fn unknown(hb: &Heartbeat) -> Refusal {
    (
        ResponseError::UnknownMemberId,
        format!("member {} is not in the group", hb.member_id),
    )
}

/// A subscription's regular expression, whole-name matching as Kafka's (RE2/J) `matches()`.
fn compile(r: &str) -> Result<regex::Regex, Refusal> {
    regex::RegexBuilder::new(&format!("^(?:{r})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            (
                ResponseError::InvalidRegularExpression,
                format!("{r:?}: {e}"),
            )
        })
}

#[cfg(test)]
mod tests;
