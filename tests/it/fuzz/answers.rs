//! What the broker sent back on an input's connection, checked against what was sent.

use super::inputs::{hex, Input, SENTINEL};
use crate::common::wire::decode_any_response;
use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

/// The frame limit the broker runs with (its `--max-request-bytes` default).
const MAX_REQUEST_BYTES: i64 = 100 << 20;

/// The requests the broker reads from `bytes`, as it frames them: (api key, version, correlation id)
/// of each whole frame, up to the first one it refuses to read.
pub fn frames_sent(bytes: &[u8]) -> Vec<(i16, i16, i32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 4 {
        let size = i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as i64;
        if !(8..=MAX_REQUEST_BYTES).contains(&size) || at + 4 + size as usize > bytes.len() {
            break;
        }
        let f = &bytes[at + 4..at + 4 + size as usize];
        out.push((
            i16::from_be_bytes([f[0], f[1]]),
            i16::from_be_bytes([f[2], f[3]]),
            i32::from_be_bytes(f[4..8].try_into().unwrap()),
        ));
        at += 4 + size as usize;
    }
    out
}

/// Checks what came back on an input's connection, which the broker has closed: whole response
/// frames, each answering a request sent (in order) and decoding as that API's response; for an
/// unmutated input, the ApiVersions request after it answered too. Returns whether it was.
pub fn check_answers(
    input: &Input,
    sent: &[u8],
    received: &[u8],
    reset: bool,
) -> Result<bool, String> {
    let requests = frames_sent(sent);
    let mut next = 0;
    let mut at = 0;
    let mut sentinel_answered = false;
    while at < received.len() {
        let left = received.len() - at;
        let size =
            (left >= 4).then(|| i32::from_be_bytes(received[at..at + 4].try_into().unwrap()));
        if reset && size.is_none_or(|s| s >= 4 && s as usize > left - 4) {
            break; // the last frame, cut by the reset
        }
        let Some(size) = size else {
            return Err(format!("{left} bytes after the last response frame"));
        };
        if size < 4 || at + 4 + size as usize > received.len() {
            return Err(format!(
                "response frame of size {size} with {} bytes left (cut short or bad size)",
                received.len() - at - 4
            ));
        }
        let frame = Bytes::copy_from_slice(&received[at + 4..at + 4 + size as usize]);
        at += 4 + size as usize;
        let correlation = i32::from_be_bytes(frame[..4].try_into().unwrap());
        let Some(pos) = requests[next..].iter().position(|r| r.2 == correlation) else {
            return Err(format!(
                "a response with correlation id {correlation}, which no request sent later had"
            ));
        };
        let (key, version, _) = requests[next + pos];
        next += pos + 1;
        let key = ApiKey::try_from(key).map_err(|_| {
            format!("an answer to unknown API key {key} (correlation {correlation})")
        })?;
        // KIP-511: an ApiVersions the broker cannot serve is answered in v0.
        let version = if key == ApiKey::ApiVersions && !(0..=3).contains(&version) {
            0
        } else {
            version
        };
        decode_any_response(key, version, frame.clone()).map_err(|e| {
            format!(
                "the {key:?} v{version} response (correlation {correlation}) does not decode: {e}; \
                 response {}",
                hex(&frame)
            )
        })?;
        if correlation == SENTINEL && next == requests.len() {
            sentinel_answered = true;
        }
    }
    if input.notes.is_empty() && !input.may_close && !sentinel_answered {
        return Err(format!(
            "a valid {:?} v{} request was not answered: the connection closed after {} response(s)",
            input.key, input.version, next
        ));
    }
    Ok(sentinel_answered)
}
