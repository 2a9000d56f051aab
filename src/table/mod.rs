//! The topic table every core holds a copy of, and the partition -> core mapping derived
//! from it. A partition is owned by exactly one core; Metadata names that core as its leader, so
//! produce and fetch requests reach the core that holds the data and nothing crosses cores.
//!
//! - [`acl`]     — ACLs in Kafka's model, kept in the table, and the authorizer's decision.
//! - [`configs`] — topic and broker configs as Kafka's admin APIs describe them: names, types,
//!   values in effect, sources, synonyms.

pub mod acl;
pub mod configs;

use kafka_protocol::protocol::StrBytes;
use serde::{Deserialize, Serialize};
use shards::LogConfig;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// One topic as the control plane records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Kafka topic id (UUID bytes), reported in Metadata v10+.
    pub id: [u8; 16],
    pub partitions: i32,
    /// Topic configs as given at creation (validated).
    pub configs: BTreeMap<String, String>,
    /// Creation order: spreads partition 0 of successive topics over different cores.
    pub ordinal: u64,
}

/// All topics, with a revision that grows with every change. Persisted by core 0, copied to every core.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicTable {
    pub revision: u64,
    pub next_ordinal: u64,
    pub topics: BTreeMap<String, TopicMeta>,
    /// Every ACL (CreateAcls / DeleteAcls), in creation order.
    #[serde(default)]
    pub acls: Vec<crate::table::acl::AclBinding>,
}

impl TopicTable {
    pub fn get(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// Partitions spread round robin over cores, starting at a core that moves with each topic.
    pub fn owner(&self, meta: &TopicMeta, partition: i32, cores: usize) -> usize {
        ((meta.ordinal + partition as u64) % cores as u64) as usize
    }

    /// Every (topic, partition) owned by `core`.
    pub fn owned_by(&self, core: usize, cores: usize) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for (name, meta) in &self.topics {
            for p in 0..meta.partitions {
                if self.owner(meta, p, cores) == core {
                    out.push((name.clone(), p));
                }
            }
        }
        out
    }
}

/// Most shards a view may have.
pub const MAX_VIEW_SHARDS: u32 = 1024;

/// A sharded view's name, `<source>.shard-<i>-of-<n>`, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewName {
    pub source: String,
    pub shard: u32,
    pub shards: u32,
}

/// `None` if `name` is not view-shaped; `Some(Err)` if it is but its numbers are impossible
/// (`shard-9-of-4`, `n` over 1024, `n` = 0).
pub fn parse_view_name(name: &str) -> Option<Result<ViewName, String>> {
    let (source, suffix) = name.rsplit_once(".shard-")?;
    let (i, n) = suffix.split_once("-of-")?;
    let (Ok(shard), Ok(shards)) = (i.parse::<u32>(), n.parse::<u32>()) else {
        return None;
    };
    if source.is_empty() || shards == 0 || shards > MAX_VIEW_SHARDS || shard >= shards {
        return Some(Err(format!(
            "view {name}: need 0 <= i < n <= {MAX_VIEW_SHARDS}"
        )));
    }
    Some(Ok(ViewName {
        source: source.to_string(),
        shard,
        shards,
    }))
}

/// The topic holding the data `name` names: a view's source (a prefix of the name, so nothing is
/// allocated), or `name` itself; `None` for a view name whose numbers are impossible.
pub fn source_topic(name: &str) -> Option<&str> {
    match parse_view_name(name) {
        None => Some(name),
        Some(Ok(_)) => name.rsplit_once(".shard-").map(|(source, _)| source),
        Some(Err(_)) => None,
    }
}

/// A view's topic id: the source's, mixed with the view's numbers, so each view has its own.
pub fn view_topic_id(source_id: [u8; 16], view: &ViewName) -> [u8; 16] {
    let mut id = source_id;
    id[8..12]
        .iter_mut()
        .zip(view.shard.to_be_bytes())
        .for_each(|(a, b)| *a ^= b);
    id[12..16]
        .iter_mut()
        .zip(view.shards.to_be_bytes())
        .for_each(|(a, b)| *a ^= b);
    id
}

