//! The kernel cannot run here (no `tls` module on the machines these tests run on), so these tests
//! check everything up to it: a real handshake over loopback TCP, with the client's first request
//! sent in the same segment as its `Finished`; the keys, IVs and sequence numbers handed over;
//! and records sealed and opened from those `CryptoInfo`s as `net/tls/tls_sw.c` does, read by
//! (and from) an unmodified rustls client.

use super::*;
use futures_rustls::rustls::crypto::ring::{cipher_suite, default_provider};
use futures_rustls::rustls::crypto::CryptoProvider;
use futures_rustls::rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use futures_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig};
use glommio::net::{TcpListener, TcpStream};
use ring::aead;
use std::io::{Read, Write};
use std::sync::Arc;

const PING: &[u8] = b"a request sent behind the client's Finished";
const PONGS: [&[u8]; 2] = [
    b"the first response, sealed as the kernel would",
    b"and a second",
];

/// A server and a client configuration that agree on `suite` only.
fn configs(suite: SupportedCipherSuite) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = CertificateDer::from(cert.der().to_vec());
    let key = PrivatePkcs8KeyDer::from(key_pair.serialize_der());
    let provider = Arc::new(CryptoProvider {
        cipher_suites: vec![suite],
        ..default_provider()
    });
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[suite.version()])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key.into())
        .unwrap();
    server.enable_secret_extraction = true;
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[suite.version()])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// The client, on a thread of its own with a blocking socket: it queues PING before the
/// handshake ends, so rustls sends it in the same write as its last handshake flight; then it
/// reads what the server sends until it has both PONGS.
fn client(addr: std::net::SocketAddr, config: Arc<ClientConfig>) -> Vec<u8> {
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = ClientConnection::new(config, name).unwrap();
    conn.writer().write_all(PING).unwrap();
    let want: usize = PONGS.iter().map(|p| p.len()).sum();
    let mut got = Vec::new();
    loop {
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        if !out.is_empty() {
            sock.write_all(&out).unwrap(); // one write: Finished and PING together
        }
        let mut buf = [0u8; 4096];
        while let Ok(n) = conn.reader().read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if got.len() >= want {
            return got;
        }
        if conn.read_tls(&mut sock).unwrap() == 0 {
            return got;
        }
        conn.process_new_packets().unwrap();
    }
}

/// One direction of a connection as the kernel runs it from what `setsockopt` was given.
struct KernelModel {
    version: u16,
    key: aead::LessSafeKey,
    /// AES-GCM: the 4-byte salt then the 8-byte IV; ChaCha20: the 12-byte IV.
    iv: [u8; 12],
    explicit_nonce: bool,
    seq: u64,
}

impl KernelModel {
    fn new(info: &CryptoInfo) -> KernelModel {
        let (version, alg, key, iv, seq): (u16, &'static aead::Algorithm, &[u8], [u8; 12], _) =
            match info {
                CryptoInfo::AesGcm128(c) => (
                    c.info.version,
                    &aead::AES_128_GCM,
                    &c.key,
                    [&c.salt[..], &c.iv[..]].concat().try_into().unwrap(),
                    c.rec_seq,
                ),
                CryptoInfo::AesGcm256(c) => (
                    c.info.version,
                    &aead::AES_256_GCM,
                    &c.key,
                    [&c.salt[..], &c.iv[..]].concat().try_into().unwrap(),
                    c.rec_seq,
                ),
                CryptoInfo::Chacha20Poly1305(c) => (
                    c.info.version,
                    &aead::CHACHA20_POLY1305,
                    &c.key,
                    c.iv,
                    c.rec_seq,
                ),
            };
        KernelModel {
            version,
            key: aead::LessSafeKey::new(aead::UnboundKey::new(alg, key).unwrap()),
            iv,
            explicit_nonce: version == TLS_1_2_VERSION
                && !matches!(info, CryptoInfo::Chacha20Poly1305(_)),
            seq: u64::from_be_bytes(seq),
        }
    }

    /// TLS 1.3 and ChaCha20: the IV XORed with the sequence number; TLS 1.2 AES-GCM: salt and the
    /// explicit nonce (the IV, counted up per record).
    fn nonce(&self) -> aead::Nonce {
        let mut n = self.iv;
        if !self.explicit_nonce {
            for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
                *b ^= s;
            }
        }
        aead::Nonce::assume_unique_for_key(n)
    }

