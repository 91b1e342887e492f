//! The cluster's metadata: its members, where each group's replicas are, and the rules. It
//! is kept by a Raft group of its own (the metadata group, whose voters are the cluster's
//! members), so every node sees the same changes in the same order and a node that joins
//! later learns all of it from the group's log.
//!
//! Nodes act on what it says: each computes from the members where every group's replicas
//! belong (`placement`), the leader of a group moves the group's replicas there one at a time
//! (see `membership`), and the leader of the metadata group lets joining nodes in and lets
//! drained ones out.

use crate::cluster::spec::{NodeSpec, rendezvous};
use crate::cluster::typ::{GroupId, NodeId};
use crate::cmd::{KeyCmd, Reply};
use crate::store::{OwnedValue, Record};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use tokio::sync::watch;

/// A member's place in the cluster's life.
///
/// On-disk format: bincode-encoded in the metadata group's log and snapshots. Variants are
/// only ever added at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Given an id, not yet a voter of the metadata group; holds no replicas.
    Joining,
    /// A full member: replicas are placed on it.
    Active,
    /// Being taken out: its replicas move away, then it is removed.
    Draining,
    /// Out of the cluster for good; its id is never given again.
    Removed,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Joining => "joining",
            MemberState::Active => "up",
            MemberState::Draining => "draining",
            MemberState::Removed => "removed",
        }
    }
}

/// On-disk format: as `MemberState`; fields never move or change type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub node: NodeSpec,
    pub state: MemberState,
}

/// Everything the metadata group keeps.
///
/// On-disk format: bincode-encoded into the metadata group's snapshots; fields never move or
/// change type, new ones go at the end behind a new format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    /// Every node that ever was a member, removed ones included (so no id is given twice).
    pub members: BTreeMap<NodeId, Member>,
    /// The id the next joining node gets.
    pub next_id: NodeId,
    /// Groups and replicas per group, fixed when the cluster was created.
    pub groups: u32,
    pub replicas: u32,
    /// Per group, the voters its leader last reported (what the group's Raft membership is).
    pub voters: Vec<Vec<NodeId>>,
    /// Named rules, by name: their specs as `BK.RULE SET` takes them.
    pub rules: BTreeMap<String, String>,
    /// Counts the changes, so that nodes can tell a newer state from an older one.
    pub version: u64,
}

/// A change to the metadata. Sent as a `KeyCmd::Meta` in the metadata group's log.
///
/// On-disk format: bincode-encoded in the metadata group's log. Variants are only ever added
/// at the end; fields never move or change type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    /// The members and shape the cluster was created with; refused once there are members.
    Bootstrap {
        nodes: Vec<NodeSpec>,
        groups: u32,
        replicas: u32,
    },
    /// A node asks to join: it gets the next id (the reply) and starts as `Joining`.
    Join {
        host: String,
        port: u16,
        peer_port: u16,
    },
    /// A joining node became a voter of the metadata group.
    Activate(NodeId),
    /// Start taking a node out.
    Drain(NodeId),
    /// A drained node is out.
    Remove(NodeId),
    /// A group's leader reports the group's voters after it changed them.
    Voters {
        group: GroupId,
        voters: Vec<NodeId>,
    },
    SetRule {
        name: String,
        spec: String,
    },
    DelRule(String),
    /// Rules read from a node's rules file: each is set, others are kept.
    LoadRules(BTreeMap<String, String>),
}

fn cfg() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl MetaOp {
    /// The command that carries this change through the metadata group's log.
    pub fn to_cmd(&self) -> io::Result<KeyCmd> {
        let bytes = bincode::serde::encode_to_vec(self, cfg()).map_err(io_err)?;
        Ok(KeyCmd::Meta(bytes.into()))
    }

    fn decode(bytes: &[u8]) -> io::Result<MetaOp> {
        crate::cluster::decode_bounded(bytes)
            .map(|(op, _)| op)
            .map_err(io_err)
    }
}

fn refuse(why: String) -> Reply {
    Reply::Error(Cow::Owned(why))
}

/// What one change did to the metadata: a change counts a new version, a refusal or a
/// repeat does not.
enum Applied {
    Changed(Reply),
    Unchanged(Reply),
}