/// The topics' names by id, for requests that name topics by id (Fetch v13+, Produce v13,
/// Metadata v12+): built with each topic table a core installs, so that a request's lookup is one
/// hash lookup, never a scan of the table.
#[derive(Debug, Default)]
pub struct TopicIds {
    by_id: HashMap<[u8; 16], StrBytes>,
    /// Each topic (name, id) by the first half of its id, which its views' ids share
    /// ([`view_topic_id`] mixes the view's numbers into the second half only).
    by_prefix: HashMap<[u8; 8], (String, [u8; 16])>,
}

impl TopicIds {
    pub fn of(table: &TopicTable) -> TopicIds {
        let mut ids = TopicIds::default();
        for (name, meta) in &table.topics {
            ids.by_id
                .insert(meta.id, StrBytes::from_string(name.clone()));
            ids.by_prefix
                .insert(prefix(&meta.id), (name.clone(), meta.id));
        }
        ids
    }

    /// The name of the topic or view with this id, if there is one.
    pub fn name(&self, id: &[u8; 16]) -> Option<StrBytes> {
        if let Some(name) = self.by_id.get(id) {
            return Some(name.clone());
        }
        let (source, source_id) = self.by_prefix.get(&prefix(id))?;
        let mixed = |at: usize| {
            let word = |b: &[u8; 16]| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            word(id) ^ word(source_id)
        };
        let (shard, shards) = (mixed(8), mixed(12));
        (shard < shards && shards <= MAX_VIEW_SHARDS)
            .then(|| StrBytes::from_string(format!("{source}.shard-{shard}-of-{shards}")))
    }
}

fn prefix(id: &[u8; 16]) -> [u8; 8] {
    let mut p = [0; 8];
    p.copy_from_slice(&id[..8]);
    p
}

/// Kafka's rules: 1 to 249 characters of `[a-zA-Z0-9._-]`, and not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 249 {
        return Err(format!(
            "topic name must have 1 to 249 characters, not {}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err("topic name cannot be '.' or '..'".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic name contains {c:?}: only [a-zA-Z0-9._-] are allowed"
        ));
    }
    Ok(())
}

/// `cleanup.policy`, a list in Kafka: delete, compact, or both; as (delete, compact).
fn cleanup_policy(v: &str) -> Result<(bool, bool), String> {
    let (mut delete, mut compact) = (false, false);
    for p in v.split(',').map(str::trim) {
        match p {
            "delete" => delete = true,
            "compact" => compact = true,
            _ => {
                return Err(format!(
                    "cleanup.policy={v:?}: each entry must be delete or compact"
                ))
            }
        }
    }
    if !(delete || compact) {
        return Err(format!(
            "cleanup.policy={v:?}: name delete, compact or both"
        ));
    }
    Ok((delete, compact))
}

/// `compression.type` and the codecs' levels.
fn apply_compression(c: &mut shards::Compression, k: &str, v: &str) -> Result<(), String> {
    match k {
        "compression.type" => {
            c.codec = match v {
                "producer" => None,
                "uncompressed" => Some(0),
                "gzip" => Some(1),
                "snappy" => Some(2),
                "lz4" => Some(3),
                "zstd" => Some(4),
                _ => {
                    return Err(format!(
                        "{k}={v:?} must be uncompressed, zstd, lz4, snappy, gzip or producer"
                    ))
                }
            }
        }
        "compression.gzip.level" => c.gzip_level = level(k, v, 1, 9, true)?,
        "compression.lz4.level" => c.lz4_level = level(k, v, 1, 17, false)?,
        "compression.zstd.level" => c.zstd_level = level(k, v, -131_072, 22, false)?,
        _ => return Err(format!("unsupported topic config {k}")),
    }
    Ok(())
}

/// A codec level config's value: a number from `min` to `max` (or -1, the codec's default, where
/// `default_ok`).
fn level(k: &str, v: &str, min: i32, max: i32, default_ok: bool) -> Result<i32, String> {
    v.parse::<i32>()
        .ok()
        .filter(|l| (min..=max).contains(l) || (default_ok && *l == -1))
        .ok_or_else(|| format!("{k}={v:?} must be a number from {min} to {max}"))
}

