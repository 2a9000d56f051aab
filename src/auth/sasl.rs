//! One connection's SASL exchange, as Kafka runs it (SaslHandshake v1, then SaslAuthenticate
//! messages carrying the mechanism's tokens), and the per-core limit on failed authentications.

use super::scram::{Failed, Mechanism, ScramServer};
use super::users::Users;
use super::{Principal, SaslMechanism};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Where one connection's authentication stands.
#[derive(Debug)]
pub enum SaslSession {
    /// No mechanism chosen yet.
    Handshake,
    Plain,
    Scram(ScramServer),
    Done,
}

/// Kafka's error codes for the exchange.
pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
pub const ILLEGAL_SASL_STATE: i16 = 34;
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// What the client sends next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes back; the exchange goes on.
    Continue(Vec<u8>),
    /// Send these bytes back; the client is authenticated as this principal.
    Authenticated(Vec<u8>, Principal),
}

impl SaslSession {
    /// SaslHandshake: chooses `mechanism` if `enabled` offers it (else Kafka's error code).
    pub fn handshake(&mut self, mechanism: &str, enabled: &[SaslMechanism]) -> Result<(), i16> {
        if !matches!(self, SaslSession::Handshake) {
            return Err(ILLEGAL_SASL_STATE);
        }
        match SaslMechanism::from_name(mechanism).filter(|m| enabled.contains(m)) {
            Some(SaslMechanism::Plain) => *self = SaslSession::Plain,
            Some(SaslMechanism::Scram(m)) => *self = SaslSession::Scram(ScramServer::new(m)),
            None => return Err(UNSUPPORTED_SASL_MECHANISM),
        }
        Ok(())
    }

    /// The user named so far (for logs).
    pub fn user(&self) -> Option<&str> {
        match self {
            SaslSession::Scram(s) => s.user(),
            _ => None,
        }
    }

    /// SaslAuthenticate: one token of the chosen mechanism.
    pub async fn authenticate(&mut self, token: &[u8], users: &Users) -> Result<Step, Failed> {
        match std::mem::replace(self, SaslSession::Done) {
            SaslSession::Plain => {
                let (user, password) = parse_plain(token)?;
                if !password_matches(users, &user, password).await {
                    return Err(Failed(
                        "Authentication failed: Invalid username or password (SASL mechanism PLAIN)"
                            .into(),
                    ));
                }
                Ok(Step::Authenticated(Vec::new(), Principal::User(user)))
            }
            SaslSession::Scram(mut scram) => {
                let store = users.current().await;
                let mechanism = match &scram {
                    ScramServer::Start { mechanism } | ScramServer::SentFirst { mechanism, .. } => {
                        *mechanism
                    }
                    ScramServer::Done => Mechanism::Sha256,
                };
                // Named by the client's first message; the last step completes the exchange.
                let named = scram.user().map(str::to_string);
                let (answer, done) =
                    scram.step(token, |u| store.credential(u, mechanism).cloned())?;
                if done {
                    let user = named.expect("a completed exchange named its user");
                    return Ok(Step::Authenticated(answer, Principal::User(user)));
                }
                *self = SaslSession::Scram(scram);
                Ok(Step::Continue(answer))
            }
            SaslSession::Handshake | SaslSession::Done => {
                Err(Failed("SaslAuthenticate before SaslHandshake".into()))
            }
        }
    }
}

/// Whether `password` is `user`'s, checked against any SCRAM credential of theirs (SASL/PLAIN,
/// HTTP Basic): one PBKDF2, milliseconds of CPU, run off the executor thread.
pub async fn password_matches(users: &Users, user: &str, password: Vec<u8>) -> bool {
    let store = users.current().await;
    let Some((mechanism, credential)) = store.any_credential(user) else {
        return false;
    };
    let credential = credential.clone();
    glommio::executor()
        .spawn_blocking(move || credential.matches(mechanism, &password))
        .await
}

/// A PLAIN token: `authzid NUL authcid NUL password`; an authorization id other than the user is
/// refused, as Kafka does.
fn parse_plain(token: &[u8]) -> Result<(String, Vec<u8>), Failed> {
    let bad = || Failed("invalid SASL/PLAIN token".into());
    let mut parts = token.splitn(3, |&b| b == 0);
    let (authzid, user, password) = (
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
    );
    let user = std::str::from_utf8(user).map_err(|_| bad())?.to_string();
    if user.is_empty() {
        return Err(bad());
    }
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(Failed(
            "an authorization id other than the user is not allowed".into(),
        ));
    }
    Ok((user, password.to_vec()))
}

/// Failed authentications per source address on one core, in one-minute windows.
#[derive(Debug, Default)]
pub struct FailureLimiter {
    by_address: RefCell<HashMap<IpAddr, (u32, Instant)>>,
}

/// Addresses remembered at most (the oldest windows are dropped first beyond it).
const MAX_ADDRESSES: usize = 10_000;
const WINDOW: Duration = Duration::from_secs(60);

impl FailureLimiter {
    /// Whether `addr` has failed `max` times within the current minute.
    pub fn blocked(&self, addr: IpAddr, max: u32) -> bool {
        self.by_address
            .borrow()
            .get(&addr)
            .is_some_and(|(n, since)| *n >= max && since.elapsed() < WINDOW)
    }

    pub fn failed(&self, addr: IpAddr) {
        let mut map = self.by_address.borrow_mut();
        if map.len() >= MAX_ADDRESSES {
            map.retain(|_, (_, since)| since.elapsed() < WINDOW);
            if map.len() >= MAX_ADDRESSES {
                map.clear();
            }
        }
        let e = map.entry(addr).or_insert((0, Instant::now()));
        if e.1.elapsed() >= WINDOW {
            *e = (0, Instant::now());
        }
        e.0 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tokens() {
        assert_eq!(
            parse_plain(b"\0alice\0pw").unwrap(),
            ("alice".into(), b"pw".to_vec())
        );
        assert_eq!(
            parse_plain(b"alice\0alice\0p\0w").unwrap(),
            ("alice".into(), b"p\0w".to_vec())
        );
        assert!(parse_plain(b"bob\0alice\0pw").is_err());
        assert!(parse_plain(b"\0\0pw").is_err());
        assert!(parse_plain(b"alice").is_err());
    }

    #[test]
    fn handshake_offers_only_enabled_mechanisms() {
        let enabled = [SaslMechanism::Scram(Mechanism::Sha512)];
        let mut s = SaslSession::Handshake;
        assert_eq!(
            s.handshake("PLAIN", &enabled),
            Err(UNSUPPORTED_SASL_MECHANISM)
        );
        assert_eq!(
            s.handshake("GSSAPI", &enabled),
            Err(UNSUPPORTED_SASL_MECHANISM)
        );
        assert_eq!(s.handshake("SCRAM-SHA-512", &enabled), Ok(()));
        assert_eq!(
            s.handshake("SCRAM-SHA-512", &enabled),
            Err(ILLEGAL_SASL_STATE)
        );
    }

    #[test]
    fn failures_are_limited_per_address_and_minute() {
        let l = FailureLimiter::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert!(!l.blocked(a, 3));
            l.failed(a);
        }
        assert!(l.blocked(a, 3));
        assert!(!l.blocked(b, 3));
    }
}
