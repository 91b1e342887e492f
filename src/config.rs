//! Node settings: built-in defaults, overridden by a TOML file, overridden by flags.

use crate::error::StartError;
use clap::Parser;
use serde::Deserialize;
use std::path::PathBuf;

/// Command-line flags. Every setting can also come from the `--config` file (same names, with
/// `_` or `-`); a flag wins over the file.
#[derive(Parser, Debug, Default, Clone)]
#[command(
    name = "bucketd",
    version,
    about = "A Redis-compatible rate-limit store"
)]
pub struct Flags {
    /// Address to listen on.
    #[arg(long)]
    pub bind: Option<String>,
    /// Port to listen on; 0 picks a free port (printed in the log).
    #[arg(long)]
    pub port: Option<u16>,
    /// Shard threads; default: one per core.
    #[arg(long)]
    pub shards: Option<usize>,
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// TOML file of named rules, reloaded when it changes.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Password clients must give with AUTH or HELLO.
    #[arg(long)]
    pub requirepass: Option<String>,
    /// Most simultaneous client connections.
    #[arg(long)]
    pub maxclients: Option<usize>,
    /// Most keys the node holds (0 = no cap).
    #[arg(long)]
    pub max_keys: Option<usize>,
    /// Memory cap for keys, e.g. 512mb or 2gb (0 = no cap).
    #[arg(long)]
    pub maxmemory: Option<String>,
    /// Largest bulk string a client may send, in bytes.
    #[arg(long)]
    pub proto_max_bulk_len: Option<usize>,
    /// Most arguments in one command.
    #[arg(long)]
    pub max_args: Option<usize>,
    /// Longest inline command, in bytes.
    #[arg(long)]
    pub max_inline_len: Option<usize>,
    /// Most bytes one connection may have received and not yet handled, bulk arguments
    /// included (a size such as 32mb); a connection that passes it is closed.
    #[arg(long)]
    pub client_query_buffer_limit: Option<String>,
    /// Most bytes all connections together may hold in request and reply buffers (a size such
    /// as 1gb; 0 = no cap); past it, the connection that pushed the total over is closed.
    #[arg(long)]
    pub maxmemory_clients: Option<String>,
    /// How often the rules file is checked for changes, in milliseconds (0 = never).
    #[arg(long)]
    pub rules_reload_ms: Option<u64>,
    /// Log filter, e.g. info or bucketd=debug.
    #[arg(long)]
    pub log: Option<String>,
    /// Cluster mode: every node of the cluster as ID:HOST:PORT:PEER_PORT, comma-separated.
    #[arg(long)]
    pub cluster_nodes: Option<String>,
    /// This node's id in `--cluster-nodes`.
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Replicas per shard group (default 3); a group has as many as there are members, up to
    /// this, and gains replicas as nodes join. Fixed when the cluster is created.
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Number of shard groups the 16384 slots are split into; fixed when the cluster is created.
    #[arg(long)]
    pub groups: Option<u32>,
    /// Where the Raft logs, votes and snapshots are kept.
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Forward commands for groups led elsewhere instead of answering -MOVED, for clients that
    /// are not cluster-aware.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub forward: Option<bool>,
    /// fsync the Raft log before acknowledging a write.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub fsync: Option<bool>,
    /// Quiet a Raft group once it has had no write for this many milliseconds: it stops
    /// heartbeating until the next write (0 = never; default 2000).
    #[arg(long)]
    pub quiet_after_ms: Option<u64>,
    /// What the Raft log's entries may weigh in memory over all of a node's groups, as their
    /// size on disk (e.g. 256mb, the default); a group past its share snapshots and drops them.
    #[arg(long)]
    pub raft_log_memory: Option<String>,
    /// Join a running cluster through any member's client address (HOST:PORT). The cluster
    /// gives this node its id; a node that joined restarts from its data dir without it.
    #[arg(long)]
    pub join: Option<String>,
    /// The port peers reach a joining node on (default: --port + 10000).
    #[arg(long)]
    pub peer_port: Option<u16>,
    /// The host name or address clients and peers reach a joining node at (default: the
    /// --bind address).
    #[arg(long)]
    pub announce_host: Option<String>,
    /// Serve Prometheus metrics at http://BIND:PORT/metrics (off unless given; 0 picks a
    /// free port, printed in the log).
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Serve Envoy's rate limit service (gRPC, envoy.service.ratelimit.v3) on this port (off
    /// unless given; 0 picks a free port, printed in the log). Needs --rls-config.
    #[arg(long)]
    pub grpc_port: Option<u16>,
    /// envoyproxy/ratelimit's YAML configuration for the rate limit service: a file, or a
    /// directory of *.yaml files; re-read when it changes (every rules-reload-ms).
    #[arg(long)]
    pub rls_config: Option<PathBuf>,
    /// Add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to the rate limit
    /// service's answers, for Envoy to set on the response (yes|no, default no).
    #[arg(long)]
    pub rls_response_headers: Option<String>,
    /// Standalone node with --data-dir: seconds between snapshots of the keys, besides the
    /// one taken at shutdown (0 = only at shutdown; default 60).
    #[arg(long)]
    pub save_interval: Option<u64>,
    /// The shared secret every peer connection must prove it knows (prefer
    /// --cluster-secret-file: a flag shows in the process list).
    #[arg(long)]
    pub cluster_secret: Option<String>,
    /// A file holding the cluster secret (a trailing newline is not part of it).
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    /// Port for TLS clients, besides the plain --port (0 = no TLS listener).
    #[arg(long)]
    pub tls_port: Option<u16>,
    /// This node's certificate chain (PEM), for the TLS port and for --tls-cluster.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that client and peer certificates are verified against.
    #[arg(long)]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Whether TLS clients must present a certificate from the CA: yes, no or optional.
    #[arg(long)]
    pub tls_auth_clients: Option<String>,
    /// Mutual TLS between cluster nodes on the peer port: yes or no.
    #[arg(long)]
    pub tls_cluster: Option<String>,
}