impl MetaState {
    /// Whether the cluster was created (the first entry is in).
    pub fn is_bootstrapped(&self) -> bool {
        !self.members.is_empty()
    }

    /// Members that are not removed.
    pub fn current(&self) -> impl Iterator<Item = &Member> {
        self.members
            .values()
            .filter(|m| m.state != MemberState::Removed)
    }

    pub fn state_of(&self, id: NodeId) -> Option<MemberState> {
        self.members.get(&id).map(|m| m.state)
    }

    /// Where every group's replicas belong: on active members only, `replicas` per group
    /// (fewer while there are fewer active members), each member holding floor(R*G/N) or
    /// ceil(R*G/N) of them. It starts from where the replicas are, so it moves as few as it
    /// can, and it is its own fixed point: once the replicas are where it says, it says the
    /// same again. Every node computes the same answer from the same metadata.
    pub fn placement(&self) -> Vec<Vec<NodeId>> {
        let active: Vec<NodeId> = self
            .members
            .values()
            .filter(|m| m.state == MemberState::Active)
            .map(|m| m.node.id)
            .collect();
        let want = (self.replicas as usize).min(active.len());
        let mut load: BTreeMap<NodeId, usize> = active.iter().map(|&id| (id, 0)).collect();
        let mut groups: Vec<Vec<NodeId>> = (0..self.groups)
            .map(|g| {
                let mut v: Vec<NodeId> = self
                    .voters
                    .get(g as usize)
                    .map(|v| {
                        v.iter()
                            .copied()
                            .filter(|id| load.contains_key(id))
                            .collect()
                    })
                    .unwrap_or_default();
                // Best first by rendezvous score, so trimming keeps the best.
                let order = rendezvous(g, v.iter().copied(), v.len());
                v = order;
                v.truncate(want);
                v
            })
            .collect();
        for v in &groups {
            for id in v {
                if let Some(n) = load.get_mut(id) {
                    *n += 1;
                }
            }
        }
        // Fill: the least loaded member not yet in the group, ties broken by rendezvous.
        for (g, v) in groups.iter_mut().enumerate() {
            while v.len() < want {
                let ranked = rendezvous(g as GroupId, active.iter().copied(), active.len());
                let Some(&pick) = ranked
                    .iter()
                    .filter(|id| !v.contains(id))
                    .min_by_key(|id| load.get(id).copied().unwrap_or(0))
                else {
                    break;
                };
                v.push(pick);
                if let Some(n) = load.get_mut(&pick) {
                    *n += 1;
                }
            }
        }
        // Even out: move one replica from the most to the least loaded member until no two
        // members differ by more than one.
        for _ in 0..(self.groups as usize * want + 1) {
            let Some((&hi, &hi_n)) = load
                .iter()
                .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
            else {
                break;
            };
            let Some((&lo, &lo_n)) = load.iter().min_by_key(|(id, n)| (**n, **id)) else {
                break;
            };
            if hi_n <= lo_n + 1 {
                break;
            }
            let Some(v) = groups
                .iter_mut()
                .find(|v| v.contains(&hi) && !v.contains(&lo))
            else {
                break;
            };
            if let Some(slot) = v.iter_mut().find(|id| **id == hi) {
                *slot = lo;
            }
            if let Some(n) = load.get_mut(&hi) {
                *n -= 1;
            }
            if let Some(n) = load.get_mut(&lo) {
                *n += 1;
            }
        }
        groups
    }

    /// Groups whose voters are not yet where they belong.
    pub fn moves_in_progress(&self) -> usize {
        let placement = self.placement();
        (0..self.groups)
            .filter(|&g| {
                let mut want = placement.get(g as usize).cloned().unwrap_or_default();
                want.sort_unstable();
                let mut have = self.voters.get(g as usize).cloned().unwrap_or_default();
                have.sort_unstable();
                want != have
            })
            .count()
    }

    /// How many groups' voters include `id`.
    pub fn replicas_on(&self, id: NodeId) -> usize {
        self.voters.iter().filter(|v| v.contains(&id)).count()
    }

