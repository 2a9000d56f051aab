//! Size-prefixed frames: a big-endian `i32` length, then that many bytes. The length is checked
//! against the limit before anything is allocated for the body. Requests are read by the broker,
//! responses by the load generator and the tests (blocking sockets go through [`read_blocking`]).

use bytes::{Buf, Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncReadExt};

#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Eof,
    /// The size field is negative, too small for a header, or above the limit. Another protocol's
    /// bytes land here (a TLS record's 0x16 0x03 or an HTTP request's `GET ` reads as a huge size):
    /// the message names it.
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
                let hint = other_protocol(*first_bytes, *min == MIN_REQUEST)
                    .map_or(String::new(), |what| format!(" ({what})"));
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

/// What a frame's first four bytes say when they are another protocol's, not a Kafka size: on a
/// request (`request`, the broker reading), what the client sent; on a response (a client reading),
/// what the port it connected to speaks.
pub fn other_protocol(first: [u8; 4], request: bool) -> Option<&'static str> {
    let tls_record = matches!(first[0], 0x14..=0x17) && first[1] == 0x03 && first[2] <= 0x04;
    let http_request = [
        &b"GET "[..],
        b"POST",
        b"PUT ",
        b"HEAD",
        b"DELE",
        b"OPTI",
        b"PATC",
    ]
    .contains(&&first[..]);
    match (request, tls_record, &first) {
        (true, true, _) => {
            Some("a TLS handshake: this port speaks plaintext Kafka; the client's TLS is for an SSL listener")
        }
        (true, false, _) if http_request => Some(
            "an HTTP request: this port speaks Kafka; the console and admin API are on the --admin address",
        ),
        (false, true, _) => Some(
            "a TLS record: this port speaks TLS; give the client the CA to trust (--tls-ca) or use a PLAINTEXT listener",
        ),
        (false, false, b"HTTP") => Some(
            "an HTTP response: this port speaks HTTP (the admin or streams address?), not Kafka",
        ),
        _ => None,
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

/// Room a connection's receive buffer starts with, and gets at least whenever it is renewed.
const MIN_BUFFER: usize = 4 << 10;
/// Frames up to this size get their whole room at once (with room for more after them); a bigger
/// one grows its room by doubling as its bytes arrive, so a size prefix alone (trusted by no one
/// before its bytes come) never allocates more than this.
const WHOLE_ROOM: usize = 1 << 20;

/// Reads request frames through a receive buffer: one read from the socket takes everything that
/// has arrived (a producer's pipelined requests, a consumer's next fetch) instead of one read for
/// the size and more for the body, and each frame is handed out as a slice of that buffer, not a
/// copy. The buffer is zeroed once when it is allocated (as a frame's own buffer was before);
/// bytes received past a frame stay for the next one.
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Received bytes not yet handed out (`..filled`), then zeroed room to receive into.
    buf: BytesMut,
    filled: usize,
}