/// The config file's shape: the same settings as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileSettings {
    #[serde(alias = "bind_addr")]
    bind: Option<String>,
    port: Option<u16>,
    shards: Option<usize>,
    rules: Option<PathBuf>,
    requirepass: Option<String>,
    maxclients: Option<usize>,
    #[serde(alias = "max_keys")]
    max_keys: Option<usize>,
    maxmemory: Option<toml::Value>,
    #[serde(alias = "proto_max_bulk_len")]
    proto_max_bulk_len: Option<usize>,
    #[serde(alias = "max_args")]
    max_args: Option<usize>,
    #[serde(alias = "max_inline_len")]
    max_inline_len: Option<usize>,
    #[serde(alias = "client_query_buffer_limit")]
    client_query_buffer_limit: Option<toml::Value>,
    #[serde(alias = "maxmemory_clients")]
    maxmemory_clients: Option<toml::Value>,
    #[serde(alias = "rules_reload_ms")]
    rules_reload_ms: Option<u64>,
    log: Option<String>,
    #[serde(alias = "cluster_nodes")]
    cluster_nodes: Option<String>,
    #[serde(alias = "node_id")]
    node_id: Option<u64>,
    replicas: Option<usize>,
    groups: Option<u32>,
    #[serde(alias = "data_dir")]
    data_dir: Option<std::path::PathBuf>,
    forward: Option<bool>,
    fsync: Option<bool>,
    #[serde(alias = "quiet_after_ms")]
    quiet_after_ms: Option<u64>,
    #[serde(alias = "raft_log_memory")]
    raft_log_memory: Option<toml::Value>,
    join: Option<String>,
    #[serde(alias = "peer_port")]
    peer_port: Option<u16>,
    #[serde(alias = "announce_host")]
    announce_host: Option<String>,
    #[serde(alias = "metrics_port")]
    metrics_port: Option<u16>,
    #[serde(alias = "grpc_port")]
    grpc_port: Option<u16>,
    #[serde(alias = "rls_config")]
    rls_config: Option<PathBuf>,
    #[serde(alias = "rls_response_headers")]
    rls_response_headers: Option<bool>,
    #[serde(alias = "save_interval")]
    save_interval: Option<u64>,
    /// Named users: `[users.NAME]` with `password` and `readonly`.
    users: Option<std::collections::BTreeMap<String, UserFile>>,
    #[serde(alias = "cluster_secret")]
    cluster_secret: Option<String>,
    #[serde(alias = "cluster_secret_file")]
    cluster_secret_file: Option<PathBuf>,
    #[serde(alias = "tls_port")]
    tls_port: Option<u16>,
    #[serde(alias = "tls_cert_file")]
    tls_cert_file: Option<PathBuf>,
    #[serde(alias = "tls_key_file")]
    tls_key_file: Option<PathBuf>,
    #[serde(alias = "tls_ca_cert_file")]
    tls_ca_cert_file: Option<PathBuf>,
    #[serde(alias = "tls_auth_clients")]
    tls_auth_clients: Option<toml::Value>,
    #[serde(alias = "tls_cluster")]
    tls_cluster: Option<toml::Value>,
}

