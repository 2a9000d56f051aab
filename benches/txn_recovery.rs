//! Recovery of partitions with open transactions after `kill -9`, against the same restart with
//! none open, in the same run:
//!
//! 1. a 2-core `shoal serve` with one topic of 1,000 partitions, 1 KiB records in every one;
//! 2. baseline: `kill -9` with every transaction ended; the time from the restart to listening;
//! 3. 10 transactional producers, each with a transaction open on 100 of the partitions (one
//!    record each), then `kill -9`; the time from the restart to listening, and until every
//!    partition's last stable offset has caught up with its high watermark (the coordinators
//!    abort the transactions, whose producers are gone, at their timeout: 5 s here, checked every
//!    100 ms, so that part is the timeout plus writing 1,000 markers).
//!
//! `cargo bench --bench txn_recovery` (about a minute here). Data lives under `target/`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Shoal;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 1000;
const PRODUCERS: i32 = 10;
const TIMEOUT_MS: u64 = 5000;

fn start(dir: &std::path::Path, listen: &str) -> (Shoal, Duration) {
    let t = Instant::now();
    let shoal = Shoal::start_on(
        dir,
        2,
        listen,
        &["--transaction-timeout-check-interval-ms", "100"],
    );
    (shoal, t.elapsed())
}

fn send(p: &BaseProducer, partition: i32, value: &[u8]) {
    let mut record = BaseRecord::<(), [u8]>::to("recovery")
        .partition(partition)
        .payload(value);
    loop {
        match p.send(record) {
            Ok(()) => return,
            Err((_, r)) => {
                record = r;
                p.poll(Duration::from_millis(10));
            }
        }
    }
}

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-txn-recovery");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let dir = tempfile::tempdir_in(&root).unwrap();
    let port = common::free_port_run(2);
    let listen = format!("127.0.0.1:{port}");
    let (shoal, _) = start(dir.path(), &listen);
    common::create_topics(&listen, &[("recovery", PARTITIONS)]);
    let value = vec![b'x'; 1024];
    let plain: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &listen)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for p in 0..PARTITIONS {
        send(&plain, p, &value);
    }
    plain.flush(Duration::from_secs(60)).unwrap();
    drop(plain);
    shoal.kill_hard();
    let (shoal, baseline) = start(dir.path(), &listen);
    println!(
        "restart after kill -9, no transaction open: listening after {:.0} ms",
        baseline.as_secs_f64() * 1e3
    );
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
                send(&p, i * (PARTITIONS / PRODUCERS) + k, &value);
            }
            p.flush(Duration::from_secs(60)).unwrap();
            p
        })
        .collect();
    let open = shoal.metric("shoal_open_transactions");
    assert_eq!(
        open, PARTITIONS as u64,
        "open transactions over the partitions"
    );
    shoal.kill_hard();
    drop(producers);
    let restarted = Instant::now();
    let (shoal, listening) = start(dir.path(), &listen);
    let lag_at_start = shoal.metric("shoal_log_last_stable_offset_lag");
    let deadline = Instant::now() + Duration::from_secs(120);
    while shoal.metric("shoal_log_last_stable_offset_lag") > 0 {
        assert!(Instant::now() < deadline, "transactions never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let resolved = restarted.elapsed();
    let aborted = shoal.metric("shoal_transactions_timed_out_total");
    println!(
        "restart after kill -9, {PARTITIONS} partitions with open transactions ({PRODUCERS} \
         producers): listening after {:.0} ms ({:.2}x the baseline), last stable offsets behind \
         by {lag_at_start} offsets at start, caught up after {:.0} ms ({aborted} transactions \
         aborted at their {TIMEOUT_MS} ms timeout; {:.0} ms past it)",
        listening.as_secs_f64() * 1e3,
        listening.as_secs_f64() / baseline.as_secs_f64(),
        resolved.as_secs_f64() * 1e3,
        resolved.as_secs_f64() * 1e3 - TIMEOUT_MS as f64,
    );
    shoal.stop();
    let _ = std::fs::remove_dir_all(&root);
}
