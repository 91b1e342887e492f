//! The cluster settings the file and the flags give, gathered and then checked into the
//! cluster's own settings.

use crate::cluster::ClusterSettings;
use crate::error::StartError;

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
    fn apply(&self, c: &mut ClusterSettings) {
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
pub(super) struct ClusterRaw {
    pub(super) nodes: Option<String>,
    pub(super) node_id: Option<u64>,
    pub(super) replicas: Option<usize>,
    pub(super) groups: Option<u32>,
    pub(super) data_dir: Option<std::path::PathBuf>,
    pub(super) forward: Option<bool>,
    pub(super) fsync: Option<bool>,
    pub(super) quiet_after_ms: Option<u64>,
    pub(super) log_memory: Option<u64>,
    pub(super) join: Option<String>,
    pub(super) peer_port: Option<u16>,
    pub(super) announce_host: Option<String>,
}

/// Where a node that joins a cluster keeps its data when no `--data-dir` is given.
pub(super) fn joined_data_dir(port: u16) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("bucketd-data/port-{port}"))
}

/// Where a node started without `--cluster-nodes` and `--join` looks for the `cluster.conf` of
/// a cluster it joined earlier: its `--data-dir`, or the folder a join on its port defaults to.
/// None with neither (a port chosen by the system never joined anything).
pub(super) fn restart_dir(
    data_dir: Option<std::path::PathBuf>,
    port: u16,
) -> Option<std::path::PathBuf> {
    data_dir.or_else(|| (port != 0).then(|| joined_data_dir(port)))
}

impl ClusterRaw {
    pub(super) fn merge(&mut self, other: ClusterRaw) {
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

    pub(super) fn build(
        self,
        bind: &str,
        port: u16,
    ) -> Result<Option<ClusterSettings>, StartError> {
        use crate::cluster::{ClusterSpec, NodeSpec};
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
                let Some((id, spec)) = crate::cluster::read_cluster_file(&dir)
                    .map_err(|e| StartError::Spec(e.to_string()))?
                else {
                    return Ok(None);
                };
                let mut c = ClusterSettings::new(id, spec, dir);
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
            let mut c = ClusterSettings::new(0, spec, data_dir);
            c.join = Some(join);
            common.apply(&mut c);
            return Ok(Some(c));
        };
        let nodes =
            ClusterSpec::parse_nodes(&nodes).map_err(|e| StartError::Spec(e.to_string()))?;
        let node_id = self.node_id.ok_or(StartError::NoNodeId)?;
        let replicas = self.replicas.unwrap_or(3);
        let spec = ClusterSpec {
            nodes,
            replicas,
            // Enough for a cluster to grow to 32 nodes each leading a group; idle groups cost
            // little (quiet), so more would do too, at smaller batches per group under load.
            groups: self.groups.unwrap_or(32),
        };
        spec.validate()
            .map_err(|e| StartError::Spec(e.to_string()))?;
        if spec.node(node_id).is_none() {
            return Err(StartError::NodeIdNotListed(node_id));
        }
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| std::path::PathBuf::from(format!("bucketd-data/node-{node_id}")));
        let mut c = ClusterSettings::new(node_id, spec, data_dir);
        common.apply(&mut c);
        Ok(Some(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_node_restarts_from_the_folder_a_join_takes_by_default() {
        // `--join` with only `--port` keeps its data in the default folder: a restart with only
        // `--port` must look there.
        let given = std::path::PathBuf::from("/some/where");
        assert_eq!(restart_dir(Some(given.clone()), 7004), Some(given));
        assert_eq!(restart_dir(None, 7004), Some(joined_data_dir(7004)));
        assert_eq!(restart_dir(None, 0), None);
    }
}
