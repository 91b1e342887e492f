//! Commands whose keys live on several shards: the connection sends each shard its share,
//! gathers the replies back into request order, and (through `limit_set`) gives back what a
//! refused check took.

use super::limit_set::{self, Parts, SetError, SetLimit};
use super::session::Session;
use crate::cmd::MultiCmd;
use crate::cmd::{KeyCmd, MAX_REPLY_BYTES, MISSING_REPLY, Reply, TOO_LARGE, summarize};
use crate::shard::ShardGone;
use bytes::Bytes;

/// The positions of `keys`, grouped by the shard that owns each.
fn by_shard(ses: &Session, keys: &[Bytes]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); ses.node.shards.len()];
    for (i, k) in keys.iter().enumerate() {
        groups[ses.node.shard_of(k)].push(i);
    }
    groups
}

/// A multi-key command whose keys live on several shards.
pub(super) async fn cross_shard(ses: &Session, m: MultiCmd) -> Result<Reply, ShardGone> {
    let n = ses.node.shards.len();
    match m {
        MultiCmd::Del(keys) => sum_per_shard(ses, keys, KeyCmd::Del).await,
        MultiCmd::Exists(keys) => sum_per_shard(ses, keys, KeyCmd::Exists).await,
        MultiCmd::MGet(keys) => {
            // Each shard answers for its keys; the replies are put back in request order,
            // and the whole is refused if it would pass the reply cap.
            let groups = by_shard(ses, &keys);
            let mut waits = Vec::new();
            for (s, idx) in groups.iter().enumerate() {
                if !idx.is_empty() {
                    let share = idx.iter().map(|&i| keys[i].clone()).collect();
                    waits.push((s, ses.dispatch(s, vec![KeyCmd::MGet(share)]).await?));
                }
            }
            let mut out = vec![Reply::Nil; keys.len()];
            let mut total = 0usize;
            for (s, p) in waits {
                match p.replies().await?.into_iter().next() {
                    Some(Reply::Array(items)) => {
                        for (&i, r) in groups[s].iter().zip(items) {
                            if let Reply::Bulk(b) = &r {
                                total += b.len();
                            }
                            out[i] = r;
                        }
                    }
                    Some(other) => return Ok(other),
                    None => return Ok(Reply::err(MISSING_REPLY)),
                }
            }
            if total > MAX_REPLY_BYTES {
                return Ok(Reply::err(TOO_LARGE));
            }
            Ok(Reply::Array(out))
        }
        MultiCmd::MSet { keys, values } => {
            // Applied shard by shard: each shard sets its share atomically.
            let mut shares: Vec<(Vec<Bytes>, Vec<Bytes>)> = vec![(Vec::new(), Vec::new()); n];
            for (k, v) in keys.into_iter().zip(values) {
                let share = &mut shares[ses.node.shard_of(&k)];
                share.0.push(k);
                share.1.push(v);
            }
            let mut waits = Vec::new();
            for (s, (keys, values)) in shares.into_iter().enumerate() {
                if !keys.is_empty() {
                    waits.push(ses.dispatch(s, vec![KeyCmd::MSet { keys, values }]).await?);
                }
            }
            let mut reply = Reply::Ok;
            for p in waits {
                if let Some(e @ Reply::Error(_)) = p.replies().await?.into_iter().next() {
                    reply = e;
                }
            }
            Ok(reply)
        }
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
    }
}

async fn sum_per_shard(
    ses: &Session,
    keys: Vec<Bytes>,
    make: fn(Vec<Bytes>) -> KeyCmd,
) -> Result<Reply, ShardGone> {
    let mut groups: Vec<Vec<Bytes>> = vec![Vec::new(); ses.node.shards.len()];
    for k in keys {
        groups[ses.node.shard_of(&k)].push(k);
    }
    let mut waits = Vec::new();
    for (s, g) in groups.into_iter().enumerate() {
        if !g.is_empty() {
            waits.push(ses.dispatch(s, vec![make(g)]).await?);
        }
    }
    let mut total = 0;
    for p in waits {
        total += p
            .replies()
            .await?
            .first()
            .and_then(Reply::as_int)
            .unwrap_or(0);
    }
    Ok(Reply::Int(total))
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
