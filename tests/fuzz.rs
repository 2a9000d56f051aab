//! Fuzzes the request path of a running `shoal`: valid requests of every API and version the broker
//! advertises, mutated (bit flips, extreme integers, length and count fields set to extremes,
//! truncation, insertions, splices of two requests, size prefixes that lie), each sent on its own
//! connection through the real connection code, with an ApiVersions request after it.
//!
//! After each input: the connection was answered or closed within a bounded time, every response is
//! a well-formed answer to a request that was sent (in order), and an input left unmutated was
//! answered in full. Twice a second: the broker is alive, printed no panic, its RSS is within the
//! bound, and a long-lived connection is served (ApiVersions, Metadata); every two seconds a record
//! produced to a topic of its own is fetched back exactly.
//!
//! Every input is generated from (seed, index) alone. `cargo test --test fuzz` runs about 20 s with a
//! fixed seed; `SHOAL_FUZZ_DURATION=10m SHOAL_FUZZ_SEED=7 cargo test --release --test fuzz --
//! --nocapture` runs longer, and `SHOAL_FUZZ_INPUTS=1234,1240` replays single inputs, one at a time.
//! A failure prints the seed, the index and the input's bytes.

mod common;
#[path = "fuzz/mutate.rs"]
mod mutate;
#[path = "fuzz/requests.rs"]
mod requests;

use bytes::Bytes;
use common::wire::{self, call, connect};
use common::Shoal;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use mutate::Rng;
use requests::{DATA_TOPIC, HEALTH_TOPIC, POOL};
use shards::batch::BatchBuilder;
use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an input's connection may stay open without being answered or closed: a Fetch may wait
/// 30 s (the broker's cap on `max_wait_ms`), a first JoinGroup the initial rebalance delay (3 s).
const ANSWER_DEADLINE: Duration = Duration::from_secs(45);
/// The frame limit the broker runs with (its `--max-request-bytes` default).
const MAX_REQUEST_BYTES: i64 = 100 << 20;
/// Correlation id of the ApiVersions request sent after every input.
const SENTINEL: i32 = 0x5e47_1e11;
/// Caches the broker runs with here; they, and a fixed slack, make the RSS bound (see `rss_bound`).
const TAIL_CACHE_BYTES: u64 = 32 << 20;
const FETCH_CACHE_BYTES: u64 = 16 << 20;
const RESPONSE_BUDGET_BYTES: u64 = 64 << 20;
/// Connections waiting for a slow answer, at most (beyond it, workers wait themselves).
const MAX_SLOW: usize = 512;

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
                l.split(',')
                    .map(|i| {
                        i.trim()
                            .parse()
                            .expect("SHOAL_FUZZ_INPUTS: indexes, comma-separated")
                    })
                    .collect()
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Inputs.

/// One input: the bytes sent on one connection, and how they came about.
#[derive(Debug, Clone)]
struct Input {
    index: u64,
    key: ApiKey,
    version: i16,
    /// The mutations applied; empty for an input sent as generated (which must be answered in full).
    notes: Vec<String>,
    bytes: Vec<u8>,
    core: usize,
    /// Written a few bytes at a time, with pauses, instead of in one write.
    trickled: bool,
    /// A consumer group session: `bytes` is its JoinGroup; what follows is generated from the answer.
    session: Option<Session>,
}

/// The rest of a consumer group session, once its JoinGroup is answered.
#[derive(Debug, Clone)]
struct Session {
    rng: Rng,
    group: String,
}

/// The inputs' generator: the APIs and versions the broker advertised, and the run's seed.
#[derive(Debug, Clone)]
struct Generator {
    seed: u64,
    apis: Vec<(ApiKey, i16)>,
    cores: usize,
    /// The partitions of the data topic each core leads.
    led: Vec<Vec<i32>>,
}

