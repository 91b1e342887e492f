//! Cluster commands, answered from this node's view of the groups in Redis Cluster's
//! formats: CLUSTER, ASKING, READONLY, READWRITE, and BK.CLUSTER for operators.
//!
//! In bucketd a node leads some groups and follows in others, so it is a "master" for the slot
//! ranges of the groups it leads and a "replica" in the others. `CLUSTER SLOTS` and
//! `CLUSTER SHARDS` give, for every group, its leader first and then its other replicas.
//!
//! The view is honest about failures: a node lists itself as a group's leader only while a
//! majority acknowledges it (so a leader cut off from its majority stops claiming its groups
//! within the election timeout), and a peer not heard from lately shows as failed.

use super::{Failure, fail};
use crate::cluster::Cluster;
use crate::cluster::MemberState;
use crate::cluster::{ClusterSpec, NodeSpec, redis_id};
use crate::cluster::{GroupId, NodeId};
use crate::cmd::{BkCluster, ClusterCmd, ClusterSub, ClusterView};
use crate::protocol::ReplyWriter;
use crate::server::session::Session;

const NO_CLUSTER: &str = "ERR This instance has cluster support disabled";

/// Runs a cluster command from this node's view of the groups.
pub(super) async fn run(
    s: &mut Session,
    cmd: ClusterCmd,
    buf: &mut Vec<u8>,
) -> Result<(), Failure> {
    match cmd {
        ClusterCmd::Bk(cmd) => {
            let cmd = cmd?;
            let Some(cl) = s.node().cluster().cloned() else {
                return Err(fail(NO_CLUSTER));
            };
            let mut w = ReplyWriter::new(buf, s.resp3());
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
            s.note_subcommand(sub);
            match cmd? {
                ClusterSub::KeySlot(slot) => ReplyWriter::new(buf, s.resp3()).int(i64::from(slot)),
                ClusterSub::View(view) => match s.node().cluster() {
                    Some(cl) => {
                        let cl = cl.clone();
                        write_view(&cl, &view?, &mut ReplyWriter::new(buf, s.resp3()));
                    }
                    None => return Err(fail(NO_CLUSTER)),
                },
            }
        }
        ClusterCmd::Accepted => {
            if s.node().cluster().is_none() {
                return Err(fail(NO_CLUSTER));
            }
            ReplyWriter::new(buf, s.resp3()).ok();
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
            MemberState::Active if !c.is_up(n.id) => "down",
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
