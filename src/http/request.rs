//! A stream request as it arrives: its head read with a bound on size, header count and time
//! (slowloris), then its route and query checked, each refusal an HTTP status with the reason.

use futures_lite::{AsyncRead, AsyncReadExt};
use std::time::{Duration, Instant};

/// Largest request head (request line and headers) read; larger ones get 431.
pub const MAX_HEAD: usize = 16 << 10;
/// Most headers in a request; more get 431.
pub const MAX_HEADERS: usize = 48;

/// A refusal: status line and the reason, sent as the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: &'static str,
    pub why: String,
}

impl Refusal {
    pub fn new(status: &'static str, why: impl Into<String>) -> Self {
        Refusal {
            status,
            why: why.into(),
        }
    }
}

/// The head of a request, with what the streams need of its headers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    pub accept: Option<String>,
    pub last_event_id: Option<String>,
    pub origin: Option<String>,
    /// A bearer token (`Authorization: Bearer ...`).
    pub token: Option<String>,
    /// HTTP Basic's credentials (`Authorization: Basic ...`), base64 as sent.
    pub basic: Option<String>,
    /// The `Host` the client asked.
    pub host: Option<String>,
    /// `Upgrade: websocket` with `Connection: upgrade`.
    pub websocket: bool,
    pub websocket_key: Option<String>,
    pub websocket_version: Option<String>,
}

/// Reads a request head off `stream` before `deadline`, with its bytes as sent: `Ok(None)` when
/// the client left before sending one, `Err` with the answer for a head too large, malformed or
/// too slow. Bytes after the head (a client must not send any before the answer) are dropped.
pub async fn read_head(
    stream: &mut (impl AsyncRead + Unpin),
    deadline: Instant,
) -> Result<Option<(Vec<u8>, Head)>, Refusal> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::new(
                "408 Request Timeout",
                "request head not sent in time",
            ));
        }
        let read = futures_lite::future::or(async { Some(stream.read(&mut chunk).await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        let n = match read {
            None => continue,
            Some(Ok(0)) | Some(Err(_)) => return Ok(None),
            Some(Ok(n)) => n,
        };
        // Parsed once the head's end may have arrived: a head trickled a byte at a time is
        // not parsed again at every byte.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if buf[from..].windows(4).any(|w| w == b"\r\n\r\n") {
            if let Some(head) = parse_head(&buf)? {
                return Ok(Some((buf, head)));
            }
        }
        if buf.len() > MAX_HEAD {
            return Err(too_large());
        }
    }
}

fn too_large() -> Refusal {
    Refusal::new(
        "431 Request Header Fields Too Large",
        "request head too large",
    )
}

/// The head in `buf`, `None` while it is incomplete.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let end = match req.parse(buf) {
        Ok(httparse::Status::Complete(end)) => end,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(too_large()),
        Err(e) => {
            return Err(Refusal::new(
                "400 Bad Request",
                format!("malformed request: {e}"),
            ))
        }
    };
    if end > MAX_HEAD {
        return Err(too_large());
    }
    let mut head = Head {
        method: req.method.unwrap_or("").to_string(),
        target: req.path.unwrap_or("").to_string(),
        ..Head::default()
    };
    let mut upgrade = false;
    let mut connection_upgrade = false;
    for h in req.headers.iter() {
        let value = || String::from_utf8_lossy(h.value).trim().to_string();
        match h.name.to_ascii_lowercase().as_str() {
            "accept" => head.accept = Some(value()),
            "last-event-id" => head.last_event_id = Some(value()),
            "origin" => head.origin = Some(value()),
            "host" => head.host = Some(value()),
            "authorization" => {
                let value = value();
                head.token = value.strip_prefix("Bearer ").map(|t| t.trim().to_string());
                head.basic = value.strip_prefix("Basic ").map(|t| t.trim().to_string());
            }
            "upgrade" => upgrade = value().eq_ignore_ascii_case("websocket"),
            "connection" => {
                connection_upgrade = value()
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            }
            "sec-websocket-key" => head.websocket_key = Some(value()),
            "sec-websocket-version" => head.websocket_version = Some(value()),
            _ => {}
        }
    }
    head.websocket = upgrade && connection_upgrade;
    Ok(Some(head))
}

/// Where a stream starts (`?offset=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Earliest,
    Latest,
    /// This offset.
    At(i64),
    /// The first record at or after this time (ms since the epoch).
    Time(i64),
    /// Right after this offset (a resumed stream's last event).
    After(i64),
}

