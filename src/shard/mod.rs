//! Shard threads: one single-threaded event loop per core, each owning a disjoint part of the
//! keyspace and the client connections placed on it.
//!
//! A command whose key the connection's own shard owns runs inline, with no hand-off at all.
//! A command for another shard travels there in a batch (one message per shard per round)
//! over a bounded crossbeam channel; a `Notify` wakes the target's event loop, which drains
//! the channel and answers each batch over a oneshot. Only the owning thread ever touches a
//! `Store`, so every command is atomic without a lock.
//!
//! - `core`: the shard's keys and clock, and how commands are applied to them;
//! - `msg`: the messages a shard takes, its answers, and the channel they travel on;
//! - `event_loop`: the loop that owns a `ShardCore` and answers its inbox;
//! - `turn`: the end of a turn of that loop, when connections write their replies together;
//! - `proposer`: in a cluster, gathers a turn's commands per group into one log entry and
//!   answers them when the entry is applied;
//! - `executor`: what the cluster asks of a shard (applying committed entries, snapshots);
//! - `group_times`: in a cluster, the time each group has reached, which its keys expire by;
//! - `stats`: the figures a shard publishes for INFO and the metrics.

mod core;
mod event_loop;
mod executor;
mod group_times;
pub(crate) mod metrics;
mod msg;
mod proposer;
mod stats;
mod turn;

// What the rest of the crate uses of this folder.
pub(crate) use metrics::{LATENCY_BOUNDS_US, LatencySnapshot, Verdict};

pub use self::core::ShardCore;
pub(crate) use self::core::release_free_memory;
pub use self::core::set_free_memory_release;
pub(crate) use self::core::{CoreRef, Outcome, Placement};
pub use self::stats::ShardStats;
pub(crate) use event_loop::run;
pub(crate) use msg::{Answer, Lent, ShardGone, ShardHandle, ShardInbox};
pub use msg::{ShardMsg, Transport, channel};
pub(crate) use turn::end_of_turn;
