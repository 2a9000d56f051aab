//! One subscriber: from its next offset in each partition it reads (one, or every partition of a
//! topic merged) it reads the log (the tail cache at the tail) or a view's shard, takes each
//! batch's shared frame, and writes all it has in one vectored write; at the end it waits for a
//! high watermark (or a last stable offset) to move, sending heartbeats while idle. Its state is a
//! position per partition and the frames it is writing: a slow subscriber holds no queue, it falls
//! behind in the log, and the slow rule decides what happens then.

use super::encode::{close_batch, heartbeat, stream_message, ws_close, Encoding, Protocol};
use super::frames::Source;
use super::lane::{Lane, LaneRead};
use super::request::{event_ids, Slow};
use super::websocket::{ClientFrame, ClientFrames, CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_POLICY};
use super::Hub;
use crate::cores::Core;
use crate::metrics::add;
use crate::wire::SharedStream;
use bytes::Bytes;
use futures_lite::AsyncReadExt;
use kafka_protocol::error::ResponseError;
use shards::OffsetMonitor;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// What a subscriber reads and how it writes it.
#[derive(Debug)]
pub struct Subscription {
    /// The topic (or view) as asked.
    pub topic: String,
    /// One lane, or every partition of the topic for a merged stream.
    pub lanes: Vec<Lane>,
    /// A merged stream: partitions the topic gained, joined (from their start) once served here.
    pub merged: bool,
    pub joining: Vec<i32>,
    pub encoding: Encoding,
    pub read_committed: bool,
    pub slow: Slow,
    /// A write found the client's socket full since its lag last shrank (it reads slower than
    /// it is written).
    pub waited: bool,
    /// Bytes ahead of it at the last look (estimated): a lag that shrinks is not slowness.
    pub ahead: f64,
    /// Looks in a row that found it behind (see [`BEHIND_ROUNDS`]), and when it was last looked at.
    pub behind_rounds: u32,
    pub looked: Instant,
    /// Who reads, from where, and the topic table's revision their right to was last checked at:
    /// a change of the ACLs ends the stream of one who may no longer read.
    pub principal: String,
    pub host: String,
    pub revision: u64,
    /// The token it was opened with, and the tokens file's reading it was last checked against.
    pub token: Option<String>,
    pub tokens_read: u64,
}

impl Subscription {
    /// A merged stream's id: where every partition stands.
    fn ids(&self, out: &mut Vec<u8>) {
        out.clear();
        event_ids(self.lanes.iter().map(|l| (l.index(), l.next - 1)), out);
    }

    /// The members a stream message adds to name the position it leaves the stream at: a
    /// merged stream's `"id"` (SSE also sets it as the event's id).
    fn id_member(&self) -> String {
        if !self.merged {
            return String::new();
        }
        let mut ids = Vec::new();
        self.ids(&mut ids);
        format!(",\"id\":\"{}\"", String::from_utf8_lossy(&ids))
    }

    /// A stream message (a gap, the slow one's last word); a merged stream's also carries the id
    /// the stream stands at after it, as its SSE event id too.
    fn message(&self, event: &str, data: &str) -> Vec<u8> {
        let data = format!("{data}{}", self.id_member());
        let mut msg = stream_message(self.encoding.protocol, event, &data);
        if self.merged && self.encoding.protocol == Protocol::Sse {
            let mut ids = Vec::new();
            self.ids(&mut ids);
            msg.truncate(msg.len() - 1);
            msg.extend_from_slice(b"id: ");
            msg.extend_from_slice(&ids);
            msg.extend_from_slice(b"\n\n");
        }
        msg
    }
}

