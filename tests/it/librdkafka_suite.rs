//! librdkafka's own integration tests (`tests/0xxx-*.c` of the librdkafka that the `rdkafka-sys`
//! crate vendors) against `shoal serve`: the test runner is built once from that source into
//! `target/librdkafka-tests/<version>/` (reused while its version stays), a 2-core server is
//! started per theme, and each chosen librdkafka test runs in a test-runner process of its own,
//! with a time limit, and must pass. The choice, and why every other test is left out, is in
//! `docs/librdkafka-suite.md`.
//!
//! The broker is configured as librdkafka's own test cluster is (its `scenarios/default.json`):
//! topics are created on first use with 4 partitions. `TEST_KAFKA_VERSION` is 3.9.0, the Kafka
//! whose APIs shoal answers. Each test's full log is kept in
//! `target/librdkafka-tests/logs/<theme>/`; a failure shows its last lines.

use crate::common;

use common::Shoal;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The broker version the tests are told: it decides which of them apply.
const KAFKA_VERSION: &str = "3.9.0";
/// The longest one test-runner process may run before it is killed and its test failed.
const RUN_LIMIT: Duration = Duration::from_secs(240);
/// The same for the slow consumer-group tests (0113 runs about 6 minutes).
const SLOW_RUN_LIMIT: Duration = Duration::from_secs(600);
/// librdkafka tests run at once per theme (each in its own process, on its own topics).
const WORKERS: usize = 2;

/// Produce and consume: partitioning, ordering, batches, compression, headers, timestamps,
/// offsets (seek, reset, lookup by time), fetch sizes, idempotence, purge, stats.
const PRODUCE_CONSUME: &[&str] = &[
    "0001_multiobj",
    "0002_unkpart",
    "0003_msgmaxsize",
    "0005_order",
    "0007_autotopic",
    "0008_reqacks",
    "0011_produce_batch",
    "0012_produce_consume",
    "0013_null_msgs",
    "0014_reconsume_191",
    "0015_offsets_seek",
    "0016_client_swname",
    "0017_compression",
    "0021_rkt_destroy",
    "0022_consume_batch",
    "0029_assign_offset",
    "0031_get_offsets",
    "0034_offset_reset",
    "0035_api_version",
    "0036_partial_fetch",
    "0038_performance",
    "0039_event_dr",
    "0040_io_event",
    "0041_fetch_max_bytes",
    "0042_many_topics",
    "0044_partition_cnt",
    "0048_partitioner",
    "0053_stats",
    "0054_offset_time",
    "0057_invalid_topic",
    "0059_bsearch",
    "0060_op_prio",
    "0063_clusterid",
    "0064_interceptors",
    "0065_yield",
    "0067_empty_topic",
    "0070_null_empty",
    "0073_headers",
    "0082_fetch_max_bytes",
    "0083_cb_event",
    "0084_destroy_flags",
    "0085_headers",
    "0086_purge_remote",
    "0090_idempotence",
    "0110_batch_size",
    "0112_assign_unknown_part",
    "0114_sticky_partitioning",
    "0125_immediate_flush",
];

/// Consumer groups: subscribe (lists, regexes, updates), assign, commit, rebalance (eager,
/// cooperative, static members), max.poll.interval, close.
const CONSUMER_GROUPS: &[&str] = &[
    "0018_cgrp_term",
    "0019_list_groups",
    "0020_destroy_hang",
    "0030_offset_commit",
    "0033_regex_subscribe",
    "0050_subscribe_adds",
    "0051_assign_adds",
    "0056_balanced_group_mt",
    "0069_consumer_add_parts",
    "0093_holb_consumer",
    "0099_commit_metadata",
    "0122_buffer_cleaning_after_rebalance",
    "0123_connections_max_idle",
    "0130_store_offsets",
    "0132_strategy_ordering",
    "0140_commit_metadata",
];

