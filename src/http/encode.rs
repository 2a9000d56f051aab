//! The bytes a subscriber reads: a batch's records as Server-Sent Events or WebSocket frames, in
//! the JSON or the value format, and the stream's own messages (heartbeats, gaps, the slow
//! subscriber's last word). A server's SSE event and WebSocket frame are the same bytes for every
//! subscriber (no masking from the server, no per-client state), which is what lets a core share
//! one encoded batch with all of them.

use super::request::Format;
use base64::Engine;
use shards::batch::{records_section, section_records, BatchHeader, Record};
use shards::InvalidBatch;
use std::io::Write;

/// How the subscriber reads the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// `text/event-stream`.
    Sse,
    /// RFC 6455, after the upgrade.
    WebSocket,
}

/// A protocol and a format: how one subscriber's records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encoding {
    pub protocol: Protocol,
    pub format: Format,
    /// A merged stream's shape: each batch one message (an SSE event, a WebSocket text frame)
    /// holding a JSON array of its records, closed per subscriber by [`close_batch`] with an id
    /// that names every partition's position.
    pub whole_batches: bool,
}

/// WebSocket opcodes the server sends.
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Appends the records of batch `h` (`batch`, compressed or not) at or after offset `from` to
/// `out`; returns how many it wrote. Control batches (transaction markers) hold no records to
/// send and write nothing.
pub fn encode_batch(
    enc: Encoding,
    partition: i32,
    h: &BatchHeader,
    batch: &[u8],
    from: i64,
    out: &mut Vec<u8>,
) -> Result<u32, InvalidBatch> {
    if h.is_control() {
        return Ok(0);
    }
    let plain = records_section(h, batch)?;
    let records = section_records(h, &plain)?;
    if enc.whole_batches {
        return Ok(whole_batch(enc.protocol, partition, &records, from, out));
    }
    let mut n = 0;
    // A WebSocket frame's length comes before its JSON: the JSON is written here first, one
    // buffer for the whole batch.
    let mut scratch = Vec::new();
    for r in records.iter().filter(|r| r.offset >= from) {
        encode_record(enc, partition, r, out, &mut scratch);
        n += 1;
    }
    Ok(n)
}

