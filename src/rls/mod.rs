//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) on `--grpc-port`:
//! what Envoy, Istio, Envoy Gateway, Contour and Emissary ask an external rate limiter, with
//! envoyproxy/ratelimit's YAML configuration (`config`).
//!
//! A request's descriptors become one set of limits, decided all or nothing in one round to
//! the shards (`server::limit_set`): nothing is taken when any of them is over its limit. In a
//! cluster any node answers: a share whose group this node leads goes to its shard, which
//! proposes it with everything else of that turn; the others are forwarded to their leaders.
//!
//! The configuration is re-read when its files change (polled every `rules-reload-ms`); a file
//! that does not load is reported and the configuration in force is kept.

pub(crate) mod config;
mod service;

use crate::cluster::GroupId;
use crate::cmd::{KeyCmd, Reply};
use crate::error::StartError;
use crate::rules::{Watch, content_hash};
use crate::server::{LimitSetParts, Node, SetError};
use crate::shard::Verdict;
use crate::shutdown::Shutdown;
use crate::slot::key_slot;
use crate::sync::lock;
use ahash::AHashMap;
use arc_swap::ArcSwap;
use config::RlsConfig;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Limits counted by name in the metrics, at most: a `detailed_metric` limit names one
/// counter per value it sees, and those must not grow without bound.
const MAX_COUNTED: usize = 4096;

/// The rate limit service's state: its configuration and what it counted.
pub(crate) struct Rls {
    path: PathBuf,
    current: ArcSwap<RlsConfig>,
    watch: Mutex<Watch>,
    /// Whether answers carry the RateLimit-* headers.
    pub(crate) headers: bool,
    pub(crate) stats: RlsStats,
}

/// What the service counted, for the metrics.
#[derive(Default)]
pub(crate) struct RlsStats {
    /// By stat key: hits `[within the limit, over it, over it in shadow mode]`.
    by_limit: Mutex<AHashMap<Box<str>, [u64; 3]>>,
    /// Answers by overall code: `[OK, OVER_LIMIT]`, and requests refused with an error.
    pub(crate) answers: [AtomicU64; 2],
    pub(crate) errors: AtomicU64,
    pub(crate) reloads: AtomicU64,
    pub(crate) reload_errors: AtomicU64,
}

impl RlsStats {
    fn count(&self, decided: &[(&str, Verdict, u64)]) {
        if decided.is_empty() {
            return;
        }
        let mut map = lock(&self.by_limit);
        for &(key, verdict, hits) in decided {
            if let Some(c) = map.get_mut(key) {
                c[verdict as usize] += hits;
            } else if map.len() < MAX_COUNTED {
                let mut c = [0; 3];
                c[verdict as usize] = hits;
                map.insert(key.into(), c);
            }
        }
    }

    /// Hits by stat key: `[within, over, shadowed]`.
    pub(crate) fn by_limit(&self) -> Vec<(String, [u64; 3])> {
        lock(&self.by_limit)
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }
}

impl Rls {
    /// Loads the configuration; one that does not load stops the node.
    pub(crate) fn open(path: PathBuf, headers: bool) -> Result<Rls, StartError> {
        let files = config::read_files(&path).map_err(|e| StartError::Rls(e.to_string()))?;
        let parsed = config::parse(&files).map_err(|e| StartError::Rls(e.to_string()))?;
        tracing::info!(
            domains = parsed.domains(),
            "rate limit service configuration loaded from {}",
            path.display()
        );
        Ok(Rls {
            watch: Mutex::new(Watch::applied(files_hash(&files))),
            path,
            current: ArcSwap::from_pointee(parsed),
            headers,
            stats: RlsStats::default(),
        })
    }

    pub(crate) fn config(&self) -> arc_swap::Guard<Arc<RlsConfig>> {
        self.current.load()
    }

