//! A consumer group's committed offsets, for `shoal consume --group`: the group's coordinator
//! (FindCoordinator), its committed offsets (OffsetFetch) and new commits (OffsetCommit) made as a
//! simple consumer (generation -1, no member), which Kafka accepts for a group with no members.

use super::failure::Failure;
use super::session::{topic_name, Session};
use crate::client::{resolve, SyncConn};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    ApiKey, FindCoordinatorRequest, FindCoordinatorResponse, GroupId, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;

/// A connection to a group's coordinator.
pub struct Group {
    id: String,
    conn: SyncConn,
    fetch_version: i16,
    commit_version: i16,
}

impl Group {
    /// Finds `id`'s coordinator and connects to it.
    pub fn open(s: &Session, id: &str) -> Result<Group, Failure> {
        let version = s.version(ApiKey::FindCoordinator, 1, 3)?;
        let req = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(id.to_string()))
            .with_key_type(0);
        let r: FindCoordinatorResponse =
            s.call(s.bootstrap, ApiKey::FindCoordinator, version, &req)?;
        let what = format!("the coordinator of group {id}");
        Failure::check(r.error_code, &what, r.error_message.as_deref())?;
        let addr = resolve(&format!("{}:{}", r.host, r.port))?;
        Ok(Group {
            id: id.to_string(),
            conn: s.connect(addr)?,
            fetch_version: s.version(ApiKey::OffsetFetch, 1, 7)?,
            commit_version: s.version(ApiKey::OffsetCommit, 2, 8)?,
        })
    }

    /// The committed offsets of `partitions` of `topic` (those with none left out).
    pub fn committed(
        &mut self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>, Failure> {
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.id.clone())))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partition_indexes(partitions.to_vec())]));
        let r: OffsetFetchResponse =
            self.conn
                .call(ApiKey::OffsetFetch, self.fetch_version, &req)?;
        let what = format!("the offsets of group {}", self.id);
        Failure::check(r.error_code, &what, None)?;
        let mut out = BTreeMap::new();
        for p in r.topics.iter().flat_map(|t| &t.partitions) {
            Failure::check(p.error_code, &what, None)?;
            if p.committed_offset >= 0 {
                out.insert(p.partition_index, p.committed_offset);
            }
        }
        Ok(out)
    }

    /// Commits `offsets` (partition to the next offset to read) of `topic`.
    pub fn commit(&mut self, topic: &str, offsets: &BTreeMap<i32, i64>) -> Result<(), Failure> {
        if offsets.is_empty() {
            return Ok(());
        }
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.id.clone())))
            .with_generation_id_or_member_epoch(-1)
            .with_retention_time_ms(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|(p, o)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(*o)
                                .with_committed_leader_epoch(-1)
                        })
                        .collect(),
                )]);
        let r: OffsetCommitResponse =
            self.conn
                .call(ApiKey::OffsetCommit, self.commit_version, &req)?;
        let what = format!("committing offsets of group {}", self.id);
        for p in r.topics.iter().flat_map(|t| &t.partitions) {
            Failure::check(p.error_code, &what, None)?;
        }
        Ok(())
    }
}
