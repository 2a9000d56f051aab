//! Runs the real `shoal` binary for end-to-end tests: temp data directory, ports chosen by the OS,
//! stopped with SIGTERM (and checked to exit cleanly) when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Shoal {
    child: Option<Child>,
    pub ports: Vec<u16>,
    pub admin: String,
    pub data_dir: PathBuf,
}

impl Shoal {
    /// Starts `shoal serve --cores N` on `data_dir` with extra flags, on free ports.
    pub fn start(data_dir: &Path, cores: usize, extra: &[&str]) -> Shoal {
        Self::start_on(data_dir, cores, "127.0.0.1:0", extra)
    }

    /// Same, with core 0 on `listen` (core i on its port + i).
    pub fn start_on(data_dir: &Path, cores: usize, listen: &str, extra: &[&str]) -> Shoal {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args([
                "serve",
                "--listen",
                listen,
                "--admin",
                "127.0.0.1:0",
                "--cores",
            ])
            .arg(cores.to_string())
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("shoal binary starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("shoal listening:") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("shoal printed its ports within 30 s");
        let mut ports = Vec::new();
        let mut admin = String::new();
        for word in line.split_whitespace() {
            if let Some(p) = word.strip_prefix("kafka_ports=") {
                ports = p.split(',').map(|p| p.parse().unwrap()).collect();
            } else if let Some(a) = word.strip_prefix("admin=") {
                admin = a.to_string();
            }
        }
        assert_eq!(ports.len(), cores);
        Shoal {
            child: Some(child),
            ports,
            admin,
            data_dir: data_dir.to_path_buf(),
        }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.ports[0])
    }

    /// Sends SIGTERM and waits (at most 30 s) for a clean exit, which it asserts.
    pub fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let status = terminate(&mut child);
        assert!(
            status.is_some_and(|s| s.success()),
            "shoal did not exit cleanly: {status:?}"
        );
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// The sum over cores (and other labels) of a metric from `/metrics`.
    pub fn metric(&self, name: &str) -> u64 {
        self.metric_with(name, "")
    }

    /// Same, over the samples whose labels contain `label` (e.g. `api="Produce"`).
    pub fn metric_with(&self, name: &str, label: &str) -> u64 {
        let (_, body) = self.admin_get("/metrics");
        body.lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(label)
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// GET on the admin server; returns (status line, body).
    pub fn admin_get(&self, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(&self.admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    }
}

/// A port P such that P..P+n are all free right now.
pub fn free_port_run(n: u16) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first.checked_add(n).is_none() {
            continue;
        }
        if (first..first + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return first;
        }
    }
    panic!("no run of {n} free ports");
}

fn terminate(child: &mut Child) -> Option<std::process::ExitStatus> {
    unsafe_kill(child.id(), 15);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

fn unsafe_kill(pid: u32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

impl Drop for Shoal {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }
}
