//! `GET /v1/status`: every core's figures and the topic table as one JSON document.

use super::Cores;
use crate::stats::CoreSnapshot;
use crate::table::TopicTable;

type Json = serde_json::Value;

impl Cores {
    /// The document: version, topics, every core's figures, the partitions that stand out and
    /// the groups' lag.
    pub(super) fn status_json(
        &self,
        stats: &[CoreSnapshot],
        table: &TopicTable,
        settings: &[crate::cores::mesh::Setting],
    ) -> String {
        let topics = self.topics_json(stats, table);
        let per_core: Vec<serde_json::Value> = stats
            .iter()
            .map(|s| {
                serde_json::json!({
                    "core": s.core,
                    "port": self.ports[s.core],
                    "connections_open": s.kafka.connections_open,
                    "partitions": s.partitions.len(),
                    "read_replicas": s.replicas.held,
                    "log_bytes": s.partitions.iter().map(|p| p.size_bytes).sum::<u64>(),
                    "tail_cache_bytes": s.tail_cache.used_bytes as u64,
                    "storage_errors": s.storage.errors,
                    "storage_failing": s.storage.failing_logs,
                    "edge": s.edge,
                    "streams": {
                        "subscribers": s.http.subscribers,
                        "websocket_subscribers": s.http.websocket_subscribers,
                        "frames_encoded": s.http.frames_encoded,
                        "frames_sent": s.http.frames_sent,
                        "slow_disconnects": s.http.slow_disconnects,
                        "gaps": s.http.gaps,
                        "topics": s.http.topics.iter().map(|(t, n)| serde_json::json!({"topic": t, "subscribers": n})).collect::<Vec<_>>(),
                    },
                })
            })
            .collect();
        let (storage_failures, upstream, replicated) = self.partition_lists(stats, table);
        // Consumer groups' lag as their coordinator cores last computed it.
        let group_lag: Vec<serde_json::Value> = stats
            .iter()
            .flat_map(|s| {
                s.group_lag.iter().map(move |g| {
                    let mut v = serde_json::json!(g);
                    v["coordinator"] = s.core.into();
                    v
                })
            })
            .collect();
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "settings": super::settings::settings_value(settings),
            "group_lag": group_lag,
            "replicated_partitions": replicated,
            "upstream_partitions": upstream,
            "data_dir": self.data_dir,
            "topic_table_revision": table.revision,
            "topics": topics,
            "cores": per_core,
            "storage_failures": storage_failures,
        })
        .to_string()
    }

    /// Each topic: partitions, configs, leaders and each partition's read replica cores.
    fn topics_json(
        &self,
        stats: &[CoreSnapshot],
        table: &TopicTable,
    ) -> serde_json::Map<String, serde_json::Value> {
        let cores = self.ports.len();
        table
            .topics
            .iter()
            .map(|(name, m)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "partitions": m.partitions,
                        "configs": m.configs,
                        "leaders": (0..m.partitions).map(|p| table.owner(m, p, cores)).collect::<Vec<_>>(),
                        // Each partition's read replica cores, as its owner core says.
                        "replica_cores": (0..m.partitions).map(|p| {
                            let owner = table.owner(m, p, cores);
                            stats
                                .iter()
                                .find(|s| s.core == owner)
                                .and_then(|s| {
                                    s.replicas.replica_cores.iter().find(|r| r.0 == *name && r.1 == p)
                                })
                                .map_or_else(Vec::new, |r| r.2.clone())
                        }).collect::<Vec<_>>(),
                    }),
                )
            })
            .collect()
    }

    /// The partitions that stand out: those whose storage fails, those an edge mirrors (with their
    /// upstream position) and those with read replicas.
    fn partition_lists(
        &self,
        stats: &[CoreSnapshot],
        table: &TopicTable,
    ) -> (Vec<Json>, Vec<Json>, Vec<Json>) {
        // Partitions whose appends fail now, with the failure that started it.
        let storage_failures: Vec<Json> = stats
            .iter()
            .flat_map(|s| {
                s.partitions.iter().filter_map(move |p| {
                    p.storage_failure.as_ref().map(|error| {
                        serde_json::json!({
                            "core": s.core,
                            "topic": p.topic,
                            "partition": p.partition,
                            "error": error,
                        })
                    })
                })
            })
            .collect();
        // Edge mode: each partition's upstream position, where a consumer has asked for it.
        let upstream: Vec<Json> = stats
            .iter()
            .flat_map(|s| {
                s.partitions.iter().filter_map(move |p| {
                    p.upstream.as_ref().map(|u| {
                        serde_json::json!({
                            "core": s.core,
                            "topic": p.topic,
                            "partition": p.partition,
                            "log_start_offset": p.log_start_offset,
                            "high_watermark": p.high_watermark,
                            "upstream": u,
                        })
                    })
                })
            })
            .collect();
        // Partitions with read replicas on other cores: each with its leader and those cores.
        let replicated: Vec<Json> = stats
            .iter()
            .flat_map(|s| {
                s.replicas
                    .replica_cores
                    .iter()
                    .filter_map(move |(topic, partition, cores)| {
                        let owner = table
                            .get(topic)
                            .map(|m| table.owner(m, *partition, self.ports.len()))?;
                        (owner == s.core).then(|| {
                            serde_json::json!({
                                "topic": topic,
                                "partition": partition,
                                "leader": owner,
                                "replica_cores": cores,
                            })
                        })
                    })
            })
            .collect();
        (storage_failures, upstream, replicated)
    }
}
