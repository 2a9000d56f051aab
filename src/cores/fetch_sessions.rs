//! A core's incremental fetch sessions (KIP-227): each session's id and epoch, the partitions it
//! covers with what its last response told the client about each, and the bounded cache that holds
//! them, evicting as Kafka's `FetchSessionCache` does. A session lives on the core its client
//! fetches from (each core is a broker of its own); which partitions a request reads and which
//! ones its response carries are decided here, the reads themselves are the fetch handler's.

use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// The session id of a fetch outside any session.
pub const NO_SESSION: i32 = 0;
/// The epoch of a full fetch that asks for a new session.
pub const INITIAL_EPOCH: i32 = 0;
/// The epoch of a full fetch that wants no session (and closes the one it names).
pub const FINAL_EPOCH: i32 = -1;

/// Most bytes one session's partition list may take (each partition costs [`PARTITION_COST`]
/// plus its topic's name or id): incremental requests add partitions to a session, and nothing
/// else bounds how many a client adds over many requests.
pub const MAX_SESSION_BYTES: usize = 4 << 20;
/// What one partition of a session costs against [`MAX_SESSION_BYTES`], besides its topic bytes.
pub const PARTITION_COST: usize = 96;

/// How many sessions a core keeps, and when an unused one may be evicted for a new one.
#[derive(Debug, Clone, Copy)]
pub struct FetchSessionConfig {
    /// Sessions per core at most (Kafka's `max.incremental.fetch.session.cache.slots`); 0: none,
    /// every fetch is a full one.
    pub max_sessions: usize,
    /// A session unused for longer than this is evicted first when a new one needs its slot.
    pub eviction_timeout: Duration,
}

impl Default for FetchSessionConfig {
    fn default() -> Self {
        Self {
            max_sessions: 1000,
            eviction_timeout: Duration::from_secs(120),
        }
    }
}

/// Why a session fetch is refused (Kafka's error codes are the front end's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionError {
    /// No session with that id on this core (never made, closed, or evicted).
    NotFound,
    /// The request's epoch is not the one the session expects next.
    InvalidEpoch,
    /// The session names topics by id and the request by name, or the other way round.
    TopicIdMismatch,
}

/// What one partition's answer told the client: an incremental response carries a partition
/// again only when this changed, or it has records, an error, or another broker to fetch from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub error_code: i16,
    pub has_records: bool,
    pub redirected: bool,
}

/// One partition of a session: where the client reads it from (its requests change that), and
/// what the last response told it.
#[derive(Debug, Clone)]
pub struct SessionPartition {
    /// The topic's name (sessions of Fetch v12 and older) or its 16 id bytes (v13+).
    pub topic: Bytes,
    pub partition: i32,
    pub fetch_offset: i64,
    pub max_bytes: i32,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

impl SessionPartition {
    pub fn new(topic: Bytes, partition: i32, fetch_offset: i64, max_bytes: i32) -> Self {
        // Never answered: -1 differs from whatever the first answer says.
        Self {
            topic,
            partition,
            fetch_offset,
            max_bytes,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
        }
    }

    /// Whether `a` goes in the response; keeps what it tells. An error leaves the high watermark
    /// unknown (-1), so the partition is answered again once the error is gone.
    fn answer(&mut self, a: &Answer) -> bool {
        let mut must = a.has_records || a.redirected || a.error_code != 0;
        must |= self.high_watermark != a.high_watermark
            || self.last_stable_offset != a.last_stable_offset
            || self.log_start_offset != a.log_start_offset;
        self.high_watermark = if a.error_code != 0 {
            -1
        } else {
            a.high_watermark
        };
        self.last_stable_offset = a.last_stable_offset;
        self.log_start_offset = a.log_start_offset;
        must
    }

    fn cost(&self) -> usize {
        PARTITION_COST + self.topic.len()
    }
}

/// One incremental fetch session.
#[derive(Debug)]
pub struct FetchSession {
    id: i32,
    /// The epoch the next request must carry.
    epoch: i32,
    /// Topics named by id (the session began with Fetch v13+), else by name.
    by_id: bool,
    /// Partitions by slot: a slot stays put while the session's order changes.
    slots: Vec<Option<SessionPartition>>,
    free: Vec<u32>,
    /// (topic, partition) -> slot.
    index: HashMap<(Bytes, i32), u32>,
    /// The slots in the order a fetch reads them: partitions that had records go to the end, so
    /// the response budget is shared out in turn (as Kafka does).
    order: Vec<u32>,
    bytes: usize,
    /// Moves whenever the partition list or its order changes: an answer for an older list is
    /// not matched against this one by position.
    generation: u64,
    last_used: Instant,
}

impl FetchSession {
    fn new(id: i32, by_id: bool, now: Instant) -> Self {
        Self {
            id,
            epoch: next_epoch(INITIAL_EPOCH),
            by_id,
            slots: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            order: Vec::new(),
            bytes: 0,
            generation: 0,
            last_used: now,
        }
    }

