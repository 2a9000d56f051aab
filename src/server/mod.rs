//! Runtime bootstrap: one pinned glommio executor per core, each a Kafka broker on its own port, joined
//! by a channel mesh for the control plane; the admin HTTP thread beside them; and an orderly stop on
//! SIGINT/SIGTERM.

mod data_dir;
mod listeners;
mod one_core;

use crate::admin;
use crate::auth::SecurityProtocol;
use crate::cores::config::BrokerConfig;
use crate::cores::mesh::CoreMsg;
use crate::cores::Listener;
use data_dir::*;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{LocalExecutorBuilder, Placement};
use listeners::*;
use one_core::run_core;
use std::net::SocketAddr;
use std::os::fd::{IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a stopping server waits for open connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(5);
/// Admin requests waiting for core 0; more are answered 503.
const ADMIN_QUEUE: usize = 64;
/// How long core 0 has to answer an admin request.
const ADMIN_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an admin client has to send its request.
const ADMIN_REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// What the server process is told to do: where it listens, how many cores, and the broker
/// settings every core runs with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Core 0's Kafka address; core i listens on port + i (port 0: any free ports). Its security
    /// follows from the TLS and SASL settings; unused when `listeners` is not empty.
    pub listen: SocketAddr,
    /// Kafka listeners with their own security (`--listener SSL://HOST:PORT`), each on port + i
    /// for core i; empty: the one `listen` describes.
    pub listeners: Vec<(SecurityProtocol, SocketAddr)>,
    /// Admin HTTP address.
    pub admin: SocketAddr,
    /// Cores (executors, brokers) to run.
    pub cores: usize,
    /// How long to keep retrying a listen address still in use at start-up.
    pub bind_retry: Duration,
    /// Serve the admin endpoint over HTTPS with the Kafka listeners' certificate and key.
    pub admin_tls: bool,
    /// An address of its own where `GET /metrics` is served to anyone, over plain HTTP.
    pub metrics_listen: Option<SocketAddr>,
    /// `/metrics` has each partition's log figures, not only their sums per core.
    pub metrics_per_partition: bool,
    /// A file holding the admin HTTP endpoint's bearer token (every request but `GET /metrics`
    /// then needs it).
    pub admin_token_file: Option<PathBuf>,
    /// Where topics are streamed over HTTP (SSE and WebSocket), on every core; `None`: nowhere.
    pub http_listen: Option<SocketAddr>,
    /// Serve the streams over TLS with the Kafka listeners' certificate (`--http-tls`).
    pub http_tls: bool,
    pub http: crate::http::HttpConfig,
    pub broker: BrokerConfig,
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    /// Kafka port of each core (broker id = index) on the first listener.
    pub ports: Vec<u16>,
    /// Every Kafka listener, with each core's port.
    pub listeners: Vec<Listener>,
    pub admin: SocketAddr,
    stop: Arc<AtomicBool>,
    cores: Vec<glommio::ExecutorJoinHandle<()>>,
    admin_thread: std::thread::JoinHandle<()>,
    /// `--metrics-listen`'s address and thread.
    pub metrics: Option<SocketAddr>,
    /// `--http-listen`'s address, every core's.
    pub http: Option<SocketAddr>,
    metrics_thread: Option<std::thread::JoinHandle<()>>,
    /// Held while the server runs: one process per data directory.
    _data_dir_lock: std::fs::File,
}

