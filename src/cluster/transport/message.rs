//! What nodes say to each other: a request for one group (`Rpc`), its answer (`RpcOk`) or why
//! there is none (`PeerError`), each carried as one `PeerFrame`.
//!
//! Nodes of one cluster exchange these bincode-encoded (`wire`, whose tests pin the bytes of
//! every kind): a variant or a field never moves or changes type, and a new one goes last.

use crate::cluster::errors::ProposeError;
use crate::cluster::quiet::{Ping, PingAck, VoteRefusal};
use crate::cluster::typ::{GroupId, SnapshotMeta, TypeConfig, Vote};
use crate::cmd::{KeyCmd, Reply};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

/// A request to one group of the node it is sent to (or to the node itself, for the kinds
/// whose group id is not used).
#[derive(Serialize, Deserialize)]
pub enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
    Snapshot {
        vote: Vote,
        snapshot: GroupSnapshotWire,
    },
    TransferLeader(TransferLeaderRequest<TypeConfig>),
    /// Commands from a client connected to a node that does not lead the group.
    Forward(Vec<KeyCmd>),
    /// The node-level ping (its group id is not used).
    Ping(Ping),
    /// A change to the script cache, made on every member (its group id is not used).
    Scripts(ScriptsChange),
}

/// What a client did to the script cache on one node, for every other node to do as well:
/// the scripts are the cluster's, so a script loaded through any node runs on every one.
#[derive(Clone, Serialize, Deserialize)]
pub enum ScriptsChange {
    /// SCRIPT LOAD: the script's text.
    Load(Vec<u8>),
    /// SCRIPT FLUSH.
    Flush,
}

/// A snapshot as it travels (openraft's `Snapshot` is not itself serializable).
#[derive(Serialize, Deserialize)]
pub struct GroupSnapshotWire {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
}

/// The answer to an `Rpc`, of its kind (a pre-vote is answered as a vote is).
#[derive(Serialize, Deserialize)]
pub enum RpcOk {
    Append(AppendEntriesResponse<TypeConfig>),
    Vote(VoteResponse<TypeConfig>),
    Snapshot(SnapshotResponse<TypeConfig>),
    TransferLeader(TransferLeaderResponse<TypeConfig>),
    Forward(Vec<Reply>),
    Ping(PingAck),
    Scripts,
}

/// Why a peer answered a request with an error instead of a result. It travels back in the
/// request's response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerError {
    /// A forwarded batch was refused by the node it was sent to, as it would have refused a
    /// client of its own.
    Refused(ProposeError),
    /// The node is stopping.
    ShuttingDown,
    /// The node holds no replica of the group.
    NoReplica(GroupId),
    /// A vote or pre-vote was refused on account of a quiet group (see `quiet`).
    VoteRefused(VoteRefusal),
    /// The group's Raft failed the request, in openraft's words.
    Raft(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Refused(e) => e.fmt(f),
            PeerError::ShuttingDown => f.write_str("node is shutting down"),
            PeerError::NoReplica(g) => write!(f, "no replica of group {g} here"),
            PeerError::VoteRefused(r) => r.fmt(f),
            PeerError::Raft(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for PeerError {}

/// One message on a peer connection.
#[derive(Serialize, Deserialize)]
pub enum PeerFrame {
    Request {
        id: u64,
        group: GroupId,
        rpc: Rpc,
    },
    Response {
        id: u64,
        result: Result<RpcOk, PeerError>,
    },
}