/// One `[users.NAME]` table of the config file.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct UserFile {
    password: String,
    #[serde(default)]
    readonly: bool,
}

/// A named user: `AUTH name password`. A read-only user may peek at limits and read the
/// server's state, not consume limits or change keys, rules, settings or the cluster.
#[derive(Clone)]
pub struct User {
    pub name: String,
    pub password: String,
    pub readonly: bool,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("readonly", &self.readonly)
            .finish_non_exhaustive()
    }
}

/// Checks the config file's users: names as Redis allows them, never `default` (its password
/// is `requirepass`), and a password each.
fn users_from_file(
    users: std::collections::BTreeMap<String, UserFile>,
) -> Result<Vec<User>, String> {
    users
        .into_iter()
        .map(|(name, u)| {
            if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("invalid user name '{name}'"));
            }
            if name == "default" {
                return Err(
                    "the default user's password is requirepass, not a [users.default] table"
                        .into(),
                );
            }
            if u.password.is_empty() {
                return Err(format!("user '{name}' needs a password"));
            }
            Ok(User {
                name,
                password: u.password,
                readonly: u.readonly,
            })
        })
        .collect()
}

/// Fully resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub bind: String,
    pub port: u16,
    pub shards: usize,
    pub rules: Option<PathBuf>,
    pub requirepass: Option<String>,
    pub maxclients: usize,
    pub max_keys: usize,
    pub maxmemory: usize,
    pub proto_max_bulk_len: usize,
    pub max_args: usize,
    pub max_inline_len: usize,
    /// Bytes one connection may have received and not yet handled.
    pub client_query_buffer_limit: usize,
    /// Bytes all connections may hold in buffers together (0 = no cap).
    pub maxmemory_clients: usize,
    pub rules_reload_ms: u64,
    pub log: String,
    /// Named users besides `default` (from the config file).
    pub users: Vec<User>,
    /// Where the metrics endpoint listens, if it is on.
    pub metrics_port: Option<u16>,
    /// Where Envoy's rate limit service listens, if it is on.
    pub grpc_port: Option<u16>,
    /// The rate limit service's configuration (envoyproxy/ratelimit YAML: a file or a
    /// directory).
    pub rls_config: Option<PathBuf>,
    /// Whether the rate limit service's answers carry the RateLimit-* headers.
    pub rls_response_headers: bool,
    /// A standalone node's snapshot directory (a cluster keeps its data in `cluster`).
    pub data_dir: Option<PathBuf>,
    /// Seconds between a standalone node's snapshots (0: only at shutdown).
    pub save_interval: u64,
    /// Cluster mode, when a cluster description is given.
    pub cluster: Option<crate::cluster::node::ClusterSettings>,
    /// The TLS client port (0 = none).
    pub tls_port: u16,
    /// The TLS files and whether clients must present a certificate.
    pub tls: crate::tls::TlsFiles,
    /// Mutual TLS between cluster nodes.
    pub tls_cluster: bool,
    /// The cluster secret, as given (a value or a file).
    pub cluster_secret: Option<SecretSource>,
}

/// Where the cluster secret comes from.
#[derive(Clone)]
pub enum SecretSource {
    Value(String),
    File(PathBuf),
}

/// Never prints the secret itself.
impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSource::Value(_) => f.write_str("Value(<secret>)"),
            SecretSource::File(p) => f.debug_tuple("File").field(p).finish(),
        }
    }
}

impl SecretSource {
    /// The secret's bytes: the value, or the file's content without its trailing newline.
    fn read(&self) -> Result<Vec<u8>, StartError> {
        let bytes = match self {
            SecretSource::Value(v) => v.as_bytes().to_vec(),
            SecretSource::File(path) => {
                let mut b = std::fs::read(path).map_err(|e| {
                    StartError::ClusterSecret(format!(
                        "cannot read the cluster secret from {}: {e}",
                        path.display()
                    ))
                })?;
                while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                    b.pop();
                }
                if b.is_empty() {
                    return Err(StartError::ClusterSecret(format!(
                        "the cluster secret file {} is empty",
                        path.display()
                    )));
                }
                b
            }
        };
        if bytes.is_empty() {
            return Err(StartError::ClusterSecret(
                "the cluster secret is empty".into(),
            ));
        }
        Ok(bytes)
    }
}

