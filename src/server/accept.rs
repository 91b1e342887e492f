//! Takes in client connections: the accept loop deals them out to the shards, round-robin,
//! and each shard adopts its own, registers it for CLIENT LIST and serves it.

use super::conn::Conn;
use super::{ClientInfo, ClientMeta, Node};
use crate::shard::{CoreRef, ShardMsg};
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
pub(super) async fn accept_loop(node: Arc<Node>, listener: TcpListener, mut shutdown: Shutdown) {
    let mut next = 0usize;
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _peer)) => {
                    node.stats.connections_received.fetch_add(1, Ordering::Relaxed);
                    if node.connected.load(Ordering::Relaxed) >= node.live.maxclients() {
                        node.stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(async move {
                            let mut s = stream;
                            let _ = s.write_all(b"-ERR max number of clients reached\r\n").await;
                        });
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
                    if shard.send(ShardMsg::Accept(std_stream)).await.is_err() {
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
    shutdown: Shutdown,
) -> Option<impl Future<Output = ()> + use<>> {
    match TcpStream::from_std(std_stream) {
        Ok(stream) => Some(serve_connection(
            node.clone(),
            core.clone(),
            stream,
            shutdown,
        )),
        Err(e) => {
            tracing::warn!("cannot adopt connection: {e}");
            node.connected.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }
}

/// Serves one connection until it ends, with its entry in the node's client list.
async fn serve_connection(node: Arc<Node>, core: CoreRef, stream: TcpStream, shutdown: Shutdown) {
    let peer = stream.peer_addr().unwrap_or(node.addr);
    let shard = core.borrow().id;
    let info = register(&node, &stream, peer, shard);
    let mut conn = Conn::new(node.clone(), core, info.clone(), stream);
    if let Err(e) = conn.serve(shutdown).await {
        tracing::debug!(client = info.id, "connection closed: {e}");
    }
    lock(&node.clients).remove(&info.id);
    node.connected.fetch_sub(1, Ordering::Relaxed);
}

/// Adds a new connection to the node's client list.
fn register(node: &Node, stream: &TcpStream, peer: SocketAddr, shard: usize) -> Arc<ClientInfo> {
    let id = node.next_client_id.fetch_add(1, Ordering::Relaxed);
    let info = Arc::new(ClientInfo {
        id,
        addr: peer,
        laddr: stream.local_addr().unwrap_or(node.addr),
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
