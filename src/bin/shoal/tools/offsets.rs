//! ListOffsets at each partition's leader: log start (earliest), high watermark (latest, read
//! uncommitted), last stable offset (latest, read committed) or the first offset at or after a
//! timestamp. Used by `topic describe`, `group describe` and `group seek`.

use super::failure::Failure;
use super::session::Session;
use kafka_protocol::messages::{ApiKey, ListOffsetsResponse, MetadataResponse};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

/// The offset after the last record: the high watermark, or with [`Isolation::ReadCommitted`]
/// the last stable offset.
pub const LATEST: i64 = -1;
/// The log start offset.
pub const EARLIEST: i64 = -2;

/// ListOffsets' isolation level: read committed answers LATEST with the last stable offset (the
/// end of what transactions have settled), read uncommitted with the high watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadUncommitted = 0,
    ReadCommitted = 1,
}

/// ListOffsets for `partitions` of `topic` at their leader `addr`: partition to offset (those
/// answered with an error left out; an offset of -1 is the broker's "none", e.g. no record at or
/// after a timestamp).
pub fn at(
    s: &Session,
    addr: SocketAddr,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
    isolation: Isolation,
) -> Result<BTreeMap<i32, i64>, Failure> {
    let version = s.version(ApiKey::ListOffsets, 1, 7)?;
    let asked: Vec<(i32, i64)> = partitions.iter().map(|p| (*p, timestamp)).collect();
    let mut req = shoal::wire::requests::list_offsets_request(topic, &asked);
    // The isolation level exists from v2; v1 always reads uncommitted.
    if version >= 2 {
        req = req.with_isolation_level(isolation as i8);
    } else if isolation == Isolation::ReadCommitted {
        return Ok(BTreeMap::new());
    }
    let r: ListOffsetsResponse = s.call(addr, ApiKey::ListOffsets, version, &req)?;
    Ok(r.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .filter(|p| p.error_code == 0)
        .map(|p| (p.partition_index, p.offset))
        .collect())
}

/// The partitions of `topic` grouped by their leader's address, by the metadata `m`.
pub fn by_leader(
    s: &Session,
    m: &MetadataResponse,
    topic: &str,
    partitions: &[i32],
) -> Result<HashMap<SocketAddr, Vec<i32>>, Failure> {
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic));
    let mut out: HashMap<SocketAddr, Vec<i32>> = HashMap::new();
    for &p in partitions {
        let leader = t
            .and_then(|t| t.partitions.iter().find(|x| x.partition_index == p))
            .map_or(-1, |x| x.leader_id.0);
        if leader < 0 {
            continue;
        }
        let addr = s.broker(m, leader).ok_or_else(|| {
            Failure::other(
                "LeaderNotAvailable",
                format!("{topic}-{p}: leader {leader} is not among the brokers"),
                "retry in a moment",
            )
        })?;
        out.entry(addr).or_default().push(p);
    }
    Ok(out)
}

/// ListOffsets for `partitions` of `topic`, each asked of its leader: partition to offset (those
/// without a leader or answered with an error left out).
pub fn of_partitions(
    s: &Session,
    m: &MetadataResponse,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
    isolation: Isolation,
) -> Result<BTreeMap<i32, i64>, Failure> {
    let mut out = BTreeMap::new();
    for (addr, ids) in by_leader(s, m, topic, partitions)? {
        out.extend(at(s, addr, topic, &ids, timestamp, isolation)?);
    }
    Ok(out)
}
