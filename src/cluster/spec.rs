//! The cluster description: which nodes exist, where they listen, how many replicas each
//! group has and how many groups the slots are split into; and the placement derived from it.

use crate::cluster::typ::{GroupId, NodeId};
use crate::slot::SLOTS;
use serde::{Deserialize, Serialize};

/// One node: clients connect to `host:port`, peers to `host:peer_port`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub id: NodeId,
    pub host: String,
    pub port: u16,
    pub peer_port: u16,
}

impl NodeSpec {
    pub fn client_addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn peer_addr(&self) -> String {
        format!("{}:{}", self.host, self.peer_port)
    }

    /// The 40-character id Redis Cluster clients expect.
    pub fn redis_id(&self) -> String {
        redis_id(self.id)
    }
}

pub fn redis_id(id: NodeId) -> String {
    format!("{id:040x}")
}

/// The most replicas a group may be given: far more than any group needs (every write waits
/// for a majority of them), and small enough for every count the metadata keeps.
pub(crate) const MAX_REPLICAS: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    pub nodes: Vec<NodeSpec>,
    /// Replicas per group (Raft voters); a group has this many, or one per node when the
    /// cluster has fewer nodes.
    pub replicas: usize,
    /// Number of groups the 16384 slots are split into; fixed for the cluster's life.
    pub groups: u32,
}

/// Why a cluster's description was refused; its text is what the operator is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecError {
    /// A `--cluster-nodes` entry is not `ID:HOST:PORT:PEER_PORT`.
    BadNode(String),
    /// One field of an entry does not parse: (which field, the entry).
    BadField(&'static str, String),
    NoNodes,
    DuplicateIds,
    ReservedId,
    Replicas,
    Groups,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecError::BadNode(item) => {
                write!(f, "invalid node '{item}': expected ID:HOST:PORT:PEER_PORT")
            }
            SpecError::BadField(what, item) => write!(f, "invalid {what} in node '{item}'"),
            SpecError::NoNodes => f.write_str("a cluster needs at least one node"),
            SpecError::DuplicateIds => f.write_str("node ids must be unique"),
            SpecError::ReservedId => f.write_str("node id 0 is reserved"),
            SpecError::Replicas => write!(f, "replicas must be between 1 and {MAX_REPLICAS}"),
            SpecError::Groups => f.write_str("groups must be between 1 and 16384"),
        }
    }
}

impl std::error::Error for SpecError {}

impl ClusterSpec {
    /// Writes `nodes` the way `parse_nodes` reads them: `ID:HOST:PORT:PEER_PORT`, comma-separated.
    pub fn format_nodes<'a>(nodes: impl IntoIterator<Item = &'a NodeSpec>) -> String {
        nodes
            .into_iter()
            .map(|n| format!("{}:{}:{}:{}", n.id, n.host, n.port, n.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Parses `ID:HOST:PORT:PEER_PORT` entries separated by commas, e.g.
    /// `1:127.0.0.1:7001:17001,2:127.0.0.1:7002:17002`.
    pub fn parse_nodes(s: &str) -> Result<Vec<NodeSpec>, SpecError> {
        let mut nodes = Vec::new();
        for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let parts: Vec<&str> = item.rsplitn(3, ':').collect();
            // rsplitn yields [peer_port, port, "ID:HOST"].
            let [peer, port, id_host] = parts[..] else {
                return Err(SpecError::BadNode(item.to_string()));
            };
            let (id, host) = id_host
                .split_once(':')
                .ok_or_else(|| SpecError::BadNode(item.to_string()))?;
            let num = |v: &str, what: &'static str| -> Result<u64, SpecError> {
                v.parse::<u64>()
                    .map_err(|_| SpecError::BadField(what, item.to_string()))
            };
            let port16 = |v: &str, what: &'static str| -> Result<u16, SpecError> {
                v.parse::<u16>()
                    .map_err(|_| SpecError::BadField(what, item.to_string()))
            };
            nodes.push(NodeSpec {
                id: num(id, "id")?,
                host: host.to_string(),
                port: port16(port, "port")?,
                peer_port: port16(peer, "peer port")?,
            });
        }
        Ok(nodes)
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        if self.nodes.is_empty() {
            return Err(SpecError::NoNodes);
        }
        let mut ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != self.nodes.len() {
            return Err(SpecError::DuplicateIds);
        }
        if ids.contains(&0) {
            return Err(SpecError::ReservedId);
        }
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(SpecError::Replicas);
        }
        if self.groups == 0 || self.groups > u32::from(SLOTS) {
            return Err(SpecError::Groups);
        }
        Ok(())
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The inclusive slot range of a group.
    pub fn group_slots(&self, g: GroupId) -> (u16, u16) {
        let total = u32::from(SLOTS);
        let lo = g * total / self.groups;
        let hi = (g + 1) * total / self.groups - 1;
        (lo as u16, hi as u16)
    }

    pub fn group_of_slot(&self, slot: u16) -> GroupId {
        // Inverse of group_slots: the largest g with g * SLOTS / groups <= slot.
        let total = u64::from(SLOTS);
        let g = ((u64::from(slot) + 1) * u64::from(self.groups)).div_ceil(total) as u32;
        g.saturating_sub(1).min(self.groups - 1)
    }

    /// The nodes holding group `g`, best first: rendezvous hashing of (group, node), so adding a
    /// node moves only the groups for which it now scores in the top `replicas`. The first is
    /// the replica that campaigns first when the group is created, which gives leaders a first
    /// spread that the balancer then evens out.
    pub fn placement(&self, g: GroupId) -> Vec<NodeId> {
        rendezvous(g, self.nodes.iter().map(|n| n.id), self.replicas)
    }
}

