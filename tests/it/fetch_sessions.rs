//! Fetch sessions (KIP-227) on the wire: a full fetch starts a session, an incremental one lists
//! only what changed and is answered only what changed, wrong epochs and unknown ids get Kafka's
//! errors, forgotten partitions leave the session, a session keeps topic names or ids, and the
//! per-core cache evicts by Kafka's rules. The counters in `/metrics` follow.

use crate::common;
use crate::kafka_raw::{batch, create_topic, produce};

use common::wire::{call, connect};
use common::Shoal;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::net::TcpStream;
use std::time::Duration;

const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A fetch in session `id` at `epoch` listing `(topic, partition, offset)` and forgetting
/// `(topic, partition)`, by topic name.
fn session_fetch(
    id: i32,
    epoch: i32,
    wanted: &[(&str, i32, i64)],
    forgotten: &[(&str, i32)],
    max_wait_ms: i32,
) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_id(id)
        .with_session_epoch(epoch)
        .with_topics(
            wanted
                .iter()
                .map(|&(t, p, offset)| {
                    FetchTopic::default()
                        .with_topic(name(t))
                        .with_partitions(vec![FetchPartition::default()
                            .with_partition(p)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(1 << 20)])
                })
                .collect(),
        )
        .with_forgotten_topics_data(
            forgotten
                .iter()
                .map(|&(t, p)| {
                    ForgottenTopic::default()
                        .with_topic(name(t))
                        .with_partitions(vec![p])
                })
                .collect(),
        )
}

/// Fetch v12 (topics by name) on `s`.
fn fetch(s: &mut TcpStream, correlation: i32, req: &FetchRequest) -> FetchResponse {
    call(s, ApiKey::Fetch, 12, correlation, req)
}

/// The (partition, record count) pairs of a response, in order.
fn answered(r: &FetchResponse) -> Vec<(i32, usize)> {
    r.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            let records = p.records.as_deref().unwrap_or_default();
            let n = if records.is_empty() {
                0
            } else {
                common::wire::record_values(records).len()
            };
            (p.partition_index, n)
        })
        .collect()
}

#[test]
fn a_session_is_answered_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "s", 3);
    let port = shoal.ports[0];
    produce(port, "s", 0, batch(&["a", "b"]));
    let mut s = connect(port);

    // A full fetch (id 0, epoch 0) starts a session and is answered every partition.
    let all = [("s", 0, 0), ("s", 1, 0), ("s", 2, 0)];
    let r = fetch(&mut s, 1, &session_fetch(0, 0, &all, &[], 0));
    assert_eq!(r.error_code, 0);
    let id = r.session_id;
    assert_ne!(id, 0, "a session was started");
    assert_eq!(answered(&r), [(0, 2), (1, 0), (2, 0)]);
    assert_eq!(shoal.metric("shoal_fetch_sessions"), 1);

    // Epoch 1, the client's position in partition 0 moved: nothing changed, nothing answered.
    let r = fetch(&mut s, 2, &session_fetch(id, 1, &[("s", 0, 2)], &[], 0));
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert_eq!(answered(&r), []);

    // Records arrive in partition 2 while epoch 2 waits: only partition 2 is answered.
    let mut waiting = connect(port);
    let req = session_fetch(id, 2, &[], &[], 5000);
    common::wire::send(&mut waiting, ApiKey::Fetch, 12, 3, &req);
    std::thread::sleep(Duration::from_millis(300));
    produce(port, "s", 2, batch(&["c"]));
    let r: FetchResponse = common::wire::recv_decoded(&mut waiting, ApiKey::Fetch, 12, 3);
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert_eq!(answered(&r), [(2, 1)]);

    // A session is not bound to a connection, but its epochs are: 2 again is refused (71), an id
    // this core never gave is not found (70). Both are answered with no partitions and id 0.
    let r = fetch(&mut s, 4, &session_fetch(id, 2, &[], &[], 0));
    assert_eq!(
        (r.error_code, r.session_id),
        (INVALID_FETCH_SESSION_EPOCH, 0)
    );
    assert!(r.responses.is_empty());
    let r = fetch(
        &mut s,
        5,
        &session_fetch(id.wrapping_add(1), 1, &[], &[], 0),
    );
    assert_eq!(
        (r.error_code, r.session_id),
        (FETCH_SESSION_ID_NOT_FOUND, 0)
    );

    // Partition 2 is forgotten: new records there are no longer answered, those of 1 are.
    let r = fetch(&mut s, 6, &session_fetch(id, 3, &[("s", 2, 1)], &[], 0));
    assert_eq!(answered(&r), []);
    let r = fetch(&mut s, 7, &session_fetch(id, 4, &[], &[("s", 2)], 0));
    assert_eq!(answered(&r), []);
    produce(port, "s", 2, batch(&["d"]));
    produce(port, "s", 1, batch(&["e"]));
    let r = fetch(&mut s, 8, &session_fetch(id, 5, &[], &[], 1000));
    assert_eq!(answered(&r), [(1, 1)]);

    assert!(shoal.metric("shoal_fetch_incremental_total") >= 5);
    assert!(shoal.metric("shoal_fetch_full_total") >= 1);
    // Epoch -1 closes the session and is answered in full, outside any session.
    let r = fetch(&mut s, 9, &session_fetch(id, -1, &all[..1], &[], 0));
    assert_eq!((r.error_code, r.session_id), (0, 0));
    assert_eq!(answered(&r), [(0, 2)]);
    assert_eq!(shoal.metric("shoal_fetch_sessions"), 0);
    let r = fetch(&mut s, 10, &session_fetch(id, 6, &[], &[], 0));
    assert_eq!(r.error_code, FETCH_SESSION_ID_NOT_FOUND);
    shoal.stop();
}

