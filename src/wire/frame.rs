//! Size-prefixed frames: a big-endian `i32` length, then that many bytes. The length is checked
//! against the limit before anything is allocated for the body. Requests are read by the broker,
//! responses by the load generator and the tests (blocking sockets go through [`read_blocking`]).

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt};

#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Eof,
    /// The size field is negative, too small for a header, or above the limit. TLS handshake bytes
    /// on the plaintext port land here (0x16 0x03 reads as a huge size).
    BadSize {
        size: i32,
        min: i32,
        limit: usize,
        first_bytes: [u8; 4],
    },
    Io(std::io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Eof => write!(f, "connection closed"),
            FrameError::BadSize {
                size,
                min,
                limit,
                first_bytes,
            } => {
                let hint = if first_bytes[0] == 0x16 && first_bytes[1] == 0x03 {
                    " (this looks like a TLS handshake: the port speaks plaintext Kafka)"
                } else {
                    ""
                };
                write!(f, "frame size {size} outside {min}..={limit}{hint}")
            }
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<FrameError> for std::io::Error {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Eof => std::io::ErrorKind::UnexpectedEof.into(),
            FrameError::Io(e) => e,
            bad => std::io::Error::other(bad.to_string()),
        }
    }
}

/// Smallest request: api key, api version, correlation id.
pub const MIN_REQUEST: i32 = 8;
/// Smallest response: correlation id.
pub const MIN_RESPONSE: i32 = 4;

fn is_hang_up(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe)
}

/// Reads one request frame's body (at most `limit` bytes).
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> Result<Bytes, FrameError> {
    read_sized(r, MIN_REQUEST, limit).await
}

/// Reads one response frame's body (at most `limit` bytes).
pub async fn read_response<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> Result<Bytes, FrameError> {
    read_sized(r, MIN_RESPONSE, limit).await
}

/// Reads one response frame from a blocking `std` stream (its own timeouts bound the wait).
pub fn read_blocking<R: std::io::Read>(r: &mut R, limit: usize) -> Result<Bytes, FrameError> {
    let mut r = futures_lite::io::AssertAsync::new(r);
    futures_lite::future::block_on(read_response(&mut r, limit))
}

async fn read_sized<R: AsyncRead + Unpin>(
    r: &mut R,
    min: i32,
    limit: usize,
) -> Result<Bytes, FrameError> {
    let mut size = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut size[got..]).await {
            Ok(0) if got == 0 => return Err(FrameError::Eof),
            Ok(0) => return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            // A client that closes abruptly between requests is not a protocol error.
            Err(e) if got == 0 && is_hang_up(&e) => return Err(FrameError::Eof),
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let n = i32::from_be_bytes(size);
    if n < min || n as usize > limit {
        return Err(FrameError::BadSize {
            size: n,
            min,
            limit,
            first_bytes: size,
        });
    }
    let mut body = vec![0u8; n as usize];
    r.read_exact(&mut body).await.map_err(FrameError::Io)?;
    Ok(Bytes::from(body))
}
