//! TLS on the Kafka listener, against the real binary, with certificates made here (a CA, the
//! server's, clients'): kafka-python and librdkafka (confluent-kafka's wheel) produce and consume
//! over TLS, over mTLS (where the certificate's subject is the principal ACLs name) and with SASL
//! on top; a plaintext client, a client that does not trust the server, and client certificates
//! that are untrusted, expired or missing are refused, and the server goes on serving.

use crate::common;

use common::pki::{pki, Ca, Pki};
use common::python::run_script;
use common::wire::{connect, send};
use common::Shoal;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use rcgen::DnType;
use std::path::{Path, PathBuf};

fn start(pki: &Pki, data: &Path, extra: &[&str]) -> Shoal {
    let (cert, key) = (
        pki.server.0.to_str().unwrap(),
        pki.server.1.to_str().unwrap(),
    );
    let mut flags = vec![
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--default-partitions",
        "1",
    ];
    flags.extend_from_slice(extra);
    Shoal::start(data, 1, &flags)
}

fn client(which: &str, shoal: &Shoal, topic: &str, options: serde_json::Value) -> String {
    run_script(
        "tls.py",
        &[which, &shoal.bootstrap(), topic, &options.to_string()],
    )
}

/// Whether `tls.py` succeeded: its 10 records acknowledged and read back, exactly.
fn ok(out: &str) -> bool {
    let line = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return false;
    };
    v["ok"] == true && v["consumed"] == 10 && v["same"] == true
}

/// The broker's count of failed TLS handshakes.
fn handshake_failures(shoal: &Shoal) -> u64 {
    shoal.metric("shoal_tls_handshake_failures_total")
}

#[test]
fn a_tls_listener_serves_python_clients_and_librdkafka_and_refuses_plaintext() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let shoal = start(&pki, data.path(), &[]);
    let ca = pki.ca_pem.to_str().unwrap();
    for which in ["kafka-python", "confluent-kafka"] {
        let out = client(which, &shoal, "secured", serde_json::json!({ "ca": ca }));
        assert!(ok(&out), "{which}: {out}");
    }
    // A client that does not trust the server's CA.
    let other = Ca::new("another CA").write(pki.dir.path(), "other");
    let failures = handshake_failures(&shoal);
    let out = client(
        "confluent-kafka",
        &shoal,
        "secured",
        serde_json::json!({ "ca": other.to_str().unwrap() }),
    );
    assert!(out.contains(r#""ok": false"#), "{out}");
    let failures_after_client = handshake_failures(&shoal);
    assert!(
        failures_after_client > failures,
        "the untrusting client's handshakes counted: {failures} then {failures_after_client}"
    );
    // A plaintext Kafka client: its bytes are not a TLS handshake; closed.
    let mut s = connect(shoal.ports[0]);
    send(
        &mut s,
        ApiKey::ApiVersions,
        3,
        1,
        &ApiVersionsRequest::default(),
    );
    // It gets a TLS alert at most (never a Kafka response), and the broker closes the connection
    // within 10 s (an end of stream or a reset, not the read timing out).
    let mut answer = Vec::new();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    match std::io::Read::read_to_end(&mut s, &mut answer) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the plaintext connection was not closed within 10 s: {e}"),
    }
    assert!(
        answer.len() <= 7 && answer.first().is_none_or(|&b| b == 21),
        "a TLS alert at most: {answer:?}"
    );
    // That one connection is one more failed handshake.
    assert_eq!(handshake_failures(&shoal), failures_after_client + 1);
    // Who encrypted: the kernel where it offers kernel TLS (`--tls-kernel auto`, the default),
    // rustls where it does not (the machines CI runs on).
    let kernel = shoal.metric("shoal_tls_kernel_connections_total");
    let user = shoal.metric("shoal_tls_user_space_connections_total");
    if shoal::wire::ktls::available() {
        assert!(
            kernel > 0 && user == 0,
            "kernel {kernel}, user space {user}"
        );
    } else {
        shards::testing::skipped(
            "a_tls_listener_serves_python_clients_and_librdkafka_and_refuses_plaintext",
            "kernel TLS",
            "this kernel offers no `tls` ULP (/proc/sys/net/ipv4/tcp_available_ulp); checked \
             that rustls encrypted instead",
        );
        assert!(
            kernel == 0 && user > 0,
            "kernel {kernel}, user space {user}"
        );
    }
    // Still serving.
    let out = client(
        "kafka-python",
        &shoal,
        "secured",
        serde_json::json!({ "ca": ca }),
    );
    assert!(ok(&out), "{out}");
}

