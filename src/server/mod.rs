//! The node: accepts connections and serves them on the shard threads.
//!
//! Each accepted connection is placed on one shard's event loop, round-robin. Its task is the
//! coordinator for its client: it parses every request one read delivered, runs the commands
//! its own shard owns inline, sends every other shard one batch with its share, and writes
//! all replies back, in request order, with one write. Commands that change how later replies
//! are encoded (HELLO), that gate later commands (AUTH), or that span shards act as barriers:
//! the round so far is flushed first, so order is kept.

mod cluster_cmds;
mod conn;
mod info;
mod live;
mod node_cmds;

pub use live::LiveSettings;

use crate::clock::Clock;
use crate::cluster::node::Cluster;
use crate::cmd::keyed::{KeyCmd, LimitReply, Reply, summarize};
use crate::cmd::{MultiCmd, NodeCmd, table};
use crate::config::Settings;
use crate::protocol::{ArgError, ReplyWriter};
use crate::rules::RuleStore;
use crate::shard::{
    self, Answer, CoreRef, ShardCore, ShardGone, ShardHandle, ShardInbox, ShardMsg,
};
use crate::slot::key_slot;
use crate::store::Store;
use bytes::Bytes;
use conn::Conn;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Version reported to clients that gate features on the Redis version.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Node-wide counters.
#[derive(Default)]
pub struct NodeStats {
    pub connections_received: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Clients closed because all clients' buffers passed `maxmemory-clients`.
    pub evicted_clients: AtomicU64,
    pub checks_per_sec: AtomicU64,
    pub commands_per_sec: AtomicU64,
}

/// What CLIENT LIST and CLIENT INFO show about one connection.
pub struct ClientInfo {
    pub id: u64,
    pub addr: SocketAddr,
    pub laddr: SocketAddr,
    pub shard: usize,
    pub created: Instant,
    pub meta: Mutex<ClientMeta>,
    /// Milliseconds since the node started, at the last request.
    pub last_active_ms: AtomicU64,
    /// Bytes received and not yet handled (Redis's `qbuf`).
    pub qbuf: AtomicU64,
    /// Bytes of replies produced and not yet written to the socket (Redis's `omem`).
    pub omem: AtomicU64,
    /// The last command run: its index in `cmd::table::COMMANDS` plus one (0: none yet).
    pub last_cmd: AtomicUsize,
    /// The last subcommand of a container command (CLIENT LIST...), as an index into the
    /// node commands' subcommand list plus one (0: none).
    pub last_sub: AtomicUsize,
    /// Set once by CLIENT KILL (or the idle timeout); the connection closes when it sees it.
    kill_requested: std::sync::atomic::AtomicBool,
    /// Wakes the connection when `kill_requested` is set (`ClientInfo::killed`).
    kill_signal: tokio::sync::Notify,
}

#[derive(Default, Clone)]
pub struct ClientMeta {
    pub name: String,
    pub lib_name: String,
    pub lib_ver: String,
    pub resp: u8,
}

/// Everything the shard threads share.
pub struct Node {
    /// The settings the node started with.
    pub settings: Settings,
    /// The current values of the settings CONFIG SET changes.
    pub live: LiveSettings,
    pub shards: Vec<ShardHandle>,
    pub rules: RuleStore,
    pub clock: Arc<dyn Clock>,
    pub clients: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
    pub stats: NodeStats,
    pub started: Instant,
    pub addr: SocketAddr,
    next_client_id: AtomicU64,
    connected: AtomicUsize,
    shutdown: watch::Receiver<bool>,
    /// Which shard owns each hash slot. Standalone: slots are dealt round-robin. Cluster: all
    /// slots of a group live on one shard, so a group's keys can be snapshotted together.
    slot_shard: Vec<u16>,
    cluster: std::sync::OnceLock<Arc<Cluster>>,
    /// Bytes all client connections hold in their request and reply buffers.
    pub client_buffer_bytes: AtomicUsize,
    /// When free heap memory was last handed back to the operating system (ms of uptime).
    last_trim_ms: AtomicU64,
}

impl Node {
    /// The cluster this node belongs to, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    pub fn connected_clients(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }

    fn shard_of(&self, key: &[u8]) -> usize {
        self.slot_owner(key_slot(key))
    }

    /// The shard that owns a hash slot.
    fn slot_owner(&self, slot: u16) -> usize {
        usize::from(self.slot_shard[usize::from(slot) % self.slot_shard.len()])
    }

