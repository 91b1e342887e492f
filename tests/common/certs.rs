//! Certificates made at test time: a CA, a certificate it signs for the nodes (good for
//! 127.0.0.1 and localhost, as server and as client), a client certificate it signs, and a
//! client certificate signed by another CA, which the nodes must refuse.

#![allow(dead_code)]

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::path::{Path, PathBuf};

/// PEM files in a folder.
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Signed by another CA.
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
    /// The other CA, for a server the nodes must not trust.
    pub rogue_ca: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    dir: &Path,
    file: &str,
) -> (PathBuf, PathBuf) {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("leaf params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("leaf cert");
    let cert_path = dir.join(format!("{file}.crt"));
    let key_path = dir.join(format!("{file}.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

impl Certs {
    pub fn make(dir: &Path) -> Certs {
        std::fs::create_dir_all(dir).expect("cert dir");
        let good = ca("bucketd test CA");
        let rogue = ca("another CA");
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, good.pem()).expect("write CA");
        let rogue_ca = dir.join("rogue-ca.crt");
        std::fs::write(&rogue_ca, rogue.pem()).expect("write CA");
        let (server_cert, server_key) = leaf(&good, "bucketd node", dir, "server");
        let (client_cert, client_key) = leaf(&good, "gateway", dir, "client");
        let (rogue_cert, rogue_key) = leaf(&rogue, "intruder", dir, "rogue");
        Certs {
            ca: ca_path,
            server_cert,
            server_key,
            client_cert,
            client_key,
            rogue_cert,
            rogue_key,
            rogue_ca,
        }
    }
}
