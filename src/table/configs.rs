//! Topic configs as Kafka's admin APIs see them: every topic config shoal knows, with its Kafka
//! name, type, the `shoal serve` flag (broker config) it defaults to, and the value in effect;
//! and the broker configs, which are the server's flags and read-only.

use shards::LogConfig;
use std::collections::BTreeMap;

/// Where a config's value comes from (Kafka's `ConfigSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// Set on the topic (CreateTopics, AlterConfigs, IncrementalAlterConfigs).
    DynamicTopic = 1,
    /// A `shoal serve` flag set to something other than its default.
    StaticBroker = 4,
    /// The built-in default.
    Default = 5,
}

/// Kafka's config value types (DescribeConfigs v3+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
}

/// One config as described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: &'static str,
    pub value: String,
    pub source: ConfigSource,
    pub read_only: bool,
    pub config_type: ConfigType,
    pub doc: &'static str,
    /// What it would be without the topic's own value: the broker config it defaults to.
    pub synonyms: Vec<(&'static str, String, ConfigSource)>,
}

/// A topic config shoal knows: Kafka name, the broker config (flag) it defaults to, type, doc.
struct Known {
    name: &'static str,
    broker: &'static str,
    config_type: ConfigType,
    doc: &'static str,
}

const TOPIC_CONFIGS: &[Known] = &[
    Known {
        name: "cleanup.policy",
        broker: "log.cleanup.policy",
        config_type: ConfigType::List,
        doc: "delete (old segments are deleted by retention), compact (the latest record per key is kept), or both",
    },
    Known {
        name: "compression.type",
        broker: "compression.type",
        config_type: ConfigType::String,
        doc: "the codec batches are stored in: producer (each batch keeps the producer's), or uncompressed, gzip, snappy, lz4 or zstd (batches in another codec are recompressed on append)",
    },
    Known {
        name: "compression.gzip.level",
        broker: "compression.gzip.level",
        config_type: ConfigType::Int,
        doc: "gzip's level when batches are recompressed to gzip: 1-9, or -1 for the default (6)",
    },
    Known {
        name: "compression.lz4.level",
        broker: "compression.lz4.level",
        config_type: ConfigType::Int,
        doc: "accepted as Kafka accepts it (1-17); shoal's LZ4 encoder writes at its one level",
    },
    Known {
        name: "compression.zstd.level",
        broker: "compression.zstd.level",
        config_type: ConfigType::Int,
        doc: "zstd's level when batches are recompressed to zstd",
    },
    Known {
        name: "delete.retention.ms",
        broker: "log.cleaner.delete.retention.ms",
        config_type: ConfigType::Long,
        doc: "compacted topics: a tombstone stays readable this long after it was written",
    },
    Known {
        name: "file.delete.delay.ms",
        broker: "log.segment.delete.delay.ms",
        config_type: ConfigType::Long,
        doc: "accepted for Kafka compatibility and not needed: shoal removes deleted and compacted segment files at once, and reads in flight keep the files they opened",
    },
    Known {
        name: "flush.ms",
        broker: "log.flush.interval.ms",
        config_type: ConfigType::Long,
        doc: "acks=0/1 data is fsynced at least this often (acks=all always is before its acknowledgement)",
    },
    Known {
        name: "max.message.bytes",
        broker: "message.max.bytes",
        config_type: ConfigType::Int,
        doc: "largest record batch accepted",
    },
    Known {
        name: "max.compaction.lag.ms",
        broker: "log.cleaner.max.compaction.lag.ms",
        config_type: ConfigType::Long,
        doc: "compacted topics: a record stays uncompacted at most about this long",
    },
    Known {
        name: "message.timestamp.type",
        broker: "log.message.timestamp.type",
        config_type: ConfigType::String,
        doc: "CreateTime (the producer's) or LogAppendTime (the broker's clock)",
    },
    Known {
        name: "message.format.version",
        broker: "log.message.format.version",
        config_type: ConfigType::String,
        doc: "accepted as Kafka 3 accepts it, and without effect: batches are always RecordBatch v2",
    },
    Known {
        name: "min.cleanable.dirty.ratio",
        broker: "log.cleaner.min.cleanable.ratio",
        config_type: ConfigType::Double,
        doc: "compacted topics: compact once this share of the log is not compacted yet",
    },
    Known {
        name: "min.compaction.lag.ms",
        broker: "log.cleaner.min.compaction.lag.ms",
        config_type: ConfigType::Long,
        doc: "compacted topics: a record stays uncompacted at least this long",
    },
    Known {
        name: "retention.bytes",
        broker: "log.retention.bytes",
        config_type: ConfigType::Long,
        doc: "old segments are deleted while a partition stays at least this big (-1: no limit)",
    },
    Known {
        name: "retention.ms",
        broker: "log.retention.ms",
        config_type: ConfigType::Long,
        doc: "segments whose newest record is older than this are deleted (-1: keep forever)",
    },
    Known {
        name: "segment.bytes",
        broker: "log.segment.bytes",
        config_type: ConfigType::Int,
        doc: "a partition rolls to a new segment file when the active one would grow past this",
    },
    Known {
        name: READ_REPLICAS_CONFIG,
        broker: "shoal.read.replicas",
        config_type: ConfigType::String,
        doc: "read replicas of this topic's partitions on the other cores: all, auto (when a partition is hot), off, or default (the server's --read-replicas)",
    },
    Known {
        name: "segment.ms",
        broker: "log.roll.ms",
        config_type: ConfigType::Long,
        doc: "a partition rolls to a new segment when the active one's first record is this old",
    },
];

