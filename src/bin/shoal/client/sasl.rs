//! The client side of SASL (`--sasl-mechanism` and a user and password): once enabled, every
//! connection the process makes, blocking or async, authenticates right after connecting (and after TLS),
//! with SaslHandshake v1 and SaslAuthenticate v2.

use super::tls::SyncStream;
use super::{decode_response, request_frame};
use futures_lite::{AsyncWriteExt, FutureExt};
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use shoal::auth::scram::ScramClient;
use shoal::auth::SaslMechanism;
use shoal::wire::frame::{read_blocking, read_response};
use shoal::wire::SharedStream;
use std::io::{self, Write};
use std::sync::OnceLock;

#[derive(Debug)]
struct Credentials {
    mechanism: SaslMechanism,
    user: String,
    password: String,
}

static SASL: OnceLock<Credentials> = OnceLock::new();

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Makes every later connection of the process authenticate.
pub fn enable(mechanism: SaslMechanism, user: String, password: String) -> io::Result<()> {
    SASL.set(Credentials {
        mechanism,
        user,
        password,
    })
    .map_err(|_| other("SASL was enabled twice"))
}

/// Where an exchange stands: the next token to send, and what checks the server's answer.
enum Exchange {
    Plain,
    Scram(ScramClient, u8),
}

impl Exchange {
    fn start(c: &Credentials) -> (Exchange, Vec<u8>) {
        match c.mechanism {
            SaslMechanism::Plain => (
                Exchange::Plain,
                format!("\0{}\0{}", c.user, c.password).into_bytes(),
            ),
            SaslMechanism::Scram(m) => {
                let (client, first) = ScramClient::start(m, &c.user, &c.password);
                (Exchange::Scram(client, 0), first)
            }
        }
    }

    /// The server's answer to our last token: the next token, or `None` when authenticated.
    fn next(&mut self, answer: SaslAuthenticateResponse) -> io::Result<Option<Vec<u8>>> {
        if answer.error_code != 0 {
            return Err(other(format!(
                "SASL authentication failed ({}): {}",
                answer.error_code,
                answer.error_message.as_deref().unwrap_or("")
            )));
        }
        match self {
            Exchange::Plain => Ok(None),
            Exchange::Scram(client, step) => {
                *step += 1;
                if *step == 1 {
                    client
                        .answer(&answer.auth_bytes)
                        .map(Some)
                        .map_err(|e| other(e.0))
                } else {
                    client.verify(&answer.auth_bytes).map_err(|e| other(e.0))?;
                    Ok(None)
                }
            }
        }
    }
}

fn handshake(c: &Credentials) -> io::Result<bytes::BytesMut> {
    let r = SaslHandshakeRequest::default()
        .with_mechanism(StrBytes::from_static_str(c.mechanism.name()));
    request_frame(ApiKey::SaslHandshake, 1, -100, &r)
}

fn check_handshake(r: SaslHandshakeResponse) -> io::Result<()> {
    if r.error_code != 0 {
        return Err(other(format!(
            "the broker refused the SASL mechanism ({})",
            r.error_code
        )));
    }
    Ok(())
}

fn authenticate_request(step: i32, token: Vec<u8>) -> io::Result<bytes::BytesMut> {
    let r = SaslAuthenticateRequest::default().with_auth_bytes(token.into());
    request_frame(ApiKey::SaslAuthenticate, 2, -101 - step, &r)
}

/// Authenticates an async connection, if SASL is enabled.
pub async fn authenticate(stream: &mut SharedStream) -> io::Result<()> {
    let Some(c) = SASL.get() else { return Ok(()) };
    let exchange = async {
        stream.write_all(&handshake(c)?).await?;
        stream.flush().await?;
        let frame = read_response(stream, 1 << 20).await.map_err(other)?;
        check_handshake(decode_response(ApiKey::SaslHandshake, 1, -100, frame)?)?;
        let (mut state, mut token) = Exchange::start(c);
        for step in 0.. {
            stream
                .write_all(&authenticate_request(step, token)?)
                .await?;
            stream.flush().await?;
            let frame = read_response(stream, 1 << 20).await.map_err(other)?;
            let answer = decode_response(ApiKey::SaslAuthenticate, 2, -101 - step, frame)?;
            match state.next(answer)? {
                Some(next) => token = next,
                None => break,
            }
        }
        Ok(())
    };
    exchange
        .or(async {
            glommio::timer::sleep(std::time::Duration::from_secs(10)).await;
            Err(other("SASL authentication timed out"))
        })
        .await
}

/// Authenticates a blocking connection, if SASL is enabled.
pub fn authenticate_sync(stream: &mut SyncStream) -> io::Result<()> {
    let Some(c) = SASL.get() else { return Ok(()) };
    stream.write_all(&handshake(c)?)?;
    stream.flush()?;
    let frame = read_blocking(stream, 1 << 20).map_err(other)?;
    check_handshake(decode_response(ApiKey::SaslHandshake, 1, -100, frame)?)?;
    let (mut state, mut token) = Exchange::start(c);
    for step in 0.. {
        stream.write_all(&authenticate_request(step, token)?)?;
        stream.flush()?;
        let frame = read_blocking(stream, 1 << 20).map_err(other)?;
        let answer = decode_response(ApiKey::SaslAuthenticate, 2, -101 - step, frame)?;
        match state.next(answer)? {
            Some(next) => token = next,
            None => break,
        }
    }
    Ok(())
}
