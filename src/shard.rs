//! Shard threads: each owns a disjoint part of the keyspace and applies batches of commands
//! to it, one batch at a time, so every command is atomic without a lock.
//!
//! Work arrives over a bounded crossbeam channel, one message per connection read carrying
//! every command of that read bound for this shard; the replies go back over a oneshot.

use crate::clock::Clock;
use crate::cmd::keyed::{self, ExecStats, KeyCmd, Reply};
use crate::store::Store;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Messages queued per shard before senders have to wait.
const QUEUE_DEPTH: usize = 4096;
/// How often an idle shard wakes up to expire keys.
const TICK: Duration = Duration::from_millis(10);
/// Parts of the table swept per tick (of `Store::parts()`), and the time budget for them.
const SWEEP_PARTS_PER_TICK: usize = 4;

pub enum ShardMsg {
    Batch {
        cmds: Vec<KeyCmd>,
        reply: oneshot::Sender<Vec<Reply>>,
    },
    Stop,
}

/// Figures a shard publishes for INFO; written only by the shard thread.
#[derive(Debug, Default)]
pub struct ShardStats {
    pub keys: AtomicU64,
    pub bytes: AtomicU64,
    pub commands: AtomicU64,
    pub checks: AtomicU64,
    pub denied: AtomicU64,
    pub expired: AtomicU64,
    pub rejected_full: AtomicU64,
    pub batches: AtomicU64,
}

/// The sending side of a shard, cloned into every connection.
#[derive(Clone)]
pub struct ShardHandle {
    pub id: usize,
    tx: Sender<ShardMsg>,
    pub stats: Arc<ShardStats>,
}

/// The shard is gone (the node is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGone;

impl ShardHandle {
    /// Queues one batch; the receiver yields its replies, one per command, in order. A full
    /// queue makes the caller wait (yielding to other tasks) rather than grow without bound.
    pub async fn submit(
        &self,
        cmds: Vec<KeyCmd>,
    ) -> Result<oneshot::Receiver<Vec<Reply>>, ShardGone> {
        let (tx, rx) = oneshot::channel();
        let mut msg = ShardMsg::Batch { cmds, reply: tx };
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => return Ok(rx),
                Err(TrySendError::Full(back)) => {
                    msg = back;
                    tokio::task::yield_now().await;
                }
                Err(TrySendError::Disconnected(_)) => return Err(ShardGone),
            }
        }
    }

    /// Sends one batch and waits for its replies.
    pub async fn call(&self, cmds: Vec<KeyCmd>) -> Result<Vec<Reply>, ShardGone> {
        self.submit(cmds).await?.await.map_err(|_| ShardGone)
    }

    pub fn stop(&self) {
        let _ = self.tx.send(ShardMsg::Stop);
    }
}

/// Settings every shard shares.
#[derive(Clone)]
pub struct ShardConfig {
    pub max_keys: usize,
    pub max_bytes: usize,
}

/// Starts `n` shard threads. The caps are split evenly between them.
pub fn spawn(
    n: usize,
    clock: Arc<dyn Clock>,
    cfg: &ShardConfig,
) -> std::io::Result<(Vec<ShardHandle>, Vec<JoinHandle<()>>)> {
    let mut handles = Vec::with_capacity(n);
    let mut threads = Vec::with_capacity(n);
    let per = |total: usize| {
        if total == 0 {
            0
        } else {
            total.div_ceil(n).max(1)
        }
    };
    for id in 0..n {
        let (tx, rx) = bounded(QUEUE_DEPTH);
        let stats = Arc::new(ShardStats::default());
        let store = Store::new(per(cfg.max_keys), per(cfg.max_bytes));
        let worker = Worker {
            rx,
            store,
            clock: clock.clone(),
            stats: stats.clone(),
            last_now: 0,
        };
        let t = std::thread::Builder::new()
            .name(format!("shard-{id}"))
            .spawn(move || worker.run())?;
        handles.push(ShardHandle { id, tx, stats });
        threads.push(t);
    }
    Ok((handles, threads))
}

struct Worker {
    rx: Receiver<ShardMsg>,
    store: Store,
    clock: Arc<dyn Clock>,
    stats: Arc<ShardStats>,
    last_now: u64,
}

impl Worker {
    /// The shard's notion of now: the injected clock, never running backward.
    fn now(&mut self) -> u64 {
        let n = self.clock.now_ns().max(self.last_now);
        self.last_now = n;
        n
    }

    fn run(mut self) {
        let mut next_sweep = Instant::now() + TICK;
        loop {
            let timeout = next_sweep.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(timeout) {
                Ok(ShardMsg::Batch { cmds, reply }) => {
                    let replies = self.apply(cmds);
                    // The connection may have gone away; its replies are then dropped.
                    let _ = reply.send(replies);
                }
                Ok(ShardMsg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= next_sweep {
                let now = self.now();
                self.store.sweep(now, SWEEP_PARTS_PER_TICK);
                self.publish();
                next_sweep = Instant::now() + TICK;
            }
        }
    }

    fn apply(&mut self, cmds: Vec<KeyCmd>) -> Vec<Reply> {
        let now = self.now();
        let mut st = ExecStats::default();
        let n = cmds.len() as u64;
        let replies: Vec<Reply> = cmds
            .into_iter()
            .map(|c| keyed::execute(&mut self.store, c, now, &mut st))
            .collect();
        let s = &self.stats;
        s.commands.fetch_add(n, Ordering::Relaxed);
        s.checks.fetch_add(st.checks, Ordering::Relaxed);
        s.denied.fetch_add(st.denied, Ordering::Relaxed);
        s.batches.fetch_add(1, Ordering::Relaxed);
        replies
    }

    fn publish(&self) {
        let u = &self.store.usage;
        let s = &self.stats;
        s.keys.store(u.keys as u64, Ordering::Relaxed);
        s.bytes.store(u.bytes as u64, Ordering::Relaxed);
        s.expired.store(u.expired, Ordering::Relaxed);
        s.rejected_full.store(u.rejected_full, Ordering::Relaxed);
    }
}
