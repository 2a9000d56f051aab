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
        let (answer, principal) = match take_token(core, session, &token, peer, auth.addr).await {
            Ok(Step::Continue(bytes)) => (bytes, None),
            Ok(Step::Authenticated(bytes, principal)) => (bytes, Some(principal)),
            // Closed without an answer, as Kafka ends a failed exchange in this framing.
            Err(_) => return None,
        };
        let size = bytes::Bytes::copy_from_slice(&(answer.len() as u32).to_be_bytes());
        let reply = Reply::Frame(vec![size, bytes::Bytes::from(answer)]);
        responses.write_in_turn(core, *seq, reply).await;
        *seq += 1;
        if principal.is_some() {
            return principal;
        }
    }
}

/// One token of the client's, whatever the framing: refused at once from an address past its
/// failures for the minute, else handed to the mechanism. An authentication is counted; a failure
/// is counted (against the address too), logged with the user named, and answered only after
/// `--failed-authentication-delay-ms`; its reason is returned.
async fn take_token(
    core: &Core,
    session: &mut SaslSession,
    token: &[u8],
    peer: &str,
    addr: Option<IpAddr>,
) -> Result<Step, String> {
    let auth = &core.config().auth;
    let failures = &core.security.auth_failures;
    let limited = addr.is_some_and(|a| failures.blocked(a, auth.max_failures_per_minute));
    let outcome = if limited {
        Err(crate::auth::scram::Failed(
            "too many failed authentications from this address: try again in a minute".into(),
        ))
    } else {
        session.authenticate(token, &core.security.users).await
    };
    match outcome {
        Ok(step) => {
            if let Step::Authenticated(_, principal) = &step {
                log::debug!("{peer} authenticated as {principal}");
                add(&core.metrics.authentications, 1);
            }
            Ok(step)
        }
        Err(crate::auth::scram::Failed(why)) => {
            if let (Some(a), false) = (addr, limited) {
                failures.failed(a);
            }
            add(&core.metrics.authentication_failures, 1);
            let user = session.user().map(|u| format!(" as User:{u}"));
            log::warn!(
                "authentication from {peer}{} failed: {why}",
                user.unwrap_or_default()
            );
            glommio::timer::sleep(auth.failed_delay).await;
            Err(why)
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
            let answer = |bytes: Vec<u8>| {
                let r = SaslAuthenticateResponse::default().with_auth_bytes(bytes.into());
                frame(key, &req, &r)
            };
            match take_token(core, session, &r.auth_bytes, peer, addr).await {
                Ok(Step::Continue(bytes)) => Next::More(answer(bytes)),
                Ok(Step::Authenticated(bytes, principal)) => Next::Done(answer(bytes), principal),
                Err(why) => Next::Close(Some(frame(
                    key,
                    &req,
                    &SaslAuthenticateResponse::default()
                        .with_error_code(SASL_AUTHENTICATION_FAILED)
                        .with_error_message(Some(StrBytes::from_string(why))),
                ))),
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
