//! Kernel TLS (kTLS): rustls does the handshake, then the kernel encrypts and decrypts the
//! connection's records, so a response's shared record buffers go to `sendmsg` as they are, as on
//! a plaintext connection (no copy into TLS records in user space, no cipher on the core's
//! thread).
//!
//! The steps, for one connection accepted on a TLS listener (`--tls-kernel auto`, the default):
//! 1. [`attach`] the `tls` upper-layer protocol to the socket before anything is read. Where the
//!    kernel refuses (no `tls` module, as on kernels built without it), nothing changed: the
//!    connection is served by rustls in user space instead.
//! 2. [`handshake`]: rustls's server handshake, fed **one TLS record at a time**, so no byte the
//!    client sends after its last handshake record leaves the socket (a client such as librdkafka
//!    sends its first request right behind its `Finished`; read ahead into rustls, it would be lost
//!    to the kernel's decryption).
//! 3. [`offload`]: the traffic keys, IVs and record sequence numbers rustls ends the handshake with
//!    become the kernel's `TLS_TX` and `TLS_RX` state (`CryptoInfo`).
//!
//! Afterwards the socket reads and writes plaintext. What the kernel cannot do for us:
//! - Control records (an alert, a TLS 1.3 KeyUpdate from the client) make a plain `recv` fail with
//!   `EIO`; the connection takes that as its end (clients close with `close_notify`; the Kafka
//!   clients we know never send KeyUpdate).
//! - It does not rotate keys, so the connection counts the records it may still send under them
//!   ([`RecordBudget`], from the cipher suite's confidentiality limit) and closes before the limit
//!   (the client reconnects, with new keys).
//!
//! Nothing here is assumed: [`available`] reads what the kernel offers, and every step that the
//! kernel refuses is an error the caller handles.

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use futures_rustls::rustls::{
    ConnectionTrafficSecrets, ProtocolVersion, ServerConnection, SupportedCipherSuite,
};
use std::io;
use std::os::unix::io::RawFd;

/// `linux/tls.h`: the socket options and their values.
const SOL_TLS: libc::c_int = 282;
const TLS_TX: libc::c_int = 1;
const TLS_RX: libc::c_int = 2;
const TLS_SET_RECORD_TYPE: libc::c_int = 1;
const TLS_1_2_VERSION: u16 = 0x0303;
const TLS_1_3_VERSION: u16 = 0x0304;
const TLS_CIPHER_AES_GCM_128: u16 = 51;
const TLS_CIPHER_AES_GCM_256: u16 = 52;
const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// The largest record a peer may send: 2^14 bytes of plaintext plus TLS 1.2's largest expansion
/// (2048; TLS 1.3 allows 256).
const MAX_RECORD: usize = (1 << 14) + 2048;
/// The most plaintext one record carries: what a write of n bytes is charged in records.
const RECORD_PLAINTEXT: u64 = 1 << 14;

/// Whether this kernel offers the `tls` upper-layer protocol.
pub fn available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"))
}

/// Attaches the `tls` upper-layer protocol to a connected TCP socket, before its handshake. Until
/// [`offload`] gives it keys the socket carries bytes as before, so when this fails (the kernel
/// has no `tls` module, or refuses this socket) the connection goes on in user space unchanged.
pub fn attach(fd: RawFd) -> io::Result<()> {
    setsockopt(fd, libc::SOL_TCP, libc::TCP_ULP, b"tls")
}

/// `setsockopt(fd, level, option, value)`.
fn setsockopt(fd: RawFd, level: libc::c_int, option: libc::c_int, value: &[u8]) -> io::Result<()> {
    // SAFETY: setsockopt reads value.len() bytes from a live buffer.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// rustls's server handshake over `io`, fed one TLS record at a time, so nothing the client sent
/// after its last handshake record is read from the socket. Alerts rustls has for the client are
/// sent before an error is returned. The caller bounds the time it may take.
pub async fn handshake<S>(io: &mut S, conn: &mut ServerConnection) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut record = Vec::with_capacity(RECORD_HEADER + MAX_RECORD);
    loop {
        write_pending(io, conn).await?;
        if !conn.is_handshaking() {
            return Ok(());
        }
        read_record(io, &mut record).await?;
        let mut rest = &record[..];
        while !rest.is_empty() {
            conn.read_tls(&mut rest)?;
        }
        if let Err(e) = conn.process_new_packets() {
            // The alert that says why, if rustls has one; the error is what matters.
            let _ = write_pending(io, conn).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }
}

/// Sends whatever TLS records rustls has queued.
async fn write_pending<S>(io: &mut S, conn: &mut ServerConnection) -> io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    if !out.is_empty() {
        io.write_all(&out).await?;
        io.flush().await?;
    }
    Ok(())
}