impl Generator {
    /// Input `index`: the first ones are every advertised (API, version) unmutated, in order; the rest
    /// a random API and version, mutated nine times in ten.
    fn input(&self, index: u64) -> Input {
        let mut rng = Rng::for_input(self.seed, index);
        let sweep = (index as usize) < self.apis.len();
        if !sweep && rng.one_in(16) {
            return self.session(index, rng);
        }
        if !sweep && rng.one_in(5) {
            return self.pipeline(index, rng);
        }
        let (key, version) = if sweep {
            self.apis[index as usize]
        } else {
            *rng.pick(&self.apis)
        };
        let core = rng.below(self.cores);
        let led = &self.led[core];
        let frame = requests::build(&mut rng, key, version, 1, index, led);
        let (bytes, notes) = if sweep || rng.one_in(10) {
            (frame, Vec::new())
        } else {
            let (k, v) = *rng.pick(&self.apis);
            let other = requests::build(&mut rng, k, v, 2, index, led);
            mutate::mutate(&mut rng, &frame, &other)
        };
        Input {
            index,
            key,
            version,
            notes,
            bytes,
            core,
            trickled: rng.one_in(25),
            session: None,
        }
    }

    /// 2-4 requests in one write (pipelined), one of them mutated nine times in ten.
    fn pipeline(&self, index: u64, mut rng: Rng) -> Input {
        let core = rng.below(self.cores);
        let led = &self.led[core];
        let n = 2 + rng.below(3);
        let mut first = None;
        let mut frames: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let (k, v) = *rng.pick(&self.apis);
                first.get_or_insert((k, v));
                requests::build(&mut rng, k, v, i as i32 + 1, index, led)
            })
            .collect();
        let first = first.unwrap();
        let mut notes = Vec::new();
        if !rng.one_in(10) {
            let (j, o) = (rng.below(n), rng.below(n));
            let other = frames[o].clone();
            let (m, what) = mutate::mutate(&mut rng, &frames[j], &other);
            frames[j] = m;
            notes.push(format!("request {} of {n}: {}", j + 1, what.join(", ")));
        }
        let (key, version) = first;
        Input {
            index,
            key,
            version,
            notes,
            bytes: frames.concat(),
            core,
            trickled: rng.one_in(25),
            session: None,
        }
    }

    /// A consumer group session on a group of its own: JoinGroup, then (see [`requests::session`])
    /// what a member does, one request of it mutated nine times in ten.
    fn session(&self, index: u64, mut rng: Rng) -> Input {
        let versions: Vec<i16> = self
            .apis
            .iter()
            .filter(|(k, _)| *k == ApiKey::JoinGroup)
            .map(|(_, v)| *v)
            .collect();
        let version = *rng.pick(&versions);
        let group = format!("fz-session-{index}");
        Input {
            index,
            key: ApiKey::JoinGroup,
            version,
            notes: Vec::new(),
            bytes: requests::join(version, 1, &group, ""),
            // Its coordinator: elsewhere the session would end at NOT_COORDINATOR.
            core: shoal::groups::coordinator_core(&group, self.cores),
            trickled: false,
            session: Some(Session { rng, group }),
        }
    }
}

