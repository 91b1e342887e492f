//! The node's parts that serve clients, in the order the composition root (`start.rs`)
//! puts them together: the client listeners, the shard threads around one `Node`, and the
//! node's own tasks (the acceptors, the snapshot, the rules file, the rates); and
//! `NodeHandle`, which stops them all.

use super::{LiveSettings, Node, NodeStats, accept, live, persist};
use crate::clock::Clock;
use crate::cluster::Cluster;
use crate::config::Settings;
use crate::error::StartError;
use crate::rules::RuleStore;
use crate::shard::{self, Placement, ShardCore, ShardHandle, ShardInbox, Transport};
use crate::shutdown::{Shutdown, Trigger};
use crate::store::{Caps, Store};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Stack of a shard thread: scripts nest (cjson reads and writes tables 1000 deep, as Redis
/// allows) on the thread that owns the keys. Only the pages touched are ever resident.
const SHARD_STACK_BYTES: usize = 16 * 1024 * 1024;

/// A running node; `shutdown` stops it and waits for it. Dropping it drops the shutdown
/// trigger, which stops the node's tasks and connections but not its shard threads.
pub struct NodeHandle {
    /// The address the node's client listener is bound to.
    pub addr: SocketAddr,
    /// Where the metrics endpoint listens, when it is on.
    pub metrics_addr: Option<SocketAddr>,
    /// The address of its TLS client listener, if it has one.
    pub tls_addr: Option<SocketAddr>,
    /// Where Envoy's rate limit service (gRPC) listens, when it is on.
    pub grpc_addr: Option<SocketAddr>,
    /// The node's shared state: not an API, for the crate's own tests.
    #[doc(hidden)]
    pub node: Arc<Node>,
    pub(crate) shutdown: Trigger,
    pub(crate) tasks: Vec<JoinHandle<()>>,
    pub(crate) threads: Vec<std::thread::JoinHandle<()>>,
}

impl NodeHandle {
    /// Stops accepting, closes every connection, stops the shards and waits for them.
    pub async fn shutdown(self) {
        self.shutdown.fire();
        if let Some(c) = self.node.cluster() {
            c.shutdown().await;
        }
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(dir) = self.node.standalone_data_dir() {
            // The clients are gone and the shards still run: the keys are as they will stay.
            match persist::save(&self.node, dir).await {
                Ok(n) => tracing::info!(keys = n, "snapshot saved to {}", dir.display()),
                Err(e) => tracing::error!("snapshot to {} failed: {e}", dir.display()),
            }
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

/// The client listeners, bound before anything starts so a taken port stops the node at once.
pub(crate) struct ClientListeners {
    plain: TcpListener,
    pub(crate) addr: SocketAddr,
    /// The TLS listener, its address and what takes clients through the handshake.
    tls: Option<(TcpListener, SocketAddr, tokio_rustls::TlsAcceptor)>,
}

impl ClientListeners {
    /// Binds `--port` and, with `--tls-port`, the TLS one; the TLS files are read here.
    pub(crate) async fn bind(settings: &Settings) -> Result<ClientListeners, StartError> {
        let (plain, addr) = crate::net::bind(&settings.bind, settings.port).await?;
        let tls = if settings.tls_port != 0 {
            crate::tls::install_default_provider();
            let acceptor = crate::tls::client_acceptor(&settings.tls)?;
            let (l, at) = crate::net::bind(&settings.bind, settings.tls_port).await?;
            Some((l, at, acceptor))
        } else {
            None
        };
        Ok(ClientListeners { plain, addr, tls })
    }

    pub(crate) fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().map(|(_, at, _)| *at)
    }
}

/// The node and its shard threads, running; what the cluster attaches to.
pub(crate) struct Shards {
    pub(crate) node: Arc<Node>,
    pub(crate) threads: Vec<std::thread::JoinHandle<()>>,
    /// Each shard thread's event loop, where the cluster runs its groups' tasks.
    pub(crate) runtimes: Vec<tokio::runtime::Handle>,
}

/// Builds the node around `settings` and starts one thread per shard, each running its own
/// event loop with the connections the acceptors hand it.
pub(crate) fn start_shards(
    settings: Settings,
    clock: Arc<dyn Clock>,
    rules: RuleStore,
    listeners: &ClientListeners,
    shutdown: &Shutdown,
) -> Result<Shards, StartError> {
    let n = settings.shards.max(1);
    let (handles, inboxes): (Vec<ShardHandle>, Vec<ShardInbox>) =
        (0..n).map(shard::channel).unzip();
    // One set of caps for the whole node, shared by the shards' stores.
    let caps = Caps::new(settings.max_keys, settings.maxmemory);
    let live = LiveSettings::new(&settings, caps.clone());
    let slot_shard = slot_shards(&settings, n);
    let node = Arc::new(Node {
        settings,
        live,
        shards: handles,
        rules,
        time: Mutex::new(crate::clock::Timeline::new(clock.clone())),
        clock,
        clients: Mutex::new(BTreeMap::new()),
        stats: NodeStats::default(),
        started: Instant::now(),
        addr: listeners.addr,
        next_client_id: AtomicU64::new(1),
        connected: AtomicUsize::new(0),
        shutdown: shutdown.clone(),
        slot_shard,
        cluster: std::sync::OnceLock::new(),
        client_buffer_bytes: AtomicUsize::new(0),
        last_trim_ms: AtomicU64::new(0),
        tls_acceptor: listeners.tls.as_ref().map(|(_, _, a)| a.clone()),
        scripts: Arc::default(),
        cross_locks: (0..n).map(|_| tokio::sync::Mutex::new(())).collect(),
    });
    let mut threads = Vec::with_capacity(n);
    let mut runtimes = Vec::with_capacity(n);
    for (id, inbox) in inboxes.into_iter().enumerate() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| StartError::ShardRuntime { shard: id, error })?;
        runtimes.push(rt.handle().clone());
        threads.push(spawn_shard(&node, id, inbox, rt, caps.clone())?);
    }
    Ok(Shards {
        node,
        threads,
        runtimes,
    })
}

/// Which shard owns each hash slot: standalone, the slots are dealt round-robin; in a cluster
/// all slots of a group go to one shard, so a group's keys can be snapshotted together.
fn slot_shards(settings: &Settings, shards: usize) -> Vec<u16> {
    (0..crate::slot::SLOTS)
        .map(|slot| {
            let unit = match &settings.cluster {
                Some(c) => c.spec.group_of_slot(slot) as usize,
                None => usize::from(slot),
            };
            (unit % shards) as u16
        })
        .collect()
}

fn spawn_shard(
    node: &Arc<Node>,
    id: usize,
    inbox: ShardInbox,
    rt: tokio::runtime::Runtime,
    caps: Arc<Caps>,
) -> Result<std::thread::JoinHandle<()>, StartError> {
    let node = node.clone();
    std::thread::Builder::new()
        .name(format!("shard-{id}"))
        .stack_size(SHARD_STACK_BYTES)
        .spawn(move || {
            let stats = node.shards[id].stats.clone();
            crate::protocol::count_errors_in(stats.errors.clone());
            let mut core = ShardCore::new(id, Store::with_caps(caps), node.clock.clone(), stats);
            core.set_placement(match (&node.settings.cluster, node.shards.len()) {
                (Some(_), _) => Placement::Cluster,
                (None, 1) => Placement::Alone,
                (None, _) => Placement::Shards(node.slot_shard.clone().into()),
            });
            let shutdown = node.shutdown.clone();
            shard::run(
                core,
                inbox,
                shutdown,
                rt,
                move |core, stream, transport, shutdown| {
                    accept::adopt(&node, core, stream, transport, shutdown)
                },
            )
        })
        .map_err(StartError::ShardThread)
}

/// Loads a standalone node's snapshot, then starts the node's own tasks: the periodic
/// snapshot, the acceptors, the rates, the idle-client timeout and the rules file's watch.
pub(crate) async fn serve(
    node: &Arc<Node>,
    listeners: ClientListeners,
    shutdown: &Shutdown,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let mut tasks = Vec::new();
    if let Some(dir) = node.standalone_data_dir() {
        let t0 = Instant::now();
        let n = persist::load(node, dir).await?;
        if n > 0 {
            tracing::info!(
                keys = n,
                ms = t0.elapsed().as_millis() as u64,
                "loaded the snapshot in {}",
                dir.display()
            );
        }
        if node.settings.save_interval > 0 {
            tasks.push(tokio::spawn(persist::save_every(
                node.clone(),
                dir.to_path_buf(),
                Duration::from_secs(node.settings.save_interval),
                shutdown.clone(),
            )));
        }
    }
    tasks.push(tokio::spawn(accept::accept_loop(
        node.clone(),
        listeners.plain,
        Transport::Plain,
        shutdown.clone(),
    )));
    if let Some((l, at, _)) = listeners.tls {
        tracing::info!(addr = ?Some(at), "bucketd listening for TLS clients");
        tasks.push(tokio::spawn(accept::accept_loop(
            node.clone(),
            l,
            Transport::Tls,
            shutdown.clone(),
        )));
    }
    tasks.push(tokio::spawn(sample_rates(node.clone(), shutdown.clone())));
    tasks.push(tokio::spawn(live::close_idle_clients(
        node.clone(),
        shutdown.clone(),
    )));
    if node.rules.file().is_some() && node.settings.rules_reload_ms > 0 {
        tasks.push(tokio::spawn(watch_rules(node.clone(), shutdown.clone())));
    }
    Ok(tasks)
}

async fn sample_rates(node: Arc<Node>, mut shutdown: Shutdown) {
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
            _ = shutdown.recv() => break,
        }
    }
}

