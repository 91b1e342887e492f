//! Command and limit behaviour, each test run twice from the same code: on a standalone node
//! and on a three-node cluster (see `topology`).
//!
//! What a cluster cannot do the same way stays in the standalone binaries: commands over keys
//! in different slots (cross-slot MSET, BK.CHECKALL and BK.RESET across shards, tests/limits.rs
//! and tests/keyspace.rs), rules (BK.RULE and the rules file are node-local today, so a rule
//! set through one node is unknown to the leader of another key; tests/limits.rs and
//! tests/commands.rs), FLUSHALL (refused in cluster mode), and node-wide state (INFO, CONFIG,
//! key caps, memory limits, CLIENT).

#![cfg(feature = "server")]

#[path = "../common/mod.rs"]
mod common;
#[path = "../cluster/harness.rs"]
#[allow(dead_code)]
mod harness;
#[macro_use]
mod topology;

mod concurrency;
mod limits;
mod strings;