impl Server {
    /// Binds every listener, then starts the cores. Returns once the ports accept connections.
    pub fn start(mut config: ServerConfig) -> std::io::Result<Server> {
        let cores = config.cores.max(1);
        let admin_token = config
            .admin_token_file
            .as_deref()
            .map(read_admin_token)
            .transpose()?;
        let broker = &mut config.broker;
        broker.data_dir = resolve_data_dir(&broker.data_dir)?;
        log::info!("data directory: {}", broker.data_dir.display());
        let asked = broker.max_open_files_per_core;
        broker.max_open_files_per_core = Some(open_files_per_core(asked, cores));
        let data_dir_lock = lock_data_dir(&broker.data_dir)?;
        claim_data_dir(
            &broker.data_dir,
            broker.edge.as_ref().map(|e| e.upstream_list()),
        )?;
        if let Some(tls) = &broker.auth.tls {
            check_and_log_tls(tls)?;
        }
        let wanted = wanted_listeners(&config)?;
        let admin_tls = admin_tls(config.admin_tls, config.broker.auth.tls.as_ref())?;
        config.http.tls = http_tls(config.http_tls, config.broker.auth.tls.as_ref())?;
        let table = crate::control::load_table(&config.broker.data_dir)?;
        let retry = config.bind_retry;
        let (sockets, listeners) = bind_listeners(&wanted, cores, retry)?;
        let ports = listeners[0].ports.clone();
        let admin_listener = bind_named(config.admin, "the admin address", retry)?;
        let admin = admin_listener.local_addr()?;
        let metrics_listener = config
            .metrics_listen
            .map(|addr| bind_named(addr, "the metrics address", retry))
            .transpose()?;
        let http_sockets = bind_streams(&config, cores, retry)?;
        reshard_internal_logs(&config.broker.data_dir, cores)?;
        let http = match &http_sockets {
            Some(sockets) => Some(sockets[0].local_addr()?),
            None => None,
        };
        let (admin_requests, admin_inbox) = admin::admin_link(ADMIN_QUEUE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let broker = Arc::new(config.broker);
        let http_config = config.http.clone();
        let http_listeners = http_sockets.map(|s| (s, http_config));
        let handles = spawn_cores(
            sockets,
            http_listeners,
            &broker,
            &listeners,
            admin_inbox,
            &stop,
            &table,
        )?;
        let admin_cores = admin::Cores {
            requests: admin_requests,
            ports: ports.clone(),
            data_dir: broker.data_dir.clone(),
            answer_timeout: ADMIN_ANSWER_TIMEOUT,
            request_deadline: ADMIN_REQUEST_DEADLINE,
            token: admin_token,
            tls: admin_tls,
            metrics_only: false,
            metrics_per_partition: config.metrics_per_partition,
        };
        let metrics_cores = admin::Cores {
            token: None,
            tls: None,
            metrics_only: true,
            ..admin_cores.clone()
        };
        let admin_thread = spawn_admin(admin_listener, admin_cores, &stop, "admin")?;
        let (metrics, metrics_thread) = match metrics_listener {
            None => (None, None),
            Some(l) => {
                let addr = l.local_addr()?;
                (
                    Some(addr),
                    Some(spawn_admin(l, metrics_cores, &stop, "metrics")?),
                )
            }
        };
        log::info!("shoal serving on ports {ports:?} ({cores} cores), admin on {admin}");
        if let Some(addr) = http {
            log::info!("streaming topics over HTTP (SSE, WebSocket) on {addr}, every core");
        }
        Ok(Server {
            http,
            ports,
            listeners,
            admin,
            stop,
            cores: handles,
            admin_thread,
            metrics,
            metrics_thread,
            _data_dir_lock: data_dir_lock,
        })
    }

    /// Asks every core to stop: no new connections, in-flight requests finish, logs close cleanly.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// A flag that stops the server when set (for signal handlers).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Waits for every core and the admin thread to finish; an error if any core failed (the others
    /// were stopped).
    pub fn wait(self) -> std::io::Result<()> {
        let mut failed = Vec::new();
        for (i, h) in self.cores.into_iter().enumerate() {
            if let Err(e) = h.join() {
                log::error!("core {i} failed: {e}");
                failed.push(i);
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        if self.admin_thread.join().is_err() {
            log::error!("the admin thread panicked");
        }
        if let Some(t) = self.metrics_thread {
            if t.join().is_err() {
                log::error!("the metrics thread panicked");
            }
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(std::io::Error::other(format!(
                "core(s) {failed:?} failed; see the log"
            ))),
        }
    }
}

/// The admin token in `path` (trimmed), refused if shorter than 16 characters.
fn read_admin_token(path: &Path) -> std::io::Result<String> {
    let token = std::fs::read_to_string(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
        .trim()
        .to_string();
    if token.len() < 16 {
        return Err(std::io::Error::other(format!(
            "{}: the admin token must have at least 16 characters",
            path.display()
        )));
    }
    Ok(token)
}

/// The admin endpoint's TLS (`--admin-tls`): the listeners' certificate, no client certificates.
fn admin_tls(
    wanted: bool,
    tls: Option<&crate::auth::tls::TlsConfig>,
) -> std::io::Result<Option<Arc<futures_rustls::rustls::ServerConfig>>> {
    match (wanted, tls) {
        (false, _) => Ok(None),
        (true, None) => Err(std::io::Error::other(
            "--admin-tls needs --tls-cert and --tls-key",
        )),
        (true, Some(t)) => {
            let plain = crate::auth::tls::TlsConfig {
                client_ca: None,
                kernel: false,
                ..t.clone()
            };
            crate::auth::tls::server_config(&plain)
                .map(Some)
                .map_err(|e| std::io::Error::other(format!("admin TLS: {e}")))
        }
    }
}

/// The stream listener's TLS (`--http-tls`): the listeners' certificate; a client certificate
/// verified where `--tls-client-ca` is set, but not required.
fn http_tls(
    wanted: bool,
    tls: Option<&crate::auth::tls::TlsConfig>,
) -> std::io::Result<Option<crate::http::HttpTls>> {
    match (wanted, tls) {
        (false, _) => Ok(None),
        (true, None) => Err(std::io::Error::other(
            "--http-tls needs --tls-cert and --tls-key",
        )),
        (true, Some(t)) => {
            crate::auth::tls::server_config_with(t, crate::auth::tls::ClientCerts::Optional)
                .map(|c| Some(crate::http::HttpTls(c)))
                .map_err(|e| std::io::Error::other(format!("--http-tls: {e}")))
        }
    }
}

/// Starts one executor per core (pinned when there are CPUs enough), each serving its sockets;
/// core 0 also takes the admin's requests.
/// The HTTP stream listener's sockets, one per core, where `--http-listen` asks for them.
fn bind_streams(
    config: &ServerConfig,
    cores: usize,
    retry: Duration,
) -> std::io::Result<Option<Vec<std::net::TcpListener>>> {
    config
        .http_listen
        .map(|addr| bind_http(addr, cores, retry))
        .transpose()
}

#[allow(clippy::too_many_arguments)]
fn spawn_cores(
    sockets: Vec<Vec<std::net::TcpListener>>,
    http: Option<(Vec<std::net::TcpListener>, crate::http::HttpConfig)>,
    broker: &Arc<BrokerConfig>,
    listeners: &[Listener],
    admin_inbox: admin::AdminInbox,
    stop: &Arc<AtomicBool>,
    table: &crate::table::TopicTable,
) -> std::io::Result<Vec<glommio::ExecutorJoinHandle<()>>> {
    let cores = sockets.len();
    let mut admin_inbox = Some(admin_inbox);
    let mesh = MeshBuilder::<CoreMsg, _>::full(cores, 1024);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut handles = Vec::with_capacity(cores);
    let (mut http_sockets, http_config) = match http {
        Some((s, c)) => (s.into_iter().map(Some).collect(), Some(c)),
        None => (Vec::new(), None),
    };
    let spread = Arc::new(crate::http::spread::Spread::new(cores));
    for (i, core_sockets) in sockets.into_iter().enumerate() {
        let placement = if cores <= cpus {
            Placement::Fixed(i)
        } else {
            Placement::Unbound
        };
        let fds: Vec<RawFd> = core_sockets.into_iter().map(|l| l.into_raw_fd()).collect();
        let inbox = if i == 0 { admin_inbox.take() } else { None };
        let http = http_sockets
            .get_mut(i)
            .and_then(Option::take)
            .zip(http_config.clone())
            .map(|(l, c)| (l.into_raw_fd(), c, spread.clone()));
        let (broker, listeners, stop, mesh, table) = (
            broker.clone(),
            listeners.to_vec(),
            stop.clone(),
            mesh.clone(),
            table.clone(),
        );
        let h = LocalExecutorBuilder::new(placement)
            .name(&format!("shoal-core-{i}"))
            // Blocking calls (listing a partition's files at open, small whole-file writes) run
            // there: a few threads let the partitions a core opens at once overlap them.
            .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(4))
            .spawn(move || async move {
                let _stop_all = StopOnPanic(stop.clone());
                run_core(
                    i,
                    (*broker).clone(),
                    listeners,
                    fds,
                    http,
                    inbox,
                    mesh,
                    stop,
                    table,
                )
                .await;
            })
            .map_err(|e| std::io::Error::other(format!("cannot start core {i}: {e}")))?;
        handles.push(h);
    }
    Ok(handles)
}

/// Starts an admin HTTP thread (`what`: "admin" or "metrics"); on failure every core is told
/// to stop.
fn spawn_admin(
    listener: std::net::TcpListener,
    cores: admin::Cores,
    stop: &Arc<AtomicBool>,
    what: &str,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    admin::spawn(listener, cores, stop.clone()).map_err(|e| {
        stop.store(true, Ordering::SeqCst);
        std::io::Error::other(format!("cannot start the {what} thread: {e}"))
    })
}

/// Stops every core if the core holding it panics: a broker with a dead core must not go on
/// half-served (its partitions and control-plane answers would just go dark).
struct StopOnPanic(Arc<AtomicBool>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// `shoal serve`: runs until SIGINT or SIGTERM, then stops cleanly.
pub fn run(config: ServerConfig) -> std::io::Result<()> {
    let server = Server::start(config)?;
    // Before the line below: whoever waits for it may stop the server at once, and a SIGTERM
    // before the handlers were registered killed the process instead of stopping it cleanly.
    let flag = server.stop_flag();
    signal_hook::flag::register(signal_hook::consts::SIGINT, flag.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, flag)?;
    // One machine-readable line for scripts and tests that start shoal on port 0.
    let ports: Vec<String> = server.ports.iter().map(u16::to_string).collect();
    let listeners: Vec<String> = server
        .listeners
        .iter()
        .map(|l| {
            let ports: Vec<String> = l.ports.iter().map(u16::to_string).collect();
            format!("{}:{}", l.protocol.name(), ports.join(","))
        })
        .collect();
    let metrics = server
        .metrics
        .map(|m| format!(" metrics={m}"))
        .unwrap_or_default();
    let http = server
        .http
        .map(|h| format!(" http={h}"))
        .unwrap_or_default();
    println!(
        "shoal listening: kafka_ports={} admin={} listeners={}{metrics}{http}",
        ports.join(","),
        server.admin,
        listeners.join(";")
    );
    server.wait()?;
    log::info!("shoal stopped");
    Ok(())
}
