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