/// Whether `v` names a Kafka version as `message.format.version` takes it: `2.8`, `0.10.2`,
/// `3.0-IV1`.
fn is_kafka_version(v: &str) -> bool {
    let (version, iv) = v.split_once("-IV").map_or((v, None), |(a, b)| (a, Some(b)));
    let parts: Vec<&str> = version.split('.').collect();
    let number = |p: &str| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit());
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| number(p)) && iv.is_none_or(number)
}

/// Topic configs shoal understands, applied over the server's defaults. Unknown keys and bad values
/// are refused (Kafka: `INVALID_CONFIG`).
pub fn apply_topic_configs(
    base: &LogConfig,
    configs: &BTreeMap<String, String>,
) -> Result<LogConfig, String> {
    let mut c = base.clone();
    let num = |k: &str, v: &str| {
        v.parse::<i64>()
            .map_err(|_| format!("{k}={v:?} is not a number"))
    };
    for (k, v) in configs {
        match k.as_str() {
            "retention.ms" => {
                c.retention_age = u64::try_from(num(k, v)?).ok().map(Duration::from_millis)
            }
            "retention.bytes" => c.retention_bytes = u64::try_from(num(k, v)?).ok(),
            "segment.bytes" => {
                c.segment_bytes =
                    u64::try_from(num(k, v)?).map_err(|_| format!("{k} must be positive"))?
            }
            "segment.ms" => {
                c.segment_age = Some(Duration::from_millis(
                    u64::try_from(num(k, v)?).map_err(|_| format!("{k} must be positive"))?,
                ))
            }
            "flush.ms" => {
                c.flush_interval = u64::try_from(num(k, v)?).ok().map(Duration::from_millis)
            }
            "max.message.bytes" => {
                c.max_batch_bytes =
                    usize::try_from(num(k, v)?).map_err(|_| format!("{k} must be positive"))?
            }
            "message.timestamp.type" => match v.as_str() {
                "CreateTime" => c.log_append_time = false,
                "LogAppendTime" => c.log_append_time = true,
                _ => return Err(format!("{k} must be CreateTime or LogAppendTime")),
            },
            "cleanup.policy" => (c.cleanup_delete, c.cleanup_compact) = cleanup_policy(v)?,
            "min.cleanable.dirty.ratio" => {
                c.min_cleanable_dirty_ratio = v
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| format!("{k}={v:?} must be a number from 0 to 1"))?
            }
            "min.compaction.lag.ms" => {
                c.min_compaction_lag = Duration::from_millis(
                    u64::try_from(num(k, v)?).map_err(|_| format!("{k} must not be negative"))?,
                )
            }
            "max.compaction.lag.ms" => {
                let ms = u64::try_from(num(k, v)?)
                    .ok()
                    .filter(|&ms| ms > 0)
                    .ok_or_else(|| format!("{k} must be positive"))?;
                c.max_compaction_lag = (ms < i64::MAX as u64).then(|| Duration::from_millis(ms))
            }
            k if k.starts_with("compression.") => apply_compression(&mut c.compression, k, v)?,
            // Kafka 3's brokers accept it and write the current format whatever it says.
            "message.format.version" if !is_kafka_version(v) => {
                return Err(format!(
                    "{k}={v:?} is not a Kafka version (such as 2.8 or 3.0-IV1)"
                ))
            }
            "message.format.version" => {}
            // Kafka waits this long before removing a file; shoal need not (see topic_configs).
            "file.delete.delay.ms" => {
                u64::try_from(num(k, v)?).map_err(|_| format!("{k} must not be negative"))?;
            }
            "delete.retention.ms" => {
                c.delete_retention = Duration::from_millis(
                    u64::try_from(num(k, v)?).map_err(|_| format!("{k} must not be negative"))?,
                )
            }
            // Not the log's: the read path's (`ReplicaPolicy::of_topic`).
            crate::table::configs::READ_REPLICAS_CONFIG => {
                if v != "default" {
                    crate::table::configs::ReplicaPolicy::parse(v)
                        .map_err(|e| format!("{k}={e} (or default)"))?;
                }
            }
            _ => return Err(format!("unsupported topic config {k}")),
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_topic_name("orders.v1_a-b").is_ok());
        for bad in ["", ".", "..", "a b", "a/b", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topics_and_views_are_found_by_id() {
        let mut t = TopicTable::default();
        for (name, id) in [("orders", [7u8; 16]), ("users", [9u8; 16])] {
            let meta = TopicMeta {
                id,
                partitions: 4,
                configs: BTreeMap::new(),
                ordinal: 0,
            };
            t.topics.insert(name.into(), meta);
        }
        let ids = TopicIds::of(&t);
        let name = |id: &[u8; 16]| ids.name(id).map(|n| n.to_string());
        assert_eq!(name(&[7; 16]).as_deref(), Some("orders"));
        assert_eq!(name(&[9; 16]).as_deref(), Some("users"));
        let view = |shard, shards| ViewName {
            source: "orders".into(),
            shard,
            shards,
        };
        for (shard, shards) in [(0, 1), (2, 3), (1023, 1024)] {
            let id = view_topic_id([7; 16], &view(shard, shards));
            let want = format!("orders.shard-{shard}-of-{shards}");
            assert_eq!(name(&id), Some(want));
        }
        // Impossible views, and ids no topic has.
        for (shard, shards) in [(3, 3), (0, 1025)] {
            assert_eq!(name(&view_topic_id([7; 16], &view(shard, shards))), None);
        }
        assert_eq!(name(&[8; 16]), None);
        assert_eq!(name(&[0; 16]), None);
    }

    #[test]
    fn partitions_are_spread_over_cores() {
        let mut t = TopicTable::default();
        t.topics.insert(
            "a".into(),
            TopicMeta {
                id: [0; 16],
                partitions: 8,
                configs: BTreeMap::new(),
                ordinal: 0,
            },
        );
        t.topics.insert(
            "b".into(),
            TopicMeta {
                id: [1; 16],
                partitions: 1,
                configs: BTreeMap::new(),
                ordinal: 1,
            },
        );
        assert_eq!(t.owned_by(0, 2).len(), 4);
        assert_eq!(t.owned_by(1, 2).len(), 5); // four of "a" and the one of "b"
    }

    #[test]
    fn view_names() {
        let v = parse_view_name("orders.v1.shard-3-of-8").unwrap().unwrap();
        assert_eq!(source_topic("orders.v1.shard-3-of-8"), Some("orders.v1"));
        assert_eq!((v.source.as_str(), v.shard, v.shards), ("orders.v1", 3, 8));
        for bad in [
            "t.shard-9-of-4",
            "t.shard-0-of-0",
            "t.shard-0-of-1025",
            ".shard-0-of-2",
        ] {
            assert!(parse_view_name(bad).unwrap().is_err(), "{bad}");
            assert_eq!(source_topic(bad), None, "{bad}");
        }
        for plain in ["orders", "t.shard-x-of-2", "t.shard-1-of-", "shard-1-of-2"] {
            assert!(parse_view_name(plain).is_none(), "{plain}");
            assert_eq!(source_topic(plain), Some(plain));
        }
    }

    #[test]
    fn topic_configs() {
        let base = LogConfig::default();
        let mut m = BTreeMap::new();
        m.insert("retention.ms".to_string(), "-1".to_string());
        m.insert(
            "message.timestamp.type".to_string(),
            "LogAppendTime".to_string(),
        );
        let c = apply_topic_configs(&base, &m).unwrap();
        assert_eq!((c.retention_age, c.log_append_time), (None, true));
        m.insert("compression.type".to_string(), "zstd".to_string());
        m.insert("compression.zstd.level".to_string(), "9".to_string());
        m.insert("message.format.version".to_string(), "2.8-IV1".to_string());
        let c = apply_topic_configs(&base, &m).unwrap();
        assert_eq!(
            (c.compression.codec, c.compression.zstd_level),
            (Some(4), 9)
        );
        for (k, bad) in [
            ("compression.type", "brotli"),
            ("compression.gzip.level", "10"),
            ("compression.gzip.level", "x"),
            ("compression.lz4.level", "-1"),
            ("compression.zstd.level", "23"),
            ("message.format.version", "latest"),
            ("message.format.version", "3"),
            ("unknown.config", "1"),
        ] {
            let mut m = m.clone();
            m.insert(k.to_string(), bad.to_string());
            assert!(apply_topic_configs(&base, &m).is_err(), "{k}={bad}");
        }
        for ok in ["0.10.2", "3.0-IV1", "2.8"] {
            assert!(is_kafka_version(ok), "{ok}");
        }
    }
}
