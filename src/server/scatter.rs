//! Limit sets whose keys live on several shards: the connection sends each shard its share,
//! gathers the decisions, and (through `limit_set`) gives back what a refused check took.

use super::limit_set::{self, Parts, SetError, SetLimit};
use super::session::Session;
use crate::cmd::MultiCmd;
use crate::cmd::{KeyCmd, MISSING_REPLY, Reply, summarize};
use crate::shard::ShardGone;

/// A set of limits whose keys live on several shards of a standalone node (BK.CHECKALL): each
/// shard decides its share, and what a refused set took is given back. The other multi-key
/// commands run over their shards together (`cross`).
pub(super) async fn cross_shard(ses: &Session, m: MultiCmd) -> Result<Reply, ShardGone> {
    match m {
        MultiCmd::CheckAll {
            keys,
            rules,
            shadow,
            cost,
            peek,
        } => {
            let limits: Vec<SetLimit> = keys
                .into_iter()
                .zip(rules)
                .zip(shadow)
                .map(|((key, rule), shadow)| SetLimit {
                    key,
                    rule,
                    cost,
                    shadow,
                })
                .collect();
            match limit_set::decide(&NodeShards(ses), &limits, peek).await {
                Ok(o) => Ok(Reply::LimitAll(summarize(&o.each, o.allowed), o.each)),
                Err(SetError::Reply(r)) => Ok(r),
                Err(SetError::Gone) => Err(ShardGone),
            }
        }
        // Not a limit set: nothing to decide in parts.
        _ => Ok(Reply::err(MISSING_REPLY)),
    }
}

/// A standalone node's shards, seen from one connection: its own shard runs a share inline.
struct NodeShards<'a>(&'a Session);

impl Parts for NodeShards<'_> {
    fn part_of(&self, key: &[u8]) -> usize {
        self.0.node.shard_of(key)
    }

    async fn run(
        &self,
        part: usize,
        _slot: u16,
        cmds: Vec<KeyCmd>,
    ) -> Result<Vec<Reply>, SetError> {
        let share = self
            .0
            .dispatch(part, cmds)
            .await
            .map_err(|_| SetError::Gone)?;
        share.replies().await.map_err(|_| SetError::Gone)
    }
}
