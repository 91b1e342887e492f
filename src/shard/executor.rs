//! What the cluster asks of a shard: apply the committed entries of the groups it owns, copy
//! out or replace a group's keys for its snapshots, clear the keys of a replica moved away.
//! Each call is one message to the shard's event loop and its answer.

use super::msg::{ShardHandle, ShardMsg};
use crate::cluster::{EntryBatch, ExecFuture, GroupExecutor, ShardStopped};
use crate::cmd::Reply;
use crate::store::Record;

impl GroupExecutor for ShardHandle {
    fn apply(&self, batches: Vec<EntryBatch>) -> ExecFuture<'_, Vec<Vec<Reply>>> {
        Box::pin(async move {
            self.ask(|reply| ShardMsg::ApplyAt { batches, reply })
                .await
                .map_err(|_| ShardStopped)
        })
    }

    fn export(&self, slots: (u16, u16), now: u64) -> ExecFuture<'_, Vec<Record>> {
        Box::pin(async move {
            self.ask(|reply| ShardMsg::Export { slots, now, reply })
                .await
                .map_err(|_| ShardStopped)
        })
    }

    fn import(&self, slots: (u16, u16), records: Vec<Record>) -> ExecFuture<'_, ()> {
        Box::pin(async move {
            self.ask(|reply| ShardMsg::Import {
                slots,
                records,
                reply,
            })
            .await
            .map_err(|_| ShardStopped)
        })
    }

    fn clear_part(&self, slots: (u16, u16), part: usize) -> ExecFuture<'_, ()> {
        Box::pin(async move {
            self.ask(|reply| ShardMsg::ClearPart { slots, part, reply })
                .await
                .map_err(|_| ShardStopped)
        })
    }
}