    /// Hands free heap memory back to the operating system, at most once a second.
    fn release_free_memory(&self) {
        let now = self.uptime_ms();
        let last = self.last_trim_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && self
                .last_trim_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            shard::release_free_memory();
        }
    }

    fn uptime_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A running node; dropping it does not stop it, `shutdown` does.
pub struct NodeHandle {
    pub addr: SocketAddr,
    pub node: Arc<Node>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl NodeHandle {
    /// Stops accepting, closes every connection, stops the shards and waits for them.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        if let Some(c) = self.node.cluster() {
            c.shutdown().await;
        }
        for t in self.tasks {
            let _ = t.await;
        }
        for s in &self.node.shards {
            s.stop();
        }
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// Binds the listener, starts the shard threads, and runs the acceptor and the background
/// tasks on the current tokio runtime.
pub async fn start(settings: Settings, clock: Arc<dyn Clock>) -> Result<NodeHandle, String> {
    let rules = RuleStore::open(settings.rules.clone())?;
    let listener = TcpListener::bind((settings.bind.as_str(), settings.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", settings.bind, settings.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let n = settings.shards.max(1);
    let (handles, inboxes): (Vec<ShardHandle>, Vec<ShardInbox>) =
        (0..n).map(shard::channel).unzip();
    let (tx, rx) = watch::channel(false);
    // One set of caps for the whole node, shared by the shards' stores.
    let caps = crate::store::Caps::new(settings.max_keys, settings.maxmemory);
    let live = LiveSettings::new(&settings, caps.clone());

    let slot_shard: Vec<u16> = (0..crate::slot::SLOTS)
        .map(|slot| {
            let unit = match &settings.cluster {
                Some(c) => c.spec.group_of_slot(slot) as usize,
                None => usize::from(slot),
            };
            (unit % n) as u16
        })
        .collect();
    let cluster_settings = settings.cluster.clone();
    let node = Arc::new(Node {
        settings,
        live,
        shards: handles,
        rules,
        clock,
        clients: Mutex::new(BTreeMap::new()),
        stats: NodeStats::default(),
        started: Instant::now(),
        addr,
        next_client_id: AtomicU64::new(1),
        connected: AtomicUsize::new(0),
        shutdown: rx.clone(),
        slot_shard,
        cluster: std::sync::OnceLock::new(),
        client_buffer_bytes: AtomicUsize::new(0),
        last_trim_ms: AtomicU64::new(0),
    });
    let mut threads = Vec::with_capacity(n);
    let mut runtimes = Vec::with_capacity(n);
    for (id, inbox) in inboxes.into_iter().enumerate() {
        let node = node.clone();
        let caps = caps.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start shard {id}'s event loop: {e}"))?;
        runtimes.push(rt.handle().clone());
        let t = std::thread::Builder::new()
            .name(format!("shard-{id}"))
            .spawn(move || {
                crate::protocol::reply::count_errors_in(node.shards[id].stats.errors.clone());
                shard_thread(node, id, inbox, Store::with_caps(caps), rt)
            })
            .map_err(|e| format!("cannot start shard thread: {e}"))?;
        threads.push(t);
    }
    if let Some(cs) = cluster_settings {
        // The shard threads must already run: replaying the log applies entries through them.
        let n_shards = node.shards.len();
        let cluster = Cluster::start(
            cs,
            &node.shards,
            &runtimes,
            |g| g as usize % n_shards,
            node.clock.clone(),
            rx.clone(),
        )
        .await?;
        for shard in &node.shards {
            shard
                .send(ShardMsg::Attach(cluster.clone(), fresh_run(shard.id)))
                .await
                .map_err(|_| "a shard stopped during start-up".to_string())?;
        }
        let _ = node.cluster.set(cluster);
    }
    let mut tasks = vec![tokio::spawn(accept_loop(
        node.clone(),
        listener,
        rx.clone(),
    ))];
    tasks.push(tokio::spawn(sample_rates(node.clone(), rx.clone())));
    tasks.push(tokio::spawn(live::close_idle_clients(
        node.clone(),
        rx.clone(),
    )));
    if node.rules.file().is_some() && node.settings.rules_reload_ms > 0 {
        tasks.push(tokio::spawn(watch_rules(node.clone(), rx)));
    }
    tracing::info!(%addr, shards = n, "bucketd listening on {addr}");
    Ok(NodeHandle {
        addr,
        node,
        shutdown: tx,
        tasks,
        threads,
    })
}

/// A number naming one shard's run: random, so no other node, no other shard and no earlier
/// run of this one names its entries the same way.
fn fresh_run(shard: usize) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(shard);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// One shard: a single-threaded event loop that owns its keys and the connections on it.
/// In a cluster the Raft groups the shard owns run on the same event loop (`rt`), so
/// proposing, committing and applying never wait for another thread to wake up.
fn shard_thread(
    node: Arc<Node>,
    id: usize,
    inbox: ShardInbox,
    store: Store,
    rt: tokio::runtime::Runtime,
) {
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let stats = node.shards[id].stats.clone();
        let core: CoreRef = Rc::new(RefCell::new(ShardCore::new(
            id,
            store,
            node.clock.clone(),
            stats,
        )));
        let mut shutdown = node.shutdown.clone();
        let sweeper = {
            let core = core.clone();
            let mut shutdown = shutdown.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(shard::SWEEP_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => core.borrow_mut().sweep(),
                        _ = shutdown.changed() => break,
                    }
                }
            })
        };
        let mut conns = tokio::task::JoinSet::new();
        let mut proposing = Vec::new();
        while let Some(msg) = inbox.recv().await {
            match msg {
                ShardMsg::Batch {
                    cmds,
                    budget,
                    reply,
                } => {
                    let answer = core.borrow_mut().apply_batch(cmds, budget);
                    // The asking connection may have gone; its replies are then dropped.
                    let _ = reply.send(answer);
                }
                ShardMsg::Keyed {
                    cmds,
                    slots,
                    budget,
                    reply,
                } => core.borrow_mut().run_for(cmds, &slots, budget, reply),
                ShardMsg::ApplyAt { batches, reply } => {
                    let replies = core.borrow_mut().apply_entries(batches);
                    let _ = reply.send(replies);
                }
                ShardMsg::Attach(cluster, run) => {
                    let p = crate::cluster::proposer::Proposer::new(cluster, run);
                    let kick = p.kick();
                    core.borrow_mut().proposer = Some(p);
                    proposing.push(tokio::task::spawn_local(
                        crate::cluster::proposer::propose_turns(core.clone(), kick),
                    ));
                }
                ShardMsg::Export { slots, now, reply } => {
                    let _ = reply.send(core.borrow().export(slots, now));
                }
                ShardMsg::Import {
                    slots,
                    records,
                    reply,
                } => {
                    core.borrow_mut().import(slots, &records);
                    let _ = reply.send(());
                }
                ShardMsg::Accept(std_stream) => match TcpStream::from_std(std_stream) {
                    Ok(stream) => {
                        let node = node.clone();
                        let core = core.clone();
                        let shutdown = shutdown.clone();
                        conns.spawn_local(serve_connection(node, core, stream, shutdown));
                    }
                    Err(e) => {
                        tracing::warn!("cannot adopt connection: {e}");
                        node.connected.fetch_sub(1, Ordering::Relaxed);
                    }
                },
                ShardMsg::SyncCaps { reply } => {
                    core.borrow_mut().store.sync_caps();
                    let _ = reply.send(());
                }
                ShardMsg::Stop => break,
            }
            while conns.try_join_next().is_some() {}
        }
        let _ = shutdown.changed().await.ok();
        // Connections saw the shutdown signal; give them a moment to say goodbye.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        sweeper.abort();
        for p in proposing {
            p.abort();
        }
    });
}