    fn advance(&mut self) {
        self.seq += 1;
        if self.explicit_nonce {
            let counter = u64::from_be_bytes(self.iv[4..].try_into().unwrap());
            self.iv[4..].copy_from_slice(&counter.wrapping_add(1).to_be_bytes());
        }
    }

    /// TLS 1.2's additional data: sequence number, type, version, plaintext length.
    fn aad12(&self, len: usize) -> Vec<u8> {
        let mut aad = self.seq.to_be_bytes().to_vec();
        aad.extend_from_slice(&[23, 3, 3]);
        aad.extend_from_slice(&(len as u16).to_be_bytes());
        aad
    }

    /// An application-data record carrying `plaintext`.
    fn seal(&mut self, plaintext: &[u8]) -> Vec<u8> {
        let tag = self.key.algorithm().tag_len();
        let mut record;
        if self.version == TLS_1_3_VERSION {
            let mut inner = plaintext.to_vec();
            inner.push(23); // the real content type
            record = vec![23, 3, 3];
            record.extend_from_slice(&((inner.len() + tag) as u16).to_be_bytes());
            let aad = aead::Aad::from(record.clone());
            self.key
                .seal_in_place_append_tag(self.nonce(), aad, &mut inner)
                .unwrap();
            record.extend_from_slice(&inner);
        } else {
            let explicit = if self.explicit_nonce { 8 } else { 0 };
            record = vec![23, 3, 3];
            record.extend_from_slice(&((explicit + plaintext.len() + tag) as u16).to_be_bytes());
            if self.explicit_nonce {
                record.extend_from_slice(&self.iv[4..]);
            }
            let mut body = plaintext.to_vec();
            let aad = aead::Aad::from(self.aad12(plaintext.len()));
            self.key
                .seal_in_place_append_tag(self.nonce(), aad, &mut body)
                .unwrap();
            record.extend_from_slice(&body);
        }
        self.advance();
        record
    }

    /// The plaintext of an application-data record.
    fn open(&mut self, record: &[u8]) -> Vec<u8> {
        let tag = self.key.algorithm().tag_len();
        assert_eq!(record[0], 23, "an application-data record");
        let plaintext = if self.version == TLS_1_3_VERSION {
            let mut body = record[5..].to_vec();
            let aad = aead::Aad::from(record[..5].to_vec());
            let inner = self
                .key
                .open_in_place(self.nonce(), aad, &mut body)
                .unwrap();
            let end = inner.iter().rposition(|&b| b != 0).unwrap();
            assert_eq!(inner[end], 23, "the inner content type");
            inner[..end].to_vec()
        } else {
            let mut nonce_iv = self.iv;
            let mut body = record[5..].to_vec();
            if self.explicit_nonce {
                nonce_iv[4..].copy_from_slice(&body[..8]);
                body.drain(..8);
            }
            let nonce = if self.explicit_nonce {
                aead::Nonce::assume_unique_for_key(nonce_iv)
            } else {
                self.nonce()
            };
            let aad = aead::Aad::from(self.aad12(body.len() - tag));
            self.key
                .open_in_place(nonce, aad, &mut body)
                .unwrap()
                .to_vec()
        };
        self.seq += 1;
        plaintext
    }
}

/// The whole path but the kernel, for one cipher suite.
fn handed_over_keys_carry_the_connection(suite: SupportedCipherSuite) {
    let (server_config, client_config) = configs(suite);
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .unwrap();
    ex.run(async move {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || client(addr, client_config));
        let mut stream: TcpStream = listener.accept().await.unwrap();
        let mut conn = ServerConnection::new(server_config).unwrap();
        handshake(&mut stream, &mut conn).await.unwrap();
        assert_eq!(
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            Some(suite.suite())
        );
        let keys = Keys::extract(conn).unwrap();

        // The client's request is still in the socket, whole, for the kernel to decrypt.
        let mut rx = KernelModel::new(&keys.rx);
        let mut record = Vec::new();
        read_record(&mut stream, &mut record).await.unwrap();
        assert_eq!(rx.open(&record), PING);

        // Records sealed from the send side's state are read by the client.
        let mut tx = KernelModel::new(&keys.tx);
        for pong in PONGS {
            stream.write_all(&tx.seal(pong)).await.unwrap();
        }
        stream.flush().await.unwrap();
        let got = client.join().unwrap();
        assert_eq!(got, PONGS.concat());
        assert!(keys.budget.check().is_ok());
    });
}

