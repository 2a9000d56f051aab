//! HTTP/1.1 as the admin thread speaks it: one bounded request per connection (head size, header
//! count, body size, a deadline), plain or over TLS, and a response that closes the connection
//! without resetting it.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Largest request head (request line and headers) served; larger ones get 431.
pub(super) const MAX_REQUEST_HEAD: usize = 16 << 10;
/// Most headers in a request; more get 431.
pub(super) const MAX_HEADERS: usize = 64;
/// Largest body read (settings are a few bytes).
pub(super) const MAX_BODY: usize = 16 << 10;
/// An admin connection: plain TCP, or TLS over it. Timeouts and shutdown act on the TCP socket.
pub(super) trait AdminStream: Read + Write {
    fn tcp(&self) -> &TcpStream;
    /// Ends the response: TLS's close_notify, then the socket's write side.
    fn finish(&mut self) -> std::io::Result<()>;
}

impl AdminStream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
    fn finish(&mut self) -> std::io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

pub(super) type TlsStream =
    futures_rustls::rustls::StreamOwned<futures_rustls::rustls::ServerConnection, TcpStream>;

impl AdminStream for TlsStream {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
    fn finish(&mut self) -> std::io::Result<()> {
        self.conn.send_close_notify();
        self.flush()?;
        self.sock.shutdown(Shutdown::Write)
    }
}

/// A response: status line, content type, body.
pub(super) type Response = (&'static str, &'static str, String);

/// A request as read off the wire.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) method: String,
    /// Path and query, as sent.
    pub(super) target: String,
    /// The `Authorization` header's value, if sent.
    pub(super) authorization: Option<String>,
    /// The console's token cookie (`shoal_admin_token`), if sent.
    pub(super) cookie_token: Option<String>,
    pub(super) body: Vec<u8>,
}

/// Reads one request: `Ok(None)` if the client left before a whole head, `Err` with the answer for
/// a head too large, malformed or too slow.
pub(super) fn read_request(
    stream: &mut impl AdminStream,
    deadline: Instant,
) -> Result<Option<Request>, Response> {
    let mut buf = Vec::new();
    let (method, target, (authorization, cookie_token), head_len, content_length) = loop {
        match read_some(stream, &mut buf, deadline)? {
            0 => return Ok(None),
            _ => {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut parsed = httparse::Request::new(&mut headers);
                match parsed.parse(&buf) {
                    Ok(httparse::Status::Complete(n)) if n <= MAX_REQUEST_HEAD => {
                        break (
                            parsed.method.unwrap_or("").to_string(),
                            parsed.path.unwrap_or("").to_string(),
                            credentials(parsed.headers),
                            n,
                            content_length(parsed.headers),
                        );
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_REQUEST_HEAD => {}
                    Ok(_) | Err(httparse::Error::TooManyHeaders) => return Err(too_large()),
                    Err(e) => {
                        return Err((
                            "400 Bad Request",
                            "text/plain",
                            format!("bad request: {e}\n"),
                        ))
                    }
                }
            }
        }
    };
    // Then the body, as long as Content-Length says (bounded); a client that closes early sends
    // what it sent.
    let want = head_len + content_length.min(MAX_BODY);
    while buf.len() < want {
        if read_some(stream, &mut buf, deadline)? == 0 {
            break;
        }
    }
    Ok(Some(Request {
        method,
        target,
        authorization,
        cookie_token,
        body: buf.split_off(head_len),
    }))
}

/// Reads what has arrived into `buf` (0 at end of stream or on a reset); 408 past `deadline`.
pub(super) fn read_some(
    stream: &mut impl AdminStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<usize, Response> {
    let timed_out = || {
        (
            "408 Request Timeout",
            "text/plain",
            "request timeout\n".to_string(),
        )
    };
    let mut chunk = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        let _ = stream.tcp().set_read_timeout(Some(left));
        match stream.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out())
            }
            Err(_) => return Ok(0),
        }
    }
}

/// The `Authorization` header's value and the console's token cookie, where sent.
pub(super) fn credentials(headers: &[httparse::Header<'_>]) -> (Option<String>, Option<String>) {
    fn header<'a>(
        headers: &'a [httparse::Header<'_>],
        name: &'static str,
    ) -> impl Iterator<Item = &'a str> {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
    }
    let authorization = header(headers, "authorization")
        .next()
        .map(|v| v.trim().to_string());
    let cookie = header(headers, "cookie")
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.trim().to_string());
    (authorization, cookie)
}

/// The cookie the console's login page keeps the admin token in (SameSite=Strict), taken for
/// GET requests only: a cookie cannot change a setting.
pub(super) const TOKEN_COOKIE: &str = "shoal_admin_token";

/// The Content-Length header's value, 0 if absent or unreadable.
pub(super) fn content_length(headers: &[httparse::Header<'_>]) -> usize {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

pub(super) fn too_large() -> Response {
    (
        "431 Request Header Fields Too Large",
        "text/plain",
        "request too large\n".to_string(),
    )
}

pub(super) fn unavailable(why: &str) -> Response {
    ("503 Service Unavailable", "text/plain", format!("{why}\n"))
}

/// Whether `request` may be served: `GET /metrics` always (scrapers), the rest with the token.
pub(super) fn authorized(request: &Request, path: &str, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    if request.method == "GET" && path == "/metrics" {
        return true;
    }
    let matches =
        |given: &str| crate::auth::scram::constant_time_eq(given.as_bytes(), token.as_bytes());
    let bearer = request
        .authorization
        .as_deref()
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| matches(given.trim()));
    let cookie = request.method == "GET"
        && request
            .cookie_token
            .as_deref()
            .map(crate::console::percent_decode)
            .is_some_and(|given| matches(&given));
    bearer || cookie
}

/// `value` from a `?value=...` query.
pub(super) fn query_value(target: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("value="))
        .map(str::to_string)
}

/// The body, if it holds more than white space.
pub(super) fn body_text(body: &[u8]) -> Option<String> {
    Some(String::from_utf8_lossy(body).to_string()).filter(|s| !s.trim().is_empty())
}

/// Writes the response and closes the connection. What the client sent and was not read is drained
/// for a moment first (at most `linger`), so the close is a FIN the client reads the answer
/// before, not a reset.
pub(super) fn respond(
    mut stream: impl AdminStream,
    response: &Response,
    linger: Duration,
) -> std::io::Result<()> {
    write_response(&mut stream, response)?;
    stream.finish()?;
    let until = Instant::now() + linger;
    let mut sink = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.tcp().set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}

pub(super) fn write_response(
    stream: &mut impl Write,
    (status, kind, body): &Response,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_comes_from_the_query() {
        assert_eq!(query_value("/v1/config/x?a=b&value=on"), Some("on".into()));
        assert_eq!(query_value("/v1/config/x"), None);
    }
}
