//! `shoal edge` in tests: an edge in front of an upstream `shoal serve`, and waiting for the edge to
//! list a topic the upstream has.

use super::{shoal_command, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `shoal edge` on `data_dir` with `cores` cores in front of `upstream` (bootstrap addresses), on
/// free ports.
pub fn edge_command(data_dir: &Path, cores: usize, upstream: &str, extra: &[&str]) -> Command {
    let args = [&["--upstream", upstream][..], extra].concat();
    shoal_command("edge", data_dir, cores, "127.0.0.1:0", &args)
}

/// One edge core in front of `upstream`, re-reading its topic list every 500 ms.
pub fn start_edge(data_dir: &Path, upstream: &str) -> Shoal {
    let cmd = edge_command(
        data_dir,
        1,
        upstream,
        &["--edge-metadata-refresh-ms", "500"],
    );
    let edge = Shoal::spawn(cmd, data_dir);
    assert_eq!(edge.ports.len(), 1);
    edge
}

/// The upstream: `shoal serve` on one core (groups rebalance at once).
pub fn start_upstream(data_dir: &Path, listen: &str) -> Shoal {
    Shoal::start_on(
        data_dir,
        1,
        listen,
        &["--group-initial-rebalance-delay-ms", "0"],
    )
}

/// Waits until `edge`'s metadata lists `topic` with `partitions` partitions, each led by one of the
/// edge's own cores (a broker on one of its ports).
pub fn wait_for_topic(edge: &Shoal, topic: &str, partitions: usize) {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", edge.bootstrap())
        .create()
        .expect("metadata client");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last: String;
    loop {
        match client.fetch_metadata(None, Duration::from_secs(5)) {
            Ok(md) => {
                if let Some(t) = md.topics().iter().find(|t| t.name() == topic) {
                    if t.error().is_none() && t.partitions().len() == partitions {
                        for p in t.partitions() {
                            let leader = md
                                .brokers()
                                .iter()
                                .find(|b| b.id() == p.leader())
                                .unwrap_or_else(|| {
                                    panic!("{topic}/{}: leader {} is no broker", p.id(), p.leader())
                                });
                            assert!(
                                edge.ports.contains(&(leader.port() as u16)),
                                "{topic}/{}: led by {}:{}, not by one of the edge's cores {:?}",
                                p.id(),
                                leader.host(),
                                leader.port(),
                                edge.ports
                            );
                        }
                        return;
                    }
                    last = format!(
                        "{topic}: error {:?}, {} partitions",
                        t.error(),
                        t.partitions().len()
                    );
                } else {
                    last = format!(
                        "topics {:?}",
                        md.topics().iter().map(|t| t.name()).collect::<Vec<_>>()
                    );
                }
            }
            Err(e) => last = e.to_string(),
        }
        assert!(
            Instant::now() < deadline,
            "the edge at {} did not list {topic} with {partitions} partitions within 15 s; last: {last}",
            edge.bootstrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