/// How records are written (`?format=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// One JSON object per record: partition, offset, timestamp, key, value, headers.
    Json,
    /// The record's value alone.
    Value,
}

/// What a subscriber that falls behind gets (`?slow=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slow {
    /// A last event that says so, then the connection closes.
    Disconnect,
    /// A `gap` event naming the offsets skipped, then the stream goes on from the tail.
    Skip,
}

/// A stream request: one partition of a topic or view, or all of them merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRequest {
    pub topic: String,
    /// `None`: every partition, merged (`/v1/topics/{topic}/stream`).
    pub partition: Option<i32>,
    /// Where each partition starts, unless `resume` names it.
    pub start: Start,
    /// A merged stream's resume id: each partition it names resumes right after that offset.
    pub resume: Vec<(i32, i64)>,
    pub format: Format,
    pub read_committed: bool,
    pub slow: Slow,
    /// The bearer token, from `Authorization` or `?access_token=` (browsers' `EventSource` and
    /// `WebSocket` cannot set headers).
    pub token: Option<String>,
}

/// The stream a request's target names, checked: `GET /v1/topics/{topic}/partitions/{p}/stream`
/// or `GET /v1/topics/{topic}/stream` (every partition, merged), with its query; the resume id
/// (`Last-Event-ID` or `?resume=`) overrides `?offset=`.
pub fn route(head: &Head) -> Result<StreamRequest, Refusal> {
    if head.method != "GET" {
        return Err(Refusal::new(
            "405 Method Not Allowed",
            "streams are read with GET",
        ));
    }
    let (path, query) = head.target.split_once('?').unwrap_or((&head.target, ""));
    let parts: Vec<&str> = path.split('/').collect();
    let (topic, partition) = match parts.as_slice() {
        ["", "v1", "topics", topic, "partitions", p, "stream"] => (*topic, Some(*p)),
        ["", "v1", "topics", topic, "stream"] => (*topic, None),
        _ => {
            return Err(Refusal::new(
                "404 Not Found",
                "no such path: streams are /v1/topics/{topic}/stream (every partition) and \
                 /v1/topics/{topic}/partitions/{p}/stream",
            ))
        }
    };
    let topic = percent_decode(topic)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Refusal::new("400 Bad Request", "the topic name is not valid UTF-8"))?;
    let partition = match partition {
        None => None,
        Some(p) => Some(
            p.parse()
                .ok()
                .filter(|p: &i32| *p >= 0)
                .ok_or_else(|| Refusal::new("400 Bad Request", format!("bad partition {p:?}")))?,
        ),
    };
    let mut req = StreamRequest {
        topic,
        partition,
        start: Start::Latest,
        resume: Vec::new(),
        format: Format::Json,
        read_committed: false,
        slow: Slow::Disconnect,
        token: head.token.clone(),
    };
    let resume = apply_query(&mut req, query, head.last_event_id.clone())?;
    let resume = match resume.filter(|id| !id.trim().is_empty()) {
        Some(id) => parse_event_ids(&id).ok_or_else(|| {
            bad(
                "resume id",
                &id,
                "PARTITION:OFFSET (or a merged stream's list of them), as the last event's id",
            )
        })?,
        None => Vec::new(),
    };
    match req.partition {
        Some(p) if !resume.is_empty() => {
            let (_, offset) = resume.iter().find(|(q, _)| *q == p).ok_or_else(|| {
                Refusal::new(
                    "400 Bad Request",
                    format!("the resume id names no offset of partition {p}"),
                )
            })?;
            req.start = Start::After(*offset);
        }
        Some(_) => {}
        None => {
            if req.format == Format::Value {
                return Err(Refusal::new(
                    "400 Bad Request",
                    "format=value names no partition or offset: a merged stream is JSON \
                     (or stream one partition: /v1/topics/{topic}/partitions/{p}/stream)",
                ));
            }
            if let Start::At(_) = req.start {
                return Err(Refusal::new(
                    "400 Bad Request",
                    "an offset is one partition's: a whole topic starts at earliest, latest or \
                     @milliseconds, or resumes from an id",
                ));
            }
            req.resume = resume;
        }
    }
    Ok(req)
}