/// The topic config (shoal's own) that says where a topic's partitions get read replicas.
pub const READ_REPLICAS_CONFIG: &str = "shoal.read.replicas";

/// When a partition gets read replicas on the other cores (`--read-replicas`, and per topic
/// [`READ_REPLICAS_CONFIG`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaPolicy {
    /// Once a partition is hot: enough consumers on its owner core, or the owner core busy.
    #[default]
    Auto,
    /// Every partition, on every other core, always.
    All,
    /// Never: a partition is served by its owner core only.
    Off,
}

impl ReplicaPolicy {
    pub fn parse(v: &str) -> Result<Self, String> {
        match v {
            "auto" => Ok(Self::Auto),
            "all" => Ok(Self::All),
            "off" => Ok(Self::Off),
            _ => Err(format!("{v:?}: read replicas are all, auto or off")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::All => "all",
            Self::Off => "off",
        }
    }
    /// A topic's own policy, if its configs set one (`default` or none: the server's).
    pub fn of_topic(configs: &BTreeMap<String, String>) -> Option<Self> {
        configs
            .get(READ_REPLICAS_CONFIG)
            .and_then(|v| Self::parse(v).ok())
    }
}

/// Whether `name` is a topic config shoal knows.
pub fn is_topic_config(name: &str) -> bool {
    TOPIC_CONFIGS.iter().any(|k| k.name == name)
}

/// Whether topic config `name` holds a comma-separated list (IncrementalAlterConfigs APPEND and
/// SUBTRACT apply to those only).
pub fn is_list_config(name: &str) -> bool {
    TOPIC_CONFIGS
        .iter()
        .any(|k| k.name == name && k.config_type == ConfigType::List)
}

fn ms(d: Option<std::time::Duration>, none: i64) -> String {
    d.map_or(none, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .to_string()
}

/// The value of topic config `name` in effect under `c`, as Kafka writes it.
pub fn topic_config_value(name: &str, c: &LogConfig) -> String {
    match name {
        "cleanup.policy" => match (c.cleanup_delete, c.cleanup_compact) {
            (true, true) => "compact,delete",
            (false, true) => "compact",
            _ => "delete",
        }
        .into(),
        "delete.retention.ms" => ms(Some(c.delete_retention), -1),
        "max.compaction.lag.ms" => ms(c.max_compaction_lag, i64::MAX),
        "min.cleanable.dirty.ratio" => c.min_cleanable_dirty_ratio.to_string(),
        "min.compaction.lag.ms" => ms(Some(c.min_compaction_lag), 0),
        "file.delete.delay.ms" => "60000".into(),
        "compression.type" => match c.compression.codec {
            None => "producer",
            Some(0) => "uncompressed",
            Some(1) => "gzip",
            Some(2) => "snappy",
            Some(3) => "lz4",
            Some(_) => "zstd",
        }
        .into(),
        "compression.gzip.level" => c.compression.gzip_level.to_string(),
        "compression.lz4.level" => c.compression.lz4_level.to_string(),
        "compression.zstd.level" => c.compression.zstd_level.to_string(),
        "message.format.version" => "3.0-IV1".into(),
        "flush.ms" => ms(c.flush_interval, i64::MAX),
        "max.message.bytes" => c.max_batch_bytes.to_string(),
        "message.timestamp.type" => if c.log_append_time {
            "LogAppendTime"
        } else {
            "CreateTime"
        }
        .into(),
        "retention.bytes" => c.retention_bytes.map_or("-1".into(), |b| b.to_string()),
        "retention.ms" => ms(c.retention_age, -1),
        "segment.bytes" => c.segment_bytes.to_string(),
        "segment.ms" => ms(c.segment_age, i64::MAX),
        READ_REPLICAS_CONFIG => "default".into(),
        _ => String::new(),
    }
}

/// The source of a value that comes from the server: a flag changed from its default, or not.
fn server_source(name: &str, server: &LogConfig) -> ConfigSource {
    if topic_config_value(name, server) == topic_config_value(name, &LogConfig::default()) {
        ConfigSource::Default
    } else {
        ConfigSource::StaticBroker
    }
}

/// Every topic config of a topic whose own values are `overrides`, over the server's `server`.
pub fn topic_config_entries(
    server: &LogConfig,
    overrides: &BTreeMap<String, String>,
) -> Vec<ConfigEntry> {
    TOPIC_CONFIGS
        .iter()
        .map(|k| {
            let inherited = (
                k.broker,
                topic_config_value(k.name, server),
                server_source(k.name, server),
            );
            let (value, source, synonyms) = match overrides.get(k.name) {
                Some(v) => (
                    v.clone(),
                    ConfigSource::DynamicTopic,
                    vec![(k.name, v.clone(), ConfigSource::DynamicTopic), inherited],
                ),
                None => (inherited.1.clone(), inherited.2, vec![inherited]),
            };
            ConfigEntry {
                name: k.name,
                value,
                source,
                read_only: false,
                config_type: k.config_type,
                doc: k.doc,
                synonyms,
            }
        })
        .collect()
}

/// The broker configs: the server's flags, read-only (changed only by restarting with others).
pub fn broker_config_entries(server: &LogConfig, default_partitions: i32) -> Vec<ConfigEntry> {
    let mut out: Vec<ConfigEntry> = TOPIC_CONFIGS
        .iter()
        .map(|k| {
            let value = topic_config_value(k.name, server);
            let source = server_source(k.name, server);
            ConfigEntry {
                name: k.broker,
                value: value.clone(),
                source,
                read_only: true,
                config_type: k.config_type,
                doc: k.doc,
                synonyms: vec![(k.broker, value, source)],
            }
        })
        .collect();
    out.push(ConfigEntry {
        name: "num.partitions",
        value: default_partitions.to_string(),
        source: ConfigSource::StaticBroker,
        read_only: true,
        config_type: ConfigType::Int,
        doc: "partitions of a topic created without a count",
        synonyms: Vec::new(),
    });
    out.sort_by_key(|e| e.name);
    out
}
