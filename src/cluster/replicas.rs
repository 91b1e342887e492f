//! Opening and closing this node's replicas: a replica's Raft on the event loop of the shard
//! that owns the group's keys, a task that follows what the replica says of its leadership
//! and voters, and keeps the group's log within its share of memory.

use crate::cluster::executor::{GroupApplier, GroupRaft, ShardExecutor, SharedExecutor};
use crate::cluster::group_net::GroupNet;
use crate::cluster::groups::{Groups, local_leader};
use crate::cluster::log_store::{GroupLog, NodeLog};
use crate::cluster::state_machine::GroupStateMachine;
use crate::cluster::transport::Network;
use crate::cluster::typ::{GroupId, NodeId, TypeConfig};
use crate::cluster::writes::Writes;
use crate::error::StartError;
use openraft::Instant as _;
use openraft::impls::BasicNode;
use openraft::network::RaftNetworkFactory;
use openraft::type_config::async_runtime::WatchReceiver;
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long a group past its share of the log's memory waits for the snapshot or the purge it
/// asked for before it gives the step up (and asks again if still past its share).
const TRIM_RETRY: Duration = Duration::from_secs(5);

/// What a group does next to keep its log within its share of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trim {
    Nothing,
    /// Take a snapshot now.
    Snapshot,
    /// The snapshot asked for is made: drop the entries up to this index, which it covers.
    Purge(u64),
}

/// Where a group is in trimming its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trimming {
    Idle,
    /// A snapshot was asked for at `since`, when the latest one ended at `before`.
    Snapshot {
        since: tokio::time::Instant,
        before: Option<u64>,
    },
    /// Entries up to `upto` were asked to go at `since` (a leader may put it off while a
    /// replication still reads them).
    Purge {
        since: tokio::time::Instant,
        upto: u64,
    },
}

/// One step of trimming a group's log, given the group's latest snapshot and purge and
/// whether its entries weigh more than its share: ask for a snapshot, then for a purge of what
/// it covers once it is there (openraft on its own keeps a thousand entries after each
/// snapshot, whatever their size). A step that does not happen within `TRIM_RETRY` is given
/// up, and asked for again if the log is still over its share.
fn trim_step(
    state: &mut Trimming,
    snapshot: Option<u64>,
    purged: Option<u64>,
    over: impl FnOnce() -> bool,
) -> Trim {
    // Called on every change of the group's metrics: the clock is read only mid-step.
    let now = tokio::time::Instant::now;
    match *state {
        Trimming::Snapshot { before, .. }
            if let Some(upto) = snapshot.filter(|&i| Some(i) > before) =>
        {
            *state = Trimming::Purge { since: now(), upto };
            Trim::Purge(upto)
        }
        Trimming::Purge { upto, .. } if purged >= Some(upto) => {
            *state = Trimming::Idle;
            Trim::Nothing
        }
        Trimming::Snapshot { since, .. } | Trimming::Purge { since, .. }
            if now().duration_since(since) < TRIM_RETRY =>
        {
            Trim::Nothing
        }
        _ if over() => {
            *state = Trimming::Snapshot {
                since: now(),
                before: snapshot,
            };
            Trim::Snapshot
        }
        _ => {
            *state = Trimming::Idle;
            Trim::Nothing
        }
    }
}

/// Builds each group's network client: every group shares the node's one `Network`.
#[derive(Clone)]
pub(crate) struct NetFactory(GroupNetworkFactory<Network, GroupId>);

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = GroupNet;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        GroupNet(GroupNetworkAdapter::new(
            self.0.factory.clone(),
            target,
            self.0.group_id,
        ))
    }
}

/// Opens and closes this node's replicas.
pub(crate) struct ReplicaSet {
    groups: Arc<Groups>,
    writes: Arc<Writes>,
    /// One log for every group of the node, so one write (and fsync) carries them all.
    node_log: NodeLog,
    /// What the entries of all groups, and of one group, may weigh in memory (see
    /// `ClusterSettings::log_memory`).
    log_limit: u64,
    log_share: u64,
    raft_config: Arc<openraft::Config>,
    /// Each group's snapshots go in a folder of its own here.
    data_dir: PathBuf,
    /// Per shard, the shard that applies the entries of the groups it owns.
    shards: Vec<SharedExecutor>,
}

/// What `ReplicaSet` works with.
pub(crate) struct ReplicaSetInit {
    pub writes: Arc<Writes>,
    pub node_log: NodeLog,
    pub log_limit: u64,
    pub raft_config: Arc<openraft::Config>,
    pub data_dir: PathBuf,
    pub shards: Vec<SharedExecutor>,
}