async fn accept_loop(node: Arc<Node>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
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
            _ = shutdown.changed() => break,
        }
    }
}

async fn serve_connection(
    node: Arc<Node>,
    core: CoreRef,
    stream: TcpStream,
    shutdown: watch::Receiver<bool>,
) {
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

fn register(node: &Node, stream: &TcpStream, peer: SocketAddr, shard: usize) -> Arc<ClientInfo> {
    let id = node.next_client_id.fetch_add(1, Ordering::Relaxed);
    let info = Arc::new(ClientInfo {
        id,
        addr: peer,
        laddr: stream.local_addr().unwrap_or(node.addr),
        shard,
        created: Instant::now(),
        meta: Mutex::new(ClientMeta {
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

/// Locks a mutex that is never held across a panic-prone section; a poisoned one is still
/// usable because every writer leaves it consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn sample_rates(node: Arc<Node>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let total = |node: &Node| -> (u64, u64) {
        node.shards.iter().fold((0, 0), |(c, k), s| {
            (
                c + s.stats.checks.load(Ordering::Relaxed),
                k + s.stats.requests.load(Ordering::Relaxed),
            )
        })
    };
    let mut last = total(&node);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = total(&node);
                node.stats.checks_per_sec.store(now.0.saturating_sub(last.0), Ordering::Relaxed);
                node.stats.commands_per_sec.store(now.1.saturating_sub(last.1), Ordering::Relaxed);
                last = now;
            }
            _ = shutdown.changed() => break,
        }
    }
}

async fn watch_rules(node: Arc<Node>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(node.settings.rules_reload_ms));
    loop {
        tokio::select! {
            _ = tick.tick() => match node.rules.reload_if_changed() {
                Ok(Some(n)) => tracing::info!(rules = n, "rules file reloaded"),
                Ok(None) => {}
                Err(e) => tracing::error!("rules file rejected, keeping the previous rules: {e}"),
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// A batch in flight: answered inline (own shard) or awaited from another shard.
enum Pending {
    Ready(Vec<Reply>),
    Wait(oneshot::Receiver<Answer>),
}

impl Pending {
    async fn replies(self) -> Result<Vec<Reply>, ShardGone> {
        match self {
            Pending::Ready(r) => Ok(r),
            Pending::Wait(rx) => rx.await.map(|a| a.replies).map_err(|_| ShardGone),
        }
    }
}

impl Conn {
    /// The positions of `keys`, grouped by the shard that owns each.
    fn by_shard(&self, keys: &[Bytes]) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); self.node.shards.len()];
        for (i, k) in keys.iter().enumerate() {
            groups[self.node.shard_of(k)].push(i);
        }
        groups
    }

    /// A multi-key command whose keys live on several shards.
    async fn cross_shard(&mut self, m: MultiCmd) -> Result<Reply, ShardGone> {
        let n = self.node.shards.len();
        match m {
            MultiCmd::Del(keys) => self.sum_per_shard(keys, KeyCmd::Del).await,
            MultiCmd::Exists(keys) => self.sum_per_shard(keys, KeyCmd::Exists).await,
            MultiCmd::MGet(keys) => {
                // Each shard answers for its keys; the replies are put back in request order,
                // and the whole is refused if it would pass the reply cap.
                let groups = self.by_shard(&keys);
                let mut waits = Vec::new();
                for (s, idx) in groups.iter().enumerate() {
                    if !idx.is_empty() {
                        let share = idx.iter().map(|&i| keys[i].clone()).collect();
                        waits.push((s, self.dispatch(s, vec![KeyCmd::MGet(share)]).await?));
                    }
                }
                let mut out = vec![Reply::Nil; keys.len()];
                let mut total = 0usize;
                for (s, p) in waits {
                    match p.replies().await?.into_iter().next() {
                        Some(Reply::Array(items)) => {
                            for (&i, r) in groups[s].iter().zip(items) {
                                if let Reply::Bulk(b) = &r {
                                    total += b.len();
                                }
                                out[i] = r;
                            }
                        }
                        Some(other) => return Ok(other),
                        None => return Ok(Reply::err("ERR internal error: missing reply")),
                    }
                }
                if total > crate::cmd::keyed::MAX_REPLY_BYTES {
                    return Ok(Reply::err(crate::cmd::keyed::TOO_LARGE));
                }
                Ok(Reply::Array(out))
            }
            MultiCmd::MSet { keys, values } => {
                // Applied shard by shard: each shard sets its share atomically.
                let mut shares: Vec<(Vec<Bytes>, Vec<Bytes>)> = vec![(Vec::new(), Vec::new()); n];
                for (k, v) in keys.into_iter().zip(values) {
                    let share = &mut shares[self.node.shard_of(&k)];
                    share.0.push(k);
                    share.1.push(v);
                }
                let mut waits = Vec::new();
                for (s, (keys, values)) in shares.into_iter().enumerate() {
                    if !keys.is_empty() {
                        waits.push(
                            self.dispatch(s, vec![KeyCmd::MSet { keys, values }])
                                .await?,
                        );
                    }
                }
                let mut reply = Reply::Ok;
                for p in waits {
                    if let Some(e @ Reply::Error(_)) = p.replies().await?.into_iter().next() {
                        reply = e;
                    }
                }
                Ok(reply)
            }
            MultiCmd::CheckAll {
                keys,
                rules,
                cost,
                peek,
            } => {
                // Each shard checks its limits atomically; if any shard refuses, the shards
                // that consumed give it back. A concurrent check may briefly see those units
                // taken (it can be refused, never over-admitted).
                let groups = self.by_shard(&keys);
                let mut waits = Vec::new();
                for (s, idx) in groups.iter().enumerate() {
                    if idx.is_empty() {
                        continue;
                    }
                    let cmd = KeyCmd::CheckAll {
                        keys: idx.iter().map(|&i| keys[i].clone()).collect(),
                        rules: idx.iter().map(|&i| rules[i]).collect(),
                        cost,
                        peek,
                    };
                    waits.push((s, self.dispatch(s, vec![cmd]).await?));
                }
                let mut each: Vec<LimitReply> = vec![[0; 5]; keys.len()];
                let mut shard_ok = vec![true; n];
                for (s, p) in waits {
                    match p.replies().await?.into_iter().next() {
                        Some(Reply::LimitAll(summary, per)) => {
                            shard_ok[s] = summary[0] == 1;
                            for (j, &i) in groups[s].iter().enumerate() {
                                if let Some(r) = per.get(j) {
                                    each[i] = *r;
                                }
                            }
                        }
                        Some(other) => return Ok(other),
                        None => return Ok(Reply::err("ERR internal error: missing reply")),
                    }
                }
                let allowed = shard_ok.iter().all(|&ok| ok);
                if !allowed {
                    // Shards whose limits all passed give back what they took (unless this was
                    // a peek), then report what those limits have now, exactly as a refused
                    // check on a single shard reports its passing limits.
                    for (s, idx) in groups.iter().enumerate() {
                        if idx.is_empty() || !shard_ok[s] {
                            continue;
                        }
                        let keys_s: Vec<Bytes> = idx.iter().map(|&i| keys[i].clone()).collect();
                        let rules_s: Vec<_> = idx.iter().map(|&i| rules[i]).collect();
                        let mut cmds = Vec::with_capacity(2);
                        if !peek {
                            cmds.push(KeyCmd::Refund {
                                keys: keys_s.clone(),
                                rules: rules_s.clone(),
                                cost,
                            });
                        }
                        cmds.push(KeyCmd::CheckAll {
                            keys: keys_s,
                            rules: rules_s,
                            cost: 0,
                            peek: true,
                        });
                        let replies = self.dispatch(s, cmds).await?.replies().await?;
                        if let Some(Reply::LimitAll(_, now)) = replies.last() {
                            for (j, &i) in idx.iter().enumerate() {
                                if let Some(r) = now.get(j) {
                                    each[i] = *r;
                                    each[i][0] = 1;
                                }
                            }
                        }
                    }
                }
                Ok(Reply::LimitAll(summarize(&each, allowed), each))
            }
        }
    }

    async fn sum_per_shard(
        &mut self,
        keys: Vec<Bytes>,
        make: fn(Vec<Bytes>) -> KeyCmd,
    ) -> Result<Reply, ShardGone> {
        let mut groups: Vec<Vec<Bytes>> = vec![Vec::new(); self.node.shards.len()];
        for k in keys {
            groups[self.node.shard_of(&k)].push(k);
        }
        let mut waits = Vec::new();
        for (s, g) in groups.into_iter().enumerate() {
            if !g.is_empty() {
                waits.push(self.dispatch(s, vec![make(g)]).await?);
            }
        }
        let mut total = 0;
        for p in waits {
            total += p
                .replies()
                .await?
                .first()
                .and_then(Reply::as_int)
                .unwrap_or(0);
        }
        Ok(Reply::Int(total))
    }

    /// Runs a command on every shard and returns the replies.
    async fn all_shards(&self, make: impl Fn() -> KeyCmd) -> Result<Vec<Reply>, ShardGone> {
        let mut waits = Vec::new();
        for s in 0..self.node.shards.len() {
            waits.push(self.dispatch(s, vec![make()]).await?);
        }
        let mut out = Vec::new();
        for w in waits {
            out.extend(w.replies().await?);
        }
        Ok(out)
    }

    async fn node_command(
        &mut self,
        spec: &'static table::CommandSpec,
        args: Result<NodeCmd, ArgError>,
        buf: &mut Vec<u8>,
    ) -> Result<(), ShardGone> {
        node_cmds::run(self, spec, args, buf).await
    }
}

/// Encodes a shard's reply.
pub fn encode(w: &mut ReplyWriter, r: &Reply) {
    match r {
        Reply::Ok => w.ok(),
        Reply::Nil => w.null(),
        Reply::Int(v) => w.int(*v),
        Reply::Bulk(b) => w.bulk(b),
        Reply::Simple(s) => w.simple(s),
        Reply::Error(e) => w.error(e),
        Reply::Limit(l) => write_limit(w, l),
        Reply::LimitAll(summary, each) => {
            w.array(6);
            for v in summary {
                w.int(*v);
            }
            w.array(each.len());
            for l in each {
                write_limit(w, l);
            }
        }
        Reply::Array(items) => {
            w.array(items.len());
            for i in items {
                encode(w, i);
            }
        }
    }
}

fn write_limit(w: &mut ReplyWriter, l: &LimitReply) {
    w.array(5);
    for v in l {
        w.int(*v);
    }
}
