//! Admin HTTP on core 0: `GET /metrics` (Prometheus text, every core's figures), `GET /v1/status`
//! (JSON), and live settings: `PUT /v1/config/<name>` with the value as body (or `?value=`):
//! `fetch_coalescing` on|off, `view_sharing` on|off, `max_delta_for_fanout` offsets; answered once
//! every core has applied it. It runs as a task on core 0's executor and gathers other cores' figures
//! by messages, so it needs no thread, lock or HTTP framework; it speaks just enough HTTP/1.1 for
//! scrapers and curl (one request per connection, bounded request size).

use crate::control::{gather_stats, set_everywhere, Setting};
use crate::core::Core;
use crate::metrics::render_prometheus;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use std::rc::Rc;

const MAX_REQUEST_HEAD: usize = 16 << 10;

pub async fn serve(core: Rc<Core>, listener: TcpListener) {
    crate::server::accept_until_shutdown(core, listener, "admin", handle).await
}

async fn handle(core: Rc<Core>, mut stream: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > MAX_REQUEST_HEAD {
            let _ = respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            )
            .await;
            return;
        }
    }
    // Then the body, as long as Content-Length says (settings are a few bytes; bounded anyway).
    let header_end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
    let want = content_length(&head[..header_end]).min(MAX_REQUEST_HEAD);
    while head.len() < header_end + want {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line =
        String::from_utf8_lossy(head.split(|&b| b == b'\n').next().unwrap_or_default()).to_string();
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let full_path = words_path(&line);
    let (status, kind, body) = match (method, path) {
        ("PUT" | "POST", setting) if setting.starts_with("/v1/config/") => {
            let value = query_value(&full_path)
                .or_else(|| body_text(&head))
                .unwrap_or_default();
            match parse_setting(&setting["/v1/config/".len()..], value.trim()) {
                Ok(s) => {
                    set_everywhere(&core, s).await;
                    ("200 OK", "text/plain", format!("{s:?}\n"))
                }
                Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
            }
        }
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            render_prometheus(&gather_stats(&core).await),
        ),
        ("GET", "/v1/status") => ("200 OK", "application/json", status_json(&core).await),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics or /v1/status\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".to_string(),
        ),
    };
    let _ = respond(&mut stream, status, kind, &body).await;
}

/// A live setting from its name and value.
fn parse_setting(name: &str, value: &str) -> Result<Setting, String> {
    match name {
        "fetch_coalescing" => crate::units::parse_on_off(value).map(Setting::FetchCoalescing),
        "view_sharing" => crate::units::parse_on_off(value).map(Setting::ViewSharing),
        "max_delta_for_fanout" => value
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .map(Setting::MaxDeltaForFanout)
            .ok_or_else(|| {
                format!("max_delta_for_fanout takes a number of offsets, not {value:?}")
            }),
        _ => Err(format!(
            "unknown setting {name:?}: fetch_coalescing, view_sharing, max_delta_for_fanout"
        )),
    }
}

fn words_path(line: &str) -> String {
    line.split_whitespace().nth(1).unwrap_or("").to_string()
}

/// `value` from a `?value=...` query.
fn query_value(path: &str) -> Option<String> {
    let query = path.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("value="))
        .map(str::to_string)
}

/// The Content-Length header's value, 0 if absent or unreadable.
fn content_length(head: &[u8]) -> usize {
    String::from_utf8_lossy(head)
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// The body that followed the head.
fn body_text(head: &[u8]) -> Option<String> {
    let at = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some(String::from_utf8_lossy(&head[at..]).to_string()).filter(|s| !s.trim().is_empty())
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    kind: &str,
    body: &str,
) -> std::io::Result<()> {
    let head =
        format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.close().await
}

async fn status_json(core: &Rc<Core>) -> String {
    let stats = gather_stats(core).await;
    let table = core.topics.borrow().clone();
    let topics: serde_json::Map<String, serde_json::Value> = table
        .topics
        .iter()
        .map(|(name, m)| {
            (
                name.clone(),
                serde_json::json!({
                    "partitions": m.partitions,
                    "configs": m.configs,
                    "leaders": (0..m.partitions).map(|p| table.owner(m, p, core.cores)).collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    let cores: Vec<serde_json::Value> = stats
        .iter()
        .map(|s| {
            serde_json::json!({
                "core": s.core,
                "port": core.ports[s.core],
                "connections_open": s.connections_open,
                "partitions": s.partitions.len(),
                "log_bytes": s.partitions.iter().map(|p| p.size_bytes).sum::<u64>(),
                "tail_cache_bytes": s.tail_cache_used,
                "storage_errors": s.storage.errors,
                "storage_failing": s.storage.failing_logs,
            })
        })
        .collect();
    // Partitions whose appends fail now, with the failure that started it.
    let storage_failures: Vec<serde_json::Value> = stats
        .iter()
        .flat_map(|s| {
            s.partitions.iter().filter_map(move |p| {
                p.storage_failure.as_ref().map(|error| {
                    serde_json::json!({
                        "core": s.core,
                        "topic": p.topic,
                        "partition": p.partition,
                        "error": error,
                    })
                })
            })
        })
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "data_dir": core.config.data_dir,
        "topic_table_revision": table.revision,
        "topics": topics,
        "cores": cores,
        "storage_failures": storage_failures,
    })
    .to_string()
}
