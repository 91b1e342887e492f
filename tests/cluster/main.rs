//! Cluster mode end to end: three-node clusters in this process (and, in `processes`, as real
//! processes), exercised through clients the way gateways use them.

#![cfg(feature = "server")]

#[path = "../common/mod.rs"]
mod common;
mod harness;

mod clients;
mod clocks;
mod collections;
mod concurrency;
mod failover;
mod hashes;
mod membership;
mod metrics;
mod network;
mod outcomes;
mod partition;
mod peer_auth;
mod pipeline;
mod processes;
mod quiet;
mod restart;
mod rls;
mod scaling;
mod scripts;
mod snapshot;
mod topology;
mod transactions;