#[test]
fn a_session_keeps_the_topic_ids_it_began_with() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "ids", 1);
    let port = shoal.ports[0];
    produce(port, "ids", 0, batch(&["a"]));
    let mut s = connect(port);
    let m: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name("ids")))
        ])),
    );
    let mut req = session_fetch(0, 0, &[("ids", 0, 0)], &[], 0);
    req.topics[0].topic_id = m.topics[0].topic_id;
    let r: FetchResponse = call(&mut s, ApiKey::Fetch, 13, 2, &req);
    assert_eq!(r.error_code, 0);
    assert_ne!(r.session_id, 0);
    assert_eq!(r.responses[0].topic_id, m.topics[0].topic_id);
    assert_eq!(answered(&r), [(0, 1)]);
    // v13+ by id, the position moved past the record: nothing changed.
    let mut incremental = session_fetch(r.session_id, 1, &[("ids", 0, 1)], &[], 0);
    incremental.topics[0].topic_id = m.topics[0].topic_id;
    let again: FetchResponse = call(&mut s, ApiKey::Fetch, 13, 3, &incremental);
    assert_eq!((again.error_code, answered(&again)), (0, vec![]));
    // The same session by name (v12) is refused as Kafka refuses it.
    let mixed = fetch(&mut s, 4, &session_fetch(r.session_id, 2, &[], &[], 0));
    assert_eq!(mixed.error_code, FETCH_SESSION_TOPIC_ID_ERROR);
    shoal.stop();
}

#[test]
fn one_slot_goes_to_the_larger_session_or_to_a_newcomer_once_it_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--max-fetch-sessions-per-core",
        "1",
        "--fetch-session-eviction-ms",
        "3000",
    ];
    let shoal = Shoal::start(dir.path(), 1, &flags);
    create_topic(&shoal, "e", 3);
    let mut s = connect(shoal.ports[0]);
    let one = [("e", 0, 0)];
    let three = [("e", 0, 0), ("e", 1, 0), ("e", 2, 0)];

    let small = fetch(&mut s, 1, &session_fetch(0, 0, &one, &[], 0)).session_id;
    assert_ne!(small, 0);
    // As small as the session in the slot: no session, answered in full outside one.
    let r = fetch(&mut s, 2, &session_fetch(0, 0, &one, &[], 0));
    assert_eq!(
        (r.error_code, r.session_id, answered(&r)),
        (0, 0, vec![(0, 0)])
    );
    // Larger: it takes the slot, and the small session's next fetch finds it gone.
    let large = fetch(&mut s, 3, &session_fetch(0, 0, &three, &[], 0)).session_id;
    assert_ne!(large, 0);
    let r = fetch(&mut s, 4, &session_fetch(small, 1, &[], &[], 0));
    assert_eq!(r.error_code, FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!(shoal.metric("shoal_fetch_session_evictions_total"), 1);
    // Its client starts over with a full fetch: no room, and the large session keeps working.
    let r = fetch(&mut s, 5, &session_fetch(0, 0, &one, &[], 0));
    assert_eq!(r.session_id, 0);
    let r = fetch(&mut s, 6, &session_fetch(large, 1, &[], &[], 0));
    assert_eq!((r.error_code, r.session_id), (0, large));

    // Unused for longer than the eviction timeout, the large session yields to a small one.
    std::thread::sleep(Duration::from_millis(3500));
    let newcomer = fetch(&mut s, 7, &session_fetch(0, 0, &one, &[], 0)).session_id;
    assert_ne!(newcomer, 0);
    let r = fetch(&mut s, 8, &session_fetch(large, 2, &[], &[], 0));
    assert_eq!(r.error_code, FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!(shoal.metric("shoal_fetch_session_evictions_total"), 2);
    assert_eq!(shoal.metric("shoal_fetch_sessions"), 1);
    shoal.stop();
}

/// The broker's CPU time so far (user + system), in microseconds, from `/proc`.
fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    ticks * 1_000_000 / hz
}