    pub fn id(&self) -> i32 {
        self.id
    }

    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The partitions in the order a fetch reads them.
    pub fn partitions(&self) -> impl Iterator<Item = &SessionPartition> {
        self.order
            .iter()
            .filter_map(|&s| self.slots[s as usize].as_ref())
    }

    /// A partition the request lists: added, or its fetch offset and size updated.
    pub fn want(&mut self, topic: &Bytes, partition: i32, fetch_offset: i64, max_bytes: i32) {
        if let Some(&slot) = self.index.get(&(topic.clone(), partition)) {
            if let Some(p) = self.slots[slot as usize].as_mut() {
                p.fetch_offset = fetch_offset;
                p.max_bytes = max_bytes;
            }
            return;
        }
        let p = SessionPartition::new(topic.clone(), partition, fetch_offset, max_bytes);
        self.bytes += p.cost();
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(p);
                s
            }
            None => {
                self.slots.push(Some(p));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert((topic.clone(), partition), slot);
        self.order.push(slot);
        self.generation += 1;
    }

    /// A partition the request's `forgotten_topics_data` lists: removed (if the session has it).
    pub fn forget(&mut self, topic: &Bytes, partition: i32) {
        let Some(slot) = self.index.remove(&(topic.clone(), partition)) else {
            return;
        };
        if let Some(p) = self.slots[slot as usize].take() {
            self.bytes -= p.cost();
        }
        self.free.push(slot);
        self.order.retain(|&s| s != slot);
        self.generation += 1;
    }

    /// Takes the answers of a fetch planned at `generation`, one per partition in
    /// [`partitions`](Self::partitions)' order, and says which go in the response; partitions that
    /// had records move to the end of the order. Answers for another generation (the session
    /// changed while the fetch ran) all go in the response and change nothing.
    pub fn answer(&mut self, generation: u64, answers: &[Answer]) -> Vec<bool> {
        if generation != self.generation || answers.len() != self.order.len() {
            return vec![true; answers.len()];
        }
        let mut keep = Vec::with_capacity(answers.len());
        for (&slot, a) in self.order.iter().zip(answers) {
            let p = self.slots[slot as usize].as_mut();
            keep.push(p.is_none_or(|p| p.answer(a)));
        }
        if answers.iter().any(|a| a.has_records) {
            let quiet = self
                .order
                .iter()
                .zip(answers)
                .filter(|(_, a)| !a.has_records);
            let read = self
                .order
                .iter()
                .zip(answers)
                .filter(|(_, a)| a.has_records);
            self.order = quiet.chain(read).map(|(&s, _)| s).collect();
            self.generation += 1;
        }
        keep
    }
}

/// Kafka's next epoch: one up, wrapping from `i32::MAX` to 1 (0 and -1 mean full fetches).
pub fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// What a request's session id and epoch make of it (Kafka's `FetchManager.newContext`).
#[derive(Debug)]
pub enum Begun<'a> {
    /// A full fetch answered outside any session (session id 0).
    Sessionless,
    /// A full fetch whose answer starts a new session ([`FetchSessions::create`]).
    Full,
    /// A fetch in this session, its partitions already updated by the request and its epoch
    /// moved on.
    Incremental(&'a mut FetchSession),
}

/// The sessions of one core.
#[derive(Debug)]
pub struct FetchSessions {
    config: FetchSessionConfig,
    sessions: HashMap<i32, FetchSession>,
    /// (last used, id), least recently used first.
    by_use: BTreeSet<(Instant, i32)>,
    evictions: u64,
}

impl FetchSessions {
    pub fn new(config: FetchSessionConfig) -> Self {
        Self {
            config,
            sessions: HashMap::new(),
            by_use: BTreeSet::new(),
            evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Sessions evicted for new ones so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    pub fn get(&self, id: i32) -> Option<&FetchSession> {
        self.sessions.get(&id)
    }

    pub fn get_mut(&mut self, id: i32) -> Option<&mut FetchSession> {
        self.sessions.get_mut(&id)
    }

    /// Starts a fetch with session `id` at `epoch`, as Kafka does: epoch 0 or -1 is a full fetch
    /// (closing the session it names; 0 asks for a new one); any other epoch must be the named
    /// session's next one, and the request's partitions and forgotten ones are applied to it by
    /// `update`. A session left empty is closed (the fetch is then sessionless), and one grown
    /// past [`MAX_SESSION_BYTES`] is closed and refused as not found: the client starts over
    /// with a full fetch.
    pub fn begin(
        &mut self,
        id: i32,
        epoch: i32,
        by_id: bool,
        now: Instant,
        update: impl FnOnce(&mut FetchSession),
    ) -> Result<Begun<'_>, SessionError> {
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            if id != NO_SESSION {
                self.remove(id);
            }
            return Ok(if epoch == FINAL_EPOCH {
                Begun::Sessionless
            } else {
                Begun::Full
            });
        }
        let session = self.sessions.get_mut(&id).ok_or(SessionError::NotFound)?;
        if session.epoch != epoch {
            return Err(SessionError::InvalidEpoch);
        }
        if session.by_id != by_id {
            return Err(SessionError::TopicIdMismatch);
        }
        update(session);
        if session.is_empty() {
            self.remove(id);
            return Ok(Begun::Sessionless);
        }
        if session.bytes > MAX_SESSION_BYTES {
            self.remove(id);
            return Err(SessionError::NotFound);
        }
        session.epoch = next_epoch(session.epoch);
        let used = std::mem::replace(&mut session.last_used, now);
        self.by_use.remove(&(used, id));
        self.by_use.insert((now, id));
        Ok(Begun::Incremental(
            self.sessions.get_mut(&id).expect("just used"),
        ))
    }

