//! Node-to-node messaging: every Raft group between two nodes shares one connection.
//!
//! Each node keeps one outgoing connection per peer (`network`), and serves the connections its
//! peers open to it (`serve`). A request carries its group id and a request id; any number are
//! in flight at once, their answers come back in any order, and a request that a peer cannot
//! serve is answered with a [`PeerError`], so the asking node acts on what happened rather than
//! on text (`message`). What one peer's writer drains from its queue goes out in one write, so
//! heartbeats and appends of many groups travel together.
//!
//! - `handshake`: every connection proves it belongs to the cluster before anything on it is
//!   decoded.
//! - `frame`, `wire`: messages are bincode, carried in length-prefixed frames of at most
//!   `FRAME_CAP` bytes (a larger message, such as a large group's snapshot, is split over
//!   several); a reader's buffer grows as bytes arrive, so a header alone costs nothing.
//! - `queue`: what is queued for one peer is bounded (in frames and in bytes): past that a
//!   request fails at once with [`CallError::QueueFull`] (openraft counts the peer unreachable
//!   and backs off), and an answer is dropped (the asker times out), instead of the queue
//!   growing while the peer does not read.
//! - `ping`: one ping per peer pair and heartbeat interval, whatever the number of groups.
//! - `fault`: tests cut links to simulate a partition.
//! - `stats`: what the links count, and how often they log it.

mod fault;
mod frame;
mod handshake;
mod message;
mod network;
mod ping;
mod queue;
mod serve;
mod stats;
mod wire;

pub(crate) use fault::Faults;
pub(crate) use handshake::PeerSecurity;
pub(crate) use message::{GroupSnapshotWire, ScriptsChange};
pub use message::{PeerError, PeerFrame, Rpc, RpcOk};
pub(crate) use network::{CallError, Network};
pub(crate) use ping::{Pinger, ping_peers};
pub(crate) use serve::{Handler, serve};
pub use wire::decode_peer_frame;
