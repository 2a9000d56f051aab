//! The fuzzer's inputs: each a function of the run's seed and its index alone.

use super::mutate::{self, Rng};
use super::requests;
use crate::common::wire;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};

/// Correlation id of the ApiVersions request sent after every input.
pub const SENTINEL: i32 = 0x5e47_1e11;

/// One input: the bytes sent on one connection, and how they came about.
#[derive(Debug, Clone)]
pub struct Input {
    pub index: u64,
    pub key: ApiKey,
    pub version: i16,
    /// The mutations applied; empty for an input sent as generated (which must be answered in full).
    pub notes: Vec<String>,
    pub bytes: Vec<u8>,
    pub core: usize,
    /// Written a few bytes at a time, with pauses, instead of in one write.
    pub trickled: bool,
    /// Valid, and yet the broker may close the connection instead of answering (see
    /// [`requests::may_close`]).
    pub may_close: bool,
    /// A session: `bytes` is its first request; what follows is generated from the answer.
    pub session: Option<Session>,
}

/// The rest of a session, once its first request is answered.
#[derive(Debug, Clone)]
pub enum Session {
    /// A consumer group's member: `bytes` is its JoinGroup.
    Group { rng: Rng, group: String },
    /// A transactional producer: `bytes` is its InitProducerId.
    Txn { rng: Rng, id: String },
}

/// The inputs' generator: the APIs and versions the broker advertised, and the run's seed.
#[derive(Debug, Clone)]
pub struct Generator {
    pub seed: u64,
    pub apis: Vec<(ApiKey, i16)>,
    pub cores: usize,
}

impl Generator {
    /// Input `index`: the first ones are every advertised (API, version) unmutated, in order; the rest
    /// a random API and version, mutated nine times in ten.
    pub fn input(&self, index: u64) -> Input {
        let mut rng = Rng::for_input(self.seed, index);
        let sweep = (index as usize) < self.apis.len();
        if !sweep && rng.one_in(16) {
            return self.session(index, rng);
        }
        if !sweep && rng.one_in(16) {
            return self.txn_session(index, rng);
        }
        if !sweep && rng.one_in(5) {
            return self.pipeline(index, rng);
        }
        let (key, version) = if sweep {
            self.apis[index as usize]
        } else {
            *rng.pick(&self.apis)
        };
        let core = rng.below(self.cores);
        let frame = requests::build(&mut rng, key, version, 1, index);
        let may_close = requests::may_close(&frame);
        let (bytes, notes) = if sweep || rng.one_in(10) {
            (frame, Vec::new())
        } else {
            let (k, v) = *rng.pick(&self.apis);
            let other = requests::build(&mut rng, k, v, 2, index);
            mutate::mutate(&mut rng, &frame, &other)
        };
        Input {
            index,
            key,
            version,
            notes,
            bytes,
            core,
            trickled: rng.one_in(25),
            may_close,
            session: None,
        }
    }

    /// 2-4 requests in one write (pipelined), one of them mutated nine times in ten.
    pub fn pipeline(&self, index: u64, mut rng: Rng) -> Input {
        let core = rng.below(self.cores);
        let n = 2 + rng.below(3);
        let mut first = None;
        let mut frames: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let (k, v) = *rng.pick(&self.apis);
                first.get_or_insert((k, v));
                requests::build(&mut rng, k, v, i as i32 + 1, index)
            })
            .collect();
        let may_close = frames.iter().any(|f| requests::may_close(f));
        let first = first.unwrap();
        let mut notes = Vec::new();
        if !rng.one_in(10) {
            let (j, o) = (rng.below(n), rng.below(n));
            let other = frames[o].clone();
            let (m, what) = mutate::mutate(&mut rng, &frames[j], &other);
            frames[j] = m;
            notes.push(format!("request {} of {n}: {}", j + 1, what.join(", ")));
        }
        let (key, version) = first;
        Input {
            index,
            key,
            version,
            notes,
            bytes: frames.concat(),
            core,
            trickled: rng.one_in(25),
            may_close,
            session: None,
        }
    }

    /// A consumer group session on a group of its own: JoinGroup, then (see [`requests::session`])
    /// what a member does, one request of it mutated nine times in ten.
    pub fn session(&self, index: u64, mut rng: Rng) -> Input {
        let versions: Vec<i16> = self
            .apis
            .iter()
            .filter(|(k, _)| *k == ApiKey::JoinGroup)
            .map(|(_, v)| *v)
            .collect();
        let version = *rng.pick(&versions);
        // Bounded too (see `requests::OWN_GROUPS`); inputs this far apart are seconds apart, when a
        // member an earlier session left behind has expired, or is waited for by the rebalance.
        let group = format!("fz-session-{}", index % (4 * requests::OWN_GROUPS));
        Input {
            index,
            key: ApiKey::JoinGroup,
            version,
            notes: Vec::new(),
            bytes: requests::join(version, 1, &group, ""),
            // Its coordinator: elsewhere the session would end at NOT_COORDINATOR.
            core: shoal::groups::coordinator_core(&group, self.cores),
            trickled: false,
            may_close: false,
            session: Some(Session::Group { rng, group }),
        }
    }

    /// A transactional producer's session on a transactional id of its own: InitProducerId (at the
    /// id's coordinator), then (see [`requests::txn_session`]) a transaction with the producer id
    /// and epoch answered, one request of it mutated nine times in ten.
    pub fn txn_session(&self, index: u64, mut rng: Rng) -> Input {
        let version = requests::advertised_version(
            &mut rng,
            &self.apis,
            ApiKey::InitProducerId,
            0..=i16::MAX,
        )
        .expect("InitProducerId is served");
        // Bounded (see `requests::OWN_TXNS`); inputs this far apart are seconds apart.
        let id = format!("fz-txn-{}", index % requests::OWN_TXNS);
        let timeout = *rng.pick(&[1, 1000, 3000, requests::TXN_MAX_TIMEOUT_MS]);
        Input {
            index,
            key: ApiKey::InitProducerId,
            version,
            notes: Vec::new(),
            bytes: requests::init_txn(version, 1, &id, timeout),
            // Its coordinator: elsewhere the session would end at NOT_COORDINATOR.
            core: shoal::transactions::coordinator_core(&id, self.cores),
            trickled: false,
            may_close: false,
            session: Some(Session::Txn { rng, id }),
        }
    }
}

pub fn sentinel() -> Vec<u8> {
    wire::request_frame(
        ApiKey::ApiVersions,
        0,
        SENTINEL,
        &ApiVersionsRequest::default(),
    )
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
pub fn describe(input: &Input, seed: u64) -> String {
    format!(
        "seed {seed}, input {} ({}{:?} v{}, to core {}{}; {})\n  input hex: {}",
        input.index,
        if input.session.is_some() {
            "session after "
        } else {
            ""
        },
        input.key,
        input.version,
        input.core,
        if input.trickled { ", trickled" } else { "" },
        if input.notes.is_empty() {
            "unmutated".to_string()
        } else {
            input.notes.join(", ")
        },
        hex(&input.bytes)
    )
}
