//! Topics streamed to browsers and devices over HTTP/1.1 (`--http-listen`): a partition of a
//! topic or view, or every partition merged, as Server-Sent Events (`Accept: text/event-stream`)
//! or over a WebSocket, from an offset (`?offset=earliest|latest|N|@ms`) or resumed after the last
//! event (`Last-Event-ID`, which browsers send by themselves on reconnect, or `?resume=`), in JSON
//! or as raw values, at read_uncommitted or read_committed.
//!
//! Every core listens on the same address (`SO_REUSEPORT`: the kernel spreads connections over
//! them), and a subscriber is served on the core it lands on: from the partitions that core owns,
//! and read replicas of the others, asked of their owners when missing (kept while streams read
//! them). Only where a topic's read replicas are off is a one-partition stream's connection handed
//! to the owner core with its request head. No message is ever copied between cores for a
//! subscriber. On a core, each batch is encoded once per protocol and format ([`frames`]) and that
//! buffer is written to every subscriber of it.
//!
//! ## Layout, top layer first
//! - [`subscriber`] — one subscriber's loop: read, share frames, write, heartbeats, the slow rule.
//! - [`lane`]       — one partition a subscriber reads (a log, a view's shard; upstream at the
//!   edge), where it is and how far it may read.
//! - [`frames`]     — the core's shared frames: one encoded buffer per batch and encoding.
//! - [`encode`]     — SSE events and WebSocket frames of a batch's records, JSON or values.
//! - [`websocket`]  — RFC 6455: the handshake's answer, the client's frames checked.
//! - [`spread`]     — new connections handed from a busy core to the least busy.
//! - [`request`]    — the request head (bounded in size, headers and time), its route and query.

pub mod encode;
pub mod frames;
pub mod lane;
pub mod request;
pub mod spread;
pub mod subscriber;
pub mod websocket;

use crate::cores::mesh::{CoreMsg, HandedStream};
use crate::cores::Core;
use crate::metrics::add;
use crate::table::acl::{authorize, Operation, ResourceType};
use crate::wire::SharedStream;
use encode::{Encoding, Protocol};
use futures_lite::AsyncWriteExt;
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use kafka_protocol::error::ResponseError;
use lane::Lane;
use request::{Head, Refusal, Start, StreamRequest};
use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};
use subscriber::Subscription;

/// The stream front end's settings (`--http-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// An SSE comment or a WebSocket ping after this long without a write; a ping unanswered by
    /// the next one closes the connection.
    pub heartbeat: Duration,
    /// Most bytes one read of a subscriber takes; a subscriber that had caught up, whose last
    /// write waited for it to read, and that finds more than this ahead of it is slow (`?slow=`).
    pub stream_buffer_bytes: usize,
    /// Connections served at once per core; more are answered 503.
    pub max_connections: usize,
    /// Memory per core for shared frames.
    pub frame_cache_bytes: usize,
    /// Topics (by prefix) anyone may stream without an identity where ACLs are enforced.
    pub anonymous_read: Vec<String>,
    /// Origins browsers may stream from (CORS and WebSocket upgrades); empty: any.
    pub allowed_origins: Vec<String>,
    /// TLS on the listener (`--http-tls`).
    pub tls: Option<HttpTls>,
}

/// The stream listener's TLS: the Kafka listeners' certificate and key; where `--tls-client-ca`
/// is set, a client certificate that is sent must verify, and names the reader (one need not be
/// sent: browsers read with tokens or a password).
#[derive(Clone)]
pub struct HttpTls(pub std::sync::Arc<futures_rustls::rustls::ServerConfig>);

impl std::fmt::Debug for HttpTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpTls")
    }
}

impl PartialEq for HttpTls {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            heartbeat: Duration::from_secs(15),
            stream_buffer_bytes: 1 << 20,
            max_connections: 20_000,
            frame_cache_bytes: 32 << 20,
            anonymous_read: Vec::new(),
            allowed_origins: Vec::new(),
            tls: None,
        }
    }
}

/// What a core's stream connections share.
#[derive(Debug)]
pub struct Hub {
    pub config: HttpConfig,
    pub frames: frames::Frames,
    open: Cell<usize>,
    /// Moves each time the tokens file is read anew: streams opened with a token check it again.
    pub tokens_read: Cell<u64>,
}