impl ReplicaSet {
    pub(crate) fn new(init: ReplicaSetInit) -> ReplicaSet {
        let groups = init.writes.groups().clone();
        let log_share = init.log_limit / (u64::from(groups.spec.groups) + 1);
        ReplicaSet {
            groups,
            writes: init.writes,
            node_log: init.node_log,
            log_limit: init.log_limit,
            log_share,
            raft_config: init.raft_config,
            data_dir: init.data_dir,
            shards: init.shards,
        }
    }

    /// What the Raft log's entries held in memory weigh over all groups (their records' size
    /// on disk), and the bound on it (`ClusterSettings::log_memory`).
    pub(crate) fn log_memory(&self) -> (u64, u64) {
        (self.node_log.mem_bytes(), self.log_limit)
    }

    /// Opens this node's replica of `g` (what its log and snapshot hold, or an empty one that
    /// its group's leader fills), and starts following its leadership and membership.
    pub(crate) async fn open_replica(&self, g: GroupId) -> Result<GroupRaft, StartError> {
        let groups = &self.groups;
        if let Some(r) = groups.raft(g) {
            return Ok(GroupRaft::clone(&r));
        }
        let meta_group = groups.meta_group();
        let exec = if g == meta_group {
            GroupApplier::Meta(groups.meta.clone())
        } else {
            let s = g as usize % self.shards.len().max(1);
            let shard = self.shards.get(s).cloned().ok_or(StartError::NoShards)?;
            GroupApplier::Shard(ShardExecutor::new(shard, groups.spec.group_slots(g)))
        };
        let dir = if g == meta_group {
            self.data_dir.join("metadata")
        } else {
            self.data_dir.join(format!("group-{g:04}"))
        };
        let log = self.node_log.group(g);
        let group_log = log.clone();
        let rt = groups.runtime_of(g);
        let sm = {
            let snapshot_dir = dir.join("snapshot");
            let clocks = self.writes.clocks().clone();
            rt.spawn(async move {
                GroupStateMachine::open(Arc::new(exec), Some(snapshot_dir))
                    .map(|sm| sm.keeping_time(g, clocks))
            })
            .await
            .map_err(|error| StartError::GroupTask { group: g, error })?
            .map_err(|error| StartError::Snapshot { group: g, error })?
        };
        let factory = NetFactory(GroupNetworkFactory::new(groups.net.clone(), g));
        // Created on the event loop of the shard that owns the group's keys: the group's Raft
        // tasks all run there.
        let config = self.raft_config.clone();
        let me = groups.me;
        let raft = rt
            .spawn(async move { GroupRaft::new(me, config, factory, log, sm).await })
            .await
            .map_err(|error| StartError::GroupTask { group: g, error })?
            .map_err(|error| StartError::Raft {
                group: g,
                error: Box::new(error),
            })?;
        self.writes.open_gate(g);
        groups.set_raft(g, Some(Arc::new(raft.clone())));
        rt.spawn(follow_replica(
            Arc::downgrade(groups),
            g,
            &raft,
            group_log,
            self.log_share,
        ));
        Ok(raft)
    }

    /// Stops this node's replica of `g` (a move took it elsewhere): its Raft stops and its
    /// keys leave the shard.
    pub(crate) async fn drop_replica(&self, g: GroupId) {
        let groups = &self.groups;
        if groups.raft(g).is_none() {
            return;
        }
        self.writes.settle_pending(g).await;
        let Some(raft) = groups.take_raft(g) else {
            return;
        };
        let rt = groups.runtime_of(g);
        let _ = rt
            .spawn(async move {
                let _ = raft.shutdown().await;
            })
            .await;
        groups.forget_leader(g);
        if g < groups.meta_group() {
            let s = g as usize % self.shards.len().max(1);
            if let Some(shard) = self.shards.get(s) {
                // A partition at a time: the shard serves its other groups in between.
                for part in 0..crate::store::Store::partitions() {
                    let slots = groups.spec.group_slots(g);
                    if shard.clear_part(slots, part).await.is_err() {
                        tracing::warn!(group = g, "could not clear the keys of a moved group");
                        break;
                    }
                }
            }
        }
        // Its log and last snapshot stay: should the group come back to this node, the
        // replica starts from them as any replica that fell behind does.
        tracing::info!(group = g, "replica moved away");
    }
}

/// What one look at a replica's metrics found.
struct Seen {
    leader: NodeId,
    /// While this node leads: when a majority last acknowledged it (ms since `born`).
    acked_at: u64,
    /// The voters, when they differ from those stored.
    voters: Option<Vec<NodeId>>,
    snapshot: Option<u64>,
    purged: Option<u64>,
}

