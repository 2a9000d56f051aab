//! Fuzzes the request path of a running `shoal`: valid requests of every API and version the broker
//! advertises (`fuzz/requests.rs`), mutated (`fuzz/mutate.rs`: bit flips, extreme integers, length
//! and count fields set to extremes, truncation, insertions, splices of two requests, size prefixes
//! that lie), alone, pipelined, or within a consumer group session or a transactional producer's
//! session (`fuzz/inputs.rs`: its producer id and epoch learned from its InitProducerId), each sent on
//! its own connection through the real connection code, with an ApiVersions request after it
//! (`fuzz/connections.rs`).
//!
//! After each input: the connection was answered or closed within a bounded time, every response is
//! a well-formed answer to a request that was sent, in order, and an input left unmutated was
//! answered in full (`fuzz/answers.rs`). Twice a second (`fuzz/broker.rs`): the broker is alive, its
//! log shows no panic and no ERROR line, its RSS is within the bound, and a long-lived connection is
//! served (ApiVersions, Metadata); every two seconds a record produced to a topic of its own is
//! fetched back exactly.
//!
//! Every input is generated from (seed, index) alone. `cargo test --test it fuzz::` runs about 20 s
//! with a fixed seed; `SHOAL_FUZZ_DURATION=10m SHOAL_FUZZ_SEED=7 cargo test --release --test it
//! fuzz:: -- --nocapture` runs longer, and `SHOAL_FUZZ_INPUTS=1234,1240` replays single inputs, one
//! at a time.
//! A failure prints the seed, the index and the input's bytes.

mod answers;
mod broker;
use crate::common;
mod connections;
mod inputs;
mod mutate;
mod requests;
mod streams;

use answers::frames_sent;
use broker::{
    advertised, caught, check_produce_fetch, check_served, prune_topics, restore_data_topic, rss,
    set_up,
};
use common::wire::connect;
use common::Shoal;
use connections::{run_input, wait_for_slow, Shared};
use inputs::{describe, sentinel, Generator, SENTINEL};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Caches the broker runs with here; they, and a fixed slack, make the RSS bound (see `run`).
const TAIL_CACHE_BYTES: u64 = 32 << 20;
const FETCH_CACHE_BYTES: u64 = 16 << 20;
const RESPONSE_BUDGET_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone)]
struct Config {
    seed: u64,
    duration: Duration,
    workers: usize,
    cores: usize,
    /// Only these inputs, one at a time (a replay).
    only: Option<Vec<u64>>,
}

fn parse_duration(s: &str) -> Duration {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .unwrap_or_else(|_| panic!("SHOAL_FUZZ_DURATION: bad duration {s:?}"));
    match unit {
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => panic!("SHOAL_FUZZ_DURATION: unit {unit:?} (use s, m or h)"),
    }
}

impl Config {
    fn from_env() -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Config {
            seed: var("SHOAL_FUZZ_SEED").map_or(1, |s| s.parse().expect("SHOAL_FUZZ_SEED: a u64")),
            duration: var("SHOAL_FUZZ_DURATION")
                .map_or(Duration::from_secs(20), |d| parse_duration(&d)),
            workers: var("SHOAL_FUZZ_WORKERS")
                .map_or(8, |w| w.parse().expect("SHOAL_FUZZ_WORKERS")),
            cores: var("SHOAL_FUZZ_CORES").map_or(2, |c| c.parse().expect("SHOAL_FUZZ_CORES")),
            only: var("SHOAL_FUZZ_INPUTS").map(|l| {
                let index = |i: &str| -> u64 {
                    i.trim()
                        .parse()
                        .expect("SHOAL_FUZZ_INPUTS: indexes and ranges (a-b), comma-separated")
                };
                l.split(',')
                    .flat_map(|i| match i.split_once('-') {
                        Some((a, b)) => index(a)..=index(b),
                        None => index(i)..=index(i),
                    })
                    .collect()
            }),
        }
    }
}

