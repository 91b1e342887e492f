//! This node's side of the mesh (`Network`): one outgoing link per peer, opened on the first
//! message sent to it and reopened after a failure, what is known of each peer's liveness,
//! and the calls made over the links, openraft's among them (`GroupRouter`).
//!
//! Any number of requests are in flight on a link at once, each with its own id, and their
//! answers may come back in any order. A link's writer drains everything queued for the peer
//! into one buffer and writes it with one syscall, so heartbeats and appends of many groups
//! travel together.

use super::fault::Faults;
use super::frame::{PEER_READ_BUF, ReadError};
use super::handshake::{HANDSHAKE_TIMEOUT, LinkError, PeerReader, PeerSecurity, PeerWriter};
use super::message::{GroupSnapshotWire, PeerError, PeerFrame, Rpc, RpcOk};
use super::queue::{QueueRefused, QueueRx, QueueTx, peer_queue};
use super::stats::LinkStats;
use super::wire::{EncodeError, encode_request, read_frame, size_hint};
use crate::cluster::typ::{GroupId, GroupSnapshot, NodeId, TypeConfig, Vote};
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
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long connecting to a peer may take, before its handshake (`HANDSHAKE_TIMEOUT`).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a call to a peer brought no result: it never reached the peer, its answer never came
/// back, or the peer answered with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Tests cut the link to the peer.
    Cut(NodeId),
    /// The node is not a peer of this one.
    UnknownNode(NodeId),
    /// The request could not be encoded.
    Encode(EncodeError),
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
            CallError::Encode(e) => e.fmt(f),
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

impl From<EncodeError> for CallError {
    fn from(e: EncodeError) -> CallError {
        CallError::Encode(e)
    }
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

