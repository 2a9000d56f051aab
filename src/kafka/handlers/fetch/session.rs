//! The fetch handler's side of fetch sessions (KIP-227, the cache is
//! [`crate::cores::fetch_sessions`]): which partitions a request reads (its own, or its session's
//! once the request's changes are applied), and which of the results its response carries (in a
//! session, only the partitions that changed).

use crate::cores::fetch_sessions::{Answer, Begun, FetchSession, SessionError, SessionPartition};
use crate::cores::Core;
use crate::wire::fetch::encode::{PartitionResult, TopicResult, FIRST_TOPIC_ID_VERSION};
use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::FetchRequest;
use std::time::Instant;

/// The first Fetch version with sessions (and a session id in the response).
const FIRST_SESSION_VERSION: i16 = 7;

/// One topic a fetch reads, as its request or its session names it.
#[derive(Debug)]
pub struct AskedTopic {
    /// The name (Fetch v12 and older; empty from v13).
    pub name: Bytes,
    /// The topic id (v13+).
    pub id: [u8; 16],
    pub partitions: Vec<AskedPartition>,
}

#[derive(Debug, Clone, Copy)]
pub struct AskedPartition {
    pub index: i32,
    pub offset: i64,
    pub max_bytes: i32,
}

/// Where a fetch stands with sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A full fetch answered outside any session.
    Sessionless,
    /// A full fetch whose answer starts a session (if the cache has room for it).
    Full,
    /// A fetch in session `id`, reading its partitions as they were at `generation`.
    Incremental { id: i32, generation: u64 },
}

/// The partitions a fetch reads and its scope; a session fetch the cache refuses is answered
/// with the error alone.
pub fn begin(
    core: &Core,
    request: &FetchRequest,
    version: i16,
) -> Result<(Scope, Vec<AskedTopic>), ResponseError> {
    let by_id = version >= FIRST_TOPIC_ID_VERSION;
    if version < FIRST_SESSION_VERSION {
        return Ok((Scope::Sessionless, from_request(request)));
    }
    let mut sessions = core.reads.sessions.borrow_mut();
    let begun = sessions.begin(
        request.session_id,
        request.session_epoch,
        by_id,
        Instant::now(),
        |s| update(s, request, by_id),
    );
    let out = match begun {
        Err(e) => Err(match e {
            SessionError::NotFound => ResponseError::FetchSessionIdNotFound,
            SessionError::InvalidEpoch => ResponseError::InvalidFetchSessionEpoch,
            SessionError::TopicIdMismatch => ResponseError::FetchSessionTopicIdError,
        }),
        Ok(Begun::Sessionless) => Ok((Scope::Sessionless, from_request(request))),
        Ok(Begun::Full) => Ok((Scope::Full, from_request(request))),
        Ok(Begun::Incremental(s)) => {
            let scope = Scope::Incremental {
                id: s.id(),
                generation: s.generation(),
            };
            Ok((scope, from_session(s, by_id)))
        }
    };
    core.metrics.fetch_sessions.set(sessions.len() as u64);
    out
}

/// The session id the response carries, after leaving out of an incremental response the
/// partitions that did not change; starts the session of a full fetch.
pub fn finish(
    core: &Core,
    scope: Scope,
    version: i16,
    asked: &[AskedTopic],
    topics: &mut Vec<TopicResult>,
) -> i32 {
    let mut sessions = core.reads.sessions.borrow_mut();
    let id = match scope {
        Scope::Sessionless => 0,
        Scope::Full => {
            let by_id = version >= FIRST_TOPIC_ID_VERSION;
            let partitions = asked.iter().zip(topics.iter()).flat_map(|(a, t)| {
                // The session's own copy: the request's name is a slice of its frame.
                let key = if by_id {
                    Bytes::copy_from_slice(&a.id)
                } else {
                    Bytes::copy_from_slice(&a.name)
                };
                a.partitions.iter().zip(&t.partitions).map(move |(p, r)| {
                    let cached = SessionPartition::new(key.clone(), p.index, p.offset, p.max_bytes);
                    (cached, answer_of(r))
                })
            });
            let id = sessions.create(by_id, Instant::now(), partitions);
            core.metrics
                .fetch_session_evictions
                .set(sessions.evictions());
            id
        }
        Scope::Incremental { id, generation } => {
            let answers: Vec<Answer> = topics
                .iter()
                .flat_map(|t| &t.partitions)
                .map(answer_of)
                .collect();
            let keep = match sessions.get_mut(id) {
                Some(s) => s.answer(generation, &answers),
                None => vec![true; answers.len()],
            };
            let mut keep = keep.into_iter();
            for t in topics.iter_mut() {
                t.partitions.retain(|_| keep.next().unwrap_or(true));
            }
            topics.retain(|t| !t.partitions.is_empty());
            id
        }
    };
    core.metrics.fetch_sessions.set(sessions.len() as u64);
    let counter = match scope {
        Scope::Incremental { .. } => &core.metrics.fetch_incremental,
        _ => &core.metrics.fetch_full,
    };
    crate::metrics::add(counter, 1);
    id
}

fn answer_of(r: &PartitionResult) -> Answer {
    Answer {
        high_watermark: r.high_watermark,
        last_stable_offset: r.last_stable_offset,
        log_start_offset: r.log_start_offset,
        error_code: r.error_code,
        has_records: r.records.len > 0,
        redirected: r.preferred_read_replica >= 0,
    }
}

/// The request's own partitions.
fn from_request(request: &FetchRequest) -> Vec<AskedTopic> {
    request
        .topics
        .iter()
        .map(|t| AskedTopic {
            name: Bytes::from(t.topic.0.clone()),
            id: *t.topic_id.as_bytes(),
            partitions: t
                .partitions
                .iter()
                .map(|p| AskedPartition {
                    index: p.partition,
                    offset: p.fetch_offset,
                    max_bytes: p.partition_max_bytes,
                })
                .collect(),
        })
        .collect()
}

/// Applies an incremental request to its session: the partitions it lists are added or updated,
/// the forgotten ones removed.
fn update(s: &mut FetchSession, request: &FetchRequest, by_id: bool) {
    let key = |name: &[u8], id: &[u8; 16]| Bytes::copy_from_slice(if by_id { id } else { name });
    for t in &request.topics {
        let key = key(t.topic.0.as_bytes(), t.topic_id.as_bytes());
        for p in &t.partitions {
            s.want(&key, p.partition, p.fetch_offset, p.partition_max_bytes);
        }
    }
    for f in &request.forgotten_topics_data {
        let key = key(f.topic.0.as_bytes(), f.topic_id.as_bytes());
        for &p in &f.partitions {
            s.forget(&key, p);
        }
    }
}

/// The session's partitions in its order, a topic entry for each run of one topic's partitions.
fn from_session(s: &FetchSession, by_id: bool) -> Vec<AskedTopic> {
    let mut topics: Vec<AskedTopic> = Vec::new();
    for p in s.partitions() {
        let same = topics.last().is_some_and(|t| {
            if by_id {
                t.id[..] == p.topic[..]
            } else {
                t.name == p.topic
            }
        });
        if !same {
            let (name, id) = if by_id {
                (Bytes::new(), p.topic[..].try_into().unwrap_or([0; 16]))
            } else {
                (p.topic.clone(), [0; 16])
            };
            topics.push(AskedTopic {
                name,
                id,
                partitions: Vec::new(),
            });
        }
        if let Some(t) = topics.last_mut() {
            t.partitions.push(AskedPartition {
                index: p.partition,
                offset: p.fetch_offset,
                max_bytes: p.max_bytes,
            });
        }
    }
    topics
}