/// Applies the query's parameters to `req`; returns the resume id (`?resume=`, else `resume`).
fn apply_query(
    req: &mut StreamRequest,
    query: &str,
    resume: Option<String>,
) -> Result<Option<String>, Refusal> {
    let mut resume = resume;
    for (key, value) in query.split('&').filter(|kv| !kv.is_empty()).map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k, percent_decode(v).unwrap_or_default())
    }) {
        match key {
            "offset" => req.start = parse_start(&value)?,
            "format" => {
                req.format = match value.as_str() {
                    "json" => Format::Json,
                    "value" => Format::Value,
                    _ => return Err(bad("format", &value, "json or value")),
                }
            }
            "isolation" => {
                req.read_committed = match value.as_str() {
                    "read_uncommitted" => false,
                    "read_committed" => true,
                    _ => {
                        return Err(bad(
                            "isolation",
                            &value,
                            "read_uncommitted or read_committed",
                        ))
                    }
                }
            }
            "slow" => {
                req.slow = match value.as_str() {
                    "disconnect" => Slow::Disconnect,
                    "skip" => Slow::Skip,
                    _ => return Err(bad("slow", &value, "disconnect or skip")),
                }
            }
            "resume" => resume = Some(value),
            "access_token" => req.token = Some(value),
            _ => {
                return Err(Refusal::new(
                    "400 Bad Request",
                    format!("unknown parameter {key:?}"),
                ))
            }
        }
    }
    Ok(resume)
}

fn bad(what: &str, value: &str, expected: &str) -> Refusal {
    Refusal::new(
        "400 Bad Request",
        format!("bad {what} {value:?}: expected {expected}"),
    )
}

fn parse_start(value: &str) -> Result<Start, Refusal> {
    let expected = "earliest, latest, an offset or @milliseconds";
    match value {
        "earliest" => Ok(Start::Earliest),
        "latest" => Ok(Start::Latest),
        _ => {
            let (time, number) = match value.strip_prefix('@') {
                Some(ms) => (true, ms),
                None => (false, value),
            };
            let n: i64 = number
                .parse()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| bad("offset", value, expected))?;
            Ok(if time { Start::Time(n) } else { Start::At(n) })
        }
    }
}

/// An event id: `PARTITION:OFFSET`, or a merged stream's `PARTITION:OFFSET,...` (each
/// partition once; an offset of -1 is before the first).
pub fn parse_event_ids(id: &str) -> Option<Vec<(i32, i64)>> {
    let mut ids: Vec<(i32, i64)> = Vec::new();
    for one in id.trim().split(',') {
        let (p, o) = one.trim().split_once(':')?;
        let p: i32 = p.parse().ok().filter(|p| *p >= 0)?;
        let o: i64 = o.parse().ok().filter(|o| *o >= -1)?;
        if ids.iter().any(|(q, _)| *q == p) {
            return None;
        }
        ids.push((p, o));
    }
    Some(ids)
}

/// A merged stream's event id: where every partition stands (`PARTITION:LAST_OFFSET,...`).
pub fn event_ids(positions: impl Iterator<Item = (i32, i64)>, out: &mut Vec<u8>) {
    use std::io::Write;
    for (i, (p, o)) in positions.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, "{p}:{o}");
    }
}

/// `%XX` escapes (and `+` as a space) decoded; `None` when the result is not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    String::from_utf8(percent_decode_bytes(s)).ok()
}

/// The bytes `%XX` escapes (and `+` as a space) stand for; a `%` not followed by two hex digits
/// stays as it is.
pub fn percent_decode_bytes(s: &str) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| Some(hex(bytes[i + 1])? << 4 | hex(bytes[i + 2])?))
            .flatten();
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    out
}

