//! The node: what its shard threads share (`Node`), the parts the composition root
//! (`start.rs`) puts together (client listeners, shard threads, the node's tasks), and
//! `NodeHandle`, which stops them.
//!
//! Each accepted connection is placed on one shard's event loop, round-robin (`accept`). Its
//! task is the coordinator for its client (`conn`): it parses every request one read
//! delivered, runs the commands its own shard owns inline, sends every other shard one batch
//! with its share, and writes all replies back, in request order, with one write. Commands
//! that change how later replies are encoded (HELLO), that gate later commands (AUTH), or
//! that span shards (`scatter`, `cross`) act as barriers: the round so far is flushed first, so order
//! is kept. The shards run their own loops (`crate::shard`).

mod accept;
mod acl;
mod commands;
mod conn;
mod cross;
mod eval_gate;
pub(crate) mod info;
mod launch;
pub(crate) mod limit_set;
pub(crate) mod live;
mod named;
pub(crate) mod node;
mod persist;
mod report;
mod round;
mod scatter;
mod session;
mod share;
mod stream;
mod txn;

pub use crate::shard::set_free_memory_release;
pub use launch::NodeHandle;
pub(crate) use launch::{ClientListeners, Shards, serve, share_file_rules, start_shards};
pub(crate) use limit_set::{
    Parts as LimitSetParts, SetError, SetLimit, decide as decide_limit_set,
};
pub(crate) use live::LiveSettings;
pub(crate) use node::{ClientInfo, ClientMeta, Node, NodeStats, REDIS_COMPAT_VERSION, VERSION};
pub(crate) use report::{NodeReport, stats};
