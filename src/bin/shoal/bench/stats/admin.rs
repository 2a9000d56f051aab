//! shoal's admin API over plain HTTP: reading `/metrics`, turning a switch on or off.

use super::metrics::parse_metrics;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

fn http(admin: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: shoal\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("admin: malformed HTTP answer"))?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        return Err(std::io::Error::other(format!(
            "admin {method} {path}: {status}: {}",
            body.trim()
        )));
    }
    Ok(body.to_string())
}

/// Every sample of `/metrics`, summed over labels, by family name; a histogram's buckets also by
/// their bound, as `NAME_bucket|le=BOUND` (summed over the other labels).
pub fn scrape(admin: SocketAddr) -> std::io::Result<HashMap<String, f64>> {
    Ok(parse_metrics(&http(admin, "GET", "/metrics", "")?))
}

/// Turns one of shoal's on/off settings (`fetch_coalescing`, `view_sharing`) on or off on every
/// core, through its admin API.
pub fn set_switch(admin: SocketAddr, name: &str, on: bool) -> std::io::Result<()> {
    http(
        admin,
        "PUT",
        &format!("/v1/config/{name}"),
        if on { "on" } else { "off" },
    )
    .map(|_| ())
}