    /// Applies one change; the reply says what came of it. Refusals change nothing.
    pub fn apply(&mut self, op: MetaOp) -> Reply {
        use Applied::{Changed, Unchanged};
        let applied = match op {
            MetaOp::Bootstrap {
                nodes,
                groups,
                replicas,
            } => self.bootstrap(nodes, groups, replicas),
            MetaOp::Join {
                host,
                port,
                peer_port,
            } => self.join(host, port, peer_port),
            MetaOp::Activate(id) => match self.members.get_mut(&id) {
                Some(m) if m.state == MemberState::Joining => {
                    m.state = MemberState::Active;
                    Changed(Reply::Ok)
                }
                _ => Unchanged(Reply::Ok),
            },
            MetaOp::Drain(id) => self.drain(id),
            MetaOp::Remove(id) => match self.members.get_mut(&id) {
                Some(m) if m.state == MemberState::Draining => {
                    m.state = MemberState::Removed;
                    Changed(Reply::Ok)
                }
                _ => Unchanged(Reply::Ok),
            },
            MetaOp::Voters { group, voters } => match self.voters.get_mut(group as usize) {
                Some(v) if *v != voters => {
                    *v = voters;
                    Changed(Reply::Ok)
                }
                _ => Unchanged(Reply::Ok),
            },
            MetaOp::SetRule { name, spec } => {
                self.rules.insert(name, spec);
                Changed(Reply::Ok)
            }
            MetaOp::DelRule(name) => match self.rules.remove(&name) {
                Some(_) => Changed(Reply::Int(1)),
                None => Unchanged(Reply::Int(0)),
            },
            MetaOp::LoadRules(rules) => {
                let n = rules.len();
                self.rules.extend(rules);
                Changed(Reply::Int(i64::try_from(n).unwrap_or(i64::MAX)))
            }
        };
        match applied {
            Changed(reply) => {
                self.version += 1;
                reply
            }
            Unchanged(reply) => reply,
        }
    }

    /// The first metadata of a new cluster; a formed cluster's is kept.
    fn bootstrap(&mut self, nodes: Vec<NodeSpec>, groups: u32, replicas: u32) -> Applied {
        if self.is_bootstrapped() {
            return Applied::Unchanged(Reply::Ok);
        }
        self.groups = groups;
        self.replicas = replicas;
        let ids: Vec<NodeId> = nodes.iter().map(|n| n.id).collect();
        self.voters = (0..groups)
            .map(|g| rendezvous(g, ids.iter().copied(), replicas as usize))
            .collect();
        self.next_id = ids.iter().copied().max().unwrap_or(0) + 1;
        for node in nodes {
            self.members.insert(
                node.id,
                Member {
                    node,
                    state: MemberState::Active,
                },
            );
        }
        Applied::Changed(Reply::Ok)
    }

    /// A node at these addresses joins: it gets a fresh id, never one given before.
    fn join(&mut self, host: String, port: u16, peer_port: u16) -> Applied {
        if !self.is_bootstrapped() {
            return Applied::Unchanged(refuse("ERR the cluster is not formed yet; retry".into()));
        }
        if let Some(m) = self
            .current()
            .find(|m| m.node.host == host && (m.node.port == port || m.node.peer_port == peer_port))
        {
            return Applied::Unchanged(refuse(format!(
                "ERR {host}:{port} (peer port {peer_port}) is already taken by node {}",
                m.node.id
            )));
        }
        let id = self.next_id.max(1);
        self.next_id = id + 1;
        self.members.insert(
            id,
            Member {
                node: NodeSpec {
                    id,
                    host,
                    port,
                    peer_port,
                },
                state: MemberState::Joining,
            },
        );
        Applied::Changed(Reply::Int(i64::try_from(id).unwrap_or(i64::MAX)))
    }