/// A yes/no setting, as Redis spells them (`true`/`false` are taken too).
fn yes_no(name: &str, v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(format!("{name} must be yes or no, not '{v}'")),
    }
}

/// A yes/no/word setting in the config file: a string, or a TOML boolean.
fn file_word(name: &str, v: toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s),
        toml::Value::Boolean(true) => Ok("yes".into()),
        toml::Value::Boolean(false) => Ok("no".into()),
        _ => Err(format!("{name} must be a string such as \"yes\"")),
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            bind: "127.0.0.1".into(),
            port: 6379,
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            rules: None,
            requirepass: None,
            maxclients: 10_000,
            max_keys: 0,
            maxmemory: 0,
            // Rate-limit keys and values are small; a smaller cap than Redis's 512 MiB keeps
            // one client from making the node buffer huge requests.
            proto_max_bulk_len: 8 * 1024 * 1024,
            max_args: 64 * 1024,
            max_inline_len: 64 * 1024,
            // Room for the largest bulk string several times over; a rate-limit client never
            // comes near it.
            client_query_buffer_limit: 32 * 1024 * 1024,
            maxmemory_clients: 1024 * 1024 * 1024,
            rules_reload_ms: 1000,
            log: "info,openraft=error".into(),
            users: Vec::new(),
            metrics_port: None,
            grpc_port: None,
            rls_config: None,
            rls_response_headers: false,
            data_dir: None,
            save_interval: 60,
            cluster: None,
            tls_port: 0,
            tls: crate::tls::TlsFiles::default(),
            tls_cluster: false,
            cluster_secret: None,
        }
    }
}

/// Parses sizes like `100`, `64kb`, `512mb`, `2gb` (powers of 1024, case-insensitive).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = [
        ("kb", 1usize << 10),
        ("mb", 1 << 20),
        ("gb", 1 << 30),
        ("k", 1 << 10),
        ("m", 1 << 20),
        ("g", 1 << 30),
        ("b", 1),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim().to_string(), *m)))
    .unwrap_or((t.clone(), 1));
    let n: usize = num.parse().map_err(|_| format!("invalid size '{s}'"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size too large '{s}'"))
}

/// A size in the config file: a number of bytes or a string such as "512mb".
fn file_size(name: &str, v: toml::Value) -> Result<usize, String> {
    match v {
        toml::Value::Integer(i) => usize::try_from(i).map_err(|_| format!("{name} must be >= 0")),
        toml::Value::String(s) => parse_size(&s),
        _ => Err(format!("{name} must be a number or a size like \"512mb\"")),
    }
}

/// The least `raft-log-memory` a node accepts.
const MIN_RAFT_LOG_MEMORY: u64 = 64 << 10;

/// The settings a founding node and a joining one take alike.
struct Common {
    forward: Option<bool>,
    fsync: Option<bool>,
    quiet_after_ms: Option<u64>,
    log_memory: Option<u64>,
}

impl Common {
    fn apply(&self, c: &mut crate::cluster::node::ClusterSettings) {
        c.forward = self.forward.unwrap_or(false);
        c.fsync = self.fsync.unwrap_or(false);
        if let Some(ms) = self.quiet_after_ms {
            c.quiet_after = (ms > 0).then(|| std::time::Duration::from_millis(ms));
        }
        if let Some(b) = self.log_memory {
            c.log_memory = b;
        }
    }
}

/// Cluster settings as gathered from the file and the flags, before validation.
#[derive(Default)]
struct ClusterRaw {
    nodes: Option<String>,
    node_id: Option<u64>,
    replicas: Option<usize>,
    groups: Option<u32>,
    data_dir: Option<std::path::PathBuf>,
    forward: Option<bool>,
    fsync: Option<bool>,
    quiet_after_ms: Option<u64>,
    log_memory: Option<u64>,
    join: Option<String>,
    peer_port: Option<u16>,
    announce_host: Option<String>,
}

/// Where a node that joins a cluster keeps its data when no `--data-dir` is given.
fn joined_data_dir(port: u16) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("bucketd-data/port-{port}"))
}

