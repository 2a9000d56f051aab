//! TLS for the Kafka and HTTP stream listeners (rustls, or the kernel after the handshake): the
//! server's certificate and key, optional client-certificate verification (mTLS), the handshake,
//! the principal a client certificate names.

use crate::wire::{ktls, SharedStream};
use futures_rustls::rustls::pki_types::pem::PemObject;
use futures_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use futures_rustls::rustls::server::WebPkiClientVerifier;
use futures_rustls::rustls::{RootCertStore, ServerConfig};
use glommio::net::TcpStream;
use std::cell::Cell;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `--tls-cert`, `--tls-key` and `--tls-client-ca` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM: the server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM: its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM: the CAs whose client certificates are accepted; set, every client must present one.
    pub client_ca: Option<PathBuf>,
    /// Hand each connection's keys to the kernel after the handshake where it offers kernel TLS
    /// (`--tls-kernel auto`); else rustls encrypts in user space.
    pub kernel: bool,
}

/// The certificates of a PEM file (at least one), or why not (a message naming the file).
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate", path.display()));
    }
    Ok(certs)
}

/// The certificate chain of a PEM file whose first certificate (the one presented) is X.509 v3:
/// TLS refuses a v1 certificate, which `openssl x509 -req` makes when no extensions are given.
pub fn presented_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = certs(path)?;
    if let Ok((_, leaf)) = x509_parser::parse_x509_certificate(chain[0].as_ref()) {
        if leaf.version() != x509_parser::x509::X509Version::V3 {
            return Err(format!(
                "{}: an X.509 v{} certificate (openssl makes one when `openssl x509 -req` is given \
                 no -extfile); TLS needs v3: sign it again with extensions (docs/security.md has \
                 the commands)",
                path.display(),
                leaf.version().0 + 1
            ));
        }
    }
    Ok(chain)
}

/// Whether clients must present a certificate where `--tls-client-ca` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Every client presents one that verifies (the Kafka listeners' mTLS).
    Required,
    /// One that is presented must verify; a client may present none.
    Optional,
}

/// The rustls configuration for `c`, or why it cannot be built (a message for the operator).
pub fn server_config(c: &TlsConfig) -> Result<Arc<ServerConfig>, String> {
    server_config_with(c, ClientCerts::Required)
}

