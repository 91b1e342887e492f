//! Takes in client connections: the accept loop deals them out to the shards, round-robin,
//! and each shard adopts its own, registers it for CLIENT LIST and serves it.

use super::conn::Conn;
use super::stream::ClientStream;
use super::{ClientInfo, ClientMeta, Node};
use crate::shard::{CoreRef, ShardMsg, Transport};
use crate::shutdown::Shutdown;
use crate::sync::lock;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Accepts connections until shutdown, refusing those past `maxclients`, and hands each to
/// the next shard's event loop.
pub(super) async fn accept_loop(
    node: Arc<Node>,
    listener: TcpListener,
    transport: Transport,
    mut shutdown: Shutdown,
) {
    let mut next = 0usize;
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _peer)) => {
                    node.stats.connections_received.fetch_add(1, Ordering::Relaxed);
                    if node.connected.load(Ordering::Relaxed) >= node.live.maxclients() {
                        node.stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        // A TLS client could not read the words before its handshake: it is
                        // only closed.
                        if transport == Transport::Plain {
                            tokio::spawn(async move {
                                let mut s = stream;
                                let _ = s.write_all(b"-ERR max number of clients reached\r\n").await;
                            });
                        }
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let std_stream = match stream.into_std() {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!("cannot hand over connection: {e}");
                            continue;
                        }
                    };
                    node.connected.fetch_add(1, Ordering::Relaxed);
                    let shard = &node.shards[next % node.shards.len()];
                    next = next.wrapping_add(1);
                    if shard.send(ShardMsg::Accept(std_stream, transport)).await.is_err() {
                        node.connected.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.recv() => break,
        }
    }
}

/// Makes a connection the acceptor handed to a shard a task of that shard's event loop: the
/// task that serves it, or `None` (and it is no longer counted) when the loop cannot take it.
pub(super) fn adopt(
    node: &Arc<Node>,
    core: &CoreRef,
    std_stream: std::net::TcpStream,
    transport: Transport,
    shutdown: Shutdown,
) -> Option<impl Future<Output = ()> + use<>> {
    match TcpStream::from_std(std_stream) {
        Ok(stream) => Some(serve_accepted(
            node.clone(),
            core.clone(),
            stream,
            transport,
            shutdown,
        )),
        Err(e) => {
            tracing::warn!("cannot adopt connection: {e}");
            node.connected.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }
}

/// How long a TLS client may take over its handshake before it is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves a connection the shard adopted: a TLS one after its handshake, which runs here on
/// the connection's own task (never on the accept loop), with a deadline.
async fn serve_accepted(
    node: Arc<Node>,
    core: CoreRef,
    stream: TcpStream,
    transport: Transport,
    shutdown: Shutdown,
) {
    let peer = stream.peer_addr().unwrap_or(node.addr);
    let laddr = stream.local_addr().unwrap_or(node.addr);
    let stream = match (transport, &node.tls_acceptor) {
        (Transport::Plain, _) => ClientStream::Plain(stream),
        (Transport::Tls, Some(acceptor)) => {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => ClientStream::Tls(Box::new(s)),
                Ok(Err(e)) => {
                    // A client's mistake, not the node's: not worth a warning each.
                    tracing::info!(%peer, "TLS handshake refused: {e}");
                    node.connected.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, "TLS handshake timed out");
                    node.connected.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        (Transport::Tls, None) => {
            node.connected.fetch_sub(1, Ordering::Relaxed);
            return;
        }
    };
    serve_connection(node, core, stream, peer, laddr, shutdown).await;
}

/// Serves one connection until it ends, with its entry in the node's client list.
async fn serve_connection(
    node: Arc<Node>,
    core: CoreRef,
    stream: ClientStream,
    peer: SocketAddr,
    laddr: SocketAddr,
    shutdown: Shutdown,
) {
    let shard = core.borrow().id;
    let info = register(&node, laddr, peer, shard);
    let mut conn = Conn::new(node.clone(), core, info.clone(), stream);
    if let Err(e) = conn.serve(shutdown).await {
        tracing::debug!(client = info.id, "connection closed: {e}");
    }
    lock(&node.clients).remove(&info.id);
    node.connected.fetch_sub(1, Ordering::Relaxed);
}

/// Adds a new connection to the node's client list.
fn register(node: &Node, laddr: SocketAddr, peer: SocketAddr, shard: usize) -> Arc<ClientInfo> {
    let id = node.next_client_id.fetch_add(1, Ordering::Relaxed);
    let info = Arc::new(ClientInfo {
        id,
        addr: peer,
        laddr,
        shard,
        created: Instant::now(),
        meta: Mutex::new(ClientMeta {
            user: "default".to_string(),
            resp: 2,
            ..ClientMeta::default()
        }),
        last_active_ms: AtomicU64::new(node.uptime_ms()),
        qbuf: AtomicU64::new(0),
        omem: AtomicU64::new(0),
        last_cmd: AtomicUsize::new(0),
        last_sub: AtomicUsize::new(0),
        kill_requested: std::sync::atomic::AtomicBool::new(false),
        kill_signal: tokio::sync::Notify::new(),
    });
    lock(&node.clients).insert(id, info.clone());
    info
}
