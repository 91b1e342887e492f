//! The listening side: accepts peer connections and serves their requests. Each request is
//! served on its own task, so a slow snapshot install never holds up another group's
//! heartbeat; the answers go back through the connection's own bounded queue.

use super::frame::{PEER_READ_BUF, ReadError};
use super::handshake::{HANDSHAKE_TIMEOUT, LinkError, PeerWriter};
use super::message::{PeerError, PeerFrame, Rpc, RpcOk};
use super::network::Network;
use super::queue::{QueueRefused, QueueRx, QueueTx, peer_queue};
use super::wire::{encode, read_frame};
use crate::ids::{GroupId, NodeId};
use crate::shutdown::Shutdown;
use std::future::Future;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Serves requests that peers send to this node.
pub(crate) trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        group: GroupId,
        rpc: Rpc,
    ) -> impl Future<Output = Result<RpcOk, PeerError>> + Send;
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

/// Serves one peer connection (from `from`): its handshake, then its requests until it
/// closes, sends what is not a request, or the node stops.
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
            r.unwrap_or(Err(LinkError::TimedOut))
        }
        _ = shutdown.recv() => return,
    };
    let (peer, rd, wr) = match accepted {
        Ok(link) => link,
        Err(why) => {
            net.note_refused(&from, &why);
            return;
        }
    };
    let mut rd = tokio::io::BufReader::with_capacity(PEER_READ_BUF, rd);
    let (tx, rx) = peer_queue();
    let writer = spawn_writer(rx, wr);
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
        tokio::spawn(answer(
            handler.clone(),
            net.clone(),
            tx.clone(),
            peer,
            (id, group, rpc),
        ));
    }
    writer.abort();
}

/// Writes the answers queued for a peer, in batches, until the connection fails.
fn spawn_writer(mut rx: QueueRx, mut wr: PeerWriter) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(64 * 1024);
        while let Some(first) = rx.recv().await {
            rx.batch_after(first, &mut batch).await;
            if wr.write_all(&batch).await.is_err() {
                return;
            }
        }
    })
}

/// Serves one request (`id`, for `group`) from `peer` and queues its answer.
async fn answer<H: Handler>(
    handler: Arc<H>,
    net: Network,
    tx: QueueTx,
    peer: NodeId,
    (id, group, rpc): (u64, GroupId, Rpc),
) {
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
}