/// Where a node started without `--cluster-nodes` and `--join` looks for the `cluster.conf` of
/// a cluster it joined earlier: its `--data-dir`, or the folder a join on its port defaults to.
/// None with neither (a port chosen by the system never joined anything).
fn restart_dir(data_dir: Option<std::path::PathBuf>, port: u16) -> Option<std::path::PathBuf> {
    data_dir.or_else(|| (port != 0).then(|| joined_data_dir(port)))
}

impl ClusterRaw {
    fn merge(&mut self, other: ClusterRaw) {
        macro_rules! over {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f; } )* };
        }
        over!(
            nodes,
            node_id,
            replicas,
            groups,
            data_dir,
            forward,
            fsync,
            quiet_after_ms,
            log_memory,
            join,
            peer_port,
            announce_host
        );
    }

    fn build(
        self,
        bind: &str,
        port: u16,
    ) -> Result<Option<crate::cluster::node::ClusterSettings>, StartError> {
        use crate::cluster::spec::{ClusterSpec, NodeSpec};
        if let Some(b) = self.log_memory
            && b < MIN_RAFT_LOG_MEMORY
        {
            // A share smaller than a few entries would snapshot the group after every write.
            return Err(StartError::Setting(format!(
                "raft-log-memory must be at least {}kb",
                MIN_RAFT_LOG_MEMORY >> 10
            )));
        }
        let common = Common {
            forward: self.forward,
            fsync: self.fsync,
            quiet_after_ms: self.quiet_after_ms,
            log_memory: self.log_memory,
        };
        let Some(nodes) = self.nodes else {
            if self.node_id.is_some() {
                return Err(StartError::NodeIdWithoutNodes);
            }
            let Some(join) = self.join else {
                // A node that joined a cluster restarts from its data folder's `cluster.conf`
                // (its id and the members), with or without `--join`: the folder it was given,
                // or the one `--join` takes by default.
                let Some(dir) = restart_dir(self.data_dir, port) else {
                    return Ok(None);
                };
                let Some((id, spec)) = crate::cluster::membership::read_cluster_file(&dir)
                    .map_err(|e| StartError::Spec(e.to_string()))?
                else {
                    return Ok(None);
                };
                let mut c = crate::cluster::node::ClusterSettings::new(id, spec, dir);
                c.joined = true;
                common.apply(&mut c);
                return Ok(Some(c));
            };
            // The id and the members come from the cluster when the node starts.
            if port == 0 {
                return Err(StartError::Setting(
                    "--join needs a fixed --port: the cluster tells clients where this node is"
                        .into(),
                ));
            }
            let peer_port = match self.peer_port {
                Some(p) => p,
                None => port.checked_add(10_000).ok_or_else(|| {
                    StartError::Setting("--port is too high for the default --peer-port".into())
                })?,
            };
            let host = self.announce_host.unwrap_or_else(|| bind.to_string());
            let spec = ClusterSpec {
                nodes: vec![NodeSpec {
                    id: 0,
                    host,
                    port,
                    peer_port,
                }],
                replicas: 1,
                groups: 1,
            };
            let data_dir = self.data_dir.unwrap_or_else(|| joined_data_dir(port));
            let mut c = crate::cluster::node::ClusterSettings::new(0, spec, data_dir);
            c.join = Some(join);
            common.apply(&mut c);
            return Ok(Some(c));
        };
        let nodes = ClusterSpec::parse_nodes(&nodes).map_err(StartError::Spec)?;
        let node_id = self.node_id.ok_or(StartError::NoNodeId)?;
        let replicas = self.replicas.unwrap_or(3);
        let spec = ClusterSpec {
            nodes,
            replicas,
            // Enough for a cluster to grow to 32 nodes each leading a group; idle groups cost
            // little (quiet), so more would do too, at smaller batches per group under load.
            groups: self.groups.unwrap_or(32),
        };
        spec.validate().map_err(StartError::Spec)?;
        if spec.node(node_id).is_none() {
            return Err(StartError::NodeIdNotListed(node_id));
        }
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| std::path::PathBuf::from(format!("bucketd-data/node-{node_id}")));
        let mut c = crate::cluster::node::ClusterSettings::new(node_id, spec, data_dir);
        common.apply(&mut c);
        Ok(Some(c))
    }
}

