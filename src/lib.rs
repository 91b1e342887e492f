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
//! - [`server::start`] with [`config::Settings`] (or [`config::Flags`], the command line) runs a
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
mod store;
#[cfg(feature = "server")]
pub mod tls;

/// Not an API: the internals this crate's own benches and integration tests reach into (the
/// command layer, the shard core, the keyspace, the Raft storage). Nothing here is stable.
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod internals {
    pub mod cmd {
        pub use crate::cmd::{Parsed, parse};
        pub mod hashes {
            pub use crate::cmd::hashes::HashOp;
        }
        pub mod keyed {
            pub use crate::cmd::keyed::{
                ExecStats, ExpireCond, GetExOpt, KeyCmd, Reply, SetCond, SetExpiry, TimeCmd,
                encode, execute,
            };
        }
    }
    pub mod cluster {
        pub mod typ {
            pub use crate::cluster::typ::{
                Applied, Entry, GroupId, LogId, NodeId, Origin, Proposal, TypeConfig, Vote,
            };
        }
        pub mod state_machine {
            pub use crate::cluster::state_machine::{
                GroupStateMachine, LocalExecutor, SnapshotBody,
            };
        }
        pub mod spec {
            pub use crate::cluster::spec::{ClusterSpec, NodeSpec, redis_id};
        }
        pub mod node {
            pub use crate::cluster::node::{Cluster, ClusterSettings};
        }
        pub mod log_store {
            pub use crate::cluster::log_store::{
                COMPACT_MIN_BYTES, COMPACT_RATIO, GroupLog, NodeLog, replay_len,
            };
        }
        pub mod transport {
            pub use crate::cluster::transport::{
                PeerError, PeerFrame, Rpc, RpcOk, decode_peer_frame,
            };
        }
    }
    pub mod protocol {
        pub use crate::protocol::request::RequestParser;
        pub use crate::protocol::{ReplyWriter, Request, RequestLimits, parse_request};
    }
    pub mod rules {
        pub use crate::rules::RuleSet;
    }
    pub mod server {
        pub use crate::server::node::Node;
    }
    pub mod shard {
        pub use crate::shard::{ShardCore, ShardMsg, ShardStats, Transport, channel};
    }
    pub mod store {
        pub use crate::store::{
            Fields, Holder, Holders, OwnedValue, Record, Semaphore, Slot, Store, Value,
        };
    }
}