/// What the consumer_protocol_groups theme adds to [`CONSUMER_GROUPS`] (but 0132, which tests
/// librdkafka's own assignors and is skipped under the consumer protocol): the tests of static
/// members and of commits during rebalances.
const CONSUMER_PROTOCOL_EXTRA: &[&str] = &["0102_static_group_rebalance", "0118_commit_rebalance"];

/// The theme that runs the consumer-group tests with the consumer group protocol (KIP-848).
const CONSUMER_PROTOCOL_THEME: &str = "consumer_protocol_groups";

/// Consumer-group tests of a minute or more each (session and poll timeouts waited out, many
/// rebalances; 0113 about 6 minutes), with Kafka's 3 s initial rebalance delay, which 0113 needs
/// as 0102 does: run with `--ignored`, outside the default run's time budget.
const SLOW_GROUPS: &[&str] = &[
    "0026_consume_pause",
    "0045_subscribe_update",
    "0045_resubscribe_with_regex",
    "0045_subscribe_many_updates",
    "0089_max_poll_interval",
    "0091_max_poll_interval_timeout",
    "0113_cooperative_rebalance",
];

/// The Admin API test (0081), subtest by subtest: those that do not need replication or an
/// API shoal lacks (see docs/librdkafka-suite.md).
const ADMIN: &[&str] = &[
    "0081_admin/do_test_unclean_destroy",
    "0081_admin/do_test_DeleteTopics",
    "0081_admin/do_test_DeleteRecords",
    "0081_admin/do_test_CreateAcls",
    "0081_admin/do_test_DescribeAcls",
    "0081_admin/do_test_DeleteAcls",
    "0081_admin/do_test_DescribeConfigs",
    "0081_admin/do_test_DescribeConfigs_groups",
    "0081_admin/do_test_DeleteGroups",
    "0081_admin/do_test_DeleteConsumerGroupOffsets",
    "0081_admin/do_test_ListOffsets",
    "0081_admin/do_test_ListConsumerGroupOffsets",
    "0081_admin/do_test_AlterConsumerGroupOffsets",
    "0081_admin/do_test_UserScramCredentials",
    "0081_admin/do_test_DescribeTopics",
    "0081_admin/do_test_DescribeCluster",
    "0081_admin/do_test_ListConsumerGroups",
];

/// The client under injected network faults (librdkafka's sockem: delays, closed connections)
/// talking to a real broker: retries, timeouts, idempotent resends.
const NETWORK_FAULTS: &[&str] = &[
    "0049_consume_conn_close",
    "0068_produce_timeout",
    "0075_retry",
    "0076_produce_retry",
    "0088_produce_metadata_timeout",
    "0094_idempotence_msg_timeout",
];

/// Transactions: the producer's, and read_committed consumers of transactional data, 0103 subtest
/// by subtest.
const TRANSACTIONS: &[&str] = &[
    "0103_transactions/do_test_misuse_txn",
    "0103_transactions/do_test_basic_producer_txn",
    "0103_transactions/do_test_consumer_producer_txn",
    "0103_transactions/do_test_fenced_txn",
    "0103_transactions/do_test_empty_txn",
    "0103_transactions/do_test_wmark_isolation_level",
    "0103_transactions/do_test_txn_abort_control_message_leader_epoch",
    "0103_transactions/do_test_fatal_idempo_error_without_kip360",
    "0129_fetch_aborted_msgs",
    "0061_consumer_lag",
    "0137_barrier_batch_consume",
];

/// Tests that talk to a real broker and fail against shoal today for a gap of shoal's (not a
/// limit of a one-node broker): docs/librdkafka-suite.md says why, each.
const KNOWN_GAPS: &[&str] = &[
    "0081_admin/do_test_AlterConfigs",
    "0081_admin/do_test_IncrementalAlterConfigs",
    "0081_admin/do_test_DescribeConsumerGroups",
    "0092_mixed_msgver",
];

