//! `shoal user` and `shoal acl` against `shoal serve` over SASL_SSL with the ACL authorizer, as
//! the super user: users created with the CLI authenticate a librdkafka client (SCRAM-SHA-256 and
//! -512), are listed, and once deleted are refused; ACLs created with the CLI let a librdkafka
//! client read or deny it by name, and list and delete round-trip (JSON parsed throughout). Their
//! --help is checked with the other operator commands' in tests/it/tools.rs.

use crate::common;

use common::cli::{librdkafka_read, shoal_input, Run};
use serde_json::{json, Value};

const ADMIN_PASSWORD: &str = "admin-pw";

/// A SASL_SSL broker with ACLs, `admin` its super user and its only user.
struct Secured {
    inner: common::cli::Secured,
    bootstrap: String,
}

impl Secured {
    fn start() -> Secured {
        // librdkafka retries a refused authentication: the test's own refusals must not lock the
        // super user out.
        let inner = common::cli::Secured::start_with(
            &[("admin", ADMIN_PASSWORD)],
            &["--max-failed-authentications-per-minute", "1000"],
        );
        Secured {
            bootstrap: inner.server.bootstrap(),
            inner,
        }
    }

    fn ca(&self) -> &str {
        self.inner.pki.ca_pem.to_str().unwrap()
    }

    /// `shoal ARGS... --format json` as `user` (SCRAM-SHA-512), `input` on its standard input.
    fn run_as(
        &self,
        user: &str,
        password: &str,
        args: &[&str],
        env: &[(&str, &str)],
        input: &[u8],
    ) -> Run {
        let mut all = args.to_vec();
        all.extend_from_slice(&[
            "-b",
            &self.bootstrap,
            "--tls-ca",
            self.ca(),
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--user",
            user,
            "--format",
            "json",
        ]);
        let mut env = env.to_vec();
        env.push(("SHOAL_PASSWORD", password));
        shoal_input(&all, &env, input)
    }

    /// `shoal ARGS...` as the super user; its JSON answer.
    fn admin(&self, args: &[&str]) -> Value {
        self.run_as("admin", ADMIN_PASSWORD, args, &[], b"").json()
    }

    /// What librdkafka reads of `topic` (COUNT records) as `user` with `mechanism`.
    fn read_as(
        &self,
        mechanism: &str,
        user: &str,
        password: &str,
        topic: &str,
        count: usize,
    ) -> Value {
        let config = json!({
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": self.ca(),
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        });
        librdkafka_read(&self.bootstrap, topic, count, &config)
    }

    /// Lets `principal` use the group `librdkafka_read.py` names (librdkafka looks for its
    /// coordinator even when partitions are assigned).
    fn allow_reader_group(&self, principal: &str) {
        let args = [
            "acl",
            "create",
            "--allow-principal",
            principal,
            "--operation",
            "read",
        ];
        let mut all = args.to_vec();
        all.extend_from_slice(&["--group", "librdkafka-read"]);
        self.admin(&all);
    }

    /// A topic with `n` records, created and produced by the super user.
    fn topic_with_records(&self, name: &str, n: usize) {
        self.admin(&["topic", "create", name, "--partitions", "1"]);
        let input: String = (0..n).map(|i| format!("record {i}\n")).collect();
        let sent = self
            .run_as(
                "admin",
                ADMIN_PASSWORD,
                &["produce", name],
                &[],
                input.as_bytes(),
            )
            .json();
        assert_eq!(sent["records"], n, "{sent}");
    }
}

