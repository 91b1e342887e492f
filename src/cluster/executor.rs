//! Where a group's committed entries are applied: a data group's on the shard that owns its
//! keys, the metadata group's on the node's copy of the metadata.
//!
//! The cluster knows the shards only through [`GroupExecutor`], which the shard layer
//! implements for its handles: the cluster sits below the shards and never names them. The
//! calls are made once per batch of committed entries (or per snapshot), never per command,
//! so a boxed future per call costs the write path nothing that counts.

use crate::cluster::meta::MetaStore;
use crate::cluster::state_machine::{EntryBatch, Executor, GroupStateMachine};
use crate::cluster::typ::TypeConfig;
use crate::cmd::Reply;
use crate::store::Record;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

/// The shard that owns a group's keys has stopped (the node is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardStopped;

impl std::fmt::Display for ShardStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("shard stopped")
    }
}

impl std::error::Error for ShardStopped {}

/// What one of [`GroupExecutor`]'s calls gives back, once the shard has done it.
pub(crate) type ExecFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, ShardStopped>> + Send + 'a>>;

/// A shard as the cluster sees it: the thread that owns the keys of some groups, where their
/// committed entries are applied and their snapshots taken and installed. `slots` is always
/// one group's range of hash slots.
pub trait GroupExecutor: Send + Sync + 'static {
    /// Applies committed entries, each at its own time; per entry, the replies its proposer
    /// did not take itself (see `EntryBatch::wanted`).
    fn apply(&self, batches: Vec<EntryBatch>) -> ExecFuture<'_, Vec<Vec<Reply>>>;
    /// Copies out the keys of `slots` (a group's snapshot).
    fn export(&self, slots: (u16, u16), now: u64) -> ExecFuture<'_, Vec<Record>>;
    /// Replaces the keys of `slots` with `records` (installing a group's snapshot).
    fn import(&self, slots: (u16, u16), records: Vec<Record>) -> ExecFuture<'_, ()>;
    /// Removes the keys of `slots` held in one partition of the store (a replica moved away:
    /// cleared a partition at a time, so the shard keeps serving in between).
    fn clear_part(&self, slots: (u16, u16), part: usize) -> ExecFuture<'_, ()>;
}

/// A shared handle on a shard.
pub(crate) type SharedExecutor = Arc<dyn GroupExecutor>;

/// Applies a data group's committed entries on the shard that owns the group's keys.
pub struct ShardExecutor {
    shard: SharedExecutor,
    slots: (u16, u16),
}

impl ShardExecutor {
    pub(crate) fn new(shard: SharedExecutor, slots: (u16, u16)) -> ShardExecutor {
        ShardExecutor { shard, slots }
    }
}

fn gone(e: ShardStopped) -> io::Error {
    io::Error::other(e)
}

impl Executor for ShardExecutor {
    async fn apply(&self, batches: Vec<EntryBatch>) -> io::Result<Vec<Vec<Reply>>> {
        self.shard.apply(batches).await.map_err(gone)
    }

    async fn export(&self, now: u64) -> io::Result<Vec<Record>> {
        self.shard.export(self.slots, now).await.map_err(gone)
    }

    async fn import(&self, records: Vec<Record>) -> io::Result<()> {
        self.shard.import(self.slots, records).await.map_err(gone)
    }
}

/// Where a group's committed entries go: a data group's to the shard that owns its keys, the
/// metadata group's to the node's copy of the metadata.
pub enum GroupApplier {
    Shard(ShardExecutor),
    Meta(Arc<MetaStore>),
}

impl Executor for GroupApplier {
    async fn apply(&self, batches: Vec<EntryBatch>) -> io::Result<Vec<Vec<Reply>>> {
        match self {
            GroupApplier::Shard(s) => s.apply(batches).await,
            GroupApplier::Meta(m) => Ok(batches
                .iter()
                .map(|b| {
                    let replies = m.apply(&b.cmds);
                    // Replies go back through Raft: metadata changes have no origin.
                    if b.origin.is_some() {
                        Vec::new()
                    } else {
                        replies
                    }
                })
                .collect()),
        }
    }

    async fn export(&self, now: u64) -> io::Result<Vec<Record>> {
        match self {
            GroupApplier::Shard(s) => s.export(now).await,
            GroupApplier::Meta(m) => m.export(),
        }
    }

    async fn import(&self, records: Vec<Record>) -> io::Result<()> {
        match self {
            GroupApplier::Shard(s) => s.import(records).await,
            GroupApplier::Meta(m) => m.import(records),
        }
    }
}

/// One replica of a group on this node: its Raft, applying through a [`GroupApplier`].
pub(crate) type GroupRaft = openraft::Raft<TypeConfig, GroupStateMachine<GroupApplier>>;
