//! Commands whose keys live on several shards: the connection sends each shard its share,
//! gathers the replies back into request order, and gives back what a refused check took.

use super::conn::Conn;
use crate::cmd::MultiCmd;
use crate::cmd::keyed::{KeyCmd, LimitReply, Reply, summarize};
use crate::shard::{Answer, ShardGone};
use bytes::Bytes;
use tokio::sync::oneshot;

/// The replies to one shard's share: already there (the connection's own shard ran it
/// inline), or still to come from another shard.
pub(super) enum ShareReplies {
    Ready(Vec<Reply>),
    Wait(oneshot::Receiver<Answer>),
}

impl ShareReplies {
    /// The replies, once they are there.
    pub(super) async fn replies(self) -> Result<Vec<Reply>, ShardGone> {
        match self {
            ShareReplies::Ready(r) => Ok(r),
            ShareReplies::Wait(rx) => rx.await.map(|a| a.replies).map_err(|_| ShardGone),
        }
    }
}

impl Conn {
    /// The positions of `keys`, grouped by the shard that owns each.
    fn by_shard(&self, keys: &[Bytes]) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); self.node.shards.len()];
        for (i, k) in keys.iter().enumerate() {
            groups[self.node.shard_of(k)].push(i);
        }
        groups
    }

    /// A multi-key command whose keys live on several shards.
    pub(super) async fn cross_shard(&mut self, m: MultiCmd) -> Result<Reply, ShardGone> {
        let n = self.node.shards.len();
        match m {
            MultiCmd::Del(keys) => self.sum_per_shard(keys, KeyCmd::Del).await,
            MultiCmd::Exists(keys) => self.sum_per_shard(keys, KeyCmd::Exists).await,
            MultiCmd::MGet(keys) => {
                // Each shard answers for its keys; the replies are put back in request order,
                // and the whole is refused if it would pass the reply cap.
                let groups = self.by_shard(&keys);
                let mut waits = Vec::new();
                for (s, idx) in groups.iter().enumerate() {
                    if !idx.is_empty() {
                        let share = idx.iter().map(|&i| keys[i].clone()).collect();
                        waits.push((s, self.dispatch(s, vec![KeyCmd::MGet(share)]).await?));
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
                        None => return Ok(Reply::err("ERR internal error: missing reply")),
                    }
                }
                if total > crate::cmd::keyed::MAX_REPLY_BYTES {
                    return Ok(Reply::err(crate::cmd::keyed::TOO_LARGE));
                }
                Ok(Reply::Array(out))
            }
            MultiCmd::MSet { keys, values } => {
                // Applied shard by shard: each shard sets its share atomically.
                let mut shares: Vec<(Vec<Bytes>, Vec<Bytes>)> = vec![(Vec::new(), Vec::new()); n];
                for (k, v) in keys.into_iter().zip(values) {
                    let share = &mut shares[self.node.shard_of(&k)];
                    share.0.push(k);
                    share.1.push(v);
                }
                let mut waits = Vec::new();
                for (s, (keys, values)) in shares.into_iter().enumerate() {
                    if !keys.is_empty() {
                        waits.push(
                            self.dispatch(s, vec![KeyCmd::MSet { keys, values }])
                                .await?,
                        );
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
                cost,
                peek,
            } => {
                // Each shard checks its limits atomically; if any shard refuses, the shards
                // that consumed give it back. A concurrent check may briefly see those units
                // taken (it can be refused, never over-admitted).
                let groups = self.by_shard(&keys);
                let mut waits = Vec::new();
                for (s, idx) in groups.iter().enumerate() {
                    if idx.is_empty() {
                        continue;
                    }
                    let cmd = KeyCmd::CheckAll {
                        keys: idx.iter().map(|&i| keys[i].clone()).collect(),
                        rules: idx.iter().map(|&i| rules[i]).collect(),
                        cost,
                        peek,
                    };
                    waits.push((s, self.dispatch(s, vec![cmd]).await?));
                }
                let mut each: Vec<LimitReply> = vec![[0; 5]; keys.len()];
                let mut shard_ok = vec![true; n];
                for (s, p) in waits {
                    match p.replies().await?.into_iter().next() {
                        Some(Reply::LimitAll(summary, per)) => {
                            shard_ok[s] = summary[0] == 1;
                            for (j, &i) in groups[s].iter().enumerate() {
                                if let Some(r) = per.get(j) {
                                    each[i] = *r;
                                }
                            }
                        }
                        Some(other) => return Ok(other),
                        None => return Ok(Reply::err("ERR internal error: missing reply")),
                    }
                }
                let allowed = shard_ok.iter().all(|&ok| ok);
                if !allowed {
                    // Shards whose limits all passed give back what they took (unless this was
                    // a peek), then report what those limits have now, exactly as a refused
                    // check on a single shard reports its passing limits.
                    for (s, idx) in groups.iter().enumerate() {
                        if idx.is_empty() || !shard_ok[s] {
                            continue;
                        }
                        let keys_s: Vec<Bytes> = idx.iter().map(|&i| keys[i].clone()).collect();
                        let rules_s: Vec<_> = idx.iter().map(|&i| rules[i]).collect();
                        let mut cmds = Vec::with_capacity(2);
                        if !peek {
                            cmds.push(KeyCmd::Refund {
                                keys: keys_s.clone(),
                                rules: rules_s.clone(),
                                cost,
                            });
                        }
                        cmds.push(KeyCmd::CheckAll {
                            keys: keys_s,
                            rules: rules_s,
                            cost: 0,
                            peek: true,
                        });
                        let replies = self.dispatch(s, cmds).await?.replies().await?;
                        if let Some(Reply::LimitAll(_, now)) = replies.last() {
                            for (j, &i) in idx.iter().enumerate() {
                                if let Some(r) = now.get(j) {
                                    each[i] = *r;
                                    each[i][0] = 1;
                                }
                            }
                        }
                    }
                }
                Ok(Reply::LimitAll(summarize(&each, allowed), each))
            }
        }
    }

    async fn sum_per_shard(
        &mut self,
        keys: Vec<Bytes>,
        make: fn(Vec<Bytes>) -> KeyCmd,
    ) -> Result<Reply, ShardGone> {
        let mut groups: Vec<Vec<Bytes>> = vec![Vec::new(); self.node.shards.len()];
        for k in keys {
            groups[self.node.shard_of(&k)].push(k);
        }
        let mut waits = Vec::new();
        for (s, g) in groups.into_iter().enumerate() {
            if !g.is_empty() {
                waits.push(self.dispatch(s, vec![make(g)]).await?);
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

    /// Runs a command on every shard and returns the replies.
    pub(crate) async fn all_shards(
        &self,
        make: impl Fn() -> KeyCmd,
    ) -> Result<Vec<Reply>, ShardGone> {
        let mut waits = Vec::new();
        for s in 0..self.node.shards.len() {
            waits.push(self.dispatch(s, vec![make()]).await?);
        }
        let mut out = Vec::new();
        for w in waits {
            out.extend(w.replies().await?);
        }
        Ok(out)
    }

    /// Sends a batch to shard `s` to apply at once, whole: inline when it is this
    /// connection's own shard.
    pub(super) async fn dispatch(
        &self,
        s: usize,
        cmds: Vec<KeyCmd>,
    ) -> Result<ShareReplies, ShardGone> {
        if s == self.my_shard {
            Ok(ShareReplies::Ready(
                self.core.borrow_mut().apply_batch_local(cmds),
            ))
        } else {
            Ok(ShareReplies::Wait(
                self.node.shards[s].submit(cmds, usize::MAX).await?,
            ))
        }
    }
}
