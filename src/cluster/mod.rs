//! Cluster mode: hash slots split over a fixed number of Raft groups, each replicated on R
//! nodes.

pub mod log_store;
pub mod node;
pub mod proposer;
pub mod quiet;
pub mod spec;
pub mod state_machine;
pub mod transport;
pub mod typ;
