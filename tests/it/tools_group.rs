//! `shoal group` against the real binary: a librdkafka consumer group's lag equal to what was
//! produced after its last commit, per partition and in total; `seek --to-datetime` moving the
//! group to exactly the first record at or after the time, where a librdkafka consumer of the
//! group then starts; `seek` and `delete` refused by name while a consumer is in the group;
//! `--dry-run` changing nothing; `delete` removing the group; a silent broker failing within
//! --timeout; over SASL_SSL with ACLs, a user without a grant refused by name. And the read-only
//! commands (`topic list`, `topic describe`, `group list`, `group describe`) through `shoal edge`
//! giving the upstream's answers. JSON output parsed throughout.

use crate::common;

use common::cli::{
    assert_help_has_an_example, consume, group, group_consumer, produce, produce_records, shoal,
    topic, Run, Secured,
};
use common::edge::{start_edge, wait_for_topic};
use common::Shoal;
use rdkafka::consumer::{CommitMode, Consumer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Partition `p`'s record at offset `o` was made at this time (ms): a second per offset, and each
/// partition half a second later than the one before, so one time falls differently in each.
fn made_at(p: usize, o: usize) -> i64 {
    const BASE_TS: i64 = 1_700_000_000_000; // 2023-11-14T22:13:20Z
    BASE_TS + o as i64 * 1000 + p as i64 * 500
}

/// Produces `counts[p]` records to partition `p`, from offset `from[p]`, each made at
/// [`made_at`].
fn produce_timed(bootstrap: &str, topic: &str, from: &[usize], counts: &[usize]) {
    let records: Vec<(i32, Option<i64>)> = counts
        .iter()
        .enumerate()
        .flat_map(|(p, n)| (from[p]..from[p] + n).map(move |o| (p as i32, Some(made_at(p, o)))))
        .collect();
    produce_records(bootstrap, topic, &records);
}

fn describe(bootstrap: &str, g: &str) -> Value {
    group(bootstrap, &["describe", g]).json()
}

/// Waits (at most 20 s) until `g` is in `state`; its description then.
fn wait_for_state(bootstrap: &str, g: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = describe(bootstrap, g);
        if d["state"] == state {
            return d;
        }
        assert!(Instant::now() < deadline, "group {g} not {state}: {d}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A field of every partition of a description, in partition order.
fn column(described: &Value, field: &str) -> Vec<Value> {
    described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[field].clone())
        .collect()
}

fn refused(run: &Run, name: &str) {
    assert!(!run.ok, "not refused: {}", run.stdout);
    assert!(run.stderr.contains(name), "{}", run.stderr);
    assert!(run.stderr.contains("hint:"), "{}", run.stderr);
}

#[test]
fn lag_seek_and_delete_of_a_group_librdkafka_consumes_in() {
    let dir = tempfile::tempdir().unwrap();
    // Two cores: the group's coordinator and the partitions' leaders differ.
    let server = Shoal::start(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    let b = server.bootstrap();
    topic(
        &b,
        &[
            "create",
            "clicks",
            "--partitions",
            "4",
            "-c",
            "retention.ms=-1",
        ],
    )
    .json();
    let first = [5, 3, 0, 4];
    produce_timed(&b, "clicks", &[0; 4], &first);

    // A consumer reads everything and commits; while it is in the group, seek and delete are
    // refused and describe shows it owning every partition.
    let consumer = group_consumer(&b, "readers", "clicks");
    consume(&consumer, 12, Duration::from_secs(30));
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    let active = wait_for_state(&b, "readers", "Stable");
    let member = active["members"][0]["member_id"].clone();
    assert_eq!(active["members"].as_array().unwrap().len(), 1, "{active}");
    assert_eq!(
        active["members"][0]["assignment"]["clicks"],
        json!([0, 1, 2, 3])
    );
    assert_eq!(column(&active, "member_id"), vec![member; 4], "{active}");
    assert_eq!(active["total_lag"], 0, "{active}");
    let listed = group(&b, &["list"]).json();
    assert!(
        listed
            .as_array()
            .unwrap()
            .contains(&json!({"group": "readers", "state": "Stable", "protocol_type": "consumer"})),
        "{listed}"
    );
    let seek = group(
        &b,
        &["seek", "readers", "--topic", "clicks", "--to-earliest"],
    );
    refused(&seek, "NonEmptyGroup");
    assert!(seek.stderr.contains("member"), "{}", seek.stderr);
    refused(&group(&b, &["delete", "readers"]), "NonEmptyGroup");
    drop(consumer);
    wait_for_state(&b, "readers", "Empty");

    // Produced after the last commit: exactly the lag, per partition and in total.
    let more = [2, 0, 3, 1];
    produce_timed(&b, "clicks", &first, &more);
    let lagging = describe(&b, "readers");
    assert_eq!(column(&lagging, "lag"), more.map(|n| json!(n)), "{lagging}");
    assert_eq!(column(&lagging, "lag_committed"), more.map(|n| json!(n)));
    assert_eq!(
        column(&lagging, "high_watermark"),
        [7, 3, 3, 5].map(|n| json!(n))
    );
    assert_eq!(
        column(&lagging, "last_stable_offset"),
        [7, 3, 3, 5].map(|n| json!(n))
    );
    let committed = column(&lagging, "committed");
    assert_eq!(committed[..2], [json!(5), json!(3)], "{lagging}");
    assert_eq!(committed[3], 4, "{lagging}");
    // Partition 2 had nothing to read: committed at 0, or nothing (its lag counts from log start).
    assert!(committed[2] == 0 || committed[2].is_null(), "{lagging}");
    assert_eq!(lagging["total_lag"], 6);
    assert_eq!(
        lagging["topics"],
        json!([{"topic": "clicks", "partitions": 4, "lag": 6, "lag_committed": 6}])
    );
    assert_eq!(lagging["members"], json!([]));

    // --dry-run plans and commits nothing.
    let plan = group(
        &b,
        &[
            "seek",
            "readers",
            "--topic",
            "clicks",
            "--to-earliest",
            "--dry-run",
        ],
    )
    .json();
    assert_eq!(plan["dry_run"], true);
    assert_eq!(column(&plan, "new"), vec![json!(0); 4], "{plan}");
    let plan = group(
        &b,
        &[
            "seek",
            "readers",
            "--all-topics",
            "--shift-by",
            "-2",
            "--dry-run",
        ],
    )
    .json();
    // Back by two from each commit; partition 2, never committed, from its log start.
    assert_eq!(
        column(&plan, "new"),
        [3, 1, 0, 2].map(|n| json!(n)),
        "{plan}"
    );
    // A day ago: every record is older (made in 2023), so each partition's end.
    let plan = group(
        &b,
        &[
            "seek",
            "readers",
            "--all-topics",
            "--by-duration",
            "1d",
            "--dry-run",
        ],
    )
    .json();
    assert_eq!(
        column(&plan, "new"),
        [7, 3, 3, 5].map(|n| json!(n)),
        "{plan}"
    );
    assert_eq!(describe(&b, "readers")["partitions"], lagging["partitions"]);

    // To the first record at or after 22:13:23.2: offset 4 (made at 23.0 + 1 s), none in
    // partitions 1 and 2 (their high watermark), offset 2 in partition 3 (made at 23.5).
    let expected = [4, 3, 3, 2];
    let moved = group(
        &b,
        &[
            "seek",
            "readers",
            "--topic",
            "clicks",
            "--to-datetime",
            "2023-11-14T22:13:23.200Z",
        ],
    )
    .json();
    assert_eq!(column(&moved, "new"), expected.map(|n| json!(n)), "{moved}");
    assert_eq!(
        column(&describe(&b, "readers"), "committed"),
        expected.map(|n| json!(n))
    );
    let consumer = group_consumer(&b, "readers", "clicks");
    let mut got = consume(&consumer, 6, Duration::from_secs(30));
    got.sort();
    assert_eq!(got, vec![(0, 4), (0, 5), (0, 6), (3, 2), (3, 3), (3, 4)]);
    assert!(
        consumer.poll(Duration::from_secs(1)).is_none(),
        "more than was left"
    );
    drop(consumer);
    wait_for_state(&b, "readers", "Empty");

    // Partitions named one by one, and a partition that does not exist.
    let one = group(
        &b,
        &["seek", "readers", "--topic", "clicks:1", "--to-offset", "1"],
    )
    .json();
    assert_eq!(column(&one, "partition"), vec![json!(1)]);
    assert_eq!(column(&describe(&b, "readers"), "committed")[1], 1);
    refused(
        &group(
            &b,
            &["seek", "readers", "--topic", "clicks:9", "--to-latest"],
        ),
        "UnknownTopicOrPartition",
    );

    let deleted = group(&b, &["delete", "readers"]).json();
    assert_eq!(deleted["deleted"], json!(["readers"]));
    let listed = group(&b, &["list"]).json();
    assert!(
        !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["group"] == "readers"),
        "{listed}"
    );
    refused(&group(&b, &["describe", "readers"]), "GroupIdNotFound");
}

#[test]
fn read_only_commands_through_an_edge_give_the_upstreams_answers() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let upstream = Shoal::start(
        dirs[0].path(),
        2,
        &["--group-initial-rebalance-delay-ms", "0"],
    );
    let up = upstream.bootstrap();
    topic(&up, &["create", "views", "--partitions", "3"]).json();
    produce(&up, "views", &[4, 2, 5]);
    let consumer = group_consumer(&up, "watchers", "views");
    consume(&consumer, 11, Duration::from_secs(30));
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    drop(consumer);
    wait_for_state(&up, "watchers", "Empty");
    produce(&up, "views", &[1, 2, 0]);

    let edge = start_edge(dirs[1].path(), &up);
    wait_for_topic(&edge, "views", 3);
    let eb = edge.bootstrap();

    let views = |listed: Value| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "views")
            .cloned()
            .unwrap_or_else(|| panic!("views not listed: {listed}"))
    };
    assert_eq!(
        views(topic(&eb, &["list"]).json()),
        views(topic(&up, &["list"]).json())
    );
    let offsets = |described: Value| {
        (
            column(&described, "high_watermark"),
            column(&described, "log_start"),
        )
    };
    let at_edge = offsets(topic(&eb, &["describe", "views"]).json());
    assert_eq!(at_edge, offsets(topic(&up, &["describe", "views"]).json()));
    assert_eq!(at_edge.0, [5, 4, 5].map(|n| json!(n)));

    let listed = group(&eb, &["list"]).json();
    assert_eq!(listed, group(&up, &["list"]).json());
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["group"] == "watchers"),
        "{listed}"
    );
    // The same description, but for the coordinator: the edge's core, which forwards upstream.
    let without_coordinator = |mut d: Value| {
        d.as_object_mut().unwrap().remove("coordinator");
        d
    };
    let described = without_coordinator(describe(&eb, "watchers"));
    assert_eq!(described, without_coordinator(describe(&up, "watchers")));
    assert_eq!(
        column(&described, "lag"),
        [1, 2, 0].map(|n| json!(n)),
        "{described}"
    );
    assert_eq!(described["total_lag"], 3);
}

