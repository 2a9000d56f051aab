//! A connection's authentication, on a listener that requires SASL: before anything else the client
//! may send only ApiVersions, SaslHandshake (v1) and SaslAuthenticate, one at a time, in frames of at
//! most [`PRE_AUTH_MAX_FRAME`] bytes (nothing large is allocated for a client nobody knows: the
//! CVE-2022-34917 class). Anything else, a malformed request, an unsupported mechanism or a failed
//! authentication closes the connection (a failure after `--failed-authentication-delay-ms`), and
//! is logged; failures are counted per source address on the core, and an address over its limit
//! is refused at once for the rest of the minute.

use super::handlers::{self, frame, Reply};
use super::requests::{next_request, Responses};
use crate::auth::sasl::{SaslSession, Step, SASL_AUTHENTICATION_FAILED};
use crate::auth::Principal;
use crate::cores::Core;
use crate::metrics::add;
use crate::wire::frame::FrameReader;
use crate::wire::header::{decode, Request};
use crate::wire::SharedStream;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use std::net::IpAddr;
use std::rc::Rc;

/// Largest request before authentication (SASL tokens are a few hundred bytes).
pub const PRE_AUTH_MAX_FRAME: usize = 64 << 10;

/// What one request before authentication leads to.
enum Next {
    /// Write the reply and read the next request.
    More(Reply),
    /// Write the reply; the client is authenticated.
    Done(Reply, Principal),
    /// Write the reply (if any) and close.
    Close(Option<Reply>),
    /// Write the reply to SaslHandshake v0; the tokens follow in the legacy framing.
    Legacy(Reply),
}

/// Runs the exchange; the principal once authenticated, `None` once the connection is to close.
/// `seq` counts the requests answered (the connection's response order goes on from it).
pub(super) async fn authenticate(
    core: &Rc<Core>,
    reader: &mut SharedStream,
    frames: &mut FrameReader,
    responses: &Responses,
    peer: &Rc<str>,
    addr: Option<IpAddr>,
    seq: &mut i64,
) -> Option<Principal> {
    let mut session = SaslSession::Handshake;
    let timeout = core.config().auth.timeout;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let give_up = async {
            glommio::timer::sleep(deadline.saturating_duration_since(std::time::Instant::now()))
                .await;
            log::warn!("closing connection from {peer}: not authenticated within {timeout:?}");
        };
        let req = next_request(core, reader, frames, PRE_AUTH_MAX_FRAME, peer, give_up).await?;
        // SaslHandshake v0: the tokens follow as bare frames, not SaslAuthenticate requests.
        let legacy = req.api_key == ApiKey::SaslHandshake as i16 && req.api_version == 0;
        let next = step(core, &mut session, req, peer, addr).await;
        let next = match (legacy, next) {
            (true, Next::More(reply)) => Next::Legacy(reply),
            (_, next) => next,
        };
        if let Next::Legacy(reply) = next {
            responses.write_in_turn(core, *seq, reply).await;
            *seq += 1;
            let auth = Auth {
                core,
                peer,
                addr,
                deadline,
            };
            return legacy_tokens(&auth, &mut session, reader, frames, responses, seq).await;
        }
        let (reply, outcome) = match next {
            Next::More(r) | Next::Legacy(r) => (Some(r), None),
            Next::Done(r, p) => (Some(r), Some(Some(p))),
            Next::Close(r) => (r, Some(None)),
        };
        if let Some(reply) = reply {
            responses.write_in_turn(core, *seq, reply).await;
            *seq += 1;
        }
        if let Some(outcome) = outcome {
            return outcome;
        }
        if responses.is_closed() {
            return None;
        }
    }
}

/// Who is authenticating, and until when.
struct Auth<'a> {
    core: &'a Rc<Core>,
    peer: &'a Rc<str>,
    addr: Option<IpAddr>,
    deadline: std::time::Instant,
}

/// After SaslHandshake v0 (old clients): the mechanism's tokens as bare size-prefixed frames each
/// way, no Kafka header, as Kafka's broker takes them; the principal once authenticated, `None`
/// once the connection is to close (a failure is answered by closing, as in Kafka).
async fn legacy_tokens(
    auth: &Auth<'_>,
    session: &mut SaslSession,
    reader: &mut SharedStream,
    frames: &mut FrameReader,
    responses: &Responses,
    seq: &mut i64,
) -> Option<Principal> {
    let (core, peer) = (auth.core, auth.peer);
    loop {
        let left = auth
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        let read = futures_lite::future::or(
            async { Some(frames.read_sized(reader, 0, PRE_AUTH_MAX_FRAME).await) },
            async {
                glommio::timer::sleep(left).await;
                None
            },
        )
        .await;
        let token = match read {
            Some(Ok(token)) => token,
            Some(Err(e)) => {
                log::warn!("closing connection from {peer}: SASL token (SaslHandshake v0): {e}");
                return None;
            }
            None => {
                log::warn!("closing connection from {peer}: not authenticated in time");
                return None;
            }
        };
        let limited = auth.addr.is_some_and(|a| {
            let max = core.config().auth.max_failures_per_minute;
            core.security.auth_failures.blocked(a, max)
        });
        let outcome = if limited {
            Err(crate::auth::scram::Failed(
                "too many failed authentications from this address".into(),
            ))
        } else {
            session.authenticate(&token, &core.security.users).await
        };
        let (answer, principal) = match outcome {
            Ok(Step::Continue(bytes)) => (bytes, None),
            Ok(Step::Authenticated(bytes, principal)) => (bytes, Some(principal)),
            Err(crate::auth::scram::Failed(why)) => {
                if let (Some(a), false) = (auth.addr, limited) {
                    core.security.auth_failures.failed(a);
                }
                add(&core.metrics.authentication_failures, 1);
                log::warn!("authentication from {peer} (SaslHandshake v0) failed: {why}");
                glommio::timer::sleep(core.config().auth.failed_delay).await;
                return None;
            }
        };
        let size = bytes::Bytes::copy_from_slice(&(answer.len() as u32).to_be_bytes());
        let reply = Reply::Frame(vec![size, bytes::Bytes::from(answer)]);
        responses.write_in_turn(core, *seq, reply).await;
        *seq += 1;
        if let Some(principal) = principal {
            log::debug!("{peer} authenticated as {principal} (SaslHandshake v0)");
            add(&core.metrics.authentications, 1);
            return Some(principal);
        }
    }
}