#[test]
fn tls13_aes_128_gcm() {
    handed_over_keys_carry_the_connection(cipher_suite::TLS13_AES_128_GCM_SHA256);
}

#[test]
fn tls13_aes_256_gcm() {
    handed_over_keys_carry_the_connection(cipher_suite::TLS13_AES_256_GCM_SHA384);
}

#[test]
fn tls13_chacha20_poly1305() {
    handed_over_keys_carry_the_connection(cipher_suite::TLS13_CHACHA20_POLY1305_SHA256);
}

#[test]
fn tls12_aes_128_gcm() {
    handed_over_keys_carry_the_connection(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
}

#[test]
fn tls12_aes_256_gcm() {
    handed_over_keys_carry_the_connection(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384);
}

#[test]
fn tls12_chacha20_poly1305() {
    handed_over_keys_carry_the_connection(
        cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    );
}

/// TLS 1.2 AES-GCM: the kernel counts its explicit nonce up from the IV it is given, where rustls
/// XORed the sequence number into it; the two never meet.
#[test]
fn tls12_kernel_nonces_start_far_from_the_handshakes() {
    let key = futures_rustls::rustls::crypto::cipher::AeadKey::from([7u8; 32]);
    let iv = futures_rustls::rustls::crypto::cipher::Iv::new([1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 5]);
    let secrets = ConnectionTrafficSecrets::Aes256Gcm { key, iv };
    let send = CryptoInfo::new(ProtocolVersion::TLSv1_2, Direction::Send, &secrets, 1).unwrap();
    let receive =
        CryptoInfo::new(ProtocolVersion::TLSv1_2, Direction::Receive, &secrets, 1).unwrap();
    let (CryptoInfo::AesGcm256(send), CryptoInfo::AesGcm256(receive)) = (send, receive) else {
        panic!("AES-256-GCM");
    };
    assert_eq!(send.salt, [1, 2, 3, 4]);
    assert_eq!(receive.iv, [0, 0, 0, 0, 0, 0, 0, 5]);
    assert_eq!(send.iv, [0x80, 0, 0, 0, 0, 0, 0, 5]);
    assert_eq!(send.rec_seq, 1u64.to_be_bytes());
    assert_eq!(send.info.version, TLS_1_2_VERSION);
    // The handshake's nonces differ from the IV in their low bits only.
    let counter = u64::from_be_bytes(send.iv);
    for used in 0..256u64 {
        let rustls_nonce = 5u64 ^ used;
        for k in 0..1_000u64 {
            assert_ne!(counter.wrapping_add(k), rustls_nonce);
        }
    }
}

#[test]
fn a_budget_counts_records_and_then_refuses() {
    let mut b = RecordBudget(10);
    b.spend(0);
    assert!(b.check().is_ok());
    b.spend(16 * 1024); // one record, and one it may have closed early
    b.spend(16 * 1024 + 1); // two, and one
    assert_eq!(b.0, 5);
    b.spend(1 << 20);
    assert_eq!(b.0, 0);
    assert!(b.check().is_err());
}

/// Where the kernel has no `tls` module, attaching fails and the socket carries bytes as before;
/// where it has one, attaching works.
#[test]
fn attaching_fails_cleanly_or_works_as_the_kernel_says() {
    use std::os::unix::io::AsRawFd;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let attached = attach(server.as_raw_fd());
    assert_eq!(attached.is_ok(), available(), "{attached:?}");
    client.write_all(b"plain").unwrap();
    let mut got = [0u8; 5];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"plain");
    server.write_all(b"still").unwrap();
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still");
}

#[test]
fn oversized_records_are_refused_before_they_are_read() {
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .unwrap();
    ex.run(async {
        let mut input = futures_lite::io::Cursor::new(vec![22, 3, 3, 0xff, 0xff]);
        let mut record = Vec::new();
        let e = read_record(&mut input, &mut record).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(record.len(), RECORD_HEADER);
    });
}
