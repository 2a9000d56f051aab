//! Admin HTTP on its own thread (`shoal-admin`): `GET /metrics` (Prometheus text, every core's
//! figures), `GET /v1/status` (JSON), the live console (`GET /` or `/console`, polling
//! `GET /v1/console`; see [`crate::console`]), and live settings: `PUT` or `POST /v1/config/<name>` with the
//! value as body (or `?value=`): `fetch_coalescing` on|off, `view_sharing` on|off, `read_replicas`
//! all|auto|off,
//! `max_delta_for_fanout` offsets; answered once every core has applied it.
//!
//! The thread never touches a core's state: it asks core 0 by message ([`AdminRequest`] on a
//! crossbeam channel) and renders the plain snapshots it gets back, so core 0's executor only
//! gathers. Requests are parsed by `httparse`; one request per connection, a bounded head, a deadline
//! per connection, and each connection on its own short-lived thread, so a slow client holds up
//! neither Kafka nor other admin requests.

use crate::control::{AdminRequest, AdminSender, Setting};
use crate::stats::{render_prometheus, CoreSnapshot};
use crate::table::TopicTable;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The console's pages.
const HTML: &str = "text/html; charset=utf-8";

/// Largest request head (request line and headers) served; larger ones get 431.
const MAX_REQUEST_HEAD: usize = 16 << 10;
/// Most headers in a request; more get 431.
const MAX_HEADERS: usize = 64;
/// Largest body read (settings are a few bytes).
const MAX_BODY: usize = 16 << 10;
/// Connections served at once; more get 503 at once.
const MAX_CONNECTIONS: usize = 32;
/// How often the thread looks at the stop flag while no connection arrives.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Longest a connection is kept open after its answer, to read what the client sent unread.
const LINGER: Duration = Duration::from_millis(500);
/// The same for connections refused past [`MAX_CONNECTIONS`], answered on the admin thread itself.
const BUSY_LINGER: Duration = Duration::from_millis(50);

/// What the admin thread knows of the server: the way to core 0, and the facts fixed at start.
#[derive(Debug, Clone)]
pub struct Cores {
    /// Requests to core 0, which gathers from and applies to every core.
    pub requests: AdminSender,
    /// Kafka port of each core.
    pub ports: Vec<u16>,
    pub data_dir: PathBuf,
    /// How long core 0 has to answer before the client gets 503. Longer than the few seconds core 0
    /// itself waits for a stuck peer's figures, so a slow peer yields a partial answer, not an error.
    pub answer_timeout: Duration,
    /// How long a client has to send its whole request before it gets 408.
    pub request_deadline: Duration,
    /// Requests other than `GET /metrics` must carry `Authorization: Bearer <token>` (else 401).
    pub token: Option<String>,
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<futures_rustls::rustls::ServerConfig>>,
    /// Serve only `GET /metrics`, to anyone (`--metrics-listen`: an address of its own for
    /// scrapers, beside a guarded admin endpoint).
    pub metrics_only: bool,
}

/// An admin connection: plain TCP, or TLS over it. Timeouts and shutdown act on the TCP socket.
trait AdminStream: Read + Write {
    fn tcp(&self) -> &TcpStream;
    /// Ends the response: TLS's close_notify, then the socket's write side.
    fn finish(&mut self) -> std::io::Result<()>;
}

impl AdminStream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
    fn finish(&mut self) -> std::io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

type TlsStream =
    futures_rustls::rustls::StreamOwned<futures_rustls::rustls::ServerConnection, TcpStream>;

impl AdminStream for TlsStream {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
    fn finish(&mut self) -> std::io::Result<()> {
        self.conn.send_close_notify();
        self.flush()?;
        self.sock.shutdown(Shutdown::Write)
    }
}

/// A response: status line, content type, body.
type Response = (&'static str, &'static str, String);