/// The settings that a file and the command line set the same way (a value given replaces the
/// default), listed once for both: `$apply!(field, ...)`.
macro_rules! plain_settings {
    ($apply:ident) => {
        $apply!(
            bind,
            port,
            shards,
            maxclients,
            max_keys,
            proto_max_bulk_len,
            max_args,
            max_inline_len,
            rules_reload_ms,
            save_interval,
            log,
            tls_port
        )
    };
}

impl Settings {
    /// Defaults, then the file named by `--config` (if any), then the flags.
    pub fn resolve(flags: &Flags) -> Result<Settings, StartError> {
        let mut s = Settings::default();
        let mut cluster = ClusterRaw::default();
        if let Some(path) = &flags.config {
            let text = std::fs::read_to_string(path).map_err(|error| StartError::ReadConfig {
                path: path.clone(),
                error,
            })?;
            let mut f: FileSettings =
                toml::from_str(&text).map_err(|error| StartError::ParseConfig {
                    path: path.clone(),
                    error: Box::new(error),
                })?;
            cluster.merge(ClusterRaw {
                nodes: f.cluster_nodes.take(),
                node_id: f.node_id.take(),
                replicas: f.replicas.take(),
                groups: f.groups.take(),
                data_dir: f.data_dir.take(),
                forward: f.forward.take(),
                fsync: f.fsync.take(),
                quiet_after_ms: f.quiet_after_ms.take(),
                log_memory: f
                    .raft_log_memory
                    .take()
                    .map(|v| file_size("raft-log-memory", v))
                    .transpose()
                    .map_err(StartError::Setting)?
                    .map(|n| n as u64),
                join: f.join.take(),
                peer_port: f.peer_port.take(),
                announce_host: f.announce_host.take(),
            });
            s.apply_file(f).map_err(StartError::Setting)?;
        }
        s.apply_flags(flags).map_err(StartError::Setting)?;
        cluster.merge(ClusterRaw {
            nodes: flags.cluster_nodes.clone(),
            node_id: flags.node_id,
            replicas: flags.replicas,
            groups: flags.groups,
            data_dir: flags.data_dir.clone(),
            forward: flags.forward,
            fsync: flags.fsync,
            quiet_after_ms: flags.quiet_after_ms,
            log_memory: flags
                .raft_log_memory
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(StartError::Setting)?
                .map(|n| n as u64),
            join: flags.join.clone(),
            peer_port: flags.peer_port,
            announce_host: flags.announce_host.clone(),
        });
        let data_dir = cluster.data_dir.clone();
        s.cluster = cluster.build(&s.bind, s.port)?;
        if s.cluster.is_none() {
            // A standalone node keeps its snapshot there.
            s.data_dir = data_dir;
        }
        if s.shards == 0 || s.shards > 1024 {
            return Err(StartError::ShardCount(s.shards));
        }
        s.secure_peers()?;
        Ok(s)
    }

    /// Reads the cluster secret and the peer TLS files into the cluster's settings, so a bad
    /// file stops the node before it starts.
    fn secure_peers(&mut self) -> Result<(), StartError> {
        let Some(cluster) = self.cluster.as_mut() else {
            return Ok(());
        };
        if let Some(source) = &self.cluster_secret {
            cluster.security.secret = Some(source.read()?.into());
        }
        if self.tls_cluster {
            cluster.security.tls = Some(crate::tls::PeerTls::new(&self.tls)?);
        }
        Ok(())
    }

    fn apply_file(&mut self, f: FileSettings) -> Result<(), String> {
        macro_rules! take {
            ($($field:ident),*) => { $( if let Some(v) = f.$field { self.$field = v; } )* };
        }
        plain_settings!(take);
        if f.rules.is_some() {
            self.rules = f.rules;
        }
        if f.requirepass.is_some() {
            self.requirepass = f.requirepass;
        }
        if f.metrics_port.is_some() {
            self.metrics_port = f.metrics_port;
        }
        if f.grpc_port.is_some() {
            self.grpc_port = f.grpc_port;
        }
        if f.rls_config.is_some() {
            self.rls_config = f.rls_config;
        }
        if let Some(v) = f.rls_response_headers {
            self.rls_response_headers = v;
        }
        if let Some(u) = f.users {
            self.users = users_from_file(u)?;
        }
        if let Some(m) = f.maxmemory {
            self.maxmemory = file_size("maxmemory", m)?;
        }
        if let Some(m) = f.client_query_buffer_limit {
            self.client_query_buffer_limit = file_size("client-query-buffer-limit", m)?;
        }
        if let Some(m) = f.maxmemory_clients {
            self.maxmemory_clients = file_size("maxmemory-clients", m)?;
        }
        self.take_secret(f.cluster_secret, f.cluster_secret_file)?;
        self.take_tls(
            f.tls_cert_file,
            f.tls_key_file,
            f.tls_ca_cert_file,
            f.tls_auth_clients
                .map(|v| file_word("tls-auth-clients", v))
                .transpose()?,
            f.tls_cluster
                .map(|v| file_word("tls-cluster", v))
                .transpose()?,
        )
    }

