//! TLS for clients and for peers: certificates and keys from PEM files, rustls on the ring
//! provider.
//!
//! Clients reach a node over TLS on `--tls-port`, beside (or, with `--port 0` and no plain
//! listener wanted, instead of) the plain port; `--tls-auth-clients` says whether they must show
//! a certificate from the CA. Peers use mutual TLS on the peer port with `--tls-cluster yes`:
//! every node presents its certificate (`--tls-cert-file`) to the others, as server and as
//! client, and verifies theirs against `--tls-ca-cert-file`.

use crate::error::StartError;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Whether clients of the TLS port must present a certificate (Redis's `tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthClients {
    /// A certificate from the CA is required.
    #[default]
    Yes,
    /// None is asked for.
    No,
    /// One is asked for and verified if sent; a client without one is let in.
    Optional,
}

impl std::str::FromStr for AuthClients {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "yes" => Ok(AuthClients::Yes),
            "no" => Ok(AuthClients::No),
            "optional" => Ok(AuthClients::Optional),
            _ => Err(format!(
                "tls-auth-clients must be yes, no or optional, not '{s}'"
            )),
        }
    }
}

/// The TLS files and choices, as the settings give them.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub auth_clients: AuthClients,
}

/// The one crypto provider bucketd uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default provider, for code (the `redis` client) that asks rustls
/// for the default. Does nothing when one is installed already.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn tls_error(path: &Path, what: &str, error: impl std::fmt::Display) -> StartError {
    StartError::Tls(format!(
        "cannot load the TLS {what} from {}: {error}",
        path.display()
    ))
}

fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, StartError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, what, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, what, e))?;
    if certs.is_empty() {
        return Err(tls_error(path, what, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, StartError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_error(path, "private key", e))
}

fn load_roots(path: &Path) -> Result<Arc<RootCertStore>, StartError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path, "CA certificate")? {
        roots
            .add(cert)
            .map_err(|e| tls_error(path, "CA certificate", e))?;
    }
    Ok(Arc::new(roots))
}

fn setting(e: impl std::fmt::Display) -> StartError {
    StartError::Tls(format!("TLS settings: {e}"))
}

/// This node's certificate chain and key, which both listeners present.
fn identity(
    files: &TlsFiles,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), StartError> {
    let cert = files
        .cert
        .as_deref()
        .ok_or_else(|| StartError::Tls("TLS needs --tls-cert-file".into()))?;
    let key = files
        .key
        .as_deref()
        .ok_or_else(|| StartError::Tls("TLS needs --tls-key-file".into()))?;
    Ok((load_certs(cert, "certificate")?, load_key(key)?))
}

/// What serves the TLS client port. Without a CA clients are not asked for certificates,
/// whatever `auth_clients` says (there would be nothing to verify them against).
pub fn client_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, StartError> {
    let (certs, key) = identity(files)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(setting)?;
    let builder = match (&files.ca, files.auth_clients) {
        (None, _) | (_, AuthClients::No) => builder.with_no_client_auth(),
        (Some(ca), mode) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(load_roots(ca)?, provider());
            let verifier = if mode == AuthClients::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(setting)?)
        }
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        StartError::Tls(format!(
            "the TLS certificate and key do not go together: {e}"
        ))
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Mutual TLS between nodes: each accepts only peers with a certificate from the CA, and
/// connects only to peers whose certificate the CA signed for the host it dials.
#[derive(Clone)]
pub struct PeerTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl PeerTls {
    pub fn new(files: &TlsFiles) -> Result<PeerTls, StartError> {
        let ca = files
            .ca
            .as_deref()
            .ok_or_else(|| StartError::Tls("--tls-cluster needs --tls-ca-cert-file".into()))?;
        let roots = load_roots(ca)?;
        let (certs, key) = identity(files)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(setting)?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(setting)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(setting)?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(setting)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(setting)?;
        Ok(PeerTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// The TLS handshake with the peer at `addr` (HOST:PORT), whose certificate must name HOST.
    pub(crate) async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::other(format!("peer address {addr}: {e}")))?;
        self.connector.connect(name, stream).await
    }

    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        self.acceptor.accept(stream).await
    }
}
