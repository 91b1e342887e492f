//! bucketd: a Redis-compatible store built for rate limiting.
//!
//! Requests arrive over RESP (`protocol`), are parsed into typed commands (`cmd`), routed by
//! hash slot (`slot`) to the shard thread that owns the key (`shard`), and applied there to
//! the shard's keyspace (`store`) with the limiter algorithms (`limiter`), which are pure
//! functions of state, rule, cost and an injected time (`clock`). In a cluster (`cluster`) a
//! shard proposes its commands to the Raft group that owns their slots and applies them when
//! they commit.
//!
//! # What a user of the crate may rely on
//!
//! - [`start`] with [`config::Settings`] (or [`config::Flags`], the command line) runs a
//!   node; [`server::NodeHandle`] stops it.
//! - [`clock`]: the time source a node reads, injectable for tests.
//! - [`limiter`]: the limit algorithms as pure functions, and the limit spec syntax.
//! - [`slot::key_slot`]: the Redis Cluster hash slot of a key.
//! - `client` (feature `client`) and `client::http` (feature `http`): the gateway side.
//!
//! Everything else is internal. The `server` feature (on by default) is the node; a gateway
//! that only wants the client builds with `default-features = false, features = ["http"]`, and
//! then compiles neither the server nor openraft.

#![warn(unreachable_pub)]

#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod limiter;
pub mod slot;
#[cfg(any(feature = "server", feature = "client"))]
mod sync;

#[cfg(feature = "server")]
mod cluster;
#[cfg(feature = "server")]
mod cmd;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod error;
#[cfg(feature = "server")]
mod glob;
#[cfg(feature = "server")]
mod ids;
#[cfg(feature = "server")]
mod metrics;
#[cfg(feature = "server")]
mod net;
#[cfg(feature = "server")]
mod protocol;
#[cfg(feature = "server")]
mod rls;
#[cfg(feature = "server")]
mod rules;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
mod shard;
#[cfg(feature = "server")]
mod shutdown;
#[cfg(feature = "server")]
mod start;
/// Runs a node: builds its shards, cluster, listeners, metrics and rate limit service from
/// [`config::Settings`]; the [`server::NodeHandle`] it returns stops it.
#[cfg(feature = "server")]
pub use start::start;
#[cfg(feature = "server")]
mod store;
#[cfg(feature = "server")]
pub mod tls;

/// Test support: the internals this crate's own integration tests (`tests/`), benches
/// (`benches/`), fuzz targets and seed generator (`fuzz/`) reach into, each re-exported once,
/// flat: `use bucketd::testing::{KeyCmd, Reply, ShardCore, GroupLog};`.
///
/// This is not an API. Nothing here is stable and it is hidden from the docs; a user of the
/// crate has the public modules listed above. The names are flat on purpose: the files behind
/// them move, and when one does only its `pub use` line here changes, not every test that
/// names it. A re-export whose bare name would say too little outside its module is renamed
/// (`parse_command`, `encode_reply`, `execute_key_cmd`, `shard_channel`), and so is one that
/// would read as another crate's or module's name (`LogEntry`, not Raft's `Entry`;
/// `StoreValue`, `StoreSlot` and `StoreSemaphore`, not `redis::Value`, the `slot` module or
/// tokio's `Semaphore`; `ClientTransport`, not the peers' transport).
///
/// `Fields`, `Holders`, `StoreSemaphore` and `ClientTransport` are here because they appear in
/// the variants of `StoreValue` and `ShardMsg`, not because a test names them today.
///
/// What the tests reach through the public modules stays there, as a user would reach it:
/// `start` and what it takes and returns (`config::Settings`, with `tls::TlsFiles`,
/// `tls::AuthClients` and `config::User` in its fields; `server::NodeHandle`;
/// `error::StartError`), `tls::install_default_provider`, `clock`, `limiter`, `slot` and
/// `client`.
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod testing {
    // The command layer: parsing a request into a command, running a keyed command against a
    // keyspace, encoding its reply.
    pub use crate::cmd::hashes::HashOp;
    pub use crate::cmd::keyed::{
        ExecStats, ExpireCond, GetExOpt, KeyCmd, Reply, SetCond, SetExpiry, TimeCmd,
        encode as encode_reply, execute as execute_key_cmd,
    };
    pub use crate::cmd::lists::ListOp;
    pub use crate::cmd::sets::SetOp;
    pub use crate::cmd::zsets::{AddFlags, LexBound, LexRange, RangeBy, ScoreRange, ZOp};
    pub use crate::cmd::{Parsed, parse as parse_command};

    // RESP on the wire.
    pub use crate::protocol::request::RequestParser;
    pub use crate::protocol::{ReplyWriter, Request, RequestLimits, parse_request};

    // Rules, the node, its shards and their keyspace.
    pub use crate::rules::RuleSet;
    pub use crate::server::node::Node;
    pub use crate::shard::{
        ShardCore, ShardMsg, ShardStats, Transport as ClientTransport, channel as shard_channel,
    };
    pub use crate::store::{
        Fields, Holder, Holders, OwnedValue, Record, Semaphore as StoreSemaphore,
        Slot as StoreSlot, Store, Value as StoreValue,
    };

    // The cluster: Raft types and storage, the peer protocol, the cluster description.
    pub use crate::cluster::log_store::{
        COMPACT_MIN_BYTES, COMPACT_RATIO, GroupLog, NodeLog, replay_len,
    };
    pub use crate::cluster::node::{Cluster, ClusterSettings};
    pub use crate::cluster::spec::{ClusterSpec, NodeSpec, redis_id};
    pub use crate::cluster::state_machine::{GroupStateMachine, LocalExecutor, SnapshotBody};
    pub use crate::cluster::transport::{PeerError, PeerFrame, Rpc, RpcOk, decode_peer_frame};
    pub use crate::cluster::typ::{
        Applied, Entry as LogEntry, GroupId, LogId, NodeId, Origin, Proposal, TypeConfig, Vote,
    };
}
