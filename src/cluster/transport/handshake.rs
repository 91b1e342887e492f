//! How a peer connection proves it belongs to the cluster, before any message is decoded:
//! with `tls-cluster` both ends present certificates from the cluster's CA; with a cluster
//! secret both ends prove they know it; with neither, the dialing node only says who it is,
//! and the peer port must be firewalled.

use crate::ids::NodeId;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a new peer connection may take to complete its handshake (TLS, then the secret).
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection's halves, ready for frames.
pub(super) type PeerReader = Box<dyn AsyncRead + Send + Unpin>;
pub(super) type PeerWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Why a connection to or from a peer did not become a link.
#[derive(Debug)]
pub(super) enum LinkError {
    /// No connection to the peer's address could be opened.
    Connect(std::io::Error),
    /// The TLS handshake failed.
    Tls(std::io::Error),
    /// The peer handshake failed: a wrong proof, a stranger, a connection that closed.
    Handshake(std::io::Error),
    /// The handshake took longer than `HANDSHAKE_TIMEOUT` (with the connecting, for a link
    /// this node opens).
    TimedOut,
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Connect(e) => write!(f, "cannot connect: {e}"),
            LinkError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            LinkError::Handshake(e) => write!(f, "handshake failed: {e}"),
            LinkError::TimedOut => f.write_str("handshake timed out"),
        }
    }
}

impl std::error::Error for LinkError {}

/// How a peer connection proves it belongs to the cluster, before any message is decoded.
#[derive(Clone, Default)]
pub struct PeerSecurity {
    /// The shared cluster secret: both ends of every connection prove they know it.
    pub secret: Option<Arc<[u8]>>,
    /// Mutual TLS between nodes: both ends present certificates from the cluster's CA.
    pub tls: Option<crate::tls::PeerTls>,
}

impl std::fmt::Debug for PeerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSecurity")
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl PeerSecurity {
    /// Secures the connection this node (`me`) opened to `target` at `addr`: TLS if the
    /// cluster uses it, then the handshake.
    pub(super) async fn dial(
        &self,
        stream: TcpStream,
        addr: &str,
        me: NodeId,
        target: NodeId,
    ) -> Result<(PeerReader, PeerWriter), LinkError> {
        let secret = self.secret.as_deref();
        match &self.tls {
            None => {
                let mut stream = stream;
                dial_handshake(&mut stream, secret, me, target)
                    .await
                    .map_err(LinkError::Handshake)?;
                Ok(split_plain(stream))
            }
            Some(tls) => {
                let mut stream = tls.connect(addr, stream).await.map_err(LinkError::Tls)?;
                dial_handshake(&mut stream, secret, me, target)
                    .await
                    .map_err(LinkError::Handshake)?;
                Ok(split_any(stream))
            }
        }
    }

    /// Takes in a connection a peer opened to this node (`me`): TLS if the cluster uses it,
    /// then the handshake. The peer's node id and the connection's halves.
    pub(super) async fn accept(
        &self,
        stream: TcpStream,
        me: NodeId,
    ) -> Result<(NodeId, PeerReader, PeerWriter), LinkError> {
        let secret = self.secret.as_deref();
        match &self.tls {
            None => {
                let mut stream = stream;
                let peer = answer_handshake(&mut stream, secret, me)
                    .await
                    .map_err(LinkError::Handshake)?;
                let (rd, wr) = split_plain(stream);
                Ok((peer, rd, wr))
            }
            Some(tls) => {
                let mut stream = tls.accept(stream).await.map_err(LinkError::Tls)?;
                let peer = answer_handshake(&mut stream, secret, me)
                    .await
                    .map_err(LinkError::Handshake)?;
                let (rd, wr) = split_any(stream);
                Ok((peer, rd, wr))
            }
        }
    }
}

