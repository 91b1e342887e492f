//! Node-to-node messaging: every Raft group between two nodes shares one connection.
//!
//! Each node keeps one outgoing TCP connection per peer (lazily opened, reopened after a
//! failure). Requests carry their group id and a request id; any number are in flight at once
//! and their responses may come back in any order. A writer task drains everything queued for
//! a peer into one buffer and writes it with one syscall, so heartbeats and appends of many
//! groups travel together. The receiving side serves each request on its own task, so a slow
//! snapshot install never holds up another group's heartbeat.
//!
//! Besides the groups' own messages, each node pings every peer once a heartbeat interval
//! (`ping_peers`): one small message per peer pair, however many groups there are. It keeps
//! `reachable` current when no group has anything to say, and carries what quiet groups need
//! (see `quiet`).
//!
//! Every connection starts with a handshake (`PeerSecurity`) before anything is decoded: with a
//! cluster secret both ends prove they know it, with `tls-cluster` both present certificates
//! from the cluster's CA; with neither, the dialing node only says who it is, and the peer port
//! must be firewalled.
//!
//! Messages are bincode, carried in frames of at most `FRAME_CAP` bytes, each prefixed with its
//! `u32` length (a message larger than a frame, such as a large group's snapshot, is split over
//! several). A frame's buffer grows as its bytes arrive, so a header alone costs nothing. A
//! request that a peer cannot serve is answered
//! with a [`PeerError`], so the asking node acts on what happened rather than on text. What is
//! queued for one peer is bounded (`PEER_QUEUE_BYTES`, `PEER_QUEUE_FRAMES`): past that a
//! request fails at once with [`CallError::QueueFull`] (openraft counts the peer unreachable and
//! backs off), and an answer is dropped (the asker times out), instead of the queue growing
//! while the peer does not read.
//!
//! `Faults` lets tests cut links to simulate a partition: a blocked peer's messages are dropped
//! in both directions.

use crate::cluster::node::ProposeError;
use crate::cluster::quiet::{Ping, PingAck, VoteRefusal};
use crate::cluster::typ::{
    Entry, GroupId, GroupSnapshot, LogId, NodeId, TypeConfig, Vote, set_wire,
};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::shutdown::Shutdown;
use crate::sync::lock;
use arc_swap::ArcSwap;
use openraft::OptionalSend;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft_multi::GroupRouter;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// What one read from a peer's connection takes in at most.
const PEER_READ_BUF: usize = 64 * 1024;

/// Largest frame a peer may send: a message larger than this travels in several frames.
///
/// What the protocol sends in one message: a heartbeat or a ping is about a hundred bytes; an
/// append carries at most openraft's `max_payload_entries` (300) entries, each one turn's
/// commands of one group, a few KiB of rate-limit checks; a forwarded batch is one client
/// round (at most 1024 commands). Honest messages other than snapshots stay well under 1 MiB.
/// 16 MiB leaves room for a round of large SET values (bulk strings are capped at 8 MiB by
/// default) without letting one header make this node reserve much memory: and nothing is
/// reserved before the bytes arrive anyway (`read_growing`).
const FRAME_CAP: usize = 16 << 20;

/// Set in a frame's length word when the message goes on in the next frame.
const MORE_FRAMES: u32 = 1 << 31;

/// Largest message reassembled from frames: a snapshot of a large group. Reached only as bytes
/// arrive (a peer must send them all), and only past the handshake.
const MESSAGE_CAP: usize = 1 << 30;

/// Most bytes read into a frame's buffer at a time: the buffer grows by what arrived, not by
/// what the header claims.
const READ_STEP: usize = 64 * 1024;

/// A buffer kept for the next frame is given back when it grew past this (a snapshot).
const KEEP_BUF: usize = 1 << 20;

/// How long a new peer connection may take to complete its handshake (TLS, then the secret).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a refused peer connection is logged at warn at most (each is counted; the rest go
/// to debug).
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(1);

/// Most bytes of encoded frames queued for one peer (in either direction: requests to it,
/// answers to its requests) that its writer has not taken yet.
///
/// A peer that keeps up drains its queue every turn of the event loop, and a turn queues far
/// less than this: a heartbeat for every group is a few KiB, a turn's appends at most a few
/// MiB. A peer that stops reading (a stalled process, a link the kernel has not yet found
/// dead) is what fills it, and then the budget is what it costs this node in memory, per peer,
/// instead of everything sent to it until the connection fails. 64 MiB is 64 of the writer's
/// 1 MiB batches: well above any honest backlog, small next to a node's memory even with
/// every peer stalled at once. A frame larger than the whole budget (a big group's snapshot)
/// is still queued when nothing else is, so it can always be sent.
const PEER_QUEUE_BYTES: usize = 64 << 20;

/// Most frames queued for one peer, whatever their size: bounds the count of small frames (a
/// heartbeat is about a hundred bytes) that the byte budget alone would let pile up.
const PEER_QUEUE_FRAMES: usize = 64 * 1024;

/// Most bytes the writer gathers into one write.
const WRITE_BATCH: usize = 1 << 20;

/// How often a full peer queue is logged at most (each refusal is counted all the same).
const FULL_LOG_EVERY: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
pub enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
    Snapshot {
        vote: Vote,
        snapshot: GroupSnapshotWire,
    },
    TransferLeader(TransferLeaderRequest<TypeConfig>),
    /// Commands from a client connected to a node that does not lead the group.
    Forward(Vec<KeyCmd>),
    /// The node-level ping (its group id is not used).
    Ping(Ping),
    /// A change to the script cache, made on every member (its group id is not used).
    Scripts(ScriptsChange),
}

/// What a client did to the script cache on one node, for every other node to do as well:
/// the scripts are the cluster's, so a script loaded through any node runs on every one.
#[derive(Clone, Serialize, Deserialize)]
pub enum ScriptsChange {
    /// SCRIPT LOAD: the script's text.
    Load(Vec<u8>),
    /// SCRIPT FLUSH.
    Flush,
}

