//! Recovery of partitions with open transactions after `kill -9`, against the same restart with
//! none open, in the same run:
//!
//! 1. a 2-core `shoal serve` with one topic of 1,000 partitions, 1 KiB records in every one;
//! 2. baseline: `kill -9` with every transaction ended; the time from the restart until every
//!    partition is open and served;
//! 3. 10 transactional producers, each with a transaction open on 100 of the partitions (one
//!    record each), then `kill -9`; the time from the restart until every partition is served
//!    (each partition's open transactions rebuilt from its log, the coordinators' states from
//!    theirs), and until every partition's last stable offset has caught up with its high
//!    watermark: the coordinators abort the transactions, whose producers are gone, once their
//!    timeout (5 s here, checked every 100 ms) has passed since they began, which writes 1,000
//!    markers.
//!
//! `cargo bench --bench txn_recovery` (about a minute here). Data lives under `target/`.

#[path = "../tests/it/common/mod.rs"]
mod common;

use common::Shoal;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 1000;
const PRODUCERS: i32 = 10;
const TIMEOUT_MS: u64 = 5000;

/// Starts the broker; it and the time until it serves `partitions` partitions.
fn start(dir: &std::path::Path, listen: &str, partitions: i32) -> (Shoal, Duration) {
    let t = Instant::now();
    let shoal = Shoal::start_on(
        dir,
        2,
        listen,
        &["--transaction-timeout-check-interval-ms", "100"],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while shoal.metric_or_zero("shoal_partitions", "") < partitions as u64 {
        assert!(Instant::now() < deadline, "partitions never opened");
        std::thread::sleep(Duration::from_millis(5));
    }
    (shoal, t.elapsed())
}

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-txn-recovery");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let dir = tempfile::tempdir_in(&root).unwrap();
    let port = common::free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let (shoal, _) = start(dir.path(), &listen, 0);
    common::create_topics(&listen, &[("recovery", PARTITIONS)]);
    let value = vec![b'x'; 1024];
    let plain: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &listen)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for p in 0..PARTITIONS {
        common::send_polling(&plain, "recovery", p, &value);
    }
    plain.flush(Duration::from_secs(60)).unwrap();
    drop(plain);
    shoal.kill_hard();
    let (shoal, baseline) = start(dir.path(), &listen, PARTITIONS);
    println!(
        "restart after kill -9, no transaction open: {PARTITIONS} partitions served after {:.0} ms",
        baseline.as_secs_f64() * 1e3
    );
    let began = Instant::now();
    let producers: Vec<BaseProducer> = (0..PRODUCERS)
        .map(|i| {
            let p: BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", &listen)
                .set("transactional.id", format!("recovery-{i}"))
                .set("transaction.timeout.ms", TIMEOUT_MS.to_string())
                .set("socket.timeout.ms", TIMEOUT_MS.to_string())
                .set("linger.ms", "5")
                .create()
                .unwrap();
            p.init_transactions(Duration::from_secs(60)).unwrap();
            p.begin_transaction().unwrap();
            for k in 0..PARTITIONS / PRODUCERS {
                common::send_polling(&p, "recovery", i * (PARTITIONS / PRODUCERS) + k, &value);
            }
            p.flush(Duration::from_secs(60)).unwrap();
            p
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while shoal.metric_or_zero("shoal_open_transactions", "") < PARTITIONS as u64 {
        assert!(
            Instant::now() < deadline,
            "open transactions over the partitions: {} of {PARTITIONS}",
            shoal.metric_or_zero("shoal_open_transactions", "")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    shoal.kill_hard();
    drop(producers);
    let killed = Instant::now();
    let restarted = Instant::now();
    let (shoal, serving) = start(dir.path(), &listen, PARTITIONS);
    let lag_at_start = shoal.metric("shoal_log_last_stable_offset_lag");
    let open_at_start = shoal.metric("shoal_transactions_open");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first_abort = None;
    while shoal.metric("shoal_log_last_stable_offset_lag") > 0 {
        assert!(Instant::now() < deadline, "transactions never ended");
        if first_abort.is_none() && shoal.metric("shoal_transactions_timed_out_total") > 0 {
            first_abort = Some(restarted.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let resolved = restarted.elapsed();
    let first_abort = first_abort.unwrap_or(resolved);
    let aborted = shoal.metric("shoal_transactions_timed_out_total");
    println!(
        "restart after kill -9, {PARTITIONS} partitions with open transactions ({PRODUCERS} \
         producers): served after {:.0} ms ({:.2}x the baseline) with {open_at_start} \
         transactions open and last stable offsets {lag_at_start} offsets behind; the first \
         timeout abort after {:.0} ms ({TIMEOUT_MS} ms after the transactions began, {:.0} ms \
         before the kill), every last stable offset caught up after {:.0} ms ({aborted} \
         transactions aborted: {:.0} ms from the first abort to the last marker)",
        serving.as_secs_f64() * 1e3,
        serving.as_secs_f64() / baseline.as_secs_f64(),
        first_abort.as_secs_f64() * 1e3,
        (killed - began).as_secs_f64() * 1e3,
        resolved.as_secs_f64() * 1e3,
        (resolved - first_abort).as_secs_f64() * 1e3,
    );
    shoal.stop();
    let _ = std::fs::remove_dir_all(&root);
}