    /// Whether its connection is open now.
    fn is_open(&self) -> bool {
        lock(&self.tx).as_ref().is_some_and(|t| !t.is_closed())
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
    security: PeerSecurity,
    stats: LinkStats,
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
                security,
                stats: LinkStats::default(),
            }),
        }
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.inner.faults
    }

    /// The node's shutdown signal, for the tasks that serve the network.
    pub(super) fn shutdown(&self) -> Shutdown {
        self.inner.shutdown.clone()
    }

    /// (frames sent, write syscalls) so far.
    pub fn batching(&self) -> (u64, u64) {
        self.inner.stats.batching()
    }

    /// Frames not sent so far because their peer's queue was full.
    pub fn queue_full_drops(&self) -> u64 {
        self.inner.stats.queue_full_drops()
    }

    /// Counts a frame (`what`) refused by `peer`'s full queue, and says so in the log now and
    /// then.
    pub(super) fn note_queue_full(&self, peer: NodeId, what: &str) {
        self.inner.stats.note_queue_full(peer, what, self.now_ms());
    }

    /// Peer connections refused so far.
    pub fn refused_connections(&self) -> u64 {
        self.inner.stats.refused_connections()
    }

    /// Counts a refused peer connection, from or to the address `peer`, and logs it.
    pub(super) fn note_refused(&self, peer: &str, why: &dyn std::fmt::Display) {
        self.inner.stats.note_refused(peer, why, self.now_ms());
    }

    /// Opens the secured connection to `target` at `addr`: TLS if the cluster uses it, then
    /// the handshake. Its halves are ready for frames.
    async fn open_link(
        &self,
        target: NodeId,
        addr: &str,
    ) -> Result<(PeerReader, PeerWriter), LinkError> {
        let stream = self
            .connect_from_home(addr)
            .await
            .map_err(LinkError::Connect)?;
        let _ = stream.set_nodelay(true);
        self.inner
            .security
            .dial(stream, addr, self.inner.me, target)
            .await
    }

    /// Takes in a new peer connection: TLS if the cluster uses it, then the handshake. The
    /// peer's node id and the connection's halves.
    pub(super) async fn accept_link(
        &self,
        stream: TcpStream,
    ) -> Result<(NodeId, PeerReader, PeerWriter), LinkError> {
        self.inner.security.accept(stream, self.inner.me).await
    }

    /// Milliseconds since the network was made, at least 1 (0 stands for "never").
    pub(super) fn now_ms(&self) -> u64 {
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

    /// Every peer this node knows now, with the count of its pings that wait for answers.
    pub(super) fn ping_slots(&self) -> Vec<(NodeId, Arc<AtomicUsize>)> {
        self.inner
            .links
            .load()
            .iter()
            .map(|(&id, l)| (id, l.pings_in_flight.clone()))
            .collect()
    }

    /// Notes that `peer` answered a ping sent at `sent_ms` (see `now_ms`).
    pub(super) fn ping_answered(&self, peer: NodeId, sent_ms: u64) {
        if let Some(l) = self.link(peer) {
            l.ping_acked.fetch_max(sent_ms, Ordering::Relaxed);
        }
    }

    /// Notes that `peer` just said something.
    pub(super) fn heard_from(&self, peer: NodeId) {
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
        self.link(peer).is_some_and(|l| l.is_open())
    }

    /// Number of open outgoing connections (one per peer at most).
    pub fn open_links(&self) -> usize {
        self.inner
            .links
            .load()
            .values()
            .filter(|l| l.is_open())
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
            CONNECT_TIMEOUT + HANDSHAKE_TIMEOUT,
            self.open_link(target, &addr),
        )
        .await
        .unwrap_or(Err(LinkError::TimedOut));
        let (rd, wr) = match opened {
            Ok(halves) => halves,
            Err(why) => {
                rx.close();
                self.failed_with(target);
                if let LinkError::Connect(_) = why {
                    fail_all(CallError::CannotConnect(target, addr));
                } else {
                    self.note_refused(&addr, &why);
                    fail_all(CallError::Handshake);
                }
                return;
            }
        };
        let reader = tokio::spawn(
            self.clone()
                .read_answers(target, addr, rd, in_flight.clone()),
        );
        self.write_queued(target, &mut rx, wr, reader).await;
        fail_all(CallError::Closed(target));
    }

    /// Writes what is queued for `target`, in batches, until the write fails, the reader sees
    /// the connection close or the node stops; then closes the queue and stops the reader.
    async fn write_queued(
        &self,
        target: NodeId,
        rx: &mut QueueRx,
        mut wr: PeerWriter,
        mut reader: JoinHandle<()>,
    ) {
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
                    self.inner.stats.note_write(n);
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
    }

    /// Reads the answers `target` sends on the link this node opened to it (at `addr`), and
    /// hands each to the request that waits for it, until the connection closes or sends
    /// what is not an answer.
    async fn read_answers(self, target: NodeId, addr: String, rd: PeerReader, in_flight: InFlight) {
        // Buffered: one read takes in every frame that has arrived, instead of two system
        // calls (length, then body) per frame.
        let mut rd = tokio::io::BufReader::with_capacity(PEER_READ_BUF, rd);
        let mut buf = Vec::new();
        loop {
            match read_frame(&mut rd, &mut buf).await {
                Ok(PeerFrame::Response { id, result }) => {
                    if self.inner.faults.is_blocked(target) {
                        continue;
                    }
                    self.heard_from(target);
                    if let Some(tx) = lock(&in_flight).remove(&id) {
                        let _ = tx.send(result.map_err(CallError::Peer));
                    }
                }
                Ok(PeerFrame::Request { .. }) => {}
                Err(ReadError::Io(_)) => return,
                Err(e) => {
                    self.note_refused(&addr, &e);
                    return;
                }
            }
        }
    }

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

/// What openraft is told of a call that brought no answer: the peer counts as unreachable,
/// and openraft backs off before it sends to it again.
fn unreachable(e: &CallError) -> Unreachable<TypeConfig> {
    Unreachable::from_string(e.to_string())
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

    /// What a call says when it fails is what the node logs and, for a forwarded batch, what
    /// the client reads after `TRYAGAIN`.
    #[test]
    fn call_errors_say_what_happened() {
        assert_eq!(
            CallError::TimedOut(2, Duration::from_millis(700)).to_string(),
            "node 2 did not answer within 700ms"
        );
        assert_eq!(
            CallError::Encode(EncodeError::TooLarge(5)).to_string(),
            "message of 5 bytes is larger than a peer takes"
        );
        assert_eq!(
            CallError::Peer(PeerError::NoReplica(3)).to_string(),
            "no replica of group 3 here"
        );
    }
}