/// The `replicas` best of `nodes` for group `g`, best first: every node computes the same
/// answer from the same set, and a node joining or leaving changes only the groups for which
/// it scores (or scored) in the top `replicas`.
pub(crate) fn rendezvous(
    g: GroupId,
    nodes: impl IntoIterator<Item = NodeId>,
    replicas: usize,
) -> Vec<NodeId> {
    let mut scored: Vec<(u64, NodeId)> = nodes
        .into_iter()
        .map(|id| {
            (
                mix(u64::from(g) << 32 ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                id,
            )
        })
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored
        .into_iter()
        .take(replicas)
        .map(|(_, id)| id)
        .collect()
}

/// splitmix64's finaliser: a fixed, well-mixed hash so every node computes the same placement.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: u64, replicas: usize, groups: u32) -> ClusterSpec {
        ClusterSpec {
            nodes: (1..=n)
                .map(|id| NodeSpec {
                    id,
                    host: "127.0.0.1".into(),
                    port: 7000 + id as u16,
                    peer_port: 17000 + id as u16,
                })
                .collect(),
            replicas,
            groups,
        }
    }

    #[test]
    fn replicas_are_a_target_that_may_exceed_the_founders() {
        assert!(spec(1, 3, 16).validate().is_ok());
        assert_eq!(spec(1, 3, 16).placement(0), vec![1]);
        assert_eq!(spec(2, 3, 16).placement(0).len(), 2);
        assert!(spec(3, 0, 16).validate().is_err());
        assert!(spec(3, MAX_REPLICAS, 16).validate().is_ok());
        assert!(spec(3, MAX_REPLICAS + 1, 16).validate().is_err());
    }

    #[test]
    fn parses_nodes() {
        let nodes =
            ClusterSpec::parse_nodes("1:127.0.0.1:7001:17001, 2:node-b:6379:16379").unwrap();
        assert_eq!(nodes[1].host, "node-b");
        assert_eq!(nodes[1].client_addr(), "node-b:6379");
        assert_eq!(nodes[0].peer_addr(), "127.0.0.1:17001");
        assert!(ClusterSpec::parse_nodes("1:h:x:1").is_err());
        assert!(ClusterSpec::parse_nodes("h:1:2").is_err());
    }

    #[test]
    fn slots_split_exactly() {
        for groups in [1, 3, 16, 64, 100] {
            let s = spec(3, 3, groups);
            let mut next = 0u32;
            for g in 0..groups {
                let (lo, hi) = s.group_slots(g);
                assert_eq!(u32::from(lo), next);
                for slot in [lo, hi] {
                    assert_eq!(s.group_of_slot(slot), g, "groups={groups} slot={slot}");
                }
                next = u32::from(hi) + 1;
            }
            assert_eq!(next, 16384);
        }
    }

    #[test]
    fn placement_is_stable_and_spreads_leaders() {
        let s = spec(3, 3, 64);
        let mut leaders = [0usize; 4];
        for g in 0..64 {
            let p = s.placement(g);
            assert_eq!(p.len(), 3);
            assert_eq!(p, s.placement(g));
            leaders[p[0] as usize] += 1;
        }
        assert!(leaders[1..].iter().all(|&c| c >= 12), "{leaders:?}");
        // Adding a fourth node moves only some groups' replica sets.
        let s4 = spec(4, 3, 64);
        let moved = (0..64)
            .filter(|&g| {
                let mut a = s.placement(g);
                let mut b = s4.placement(g);
                a.sort_unstable();
                b.sort_unstable();
                a != b
            })
            .count();
        assert!(moved > 0 && moved < 64, "moved {moved}");
    }
}
