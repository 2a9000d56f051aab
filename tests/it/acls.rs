//! ACLs against the real binary, through kafka-python's admin client and clients over
//! SASL/SCRAM: a super user creates topics and ACLs; a principal with READ on a topic consumes it
//! and cannot produce to it; a prefixed ALLOW grants a family of topics and a DENY beats it; a
//! principal with no ACL sees no topics in Metadata and cannot fetch; group ACLs hold; ACLs are
//! described, deleted, and kept across a restart.

use crate::common;

use common::python::run_script;
use common::wire::{call, connect, sasl_plain};
use common::Shoal;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::path::Path;

fn start(dir: &Path) -> Shoal {
    Shoal::start(
        dir,
        2,
        &[
            "--sasl-mechanisms",
            "SCRAM-SHA-256,PLAIN",
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
            "--auto-create-topics",
            "false",
        ],
    )
}

/// `tests/python/acls.py` as `user`.
fn act(shoal: &Shoal, user: &str, args: &[&str]) -> String {
    let bootstrap = shoal.bootstrap();
    let password = format!("{user}-pw");
    let mut all = vec![bootstrap.as_str(), user, password.as_str()];
    all.extend_from_slice(args);
    run_script("acls.py", &all).trim().to_string()
}

const ALICE_ACLS: &str = r#"[
  ["TOPIC", "orders", "LITERAL", "User:alice", "READ", "ALLOW"],
  ["TOPIC", "logs.", "PREFIXED", "User:alice", "WRITE", "ALLOW"],
  ["TOPIC", "logs.secret", "LITERAL", "User:alice", "ALL", "DENY"],
  ["GROUP", "g1-", "PREFIXED", "User:alice", "READ", "ALLOW"]
]"#;

#[test]
fn acls_grant_deny_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    for u in ["admin", "alice", "bob"] {
        common::add_user(dir.path(), u, &format!("{u}-pw"));
    }
    let shoal = start(dir.path());
    let out = act(
        &shoal,
        "admin",
        &["create", "orders", "logs.app", "logs.secret"],
    );
    assert!(!out.contains(": 2") && out.contains("orders"), "{out}");
    // Only the super user may create topics and ACLs so far.
    let out = act(&shoal, "alice", &["create", "mine"]);
    assert!(
        out.contains(r#""mine": 29"#),
        "TOPIC_AUTHORIZATION_FAILED: {out}"
    );
    let out = act(&shoal, "alice", &["add_acls", ALICE_ACLS]);
    assert!(out.contains(r#""ok": false"#), "{out}");
    assert_eq!(
        act(&shoal, "admin", &["add_acls", ALICE_ACLS]),
        r#"{"ok": true, "failed": []}"#
    );
    assert_eq!(
        act(&shoal, "admin", &["produce", "orders"]),
        r#"{"ok": true}"#
    );

    // `group`: a new one each time (it commits what it consumed).
    let check = |shoal: &Shoal, group: &str| {
        // READ on orders, with a group under the prefix g1-: consumes; no WRITE on it.
        let out = act(shoal, "alice", &["consume", "orders", group]);
        assert!(
            out.contains(r#""ok": true"#) && !out.contains(r#""consumed": 0"#),
            "{out}"
        );
        let out = act(shoal, "alice", &["produce", "orders"]);
        assert!(out.contains("TopicAuthorizationFailedError"), "{out}");
        // A group without an ACL.
        let out = act(shoal, "alice", &["consume", "orders", "g2"]);
        assert!(out.contains("GroupAuthorizationFailedError"), "{out}");
        // Prefixed ALLOW, and a DENY that beats it.
        assert_eq!(
            act(shoal, "alice", &["produce", "logs.app"]),
            r#"{"ok": true}"#
        );
        let out = act(shoal, "alice", &["produce", "logs.secret"]);
        assert!(out.contains("TopicAuthorizationFailedError"), "{out}");
        // Metadata shows only what a principal may describe.
        assert_eq!(
            act(shoal, "alice", &["topics"]),
            r#"{"topics": ["logs.app", "orders"]}"#
        );
        assert_eq!(act(shoal, "bob", &["topics"]), r#"{"topics": []}"#);
        let out = act(shoal, "bob", &["consume", "orders", group]);
        assert!(out.contains(r#""ok": false"#), "{out}");
    };
    check(&shoal, "g1-before");
    let described = act(&shoal, "admin", &["describe_acls"]);
    assert_eq!(described.matches("User:alice").count(), 4, "{described}");
    assert!(
        described.contains(r#"["TOPIC", "logs.", "PREFIXED", "User:alice", "WRITE", "ALLOW"]"#),
        "{described}"
    );

    // Kept across a restart.
    drop(shoal);
    let shoal = start(dir.path());
    check(&shoal, "g1-after");

    // Deleted: alice may no longer read orders.
    let out = act(
        &shoal,
        "admin",
        &[
            "delete_acls",
            r#"[["TOPIC", "orders", "LITERAL", "User:alice", "READ", "ALLOW"]]"#,
        ],
    );
    assert_eq!(out, r#"{"deleted": 1}"#);
    // kafka-python gets no leader for a topic it may not describe, so it reads nothing.
    let out = act(&shoal, "alice", &["consume", "orders", "g1-last"]);
    assert!(
        out.contains(r#""consumed": 0"#) || out.contains("Error"),
        "{out}"
    );
    // And a Fetch sent anyway, on every core, gets TOPIC_AUTHORIZATION_FAILED.
    for &port in &shoal.ports {
        let mut s = connect(port);
        assert_eq!(sasl_plain(&mut s, "alice", "alice-pw").0, 0);
        let fetch = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(vec![
                    FetchPartition::default().with_partition_max_bytes(1 << 20)
                ])]);
        let r: FetchResponse = call(&mut s, ApiKey::Fetch, 12, 7, &fetch);
        assert_eq!(
            r.responses[0].partitions[0].error_code, 29,
            "core on port {port}"
        );
    }
    assert_eq!(
        act(&shoal, "admin", &["describe_acls"])
            .matches("User:alice")
            .count(),
        3
    );
}

#[test]
fn without_an_authorizer_acl_requests_say_security_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let b = shoal.bootstrap();
    let grant = [
        "--allow-principal",
        "User:alice",
        "--operation",
        "read",
        "--topic",
        "t",
        "-b",
        &b,
    ];
    for args in [
        [&["acl", "create"][..], &grant[..]].concat(),
        vec!["acl", "list", "-b", &b],
        [&["acl", "delete"][..], &grant[..]].concat(),
    ] {
        let run = common::cli::shoal(&args, &[]);
        assert!(!run.ok, "{args:?}: {}", run.stdout);
        assert!(
            run.stderr.contains("SecurityDisabled") && run.stderr.contains("--authorizer acl"),
            "{args:?}: {}",
            run.stderr
        );
    }
    // Nothing was stored: with an authorizer, no ACL is there.
    shoal.stop();
    let open = [
        "--authorizer",
        "acl",
        "--allow-everyone-if-no-acl-found",
        "true",
    ];
    let shoal = Shoal::start(dir.path(), 1, &open);
    let listed = common::cli::shoal(&["acl", "list", "-b", &shoal.bootstrap()], &[]);
    assert!(listed.ok, "{}", listed.stderr);
    assert!(!listed.stdout.contains("alice"), "{}", listed.stdout);
    shoal.stop();
}
