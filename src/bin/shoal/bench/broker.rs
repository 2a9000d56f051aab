//! The broker under test: an embedded shoal (in this process, or a child process per run), or an
//! external Kafka-compatible broker at `--bootstrap`.

use super::args::FanoutArgs;
use super::stats;
use super::workload::Observer;
use shoal::server::{Server, ServerConfig};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The name prefix of a shoal's core threads (`shoal-core-<core>`, see `shoal::server`).
const CORE_THREADS: &str = "shoal-core-";

/// Turns `shoal serve` flags (`--broker-arg`s, after the bench's own) into the embedded broker's
/// configuration; the command line owns that parsing.
pub type ServeConfig = fn(&[String]) -> Result<ServerConfig, String>;

/// How the embedded shoal runs.
enum Embedded {
    InProcess(Box<Server>),
    Child(std::process::Child),
}

/// The embedded shoal, or the address of an external broker.
pub struct Broker {
    embedded: Option<(Embedded, Option<PathBuf>)>,
    pub bootstrap: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// Where it streams topics over HTTP (`--http-listen`), if it does.
    pub http: Option<SocketAddr>,
    pub pid: Option<u32>,
    pub cores: Option<usize>,
    pub serve_config: ServeConfig,
    /// The embedded broker's data directory and flush interval (`--disk-baseline` measures there).
    pub data_dir: Option<PathBuf>,
    pub flush_interval: Option<Duration>,
}

impl Broker {
    pub fn start(args: &FanoutArgs, serve_config: ServeConfig) -> io::Result<Broker> {
        if let Some(b) = &args.bootstrap {
            let admin = args
                .admin
                .as_deref()
                .map(crate::client::resolve)
                .transpose()?;
            // The broker's CPU and memory can be read when it runs on this host.
            // (Only for loopback addresses: a port number alone says nothing about other hosts.)
            let pid = admin
                .or(crate::client::resolve(b).ok())
                .filter(|a| a.ip().is_loopback())
                .and_then(stats::find_listener_pid)
                .filter(|p| *p != std::process::id());
            return Ok(Broker {
                embedded: None,
                bootstrap: crate::client::resolve(b)?,
                admin,
                http: args.http,
                pid,
                cores: None,
                serve_config,
                data_dir: None,
                flush_interval: None,
            });
        }
        // A directory of our own (removed at the end) under the system's temporary directory, or
        // under --data-dir when each run gets a fresh process (a fresh process must not replay
        // the earlier runs' topics).
        let fresh_under = |parent: PathBuf| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let d = parent.join(format!("shoal-bench-{}-{nanos}", std::process::id()));
            (d.clone(), Some(d))
        };
        let (dir, remove) = match &args.data_dir {
            Some(d) if args.broker_process => fresh_under(d.clone()),
            Some(d) => (d.clone(), None),
            None => fresh_under(std::env::temp_dir()),
        };
        let argv = serve_argv(args, &dir)?;
        let config =
            serve_config(&argv[2..]).map_err(|e| io::Error::other(format!("--broker-arg: {e}")))?;
        let cores = Some(args.broker_cores.max(1));
        let flush_interval = config.broker.log.flush_interval;
        if args.broker_process {
            let (child, port, admin, http) = spawn_broker(&argv[1..])?;
            return Ok(Broker {
                http,
                pid: Some(child.id()),
                embedded: Some((Embedded::Child(child), remove)),
                bootstrap: SocketAddr::from(([127, 0, 0, 1], port)),
                admin: Some(admin),
                cores,
                serve_config,
                data_dir: Some(dir),
                flush_interval,
            });
        }
        let server = Server::start(config)?;
        let bootstrap = SocketAddr::from(([127, 0, 0, 1], server.ports[0]));
        let admin = Some(server.admin);
        let http = server.http;
        Ok(Broker {
            http,
            embedded: Some((Embedded::InProcess(Box::new(server)), remove)),
            bootstrap,
            admin,
            pid: None,
            cores,
            serve_config,
            data_dir: Some(dir),
            flush_interval,
        })
    }

    pub fn observer(&self) -> Observer {
        let in_process = matches!(self.embedded, Some((Embedded::InProcess(_), _)));
        Observer {
            thread_prefix: in_process.then_some(CORE_THREADS),
            pid: self.pid,
            pid_thread_prefix: self.pid.map(|_| CORE_THREADS),
            admin: self.admin,
            rss_of_this_process: in_process,
        }
    }

    pub fn describe(&self) -> String {
        match (&self.embedded, self.admin) {
            (Some((how, _)), Some(a)) => format!(
                "embedded shoal ({} core{}{}) on {}, admin {a}",
                self.cores.unwrap_or(1),
                if self.cores == Some(1) { "" } else { "s" },
                match how {
                    Embedded::InProcess(_) => String::new(),
                    Embedded::Child(c) => format!(", child process {}", c.id()),
                },
                self.bootstrap
            ),
            (None, Some(a)) => format!("shoal at {}, admin {a}", self.bootstrap),
            _ => format!("Kafka broker at {}", self.bootstrap),
        }
    }

    /// Stops the embedded shoal and starts a fresh one (a new process and data directory).
    pub fn restart(&mut self, args: &FanoutArgs) -> io::Result<()> {
        self.stop();
        *self = Broker::start(args, self.serve_config)?;
        Ok(())
    }

    pub fn stop(&mut self) {
        if let Some((how, remove)) = self.embedded.take() {
            match how {
                Embedded::InProcess(server) => {
                    server.stop();
                    if let Err(e) = server.wait() {
                        log::error!("embedded shoal: {e}");
                    }
                }
                Embedded::Child(mut child) => {
                    // SAFETY: kill(2) on the child's pid, which is not reaped before wait().
                    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                    // An orderly stop, or SIGKILL after 30 s.
                    let deadline = std::time::Instant::now() + Duration::from_secs(30);
                    let status = loop {
                        match child.try_wait() {
                            Ok(None) if std::time::Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_millis(20))
                            }
                            Ok(None) => {
                                log::error!("embedded shoal process: no stop within 30 s, killed");
                                let _ = child.kill();
                                break child.wait();
                            }
                            done => break done.map(|s| s.expect("exited")),
                        }
                    };
                    match status {
                        Ok(status) if !status.success() => {
                            log::error!("embedded shoal process: {status}")
                        }
                        Err(e) => log::error!("embedded shoal process: {e}"),
                        Ok(_) => {}
                    }
                }
            }
            if let Some(d) = remove {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
}

