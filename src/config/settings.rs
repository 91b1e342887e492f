//! The resolved settings: the defaults, then the `--config` file, then the flags.

use super::cluster::ClusterRaw;
use super::file::{FileSettings, file_size, file_word};
use super::flags::Flags;
use super::users::{User, users_from_file};
use super::values::{SettingError, parse_size, yes_no};
use crate::error::StartError;
use std::path::PathBuf;

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
    pub cluster: Option<crate::cluster::ClusterSettings>,
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
            let mut f = FileSettings::read(path)?;
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
                    .transpose()?
                    .map(|n| n as u64),
                join: f.join.take(),
                peer_port: f.peer_port.take(),
                announce_host: f.announce_host.take(),
            });
            s.apply_file(f)?;
        }
        s.apply_flags(flags)?;
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
                .transpose()?
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

    fn apply_file(&mut self, f: FileSettings) -> Result<(), SettingError> {
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

    fn apply_flags(&mut self, f: &Flags) -> Result<(), SettingError> {
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
                _ => return Err(SettingError::RlsResponseHeaders(v.clone())),
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
    fn take_secret(
        &mut self,
        value: Option<String>,
        file: Option<PathBuf>,
    ) -> Result<(), SettingError> {
        match (value, file) {
            (Some(_), Some(_)) => Err(SettingError::TwoSecrets),
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
    ) -> Result<(), SettingError> {
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
            self.tls.auth_clients = a.parse().map_err(SettingError::TlsAuthClients)?;
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
            dir.join(crate::cluster::CLUSTER_FILE),
            "node-id = 4\ngroups = 8\nreplicas = 3\n\
             cluster-nodes = \"3:127.0.0.1:7003:17003,4:127.0.0.1:7004:17004\"\n",
        )
        .unwrap();
        let c = Settings::resolve(&flags).unwrap().cluster.unwrap();
        assert_eq!((c.node_id, c.spec.groups, c.spec.replicas), (4, 8, 3));
        assert_eq!(c.spec.nodes.len(), 2);
        assert!(c.joined && c.join.is_none());
        std::fs::write(dir.join(crate::cluster::CLUSTER_FILE), "node-id = x\n").unwrap();
        assert!(Settings::resolve(&flags).is_err());
        let _ = std::fs::remove_dir_all(&dir);
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
        assert_eq!(limit(&flags).unwrap(), crate::cluster::DEFAULT_LOG_MEMORY);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
