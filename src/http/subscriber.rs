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
    /// The last write had to wait for the client to read (its socket was full).
    pub waited: bool,
}

/// A write that takes longer than this waited for the client to read.
const WAITED: Duration = Duration::from_millis(20);

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
    let last = match (sub.encoding.protocol, &end) {
        (Protocol::WebSocket, End::Client(code)) => {
            Some(ws_close(code.unwrap_or(CLOSE_NORMAL), ""))
        }
        (Protocol::WebSocket, End::Broken(code, why)) => Some(ws_close(*code, why)),
        (Protocol::WebSocket, End::Stopping) => Some(ws_close(CLOSE_GOING_AWAY, "server stopping")),
        (Protocol::WebSocket, End::Slow) => Some(ws_close(CLOSE_POLICY, "too slow")),
        (Protocol::WebSocket, End::Failed(why)) => Some(ws_close(1011, why)),
        (Protocol::Sse, End::Failed(why)) => Some(stream_message(
            Protocol::Sse,
            "error",
            &format!("\"error\":{}", serde_json::Value::from(why.as_str())),
        )),
        _ => None,
    };
    if let Some(last) = last {
        let _ = write_within(&mut out, &[Bytes::from(last)], Duration::from_secs(1)).await;
    }
    drop(reader);
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
        let now = Instant::now();
        if now.duration_since(noted) >= crate::replicas::TICK {
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
            let _ = write_within(out, &[Bytes::from(why)], Duration::from_secs(1)).await;
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
        Err(shards::Error::OffsetOutOfRange { .. }) => return Sent::Wrote,
        Err(e) => return Sent::Failed(format!("reading the log: {e}")),
    };
    let read_bytes = read.records.len;
    let aborted = if sub.read_committed && read.records.batches > 0 {
        log.aborted_transactions(read.records.first_offset, read.records.last_offset)
    } else {
        Vec::new()
    };
    let mut chunks = Vec::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    for (h, batch) in read.records.batches() {
        if h.base_offset >= end {
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
    let more_ahead = end > sub.next;
    // Behind: more than the buffer ahead of a subscriber that had caught up and whose last write
    // had to wait (a burst read by a client that keeps up is not slowness).
    if caught_up && more_ahead && read_bytes >= budget && sub.waited {
        // Put the position back: the slow rule decides from where it goes on.
        sub.next = start;
        return Sent::Behind;
    }
    if chunks.is_empty() {
        return Sent::Wrote;
    }
    let frames = chunks.len() as u64;
    let started = Instant::now();
    if !write_within(out, &chunks, stall).await {
        return Sent::Stalled;
    }
    sub.waited = started.elapsed() > WAITED;
    add(&core.http.frames_sent, frames);
    add(&core.http.records_sent, records);
    add(&core.http.bytes_sent, bytes);
    Sent::Wrote
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
