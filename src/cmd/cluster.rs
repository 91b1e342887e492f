//! Cluster commands: CLUSTER, ASKING, READONLY, READWRITE, BK.CLUSTER. Their entries and how
//! their arguments parse into a `ClusterCmd`; the server answers them from its view of the
//! groups.

use super::table::{CommandSpec, Parser, command, subcommand};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::protocol::{ArgError, Args};
use crate::slot::key_slot;

/// A cluster command, parsed.
pub enum ClusterCmd {
    /// CLUSTER subcommand ...: `sub` as in `ConnectionCmd::Client`.
    Cluster {
        sub: usize,
        cmd: Result<ClusterSub, ArgError>,
    },
    /// ASKING, READONLY, READWRITE: accepted in cluster mode, with nothing to change.
    Accepted,
    /// BK.CLUSTER: the cluster's members, for operators.
    Bk(Result<BkCluster, ArgError>),
}

/// BK.CLUSTER STATUS | REMOVE id | JOIN host port peer-port.
pub enum BkCluster {
    Status,
    /// The node's id, as the cluster numbers its members.
    Remove(u64),
    /// Sent by a starting node given `--join`.
    Join {
        host: String,
        port: u16,
        peer_port: u16,
    },
}

pub enum ClusterSub {
    /// KEYSLOT key: answered by standalone nodes too.
    KeySlot(u16),
    /// A subcommand only a cluster answers; a standalone node refuses it before it looks at
    /// why its arguments would be refused.
    View(Result<ClusterView, ArgError>),
}

/// The subcommands that report this node's view of the cluster.
pub enum ClusterView {
    MyId,
    Slots,
    Shards,
    Nodes,
    Info,
}

pub(super) const COMMANDS: &[CommandSpec] = &[
    command! {
        name: "cluster",
        arity: -2,
        flags: ["stale"],
        keys: (0, 0, 0),
        acl: ["@slow"],
        group: "cluster",
        summary: "Cluster commands; standalone nodes answer CLUSTER KEYSLOT.",
        parse: Parser::Node(parse_cluster),
    },
    command! {
        name: "bk.cluster",
        arity: -2,
        flags: ["admin"],
        keys: (0, 0, 0),
        acl: ["@admin", "@slow"],
        group: "cluster",
        summary: "The cluster's members: BK.CLUSTER STATUS | REMOVE node-id | JOIN host port peer-port.",
        parse: Parser::Node(parse_bk_cluster),
    },
    command! {
        name: "asking",
        arity: 1,
        flags: ["fast"],
        keys: (0, 0, 0),
        acl: ["@fast", "@connection"],
        group: "cluster",
        summary: "Lets the next command on this connection reach a slot being imported.",
        parse: Parser::Node(parse_accepted),
    },
    command! {
        name: "readonly",
        arity: 1,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@fast"],
        group: "cluster",
        summary: "Enables reads from replicas on this connection.",
        parse: Parser::Node(parse_accepted),
    },
    command! {
        name: "readwrite",
        arity: 1,
        flags: ["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: ["@keyspace", "@fast"],
        group: "cluster",
        summary: "Disables reads from replicas on this connection.",
        parse: Parser::Node(parse_accepted),
    },
];

fn parse_cluster(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sub = a.next_keyword()?;
    Ok(NodeCmd::Cluster(ClusterCmd::Cluster {
        sub: subcommand("cluster", &sub),
        cmd: parse_cluster_sub(a, &sub),
    }))
}

fn parse_cluster_sub(a: &mut Args, sub: &str) -> Result<ClusterSub, ArgError> {
    if sub == "KEYSLOT" {
        let key = a.next_bytes()?;
        a.finish_as(Trailing::Syntax)?;
        return Ok(ClusterSub::KeySlot(key_slot(&key)));
    }
    let view = match sub {
        "MYID" => Ok(ClusterView::MyId),
        "SLOTS" => Ok(ClusterView::Slots),
        "SHARDS" => Ok(ClusterView::Shards),
        "NODES" => Ok(ClusterView::Nodes),
        "INFO" => Ok(ClusterView::Info),
        "COUNTKEYSINSLOT" | "GETKEYSINSLOT" => {
            Err(msg(format!("ERR CLUSTER {sub} is not supported")))
        }
        other => Err(msg(format!(
            "ERR unknown subcommand '{other}'. Try CLUSTER HELP."
        ))),
    };
    let view = match view {
        Ok(v) => a.finish_as(Trailing::Syntax).map(|()| v),
        Err(e) => Err(e),
    };
    Ok(ClusterSub::View(view))
}

fn parse_bk_cluster(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sub = a.next_keyword()?;
    let parsed = (|| {
        let cmd = match sub.as_str() {
            "STATUS" => BkCluster::Status,
            "REMOVE" => {
                let id = a.next_string()?;
                let id = id
                    .parse::<u64>()
                    .map_err(|_| msg(format!("ERR invalid node id '{id}'")))?;
                BkCluster::Remove(id)
            }
            "JOIN" => {
                let host = a.next_string()?;
                // The host goes into every node's member list and cluster.conf, where commas,
                // spaces and quotes would break it.
                let fits =
                    |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
                if host.is_empty() || host.len() > 255 || !host.chars().all(fits) {
                    return Err(msg(format!(
                        "ERR invalid host '{host}': a name or address of letters, digits, '.', '-', '_' or ':'"
                    )));
                }
                let mut port = || -> Result<u16, ArgError> {
                    let p = a.next_string()?;
                    p.parse::<u16>()
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| msg(format!("ERR invalid port '{p}'")))
                };
                let port_ = port()?;
                let peer_port = port()?;
                BkCluster::Join {
                    host,
                    port: port_,
                    peer_port,
                }
            }
            other => {
                return Err(msg(format!(
                    "ERR unknown subcommand '{other}' for BK.CLUSTER: use STATUS, REMOVE or JOIN"
                )));
            }
        };
        a.finish_as(Trailing::Syntax)?;
        Ok(cmd)
    })();
    Ok(NodeCmd::Cluster(ClusterCmd::Bk(parsed)))
}

fn parse_accepted(_: &mut Args) -> Result<NodeCmd, ArgError> {
    Ok(NodeCmd::Cluster(ClusterCmd::Accepted))
}
