//! Cluster commands: CLUSTER, ASKING, READONLY, READWRITE. Their entries, how their
//! arguments parse into a `ClusterCmd`, and how the node answers them from its view of the
//! groups, in Redis Cluster's formats.
//!
//! In bucketd a node leads some groups and follows in others, so it is a "master" for the slot
//! ranges of the groups it leads and a "replica" in the others. `CLUSTER SLOTS` and
//! `CLUSTER SHARDS` give, for every group, its leader first and then its other replicas.
//!
//! The view is honest about failures: a node lists itself as a group's leader only while a
//! majority acknowledges it (so a leader cut off from its majority stops claiming its groups
//! within the election timeout), and a peer not heard from lately shows as failed.

use super::node::{Failure, msg as fail, note_subcommand};
use super::table::{CommandSpec, Parser, command, subcommand};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::cluster::node::Cluster;
use crate::cluster::spec::{ClusterSpec, NodeSpec, redis_id};
use crate::cluster::typ::{GroupId, NodeId};
use crate::protocol::ReplyWriter;
use crate::protocol::{ArgError, Args};
use crate::server::conn::Conn;
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
    Remove(NodeId),
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
                    .parse::<NodeId>()
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

const NO_CLUSTER: &str = "ERR This instance has cluster support disabled";

/// Runs a cluster command from this node's view of the groups.
pub(crate) async fn run(c: &mut Conn, cmd: ClusterCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ClusterCmd::Bk(cmd) => {
            let cmd = cmd?;
            let Some(cl) = c.node().cluster().cloned() else {
                return Err(fail(NO_CLUSTER));
            };
            let mut w = ReplyWriter::new(buf, c.resp3());
            match cmd {
                BkCluster::Status => write_status(&cl, &mut w),
                BkCluster::Remove(id) => {
                    cl.remove_node(id).await.map_err(fail)?;
                    w.ok();
                }
                BkCluster::Join {
                    host,
                    port,
                    peer_port,
                } => {
                    let id = cl.admit(&host, port, peer_port).await.map_err(fail)?;
                    let m = cl.metadata();
                    let nodes = ClusterSpec::format_nodes(m.current().map(|n| &n.node));
                    w.simple(&format!("JOINED {id} {} {} {nodes}", m.groups, m.replicas));
                }
            }
        }
        ClusterCmd::Cluster { sub, cmd } => {
            note_subcommand(c, sub);
            match cmd? {
                ClusterSub::KeySlot(slot) => ReplyWriter::new(buf, c.resp3()).int(i64::from(slot)),
                ClusterSub::View(view) => match c.node().cluster() {
                    Some(cl) => {
                        let cl = cl.clone();
                        write_view(&cl, &view?, &mut ReplyWriter::new(buf, c.resp3()));
                    }
                    None => return Err(fail(NO_CLUSTER)),
                },
            }
        }
        ClusterCmd::Accepted => {
            if c.node().cluster().is_none() {
                return Err(fail(NO_CLUSTER));
            }
            ReplyWriter::new(buf, c.resp3()).ok();
        }
    }
    Ok(())
}

/// The group's serving leader as this node sees it; while none is known, the first replica
/// (other than this node) that is up, so clients always get a full slot map and a wrong guess
/// costs them one -MOVED.
fn leader_or_guess(c: &Cluster, g: GroupId) -> NodeId {
    if let Some(l) = c.serving_leader(g) {
        return l;
    }
    let placement = c.voters(g);
    placement
        .iter()
        .copied()
        .find(|&id| id != c.me && c.is_up(id))
        .or_else(|| placement.iter().copied().find(|&id| id != c.me))
        .or_else(|| placement.first().copied())
        .unwrap_or(c.me)
}

/// Replicas of `g`, leader first.
fn members(c: &Cluster, g: GroupId) -> Vec<NodeSpec> {
    let leader = leader_or_guess(c, g);
    let mut ids = c.voters(g);
    ids.sort_by_key(|&id| id != leader);
    ids.iter().filter_map(|&id| c.node(id)).collect()
}

fn write_node(w: &mut ReplyWriter, n: &NodeSpec) {
    w.array(4);
    w.bulk(n.host.as_bytes());
    w.int(i64::from(n.port));
    w.bulk(n.redis_id().as_bytes());
    w.map(0);
}