    /// Node `id` starts leaving: one at a time, and never the last active member.
    fn drain(&mut self, id: NodeId) -> Applied {
        let refused = |why: String| Applied::Unchanged(refuse(why));
        let Some(m) = self.members.get(&id) else {
            return refused(format!("ERR no node {id} in this cluster"));
        };
        match m.state {
            MemberState::Removed => return refused(format!("ERR node {id} was removed already")),
            MemberState::Draining => {
                return refused(format!("ERR node {id} is being removed already"));
            }
            MemberState::Joining | MemberState::Active => {}
        }
        if let Some(other) = self.current().find(|m| m.state == MemberState::Draining) {
            return refused(format!(
                "ERR node {} is being removed; wait until it is out",
                other.node.id
            ));
        }
        let others = self
            .current()
            .filter(|m| m.state == MemberState::Active && m.node.id != id)
            .count();
        if others == 0 {
            return refused(format!(
                "ERR node {id} is the cluster's last member; it cannot be removed"
            ));
        }
        if let Some(m) = self.members.get_mut(&id) {
            m.state = MemberState::Draining;
        }
        Applied::Changed(Reply::Ok)
    }
}

/// The key a metadata snapshot keeps the whole state under.
const META_KEY: &[u8] = b"bucketd:metadata";

/// What a node does with the cluster's rules: called with them whenever they change here.
pub(crate) type RulesHook = Box<dyn Fn(&BTreeMap<String, String>) + Send + Sync>;

/// The metadata group's applied state on this node, and its watchers.
pub struct MetaStore {
    tx: watch::Sender<Arc<MetaState>>,
    /// Called, in the order the changes apply, whenever the rules change.
    rules_hook: Option<RulesHook>,
}

impl MetaStore {
    pub(crate) fn new(rules_hook: Option<RulesHook>) -> MetaStore {
        let (tx, _) = watch::channel(Arc::new(MetaState::default()));
        MetaStore { tx, rules_hook }
    }

    pub fn get(&self) -> Arc<MetaState> {
        self.tx.borrow().clone()
    }

    pub fn watch(&self) -> watch::Receiver<Arc<MetaState>> {
        self.tx.subscribe()
    }

    fn publish(&self, s: Arc<MetaState>) {
        let rules_changed = self.tx.borrow().rules != s.rules;
        self.tx.send_replace(s.clone());
        if rules_changed && let Some(hook) = &self.rules_hook {
            hook(&s.rules);
        }
    }

    /// Applies committed commands in order; one reply each.
    pub fn apply(&self, cmds: &[KeyCmd]) -> Vec<Reply> {
        let mut state = MetaState::clone(&self.get());
        let before = state.version;
        let replies = cmds
            .iter()
            .map(|c| match c {
                KeyCmd::Meta(bytes) => match MetaOp::decode(bytes) {
                    Ok(op) => state.apply(op),
                    Err(e) => refuse(format!("ERR unreadable metadata change: {e}")),
                },
                _ => Reply::err("ERR the metadata group takes only metadata changes"),
            })
            .collect();
        if state.version != before {
            self.publish(Arc::new(state));
        }
        replies
    }

    /// The state as one record, for a snapshot.
    pub fn export(&self) -> io::Result<Vec<Record>> {
        let state = self.get();
        let bytes = bincode::serde::encode_to_vec(&*state, cfg()).map_err(io_err)?;
        Ok(vec![Record {
            key: META_KEY.to_vec(),
            value: OwnedValue::Str(bytes),
            expires_at: 0,
        }])
    }

    /// Replaces the state with a snapshot's.
    pub fn import(&self, records: Vec<Record>) -> io::Result<()> {
        let state = match records.into_iter().find(|r| r.key == META_KEY) {
            Some(Record {
                value: OwnedValue::Str(bytes),
                ..
            }) => {
                crate::cluster::decode_bounded::<MetaState>(&bytes)
                    .map_err(io_err)?
                    .0
            }
            Some(_) => return Err(io_err("metadata snapshot of the wrong type")),
            None => MetaState::default(),
        };
        self.publish(Arc::new(state));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: NodeId) -> NodeSpec {
        NodeSpec {
            id,
            host: "127.0.0.1".into(),
            port: 7000 + id as u16,
            peer_port: 17000 + id as u16,
        }
    }

    fn three() -> MetaState {
        let mut s = MetaState::default();
        s.apply(MetaOp::Bootstrap {
            nodes: vec![node(1), node(2), node(3)],
            groups: 16,
            replicas: 3,
        });
        s
    }

