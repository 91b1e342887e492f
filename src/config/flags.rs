//! The command line: every setting as a flag.

use clap::Parser;
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
