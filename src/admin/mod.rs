//! Admin HTTP on its own thread (`shoal-admin`): `GET /metrics` (Prometheus text, every core's
//! figures), `GET /v1/status` (JSON), the live console (`GET /` or `/console`, polling
//! `GET /v1/console`; see [`crate::console`]), and live settings: `PUT` or `POST
//! /v1/config/<name>` with the value as body (or `?value=`): `fetch_coalescing` on|off,
//! `view_sharing` on|off, `read_replicas` all|auto|off, `max_delta_for_fanout` offsets,
//! `group_lag_interval_ms`; answered once every core has applied it, as JSON in the words of the
//! request (`{"read_replicas":"all"}`). `GET /v1/config` (all) and `GET /v1/config/<name>` read
//! them back the same way.
//!
//! The thread never touches a core's state: it asks core 0 by message ([`AdminRequest`] on a
//! crossbeam channel) and renders the plain snapshots it gets back, so core 0's executor only
//! gathers. Requests are parsed by `httparse`; one request per connection, a bounded head, a deadline
//! per connection, and each connection on its own short-lived thread, so a slow client holds up
//! neither Kafka nor other admin requests. A thread of the console's samples the cores' figures
//! for its charts ([`crate::console::History`]) the same way.
//!
//! ## Layout, top layer first
//! - `status`   — `/v1/status`'s JSON from the cores' snapshots and the topic table.
//! - `settings` — live settings by name: parsed from a request, written back as JSON.
//! - `link`     — the channel and doorbell to core 0, and core 0's side of it.
//! - `http`     — requests read and responses written, over plain TCP or TLS.

mod http;
mod link;
mod settings;
mod status;

use crate::console::History;
use crate::stats::render_prometheus;
use http::*;
pub use link::{admin_link, serve_admin, AdminInbox, AdminRequest, AdminSender};
pub use settings::parse_on_off;
use settings::{parse_setting, settings_json, unknown_setting, NAMES};
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The console's pages.
const HTML: &str = "text/html; charset=utf-8";

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
    /// `/metrics` lists each partition's log figures (`--metrics-per-partition`), not only their
    /// sums per core.
    pub metrics_per_partition: bool,
}

/// Starts the admin thread on `listener` (bound by the caller, so bind errors are reported at
/// start-up). It stops within `STOP_POLL` of `stop` being set; connections still being served
/// finish on their own threads, each within its deadline.
pub fn spawn(
    listener: TcpListener,
    cores: Cores,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let (history, sampler) = if cores.metrics_only {
        (Arc::new(History::new()), None)
    } else {
        let asking = cores.clone();
        let (history, thread) =
            History::spawn(move || asking.ask(AdminRequest::Sample).ok(), stop.clone())?;
        (history, Some(thread))
    };
    std::thread::Builder::new()
        .name("shoal-admin".into())
        .spawn(move || {
            serve(listener, cores, history, stop);
            // The console's sampler sees the same flag: joined here, so that a joined admin
            // thread leaves nothing asking core 0.
            if let Some(thread) = sampler {
                let _ = thread.join();
            }
        })
}