/// Reads what `g`'s replica says of its leadership, voters, snapshot and purge.
fn look_at(groups: &Groups, g: GroupId, m: &openraft::RaftMetrics<TypeConfig>) -> Seen {
    let me = groups.me;
    let mem = m.membership_config.membership();
    // Voters and learners alike have a node entry.
    let member = mem.get_node(&me).is_some();
    let leader = local_leader(me, m.current_leader, m.state, member);
    let acked_at = match (leader, &m.last_quorum_acked) {
        (l, Some(t)) if l == me => {
            let since = groups.born().elapsed().saturating_sub(t.elapsed());
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX).max(1)
        }
        _ => 0,
    };
    // The metrics change with every append; the voters almost never do, so they are compared
    // in place and copied only when they differ. openraft gathers them into a new set on
    // every `voter_ids`: that is left to a joint configuration, which lasts only while a
    // replica moves.
    let stored = groups.stored_voters(g);
    let changed = match mem.get_joint_config().as_slice() {
        [one] => !one.is_empty() && !stored.iter().eq(one.iter()),
        _ => mem.voter_ids().next().is_some() && !stored.iter().copied().eq(mem.voter_ids()),
    };
    Seen {
        leader,
        acked_at,
        voters: changed.then(|| mem.voter_ids().collect::<Vec<NodeId>>()),
        snapshot: m.snapshot.map(|l| l.index),
        purged: m.purged.map(|l| l.index),
    }
}

/// Follows `g`'s replica until its Raft stops: who leads it, its voters, and trimming its log
/// to `log_share`.
fn follow_replica(
    groups: Weak<Groups>,
    g: GroupId,
    raft: &GroupRaft,
    group_log: GroupLog,
    log_share: u64,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut metrics = raft.metrics();
    async move {
        let mut trimming = Trimming::Idle;
        loop {
            let Some(c) = groups.upgrade() else { return };
            let seen = look_at(&c, g, &metrics.borrow_watched());
            c.observe_leader(g, seen.leader, seen.acked_at);
            if let Some(voters) = seen.voters {
                c.set_voters(g, voters);
            }
            let trim = trim_step(&mut trimming, seen.snapshot, seen.purged, || {
                group_log.mem_bytes() > log_share
            });
            let raft = if trim == Trim::Nothing {
                None
            } else {
                c.raft(g)
            };
            drop(c);
            // Errors mean the group's Raft stopped: the next wait for metrics ends.
            match (trim, raft) {
                (Trim::Snapshot, Some(r)) => drop(r.trigger().snapshot().await),
                (Trim::Purge(upto), Some(r)) => drop(r.trigger().purge_log(upto).await),
                _ => {}
            }
            if metrics.changed().await.is_err() {
                if let Some(c) = groups.upgrade() {
                    c.forget_leader(g);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{TRIM_RETRY, Trim, Trimming, trim_step};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_log_over_its_share_snapshots_then_purges_what_the_snapshot_covers() {
        let mut st = Trimming::Idle;
        assert_eq!(
            trim_step(&mut st, Some(10), Some(5), || false),
            Trim::Nothing
        );
        assert_eq!(
            trim_step(&mut st, Some(10), Some(5), || true),
            Trim::Snapshot
        );
        // While the snapshot is made, nothing more is asked, however heavy the log.
        assert_eq!(
            trim_step(&mut st, Some(10), Some(5), || true),
            Trim::Nothing
        );
        assert_eq!(
            trim_step(&mut st, Some(40), Some(5), || true),
            Trim::Purge(40)
        );
        // The purge is put off for a while (a replication still reads those entries).
        tokio::time::advance(TRIM_RETRY / 2).await;
        assert_eq!(
            trim_step(&mut st, Some(40), Some(5), || true),
            Trim::Nothing
        );
        assert_eq!(
            trim_step(&mut st, Some(40), Some(40), || false),
            Trim::Nothing
        );
        assert_eq!(st, Trimming::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_that_does_not_happen_is_asked_for_again() {
        let mut st = Trimming::Idle;
        assert_eq!(trim_step(&mut st, None, None, || true), Trim::Snapshot);
        tokio::time::advance(TRIM_RETRY - Duration::from_millis(1)).await;
        assert_eq!(trim_step(&mut st, None, None, || true), Trim::Nothing);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(trim_step(&mut st, None, None, || true), Trim::Snapshot);
        assert_eq!(trim_step(&mut st, Some(7), None, || true), Trim::Purge(7));
        tokio::time::advance(TRIM_RETRY).await;
        // Given up; under its share by now, the log is left alone.
        assert_eq!(
            trim_step(&mut st, Some(7), Some(3), || false),
            Trim::Nothing
        );
        assert_eq!(st, Trimming::Idle);
    }
}
