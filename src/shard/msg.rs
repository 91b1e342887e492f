//! How work reaches a shard: the messages it takes, the answers it gives, and the bounded
//! channel between (`ShardHandle` sends from any thread, `ShardInbox` is the shard's end).

use super::stats::ShardStats;
use crate::cmd::{KeyCmd, Reply};
use crate::store::Record;
use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError, bounded};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// Messages queued per shard before senders have to wait.
const QUEUE_DEPTH: usize = 4096;

pub enum ShardMsg {
    /// A connection's key commands for this shard (`slots[i]` is the hash slot of `cmds[i]`):
    /// applied at once on a standalone node, run until their replies pass `budget` bytes
    /// (the rest come back unrun); in a cluster, proposed to their groups and answered when
    /// the entries are applied.
    Keyed {
        cmds: Vec<KeyCmd>,
        slots: Vec<u16>,
        budget: usize,
        reply: oneshot::Sender<Answer>,
    },
    /// Commands applied to this shard's own copy of the keys at once, replicated or not
    /// (node-wide reads such as KEYS, and a standalone node's cross-shard commands).
    Batch {
        cmds: Vec<KeyCmd>,
        budget: usize,
        reply: oneshot::Sender<Answer>,
    },
    /// This node is a cluster member: from now on key commands are proposed to their
    /// groups. `run` tells this run's entries from earlier ones.
    Attach(std::sync::Arc<crate::cluster::Cluster>, u64),
    /// Commands of committed Raft entries, applied at each entry's time.
    ApplyAt {
        batches: Vec<crate::cluster::EntryBatch>,
        reply: oneshot::Sender<Vec<Vec<Reply>>>,
    },
    /// Copies out the keys of a slot range (a group's snapshot).
    Export {
        slots: (u16, u16),
        now: u64,
        reply: oneshot::Sender<Vec<Record>>,
    },
    /// Copies out every key of one partition of the store (a standalone node's snapshot,
    /// taken a partition at a time so the shard keeps serving meanwhile).
    ExportPart {
        part: usize,
        now: u64,
        reply: oneshot::Sender<Vec<Record>>,
    },
    /// Replaces the keys of a slot range (installing a group's snapshot).
    Import {
        slots: (u16, u16),
        records: Vec<Record>,
        reply: oneshot::Sender<()>,
    },
    /// Removes the keys of a slot range from one partition of the store (a group's replica
    /// moved away: cleared a partition at a time, so the shard keeps serving meanwhile).
    ClearPart {
        slots: (u16, u16),
        part: usize,
        reply: oneshot::Sender<()>,
    },
    /// Limit time on this shard must not fall below `at` (a standalone node's snapshot was
    /// saved at that time): it runs on from there.
    RaiseTime {
        at: u64,
        reply: oneshot::Sender<()>,
    },
    /// A new client connection to serve on this shard, from the plain or the TLS port.
    Accept(std::net::TcpStream, Transport),
    /// Lends the shard's store to a connection that runs a command over the keys of several
    /// shards of a standalone node: the shard sends it and waits, doing nothing else, until
    /// the `Lent` is dropped and the store comes back.
    Lend {
        reply: oneshot::Sender<Lent>,
    },
    /// The node's caps were switched on or off: start or stop counting this shard's keys in
    /// them now, before the reply, so the change is in force on every shard once all replied.
    SyncCaps {
        reply: oneshot::Sender<()>,
    },
    Stop,
}

/// A shard's answer to a batch: one reply per command it ran, in order, and the commands it
/// did not run because the replies had reached the batch's byte budget.
#[derive(Debug, Default)]
pub struct Answer {
    pub replies: Vec<Reply>,
    pub rest: Vec<KeyCmd>,
    /// In a cluster: why a group refused the batch (every command of that group's share
    /// answered with this error).
    pub refused: Option<String>,
    /// The first command of `rest` is a script that reached keys of other shards before it
    /// wrote anything: it runs again with every shard held.
    pub escalate: bool,
}

/// A shard's store, lent to the connection that holds it for one command over several
/// shards. The shard that lent it waits for it; dropping this sends it back, however the
/// borrower ends.
pub struct Lent {
    pub shard: usize,
    store: Option<crate::store::Store>,
    back: crossbeam_channel::Sender<crate::store::Store>,
}

impl Lent {
    pub(super) fn new(
        shard: usize,
        store: crate::store::Store,
        back: crossbeam_channel::Sender<crate::store::Store>,
    ) -> Lent {
        Lent {
            shard,
            store: Some(store),
            back,
        }
    }