fn sentinel() -> Vec<u8> {
    wire::request_frame(
        ApiKey::ApiVersions,
        0,
        SENTINEL,
        &ApiVersionsRequest::default(),
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The requests the broker reads from `bytes`, as it frames them: (api key, version, correlation id)
/// of each whole frame, up to the first one it refuses to read.
fn frames_sent(bytes: &[u8]) -> Vec<(i16, i16, i32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 4 {
        let size = i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as i64;
        if !(8..=MAX_REQUEST_BYTES).contains(&size) || at + 4 + size as usize > bytes.len() {
            break;
        }
        let f = &bytes[at + 4..at + 4 + size as usize];
        out.push((
            i16::from_be_bytes([f[0], f[1]]),
            i16::from_be_bytes([f[2], f[3]]),
            i32::from_be_bytes(f[4..8].try_into().unwrap()),
        ));
        at += 4 + size as usize;
    }
    out
}

/// Checks what came back on an input's connection, which the broker has closed: whole response
/// frames, each answering a request sent (in order) and decoding as that API's response; for an
/// unmutated input, the ApiVersions request after it answered too. Returns whether it was.
fn check_answers(input: &Input, sent: &[u8], received: &[u8], reset: bool) -> Result<bool, String> {
    let requests = frames_sent(sent);
    let mut next = 0;
    let mut at = 0;
    let mut sentinel_answered = false;
    while at < received.len() {
        let left = received.len() - at;
        let size =
            (left >= 4).then(|| i32::from_be_bytes(received[at..at + 4].try_into().unwrap()));
        if reset && size.is_none_or(|s| s >= 4 && s as usize > left - 4) {
            break; // the last frame, cut by the reset
        }
        let Some(size) = size else {
            return Err(format!("{left} bytes after the last response frame"));
        };
        if size < 4 || at + 4 + size as usize > received.len() {
            return Err(format!(
                "response frame of size {size} with {} bytes left (cut short or bad size)",
                received.len() - at - 4
            ));
        }
        let frame = Bytes::copy_from_slice(&received[at + 4..at + 4 + size as usize]);
        at += 4 + size as usize;
        let correlation = i32::from_be_bytes(frame[..4].try_into().unwrap());
        let Some(pos) = requests[next..].iter().position(|r| r.2 == correlation) else {
            return Err(format!(
                "a response with correlation id {correlation}, which no request sent later had"
            ));
        };
        let (key, version, _) = requests[next + pos];
        next += pos + 1;
        let key = ApiKey::try_from(key).map_err(|_| {
            format!("an answer to unknown API key {key} (correlation {correlation})")
        })?;
        // KIP-511: an ApiVersions the broker cannot serve is answered in v0.
        let version = if key == ApiKey::ApiVersions && !(0..=3).contains(&version) {
            0
        } else {
            version
        };
        requests::decode_response(key, version, frame.clone()).map_err(|e| {
            format!(
                "the {key:?} v{version} response (correlation {correlation}) does not decode: {e}; \
                 response {}",
                hex(&frame)
            )
        })?;
        if correlation == SENTINEL && next == requests.len() {
            sentinel_answered = true;
        }
    }
    if input.notes.is_empty() && !sentinel_answered {
        return Err(format!(
            "a valid {:?} v{} request was not answered: the connection closed after {} response(s)",
            input.key, input.version, next
        ));
    }
    Ok(sentinel_answered)
}

// ---------------------------------------------------------------------------------------------------
// Running inputs.

/// What the run has seen, shared by the workers, the waiter for slow answers and the health checks.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    tried: AtomicU64,
    answered: AtomicU64,
    closed: AtomicU64,
    slow: AtomicU64,
    /// Slow inputs still waiting when the run ended (not checked).
    unsettled: AtomicU64,
    failure: Mutex<Option<String>>,
    /// Inputs sent and not yet settled.
    in_flight: Mutex<BTreeMap<u64, ()>>,
    /// Connections waiting for an answer.
    waiting: Mutex<Vec<Pending>>,
    panics: AtomicUsize,
    /// The broker's log lines that tell of a panic.
    panic_lines: Mutex<Vec<String>>,
    log_tail: Mutex<VecDeque<String>>,
}

impl Shared {
    fn fail(&self, what: String) {
        let mut f = self.failure.lock().unwrap();
        if f.is_none() {
            *f = Some(what);
        }
        self.stop.store(true, Ordering::SeqCst);
    }
    fn failed(&self) -> bool {
        self.failure.lock().unwrap().is_some()
    }
}

/// An input's connection, written and half-closed, waiting for the broker to answer and close.
#[derive(Debug)]
struct Pending {
    input: Input,
    sent: Vec<u8>,
    stream: TcpStream,
    received: Vec<u8>,
    /// The connection ended with a reset, not an orderly close: the broker closed it with bytes of
    /// ours unread (after a frame it refused), and the kernel dropped what it had not sent yet.
    reset: bool,
    deadline: Instant,
}

/// Reads what is there; `Some` once the broker has closed the connection.
fn pump(p: &mut Pending) -> Option<()> {
    let mut buf = [0u8; 16 << 10];
    loop {
        match p.stream.read(&mut buf) {
            Ok(0) => return Some(()),
            Ok(n) => p.received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                p.reset = true;
                return Some(());
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("reading input {}'s connection: {e}", p.input.index),
        }
    }
}

fn describe(input: &Input, seed: u64) -> String {
    format!(
        "seed {seed}, input {} ({}{:?} v{}, to core {}{}; {})\n  input hex: {}",
        input.index,
        if input.session.is_some() {
            "session after "
        } else {
            ""
        },
        input.key,
        input.version,
        input.core,
        if input.trickled { ", trickled" } else { "" },
        if input.notes.is_empty() {
            "unmutated".to_string()
        } else {
            input.notes.join(", ")
        },
        hex(&input.bytes)
    )
}

fn settle(shared: &Shared, p: &Pending, seed: u64) {
    match check_answers(&p.input, &p.sent, &p.received, p.reset) {
        Ok(true) => {
            shared.answered.fetch_add(1, Ordering::Relaxed);
        }
        Ok(false) => {
            shared.closed.fetch_add(1, Ordering::Relaxed);
        }
        Err(why) => shared.fail(format!("{why}\n  {}", describe(&p.input, seed))),
    }
    shared.in_flight.lock().unwrap().remove(&p.input.index);
}

/// Reads one response frame (size prefix included) into `received`, waiting at most 10 s.
fn read_response(stream: &mut TcpStream, received: &mut Vec<u8>) -> Result<Bytes, String> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .map_err(|e| format!("reading a JoinGroup answer: {e}"))?;
    let n = i32::from_be_bytes(size);
    if !(4..=1 << 20).contains(&n) {
        return Err(format!("JoinGroup answer of size {n}"));
    }
    let mut frame = vec![0u8; n as usize];
    stream
        .read_exact(&mut frame)
        .map_err(|e| format!("reading a JoinGroup answer: {e}"))?;
    received.extend_from_slice(&size);
    received.extend_from_slice(&frame);
    Ok(Bytes::from(frame))
}

