//! What a script must pass before it runs: its text found (EVALSHA) or kept (EVAL), its
//! `#!lua` flags, its keys (one slot in a cluster; on a standalone node, the shards it runs
//! over), and the node's state (a cluster refuses `no-cluster` scripts, a full node scripts
//! that may write without `allow-oom`). Decided on the node that got the script, before it is
//! proposed, not where it runs: replicas hold different keys, and must all run what the log
//! holds.

use super::Node;
use super::cross::{self, Span};
use super::txn::CROSSSLOT;
use crate::cmd::{Eval, ShebangError};

const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";

/// Why a script cannot run as asked; its reply is the text.
pub(super) enum EvalRefused {
    NoScript,
    CrossSlot,
    /// The script's `#!lua` line does not parse.
    Shebang(ShebangError),
    /// A `no-cluster` script, in a cluster.
    NoCluster,
    /// A script that may write and did not say `allow-oom`, while the node is at a cap.
    Oom,
}

impl EvalRefused {
    pub(super) fn message(&self) -> std::borrow::Cow<'static, str> {
        match self {
            EvalRefused::NoScript => NOSCRIPT.into(),
            EvalRefused::CrossSlot => CROSSSLOT.into(),
            EvalRefused::Shebang(e) => e.to_string().into(),
            EvalRefused::NoCluster => {
                "ERR Can not run script on cluster, 'no-cluster' flag is set.".into()
            }
            // What Redis answers: the script's flags make EVAL a command refused when full.
            EvalRefused::Oom => "OOM command not allowed when used memory > 'maxmemory'.".into(),
        }
    }
}

/// Readies a script to run: finds an EVALSHA's text in the node's cache (and keeps an EVAL's,
/// as Redis does), and says where it runs: None on the one shard that owns its keys, or over
/// several shards of a standalone node.
pub(super) fn prepare(node: &Node, e: &mut Eval) -> Result<Option<Span>, EvalRefused> {
    if e.body.is_empty() {
        e.body = node.scripts.get(&e.sha).ok_or(EvalRefused::NoScript)?;
    } else {
        node.scripts.insert(e.sha.clone(), e.body.clone());
    }
    let flags = e.flags().map_err(EvalRefused::Shebang)?;
    let span = cross::script_span(node, &e.keys).ok_or(EvalRefused::CrossSlot)?;
    if flags.refused_in_cluster() && node.cluster().is_some() {
        return Err(EvalRefused::NoCluster);
    }
    if flags.refused_when_full() && node.live.caps.reached() {
        return Err(EvalRefused::Oom);
    }
    Ok(span)
}
