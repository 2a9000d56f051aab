//! One subscriber: from its next offset it reads the partition's log (the tail cache at the tail),
//! takes each batch's shared frame, and writes all it has in one vectored write; at the end it
//! waits for the high watermark (or the last stable offset) to move, sending heartbeats while
//! idle. Its state is a position and the frames it is writing: a slow subscriber holds no queue,
//! it falls behind in the log, and the slow rule decides what happens then.

use super::encode::{heartbeat, stream_message, ws_close, Encoding, Protocol};
use super::request::Slow;
use super::websocket::{ClientFrame, ClientFrames, CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_POLICY};
use super::Hub;
use crate::cores::Core;
use crate::metrics::add;
use crate::wire::SharedStream;
use bytes::Bytes;
use futures_lite::AsyncReadExt;
use shards::partition::Partition;
use shards::transactions::AbortedTxn;
use shards::OffsetMonitor;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// What a subscriber reads and how it writes it.
#[derive(Debug)]
pub struct Subscription {
    pub part: Rc<Partition>,
    pub encoding: Encoding,
    pub read_committed: bool,
    pub slow: Slow,
    /// The first offset to send.
    pub next: i64,
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
    let end = serve(core, hub, &mut out, &mut sub, conn, &inbox).await;
    core.replicas.connection_closed(conn);
    if let End::Failed(why) = &end {
        log::warn!(
            "core {}: a stream of {} partition {} ended: {why}",
            core.id(),
            sub.part.topic,
            sub.part.index
        );
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
    (!super::may_read(core, hub, who, &sub.part.topic)).then_some(End::Refused)
}

/// The stream's loop; returns why it ended.
async fn serve(
    core: &Rc<Core>,
    hub: &Hub,
    out: &mut SharedStream,
    sub: &mut Subscription,
    conn: u64,
    from_client: &Inbox,
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
        if sub.part.log.is_closed() {
            return End::Moved;
        }
        // A subscriber catching up from the tail cache never waits: others get the core too.
        glommio::yield_if_needed().await;
        let now = Instant::now();
        if now.duration_since(noted) >= crate::replicas::TICK {
            if let Some(end) = recheck(core, hub, sub) {
                return end;
            }
            // Counts as a consumer of the partition here, as a Kafka fetch would (read replicas
            // start for partitions streamed to many).
            core.replicas.note_fetch(&sub.part, conn, now);
            noted = now;
        }
        let part = sub.part.clone();
        let log = &part.log;
        let end = if sub.read_committed {
            log.last_stable_offset()
        } else {
            log.high_watermark()
        };
        if sub.next < log.log_start_offset() {
            // Retention or compaction's deletion passed the subscriber: it is told what it missed.
            let from = sub.next;
            sub.next = log.log_start_offset();
            if !send_gap(out, protocol, sub.part.index, from, sub.next - 1, stall).await {
                return End::Slow;
            }
            continue;
        }
        if sub.next < end {
            match send_some(core, hub, out, sub, end, caught_up, stall).await {
                Sent::Wrote => last_write = Instant::now(),
                Sent::Nothing => glommio::timer::sleep(Duration::from_millis(10)).await,
                Sent::Behind => {
                    if let Some(end) = fall_behind(core, out, sub, end, stall).await {
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
/// with a last event that says so, or skipped to `end` with a gap event.
async fn fall_behind(
    core: &Core,
    out: &mut SharedStream,
    sub: &mut Subscription,
    end: i64,
    stall: Duration,
) -> Option<End> {
    let protocol = sub.encoding.protocol;
    match sub.slow {
        Slow::Disconnect => {
            add(&core.http.slow_disconnects, 1);
            let why = stream_message(
                protocol,
                "slow",
                &format!(
                    "\"partition\":{},\"next_offset\":{},\"high_watermark\":{}",
                    sub.part.index,
                    sub.next,
                    sub.part.log.high_watermark()
                ),
            );
            let mut last = vec![Bytes::from(why)];
            if protocol == Protocol::WebSocket {
                last.push(Bytes::from(ws_close(CLOSE_POLICY, "too slow")));
            }
            let _ = write_within(out, &last, Duration::from_secs(1)).await;
            Some(End::Slow)
        }
        Slow::Skip => {
            let from = sub.next;
            sub.next = end;
            add(&core.http.gaps, 1);
            let index = sub.part.index;
            (!send_gap(out, protocol, index, from, end - 1, stall).await).then_some(End::Slow)
        }
    }
}

/// Waits at most `wait` for more to read, a word from the client, or the server's stop.
async fn idle(core: &Core, sub: &Subscription, from_client: &Inbox, wait: Duration) {
    let log = &sub.part.log;
    let monitor = if sub.read_committed {
        log.last_stable_monitor()
    } else {
        log.high_watermark_monitor()
    };
    let moved = async {
        monitor.wait_for(sub.next + 1).await;
    };
    let timer = async {
        glommio::timer::sleep(wait).await;
    };
    let stopping = async {
        core.shutdown().wait_for(1).await;
    };
    futures_lite::future::or(
        futures_lite::future::or(moved, from_client.wait()),
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

/// Reads from the subscriber's next offset up to `end` (at most the stream buffer), and writes
/// the batches' frames in one vectored write.
async fn send_some(
    core: &Rc<Core>,
    hub: &Hub,
    out: &mut SharedStream,
    sub: &mut Subscription,
    end: i64,
    caught_up: bool,
    stall: Duration,
) -> Sent {
    let budget = hub.config.stream_buffer_bytes;
    let log = sub.part.log.clone();
    let start = sub.next;
    let read = match log.read(sub.next, budget, true).await {
        Ok(read) => read,
        Err(shards::Error::OffsetOutOfRange { .. }) => return Sent::Nothing,
        Err(e) => return Sent::Failed(format!("reading the log: {e}")),
    };
    let read_bytes = read.records.len;
    let aborted = if sub.read_committed && read.records.batches > 0 {
        // The end is exclusive: the last batch's own transaction counts.
        log.aborted_transactions(read.records.first_offset, read.records.last_offset + 1)
    } else {
        Vec::new()
    };
    let mut chunks = Vec::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    for (h, batch) in read.records.batches() {
        if h.base_offset >= end {
            // Nothing lies between `next` and this batch (compacted away): the stream is at `end`.
            sub.next = sub.next.max(end.min(h.base_offset));
            break;
        }
        if h.last_offset() < sub.next {
            continue;
        }
        let from = sub.next;
        sub.next = h.last_offset() + 1;
        if h.is_transactional()
            && !h.is_control()
            && is_aborted(&aborted, h.producer_id, h.base_offset)
        {
            continue;
        }
        let frame = match hub.frames.frame(
            &core.http,
            log.id(),
            sub.encoding,
            sub.part.index,
            &h,
            &batch,
            from,
        ) {
            Ok(frame) => frame,
            Err(e) => {
                return Sent::Failed(format!(
                    "a batch at offset {} cannot be read: {e}",
                    h.base_offset
                ))
            }
        };
        if !frame.bytes.is_empty() {
            records += u64::from(frame.records);
            bytes += frame.bytes.len() as u64;
            chunks.push(frame.bytes);
        }
    }
    if behind(sub, start, read_bytes, end, caught_up && budget > 0, budget) {
        // Put the position back: the slow rule decides from where it goes on.
        sub.next = start;
        sub.behind_rounds = 0;
        return Sent::Behind;
    }
    if chunks.is_empty() {
        return if sub.next == start {
            Sent::Nothing
        } else {
            Sent::Wrote
        };
    }
    let frames = chunks.len() as u64;
    let write = async { out.write_chunks_full(&chunks).await.ok() };
    let written = futures_lite::future::or(write, async {
        glommio::timer::sleep(stall).await;
        None
    })
    .await;
    let Some(full) = written else {
        return Sent::Stalled;
    };
    sub.waited |= full;
    add(&core.http.frames_sent, frames);
    add(&core.http.records_sent, records);
    add(&core.http.bytes_sent, bytes);
    Sent::Wrote
}

/// Whether the subscriber is behind, judged once a second: more than the buffer ahead of it
/// (estimated from this read's bytes per offset, `start..sub.next`), after it had caught up
/// (`caught_up`), a lag that did not shrink since the last look, and a socket found full in
/// between, for [`BEHIND_ROUNDS`] looks in a row (a client that keeps up, or works off a burst,
/// is not slow).
fn behind(
    sub: &mut Subscription,
    start: i64,
    read_bytes: usize,
    end: i64,
    caught_up: bool,
    budget: usize,
) -> bool {
    let per_offset = read_bytes as f64 / (sub.next - start).max(1) as f64;
    let ahead = (end - sub.next).max(0) as f64 * per_offset;
    if sub.looked.elapsed() >= LOOK_EVERY {
        sub.looked = Instant::now();
        let growing = caught_up && ahead > budget as f64 && ahead >= sub.ahead && sub.waited;
        sub.ahead = ahead;
        sub.waited = false;
        sub.behind_rounds = if growing { sub.behind_rounds + 1 } else { 0 };
    }
    sub.behind_rounds >= BEHIND_ROUNDS
}

/// Whether a transactional batch of `producer_id` at `base_offset` belongs to an aborted
/// transaction among `aborted` (those overlapping the read).
fn is_aborted(aborted: &[AbortedTxn], producer_id: i64, base_offset: i64) -> bool {
    aborted.iter().any(|a| {
        a.producer_id == producer_id && a.first_offset <= base_offset && base_offset < a.last_offset
    })
}

/// Tells the subscriber it will not get offsets `from..=to` of `partition`.
async fn send_gap(
    out: &mut SharedStream,
    protocol: Protocol,
    partition: i32,
    from: i64,
    to: i64,
    stall: Duration,
) -> bool {
    let gap = stream_message(
        protocol,
        "gap",
        &format!("\"partition\":{partition},\"from\":{from},\"to\":{to}"),
    );
    write_within(out, &[Bytes::from(gap)], stall).await
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