/// `n` fetches of `req` one after another: (request bytes, response bytes, broker CPU in us),
/// each per fetch. `next` makes each fetch's request from its index.
fn measure(
    s: &mut TcpStream,
    pid: u32,
    n: usize,
    next: &mut dyn FnMut() -> FetchRequest,
) -> (usize, usize, u64) {
    let (mut sent, mut received) = (0, 0);
    let cpu = cpu_us(pid);
    for i in 0..n {
        let frame = common::wire::request_frame(ApiKey::Fetch, 12, i as i32, &next());
        sent += frame.len();
        std::io::Write::write_all(s, &frame).unwrap();
        let body = common::wire::recv(s).expect("a response");
        received += body.len() + 4;
        let r: FetchResponse = common::wire::decode(ApiKey::Fetch, 12, i as i32, body);
        assert_eq!(r.error_code, 0);
    }
    let cpu = cpu_us(pid) - cpu;
    (sent / n, received / n, cpu / n as u64)
}

/// The figure: a consumer of 1,000 partitions idling at the tail, in a session and outside one,
/// in the same run (alternating rounds). Request and response bytes per fetch are exact; the
/// broker's CPU per fetch is printed beside its ratio.
#[test]
fn an_idle_consumer_of_1000_partitions_sends_and_costs_less_in_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    create_topic(&shoal, "idle", 1000);
    let pid = shoal.pid();
    let all: Vec<(&str, i32, i64)> = (0..1000).map(|p| ("idle", p, 0)).collect();
    let mut s = connect(shoal.ports[0]);
    let r = fetch(&mut s, 1, &session_fetch(0, 0, &all, &[], 0));
    let (id, mut epoch) = (r.session_id, 1);
    assert_ne!(id, 0);
    let (mut full, mut incremental) = ((0, 0, 0), (0, 0, 0));
    let rounds = 3;
    for _ in 0..rounds {
        let f = measure(&mut s, pid, 100, &mut || session_fetch(0, -1, &all, &[], 0));
        let i = measure(&mut s, pid, 100, &mut || {
            epoch += 1;
            session_fetch(id, epoch - 1, &[], &[], 0)
        });
        full = (f.0, f.1, full.2 + f.2);
        incremental = (i.0, i.1, incremental.2 + i.2);
    }
    let (full_cpu, incremental_cpu) = (full.2 / rounds, incremental.2 / rounds);
    println!(
        "idle consumer of 1000 partitions, per fetch: request bytes full {} / incremental {} \
         (x{:.0}), response bytes {} / {} (x{:.0}), broker CPU {} us / {} us (x{:.1})",
        full.0,
        incremental.0,
        full.0 as f64 / incremental.0 as f64,
        full.1,
        incremental.1,
        full.1 as f64 / incremental.1 as f64,
        full_cpu,
        incremental_cpu,
        full_cpu as f64 / incremental_cpu.max(1) as f64,
    );
    assert!(incremental.0 * 100 < full.0, "{incremental:?} vs {full:?}");
    assert!(incremental.1 * 100 < full.1, "{incremental:?} vs {full:?}");
    assert!(incremental_cpu < full_cpu, "{incremental:?} vs {full:?}");
    shoal.stop();
}