fn run(config: Config) {
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared::default());
    let log = shared.clone();
    let mut shoal = Shoal::start_watching_log(
        dir.path(),
        config.cores,
        &[
            "--tail-cache-bytes",
            &TAIL_CACHE_BYTES.to_string(),
            "--fetch-cache-bytes",
            &FETCH_CACHE_BYTES.to_string(),
            "--fetch-response-budget-bytes",
            &RESPONSE_BUDGET_BYTES.to_string(),
            // A fresh group's first JoinGroup is answered at once (sessions start with one).
            "--group-initial-rebalance-delay-ms",
            "0",
            // A fuzzed transaction left open holds the data topic's last stable offset back this
            // long at most (the health checks read the health topic, read_uncommitted).
            "--transaction-max-timeout-ms",
            &requests::TXN_MAX_TIMEOUT_MS.to_string(),
        ],
        move |line| {
            // The panic hook's "panicked at", the line of a panic caught per request, or an error
            // (a response that cannot be encoded, storage trouble): none is a client's doing.
            if line.contains("panicked") || line.contains(" ERROR ") {
                log.alarms.fetch_add(1, Ordering::SeqCst);
                log.alarm_lines.lock().unwrap().push(line.to_string());
            }
            let mut tail = log.log_tail.lock().unwrap();
            if tail.len() == 40 {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        },
    );
    let ports = shoal.ports.clone();
    let pid = shoal.pid();
    let health_port = set_up(&ports);
    let metadata_port = ports[0];
    let generator = Generator {
        seed: config.seed,
        apis: advertised(ports[0]),
        cores: config.cores,
    };
    // The bound: what the broker holds after start-up and set-up, plus what its caches and response
    // budget (each per core) may legitimately grow to, plus 256 MiB for everything else it keeps
    // per connection, topic and group (the fuzzer keeps at most `workers` + 512 connections open,
    // and prunes topics).
    // A leak of a kilobyte per input passes it within a few hundred thousand inputs.
    let rss_start = rss(pid).expect("broker RSS");
    let per_core = TAIL_CACHE_BYTES + FETCH_CACHE_BYTES + RESPONSE_BUDGET_BYTES;
    let rss_bound = rss_start + config.cores as u64 * per_core + (256 << 20);
    let mut rss_peak = rss_start;
    let next = Arc::new(AtomicU64::new(0));
    let only = config.only.clone();
    let workers = if only.is_some() { 1 } else { config.workers };
    let start = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (shared, next, generator, ports, only) = (
                shared.clone(),
                next.clone(),
                generator.clone(),
                ports.clone(),
                only.clone(),
            );
            std::thread::spawn(move || loop {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let n = next.fetch_add(1, Ordering::SeqCst);
                let index = match &only {
                    Some(list) => match list.get(n as usize) {
                        Some(&i) => i,
                        None => return,
                    },
                    None => n,
                };
                let input = generator.input(index);
                if only.is_some() {
                    eprintln!("replaying {}", describe(&input, generator.seed));
                }
                shared.tried.fetch_add(1, Ordering::Relaxed);
                run_input(&shared, &ports, input, &generator);
                if only.is_some() {
                    // A replay settles each input before the next.
                    while !shared.in_flight.lock().unwrap().is_empty() && !shared.failed() {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        })
        .collect();
    let waiter = {
        let shared = shared.clone();
        std::thread::spawn(move || wait_for_slow(&shared, config.seed))
    };
    let mut health = connect(metadata_port);
    let mut checks = 0u64;
    let mut restored = 0u64;
    let mut last_report = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        checks += 1;
        let done = match &only {
            Some(list) => {
                next.load(Ordering::SeqCst) >= list.len() as u64
                    && shared.in_flight.lock().unwrap().is_empty()
            }
            None => start.elapsed() >= config.duration,
        };
        if !shoal.is_running() {
            shared.fail("the broker exited".into());
        } else if shared.alarms.load(Ordering::SeqCst) > 0 {
            shared.fail("the broker panicked or logged an error (see its log below)".into());
        } else if let Some(r) = rss(pid) {
            rss_peak = rss_peak.max(r);
            if r > rss_bound {
                shared.fail(format!(
                    "broker RSS {} MiB is above the bound of {} MiB",
                    r >> 20,
                    rss_bound >> 20
                ));
            }
        }
        if !shared.failed() {
            let c = (checks * 2 % 1_000_000) as i32;
            if let Err(e) = caught("a long-lived connection", || check_served(&mut health, c)) {
                shared.fail(e);
            }
        }
        if !shared.failed() && checks % 4 == 0 {
            if let Err(e) = caught("produce and fetch back", || {
                check_produce_fetch(health_port, checks)
            }) {
                shared.fail(e);
            }
        }
        if !shared.failed() && checks % 10 == 0 {
            if let Err(e) = caught("pruning fuzzed topics", || prune_topics(metadata_port)) {
                shared.fail(e);
            }
            match caught("restoring the data topic", || restore_data_topic(&ports)) {
                Ok(true) => restored += 1,
                Ok(false) => {}
                Err(e) => shared.fail(e),
            }
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            last_report = Instant::now();
            eprintln!(
                "fuzz: {:?}: {} inputs, RSS {} MiB (peak {} MiB)",
                start.elapsed(),
                shared.tried.load(Ordering::Relaxed),
                rss(pid).unwrap_or(0) >> 20,
                rss_peak >> 20
            );
        }
        if done || shared.failed() {
            break;
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.join().unwrap();
    }
    waiter.join().unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    // What the transaction sessions got to (a broker that died has no metrics).
    let transactions = if shoal.is_running() {
        format!(
            "; transactions committed {}, aborted {}",
            shoal.metric("shoal_transactions_committed_total"),
            shoal.metric("shoal_transactions_aborted_total")
        )
    } else {
        String::new()
    };
    let tried = shared.tried.load(Ordering::Relaxed);
    let summary = format!(
        "fuzz: seed {}: {tried} inputs in {elapsed:.1} s ({:.0}/s) over {} API versions; answered \
         in full {}, closed by the broker {}, slow (over 300 ms) {} ({} still waiting at the end, \
         not checked); data topic restored {restored} times; broker RSS {} MiB at start, peak {} \
         MiB, bound {} MiB{transactions}",
        config.seed,
        tried as f64 / elapsed,
        generator.apis.len(),
        shared.answered.load(Ordering::Relaxed),
        shared.closed.load(Ordering::Relaxed),
        shared.slow.load(Ordering::Relaxed),
        shared.unsettled.load(Ordering::Relaxed),
        rss_start >> 20,
        rss_peak >> 20,
        rss_bound >> 20,
    );
    eprintln!("{summary}");
    if let Some(failure) = shared.failure.lock().unwrap().clone() {
        let in_flight: Vec<u64> = shared.in_flight.lock().unwrap().iter().copied().collect();
        let mut report = format!("fuzz FAILED (seed {}): {failure}\n", config.seed);
        if !in_flight.is_empty() {
            report += &format!(
                "inputs in flight (replay with SHOAL_FUZZ_SEED={} SHOAL_FUZZ_INPUTS={}):\n",
                config.seed,
                in_flight
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            for &i in in_flight.iter().take(32) {
                report += &format!("  {}\n", describe(&generator.input(i), config.seed));
            }
        }
        for l in shared.alarm_lines.lock().unwrap().iter().take(10) {
            report += &format!("broker log: {l}\n");
        }
        report += "broker log (last lines):\n";
        for l in shared.log_tail.lock().unwrap().iter() {
            report += &format!("  {l}\n");
        }
        panic!("{report}");
    }
    assert!(tried > 0);
    // A broker that does not stop cleanly: what its log last said.
    if let Err(e) = caught("stopping the broker", || {
        shoal.stop();
        Ok(())
    }) {
        let tail: Vec<String> = shared.log_tail.lock().unwrap().iter().cloned().collect();
        panic!("{e}\nbroker log (last lines):\n  {}", tail.join("\n  "));
    }
}

#[test]
fn fuzz_the_request_path() {
    run(Config::from_env());
}

#[test]
fn a_lying_size_prefix_is_seen_as_the_broker_sees_it() {
    // The fuzzer's model of the broker's framing, on which its answer checks rest.
    let mut bytes = sentinel();
    bytes.extend_from_slice(&(-1i32).to_be_bytes());
    bytes.extend_from_slice(&sentinel());
    assert_eq!(frames_sent(&bytes), vec![(18, 0, SENTINEL)]);
    let mut cut = sentinel();
    cut[3] += 1;
    assert!(frames_sent(&cut).is_empty());
}
