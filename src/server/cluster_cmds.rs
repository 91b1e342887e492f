//! CLUSTER subcommands in Redis Cluster's formats, from this node's view of the groups.
//!
//! In bucketd a node leads some groups and follows in others, so it is a "master" for the slot
//! ranges of the groups it leads and a "replica" in the others. `CLUSTER SLOTS` and
//! `CLUSTER SHARDS` give, for every group, its leader first and then its other replicas.
//!
//! The view is honest about failures: a node lists itself as a group's leader only while a
//! majority acknowledges it (so a leader cut off from its majority stops claiming its groups
//! within the election timeout), and a peer not heard from lately shows as failed.

use crate::cluster::node::Cluster;
use crate::cluster::spec::{NodeSpec, redis_id};
use crate::cluster::typ::{GroupId, NodeId};
use crate::cmd::cluster::ClusterView;
use crate::protocol::ReplyWriter;

/// The group's serving leader as this node sees it; while none is known, the first replica
/// (other than this node) that is up, so clients always get a full slot map and a wrong guess
/// costs them one -MOVED.
fn leader_or_guess(c: &Cluster, g: GroupId) -> NodeId {
    if let Some(l) = c.serving_leader(g) {
        return l;
    }
    let placement = c.spec.placement(g);
    placement
        .iter()
        .copied()
        .find(|&id| id != c.me && c.is_up(id))
        .or_else(|| placement.iter().copied().find(|&id| id != c.me))
        .or_else(|| placement.first().copied())
        .unwrap_or(c.me)
}

/// Replicas of `g`, leader first.
fn members(c: &Cluster, g: GroupId) -> Vec<&NodeSpec> {
    let leader = leader_or_guess(c, g);
    let mut ids = c.spec.placement(g);
    ids.sort_by_key(|&id| id != leader);
    ids.iter().filter_map(|&id| c.spec.node(id)).collect()
}

fn write_node(w: &mut ReplyWriter, n: &NodeSpec) {
    w.array(4);
    w.bulk(n.host.as_bytes());
    w.int(i64::from(n.port));
    w.bulk(n.redis_id().as_bytes());
    w.map(0);
}

/// Answers one of the subcommands that report this node's view of the cluster.
pub(super) fn run(c: &Cluster, view: &ClusterView, w: &mut ReplyWriter) {
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
                for n in nodes {
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
            for n in &c.spec.nodes {
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
            let masters = c
                .spec
                .nodes
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
                c.spec.nodes.len(),
                c.spec.groups,
                c.spec.replicas,
            );
            w.verbatim(&text);
        }
    }
}