/// Joins the session's group (twice for v4+, which first hands out a member id), then generates the
/// rest of the session from the answer into `input.bytes`. Returns the JoinGroup requests sent.
fn start_session(
    stream: &mut TcpStream,
    input: &mut Input,
    apis: &[(ApiKey, i16)],
    received: &mut Vec<u8>,
) -> Result<Vec<u8>, String> {
    let Session { mut rng, group } = input.session.clone().unwrap();
    let v = input.version;
    let mut sent = Vec::new();
    let mut join = input.bytes.clone();
    let answer = loop {
        stream
            .write_all(&join)
            .map_err(|e| format!("sending a JoinGroup: {e}"))?;
        sent.extend_from_slice(&join);
        let mut frame = read_response(stream, received)?;
        ResponseHeader::decode(&mut frame, ApiKey::JoinGroup.response_header_version(v))
            .map_err(|e| e.to_string())?;
        let r = JoinGroupResponse::decode(&mut frame, v).map_err(|e| e.to_string())?;
        const MEMBER_ID_REQUIRED: i16 = 79;
        if r.error_code == MEMBER_ID_REQUIRED && sent.len() == join.len() {
            join = requests::join(v, 2, &group, &r.member_id);
            continue;
        }
        if r.error_code != 0 {
            return Err(format!(
                "JoinGroup v{v} of a fresh group answered error {}",
                r.error_code
            ));
        }
        break r;
    };
    let leader = answer.leader == answer.member_id;
    let mut frames = requests::session(
        &mut rng,
        apis,
        &group,
        &answer.member_id,
        answer.generation_id,
        leader,
    );
    if !rng.one_in(10) {
        let n = frames.len();
        let (j, o) = (rng.below(n), rng.below(n));
        let other = frames[o].clone();
        let (m, what) = mutate::mutate(&mut rng, &frames[j], &other);
        frames[j] = m;
        input.notes.push(format!(
            "session request {} of {n}: {}",
            j + 1,
            what.join(", ")
        ));
    }
    input.bytes = frames.concat();
    Ok(sent)
}

