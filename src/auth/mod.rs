//! # auth — who a connection is
//!
//! Authentication for the Kafka listener and the HTTP streams, below the front ends (which ask it) and above
//! nothing but the engine's small-file helper:
//!
//! ## Layout, top layer first
//! - [`tls`]   — the listener's TLS (rustls): certificates, mTLS, a client certificate's principal.
//! - [`sasl`]  — one connection's SASL exchange (PLAIN or SCRAM), and the per-core limit on failed
//!   attempts per source address.
//! - [`users`] — the users file (`<data-dir>/users.json`) that `shoal user` edits and each core
//!   reads again when it changes.
//! - [`scram`] — SCRAM-SHA-256/512: stored credentials and the server's side of an exchange.
//! - [`tokens`] — bearer tokens for the HTTP streams, each tied to a user (`<data-dir>/tokens.json`).
//! - [`watched`] — a small file a core reads again when it changes (users, tokens).

pub mod sasl;
pub mod scram;
pub mod tls;
pub mod tokens;
pub mod users;
pub mod watched;

use std::time::Duration;

/// A SASL mechanism a listener may offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    Scram(scram::Mechanism),
}

impl SaslMechanism {
    pub const ALL: [SaslMechanism; 3] = [
        SaslMechanism::Scram(scram::Mechanism::Sha256),
        SaslMechanism::Scram(scram::Mechanism::Sha512),
        SaslMechanism::Plain,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(m) => m.name(),
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// [`Self::from_name`], with the message a command line shows for a name it does not know.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::from_name(name)
            .ok_or_else(|| format!("{name}: one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"))
    }
}

/// A Kafka listener's security protocol, as Kafka names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub const ALL: [SecurityProtocol; 4] = [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The connection is TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Clients authenticate with SASL first.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    /// The protocol of a listener configured only by `--tls-cert` and `--sasl-mechanisms`.
    pub fn implied(tls: bool, sasl: bool) -> Self {
        match (tls, sasl) {
            (false, false) => SecurityProtocol::Plaintext,
            (true, false) => SecurityProtocol::Ssl,
            (false, true) => SecurityProtocol::SaslPlaintext,
            (true, true) => SecurityProtocol::SaslSsl,
        }
    }
}

/// How the Kafka listeners authenticate clients.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// SASL mechanisms offered on SASL listeners.
    pub sasl: Vec<SaslMechanism>,
    /// The certificate and key of TLS listeners.
    pub tls: Option<tls::TlsConfig>,
    /// A failed authentication is answered after this long, then the connection closes (Kafka's
    /// `connection.failed.authentication.delay.ms`).
    pub failed_delay: Duration,
    /// Failed authentications from one source address, per core, within a minute, after which its
    /// attempts are refused at once until the minute is over.
    pub max_failures_per_minute: u32,
    /// A SASL listener closes a connection not authenticated this long after it connected.
    pub timeout: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            sasl: Vec::new(),
            tls: None,
            failed_delay: Duration::from_millis(100),
            max_failures_per_minute: 10,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Who a connection is, in Kafka's form (`User:<name>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// A listener without authentication.
    Anonymous,
    User(String),
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Anonymous => write!(f, "User:ANONYMOUS"),
            Principal::User(u) => write!(f, "User:{u}"),
        }
    }
}