    pub fn store(&mut self) -> Option<&mut crate::store::Store> {
        self.store.as_mut()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            // The lender waits on the other end for as long as this lives.
            let _ = self.back.send(store);
        }
    }
}

/// The sending side of a shard, shared by every thread.
#[derive(Clone)]
pub struct ShardHandle {
    pub id: usize,
    tx: Sender<ShardMsg>,
    wake: Arc<Notify>,
    pub stats: Arc<ShardStats>,
}

/// The shard is gone (the node is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGone;

impl ShardHandle {
    /// Queues a message and wakes the shard. A full queue makes the caller wait (yielding to
    /// other tasks) rather than grow without bound.
    pub async fn send(&self, mut msg: ShardMsg) -> Result<(), ShardGone> {
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => {
                    self.wake.notify_one();
                    return Ok(());
                }
                Err(TrySendError::Full(back)) => {
                    msg = back;
                    self.wake.notify_one();
                    tokio::task::yield_now().await;
                }
                Err(TrySendError::Disconnected(_)) => return Err(ShardGone),
            }
        }
    }

    /// Queues one batch to run until its replies pass `budget` bytes (`usize::MAX`: all of
    /// it); the receiver yields the answer.
    pub async fn submit(
        &self,
        cmds: Vec<KeyCmd>,
        budget: usize,
    ) -> Result<oneshot::Receiver<Answer>, ShardGone> {
        let (tx, rx) = oneshot::channel();
        self.send(ShardMsg::Batch {
            cmds,
            budget,
            reply: tx,
        })
        .await?;
        Ok(rx)
    }

    /// Queues a connection's key commands (see `ShardMsg::Keyed`).
    pub async fn submit_keyed(
        &self,
        cmds: Vec<KeyCmd>,
        slots: Vec<u16>,
        budget: usize,
    ) -> Result<oneshot::Receiver<Answer>, ShardGone> {
        let (tx, rx) = oneshot::channel();
        self.send(ShardMsg::Keyed {
            cmds,
            slots,
            budget,
            reply: tx,
        })
        .await?;
        Ok(rx)
    }

    /// Sends one batch, runs all of it, and waits for its replies.
    pub async fn call(&self, cmds: Vec<KeyCmd>) -> Result<Vec<Reply>, ShardGone> {
        let answer = self
            .ask(|reply| ShardMsg::Batch {
                cmds,
                budget: usize::MAX,
                reply,
            })
            .await?;
        Ok(answer.replies)
    }

    /// Sends the message `msg` builds around a reply channel, and waits for the reply:
    /// `shard.ask(|reply| ShardMsg::SyncCaps { reply }).await`.
    pub async fn ask<T>(
        &self,
        msg: impl FnOnce(oneshot::Sender<T>) -> ShardMsg,
    ) -> Result<T, ShardGone> {
        let (reply, rx) = oneshot::channel();
        self.send(msg(reply)).await?;
        rx.await.map_err(|_| ShardGone)
    }

    /// Asks the shard to stop; works from any thread, without a runtime.
    pub fn stop(&self) {
        // Stop must get through even when the queue is full of work.
        let mut msg = ShardMsg::Stop;
        for _ in 0..1000 {
            match self.tx.try_send(msg) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                Err(TrySendError::Full(back)) => {
                    msg = back;
                    self.wake.notify_one();
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        self.wake.notify_one();
    }
}

/// The receiving side of a shard, moved into its thread.
pub struct ShardInbox {
    rx: Receiver<ShardMsg>,
    wake: Arc<Notify>,
}

/// Creates the channel pair of one shard.
pub fn channel(id: usize) -> (ShardHandle, ShardInbox) {
    let (tx, rx) = bounded(QUEUE_DEPTH);
    let wake = Arc::new(Notify::new());
    (
        ShardHandle {
            id,
            tx,
            wake: wake.clone(),
            stats: Arc::new(ShardStats::default()),
        },
        ShardInbox { rx, wake },
    )
}

impl ShardInbox {
    /// The next message; waits on the event loop (not the thread) when the queue is empty.
    pub async fn recv(&self) -> Option<ShardMsg> {
        loop {
            match self.rx.try_recv() {
                Ok(m) => return Some(m),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => self.wake.notified().await,
            }
        }
    }
}

/// Which listener a client connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Plain,
    /// The TLS port: the shard runs the handshake before serving it.
    Tls,
}