/// Sends one input (and the ApiVersions after it), half-closes, and waits briefly for the broker to
/// answer and close; a slow one is left to [`wait_for_slow`].
fn run_input(shared: &Shared, ports: &[u16], mut input: Input, generator: &Generator) {
    let seed = generator.seed;
    shared.in_flight.lock().unwrap().insert(input.index, ());
    let port = ports[input.core];
    let mut stream = match TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => s,
        Err(e) => {
            shared.fail(format!(
                "cannot connect to core {} (port {port}): {e}",
                input.core
            ));
            return;
        }
    };
    stream.set_nodelay(true).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = Vec::new();
    let mut sent = Vec::new();
    if input.session.is_some() {
        match start_session(&mut stream, &mut input, &generator.apis, &mut received) {
            Ok(s) => sent = s,
            Err(e) => {
                shared.fail(format!("{e}\n  {}", describe(&input, seed)));
                return;
            }
        }
    }
    sent.extend_from_slice(&input.bytes);
    sent.extend_from_slice(&sentinel());
    let to_write = &sent[sent.len() - input.bytes.len() - sentinel().len()..];
    let written = if input.trickled {
        to_write.chunks(3).try_for_each(|c| {
            std::thread::sleep(Duration::from_micros(300));
            stream.write_all(c)
        })
    } else {
        stream.write_all(to_write)
    };
    match written {
        // The broker may close early: a frame it refuses ends the connection.
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {}
        Err(e) => {
            shared.fail(format!(
                "writing an input: {e}\n  {}",
                describe(&input, seed)
            ));
            return;
        }
    }
    let _ = stream.shutdown(Shutdown::Write);
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut p = Pending {
        input,
        sent,
        stream,
        received,
        reset: false,
        deadline: Instant::now() + ANSWER_DEADLINE,
    };
    let quick = Instant::now() + Duration::from_millis(300);
    while Instant::now() < quick {
        if pump(&mut p).is_some() {
            settle(shared, &p, seed);
            return;
        }
    }
    shared.slow.fetch_add(1, Ordering::Relaxed);
    p.stream.set_nonblocking(true).unwrap();
    loop {
        let mut waiting = shared.waiting.lock().unwrap();
        if waiting.len() < MAX_SLOW {
            waiting.push(p);
            return;
        }
        drop(waiting);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls the connections waiting for slow answers until the run stops and none is left.
fn wait_for_slow(shared: &Shared, seed: u64) {
    let mut stopped = None;
    loop {
        let mut ready = Vec::new();
        {
            let mut waiting = shared.waiting.lock().unwrap();
            let now = Instant::now();
            let mut i = 0;
            while i < waiting.len() {
                if pump(&mut waiting[i]).is_some() {
                    ready.push(waiting.swap_remove(i));
                } else if now > waiting[i].deadline {
                    let p = waiting.swap_remove(i);
                    shared.fail(format!(
                        "neither answered nor closed within {ANSWER_DEADLINE:?} ({} bytes back)\n  {}",
                        p.received.len(),
                        describe(&p.input, seed)
                    ));
                } else {
                    i += 1;
                }
            }
            if shared.stop.load(Ordering::SeqCst) {
                // At the end of the run, an answer still pending (a long poll) is not waited for.
                let end = *stopped.get_or_insert_with(Instant::now);
                if waiting.is_empty() && ready.is_empty() || end.elapsed() > Duration::from_secs(2)
                {
                    shared
                        .unsettled
                        .store(waiting.len() as u64, Ordering::SeqCst);
                    for p in waiting.drain(..) {
                        shared.in_flight.lock().unwrap().remove(&p.input.index);
                    }
                    return;
                }
            }
        }
        for p in &ready {
            settle(shared, p, seed);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------------------
// The broker and its health.

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// VmRSS of a process, in bytes.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// The APIs and versions the broker advertises.
fn advertised(port: u16) -> Vec<(ApiKey, i16)> {
    let mut s = connect(port);
    let r: ApiVersionsResponse = call(
        &mut s,
        ApiKey::ApiVersions,
        3,
        1,
        &ApiVersionsRequest::default(),
    );
    let mut out = Vec::new();
    for k in &r.api_keys {
        let key = ApiKey::try_from(k.api_key).expect("a known API key");
        assert!(
            requests::KNOWN.contains(&key),
            "the broker serves {key:?}, which the fuzzer has no requests for: add them to tests/fuzz/requests.rs"
        );
        out.extend((k.min_version..=k.max_version).map(|v| (key, v)));
    }
    out
}

fn create_topic(port: u16, topic: &str, partitions: i32) {
    let mut s = connect(port);
    let r: CreateTopicsResponse = call(
        &mut s,
        ApiKey::CreateTopics,
        7,
        1,
        &CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(name(topic))
                .with_num_partitions(partitions)
                .with_replication_factor(1)]),
    );
    assert_eq!(r.topics[0].error_code, 0, "create {topic}");
}

/// The core leading `topic`/`partition`.
fn leader(port: u16, topic: &str, partition: i32) -> usize {
    let mut s = connect(port);
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(topic)))
        ])),
    );
    let p = r.topics[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)
        .expect("partition in metadata");
    p.leader_id.0 as usize
}

