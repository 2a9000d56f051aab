//! Certificates made at test time: a CA, and server and client certificates it signs.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A CA that signs certificates into `dir`.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// Writes `<name>.pem` (the CA's certificate) into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }

    /// Signs a certificate for `subject` ((type, value) pairs), writes `<name>.crt` and `<name>.key`.
    pub fn sign(
        &self,
        dir: &Path,
        name: &str,
        subject: &[(DnType, &str)],
        server: bool,
        expired: bool,
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let sans = if server {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        } else {
            Vec::new()
        };
        let mut p = CertificateParams::new(sans).unwrap();
        for (t, v) in subject {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        let (crt, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&crt, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (crt, k)
    }
}

/// Files of one test: the CA, the server's certificate and key.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    pub ca_pem: PathBuf,
    pub server: (PathBuf, PathBuf),
}

/// A CA, and a server certificate it signed for localhost and 127.0.0.1, in a temp directory.
pub fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("shoal test CA");
    let ca_pem = ca.write(dir.path(), "ca");
    let server = ca.sign(
        dir.path(),
        "server",
        &[(DnType::CommonName, "localhost")],
        true,
        false,
    );
    Pki {
        dir,
        ca,
        ca_pem,
        server,
    }
}
