//! The write path of a group on this node: a shard's gathered batch is proposed here when
//! this node leads the group, forwarded to its leader otherwise, and waited on until its fate
//! is known; a refusal becomes the error a Redis Cluster client acts on.

use crate::clock::Clock;
use crate::cluster::errors::{ProposeError, TryAgain};
use crate::cluster::executor::GroupRaft;
use crate::cluster::group_time::GroupClocks;
use crate::cluster::groups::Groups;
use crate::cluster::transport::{CallError, PeerError, Rpc, RpcOk};
use crate::cluster::typ::{Applied, GroupId, NodeId, Origin, Proposal};
use crate::cmd::{KeyCmd, Reply};
use openraft::error::ClientWriteError;
use openraft::type_config::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// A write whose group's majority is in reach waits at most this long for its fate (see
/// `wait_for_fate`).
const FATE_WAIT: Duration = Duration::from_secs(2);

/// How often a write past its write timeout looks again whether its group is in reach.
const FATE_POLL: Duration = Duration::from_millis(20);

/// Proposes and forwards the writes of every group through this node.
pub(crate) struct Writes {
    groups: Arc<Groups>,
    /// Per group: the writes proposed through this node that wait for their fate, and
    /// whether its replica is being moved away (see `settle_pending`).
    gates: Vec<WriteGate>,
    /// Serve clients that are not cluster-aware: forward to the leader instead of `-MOVED`.
    forward: bool,
    write_timeout: Duration,
    /// Each group's time, as this node stamps it on the entries it proposes.
    clocks: Arc<GroupClocks>,
    /// Log entries the shards gathered and proposed here, and the commands they carried.
    entries_proposed: AtomicU64,
    commands_proposed: AtomicU64,
    /// Per group: entries proposed through this node.
    group_proposals: Vec<AtomicU64>,
}

