//! Runtime bootstrap: one pinned glommio executor per core, each a Kafka broker on its own port, joined
//! by a channel mesh for the control plane; the admin HTTP thread beside them; and an orderly stop on
//! SIGINT/SIGTERM.

use crate::admin;
use crate::auth::SecurityProtocol;
use crate::config::BrokerConfig;
use crate::control::{self, spawn_receivers, AdminInbox};
use crate::core_state::Core;
use crate::core_state::Listener;
use crate::kafka::connection;
use crate::mesh::{CoreMsg, Mesh};
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// A file holding the admin HTTP endpoint's bearer token (every request but `GET /metrics`
    /// then needs it).
    pub admin_token_file: Option<PathBuf>,
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
    metrics_thread: Option<std::thread::JoinHandle<()>>,
    /// Held while the server runs: one process per data directory.
    _data_dir_lock: std::fs::File,
}

/// Most open files asked for: every partition holds two or three (its directory, its active
/// segment, sealed segments being read), every connection one, so 10,000 partitions and their
/// consumers need more than the usual default of 1,024 (or a hard limit of 20,000).
const OPEN_FILES_WANTED: u64 = 1 << 20;

/// Raises this process's open-files limit as far as it may: the soft limit to the hard one, and
/// both to [`OPEN_FILES_WANTED`] where the process may raise its hard limit (root) and the kernel
/// allows it (`fs.nr_open`). Logs what it ends with, so a refused partition (`Too many open
/// files`) can be matched to it.
fn raise_open_files_limit() {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write the one struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) } != 0 {
        return;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(now.rlim_max);
    let wanted = OPEN_FILES_WANTED.min(nr_open).max(now.rlim_max);
    let set = |soft: u64, hard: u64| {
        let l = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0 }
    };
    let limit = if set(wanted, wanted) {
        wanted
    } else if set(now.rlim_max, now.rlim_max) {
        now.rlim_max
    } else {
        now.rlim_cur
    };
    log::info!("open files limit: {limit} (partitions take two or three each, connections one)");
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
        raise_open_files_limit();
        let data_dir_lock = lock_data_dir(&broker.data_dir)?;
        claim_data_dir(&broker.data_dir, broker.edge.as_ref())?;
        if let Some(tls) = &broker.auth.tls {
            check_and_log_tls(tls)?;
        }
        let wanted = wanted_listeners(&config)?;
        let admin_tls = admin_tls(config.admin_tls, config.broker.auth.tls.as_ref())?;
        let table = control::load_table(&config.broker.data_dir)?;
        crate::groups::reshard(&config.broker.data_dir, cores)?;
        crate::transactions::reshard(&config.broker.data_dir, cores)?;
        let retry = config.bind_retry;
        let (sockets, listeners) = bind_listeners(&wanted, cores, retry)?;
        let ports = listeners[0].ports.clone();
        let admin_listener = bind_named(config.admin, "the admin address", retry)?;
        let admin = admin_listener.local_addr()?;
        let metrics_listener = config
            .metrics_listen
            .map(|addr| bind_named(addr, "the metrics address", retry))
            .transpose()?;
        let (admin_requests, admin_inbox) = control::admin_link(ADMIN_QUEUE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let broker = Arc::new(config.broker);
        let handles = spawn_cores(sockets, &broker, &listeners, admin_inbox, &stop, &table)?;
        let admin_cores = admin::Cores {
            requests: admin_requests,
            ports: ports.clone(),
            data_dir: broker.data_dir.clone(),
            answer_timeout: ADMIN_ANSWER_TIMEOUT,
            request_deadline: ADMIN_REQUEST_DEADLINE,
            token: admin_token,
            tls: admin_tls,
            metrics_only: false,
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
        Ok(Server {
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

/// Locks the data directory (`LOCK`, an advisory lock the kernel drops when the process dies), so
/// that a second server started on it, by mistake or by an overlapping restart, stops here before
/// it touches anything.
fn lock_data_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(file);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(std::io::Error::other(format!(
            "data directory {} is in use by another shoal process",
            dir.display()
        )));
    }
    Err(std::io::Error::new(
        e.kind(),
        format!("locking {}: {e}", path.display()),
    ))
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

/// Checks that the listeners' TLS files can be read, and says how records will be encrypted.
fn check_and_log_tls(tls: &crate::auth::tls::TlsConfig) -> std::io::Result<()> {
    crate::auth::tls::server_config(tls).map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
    let kernel = if !tls.kernel {
        "encrypted in user space (--tls-kernel off)"
    } else if crate::wire::ktls::available() {
        "encrypted by the kernel (kTLS) after each handshake"
    } else {
        "encrypted in user space (this kernel does not offer kernel TLS: no `tls` in \
         /proc/sys/net/ipv4/tcp_available_ulp)"
    };
    log::info!(
        "TLS on the Kafka listener{}; {kernel}",
        if tls.client_ca.is_some() {
            ", client certificates required"
        } else {
            ""
        },
    );
    Ok(())
}

/// The Kafka listeners to open (`--listeners`, or `--listen` with the protocol the security
/// settings imply), each refused if it needs security settings that are missing.
fn wanted_listeners(config: &ServerConfig) -> std::io::Result<Vec<(SecurityProtocol, SocketAddr)>> {
    let auth = &config.broker.auth;
    let wanted = if config.listeners.is_empty() {
        let implied = SecurityProtocol::implied(auth.tls.is_some(), !auth.sasl.is_empty());
        vec![(implied, config.listen)]
    } else {
        config.listeners.clone()
    };
    for (protocol, addr) in &wanted {
        if protocol.tls() && auth.tls.is_none() {
            return Err(std::io::Error::other(format!(
                "listener {}://{addr} needs --tls-cert and --tls-key",
                protocol.name()
            )));
        }
        if protocol.sasl() && auth.sasl.is_empty() {
            return Err(std::io::Error::other(format!(
                "listener {}://{addr} needs --sasl-mechanisms",
                protocol.name()
            )));
        }
    }
    Ok(wanted)
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

/// Binds one socket per core per listener (core *i* on the listener's port + *i*, or a free port
/// for port 0): the sockets by core, and each listener with the ports it got.
fn bind_listeners(
    wanted: &[(SecurityProtocol, SocketAddr)],
    cores: usize,
    retry: Duration,
) -> std::io::Result<(Vec<Vec<std::net::TcpListener>>, Vec<Listener>)> {
    let mut sockets: Vec<Vec<std::net::TcpListener>> = (0..cores).map(|_| Vec::new()).collect();
    for (protocol, addr) in wanted {
        for (i, core_sockets) in sockets.iter_mut().enumerate() {
            let port = if addr.port() == 0 {
                0
            } else {
                addr.port() + i as u16
            };
            let l = bind_retrying(SocketAddr::new(addr.ip(), port), retry).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "core {i}: cannot listen on port {port}: {e} ({} listener)",
                        protocol.name()
                    ),
                )
            })?;
            l.set_nonblocking(true)?;
            core_sockets.push(l);
        }
    }
    let listeners = wanted
        .iter()
        .enumerate()
        .map(|(k, (protocol, _))| {
            let ports = sockets
                .iter()
                .map(|s| s[k].local_addr().map(|a| a.port()))
                .collect::<Result<Vec<u16>, _>>()?;
            Ok(Listener {
                protocol: *protocol,
                ports,
            })
        })
        .collect::<std::io::Result<_>>()?;
    Ok((sockets, listeners))
}

