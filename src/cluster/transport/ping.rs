//! The node-level ping: each node pings every peer once a heartbeat interval, one small
//! message per pair of nodes however many groups there are. It keeps `Network::reachable`
//! current when no group has anything to say, and carries what quiet groups need (see
//! `quiet`).

use super::message::{Rpc, RpcOk};
use super::network::Network;
use crate::cluster::quiet::{Ping, PingAck};
use crate::cluster::{next_tick, ticker};
use crate::ids::NodeId;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Builds the node-level pings and takes their answers.
pub(crate) trait Pinger: Send + Sync + 'static {
    /// The ping to send `peer` now.
    fn ping(&self, peer: NodeId) -> Ping;
    /// `peer` answered `ping`, which was sent at `sent`.
    fn answered(&self, peer: NodeId, sent: std::time::Instant, ping: &Ping, ack: &PingAck);
}

/// At most this many pings to one peer wait for their answers at a time.
const PINGS_IN_FLIGHT: usize = 3;

/// Pings every peer every `every` until the node stops, all peers at the same moment (so
/// that the promises a quiet leader's followers make run out together), with at most
/// `PINGS_IN_FLIGHT` pings in flight per peer. An answer counts from when its ping was sent
/// (the peer answered some moment after that), and like any response it counts as hearing
/// from the peer.
pub(crate) fn ping_peers<P: Pinger>(
    net: &Network,
    pinger: Arc<P>,
    every: Duration,
    handle: &tokio::runtime::Handle,
) {
    let net = net.clone();
    let mut shutdown = net.shutdown();
    handle.spawn(async move {
        let mut tick = ticker(every);
        while next_tick(&mut tick, &mut shutdown).await {
            // The peers of the moment: nodes join and leave.
            for (peer, in_flight) in net.ping_slots() {
                // A ping is sent every interval even while earlier ones wait for their
                // answers: on a loaded node an answer can take longer than an interval, and a
                // lease renewed only by every other ping would lapse between them. Each waits
                // three intervals at most, so a silent peer has at most three on their way.
                if in_flight.fetch_add(1, Ordering::Relaxed) >= PINGS_IN_FLIGHT {
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                    continue;
                }
                let (net, pinger) = (net.clone(), pinger.clone());
                tokio::spawn(async move {
                    let ping = pinger.ping(peer);
                    let sent = std::time::Instant::now();
                    let sent_ms = net.now_ms();
                    // An answer later than a few intervals is of no use to a lease.
                    let answer = net.call(peer, 0, Rpc::Ping(ping.clone()), every * 3).await;
                    if let Ok(RpcOk::Ping(ack)) = answer {
                        net.ping_answered(peer, sent_ms);
                        pinger.answered(peer, sent, &ping, &ack);
                    }
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    });
}
