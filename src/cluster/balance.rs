//! Evening out the leaderships over the nodes that are up.

use crate::cluster::executor::GroupRaft;
use crate::cluster::groups::Groups;
use crate::cluster::typ::NodeId;
use crate::shutdown::Shutdown;
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often leaders look at the spread of leaderships.
const BALANCE_EVERY: Duration = Duration::from_millis(500);
/// Most leaderships one node hands over per look, so moves stay few at a time.
const MOVES_PER_TURN: usize = 2;

/// Hands this node's surplus leaderships over, while turned on.
pub(crate) struct Balancer {
    groups: Arc<Groups>,
    /// Whether this node evens out leaderships (it hands its surplus over).
    on: AtomicBool,
}

impl Balancer {
    pub(crate) fn new(groups: Arc<Groups>, on: bool) -> Balancer {
        Balancer {
            groups,
            on: AtomicBool::new(on),
        }
    }

    /// Turns the evening out of leaderships on or off.
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Keeps leaderships spread evenly over the nodes that are up: a node that leads more than
    /// one group beyond the least-loaded replica of a group it leads hands that group over (a
    /// leader transfer, to a replica that has caught up). Nodes only ever give leaderships away,
    /// never take them, so two nodes cannot pull one group back and forth; counts converge to
    /// floor(G/N) or ceil(G/N) per node, after start-up and again after a failed node returns.
    pub(crate) async fn run(balancer: Weak<Balancer>, mut shutdown: Shutdown) {
        let mut tick = super::ticker(BALANCE_EVERY);
        while super::next_tick(&mut tick, &mut shutdown).await {
            let Some(b) = balancer.upgrade() else { return };
            let c = &b.groups;
            if !b.is_on() {
                continue;
            }
            // Only full members take leaderships: not a node that is joining or being drained.
            let meta = c.metadata();
            let mut counts: BTreeMap<NodeId, usize> = c
                .nodes()
                .iter()
                .filter(|n| c.is_up(n.id))
                .filter(|n| {
                    !meta.is_bootstrapped()
                        || meta.state_of(n.id) == Some(crate::cluster::meta::MemberState::Active)
                })
                .map(|n| (n.id, 0))
                .collect();
            for g in 0..c.spec.groups {
                if let Some(l) = c.serving_leader(g)
                    && let Some(n) = counts.get_mut(&l)
                {
                    *n += 1;
                }
            }
            let mut moved = 0;
            for g in 0..c.spec.groups {
                if moved >= MOVES_PER_TURN {
                    break;
                }
                if !c.leads(g) {
                    continue;
                }
                let Some(raft) = c.raft(g) else { continue };
                let mine = counts.get(&c.me).copied().unwrap_or(0);
                let target = c
                    .voters(g)
                    .into_iter()
                    .filter(|&id| id != c.me && caught_up(&raft, id))
                    .filter_map(|id| counts.get(&id).map(|&n| (n, id)))
                    .min();
                // Looked at again before each move, so that once balancing is turned off no new
                // move starts.
                if let Some((theirs, to)) = target
                    && mine > theirs + 1
                    && b.is_on()
                    && c.transfer_leader(g, to).await.is_ok()
                {
                    moved += 1;
                    if let Some(n) = counts.get_mut(&c.me) {
                        *n -= 1;
                    }
                    if let Some(n) = counts.get_mut(&to) {
                        *n += 1;
                    }
                }
            }
        }
    }
}

/// Whether replica `id` holds everything the leader `raft` has in its log.
pub(crate) fn caught_up(raft: &GroupRaft, id: NodeId) -> bool {
    let m = raft.metrics();
    let m = m.borrow_watched();
    m.replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .map(|l| l.index())
        .is_some_and(|i| Some(i) >= m.last_log_index)
}