/// A group's first rebalance does not wait for more members (Kafka's
/// `group.initial.rebalance.delay.ms=0`, as development setups have it): each test joins many
/// groups, and the 3 s default would double their time.
const NO_REBALANCE_DELAY: &[&str] = &["--group-initial-rebalance-delay-ms", "0"];

#[test]
fn librdkafka_produce_consume() {
    run_theme("produce_consume", NO_REBALANCE_DELAY, PRODUCE_CONSUME);
}

#[test]
fn librdkafka_consumer_groups() {
    run_theme("consumer_groups", NO_REBALANCE_DELAY, CONSUMER_GROUPS);
}

/// The same consumer-group tests with `group.protocol=consumer` (the suite's
/// `TEST_CONSUMER_GROUP_PROTOCOL=consumer`): members heartbeat with ConsumerGroupHeartbeat and the
/// broker assigns.
#[test]
fn librdkafka_consumer_protocol_groups() {
    let quick = ["--group-consumer-heartbeat-interval-ms", "500"];
    let cases: Vec<&str> = CONSUMER_GROUPS
        .iter()
        .copied()
        .filter(|t| *t != "0132_strategy_ordering")
        .chain(CONSUMER_PROTOCOL_EXTRA.iter().copied())
        .collect();
    run_theme(CONSUMER_PROTOCOL_THEME, &quick, &cases);
}

/// Consumer-group tests that count on Kafka's 3 s initial rebalance delay, which gathers the
/// members that subscribe together into the first generation: 0102's two static members must
/// both be in it; 0118 expects the first revocation to come from closing a consumer (whose commit
/// the client then refuses), not from the second member joining late.
const WITH_REBALANCE_DELAY: &[&str] = &["0102_static_group_rebalance", "0118_commit_rebalance"];

#[test]
fn librdkafka_groups_with_rebalance_delay() {
    run_theme("groups_with_rebalance_delay", &[], WITH_REBALANCE_DELAY);
}

#[test]
fn librdkafka_admin() {
    // ACL calls need an authorizer (without one they get SECURITY_DISABLED, as from Kafka); with
    // everyone allowed where no ACL names a resource, the rest runs as without one.
    let flags = [
        NO_REBALANCE_DELAY,
        &[
            "--authorizer",
            "acl",
            "--allow-everyone-if-no-acl-found",
            "true",
        ],
    ]
    .concat();
    run_theme("admin", &flags, ADMIN);
}

#[test]
fn librdkafka_network_faults() {
    run_theme("network_faults", NO_REBALANCE_DELAY, NETWORK_FAULTS);
}

#[test]
#[ignore = "slow: about 8 minutes of consumer-group timeouts"]
fn librdkafka_slow_consumer_groups() {
    run_theme_within("slow_consumer_groups", &[], SLOW_GROUPS, SLOW_RUN_LIMIT);
}

/// The slow consumer-group tests with the consumer group protocol (KIP-848), but the two of 0045
/// that are known gaps under it (docs/librdkafka-suite.md): `_resubscribe_with_regex` expects
/// Kafka's asynchronous resolution of regular expressions (literal topics assigned one heartbeat
/// before the matched ones), and `_subscribe_many_updates` was not investigated.
#[test]
#[ignore = "slow: about 8 minutes of consumer-group timeouts"]
fn librdkafka_slow_consumer_protocol_groups() {
    let quick = ["--group-consumer-heartbeat-interval-ms", "500"];
    let gaps = ["0045_resubscribe_with_regex", "0045_subscribe_many_updates"];
    let cases: Vec<&str> = SLOW_GROUPS
        .iter()
        .copied()
        .filter(|t| !gaps.contains(t))
        .collect();
    run_theme_within(
        &format!("slow_{CONSUMER_PROTOCOL_THEME}"),
        &quick,
        &cases,
        SLOW_RUN_LIMIT,
    );
}