    /// A new session for the answer of a full fetch: its partitions (in order) with their
    /// answers. Returns its id, or [`NO_SESSION`] when the cache has no room and nothing may be
    /// evicted for it, or the session would be too large; the fetch is then answered sessionless.
    pub fn create(
        &mut self,
        by_id: bool,
        now: Instant,
        partitions: impl IntoIterator<Item = (SessionPartition, Answer)>,
    ) -> i32 {
        if self.config.max_sessions == 0 {
            return NO_SESSION;
        }
        let mut session = FetchSession::new(NO_SESSION, by_id, now);
        for (p, a) in partitions {
            session.want(&p.topic, p.partition, p.fetch_offset, p.max_bytes);
            if let Some(&slot) = session.index.get(&(p.topic.clone(), p.partition)) {
                if let Some(cached) = session.slots[slot as usize].as_mut() {
                    cached.answer(&a);
                }
            }
            if session.bytes > MAX_SESSION_BYTES {
                return NO_SESSION;
            }
        }
        if session.is_empty() {
            return NO_SESSION;
        }
        if self.sessions.len() >= self.config.max_sessions && !self.evict_for(session.len(), now) {
            return NO_SESSION;
        }
        let id = self.new_id();
        session.id = id;
        self.sessions.insert(id, session);
        self.by_use.insert((now, id));
        id
    }

    /// Makes room for a new session of `size` partitions: evicts the least recently used session
    /// if it has been unused for longer than the eviction timeout, else the least recently used
    /// of those with fewer partitions than the new one (so that small sessions cannot push a
    /// large one out, and a large one keeps its slot against a stream of small ones). False if
    /// none may go.
    fn evict_for(&mut self, size: usize, now: Instant) -> bool {
        let stale = self
            .by_use
            .first()
            .filter(|(used, _)| now.saturating_duration_since(*used) > self.config.eviction_timeout)
            .map(|&(_, id)| id);
        let victim = stale.or_else(|| {
            self.by_use
                .iter()
                .map(|&(_, id)| id)
                .find(|id| self.sessions.get(id).is_some_and(|s| s.len() < size))
        });
        let Some(victim) = victim else {
            return false;
        };
        self.remove(victim);
        self.evictions += 1;
        true
    }

    fn remove(&mut self, id: i32) -> Option<FetchSession> {
        let s = self.sessions.remove(&id)?;
        self.by_use.remove(&(s.last_used, id));
        Some(s)
    }