async fn step(
    core: &Rc<Core>,
    session: &mut SaslSession,
    req: Request,
    peer: &Rc<str>,
    addr: Option<IpAddr>,
) -> Next {
    let key = ApiKey::try_from(req.api_key).expect("header parsing checked the key");
    let auth = &core.config().auth;
    let supported = handlers::supports(req.api_key, req.api_version);
    let malformed = |why: String| {
        log::warn!(
            "closing connection from {peer} before authentication: malformed {key:?}: {why}"
        );
        add(&core.metrics.protocol_errors, 1);
        Next::Close(None)
    };
    match key {
        ApiKey::ApiVersions if supported => match handlers::api_versions::handle(&req) {
            Ok(reply) => Next::More(reply),
            Err(e) => malformed(e),
        },
        ApiKey::ApiVersions => Next::More(handlers::api_versions::unsupported_version(&req)),
        ApiKey::SaslHandshake if supported => {
            let r: SaslHandshakeRequest = match decode(&req) {
                Ok(r) => r,
                Err(e) => return malformed(e),
            };
            let offered: Vec<StrBytes> = auth
                .sasl
                .iter()
                .map(|m| StrBytes::from_static_str(m.name()))
                .collect();
            match session.handshake(&r.mechanism, &auth.sasl) {
                Ok(()) => Next::More(frame(
                    key,
                    &req,
                    &SaslHandshakeResponse::default().with_mechanisms(offered),
                )),
                Err(code) => {
                    log::warn!(
                        "closing connection from {peer}: SASL mechanism {:?} is not offered",
                        r.mechanism.as_str()
                    );
                    Next::Close(Some(frame(
                        key,
                        &req,
                        &SaslHandshakeResponse::default()
                            .with_error_code(code)
                            .with_mechanisms(offered),
                    )))
                }
            }
        }
        ApiKey::SaslAuthenticate if supported => {
            let r: SaslAuthenticateRequest = match decode(&req) {
                Ok(r) => r,
                Err(e) => return malformed(e),
            };
            let limited = addr.is_some_and(|a| {
                core.security
                    .auth_failures
                    .blocked(a, auth.max_failures_per_minute)
            });
            let outcome = if limited {
                Err(crate::auth::scram::Failed(
                    "too many failed authentications from this address: try again in a minute"
                        .into(),
                ))
            } else {
                session
                    .authenticate(&r.auth_bytes, &core.security.users)
                    .await
            };
            match outcome {
                Ok(Step::Continue(bytes)) => Next::More(frame(
                    key,
                    &req,
                    &SaslAuthenticateResponse::default().with_auth_bytes(bytes.into()),
                )),
                Ok(Step::Authenticated(bytes, principal)) => {
                    log::debug!("{peer} authenticated as {principal}");
                    add(&core.metrics.authentications, 1);
                    Next::Done(
                        frame(
                            key,
                            &req,
                            &SaslAuthenticateResponse::default().with_auth_bytes(bytes.into()),
                        ),
                        principal,
                    )
                }
                Err(crate::auth::scram::Failed(why)) => {
                    if let (Some(a), false) = (addr, limited) {
                        core.security.auth_failures.failed(a);
                    }
                    add(&core.metrics.authentication_failures, 1);
                    log::warn!(
                        "authentication from {peer}{} failed: {why}",
                        session
                            .user()
                            .map(|u| format!(" as User:{u}"))
                            .unwrap_or_default()
                    );
                    glommio::timer::sleep(auth.failed_delay).await;
                    Next::Close(Some(frame(
                        key,
                        &req,
                        &SaslAuthenticateResponse::default()
                            .with_error_code(SASL_AUTHENTICATION_FAILED)
                            .with_error_message(Some(StrBytes::from_string(why))),
                    )))
                }
            }
        }
        _ => {
            log::warn!(
                "closing connection from {peer}: {key:?} v{} before authentication",
                req.api_version
            );
            add(&core.metrics.protocol_errors, 1);
            Next::Close(None)
        }
    }
}
