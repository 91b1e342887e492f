//! The node's counters read once for a report: INFO and the Prometheus endpoint both show
//! what `stats` gathers, so the two never sum the shards differently.

use super::Node;
use std::sync::atomic::Ordering;

/// The node's counters at one moment: the shards' summed, and each shard's own.
pub(crate) struct NodeReport {
    /// Keys held.
    pub(crate) keys: u64,
    /// Bytes the keys take, by the node's own count.
    pub(crate) used_bytes: u64,
    /// Keys with a TTL.
    pub(crate) expires: u64,
    /// Sampled average TTL in ms, each shard's weighted by its keys with a TTL.
    pub(crate) avg_ttl_ms: u64,
    /// Keys removed as they expired.
    pub(crate) expired: u64,
    /// Requests handled, of any command.
    pub(crate) requests: u64,
    /// Limit decisions, and those that denied.
    pub(crate) checks: u64,
    pub(crate) denied: u64,
    /// Keys refused because the node was full.
    pub(crate) rejected_full: u64,
    /// Error replies sent, by code, in the order the codes were first counted.
    pub(crate) errors: Vec<(&'static str, u64)>,
    /// Resident set size of the process.
    pub(crate) rss_bytes: u64,
    pub(crate) shards: Vec<ShardReport>,
}

/// One shard's counters.
pub(crate) struct ShardReport {
    pub(crate) id: usize,
    pub(crate) keys: u64,
    pub(crate) bytes: u64,
    pub(crate) commands: u64,
    pub(crate) checks: u64,
    pub(crate) remote_batches: u64,
}

impl NodeReport {
    /// Error replies sent, of any code.
    pub(crate) fn total_errors(&self) -> u64 {
        self.errors.iter().map(|e| e.1).sum()
    }
}

/// Reads every shard's counters once and sums them.
pub(crate) fn stats(node: &Node) -> NodeReport {
    let mut r = NodeReport {
        keys: 0,
        used_bytes: 0,
        expires: 0,
        avg_ttl_ms: 0,
        expired: 0,
        requests: 0,
        checks: 0,
        denied: 0,
        rejected_full: 0,
        errors: Vec::new(),
        rss_bytes: rss_bytes(),
        shards: Vec::with_capacity(node.shards.len()),
    };
    let mut weighted_ttl: u128 = 0;
    for s in &node.shards {
        let st = &s.stats;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let shard = ShardReport {
            id: s.id,
            keys: load(&st.keys),
            bytes: load(&st.bytes),
            commands: load(&st.commands),
            checks: load(&st.checks),
            remote_batches: load(&st.remote_batches),
        };
        let expires = load(&st.expires);
        r.keys += shard.keys;
        r.used_bytes += shard.bytes;
        r.checks += shard.checks;
        r.expires += expires;
        weighted_ttl += u128::from(load(&st.avg_ttl_ms)) * u128::from(expires);
        r.expired += load(&st.expired);
        r.requests += load(&st.requests);
        r.denied += load(&st.denied);
        r.rejected_full += load(&st.rejected_full);
        // Every shard counts the same codes in the same order.
        for (i, (code, n)) in st.errors.snapshot().enumerate() {
            match r.errors.get_mut(i) {
                Some(e) => e.1 += n,
                None => r.errors.push((code, n)),
            }
        }
        r.shards.push(shard);
    }
    r.avg_ttl_ms = weighted_ttl
        .checked_div(u128::from(r.expires))
        .map_or(0, |v| u64::try_from(v).unwrap_or(u64::MAX));
    r
}

/// Resident set size of this process, in bytes (0 where /proc is not available).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}
