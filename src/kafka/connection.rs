//! One client connection: frames are read and handled concurrently (pipelining), and each handler
//! writes its own response once every earlier response on the connection is written (responses go
//! out strictly in request order). A handler runs in the task queue of its kind of work (produce,
//! fetch, the rest: [`crate::cores::TaskQueues`]), and so does the write of its response, which
//! for a fetch is most of its cost: a core flooded with fetches keeps serving its producers.

use super::authenticate::authenticate;
use super::session::Session;
use crate::auth::Principal;
use crate::cores::Core;
use crate::kafka::handlers::{self, Reply};
use crate::metrics::add;
use crate::wire::frame::{FrameError, FrameReader};
use crate::wire::header::{self, HeaderError};
use crate::wire::ktls;
use crate::wire::SharedStream;
use bytes::Bytes;
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use kafka_protocol::messages::ApiKey;
use shards::OffsetMonitor;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::unix::io::AsRawFd;
use std::rc::Rc;

/// Requests handled at once on one connection before reading waits for responses to drain. At
/// most 64: [`Responses::ready`] has a bit per request in flight.
const MAX_IN_FLIGHT: i64 = 64;
const _: () = assert!(MAX_IN_FLIGHT <= 64);

/// The writing end of a connection, shared by its handlers in request order.
pub(super) struct Responses {
    out: SharedStream,
    /// Responses written (or skipped once the connection broke): request `n` (from 0) writes when
    /// this reaches `n`.
    written: OffsetMonitor,
    /// Set when a write failed or a handler asked to close: later responses are dropped.
    closed: Cell<bool>,
    /// Requests whose reply is ready and waiting for their turn to be written: bit `seq % 64`.
    /// At most [`MAX_IN_FLIGHT`] (64) requests are in flight, all within 64 of `written`, so their
    /// bits are distinct; a bit set costs nothing per request, where a set would allocate.
    ready: Cell<u64>,
    /// Replies left by earlier requests to the next one, written with it.
    pending: RefCell<Pending>,
    /// Requests read from the connection so far (the next one read gets this `seq`).
    read: Cell<i64>,
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
        if write_chunks(&mut out, &chunks).await.is_err() {
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

/// Serves one connection accepted on listener `listener` (index in `core.cluster.listeners`).
pub async fn serve(core: Rc<Core>, stream: TcpStream, listener: usize) {
    let protocol = core.cluster.listeners[listener].protocol;
    let addr = stream.peer_addr().ok();
    let peer: Rc<str> = addr.map_or_else(|| "?".into(), |a| a.to_string().into());
    let _ = stream.set_nodelay(true);
    let tls = if protocol.tls() {
        core.security.tls.as_ref()
    } else {
        None
    };
    let (mut reader, certificate_principal) = match tls {
        None => (SharedStream::new(stream), None),
        Some(Err(why)) => {
            log::error!(
                "refusing the connection from {peer}: TLS is configured but unusable: {why}"
            );
            return;
        }
        Some(Ok(tls)) => match tls_handshake(&core, tls, stream).await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("TLS handshake with {peer} failed: {e}");
                add(&core.metrics.tls_handshake_failures, 1);
                return;
            }
        },
    };
    add(&core.metrics.connections_open, 1);
    add(&core.metrics.connections_total, 1);
    let responses = Rc::new(Responses {
        out: reader.clone(),
        written: OffsetMonitor::new(0),
        closed: Cell::new(false),
        ready: Cell::new(0),
        read: Cell::new(0),
        pending: RefCell::default(),
    });
    let mut frames = FrameReader::new();
    let mut seq: i64 = 0;
    // Who the client is: authenticated first where the listener asks for it.
    let principal = if protocol.sasl() {
        authenticate(
            &core,
            &mut reader,
            &mut frames,
            &responses,
            &peer,
            addr.map(|a| a.ip()),
            &mut seq,
        )
        .await
    } else {
        // mTLS: the verified certificate's subject; else anonymous.
        Some(certificate_principal.map_or(Principal::Anonymous, Principal::User))
    };
    if let Some(principal) = principal {
        let session = Rc::new(Session::new(
            peer.clone(),
            principal,
            addr.map(|a| a.ip()),
            listener,
        ));
        serve_requests(
            &core,
            &session,
            &mut reader,
            &mut frames,
            &responses,
            &mut seq,
        )
        .await;
    }
    // Every response already asked for goes out before the connection closes.
    responses.written.wait_for(seq).await;
    let mut out = responses.out.clone();
    let _ = out.flush().await;
    let _ = out.close().await;
    core.metrics
        .connections_open
        .set(core.metrics.connections_open.get().saturating_sub(1));
}