    fn apply_flags(&mut self, f: &Flags) -> Result<(), String> {
        macro_rules! take {
            ($($field:ident),*) => { $( if let Some(v) = &f.$field { self.$field = v.clone(); } )* };
        }
        plain_settings!(take);
        if f.rules.is_some() {
            self.rules = f.rules.clone();
        }
        if f.requirepass.is_some() {
            self.requirepass = f.requirepass.clone();
        }
        if f.metrics_port.is_some() {
            self.metrics_port = f.metrics_port;
        }
        if f.grpc_port.is_some() {
            self.grpc_port = f.grpc_port;
        }
        if f.rls_config.is_some() {
            self.rls_config = f.rls_config.clone();
        }
        if let Some(v) = &f.rls_response_headers {
            self.rls_response_headers = match v.to_ascii_lowercase().as_str() {
                "yes" | "true" => true,
                "no" | "false" => false,
                _ => {
                    return Err(format!(
                        "--rls-response-headers: expected yes or no, got '{v}'"
                    ));
                }
            };
        }
        if let Some(m) = &f.maxmemory {
            self.maxmemory = parse_size(m)?;
        }
        if let Some(m) = &f.client_query_buffer_limit {
            self.client_query_buffer_limit = parse_size(m)?;
        }
        if let Some(m) = &f.maxmemory_clients {
            self.maxmemory_clients = parse_size(m)?;
        }
        self.take_secret(f.cluster_secret.clone(), f.cluster_secret_file.clone())?;
        self.take_tls(
            f.tls_cert_file.clone(),
            f.tls_key_file.clone(),
            f.tls_ca_cert_file.clone(),
            f.tls_auth_clients.clone(),
            f.tls_cluster.clone(),
        )
    }

    /// A secret given as a value or as a file replaces one given before (by the file when
    /// this is the command line); both at once is a mistake.
    fn take_secret(&mut self, value: Option<String>, file: Option<PathBuf>) -> Result<(), String> {
        match (value, file) {
            (Some(_), Some(_)) => {
                Err("give --cluster-secret or --cluster-secret-file, not both".into())
            }
            (Some(v), None) => {
                self.cluster_secret = Some(SecretSource::Value(v));
                Ok(())
            }
            (None, Some(p)) => {
                self.cluster_secret = Some(SecretSource::File(p));
                Ok(())
            }
            (None, None) => Ok(()),
        }
    }

