//! Request and response headers with `kafka-protocol`: the broker's side (parse a request, encode a
//! response) and the client's (encode a request, decode a response).

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// A decoded request header and the rest of the frame.
#[derive(Debug)]
pub struct Request {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub header: RequestHeader,
    pub body: Bytes,
}

/// Why a frame could not become a request.
#[derive(Debug)]
pub enum HeaderError {
    /// Unknown API key: nothing sensible can be answered.
    UnknownApi { api_key: i16, correlation_id: i32 },
    /// The header itself is malformed.
    Malformed(String),
}

/// Reads api key, version and correlation id, then the rest of the header in the version the API
/// uses. The header of an unsupported version is read as v1 (all header versions start the same).
pub fn parse(mut frame: Bytes) -> Result<Request, HeaderError> {
    if frame.len() < 8 {
        return Err(HeaderError::Malformed(format!(
            "{} bytes: shorter than api key, version and correlation id",
            frame.len()
        )));
    }
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let api_version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let key = ApiKey::try_from(api_key).map_err(|_| HeaderError::UnknownApi {
        api_key,
        correlation_id,
    })?;
    let valid = key.valid_versions();
    let header_version = if (valid.min..=valid.max).contains(&api_version) {
        key.request_header_version(api_version)
    } else {
        1
    };
    let header = RequestHeader::decode(&mut frame, header_version)
        .map_err(|e| HeaderError::Malformed(e.to_string()))?;
    Ok(Request {
        api_key,
        api_version,
        correlation_id,
        header,
        body: frame,
    })
}

/// Encodes a whole response frame (size, header, body) for `api_key` at `version`. An error means a
/// handler set a field the version cannot carry: a bug, reported without taking the core down.
pub fn encode<R: Encodable>(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Result<Bytes, String> {
    let header_version = api_key.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header
        .encode(&mut buf, header_version)
        .map_err(|e| e.to_string())?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("{api_key:?} v{version} response: {e}"))?;
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// Decodes a request body. Runs under `catch_unwind`: a decoder panic on hostile input fails this
/// request (and closes its connection), never the core.
pub fn decode<R: Decodable>(req: &Request) -> Result<R, String> {
    let mut body = req.body.clone();
    let version = req.api_version;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        R::decode(&mut body, version)
    })) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("the decoder panicked".to_string()),
    }
}

/// Encodes a whole request frame (size, header in the version the API uses, body) from `client_id`.
pub fn encode_request<R: Encodable>(
    client_id: &str,
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Result<BytesMut, String> {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut buf = BytesMut::with_capacity(128);
    buf.put_i32(0);
    header
        .encode(&mut buf, api_key.request_header_version(version))
        .map_err(|e| format!("{api_key:?} v{version} header: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("{api_key:?} v{version} request: {e}"))?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// Decodes a response frame (without its size): the header, whose correlation id must be
/// `correlation_id`, then the body, which must use up the frame.
pub fn decode_response<R: Decodable>(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    mut frame: Bytes,
) -> Result<R, String> {
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
        .map_err(|e| format!("{api_key:?} v{version} response header: {e}"))?;
    if header.correlation_id != correlation_id {
        return Err(format!(
            "{api_key:?} v{version}: correlation id {} answered where {correlation_id} was expected",
            header.correlation_id
        ));
    }
    let body = R::decode(&mut frame, version)
        .map_err(|e| format!("{api_key:?} v{version} response body: {e}"))?;
    if !frame.is_empty() {
        return Err(format!(
            "{api_key:?} v{version}: {} bytes after the response body",
            frame.len()
        ));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_too_short_for_a_header_is_malformed() {
        for len in 0..8 {
            let frame = Bytes::from(vec![0u8; len]);
            assert!(
                matches!(parse(frame), Err(HeaderError::Malformed(_))),
                "{len} bytes"
            );
        }
        // ApiVersions v0, correlation id 7, null client id: the shortest whole header.
        let frame = Bytes::from_static(&[0, 18, 0, 0, 0, 0, 0, 7, 0xff, 0xff]);
        let req = parse(frame).unwrap();
        assert_eq!(
            (req.api_key, req.api_version, req.correlation_id),
            (18, 0, 7)
        );
    }
}
