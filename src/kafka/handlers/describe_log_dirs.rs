//! DescribeLogDirs (`kafka-log-dirs.sh`): the size on disk of the partitions this core (this
//! broker) leads, in its one log directory, with the file system's total and free bytes (v4).
//! Needs DESCRIBE on the cluster, as Kafka does.

use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{
    ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::path::Path;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DescribeLogDirs,
    min: 1,
    max: 4,
};

pub fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: DescribeLogDirsRequest = decode(req)?;
    let v = req.api_version;
    if !who.may_cluster(core, Operation::Describe) {
        // Before v3 there is no error field: a client without the right sees no directory.
        let response = DescribeLogDirsResponse::default();
        let response = if v >= 3 {
            response.with_error_code(ResponseError::ClusterAuthorizationFailed.code())
        } else {
            response
        };
        return Ok(frame(ApiKey::DescribeLogDirs, req, &response));
    }
    let dir = &core.config().data_dir;
    let mut result = DescribeLogDirsResult::default()
        .with_log_dir(StrBytes::from_string(dir.display().to_string()))
        .with_topics(sizes(core, request.topics.as_deref()));
    if v >= 4 {
        let (total, usable) = file_system_bytes(dir).unwrap_or((-1, -1));
        result = result.with_total_bytes(total).with_usable_bytes(usable);
    }
    Ok(frame(
        ApiKey::DescribeLogDirs,
        req,
        &DescribeLogDirsResponse::default().with_results(vec![result]),
    ))
}

/// Each asked-for partition this core owns with its size (every partition it owns when `asked`
/// is null); partitions led elsewhere or unknown are left out, as Kafka leaves out replicas a
/// broker does not hold.
fn sizes(
    core: &Core,
    asked: Option<&[kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic]>,
) -> Vec<DescribeLogDirsTopic> {
    let mut by_topic: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    let mut add = |p: &shards::partition::Partition| {
        by_topic.entry(p.topic.clone()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(p.index)
                .with_partition_size(p.log.stats().size_bytes.min(i64::MAX as u64) as i64)
                .with_offset_lag(0),
        );
    };
    match asked {
        None => core.owned_partitions().iter().for_each(|p| add(p)),
        Some(topics) => {
            for t in topics {
                for &index in &t.partitions {
                    if let Some(p) = core.partition(&t.topic, index) {
                        add(&p);
                    }
                }
            }
        }
    }
    by_topic
        .into_iter()
        .map(|(name, mut partitions)| {
            partitions.sort_by_key(|p| p.partition_index);
            partitions.dedup_by_key(|p| p.partition_index);
            DescribeLogDirsTopic::default()
                .with_name(TopicName(StrBytes::from_string(name)))
                .with_partitions(partitions)
        })
        .collect()
}

/// The file system's size and the bytes an unprivileged writer may still use, from `statvfs`.
pub fn file_system_bytes(dir: &Path) -> Option<(i64, i64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let block = st.f_frsize as i64;
    Some((
        (st.f_blocks as i64).saturating_mul(block),
        (st.f_bavail as i64).saturating_mul(block),
    ))
}