/// Reads exactly one TLS record (header and body) into `record`.
async fn read_record<S>(io: &mut S, record: &mut Vec<u8>) -> io::Result<()>
where
    S: AsyncRead + Unpin,
{
    record.resize(RECORD_HEADER, 0);
    io.read_exact(record).await?;
    let len = u16::from_be_bytes([record[3], record[4]]) as usize;
    if len > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a TLS record of {len} bytes (at most {MAX_RECORD})"),
        ));
    }
    record.resize(RECORD_HEADER + len, 0);
    io.read_exact(&mut record[RECORD_HEADER..]).await
}

/// How many more records the connection may send under its keys: the cipher suite's
/// confidentiality limit (AES-GCM: 2^24 records) less what was sent. Each write is counted as the
/// most records it can become; one write may overshoot (the limit has a wide margin), the next is
/// refused.
#[derive(Debug, Clone, Copy)]
pub struct RecordBudget(u64);

impl RecordBudget {
    /// The records a suite's keys may encrypt.
    pub fn of(suite: SupportedCipherSuite) -> RecordBudget {
        let limit = match suite {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        };
        RecordBudget(limit)
    }

    /// A budget of `records` (tests: the suites' limits are millions of records).
    #[cfg(test)]
    pub(crate) fn records(records: u64) -> RecordBudget {
        RecordBudget(records)
    }

    /// Counts a write of `bytes` the kernel took: at most a record per 16 KiB, and one more for a
    /// record the write may have closed early.
    pub fn spend(&mut self, bytes: usize) {
        if bytes > 0 {
            let records = (bytes as u64).div_ceil(RECORD_PLAINTEXT) + 1;
            self.0 = self.0.saturating_sub(records);
        }
    }

    /// Whether the keys may encrypt more: an error once they may not.
    pub fn check(&self) -> io::Result<()> {
        if self.0 > 0 {
            Ok(())
        } else {
            Err(io::Error::other(
                "kernel TLS: the keys' record limit is reached; closing so the client reconnects \
                 with new keys",
            ))
        }
    }
}

/// Hands the connection's keys to the kernel (`TLS_TX`, then `TLS_RX`) after [`handshake`]; from
/// then on the socket carries plaintext. `conn` must come from a `ServerConfig` with
/// `enable_secret_extraction`. An error leaves the connection unusable: close it.
pub fn offload(fd: RawFd, conn: ServerConnection) -> io::Result<RecordBudget> {
    let keys = Keys::extract(conn)?;
    set(fd, TLS_TX, &keys.tx)?;
    set(fd, TLS_RX, &keys.rx)?;
    Ok(keys.budget)
}

/// What the kernel is given for a connection whose handshake is done.
#[derive(Debug)]
pub(crate) struct Keys {
    pub tx: CryptoInfo,
    pub rx: CryptoInfo,
    pub budget: RecordBudget,
}

impl Keys {
    pub(crate) fn extract(conn: ServerConnection) -> io::Result<Keys> {
        let (version, suite) = match (conn.protocol_version(), conn.negotiated_cipher_suite()) {
            (Some(v), Some(s)) => (v, s),
            _ => return Err(io::Error::other("kernel TLS: the handshake is not done")),
        };
        let secrets = conn
            .dangerous_extract_secrets()
            .map_err(|e| io::Error::other(format!("kernel TLS: {e}")))?;
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        Ok(Keys {
            tx: CryptoInfo::new(version, Direction::Send, &tx, tx_seq)?,
            rx: CryptoInfo::new(version, Direction::Receive, &rx, rx_seq)?,
            budget: RecordBudget::of(suite),
        })
    }
}

fn set(fd: RawFd, option: libc::c_int, info: &CryptoInfo) -> io::Result<()> {
    setsockopt(fd, SOL_TLS, option, info.as_bytes()).map_err(|e| {
        let which = if option == TLS_TX { "TLS_TX" } else { "TLS_RX" };
        io::Error::new(e.kind(), format!("kernel TLS: {which}: {e}"))
    })
}

/// Sends TLS's `close_notify` alert through the kernel (a record of type 21), best effort, before
/// the connection closes.
pub fn close_notify(fd: RawFd) {
    const ALERT: u8 = 21;
    // Level warning, description close_notify.
    let payload = [1u8, 0];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(1) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: the message points at live buffers; CMSG_FIRSTHDR of a control buffer of
    // CMSG_SPACE(1) bytes is a valid header with room for one byte of data.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = SOL_TLS;
        (*cmsg).cmsg_type = TLS_SET_RECORD_TYPE;
        (*cmsg).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(cmsg) = ALERT;
        libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Send,
    Receive,
}

/// `struct tls_crypto_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Info {
    pub version: u16,
    pub cipher_type: u16,
}