    /// Re-reads the configuration once its files have changed and settled. `Ok(None)`: nothing
    /// to apply; `Err`: the new files were refused and the configuration in force is kept.
    fn reload_if_changed(&self) -> Result<Option<usize>, config::ConfigError> {
        let Ok(files) = config::read_files(&self.path) else {
            // A file being replaced may be briefly missing; the next poll sees it again.
            return Ok(None);
        };
        if !lock(&self.watch).settled_change(files_hash(&files)) {
            return Ok(None);
        }
        let parsed = config::parse(&files)?;
        let n = parsed.domains();
        self.current.store(Arc::new(parsed));
        Ok(Some(n))
    }
}

fn files_hash(files: &[(String, String)]) -> u64 {
    let mut all = String::new();
    for (name, text) in files {
        all.push_str(name);
        all.push('\0');
        all.push_str(text);
        all.push('\0');
    }
    content_hash(&all)
}

/// Watches the configuration's files until shutdown.
pub(crate) async fn watch(rls: Arc<Rls>, every: Duration, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => match rls.reload_if_changed() {
                Ok(Some(n)) => {
                    rls.stats.reloads.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(domains = n, "rate limit service configuration reloaded");
                }
                Ok(None) => {}
                Err(e) => {
                    rls.stats.reload_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        "rate limit service configuration rejected, keeping the one in force: {e}"
                    );
                }
            },
            _ = shutdown.recv() => break,
        }
    }
}

/// Serves the gRPC service on `listener` until shutdown.
pub(crate) async fn serve(
    node: Arc<Node>,
    rls: Arc<Rls>,
    listener: tokio::net::TcpListener,
    shutdown: Shutdown,
) {
    service::serve(node, rls, listener, shutdown).await
}

/// Where a node runs a set's shares: its shards when standalone, the groups' leaders in a
/// cluster.
pub(crate) struct NodeParts<'a>(pub(crate) &'a Node);

impl LimitSetParts for NodeParts<'_> {
    fn part_of(&self, key: &[u8]) -> usize {
        match self.0.cluster() {
            Some(c) => c.group_of_slot(key_slot(key)) as usize,
            None => self.0.shard_of(key),
        }
    }

    async fn run(&self, part: usize, slot: u16, cmds: Vec<KeyCmd>) -> Result<Vec<Reply>, SetError> {
        let node = self.0;
        let Some(c) = node.cluster() else {
            let rx = node.shards[part]
                .submit(cmds, usize::MAX)
                .await
                .map_err(|_| SetError::Gone)?;
            return rx.await.map(|a| a.replies).map_err(|_| SetError::Gone);
        };
        let g = part as GroupId;
        let leader = match c.serving_leader(g) {
            Some(l) => Some(l),
            None => c.settled_leader(g).await,
        };
        let Some(leader) = leader else {
            return Err(SetError::Reply(Reply::err(
                "CLUSTERDOWN The cluster is down",
            )));
        };
        let mut target = leader;
        if leader == c.me {
            // Proposed by the group's shard, in one entry with the rest of its turn.
            let shard = &node.shards[node.slot_owner(slot)];
            let slots = vec![slot; cmds.len()];
            let rx = shard
                .submit_keyed(cmds.clone(), slots, usize::MAX)
                .await
                .map_err(|_| SetError::Gone)?;
            let answer = rx.await.map_err(|_| SetError::Gone)?;
            match answer.refused {
                None => return Ok(answer.replies),
                // The leadership moved before the entry was proposed: nothing was applied,
                // so the share can go to the new leader.
                Some(why) if why.starts_with("MOVED") => match c.settled_leader(g).await {
                    Some(l) if l != c.me => target = l,
                    _ => return Err(SetError::Reply(Reply::Error(why.into()))),
                },
                Some(why) => return Err(SetError::Reply(Reply::Error(why.into()))),
            }
        }
        match c.send_to_leader(g, target, None, cmds).await {
            Ok(Some(replies)) => Ok(replies),
            Ok(None) => Err(SetError::Reply(Reply::err(
                "ERR internal error: a forwarded share had no replies",
            ))),
            Err(e) => Err(SetError::Reply(Reply::Error(
                c.error_reply(slot, &e).into(),
            ))),
        }
    }
}
