//! OffsetFetch: a group's committed offsets, for the partitions asked or (topics null, v2+) all of
//! them; v8 asks for several groups at once, each answered by its own coordinator (a group another
//! core coordinates gets `NOT_COORDINATOR`, as on a multi-broker Kafka cluster).
//!
//! A connection's requests run concurrently, but Kafka answers a fetch behind a commit on the same
//! connection with the committed offset: [`handle`] first awaits `settle`, which waits until the
//! commits of the groups asked for that were begun before it have been applied (only those groups'
//! commits, and only those already begun).
//!
//! Pending transactional offsets (TxnOffsetCommit, transaction not yet ended) are never shown;
//! with `require_stable` (v7+) a partition that has one answers `UNSTABLE_OFFSET_COMMIT`
//! instead of its committed offset, and the client retries (KIP-447).
//!
//! From v9 a member of a consumer-protocol group (KIP-848) names itself and its epoch: an
//! unknown member is `UNKNOWN_MEMBER_ID`, another epoch `STALE_MEMBER_EPOCH`.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::groups::offsets::Committed;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{ApiKey, OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::OffsetFetch,
    min: 1,
    max: 9,
};

/// One partition's answer: its committed offset (if any), or its error.
type Found = (i32, Result<Option<Committed>, ResponseError>);

/// The offsets of `group` for `asked` ((topic, partitions); `None`: everything committed), or the
/// group-level error. Topics the client may not describe show no committed offset (asked) or are
/// left out (all). With `require_stable`, a partition with a pending transactional offset
/// answers `UNSTABLE_OFFSET_COMMIT`.
fn lookup(
    core: &Core,
    who: &Session,
    group: &str,
    asked: Option<Vec<(TopicName, Vec<i32>)>>,
    require_stable: bool,
) -> Result<Vec<(TopicName, Vec<Found>)>, ResponseError> {
    if !who.may_group(core, Operation::Describe, group) {
        return Err(ResponseError::GroupAuthorizationFailed);
    }
    core.groups().check(group)?;
    let visible = |t: &str| who.may_topic(core, Operation::Describe, t);
    let stable = |t: &str, p: i32, c: Option<Committed>| {
        if require_stable && core.groups().has_pending(group, t, p) {
            Err(ResponseError::UnstableOffsetCommit)
        } else {
            Ok(c)
        }
    };
    Ok(match asked {
        Some(topics) => topics
            .into_iter()
            .map(|(name, parts)| {
                let found = parts
                    .into_iter()
                    .map(|p| match visible(&name) {
                        true => (p, stable(&name, p, core.groups().fetch(group, &name, p))),
                        false => (p, Ok(None)),
                    })
                    .collect();
                (name, found)
            })
            .collect(),
        None => {
            let mut by_topic: BTreeMap<String, Vec<Found>> = BTreeMap::new();
            for ((t, p), c) in core.groups().fetch_all(group) {
                if !visible(&t) {
                    continue;
                }
                let found = stable(&t, p, Some(c));
                by_topic.entry(t).or_default().push((p, found));
            }
            by_topic
                .into_iter()
                .map(|(t, parts)| (TopicName(StrBytes::from_string(t)), parts))
                .collect()
        }
    })
}

/// Offset, leader epoch, metadata and error code of one partition's answer.
fn fields(
    found: Result<Option<Committed>, ResponseError>,
    v: i16,
) -> (i64, i32, Option<StrBytes>, i16) {
    match found {
        Ok(Some(c)) => (
            c.offset,
            if v >= 5 { c.leader_epoch } else { -1 },
            Some(StrBytes::from_string(c.metadata.unwrap_or_default())),
            0,
        ),
        Ok(None) => (-1, -1, Some(StrBytes::default()), 0),
        Err(e) => (-1, -1, Some(StrBytes::default()), e.code()),
    }
}

