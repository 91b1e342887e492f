//! Cluster mode: hash slots split over a fixed number of Raft groups, each replicated on R
//! nodes.

pub(crate) mod log_store;
pub(crate) mod membership;
pub(crate) mod meta;
pub(crate) mod node;
pub(crate) mod proposer;
pub(crate) mod quiet;
pub(crate) mod spec;
pub(crate) mod state_machine;
pub(crate) mod transport;
pub(crate) mod typ;

/// A timer for a node's periodic task: a tick that comes late is not made up for.
pub(crate) fn ticker(period: std::time::Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// Waits for the next tick; false once the node is shutting down.
pub(crate) async fn next_tick(
    tick: &mut tokio::time::Interval,
    shutdown: &mut crate::shutdown::Shutdown,
) -> bool {
    tokio::select! {
        _ = tick.tick() => true,
        _ = shutdown.recv() => false,
    }
}