/// [`server_config`], with client certificates `clients`.
pub fn server_config_with(
    c: &TlsConfig,
    clients: ClientCerts,
) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(futures_rustls::rustls::crypto::ring::default_provider());
    let chain = presented_certs(&c.cert)?;
    let key =
        PrivateKeyDer::from_pem_file(&c.key).map_err(|e| format!("{}: {e}", c.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &c.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certs(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match clients {
                ClientCerts::Required => verifier,
                ClientCerts::Optional => verifier.allow_unauthenticated(),
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and {}: {e}", c.cert.display(), c.key.display()))?;
    // The keys leave rustls only for the kernel (`ktls::offload`).
    config.enable_secret_extraction = c.kernel;
    Ok(Arc::new(config))
}

/// Longest a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection after its TLS handshake.
#[derive(Debug)]
pub struct Accepted {
    pub stream: SharedStream,
    /// The principal its verified client certificate names (mTLS), as Kafka writes it
    /// (`CN=alice,O=acme`, without the `User:` prefix).
    pub principal: Option<String>,
    /// The kernel encrypts it (kernel TLS); else rustls, in user space.
    pub kernel: bool,
}

/// The TLS handshake of a new connection on core `core`, within [`HANDSHAKE_TIMEOUT`]. Where
/// `kernel_tls` is on and the socket takes the `tls` module, the keys go to the kernel after the
/// handshake and it encrypts from then on; a refusal of the keys turns `kernel_tls` off for the
/// core (that connection is lost, the next ones are not).
pub async fn accept(
    tls: &Arc<ServerConfig>,
    mut stream: TcpStream,
    kernel_tls: &Cell<bool>,
    core: usize,
) -> io::Result<Accepted> {
    /// Ends a handshake that takes too long.
    async fn timeout<T>() -> io::Result<T> {
        glommio::timer::sleep(HANDSHAKE_TIMEOUT).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "handshake timed out",
        ))
    }
    if kernel_tls.get() && ktls::attach(stream.as_raw_fd()).is_ok() {
        let mut conn =
            futures_rustls::rustls::ServerConnection::new(tls.clone()).map_err(io::Error::other)?;
        futures_lite::future::or(ktls::handshake(&mut stream, &mut conn), timeout()).await?;
        let principal = leaf_principal(conn.peer_certificates());
        let suite = conn.negotiated_cipher_suite().map(|s| s.suite());
        let budget = ktls::offload(stream.as_raw_fd(), conn).inspect_err(|e| {
            kernel_tls.set(false);
            log::warn!(
                "core {core}: the kernel refused TLS keys ({suite:?}): {e}; this core encrypts in \
                 user space from now on"
            );
        })?;
        return Ok(Accepted {
            stream: SharedStream::kernel_tls(stream, budget),
            principal,
            kernel: true,
        });
    }
    let acceptor = futures_rustls::TlsAcceptor::from(tls.clone());
    let accepted = futures_lite::future::or(acceptor.accept(stream), timeout()).await?;
    let principal = leaf_principal(accepted.get_ref().1.peer_certificates());
    Ok(Accepted {
        stream: SharedStream::tls(accepted),
        principal,
        kernel: false,
    })
}

/// What a failed handshake's error means for the client's owner, where it is one a user meets
/// when setting TLS up ("" otherwise).
pub fn handshake_hint(e: &io::Error) -> &'static str {
    let text = e.to_string();
    if text.contains("UnsupportedCertVersion") {
        " (the client's certificate is X.509 v1, as `openssl x509 -req` makes it without \
         -extfile: TLS needs v3; sign it with extensions, see docs/security.md)"
    } else if text.contains("InvalidContentType") || text.contains("corrupt message") {
        " (the client did not start with a TLS handshake: it speaks plaintext to a TLS port; \
         give it security.protocol=SSL, or use a PLAINTEXT listener)"
    } else if text.contains("UnknownIssuer") {
        " (the client's certificate is not signed by a CA in --tls-client-ca)"
    } else {
        ""
    }
}

/// The principal a verified client certificate chain's leaf names.
fn leaf_principal(chain: Option<&[CertificateDer<'_>]>) -> Option<String> {
    chain
        .and_then(|chain| chain.first())
        .and_then(certificate_principal)
}

/// The user a verified client certificate names, as Kafka's default principal builder writes it:
/// the subject's distinguished name in RFC 2253 order (`CN=alice,O=acme`; the principal is
/// `User:CN=alice,O=acme`).
pub fn certificate_principal(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let mut rdns: Vec<String> = parsed
        .subject()
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|a| {
                    let name = x509_parser::objects::oid2abbrev(
                        a.attr_type(),
                        x509_parser::objects::oid_registry(),
                    )
                    .map_or_else(|_| a.attr_type().to_id_string(), str::to_string);
                    let value = a
                        .as_str()
                        .map_or_else(|_| "?".to_string(), escape_rdn_value);
                    format!("{name}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.reverse();
    (!rdns.is_empty()).then(|| rdns.join(","))
}

/// RFC 2253 escaping of an attribute value.
fn escape_rdn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && matches!(c, ' ' | '#'))
            || (i + 1 == v.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificates_subject_in_rfc2253_order() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "acme, inc");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let cert = p.self_signed(&key).unwrap();
        // rcgen encodes CN before O; RFC 2253 writes the sequence from its last element (what
        // `openssl x509 -subject -nameopt RFC2253` prints for this certificate).
        assert_eq!(
            certificate_principal(cert.der()).as_deref(),
            Some("O=acme\\, inc,CN=alice")
        );
    }

    #[test]
    fn rfc2253_values() {
        assert_eq!(escape_rdn_value("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape_rdn_value(" x "), "\\ x\\ ");
        assert_eq!(escape_rdn_value("plain"), "plain");
    }
}