/// Waits until the commits in flight for the groups this request asks for are applied. [`handle`]
/// runs it first thing, in the request's own task: tasks start in the order the requests arrived,
/// and a commit counts as in flight from its task's first poll, so every commit sent before this
/// fetch is waited for.
async fn settle(core: &Core, version: i16, request: &OffsetFetchRequest) {
    if version >= 8 {
        for g in &request.groups {
            core.groups().settled(&g.group_id).await;
        }
    } else {
        core.groups().settled(&request.group_id).await;
    }
}

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: OffsetFetchRequest = decode(req)?;
    // A fetch sees the commits sent before it on this connection, as in Kafka, where a
    // connection's requests run one at a time: its groups' commits in flight are waited for. A
    // connection's handlers start in arrival order, so a commit sent before it has already
    // counted itself in flight when this runs.
    settle(core, req.api_version, &request).await;
    let v = req.api_version;
    let response = if v >= 8 {
        let groups: Vec<OffsetFetchResponseGroup> = request
            .groups
            .iter()
            .map(|g| group_answer(core, who, g, request.require_stable, v))
            .collect();
        count_errors(core, req, groups.iter().map(|g| g.error_code));
        OffsetFetchResponse::default().with_groups(groups)
    } else {
        let asked: Option<Vec<(TopicName, Vec<i32>)>> = request.topics.as_ref().map(|ts| {
            ts.iter()
                .map(|t| (t.name.clone(), t.partition_indexes.clone()))
                .collect()
        });
        let partition = |p: i32, c: Result<Option<Committed>, ResponseError>| {
            let (offset, epoch, meta, e) = fields(c, v);
            OffsetFetchResponsePartition::default()
                .with_partition_index(p)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(epoch)
                .with_metadata(meta)
                .with_error_code(e)
        };
        let require_stable = v >= 7 && request.require_stable;
        match lookup(core, who, &request.group_id, asked.clone(), require_stable) {
            Ok(topics) => OffsetFetchResponse::default().with_topics(
                topics
                    .into_iter()
                    .map(|(name, parts)| {
                        OffsetFetchResponseTopic::default()
                            .with_name(name)
                            .with_partitions(
                                parts.into_iter().map(|(p, c)| partition(p, c)).collect(),
                            )
                    })
                    .collect(),
            ),
            Err(e) => {
                core.metrics.error(req.api_key);
                // v1 has no top-level error: it goes in every partition.
                let topics = asked
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(name, parts)| {
                        OffsetFetchResponseTopic::default()
                            .with_name(name)
                            .with_partitions(
                                parts.into_iter().map(|p| partition(p, Err(e))).collect(),
                            )
                    })
                    .collect();
                let r = OffsetFetchResponse::default().with_topics(topics);
                if v >= 2 {
                    r.with_error_code(e.code())
                } else {
                    r
                }
            }
        }
    };
    Ok(frame(ApiKey::OffsetFetch, req, &response))
}

/// One group's answer (v8+), for the member (v9+) it names.
fn group_answer(
    core: &Core,
    who: &Session,
    g: &kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup,
    require_stable: bool,
    v: i16,
) -> OffsetFetchResponseGroup {
    let asked = g.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.clone(), t.partition_indexes.clone()))
            .collect()
    });
    let base = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
    // v9: a consumer-protocol group's member fetches at its current epoch; checked after the
    // group's authorization, as the check tells who is a member.
    let member = if who.may_group(core, Operation::Describe, &g.group_id) {
        core.groups()
            .check_fetch_member(&g.group_id, g.member_id.as_deref(), g.member_epoch)
    } else {
        Err(ResponseError::GroupAuthorizationFailed)
    };
    let found = member.and_then(|()| lookup(core, who, &g.group_id, asked, require_stable));
    match found {
        Err(e) => base.with_error_code(e.code()),
        Ok(topics) => base.with_topics(
            topics
                .into_iter()
                .map(|(name, parts)| {
                    OffsetFetchResponseTopics::default()
                        .with_name(name)
                        .with_partitions(
                            parts
                                .into_iter()
                                .map(|(p, c)| {
                                    let (offset, epoch, meta, e) = fields(c, v);
                                    OffsetFetchResponsePartitions::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset)
                                        .with_committed_leader_epoch(epoch)
                                        .with_metadata(meta)
                                        .with_error_code(e)
                                })
                                .collect(),
                        )
                })
                .collect(),
        ),
    }
}
