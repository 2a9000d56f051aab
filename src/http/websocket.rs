//! WebSocket (RFC 6455) as a stream needs it: the opening handshake's answer, and the frames a
//! client sends after it (close, ping, pong; data frames are read and dropped), checked as the
//! RFC requires: masked, no reserved bits, control frames short and final. A frame that breaks
//! a rule is an error with the close code the RFC gives for it.

use base64::Engine;

/// The GUID RFC 6455 appends to the client's key.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Largest client data frame read (and dropped); larger ones close with 1009.
pub const MAX_CLIENT_FRAME: u64 = 64 << 10;

/// Close codes.
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
pub const CLOSE_POLICY: u16 = 1008;
pub const CLOSE_TOO_BIG: u16 = 1009;

/// `Sec-WebSocket-Accept` for the client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let mut input = key.trim().as_bytes().to_vec();
    input.extend_from_slice(GUID.as_bytes());
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// The answer that opens the WebSocket.
pub fn handshake_response(key: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        accept_key(key)
    )
    .into_bytes()
}

/// A frame from the client that the stream acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame {
    /// Answered with a pong carrying the same payload.
    Ping(Vec<u8>),
    Pong,
    /// The client closes, with its status code if it gave one.
    Close(Option<u16>),
    /// A data frame (or a piece of one): streams take no input, it is dropped.
    Data,
}

/// A rule a client's frame broke: the close code and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub code: u16,
    pub why: &'static str,
}

/// Client frames taken from the bytes read, one at a time.
#[derive(Debug, Default)]
pub struct ClientFrames {
    buf: Vec<u8>,
}

impl ClientFrames {
    /// Bytes read from the client.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, `None` until one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<ClientFrame>, Violation> {
        let violation = |why| Violation {
            code: CLOSE_PROTOCOL_ERROR,
            why,
        };
        let b = &self.buf;
        if b.len() < 2 {
            return Ok(None);
        }
        let (fin, rsv, op) = (b[0] & 0x80 != 0, b[0] & 0x70, b[0] & 0x0f);
        let (masked, len7) = (b[1] & 0x80 != 0, b[1] & 0x7f);
        if rsv != 0 {
            return Err(violation("reserved bits set"));
        }
        if !masked {
            return Err(violation("a client's frame must be masked"));
        }
        let (len, mut at) = match len7 {
            126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as u64, 4),
            127 if b.len() >= 10 => (
                u64::from_be_bytes(b[2..10].try_into().expect("8 bytes")),
                10,
            ),
            126 | 127 => return Ok(None),
            n => (n as u64, 2),
        };
        let control = op & 0x8 != 0;
        if control && (len > 125 || !fin) {
            return Err(violation(
                "a control frame must be final and at most 125 bytes",
            ));
        }
        if !matches!(op, 0x0..=0x2 | 0x8..=0xA) {
            return Err(violation("unknown opcode"));
        }
        if len > MAX_CLIENT_FRAME {
            return Err(Violation {
                code: CLOSE_TOO_BIG,
                why: "frame too large: streams take no input",
            });
        }
        let total = at + 4 + len as usize;
        if b.len() < total {
            return Ok(None);
        }
        let mask = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        at += 4;
        let payload: Vec<u8> = b[at..total]
            .iter()
            .enumerate()
            .map(|(i, x)| x ^ mask[i % 4])
            .collect();
        self.buf.drain(..total);
        Ok(Some(match op {
            0x8 => {
                if payload.len() == 1 {
                    return Err(violation("a close frame's code takes two bytes"));
                }
                ClientFrame::Close(
                    (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]])),
                )
            }
            0x9 => ClientFrame::Ping(payload),
            0xA => ClientFrame::Pong,
            _ => ClientFrame::Data,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's frame: final, masked with `mask`.
    fn client(op: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut out = vec![0x80 | op];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn the_rfcs_example_key() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn frames_arrive_in_pieces_and_in_order() {
        let mut bytes = client(0x9, b"hi", [1, 2, 3, 4]);
        bytes.extend(client(0x1, &[b'x'; 300], [9, 9, 9, 9]));
        bytes.extend(client(0x8, &1000u16.to_be_bytes(), [0, 0, 0, 7]));
        let mut frames = ClientFrames::default();
        let mut got = Vec::new();
        for chunk in bytes.chunks(3) {
            frames.push(chunk);
            while let Some(f) = frames.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(
            got,
            [
                ClientFrame::Ping(b"hi".to_vec()),
                ClientFrame::Data,
                ClientFrame::Close(Some(1000))
            ]
        );
    }

    #[test]
    fn broken_rules_give_the_rfcs_close_codes() {
        let check = |bytes: Vec<u8>, code: u16| {
            let mut frames = ClientFrames::default();
            frames.push(&bytes);
            assert_eq!(frames.next_frame().unwrap_err().code, code, "{bytes:?}");
        };
        check(vec![0x81, 0x00], CLOSE_PROTOCOL_ERROR); // unmasked
        check(vec![0xC1, 0x80, 0, 0, 0, 0], CLOSE_PROTOCOL_ERROR); // reserved bit
        check(vec![0x83, 0x80, 0, 0, 0, 0], CLOSE_PROTOCOL_ERROR); // opcode 3
        check(vec![0x09, 0x80, 0, 0, 0, 0], CLOSE_PROTOCOL_ERROR); // control, not final
        check(client(0x9, &[0; 126], [0; 4]), CLOSE_PROTOCOL_ERROR); // control, too long
        check(client(0x8, &[3], [0; 4]), CLOSE_PROTOCOL_ERROR); // a one-byte close code
        let mut big = vec![0x82, 0x80 | 127];
        big.extend_from_slice(&(1u64 << 40).to_be_bytes());
        check(big, CLOSE_TOO_BIG);
    }

    #[test]
    fn random_bytes_never_panic_and_frames_stay_bounded() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let mut frames = ClientFrames::default();
            frames.push(&bytes);
            while let Ok(Some(_)) = frames.next_frame() {}
            assert!(frames.buf.len() <= bytes.len());
        }
    }
}