#[test]
fn users_created_with_the_cli_authenticate_librdkafka_until_deleted() {
    let s = Secured::start();
    s.topic_with_records("secured", 5);
    s.admin(&[
        "acl",
        "create",
        "--allow-principal",
        "User:carol",
        "--operation",
        "read",
        "--operation",
        "describe",
        "--topic",
        "secured",
    ]);
    s.allow_reader_group("User:carol");
    // Password from the environment, both mechanisms; and from a file, one.
    let created = s
        .run_as(
            "admin",
            ADMIN_PASSWORD,
            &[
                "user",
                "create",
                "carol",
                "--mechanism",
                "SCRAM-SHA-256",
                "--mechanism",
                "SCRAM-SHA-512",
            ],
            &[("SHOAL_NEW_PASSWORD", "carol-pw")],
            b"",
        )
        .json();
    assert_eq!(
        created["mechanisms"],
        json!(["SCRAM-SHA-256", "SCRAM-SHA-512"])
    );
    let file = s.inner.pki.dir.path().join("dave.pw");
    std::fs::write(&file, "dave-pw\n").unwrap();
    s.admin(&[
        "user",
        "create",
        "dave",
        "--iterations",
        "8192",
        "--new-password-file",
        file.to_str().unwrap(),
    ]);

    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let read = s.read_as(mechanism, "carol", "carol-pw", "secured", 5);
        assert_eq!(read["ok"], true, "{mechanism}: {read}");
        assert_eq!(read["records"].as_array().unwrap().len(), 5, "{read}");
        assert_eq!(read["records"][4]["value"], "record 4");
    }
    let wrong = s.read_as("SCRAM-SHA-256", "carol", "not-it", "secured", 1);
    assert_eq!(wrong["error"], "_AUTHENTICATION", "{wrong}");

    let listed = s.admin(&["user", "list"]);
    let entry = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["user"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed: {listed}"))
    };
    assert_eq!(
        entry("carol")["credentials"],
        json!([{"mechanism": "SCRAM-SHA-256", "iterations": 4096}, {"mechanism": "SCRAM-SHA-512", "iterations": 4096}])
    );
    assert_eq!(
        entry("dave")["credentials"],
        json!([{"mechanism": "SCRAM-SHA-256", "iterations": 8192}])
    );

    // Not a super user: refused by name.
    let refused = s.run_as(
        "carol",
        "carol-pw",
        &["user", "create", "eve"],
        &[("SHOAL_NEW_PASSWORD", "eve-pw")],
        b"",
    );
    assert!(
        !refused.ok && refused.stderr.contains("ClusterAuthorizationFailed"),
        "{}",
        refused.stderr
    );
    // No new password anywhere: refused before asking the broker.
    let none = s.run_as(
        "admin",
        ADMIN_PASSWORD,
        &["user", "create", "eve"],
        &[],
        b"",
    );
    assert!(
        !none.ok && none.stderr.contains("SHOAL_NEW_PASSWORD"),
        "{}",
        none.stderr
    );

    let deleted = s.admin(&["user", "delete", "carol"]);
    assert_eq!(
        deleted["deleted"],
        json!(["SCRAM-SHA-256", "SCRAM-SHA-512"])
    );
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let read = s.read_as(mechanism, "carol", "carol-pw", "secured", 1);
        assert_eq!(read["error"], "_AUTHENTICATION", "{mechanism}: {read}");
    }
    let listed = s.admin(&["user", "list"]);
    assert!(!listed.to_string().contains("carol"), "{listed}");
    let again = s.run_as(
        "admin",
        ADMIN_PASSWORD,
        &["user", "delete", "carol"],
        &[],
        b"",
    );
    assert!(
        !again.ok && again.stderr.contains("ResourceNotFound"),
        "{}",
        again.stderr
    );
    s.inner.server.stop();
}

