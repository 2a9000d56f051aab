//! A connection's requests and responses: the next request read off the wire (bounded, counted,
//! until the connection is to close), and the responses written strictly in request order while
//! later requests are handled (pipelining).

use crate::cores::Core;
use crate::kafka::handlers::Reply;
use crate::metrics::add;
use crate::wire::frame::{FrameError, FrameReader};
use crate::wire::header::{self, HeaderError};
use crate::wire::SharedStream;
use bytes::Bytes;
use shards::OffsetMonitor;
use std::cell::{Cell, RefCell};
use std::os::unix::io::AsRawFd;

/// Requests handled at once on one connection before reading waits for responses to drain. At
/// most 64: [`Responses::ready`] has a bit per request in flight.
pub(super) const MAX_IN_FLIGHT: i64 = 64;

const _: () = assert!(MAX_IN_FLIGHT <= 64);

/// The writing end of a connection, shared by its handlers in request order.
pub(super) struct Responses {
    pub(super) out: SharedStream,
    /// Responses written (or skipped once the connection broke): request `n` (from 0) writes when
    /// this reaches `n`.
    pub(super) written: OffsetMonitor,
    /// Set when a write failed or a handler asked to close: later responses are dropped.
    pub(super) closed: Cell<bool>,
    /// Requests whose reply is ready and waiting for their turn to be written: bit `seq % 64`.
    /// At most [`MAX_IN_FLIGHT`] (64) requests are in flight, all within 64 of `written`, so their
    /// bits are distinct; a bit set costs nothing per request, where a set would allocate.
    ready: Cell<u64>,
    /// Replies left by earlier requests to the next one, written with it.
    pending: RefCell<Pending>,
    /// Requests read from the connection so far (the next one read gets this `seq`).
    pub(super) read: Cell<i64>,
}

/// Reply bytes not written yet, with the holds on shared results they carry.
#[derive(Default)]
struct Pending {
    chunks: Vec<Bytes>,
    holds: Vec<shards::ResponseHold>,
}

impl Pending {
    /// Adds a reply's chunks and holds (moved in, not copied, when nothing is pending).
    fn add(&mut self, chunks: Vec<Bytes>, holds: Vec<shards::ResponseHold>) {
        if self.chunks.is_empty() {
            self.chunks = chunks;
        } else {
            self.chunks.extend(chunks);
        }
        if self.holds.is_empty() {
            self.holds = holds;
        } else {
            self.holds.extend(holds);
        }
    }

    /// Writes the bytes (closing the connection if that fails), then releases the holds.
    async fn flush(&mut self, responses: &Responses, core: &Core) {
        let Pending { chunks, holds } = std::mem::take(self);
        if chunks.is_empty() {
            return;
        }
        let mut out = responses.out.clone();
        if out.write_chunks(&chunks).await.is_err() {
            responses.close();
        } else {
            let n: usize = chunks.iter().map(Bytes::len).sum();
            add(&core.metrics.bytes_out, n as u64);
            add(&core.metrics.response_writes, 1);
        }
        drop(holds);
    }
}

impl Responses {
    /// The responses of a connection that writes to `out`, none read yet.
    pub(super) fn new(out: SharedStream) -> Self {
        Responses {
            out,
            written: OffsetMonitor::new(0),
            closed: Cell::new(false),
            ready: Cell::new(0),
            read: Cell::new(0),
            pending: RefCell::default(),
        }
    }

    /// Writes request `seq`'s reply after every earlier one, then lets the next go. When the next
    /// request's reply is already waiting for its turn, this one is left to it, and it writes both
    /// with one `sendmsg`: pipelined responses that are ready together (a producer's requests
    /// answered by one group write) cost one send, one loopback delivery, one wake-up of the client.
    ///
    /// Replies that become ready together are woken together but run one after the other, so the
    /// first would never see the next one ready: when a later request has been read and its reply
    /// is not waiting yet, this one first lets the tasks already woken on the core run once (a
    /// yield, not a wait for the next reply: a reply that is not ready by then is not waited for).
    /// Not when the task queue is due to give up the core: the yield would then leave the reply
    /// until the queue's next turn, behind a round of fetches. (Measurements in
    /// `docs/performance.md`.)
    pub(super) async fn write_in_turn(&self, core: &Core, seq: i64, reply: Reply) {
        let bit = |seq: i64| 1u64 << (seq as u64 % 64);
        self.ready.set(self.ready.get() | bit(seq));
        self.written.wait_for(seq).await;
        if self.read.get() > seq + 1
            && self.ready.get() & bit(seq + 1) == 0
            && !glommio::executor().need_preempt()
        {
            futures_lite::future::yield_now().await;
        }
        self.ready.set(self.ready.get() & !bit(seq));
        if !self.closed.get() {
            let mut pending = self.pending.take();
            match reply {
                Reply::None => {}
                Reply::Close => {
                    pending.flush(self, core).await;
                    self.close();
                }
                Reply::Frame(chunks) => pending.add(chunks, Vec::new()),
                Reply::Fetch(chunks, holds) => pending.add(chunks, holds),
            }
            if self.ready.get() & bit(seq + 1) != 0 && !self.closed.get() {
                *self.pending.borrow_mut() = pending;
            } else {
                pending.flush(self, core).await;
            }
        }
        self.written.advance(seq + 1);
    }

    /// Whether the connection is closing (a write failed or a reply asked for it).
    pub(super) fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Drops every later response and ends the connection: the reader's pending read returns at
    /// once (end of stream), the client sees the connection close.
    fn close(&self) {
        self.closed.set(true);
        // SAFETY: shutdown(2) on the connection's own descriptor, which stays open (and owned by
        // the stream) until the connection's tasks are done.
        unsafe { libc::shutdown(self.out.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

/// The next request on the connection, counted in the metrics; `None` once the connection is to
/// close: at its end, when the server stops or `give_up` finishes first, or after a bad frame or
/// header (logged and counted as a protocol error).
pub(super) async fn next_request(
    core: &Core,
    reader: &mut SharedStream,
    frames: &mut FrameReader,
    limit: usize,
    peer: &str,
    give_up: impl std::future::Future<Output = ()>,
) -> Option<header::Request> {
    let frame = futures_lite::future::or(
        async { Some(frames.read_request(reader, limit).await) },
        async {
            core.until_stopping(give_up).await;
            None
        },
    )
    .await;
    let frame = match frame? {
        Err(FrameError::Eof) => return None,
        Err(e) => {
            log::warn!("closing connection from {peer}: {e}");
            add(&core.metrics.protocol_errors, 1);
            return None;
        }
        Ok(f) => f,
    };
    add(&core.metrics.bytes_in, frame.len() as u64 + 4);
    let req = match header::parse(frame) {
        Ok(r) => r,
        Err(HeaderError::UnknownApi {
            api_key,
            correlation_id,
        }) => {
            log::warn!("closing connection from {peer}: unknown API key {api_key} (correlation id {correlation_id})");
            add(&core.metrics.protocol_errors, 1);
            return None;
        }
        Err(HeaderError::Malformed(why)) => {
            log::warn!("closing connection from {peer}: malformed request header: {why}");
            add(&core.metrics.protocol_errors, 1);
            return None;
        }
    };
    core.metrics.request(req.api_key);
    Some(req)
}
