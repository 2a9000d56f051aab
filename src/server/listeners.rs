//! The Kafka listeners: which addresses each core binds (one per security protocol, port + core),
//! bound with a retry while a previous process lets go, and their TLS checked and logged at start.

use super::ServerConfig;
use crate::auth::SecurityProtocol;
use crate::cores::Listener;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Checks that the listeners' TLS files can be read, and says how records will be encrypted.
pub(super) fn check_and_log_tls(tls: &crate::auth::tls::TlsConfig) -> std::io::Result<()> {
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
pub(super) fn wanted_listeners(
    config: &ServerConfig,
) -> std::io::Result<Vec<(SecurityProtocol, SocketAddr)>> {
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

/// Binds one socket per core per listener (core *i* on the listener's port + *i*, or a free port
/// for port 0): the sockets by core, and each listener with the ports it got.
pub(super) fn bind_listeners(
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
pub(super) fn bind_named(
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

/// Binds `addr`, retrying for up to `retry` while it is in use. A process killed with SIGKILL a
/// moment ago keeps its listening sockets until the kernel has torn down its io_uring rings (a
/// fraction of a second, longer with I/O in flight), and supervisors restart at once. No
/// `SO_REUSEPORT`: a dying and a new process must never share a port.
pub(super) fn bind_retrying(
    addr: SocketAddr,
    retry: Duration,
) -> std::io::Result<std::net::TcpListener> {
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

/// The stream listener: one socket per core on the same address (`SO_REUSEPORT`, so the kernel
/// spreads connections over the cores); port 0 picks one free port for all of them.
pub(super) fn bind_http(
    addr: SocketAddr,
    cores: usize,
    retry: Duration,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let context = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("the HTTP stream address {addr}: {e}"))
    };
    // A plain bind first: another process on the address makes it fail, where joining that
    // process's SO_REUSEPORT group would silently share its connections.
    let probe = bind_retrying(addr, retry).map_err(context)?;
    let addr = probe.local_addr()?;
    drop(probe);
    let mut out: Vec<std::net::TcpListener> = Vec::with_capacity(cores);
    let deadline = Instant::now() + retry;
    while out.len() < cores {
        let at = match out.first() {
            Some(first) => first.local_addr()?,
            None => addr,
        };
        match reuse_port_listener(at) {
            Ok(l) => out.push(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(context(e)),
        }
    }
    Ok(out)
}

fn reuse_port_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}
