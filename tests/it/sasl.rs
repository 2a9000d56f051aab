//! SASL on the Kafka listener, against the real binary: users added with `shoal user add` (while
//! the server runs) produce and consume with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN through
//! kafka-python and through librdkafka (confluent-kafka's wheel); a wrong password and an unknown
//! user are refused with SASL_AUTHENTICATION_FAILED; a removed user is refused; repeated failures
//! from one address are refused at once; and before authentication a client can send nothing but
//! ApiVersions and the SASL requests, in small frames, without disturbing anyone else.

use crate::common;

use common::python::run_script;
use common::wire::{connect, expect_closed, raw_frame, recv_decoded, sasl_plain, send};
use common::Shoal;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const MECHANISMS: &str = "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN";

/// `shoal user ARGS...` on `data_dir`, the password (if any) on standard input; its output.
fn user(data_dir: &Path, args: &[&str], password: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.arg("user")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("shoal user runs");
    if let Some(p) = password {
        writeln!(child.stdin.take().unwrap(), "{p}").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Runs tests/python/sasl.py; its JSON line.
fn client(which: &str, bootstrap: &str, mechanism: &str, user: &str, password: &str) -> String {
    run_script(
        "sasl.py",
        &[which, bootstrap, mechanism, user, password, "secured"],
    )
}

fn start(dir: &Path, extra: &[&str]) -> Shoal {
    let mut flags = vec!["--sasl-mechanisms", MECHANISMS, "--default-partitions", "1"];
    flags.extend_from_slice(extra);
    Shoal::start(dir, 1, &flags)
}

#[test]
fn users_authenticate_with_scram_and_plain_through_python_clients_and_librdkafka() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = start(dir.path(), &[]);
    let bootstrap = shoal.bootstrap();
    // Added while the server runs: picked up at the next authentication.
    let (ok, out) = user(
        dir.path(),
        &["add", "alice", "--password-stdin"],
        Some("wonder land"),
    );
    assert!(ok, "{out}");
    // Offline, as a broker lists them: a table, or JSON with --format json.
    let (ok, out) = user(dir.path(), &["list"], None);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(ok, "{out}");
    assert_eq!(rows[0], ["USER", "MECHANISM", "ITERATIONS"], "{out}");
    assert!(
        rows.contains(&vec!["alice", "SCRAM-SHA-512", "4096"]),
        "{out}"
    );
    let (ok, out) = user(dir.path(), &["list", "--format", "json"], None);
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert!(ok);
    assert_eq!(json[0]["user"], "alice", "{out}");
    assert_eq!(json[0]["credentials"][0]["mechanism"], "SCRAM-SHA-256");
    assert_eq!(json[0]["credentials"][1]["iterations"], 4096);
    let stored = std::fs::read_to_string(dir.path().join("users.json")).unwrap();
    assert!(!stored.contains("wonder"), "no password is stored");

    for (which, mechanism) in [
        ("kafka-python", "SCRAM-SHA-256"),
        ("kafka-python", "SCRAM-SHA-512"),
        ("kafka-python", "PLAIN"),
        ("confluent-kafka", "SCRAM-SHA-512"),
        ("confluent-kafka", "PLAIN"),
    ] {
        let out = client(which, &bootstrap, mechanism, "alice", "wonder land");
        assert!(out.contains(r#""ok": true"#), "{which} {mechanism}: {out}");
        assert!(
            !out.contains(r#""consumed": 0"#),
            "{which} {mechanism}: {out}"
        );
    }
    // Refused: librdkafka reports the broker's SASL_AUTHENTICATION_FAILED as _AUTHENTICATION (a
    // Python client only retries until it times out, so the raw exchange checks the code).
    let out = client(
        "confluent-kafka",
        &bootstrap,
        "SCRAM-SHA-256",
        "alice",
        "wrong",
    );
    assert!(out.contains(r#""error": "_AUTHENTICATION""#), "{out}");
    for (who, password) in [("alice", "wrong"), ("mallory", "wonder land")] {
        let (code, message) = plain(shoal.ports[0], who, password);
        assert_eq!(code, 58, "{who}: {message}");
        assert!(
            message.contains("Invalid username or password"),
            "{message}"
        );
    }
    // Removed: refused from then on.
    let (ok, out) = user(dir.path(), &["remove", "alice"], None);
    assert!(ok, "{out}");
    let out = client(
        "kafka-python",
        &bootstrap,
        "SCRAM-SHA-256",
        "alice",
        "wonder land",
    );
    assert!(out.contains(r#""ok": false"#), "{out}");
    assert!(shoal.metric("shoal_sasl_authentication_failures_total") >= 5);
    assert!(shoal.metric("shoal_sasl_authentications_total") >= 5);
}

/// One SASL/PLAIN exchange on a new connection: the SaslAuthenticate error code and message.
fn plain(port: u16, user: &str, password: &str) -> (i16, String) {
    sasl_plain(&mut connect(port), user, password)
}

#[test]
fn repeated_failures_from_one_address_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = user(dir.path(), &["add", "bob", "--password", "pw"], None);
    assert!(ok, "{out}");
    let shoal = start(
        dir.path(),
        &["--max-failed-authentications-per-minute", "3"],
    );
    let port = shoal.ports[0];
    assert_eq!(plain(port, "bob", "pw").0, 0, "the right password works");
    for _ in 0..3 {
        assert_eq!(plain(port, "bob", "guess").0, 58);
    }
    // The right password, from the same address, within the minute: refused, and said why.
    let (code, message) = plain(port, "bob", "pw");
    assert_eq!(code, 58);
    assert!(
        message.contains("too many failed authentications"),
        "{message}"
    );
}

#[test]
fn before_authentication_only_small_sasl_requests_are_taken() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = start(dir.path(), &["--sasl-authentication-timeout-ms", "1000"]);
    let port = shoal.ports[0];
    // ApiVersions is answered, and lists the SASL APIs.
    let mut s = connect(port);
    send(
        &mut s,
        ApiKey::ApiVersions,
        3,
        1,
        &ApiVersionsRequest::default(),
    );
    let r: ApiVersionsResponse = recv_decoded(&mut s, ApiKey::ApiVersions, 3, 1);
    assert!(r
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::SaslAuthenticate as i16));
    // Anything else before authentication closes the connection.
    send(&mut s, ApiKey::Metadata, 12, 2, &MetadataRequest::default());
    expect_closed(&mut s, "Metadata before authentication");
    // A mechanism not offered: the offered ones, then the connection closes.
    let mut s = connect(port);
    let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI"));
    send(&mut s, ApiKey::SaslHandshake, 1, 1, &hs);
    let r: SaslHandshakeResponse = recv_decoded(&mut s, ApiKey::SaslHandshake, 1, 1);
    assert_eq!(r.error_code, 33);
    assert_eq!(r.mechanisms.len(), 3);
    expect_closed(&mut s, "after UNSUPPORTED_SASL_MECHANISM");
    // A frame claiming 100 MiB before authentication: closed without reading (or allocating) it.
    let mut s = connect(port);
    s.write_all(&(100i32 << 20).to_be_bytes()).unwrap();
    expect_closed(&mut s, "an oversized frame before authentication");
    // Garbage where a SaslAuthenticate body should be: closed.
    let mut s = connect(port);
    send(
        &mut s,
        ApiKey::SaslHandshake,
        1,
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    );
    let _: SaslHandshakeResponse = recv_decoded(&mut s, ApiKey::SaslHandshake, 1, 1);
    s.write_all(&raw_frame(
        ApiKey::SaslAuthenticate as i16,
        2,
        2,
        true,
        &[0xff; 7],
    ))
    .unwrap();
    expect_closed(&mut s, "a garbage SaslAuthenticate");
    // A client that never authenticates is closed after --sasl-authentication-timeout-ms, however
    // busy it keeps the connection.
    let mut s = connect(port);
    let started = std::time::Instant::now();
    let closed = loop {
        send(
            &mut s,
            ApiKey::ApiVersions,
            3,
            1,
            &ApiVersionsRequest::default(),
        );
        if common::wire::recv(&mut s).is_none() {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "never closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        closed >= std::time::Duration::from_millis(900),
        "{closed:?}"
    );
    // The server serves everyone else meanwhile.
    let (ok, out) = user(dir.path(), &["add", "carol", "--password", "pw"], None);
    assert!(ok, "{out}");
    let out = client(
        "kafka-python",
        &shoal.bootstrap(),
        "SCRAM-SHA-256",
        "carol",
        "pw",
    );
    assert!(out.contains(r#""ok": true"#), "{out}");
}

#[test]
fn the_user_command_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    for (args, stdin, why) in [
        (
            &["add", "x", "--password", "p", "--iterations", "100"][..],
            None,
            "--iterations",
        ),
        (
            &["add", "x", "--password", "p", "--mechanisms", "MD5"][..],
            None,
            "SCRAM-SHA-256 or SCRAM-SHA-512",
        ),
        (&["add", "", "--password", "p"][..], None, "1 to 256"),
        (&["add", "x", "--password-stdin"][..], Some(""), "empty"),
        (&["remove", "nobody"][..], None, "no such user"),
    ] {
        let (ok, out) = user(dir.path(), args, stdin);
        assert!(!ok && out.contains(why), "{args:?}: {out}");
    }
}

/// `tests/python/scram_admin.py` as `user`.
fn scram_admin(bootstrap: &str, user: &str, password: &str, args: &[&str]) -> String {
    let mut all = vec![bootstrap, user, password];
    all.extend_from_slice(args);
    run_script("scram_admin.py", &all).trim().to_string()
}

#[test]
fn scram_credentials_are_managed_through_the_kafka_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = user(
        dir.path(),
        &["add", "admin", "--password", "admin-pw"],
        None,
    );
    assert!(ok, "{out}");
    // Everything is open but the cluster, which an ACL names (so only the super user may alter
    // it).
    let shoal = start(
        dir.path(),
        &[
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
            "--allow-everyone-if-no-acl-found",
            "true",
        ],
    );
    let bootstrap = shoal.bootstrap();
    let cluster_acl =
        r#"[["CLUSTER", "kafka-cluster", "LITERAL", "User:admin", "ALTER", "ALLOW"]]"#;
    let out = run_script(
        "acls.py",
        &[&bootstrap, "admin", "admin-pw", "add_acls", cluster_acl],
    );
    assert!(out.contains(r#""ok": true"#), "{out}");
    // Set by the admin (confluent-kafka salts the password; the broker never sees it), then used.
    let out = scram_admin(&bootstrap, "admin", "admin-pw", &["set", "dave", "dave-pw"]);
    assert_eq!(out, r#"{"ok": true}"#);
    let out = client(
        "kafka-python",
        &bootstrap,
        "SCRAM-SHA-256",
        "dave",
        "dave-pw",
    );
    assert!(out.contains(r#""ok": true"#), "{out}");
    let out = scram_admin(&bootstrap, "admin", "admin-pw", &["describe"]);
    assert_eq!(
        out,
        r#"{"users": {"admin": [["SCRAM_SHA_256", 4096], ["SCRAM_SHA_512", 4096]], "dave": [["SCRAM_SHA_256", 4096]]}}"#
    );
    // Dave may not manage credentials (no ALTER on the cluster), nor remove one he lacks.
    let out = scram_admin(&bootstrap, "dave", "dave-pw", &["set", "eve", "x"]);
    assert!(
        out.contains(r#""ok": false"#) && out.contains("CLUSTER_AUTHORIZATION_FAILED"),
        "{out}"
    );
    let out = scram_admin(&bootstrap, "admin", "admin-pw", &["delete", "dave"]);
    assert!(
        out.contains(r#""ok": false"#) && out.contains("RESOURCE_NOT_FOUND"),
        "{out}"
    );
    let (_, listed) = user(dir.path(), &["list"], None);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().eq(["dave", "SCRAM-SHA-256", "4096"])),
        "{listed}"
    );
}

#[test]
fn the_rdkafka_crate_authenticates_with_plain() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = user(
        dir.path(),
        &["add", "frank", "--password", "frank-pw"],
        None,
    );
    assert!(ok, "{out}");
    let shoal = start(dir.path(), &[]);
    let config = |password: &str| {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", shoal.bootstrap())
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "PLAIN")
            .set("sasl.username", "frank")
            .set("sasl.password", password)
            .set("message.timeout.ms", "10000");
        c
    };
    let p: ThreadedProducer<DefaultProducerContext> = config("frank-pw").create().unwrap();
    for i in 0..5 {
        let v = format!("v{i}");
        p.send(BaseRecord::<(), _>::to("secured").payload(&v))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    p.flush(Duration::from_secs(10))
        .expect("delivered over SASL/PLAIN");
    let c: BaseConsumer = config("frank-pw").set("group.id", "rdk").create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("secured", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let (mut got, deadline) = (0, Instant::now() + Duration::from_secs(20));
    while got < 5 && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            assert!(m.unwrap().payload().is_some());
            got += 1;
        }
    }
    assert_eq!(got, 5);
    // A wrong password: nothing is delivered.
    let p: ThreadedProducer<DefaultProducerContext> = config("nope").create().unwrap();
    p.send(BaseRecord::<(), _>::to("secured").payload("x"))
        .map_err(|(e, _)| e)
        .unwrap();
    assert!(p.flush(Duration::from_secs(3)).is_err(), "not delivered");
}

#[test]
fn random_bytes_before_authentication_close_only_their_connection() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = user(dir.path(), &["add", "gina", "--password", "pw"], None);
    assert!(ok, "{out}");
    let shoal = start(dir.path(), &["--sasl-authentication-timeout-ms", "2000"]);
    let port = shoal.ports[0];
    // A fixed seed: the same inputs every run.
    let mut x: u64 = 0x5eed_5a51;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..200 {
        let mut s = connect(port);
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // Mostly well-framed garbage (a plausible size, random bytes), some lying sizes, some
        // frames that start like a SASL request and go wrong.
        let len = (next() % 300) as usize;
        let mut body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 3 == 0 && body.len() >= 4 {
            body[..2].copy_from_slice(&(ApiKey::SaslAuthenticate as i16).to_be_bytes());
            body[2..4].copy_from_slice(&2i16.to_be_bytes());
        }
        let claimed = match round % 5 {
            0 => (next() as i32).wrapping_abs(),
            _ => body.len() as i32,
        };
        let _ = s.write_all(&claimed.to_be_bytes());
        let _ = s.write_all(&body);
        // Whatever comes back, the connection ends (closed, or timed out unauthenticated).
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    // Everyone else is still served.
    assert_eq!(plain(port, "gina", "pw").0, 0);
    let out = client(
        "kafka-python",
        &shoal.bootstrap(),
        "SCRAM-SHA-256",
        "gina",
        "pw",
    );
    assert!(out.contains(r#""ok": true"#), "{out}");
}

/// Debian 12's kcat, on librdkafka 2.0.2 (which needs SaslHandshake v0 among the advertised
/// versions, and sends its own SCRAM nonce again in its final message), produces and consumes over
/// SASL_SSL with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN; a wrong password is refused.
#[test]
fn debians_kcat_on_librdkafka_2_0_authenticates_with_scram_and_plain_over_sasl_ssl() {
    const TEST: &str =
        "sasl::debians_kcat_on_librdkafka_2_0_authenticates_with_scram_and_plain_over_sasl_ssl";
    let kcat = match common::debian::installed(&["/usr/bin/kcat", "/usr/bin/kafkacat"], "kcat") {
        Ok(path) => path,
        Err(why) => return shards::testing::skipped(TEST, "Debian's kcat", &why),
    };
    let secured = common::cli::Secured::start_with(
        &[("admin", "admin-pw"), ("carol", "carol-pw")],
        &["--max-failed-authentications-per-minute", "1000"],
    );
    let b = secured.server.bootstrap();
    let ca = secured.pki.ca_pem.to_str().unwrap().to_string();
    let run = |mechanism: &str, password: &str, args: &[&str], input: &str| {
        // Debian's librdkafka, not one a build of the tests put on the library path.
        let mut child = Command::new(&kcat)
            .env_remove("LD_LIBRARY_PATH")
            .args(["-b", &b, "-X", "security.protocol=SASL_SSL"])
            .args(["-X", &format!("ssl.ca.location={ca}")])
            .args(["-X", &format!("sasl.mechanisms={mechanism}")])
            .args(["-X", "sasl.username=carol"])
            .args(["-X", &format!("sasl.password={password}")])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kcat runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The super user makes the topic and lets carol use it.
    let admin = |args: &[&str]| {
        let tls = ["-b", &b, "--tls-ca", &ca];
        let sasl = ["--sasl-mechanism", "SCRAM-SHA-512", "--user", "admin"];
        let all = [args, &tls[..], &sasl[..]].concat();
        let done = common::cli::shoal(&all, &[("SHOAL_PASSWORD", "admin-pw")]);
        assert!(done.ok, "{args:?}: {}", done.stderr);
    };
    admin(&["topic", "create", "kcat", "--partitions", "1"]);
    admin(&[
        "acl",
        "create",
        "--allow-principal",
        "User:carol",
        "--operation",
        "all",
        "--topic",
        "kcat",
    ]);
    for (i, mechanism) in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
        .iter()
        .enumerate()
    {
        let value = format!("through kcat {i}");
        let (ok, _, err) = run(
            mechanism,
            "carol-pw",
            &["-P", "-t", "kcat"],
            &format!("{value}\n"),
        );
        assert!(ok, "{mechanism}: producing: {err}");
        let offset = i.to_string();
        let consume = [
            "-C",
            "-t",
            "kcat",
            "-p",
            "0",
            "-o",
            offset.as_str(),
            "-c",
            "1",
            "-e",
        ];
        let (ok, out, err) = run(mechanism, "carol-pw", &consume, "");
        assert!(ok, "{mechanism}: consuming: {err}");
        assert_eq!(out.trim(), value, "{mechanism}: {err}");
    }
    let (ok, _, err) = run("SCRAM-SHA-256", "wrong", &["-L", "-m", "5"], "");
    assert!(!ok && err.contains("Authentication failed"), "{err}");
    secured.server.stop();
}
