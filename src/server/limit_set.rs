//! A set of limits decided all-or-nothing when their keys live in several places: the shards
//! of a standalone node, or the Raft groups of a cluster.
//!
//! Every part gets its share at once, as one `CheckSet` each, and decides it atomically. When
//! every part passes, that is the answer. When one refuses, the parts that passed give back
//! what they took, and their limits are read again so the reply says what they have now. A
//! concurrent check may see those units taken for that moment: it can be refused because of
//! them, never admitted past a limit.

use crate::cmd::{KeyCmd, LimitReply, MISSING_REPLY, Reply};
use crate::limiter::Rule;
use crate::slot::key_slot;
use bytes::Bytes;
use std::future::Future;

/// One limit of a set.
#[derive(Debug, Clone)]
pub(crate) struct SetLimit {
    pub key: Bytes,
    pub rule: Rule,
    pub cost: u64,
    /// Decided and reported as it is, but never refuses the set.
    pub shadow: bool,
}

/// Why a set could not be decided.
#[derive(Debug)]
pub(crate) enum SetError {
    /// The node is shutting down.
    Gone,
    /// What to answer instead (a part's error: WRONGTYPE, MOVED, CLUSTERDOWN...).
    Reply(Reply),
}

/// Where the keys of a set live, and how to run commands there.
pub(crate) trait Parts {
    /// The part that owns `key`.
    fn part_of(&self, key: &[u8]) -> usize;
    /// Runs `cmds`, whose keys all belong to `part`, as one batch; `slot` is the hash slot of
    /// one of those keys.
    fn run(
        &self,
        part: usize,
        slot: u16,
        cmds: Vec<KeyCmd>,
    ) -> impl Future<Output = Result<Vec<Reply>, SetError>>;
}

/// The decision on a set: whether it passed (every limit not in shadow mode did, and was
/// taken), and each limit's figures in the order given, with `[0]` saying whether that limit
/// itself passes.
#[derive(Debug)]
pub(crate) struct SetOutcome {
    pub allowed: bool,
    pub each: Vec<LimitReply>,
}

/// One part's share of a set: the positions of its limits.
struct Share {
    part: usize,
    at: Vec<usize>,
}

impl Share {
    fn check(&self, limits: &[SetLimit], peek: bool) -> KeyCmd {
        KeyCmd::CheckSet {
            keys: self.at.iter().map(|&i| limits[i].key.clone()).collect(),
            rules: self.at.iter().map(|&i| limits[i].rule).collect(),
            costs: self.at.iter().map(|&i| limits[i].cost).collect(),
            shadow: self.at.iter().map(|&i| limits[i].shadow).collect(),
            peek,
        }
    }
}

/// Decides `limits` all or nothing; `peek` decides without taking anything.
pub(crate) async fn decide(
    parts: &impl Parts,
    limits: &[SetLimit],
    peek: bool,
) -> Result<SetOutcome, SetError> {
    let mut shares: Vec<Share> = Vec::new();
    for (i, l) in limits.iter().enumerate() {
        let p = parts.part_of(&l.key);
        match shares.iter_mut().find(|s| s.part == p) {
            Some(s) => s.at.push(i),
            None => shares.push(Share {
                part: p,
                at: vec![i],
            }),
        }
    }
    let slot = |s: &Share| key_slot(&limits[s.at[0]].key);
    let runs = shares
        .iter()
        .map(|s| parts.run(s.part, slot(s), vec![s.check(limits, peek)]));
    let results = futures_util::future::join_all(runs).await;
    let mut each: Vec<LimitReply> = vec![[0; 5]; limits.len()];
    // Per share: Some(passed) once decided; None when it failed to run.
    let mut passed: Vec<Option<bool>> = Vec::with_capacity(shares.len());
    let mut failure = None;
    for (s, r) in shares.iter().zip(results) {
        match r.map(|mut v| v.pop()) {
            Ok(Some(Reply::LimitAll(summary, per))) if per.len() == s.at.len() => {
                for (&i, r) in s.at.iter().zip(per) {
                    each[i] = r;
                }
                passed.push(Some(summary[0] == 1));
            }
            Ok(Some(other)) => {
                passed.push(None);
                failure.get_or_insert(SetError::Reply(other));
            }
            Ok(None) => {
                passed.push(None);
                failure.get_or_insert(SetError::Reply(Reply::err(MISSING_REPLY)));
            }
            Err(e) => {
                passed.push(None);
                failure.get_or_insert(e);
            }
        }
    }
    let allowed = failure.is_none() && passed.iter().all(|p| *p == Some(true));
    if allowed {
        return Ok(SetOutcome { allowed, each });
    }
    // Give back what the passing shares took, and read their limits again.
    let backs = shares
        .iter()
        .zip(&passed)
        .filter(|(_, p)| **p == Some(true))
        .map(|(s, _)| {
            let taken: Vec<usize> =
                s.at.iter()
                    .copied()
                    .filter(|&i| each[i][0] == 1 && limits[i].cost > 0)
                    .collect();
            let mut cmds = Vec::with_capacity(2);
            if !peek && !taken.is_empty() {
                cmds.push(KeyCmd::RefundSet {
                    keys: taken.iter().map(|&i| limits[i].key.clone()).collect(),
                    rules: taken.iter().map(|&i| limits[i].rule).collect(),
                    costs: taken.iter().map(|&i| limits[i].cost).collect(),
                });
            }
            let mut again = s.check(limits, true);
            if let KeyCmd::CheckSet { costs, .. } = &mut again {
                costs.iter_mut().for_each(|c| *c = 0);
            }
            cmds.push(again);
            async move { (s, parts.run(s.part, slot(s), cmds).await) }
        });
    for (s, r) in futures_util::future::join_all(backs).await {
        match r {
            Ok(replies) => {
                if let Some(Reply::LimitAll(_, now)) = replies.last() {
                    for (&i, r) in s.at.iter().zip(now) {
                        // Only the limits that passed are read again: a shadow limit that
                        // failed keeps its refusal (a read at cost 0 always passes).
                        if each[i][0] == 1 {
                            each[i] = *r;
                            each[i][0] = 1;
                        }
                    }
                }
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(SetOutcome { allowed, each }),
    }
}
