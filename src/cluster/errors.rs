//! Why the cluster did not do what it was asked: a write not applied (and the reason a Redis
//! Cluster client acts on), a leadership not handed over, a member not let in or out, a
//! cluster not joined.

use crate::cluster::typ::{GroupId, NodeId, TypeConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Why a proposal was not applied. A forwarded batch's refusal travels back to the node that
/// forwarded it (in `PeerError::Refused`); `Cluster::error_reply` says it to a client.
///
/// Wire format: bincode-encoded in peer replies; variants never move or change type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProposeError {
    /// Another node leads the group.
    Moved(NodeId),
    /// No leader is known (no quorum, or an election is under way).
    ClusterDown,
    /// The group did not commit in time, or lost its leader meanwhile; retry.
    TryAgain(TryAgain),
    /// The cluster removed this node.
    Removed,
    /// The write may have been applied, or may yet be, and its fate could not be learnt
    /// within the bound of a write's wait: an error Redis clients do not retry by themselves
    /// (`-UNKNOWN`), so a write is never applied twice behind their back. The text says why.
    Unknown(String),
}

impl ProposeError {
    /// A write whose fate is not known, for this reason.
    pub(crate) fn unknown(why: impl std::fmt::Display) -> ProposeError {
        ProposeError::Unknown(why.to_string())
    }
}

/// Why a write was not applied, and may be sent again (the client gets `-TRYAGAIN` and its
/// text), or, for the reasons that leave its fate open, why its outcome is unknown (the
/// client gets `-UNKNOWN`, see `ProposeError::Unknown`).
///
/// Between nodes it travels as its text, the one a client reads: a node that receives it
/// keeps the text as the leader said it (`Peer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum TryAgain {
    /// The leader's connection could not be opened: nothing was sent, so sending the batch
    /// again cannot apply it twice.
    NotSent(String),
    /// The call to the leader failed once the batch may have been sent.
    CallFailed(String),
    /// The leader answered a forwarded batch with something else than replies.
    UnexpectedAnswer,
    /// The group's leadership kept moving while the batch followed it.
    LeadershipMoving(GroupId),
    /// The group did not commit within this long.
    NotCommitted { group: GroupId, waited: Duration },
    /// Another leader's log replaced the write's entry. `settled`: this replica has applied
    /// as far as the entry could have committed, so it was not applied; otherwise its fate is
    /// unknown.
    Discarded { settled: bool },
    /// The group's Raft refused the write, in openraft's words.
    Raft(String),
    /// The write committed, and its replies never came to the shard that waited for them.
    CommittedWithoutReplies,
    /// A metadata change was applied and gave no reply.
    NoReply,
    /// A metadata change could not be encoded.
    Encode(String),
    /// As the node that refused it put it.
    Peer(String),
}

impl std::fmt::Display for TryAgain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TryAgain::NotSent(why)
            | TryAgain::CallFailed(why)
            | TryAgain::Raft(why)
            | TryAgain::Encode(why)
            | TryAgain::Peer(why) => f.write_str(why),
            TryAgain::UnexpectedAnswer => f.write_str("unexpected forward reply"),
            TryAgain::LeadershipMoving(g) => {
                write!(f, "the leadership of group {g} is moving; retry")
            }
            TryAgain::NotCommitted { group, waited } => write!(
                f,
                "group {group} did not commit within {} ms",
                waited.as_millis()
            ),
            TryAgain::Discarded { settled: true } => {
                f.write_str("the leader changed before this write committed; it was not applied")
            }
            TryAgain::Discarded { settled: false } => f.write_str(
                "the leader changed before this write committed, and its entry may still commit",
            ),
            TryAgain::CommittedWithoutReplies => {
                f.write_str("the write committed without its replies")
            }
            TryAgain::NoReply => f.write_str("no reply"),
        }
    }
}

impl From<TryAgain> for String {
    fn from(t: TryAgain) -> String {
        t.to_string()
    }
}

impl From<String> for TryAgain {
    fn from(why: String) -> TryAgain {
        TryAgain::Peer(why)
    }
}

impl From<&str> for TryAgain {
    fn from(why: &str) -> TryAgain {
        TryAgain::Peer(why.to_string())
    }
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposeError::Moved(l) => write!(f, "node {l} leads the group"),
            ProposeError::ClusterDown => f.write_str("the group has no leader"),
            ProposeError::TryAgain(why) => why.fmt(f),
            ProposeError::Removed => f.write_str("this node was removed from the cluster"),
            ProposeError::Unknown(why) => write!(f, "outcome unknown: {why}"),
        }
    }
}

impl std::error::Error for ProposeError {}

