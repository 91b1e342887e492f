//! The Raft type configuration and short aliases for openraft's generic types, in one place.
//!
//! bucketd pins openraft 0.10 (an alpha, pinned exactly): it runs tens of Raft groups in one
//! process, and 0.10 brings what that needs — the `openraft-multi` adapters that let every group
//! share one connection per peer, and storage/network traits without the 0.9 `storage-v2`
//! feature dance. The exact pin keeps an alpha's API changes from arriving unasked.

use crate::cmd::{KeyCmd, Reply};
pub use crate::ids::{GroupId, NodeId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A batch of commands stamped with the leader's clock: one log entry. Every replica applies
/// the commands at `ts`, so every replica computes the same buckets.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Debug, Clone, Deserialize)]
pub struct Proposal {
    /// Leader time in ns since the epoch when the batch was proposed.
    pub ts: u64,
    /// Who waits for the replies: the shard that gathered the batch answers its clients
    /// itself when it applies the entry. None: the replies travel back through Raft.
    pub origin: Option<Origin>,
    /// Shared, not copied, by the log, the replication streams and the apply: one entry is
    /// read several times on a leader. Encoded exactly as the list of commands itself; the
    /// strings of a decoded entry's commands share a few buffers (see `cmd::packed`).
    #[serde(deserialize_with = "crate::cmd::commands")]
    pub cmds: Arc<Vec<KeyCmd>>,
    /// The whole entry's encoding, when it is at hand: as a follower received it from its
    /// leader (its log then writes these bytes rather than encoding the entry again), or as
    /// the leader's log wrote it (the appends to its followers then copy these bytes). Never
    /// encoded itself.
    #[serde(skip)]
    pub wire: Wire,
    /// The entry is held as its encoding alone (`wire`; `cmds` is empty): the log drops an
    /// entry's decoded commands once they have been read to be applied, and decodes them
    /// from `wire` again should they be read again (see [`decoded`]). Never encoded itself.
    #[serde(skip)]
    pub bytes_only: bool,
}

/// Encoded as if derived (the fields but `wire` and `bytes_only`, in order); an entry held as
/// its bytes alone refuses, since its encoding is `wire` and `cmds` is empty.
impl Serialize for Proposal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeStruct};
        if self.bytes_only {
            return Err(S::Error::custom(
                "an entry held as its encoding is written from its bytes",
            ));
        }
        let mut st = s.serialize_struct("Proposal", 3)?;
        st.serialize_field("ts", &self.ts)?;
        st.serialize_field("origin", &self.origin)?;
        st.serialize_field("cmds", &self.cmds)?;
        st.end()
    }
}

impl Proposal {
    pub fn new(ts: u64, origin: Option<Origin>, cmds: Vec<KeyCmd>) -> Proposal {
        Proposal {
            ts,
            origin,
            cmds: Arc::new(cmds),
            wire: Wire::default(),
            bytes_only: false,
        }
    }
}

/// An entry's bincode encoding (`Entry` as a whole, log id and payload), kept beside the
/// decoded entry so that it is encoded once, not once per copy written or sent.
#[derive(Clone, Default)]
pub struct Wire(pub Option<bytes::Bytes>);

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(b) => write!(f, "Wire({} bytes)", b.len()),
            None => f.write_str("Wire(None)"),
        }
    }
}

/// Names a batch gathered by one shard of one node run: the shard's run (a number drawn at
/// start, so a restarted node never mistakes an old entry for one it waits on) and the
/// batch's place in that run.
///
/// On-disk format: bincode-encoded into the Raft log (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub run: u64,
    pub seq: u64,
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bytes_only {
            write!(f, "Proposal(ts={}, encoded)", self.ts)
        } else {
            write!(f, "Proposal(ts={}, {} commands)", self.ts, self.cmds.len())
        }
    }
}

/// One reply per command of the applied proposal (empty for blank and membership entries).
///
/// On-disk format rules apply: bincode-encoded in the Raft replies nodes send each other (golden
/// bytes in tests/encoding.rs). Its field never changes type; changes are append-only (new
/// `Reply` variants) or take a new format version.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Applied(pub Vec<Reply>);

/// The encoding an entry carries, if it does (see `Proposal::wire`).
pub(crate) fn wire_of(entry: &Entry) -> Option<&bytes::Bytes> {
    match &entry.payload {
        openraft::EntryPayload::Normal(p) => p.wire.0.as_ref(),
        _ => None,
    }
}

/// Whether the entry is held as its encoding alone (see `Proposal::bytes_only`).
#[cfg(test)]
pub(crate) fn is_bytes_only(entry: &Entry) -> bool {
    matches!(&entry.payload, openraft::EntryPayload::Normal(p) if p.bytes_only)
}

/// Drops a normal entry's decoded commands when it carries its encoding, which it then keeps:
/// once the state machine has read an entry, it is seldom read again.
pub(crate) fn keep_bytes_only(entry: &mut Entry) {
    if let openraft::EntryPayload::Normal(p) = &mut entry.payload
        && p.wire.0.is_some()
        && !p.bytes_only
    {
        p.cmds = Arc::default();
        p.bytes_only = true;
    }
}

/// Gives a normal entry its encoding (or takes it away, with None, unless the entry is held
/// as its encoding alone).
pub(crate) fn set_wire(entry: &mut Entry, wire: Option<bytes::Bytes>) {
    if let openraft::EntryPayload::Normal(p) = &mut entry.payload
        && !(p.bytes_only && wire.is_none())
    {
        p.wire.0 = wire;
    }
}

openraft::declare_raft_types!(
    /// bucketd's Raft types.
    pub TypeConfig:
        D = Proposal,
        R = Applied,
        NodeId = u64,
        Node = openraft::impls::BasicNode,
);

pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub(crate) type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub(crate) type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub(crate) type LogState = openraft::storage::LogState<TypeConfig>;
pub(crate) type GroupSnapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, Vec<u8>>;