/// Starts the admin thread on `listener` (bound by the caller, so bind errors are reported at
/// start-up). It stops within `STOP_POLL` of `stop` being set; connections still being served
/// finish on their own threads, each within its deadline.
pub fn spawn(
    listener: TcpListener,
    cores: Cores,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("shoal-admin".into())
        .spawn(move || serve(listener, cores, stop))
}

fn serve(listener: TcpListener, cores: Cores, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        if !readable(&listener, STOP_POLL) {
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => {
                log::warn!("admin accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            // Answered here, so with short timeouts: a short answer fits the socket's buffer.
            let _ = stream.set_write_timeout(Some(BUSY_LINGER));
            let busy = unavailable("too many admin connections");
            let _ = respond(stream, &busy, BUSY_LINGER);
            continue;
        }
        let (cores, done) = (cores.clone(), OpenGuard(open.clone()));
        let spawned = std::thread::Builder::new()
            .name("shoal-admin-conn".into())
            .spawn(move || {
                let _done = done;
                serve_connection(stream, &cores);
            });
        if let Err(e) = spawned {
            log::warn!("admin: cannot start a connection thread: {e}");
        }
    }
}

/// Counts a connection as open until its thread ends.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether `listener` has a connection to accept within `timeout`.
fn readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd` that outlives the call.
    unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) > 0 }
}

fn serve_connection(stream: TcpStream, cores: &Cores) {
    let _ = stream.set_nonblocking(false);
    match &cores.tls {
        None => serve_stream(stream, cores),
        Some(tls) => match futures_rustls::rustls::ServerConnection::new(tls.clone()) {
            Ok(conn) => serve_stream(TlsStream::new(conn, stream), cores),
            Err(e) => log::warn!("admin: TLS: {e}"),
        },
    }
}

fn serve_stream(mut stream: impl AdminStream, cores: &Cores) {
    let deadline = Instant::now() + cores.request_deadline;
    let response = match read_request(&mut stream, deadline) {
        Ok(Some(request)) => route(&request, cores),
        Ok(None) => return,
        Err(response) => response,
    };
    let _ = stream.tcp().set_write_timeout(Some(cores.request_deadline));
    let _ = respond(stream, &response, LINGER);
}

/// A request as read off the wire.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    /// Path and query, as sent.
    target: String,
    /// The `Authorization` header's value, if sent.
    authorization: Option<String>,
    /// The console's token cookie (`shoal_admin_token`), if sent.
    cookie_token: Option<String>,
    body: Vec<u8>,
}

/// Reads one request: `Ok(None)` if the client left before a whole head, `Err` with the answer for
/// a head too large, malformed or too slow.
fn read_request(
    stream: &mut impl AdminStream,
    deadline: Instant,
) -> Result<Option<Request>, Response> {
    let mut buf = Vec::new();
    let (method, target, (authorization, cookie_token), head_len, content_length) = loop {
        match read_some(stream, &mut buf, deadline)? {
            0 => return Ok(None),
            _ => {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut parsed = httparse::Request::new(&mut headers);
                match parsed.parse(&buf) {
                    Ok(httparse::Status::Complete(n)) if n <= MAX_REQUEST_HEAD => {
                        break (
                            parsed.method.unwrap_or("").to_string(),
                            parsed.path.unwrap_or("").to_string(),
                            credentials(parsed.headers),
                            n,
                            content_length(parsed.headers),
                        );
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_REQUEST_HEAD => {}
                    Ok(_) | Err(httparse::Error::TooManyHeaders) => return Err(too_large()),
                    Err(e) => {
                        return Err((
                            "400 Bad Request",
                            "text/plain",
                            format!("bad request: {e}\n"),
                        ))
                    }
                }
            }
        }
    };
    // Then the body, as long as Content-Length says (bounded); a client that closes early sends
    // what it sent.
    let want = head_len + content_length.min(MAX_BODY);
    while buf.len() < want {
        if read_some(stream, &mut buf, deadline)? == 0 {
            break;
        }
    }
    Ok(Some(Request {
        method,
        target,
        authorization,
        cookie_token,
        body: buf.split_off(head_len),
    }))
}

/// Reads what has arrived into `buf` (0 at end of stream or on a reset); 408 past `deadline`.
fn read_some(
    stream: &mut impl AdminStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<usize, Response> {
    let timed_out = || {
        (
            "408 Request Timeout",
            "text/plain",
            "request timeout\n".to_string(),
        )
    };
    let mut chunk = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        let _ = stream.tcp().set_read_timeout(Some(left));
        match stream.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out())
            }
            Err(_) => return Ok(0),
        }
    }
}

/// The `Authorization` header's value and the console's token cookie, where sent.
fn credentials(headers: &[httparse::Header<'_>]) -> (Option<String>, Option<String>) {
    fn header<'a>(
        headers: &'a [httparse::Header<'_>],
        name: &'static str,
    ) -> impl Iterator<Item = &'a str> {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
    }
    let authorization = header(headers, "authorization")
        .next()
        .map(|v| v.trim().to_string());
    let cookie = header(headers, "cookie")
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.trim().to_string());
    (authorization, cookie)
}

/// The cookie the console's login page keeps the admin token in (SameSite=Strict), taken for
/// GET requests only: a cookie cannot change a setting.
const TOKEN_COOKIE: &str = "shoal_admin_token";

/// The Content-Length header's value, 0 if absent or unreadable.
fn content_length(headers: &[httparse::Header<'_>]) -> usize {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

fn too_large() -> Response {
    (
        "431 Request Header Fields Too Large",
        "text/plain",
        "request too large\n".to_string(),
    )
}

fn unavailable(why: &str) -> Response {
    ("503 Service Unavailable", "text/plain", format!("{why}\n"))
}

/// Whether `request` may be served: `GET /metrics` always (scrapers), the rest with the token.
fn authorized(request: &Request, path: &str, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    if request.method == "GET" && path == "/metrics" {
        return true;
    }
    let matches =
        |given: &str| crate::auth::scram::constant_time_eq(given.as_bytes(), token.as_bytes());
    let bearer = request
        .authorization
        .as_deref()
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| matches(given.trim()));
    let cookie = request.method == "GET"
        && request
            .cookie_token
            .as_deref()
            .map(crate::console::percent_decode)
            .is_some_and(|given| matches(&given));
    bearer || cookie
}

fn route(request: &Request, cores: &Cores) -> Response {
    let target = request.target.as_str();
    let path = target.split('?').next().unwrap_or("");
    if cores.metrics_only && !(request.method == "GET" && path == "/metrics") {
        return (
            "404 Not Found",
            "text/plain",
            "this address serves GET /metrics only\n".to_string(),
        );
    }
    if !authorized(request, path, cores.token.as_deref()) {
        if request.method == "GET" && matches!(path, "/" | "/console") {
            // A browser cannot send a bearer token: the login page (no data) keeps it in a cookie.
            return (
                "401 Unauthorized",
                HTML,
                crate::console::LOGIN_PAGE.to_string(),
            );
        }
        log::warn!(
            "admin: {} {path} refused: no valid bearer token",
            request.method
        );
        return (
            "401 Unauthorized",
            "text/plain",
            "a bearer token is required: Authorization: Bearer <token>\n".to_string(),
        );
    }
    match (request.method.as_str(), path) {
        ("PUT" | "POST", setting) if setting.starts_with("/v1/config/") => {
            let value = query_value(target)
                .or_else(|| body_text(&request.body))
                .unwrap_or_default();
            match parse_setting(&setting["/v1/config/".len()..], value.trim()) {
                Ok(s) => match cores.ask(|reply| AdminRequest::Set(s, reply)) {
                    Ok(()) => ("200 OK", "text/plain", format!("{s:?}\n")),
                    Err(unanswered) => unanswered,
                },
                Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
            }
        }
        ("GET", "/metrics") => match cores.ask(AdminRequest::Stats) {
            Ok(stats) => (
                "200 OK",
                "text/plain; version=0.0.4",
                render_prometheus(&stats),
            ),
            Err(unanswered) => unanswered,
        },
        ("GET", "/v1/status") => match cores.ask(AdminRequest::Status) {
            Ok((stats, table)) => (
                "200 OK",
                "application/json",
                cores.status_json(&stats, &table),
            ),
            Err(unanswered) => unanswered,
        },
        ("GET", "/" | "/console") => ("200 OK", HTML, crate::console::PAGE.to_string()),
        ("GET", "/v1/console") => match cores.ask(AdminRequest::Status) {
            Ok((stats, table)) => (
                "200 OK",
                "application/json",
                crate::console::console_json(
                    &stats,
                    &table,
                    &cores.ports,
                    &crate::console::ConsoleQuery::parse(target),
                ),
            ),
            Err(unanswered) => unanswered,
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /console, /metrics or /v1/status\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".to_string(),
        ),
    }
}

impl Cores {
    /// Sends core 0 the request `make(reply)` and waits for the answer; 503 if core 0 does not take
    /// the request or answer within [`Cores::answer_timeout`].
    fn ask<T>(
        &self,
        make: impl FnOnce(crossbeam_channel::Sender<T>) -> AdminRequest,
    ) -> Result<T, Response> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        if !self.requests.send(make(reply)) {
            return Err(unavailable("core 0 is not taking admin requests"));
        }
        answer.recv_timeout(self.answer_timeout).map_err(|_| {
            log::warn!(
                "admin: core 0 did not answer within {:?}",
                self.answer_timeout
            );
            unavailable("core 0 did not answer in time")
        })
    }

    fn status_json(&self, stats: &[CoreSnapshot], table: &TopicTable) -> String {
        let cores = self.ports.len();
        let topics: serde_json::Map<String, serde_json::Value> = table
            .topics
            .iter()
            .map(|(name, m)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "partitions": m.partitions,
                        "configs": m.configs,
                        "leaders": (0..m.partitions).map(|p| table.owner(m, p, cores)).collect::<Vec<_>>(),
                        // Each partition's read replica cores, as its owner core says.
                        "replica_cores": (0..m.partitions).map(|p| {
                            let owner = table.owner(m, p, cores);
                            stats
                                .iter()
                                .find(|s| s.core == owner)
                                .and_then(|s| {
                                    s.replicas.replica_cores.iter().find(|r| r.0 == *name && r.1 == p)
                                })
                                .map_or_else(Vec::new, |r| r.2.clone())
                        }).collect::<Vec<_>>(),
                    }),
                )
            })
            .collect();
        let per_core: Vec<serde_json::Value> = stats
            .iter()
            .map(|s| {
                serde_json::json!({
                    "core": s.core,
                    "port": self.ports[s.core],
                    "connections_open": s.kafka.connections_open,
                    "partitions": s.partitions.len(),
                    "read_replicas": s.replicas.held,
                    "log_bytes": s.partitions.iter().map(|p| p.size_bytes).sum::<u64>(),
                    "tail_cache_bytes": s.tail_cache.used_bytes as u64,
                    "storage_errors": s.storage.errors,
                    "storage_failing": s.storage.failing_logs,
                    "edge": s.edge,
                })
            })
            .collect();
        // Partitions whose appends fail now, with the failure that started it.
        let storage_failures: Vec<serde_json::Value> = stats
            .iter()
            .flat_map(|s| {
                s.partitions.iter().filter_map(move |p| {
                    p.storage_failure.as_ref().map(|error| {
                        serde_json::json!({
                            "core": s.core,
                            "topic": p.topic,
                            "partition": p.partition,
                            "error": error,
                        })
                    })
                })
            })
            .collect();
        // Edge mode: each partition's upstream position, where a consumer has asked for it.
        let upstream: Vec<serde_json::Value> = stats
            .iter()
            .flat_map(|s| {
                s.partitions.iter().filter_map(move |p| {
                    p.upstream.as_ref().map(|u| {
                        serde_json::json!({
                            "core": s.core,
                            "topic": p.topic,
                            "partition": p.partition,
                            "log_start_offset": p.log_start_offset,
                            "high_watermark": p.high_watermark,
                            "upstream": u,
                        })
                    })
                })
            })
            .collect();
        // Partitions with read replicas on other cores: each with its leader and those cores.
        let replicated: Vec<serde_json::Value> = stats
            .iter()
            .flat_map(|s| {
                s.replicas
                    .replica_cores
                    .iter()
                    .filter_map(move |(topic, partition, cores)| {
                        let owner = table
                            .get(topic)
                            .map(|m| table.owner(m, *partition, self.ports.len()))?;
                        (owner == s.core).then(|| {
                            serde_json::json!({
                                "topic": topic,
                                "partition": partition,
                                "leader": owner,
                                "replica_cores": cores,
                            })
                        })
                    })
            })
            .collect();
        // Consumer groups' lag as their coordinator cores last computed it.
        let group_lag: Vec<serde_json::Value> = stats
            .iter()
            .flat_map(|s| {
                s.group_lag.iter().map(move |g| {
                    let mut v = serde_json::json!(g);
                    v["coordinator"] = s.core.into();
                    v
                })
            })
            .collect();
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "group_lag": group_lag,
            "replicated_partitions": replicated,
            "upstream_partitions": upstream,
            "data_dir": self.data_dir,
            "topic_table_revision": table.revision,
            "topics": topics,
            "cores": per_core,
            "storage_failures": storage_failures,
        })
        .to_string()
    }
}

/// A live setting from its name and value.
fn parse_setting(name: &str, value: &str) -> Result<Setting, String> {
    match name {
        "fetch_coalescing" => parse_on_off(value).map(Setting::FetchCoalescing),
        "view_sharing" => parse_on_off(value).map(Setting::ViewSharing),
        "max_delta_for_fanout" => value
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .map(Setting::MaxDeltaForFanout)
            .ok_or_else(|| {
                format!("max_delta_for_fanout takes a number of offsets, not {value:?}")
            }),
        "read_replicas" => {
            crate::table::configs::ReplicaPolicy::parse(value).map(Setting::ReadReplicas)
        }
        "group_lag_interval_ms" => value
            .parse::<u64>()
            .map(|ms| Setting::GroupLagInterval(Duration::from_millis(ms)))
            .map_err(|_| {
                format!("group_lag_interval_ms takes milliseconds (0: off), not {value:?}")
            }),
        _ => Err(format!(
            "unknown setting {name:?}: fetch_coalescing, view_sharing, max_delta_for_fanout, \
             read_replicas, group_lag_interval_ms"
        )),
    }
}

/// `on`/`off` (also `true`/`false`), for live settings and the flags that set them at start.
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

/// `value` from a `?value=...` query.
fn query_value(target: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("value="))
        .map(str::to_string)
}

/// The body, if it holds more than white space.
fn body_text(body: &[u8]) -> Option<String> {
    Some(String::from_utf8_lossy(body).to_string()).filter(|s| !s.trim().is_empty())
}

/// Writes the response and closes the connection. What the client sent and was not read is drained
/// for a moment first (at most `linger`), so the close is a FIN the client reads the answer
/// before, not a reset.
fn respond(
    mut stream: impl AdminStream,
    response: &Response,
    linger: Duration,
) -> std::io::Result<()> {
    write_response(&mut stream, response)?;
    stream.finish()?;
    let until = Instant::now() + linger;
    let mut sink = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.tcp().set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}

fn write_response(stream: &mut impl Write, (status, kind, body): &Response) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An admin thread on a free port, with a stand-in for core 0 that answers as `core0` says.
    fn start(
        answer_timeout: Duration,
        request_deadline: Duration,
        core0: impl FnOnce(crossbeam_channel::Receiver<AdminRequest>) + Send + 'static,
    ) -> (std::net::SocketAddr, Arc<AtomicBool>, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (requests, inbox) = crate::control::admin_link(16).unwrap();
        std::thread::spawn(move || core0(inbox.requests));
        let cores = Cores {
            requests,
            ports: vec![9092],
            data_dir: PathBuf::from("/data"),
            answer_timeout,
            request_deadline,
            token: None,
            tls: None,
            metrics_only: false,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let thread = spawn(listener, cores, stop.clone()).unwrap();
        (addr, stop, thread)
    }

    /// Answers every request like a one-core server with no traffic.
    fn idle_core0(rx: crossbeam_channel::Receiver<AdminRequest>) {
        for request in rx {
            let stats = vec![CoreSnapshot::default()];
            match request {
                AdminRequest::Stats(reply) => drop(reply.send(stats)),
                AdminRequest::Status(reply) => drop(reply.send((stats, TopicTable::default()))),
                AdminRequest::Set(_, reply) => drop(reply.send(())),
            }
        }
    }

    /// Sends `raw` and returns everything the server answered before closing.
    fn exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        String::from_utf8_lossy(&out).to_string()
    }

    fn status_line(answer: &str) -> &str {
        answer.lines().next().unwrap_or("")
    }

    #[test]
    fn answers_each_path_with_its_status_and_closes() {
        let (addr, stop, thread) =
            start(Duration::from_secs(5), Duration::from_secs(10), idle_core0);
        let get = |path: &str| {
            exchange(
                addr,
                format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
            )
        };
        let metrics = get("/metrics");
        assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK");
        assert!(metrics.contains("Content-Type: text/plain; version=0.0.4\r\n"));
        assert!(
            metrics.contains("shoal_connections_open{core=\"0\"} 0"),
            "{metrics}"
        );
        let status = get("/v1/status?pretty");
        assert_eq!(status_line(&status), "HTTP/1.1 200 OK");
        let body = status.split_once("\r\n\r\n").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["cores"][0]["port"], 9092);
        assert_eq!(json["data_dir"], "/data");
        assert_eq!(status_line(&get("/nope")), "HTTP/1.1 404 Not Found");
        let delete = exchange(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status_line(&delete), "HTTP/1.1 405 Method Not Allowed");
        let set = exchange(
            addr,
            b"POST /v1/config/view_sharing?value=off HTTP/1.1\r\n\r\n",
        );
        assert_eq!(status_line(&set), "HTTP/1.1 200 OK");
        assert!(set.ends_with("\r\n\r\nViewSharing(false)\n"), "{set}");
        let set = exchange(
            addr,
            b"PUT /v1/config/max_delta_for_fanout HTTP/1.1\r\nContent-Length: 4\r\n\r\n 12\n",
        );
        assert!(set.ends_with("\r\n\r\nMaxDeltaForFanout(12)\n"), "{set}");
        let bad = exchange(
            addr,
            b"PUT /v1/config/view_sharing HTTP/1.1\r\nContent-Length: 5\r\n\r\nmaybe",
        );
        assert_eq!(status_line(&bad), "HTTP/1.1 400 Bad Request");
        assert!(
            bad.ends_with("expected on or off, not \"maybe\"\n"),
            "{bad}"
        );
        let mut huge = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        huge.resize(huge.len() + MAX_REQUEST_HEAD + 10, b'a');
        huge.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            status_line(&exchange(addr, &huge)),
            "HTTP/1.1 431 Request Header Fields Too Large"
        );
        let garbage = exchange(addr, b"\x01\x02 nonsense\r\n\r\n");
        assert_eq!(status_line(&garbage), "HTTP/1.1 400 Bad Request");
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();
    }

    #[test]
    fn a_core_that_does_not_answer_gets_503_in_bounded_time() {
        // Core 0 takes requests but never answers them.
        let (kept, keep) = crossbeam_channel::unbounded();
        let (addr, stop, thread) = start(
            Duration::from_millis(300),
            Duration::from_secs(10),
            move |rx| {
                for request in rx {
                    kept.send(request).unwrap();
                }
            },
        );
        let started = Instant::now();
        let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status_line(&answer), "HTTP/1.1 503 Service Unavailable");
        assert!(
            answer.ends_with("core 0 did not answer in time\n"),
            "{answer}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(keep.len(), 1, "the request reached core 0");
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();
    }

    #[test]
    fn a_stuck_client_delays_no_one_and_the_thread_stops_on_the_flag() {
        let (addr, stop, thread) =
            start(Duration::from_secs(5), Duration::from_secs(10), idle_core0);
        // Half a head, and half a body, never finished.
        let mut half_head = TcpStream::connect(addr).unwrap();
        half_head.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
        let mut half_body = TcpStream::connect(addr).unwrap();
        half_body
            .write_all(b"PUT /v1/config/view_sharing HTTP/1.1\r\nContent-Length: 3\r\n\r\no")
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        for _ in 0..5 {
            let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            assert_eq!(status_line(&answer), "HTTP/1.1 200 OK");
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "5 requests took {:?} beside stuck clients",
            started.elapsed()
        );
        let stopping = Instant::now();
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();
        assert!(stopping.elapsed() < Duration::from_secs(1));
        assert!(TcpStream::connect(addr).is_err(), "the listener is closed");
    }

    #[test]
    fn a_request_not_sent_in_time_gets_408() {
        let deadline = Duration::from_millis(500);
        let (addr, stop, thread) = start(Duration::from_secs(5), deadline, idle_core0);
        let started = Instant::now();
        let answer = exchange(
            addr,
            b"PUT /v1/config/view_sharing HTTP/1.1\r\nContent-Length: 3\r\n\r\no",
        );
        assert_eq!(status_line(&answer), "HTTP/1.1 408 Request Timeout");
        assert!(started.elapsed() >= deadline && started.elapsed() < deadline * 10);
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();
    }

    #[test]
    fn connections_past_the_cap_get_503_until_the_quiet_ones_time_out() {
        // Long enough that no quiet connection times out before the probe behind them is accepted,
        // however loaded the machine (a 500 ms deadline once let one expire first under CI load).
        let deadline = Duration::from_secs(3);
        let (addr, stop, thread) = start(Duration::from_secs(5), deadline, idle_core0);
        // As many quiet connections as are served at once, then one more.
        let quiet: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // The listener accepts in arrival order, so the probe is accepted after every quiet one.
        let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status_line(&answer), "HTTP/1.1 503 Service Unavailable");
        assert!(answer.ends_with("too many admin connections\n"), "{answer}");
        // Once they are timed out, connections are served again.
        std::thread::sleep(deadline + LINGER + Duration::from_millis(300));
        let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status_line(&answer), "HTTP/1.1 200 OK");
        drop(quiet);
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();
    }

    #[test]
    fn settings_parse_as_before() {
        assert_eq!(
            parse_setting("fetch_coalescing", "on"),
            Ok(Setting::FetchCoalescing(true))
        );
        assert_eq!(
            parse_setting("view_sharing", "false"),
            Ok(Setting::ViewSharing(false))
        );
        assert_eq!(
            parse_setting("max_delta_for_fanout", "500"),
            Ok(Setting::MaxDeltaForFanout(500))
        );
        assert!(parse_setting("max_delta_for_fanout", "-3").is_err());
        assert_eq!(
            parse_setting("group_lag_interval_ms", "250"),
            Ok(Setting::GroupLagInterval(Duration::from_millis(250)))
        );
        assert!(parse_setting("group_lag_interval_ms", "soon").is_err());
        assert!(parse_setting("fetch_coalescing", "maybe").is_err());
        assert!(parse_setting("nonsense", "1").is_err());
        assert_eq!(query_value("/v1/config/x?a=b&value=on"), Some("on".into()));
        assert_eq!(query_value("/v1/config/x"), None);
    }
}