    /// A random id no session of this core has. Kafka's are any nonzero `i32`; these are
    /// positive, since some clients (kafka-python) read a session id of -1 as "throttled".
    fn new_id(&self) -> i32 {
        loop {
            let id = rand::random::<i32>() & i32::MAX;
            if id != NO_SESSION && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_sessions: usize) -> FetchSessionConfig {
        FetchSessionConfig {
            max_sessions,
            eviction_timeout: Duration::from_secs(60),
        }
    }

    fn quiet(hw: i64) -> Answer {
        Answer {
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
            error_code: 0,
            has_records: false,
            redirected: false,
        }
    }

    /// A session of `n` partitions of topic "t", each answered at high watermark 10.
    fn create(cache: &mut FetchSessions, n: i32, now: Instant) -> i32 {
        let t = Bytes::from_static(b"t");
        cache.create(
            false,
            now,
            (0..n).map(|i| (SessionPartition::new(t.clone(), i, 0, 1024), quiet(10))),
        )
    }

    fn begin_ok(cache: &mut FetchSessions, id: i32, epoch: i32, now: Instant) -> (i32, u64) {
        match cache.begin(id, epoch, false, now, |_| ()) {
            Ok(Begun::Incremental(s)) => (s.epoch(), s.generation()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn epochs_start_at_one_and_must_match_then_move_on() {
        let mut cache = FetchSessions::new(config(10));
        let now = Instant::now();
        let id = create(&mut cache, 3, now);
        assert_ne!(id, NO_SESSION);
        assert_eq!(cache.get(id).unwrap().epoch(), 1);
        let err = |c: &mut FetchSessions, id, epoch| c.begin(id, epoch, false, now, |_| ()).err();
        assert_eq!(err(&mut cache, id, 2), Some(SessionError::InvalidEpoch));
        assert_eq!(err(&mut cache, id + 1, 1), Some(SessionError::NotFound));
        assert_eq!(err(&mut cache, NO_SESSION, 1), Some(SessionError::NotFound));
        assert_eq!(
            cache.begin(id, 1, true, now, |_| ()).err(),
            Some(SessionError::TopicIdMismatch)
        );
        assert_eq!(begin_ok(&mut cache, id, 1, now).0, 2);
        assert_eq!(begin_ok(&mut cache, id, 2, now).0, 3);
        // The same epoch again (a retried request) is refused.
        assert_eq!(err(&mut cache, id, 2), Some(SessionError::InvalidEpoch));
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(FINAL_EPOCH), FINAL_EPOCH);
    }

    #[test]
    fn full_fetches_close_the_session_they_name() {
        let mut cache = FetchSessions::new(config(10));
        let now = Instant::now();
        let a = create(&mut cache, 1, now);
        let b = create(&mut cache, 1, now);
        assert!(matches!(
            cache.begin(a, INITIAL_EPOCH, false, now, |_| ()),
            Ok(Begun::Full)
        ));
        assert!(matches!(
            cache.begin(b, FINAL_EPOCH, false, now, |_| ()),
            Ok(Begun::Sessionless)
        ));
        assert!(cache.is_empty());
        assert!(matches!(
            cache.begin(NO_SESSION, FINAL_EPOCH, false, now, |_| ()),
            Ok(Begun::Sessionless)
        ));
    }

    #[test]
    fn only_changed_partitions_are_answered() {
        let mut cache = FetchSessions::new(config(10));
        let now = Instant::now();
        let id = create(&mut cache, 4, now);
        let (_, generation) = begin_ok(&mut cache, id, 1, now);
        let s = cache.get_mut(id).unwrap();
        let mut answers = vec![quiet(10); 4];
        answers[1].high_watermark = 11; // moved
        answers[2].error_code = 6; // an error
        answers[3].log_start_offset = 5; // retention
        assert_eq!(s.answer(generation, &answers), [false, true, true, true]);
        // Unchanged now, but the partition that had an error is answered once it is gone.
        let (_, generation) = begin_ok(&mut cache, id, 2, now);
        let s = cache.get_mut(id).unwrap();
        let mut answers = vec![quiet(10); 4];
        answers[1].high_watermark = 11;
        answers[3].log_start_offset = 5;
        assert_eq!(s.answer(generation, &answers), [false, false, true, false]);
        // Answers for an older partition list all go out and change nothing.
        assert_eq!(s.answer(generation + 7, &answers), [true; 4]);
    }

    #[test]
    fn partitions_with_records_go_to_the_end() {
        let mut cache = FetchSessions::new(config(10));
        let now = Instant::now();
        let id = create(&mut cache, 3, now);
        let (_, generation) = begin_ok(&mut cache, id, 1, now);
        let s = cache.get_mut(id).unwrap();
        let mut answers = vec![quiet(10); 3];
        answers[0].has_records = true;
        assert_eq!(s.answer(generation, &answers), [true, false, false]);
        let order: Vec<i32> = s.partitions().map(|p| p.partition).collect();
        assert_eq!(order, [1, 2, 0]);
    }

    #[test]
    fn requests_add_update_and_forget_partitions() {
        let mut cache = FetchSessions::new(config(10));
        let now = Instant::now();
        let id = create(&mut cache, 2, now);
        let (t, u) = (Bytes::from_static(b"t"), Bytes::from_static(b"u"));
        let begun = cache.begin(id, 1, false, now, |s| {
            s.want(&t, 1, 42, 512);
            s.want(&u, 0, 7, 100);
            s.forget(&t, 0);
            s.forget(&u, 9); // not in the session: nothing
        });
        let Ok(Begun::Incremental(s)) = begun else {
            panic!("{begun:?}")
        };
        let listed: Vec<(&[u8], i32, i64, i32)> = s
            .partitions()
            .map(|p| (&p.topic[..], p.partition, p.fetch_offset, p.max_bytes))
            .collect();
        assert_eq!(listed, [(&b"t"[..], 1, 42, 512), (&b"u"[..], 0, 7, 100)]);
        // Forgetting every partition closes the session: the fetch is sessionless.
        let begun = cache.begin(id, 2, false, now, |s| {
            s.forget(&t, 1);
            s.forget(&u, 0);
        });
        assert!(matches!(begun, Ok(Begun::Sessionless)));
        assert!(cache.get(id).is_none());
    }

    #[test]
    fn a_session_too_large_is_closed_as_not_found() {
        let mut cache = FetchSessions::new(config(10));
        let now = Instant::now();
        let id = create(&mut cache, 1, now);
        let big = Bytes::from(vec![b'x'; 30_000]);
        let begun = cache.begin(id, 1, false, now, |s| {
            for i in 0..200 {
                s.want(&big, i, 0, 1);
            }
        });
        assert_eq!(begun.err(), Some(SessionError::NotFound));
        assert!(cache.get(id).is_none());
        let too_big = (0..200).map(|i| (SessionPartition::new(big.clone(), i, 0, 1), quiet(0)));
        assert_eq!(cache.create(false, now, too_big), NO_SESSION);
    }

    #[test]
    fn a_full_cache_evicts_a_stale_session_first() {
        let mut cache = FetchSessions::new(config(2));
        let t0 = Instant::now();
        let big = create(&mut cache, 100, t0);
        let small = create(&mut cache, 1, t0 + Duration::from_secs(30));
        // Neither is stale and neither is smaller than 1 partition: no room.
        let later = t0 + Duration::from_secs(40);
        assert_eq!(create(&mut cache, 1, later), NO_SESSION);
        assert_eq!(cache.evictions(), 0);
        // Unused for longer than the timeout, the large one goes for a small newcomer.
        let late = t0 + Duration::from_secs(61);
        let newcomer = create(&mut cache, 1, late);
        assert_ne!(newcomer, NO_SESSION);
        assert!(cache.get(big).is_none() && cache.get(small).is_some());
        assert_eq!(cache.evictions(), 1);
    }

    #[test]
    fn small_sessions_cannot_push_out_a_larger_one() {
        let mut cache = FetchSessions::new(config(2));
        let t0 = Instant::now();
        let large = create(&mut cache, 500, t0);
        let small = create(&mut cache, 10, t0);
        let t = t0 + Duration::from_secs(1);
        // Another small one: only sessions with fewer partitions may go, and none has fewer than 10.
        assert_eq!(create(&mut cache, 10, t), NO_SESSION);
        // A larger one evicts the least recently used of those smaller than itself.
        begin_ok(&mut cache, large, 1, t); // the large one is used after the small one
        let larger = create(&mut cache, 600, t);
        assert_ne!(larger, NO_SESSION);
        assert!(cache.get(small).is_none() && cache.get(large).is_some());
        // The evicted client's next incremental fetch learns it; its full fetch gets no session.
        assert_eq!(
            cache.begin(small, 1, false, t, |_| ()).err(),
            Some(SessionError::NotFound)
        );
        assert_eq!(create(&mut cache, 10, t), NO_SESSION);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.evictions(), 1);
    }

    #[test]
    fn no_slots_means_no_sessions() {
        let mut cache = FetchSessions::new(config(0));
        assert_eq!(create(&mut cache, 5, Instant::now()), NO_SESSION);
        assert!(cache.is_empty());
    }
}
