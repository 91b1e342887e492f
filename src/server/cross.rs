//! Commands over the keys of several shards of a standalone node, run atomically and
//! isolated: the connection that got one coordinates it (see docs/multi-shard.md).
//!
//! 1. It takes the node's lock of every shard involved, and of its own shard, in shard order.
//!    Two commands that share a shard are so ordered one after the other; commands on
//!    disjoint shards run side by side; and since every coordinator takes its locks in the
//!    same order, none waits for another that waits for it. (Its own shard's lock keeps its
//!    thread, which the command runs on, from being lent to a coordinator that waits for a
//!    shard this one holds.)
//! 2. It asks each involved shard other than its own to lend it its store. A shard that
//!    lends waits, doing nothing else, until the store comes back; the commands queued to it
//!    before the loan have run, those queued after run once it is back.
//! 3. With every store in hand it runs the commands, its own shard's store included, without
//!    yielding: nothing else runs on its own shard meanwhile, and the lenders are waiting. No
//!    one sees a half-applied script or transaction.
//! 4. Dropping the loans sends the stores back; the locks are released.
//!
//! A command whose keys one shard owns takes none of this: it runs on that shard as always.

use super::Node;
use super::session::Session;
use crate::cmd::{KeyCmd, Reply, keys_of};
use crate::shard::{Lent, ShardGone, ShardMsg};
use crate::slot::key_slot;
use tokio::sync::oneshot;

/// The shards a command spans.
pub(super) enum Span {
    /// These shards (any order, repeats allowed).
    Some(Vec<usize>),
    /// Every shard of the node: a script that reaches beyond its declared keys, or the whole
    /// keyspace (KEYS, DBSIZE).
    Every,
}

/// Runs `cmds` in order as one step over the shards of `span`, and answers each.
pub(super) async fn run(
    ses: &Session,
    span: Span,
    cmds: Vec<KeyCmd>,
) -> Result<Vec<Reply>, ShardGone> {
    let n = ses.node.shards.len();
    let (mut shards, every) = match span {
        Span::Some(s) => (s, false),
        Span::Every => ((0..n).collect(), true),
    };
    // Its own shard too: the command runs on its thread, which must not be lent meanwhile
    // to a coordinator that waits for a shard this one holds.
    shards.push(ses.my_shard);
    shards.sort_unstable();
    shards.dedup();
    shards.retain(|&s| s < n);
    let every = every || shards.len() == n;
    let mut guards = Vec::with_capacity(shards.len());
    for &s in &shards {
        if let Some(lock) = ses.node.cross_locks.get(s) {
            guards.push(lock.lock().await);
        }
    }
    let mut asked = Vec::with_capacity(shards.len());
    for &s in &shards {
        if s != ses.my_shard {
            let (tx, rx) = oneshot::channel();
            ses.node.shards[s]
                .send(ShardMsg::Lend { reply: tx })
                .await?;
            asked.push(rx);
        }
    }
    let mut lent: Vec<Lent> = Vec::with_capacity(asked.len());
    for rx in asked {
        lent.push(rx.await.map_err(|_| ShardGone)?);
    }
    let replies = ses.core.borrow_mut().run_across(&mut lent, every, &cmds);
    drop(lent);
    drop(guards);
    Ok(replies)
}

/// How EXEC runs a transaction's key commands on a standalone node of several shards: over
/// the shards its keys are on when there are several (every shard when it holds a script,
/// which may reach any key); None when one shard runs it whole, as on a cluster node.
pub(super) fn exec_span(node: &Node, keyed: &[KeyCmd]) -> Option<Span> {
    if node.cluster().is_some() || node.shards.len() < 2 {
        return None;
    }
    if keyed.iter().any(|c| matches!(c, KeyCmd::Eval(_))) {
        return Some(Span::Every);
    }
    let mut shards: Vec<usize> = keyed
        .iter()
        .flat_map(|c| keys_of(c).into_iter().map(|k| node.shard_of(k)))
        .collect();
    shards.sort_unstable();
    shards.dedup();
    (shards.len() > 1).then_some(Span::Some(shards))
}

/// Where a script with `keys` runs: None (the outer None) when its keys span slots of a
/// cluster, which Redis Cluster refuses; Some(None) on the one shard that owns them; over
/// several shards of a standalone node when its keys are on several, or when it declares
/// none (it may then reach any key).
pub(super) fn script_span(node: &Node, keys: &[bytes::Bytes]) -> Option<Option<Span>> {
    if node.cluster().is_some() {
        let slot = keys.first().map(|k| key_slot(k));
        return keys
            .iter()
            .all(|k| Some(key_slot(k)) == slot)
            .then_some(None);
    }
    if node.shards.len() < 2 {
        return Some(None);
    }
    let Some(first) = keys.first() else {
        return Some(Some(Span::Every));
    };
    let shard = node.shard_of(first);
    if keys.iter().all(|k| node.shard_of(k) == shard) {
        return Some(None);
    }
    Some(Some(Span::Some(
        keys.iter().map(|k| node.shard_of(k)).collect(),
    )))
}