/// librdkafka's transaction tests that run against a real broker.
#[test]
fn librdkafka_transaction_tests() {
    run_theme("transactions", NO_REBALANCE_DELAY, TRANSACTIONS);
}

/// What shoal fails today (docs/librdkafka-suite.md): run it to see whether a fix closed a gap.
#[test]
#[ignore = "known gaps of shoal's, listed in docs/librdkafka-suite.md"]
fn librdkafka_known_gaps() {
    run_theme("known_gaps", NO_REBALANCE_DELAY, KNOWN_GAPS);
}

/// How one librdkafka test ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

/// Starts a 2-core shoal with `extra` flags, runs `cases` against it, prints a line per case and
/// fails the test unless every case passed.
fn run_theme(theme: &str, extra: &[&str], cases: &[&str]) {
    run_theme_within(theme, extra, cases, RUN_LIMIT)
}

/// [`run_theme`], killing a test-runner after `limit`.
fn run_theme_within(theme: &str, extra: &[&str], cases: &[&str], limit: Duration) {
    let test = format!("librdkafka_suite::{theme}");
    // The suite's switch between the classic group protocol and KIP-848's.
    let protocol = if theme.contains(CONSUMER_PROTOCOL_THEME) {
        "consumer"
    } else {
        "classic"
    };
    let runner = runner();
    let data = tempfile::tempdir().unwrap();
    let mut flags = vec!["--default-partitions", "4"];
    flags.extend_from_slice(extra);
    let shoal = Shoal::start(data.path(), 2, &flags);
    let work = tempfile::tempdir().unwrap();
    let conf = work.path().join("test.conf");
    // The runners' working directory: 0053 reads `../src/statistics_schema.json`, as from tests/.
    let cwd = work.path().join("tests");
    std::fs::create_dir(&cwd).unwrap();
    std::os::unix::fs::symlink(
        runner.tests.parent().unwrap().join("src"),
        work.path().join("src"),
    )
    .unwrap();
    std::fs::write(&conf, format!("bootstrap.servers={}\n", shoal.bootstrap())).unwrap();
    let logs = runner.root.join("logs").join(theme);
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).unwrap();

    let started = Instant::now();
    let queue = Mutex::new(jobs(cases));
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let Some(job) = ({
                    let mut q = queue.lock().unwrap();
                    (!q.is_empty()).then(|| q.remove(0))
                }) else {
                    return;
                };
                let t = Instant::now();
                let outcomes = run_job(runner, &cwd, &conf, &job, &logs, limit, protocol);
                let took = t.elapsed().as_secs_f64();
                for (case, outcome) in outcomes {
                    say(&format!(
                        "librdkafka {case}: {} ({took:.1} s)",
                        match &outcome {
                            Outcome::Passed => "PASSED".to_string(),
                            Outcome::Skipped(why) => format!("SKIPPED: {why}"),
                            Outcome::Failed(why) => format!("FAILED: {why}"),
                        },
                    ));
                    results.lock().unwrap().push((case, outcome));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    let passed = results
        .iter()
        .filter(|(_, o)| *o == Outcome::Passed)
        .count();
    say(&format!(
        "librdkafka {theme}: {passed} of {} passed in {:.0} s",
        results.len(),
        started.elapsed().as_secs_f64()
    ));
    let mut failures = Vec::new();
    for (case, outcome) in &results {
        match outcome {
            Outcome::Passed => {}
            // A test the runner was built without (RapidJSON could not be installed).
            Outcome::Skipped(why) if why.contains("RapidJSON") && !runner.rapidjson => {
                shards::testing::skipped(&test, &format!("librdkafka test {case}"), why)
            }
            Outcome::Skipped(why) => failures.push(format!("{case}: skipped: {why}")),
            Outcome::Failed(why) => {
                let log = log_path(&logs, &job_key(case));
                failures.push(format!(
                    "{case}: {why}\n--- last lines of {} ---\n{}",
                    log.display(),
                    log_tail(&log, 40)
                ));
            }
        }
    }
    assert!(
        shoal_alive(shoal),
        "shoal exited during the librdkafka tests"
    );
    assert!(
        failures.is_empty(),
        "{} librdkafka test(s) failed against shoal:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

fn shoal_alive(mut shoal: Shoal) -> bool {
    let alive = shoal.is_running();
    shoal.stop();
    alive
}

/// Writes a line to stderr directly, so the test harness does not capture it.
fn say(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// The test-runner processes to start: one per test number (the runner selects tests by number,
/// so tests sharing one run together) or per 0081 subtest, each with the cases it must report.
fn jobs<'a>(cases: &[&'a str]) -> Vec<(String, Vec<&'a str>)> {
    let mut jobs: Vec<(String, Vec<&str>)> = Vec::new();
    for &case in cases {
        let key = job_key(case);
        match jobs.iter_mut().find(|(k, _)| *k == key) {
            Some((_, names)) => names.push(case),
            None => jobs.push((key, vec![case])),
        }
    }
    jobs
}

/// `0045` for `0045_subscribe_update`; `0081_admin-do_test_X` for the subtest `0081_admin/do_test_X`.
fn job_key(case: &str) -> String {
    if case.contains('/') {
        case.replace('/', "-")
    } else {
        case[..4].to_string()
    }
}

fn log_path(logs: &Path, key: &str) -> PathBuf {
    logs.join(format!("{key}.log"))
}

/// Runs one job in a test-runner process of its own and reads how each of its cases
/// (`<test name>` or `<test name>/<subtest function>`) ended from its output.
fn run_job(
    runner: &Runner,
    work: &Path,
    conf: &Path,
    (key, cases): &(String, Vec<&str>),
    logs: &Path,
    limit: Duration,
    protocol: &str,
) -> Vec<(String, Outcome)> {
    let subtest = cases[0].split_once('/').map(|(_, sub)| sub);
    let log = log_path(logs, key);
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(runner.tests.join("test-runner"));
    cmd.current_dir(work)
        .env("TESTS", &key[..4])
        .env("TEST_KAFKA_VERSION", KAFKA_VERSION)
        .env("RDKAFKA_TEST_CONF", conf)
        .env("LD_LIBRARY_PATH", &runner.lib_path)
        .env_remove("CI")
        .env_remove("TEST_DEBUG")
        .env_remove("TEST_LEVEL")
        .env("TEST_CONSUMER_GROUP_PROTOCOL", protocol)
        .args(["-L", "-p1"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    if let Some(sub) = subtest {
        // Subtests are named "<function>:<line>: ..."; the colon keeps a prefix from matching.
        cmd.env("SUBTESTS", format!("{sub}:"));
    }
    let mut child = cmd.spawn().expect("test-runner starts");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    let mut outcomes: Vec<(String, Outcome)> = cases
        .iter()
        .map(|case| {
            let name = case.split('/').next().unwrap();
            (case.to_string(), outcome_of(&text, name, subtest))
        })
        .collect();
    let why = match status {
        None => Some(format!("no result within {} s", limit.as_secs())),
        // Every test passed, yet the runner failed (its own checks at exit).
        Some(s) if !s.success() && outcomes.iter().all(|(_, o)| *o == Outcome::Passed) => {
            Some(format!("passed, but the test-runner exited with {s}"))
        }
        Some(_) => None,
    };
    if let Some(why) = why {
        for (_, outcome) in &mut outcomes {
            if *outcome == Outcome::Passed || status.is_none() {
                *outcome = Outcome::Failed(why.clone());
            }
        }
    }
    outcomes
}

/// How test `name` (and `subtest`, where given) ended, from the runner's output.
fn outcome_of(text: &str, name: &str, subtest: Option<&str>) -> Outcome {
    let lines: Vec<&str> = text.lines().collect();
    // A failure: `### Test "<name> (<subtest>)" failed at <where>: ###` and the reason below.
    let failed = [
        format!("### Test \"{name}\""),
        format!("### Test \"{name} ("),
    ];
    if let Some(i) = lines
        .iter()
        .position(|l| failed.iter().any(|f| l.starts_with(f.as_str())) && l.contains("failed at"))
    {
        let at = lines[i]
            .split(" failed at ")
            .nth(1)
            .and_then(|w| w.split(" at ").next())
            .unwrap_or("");
        let why = lines.get(i + 1).copied().unwrap_or("");
        return Outcome::Failed(format!("{why} ({at})"));
    }
    let banner = |state: &str| {
        lines
            .iter()
            .any(|l| l.contains(&format!("= Test {name} {state} =")))
    };
    if banner("SKIPPED") {
        let why = lines
            .iter()
            .find_map(|l| {
                l.starts_with(&format!("[{name}"))
                    .then(|| l.split_once("SKIPPING TEST: "))
                    .flatten()
                    .map(|(_, why)| why.trim().to_string())
            })
            .unwrap_or_default();
        return Outcome::Skipped(why);
    }
    if !banner("PASSED") {
        let last = lines
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with('%'))
            .unwrap_or(&"");
        return Outcome::Failed(format!("no PASSED line; last line: {last}"));
    }
    // Quick mode and SUBTESTS skip subtests silently: a subtest that never started did not pass.
    if let Some(sub) = subtest {
        if !lines.iter().any(|l| l.contains(&format!("[ {sub}:"))) {
            return Outcome::Failed(format!("subtest {sub} did not run"));
        }
    }
    Outcome::Passed
}

/// The text without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last `n` lines of a log, without librdkafka's debug lines.
fn log_tail(path: &Path, n: usize) -> String {
    let text = strip_ansi(&std::fs::read_to_string(path).unwrap_or_default());
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("%7|")).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// librdkafka's test runner, built.
struct Runner {
    /// `target/librdkafka-tests`.
    root: PathBuf,
    /// The built source tree's `tests/`.
    tests: PathBuf,
    /// `LD_LIBRARY_PATH` for it: the built librdkafka and librdkafka++.
    lib_path: String,
    /// Built with RapidJSON (which some tests need to check statistics).
    rapidjson: bool,
}

/// The test runner, built the first time a test asks (once per process; a tree another process
/// built is reused).
fn runner() -> &'static Runner {
    static RUNNER: OnceLock<Result<Runner, String>> = OnceLock::new();
    match RUNNER.get_or_init(build_runner) {
        Ok(r) => r,
        Err(e) => panic!("librdkafka's test runner could not be built: {e}"),
    }
}

/// Marks the runner trees whose tests were adapted by [`one_replica`].
const PATCHED: &str = "-rf1";

/// 0103 creates its topics with replication factor 3 (a three-broker cluster); shoal keeps one
/// copy of each partition and refuses any other factor, as a one-broker Kafka would. Its topics
/// are created with factor 1 instead; nothing else of the test changes.
fn one_replica(tree: &Path) -> Result<(), String> {
    let file = tree.join("tests/0103-transactions.c");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let patched = text.replace(", 3, 5000);", ", 1, 5000);");
    if patched == text {
        return Err(format!(
            "{}: no topic created with factor 3",
            file.display()
        ));
    }
    std::fs::write(&file, patched).map_err(|e| format!("{}: {e}", file.display()))
}

fn build_runner() -> Result<Runner, String> {
    let version = rdkafka_sys_version()?;
    let source = vendored_source(&version)?;
    let rapidjson = rapidjson();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("librdkafka-tests");
    let key = format!(
        "{}{}{PATCHED}",
        version.replace('+', "-"),
        if rapidjson { "-rapidjson" } else { "" }
    );
    let tree = root.join(&key);
    let runner = |tree: &Path| Runner {
        root: root.clone(),
        tests: tree.join("tests"),
        lib_path: format!(
            "{}:{}",
            tree.join("src").display(),
            tree.join("src-cpp").display()
        ),
        rapidjson,
    };
    if tree.join("tests/test-runner").exists() {
        return Ok(runner(&tree));
    }
    say(&format!(
        "librdkafka: building the test runner of {version} in {} (once; a few minutes)",
        tree.display()
    ));
    let started = Instant::now();
    let building = root.join(format!("{key}.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let log_file = root.join(format!("{key}.build.log"));
    let log = std::fs::File::create(&log_file).map_err(|e| e.to_string())?;
    let step = |what: &str, cmd: &mut Command| -> Result<(), String> {
        let status = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log.try_clone().unwrap())
            .status()
            .map_err(|e| format!("{what}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed ({status}); the end of {}:\n{}",
                log_file.display(),
                log_tail(&log_file, 30)
            ))
        }
    };
    step(
        "copying the source",
        Command::new("cp").arg("-r").arg(&source).arg(&building),
    )?;
    one_replica(&building)?;
    // The smallest build the runner needs: no TLS, SASL, zstd or HTTP (the tests that need them
    // are not run); zlib and the built-in LZ4 and snappy for 0017_compression.
    step(
        "configure",
        Command::new("./configure")
            .args([
                "--disable-ssl",
                "--disable-gssapi",
                "--disable-curl",
                "--disable-zstd",
                "--disable-lz4-ext",
                "--disable-regex-ext",
                "--disable-syslog",
            ])
            .current_dir(&building),
    )?;
    step(
        "make libs",
        Command::new("make")
            .args(["-j2", "libs"])
            .current_dir(&building),
    )?;
    step(
        "make test-runner",
        Command::new("make")
            .args(["-j2", "test-runner"])
            .current_dir(building.join("tests")),
    )?;
    match std::fs::rename(&building, &tree) {
        Ok(()) => {}
        // Another process finished first: use its tree.
        Err(_) if tree.join("tests/test-runner").exists() => {
            let _ = std::fs::remove_dir_all(&building);
        }
        Err(e) => return Err(format!("renaming {}: {e}", building.display())),
    }
    say(&format!(
        "librdkafka: test runner built in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(runner(&tree))
}

/// rdkafka-sys's version in Cargo.lock, e.g. `4.10.0+2.12.1` (librdkafka 2.12.1).
fn rdkafka_sys_version() -> Result<String, String> {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock");
    let text = std::fs::read_to_string(&lock).map_err(|e| format!("{}: {e}", lock.display()))?;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"rdkafka-sys\"" {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.strip_prefix("version = \""))
                .and_then(|l| l.strip_suffix('"'))
            {
                return Ok(v.to_string());
            }
        }
    }
    Err("no rdkafka-sys in Cargo.lock".into())
}

/// The librdkafka source that rdkafka-sys vendors, in cargo's registry.
fn vendored_source(version: &str) -> Result<PathBuf, String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registry = cargo_home.join("registry/src");
    let crate_dir = format!("rdkafka-sys-{version}");
    std::fs::read_dir(&registry)
        .map_err(|e| format!("{}: {e}", registry.display()))?
        .filter_map(Result::ok)
        .map(|d| d.path().join(&crate_dir).join("librdkafka"))
        .find(|p| p.join("tests/test.c").exists())
        .ok_or_else(|| format!("no {crate_dir}/librdkafka under {}", registry.display()))
}

/// Whether RapidJSON's headers are there, installing Debian's `rapidjson-dev` (as root, with
/// `apt-get`) where they are missing; without them 0053_stats and 0110_batch_size are skipped.
fn rapidjson() -> bool {
    let found = || Path::new("/usr/include/rapidjson/schema.h").exists();
    if found() {
        return true;
    }
    common::debian::install(&["rapidjson-dev"]);
    found()
}