/// Produces one batch; returns its base offset.
fn produce(port: u16, topic: &str, partition: i32, batch: Vec<u8>) -> i64 {
    let mut s = connect(port);
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        1,
        &ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(name(topic))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(Bytes::from(batch)))])]),
    );
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 0, "produce to {topic}/{partition}");
    p.base_offset
}

/// The broker's state the fuzzer builds on: the data topic with ordinary records and records whose
/// timestamps are extreme, and the health checks' topic.
fn set_up(ports: &[u16]) -> (u16, Vec<Vec<i32>>) {
    create_topic(ports[0], DATA_TOPIC, 2);
    create_topic(ports[0], HEALTH_TOPIC, 1);
    let mut led = vec![Vec::new(); ports.len()];
    for partition in 0..2 {
        let core = leader(ports[0], DATA_TOPIC, partition);
        led[core].push(partition);
        let port = ports[core];
        let now = now_ms();
        for i in 0..20 {
            let mut b = BatchBuilder::new(now - 100_000 + i * 1000);
            for r in 0..3 {
                b.push(
                    now - 100_000 + i * 1000 + r,
                    Some(format!("k{r}").as_bytes()),
                    Some(b"seed record"),
                    &[],
                );
            }
            produce(port, DATA_TOPIC, partition, b.finish(0));
        }
        // Timestamps at the edges of i64, deltas as large as they go (a record's timestamp is the
        // batch's base plus its delta: the first batch's overflows i64).
        for (base, ts, patched_base) in [
            (0, i64::MAX, Some(100)),
            (0, i64::MAX, None),
            (i64::MAX - 1, i64::MAX, None),
            (-1, -1, None),
            (0, 0, None),
        ] {
            let mut b = BatchBuilder::new(base);
            b.push(ts, None, Some(b"edge timestamp"), &[]);
            let mut batch = b.finish(0);
            if let Some(base) = patched_base {
                let mut h = shards::batch::BatchHeader::parse(&batch).unwrap();
                h.base_timestamp = base;
                shards::batch::write_header(&mut batch, &h);
            }
            produce(port, DATA_TOPIC, partition, batch);
        }
    }
    (ports[leader(ports[0], HEALTH_TOPIC, 0)], led)
}

/// ApiVersions and Metadata on a long-lived connection.
fn check_served(s: &mut TcpStream, correlation: i32) -> Result<(), String> {
    let r: ApiVersionsResponse = call(
        s,
        ApiKey::ApiVersions,
        3,
        correlation,
        &ApiVersionsRequest::default(),
    );
    if r.error_code != 0 || r.api_keys.is_empty() {
        return Err(format!("ApiVersions answered {r:?}"));
    }
    let r: MetadataResponse = call(
        s,
        ApiKey::Metadata,
        12,
        correlation + 1,
        &MetadataRequest::default().with_topics(Some(
            [DATA_TOPIC, HEALTH_TOPIC]
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(name(t))))
                .collect(),
        )),
    );
    let partitions: Vec<(i16, usize)> = r
        .topics
        .iter()
        .map(|t| (t.error_code, t.partitions.len()))
        .collect();
    if partitions != [(0, 2), (0, 1)] {
        return Err(format!("Metadata of the fuzzer's topics: {partitions:?}"));
    }
    Ok(())
}