/// Looks in a row (one a second) a subscriber must be found behind before the slow rule
/// applies: one long write (a large burst, a distant client) is not slowness; a lag that grows is.
pub const BEHIND_ROUNDS: u32 = 2;
/// How often a subscriber's lag is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What the client did, as the task reading its side of the connection saw it.
#[derive(Debug)]
enum FromClient {
    /// A WebSocket ping: answered with a pong of the same payload.
    Ping(Vec<u8>),
    Pong,
    /// The client closed (a WebSocket close frame, with its code; or the connection's end).
    Closed(Option<u16>),
    /// A WebSocket frame broke the RFC: closed with this code and reason.
    Broken(u16, &'static str),
}

/// Why the stream ended.
enum End {
    Client(Option<u16>),
    Broken(u16, &'static str),
    Slow,
    Stopping,
    /// The partition is no longer served here.
    Moved,
    /// The reader may no longer read the topic (the ACLs changed).
    Refused,
    Failed(String),
}

/// Serves `sub` on `out` until the client leaves, the server stops, or the subscriber falls
/// behind (`slow=disconnect`) or stops reading.
pub async fn run(core: &Rc<Core>, hub: &Hub, out: SharedStream, mut sub: Subscription) {
    let inbox = Rc::new(Inbox::default());
    let reader = glommio::spawn_local(read_client(
        out.clone(),
        sub.encoding.protocol,
        inbox.clone(),
    ));
    let conn = crate::replicas::connection_id();
    let mut out = out;
    let mut counted = Counted::new(core, &sub);
    let end = serve(core, hub, &mut out, &mut sub, conn, &inbox, &mut counted).await;
    drop(counted);
    core.replicas.connection_closed(conn);
    if let End::Failed(why) = &end {
        log::warn!("core {}: a stream of {} ended: {why}", core.id(), sub.topic);
    }
    // After a slow or stalled subscriber nothing more is written: a write may have stopped in the
    // middle of a frame (the slow rule's own last words were written with it).
    let last = match (sub.encoding.protocol, &end) {
        (Protocol::WebSocket, End::Client(code)) => Some(ws_close(echoed(*code), "")),
        (Protocol::WebSocket, End::Broken(code, why)) => Some(ws_close(*code, why)),
        (Protocol::WebSocket, End::Stopping) => Some(ws_close(CLOSE_GOING_AWAY, "server stopping")),
        (Protocol::WebSocket, End::Refused) => Some(ws_close(CLOSE_POLICY, "not allowed")),
        (Protocol::Sse, End::Refused) => Some(stream_message(
            Protocol::Sse,
            "error",
            "\"error\":\"no longer allowed to read this topic\"",
        )),
        (Protocol::WebSocket, End::Moved) => {
            Some(ws_close(CLOSE_GOING_AWAY, "partition moved: resume"))
        }
        (Protocol::WebSocket, End::Failed(_)) => Some(ws_close(1011, "internal error")),
        (Protocol::Sse, End::Failed(_)) => Some(stream_message(
            Protocol::Sse,
            "error",
            "\"error\":\"internal error: see the broker's log\"",
        )),
        _ => None,
    };
    if let Some(last) = last {
        let _ = write_within(&mut out, &[Bytes::from(last)], Duration::from_secs(1)).await;
    }
    drop(reader);
}

/// What a stream counts while it lives: its topic's streams, and for each partition it reads the
/// streams that hold a read replica of it here. Undone when dropped, also when a panic unwinds
/// the stream.
struct Counted {
    core: Rc<Core>,
    topic: String,
    logs: Vec<u64>,
}

impl Counted {
    fn new(core: &Rc<Core>, sub: &Subscription) -> Counted {
        core.http.topic_opened(&sub.topic);
        let mut counted = Counted {
            core: core.clone(),
            topic: sub.topic.clone(),
            logs: Vec::new(),
        };
        for lane in &sub.lanes {
            counted.add(lane.part.log.id());
        }
        counted
    }

