//! Sending inputs, each on its own connection, and waiting (bounded) for the broker to answer or
//! close it: briefly in the worker that sent it, then, for a slow answer, in [`wait_for_slow`].

use super::answers::check_answers;
use super::inputs::{describe, sentinel, Generator, Input, Session};
use super::mutate::{self, Rng};
use super::requests;
use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, InitProducerIdResponse, JoinGroupResponse, ResponseHeader};
use kafka_protocol::protocol::Decodable;
use std::collections::{BTreeSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an input's connection may stay open without being answered or closed: a Fetch may wait
/// 30 s (the broker's cap on `max_wait_ms`), a JoinGroup of its own group is answered at once.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(45);
/// Connections waiting for a slow answer, at most (beyond it, workers wait themselves).
const MAX_SLOW: usize = 512;

/// What the run has seen, shared by the workers, the waiter for slow answers and the health checks.
#[derive(Debug, Default)]
pub struct Shared {
    pub stop: AtomicBool,
    pub tried: AtomicU64,
    pub answered: AtomicU64,
    pub closed: AtomicU64,
    pub slow: AtomicU64,
    /// Slow inputs still waiting when the run ended (not checked).
    pub unsettled: AtomicU64,
    pub failure: Mutex<Option<String>>,
    /// Inputs sent and not yet settled.
    pub in_flight: Mutex<BTreeSet<u64>>,
    /// Connections waiting for an answer.
    pub waiting: Mutex<Vec<Pending>>,
    pub alarms: AtomicUsize,
    /// The broker's log lines that tell of a panic or an error.
    pub alarm_lines: Mutex<Vec<String>>,
    pub log_tail: Mutex<VecDeque<String>>,
}

impl Shared {
    pub fn fail(&self, what: String) {
        let mut f = self.failure.lock().unwrap();
        if f.is_none() {
            *f = Some(what);
        }
        self.stop.store(true, Ordering::SeqCst);
    }
    pub fn failed(&self) -> bool {
        self.failure.lock().unwrap().is_some()
    }
}

/// An input's connection, written and half-closed, waiting for the broker to answer and close.
#[derive(Debug)]
pub struct Pending {
    pub input: Input,
    pub sent: Vec<u8>,
    pub stream: TcpStream,
    pub received: Vec<u8>,
    /// The connection ended with a reset, not an orderly close: the broker closed it with bytes of
    /// ours unread (after a frame it refused), and the kernel dropped what it had not sent yet.
    pub reset: bool,
    pub deadline: Instant,
}

/// Reads what is there; `Some` once the broker has closed the connection.
pub fn pump(p: &mut Pending) -> Option<()> {
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

pub fn settle(shared: &Shared, p: &Pending, seed: u64) {
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

/// Reads one response frame (a session's first answer; size prefix included) into `received`,
/// waiting at most 10 s.
pub fn read_response(stream: &mut TcpStream, received: &mut Vec<u8>) -> Result<Bytes, String> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .map_err(|e| format!("reading a session's answer: {e}"))?;
    let n = i32::from_be_bytes(size);
    if !(4..=1 << 20).contains(&n) {
        return Err(format!("a session's answer of size {n}"));
    }
    let mut frame = vec![0u8; n as usize];
    stream
        .read_exact(&mut frame)
        .map_err(|e| format!("reading a session's answer: {e}"))?;
    received.extend_from_slice(&size);
    received.extend_from_slice(&frame);
    Ok(Bytes::from(frame))
}

/// Starts the session: sends its first request (see [`start_group_session`] and
/// [`start_txn_session`]), then generates the rest of the session from the answer into
/// `input.bytes`, one request of it mutated nine times in ten. Returns the requests sent.
pub fn start_session(
    stream: &mut TcpStream,
    input: &mut Input,
    apis: &[(ApiKey, i16)],
    received: &mut Vec<u8>,
) -> Result<Vec<u8>, String> {
    let session = input.session.clone().unwrap();
    let (mut sent, mut rng, mut frames) = match &session {
        Session::Group { rng, group } => {
            start_group_session(stream, input, apis, received, rng.clone(), group)?
        }
        Session::Txn { rng, id } => {
            start_txn_session(stream, input, apis, received, rng.clone(), id)?
        }
    };
    let n = frames.len();
    let mut mutated = None;
    if n > 0 && !rng.one_in(10) {
        let (j, o) = (rng.below(n), rng.below(n));
        let other = frames[o].clone();
        let (m, what) = mutate::mutate(&mut rng, &frames[j], &other);
        frames[j] = m;
        mutated = Some(j);
        input.notes.push(format!(
            "session request {} of {n}: {}",
            j + 1,
            what.join(", ")
        ));
    }
    // A transactional producer waits for each answer before its next request (its batches
    // before EndTxn, AddPartitionsToTxn before its batches): so do three transaction sessions in
    // four, up to the mutated request; the fourth sends them all at once, which the broker
    // handles concurrently.
    if matches!(session, Session::Txn { .. }) && n > 0 && !rng.one_in(4) {
        let upto = mutated.unwrap_or(n - 1);
        for frame in frames.drain(..upto) {
            stream
                .write_all(&frame)
                .map_err(|e| format!("sending a session's request: {e}"))?;
            sent.extend_from_slice(&frame);
            read_response(stream, received)?;
        }
    }
    input.bytes = frames.concat();
    Ok(sent)
}

/// The requests a session sent first, its generator, and the rest of it.
type Started = (Vec<u8>, Rng, Vec<Vec<u8>>);

/// Sends a transaction session's InitProducerId (again while the broker answers
/// CONCURRENT_TRANSACTIONS: an earlier session's transaction on the same id is being ended), and
/// generates the transaction from the producer id and epoch answered.
fn start_txn_session(
    stream: &mut TcpStream,
    input: &Input,
    apis: &[(ApiKey, i16)],
    received: &mut Vec<u8>,
    mut rng: Rng,
    id: &str,
) -> Result<Started, String> {
    const CONCURRENT_TRANSACTIONS: i16 = 51;
    let v = input.version;
    let mut sent = Vec::new();
    let init = input.bytes.clone();
    let mut tries = 0;
    let answer = loop {
        stream
            .write_all(&init)
            .map_err(|e| format!("sending an InitProducerId: {e}"))?;
        sent.extend_from_slice(&init);
        let mut frame = read_response(stream, received)?;
        ResponseHeader::decode(
            &mut frame,
            ApiKey::InitProducerId.response_header_version(v),
        )
        .map_err(|e| e.to_string())?;
        let r = InitProducerIdResponse::decode(&mut frame, v).map_err(|e| e.to_string())?;
        tries += 1;
        if r.error_code == CONCURRENT_TRANSACTIONS && tries < 50 {
            // The same request again (answers come in order: the same correlation id is clear).
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if r.error_code != 0 {
            return Err(format!(
                "InitProducerId v{v} of transactional id {id} (its own) answered error {} after \
                 {tries} tries",
                r.error_code
            ));
        }
        break r;
    };
    let frames = requests::txn_session(
        &mut rng,
        apis,
        id,
        answer.producer_id.0,
        answer.producer_epoch,
    );
    Ok((sent, rng, frames))
}

/// Joins the session's group (twice for v4+, which first hands out a member id), and generates
/// what the member does from the answer.
fn start_group_session(
    stream: &mut TcpStream,
    input: &Input,
    apis: &[(ApiKey, i16)],
    received: &mut Vec<u8>,
    mut rng: Rng,
    group: &str,
) -> Result<Started, String> {
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
            join = requests::join(v, 2, group, &r.member_id);
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
    let frames = requests::session(
        &mut rng,
        apis,
        group,
        &answer.member_id,
        answer.generation_id,
        leader,
    );
    Ok((sent, rng, frames))
}

/// Sends one input (and the ApiVersions after it), half-closes, and waits briefly for the broker to
/// answer and close; a slow one is left to [`wait_for_slow`].
pub fn run_input(shared: &Shared, ports: &[u16], mut input: Input, generator: &Generator) {
    let seed = generator.seed;
    shared.in_flight.lock().unwrap().insert(input.index);
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
    // The broker may close early: a frame it refuses ends the connection, and with bytes of ours
    // still unread its kernel resets it (this write's error reports that, not a later read).
    let mut reset = false;
    match written {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
            reset = true
        }
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
        reset,
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
pub fn wait_for_slow(shared: &Shared, seed: u64) {
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