/// Longest a client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The TLS handshake of a new connection, and the principal its client certificate names (mTLS)
/// as Kafka writes it (`CN=alice,O=acme`, without the `User:` prefix). Where the core hands keys
/// to the kernel and the socket takes the `tls` module, the kernel encrypts from then on;
/// otherwise rustls does, in user space.
async fn tls_handshake(
    core: &Core,
    tls: &std::sync::Arc<futures_rustls::rustls::ServerConfig>,
    mut stream: TcpStream,
) -> io::Result<(SharedStream, Option<String>)> {
    /// Ends a handshake that takes too long.
    async fn timeout<T>() -> io::Result<T> {
        glommio::timer::sleep(TLS_HANDSHAKE_TIMEOUT).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "handshake timed out",
        ))
    }
    if core.security.kernel_tls.get() && ktls::attach(stream.as_raw_fd()).is_ok() {
        let mut conn =
            futures_rustls::rustls::ServerConnection::new(tls.clone()).map_err(io::Error::other)?;
        futures_lite::future::or(ktls::handshake(&mut stream, &mut conn), timeout()).await?;
        let principal = certificate_principal(conn.peer_certificates());
        let suite = conn.negotiated_cipher_suite().map(|s| s.suite());
        let budget = ktls::offload(stream.as_raw_fd(), conn).inspect_err(|e| {
            // This connection is lost (its keys have left rustls); the next ones are not.
            core.security.kernel_tls.set(false);
            log::warn!(
                "core {}: the kernel refused TLS keys ({suite:?}): {e}; this core encrypts in \
                 user space from now on",
                core.id()
            );
        })?;
        add(&core.metrics.tls_kernel_connections, 1);
        return Ok((SharedStream::kernel_tls(stream, budget), principal));
    }
    let acceptor = futures_rustls::TlsAcceptor::from(tls.clone());
    let accepted = futures_lite::future::or(acceptor.accept(stream), timeout()).await?;
    let principal = certificate_principal(accepted.get_ref().1.peer_certificates());
    add(&core.metrics.tls_user_space_connections, 1);
    Ok((SharedStream::tls(accepted), principal))
}

/// The principal a verified client certificate chain's leaf names.
fn certificate_principal(
    chain: Option<&[futures_rustls::rustls::pki_types::CertificateDer<'_>]>,
) -> Option<String> {
    chain
        .and_then(|chain| chain.first())
        .and_then(crate::auth::tls::certificate_principal)
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

/// Reads and handles the requests of an authenticated connection until it closes, the client
/// goes away or the server stops; `seq` counts the requests read.
async fn serve_requests(
    core: &Rc<Core>,
    session: &Rc<Session>,
    reader: &mut SharedStream,
    frames: &mut FrameReader,
    responses: &Rc<Responses>,
    seq: &mut i64,
) {
    let limit = core.config().max_request_bytes;
    let peer = &session.peer;
    let mut fetched = false;
    loop {
        // Bounded pipelining: wait for the oldest responses to go out.
        responses.written.wait_for(*seq - MAX_IN_FLIGHT + 1).await;
        if responses.closed.get() {
            break;
        }
        let Some(req) =
            next_request(core, reader, frames, limit, peer, std::future::pending()).await
        else {
            break;
        };
        if !fetched && req.api_key == ApiKey::Fetch as i16 {
            fetched = true;
            add(&core.metrics.fetch_connections, 1);
        }
        let queue = core.queues().for_api(req.api_key);
        let (api_key, read_at) = (req.api_key, std::time::Instant::now());
        // Detached: a request, once read, is handled to the end even if the connection goes away
        // (as in Kafka); only its answer is dropped. A handler cancelled half-way could leave
        // state behind (a group deletion between its steps, a commit written but not applied).
        let task = {
            let (core, responses, session) = (core.clone(), responses.clone(), session.clone());
            let seq = *seq;
            async move {
                let reply = handlers::handle_guarded(core.clone(), req, session).await;
                responses.write_in_turn(&core, seq, reply).await;
                core.metrics.duration(api_key, read_at.elapsed());
            }
        };
        match glommio::spawn_local_into(task, queue) {
            Ok(t) => t.detach(),
            Err(e) => {
                log::error!("closing connection from {peer}: cannot start a handler: {e}");
                break;
            }
        };
        *seq += 1;
        responses.read.set(*seq);
    }
    if fetched {
        let open = &core.metrics.fetch_connections;
        open.set(open.get().saturating_sub(1));
        core.replicas.connection_closed(session.id);
    }
}

/// Writes a response's chunks with as few system calls as it can: first one non-blocking
/// `sendmsg` over all of them (a fetch response is a header, shared record parts and a trailer:
/// written one by one, each would be a system call of its own), then glommio's writes, which wait
/// for the socket, for whatever it did not take at once.
async fn write_chunks(out: &mut SharedStream, chunks: &[Bytes]) -> io::Result<()> {
    if out.encrypts_in_user_space() {
        // Encrypted in user space: each chunk is copied into TLS records.
        for c in chunks {
            out.write_all(c).await?;
        }
        return out.flush().await;
    }
    let mut sent = if chunks.len() > 1 {
        out.send_now(chunks)?
    } else {
        0
    };
    for c in chunks {
        if sent >= c.len() {
            sent -= c.len();
            continue;
        }
        out.write_all(&c[sent..]).await?;
        sent = 0;
    }
    Ok(())
}
