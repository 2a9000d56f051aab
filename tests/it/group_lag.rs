//! Consumer group lag as the broker's metrics, against the real binary on 2 cores (so a group's
//! coordinator asks the other core for some of its partitions' ends): a librdkafka group consumes,
//! commits and leaves; records produced after the commit show as lag, per group and per partition,
//! and as time lag (their timestamps are an hour old); once the group consumes them and commits,
//! every figure is back to 0. The figures equal `shoal group describe`'s; also in `/v1/status`,
//! switched off and on live, and gone with the topic.

use crate::common;

use common::cli::{produce, produce_stamped};
use common::{create_topics, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "lag";
const GROUP: &str = "g";

/// Records produced to each partition after the group's first commit.
const BEHIND: [usize; 4] = [3, 5, 7, 9];

/// A librdkafka member of `GROUP` consumes until it has `want` records, commits its positions and
/// leaves.
fn consume_and_commit(bootstrap: &str, want: usize) {
    let consumer = common::cli::group_consumer(bootstrap, GROUP, TOPIC);
    let deadline = Instant::now() + WAIT;
    let mut seen = 0;
    while seen < want {
        assert!(Instant::now() < deadline, "consumed {seen} of {want}");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => seen += 1,
            Some(Err(e)) => eprintln!("consumer error (retried by librdkafka): {e}"),
            None => {}
        }
    }
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .expect("committed");
    consumer.unsubscribe();
}

/// The group's figures in one `/metrics` scrape.
#[derive(Debug, PartialEq, Eq)]
struct Figures {
    sum: u64,
    max: u64,
    time_lag_seconds: u64,
    partitions: Vec<u64>,
}

/// Whether `/metrics` has the group's lag series (a lag round has computed them).
fn exported(node: &Shoal) -> bool {
    let (_, body) = node.admin_get("/metrics");
    body.contains(&format!(
        "shoal_group_time_lag_seconds_max{{group=\"{GROUP}\"}}"
    ))
}

/// The group's figures, once a lag round has computed them.
fn figures(node: &Shoal) -> Option<Figures> {
    let label = format!("group=\"{GROUP}\"");
    if !exported(node) {
        return None;
    }
    let partition = |p: usize| format!("{label},topic=\"{TOPIC}\",partition=\"{p}\"");
    Some(Figures {
        sum: node.metric_with("shoal_group_lag_sum", &label),
        max: node.metric_with("shoal_group_lag_max", &label),
        time_lag_seconds: node.metric_with("shoal_group_time_lag_seconds_max", &label),
        partitions: (0..BEHIND.len())
            .map(|p| node.metric_with("shoal_group_partition_lag", &partition(p)))
            .collect(),
    })
}

/// Waits (bounded) until the group's figures satisfy `want`.
fn wait_for_figures(node: &Shoal, what: &str, want: impl Fn(&Figures) -> bool) -> Figures {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = figures(node);
        match now {
            Some(f) if want(&f) => return f,
            _ => assert!(Instant::now() < deadline, "{what}: still {now:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn caught_up(f: &Figures) -> bool {
    *f == Figures {
        sum: 0,
        max: 0,
        time_lag_seconds: 0,
        partitions: vec![0; BEHIND.len()],
    }
}

/// The group's entry in `/v1/status`.
fn status_entry(node: &Shoal) -> serde_json::Value {
    let (_, body) = node.admin_get("/v1/status");
    let status: serde_json::Value = serde_json::from_str(&body).expect("status is JSON");
    status["group_lag"]
        .as_array()
        .expect("a group_lag list")
        .iter()
        .find(|g| g["group"] == GROUP)
        .cloned()
        .unwrap_or_else(|| panic!("no lag of {GROUP} in {body}"))
}

#[test]
fn lag_after_the_last_commit_and_back_to_zero_once_consumed() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--group-initial-rebalance-delay-ms",
        "100",
        "--group-lag-interval-ms",
        "200",
        "--group-lag-per-partition",
    ];
    let node = Shoal::start(dir.path(), 2, &flags);
    let bootstrap = node.bootstrap();
    create_topics(&bootstrap, &[(TOPIC, BEHIND.len() as i32)]);
    produce(&bootstrap, TOPIC, &[10; 4]);
    consume_and_commit(&bootstrap, 40);
    wait_for_figures(&node, "after the first commit", caught_up);

    let hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 3_600_000;
    produce_stamped(&bootstrap, TOPIC, &BEHIND, Some(hour_ago));
    let total: usize = BEHIND.iter().sum();
    let lagging = wait_for_figures(&node, "records produced after the commit", |f| {
        f.sum == total as u64
    });
    assert_eq!(lagging.max, 9, "{lagging:?}");
    let expected: Vec<u64> = BEHIND.iter().map(|&n| n as u64).collect();
    assert_eq!(lagging.partitions, expected);
    assert!(
        (3_600..3_700).contains(&lagging.time_lag_seconds),
        "the first unconsumed records are an hour old: {lagging:?}"
    );
    // The metric is the operator command's figure: `shoal group describe`, per partition and in all.
    let described = common::cli::shoal(
        &[
            "group", "describe", GROUP, "-b", &bootstrap, "--format", "json",
        ],
        &[],
    )
    .json();
    assert_eq!(described["total_lag"], lagging.sum, "{described}");
    for p in described["partitions"].as_array().unwrap() {
        let index = p["partition"].as_u64().unwrap() as usize;
        assert_eq!(p["lag"], lagging.partitions[index], "{described}");
    }
    let entry = status_entry(&node);
    assert_eq!(entry["lag_sum"], total as u64, "{entry}");
    assert_eq!(entry["lag_max"], 9, "{entry}");
    assert!(
        entry["coordinator"].as_u64().is_some_and(|c| c < 2),
        "{entry}"
    );

    consume_and_commit(&bootstrap, total);
    wait_for_figures(&node, "after consuming to the end", caught_up);

    // Off live: the series go; on again: they come back.
    let (status, _) = node.admin_request("PUT", "/v1/config/group_lag_interval_ms?value=0", "");
    assert!(status.contains("200"), "{status}");
    let deadline = Instant::now() + WAIT;
    while exported(&node) {
        assert!(
            Instant::now() < deadline,
            "lag series still exported when off"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    node.admin_request("PUT", "/v1/config/group_lag_interval_ms?value=200", "");
    wait_for_figures(&node, "switched on again", caught_up);

    // A deleted topic's partitions are left out: the group, committed to no other, has no series.
    delete_topic(&bootstrap);
    let deadline = Instant::now() + WAIT;
    while exported(&node) {
        assert!(
            Instant::now() < deadline,
            "lag of a deleted topic still exported"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    node.stop();
}

fn delete_topic(bootstrap: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let deleted = futures_lite::future::block_on(admin.delete_topics(&[TOPIC], &opts));
    for r in deleted.expect("DeleteTopics answered") {
        r.expect("topic deleted");
    }
}
