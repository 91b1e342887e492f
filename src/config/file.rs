//! The `--config` file's shape: the same settings as the flags, in TOML, and the file's
//! own ways to give a size or a yes/no word.

use super::values::{SettingError, parse_size};
use crate::error::StartError;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The config file's shape: the same settings as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct FileSettings {
    #[serde(alias = "bind_addr")]
    pub(super) bind: Option<String>,
    pub(super) port: Option<u16>,
    pub(super) shards: Option<usize>,
    pub(super) rules: Option<PathBuf>,
    pub(super) requirepass: Option<String>,
    pub(super) maxclients: Option<usize>,
    #[serde(alias = "max_keys")]
    pub(super) max_keys: Option<usize>,
    pub(super) maxmemory: Option<toml::Value>,
    #[serde(alias = "proto_max_bulk_len")]
    pub(super) proto_max_bulk_len: Option<usize>,
    #[serde(alias = "max_args")]
    pub(super) max_args: Option<usize>,
    #[serde(alias = "max_inline_len")]
    pub(super) max_inline_len: Option<usize>,
    #[serde(alias = "client_query_buffer_limit")]
    pub(super) client_query_buffer_limit: Option<toml::Value>,
    #[serde(alias = "maxmemory_clients")]
    pub(super) maxmemory_clients: Option<toml::Value>,
    #[serde(alias = "rules_reload_ms")]
    pub(super) rules_reload_ms: Option<u64>,
    pub(super) log: Option<String>,
    #[serde(alias = "cluster_nodes")]
    pub(super) cluster_nodes: Option<String>,
    #[serde(alias = "node_id")]
    pub(super) node_id: Option<u64>,
    pub(super) replicas: Option<usize>,
    pub(super) groups: Option<u32>,
    #[serde(alias = "data_dir")]
    pub(super) data_dir: Option<std::path::PathBuf>,
    pub(super) forward: Option<bool>,
    pub(super) fsync: Option<bool>,
    #[serde(alias = "quiet_after_ms")]
    pub(super) quiet_after_ms: Option<u64>,
    #[serde(alias = "raft_log_memory")]
    pub(super) raft_log_memory: Option<toml::Value>,
    pub(super) join: Option<String>,
    #[serde(alias = "peer_port")]
    pub(super) peer_port: Option<u16>,
    #[serde(alias = "announce_host")]
    pub(super) announce_host: Option<String>,
    #[serde(alias = "metrics_port")]
    pub(super) metrics_port: Option<u16>,
    #[serde(alias = "grpc_port")]
    pub(super) grpc_port: Option<u16>,
    #[serde(alias = "rls_config")]
    pub(super) rls_config: Option<PathBuf>,
    #[serde(alias = "rls_response_headers")]
    pub(super) rls_response_headers: Option<bool>,
    #[serde(alias = "save_interval")]
    pub(super) save_interval: Option<u64>,
    /// Named users: `[users.NAME]` with `password` and `readonly`.
    pub(super) users: Option<std::collections::BTreeMap<String, UserFile>>,
    #[serde(alias = "cluster_secret")]
    pub(super) cluster_secret: Option<String>,
    #[serde(alias = "cluster_secret_file")]
    pub(super) cluster_secret_file: Option<PathBuf>,
    #[serde(alias = "tls_port")]
    pub(super) tls_port: Option<u16>,
    #[serde(alias = "tls_cert_file")]
    pub(super) tls_cert_file: Option<PathBuf>,
    #[serde(alias = "tls_key_file")]
    pub(super) tls_key_file: Option<PathBuf>,
    #[serde(alias = "tls_ca_cert_file")]
    pub(super) tls_ca_cert_file: Option<PathBuf>,
    #[serde(alias = "tls_auth_clients")]
    pub(super) tls_auth_clients: Option<toml::Value>,
    #[serde(alias = "tls_cluster")]
    pub(super) tls_cluster: Option<toml::Value>,
}

impl FileSettings {
    /// Reads and parses the `--config` file.
    pub(super) fn read(path: &Path) -> Result<FileSettings, StartError> {
        let text = std::fs::read_to_string(path).map_err(|error| StartError::ReadConfig {
            path: path.to_path_buf(),
            error,
        })?;
        toml::from_str(&text).map_err(|error| StartError::ParseConfig {
            path: path.to_path_buf(),
            error: Box::new(error),
        })
    }
}

/// One `[users.NAME]` table of the config file.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct UserFile {
    pub(super) password: String,
    #[serde(default)]
    pub(super) readonly: bool,
}

/// A yes/no/word setting in the config file: a string, or a TOML boolean.
pub(super) fn file_word(name: &'static str, v: toml::Value) -> Result<String, SettingError> {
    match v {
        toml::Value::String(s) => Ok(s),
        toml::Value::Boolean(true) => Ok("yes".into()),
        toml::Value::Boolean(false) => Ok("no".into()),
        _ => Err(SettingError::NotAWord(name)),
    }
}

/// A size in the config file: a number of bytes or a string such as "512mb".
pub(super) fn file_size(name: &'static str, v: toml::Value) -> Result<usize, SettingError> {
    match v {
        toml::Value::Integer(i) => usize::try_from(i).map_err(|_| SettingError::Negative(name)),
        toml::Value::String(s) => parse_size(&s),
        _ => Err(SettingError::NotASize(name)),
    }
}