/// Answers one of the subcommands that report this node's view of the cluster.
fn write_view(c: &Cluster, view: &ClusterView, w: &mut ReplyWriter) {
    match view {
        ClusterView::MyId => {
            w.bulk(redis_id(c.me).as_bytes());
        }
        ClusterView::Slots => {
            w.array(c.spec.groups as usize);
            for g in 0..c.spec.groups {
                let (lo, hi) = c.spec.group_slots(g);
                let nodes = members(c, g);
                w.array(2 + nodes.len());
                w.int(i64::from(lo));
                w.int(i64::from(hi));
                for n in &nodes {
                    write_node(w, n);
                }
            }
        }
        ClusterView::Shards => {
            w.array(c.spec.groups as usize);
            for g in 0..c.spec.groups {
                let (lo, hi) = c.spec.group_slots(g);
                let leader = leader_or_guess(c, g);
                let nodes = members(c, g);
                w.map(2);
                w.bulk(b"slots");
                w.array(2);
                w.int(i64::from(lo));
                w.int(i64::from(hi));
                w.bulk(b"nodes");
                w.array(nodes.len());
                for n in nodes {
                    w.map(7);
                    w.kv_str("id", &n.redis_id());
                    w.kv_int("port", i64::from(n.port));
                    w.kv_str("ip", &n.host);
                    w.kv_str("endpoint", &n.host);
                    w.kv_str("role", if n.id == leader { "master" } else { "replica" });
                    w.kv_int("replication-offset", 0);
                    w.kv_str("health", if c.is_up(n.id) { "online" } else { "fail" });
                }
            }
        }
        ClusterView::Nodes => {
            let mut text = String::new();
            for n in &c.nodes() {
                let up = c.is_up(n.id);
                let led: Vec<String> = (0..c.spec.groups)
                    .filter(|&g| up && leader_or_guess(c, g) == n.id)
                    .map(|g| {
                        let (lo, hi) = c.spec.group_slots(g);
                        if lo == hi {
                            lo.to_string()
                        } else {
                            format!("{lo}-{hi}")
                        }
                    })
                    .collect();
                let flags = match (n.id == c.me, up) {
                    (true, _) => "myself,master",
                    (false, true) => "master",
                    (false, false) => "master,fail",
                };
                let link = if n.id == c.me || (up && c.network().link_open(n.id)) {
                    "connected"
                } else {
                    "disconnected"
                };
                text.push_str(&format!(
                    "{} {}:{}@{} {} - 0 0 1 {link}{}{}\n",
                    n.redis_id(),
                    n.host,
                    n.port,
                    n.peer_port,
                    flags,
                    if led.is_empty() { "" } else { " " },
                    led.join(" ")
                ));
            }
            w.verbatim(&text);
        }
        ClusterView::Info => {
            let led = (0..c.spec.groups)
                .filter(|&g| c.serving_leader(g).is_some())
                .count();
            let ok_slots: u32 = (0..c.spec.groups)
                .filter(|&g| c.serving_leader(g).is_some())
                .map(|g| {
                    let (lo, hi) = c.spec.group_slots(g);
                    u32::from(hi) - u32::from(lo) + 1
                })
                .sum();
            let nodes = c.nodes();
            let masters = nodes
                .iter()
                .filter(|n| (0..c.spec.groups).any(|g| leader_or_guess(c, g) == n.id))
                .count();
            let state = if led == c.spec.groups as usize {
                "ok"
            } else {
                "fail"
            };
            let text = format!(
                "cluster_state:{state}\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:{ok_slots}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:{}\r\ncluster_known_nodes:{}\r\ncluster_size:{masters}\r\ncluster_current_epoch:1\r\ncluster_my_epoch:1\r\ncluster_groups:{}\r\ncluster_replicas:{}\r\n",
                16384 - ok_slots,
                nodes.len(),
                c.spec.groups,
                c.spec.replicas,
            );
            w.verbatim(&text);
        }
    }
}

/// BK.CLUSTER STATUS: the members, their state and load, and the moves still to make.
fn write_status(c: &Cluster, w: &mut ReplyWriter) {
    let m = c.metadata();
    let members: Vec<_> = m.current().collect();
    let leaders = |id: NodeId| {
        (0..c.spec.groups)
            .filter(|&g| c.serving_leader(g) == Some(id))
            .count()
    };
    let this_node = match m.state_of(c.me) {
        Some(s) => s.name(),
        None => "joining",
    };
    w.map(7);
    w.kv_int("nodes", members.len() as i64);
    w.kv_int("groups", i64::from(c.spec.groups));
    w.kv_int("replicas", c.spec.replicas as i64);
    w.kv_int("moves_in_progress", m.moves_in_progress() as i64);
    w.kv_int("version", i64::try_from(m.version).unwrap_or(i64::MAX));
    w.kv_str("this_node", this_node);
    w.bulk(b"members");
    w.array(members.len());
    for member in members {
        let n = &member.node;
        let state = match member.state {
            crate::cluster::meta::MemberState::Active if !c.is_up(n.id) => "down",
            s => s.name(),
        };
        w.map(7);
        w.kv_int("id", i64::try_from(n.id).unwrap_or(i64::MAX));
        w.kv_str("address", &n.client_addr());
        w.kv_str("peer_address", &n.peer_addr());
        w.kv_str("state", state);
        w.kv_int("replicas", m.replicas_on(n.id) as i64);
        w.kv_int("leaders", leaders(n.id) as i64);
        w.kv_str("myself", if n.id == c.me { "yes" } else { "no" });
    }
}