/// A batch's records at or after `from` as one message's shared part: for SSE `data: [..]` and
/// its line end, for WebSocket the frame's payload up to `{"records":[..]`; the subscriber's
/// [`close_batch`] completes it. Writes nothing when no record is left.
fn whole_batch(
    protocol: Protocol,
    partition: i32,
    records: &[Record<'_>],
    from: i64,
    out: &mut Vec<u8>,
) -> u32 {
    let mut n = 0;
    for r in records.iter().filter(|r| r.offset >= from) {
        out.extend_from_slice(match (n, protocol) {
            (0, Protocol::Sse) => b"data: [",
            (0, Protocol::WebSocket) => b"{\"records\":[",
            _ => b",",
        });
        json_record(partition, r, out);
        n += 1;
    }
    if n > 0 {
        out.extend_from_slice(match protocol {
            Protocol::Sse => b"]\n",
            Protocol::WebSocket => b"]",
        });
    }
    n
}

/// What one subscriber adds around a whole batch's shared part (`shared_len` bytes) so that its
/// message carries `ids` (where the stream stands after it): the bytes before it (a WebSocket
/// frame's header) and after it (SSE's `id:` line and the event's end; WebSocket's `"id"`).
pub fn close_batch(protocol: Protocol, shared_len: usize, ids: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut after = Vec::with_capacity(ids.len() + 12);
    match protocol {
        Protocol::Sse => {
            after.extend_from_slice(b"id: ");
            after.extend_from_slice(ids);
            after.extend_from_slice(b"\n\n");
            (Vec::new(), after)
        }
        Protocol::WebSocket => {
            after.extend_from_slice(b",\"id\":\"");
            after.extend_from_slice(ids);
            after.extend_from_slice(b"\"}");
            let mut before = Vec::with_capacity(10);
            ws_header(OP_TEXT, shared_len + after.len(), &mut before);
            (before, after)
        }
    }
}

/// One record, as `enc` writes it.
fn encode_record(
    enc: Encoding,
    partition: i32,
    r: &Record<'_>,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) {
    match (enc.protocol, enc.format) {
        (Protocol::Sse, Format::Json) => {
            let _ = write!(out, "id: {partition}:{}\ndata: ", r.offset);
            json_record(partition, r, out);
            out.extend_from_slice(b"\n\n");
        }
        (Protocol::Sse, Format::Value) => {
            let _ = writeln!(out, "id: {partition}:{}", r.offset);
            let value = r.value.unwrap_or_default();
            match std::str::from_utf8(value) {
                // SSE lines end at CR or LF: text with a CR goes as base64 like binary values.
                Ok(text) if !text.contains('\r') => {
                    for line in text.split('\n') {
                        out.extend_from_slice(b"data: ");
                        out.extend_from_slice(line.as_bytes());
                        out.push(b'\n');
                    }
                }
                _ => {
                    out.extend_from_slice(b"event: base64\ndata: ");
                    out.extend_from_slice(base64(value).as_bytes());
                    out.push(b'\n');
                }
            }
            out.push(b'\n');
        }
        (Protocol::WebSocket, Format::Json) => {
            scratch.clear();
            json_record(partition, r, scratch);
            ws_frame(OP_TEXT, scratch, out);
        }
        (Protocol::WebSocket, Format::Value) => {
            let value = r.value.unwrap_or_default();
            let op = if std::str::from_utf8(value).is_ok() {
                OP_TEXT
            } else {
                OP_BINARY
            };
            ws_frame(op, value, out);
        }
    }
}

/// `{"partition":..,"offset":..,"timestamp":..,"key":..,"value":..,"headers":[..]}`: a key, value
/// or header value that is UTF-8 is a string (`null` when absent), one that is not is base64 under
/// `key_base64` / `value_base64` / `value_base64` in the header.
fn json_record(partition: i32, r: &Record<'_>, out: &mut Vec<u8>) {
    let _ = write!(
        out,
        "{{\"partition\":{partition},\"offset\":{},\"timestamp\":{},",
        r.offset, r.timestamp
    );
    json_bytes("key", r.key, out);
    out.push(b',');
    json_bytes("value", r.value, out);
    out.extend_from_slice(b",\"headers\":[");
    for (i, (k, v)) in r.headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        json_string(&String::from_utf8_lossy(k), out);
        out.push(b',');
        json_bytes("value", *v, out);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

/// `"name":"text"`, `"name":null`, or `"name_base64":"..."` for bytes that are not UTF-8.
fn json_bytes(name: &str, bytes: Option<&[u8]>, out: &mut Vec<u8>) {
    match bytes.map(std::str::from_utf8) {
        None => {
            let _ = write!(out, "\"{name}\":null");
        }
        Some(Ok(text)) => {
            let _ = write!(out, "\"{name}\":");
            json_string(text, out);
        }
        Some(Err(_)) => {
            let _ = write!(
                out,
                "\"{name}_base64\":\"{}\"",
                base64(bytes.unwrap_or_default())
            );
        }
    }
}

fn json_string(s: &str, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, s);
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A server's WebSocket frame: final, unmasked, with `payload`.
pub fn ws_frame(op: u8, payload: &[u8], out: &mut Vec<u8>) {
    ws_header(op, payload.len(), out);
    out.extend_from_slice(payload);
}

/// A server's WebSocket frame header: final, unmasked, for a payload of `len` bytes.
fn ws_header(op: u8, len: usize, out: &mut Vec<u8>) {
    out.push(0x80 | op);
    match len {
        n if n < 126 => out.push(n as u8),
        n if n <= u16::MAX as usize => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
}

/// A message of the stream itself (not a record): an SSE event of type `event`, or for WebSocket
/// a text frame `{"type":event,...data}`. `data` is a JSON object's members.
pub fn stream_message(protocol: Protocol, event: &str, data: &str) -> Vec<u8> {
    let mut out = Vec::new();
    match protocol {
        Protocol::Sse => {
            let _ = write!(out, "event: {event}\ndata: {{{data}}}\n\n");
        }
        Protocol::WebSocket => {
            let json = format!("{{\"type\":\"{event}\",{data}}}");
            ws_frame(OP_TEXT, json.as_bytes(), &mut out);
        }
    }
    out
}

/// What keeps an idle stream open through proxies: an SSE comment, or a WebSocket ping.
pub fn heartbeat(protocol: Protocol) -> Vec<u8> {
    match protocol {
        Protocol::Sse => b":\n\n".to_vec(),
        Protocol::WebSocket => {
            let mut out = Vec::new();
            ws_frame(OP_PING, b"", &mut out);
            out
        }
    }
}

/// A WebSocket close frame with its status code and reason.
pub fn ws_close(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    // At most 123 bytes, cut where a character starts.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    payload.extend_from_slice(&reason.as_bytes()[..end]);
    let mut out = Vec::new();
    ws_frame(OP_CLOSE, &payload, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::batch::BatchBuilder;

    fn batch() -> (BatchHeader, Vec<u8>) {
        let t = 1_700_000_000_000;
        let mut b = BatchBuilder::new(t);
        b.push(
            t,
            Some(b"k1"),
            Some(b"hello"),
            &[(&b"h"[..], Some(&b"x"[..]))],
        );
        b.push(t + 1, None, Some(b"two\nlines"), &[]);
        b.push(t + 2, Some(&[0xff, 0x00]), Some(&[0xff, 0xfe]), &[]);
        b.push(t + 3, None, None, &[]);
        let bytes = b.finish(40);
        (BatchHeader::parse(&bytes).unwrap(), bytes)
    }

    fn encode(protocol: Protocol, format: Format, from: i64) -> String {
        let (h, b) = batch();
        let mut out = Vec::new();
        let enc = Encoding {
            protocol,
            format,
            whole_batches: false,
        };
        encode_batch(enc, 3, &h, &b, from, &mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn sse_json_events_carry_partition_and_offset_as_their_id() {
        let s = encode(Protocol::Sse, Format::Json, 40);
        let events: Vec<&str> = s.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 4);
        assert!(events[0].starts_with("id: 3:40\ndata: {\"partition\":3,\"offset\":40,"));
        assert!(events[0].contains(
            "\"key\":\"k1\",\"value\":\"hello\",\"headers\":[{\"key\":\"h\",\"value\":\"x\"}]"
        ));
        assert!(events[1].contains("\"key\":null,\"value\":\"two\\nlines\""));
        assert!(events[2].contains("\"key_base64\":\"/wA=\",\"value_base64\":\"//4=\""));
        assert!(events[3].contains("\"value\":null"));
        let v: serde_json::Value =
            serde_json::from_str(events[1].split_once("data: ").unwrap().1).unwrap();
        assert_eq!(v["offset"], 41);
    }

    #[test]
    fn sse_values_are_text_lines_or_base64() {
        let s = encode(Protocol::Sse, Format::Value, 41);
        assert_eq!(
            s,
            "id: 3:41\ndata: two\ndata: lines\n\nid: 3:42\nevent: base64\ndata: //4=\n\nid: 3:43\ndata: \n\n"
        );
    }

    #[test]
    fn websocket_frames_are_unmasked_text_or_binary() {
        let (h, b) = batch();
        let mut out = Vec::new();
        let enc = Encoding {
            protocol: Protocol::WebSocket,
            format: Format::Value,
            whole_batches: false,
        };
        assert_eq!(encode_batch(enc, 0, &h, &b, 42, &mut out).unwrap(), 2);
        assert_eq!(out, [0x82, 2, 0xff, 0xfe, 0x81, 0]);
        let mut long = Vec::new();
        ws_frame(OP_TEXT, &[b'a'; 300], &mut long);
        assert_eq!(&long[..4], &[0x81, 126, 1, 44]);
        let mut huge = Vec::new();
        ws_frame(OP_BINARY, &vec![0; 70_000], &mut huge);
        assert_eq!(&huge[..10], &[0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
        assert_eq!(ws_close(1008, "slow")[..4], [0x88, 6, 0x03, 0xf0]);
    }

    #[test]
    fn a_whole_batch_is_one_message_closed_with_the_subscribers_ids() {
        let (h, b) = batch();
        for protocol in [Protocol::Sse, Protocol::WebSocket] {
            let enc = Encoding {
                protocol,
                format: Format::Json,
                whole_batches: true,
            };
            let mut shared = Vec::new();
            assert_eq!(encode_batch(enc, 3, &h, &b, 42, &mut shared).unwrap(), 2);
            let (before, after) = close_batch(protocol, shared.len(), b"0:9,3:43");
            let message = [before, shared, after].concat();
            let json = match protocol {
                Protocol::Sse => {
                    let text = String::from_utf8(message).unwrap();
                    let (data, id) = text.split_once('\n').unwrap();
                    assert_eq!(id, "id: 0:9,3:43\n\n");
                    let records: serde_json::Value =
                        serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                    records
                }
                Protocol::WebSocket => {
                    assert_eq!(&message[..2], &[0x81, 126]);
                    let len = u16::from_be_bytes([message[2], message[3]]) as usize;
                    assert_eq!(len, message.len() - 4, "the header counts both parts");
                    let v: serde_json::Value = serde_json::from_slice(&message[4..]).unwrap();
                    assert_eq!(v["id"], "0:9,3:43");
                    v["records"].clone()
                }
            };
            assert_eq!(json[0]["offset"], 42);
            assert_eq!(json[1]["offset"], 43);
            let mut none = Vec::new();
            assert_eq!(encode_batch(enc, 3, &h, &b, 44, &mut none).unwrap(), 0);
            assert!(none.is_empty());
        }
    }

    #[test]
    fn stream_messages() {
        assert_eq!(
            stream_message(Protocol::Sse, "gap", "\"from\":1,\"to\":5"),
            b"event: gap\ndata: {\"from\":1,\"to\":5}\n\n"
        );
        let ws = stream_message(Protocol::WebSocket, "gap", "\"from\":1");
        assert_eq!(&ws[2..], b"{\"type\":\"gap\",\"from\":1}");
        assert_eq!(heartbeat(Protocol::Sse), b":\n\n");
        assert_eq!(heartbeat(Protocol::WebSocket), [0x89, 0]);
    }
}