/// `struct tls12_crypto_info_aes_gcm_128` (for TLS 1.2 and 1.3 alike).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AesGcm128 {
    pub info: Info,
    pub iv: [u8; 8],
    pub key: [u8; 16],
    pub salt: [u8; 4],
    pub rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_aes_gcm_256`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AesGcm256 {
    pub info: Info,
    pub iv: [u8; 8],
    pub key: [u8; 32],
    pub salt: [u8; 4],
    pub rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_chacha20_poly1305` (no salt: the whole 12-byte IV).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chacha20Poly1305 {
    pub info: Info,
    pub iv: [u8; 12],
    pub key: [u8; 32],
    pub rec_seq: [u8; 8],
}

// The kernel checks the option's length against its struct's size.
const _: () = assert!(std::mem::size_of::<AesGcm128>() == 40);
const _: () = assert!(std::mem::size_of::<AesGcm256>() == 56);
const _: () = assert!(std::mem::size_of::<Chacha20Poly1305>() == 56);

/// One direction's state for the kernel: its key, IV and next record sequence number.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CryptoInfo {
    AesGcm128(AesGcm128),
    AesGcm256(AesGcm256),
    Chacha20Poly1305(Chacha20Poly1305),
}

impl CryptoInfo {
    /// The state for one direction, from what rustls extracted: `seq` is the sequence number of
    /// the next record in that direction.
    ///
    /// rustls's 12-byte IV is the kernel's 4-byte salt and 8-byte IV for AES-GCM. In TLS 1.3 (and
    /// for ChaCha20 in both versions) each record's nonce is the IV XORed with its sequence
    /// number, as rustls computes it. TLS 1.2's AES-GCM records carry an explicit nonce: the
    /// kernel sends the IV it was given and counts it up per record, where rustls sent the IV
    /// XORed with the sequence number; so for sending, the kernel's IV starts half the 64-bit
    /// space away from every nonce rustls used (the handshake's few records, which only change
    /// the low bits), and no nonce is used twice under the key. Receiving uses the nonce in each
    /// record.
    fn new(
        version: ProtocolVersion,
        direction: Direction,
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
    ) -> io::Result<CryptoInfo> {
        let version = match version {
            ProtocolVersion::TLSv1_2 => TLS_1_2_VERSION,
            ProtocolVersion::TLSv1_3 => TLS_1_3_VERSION,
            v => return Err(io::Error::other(format!("kernel TLS: no {v:?}"))),
        };
        let rec_seq = seq.to_be_bytes();
        let gcm_iv = |iv: &[u8]| -> ([u8; 4], [u8; 8]) {
            let salt: [u8; 4] = iv[..4].try_into().unwrap();
            let mut explicit: [u8; 8] = iv[4..12].try_into().unwrap();
            if version == TLS_1_2_VERSION && direction == Direction::Send {
                explicit[0] ^= 0x80;
            }
            (salt, explicit)
        };
        Ok(match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                let (salt, iv) = gcm_iv(iv.as_ref());
                CryptoInfo::AesGcm128(AesGcm128 {
                    info: Info {
                        version,
                        cipher_type: TLS_CIPHER_AES_GCM_128,
                    },
                    iv,
                    key: fixed(key.as_ref())?,
                    salt,
                    rec_seq,
                })
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                let (salt, iv) = gcm_iv(iv.as_ref());
                CryptoInfo::AesGcm256(AesGcm256 {
                    info: Info {
                        version,
                        cipher_type: TLS_CIPHER_AES_GCM_256,
                    },
                    iv,
                    key: fixed(key.as_ref())?,
                    salt,
                    rec_seq,
                })
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                CryptoInfo::Chacha20Poly1305(Chacha20Poly1305 {
                    info: Info {
                        version,
                        cipher_type: TLS_CIPHER_CHACHA20_POLY1305,
                    },
                    iv: fixed(iv.as_ref())?,
                    key: fixed(key.as_ref())?,
                    rec_seq,
                })
            }
            _ => {
                return Err(io::Error::other(
                    "kernel TLS: a cipher suite it has no form for",
                ))
            }
        })
    }

    /// The struct's bytes, as `setsockopt` takes them.
    fn as_bytes(&self) -> &[u8] {
        fn bytes<T>(t: &T) -> &[u8] {
            // SAFETY: T is a repr(C) struct of u16s and byte arrays without padding (the sizes
            // are asserted above), so every byte is initialised.
            unsafe { std::slice::from_raw_parts((t as *const T).cast(), std::mem::size_of::<T>()) }
        }
        match self {
            CryptoInfo::AesGcm128(c) => bytes(c),
            CryptoInfo::AesGcm256(c) => bytes(c),
            CryptoInfo::Chacha20Poly1305(c) => bytes(c),
        }
    }
}

fn fixed<const N: usize>(b: &[u8]) -> io::Result<[u8; N]> {
    b.try_into().map_err(|_| {
        io::Error::other(format!(
            "kernel TLS: a key or IV of {} bytes where {N} were expected",
            b.len()
        ))
    })
}

#[cfg(test)]
#[path = "ktls_tests.rs"]
mod tests;
