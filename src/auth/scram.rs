//! SCRAM (RFC 5802, RFC 7677) as Kafka uses it: `SCRAM-SHA-256` and `SCRAM-SHA-512`, the
//! credentials a server stores (salt, iterations, stored key, server key; never the password),
//! and the server's side of one exchange.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

/// The SCRAM mechanisms shoal serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

/// Kafka's minimum (and default) iteration count.
pub const MIN_ITERATIONS: u32 = 4096;
/// Kafka's maximum iteration count.
pub const MAX_ITERATIONS: u32 = 16384;

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's `ScramMechanism` code (DescribeUserScramCredentials / AlterUserScramCredentials).
    pub fn code(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.code() == code)
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Mechanism::Sha512 => {
                let mut m = Hmac::<Sha512>::new_from_slice(key).expect("any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// PBKDF2 of `password` (RFC 5802's `Hi`): `iterations` HMACs, a few milliseconds at 4096.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            Mechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// What the server keeps of a user's password for one mechanism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl Credential {
    /// The credential for `password` with a fresh random salt.
    pub fn new(mechanism: Mechanism, password: &[u8], iterations: u32) -> Self {
        let salt: [u8; 24] = rand::random();
        Self::with_salt(mechanism, password, &salt, iterations)
    }

    pub fn with_salt(mechanism: Mechanism, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = mechanism.salted_password(password, salt, iterations);
        Self::from_salted_password(mechanism, salt, iterations, &salted)
    }

    /// The credential for an already salted password (AlterUserScramCredentials sends that, so
    /// the password never reaches the broker).
    pub fn from_salted_password(
        mechanism: Mechanism,
        salt: &[u8],
        iterations: u32,
        salted: &[u8],
    ) -> Self {
        let client_key = mechanism.hmac(salted, b"Client Key");
        Self {
            salt: salt.to_vec(),
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted, b"Server Key"),
        }
    }

    /// Whether `password` is this credential's (SASL/PLAIN checks passwords this way): one PBKDF2,
    /// so run it off the executor thread.
    pub fn matches(&self, mechanism: Mechanism, password: &[u8]) -> bool {
        let other = Self::with_salt(mechanism, password, &self.salt, self.iterations);
        constant_time_eq(&other.stored_key, &self.stored_key)
    }
}

/// Compares without stopping at the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why an exchange failed: said to the client as `SASL_AUTHENTICATION_FAILED` with this message,
/// and logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed(pub String);

