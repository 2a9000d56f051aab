//! The operator commands (`shoal topic`, `shoal cluster`) against the real binary: topics created,
//! described, altered, grown and deleted with the CLI as librdkafka sees them, with JSON output
//! parsed; describe's high watermark equal to what librdkafka produced and its size the broker's;
//! Kafka errors named; an unreachable or silent broker failing within --timeout; and SASL_SSL with
//! ACLs, where a user without a grant is refused by name; every command's --help has an example.

use crate::common;

use common::cli::{
    assert_help_has_an_example, librdkafka_partitions, produce, shoal, topic, Secured,
};
use common::Shoal;
use serde_json::Value;
use std::time::Duration;

fn config<'a>(described: &'a Value, name: &str) -> &'a Value {
    described["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no config {name}: {described}"))
}

#[test]
fn topics_made_with_the_cli_are_the_topics_librdkafka_sees() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--auto-create-topics", "false", "--metrics-per-partition"];
    let server = Shoal::start(dir.path(), 2, &flags);
    let b = server.bootstrap();

    let created = topic(
        &b,
        &[
            "create",
            "orders",
            "--partitions",
            "4",
            "-c",
            "retention.ms=3600000",
        ],
    )
    .json();
    assert_eq!(created["partitions"], 4);
    assert_eq!(librdkafka_partitions(&b, "orders"), Some(4));
    let listed = topic(&b, &["list"]).json();
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "orders")
        .unwrap_or_else(|| panic!("orders not listed: {listed}"));
    assert_eq!(entry["partitions"], 4);

    // Creating it again: refused, by name.
    let again = topic(&b, &["create", "orders", "--partitions", "4"]);
    assert!(!again.ok, "{}", again.stdout);
    assert!(
        again.stderr.contains("TopicAlreadyExists"),
        "{}",
        again.stderr
    );
    assert!(again.stderr.contains("hint:"), "{}", again.stderr);

    // The high watermark and log start of each partition, as produced.
    let counts = [5, 0, 3, 7];
    produce(&b, "orders", &counts);
    let described = topic(&b, &["describe", "orders"]).json();
    let parts = described["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 4, "{described}");
    for (p, n) in counts.iter().enumerate() {
        assert_eq!(parts[p]["partition"], p, "{described}");
        assert_eq!(
            parts[p]["high_watermark"], *n as i64,
            "partition {p}: {described}"
        );
        assert_eq!(parts[p]["log_start"], 0, "partition {p}: {described}");
        // Its size on disk (DescribeLogDirs to the leader) is the broker's own figure.
        let size = parts[p]["size_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{described}"));
        assert_eq!(
            size,
            server.metric_with(
                "shoal_log_size_bytes",
                &format!("topic=\"orders\",partition=\"{p}\"")
            ),
            "partition {p}: {described}"
        );
        assert_eq!(size > 0, *n > 0, "partition {p}: {described}");
        // Two cores: every partition has a leader among them, which is its only replica.
        let leader = parts[p]["leader"].as_i64().unwrap();
        assert!((0..2).contains(&leader), "{described}");
        assert_eq!(
            parts[p]["replicas"],
            serde_json::json!([leader]),
            "{described}"
        );
    }
    let retention = config(&described, "retention.ms");
    assert_eq!(retention["value"], "3600000");
    assert_eq!(retention["source"], "DYNAMIC_TOPIC_CONFIG");

    // Set one config and remove another: the rest stay.
    topic(
        &b,
        &[
            "alter-config",
            "orders",
            "-c",
            "segment.bytes=1048576",
            "--delete-config",
            "retention.ms",
        ],
    )
    .json();
    let described = topic(&b, &["describe", "orders"]).json();
    let segment = config(&described, "segment.bytes");
    assert_eq!(segment["value"], "1048576");
    assert_eq!(segment["source"], "DYNAMIC_TOPIC_CONFIG");
    assert_ne!(
        config(&described, "retention.ms")["source"],
        "DYNAMIC_TOPIC_CONFIG"
    );

    topic(&b, &["add-partitions", "orders", "--partitions", "6"]).json();
    assert_eq!(librdkafka_partitions(&b, "orders"), Some(6));
    let described = topic(&b, &["describe", "orders"]).json();
    assert_eq!(described["partitions"].as_array().unwrap().len(), 6);
    let shrink = topic(&b, &["add-partitions", "orders", "--partitions", "2"]);
    assert!(
        !shrink.ok && shrink.stderr.contains("InvalidPartitions"),
        "{}",
        shrink.stderr
    );

    let info = shoal(&["cluster", "info", "-b", &b, "--format", "json"], &[]).json();
    assert_eq!(info["brokers"].as_array().unwrap().len(), 2, "{info}");
    assert!(info["brokers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["address"] == b.as_str()));
    assert!(info["api_versions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["name"] == "CreateTopics"));
    let controller = info["controller"].as_i64().unwrap();
    assert!((0..2).contains(&controller), "{info}");
    let table = shoal(&["cluster", "info", "-b", &b], &[]);
    assert!(
        table.ok && table.stdout.contains("CLUSTER-ID"),
        "{}",
        table.stdout
    );

    topic(&b, &["delete", "orders"]).json();
    assert_eq!(librdkafka_partitions(&b, "orders"), None);
    let gone = topic(&b, &["describe", "orders"]);
    assert!(
        !gone.ok && gone.stderr.contains("UnknownTopicOrPartition"),
        "{}",
        gone.stderr
    );
    server.stop();
}

#[test]
fn an_unreachable_or_silent_broker_fails_within_the_timeout() {
    // A closed port: refused at once, naming the address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    for command in [
        "topic list",
        "consume t",
        "produce t",
        "acl list",
        "user list",
    ] {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.extend_from_slice(&["-b", &addr, "--timeout", "2s"]);
        let run = common::cli::shoal_input(&args, &[], b"x\n");
        assert!(!run.ok, "{command}");
        assert!(
            run.took < Duration::from_secs(10),
            "{command}: {:?}",
            run.took
        );
        assert!(
            run.stderr.contains("BrokerUnreachable") && run.stderr.contains(&addr),
            "{command}: {}",
            run.stderr
        );
    }
    // A port that accepts but never answers: given up on after --timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let run = shoal(&["cluster", "info", "-b", &addr, "--timeout", "1s"], &[]);
    assert!(!run.ok);
    assert!(
        run.took >= Duration::from_secs(1) && run.took < Duration::from_secs(10),
        "{:?}",
        run.took
    );
    assert!(run.stderr.contains("TimedOut"), "{}", run.stderr);
    drop(silent);
}

#[test]
fn over_sasl_ssl_a_user_authenticates_and_acls_refuse_by_name() {
    let secure = Secured::start();
    let b = secure.server.bootstrap();
    let data = &secure.data;
    let secured = |mechanism: &str, user: &str, args: &[&str], env: &[(&str, &str)]| {
        secure.run(mechanism, user, &[&["topic"], args].concat(), env)
    };
    // The super user creates a topic (password from the environment).
    let admin_env = [("SHOAL_PASSWORD", "admin-pw")];
    secured(
        "SCRAM-SHA-256",
        "admin",
        &["create", "secured", "--partitions", "2"],
        &admin_env,
    )
    .json();
    let listed = secured("SCRAM-SHA-512", "admin", &["list"], &admin_env).json();
    assert!(listed.to_string().contains("\"secured\""), "{listed}");

    // alice (password from a file) authenticates; with no ACL she sees no topics and may not
    // create one.
    let file = data.path().join("alice.pw");
    std::fs::write(&file, "alice-pw\n").unwrap();
    let file = file.to_str().unwrap();
    let listed = secured("PLAIN", "alice", &["list", "--password-file", file], &[]).json();
    assert_eq!(listed, serde_json::json!([]));
    let denied = secured(
        "SCRAM-SHA-256",
        "alice",
        &[
            "create",
            "mine",
            "--partitions",
            "1",
            "--password-file",
            file,
        ],
        &[],
    );
    assert!(!denied.ok, "{}", denied.stdout);
    assert!(
        denied.stderr.contains("TopicAuthorizationFailed")
            || denied.stderr.contains("ClusterAuthorizationFailed"),
        "{}",
        denied.stderr
    );
    // A wrong password, and no password at all.
    let wrong = secured(
        "SCRAM-SHA-256",
        "alice",
        &["list"],
        &[("SHOAL_PASSWORD", "nope")],
    );
    assert!(
        !wrong.ok && wrong.stderr.contains("SaslAuthenticationFailed"),
        "{}",
        wrong.stderr
    );
    let none = secured("SCRAM-SHA-256", "alice", &["list"], &[]);
    assert!(
        !none.ok && none.stderr.contains("SHOAL_PASSWORD"),
        "{}",
        none.stderr
    );
    // Without TLS the listener is not spoken to.
    let plain = shoal(&["topic", "list", "-b", &b, "--timeout", "2s"], &[]);
    assert!(
        !plain.ok && plain.took < Duration::from_secs(10),
        "{}",
        plain.stderr
    );
    secure.server.stop();
}

#[test]
fn every_command_has_help_with_an_example() {
    for command in [
        "topic create",
        "topic list",
        "topic describe",
        "topic alter-config",
        "topic add-partitions",
        "topic delete",
        "cluster info",
        "acl create",
        "acl list",
        "acl delete",
        "user create",
        "user delete",
        "user list",
        "produce",
        "consume",
    ] {
        assert_help_has_an_example(command);
    }
}