/// The peer handshake with a cluster secret. Each side sends a fresh random nonce, then each
/// proves it knows the secret with an HMAC-SHA256 over this label, its role, both node ids and
/// both nonces. The secret never travels; a proof is good for one connection only (both
/// nonces), one direction (the role) and one pair of nodes; a proof made with another
/// cluster's secret does not verify.
///
/// On the wire, all fixed sizes, before any frame:
/// - dialer: `HELLO_MAGIC`, its node id (u64 LE), its nonce (`NONCE_LEN` bytes);
/// - listener: its nonce, then its proof (`PROOF_LEN` bytes);
/// - dialer: its proof.
///
/// Without a secret the dialer sends only its node id (8 bytes).
const PROOF_LABEL: &[u8] = b"bucketd-peer-v1";
const HELLO_MAGIC: [u8; 8] = *b"BKDPEER1";
const NONCE_LEN: usize = 32;
const PROOF_LEN: usize = 32;
const ROLE_DIALER: u8 = 1;
const ROLE_LISTENER: u8 = 2;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The proof one side gives: the MAC, ready to finalize or to verify against.
fn proof(
    secret: &[u8],
    role: u8,
    dialer: NodeId,
    listener: NodeId,
    dialer_nonce: &[u8; NONCE_LEN],
    listener_nonce: &[u8; NONCE_LEN],
) -> std::io::Result<HmacSha256> {
    use hmac::Mac;
    // HMAC takes keys of every length; the error is only there for the trait's sake.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret)
        .map_err(|_| std::io::Error::other("the cluster secret is not a usable key"))?;
    mac.update(PROOF_LABEL);
    mac.update(&[role]);
    mac.update(&dialer.to_le_bytes());
    mac.update(&listener.to_le_bytes());
    mac.update(dialer_nonce);
    mac.update(listener_nonce);
    Ok(mac)
}

fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(format!("no randomness: {e}")))?;
    Ok(n)
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string())
}

/// The dialing side of the handshake, to `target`.
async fn dial_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: Option<&[u8]>,
    me: NodeId,
    target: NodeId,
) -> std::io::Result<()> {
    let Some(secret) = secret else {
        s.write_all(&me.to_le_bytes()).await?;
        return s.flush().await;
    };
    let mine = nonce()?;
    let mut hello = [0u8; 8 + 8 + NONCE_LEN];
    hello[..8].copy_from_slice(&HELLO_MAGIC);
    hello[8..16].copy_from_slice(&me.to_le_bytes());
    hello[16..].copy_from_slice(&mine);
    s.write_all(&hello).await?;
    s.flush().await?;
    let mut answer = [0u8; NONCE_LEN + PROOF_LEN];
    s.read_exact(&mut answer).await?;
    let mut theirs = [0u8; NONCE_LEN];
    theirs.copy_from_slice(&answer[..NONCE_LEN]);
    use hmac::Mac;
    proof(secret, ROLE_LISTENER, me, target, &mine, &theirs)?
        .verify_slice(&answer[NONCE_LEN..])
        .map_err(|_| refused("the peer's proof of the cluster secret is wrong"))?;
    let mine_proof = proof(secret, ROLE_DIALER, me, target, &mine, &theirs)?.finalize();
    s.write_all(&mine_proof.into_bytes()).await?;
    s.flush().await
}

/// The listening side of the handshake: the dialer's node id once it has proved itself.
async fn answer_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: Option<&[u8]>,
    me: NodeId,
) -> std::io::Result<NodeId> {
    let Some(secret) = secret else {
        let mut who = [0u8; 8];
        s.read_exact(&mut who).await?;
        return Ok(u64::from_le_bytes(who));
    };
    let mut hello = [0u8; 8 + 8 + NONCE_LEN];
    s.read_exact(&mut hello).await?;
    if hello[..8] != HELLO_MAGIC {
        return Err(refused("not a peer handshake (no cluster secret?)"));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&hello[8..16]);
    let dialer = u64::from_le_bytes(id);
    let mut theirs = [0u8; NONCE_LEN];
    theirs.copy_from_slice(&hello[16..]);
    let mine = nonce()?;
    use hmac::Mac;
    let my_proof = proof(secret, ROLE_LISTENER, dialer, me, &theirs, &mine)?.finalize();
    let mut answer = [0u8; NONCE_LEN + PROOF_LEN];
    answer[..NONCE_LEN].copy_from_slice(&mine);
    answer[NONCE_LEN..].copy_from_slice(&my_proof.into_bytes());
    s.write_all(&answer).await?;
    s.flush().await?;
    let mut their_proof = [0u8; PROOF_LEN];
    s.read_exact(&mut their_proof).await?;
    proof(secret, ROLE_DIALER, dialer, me, &theirs, &mine)?
        .verify_slice(&their_proof)
        .map_err(|_| refused("wrong proof of the cluster secret"))?;
    Ok(dialer)
}

/// Splits a plain connection without a lock between its halves.
fn split_plain(stream: TcpStream) -> (PeerReader, PeerWriter) {
    let (rd, wr) = stream.into_split();
    (Box::new(rd), Box::new(wr))
}

/// Splits a connection of any kind (a TLS stream) into halves that share it.
fn split_any<S: AsyncRead + AsyncWrite + Send + 'static>(stream: S) -> (PeerReader, PeerWriter) {
    let (rd, wr) = tokio::io::split(stream);
    (Box::new(rd), Box::new(wr))
}
