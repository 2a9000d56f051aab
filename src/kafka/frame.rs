//! Size-prefixed frames: a big-endian `i32` length, then that many bytes. The length is checked
//! against the limit before anything is allocated for the body.

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt};

#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Eof,
    /// The size field is negative, too small for a request header, or above the limit. TLS handshake
    /// bytes on the plaintext port land here (0x16 0x03 reads as a huge size).
    BadSize {
        size: i32,
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
                limit,
                first_bytes,
            } => {
                let hint = if first_bytes[0] == 0x16 && first_bytes[1] == 0x03 {
                    " (this looks like a TLS handshake: the port speaks plaintext Kafka)"
                } else {
                    ""
                };
                write!(f, "frame size {size} outside 8..={limit}{hint}")
            }
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Smallest request: api key, api version, correlation id.
const MIN_REQUEST: i32 = 8;

fn is_hang_up(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe)
}

/// Reads one frame body.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
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
    if n < MIN_REQUEST || n as usize > limit {
        return Err(FrameError::BadSize {
            size: n,
            limit,
            first_bytes: size,
        });
    }
    let mut body = vec![0u8; n as usize];
    r.read_exact(&mut body).await.map_err(FrameError::Io)?;
    Ok(Bytes::from(body))
}