    fn take_tls(
        &mut self,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
        auth_clients: Option<String>,
        cluster: Option<String>,
    ) -> Result<(), String> {
        if cert.is_some() {
            self.tls.cert = cert;
        }
        if key.is_some() {
            self.tls.key = key;
        }
        if ca.is_some() {
            self.tls.ca = ca;
        }
        if let Some(a) = auth_clients {
            self.tls.auth_clients = a.parse()?;
        }
        if let Some(c) = cluster {
            self.tls_cluster = yes_no("tls-cluster", &c)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("64kb"), Ok(65536));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn flags_override_file() {
        let dir = std::env::temp_dir().join(format!("bucketd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(&p, "port = 7000\nshards = 3\nmaxmemory = \"1mb\"\n").unwrap();
        let flags = Flags {
            config: Some(p.clone()),
            port: Some(7001),
            ..Flags::default()
        };
        let s = Settings::resolve(&flags).unwrap();
        assert_eq!((s.port, s.shards, s.maxmemory), (7001, 3, 1 << 20));
        std::fs::write(&p, "prot = 1\n").unwrap();
        assert!(Settings::resolve(&flags).is_err());
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = |f: Flags| match Settings::resolve(&f) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            err(Flags {
                shards: Some(0),
                ..Flags::default()
            }),
            "shards must be at least 1"
        );
        assert_eq!(
            err(Flags {
                node_id: Some(1),
                ..Flags::default()
            }),
            "--node-id needs --cluster-nodes"
        );
        assert_eq!(
            err(Flags {
                cluster_nodes: Some("1:127.0.0.1:7001:17001".into()),
                node_id: Some(2),
                ..Flags::default()
            }),
            "node id 2 is not in --cluster-nodes"
        );
        assert_eq!(
            err(Flags {
                maxmemory: Some("lots".into()),
                ..Flags::default()
            }),
            "invalid size 'lots'"
        );
    }

    #[test]
    fn quiet_after_from_file_and_flag() {
        let dir = std::env::temp_dir().join(format!("bucketd-cfg-quiet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(
            &p,
            "cluster-nodes = \"1:127.0.0.1:7001:17001\"\nnode-id = 1\nquiet-after-ms = 500\n",
        )
        .unwrap();
        let mut flags = Flags {
            config: Some(p.clone()),
            ..Flags::default()
        };
        let quiet = |f: &Flags| Settings::resolve(f).unwrap().cluster.unwrap().quiet_after;
        assert_eq!(quiet(&flags), Some(std::time::Duration::from_millis(500)));
        flags.quiet_after_ms = Some(0);
        assert_eq!(quiet(&flags), None);
        std::fs::write(
            &p,
            "cluster-nodes = \"1:127.0.0.1:7001:17001\"\nnode-id = 1\n",
        )
        .unwrap();
        flags.quiet_after_ms = None;
        assert_eq!(quiet(&flags), Some(std::time::Duration::from_secs(2)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_data_folder_with_a_cluster_file_restarts_its_node_in_the_cluster() {
        let dir = std::env::temp_dir().join(format!("bucketd-cfg-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let flags = Flags {
            port: Some(7004),
            data_dir: Some(dir.clone()),
            ..Flags::default()
        };
        // Without the file, a data folder is a standalone node's.
        assert!(Settings::resolve(&flags).unwrap().cluster.is_none());
        std::fs::write(
            dir.join(crate::cluster::membership::CLUSTER_FILE),
            "node-id = 4\ngroups = 8\nreplicas = 3\n\
             cluster-nodes = \"3:127.0.0.1:7003:17003,4:127.0.0.1:7004:17004\"\n",
        )
        .unwrap();
        let c = Settings::resolve(&flags).unwrap().cluster.unwrap();
        assert_eq!((c.node_id, c.spec.groups, c.spec.replicas), (4, 8, 3));
        assert_eq!(c.spec.nodes.len(), 2);
        assert!(c.joined && c.join.is_none());
        std::fs::write(
            dir.join(crate::cluster::membership::CLUSTER_FILE),
            "node-id = x\n",
        )
        .unwrap();
        assert!(Settings::resolve(&flags).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_joined_node_restarts_from_the_folder_a_join_takes_by_default() {
        // `--join` with only `--port` keeps its data in the default folder: a restart with only
        // `--port` must look there.
        let given = std::path::PathBuf::from("/some/where");
        assert_eq!(restart_dir(Some(given.clone()), 7004), Some(given));
        assert_eq!(restart_dir(None, 7004), Some(joined_data_dir(7004)));
        assert_eq!(restart_dir(None, 0), None);
    }

    #[test]
    fn raft_log_memory_from_file_and_flag() {
        let dir = std::env::temp_dir().join(format!("bucketd-cfg-logmem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        let node = "cluster-nodes = \"1:127.0.0.1:7001:17001\"\nnode-id = 1\n";
        std::fs::write(&p, format!("{node}raft-log-memory = \"2mb\"\n")).unwrap();
        let mut flags = Flags {
            config: Some(p.clone()),
            ..Flags::default()
        };
        let limit = |f: &Flags| Settings::resolve(f).map(|s| s.cluster.unwrap().log_memory);
        assert_eq!(limit(&flags).unwrap(), 2 << 20);
        flags.raft_log_memory = Some("64mb".into());
        assert_eq!(limit(&flags).unwrap(), 64 << 20);
        flags.raft_log_memory = Some("1kb".into());
        assert_eq!(
            limit(&flags).unwrap_err().to_string(),
            "raft-log-memory must be at least 64kb"
        );
        std::fs::write(&p, node).unwrap();
        flags.raft_log_memory = None;
        assert_eq!(
            limit(&flags).unwrap(),
            crate::cluster::node::DEFAULT_LOG_MEMORY
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