impl Writes {
    pub(crate) fn new(
        groups: Arc<Groups>,
        forward: bool,
        write_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Writes {
        let all = groups.spec.groups as usize + 1;
        Writes {
            groups,
            gates: (0..all).map(|_| WriteGate::default()).collect(),
            forward,
            write_timeout,
            clocks: Arc::new(GroupClocks::new(clock, all)),
            entries_proposed: AtomicU64::new(0),
            commands_proposed: AtomicU64::new(0),
            group_proposals: (0..all).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(crate) fn groups(&self) -> &Arc<Groups> {
        &self.groups
    }

    /// Each group's time on this node; the state machines raise it as they apply.
    pub(crate) fn clocks(&self) -> &Arc<GroupClocks> {
        &self.clocks
    }

    /// A replica of `g` is here (again): writes to it are taken.
    pub(crate) fn open_gate(&self, g: GroupId) {
        if let Some(gate) = self.gates.get(g as usize) {
            gate.open();
        }
    }

    /// (log entries, commands in them) that this node's shards gathered and proposed: how
    /// well the shards batch.
    pub(crate) fn proposals(&self) -> (u64, u64) {
        (
            self.entries_proposed.load(Ordering::Relaxed),
            self.commands_proposed.load(Ordering::Relaxed),
        )
    }

    /// Entries of `g` proposed through this node.
    pub(crate) fn proposals_of(&self, g: GroupId) -> u64 {
        self.group_proposals
            .get(g as usize)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Refuses new writes to `g` on this node, then waits, up to the bound of a write's wait
    /// for its fate, until no write proposed here for it waits any more. A write proposed
    /// while this replica led the group may be in the log of the replicas that keep it, and
    /// commit there: this replica, a follower still reachable by the group's leader, then
    /// applies it and the write gets its own reply. Stopping the Raft under it would answer
    /// `-TRYAGAIN` to a write that may be applied, and a client that retries would have it
    /// applied twice.
    pub(crate) async fn settle_pending(&self, g: GroupId) {
        let Some(gate) = self.gates.get(g as usize) else {
            return;
        };
        gate.close();
        let settled = gate
            .settled(fate_bound(self.write_timeout) + FATE_POLL)
            .await;
        if !settled {
            tracing::warn!(
                group = g,
                "a write proposed here still waits as its replica stops"
            );
        }
    }

    /// Runs a shard's gathered batch through group `g`: proposed here when this node leads
    /// it (the shard that gathered it answers its clients when it applies the entry, and this
    /// returns None), forwarded to the leader when forwarding is on (this returns the
    /// leader's replies), otherwise refused with the leader to ask.
    pub(crate) async fn replicate(
        &self,
        g: GroupId,
        origin: Origin,
        cmds: Vec<KeyCmd>,
    ) -> Result<Option<Vec<Reply>>, ProposeError> {
        if self.groups.is_removed() {
            // Serves nothing, but sends clients whose slot map is stale to a member that
            // holds the group, so they see only -MOVED.
            let meta = self.groups.metadata();
            let to = meta.voters.get(g as usize).and_then(|v| {
                v.iter().copied().find(|&id| {
                    id != self.groups.me
                        && meta.state_of(id) == Some(crate::cluster::meta::MemberState::Active)
                })
            });
            return Err(to.map_or(ProposeError::Removed, ProposeError::Moved));
        }
        let leader = match self.groups.serving_leader(g) {
            Some(l) => Some(l),
            None => self.groups.settled_leader(g).await,
        };
        let first = match leader {
            Some(l) if l == self.groups.me && !self.forward => {
                return self.commit(g, Some(origin), cmds).await.map(|_| None);
            }
            Some(l) if !self.forward => return Err(ProposeError::Moved(l)),
            Some(l) => l,
            None => return Err(ProposeError::ClusterDown),
        };
        // A client of a forwarding node cannot follow -MOVED, so follow the redirects here
        // (the leadership was moving).
        self.send_to_leader(g, first, Some(origin), cmds).await
    }

    /// Runs `cmds` through group `g` on `target`, its leader as far as this node knows:
    /// proposed here when that is this node (with an `origin`, the shard that gathered them
    /// answers its clients as it applies the entry, and this returns None), forwarded
    /// otherwise (this returns the leader's replies). Follows up to three redirects: a
    /// redirect means the batch was refused before it entered the log, so sending it again
    /// cannot apply it twice. A batch whose leader could not be reached at all fails with
    /// `TryAgain::NotSent`.
    pub(crate) async fn send_to_leader(
        &self,
        g: GroupId,
        mut target: NodeId,
        origin: Option<Origin>,
        cmds: Vec<KeyCmd>,
    ) -> Result<Option<Vec<Reply>>, ProposeError> {
        for _ in 0..3 {
            let result = if target == self.groups.me {
                let replies = self.commit(g, origin, cmds.clone()).await;
                replies.map(|r| origin.is_none().then_some(r))
            } else {
                // The leader may wait for the write's fate past its write timeout.
                let ttl = fate_bound(self.write_timeout) + Duration::from_millis(200);
                match self
                    .groups
                    .net
                    .call(target, g, Rpc::Forward(cmds.clone()), ttl)
                    .await
                {
                    Ok(RpcOk::Forward(replies)) => Ok(Some(replies)),
                    // The leader took the batch: whatever else it says, the batch may have
                    // been applied.
                    Ok(_) => Err(ProposeError::unknown(TryAgain::UnexpectedAnswer)),
                    Err(CallError::Peer(PeerError::Refused(e))) => Err(e),
                    Err(e @ CallError::CannotConnect(..)) => {
                        return Err(ProposeError::TryAgain(TryAgain::NotSent(e.to_string())));
                    }
                    Err(e) => Err(ProposeError::unknown(TryAgain::CallFailed(e.to_string()))),
                }
            };
            match result {
                // Refused before it entered the log (a redirect, possibly to the node just
                // asked, once the leadership has settled): safe to send again.
                Err(ProposeError::Moved(l)) => target = l,
                other => return other,
            }
        }
        Err(ProposeError::TryAgain(TryAgain::LeadershipMoving(g)))
    }

    /// The error reply a Redis Cluster client acts on, for a command on `slot` that group
    /// could not take.
    pub(crate) fn error_reply(&self, slot: u16, e: &ProposeError) -> String {
        match e {
            ProposeError::Moved(leader) => match self.groups.node(*leader) {
                Some(n) => format!("MOVED {slot} {}", n.client_addr()),
                None => "CLUSTERDOWN The cluster is down".to_string(),
            },
            ProposeError::ClusterDown => "CLUSTERDOWN The cluster is down".to_string(),
            ProposeError::TryAgain(why) => format!("TRYAGAIN {why}"),
            ProposeError::Unknown(why) => format!(
                "UNKNOWN outcome unknown: {why}; the write may or may not have been applied"
            ),
            ProposeError::Removed => {
                format!(
                    "ERR node {} was removed from the cluster; it serves nothing",
                    self.groups.me
                )
            }
        }
    }

    /// Proposes commands forwarded by another node; the replies travel back through Raft.
    pub(crate) async fn propose_local(
        &self,
        g: GroupId,
        cmds: Vec<KeyCmd>,
    ) -> Result<Vec<Reply>, ProposeError> {
        self.commit(g, None, cmds).await
    }

    /// Proposes on this node, which must lead the group; the leader stamps the group's time.
    async fn commit(
        &self,
        g: GroupId,
        origin: Option<Origin>,
        cmds: Vec<KeyCmd>,
    ) -> Result<Vec<Reply>, ProposeError> {
        // Counted before the replica is looked up: a replica that starts leaving after this
        // waits for the write (see `settle_pending`).
        let (_pending, leaving) = match self.gates.get(g as usize) {
            Some(gate) => {
                let (w, leaving) = gate.enter();
                (Some(w), leaving)
            }
            None => (None, false),
        };
        let Some(raft) = self.groups.raft(g).filter(|_| !leaving) else {
            return match self.groups.leader(g) {
                Some(l) => Err(ProposeError::Moved(l)),
                None => Err(ProposeError::ClusterDown),
            };
        };
        self.groups.wake_for_write(g, &raft).await;
        if self.groups.leader(g) == Some(self.groups.me) && !self.groups.leads(g) {
            // Leader by its own count but without a lease: either just elected (the lease
            // comes with the first acknowledged heartbeat) or cut off from its majority, in
            // which case another node may be leading already.
            match self.groups.settled_leader(g).await {
                Some(l) if l == self.groups.me => {}
                Some(l) => return Err(ProposeError::Moved(l)),
                None => return Err(ProposeError::ClusterDown),
            }
        }
        if let Some(n) = self.group_proposals.get(g as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        if origin.is_some() {
            self.entries_proposed.fetch_add(1, Ordering::Relaxed);
            self.commands_proposed
                .fetch_add(cmds.len() as u64, Ordering::Relaxed);
        }
        let proposal = Proposal::new(self.clocks.stamp(g), origin, cmds);
        let write = raft.client_write(proposal);
        match wait_for_fate(write, self.write_timeout, || self.groups.majority_up(g)).await {
            Ok(Ok(resp)) => {
                let Applied(replies) = resp.data;
                Ok(replies)
            }
            Ok(Err(e)) => match e.api_error() {
                // Refused before it entered the log: nothing was applied.
                Some(ClientWriteError::ForwardToLeader(f)) => match f.leader_id {
                    Some(l) if l != self.groups.me => Err(ProposeError::Moved(l)),
                    // The leadership is moving (a transfer, or an election under way). Once
                    // it has settled, send the client there, even back here: the write never
                    // entered the log, so repeating it cannot apply it twice.
                    _ => match self.groups.settled_leader(g).await {
                        Some(l) => Err(ProposeError::Moved(l)),
                        None => Err(ProposeError::ClusterDown),
                    },
                },
                Some(ClientWriteError::LogEntryDiscarded(_)) => {
                    let settled = origin.is_some() && self.settle_discarded(&raft).await;
                    let why = TryAgain::Discarded { settled };
                    Err(if settled {
                        ProposeError::TryAgain(why)
                    } else {
                        ProposeError::unknown(why)
                    })
                }
                // The Raft stopped or failed with the entry perhaps in its log.
                _ => Err(ProposeError::unknown(TryAgain::Raft(e.to_string()))),
            },
            Err(waited) => Err(ProposeError::unknown(TryAgain::NotCommitted {
                group: g,
                waited,
            })),
        }
    }

    /// Waits, at most `write_timeout`, until this replica has applied as far as its log now
    /// reaches, after the entry of a write proposed here was discarded from its log (another
    /// leader's log replaced it, or a snapshot covered it). Such an entry may still commit
    /// through a replica that kept it; it can only commit at the index it had, which the log
    /// reached. Once this replica has applied that far, the entry was either applied here, and
    /// the shard that gathered it answered its clients with the replies, or it never will be:
    /// the `-TRYAGAIN` the clients get otherwise is then exact, and a client that retries (as
    /// Redis Cluster clients do on their own) cannot have the write applied twice. (Unless a
    /// snapshot sent by the new leader carried the entry, which the apply never sees; a
    /// replica that just proposed is rarely so far behind.) False when the wait ran out and the
    /// write's fate is still unknown.
    ///
    /// The log is read again once applied that far: a replica that found its log in conflict
    /// with the new leader's may have cut it back before taking the leader's entries, so the
    /// first reading can fall short of the discarded entry; the leader's entries then follow
    /// within a round trip, and the wait goes on to where they reach.
    async fn settle_discarded(&self, raft: &GroupRaft) -> bool {
        let deadline = tokio::time::Instant::now() + self.write_timeout;
        let mut upto = raft.metrics().borrow_watched().last_log_index;
        for _ in 0..2 {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if raft
                .wait(Some(left))
                .applied_index_at_least(upto, "a discarded write settles")
                .await
                .is_err()
            {
                return false;
            }
            let now = raft.metrics().borrow_watched().last_log_index;
            if now <= upto {
                return true;
            }
            upto = now;
        }
        true
    }
}

/// One group's writes on this node: how many wait for their fate, and whether the replica
/// is leaving (its top bit). Both live in one word, so a write that counts itself learns in
/// the same step whether the replica was leaving, and a replica that starts leaving after
/// that step sees the write counted.
#[derive(Default)]
struct WriteGate(AtomicU32);

/// The bit of a `WriteGate` that says the replica is leaving.
const LEAVING: u32 = 1 << 31;

impl WriteGate {
    /// Counts a write until the guard drops; true with it when the replica is leaving.
    fn enter(&self) -> (PendingWrite<'_>, bool) {
        let before = self.0.fetch_add(1, Ordering::AcqRel);
        (PendingWrite(&self.0), before & LEAVING != 0)
    }

    /// The replica is leaving: writes that come now are told so.
    fn close(&self) {
        self.0.fetch_or(LEAVING, Ordering::AcqRel);
    }

    /// A replica is here again.
    fn open(&self) {
        self.0.fetch_and(!LEAVING, Ordering::AcqRel);
    }

    /// Waits until no write is counted, looking every `FATE_POLL`, for at most `bound`. False
    /// when the bound ran out first.
    async fn settled(&self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if self.0.load(Ordering::Acquire) & !LEAVING == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(FATE_POLL).await;
        }
    }
}

/// A write that waits for its fate, counted in its `WriteGate` while it does.
struct PendingWrite<'a>(&'a AtomicU32);

impl Drop for PendingWrite<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The longest a write waits for its fate: `FATE_WAIT`, or the write timeout if that is longer.
/// A node forwarding a write to its leader waits as long, and a little more.
fn fate_bound(write_timeout: Duration) -> Duration {
    write_timeout.max(FATE_WAIT)
}

/// Waits for a proposed write's fate: for `write_timeout`, then on for as long as `in_reach`
/// (a majority of the group's replicas were heard from lately), until `fate_bound` from the
/// start. The error is how long it waited.
///
/// Past `write_timeout` the entry may be in the log, and the only reply left is `-TRYAGAIN`,
/// which cluster clients retry on their own: if the entry then commits, the write is applied
/// twice behind its client's back. While the group's majority is in reach, its leader (this
/// node, or the one a transfer or an election just made) settles the entry with its next
/// appends: it commits (and is answered with its reply), or the leader's log replaces it (and
/// the discard is settled, see `settle_discarded`). So a slow commit on a loaded cluster, or
/// one caught in a leadership move, is answered late rather than applied twice. A node cut
/// off from its group's majority answers at `write_timeout`.
async fn wait_for_fate<F: std::future::Future>(
    write: F,
    write_timeout: Duration,
    in_reach: impl Fn() -> bool,
) -> Result<F::Output, Duration> {
    tokio::pin!(write);
    let start = tokio::time::Instant::now();
    let hard = start + fate_bound(write_timeout);
    let mut until = start + write_timeout;
    loop {
        if let Ok(r) = tokio::time::timeout_at(until, &mut write).await {
            return Ok(r);
        }
        let now = tokio::time::Instant::now();
        if now >= hard || !in_reach() {
            return Err(now - start);
        }
        until = (now + FATE_POLL).min(hard);
    }
}

#[cfg(test)]
mod tests {
    use super::{FATE_POLL, FATE_WAIT, WriteGate, wait_for_fate};
    use std::cell::Cell;
    use std::time::Duration;

    const WRITE_TIMEOUT: Duration = Duration::from_millis(500);

    /// A write that commits after `after`.
    async fn commits_after(after: Duration) -> &'static str {
        tokio::time::sleep(after).await;
        "applied"
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_moved_away_waits_for_its_pending_writes() {
        static GATE: WriteGate = WriteGate(std::sync::atomic::AtomicU32::new(0));
        let write = tokio::spawn(async {
            let (_w, leaving) = GATE.enter();
            assert!(!leaving);
            commits_after(Duration::from_millis(300)).await
        });
        tokio::task::yield_now().await;
        GATE.close();
        // A write that comes once the replica is leaving is told so, and counted meanwhile.
        let (late, leaving) = GATE.enter();
        assert!(leaving);
        drop(late);
        let t0 = tokio::time::Instant::now();
        assert!(GATE.settled(FATE_WAIT).await);
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(
            waited <= Duration::from_millis(300) + FATE_POLL,
            "{waited:?}"
        );
        assert!(matches!(write.await, Ok("applied")));
        // Nothing pending: no wait at all.
        let t1 = tokio::time::Instant::now();
        assert!(GATE.settled(FATE_WAIT).await);
        assert_eq!(t1.elapsed(), Duration::ZERO);
        // A replica here again takes writes.
        GATE.open();
        assert!(!GATE.enter().1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_never_settles_holds_its_replica_only_so_long() {
        let gate = WriteGate::default();
        let _w = gate.enter();
        gate.close();
        let t0 = tokio::time::Instant::now();
        assert!(!gate.settled(FATE_WAIT).await);
        let waited = t0.elapsed();
        assert!(
            waited >= FATE_WAIT && waited <= FATE_WAIT + FATE_POLL,
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_commit_while_the_group_is_in_reach_gets_its_reply() {
        let t0 = tokio::time::Instant::now();
        let r = wait_for_fate(commits_after(WRITE_TIMEOUT * 3), WRITE_TIMEOUT, || true).await;
        assert_eq!(r, Ok("applied"));
        assert_eq!(t0.elapsed(), WRITE_TIMEOUT * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_cut_off_from_its_group_gives_up_at_the_write_timeout() {
        let t0 = tokio::time::Instant::now();
        let r = wait_for_fate(commits_after(WRITE_TIMEOUT * 3), WRITE_TIMEOUT, || false).await;
        assert_eq!(r, Err(WRITE_TIMEOUT));
        assert_eq!(t0.elapsed(), WRITE_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_gives_up_once_its_group_is_out_of_reach() {
        let t0 = tokio::time::Instant::now();
        let out_of_reach_at = t0 + WRITE_TIMEOUT + Duration::from_millis(300);
        let asked = Cell::new(0);
        let in_reach = || {
            asked.set(asked.get() + 1);
            tokio::time::Instant::now() < out_of_reach_at
        };
        let r = wait_for_fate(commits_after(FATE_WAIT), WRITE_TIMEOUT, in_reach).await;
        let waited = r.expect_err("the group went out of reach before the commit");
        assert!(
            waited >= WRITE_TIMEOUT + Duration::from_millis(300)
                && waited <= WRITE_TIMEOUT + Duration::from_millis(320),
            "gave up after {waited:?}"
        );
        assert!(asked.get() > 1, "asked {} times", asked.get());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_in_reach_waits_no_longer_than_the_bound() {
        let r = wait_for_fate(commits_after(FATE_WAIT * 2), WRITE_TIMEOUT, || true).await;
        assert_eq!(r, Err(FATE_WAIT));
        // A write timeout beyond the bound is the bound.
        let long = FATE_WAIT * 3;
        let r = wait_for_fate(commits_after(long * 2), long, || true).await;
        assert_eq!(r, Err(long));
    }
}
