//! What this node does for its peers: it answers their requests (Raft's, forwarded writes,
//! pings, script cache changes), and builds its own pings and takes their answers.

use crate::cluster::groups::Groups;
use crate::cluster::quiet::{Ping, PingAck};
use crate::cluster::transport::{
    GroupSnapshotWire, Handler, PeerError, Pinger, Rpc, RpcOk, ScriptsChange,
};
use crate::cluster::typ::{GroupId, NodeId, TypeConfig};
use crate::cluster::writes::Writes;
use crate::cmd::{MAX_SCRIPT_BYTES, ScriptCache, sha1_hex};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Serves peers' requests; holds the node's write path weakly so a stopped node can be
/// dropped.
pub(crate) struct PeerHandler {
    writes: Weak<Writes>,
    scripts: Arc<ScriptCache>,
}

impl PeerHandler {
    pub(crate) fn new(writes: &Arc<Writes>, scripts: Arc<ScriptCache>) -> PeerHandler {
        PeerHandler {
            writes: Arc::downgrade(writes),
            scripts,
        }
    }

    /// A script cache change another member shares (see `Cluster::share_scripts`).
    fn apply_scripts(&self, change: ScriptsChange) {
        match change {
            ScriptsChange::Load(body) => {
                if body.len() <= MAX_SCRIPT_BYTES {
                    let body = bytes::Bytes::from(body);
                    self.scripts.insert(sha1_hex(&body), body);
                }
            }
            ScriptsChange::Flush => self.scripts.clear(),
        }
    }
}

impl Handler for PeerHandler {
    async fn handle(&self, group: GroupId, rpc: Rpc) -> Result<RpcOk, PeerError> {
        let writes = self.writes.upgrade().ok_or(PeerError::ShuttingDown)?;
        let cluster = writes.groups();
        let raft = || cluster.raft(group).ok_or(PeerError::NoReplica(group));
        if cluster.is_removed() {
            return Err(PeerError::NoReplica(group));
        }
        let raft_err =
            |e: openraft::error::RaftError<TypeConfig, _>| PeerError::Raft(e.to_string());
        match rpc {
            Rpc::Ping(ping) => {
                cluster.note_leads(ping.from, &ping.leads);
                Ok(RpcOk::Ping(cluster.quiet().on_ping(&**cluster, &ping)))
            }
            Rpc::Scripts(change) => {
                self.apply_scripts(change);
                Ok(RpcOk::Scripts)
            }
            Rpc::Forward(cmds) => writes
                .propose_local(group, cmds)
                .await
                .map(RpcOk::Forward)
                .map_err(PeerError::Refused),
            Rpc::Append(r) => {
                let raft = raft()?;
                let res = raft.append_entries(r).await;
                cluster
                    .quiet()
                    .after_append(group, &raft, res.as_ref().ok());
                res.map(RpcOk::Append).map_err(raft_err)
            }
            Rpc::Vote(r) => {
                let raft = raft()?;
                cluster
                    .quiet()
                    .may_vote(group, &r)
                    .map_err(PeerError::VoteRefused)?;
                cluster.quiet().before_vote(group, &r);
                let res = raft.vote(r).await;
                cluster.quiet().after_vote(group, &raft);
                res.map(RpcOk::Vote).map_err(raft_err)
            }
            Rpc::PreVote(r) => {
                let raft = raft()?;
                cluster
                    .quiet()
                    .may_vote(group, &r)
                    .map_err(PeerError::VoteRefused)?;
                let res = raft.pre_vote(r).await;
                cluster.quiet().after_vote(group, &raft);
                res.map(RpcOk::Vote).map_err(raft_err)
            }
            Rpc::Snapshot { vote, snapshot } => {
                let GroupSnapshotWire { meta, data } = snapshot;
                raft()?
                    .install_full_snapshot(
                        vote,
                        openraft::storage::Snapshot {
                            meta,
                            snapshot: data,
                        },
                    )
                    .await
                    .map(RpcOk::Snapshot)
                    .map_err(|e| PeerError::Raft(e.to_string()))
            }
            Rpc::TransferLeader(r) => {
                let raft = raft()?;
                cluster.quiet().on_transfer(group, &raft);
                raft.handle_transfer_leader(r)
                    .await
                    .map(RpcOk::TransferLeader)
                    .map_err(|e| PeerError::Raft(e.to_string()))
            }
        }
    }
}

/// Builds the node's pings and takes their answers, for `transport::ping_peers`.
pub(crate) struct QuietPinger(pub(crate) Weak<Groups>);

impl Pinger for QuietPinger {
    fn ping(&self, peer: NodeId) -> Ping {
        match self.0.upgrade() {
            Some(c) => {
                let mut p = c.quiet().ping(peer);
                p.leads = c.led_groups();
                p
            }
            None => Ping::default(),
        }
    }

    fn answered(&self, peer: NodeId, sent: Instant, ping: &Ping, ack: &PingAck) {
        if let Some(c) = self.0.upgrade() {
            c.quiet().answered(&*c, peer, sent, ping, ack);
        }
    }
}
