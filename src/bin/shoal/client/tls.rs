//! The client side of TLS (a CA, and a client certificate and key for mTLS): one rustls client
//! configuration for the whole process, used by every connection it makes, blocking
//! (set-up calls) and async (producers, consumers).

use futures_rustls::rustls::pki_types::pem::PemObject;
use futures_rustls::rustls::pki_types::{PrivateKeyDer, ServerName};
use futures_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use shoal::wire::SharedStream;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

static CLIENT: OnceLock<Arc<ClientConfig>> = OnceLock::new();

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Makes every later connection of the process use TLS, trusting `ca` (and presenting a client
/// certificate, when given).
pub fn enable(ca: &Path, client: Option<(&Path, &Path)>) -> io::Result<()> {
    let certs = |p: &Path| shoal::auth::tls::certs(p).map_err(other);
    let mut roots = RootCertStore::empty();
    for c in certs(ca)? {
        roots.add(c).map_err(other)?;
    }
    let provider = Arc::new(futures_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(other)?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| other(format!("{}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(shoal::auth::tls::presented_certs(cert).map_err(other)?, key)
                .map_err(other)?
        }
    };
    CLIENT
        .set(Arc::new(config))
        .map_err(|_| other("TLS was enabled twice"))
}

fn server_name(addr: SocketAddr) -> ServerName<'static> {
    ServerName::IpAddress(addr.ip().into())
}

/// `stream` to `addr`, through TLS if it is enabled.
pub async fn wrap(stream: glommio::net::TcpStream, addr: SocketAddr) -> io::Result<SharedStream> {
    match CLIENT.get() {
        None => Ok(SharedStream::new(stream)),
        Some(config) => {
            let connector = futures_rustls::TlsConnector::from(config.clone());
            let tls = connector
                .connect(server_name(addr), stream)
                .await
                .map_err(|e| other(format!("TLS handshake with {addr}: {e}")))?;
            Ok(SharedStream::tls_client(tls))
        }
    }
}

/// A blocking connection, plain or TLS.
#[derive(Debug)]
pub enum SyncStream {
    Plain(std::net::TcpStream),
    Tls(Box<StreamOwned<ClientConnection, std::net::TcpStream>>),
}

impl SyncStream {
    pub fn wrap(stream: std::net::TcpStream, addr: SocketAddr) -> io::Result<SyncStream> {
        Ok(match CLIENT.get() {
            None => SyncStream::Plain(stream),
            Some(config) => {
                let conn =
                    ClientConnection::new(config.clone(), server_name(addr)).map_err(other)?;
                SyncStream::Tls(Box::new(StreamOwned::new(conn, stream)))
            }
        })
    }
}

impl Read for SyncStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            SyncStream::Plain(s) => s.read(buf),
            SyncStream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for SyncStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SyncStream::Plain(s) => s.write(buf),
            SyncStream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            SyncStream::Plain(s) => s.flush(),
            SyncStream::Tls(s) => s.flush(),
        }
    }
}
