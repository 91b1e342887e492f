//! The composition root: builds a node from its settings and puts its parts together (the
//! shard threads and client listeners of `server`, the Raft groups of `cluster`, the
//! Prometheus endpoint of `metrics` and Envoy's rate limit service of `rls`). Only `lib.rs`
//! and the binary reach it; nothing below knows the parts above it.

use crate::clock::Clock;
use crate::cluster::Cluster;
use crate::cluster::ClusterSettings;
use crate::config::Settings;
use crate::error::StartError;
use crate::rls::Rls;
use crate::rules::RuleStore;
use crate::server::{ClientListeners, Node, NodeHandle, Shards};
use crate::shard::ShardMsg;
use crate::shutdown::{self, Shutdown};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Binds the listeners, starts the shard threads, joins or starts the cluster, and runs the
/// acceptors and the background tasks on the current tokio runtime.
pub async fn start(
    mut settings: Settings,
    clock: Arc<dyn Clock>,
) -> Result<NodeHandle, StartError> {
    if let Some(cs) = settings.cluster.as_mut()
        && let Some(addr) = cs.join.clone()
    {
        // The id, the members and the number of groups (which places the slots on the
        // shards) come from the cluster.
        crate::cluster::resolve_join(cs, &addr)
            .await
            .map_err(|e| StartError::Join(e.to_string()))?;
    }
    let rules =
        RuleStore::open(settings.rules.clone()).map_err(|e| StartError::Rules(e.to_string()))?;
    let rls = open_rls(&settings)?;
    let listeners = ClientListeners::bind(&settings).await?;
    let addr = listeners.addr;
    let tls_addr = listeners.tls_addr();
    let (trigger, shutdown) = shutdown::channel();
    let cluster_settings = settings.cluster.clone();
    let Shards {
        node,
        threads,
        runtimes,
    } = crate::server::start_shards(settings, clock, rules, &listeners, &shutdown)?;
    if let Some(cs) = cluster_settings {
        // The shard threads must already run: replaying the log applies entries through them.
        start_cluster(&node, cs, &runtimes, &shutdown).await?;
    }
    let mut tasks = crate::server::serve(&node, listeners, &shutdown).await?;
    let metrics_addr = start_metrics(&node, rls.as_ref(), &shutdown, &mut tasks).await?;
    let grpc_addr = match &rls {
        Some(rls) => start_rls(&node, rls, &shutdown, &mut tasks).await?,
        None => None,
    };
    tracing::info!(%addr, shards = node.shards.len(), "bucketd listening on {addr}");
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

/// Loads the rate limit service's configuration, when there is one: a bad one stops the node
/// before anything is bound.
fn open_rls(settings: &Settings) -> Result<Option<Arc<Rls>>, StartError> {
    match (&settings.rls_config, settings.grpc_port) {
        (Some(path), _) => Ok(Some(Arc::new(Rls::open(
            path.clone(),
            settings.rls_response_headers,
        )?))),
        (None, Some(_)) => Err(StartError::Rls(
            "--grpc-port needs a rate limit configuration (--rls-config FILE|DIR)".into(),
        )),
        (None, None) => Ok(None),
    }
}

/// Starts the node's Raft groups on its shards' event loops and attaches every shard to them.
/// The cluster's rules replace the node's own as the metadata applies them.
async fn start_cluster(
    node: &Arc<Node>,
    mut cs: ClusterSettings,
    runtimes: &[Handle],
    shutdown: &Shutdown,
) -> Result<(), StartError> {
    cs.scripts = node.scripts.clone();
    // Weak: the node holds the cluster.
    let n = Arc::downgrade(node);
    let rules_hook: crate::cluster::RulesHook = Box::new(move |rules| {
        if let Some(n) = n.upgrade() {
            n.rules.replace_with(rules);
        }
    });
    let cluster = Cluster::start(
        cs,
        &node.shards,
        runtimes,
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
        tokio::spawn(crate::server::share_file_rules(
            node.clone(),
            cluster.clone(),
        ));
    }
    node.set_cluster(cluster);
    Ok(())
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

/// Serves `/metrics` on `--metrics-port`, when it is set.
async fn start_metrics(
    node: &Arc<Node>,
    rls: Option<&Arc<Rls>>,
    shutdown: &Shutdown,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Option<SocketAddr>, StartError> {
    let Some(port) = node.settings.metrics_port else {
        return Ok(None);
    };
    let (listener, maddr) = crate::net::bind(&node.settings.bind, port).await?;
    tracing::info!(%maddr, "metrics at http://{maddr}/metrics");
    let service = rls.map(|rls| {
        let rls = rls.clone();
        let counts: crate::metrics::ServiceCounts = Arc::new(move || service_stats(&rls));
        counts
    });
    tasks.push(tokio::spawn(crate::metrics::serve(
        node.clone(),
        service,
        listener,
        shutdown.clone(),
    )));
    Ok(Some(maddr))
}

/// Serves Envoy's rate limit service on `--grpc-port`, when it is set, and re-reads its
/// configuration as its files change.
async fn start_rls(
    node: &Arc<Node>,
    rls: &Arc<Rls>,
    shutdown: &Shutdown,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Option<SocketAddr>, StartError> {
    let mut grpc_addr = None;
    if let Some(port) = node.settings.grpc_port {
        let (listener, gaddr) = crate::net::bind(&node.settings.bind, port).await?;
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
    Ok(grpc_addr)
}

/// What the rate limit service counted, as the metrics show it.
fn service_stats(rls: &Rls) -> crate::metrics::ServiceStats {
    let st = &rls.stats;
    crate::metrics::ServiceStats {
        by_rule: st.by_limit(),
        answers: [
            st.answers[0].load(Ordering::Relaxed),
            st.answers[1].load(Ordering::Relaxed),
        ],
        errors: st.errors.load(Ordering::Relaxed),
        reloads: st.reloads.load(Ordering::Relaxed),
        reload_errors: st.reload_errors.load(Ordering::Relaxed),
    }
}
