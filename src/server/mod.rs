//! The node: what its shard threads share (`Node`), and its life from `start` (listener, shard
//! threads, cluster, background tasks) to `NodeHandle::shutdown`.
//!
//! Each accepted connection is placed on one shard's event loop, round-robin (`accept`). Its
//! task is the coordinator for its client (`conn`): it parses every request one read
//! delivered, runs the commands its own shard owns inline, sends every other shard one batch
//! with its share, and writes all replies back, in request order, with one write. Commands
//! that change how later replies are encoded (HELLO), that gate later commands (AUTH), or
//! that span shards (`scatter`) act as barriers: the round so far is flushed first, so order
//! is kept. The shards run their own loops (`crate::shard`).

mod accept;
mod acl;
mod commands;
mod conn;
pub(crate) mod info;
pub(crate) mod limit_set;
pub(crate) mod live;
mod metrics;
mod named;
pub(crate) mod node;
mod persist;
mod round;
mod scatter;
mod session;
mod stream;
mod txn;

pub use crate::shard::set_free_memory_release;
pub(crate) use live::LiveSettings;
pub(crate) use node::{ClientInfo, ClientMeta, Node, NodeStats, REDIS_COMPAT_VERSION, VERSION};

use crate::clock::Clock;
use crate::cluster::node::Cluster;
use crate::config::Settings;
use crate::error::StartError;
use crate::rules::RuleStore;
use crate::shard::Transport;
use crate::shard::{self, ShardCore, ShardHandle, ShardInbox, ShardMsg};
use crate::shutdown::{self, Shutdown, Trigger};
use crate::store::Store;
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
    shutdown: Trigger,
    tasks: Vec<JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
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