/// A snapshot as it travels (openraft's `Snapshot` is not itself serializable).
#[derive(Serialize, Deserialize)]
pub struct GroupSnapshotWire {
    pub meta: crate::cluster::typ::SnapshotMeta,
    pub data: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
pub enum RpcOk {
    Append(AppendEntriesResponse<TypeConfig>),
    Vote(VoteResponse<TypeConfig>),
    Snapshot(SnapshotResponse<TypeConfig>),
    TransferLeader(TransferLeaderResponse<TypeConfig>),
    Forward(Vec<Reply>),
    Ping(PingAck),
    Scripts,
}

/// Why a peer answered a request with an error instead of a result. It travels back in the
/// request's response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerError {
    /// A forwarded batch was refused by the node it was sent to, as it would have refused a
    /// client of its own.
    Refused(ProposeError),
    /// The node is stopping.
    ShuttingDown,
    /// The node holds no replica of the group.
    NoReplica(GroupId),
    /// A vote or pre-vote was refused on account of a quiet group (see `quiet`).
    VoteRefused(VoteRefusal),
    /// The group's Raft failed the request, in openraft's words.
    Raft(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Refused(e) => e.fmt(f),
            PeerError::ShuttingDown => f.write_str("node is shutting down"),
            PeerError::NoReplica(g) => write!(f, "no replica of group {g} here"),
            PeerError::VoteRefused(r) => r.fmt(f),
            PeerError::Raft(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for PeerError {}

/// Why a call to a peer brought no result: it never reached the peer, its answer never came
/// back, or the peer answered with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Tests cut the link to the peer.
    Cut(NodeId),
    /// The node is not a peer of this one.
    UnknownNode(NodeId),
    /// The request could not be encoded, in bincode's words.
    Encode(String),
    /// The peer's queue holds all it may: the peer is not keeping up.
    QueueFull(NodeId),
    /// The connection to the peer closed before the answer came.
    Closed(NodeId),
    /// The connection to the peer went away with the request.
    Lost(NodeId),
    /// The peer did not answer within the given time.
    TimedOut(NodeId, Duration),
    /// No connection to the peer at that address could be opened.
    CannotConnect(NodeId, String),
    /// The connection opened but this node could not introduce itself.
    Handshake,
    /// The peer answered with a result of another kind than the request's.
    UnexpectedAnswer,
    /// The peer answered with an error.
    Peer(PeerError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Cut(n) => write!(f, "link to node {n} is cut"),
            CallError::UnknownNode(n) => write!(f, "unknown node {n}"),
            CallError::Encode(e) => f.write_str(e),
            CallError::QueueFull(n) => write!(f, "the queue to node {n} is full"),
            CallError::Closed(n) => write!(f, "connection to node {n} closed"),
            CallError::Lost(n) => write!(f, "connection to node {n} lost"),
            CallError::TimedOut(n, ttl) => write!(f, "node {n} did not answer within {ttl:?}"),
            CallError::CannotConnect(n, addr) => write!(f, "cannot connect to node {n} at {addr}"),
            CallError::Handshake => f.write_str("handshake failed"),
            CallError::UnexpectedAnswer => f.write_str("unexpected response type"),
            CallError::Peer(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CallError {}

/// One message on a peer connection.
#[derive(Serialize, Deserialize)]
pub enum PeerFrame {
    Request {
        id: u64,
        group: GroupId,
        rpc: Rpc,
    },
    Response {
        id: u64,
        result: Result<RpcOk, PeerError>,
    },
}

/// Appends `frame` to `out` as one message: one length-prefixed frame, or several when it is
/// larger than `FRAME_CAP`.
fn encode(frame: &PeerFrame, out: &mut Vec<u8>) -> Result<(), CallError> {
    encode_with(out, |out| put(out, frame))
}

/// Appends one value's bincode encoding to `out`.
fn put(out: &mut Vec<u8>, value: impl Serialize) -> Result<(), CallError> {
    bincode::serde::encode_into_std_write(value, out, bincode::config::standard())
        .map(drop)
        .map_err(|e| CallError::Encode(e.to_string()))
}

/// The variant numbers bincode gives `PeerFrame::Request` and `Rpc::Append` (their places in
/// their enums).
const REQUEST_VARIANT: u32 = 0;
const APPEND_VARIANT: u32 = 0;

/// Appends a request to `out` as `encode` does. An append's entries that carry their encoding
/// (`Proposal::wire`, the leader's log wrote it) are copied from it rather than encoded again
/// for each follower; the bytes are the same either way, since bincode writes an enum's
/// variant number and then its fields one after the other, with nothing around them.
fn encode_request(id: u64, group: GroupId, rpc: Rpc, out: &mut Vec<u8>) -> Result<(), CallError> {
    let Rpc::Append(req) = &rpc else {
        return encode(&PeerFrame::Request { id, group, rpc }, out);
    };
    encode_with(out, |out| {
        put(out, (REQUEST_VARIANT, id, group, APPEND_VARIANT))?;
        put(out, (&req.vote, &req.prev_log_id, req.entries.len() as u64))?;
        for entry in &req.entries {
            match crate::cluster::typ::wire_of(entry) {
                Some(bytes) => out.extend_from_slice(bytes),
                None => put(out, entry)?,
            }
        }
        put(out, req.leader_commit)
    })
}

/// About how many bytes `rpc` takes framed, so that the buffer it is encoded into is made
/// once rather than regrown by doubling (an append at pipeline 16 is about ten KiB).
fn size_hint(rpc: &Rpc) -> usize {
    match rpc {
        Rpc::Append(req) => req
            .entries
            .iter()
            .map(|e| crate::cluster::typ::wire_of(e).map_or(ENTRY_GUESS, |w| w.len()))
            .fold(64, usize::saturating_add)
            .min(MESSAGE_CAP),
        _ => 128,
    }
}

/// What an entry whose encoding is not at hand is guessed to take.
const ENTRY_GUESS: usize = 256;

/// Frames what `body` appends to `out`: one length-prefixed frame, or several when it is
/// larger than `FRAME_CAP`.
fn encode_with(
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), CallError>,
) -> Result<(), CallError> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    if let Err(e) = body(out) {
        out.truncate(start);
        return Err(e);
    }
    let len = out.len() - start - 4;
    if len > MESSAGE_CAP {
        out.truncate(start);
        return Err(CallError::Encode(format!(
            "message of {len} bytes is larger than a peer takes"
        )));
    }
    if len <= FRAME_CAP {
        // `len` fits: it is at most FRAME_CAP, far below the MORE_FRAMES bit.
        out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
        return Ok(());
    }
    let body = out.split_off(start + 4);
    out.truncate(start);
    let mut pieces = body.chunks(FRAME_CAP).peekable();
    while let Some(piece) = pieces.next() {
        let mut word = piece.len() as u32;
        if pieces.peek().is_some() {
            word |= MORE_FRAMES;
        }
        out.extend_from_slice(&word.to_le_bytes());
        out.extend_from_slice(piece);
    }
    Ok(())
}

/// Why a peer's bytes were not a message.
#[derive(Debug)]
enum ReadError {
    /// The connection closed or failed.
    Io(std::io::Error),
    /// A frame's header claims more than `FRAME_CAP`, or a message more than `MESSAGE_CAP`.
    TooLarge(usize),
    /// The bytes are not a message, in bincode's words.
    Decode(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => e.fmt(f),
            ReadError::TooLarge(n) => write!(f, "frame of {n} bytes is over the cap"),
            ReadError::Decode(e) => write!(f, "undecodable frame: {e}"),
        }
    }
}

/// Appends exactly `n` more bytes from `r` to `buf`, growing it by what arrives (at most
/// `READ_STEP` at a time) rather than by what was announced.
async fn read_growing(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    n: usize,
) -> std::io::Result<()> {
    let end = buf.len() + n;
    while buf.len() < end {
        let step = (end - buf.len()).min(READ_STEP);
        buf.reserve(step);
        let got = (&mut *r).take(step as u64).read_buf(buf).await?;
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads one message (one frame, or several with `MORE_FRAMES`) and decodes it.
async fn read_frame(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<PeerFrame, ReadError> {
    if buf.capacity() > KEEP_BUF {
        *buf = Vec::new();
    }
    buf.clear();
    loop {
        let mut word = [0u8; 4];
        r.read_exact(&mut word).await.map_err(ReadError::Io)?;
        let word = u32::from_le_bytes(word);
        let len = (word & !MORE_FRAMES) as usize;
        if len > FRAME_CAP {
            return Err(ReadError::TooLarge(len));
        }
        if buf.len() + len > MESSAGE_CAP {
            return Err(ReadError::TooLarge(buf.len() + len));
        }
        read_growing(r, buf, len).await.map_err(ReadError::Io)?;
        if word & MORE_FRAMES == 0 {
            break;
        }
    }
    decode_peer_frame(buf).map_err(ReadError::Decode)
}

/// Decodes a message's bytes (what its frames carried), refusing lengths the bytes cannot
/// hold.
pub fn decode_peer_frame(bytes: &[u8]) -> Result<PeerFrame, String> {
    use crate::cluster::decode_bounded;
    if let Ok(((REQUEST_VARIANT, id, group, APPEND_VARIANT), at)) =
        decode_bounded::<(u32, u64, GroupId, u32)>(bytes)
    {
        return decode_append(bytes, at, id, group).map_err(|e| e.to_string());
    }
    decode_bounded(bytes)
        .map(|(f, _)| f)
        .map_err(|e| e.to_string())
}

/// How many entries to make room for ahead of decoding an append that announces `n` of them
/// with `left` bytes to go: no more than the bytes could hold (an entry takes at least one
/// byte) and no more than 1 MiB of entries, as serde does for a sequence. A count beyond what
/// the bytes hold fails once they end.
fn entries_room(n: u64, left: usize) -> usize {
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .min(left)
        .min((1 << 20) / std::mem::size_of::<Entry>().max(1))
}

/// The rest of an append request (from `at` in `bytes`), decoded piece by piece so that each
/// entry keeps the bytes it came in (`Proposal::wire`): the follower's log writes those
/// rather than encoding the entry again, and keeps only those once the entry is applied. The
/// entries' bytes are copied out of the frame once, all together, and each entry's strings
/// are views into them rather than copies of their own.
fn decode_append(
    bytes: &[u8],
    mut at: usize,
    id: u64,
    group: GroupId,
) -> Result<PeerFrame, bincode::error::DecodeError> {
    use crate::cluster::decode_bounded;
    let rest = |at: usize| bytes.get(at..).unwrap_or_default();
    let ((vote, prev_log_id, n), used): ((Vote, Option<LogId>, u64), usize) =
        decode_bounded(rest(at))?;
    at += used;
    let mut entries = Vec::with_capacity(entries_room(n, bytes.len().saturating_sub(at)));
    let region = bytes::Bytes::copy_from_slice(rest(at));
    let mut from = 0;
    for _ in 0..n {
        let (mut entry, used) = crate::cluster::entry_decode::decode_entry(&region, from)?;
        set_wire(&mut entry, Some(region.slice(from..from + used)));
        from += used;
        entries.push(entry);
    }
    let (leader_commit, _) = decode_bounded(region.get(from..).unwrap_or_default())?;
    Ok(PeerFrame::Request {
        id,
        group,
        rpc: Rpc::Append(AppendEntriesRequest {
            vote,
            prev_log_id,
            entries,
            leader_commit,
        }),
    })
}

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
/// Without a secret the dialer sends only its node id (8 bytes), as nodes always have.
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

type PeerReader = Box<dyn AsyncRead + Send + Unpin>;
type PeerWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits a plain connection without a lock between its halves.
fn split_plain(stream: TcpStream) -> (PeerReader, PeerWriter) {
    let (rd, wr) = stream.into_split();
    (Box::new(rd), Box::new(wr))
}

fn split_any<S: AsyncRead + AsyncWrite + Send + 'static>(stream: S) -> (PeerReader, PeerWriter) {
    let (rd, wr) = tokio::io::split(stream);
    (Box::new(rd), Box::new(wr))
}

/// Why a frame was not queued.
enum QueueRefused {
    /// The queue holds `PEER_QUEUE_BYTES` or `PEER_QUEUE_FRAMES` already.
    Full,
    /// Its writer has stopped.
    Closed,
}

/// The sending end of the frames queued for one peer's writer, bounded in frames and bytes.
#[derive(Clone)]
struct QueueTx {
    tx: mpsc::Sender<Vec<u8>>,
    /// Bytes queued and not yet taken by the writer.
    bytes: Arc<AtomicUsize>,
}

/// The writer's end of a peer's queue.
struct QueueRx {
    rx: mpsc::Receiver<Vec<u8>>,
    bytes: Arc<AtomicUsize>,
}

fn peer_queue() -> (QueueTx, QueueRx) {
    let (tx, rx) = mpsc::channel(PEER_QUEUE_FRAMES);
    let bytes = Arc::new(AtomicUsize::new(0));
    (
        QueueTx {
            tx,
            bytes: bytes.clone(),
        },
        QueueRx { rx, bytes },
    )
}

impl QueueTx {
    /// Queues `frame` unless the queue is full; never waits.
    fn push(&self, frame: Vec<u8>) -> Result<(), QueueRefused> {
        let len = frame.len();
        let before = self.bytes.fetch_add(len, Ordering::Relaxed);
        // An empty queue takes any frame, so one larger than the budget can still go.
        if before != 0 && before + len > PEER_QUEUE_BYTES {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(QueueRefused::Full);
        }
        self.tx.try_send(frame).map_err(|e| {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => QueueRefused::Full,
                mpsc::error::TrySendError::Closed(_) => QueueRefused::Closed,
            }
        })
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl QueueRx {
    /// Waits for the next frame; `None` once the queue is closed and empty. Cancel safe.
    async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }

    /// Puts `first` (just received) into `batch` (cleared first) with every frame queued
    /// behind it, up to `WRITE_BATCH` bytes, and returns how many frames that is.
    async fn batch_after(&mut self, first: Vec<u8>, batch: &mut Vec<u8>) -> u64 {
        batch.clear();
        batch.extend_from_slice(&first);
        let mut taken = first.len();
        // Let the other groups' tasks that are ready run first, so what they queue for this
        // peer rides in the same write.
        tokio::task::yield_now().await;
        let mut n = 1;
        while batch.len() < WRITE_BATCH {
            match self.rx.try_recv() {
                Ok(more) => {
                    batch.extend_from_slice(&more);
                    taken += more.len();
                    n += 1;
                }
                Err(_) => break,
            }
        }
        self.bytes.fetch_sub(taken, Ordering::Relaxed);
        n
    }

    fn close(&mut self) {
        self.rx.close();
    }
}

/// Links that tests have cut.
#[derive(Default)]
pub struct Faults {
    blocked: RwLock<HashSet<NodeId>>,
}

impl Faults {
    pub fn block(&self, peer: NodeId) {
        crate::sync::write(&self.blocked).insert(peer);
    }

    pub fn unblock(&self, peer: NodeId) {
        crate::sync::write(&self.blocked).remove(&peer);
    }

    pub fn heal(&self) {
        crate::sync::write(&self.blocked).clear();
    }

    pub fn is_blocked(&self, peer: NodeId) -> bool {
        crate::sync::read(&self.blocked).contains(&peer)
    }
}

/// Serves requests that peers send to this node.
pub(crate) trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        group: GroupId,
        rpc: Rpc,
    ) -> impl Future<Output = Result<RpcOk, PeerError>> + Send;
}

/// The requests sent to one peer that wait for their answers, by request id.
type InFlight = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<RpcOk, CallError>>>>>;

/// The outgoing connection to one peer.
struct PeerLink {
    addr: String,
    tx: Mutex<Option<QueueTx>>,
    in_flight: InFlight,
    /// When the peer was last heard from (a request or a response), in ms since `born`.
    heard: AtomicU64,
    /// When a connection to the peer last failed (refused, reset, timed out), likewise.
    failed: AtomicU64,
    /// When the latest ping that the peer answered was sent, likewise: the peer was up and
    /// agreed to what the answer says at least from then on.
    ping_acked: AtomicU64,
    /// Pings to the peer that wait for their answers.
    pings_in_flight: Arc<AtomicUsize>,
}

impl PeerLink {
    fn new(addr: String) -> PeerLink {
        PeerLink {
            addr,
            tx: Mutex::new(None),
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            heard: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            ping_acked: AtomicU64::new(0),
            pings_in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// Every peer's link, by node id: replaced whole when a node joins the cluster.
type Links = HashMap<NodeId, Arc<PeerLink>>;

/// This node's side of the mesh: one link per peer. Cheap to clone.
#[derive(Clone)]
pub struct Network {
    inner: Arc<NetworkInner>,
}

struct NetworkInner {
    me: NodeId,
    links: ArcSwap<Links>,
    /// The address outgoing connections leave from: this node's own advertised address, so
    /// that on one machine nodes on 127.0.0.1, .2 and .3 can be cut apart by address.
    local_ip: Option<std::net::IpAddr>,
    born: std::time::Instant,
    next_id: AtomicU64,
    faults: Arc<Faults>,
    shutdown: Shutdown,
    /// Frames sent, and writes that carried them (to see batching at work).
    frames_sent: AtomicU64,
    writes: AtomicU64,
    /// Frames not sent because their peer's queue was full, and when that was last logged
    /// (ms since `born`).
    queue_full: AtomicU64,
    queue_full_logged: AtomicU64,
    security: PeerSecurity,
    /// Peer connections refused (a failed handshake, an over-cap or undecodable frame), and
    /// when that was last logged at warn (ms since `born`).
    refused: AtomicU64,
    refused_logged: AtomicU64,
}

impl Network {
    /// `peers` maps every other node to its peer address.
    pub fn new(
        me: NodeId,
        peers: &[(NodeId, String)],
        faults: Arc<Faults>,
        shutdown: Shutdown,
        security: PeerSecurity,
    ) -> Network {
        let links: Links = peers
            .iter()
            .filter(|(id, _)| *id != me)
            .map(|(id, addr)| (*id, Arc::new(PeerLink::new(addr.clone()))))
            .collect();
        let local_ip = peers
            .iter()
            .find(|(id, _)| *id == me)
            .and_then(|(_, addr)| addr.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        Network {
            inner: Arc::new(NetworkInner {
                me,
                links: ArcSwap::from_pointee(links),
                local_ip,
                born: std::time::Instant::now(),
                next_id: AtomicU64::new(1),
                faults,
                shutdown,
                frames_sent: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                queue_full: AtomicU64::new(0),
                queue_full_logged: AtomicU64::new(0),
                security,
                refused: AtomicU64::new(0),
                refused_logged: AtomicU64::new(0),
            }),
        }
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.inner.faults
    }

    /// (frames sent, write syscalls) so far.
    pub fn batching(&self) -> (u64, u64) {
        (
            self.inner.frames_sent.load(Ordering::Relaxed),
            self.inner.writes.load(Ordering::Relaxed),
        )
    }

    /// Frames not sent so far because their peer's queue was full.
    pub fn queue_full_drops(&self) -> u64 {
        self.inner.queue_full.load(Ordering::Relaxed)
    }

    /// Whether `every` has passed since `last_logged` (ms, 0: never) was set, setting it if
    /// so: of threads asking at once, one gets true.
    fn time_to_log(&self, last_logged: &AtomicU64, every: Duration) -> bool {
        let now = self.now_ms();
        let last = last_logged.load(Ordering::Relaxed);
        let every = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
        (last == 0 || now.saturating_sub(last) >= every)
            && last_logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Counts a frame refused by `peer`'s full queue, and says so in the log at most once per
    /// `FULL_LOG_EVERY`.
    fn note_queue_full(&self, peer: NodeId, what: &str) {
        let total = self.inner.queue_full.fetch_add(1, Ordering::Relaxed) + 1;
        if self.time_to_log(&self.inner.queue_full_logged, FULL_LOG_EVERY) {
            tracing::warn!(
                peer,
                total,
                "the queue to node {peer} is full: {what} dropped ({total} so far)"
            );
        }
    }

    /// Peer connections refused so far.
    pub fn refused_connections(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Counts a refused peer connection and logs it: at warn at most once per
    /// `REFUSED_LOG_EVERY` (a flood of bad connections must not flood the log), else at debug.
    fn note_refused(&self, peer: &str, why: &dyn std::fmt::Display) {
        let total = self.inner.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if self.time_to_log(&self.inner.refused_logged, REFUSED_LOG_EVERY) {
            tracing::warn!(
                peer,
                total,
                "refused a peer connection from {peer}: {why} ({total} refused so far)"
            );
        } else {
            tracing::debug!(peer, "refused a peer connection from {peer}: {why}");
        }
    }

    /// Opens the secured connection to `target` at `addr`: TLS if the cluster uses it, then
    /// the handshake. Its halves are ready for frames.
    async fn open_link(
        &self,
        target: NodeId,
        addr: &str,
    ) -> Result<(PeerReader, PeerWriter), String> {
        let stream = self
            .connect_from_home(addr)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let security = &self.inner.security;
        let secret = security.secret.as_deref();
        let me = self.inner.me;
        match &security.tls {
            None => {
                let mut stream = stream;
                dial_handshake(&mut stream, secret, me, target)
                    .await
                    .map_err(|e| format!("handshake failed: {e}"))?;
                Ok(split_plain(stream))
            }
            Some(tls) => {
                let mut stream = tls
                    .connect(addr, stream)
                    .await
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                dial_handshake(&mut stream, secret, me, target)
                    .await
                    .map_err(|e| format!("handshake failed: {e}"))?;
                Ok(split_any(stream))
            }
        }
    }

    /// Takes in a new peer connection: TLS if the cluster uses it, then the handshake. The
    /// peer's node id and the connection's halves.
    async fn accept_link(
        &self,
        stream: TcpStream,
    ) -> Result<(NodeId, PeerReader, PeerWriter), String> {
        let security = &self.inner.security;
        let secret = security.secret.as_deref();
        let me = self.inner.me;
        match &security.tls {
            None => {
                let mut stream = stream;
                let peer = answer_handshake(&mut stream, secret, me)
                    .await
                    .map_err(|e| format!("handshake failed: {e}"))?;
                let (rd, wr) = split_plain(stream);
                Ok((peer, rd, wr))
            }
            Some(tls) => {
                let mut stream = tls
                    .accept(stream)
                    .await
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                let peer = answer_handshake(&mut stream, secret, me)
                    .await
                    .map_err(|e| format!("handshake failed: {e}"))?;
                let (rd, wr) = split_any(stream);
                Ok((peer, rd, wr))
            }
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.born.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn link(&self, peer: NodeId) -> Option<Arc<PeerLink>> {
        self.inner.links.load().get(&peer).cloned()
    }

    /// Adds a peer (a node that joined), or points a known one at a new address. Its link
    /// opens on the first message sent to it.
    pub fn add_peer(&self, peer: NodeId, addr: &str) {
        if peer == self.inner.me {
            return;
        }
        self.inner.links.rcu(|links| {
            let mut links = Links::clone(links);
            if links.get(&peer).is_none_or(|l| l.addr != addr) {
                links.insert(peer, Arc::new(PeerLink::new(addr.to_string())));
            }
            links
        });
    }

    /// Forgets a peer (a node removed from the cluster): its link closes.
    pub fn remove_peer(&self, peer: NodeId) {
        self.inner.links.rcu(|links| {
            let mut links = Links::clone(links);
            links.remove(&peer);
            links
        });
    }

    /// Every peer this node knows.
    pub fn peers(&self) -> Vec<NodeId> {
        self.inner.links.load().keys().copied().collect()
    }

    /// Notes that `peer` just said something.
    fn heard_from(&self, peer: NodeId) {
        if let Some(l) = self.link(peer) {
            l.heard.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Notes that a connection to `peer` just failed.
    fn failed_with(&self, peer: NodeId) {
        if let Some(l) = self.link(peer) {
            l.failed.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    fn stamp(&self, peer: NodeId, which: impl Fn(&PeerLink) -> &AtomicU64) -> u64 {
        self.inner
            .links
            .load()
            .get(&peer)
            .map_or(0, |l| which(l).load(Ordering::Relaxed))
    }

    /// How long ago `peer` was last heard from; `None` if never (or it is not a peer).
    pub fn last_heard(&self, peer: NodeId) -> Option<Duration> {
        let at = self.stamp(peer, |l| &l.heard);
        (at != 0).then(|| Duration::from_millis(self.now_ms().saturating_sub(at)))
    }

    /// Whether `peer` was heard from within `within`. Every node hears from every other
    /// several times a second while they are connected (pings and their answers, besides
    /// whatever the groups send).
    /// A peer whose connection failed after it was last heard from (a killed process refuses
    /// the next connection at once) is not reachable either.
    pub fn reachable(&self, peer: NodeId, within: Duration) -> bool {
        if peer == self.inner.me {
            return true;
        }
        let heard = self.stamp(peer, |l| &l.heard);
        let failed = self.stamp(peer, |l| &l.failed);
        let within = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        heard != 0 && heard > failed && self.now_ms().saturating_sub(heard) <= within
    }

    /// How long ago the latest ping `peer` answered was sent; `None` if it never answered one.
    pub fn last_ping_acked(&self, peer: NodeId) -> Option<Duration> {
        let at = self.stamp(peer, |l| &l.ping_acked);
        (at != 0).then(|| Duration::from_millis(self.now_ms().saturating_sub(at)))
    }

    /// Opens a connection to `addr` from this node's own address when it has one.
    async fn connect_from_home(&self, addr: &str) -> std::io::Result<TcpStream> {
        let Some(ip) = self.inner.local_ip else {
            return TcpStream::connect(addr).await;
        };
        let target = tokio::net::lookup_host(addr)
            .await?
            .find(|a| a.is_ipv4() == ip.is_ipv4())
            .ok_or_else(|| std::io::Error::other(format!("no address for {addr}")))?;
        let socket = if ip.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.bind(std::net::SocketAddr::new(ip, 0))?;
        socket.connect(target).await
    }

    /// Whether an outgoing connection to `peer` is open now.
    pub fn link_open(&self, peer: NodeId) -> bool {
        self.link(peer)
            .is_some_and(|l| lock(&l.tx).as_ref().is_some_and(|t| !t.is_closed()))
    }

    /// Number of open outgoing connections (one per peer at most).
    pub fn open_links(&self) -> usize {
        self.inner
            .links
            .load()
            .values()
            .filter(|l| lock(&l.tx).as_ref().is_some_and(|t| !t.is_closed()))
            .count()
    }

    /// Sends one request and waits for its response, at most `ttl`.
    pub async fn call(
        &self,
        target: NodeId,
        group: GroupId,
        rpc: Rpc,
        ttl: Duration,
    ) -> Result<RpcOk, CallError> {
        if self.inner.faults.is_blocked(target) {
            return Err(CallError::Cut(target));
        }
        let link = self.link(target).ok_or(CallError::UnknownNode(target))?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut bytes = Vec::with_capacity(size_hint(&rpc));
        encode_request(id, group, rpc, &mut bytes)?;
        let (tx, rx) = oneshot::channel();
        lock(&link.in_flight).insert(id, tx);
        if let Err(refused) = self.queue(target, &link, bytes) {
            lock(&link.in_flight).remove(&id);
            return Err(match refused {
                QueueRefused::Full => {
                    self.note_queue_full(target, "a request");
                    CallError::QueueFull(target)
                }
                QueueRefused::Closed => CallError::Closed(target),
            });
        }
        match tokio::time::timeout(ttl, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(CallError::Lost(target)),
            Err(_) => {
                lock(&link.in_flight).remove(&id);
                Err(CallError::TimedOut(target, ttl))
            }
        }
    }

    /// Queues `frame` for the link's writer, starting the connection if there is none.
    fn queue(&self, target: NodeId, link: &PeerLink, frame: Vec<u8>) -> Result<(), QueueRefused> {
        let mut slot = lock(&link.tx);
        if let Some(tx) = slot.as_ref()
            && !tx.is_closed()
        {
            return tx.push(frame);
        }
        let (tx, rx) = peer_queue();
        let pushed = tx.push(frame);
        *slot = Some(tx);
        let net = self.clone();
        let addr = link.addr.clone();
        let in_flight = link.in_flight.clone();
        tokio::spawn(async move { net.run_link(target, addr, rx, in_flight).await });
        pushed
    }

    /// Owns one connection: writes queued frames in batches, reads responses. When the
    /// connection fails every waiting request fails with it, and the next request reconnects.
    async fn run_link(self, target: NodeId, addr: String, mut rx: QueueRx, in_flight: InFlight) {
        let fail_all = |why: CallError| {
            for (_, tx) in lock(&in_flight).drain() {
                let _ = tx.send(Err(why.clone()));
            }
        };
        // Connecting has its own short bound; the handshake that follows has the usual one.
        let opened = tokio::time::timeout(
            Duration::from_millis(500) + HANDSHAKE_TIMEOUT,
            self.open_link(target, &addr),
        )
        .await
        .unwrap_or_else(|_| Err("handshake timed out".to_string()));
        let (rd, mut wr) = match opened {
            Ok(halves) => halves,
            Err(why) => {
                rx.close();
                self.failed_with(target);
                if why.starts_with("cannot connect") {
                    fail_all(CallError::CannotConnect(target, addr));
                } else {
                    self.note_refused(&addr, &why);
                    fail_all(CallError::Handshake);
                }
                return;
            }
        };
        // Buffered: one read takes in every frame that has arrived, instead of two system
        // calls (length, then body) per frame.
        let mut rd = tokio::io::BufReader::with_capacity(PEER_READ_BUF, rd);
        let reader_in_flight = in_flight.clone();
        let net = self.clone();
        let addr_for_reader = addr.clone();
        let mut reader = tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                match read_frame(&mut rd, &mut buf).await {
                    Ok(PeerFrame::Response { id, result }) => {
                        if net.inner.faults.is_blocked(target) {
                            continue;
                        }
                        net.heard_from(target);
                        if let Some(tx) = lock(&reader_in_flight).remove(&id) {
                            let _ = tx.send(result.map_err(CallError::Peer));
                        }
                    }
                    Ok(PeerFrame::Request { .. }) => {}
                    Err(ReadError::Io(_)) => return,
                    Err(e) => {
                        net.note_refused(&addr_for_reader, &e);
                        return;
                    }
                }
            }
        });
        let mut shutdown = self.inner.shutdown.clone();
        let mut batch = Vec::with_capacity(64 * 1024);
        loop {
            tokio::select! {
                msg = rx.recv() => {
                    let Some(first) = msg else { break };
                    let n = rx.batch_after(first, &mut batch).await;
                    if wr.write_all(&batch).await.is_err() {
                        self.failed_with(target);
                        break;
                    }
                    self.inner.frames_sent.fetch_add(n, Ordering::Relaxed);
                    self.inner.writes.fetch_add(1, Ordering::Relaxed);
                }
                _ = &mut reader => {
                    // The peer closed or reset the connection.
                    self.failed_with(target);
                    break;
                }
                _ = shutdown.recv() => break,
            }
        }
        rx.close();
        reader.abort();
        fail_all(CallError::Closed(target));
    }
}

/// Builds the node-level pings and takes their answers.
pub(crate) trait Pinger: Send + Sync + 'static {
    /// The ping to send `peer` now.
    fn ping(&self, peer: NodeId) -> Ping;
    /// `peer` answered `ping`, which was sent at `sent`.
    fn answered(&self, peer: NodeId, sent: std::time::Instant, ping: &Ping, ack: &PingAck);
}

/// Pings every peer every `every` until the node stops, all peers at the same moment (so
/// that the promises a quiet leader's followers make run out together), with at most one
/// ping in flight per peer. An answer counts from when its ping was sent (the peer answered
/// some moment after that), and like any response it counts as hearing from the peer.
/// At most this many pings to one peer wait for their answers at a time.
const PINGS_IN_FLIGHT: usize = 3;

pub(crate) fn ping_peers<P: Pinger>(
    net: &Network,
    pinger: Arc<P>,
    every: Duration,
    handle: &tokio::runtime::Handle,
) {
    let net = net.clone();
    let mut shutdown = net.inner.shutdown.clone();
    handle.spawn(async move {
        let mut tick = super::ticker(every);
        while super::next_tick(&mut tick, &mut shutdown).await {
            // The peers of the moment: nodes join and leave.
            let peers: Vec<(NodeId, Arc<AtomicUsize>)> = net
                .inner
                .links
                .load()
                .iter()
                .map(|(&id, l)| (id, l.pings_in_flight.clone()))
                .collect();
            for (peer, in_flight) in &peers {
                // A ping is sent every interval even while earlier ones wait for their
                // answers: on a loaded node an answer can take longer than an interval, and a
                // lease renewed only by every other ping would lapse between them. Each waits
                // three intervals at most, so a silent peer has at most three on their way.
                if in_flight.fetch_add(1, Ordering::Relaxed) >= PINGS_IN_FLIGHT {
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                    continue;
                }
                let (peer, in_flight) = (*peer, in_flight.clone());
                let (net, pinger) = (net.clone(), pinger.clone());
                tokio::spawn(async move {
                    let ping = pinger.ping(peer);
                    let sent = std::time::Instant::now();
                    let sent_ms = net.now_ms();
                    // An answer later than a few intervals is of no use to a lease.
                    let answer = net.call(peer, 0, Rpc::Ping(ping.clone()), every * 3).await;
                    if let Ok(RpcOk::Ping(ack)) = answer {
                        if let Some(l) = net.link(peer) {
                            l.ping_acked.fetch_max(sent_ms, Ordering::Relaxed);
                        }
                        pinger.answered(peer, sent, &ping, &ack);
                    }
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    });
}

/// Accepts peer connections and serves their requests with `handler`.
pub(crate) async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    net: Network,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            res = listener.accept() => {
                let Ok((stream, from)) = res else { continue };
                let _ = stream.set_nodelay(true);
                // The handshake runs on the connection's own task: a connection that says
                // nothing holds up no other.
                tokio::spawn(serve_peer(stream, from, handler.clone(), net.clone(), shutdown.clone()));
            }
            _ = shutdown.recv() => return,
        }
    }
}

async fn serve_peer<H: Handler>(
    stream: TcpStream,
    from: std::net::SocketAddr,
    handler: Arc<H>,
    net: Network,
    mut shutdown: Shutdown,
) {
    let faults = net.faults().clone();
    let from = from.to_string();
    let accepted = tokio::select! {
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, net.accept_link(stream)) => {
            r.unwrap_or_else(|_| Err("handshake timed out".to_string()))
        }
        _ = shutdown.recv() => return,
    };
    let (peer, rd, mut wr) = match accepted {
        Ok(link) => link,
        Err(why) => {
            net.note_refused(&from, &why);
            return;
        }
    };
    let mut rd = tokio::io::BufReader::with_capacity(PEER_READ_BUF, rd);
    let (tx, mut rx) = peer_queue();
    let writer = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(64 * 1024);
        while let Some(first) = rx.recv().await {
            rx.batch_after(first, &mut batch).await;
            if wr.write_all(&batch).await.is_err() {
                return;
            }
        }
    });
    let mut buf = Vec::new();
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut rd, &mut buf) => f,
            _ = shutdown.recv() => break,
        };
        let (id, group, rpc) = match frame {
            Ok(PeerFrame::Request { id, group, rpc }) => (id, group, rpc),
            Ok(PeerFrame::Response { .. }) => {
                net.note_refused(&from, &"a response where a request belongs");
                break;
            }
            Err(ReadError::Io(_)) => break,
            Err(e) => {
                net.note_refused(&from, &e);
                break;
            }
        };
        if faults.is_blocked(peer) {
            continue;
        }
        net.heard_from(peer);
        let handler = handler.clone();
        let tx = tx.clone();
        let net = net.clone();
        tokio::spawn(async move {
            let result = handler.handle(group, rpc).await;
            if net.faults().is_blocked(peer) {
                return;
            }
            let mut bytes = Vec::new();
            if encode(&PeerFrame::Response { id, result }, &mut bytes).is_ok()
                && let Err(QueueRefused::Full) = tx.push(bytes)
            {
                // The asker times out, as if the answer were lost.
                net.note_queue_full(peer, "an answer");
            }
        });
    }
    writer.abort();
}

fn unreachable(e: &CallError) -> Unreachable<TypeConfig> {
    Unreachable::from_string(e.to_string())
}

impl Network {
    /// One request-response RPC, with the expected kind of answer picked out by `pick`.
    async fn rpc<T>(
        &self,
        target: NodeId,
        group: GroupId,
        rpc: Rpc,
        option: &RPCOption,
        pick: fn(RpcOk) -> Option<T>,
    ) -> Result<T, RPCError<TypeConfig>> {
        match self.call(target, group, rpc, option.soft_ttl()).await {
            Ok(ok) => pick(ok)
                .ok_or_else(|| RPCError::Unreachable(unreachable(&CallError::UnexpectedAnswer))),
            Err(e) => Err(RPCError::Unreachable(unreachable(&e))),
        }
    }
}

impl GroupRouter<TypeConfig, GroupId> for Network {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &self,
        target: NodeId,
        group_id: GroupId,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.rpc(target, group_id, Rpc::Append(rpc), &option, |ok| match ok {
            RpcOk::Append(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn vote(
        &self,
        target: NodeId,
        group_id: GroupId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.rpc(target, group_id, Rpc::Vote(rpc), &option, |ok| match ok {
            RpcOk::Vote(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn pre_vote(
        &self,
        target: NodeId,
        group_id: GroupId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.rpc(
            target,
            group_id,
            Rpc::PreVote(rpc),
            &option,
            |ok| match ok {
                RpcOk::Vote(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn full_snapshot(
        &self,
        target: NodeId,
        group_id: GroupId,
        vote: Vote,
        snapshot: GroupSnapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let wire = GroupSnapshotWire {
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        let call = self.call(
            target,
            group_id,
            Rpc::Snapshot {
                vote,
                snapshot: wire,
            },
            option.hard_ttl(),
        );
        tokio::select! {
            r = call => match r {
                Ok(RpcOk::Snapshot(r)) => Ok(r),
                Ok(_) => Err(StreamingError::Unreachable(unreachable(&CallError::UnexpectedAnswer))),
                Err(e) => Err(StreamingError::Unreachable(unreachable(&e))),
            },
            closed = cancel => Err(StreamingError::Closed(closed)),
        }
    }

    async fn transfer_leader(
        &self,
        target: NodeId,
        group_id: GroupId,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.rpc(
            target,
            group_id,
            Rpc::TransferLeader(req),
            &option,
            |ok| match ok {
                RpcOk::TransferLeader(r) => Some(r),
                _ => None,
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_queue_refuses_past_its_byte_budget_and_takes_any_frame_when_empty() {
        let (tx, mut rx) = peer_queue();
        // A frame larger than the whole budget still goes when nothing else is queued.
        assert!(tx.push(vec![0; PEER_QUEUE_BYTES + 1]).is_ok());
        assert!(matches!(tx.push(vec![0; 1]), Err(QueueRefused::Full)));
        let mut batch = Vec::new();
        let first = rx.recv().await.unwrap();
        assert_eq!(rx.batch_after(first, &mut batch).await, 1);
        // Taken by the writer, its bytes no longer count.
        assert!(tx.push(vec![0; PEER_QUEUE_BYTES / 2]).is_ok());
        assert!(tx.push(vec![0; PEER_QUEUE_BYTES / 2]).is_ok());
        assert!(matches!(tx.push(vec![0; 1]), Err(QueueRefused::Full)));
        let (tx, rx) = peer_queue();
        drop(rx);
        assert!(matches!(tx.push(vec![0; 1]), Err(QueueRefused::Closed)));
        assert_eq!(tx.bytes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_peer_queue_refuses_past_its_frame_count() {
        let (tx, _rx) = peer_queue();
        for _ in 0..PEER_QUEUE_FRAMES {
            assert!(tx.push(vec![0; 8]).is_ok());
        }
        assert!(matches!(tx.push(vec![0; 8]), Err(QueueRefused::Full)));
        // A refused frame leaves the byte count as it was.
        assert_eq!(tx.bytes.load(Ordering::Relaxed), PEER_QUEUE_FRAMES * 8);
    }

    /// A message larger than a frame travels in several and comes back whole; a header over
    /// the cap is refused before anything is read or reserved for it.
    #[tokio::test]
    async fn large_messages_are_split_into_capped_frames() {
        let big = "x".repeat(FRAME_CAP * 2 + 17);
        let frame = PeerFrame::Response {
            id: 9,
            result: Err(PeerError::Raft(big.clone())),
        };
        let mut bytes = Vec::new();
        encode(&frame, &mut bytes).unwrap();
        let first = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        assert_eq!(first, FRAME_CAP as u32 | MORE_FRAMES);
        let mut buf = Vec::new();
        let back = read_frame(&mut bytes.as_slice(), &mut buf).await.unwrap();
        assert!(
            matches!(back, PeerFrame::Response { id: 9, result: Err(PeerError::Raft(s)) } if s == big)
        );
        let mut over = Vec::new();
        over.extend_from_slice(&(FRAME_CAP as u32 + 1).to_le_bytes());
        let mut buf = Vec::new();
        assert!(matches!(
            read_frame(&mut over.as_slice(), &mut buf).await,
            Err(ReadError::TooLarge(_))
        ));
        assert_eq!(buf.capacity(), 0);
    }

    fn wired_append() -> (AppendEntriesRequest<TypeConfig>, Vec<Vec<u8>>) {
        use crate::cluster::typ::Proposal;
        use openraft::entry::RaftEntry;
        let lid = |i| openraft::testing::log_id::<TypeConfig>(2, 1, i);
        let cmds = |k: &str| {
            vec![KeyCmd::IncrBy {
                key: bytes::Bytes::from(k.to_string()),
                delta: 3,
            }]
        };
        let entries = vec![
            Entry::new_normal(lid(5), Proposal::new(7, None, cmds("a"))),
            Entry::new_blank(lid(6)),
            Entry::new_normal(lid(7), Proposal::new(8, None, cmds("b"))),
        ];
        let plain: Vec<Vec<u8>> = entries
            .iter()
            .map(|e| bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap())
            .collect();
        let req = AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(lid(4)),
            entries,
            leader_commit: Some(lid(3)),
        };
        (req, plain)
    }

    /// An append whose entries carry their encoding (as the leader's log leaves them) is sent
    /// as exactly the bytes of the whole request encoded, and those bytes are copied, not
    /// encoded again; the follower gets each entry back with the bytes it came in.
    #[test]
    fn appends_carry_each_entry_as_encoded_once() {
        let (mut req, plain) = wired_append();
        let mut whole = Vec::new();
        encode(
            &PeerFrame::Request {
                id: 11,
                group: 4,
                rpc: Rpc::Append(req.clone()),
            },
            &mut whole,
        )
        .unwrap();
        // The first entry carries its encoding, the third does not: both ways give the same
        // bytes.
        set_wire(&mut req.entries[0], Some(plain[0].clone().into()));
        let mut spliced = Vec::new();
        encode_request(11, 4, Rpc::Append(req.clone()), &mut spliced).unwrap();
        assert_eq!(spliced, whole);

        let PeerFrame::Request { id, group, rpc } = decode_peer_frame(&spliced[4..]).unwrap()
        else {
            panic!("a request");
        };
        let Rpc::Append(back) = rpc else {
            panic!("an append")
        };
        assert_eq!((id, group), (11, 4));
        assert_eq!(back.vote, req.vote);
        assert_eq!(back.prev_log_id, req.prev_log_id);
        assert_eq!(back.leader_commit, req.leader_commit);
        assert_eq!(back.entries.len(), 3);
        for (i, e) in back.entries.iter().enumerate() {
            // A normal entry arrives decoded, with the bytes it came in; held as those bytes
            // alone, it refuses to be encoded anew, and decodes to the entry sent.
            let mut held = e.clone();
            crate::cluster::typ::keep_bytes_only(&mut held);
            assert_eq!(
                crate::cluster::typ::is_bytes_only(&held),
                i != 1,
                "entry {i}"
            );
            let as_held = bincode::serde::encode_to_vec(&held, bincode::config::standard());
            assert_eq!(as_held.is_err(), i != 1, "entry {i}");
            let full = crate::cluster::typ::decoded(held).unwrap();
            assert!(!crate::cluster::typ::is_bytes_only(&full));
            let again = bincode::serde::encode_to_vec(&full, bincode::config::standard()).unwrap();
            assert_eq!(again, plain[i], "entry {i}");
            let arrived = bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap();
            assert_eq!(arrived, plain[i], "entry {i}");
            // Its keys are views into its bytes, not copies, as it arrived and decoded again.
            let mut viewed = 0;
            for x in [e, &full] {
                if let (openraft::EntryPayload::Normal(p), Some(wire)) =
                    (&x.payload, crate::cluster::typ::wire_of(x))
                {
                    let within = wire.as_ptr_range();
                    for key in p.cmds.iter().filter_map(KeyCmd::single_key) {
                        assert!(within.contains(&key.as_ptr()), "entry {i}");
                        viewed += 1;
                    }
                    assert_eq!(p.cmds.len(), 1, "entry {i}");
                }
            }
            assert_eq!(viewed, if i == 1 { 0 } else { 2 }, "entry {i}");
            // A blank entry has nowhere to keep bytes; a normal one keeps what it came in.
            let kept = crate::cluster::typ::wire_of(e).map(|b| b.to_vec());
            assert_eq!(kept, (i != 1).then(|| plain[i].clone()), "entry {i}");
        }

        // The carried bytes are what is sent: an entry carrying another's encoding arrives
        // as that other entry.
        set_wire(&mut req.entries[0], Some(plain[2].clone().into()));
        let mut swapped = Vec::new();
        encode_request(11, 4, Rpc::Append(req), &mut swapped).unwrap();
        let Ok(PeerFrame::Request {
            rpc: Rpc::Append(back),
            ..
        }) = decode_peer_frame(&swapped[4..])
        else {
            panic!("an append");
        };
        assert_eq!(back.entries[0].log_id.index, 7);
    }

    /// An append announcing more entries than its bytes hold is refused, without room made
    /// for the count it announced.
    #[test]
    fn an_append_announcing_more_entries_than_it_holds_is_refused() {
        let (req, _) = wired_append();
        let mut bytes = Vec::new();
        put(&mut bytes, (REQUEST_VARIANT, 1u64, 2u32, APPEND_VARIANT)).unwrap();
        put(&mut bytes, (&req.vote, &req.prev_log_id, u64::MAX)).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        assert!(decode_peer_frame(&bytes).is_err());
        // However large the message, no more than 1 MiB of entries is set aside for the count.
        let most = (1 << 20) / std::mem::size_of::<Entry>();
        assert_eq!(entries_room(u64::MAX, MESSAGE_CAP), most);
        assert_eq!(entries_room(u64::MAX, 3), 3);
        assert_eq!(entries_room(2, MESSAGE_CAP), 2);
        // Cut anywhere, a real append is refused too.
        let mut whole = Vec::new();
        encode_request(1, 2, Rpc::Append(req), &mut whole).unwrap();
        for end in 4..whole.len() {
            assert!(decode_peer_frame(&whole[4..end]).is_err(), "cut at {end}");
        }
    }

    /// Every kind of message, as the bytes it goes out as (framed): nodes of one cluster
    /// speak this format to each other, so it changes only with a new protocol version.
    #[test]
    fn peer_frames_keep_their_encoding() {
        use crate::cluster::quiet::{Ping, PingAck};
        use crate::cluster::typ::SnapshotMeta;
        let vote = Vote::new_committed(2, 1);
        let lid = |i| openraft::testing::log_id::<TypeConfig>(2, 1, i);
        let (append, _) = wired_append();
        let req = |rpc| PeerFrame::Request {
            id: 300,
            group: 7,
            rpc,
        };
        let ok = |r| PeerFrame::Response {
            id: 300,
            result: Ok(r),
        };
        let err = |e| PeerFrame::Response {
            id: 300,
            result: Err(e),
        };
        let frames = [
            req(Rpc::Append(append)),
            req(Rpc::Vote(VoteRequest::new(vote, Some(lid(4))))),
            req(Rpc::PreVote(VoteRequest::new(vote, None))),
            req(Rpc::Snapshot {
                vote,
                snapshot: GroupSnapshotWire {
                    meta: SnapshotMeta::default(),
                    data: vec![1, 2, 3],
                },
            }),
            req(Rpc::TransferLeader(TransferLeaderRequest::new(
                vote,
                3,
                Some(lid(9)),
            ))),
            req(Rpc::Forward(vec![KeyCmd::IncrBy {
                key: bytes::Bytes::from_static(b"k"),
                delta: -2,
            }])),
            req(Rpc::Ping(Ping {
                from: 1,
                quiet: vec![(2, 5)],
                leads: vec![(3, 6)],
            })),
            req(Rpc::Scripts(ScriptsChange::Load(b"return 1".to_vec()))),
            req(Rpc::Scripts(ScriptsChange::Flush)),
            ok(RpcOk::Append(AppendEntriesResponse::Success)),
            ok(RpcOk::Vote(VoteResponse {
                vote,
                vote_granted: true,
                last_log_id: Some(lid(4)),
            })),
            ok(RpcOk::Snapshot(SnapshotResponse::new(vote))),
            ok(RpcOk::TransferLeader(Ok(()))),
            ok(RpcOk::Forward(vec![Reply::Int(7)])),
            ok(RpcOk::Ping(PingAck { promised: vec![2] })),
            ok(RpcOk::Scripts),
            err(PeerError::Refused(ProposeError::Moved(3))),
            err(PeerError::Refused(ProposeError::ClusterDown)),
            err(PeerError::Refused(ProposeError::TryAgain("t".into()))),
            err(PeerError::Refused(ProposeError::Removed)),
            err(PeerError::ShuttingDown),
            err(PeerError::NoReplica(7)),
            err(PeerError::VoteRefused(VoteRefusal::JustRestarted)),
            err(PeerError::VoteRefused(VoteRefusal::LedQuietly(4))),
            err(PeerError::VoteRefused(VoteRefusal::Promised {
                leader: 2,
                group: 5,
            })),
            err(PeerError::Raft("r".into())),
        ];
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let actual: Vec<String> = frames.into_iter().map(|f| hex(&framed(f))).collect();
        assert_eq!(actual, GOLDEN_FRAMES);
        // Each decodes to a message that goes out as the same bytes again.
        for (i, golden) in actual.iter().enumerate() {
            let bytes: Vec<u8> = (0..golden.len())
                .step_by(2)
                .map(|at| u8::from_str_radix(&golden[at..at + 2], 16).unwrap())
                .collect();
            let back = decode_peer_frame(&bytes[4..]).unwrap();
            assert_eq!(framed(back), bytes, "frame {i}");
        }
    }

    /// A message as it goes out: a request as `Network::call` encodes it, a response as
    /// `serve_peer` does.
    fn framed(frame: PeerFrame) -> Vec<u8> {
        let mut out = Vec::new();
        match frame {
            PeerFrame::Request { id, group, rpc } => {
                encode_request(id, group, rpc, &mut out).unwrap()
            }
            f => encode(&f, &mut out).unwrap(),
        }
        out
    }

    const GOLDEN_FRAMES: [&str; 26] = [
        "2c00000000fb2c0107000201010102010403020105010700010201610602010600020107010800010201620601020103",
        "0e00000000fb2c0107010201010102010400",
        "0b00000000fb2c0107020201010000",
        "1200000000fb2c010703020101000000000003010203",
        "0e00000000fb2c0107040201010301020109",
        "0b00000000fb2c0107050102016b03",
        "0d00000000fb2c01070601010205010306",
        "1000000000fb2c010707000872657475726e2031",
        "0700000000fb2c01070701",
        "0700000001fb2c01000000",
        "0e00000001fb2c0100010201010101020104",
        "0900000001fb2c010002020101",
        "0700000001fb2c01000300",
        "0900000001fb2c01000401020e",
        "0800000001fb2c0100050102",
        "0600000001fb2c010006",
        "0800000001fb2c0101000003",
        "0700000001fb2c01010001",
        "0900000001fb2c010100020174",
        "0700000001fb2c01010003",
        "0600000001fb2c010101",
        "0700000001fb2c01010207",
        "0700000001fb2c01010300",
        "0800000001fb2c0101030104",
        "0900000001fb2c010103020205",
        "0800000001fb2c0101040172",
    ];

    /// What a forwarding node acts on survives the trip: a redirect keeps its node, a reason
    /// its words.
    #[test]
    fn peer_errors_travel_intact() {
        let cfg = bincode::config::standard();
        for e in [
            PeerError::Refused(ProposeError::Moved(3)),
            PeerError::Refused(ProposeError::ClusterDown),
            PeerError::Refused(ProposeError::TryAgain("group 1 did not commit".into())),
            PeerError::ShuttingDown,
            PeerError::NoReplica(7),
            PeerError::VoteRefused(VoteRefusal::Promised {
                leader: 2,
                group: 5,
            }),
            PeerError::Raft("stopped".into()),
        ] {
            let bytes = bincode::serde::encode_to_vec(&e, cfg).unwrap();
            let (back, _): (PeerError, usize) =
                bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
            assert_eq!(back, e);
        }
        assert_eq!(PeerError::ShuttingDown.to_string(), "node is shutting down");
        assert_eq!(
            CallError::TimedOut(2, Duration::from_millis(700)).to_string(),
            "node 2 did not answer within 700ms"
        );
    }
}