    #[test]
    fn ids_are_never_given_twice() {
        let mut s = three();
        let join = |s: &mut MetaState, port: u16| {
            s.apply(MetaOp::Join {
                host: "127.0.0.1".into(),
                port,
                peer_port: port + 10_000,
            })
        };
        assert_eq!(join(&mut s, 7004), Reply::Int(4));
        s.apply(MetaOp::Activate(4));
        assert_eq!(s.apply(MetaOp::Drain(4)), Reply::Ok);
        s.apply(MetaOp::Remove(4));
        // The same address may join again once its node is out, under a new id.
        assert_eq!(join(&mut s, 7004), Reply::Int(5));
        // An address in use is refused and changes nothing.
        let before = s.clone();
        assert!(matches!(join(&mut s, 7001), Reply::Error(_)));
        assert_eq!(s, before);
    }

    #[test]
    fn removals_are_refused_when_they_cannot_be_done() {
        let mut s = three();
        assert!(matches!(s.apply(MetaOp::Drain(9)), Reply::Error(_)));
        assert_eq!(s.apply(MetaOp::Drain(3)), Reply::Ok);
        // One removal at a time.
        assert!(matches!(s.apply(MetaOp::Drain(2)), Reply::Error(_)));
        assert!(matches!(s.apply(MetaOp::Drain(3)), Reply::Error(_)));
        s.apply(MetaOp::Remove(3));
        assert_eq!(s.apply(MetaOp::Drain(2)), Reply::Ok);
        s.apply(MetaOp::Remove(2));
        // The last member stays.
        assert!(matches!(s.apply(MetaOp::Drain(1)), Reply::Error(_)));
    }

    #[test]
    fn placement_follows_the_active_members() {
        let mut s = three();
        assert_eq!(s.moves_in_progress(), 0);
        s.apply(MetaOp::Join {
            host: "127.0.0.1".into(),
            port: 7004,
            peer_port: 17004,
        });
        // A joining node holds nothing yet.
        assert_eq!(s.moves_in_progress(), 0);
        s.apply(MetaOp::Activate(4));
        let moving = s.moves_in_progress();
        assert!(moving > 0 && moving < 16, "{moving}");
        for (g, d) in s.placement().into_iter().enumerate() {
            assert_eq!(d.len(), 3);
            s.apply(MetaOp::Voters {
                group: g as GroupId,
                voters: d,
            });
        }
        assert_eq!(s.moves_in_progress(), 0);
        let per_node: Vec<usize> = (1..=4).map(|id| s.replicas_on(id)).collect();
        assert_eq!(per_node, vec![12, 12, 12, 12]);
        // Once there, it stays.
        let sorted = |v: Vec<Vec<NodeId>>| -> Vec<Vec<NodeId>> {
            v.into_iter()
                .map(|mut g| {
                    g.sort_unstable();
                    g
                })
                .collect()
        };
        assert_eq!(sorted(s.placement()), sorted(s.voters.clone()));
        // Growing to five, then shrinking back, stays even at every step.
        s.apply(MetaOp::Join {
            host: "127.0.0.1".into(),
            port: 7005,
            peer_port: 17005,
        });
        s.apply(MetaOp::Activate(5));
        let settle = |s: &mut MetaState| {
            for (g, v) in s.placement().into_iter().enumerate() {
                s.apply(MetaOp::Voters {
                    group: g as GroupId,
                    voters: v,
                });
            }
            assert_eq!(s.moves_in_progress(), 0);
        };
        settle(&mut s);
        let per_node: Vec<usize> = (1..=5).map(|id| s.replicas_on(id)).collect();
        assert!(per_node.iter().all(|&n| n == 9 || n == 10), "{per_node:?}");
        s.apply(MetaOp::Drain(2));
        settle(&mut s);
        assert_eq!(s.replicas_on(2), 0);
        let per_node: Vec<usize> = [1, 3, 4, 5].iter().map(|&id| s.replicas_on(id)).collect();
        assert_eq!(per_node, vec![12, 12, 12, 12]);
        for v in &s.voters {
            let mut d = v.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 3);
        }
    }
}