#[test]
fn acls_created_with_the_cli_allow_and_deny_librdkafka_and_round_trip() {
    let s = Secured::start();
    s.topic_with_records("orders", 3);
    for u in ["alice", "bob"] {
        let password = format!("{u}-pw");
        let env = [("SHOAL_NEW_PASSWORD", password.as_str())];
        let args = ["user", "create", u, "--mechanism", "SCRAM-SHA-512"];
        s.run_as("admin", ADMIN_PASSWORD, &args, &env, b"").json();
    }
    let created = s.admin(&[
        "acl",
        "create",
        "--allow-principal",
        "User:alice",
        "--operation",
        "read",
        "--operation",
        "describe",
        "--topic",
        "orders",
    ]);
    assert_eq!(created.as_array().unwrap().len(), 2, "{created}");
    s.allow_reader_group("User:alice");
    let alice = |count| s.read_as("SCRAM-SHA-512", "alice", "alice-pw", "orders", count);
    assert_eq!(alice(3)["records"].as_array().map(Vec::len), Some(3));
    // bob has no ACL: no allow, so no topic.
    let bob = s.read_as("SCRAM-SHA-512", "bob", "bob-pw", "orders", 1);
    assert_eq!(bob["error"], "TOPIC_AUTHORIZATION_FAILED", "{bob}");

    // A DENY beats the ALLOW.
    s.admin(&[
        "acl",
        "create",
        "--deny-principal",
        "User:alice",
        "--operation",
        "read",
        "--topic",
        "orders",
    ]);
    let denied = alice(1);
    assert_eq!(denied["error"], "TOPIC_AUTHORIZATION_FAILED", "{denied}");

    let binding = |permission: &str, operation: &str| {
        json!({"principal": "User:alice", "permission": permission, "operation": operation,
               "resource_type": "TOPIC", "name": "orders", "pattern_type": "LITERAL", "host": "*"})
    };
    let mut listed = s.admin(&["acl", "list", "--topic", "orders"]);
    let all = json!([
        binding("ALLOW", "DESCRIBE"),
        binding("ALLOW", "READ"),
        binding("DENY", "READ")
    ]);
    sort(&mut listed);
    assert_eq!(listed, sorted(all.clone()));
    let mut everything = s.admin(&["acl", "list"]);
    sort(&mut everything);
    let group = json!({"principal": "User:alice", "permission": "ALLOW", "operation": "READ",
        "resource_type": "GROUP", "name": "librdkafka-read", "pattern_type": "LITERAL", "host": "*"});
    let mut all = all;
    all.as_array_mut().unwrap().push(group);
    assert_eq!(everything, sorted(all));
    let denies = s.admin(&["acl", "list", "--deny-principal", "User:alice"]);
    assert_eq!(denies, json!([binding("DENY", "READ")]));
    let denies = s.admin(&[
        "acl",
        "list",
        "--deny-principal",
        "User:alice",
        "--topic",
        "orders",
    ]);
    assert_eq!(denies, json!([binding("DENY", "READ")]));
    let matching = s.admin(&[
        "acl",
        "list",
        "--topic",
        "orders",
        "--resource-pattern-type",
        "match",
        "--operation",
        "describe",
    ]);
    assert_eq!(matching, json!([binding("ALLOW", "DESCRIBE")]));

    let deleted = s.admin(&[
        "acl",
        "delete",
        "--deny-principal",
        "User:alice",
        "--topic",
        "orders",
    ]);
    assert_eq!(deleted, json!([binding("DENY", "READ")]));
    let mut listed = s.admin(&["acl", "list", "--topic", "orders"]);
    sort(&mut listed);
    assert_eq!(
        listed,
        sorted(json!([
            binding("ALLOW", "DESCRIBE"),
            binding("ALLOW", "READ")
        ]))
    );
    assert_eq!(alice(3)["records"].as_array().map(Vec::len), Some(3));

    // Refusals by name: a delete with no resource, alice managing ACLs.
    let no_resource = s.run_as(
        "admin",
        ADMIN_PASSWORD,
        &["acl", "delete", "--allow-principal", "User:alice"],
        &[],
        b"",
    );
    assert!(
        !no_resource.ok && no_resource.stderr.contains("InvalidArguments"),
        "{}",
        no_resource.stderr
    );
    let by_alice = s.run_as(
        "alice",
        "alice-pw",
        &[
            "acl",
            "create",
            "--allow-principal",
            "User:alice",
            "--operation",
            "all",
            "--cluster",
        ],
        &[],
        b"",
    );
    assert!(
        !by_alice.ok && by_alice.stderr.contains("ClusterAuthorizationFailed"),
        "{}",
        by_alice.stderr
    );
    s.inner.server.stop();
}

fn sort(v: &mut Value) {
    v.as_array_mut().unwrap().sort_by_key(|b| b.to_string());
}

fn sorted(mut v: Value) -> Value {
    sort(&mut v);
    v
}