/// Binds `addr` (named `what` in the error), non-blocking.
fn bind_named(
    addr: SocketAddr,
    what: &str,
    retry: Duration,
) -> std::io::Result<std::net::TcpListener> {
    let l = bind_retrying(addr, retry).map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen on {what} {addr}: {e}"))
    })?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Starts one executor per core (pinned when there are CPUs enough), each serving its sockets;
/// core 0 also takes the admin's requests.
fn spawn_cores(
    sockets: Vec<Vec<std::net::TcpListener>>,
    broker: &Arc<BrokerConfig>,
    listeners: &[Listener],
    admin_inbox: control::AdminInbox,
    stop: &Arc<AtomicBool>,
    table: &crate::table::TopicTable,
) -> std::io::Result<Vec<glommio::ExecutorJoinHandle<()>>> {
    let cores = sockets.len();
    let mut admin_inbox = Some(admin_inbox);
    let mesh = MeshBuilder::<CoreMsg, _>::full(cores, 1024);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut handles = Vec::with_capacity(cores);
    for (i, core_sockets) in sockets.into_iter().enumerate() {
        let placement = if cores <= cpus {
            Placement::Fixed(i)
        } else {
            Placement::Unbound
        };
        let fds: Vec<RawFd> = core_sockets.into_iter().map(|l| l.into_raw_fd()).collect();
        let inbox = if i == 0 { admin_inbox.take() } else { None };
        let (broker, listeners, stop, mesh, table) = (
            broker.clone(),
            listeners.to_vec(),
            stop.clone(),
            mesh.clone(),
            table.clone(),
        );
        let h = LocalExecutorBuilder::new(placement)
            .name(&format!("shoal-core-{i}"))
            .spawn(move || async move {
                let _stop_all = StopOnPanic(stop.clone());
                run_core(
                    i,
                    (*broker).clone(),
                    listeners,
                    fds,
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

/// Marks a data directory an edge's cache ([`EDGE_MARK`]). An edge starts with an empty cache
/// (what it held may no longer be the upstream's), so it refuses a directory that holds a broker's
/// data, and `serve` refuses an edge's.
fn claim_data_dir(dir: &Path, edge: Option<&crate::edge::EdgeConfig>) -> std::io::Result<()> {
    let mark = dir.join(EDGE_MARK);
    let has_mark = mark.exists();
    let has_table = dir.join("topics.json").exists();
    let context = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("data directory {}: {e}", dir.display()))
    };
    match edge {
        None if has_mark => Err(std::io::Error::other(format!(
            "data directory {} is a shoal edge's cache; give `shoal serve` a directory of its own",
            dir.display()
        ))),
        None => Ok(()),
        Some(_) if (has_table || has_topic_dirs(dir)) && !has_mark => {
            Err(std::io::Error::other(format!(
                "data directory {} holds a broker's data; give `shoal edge` a directory of its own",
                dir.display()
            )))
        }
        Some(edge) => {
            std::fs::write(&mark, format!("upstream={}\n", edge.upstream_list()))
                .map_err(context)?;
            match std::fs::remove_dir_all(dir.join("topics")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(context(e)),
                _ => {}
            }
            match std::fs::remove_file(dir.join("topics.json")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(context(e)),
                _ => {}
            }
            shards::files::create_dir_all_durable(&dir.join("topics")).map_err(context)
        }
    }
}

/// Whether `dir/topics` holds anything (a broker's partitions).
fn has_topic_dirs(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("topics")).is_ok_and(|mut d| d.next().is_some())
}

/// The file that marks a data directory as a shoal edge's cache.
pub const EDGE_MARK: &str = "EDGE";

/// Creates the data directory and resolves it to an absolute path with no `..` or symlinks, so
/// every later path (logs opened long after start-up, group stores) is independent of the working
/// directory and of how the user spelled it.
fn resolve_data_dir(dir: &Path) -> std::io::Result<PathBuf> {
    let context = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("data directory {}: {e}", dir.display()))
    };
    shards::files::create_dir_all_durable(&dir.join("topics")).map_err(context)?;
    std::fs::canonicalize(dir).map_err(context)
}