/// How long a client has to send its request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &str) -> Head {
        Head {
            method: "GET".into(),
            target: target.into(),
            ..Head::default()
        }
    }

    #[test]
    fn a_partition_stream_with_its_query() {
        let r = route(&head(
            "/v1/topics/pri%2Bces/partitions/3/stream?offset=17&format=value&isolation=read_committed&slow=skip",
        ))
        .unwrap();
        assert_eq!(r.topic, "pri+ces");
        assert_eq!(r.partition, Some(3));
        assert_eq!(r.start, Start::At(17));
        assert_eq!(r.format, Format::Value);
        assert!(r.read_committed);
        assert_eq!(r.slow, Slow::Skip);
        let r = route(&head(
            "/v1/topics/t/partitions/0/stream?offset=@1700000000000",
        ))
        .unwrap();
        assert_eq!(r.start, Start::Time(1_700_000_000_000));
        let r = route(&head("/v1/topics/t/partitions/0/stream")).unwrap();
        assert_eq!(
            (r.start, r.format, r.slow),
            (Start::Latest, Format::Json, Slow::Disconnect)
        );
    }

    #[test]
    fn the_resume_id_wins_over_the_offset() {
        let mut h = head("/v1/topics/t/partitions/2/stream?offset=earliest");
        h.last_event_id = Some("2:41".into());
        assert_eq!(route(&h).unwrap().start, Start::After(41));
        let r = route(&head("/v1/topics/t/partitions/2/stream?resume=2%3A9")).unwrap();
        assert_eq!(r.start, Start::After(9));
        h.last_event_id = Some("1:41".into());
        assert_eq!(route(&h).unwrap_err().status, "400 Bad Request");
        // A merged stream's id names every partition; a partition's stream takes its own.
        h.last_event_id = Some("0:-1,2:7,1:3".into());
        assert_eq!(route(&h).unwrap().start, Start::After(7));
        let mut merged = head("/v1/topics/t/stream?offset=earliest");
        merged.last_event_id = Some("0:-1,2:7".into());
        let r = route(&merged).unwrap();
        assert_eq!((r.partition, r.start), (None, Start::Earliest));
        assert_eq!(r.resume, vec![(0, -1), (2, 7)]);
        let mut ids = Vec::new();
        event_ids(r.resume.iter().copied(), &mut ids);
        assert_eq!(ids, b"0:-1,2:7");
        for bad in ["0:1,0:2", "0:-2", "0:1,", "x"] {
            merged.last_event_id = Some(bad.into());
            assert!(route(&merged).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_requests_say_why() {
        for (target, status) in [
            ("/v1/topics/t/partitions/x/stream", "400 Bad Request"),
            ("/v1/topics/t/partitions/-1/stream", "400 Bad Request"),
            (
                "/v1/topics/t/partitions/0/stream?offset=soon",
                "400 Bad Request",
            ),
            (
                "/v1/topics/t/partitions/0/stream?offset=-4",
                "400 Bad Request",
            ),
            (
                "/v1/topics/t/partitions/0/stream?format=xml",
                "400 Bad Request",
            ),
            (
                "/v1/topics/t/partitions/0/stream?bogus=1",
                "400 Bad Request",
            ),
            (
                "/v1/topics/t/partitions/0/stream?resume=zz",
                "400 Bad Request",
            ),
            ("/v1/topics/t/stream?format=value", "400 Bad Request"),
            ("/v1/topics/t/stream?offset=5", "400 Bad Request"),
            ("/v1/topics/t/streams", "404 Not Found"),
            ("/nothing", "404 Not Found"),
        ] {
            let err = route(&head(target)).unwrap_err();
            assert_eq!(err.status, status, "{target}: {}", err.why);
            assert!(!err.why.is_empty());
        }
        let mut h = head("/v1/topics/t/partitions/0/stream");
        h.method = "POST".into();
        assert_eq!(route(&h).unwrap_err().status, "405 Method Not Allowed");
    }

    #[test]
    fn heads_parse_with_bounds() {
        let raw = b"GET /v1/topics/t/partitions/0/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
                    Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: abc\r\nLast-Event-ID: 0:5\r\n\r\n";
        let h = parse_head(raw).unwrap().unwrap();
        assert!(h.websocket);
        assert_eq!(h.websocket_key.as_deref(), Some("abc"));
        assert_eq!(h.last_event_id.as_deref(), Some("0:5"));
        assert_eq!(parse_head(&raw[..20]).unwrap(), None);
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..MAX_HEADERS + 1 {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_head(&many).unwrap_err().status,
            "431 Request Header Fields Too Large"
        );
        assert_eq!(
            parse_head(b"\x00\x01 nonsense\r\n\r\n").unwrap_err().status,
            "400 Bad Request"
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c").as_deref(), Some("a b c"));
        assert_eq!(percent_decode("%zz%").as_deref(), Some("%zz%"));
        assert_eq!(percent_decode("%ff"), None);
        // A sign is not a hex digit.
        assert_eq!(percent_decode("%+1").as_deref(), Some("% 1"));
    }

    #[test]
    fn random_heads_never_panic() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = b"GET /v1/topics/t/partitions/0/stream?offset=3&format=json HTTP/1.1\r\nLast-Event-ID: 0:1\r\n\r\n";
        for _ in 0..20_000 {
            let mut bytes = base.to_vec();
            for _ in 0..(next() % 6) {
                let at = (next() as usize) % bytes.len();
                bytes[at] = next() as u8;
            }
            if let Ok(Some(head)) = parse_head(&bytes) {
                let _ = route(&head);
            }
        }
    }
}