/// Why a leadership could not be handed over.
#[derive(Debug)]
pub enum TransferError {
    /// This node holds no replica of the group.
    NoReplica(GroupId),
    /// The group's Raft has stopped.
    Raft(openraft::error::Fatal<TypeConfig>),
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransferError::NoReplica(g) => write!(f, "no replica of group {g} here"),
            TransferError::Raft(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TransferError {}

/// Why a node was not let in (`BK.CLUSTER JOIN`) or not drained (`BK.CLUSTER REMOVE`). It
/// reads as the error reply the client gets.
#[derive(Debug)]
pub enum MemberChangeError {
    /// The joining node's peer address does not answer from here (`None`: timed out).
    PeerUnreachable {
        addr: String,
        error: Option<std::io::Error>,
    },
    /// The cluster has not written its first metadata yet.
    NotFormed,
    /// The metadata group refused the change, with this error reply.
    Refused(String),
    /// The metadata group gave the joining node an id that is no id.
    BadId,
    /// The metadata group answered with something else than the change's reply.
    UnexpectedReply,
    /// The change could not be run through the metadata group: the error reply a Redis
    /// Cluster client acts on.
    NotApplied(String),
}

impl std::fmt::Display for MemberChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberChangeError::PeerUnreachable { addr, error: None } => {
                write!(f, "ERR cannot reach the peer address {addr}: timed out")
            }
            MemberChangeError::PeerUnreachable {
                addr,
                error: Some(e),
            } => write!(f, "ERR cannot reach the peer address {addr}: {e}"),
            MemberChangeError::NotFormed => f.write_str("ERR the cluster is not formed yet; retry"),
            MemberChangeError::Refused(reply) | MemberChangeError::NotApplied(reply) => {
                f.write_str(reply)
            }
            MemberChangeError::BadId => f.write_str("ERR bad node id"),
            MemberChangeError::UnexpectedReply => {
                f.write_str("ERR unexpected reply from the metadata group")
            }
        }
    }
}

impl std::error::Error for MemberChangeError {}

impl From<MemberChangeError> for String {
    fn from(e: MemberChangeError) -> String {
        e.to_string()
    }
}

/// Why a node could not learn the cluster it belongs to: from its data folder, or from the
/// member it was told to join through.
#[derive(Debug)]
pub(crate) enum JoinError {
    /// `cluster.conf` could not be read, or says something wrong.
    ClusterFile {
        path: PathBuf,
        problem: String,
    },
    /// The node was given no address of its own.
    NoAddress,
    /// The node's peer port could not be bound (the member checks that it answers).
    PeerPort {
        port: u16,
        error: std::io::Error,
    },
    /// The member could not be reached (`None`: timed out).
    Unreachable {
        addr: String,
        error: Option<std::io::Error>,
    },
    /// The connection to the member failed.
    Io {
        addr: String,
        error: std::io::Error,
    },
    /// The member did not answer in time.
    NoAnswer {
        addr: String,
    },
    /// The member refused, with this error.
    Refused {
        addr: String,
        why: String,
    },
    /// The member's answer is not a join's answer.
    BadAnswer {
        addr: String,
        line: String,
    },
    BadGroupCount,
    BadReplicas,
    /// The members the member listed do not parse.
    BadNodes(crate::cluster::spec::SpecError),
    /// What the member said could not be written to the data folder.
    WriteFile {
        dir: PathBuf,
        error: std::io::Error,
    },
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::ClusterFile { path, problem } => write!(f, "{}: {problem}", path.display()),
            JoinError::NoAddress => f.write_str("no address for this node"),
            JoinError::PeerPort { port, error } => {
                write!(f, "cannot listen on peer port {port}: {error}")
            }
            JoinError::Unreachable { addr, error: None } => {
                write!(f, "cannot reach {addr}: timed out")
            }
            JoinError::Unreachable {
                addr,
                error: Some(e),
            } => write!(f, "cannot reach {addr}: {e}"),
            JoinError::Io { addr, error } => write!(f, "{addr}: {error}"),
            JoinError::NoAnswer { addr } => write!(f, "{addr} did not answer the join in time"),
            JoinError::Refused { addr, why } => write!(f, "{addr} refused the join: {why}"),
            JoinError::BadAnswer { addr, line } => {
                write!(f, "{addr} answered the join with '{line}'")
            }
            JoinError::BadGroupCount => f.write_str("bad group count"),
            JoinError::BadReplicas => f.write_str("bad replicas"),
            JoinError::BadNodes(why) => write!(f, "{why}"),
            JoinError::WriteFile { dir, error } => {
                write!(f, "cannot write {}: {error}", dir.display())
            }
        }
    }
}

impl std::error::Error for JoinError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reason travels between nodes as the text a client reads, as it always has.
    #[test]
    fn a_reason_travels_as_its_text() {
        let cfg = bincode::config::standard();
        let why = TryAgain::NotCommitted {
            group: 4,
            waited: Duration::from_millis(512),
        };
        let typed = bincode::serde::encode_to_vec(ProposeError::TryAgain(why), cfg).unwrap();
        let text = "group 4 did not commit within 512 ms".to_string();
        let plain = bincode::serde::encode_to_vec((2u32, &text), cfg).unwrap();
        assert_eq!(typed, plain);
        let (back, _): (ProposeError, usize) =
            bincode::serde::decode_from_slice(&typed, cfg).unwrap();
        assert_eq!(back, ProposeError::TryAgain(TryAgain::Peer(text)));
    }
}