/// Binds `addr`, retrying for up to `retry` while it is in use. A process killed with SIGKILL a
/// moment ago keeps its listening sockets until the kernel has torn down its io_uring rings (a
/// fraction of a second, longer with I/O in flight), and supervisors restart at once. No
/// `SO_REUSEPORT`: a dying and a new process must never share a port.
fn bind_retrying(addr: SocketAddr, retry: Duration) -> std::io::Result<std::net::TcpListener> {
    let deadline = Instant::now() + retry;
    let mut said = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                if !said {
                    log::warn!(
                        "{addr} is in use; retrying for up to {} ms (a process that just exited may still hold it)",
                        retry.as_millis()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
            Ok(l) => {
                if said {
                    log::info!("{addr} is free again; listening");
                }
                return Ok(l);
            }
        }
    }
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
    println!(
        "shoal listening: kafka_ports={} admin={} listeners={}{metrics}",
        ports.join(","),
        server.admin,
        listeners.join(";")
    );
    server.wait()?;
    log::info!("shoal stopped");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_core(
    id: usize,
    config: BrokerConfig,
    listeners: Vec<Listener>,
    fds: Vec<RawFd>,
    admin_inbox: Option<AdminInbox>,
    mesh: MeshBuilder<CoreMsg, glommio::channels::channel_mesh::Full>,
    stop: Arc<AtomicBool>,
    table: crate::table::TopicTable,
) {
    let cores = listeners[0].ports.len();
    let (senders, receivers) = if cores > 1 {
        let (s, r) = mesh.join().await.expect("joining the core mesh");
        (Some(s), Some(r))
    } else {
        (None, None)
    };
    let core = Rc::new(Core::new(
        id,
        Rc::new(config),
        listeners,
        Mesh::new(senders),
    ));
    if let Some(r) = receivers {
        spawn_receivers(&core, r);
    }
    open_core(&core, table).await;
    // Compacted topics' partitions on this core are compacted in the background from now on.
    shards::compactor::start();
    let ticker = glommio::spawn_local({
        let core = core.clone();
        async move { core.groups().run_ticker(core.shutdown()).await }
    });
    let replica_ticker = glommio::spawn_local(control::tick_replicas(core.clone()));
    let txn_ticker = glommio::spawn_local(crate::transaction_markers::run_ticker(core.clone()));
    let lag_rounds = glommio::spawn_local(crate::group_lag::run(core.clone()));
    // Latency-sensitive: a write's hand-overs leave before the owner's fetch work goes on.
    match glommio::spawn_local_into(
        control::send_replica_messages(core.clone()),
        core.queues().other,
    ) {
        Ok(task) => {
            task.detach();
        }
        Err(e) => log::error!("core {id}: read replica hand-overs cannot be sent: {e}"),
    }
    let sampler = glommio::spawn_local(crate::load::run_sampler(
        core.reads.load.clone(),
        core.shutdown().clone(),
    ));
    let accepts: Vec<_> = fds
        .into_iter()
        .enumerate()
        .map(|(k, fd)| {
            // SAFETY: `fd` is a listening socket this process owns, handed over by
            // `Server::start`.
            let listener = unsafe { TcpListener::from_raw_fd(fd) };
            glommio::spawn_local(accept_until_shutdown(core.clone(), listener, k))
        })
        .collect();
    let admin =
        admin_inbox.map(|inbox| glommio::spawn_local(control::serve_admin(core.clone(), inbox)));
    let mirror = (id == 0 && core.upstream().is_some())
        .then(|| glommio::spawn_local(control::mirror_upstream(core.clone())));
    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    log::info!("core {id}: stopping");
    core.shutdown().advance(1);
    core.groups().stop();
    ticker.await;
    replica_ticker.await;
    txn_ticker.await;
    lag_rounds.await;
    sampler.await;
    for a in accepts {
        a.await;
    }
    if let Some(a) = admin {
        a.await;
    }
    if let Some(m) = mirror {
        m.await;
    }
    close_core(&core).await;
    log::info!("core {id}: stopped");
}

/// Opens what a core holds at start: the partitions of `table` it owns, its groups' offsets and
/// its transaction log; then marks it opened.
async fn open_core(core: &Core, table: crate::table::TopicTable) {
    let id = core.id();
    core.apply_table(table).await;
    if let Err(e) = core
        .groups()
        .load(&core.config().data_dir, core.reads.tail_cache.clone())
        .await
    {
        // Without its offsets the core must not coordinate groups (it would answer as if none
        // were committed); it answers COORDINATOR_LOAD_IN_PROGRESS instead.
        log::error!("core {id}: cannot load committed offsets: {e}");
    }
    if let Err(e) = core
        .transactions()
        .load(&core.config().data_dir, core.reads.tail_cache.clone())
        .await
    {
        // Without its log the core must not coordinate transactions; it answers
        // COORDINATOR_LOAD_IN_PROGRESS instead.
        log::error!("core {id}: cannot load the transaction log: {e}");
    }
    // What the other cores ask of this core's partitions, groups and transactions (markers
    // first) waited for this.
    core.mark_opened();
}

/// Lets open connections finish (up to [`DRAIN`]), then closes the partitions, groups and
/// transactions cleanly.
async fn close_core(core: &Core) {
    let deadline = Instant::now() + DRAIN;
    while core.metrics.connections_open.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    core.close_partitions().await;
    core.groups().close().await;
    core.transactions().close().await;
}

/// Accepts Kafka connections until the core stops, serving each in its own task.
async fn accept_until_shutdown(core: Rc<Core>, listener: TcpListener, index: usize) {
    while let Some(accepted) = core.until_stopping(listener.accept()).await {
        match accepted {
            Ok(stream) => {
                let serve = connection::serve(core.clone(), stream, index);
                match glommio::spawn_local_into(serve, core.queues().readers) {
                    Ok(task) => {
                        task.detach();
                    }
                    Err(e) => log::error!("core {}: cannot serve a connection: {e}", core.id()),
                }
            }
            Err(e) => {
                log::warn!("core {}: kafka accept failed: {e}", core.id());
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