async fn watch_rules(node: Arc<Node>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_millis(node.settings.rules_reload_ms));
    loop {
        tokio::select! {
            _ = tick.tick() => match node.rules.reload_if_changed() {
                Ok(Some(n)) => {
                    tracing::info!(rules = n, "rules file reloaded");
                    if let Some(c) = node.cluster() {
                        tokio::spawn(share_file_rules(node.clone(), c.clone()));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::error!("rules file rejected, keeping the previous rules: {e}"),
            },
            _ = shutdown.recv() => break,
        }
    }
}

/// Hands the rules of this node's file to the cluster, which sets them on every node; tried
/// until the cluster takes them. Where two nodes' files disagree on a rule, the file loaded
/// last wins.
pub(crate) async fn share_file_rules(node: Arc<Node>, cluster: Arc<Cluster>) {
    let Some(path) = node.rules.file() else {
        return;
    };
    let set =
        match crate::rules::read_file(path).and_then(|t| crate::rules::RuleSet::parse_toml(&t)) {
            Ok(set) => set,
            Err(e) => {
                tracing::error!("rules file not shared with the cluster: {e}");
                return;
            }
        };
    let specs = set.specs();
    for _ in 0..100 {
        match cluster
            .propose_meta(crate::cluster::MetaOp::LoadRules(specs.clone()))
            .await
        {
            Ok(_) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    tracing::error!("the cluster did not take this node's rules file");
}
