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
//! Frames are `u32` length-prefixed bincode. `Faults` lets tests cut links to simulate a
//! partition: a blocked peer's messages are dropped in both directions.

use crate::cluster::quiet::{Ping, PingAck};
use crate::cluster::typ::{GroupId, GroupSnapshot, NodeId, TypeConfig, Vote};
use crate::cmd::keyed::{KeyCmd, Reply};
use crate::shutdown::Shutdown;
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// What one read from a peer's connection takes in at most.
const PEER_READ_BUF: usize = 64 * 1024;

/// Largest frame accepted from a peer (snapshots of a large group included).
const MAX_FRAME: usize = 1 << 30;

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
}

#[derive(Serialize, Deserialize)]
enum Frame {
    Request {
        id: u64,
        group: GroupId,
        rpc: Rpc,
    },
    Response {
        id: u64,
        result: Result<RpcOk, String>,
    },
}

fn encode(frame: &Frame, out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    bincode::serde::encode_into_std_write(frame, out, bincode::config::standard())
        .map_err(|e| e.to_string())?;
    let len = u32::try_from(out.len() - start - 4).map_err(|_| "frame too large".to_string())?;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

async fn read_frame(
    r: &mut (impl AsyncReadExt + Unpin),
    buf: &mut Vec<u8>,
) -> std::io::Result<Frame> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other("peer frame too large"));
    }
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    bincode::serde::decode_from_slice(buf, bincode::config::standard())
        .map(|(f, _)| f)
        .map_err(std::io::Error::other)
}

/// Links that tests have cut.
#[derive(Default)]
pub struct Faults {
    blocked: RwLock<HashSet<NodeId>>,
}

impl Faults {
    pub fn block(&self, peer: NodeId) {
        self.blocked
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(peer);
    }

    pub fn unblock(&self, peer: NodeId) {
        self.blocked
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&peer);
    }

    pub fn heal(&self) {
        self.blocked
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    pub fn is_blocked(&self, peer: NodeId) -> bool {
        self.blocked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&peer)
    }
}

/// Serves requests that peers send to this node.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        group: GroupId,
        rpc: Rpc,
    ) -> impl Future<Output = Result<RpcOk, String>> + Send;
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<RpcOk, String>>>>>;

/// The outgoing connection to one peer.
struct PeerLink {
    addr: String,
    tx: Mutex<Option<mpsc::UnboundedSender<Vec<u8>>>>,
    pending: Pending,
}

/// This node's side of the mesh: one link per peer. Cheap to clone.
#[derive(Clone)]
pub struct Network {
    inner: Arc<NetworkInner>,
}

struct NetworkInner {
    me: NodeId,
    links: HashMap<NodeId, PeerLink>,
    /// When each peer was last heard from (a request or a response), in ms since `born`.
    heard: HashMap<NodeId, AtomicU64>,
    /// When a connection to each peer last failed (refused, reset, timed out), likewise.
    failed: HashMap<NodeId, AtomicU64>,
    /// When the latest ping that each peer answered was sent, likewise: the peer was up and
    /// agreed to what the answer says at least from then on.
    ping_acked: HashMap<NodeId, AtomicU64>,
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
}