/// Binds the listener, starts the shard threads, and runs the acceptor and the background
/// tasks on the current tokio runtime.
pub async fn start(
    mut settings: Settings,
    clock: Arc<dyn Clock>,
) -> Result<NodeHandle, StartError> {
    if let Some(cs) = settings.cluster.as_mut()
        && let Some(addr) = cs.join.clone()
    {
        // The id, the members and the number of groups (which places the slots on the
        // shards) come from the cluster.
        crate::cluster::membership::resolve_join(cs, &addr)
            .await
            .map_err(StartError::Join)?;
    }
    let rules = RuleStore::open(settings.rules.clone()).map_err(StartError::Rules)?;
    let rls = match (&settings.rls_config, settings.grpc_port) {
        (Some(path), _) => Some(Arc::new(crate::rls::Rls::open(
            path.clone(),
            settings.rls_response_headers,
        )?)),
        (None, Some(_)) => {
            return Err(StartError::Rls(
                "--grpc-port needs a rate limit configuration (--rls-config FILE|DIR)".into(),
            ));
        }
        (None, None) => None,
    };
    let listener = TcpListener::bind((settings.bind.as_str(), settings.port))
        .await
        .map_err(|error| StartError::Listen {
            addr: format!("{}:{}", settings.bind, settings.port),
            error,
        })?;
    let addr = listener.local_addr().map_err(StartError::Socket)?;
    // The TLS files are read before anything starts, so a bad one stops the node at once.
    let tls = if settings.tls_port != 0 {
        crate::tls::install_default_provider();
        let acceptor = crate::tls::client_acceptor(&settings.tls)?;
        let l = TcpListener::bind((settings.bind.as_str(), settings.tls_port))
            .await
            .map_err(|error| StartError::Listen {
                addr: format!("{}:{}", settings.bind, settings.tls_port),
                error,
            })?;
        Some((l, acceptor))
    } else {
        None
    };
    let tls_addr = match &tls {
        Some((l, _)) => Some(l.local_addr().map_err(StartError::Socket)?),
        None => None,
    };
    let n = settings.shards.max(1);
    let (handles, inboxes): (Vec<ShardHandle>, Vec<ShardInbox>) =
        (0..n).map(shard::channel).unzip();
    let (trigger, shutdown) = shutdown::channel();
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
        shutdown: shutdown.clone(),
        slot_shard,
        cluster: std::sync::OnceLock::new(),
        client_buffer_bytes: AtomicUsize::new(0),
        last_trim_ms: AtomicU64::new(0),
        tls_acceptor: tls.as_ref().map(|(_, a)| a.clone()),
        scripts: Arc::default(),
        rls,
    });
    let mut threads = Vec::with_capacity(n);
    let mut runtimes = Vec::with_capacity(n);
    for (id, inbox) in inboxes.into_iter().enumerate() {
        let node = node.clone();
        let caps = caps.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| StartError::ShardRuntime { shard: id, error })?;
        runtimes.push(rt.handle().clone());
        let t = std::thread::Builder::new()
            .name(format!("shard-{id}"))
            .stack_size(SHARD_STACK_BYTES)
            .spawn(move || {
                let stats = node.shards[id].stats.clone();
                crate::protocol::reply::count_errors_in(stats.errors.clone());
                let core = ShardCore::new(id, Store::with_caps(caps), node.clock.clone(), stats);
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
            .map_err(StartError::ShardThread)?;
        threads.push(t);
    }
    if let Some(mut cs) = cluster_settings {
        cs.scripts = node.scripts.clone();
        // The shard threads must already run: replaying the log applies entries through them.
        // The cluster's rules replace the node's own as the metadata applies them. Weak: the
        // node holds the cluster.
        let n = Arc::downgrade(&node);
        let rules_hook: crate::cluster::meta::RulesHook = Box::new(move |rules| {
            if let Some(n) = n.upgrade() {
                n.rules.replace_with(rules);
            }
        });
        let cluster = Cluster::start(
            cs,
            &node.shards,
            &runtimes,
            node.clock.clone(),
            Some(rules_hook),
            shutdown.clone(),
        )
        .await?;
        for shard in &node.shards {
            shard
                .send(ShardMsg::Attach(cluster.clone(), fresh_run(shard.id)))
                .await
                .map_err(|_| StartError::ShardStopped)?;
        }
        if node.rules.file().is_some() {
            tokio::spawn(share_file_rules(node.clone(), cluster.clone()));
        }
        let _ = node.cluster.set(cluster);
    }
    let mut tasks = Vec::new();
    if let Some(dir) = node.standalone_data_dir() {
        let t0 = Instant::now();
        let n = persist::load(&node, dir).await?;
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
        listener,
        Transport::Plain,
        shutdown.clone(),
    )));
    if let Some((l, _)) = tls {
        tracing::info!(addr = ?tls_addr, "bucketd listening for TLS clients");
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
    let mut metrics_addr = None;
    if let Some(port) = node.settings.metrics_port {
        let at = format!("{}:{port}", node.settings.bind);
        let listener = TcpListener::bind(&at)
            .await
            .map_err(|error| StartError::Listen { addr: at, error })?;
        let maddr = listener.local_addr().map_err(StartError::Socket)?;
        tracing::info!(%maddr, "metrics at http://{maddr}/metrics");
        metrics_addr = Some(maddr);
        tasks.push(tokio::spawn(metrics::serve(
            node.clone(),
            listener,
            shutdown.clone(),
        )));
    }
    let mut grpc_addr = None;
    if let Some(rls) = &node.rls {
        if let Some(port) = node.settings.grpc_port {
            let at = format!("{}:{port}", node.settings.bind);
            let listener = TcpListener::bind(&at)
                .await
                .map_err(|error| StartError::Listen { addr: at, error })?;
            let gaddr = listener.local_addr().map_err(StartError::Socket)?;
            tracing::info!(%gaddr, "Envoy rate limit service (gRPC) listening on {gaddr}");
            grpc_addr = Some(gaddr);
            tasks.push(tokio::spawn(crate::rls::serve(
                node.clone(),
                rls.clone(),
                listener,
                shutdown.clone(),
            )));
        }
        if node.settings.rules_reload_ms > 0 {
            tasks.push(tokio::spawn(crate::rls::watch(
                rls.clone(),
                Duration::from_millis(node.settings.rules_reload_ms),
                shutdown.clone(),
            )));
        }
    }
    if node.rules.file().is_some() && node.settings.rules_reload_ms > 0 {
        tasks.push(tokio::spawn(watch_rules(node.clone(), shutdown)));
    }
    tracing::info!(%addr, shards = n, "bucketd listening on {addr}");
    Ok(NodeHandle {
        addr,
        metrics_addr,
        tls_addr,
        grpc_addr,
        node,
        shutdown: trigger,
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
async fn share_file_rules(node: Arc<Node>, cluster: Arc<Cluster>) {
    let Some(path) = node.rules.file() else {
        return;
    };
    let set = match std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| crate::rules::RuleSet::parse_toml(&t))
    {
        Ok(set) => set,
        Err(e) => {
            tracing::error!("rules file not shared with the cluster: {e}");
            return;
        }
    };
    let specs = set.specs();
    for _ in 0..100 {
        match cluster
            .propose_meta(crate::cluster::meta::MetaOp::LoadRules(specs.clone()))
            .await
        {
            Ok(_) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    tracing::error!("the cluster did not take this node's rules file");
}
