//! kafkajs, a pure JavaScript client with its own protocol code (older API versions than
//! librdkafka's: Produce v3-7, Fetch v4-11, InitProducerId v0-1, AddPartitionsToTxn and EndTxn
//! v0-1), against a two-core shoal: a plain round trip, then its transactional producer (commit,
//! abort, read_committed and read_uncommitted consumers) and zombie fencing. The scripts are in
//! `tests/js/`; node, npm and kafkajs come from `common::node` (a SKIPPED line where they cannot).

use crate::common;

use common::node::run_script;
use common::Shoal;
use serde_json::Value;

/// A two-core shoal with `topic` (two partitions: one per core) created.
fn start(dir: &std::path::Path, topic: &str) -> Shoal {
    let shoal = Shoal::start(dir, 2, &[]);
    common::create_topics(&shoal.bootstrap(), &[(topic, 2)]);
    shoal
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The yardstick: kafkajs's plain producer and a consumer group read back exactly what was sent.
#[test]
fn kafkajs_produces_and_consumes() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = start(dir.path(), "js-plain");
    let Some(r) = run_script(
        "kafkajs_produces_and_consumes",
        "kafkajs.js",
        &["roundtrip", &shoal.bootstrap(), "js-plain"],
    ) else {
        return;
    };
    eprintln!("kafkajs saw: {r}");
    assert_eq!(sorted(strings(&r["received"])), sorted(strings(&r["sent"])));
    shoal.stop();
}

/// kafkajs's transactional producer: a transaction committed, one aborted, one committed, each
/// over both partitions (both cores). A read_committed consumer (kafkajs's default) sees exactly
/// the committed records; a read_uncommitted one sees every record.
#[test]
fn kafkajs_transactions_commit_and_abort() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = start(dir.path(), "js-txn");
    let Some(r) = run_script(
        "kafkajs_transactions_commit_and_abort",
        "kafkajs.js",
        &["transactions", &shoal.bootstrap(), "js-txn"],
    ) else {
        return;
    };
    eprintln!("kafkajs saw: {r}");
    let committed = strings(&r["committed"]);
    let aborted = strings(&r["aborted"]);
    assert_eq!(
        sorted(strings(&r["readCommitted"])),
        sorted(committed.clone()),
        "read_committed sees the committed records, each once, and no aborted one"
    );
    let all: Vec<String> = committed.into_iter().chain(aborted).collect();
    assert_eq!(
        sorted(strings(&r["readUncommitted"])),
        sorted(all),
        "read_uncommitted sees every record"
    );
    assert_eq!(shoal.metric("shoal_transactions_committed_total"), 2);
    assert_eq!(shoal.metric("shoal_transactions_aborted_total"), 1);
    assert_eq!(shoal.metric("shoal_transactions_open"), 0);
    shoal.stop();
}

/// Two kafkajs producers with one transactional id: the newer's initialisation fences the older,
/// whose commit fails with Kafka's fencing error (INVALID_PRODUCER_EPOCH at the EndTxn v0-1
/// kafkajs sends: PRODUCER_FENCED is for v2+); the newer commits, and only its records are
/// committed.
#[test]
fn kafkajs_zombie_producer_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = start(dir.path(), "js-fenced");
    let Some(r) = run_script(
        "kafkajs_zombie_producer_is_fenced",
        "kafkajs.js",
        &["fencing", &shoal.bootstrap(), "js-fenced"],
    ) else {
        return;
    };
    eprintln!("kafkajs saw: {r}");
    let older = &r["olderCommit"];
    assert_eq!(
        older["ok"], false,
        "the fenced producer's commit fails: {r}"
    );
    let kind = older["type"].as_str().unwrap_or_default();
    assert!(
        ["INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"].contains(&kind),
        "a fencing error, not {older}"
    );
    assert_eq!(
        sorted(strings(&r["readCommitted"])),
        ["newer-0", "newer-1"],
        "only the newer producer's transaction is committed"
    );
    assert!(shoal.metric("shoal_transactions_producers_fenced_total") >= 1);
    shoal.stop();
}