/// The `shoal serve` command line of the embedded broker on `dir`: the bench's flags, then the
/// `--broker-arg`s. The bench's listeners (`--listen`, `--admin`, `--http-listen` on free
/// loopback ports) are left out where a `--broker-arg` gives its own; the data directory and the
/// cores are the bench's own flags (`--data-dir`, `--broker-cores`), which the run's set-up and
/// figures depend on.
fn serve_argv(args: &FanoutArgs, dir: &std::path::Path) -> io::Result<Vec<String>> {
    let given = |flag: &str| {
        args.broker_args
            .iter()
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
    };
    for (flag, ours) in [("--data-dir", "--data-dir"), ("--cores", "--broker-cores")] {
        if given(flag) {
            return Err(io::Error::other(format!(
                "--broker-arg={flag}: give the bench's {ours} instead (the bench sets it up and \
                 measures with it)"
            )));
        }
    }
    let mut argv: Vec<String> = vec![
        "shoal".into(),
        "serve".into(),
        "--data-dir".into(),
        dir.to_string_lossy().into_owned(),
        "--cores".into(),
        args.broker_cores.max(1).to_string(),
    ];
    let mut listeners = vec!["--listen", "--admin"];
    if args.protocol != crate::bench::args::Protocol::Kafka {
        listeners.push("--http-listen");
    }
    for flag in listeners.into_iter().filter(|f| !given(f)) {
        argv.extend([flag.to_string(), "127.0.0.1:0".to_string()]);
    }
    argv.extend(args.broker_args.iter().cloned());
    Ok(argv)
}

/// Stops the embedded shoal however the generator ends (an error, a panic).
impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `shoal serve ARGS` (this executable) as a child process and reads its Kafka port and
/// admin address from the line it prints once it listens. Its other output goes to ours.
type Spawned = (std::process::Child, u16, SocketAddr, Option<SocketAddr>);

fn spawn_broker(serve_args: &[String]) -> io::Result<Spawned> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut command = std::process::Command::new(exe);
    // SAFETY: prctl(2) only, between fork and exec. The child gets SIGTERM if the thread that
    // started it dies, so a generator killed outright (SIGKILL) leaves no broker behind; the
    // series starts every child from the main thread, which lives until the end.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = command
        .args(serve_args)
        // Its info lines would be interleaved with the report: warnings and errors only, unless
        // RUST_LOG says otherwise.
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in io::BufReader::new(stdout).lines().map_while(Result::ok) {
            match tx.take_if(|_| line.starts_with("shoal listening:")) {
                Some(tx) => drop(tx.send(line)),
                None => println!("{line}"),
            }
        }
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line,
        Err(e) => {
            let _ = child.kill();
            let status = child.wait()?;
            let why = match e {
                std::sync::mpsc::RecvTimeoutError::Timeout => "did not start listening within 60 s",
                std::sync::mpsc::RecvTimeoutError::Disconnected => "exited before listening",
            };
            return Err(io::Error::other(format!(
                "the shoal process {why} ({status})"
            )));
        }
    };
    let (mut port, mut admin, mut http) = (None, None, None);
    for word in line.split_whitespace() {
        if let Some(p) = word.strip_prefix("kafka_ports=") {
            port = p.split(',').next().and_then(|p| p.parse().ok());
        } else if let Some(a) = word.strip_prefix("admin=") {
            admin = a.parse().ok();
        } else if let Some(h) = word.strip_prefix("http=") {
            http = h.parse().ok();
        }
    }
    match (port, admin) {
        (Some(p), Some(a)) => Ok((child, p, a, http)),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err(io::Error::other(format!(
                "cannot read the shoal process's ports: {line:?}"
            )))
        }
    }
}