/// Serves stream connections on this core until the server stops: those `listener` accepts (a
/// busy core hands new ones to the least busy, by `spread`), and those other cores hand over.
pub async fn serve(
    core: Rc<Core>,
    listener: TcpListener,
    config: HttpConfig,
    spread: std::sync::Arc<spread::Spread>,
) {
    let hub = Rc::new(Hub {
        frames: frames::Frames::new(config.frame_cache_bytes),
        config,
        open: Cell::new(0),
        tokens_read: Cell::new(0),
    });
    let tokens = glommio::spawn_local(watch_tokens(core.clone(), hub.clone()));
    let load = glommio::spawn_local(publish_load(core.clone(), spread.clone()));
    let (handed, inbox) = local_channel::new_bounded::<HandedStream>(1024);
    core.serve_handed_streams(handed);
    let from_others = {
        let (core, hub) = (core.clone(), hub.clone());
        glommio::spawn_local(async move {
            while let Some(Some(h)) = core.until_stopping(inbox.recv()).await {
                // SAFETY: the descriptor came with the message, owned by nothing else.
                let stream = unsafe { TcpStream::from_raw_fd(h.fd.into_raw_fd()) };
                // No head: handed by load before anything was read; served as if accepted here.
                let head = (!h.head.is_empty()).then_some(h.head);
                spawn_connection(&core, &hub, stream, head);
            }
        })
    };
    while let Some(accepted) = core.until_stopping(listener.accept()).await {
        match accepted {
            Ok(stream) => match spread.target(core.id()) {
                Some(to) => pass_on(&core, stream, to).await,
                None => spawn_connection(&core, &hub, stream, None),
            },
            Err(e) => {
                log::warn!("core {}: http accept failed: {e}", core.id());
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(from_others);
    drop(tokens);
    drop(load);
}

/// Says how busy this core is, every 100 ms, for the others to spread connections by.
async fn publish_load(core: Rc<Core>, spread: std::sync::Arc<spread::Spread>) {
    while core.pause(Duration::from_millis(100)).await {
        spread.note(core.id(), core.reads.load.busy());
    }
}

/// Hands a connection just accepted, nothing read from it, to core `to` (spread by load).
async fn pass_on(core: &Core, stream: TcpStream, to: usize) {
    if let Some(fd) = duplicate(core, &stream) {
        if core
            .mesh()
            .send(
                to,
                CoreMsg::Stream(HandedStream {
                    fd,
                    head: Vec::new(),
                }),
            )
            .await
        {
            add(&core.http.spread, 1);
        }
    }
}

/// A descriptor of `stream`'s socket to hand to another core (this core's closes with `stream`).
fn duplicate(core: &Core, stream: &impl AsRawFd) -> Option<std::os::fd::OwnedFd> {
    let fd = unsafe { libc::dup(stream.as_raw_fd()) };
    if fd < 0 {
        log::warn!(
            "core {}: a stream connection cannot be handed over: {}",
            core.id(),
            std::io::Error::last_os_error()
        );
        return None;
    }
    // SAFETY: `fd` is the new descriptor `dup` returned, owned by nothing else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Reads the tokens file again every second while the server runs, and says so to the streams
/// when it changed (a revoked token ends the streams opened with it).
async fn watch_tokens(core: Rc<Core>, hub: Rc<Hub>) {
    let mut seen = core.security.tokens.current().await;
    while core.pause(Duration::from_secs(1)).await {
        let now = core.security.tokens.current().await;
        if !Rc::ptr_eq(&now, &seen) {
            seen = now;
            hub.tokens_read.set(hub.tokens_read.get() + 1);
        }
    }
}

/// Serves a connection in a task of its own: a panic in it is caught, logged, and closes only
/// this connection; the core keeps serving.
fn spawn_connection(core: &Rc<Core>, hub: &Rc<Hub>, stream: TcpStream, head: Option<Vec<u8>>) {
    use futures_lite::FutureExt;
    let (core, hub) = (core.clone(), hub.clone());
    let queue = core.queues().fetch;
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let guarded = async move {
        let served = std::panic::AssertUnwindSafe(connection(&core, &hub, stream, head))
            .catch_unwind()
            .await;
        if let Err(payload) = served {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            log::error!(
                "core {}: the stream connection from {peer} panicked: {why}",
                core.id()
            );
        }
    };
    let task = glommio::spawn_local_into(guarded, queue);
    if let Ok(task) = task {
        task.detach();
    }
}

/// One connection: its TLS handshake (on a TLS listener), its request read (or handed over with
/// it), checked, then served as a stream, handed to the partition's owner, or refused.
async fn connection(core: &Rc<Core>, hub: &Hub, stream: TcpStream, head: Option<Vec<u8>>) {
    // The client's address, as Kafka's ACLs name hosts.
    let host = stream
        .peer_addr()
        .map_or_else(|_| "*".to_string(), |a| a.ip().to_string());
    let _ = stream.set_nodelay(true);
    let tls = hub.config.tls.as_ref().filter(|_| head.is_none());
    if hub.open.get() >= hub.config.max_connections {
        let busy = Refusal::new(
            "503 Service Unavailable",
            "too many stream connections on this core",
        );
        if tls.is_none() {
            refuse(core, &mut SharedStream::new(stream), &busy).await;
        } else {
            // No answer without a handshake, which is what the limit spares.
            add(&core.http.refused, 1);
        }
        return;
    }
    hub.open.set(hub.open.get() + 1);
    let _open = Open(&hub.open);
    let (mut stream, certificate) = match tls {
        None => (SharedStream::new(stream), None),
        Some(tls) => {
            let security = &core.security;
            match crate::auth::tls::accept(&tls.0, stream, &security.kernel_tls, core.id()).await {
                Ok(accepted) => (accepted.stream, accepted.principal),
                Err(e) => {
                    add(&core.http.tls_failures, 1);
                    log::debug!("core {}: a stream's TLS handshake failed: {e}", core.id());
                    return;
                }
            }
        }
    };
    let Some((raw, parsed)) = request_head(&mut stream, head).await else {
        return;
    };
    let over_tls = tls.is_some();
    let (head, req, principal) = match admit(core, hub, parsed, &host, over_tls, certificate).await
    {
        Ok(checked) => checked,
        Err(refusal) => {
            refuse(core, &mut stream, &refusal).await;
            return;
        }
    };
    let mut lanes = match lanes_here(core, &req).await {
        Ok(lanes) => lanes,
        Err(Elsewhere::HandOver(partition)) if !over_tls => {
            hand_over(core, stream, req.topic.as_str(), partition, raw).await;
            return;
        }
        Err(Elsewhere::HandOver(partition)) => {
            // A TLS session cannot move to another core: it is served where it lands, or not.
            let why = format!(
                "partition {partition} of {:?} has no read replica on this core (read replicas \
                 are off for it, or none came in time), and a TLS stream is served where it \
                 lands; try again",
                req.topic
            );
            let refusal = Refusal::new("503 Service Unavailable", why);
            refuse(core, &mut stream, &refusal).await;
            return;
        }
        Err(Elsewhere::Refused(refusal)) => {
            refuse(core, &mut stream, &refusal).await;
            return;
        }
    };
    for lane in &mut lanes {
        let start = req
            .resume
            .iter()
            .find(|(p, _)| *p == lane.index())
            .map_or(req.start, |(_, o)| Start::After(*o));
        match lane.start_offset(start, req.read_committed).await {
            Ok(next) => lane.next = next,
            Err(refusal) => {
                refuse(core, &mut stream, &refusal).await;
                return;
            }
        }
    }
    let opened = Opened {
        head,
        req,
        principal,
        host,
        lanes,
    };
    stream_to(core, hub, stream, opened).await;
}

/// A stream request admitted, with its partitions here at their first offsets.
struct Opened {
    head: Head,
    req: StreamRequest,
    principal: String,
    host: String,
    lanes: Vec<Lane>,
}

/// Answers the request that opens the stream, and serves it until it ends.
async fn stream_to(core: &Rc<Core>, hub: &Hub, mut stream: SharedStream, opened: Opened) {
    let Opened {
        head,
        req,
        principal,
        host,
        lanes,
    } = opened;
    let protocol = if head.websocket {
        Protocol::WebSocket
    } else {
        Protocol::Sse
    };
    let answer = match protocol {
        Protocol::WebSocket => {
            websocket::handshake_response(head.websocket_key.as_deref().unwrap_or_default())
        }
        Protocol::Sse => sse_head(&head, !hub.config.allowed_origins.is_empty()),
    };
    if stream.write_all(&answer).await.is_err() {
        return;
    }
    add(&core.http.subscribers_total, 1);
    let _open = Gauge::up(&core.http.subscribers);
    let _ws =
        (protocol == Protocol::WebSocket).then(|| Gauge::up(&core.http.websocket_subscribers));
    let merged = req.partition.is_none();
    let sub = Subscription {
        topic: req.topic,
        lanes,
        merged,
        joining: Vec::new(),
        encoding: Encoding {
            protocol,
            format: req.format,
            whole_batches: merged,
        },
        read_committed: req.read_committed,
        slow: req.slow,
        waited: false,
        ahead: 0.0,
        behind_rounds: 0,
        looked: Instant::now(),
        principal,
        host,
        revision: core.topics().revision,
        token: req.token,
        tokens_read: hub.tokens_read.get(),
    };
    subscriber::run(core, hub, stream, sub).await;
}

/// The request's head: handed over with the connection, or read from it (with its bytes as
/// sent); `None` when the client left without sending one.
async fn request_head(
    stream: &mut SharedStream,
    handed: Option<Vec<u8>>,
) -> Option<(Vec<u8>, Result<Head, Refusal>)> {
    match handed {
        Some(raw) => {
            let parsed = request::parse_head(&raw).and_then(|h| {
                h.ok_or_else(|| Refusal::new("400 Bad Request", "incomplete request head"))
            });
            Some((raw, parsed))
        }
        None => {
            let deadline = Instant::now() + request::HEAD_DEADLINE;
            match request::read_head(stream, deadline).await {
                Ok(None) => None,
                Ok(Some((raw, head))) => Some((raw, Ok(head))),
                Err(refusal) => Some((Vec::new(), Err(refusal))),
            }
        }
    }
}

/// A gauge counted up while this lives (also when a panic unwinds it).
struct Gauge<'a>(&'a Cell<u64>);

impl<'a> Gauge<'a> {
    fn up(cell: &'a Cell<u64>) -> Self {
        cell.set(cell.get() + 1);
        Gauge(cell)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Counts an open connection while it lives.
struct Open<'a>(&'a Cell<usize>);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// The request's route, who sends it (from `host`, with the client certificate's subject if one
/// verified), and its checks: the head, the stream asked for and the principal, or why the
/// request is refused.
async fn admit(
    core: &Core,
    hub: &Hub,
    parsed: Result<Head, Refusal>,
    host: &str,
    over_tls: bool,
    certificate: Option<String>,
) -> Result<(Head, StreamRequest, String), Refusal> {
    let head = parsed?;
    let req = request::route(&head)?;
    let principal = principal(core, &head, &req, host, over_tls, certificate).await?;
    let who = Who {
        principal: &principal,
        host,
    };
    let req = check(core, hub, &head, req, who)?;
    Ok((head, req, principal))
}

/// Who the request is: the user its bearer token belongs to; else the SCRAM user whose name and
/// password HTTP Basic sends (over TLS only); else the subject of its client certificate; else
/// `User:ANONYMOUS`.
async fn principal(
    core: &Core,
    head: &Head,
    req: &StreamRequest,
    host: &str,
    over_tls: bool,
    certificate: Option<String>,
) -> Result<String, Refusal> {
    let unauthorized = |why: &str| Refusal::new("401 Unauthorized", why);
    if let Some(token) = &req.token {
        let tokens = core.security.tokens.current().await;
        return match tokens.user_of(token) {
            Some(user) => Ok(format!("User:{user}")),
            None => Err(unauthorized(
                "unknown or revoked token (shoal user token create USER)",
            )),
        };
    }
    if let Some(basic) = &head.basic {
        if !over_tls {
            return Err(unauthorized(
                "HTTP Basic sends a password: it is accepted over TLS only (--http-tls)",
            ));
        }
        return basic_user(core, basic, host)
            .await
            .map(|u| format!("User:{u}"));
    }
    Ok(certificate.map_or_else(|| "User:ANONYMOUS".to_string(), |c| format!("User:{c}")))
}

/// The SCRAM user HTTP Basic's `credentials` (base64 `user:password`) name, if the password is
/// theirs. A failure counts against `host` as a failed SASL authentication does, and an address
/// past `--max-failed-authentications-per-minute` is refused without a check.
async fn basic_user(core: &Core, credentials: &str, host: &str) -> Result<String, Refusal> {
    use base64::Engine;
    let malformed = || Refusal::new("400 Bad Request", "malformed HTTP Basic credentials");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(credentials)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(malformed)?;
    let (user, password) = decoded.split_once(':').ok_or_else(malformed)?;
    let addr: Option<std::net::IpAddr> = host.parse().ok();
    let failures = &core.security.auth_failures;
    let max = core.config().auth.max_failures_per_minute;
    if addr.is_some_and(|a| failures.blocked(a, max)) {
        return Err(Refusal::new(
            "429 Too Many Requests",
            "too many failed authentications from this address: try again in a minute",
        ));
    }
    let users = &core.security.users;
    if crate::auth::sasl::password_matches(users, user, password.as_bytes().to_vec()).await {
        return Ok(user.to_string());
    }
    if let Some(a) = addr {
        failures.failed(a);
    }
    Err(Refusal::new(
        "401 Unauthorized",
        "wrong user name or password (HTTP Basic)",
    ))
}

/// The request's checks beyond its syntax: the protocol it asks for, where it comes from, and
/// whether `principal` may read the topic.
fn check(
    core: &Core,
    hub: &Hub,
    head: &Head,
    req: StreamRequest,
    who: Who<'_>,
) -> Result<StreamRequest, Refusal> {
    let principal = who.principal;
    if head.websocket {
        if head.websocket_version.as_deref() != Some("13") {
            return Err(Refusal::new(
                "426 Upgrade Required",
                "WebSocket version 13 only (Sec-WebSocket-Version: 13)",
            ));
        }
        if head.websocket_key.as_deref().is_none_or(str::is_empty) {
            return Err(Refusal::new(
                "400 Bad Request",
                "a WebSocket upgrade needs Sec-WebSocket-Key",
            ));
        }
    } else if let Some(accept) = &head.accept {
        let takes_sse = accept
            .split(',')
            .map(|t| t.split(';').next().unwrap_or("").trim())
            .any(|t| t == "text/event-stream" || t == "*/*" || t == "text/*");
        if !takes_sse {
            return Err(Refusal::new(
                "406 Not Acceptable",
                "streams are text/event-stream or a WebSocket upgrade",
            ));
        }
    }
    if let Some(origin) = &head.origin {
        let allowed = &hub.config.allowed_origins;
        let listed = allowed.iter().any(|a| a == origin || a == "*");
        // With no list, browsers' own rules apply: no CORS answer, so a page of another origin
        // cannot read an SSE stream; a WebSocket (which browsers open across origins) only from
        // the page's own origin.
        let same_origin = head.host.as_deref().is_some_and(|host| {
            origin
                .split_once("://")
                .is_some_and(|(_, authority)| authority == host)
        });
        let refused = if allowed.is_empty() {
            head.websocket && !same_origin
        } else {
            !listed
        };
        if refused {
            return Err(Refusal::new(
                "403 Forbidden",
                format!("origin {origin} is not allowed (--http-allowed-origins)"),
            ));
        }
    }
    let source = crate::table::source_topic(&req.topic).unwrap_or(&req.topic);
    if !may_read(core, hub, who, source) {
        let refusal = if principal == "User:ANONYMOUS" {
            Refusal::new(
                "401 Unauthorized",
                format!(
                    "ACLs are enforced and anonymous clients may not READ topic {source:?}: \
                     send a token (Authorization: Bearer, or ?access_token=), allow \
                     User:ANONYMOUS, or name its prefix in --http-anonymous-read"
                ),
            )
        } else {
            Refusal::new(
                "403 Forbidden",
                format!("{principal} may not READ topic {source:?}"),
            )
        };
        return Err(refusal);
    }
    Ok(req)
}

/// Who asks: the principal and the host it connects from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Who<'a> {
    pub(super) principal: &'a str,
    pub(super) host: &'a str,
}

/// Whether `who` may read `topic` (always where no ACLs are enforced; anyone, for a topic under
/// an anonymous prefix).
pub(super) fn may_read(core: &Core, hub: &Hub, who: Who<'_>, topic: &str) -> bool {
    if hub
        .config
        .anonymous_read
        .iter()
        .any(|p| topic.starts_with(p.as_str()))
    {
        return true;
    }
    let config = &core.config().authorizer;
    let acls = &core.topics().acls;
    authorize(
        config,
        acls,
        who.principal,
        who.host,
        Operation::Read,
        ResourceType::Topic,
        topic,
    )
}

/// Why a stream is not served on this core.
enum Elsewhere {
    /// Its partition is served by its owner only (read replicas off, or none came in time): the
    /// connection goes there.
    HandOver(i32),
    Refused(Refusal),
}

/// How long a stream waits for a read replica it asked the owner for.
const REPLICA_WAIT: Duration = Duration::from_secs(5);

/// The partitions `req` streams, as this core serves them: owned, or read replicas (asked of
/// their owners when missing, unless the topic's read replicas are off).
async fn lanes_here(core: &Core, req: &StreamRequest) -> Result<Vec<Lane>, Elsewhere> {
    let refused = |status, why: String| Elsewhere::Refused(Refusal::new(status, why));
    let no_topic = || refused("404 Not Found", format!("no topic or view {:?}", req.topic));
    let source = crate::table::source_topic(&req.topic).ok_or_else(no_topic)?;
    let (count, policy) = {
        let table = core.topics();
        let meta = table.get(source).ok_or_else(no_topic)?;
        (meta.partitions, core.replica_policy(&table, source))
    };
    let partitions: Vec<i32> = match req.partition {
        Some(p) if p < count => vec![p],
        Some(p) => {
            let why = format!("no partition {p} of topic {:?}", req.topic);
            return Err(refused("404 Not Found", why));
        }
        None => (0..count).collect(),
    };
    let deadline = Instant::now() + REPLICA_WAIT;
    let mut lanes = Vec::with_capacity(partitions.len());
    for p in partitions {
        let mut asked = false;
        loop {
            match Lane::here(core, &req.topic, p) {
                Ok(lane) => {
                    lanes.push(lane);
                    break;
                }
                Err(ResponseError::NotLeaderOrFollower) => {}
                Err(_) => return Err(no_topic()),
            }
            let owner = core.data_owner(&req.topic, p).ok_or_else(no_topic)?;
            if owner == core.id() {
                // Its owner is this core, which has not opened it (yet, or it failed to).
                let why = format!(
                    "partition {p} of {:?} is not open yet; try again",
                    req.topic
                );
                return Err(refused("503 Service Unavailable", why));
            }
            let off = policy == crate::table::configs::ReplicaPolicy::Off;
            if off || Instant::now() >= deadline {
                if req.partition.is_some() {
                    return Err(Elsewhere::HandOver(p));
                }
                let why = if off {
                    format!(
                        "read replicas are off for topic {source:?}, and a merged stream is \
                         served where every partition is: stream it by partition \
                         (/v1/topics/{{topic}}/partitions/{{p}}/stream)"
                    )
                } else {
                    format!("no read replica of partition {p} of {source:?} here yet; try again")
                };
                return Err(refused("503 Service Unavailable", why));
            }
            if !asked {
                core.replicas.ask_for(owner, source, p);
                asked = true;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(lanes)
}

/// The answer that opens an SSE stream; `cors`: name the request's origin as allowed (it was
/// checked against `--http-allowed-origins`).
fn sse_head(head: &Head, cors: bool) -> Vec<u8> {
    let cors = match &head.origin {
        Some(origin) if cors => {
            format!("Access-Control-Allow-Origin: {origin}\r\nVary: Origin\r\n")
        }
        _ => String::new(),
    };
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
         X-Accel-Buffering: no\r\nConnection: close\r\n{cors}\r\n"
    )
    .into_bytes()
}

/// Answers with `refusal`'s status and reason, and closes.
async fn refuse(core: &Core, stream: &mut SharedStream, refusal: &Refusal) {
    add(&core.http.refused, 1);
    let body = format!("{}\n", refusal.why);
    let answer = format!(
        "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n{}\r\n{body}",
        refusal.status,
        body.len(),
        if refusal.status.starts_with("426") {
            "Sec-WebSocket-Version: 13\r\n"
        } else {
            ""
        },
    );
    let _ = futures_lite::future::or(
        async {
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.close().await;
        },
        glommio::timer::sleep(Duration::from_secs(2)),
    )
    .await;
}

/// Hands the connection (and the head it sent) to the core that owns the partition.
async fn hand_over(
    core: &Core,
    mut stream: SharedStream,
    topic: &str,
    partition: i32,
    head: Vec<u8>,
) {
    let owner = core.data_owner(topic, partition);
    if owner.is_none_or(|o| o == core.id()) {
        // Its owner is this core, which has not opened it (yet, or it failed to): try again.
        let opening = Refusal::new(
            "503 Service Unavailable",
            format!("partition {partition} of {topic:?} is not open yet; try again"),
        );
        refuse(core, &mut stream, &opening).await;
        return;
    }
    let owner = owner.expect("checked above");
    // The socket travels as a duplicate descriptor; this core's handle closes with `stream`.
    let fd = duplicate(core, &stream);
    drop(stream);
    let Some(fd) = fd else {
        return;
    };
    if core
        .mesh()
        .send(owner, CoreMsg::Stream(HandedStream { fd, head }))
        .await
    {
        add(&core.http.handed_over, 1);
    }
}
