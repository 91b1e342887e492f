//! What every shard thread of a node shares (`Node`): settings, shards, rules, the client
//! list and node-wide counters.

use super::LiveSettings;
use crate::clock::Clock;
use crate::cluster::Cluster;
use crate::config::Settings;
use crate::rules::RuleStore;
use crate::shard::{self, ShardHandle};
use crate::shutdown::Shutdown;
use crate::slot::key_slot;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Version reported to clients that gate features on the Redis version; scripts see the same
/// in `redis.REDIS_VERSION`.
pub(crate) const REDIS_COMPAT_VERSION: &str = crate::cmd::REDIS_VERSION;
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

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
    pub(super) kill_requested: std::sync::atomic::AtomicBool,
    /// Wakes the connection when `kill_requested` is set (`ClientInfo::killed`).
    pub(super) kill_signal: tokio::sync::Notify,
}

impl ClientInfo {
    /// Asks the connection to close (CLIENT KILL, the idle timeout). It closes as soon as its
    /// loop sees `killed` resolve; until then it is already left out of CLIENT LIST and KILL.
    pub fn kill(&self) {
        self.kill_requested.store(true, Ordering::Release);
        self.kill_signal.notify_waiters();
    }

    pub fn is_killed(&self) -> bool {
        self.kill_requested.load(Ordering::Acquire)
    }

    /// Resolves once the client has been killed; cancel-safe, so it can sit in a `select!`
    /// that is re-entered on every read.
    pub async fn killed(&self) {
        loop {
            let notified = self.kill_signal.notified();
            tokio::pin!(notified);
            // Registered before the flag is checked, so a kill in between is not missed.
            notified.as_mut().enable();
            if self.is_killed() {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Default, Clone)]
pub struct ClientMeta {
    pub name: String,
    /// The user it authenticated as (`default` until then).
    pub user: String,
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
    /// The node's own reading of limit time (TIME, the rate limit service, snapshots); each
    /// shard keeps its own, from the same clock and the same floor.
    pub(super) time: Mutex<crate::clock::Timeline>,
    pub clients: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
    pub stats: NodeStats,
    pub started: Instant,
    pub addr: SocketAddr,
    pub(super) next_client_id: AtomicU64,
    pub(super) connected: AtomicUsize,
    pub(super) shutdown: Shutdown,
    /// Which shard owns each hash slot. Standalone: slots are dealt round-robin. Cluster: all
    /// slots of a group live on one shard, so a group's keys can be snapshotted together.
    pub(super) slot_shard: Vec<u16>,
    pub(super) cluster: std::sync::OnceLock<Arc<Cluster>>,
    /// Bytes all client connections hold in their request and reply buffers.
    pub client_buffer_bytes: AtomicUsize,
    /// When free heap memory was last handed back to the operating system (ms of uptime).
    pub(super) last_trim_ms: AtomicU64,
    /// What takes TLS clients through their handshake, when the node has a TLS port.
    pub(super) tls_acceptor: Option<tokio_rustls::TlsAcceptor>,
    /// The Lua scripts this node knows, for EVALSHA.
    pub(crate) scripts: Arc<crate::cmd::ScriptCache>,
    /// One lock per shard, taken in shard order by a command over the keys of several
    /// shards of a standalone node (`cross`).
    pub(super) cross_locks: Vec<tokio::sync::Mutex<()>>,
}

impl Node {
    /// Limit time on this node (see `clock::Timeline`): what TIME answers and what a
    /// snapshot records.
    pub fn now(&self) -> u64 {
        crate::sync::lock(&self.time).now()
    }

    /// A standalone node's snapshot directory, when it keeps one.
    pub(crate) fn standalone_data_dir(&self) -> Option<&std::path::Path> {
        match &self.settings.cluster {
            None => self.settings.data_dir.as_deref(),
            Some(_) => None,
        }
    }

    /// The cluster this node belongs to, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// Sets the cluster once it has started; the node is built before it.
    pub(crate) fn set_cluster(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
    }

    pub fn connected_clients(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }

    pub(crate) fn shard_of(&self, key: &[u8]) -> usize {
        self.slot_owner(key_slot(key))
    }

    /// The shard that owns a hash slot.
    pub(crate) fn slot_owner(&self, slot: u16) -> usize {
        usize::from(self.slot_shard[usize::from(slot) % self.slot_shard.len()])
    }

    /// Hands free heap memory back to the operating system, at most once a second.
    pub(super) fn release_free_memory(&self) {
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

    pub(crate) fn uptime_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