impl Network {
    /// `peers` maps every other node to its peer address.
    pub fn new(
        me: NodeId,
        peers: &[(NodeId, String)],
        faults: Arc<Faults>,
        shutdown: Shutdown,
    ) -> Network {
        let links = peers
            .iter()
            .filter(|(id, _)| *id != me)
            .map(|(id, addr)| {
                (
                    *id,
                    PeerLink {
                        addr: addr.clone(),
                        tx: Mutex::new(None),
                        pending: Arc::new(Mutex::new(HashMap::new())),
                    },
                )
            })
            .collect();
        // One time stamp per peer, 0 until it is first set.
        let stamps = || -> HashMap<NodeId, AtomicU64> {
            peers
                .iter()
                .filter(|(id, _)| *id != me)
                .map(|(id, _)| (*id, AtomicU64::new(0)))
                .collect()
        };
        let (heard, failed, ping_acked) = (stamps(), stamps(), stamps());
        let local_ip = peers
            .iter()
            .find(|(id, _)| *id == me)
            .and_then(|(_, addr)| addr.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        Network {
            inner: Arc::new(NetworkInner {
                me,
                links,
                heard,
                failed,
                ping_acked,
                local_ip,
                born: std::time::Instant::now(),
                next_id: AtomicU64::new(1),
                faults,
                shutdown,
                frames_sent: AtomicU64::new(0),
                writes: AtomicU64::new(0),
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

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.born.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Notes that `peer` just said something.
    fn heard_from(&self, peer: NodeId) {
        if let Some(at) = self.inner.heard.get(&peer) {
            at.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Notes that a connection to `peer` just failed.
    fn failed_with(&self, peer: NodeId) {
        if let Some(at) = self.inner.failed.get(&peer) {
            at.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    fn stamp(map: &HashMap<NodeId, AtomicU64>, peer: NodeId) -> u64 {
        map.get(&peer).map_or(0, |a| a.load(Ordering::Relaxed))
    }

    /// How long ago `peer` was last heard from; `None` if never (or it is not a peer).
    pub fn last_heard(&self, peer: NodeId) -> Option<Duration> {
        let at = Self::stamp(&self.inner.heard, peer);
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
        let heard = Self::stamp(&self.inner.heard, peer);
        let failed = Self::stamp(&self.inner.failed, peer);
        let within = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        heard != 0 && heard > failed && self.now_ms().saturating_sub(heard) <= within
    }

    /// How long ago the latest ping `peer` answered was sent; `None` if it never answered one.
    pub fn last_ping_acked(&self, peer: NodeId) -> Option<Duration> {
        let at = Self::stamp(&self.inner.ping_acked, peer);
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
        self.inner
            .links
            .get(&peer)
            .is_some_and(|l| lock(&l.tx).as_ref().is_some_and(|t| !t.is_closed()))
    }

    /// Number of open outgoing connections (one per peer at most).
    pub fn open_links(&self) -> usize {
        self.inner
            .links
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
    ) -> Result<RpcOk, String> {
        if self.inner.faults.is_blocked(target) {
            return Err(format!("link to node {target} is cut"));
        }
        let link = self
            .inner
            .links
            .get(&target)
            .ok_or_else(|| format!("unknown node {target}"))?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut bytes = Vec::new();
        encode(&Frame::Request { id, group, rpc }, &mut bytes)?;
        let (tx, rx) = oneshot::channel();
        lock(&link.pending).insert(id, tx);
        let sender = self.sender(target, link);
        if sender.send(bytes).is_err() {
            lock(&link.pending).remove(&id);
            return Err(format!("connection to node {target} closed"));
        }
        match tokio::time::timeout(ttl, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(format!("connection to node {target} lost")),
            Err(_) => {
                lock(&link.pending).remove(&id);
                Err(format!("node {target} did not answer within {ttl:?}"))
            }
        }
    }

    /// The queue of the link's writer, starting the connection if there is none.
    fn sender(&self, target: NodeId, link: &PeerLink) -> mpsc::UnboundedSender<Vec<u8>> {
        let mut slot = lock(&link.tx);
        if let Some(tx) = slot.as_ref()
            && !tx.is_closed()
        {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        *slot = Some(tx.clone());
        let net = self.clone();
        let addr = link.addr.clone();
        let pending = link.pending.clone();
        tokio::spawn(async move { net.run_link(target, addr, rx, pending).await });
        tx
    }

    /// Owns one connection: writes queued frames in batches, reads responses. When the
    /// connection fails every waiting request fails with it, and the next request reconnects.
    async fn run_link(
        self,
        target: NodeId,
        addr: String,
        mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
        pending: Pending,
    ) {
        let fail_all = |why: &str| {
            for (_, tx) in lock(&pending).drain() {
                let _ = tx.send(Err(why.to_string()));
            }
        };
        let stream =
            match tokio::time::timeout(Duration::from_millis(500), self.connect_from_home(&addr))
                .await
            {
                Ok(Ok(s)) => s,
                _ => {
                    rx.close();
                    self.failed_with(target);
                    fail_all(&format!("cannot connect to node {target} at {addr}"));
                    return;
                }
            };
        let _ = stream.set_nodelay(true);
        let (rd, mut wr) = stream.into_split();
        // Buffered: one read takes in every frame that has arrived, instead of two system
        // calls (length, then body) per frame.
        let mut rd = tokio::io::BufReader::with_capacity(PEER_READ_BUF, rd);
        // Say who we are, so the peer can apply link faults to us.
        if wr.write_all(&self.inner.me.to_le_bytes()).await.is_err() {
            fail_all("handshake failed");
            return;
        }
        let reader_pending = pending.clone();
        let net = self.clone();
        let mut reader = tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                match read_frame(&mut rd, &mut buf).await {
                    Ok(Frame::Response { id, result }) => {
                        if net.inner.faults.is_blocked(target) {
                            continue;
                        }
                        net.heard_from(target);
                        if let Some(tx) = lock(&reader_pending).remove(&id) {
                            let _ = tx.send(result);
                        }
                    }
                    Ok(Frame::Request { .. }) => {}
                    Err(_) => return,
                }
            }
        });
        let mut shutdown = self.inner.shutdown.clone();
        let mut batch = Vec::with_capacity(64 * 1024);
        loop {
            tokio::select! {
                msg = rx.recv() => {
                    let Some(first) = msg else { break };
                    batch.clear();
                    batch.extend_from_slice(&first);
                    // Let the other groups' tasks that are ready run first, so what they queue
                    // for this peer rides in the same write.
                    tokio::task::yield_now().await;
                    let mut n = 1;
                    while batch.len() < 1 << 20 {
                        match rx.try_recv() {
                            Ok(more) => { batch.extend_from_slice(&more); n += 1; }
                            Err(_) => break,
                        }
                    }
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
        fail_all(&format!("connection to node {target} closed"));
    }
}

/// Builds the node-level pings and takes their answers.
pub trait Pinger: Send + Sync + 'static {
    /// The ping to send `peer` now.
    fn ping(&self, peer: NodeId) -> Ping;
    /// `peer` answered `ping`, which was sent at `sent`.
    fn answered(&self, peer: NodeId, sent: std::time::Instant, ping: &Ping, ack: &PingAck);
}

/// Pings every peer every `every` until the node stops, all peers at the same moment (so
/// that the promises a quiet leader's followers make run out together), with at most one
/// ping in flight per peer. An answer counts from when its ping was sent (the peer answered
/// some moment after that), and like any response it counts as hearing from the peer.
pub fn ping_peers<P: Pinger>(
    net: &Network,
    pinger: Arc<P>,
    every: Duration,
    handle: &tokio::runtime::Handle,
) {
    let net = net.clone();
    let peers: Vec<(NodeId, Arc<std::sync::atomic::AtomicBool>)> = net
        .inner
        .links
        .keys()
        .map(|&id| (id, Arc::new(std::sync::atomic::AtomicBool::new(false))))
        .collect();
    let mut shutdown = net.inner.shutdown.clone();
    handle.spawn(async move {
        let mut tick = super::ticker(every);
        while super::next_tick(&mut tick, &mut shutdown).await {
            for (peer, in_flight) in &peers {
                if in_flight.swap(true, Ordering::Relaxed) {
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
                        if let Some(at) = net.inner.ping_acked.get(&peer) {
                            at.fetch_max(sent_ms, Ordering::Relaxed);
                        }
                        pinger.answered(peer, sent, &ping, &ack);
                    }
                    in_flight.store(false, Ordering::Relaxed);
                });
            }
        }
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts peer connections and serves their requests with `handler`.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    net: Network,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            res = listener.accept() => {
                let Ok((stream, _)) = res else { continue };
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_peer(stream, handler.clone(), net.clone(), shutdown.clone()));
            }
            _ = shutdown.recv() => return,
        }
    }
}

async fn serve_peer<H: Handler>(
    stream: TcpStream,
    handler: Arc<H>,
    net: Network,
    mut shutdown: Shutdown,
) {
    let faults = net.faults().clone();
    let (rd, mut wr) = stream.into_split();
    let mut rd = tokio::io::BufReader::with_capacity(PEER_READ_BUF, rd);
    let mut who = [0u8; 8];
    if rd.read_exact(&mut who).await.is_err() {
        return;
    }
    let peer = u64::from_le_bytes(who);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(64 * 1024);
        while let Some(first) = rx.recv().await {
            batch.clear();
            batch.extend_from_slice(&first);
            tokio::task::yield_now().await;
            while batch.len() < 1 << 20 {
                match rx.try_recv() {
                    Ok(more) => batch.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
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
        let Ok(Frame::Request { id, group, rpc }) = frame else {
            break;
        };
        if faults.is_blocked(peer) {
            continue;
        }
        net.heard_from(peer);
        let handler = handler.clone();
        let tx = tx.clone();
        let faults = faults.clone();
        tokio::spawn(async move {
            let result = handler.handle(group, rpc).await;
            if faults.is_blocked(peer) {
                return;
            }
            let mut bytes = Vec::new();
            if encode(&Frame::Response { id, result }, &mut bytes).is_ok() {
                let _ = tx.send(bytes);
            }
        });
    }
    writer.abort();
}

fn unreachable(msg: String) -> Unreachable<TypeConfig> {
    Unreachable::from_string(msg)
}

fn unexpected() -> String {
    "unexpected response type".to_string()
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
            Ok(ok) => pick(ok).ok_or_else(|| RPCError::Unreachable(unreachable(unexpected()))),
            Err(e) => Err(RPCError::Unreachable(unreachable(e))),
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
                Ok(_) => Err(StreamingError::Unreachable(unreachable(unexpected()))),
                Err(e) => Err(StreamingError::Unreachable(unreachable(e))),
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