    fn add(&mut self, log: u64) {
        self.core.replicas.stream_opened(log);
        self.logs.push(log);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.core.http.topic_closed(&self.topic);
        for &log in &self.logs {
            self.core.replicas.stream_closed(log);
        }
    }
}

/// The close code answering a client's close: its own where the RFC lets it be sent, 1000 for a
/// close without one, 1002 for one that may not appear on the wire (1005, 1006, 1015, unassigned).
fn echoed(code: Option<u16>) -> u16 {
    match code {
        None => CLOSE_NORMAL,
        Some(c @ (1000..=1003 | 1007..=1011 | 3000..=4999)) => c,
        Some(_) => super::websocket::CLOSE_PROTOCOL_ERROR,
    }
}

/// After a change of the topic table (ACLs among it) or of the tokens file: whether the subscriber
/// may still read (its token still names it); the end of its stream if not.
fn recheck(core: &Core, hub: &Hub, sub: &mut Subscription) -> Option<End> {
    if let Some(token) = &sub.token {
        if hub.tokens_read.get() != sub.tokens_read {
            sub.tokens_read = hub.tokens_read.get();
            let tokens = core.security.tokens.last();
            let still = tokens.user_of(token).map(|u| format!("User:{u}"));
            if still.as_deref() != Some(sub.principal.as_str()) {
                return Some(End::Refused);
            }
        }
    }
    let table = core.topics();
    if table.revision == sub.revision {
        return None;
    }
    sub.revision = table.revision;
    let who = super::Who {
        principal: &sub.principal,
        host: &sub.host,
    };
    let source = crate::table::source_topic(&sub.topic).unwrap_or(&sub.topic);
    if !super::may_read(core, hub, who, source) {
        return Some(End::Refused);
    }
    if sub.merged {
        // Partitions the topic gained join the merged stream.
        let count = table.get(source).map_or(0, |m| m.partitions);
        let known = sub.lanes.len() + sub.joining.len();
        sub.joining.extend(known as i32..count);
    }
    None
}

/// A merged stream's partitions not served here yet: joined from their start once this core
/// holds them (a read replica asked of their owner meanwhile).
async fn join(core: &Core, sub: &mut Subscription, counted: &mut Counted) {
    let mut still = Vec::new();
    for p in std::mem::take(&mut sub.joining) {
        match Lane::here(core, &sub.topic, p) {
            Ok(mut lane) => {
                let rc = sub.read_committed;
                let Ok(start) = lane.start_offset(super::request::Start::Earliest, rc).await else {
                    still.push(p);
                    continue;
                };
                lane.next = start;
                counted.add(lane.part.log.id());
                sub.lanes.push(lane);
            }
            Err(ResponseError::NotLeaderOrFollower) => {
                if let Some(owner) = core.data_owner(&sub.topic, p) {
                    core.replicas.ask_for(
                        owner,
                        crate::table::source_topic(&sub.topic).unwrap_or(""),
                        p,
                    );
                }
                still.push(p);
            }
            Err(_) => {}
        }
    }
    sub.lanes.sort_by_key(Lane::index);
    sub.joining = still;
}

/// The stream's loop; returns why it ended.
async fn serve(
    core: &Rc<Core>,
    hub: &Hub,
    out: &mut SharedStream,
    sub: &mut Subscription,
    conn: u64,
    from_client: &Inbox,
    counted: &mut Counted,
) -> End {
    let protocol = sub.encoding.protocol;
    let heartbeat_every = hub.config.heartbeat;
    let stall = (heartbeat_every * 3).max(Duration::from_secs(5));
    let mut last_write = Instant::now();
    let mut ping_unanswered = false;
    let mut caught_up = false;
    let mut noted = Instant::now() - Duration::from_secs(3600);
    loop {
        if let Some(end) = answer_client(out, from_client, stall, &mut ping_unanswered).await {
            return end;
        }
        if core.is_shutting_down() {
            return End::Stopping;
        }
        // A partition closed under the stream (a read replica stopped, the topic deleted or
        // re-created): the client resumes with its last id and is served where the partition is.
        if sub.lanes.iter().any(|l| l.part.log.is_closed()) {
            return End::Moved;
        }
        // A subscriber catching up from the tail cache never waits: others get the core too.
        glommio::yield_if_needed().await;
        let now = Instant::now();
        if now.duration_since(noted) >= crate::replicas::TICK {
            if let Some(end) = recheck(core, hub, sub) {
                return end;
            }
            if !sub.joining.is_empty() {
                join(core, sub, counted).await;
            }
            // Counts as a consumer of the partitions here, as a Kafka fetch would (read replicas
            // start for partitions streamed to many).
            for lane in &sub.lanes {
                core.replicas.note_fetch(&lane.part, conn, now);
            }
            noted = now;
        }
        // Retention or compaction's deletion passed the subscriber: it is told what it missed.
        if let Some(i) = sub.lanes.iter().position(Lane::passed) {
            let from = sub.lanes[i].next;
            sub.lanes[i].next = sub.lanes[i].part.log.log_start_offset();
            if !send_gap(out, sub, i, from, stall).await {
                return End::Slow;
            }
            continue;
        }
        let rc = sub.read_committed;
        if sub.lanes.iter().any(|l| l.pending(rc)) {
            match send_some(core, hub, out, sub, caught_up, stall).await {
                Sent::Wrote => last_write = Instant::now(),
                Sent::Nothing => glommio::timer::sleep(Duration::from_millis(10)).await,
                Sent::Behind => {
                    if let Some(end) = fall_behind(core, out, sub, stall).await {
                        return end;
                    }
                }
                Sent::Stalled => {
                    add(&core.http.slow_disconnects, 1);
                    return End::Slow;
                }
                Sent::Failed(why) => return End::Failed(why),
            }
            continue;
        }
        caught_up = true;
        let idle_for = last_write.elapsed();
        if idle_for >= heartbeat_every {
            if protocol == Protocol::WebSocket {
                if ping_unanswered {
                    return End::Broken(CLOSE_POLICY, "ping unanswered");
                }
                ping_unanswered = true;
            }
            if !write_within(out, &[Bytes::from(heartbeat(protocol))], stall).await {
                add(&core.http.slow_disconnects, 1);
                return End::Slow;
            }
            last_write = Instant::now();
            continue;
        }
        let wait = heartbeat_every
            .saturating_sub(idle_for)
            .min(crate::replicas::TICK);
        idle(core, sub, from_client, wait).await;
    }
}

/// Acts on what the client sent (pings answered, pongs noted); the end of the stream if the
/// client closed or broke the protocol.
async fn answer_client(
    out: &mut SharedStream,
    from_client: &Inbox,
    stall: Duration,
    ping_unanswered: &mut bool,
) -> Option<End> {
    while let Some(msg) = from_client.take() {
        match msg {
            FromClient::Ping(payload) => {
                let mut pong = Vec::new();
                super::encode::ws_frame(super::encode::OP_PONG, &payload, &mut pong);
                if !write_within(out, &[Bytes::from(pong)], stall).await {
                    return Some(End::Slow);
                }
            }
            FromClient::Pong => *ping_unanswered = false,
            FromClient::Closed(code) => return Some(End::Client(code)),
            FromClient::Broken(code, why) => return Some(End::Broken(code, why)),
        }
    }
    None
}

/// The slow rule, for a subscriber that fell more than the stream buffer behind: disconnected
/// with a last event that says so, or skipped to the end of each partition with a gap event.
async fn fall_behind(
    core: &Core,
    out: &mut SharedStream,
    sub: &mut Subscription,
    stall: Duration,
) -> Option<End> {
    let protocol = sub.encoding.protocol;
    match sub.slow {
        Slow::Disconnect => {
            add(&core.http.slow_disconnects, 1);
            let lane = &sub.lanes[0];
            let data = if sub.merged {
                String::from("\"error\":\"too slow\"")
            } else {
                format!(
                    "\"partition\":{},\"next_offset\":{},\"high_watermark\":{}",
                    lane.index(),
                    lane.next,
                    lane.part.log.high_watermark()
                )
            };
            let mut last = vec![Bytes::from(sub.message("slow", &data))];
            if protocol == Protocol::WebSocket {
                last.push(Bytes::from(ws_close(CLOSE_POLICY, "too slow")));
            }
            let _ = write_within(out, &last, Duration::from_secs(1)).await;
            Some(End::Slow)
        }
        Slow::Skip => {
            let rc = sub.read_committed;
            for i in 0..sub.lanes.len() {
                let (from, end) = (sub.lanes[i].next, sub.lanes[i].end(rc));
                if from >= end {
                    continue;
                }
                sub.lanes[i].next = end;
                add(&core.http.gaps, 1);
                if !send_gap(out, sub, i, from, stall).await {
                    return Some(End::Slow);
                }
            }
            None
        }
    }
}

/// Waits at most `wait` for more to read in any partition, a word from the client, or the
/// server's stop.
async fn idle(core: &Core, sub: &Subscription, from_client: &Inbox, wait: Duration) {
    let rc = sub.read_committed;
    let any_moved = async {
        // One partition (most streams): its monitor alone, nothing allocated per wait.
        if let [lane] = &sub.lanes[..] {
            lane.monitor(rc).wait_for(lane.next + 1).await;
            return;
        }
        let mut moved: Vec<Pin<Box<dyn Future<Output = bool>>>> = sub
            .lanes
            .iter()
            .map(|lane| {
                let (monitor, next) = (lane.monitor(rc), lane.next);
                Box::pin(async move { monitor.wait_for(next + 1).await })
                    as Pin<Box<dyn Future<Output = bool>>>
            })
            .collect();
        std::future::poll_fn(|cx| {
            for m in moved.iter_mut() {
                if m.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        })
        .await;
    };
    let timer = async {
        glommio::timer::sleep(wait).await;
    };
    let stopping = async {
        core.shutdown().wait_for(1).await;
    };
    futures_lite::future::or(
        futures_lite::future::or(any_moved, from_client.wait()),
        futures_lite::future::or(timer, stopping),
    )
    .await;
}

/// What one round of reading and writing did.
enum Sent {
    Wrote,
    /// Nothing was read or written, and the position did not move: wait a little.
    Nothing,
    /// More than the stream buffer lies ahead of a subscriber that had caught up.
    Behind,
    /// A write did not finish in time: the client does not read.
    Stalled,
    Failed(String),
}

/// What a round of reading gathered to write in one go.
#[derive(Default)]
struct Round {
    chunks: Vec<Bytes>,
    records: u64,
    bytes: u64,
    frames: u64,
    /// Scratch for a merged stream's ids.
    ids: Vec<u8>,
}

/// Reads each partition from the subscriber's next offset up to its end (at most the stream
/// buffer in all), and writes the batches' frames in one vectored write.
async fn send_some(
    core: &Rc<Core>,
    hub: &Hub,
    out: &mut SharedStream,
    sub: &mut Subscription,
    caught_up: bool,
    stall: Duration,
) -> Sent {
    let budget = hub.config.stream_buffer_bytes;
    let per_lane = (budget / sub.lanes.len().max(1)).max(64 << 10);
    let starts: Vec<i64> = sub.lanes.iter().map(|l| l.next).collect();
    let mut round = Round::default();
    let mut ahead = 0.0;
    let rc = sub.read_committed;
    for (i, &start) in starts.iter().enumerate() {
        if !sub.lanes[i].pending(rc) {
            continue;
        }
        let mut read = match sub.lanes[i].read(core, per_lane, rc).await {
            Ok(read) => read,
            Err(shards::Error::OffsetOutOfRange {
                log_start_offset,
                high_watermark,
                ..
            }) => {
                out_of_range(sub, i, log_start_offset, high_watermark, &mut round);
                continue;
            }
            Err(e) => return Sent::Failed(format!("reading the log: {e}")),
        };
        if let Err(why) = take_batches(core, hub, sub, i, &mut read, &mut round) {
            return Sent::Failed(why);
        }
        let next = sub.lanes[i].next;
        let per_offset = read.read.records.len as f64 / (next - start).max(1) as f64;
        ahead += (read.end - next).max(0) as f64 * per_offset;
    }
    if behind(sub, ahead, caught_up && budget > 0, budget) {
        // Put the positions back: the slow rule decides from where it goes on.
        for (lane, start) in sub.lanes.iter_mut().zip(starts) {
            lane.next = start;
        }
        sub.behind_rounds = 0;
        return Sent::Behind;
    }
    if round.chunks.is_empty() {
        let moved = sub.lanes.iter().zip(&starts).any(|(l, s)| l.next != *s);
        return if moved { Sent::Wrote } else { Sent::Nothing };
    }
    let write = async { out.write_chunks_full(&round.chunks).await.ok() };
    let written = futures_lite::future::or(write, async {
        glommio::timer::sleep(stall).await;
        None
    })
    .await;
    let Some(full) = written else {
        return Sent::Stalled;
    };
    sub.waited |= full;
    add(&core.http.frames_sent, round.frames);
    add(&core.http.records_sent, round.records);
    add(&core.http.bytes_sent, round.bytes);
    Sent::Wrote
}

/// Edge mode: lane `i`'s offset is outside what the upstream holds (it was deleted there, or a
/// resume id names more than it has): the lane goes to the upstream's start, with a gap, or to
/// its end.
fn out_of_range(sub: &mut Subscription, i: usize, start: i64, end: i64, round: &mut Round) {
    let lane = &mut sub.lanes[i];
    if lane.edge.is_none() {
        // The local log's start passed it: the loop's own check tells the subscriber.
        return;
    }
    let from = lane.next;
    if from < start {
        lane.next = start;
        let data = format!(
            "\"partition\":{},\"from\":{from},\"to\":{}",
            lane.index(),
            start - 1
        );
        round.chunks.push(Bytes::from(sub.message("gap", &data)));
    } else {
        lane.next = end;
    }
}

/// The frames cache's name for what `lane` reads.
fn source(lane: &Lane) -> Source {
    Source {
        log: lane.part.log.id(),
        view: lane.view.as_ref().map_or((0, 0), |v| (v.1, v.2)),
    }
}

/// Lane `i`'s batches in `read`, up to its end: their shared frames added to `round` (a merged
/// stream's each closed with the ids after it), and the lane's position moved past them.
fn take_batches(
    core: &Core,
    hub: &Hub,
    sub: &mut Subscription,
    i: usize,
    read: &mut LaneRead,
    round: &mut Round,
) -> Result<(), String> {
    let lane = &sub.lanes[i];
    let end = read.end;
    let (source, index) = (source(lane), lane.index());
    for (h, batch) in read.read.records.batches() {
        let next = sub.lanes[i].next;
        if h.base_offset >= end {
            // Nothing lies between `next` and this batch (compacted away): the stream is at `end`.
            sub.lanes[i].next = next.max(end.min(h.base_offset));
            break;
        }
        if h.last_offset() < next {
            continue;
        }
        sub.lanes[i].next = h.last_offset() + 1;
        if read.aborts.aborted(&h) {
            continue;
        }
        let frame = hub
            .frames
            .frame(&core.http, source, sub.encoding, index, &h, &batch, next)
            .map_err(|e| format!("a batch at offset {} cannot be read: {e}", h.base_offset))?;
        if frame.bytes.is_empty() {
            continue;
        }
        round.records += u64::from(frame.records);
        round.bytes += frame.bytes.len() as u64;
        round.frames += 1;
        if sub.encoding.whole_batches {
            // The message closes with where the whole stream stands after it.
            sub.ids(&mut round.ids);
            let (before, after) = close_batch(sub.encoding.protocol, frame.bytes.len(), &round.ids);
            if !before.is_empty() {
                round.chunks.push(Bytes::from(before));
            }
            round.chunks.push(frame.bytes);
            round.chunks.push(Bytes::from(after));
        } else {
            round.chunks.push(frame.bytes);
        }
    }
    Ok(())
}

/// Whether the subscriber is behind, judged once a second: more than the buffer `ahead` of it
/// (estimated from this read's bytes per offset), after it had caught up (`caught_up`), a lag
/// that did not shrink since the last look, and a socket found full in between, for
/// [`BEHIND_ROUNDS`] looks in a row (a client that keeps up, or works off a burst, is not slow).
fn behind(sub: &mut Subscription, ahead: f64, caught_up: bool, budget: usize) -> bool {
    if sub.looked.elapsed() >= LOOK_EVERY {
        sub.looked = Instant::now();
        let growing = caught_up && ahead > budget as f64 && ahead >= sub.ahead && sub.waited;
        sub.ahead = ahead;
        sub.waited = false;
        sub.behind_rounds = if growing { sub.behind_rounds + 1 } else { 0 };
    }
    sub.behind_rounds >= BEHIND_ROUNDS
}

/// Tells the subscriber it will not get offsets `from` up to lane `i`'s next offset (excluded).
async fn send_gap(
    out: &mut SharedStream,
    sub: &Subscription,
    i: usize,
    from: i64,
    stall: Duration,
) -> bool {
    let lane = &sub.lanes[i];
    let data = format!(
        "\"partition\":{},\"from\":{from},\"to\":{}",
        lane.index(),
        lane.next - 1
    );
    write_within(out, &[Bytes::from(sub.message("gap", &data))], stall).await
}

/// Writes `chunks`, giving up after `limit` (the client does not read); whether all were written.
async fn write_within(out: &mut SharedStream, chunks: &[Bytes], limit: Duration) -> bool {
    let write = async { out.write_chunks(chunks).await.is_ok() };
    futures_lite::future::or(write, async {
        glommio::timer::sleep(limit).await;
        false
    })
    .await
}

/// What the client's reader has seen and the stream's loop has not taken yet.
#[derive(Default)]
struct Inbox {
    messages: RefCell<VecDeque<FromClient>>,
    /// Messages put in so far.
    count: OffsetMonitor,
    /// Messages taken so far.
    taken: std::cell::Cell<i64>,
}

impl Inbox {
    fn put(&self, msg: FromClient) {
        self.messages.borrow_mut().push_back(msg);
        self.count.advance(self.count.value() + 1);
    }

    fn take(&self) -> Option<FromClient> {
        let msg = self.messages.borrow_mut().pop_front()?;
        self.taken.set(self.taken.get() + 1);
        Some(msg)
    }

    /// Until a message not taken yet is in.
    async fn wait(&self) {
        self.count.wait_for(self.taken.get() + 1).await;
    }
}

/// Reads the client's side of the connection: WebSocket frames (pings, pongs, close, broken
/// ones), or for SSE only the connection's end. What it sees goes to the stream's loop; it stops
/// at the first close or broken frame, and reads nothing more while the loop has 16 messages
/// not taken (a client flooding pings waits for its pongs).
async fn read_client(mut input: SharedStream, protocol: Protocol, to: Rc<Inbox>) {
    let mut frames = ClientFrames::default();
    // Small: a subscriber sends little (nothing over SSE, control frames over WebSocket), and
    // an idle one holds this buffer for as long as it stays.
    let mut buf = vec![0u8; 512];
    loop {
        let n = match input.read(&mut buf).await {
            Ok(0) | Err(_) => {
                to.put(FromClient::Closed(None));
                return;
            }
            Ok(n) => n,
        };
        if protocol == Protocol::Sse {
            // An SSE client sends nothing after its request.
            continue;
        }
        frames.push(&buf[..n]);
        loop {
            let msg = match frames.next_frame() {
                Ok(None) => break,
                Ok(Some(ClientFrame::Ping(p))) => FromClient::Ping(p),
                Ok(Some(ClientFrame::Pong)) => FromClient::Pong,
                Ok(Some(ClientFrame::Data)) => continue,
                Ok(Some(ClientFrame::Close(code))) => FromClient::Closed(code),
                Err(v) => FromClient::Broken(v.code, v.why),
            };
            let last = matches!(msg, FromClient::Closed(_) | FromClient::Broken(..));
            to.put(msg);
            if last {
                return;
            }
            while to.messages.borrow().len() >= 16 {
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