/// The server's side of one SCRAM exchange.
#[derive(Debug)]
pub enum ScramServer {
    /// Waiting for the client-first message.
    Start {
        mechanism: Mechanism,
    },
    /// Sent server-first; waiting for client-final.
    SentFirst {
        mechanism: Mechanism,
        user: String,
        credential: Credential,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    Done,
}

/// A SCRAM attribute value (`n=`, `r=`, ...) of a comma-separated message.
fn attribute(message: &str, name: char) -> Option<&str> {
    message
        .split(',')
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
}

/// Whether a client-final-message's nonce is the exchange's: it ends with the nonce the server
/// sent, which is all Kafka checks (librdkafka 2.0 sends its own nonce twice before it).
fn nonce_matches(client_final: &str, nonce: &str) -> bool {
    attribute(client_final, 'r').is_some_and(|r| r.ends_with(nonce))
}

/// A SCRAM username: `=2C` is a comma, `=3D` an equals sign; any other `=` is malformed.
fn decode_username(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl ScramServer {
    pub fn new(mechanism: Mechanism) -> Self {
        ScramServer::Start { mechanism }
    }

    /// The user the client named (once it has).
    pub fn user(&self) -> Option<&str> {
        match self {
            ScramServer::SentFirst { user, .. } => Some(user),
            _ => None,
        }
    }

    /// Takes the client's next message; returns the server's answer, and whether the exchange is
    /// complete (the client is authenticated as [`Self::user`]). `lookup` finds a user's credential.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<Credential>,
    ) -> Result<(Vec<u8>, bool), Failed> {
        let server_nonce: [u8; 24] = rand::random();
        self.step_with_nonce(message, lookup, &B64.encode(server_nonce))
    }

    /// [`Self::step`] with the server's nonce given (RFC test vectors).
    fn step_with_nonce(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<Credential>,
        server_nonce: &str,
    ) -> Result<(Vec<u8>, bool), Failed> {
        let bad = |why: &str| Failed(format!("invalid SCRAM message: {why}"));
        let message = std::str::from_utf8(message).map_err(|_| bad("not UTF-8"))?;
        match std::mem::replace(self, ScramServer::Done) {
            ScramServer::Start { mechanism } => {
                // gs2-header: "n,," or "n,a=authzid,"; "y" or "p" (channel binding) is not offered.
                let mut parts = message.splitn(3, ',');
                let (cb, authzid, bare) = (parts.next(), parts.next(), parts.next());
                if cb != Some("n") {
                    return Err(bad("channel binding is not supported"));
                }
                let bare = bare.ok_or_else(|| bad("no client-first-message-bare"))?;
                let user = attribute(bare, 'n')
                    .and_then(decode_username)
                    .ok_or_else(|| bad("no valid username"))?;
                if let Some(z) = authzid.and_then(|a| a.strip_prefix("a=")) {
                    if decode_username(z).as_deref() != Some(user.as_str()) {
                        return Err(Failed(
                            "an authorization id other than the user is not allowed".into(),
                        ));
                    }
                }
                let client_nonce = attribute(bare, 'r').ok_or_else(|| bad("no nonce"))?;
                if client_nonce.is_empty()
                    || !client_nonce
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && b != b',')
                {
                    return Err(bad("invalid nonce"));
                }
                let credential = lookup(&user).ok_or_else(|| {
                    Failed(format!(
                        "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                        mechanism.name()
                    ))
                })?;
                let nonce = format!("{client_nonce}{server_nonce}");
                let server_first = format!(
                    "r={nonce},s={},i={}",
                    B64.encode(&credential.salt),
                    credential.iterations
                );
                let answer = server_first.clone().into_bytes();
                *self = ScramServer::SentFirst {
                    mechanism,
                    user,
                    credential,
                    client_first_bare: bare.to_string(),
                    server_first,
                    nonce,
                };
                Ok((answer, false))
            }
            ScramServer::SentFirst {
                mechanism,
                user: _,
                credential,
                client_first_bare,
                server_first,
                nonce,
            } => {
                let invalid = || {
                    Failed(format!(
                        "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                        mechanism.name()
                    ))
                };
                let (without_proof, proof) =
                    message.rsplit_once(",p=").ok_or_else(|| bad("no proof"))?;
                let binding =
                    attribute(without_proof, 'c').ok_or_else(|| bad("no channel binding"))?;
                let binding = B64
                    .decode(binding)
                    .map_err(|_| bad("channel binding is not base64"))?;
                if !binding.starts_with(b"n,") {
                    return Err(bad("channel binding does not match"));
                }
                if !nonce_matches(without_proof, &nonce) {
                    return Err(bad("nonce does not match"));
                }
                let proof = B64.decode(proof).map_err(|_| bad("proof is not base64"))?;
                let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
                let signature = mechanism.hmac(&credential.stored_key, auth_message.as_bytes());
                if proof.len() != signature.len() {
                    return Err(invalid());
                }
                let client_key: Vec<u8> =
                    proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
                if !constant_time_eq(&mechanism.hash(&client_key), &credential.stored_key) {
                    return Err(invalid());
                }
                let server_signature =
                    mechanism.hmac(&credential.server_key, auth_message.as_bytes());
                Ok((
                    format!("v={}", B64.encode(server_signature)).into_bytes(),
                    true,
                ))
            }
            ScramServer::Done => Err(bad("the exchange is over")),
        }
    }
}

/// The client's side of one SCRAM exchange (the load generator's; tests).
#[derive(Debug)]
pub struct ScramClient {
    mechanism: Mechanism,
    password: Vec<u8>,
    client_first_bare: String,
    /// After the server's first message: the AuthMessage and the server signature to expect.
    expect: Option<Vec<u8>>,
}