fn serve(listener: TcpListener, cores: Cores, history: Arc<History>, stop: Arc<AtomicBool>) {
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
        let (cores, history, done) = (cores.clone(), history.clone(), OpenGuard(open.clone()));
        let spawned = std::thread::Builder::new()
            .name("shoal-admin-conn".into())
            .spawn(move || {
                let _done = done;
                serve_connection(stream, &cores, &history);
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

fn serve_connection(stream: TcpStream, cores: &Cores, history: &History) {
    let _ = stream.set_nonblocking(false);
    match &cores.tls {
        None => serve_stream(stream, cores, history),
        Some(tls) => match futures_rustls::rustls::ServerConnection::new(tls.clone()) {
            Ok(conn) => serve_stream(TlsStream::new(conn, stream), cores, history),
            Err(e) => log::warn!("admin: TLS: {e}"),
        },
    }
}

fn serve_stream(mut stream: impl AdminStream, cores: &Cores, history: &History) {
    let deadline = Instant::now() + cores.request_deadline;
    let response = match read_request(&mut stream, deadline) {
        Ok(Some(request)) => route(&request, cores, history),
        Ok(None) => return,
        Err(response) => response,
    };
    let _ = stream.tcp().set_write_timeout(Some(cores.request_deadline));
    let _ = respond(stream, &response, LINGER);
}

fn route(request: &Request, cores: &Cores, history: &History) -> Response {
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
            set_setting(request, &setting["/v1/config/".len()..], cores)
        }
        ("GET", "/v1/config") => get_settings(None, cores),
        ("GET", setting) if setting.starts_with("/v1/config/") => {
            get_settings(Some(&setting["/v1/config/".len()..]), cores)
        }
        ("GET", "/metrics") => match cores.ask(AdminRequest::Stats) {
            Ok(stats) => (
                "200 OK",
                "text/plain; version=0.0.4",
                render_prometheus(&stats, cores.metrics_per_partition),
            ),
            Err(unanswered) => unanswered,
        },
        ("GET", "/v1/status") => {
            let asked = cores.ask(AdminRequest::Status).and_then(|status| {
                cores
                    .ask(AdminRequest::Settings)
                    .map(|settings| (status, settings))
            });
            match asked {
                Ok(((stats, table), settings)) => (
                    "200 OK",
                    "application/json",
                    cores.status_json(&stats, &table, &settings),
                ),
                Err(unanswered) => unanswered,
            }
        }
        ("GET", "/" | "/console") => ("200 OK", HTML, crate::console::PAGE.to_string()),
        ("GET", "/v1/console") => match cores.ask(AdminRequest::Status) {
            Ok((stats, table)) => (
                "200 OK",
                "application/json",
                crate::console::console_json(
                    &stats,
                    &table,
                    &crate::console::Broker {
                        ports: &cores.ports,
                        data_dir: &cores.data_dir,
                        history,
                    },
                    &crate::console::ConsoleQuery::parse(target),
                ),
            ),
            Err(unanswered) => unanswered,
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /console, /metrics, /v1/status or /v1/config\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served (PUT or POST on /v1/config/<name>)\n".to_string(),
        ),
    }
}

/// `PUT /v1/config/<name>`: the value from `?value=` or the body, applied on every core.
fn set_setting(request: &Request, name: &str, cores: &Cores) -> Response {
    let value = query_value(&request.target)
        .or_else(|| body_text(&request.body))
        .unwrap_or_default();
    match parse_setting(name, value.trim()) {
        Ok(s) => match cores.ask(|reply| AdminRequest::Set(s, reply)) {
            Ok(()) => ("200 OK", "application/json", settings_json([&s])),
            Err(unanswered) => unanswered,
        },
        Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
    }
}

/// `GET /v1/config` (`name` none: every live setting) or `GET /v1/config/<name>`.
fn get_settings(name: Option<&str>, cores: &Cores) -> Response {
    if let Some(name) = name.filter(|n| !NAMES.contains(n)) {
        return ("404 Not Found", "text/plain", unknown_setting(name) + "\n");
    }
    match cores.ask(AdminRequest::Settings) {
        Ok(settings) => {
            let asked = settings
                .iter()
                .filter(|s| name.is_none_or(|n| settings::name_and_value(s).0 == n));
            ("200 OK", "application/json", settings_json(asked))
        }
        Err(unanswered) => unanswered,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::CoreSnapshot;
    use crate::table::TopicTable;
    use std::io::{Read, Write};

    /// An admin thread on a free port, with a stand-in for core 0 that answers as `core0` says.
    fn start(
        answer_timeout: Duration,
        request_deadline: Duration,
        core0: impl FnOnce(crossbeam_channel::Receiver<AdminRequest>) + Send + 'static,
    ) -> (std::net::SocketAddr, Arc<AtomicBool>, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (requests, inbox) = admin_link(16).unwrap();
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
            metrics_per_partition: false,
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
                AdminRequest::Stats(reply) | AdminRequest::Sample(reply) => drop(reply.send(stats)),
                AdminRequest::Status(reply) => drop(reply.send((stats, TopicTable::default()))),
                AdminRequest::Set(_, reply) => drop(reply.send(())),
                AdminRequest::Settings(reply) => drop(reply.send(Vec::new())),
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
        assert!(
            set.ends_with("\r\n\r\n{\"view_sharing\":\"off\"}\n"),
            "{set}"
        );
        let set = exchange(
            addr,
            b"PUT /v1/config/max_delta_for_fanout HTTP/1.1\r\nContent-Length: 4\r\n\r\n 12\n",
        );
        assert!(
            set.ends_with("\r\n\r\n{\"max_delta_for_fanout\":12}\n"),
            "{set}"
        );
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
}
