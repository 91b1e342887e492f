//! What a shard publishes about itself: the figures INFO and the metrics endpoint show.

use crate::protocol::ErrorCounts;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Figures a shard publishes for INFO; written only by the shard thread.
#[derive(Debug, Default)]
pub struct ShardStats {
    /// Requests from the connections on this shard (any command).
    pub requests: AtomicU64,
    pub keys: AtomicU64,
    pub bytes: AtomicU64,
    pub commands: AtomicU64,
    pub checks: AtomicU64,
    pub denied: AtomicU64,
    pub expired: AtomicU64,
    pub rejected_full: AtomicU64,
    pub remote_batches: AtomicU64,
    /// Keys with an expiry.
    pub expires: AtomicU64,
    /// Sampled average TTL of the keys with an expiry, in ms.
    pub avg_ttl_ms: AtomicU64,
    /// Error replies sent to the connections on this shard, by code; the shard thread
    /// counts into it (`protocol::reply::count_errors_in`).
    pub errors: Arc<ErrorCounts>,
    /// What the metrics endpoint shows beyond these.
    pub(crate) metrics: super::metrics::ShardMetrics,
}