impl FrameReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one request frame's body (at most `limit` bytes).
    pub async fn read_request<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        limit: usize,
    ) -> Result<Bytes, FrameError> {
        self.read_sized(r, MIN_REQUEST, limit).await
    }

    /// Reads one frame's body of `min` to `limit` bytes (a SASL token in the legacy framing
    /// after SaslHandshake v0 may be empty).
    pub async fn read_sized<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        min: i32,
        limit: usize,
    ) -> Result<Bytes, FrameError> {
        while self.filled < 4 {
            self.receive(r, 4).await?;
        }
        let size: [u8; 4] = self.buf[..4].try_into().unwrap();
        let n = i32::from_be_bytes(size);
        if n < min || n as usize > limit {
            return Err(FrameError::BadSize {
                size: n,
                min,
                limit,
                first_bytes: size,
            });
        }
        let total = 4 + n as usize;
        while self.filled < total {
            self.receive(r, total).await?;
        }
        let mut frame = self.buf.split_to(total);
        self.filled -= total;
        frame.advance(4);
        Ok(frame.freeze())
    }

    /// Whether the next [`Self::read_request`] returns without reading the socket: a whole frame
    /// (or a size it refuses at once, below the smallest request) has already been received. A
    /// server answering what one read brought writes its answers when this is false.
    pub fn has_frame(&self) -> bool {
        if self.filled < 4 {
            return false;
        }
        let n = i32::from_be_bytes(self.buf[..4].try_into().unwrap());
        n < MIN_REQUEST || self.filled >= 4 + n as usize
    }

    /// Receives more bytes, first making room towards `want` bytes in all (the frame being read).
    async fn receive<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        want: usize,
    ) -> Result<(), FrameError> {
        if self.buf.len() < want || self.buf.len() == self.filled {
            let room = if want <= WHOLE_ROOM {
                // The frame, and three times as much (up to 256 KiB) for those behind it.
                (want + (3 * want).min(256 << 10)).max(MIN_BUFFER)
            } else {
                want.min((2 * self.buf.len()).max(WHOLE_ROOM))
            };
            let mut fresh = BytesMut::zeroed(room.max(self.filled + 1));
            fresh[..self.filled].copy_from_slice(&self.buf[..self.filled]);
            self.buf = fresh;
        }
        let at_boundary = self.filled == 0;
        match r.read(&mut self.buf[self.filled..]).await {
            Ok(0) if at_boundary => Err(FrameError::Eof),
            Ok(0) => Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                self.filled += n;
                Ok(())
            }
            // A client that closes abruptly between requests is not a protocol error.
            Err(e) if at_boundary && is_hang_up(&e) => Err(FrameError::Eof),
            Err(e) => Err(FrameError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_protocols_bytes_are_named() {
        let says = |first: [u8; 4], request| other_protocol(first, request).unwrap_or("");
        // A plaintext client on a TLS port reads the server's alert; on the admin port, HTTP.
        assert!(says(352518912i32.to_be_bytes(), false).contains("this port speaks TLS"));
        assert!(says(*b"HTTP", false).contains("speaks HTTP"));
        // A TLS client or a browser on a plaintext Kafka port.
        assert!(says([0x16, 0x03, 0x01, 0x02], true).contains("speaks plaintext Kafka"));
        assert!(says(*b"GET ", true).contains("--admin address"));
        assert_eq!(other_protocol([0, 0x40, 0, 0], true), None);
        assert_eq!(other_protocol(*b"HTTP", true), None);
        let e = FrameError::BadSize {
            size: 1213486160,
            min: MIN_RESPONSE,
            limit: 64 << 20,
            first_bytes: *b"HTTP",
        };
        assert!(e.to_string().ends_with("not Kafka)"), "{e}");
    }

    /// A reader that hands out its bytes in the given pieces, one piece (or less) per read.
    struct Pieces {
        data: Vec<u8>,
        cuts: Vec<usize>,
        at: usize,
        reads: usize,
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let this = &mut *self;
            this.reads += 1;
            let next_cut = this
                .cuts
                .iter()
                .copied()
                .find(|&c| c > this.at)
                .unwrap_or(this.data.len());
            let n = (next_cut - this.at).min(buf.len());
            buf[..n].copy_from_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            std::task::Poll::Ready(Ok(n))
        }
    }

    fn frames(sizes: &[usize]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut wire = Vec::new();
        let mut bodies = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let body: Vec<u8> = (0..n).map(|j| (i * 7 + j) as u8).collect();
            wire.extend((n as i32).to_be_bytes());
            wire.extend(&body);
            bodies.push(body);
        }
        (wire, bodies)
    }

    fn read_all(
        wire: Vec<u8>,
        cuts: Vec<usize>,
        limit: usize,
    ) -> (Vec<Result<Bytes, String>>, usize) {
        let mut r = Pieces {
            data: wire,
            cuts,
            at: 0,
            reads: 0,
        };
        let mut reader = FrameReader::new();
        let mut out = Vec::new();
        futures_lite::future::block_on(async {
            loop {
                match reader.read_request(&mut r, limit).await {
                    Ok(f) => out.push(Ok(f)),
                    Err(FrameError::Eof) => break,
                    Err(e) => {
                        out.push(Err(e.to_string()));
                        break;
                    }
                }
            }
        });
        (out, r.reads)
    }

    #[test]
    fn frames_split_anywhere_come_out_whole_and_in_order() {
        let sizes = [8, 100, 16 << 10, 9, 3 << 20, 8, 70_000];
        let (wire, bodies) = frames(&sizes);
        // Every byte its own read, cuts at awkward places, and all at once.
        let every_byte: Vec<usize> = (1..wire.len()).step_by(1).take(2000).collect();
        let awkward = vec![1, 3, 5, 13, 200, 16_000, 16_500, 3 << 20, (3 << 20) + 17];
        for cuts in [every_byte, awkward, vec![]] {
            let (got, _) = read_all(wire.clone(), cuts, 4 << 20);
            let got: Vec<Vec<u8>> = got.into_iter().map(|f| f.unwrap().to_vec()).collect();
            assert_eq!(got, bodies);
        }
    }

    #[test]
    fn pipelined_frames_take_one_read_between_them() {
        let (wire, bodies) = frames(&[16 << 10; 5]);
        let (got, reads) = read_all(wire, vec![], 1 << 20);
        assert_eq!(got.len(), bodies.len());
        // The first read fills a small buffer, the next ones the room made for 16 KiB frames
        // and those behind them; far fewer than two reads per frame, plus the one seeing the end.
        assert!(reads <= 5, "{reads} reads for 5 frames");
    }

    #[test]
    fn has_frame_says_whether_a_whole_frame_is_already_received() {
        let (wire, bodies) = frames(&[100, 100, 100]);
        // The first read brings two frames and half the third.
        let cut = 2 * 104 + 50;
        let mut r = Pieces {
            data: wire,
            cuts: vec![cut],
            at: 0,
            reads: 0,
        };
        let mut reader = FrameReader::new();
        assert!(!reader.has_frame(), "nothing received");
        futures_lite::future::block_on(async {
            let first = reader.read_request(&mut r, 1 << 20).await.unwrap();
            assert_eq!(first.to_vec(), bodies[0]);
            assert!(reader.has_frame(), "the second frame came with the first");
            reader.read_request(&mut r, 1 << 20).await.unwrap();
            assert!(!reader.has_frame(), "half of the third");
            let reads = r.reads;
            reader.read_request(&mut r, 1 << 20).await.unwrap();
            assert!(r.reads > reads, "the third needed a read");
            assert!(!reader.has_frame());
        });
    }

    #[test]
    fn bad_sizes_and_cut_frames_are_errors_without_allocating_the_claimed_size() {
        // A size above the limit is refused before anything is read for it.
        let mut wire = (i32::MAX).to_be_bytes().to_vec();
        wire.extend([0; 16]);
        let (got, _) = read_all(wire, vec![], 1 << 20);
        assert!(got[0].as_ref().unwrap_err().contains("outside"), "{got:?}");
        // Too small for a header.
        let (got, _) = read_all(4i32.to_be_bytes().to_vec(), vec![], 1 << 20);
        assert!(got[0].as_ref().unwrap_err().contains("outside"));
        // A frame cut short by the end of the stream.
        let (mut wire, _) = frames(&[64 << 20]);
        wire.truncate(100);
        let mut reader = FrameReader::new();
        let mut r = Pieces {
            data: wire,
            cuts: vec![],
            at: 0,
            reads: 0,
        };
        let e = futures_lite::future::block_on(reader.read_request(&mut r, 128 << 20));
        assert!(matches!(e, Err(FrameError::Io(_))), "{e:?}");
        // Only a bounded room was made for the 64 MiB claim while 100 bytes had come.
        assert!(reader.buf.len() <= 2 * WHOLE_ROOM, "{}", reader.buf.len());
    }
}
