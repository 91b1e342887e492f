//! Joining a cluster: what a node's data folder remembers of the cluster it belongs to
//! (`cluster.conf`), and asking a member to let a new node in.

use crate::cluster::errors::JoinError;
use crate::cluster::settings::{ClusterSettings, bind_host};
use crate::cluster::spec::{ClusterSpec, NodeSpec};
use crate::ids::NodeId;
use std::path::Path;
use std::time::Duration;

/// The file in a node's data folder that names its id and its cluster.
pub(crate) const CLUSTER_FILE: &str = "cluster.conf";

/// Writes what a node needs to rejoin from its data folder: its id and the cluster.
pub(super) fn write_cluster_file<'a>(
    dir: &Path,
    me: NodeId,
    groups: u32,
    replicas: usize,
    nodes: impl IntoIterator<Item = &'a NodeSpec>,
) -> std::io::Result<()> {
    let text = format!(
        "# Written by bucketd: the cluster this node belongs to.\nnode-id = {me}\ngroups = {groups}\nreplicas = {replicas}\ncluster-nodes = \"{}\"\n",
        ClusterSpec::format_nodes(nodes)
    );
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{CLUSTER_FILE}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join(CLUSTER_FILE))
}

/// A node's cluster as its data folder remembers it: (its id, the cluster).
pub(crate) fn read_cluster_file(dir: &Path) -> Result<Option<(NodeId, ClusterSpec)>, JoinError> {
    let path = dir.join(CLUSTER_FILE);
    let bad = |problem: &str| JoinError::ClusterFile {
        path: path.clone(),
        problem: problem.to_string(),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(&e.to_string())),
    };
    let doc: toml::Table = text.parse().map_err(|e| bad(&format!("{e}")))?;
    let int = |k: &str| {
        doc.get(k)
            .and_then(toml::Value::as_integer)
            .ok_or_else(|| bad(&format!("no {k}")))
    };
    let id = u64::try_from(int("node-id")?).map_err(|_| bad("bad node-id"))?;
    let groups = u32::try_from(int("groups")?).map_err(|_| bad("bad groups"))?;
    let replicas = usize::try_from(int("replicas")?).map_err(|_| bad("bad replicas"))?;
    let nodes = doc
        .get("cluster-nodes")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| bad("no cluster-nodes"))?;
    let nodes = ClusterSpec::parse_nodes(nodes).map_err(|e| bad(&e.to_string()))?;
    Ok(Some((
        id,
        ClusterSpec {
            nodes,
            replicas,
            groups,
        },
    )))
}

/// Asks a member at `addr` (its client address) to let this node in: returns this node's new
/// id and the cluster as the member knows it.
pub(crate) async fn request_join(
    addr: &str,
    me: &NodeSpec,
) -> Result<(NodeId, ClusterSpec), JoinError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let unreachable = |error| JoinError::Unreachable {
        addr: addr.to_string(),
        error,
    };
    let io = |error| JoinError::Io {
        addr: addr.to_string(),
        error,
    };
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(None))?
        .map_err(|e| unreachable(Some(e)))?;
    let args = [
        "BK.CLUSTER".to_string(),
        "JOIN".to_string(),
        me.host.clone(),
        me.port.to_string(),
        me.peer_port.to_string(),
    ];
    let mut req = format!("*{}\r\n", args.len());
    for a in &args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).await.map_err(io)?;
    // The answer is one line: "+OK id groups replicas nodes" or "-ERR ...".
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        while !buf.ends_with(b"\r\n") && buf.len() < 1 << 20 {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .map_err(|_| JoinError::NoAnswer {
            addr: addr.to_string(),
        })?
        .map_err(io)?;
    let line = String::from_utf8_lossy(&buf).trim_end().to_string();
    if let Some(err) = line.strip_prefix('-') {
        return Err(JoinError::Refused {
            addr: addr.to_string(),
            why: err.to_string(),
        });
    }
    let fields: Vec<&str> = line.trim_start_matches('+').split(' ').collect();
    let bad_answer = || JoinError::BadAnswer {
        addr: addr.to_string(),
        line: line.clone(),
    };
    let [_, id, groups, replicas, nodes] = fields[..] else {
        return Err(bad_answer());
    };
    let num = |v: &str| v.parse::<u64>().map_err(|_| bad_answer());
    let id = num(id)?;
    let groups = u32::try_from(num(groups)?).map_err(|_| JoinError::BadGroupCount)?;
    let replicas = usize::try_from(num(replicas)?).map_err(|_| JoinError::BadReplicas)?;
    let mut nodes = ClusterSpec::parse_nodes(nodes).map_err(JoinError::BadNodes)?;
    nodes.retain(|n| n.id != id);
    nodes.push(NodeSpec { id, ..me.clone() });
    Ok((
        id,
        ClusterSpec {
            nodes,
            replicas,
            groups,
        },
    ))
}

/// Gives a node started with `--join` its id and the members: from its data folder when it
/// joined before (a restart), otherwise from the member at `addr`.
pub(crate) async fn resolve_join(cs: &mut ClusterSettings, addr: &str) -> Result<(), JoinError> {
    let me = cs.spec.nodes.first().cloned().ok_or(JoinError::NoAddress)?;
    let (id, spec) =
        match read_cluster_file(&cs.data_dir)? {
            Some(known) => known,
            None => {
                // The peer port must answer while the member checks it: bound now, served once
                // the node runs.
                let probe = std::net::TcpListener::bind((bind_host(&me.host), me.peer_port))
                    .map_err(|error| JoinError::PeerPort {
                        port: me.peer_port,
                        error,
                    })?;
                let (id, spec) = request_join(addr, &me).await?;
                drop(probe);
                write_cluster_file(&cs.data_dir, id, spec.groups, spec.replicas, &spec.nodes)
                    .map_err(|error| JoinError::WriteFile {
                        dir: cs.data_dir.clone(),
                        error,
                    })?;
                tracing::info!(node = id, "the cluster gave this node its id");
                (id, spec)
            }
        };
    cs.node_id = id;
    cs.spec = spec;
    cs.joined = true;
    Ok(())
}
