//! bucketd: a Redis-compatible store built for rate limiting.
//!
//! Requests arrive over RESP (`protocol`), are parsed into typed commands (`cmd`), routed by
//! hash slot (`slot`) to the shard thread that owns the key (`shard`), and applied there to
//! the shard's keyspace (`store`) with the limiter algorithms (`limiter`), which are pure
//! functions of state, rule, cost and an injected time (`clock`).

#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod cluster;
pub mod cmd;
pub mod config;
pub mod error;
pub mod glob;
pub mod limiter;
pub mod protocol;
pub mod rules;
pub mod server;
pub mod shard;
pub mod shutdown;
pub mod slot;
pub mod store;
pub(crate) mod sync;