impl ScramClient {
    /// Starts an exchange; returns the client and its first message.
    pub fn start(mechanism: Mechanism, user: &str, password: &str) -> (Self, Vec<u8>) {
        let nonce: [u8; 18] = rand::random();
        let name = user.replace('=', "=3D").replace(',', "=2C");
        let client_first_bare = format!("n={name},r={}", B64.encode(nonce));
        let first = format!("n,,{client_first_bare}").into_bytes();
        let client = Self {
            mechanism,
            password: password.as_bytes().to_vec(),
            client_first_bare,
            expect: None,
        };
        (client, first)
    }

    /// Takes the server's first message; returns the client's final one.
    pub fn answer(&mut self, server_first: &[u8]) -> Result<Vec<u8>, Failed> {
        let bad = |why: &str| Failed(format!("server-first message: {why}"));
        let text = std::str::from_utf8(server_first).map_err(|_| bad("not UTF-8"))?;
        let nonce = attribute(text, 'r').ok_or_else(|| bad("no nonce"))?;
        let ours = attribute(&self.client_first_bare, 'r').unwrap_or_default();
        if !nonce.starts_with(ours) {
            return Err(bad("the nonce does not extend ours"));
        }
        let salt = attribute(text, 's')
            .and_then(|s| B64.decode(s).ok())
            .ok_or_else(|| bad("no salt"))?;
        let iterations: u32 = attribute(text, 'i')
            .and_then(|i| i.parse().ok())
            .filter(|i| (MIN_ITERATIONS..=MAX_ITERATIONS).contains(i))
            .ok_or_else(|| bad("iterations missing or out of range"))?;
        let m = self.mechanism;
        let salted = m.salted_password(&self.password, &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = m.hmac(&m.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        self.expect = Some(m.hmac(&server_key, auth.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server's final message (it proves the server knows the credential).
    pub fn verify(&self, server_final: &[u8]) -> Result<(), Failed> {
        let text = std::str::from_utf8(server_final).unwrap_or_default();
        let given = attribute(text, 'v').and_then(|v| B64.decode(v).ok());
        match (&self.expect, given) {
            (Some(want), Some(got)) if constant_time_eq(want, &got) => Ok(()),
            _ => Err(Failed("the server's signature does not match".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client-final-message `c=biws,r=NONCE` proved with password `pw` over the exchange so far.
    fn client_final(first: &[u8], nonce: &str) -> String {
        let (mechanism, salt) = (Mechanism::Sha256, b"salt");
        let without_proof = format!("c=biws,r={nonce}");
        let first = String::from_utf8(first.to_vec()).unwrap();
        let auth = format!("n=u,r=abc,{first},{without_proof}");
        let client_key =
            mechanism.hmac(&mechanism.salted_password(b"pw", salt, 4096), b"Client Key");
        let signature = mechanism.hmac(&mechanism.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    #[test]
    fn a_final_nonce_ending_with_the_servers_is_taken_as_kafka_takes_it() {
        let cred = Credential::with_salt(Mechanism::Sha256, b"pw", b"salt", 4096);
        let first = |server: &mut ScramServer| {
            let lookup = |_: &str| Some(cred.clone());
            server
                .step_with_nonce(b"n,,n=u,r=abc", lookup, "XYZ")
                .unwrap()
                .0
        };
        // librdkafka 2.0 sends its own nonce again before the whole one.
        let mut server = ScramServer::new(Mechanism::Sha256);
        let f = first(&mut server);
        let (_, done) = server
            .step(client_final(&f, "abcabcXYZ").as_bytes(), |_| None)
            .unwrap();
        assert!(done);
        // One that does not end with the server's nonce is refused.
        let mut server = ScramServer::new(Mechanism::Sha256);
        let f = first(&mut server);
        assert!(server
            .step(client_final(&f, "abcXY").as_bytes(), |_| None)
            .is_err());
    }

    /// RFC 7677's SCRAM-SHA-256 exchange, byte for byte: user "user", password "pencil".
    #[test]
    fn rfc7677_test_vector() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = Credential::with_salt(Mechanism::Sha256, b"pencil", &salt, 4096);
        let mut server = ScramServer::new(Mechanism::Sha256);
        let snonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let (first, done) = server
            .step_with_nonce(
                b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
                |_| Some(cred.clone()),
                snonce,
            )
            .unwrap();
        assert!(!done);
        assert_eq!(
            String::from_utf8(first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let (last, done) = server
            .step(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                |_| None,
            )
            .unwrap();
        assert!(done);
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    /// The same exchange with a random server nonce, the client's proof computed here.
    #[test]
    fn rfc7677_example() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = Credential::with_salt(Mechanism::Sha256, b"pencil", &salt, 4096);
        let mut server = ScramServer::new(Mechanism::Sha256);
        let (first, done) = server
            .step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", |u| {
                (u == "user").then(|| cred.clone())
            })
            .unwrap();
        assert!(!done);
        // The server's nonce is random: rebuild the client's proof for it.
        let first = String::from_utf8(first).unwrap();
        let nonce = attribute(&first, 'r').unwrap().to_string();
        assert!(nonce.starts_with("rOprNGfwEbeRWgbNEkqO"));
        let salted = Mechanism::Sha256.salted_password(b"pencil", &salt, 4096);
        let client_key = Mechanism::Sha256.hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("n=user,r=rOprNGfwEbeRWgbNEkqO,{first},{without_proof}");
        let sig = Mechanism::Sha256.hmac(&Mechanism::Sha256.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        let last = format!("{without_proof},p={}", B64.encode(&proof));
        let mut wrong = ScramServer::SentFirst {
            mechanism: Mechanism::Sha256,
            user: "user".into(),
            credential: cred.clone(),
            client_first_bare: "n=user,r=rOprNGfwEbeRWgbNEkqO".into(),
            server_first: first.clone(),
            nonce: nonce.clone(),
        };
        let (fin, done) = server.step(last.as_bytes(), |_| None).unwrap();
        assert!(done);
        let server_key = Mechanism::Sha256.hmac(&salted, b"Server Key");
        let expect = Mechanism::Sha256.hmac(&server_key, auth.as_bytes());
        assert_eq!(fin, format!("v={}", B64.encode(expect)).into_bytes());
        // A wrong proof fails.
        let mut bad = proof.clone();
        bad[0] ^= 1;
        let last = format!("{without_proof},p={}", B64.encode(&bad));
        assert!(wrong.step(last.as_bytes(), |_| None).is_err());
    }

    #[test]
    fn the_client_and_the_server_agree() {
        for m in Mechanism::ALL {
            let cred = Credential::new(m, b"pass,word=", 4096);
            let (mut client, first) = ScramClient::start(m, "us=er,1", "pass,word=");
            let mut server = ScramServer::new(m);
            let (server_first, _) = server
                .step(&first, |u| (u == "us=er,1").then(|| cred.clone()))
                .unwrap();
            let last = client.answer(&server_first).unwrap();
            let (server_final, done) = server.step(&last, |_| None).unwrap();
            assert!(done);
            client.verify(&server_final).unwrap();
            assert!(client.verify(b"v=AAAA").is_err());
        }
    }

    #[test]
    fn unknown_users_and_malformed_messages_fail() {
        let mut s = ScramServer::new(Mechanism::Sha512);
        assert!(s.step(b"n,,n=nobody,r=abc", |_| None).is_err());
        for m in [
            &b"y,,n=u,r=a"[..],
            b"n,,r=a",
            b"n,,n=u",
            b"n,,n=a=b,r=x",
            b"\xff",
        ] {
            let mut s = ScramServer::new(Mechanism::Sha512);
            let cred = Credential::new(Mechanism::Sha512, b"pw", 4096);
            assert!(s.step(m, |_| Some(cred.clone())).is_err(), "{m:?}");
        }
        assert_eq!(decode_username("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
    }

    #[test]
    fn plain_passwords_are_checked_against_scram_credentials() {
        for m in Mechanism::ALL {
            let c = Credential::new(m, b"secret", 4096);
            assert!(c.matches(m, b"secret"));
            assert!(!c.matches(m, b"Secret"));
        }
    }
}