#[test]
fn mtls_refuses_bad_certificates_and_names_the_principal_acls_use() {
    let pki = pki();
    let dir = pki.dir.path();
    let data = tempfile::tempdir().unwrap();
    let ca = pki.ca_pem.to_str().unwrap();
    let shoal = start(
        &pki,
        data.path(),
        &[
            "--tls-client-ca",
            ca,
            "--authorizer",
            "acl",
            "--allow-everyone-if-no-acl-found",
            "true",
        ],
    );
    let alice = pki.ca.sign(
        dir,
        "alice",
        &[
            (DnType::OrganizationName, "acme"),
            (DnType::CommonName, "alice"),
        ],
        false,
        false,
    );
    let bob = pki
        .ca
        .sign(dir, "bob", &[(DnType::CommonName, "bob")], false, false);
    let expired = pki
        .ca
        .sign(dir, "old", &[(DnType::CommonName, "alice")], false, true);
    let stranger = Ca::new("stranger").sign(
        dir,
        "mallory",
        &[(DnType::CommonName, "alice")],
        false,
        false,
    );
    let with = |(c, k): &(PathBuf, PathBuf)| serde_json::json!({ "ca": ca, "cert": c.to_str().unwrap(), "key": k.to_str().unwrap() });
    // Only alice's principal may use the topic "private" (a topic with an ACL is closed to
    // everyone else); "public" has none, so it is open.
    let out = run_script(
        "tls_acl.py",
        &[
            &shoal.bootstrap(),
            &with(&alice).to_string(),
            "User:O=acme,CN=alice",
            "private",
        ],
    );
    assert!(out.contains(r#""ok": true"#), "{out}");
    for which in ["kafka-python", "confluent-kafka"] {
        let out = client(which, &shoal, "private", with(&alice));
        assert!(ok(&out), "{which} alice: {out}");
        let out = client(which, &shoal, "public", with(&bob));
        assert!(ok(&out), "{which} bob on public: {out}");
        let out = client(which, &shoal, "private", with(&bob));
        assert!(out.contains(r#""ok": false"#), "{which} bob: {out}");
    }
    // Each refused client's handshakes are counted (one client may try more than once).
    for (what, options) in [
        ("expired", with(&expired)),
        ("untrusted", with(&stranger)),
        ("no client certificate", serde_json::json!({ "ca": ca })),
    ] {
        let failures = handshake_failures(&shoal);
        let out = client("confluent-kafka", &shoal, "public", options);
        assert!(out.contains(r#""ok": false"#), "{what}: {out}");
        let after = handshake_failures(&shoal);
        assert!(
            after > failures,
            "{what}: failed handshakes {failures} then {after}"
        );
    }
}

#[test]
fn sasl_scram_over_tls() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let added = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["user", "add", "carol", "--password", "pw", "--data-dir"])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(added.status.success());
    // Encrypted in user space wherever it runs.
    let shoal = start(
        &pki,
        data.path(),
        &["--sasl-mechanisms", "SCRAM-SHA-512", "--tls-kernel", "off"],
    );
    let ca = pki.ca_pem.to_str().unwrap();
    for which in ["kafka-python", "confluent-kafka"] {
        let good = serde_json::json!({ "ca": ca, "sasl": ["SCRAM-SHA-512", "carol", "pw"] });
        assert!(ok(&client(which, &shoal, "secured", good)), "{which}");
    }
    assert_eq!(shoal.metric("shoal_tls_kernel_connections_total"), 0);
    assert!(shoal.metric("shoal_tls_user_space_connections_total") > 0);
    let bad = serde_json::json!({ "ca": ca, "sasl": ["SCRAM-SHA-512", "carol", "nope"] });
    let out = client("confluent-kafka", &shoal, "secured", bad);
    assert!(out.contains(r#""ok": false"#), "{out}");
}

#[test]
fn listeners_with_different_security_side_by_side() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let added = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["user", "add", "erin", "--password", "pw", "--data-dir"])
        .arg(data.path())
        .output()
        .unwrap();
    assert!(added.status.success());
    let (cert, key) = (
        pki.server.0.to_str().unwrap(),
        pki.server.1.to_str().unwrap(),
    );
    let shoal = Shoal::start(
        data.path(),
        2,
        &[
            "--listener",
            "PLAINTEXT://127.0.0.1:0",
            "--listener",
            "SSL://127.0.0.1:0",
            "--listener",
            "SASL_PLAINTEXT://127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--sasl-mechanisms",
            "SCRAM-SHA-256",
            "--default-partitions",
            "2",
        ],
    );
    let names: Vec<&str> = shoal.listeners.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["PLAINTEXT", "SSL", "SASL_PLAINTEXT"]);
    let bootstrap = |k: usize| format!("127.0.0.1:{}", shoal.listeners[k].1[0]);
    // Each client is told its own listener's ports: a TLS client told a plaintext port, or a
    // plaintext one told a SASL port, would fail.
    let mut s = common::wire::connect(shoal.listeners[0].1[1]);
    let r: kafka_protocol::messages::MetadataResponse = common::wire::call(
        &mut s,
        ApiKey::Metadata,
        12,
        1,
        &kafka_protocol::messages::MetadataRequest::default(),
    );
    let mut told: Vec<i32> = r.brokers.iter().map(|b| b.port).collect();
    told.sort();
    let mut plain: Vec<i32> = shoal.listeners[0].1.iter().map(|&p| i32::from(p)).collect();
    plain.sort();
    assert_eq!(told, plain);
    let ca = pki.ca_pem.to_str().unwrap();
    let out = run_script(
        "tls.py",
        &[
            "confluent-kafka",
            &bootstrap(1),
            "both",
            &serde_json::json!({ "ca": ca }).to_string(),
        ],
    );
    assert!(ok(&out), "SSL listener: {out}");
    let out = run_script(
        "sasl.py",
        &[
            "kafka-python",
            &bootstrap(2),
            "SCRAM-SHA-256",
            "erin",
            "pw",
            "secured",
        ],
    );
    assert!(
        out.contains(r#""ok": true"#),
        "SASL_PLAINTEXT listener: {out}"
    );
    // The plaintext listener takes no TLS handshake and asks for no SASL.
    let mut s = common::wire::connect(shoal.listeners[0].1[0]);
    let r: kafka_protocol::messages::MetadataResponse = common::wire::call(
        &mut s,
        ApiKey::Metadata,
        12,
        2,
        &kafka_protocol::messages::MetadataRequest::default().with_topics(None),
    );
    assert!(r
        .topics
        .iter()
        .any(|t| t.name.as_ref().is_some_and(|n| n.as_str() == "both")));
}

#[test]
fn the_admin_endpoint_serves_https() {
    let pki = pki();
    let data = tempfile::tempdir().unwrap();
    let shoal = start(&pki, data.path(), &["--admin-tls"]);
    let ca = pki.ca_pem.to_str().unwrap();
    let get = |url: &str| {
        let script = "import ssl, sys, urllib.request\n\
             ctx = ssl.create_default_context(cafile=sys.argv[2])\n\
             try:\n    print(urllib.request.urlopen(sys.argv[1], context=ctx, timeout=10).read().decode()[:200])\n\
             except Exception as e:\n    print('failed:', type(e).__name__)";
        let out = std::process::Command::new("python3")
            .args(["-c", script, url, ca])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let https = get(&format!("https://{}/v1/status", shoal.admin));
    assert!(https.contains("\"cores\""), "{https}");
    let plain = get(&format!("http://{}/v1/status", shoal.admin));
    assert!(plain.contains("failed"), "{plain}");
}