/// Produces a record to the health topic and fetches it back.
fn check_produce_fetch(port: u16, n: u64) -> Result<(), String> {
    let value = format!("probe {n}");
    let mut b = BatchBuilder::new(now_ms());
    b.push(now_ms(), None, Some(value.as_bytes()), &[]);
    let offset = produce(port, HEALTH_TOPIC, 0, b.finish(0));
    let mut s = connect(port);
    let r: FetchResponse = call(
        &mut s,
        ApiKey::Fetch,
        12,
        1,
        &FetchRequest::default()
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(name(HEALTH_TOPIC))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(1 << 20)])]),
    );
    let p = &r.responses[0].partitions[0];
    let records = p.records.clone().unwrap_or_default();
    let found = shards::batch::records(&records).map_err(|e| format!("fetched batch: {e:?}"))?;
    match found.first() {
        Some(r) if r.offset == offset && r.value == Some(value.as_bytes()) => Ok(()),
        _ => Err(format!(
            "fetched at {offset} (error {}): {:?}, not the record produced",
            p.error_code,
            found.first()
        )),
    }
}

/// Deletes the topics fuzzed requests created (CreateTopics, auto-creation), so they cannot pile up.
fn prune_topics(port: u16) -> Result<(), String> {
    let mut s = connect(port);
    let r: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default().with_topics(None),
    );
    let extra: Vec<TopicName> = r
        .topics
        .iter()
        .filter_map(|t| t.name.clone())
        .filter(|n| {
            ![DATA_TOPIC, HEALTH_TOPIC].contains(&n.0.as_str()) && !POOL.contains(&n.0.as_str())
        })
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let r: DeleteTopicsResponse = call(
        &mut s,
        ApiKey::DeleteTopics,
        6,
        2,
        &DeleteTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(
                extra
                    .into_iter()
                    .map(|n| DeleteTopicState::default().with_name(Some(n)))
                    .collect(),
            ),
    );
    match r
        .responses
        .iter()
        .find(|t| t.error_code != 0 && t.error_code != 3)
    {
        Some(t) => Err(format!(
            "deleting fuzzed topic {:?}: error {}",
            t.name, t.error_code
        )),
        None => Ok(()),
    }
}

/// Runs `f`, turning a panic (a wire helper's timeout or assertion) into an error.
fn caught<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(p) => Err(format!(
            "{what}: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
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
        ],
        move |line| {
            // The panic hook's "panicked at", or the line of a panic caught per request.
            if line.contains("panicked") {
                log.panics.fetch_add(1, Ordering::SeqCst);
                log.panic_lines.lock().unwrap().push(line.to_string());
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
    let (health_port, led) = set_up(&ports);
    let metadata_port = ports[0];
    let generator = Generator {
        seed: config.seed,
        apis: advertised(ports[0]),
        cores: config.cores,
        led,
    };
    // The bound: what the broker holds after start-up and set-up, plus what its caches and response
    // budget (each per core) may legitimately grow to, plus 256 MiB for everything else it keeps per connection and
    // per topic (the fuzzer keeps at most `workers + MAX_SLOW` connections open, and prunes topics).
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
        } else if shared.panics.load(Ordering::SeqCst) > 0 {
            shared.fail("the broker panicked (see its log below)".into());
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
    let tried = shared.tried.load(Ordering::Relaxed);
    let summary = format!(
        "fuzz: seed {}: {tried} inputs in {elapsed:.1} s ({:.0}/s) over {} API versions; answered in \
         full {}, closed by the broker {}, slow (over 300 ms) {} ({} still waiting at the end, not checked); broker RSS {} MiB at start, peak {} \
         MiB, bound {} MiB",
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
        let in_flight: Vec<u64> = shared.in_flight.lock().unwrap().keys().copied().collect();
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
        for l in shared.panic_lines.lock().unwrap().iter().take(10) {
            report += &format!("broker log: {l}\n");
        }
        report += "broker log (last lines):\n";
        for l in shared.log_tail.lock().unwrap().iter() {
            report += &format!("  {l}\n");
        }
        panic!("{report}");
    }
    assert!(tried > 0);
    shoal.stop();
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