#[test]
fn over_sasl_ssl_a_group_without_an_acl_is_refused_by_name() {
    let secure = Secured::start();
    let admin = |args: &[&str]| {
        secure.run(
            "SCRAM-SHA-512",
            "admin",
            args,
            &[("SHOAL_PASSWORD", "admin-pw")],
        )
    };
    let alice = |args: &[&str]| {
        secure.run(
            "SCRAM-SHA-256",
            "alice",
            args,
            &[("SHOAL_PASSWORD", "alice-pw")],
        )
    };
    admin(&["topic", "create", "secured", "--partitions", "2"]).json();
    // The super user makes a group by moving its offsets, lists and describes it.
    let moved = admin(&[
        "group",
        "seek",
        "auditors",
        "--topic",
        "secured",
        "--to-earliest",
    ])
    .json();
    assert_eq!(column(&moved, "new"), vec![json!(0); 2], "{moved}");
    let listed = admin(&["group", "list"]).json();
    assert!(listed.to_string().contains("\"auditors\""), "{listed}");
    let described = admin(&["group", "describe", "auditors"]).json();
    assert_eq!(
        column(&described, "committed"),
        vec![json!(0); 2],
        "{described}"
    );

    // alice has no ACL: she sees no group, and may not describe, move or delete one.
    assert_eq!(alice(&["group", "list"]).json(), json!([]));
    refused(
        &alice(&["group", "describe", "auditors"]),
        "GroupAuthorizationFailed",
    );
    refused(
        &alice(&[
            "group",
            "seek",
            "auditors",
            "--topic",
            "secured",
            "--to-latest",
        ]),
        "GroupAuthorizationFailed",
    );
    refused(
        &alice(&["group", "delete", "auditors"]),
        "GroupAuthorizationFailed",
    );
    admin(&["group", "delete", "auditors"]).json();
    secure.server.stop();
}

#[test]
fn every_group_command_has_help_with_an_example() {
    for command in ["group list", "group describe", "group seek", "group delete"] {
        assert_help_has_an_example(command);
    }
    let seek = shoal(&["group", "seek", "--help"], &[]).stdout;
    for flag in [
        "--to-datetime",
        "--by-duration",
        "--shift-by",
        "--dry-run",
        "--all-topics",
    ] {
        assert!(seek.contains(flag), "seek lacks {flag}: {seek}");
    }
    // Two targets at once are refused before any broker is asked.
    let both = shoal(
        &[
            "group",
            "seek",
            "g",
            "--topic",
            "t",
            "--to-earliest",
            "--to-latest",
        ],
        &[],
    );
    assert!(
        !both.ok && both.stderr.contains("cannot be used with"),
        "{}",
        both.stderr
    );
    // A broker that accepts and never answers: TimedOut within --timeout, not a hang.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let run = shoal(
        &["group", "describe", "g", "-b", &addr, "--timeout", "1s"],
        &[],
    );
    assert!(!run.ok && run.stderr.contains("TimedOut"), "{}", run.stderr);
    assert!(run.took < Duration::from_secs(10), "{:?}", run.took);
    drop(silent);
}
