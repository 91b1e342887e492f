//! What a node's peer links count (frames and the writes that carried them, frames a full
//! queue refused, peer connections refused), and how often they say so in the log: each is
//! counted, but a flood of them must not flood the log.

use crate::ids::NodeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often a refused peer connection is logged at warn at most (each is counted; the rest go
/// to debug).
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(1);

/// How often a full peer queue is logged at most (each refusal is counted all the same).
const FULL_LOG_EVERY: Duration = Duration::from_secs(1);

/// The counters of one node's links. Times are in ms on the network's clock, never 0 (0 says
/// "never").
#[derive(Default)]
pub(super) struct LinkStats {
    /// Frames sent, and writes that carried them (to see batching at work).
    frames_sent: AtomicU64,
    writes: AtomicU64,
    /// Frames not sent because their peer's queue was full, and when that was last logged.
    queue_full: AtomicU64,
    queue_full_logged: AtomicU64,
    /// Peer connections refused (a failed handshake, an over-cap or undecodable frame), and
    /// when that was last logged at warn.
    refused: AtomicU64,
    refused_logged: AtomicU64,
}

impl LinkStats {
    /// Counts one write that carried `frames` frames.
    pub(super) fn note_write(&self, frames: u64) {
        self.frames_sent.fetch_add(frames, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// (frames sent, write syscalls) so far.
    pub(super) fn batching(&self) -> (u64, u64) {
        (
            self.frames_sent.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
        )
    }

    /// Frames not sent so far because their peer's queue was full.
    pub(super) fn queue_full_drops(&self) -> u64 {
        self.queue_full.load(Ordering::Relaxed)
    }

    /// Peer connections refused so far.
    pub(super) fn refused_connections(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Counts a frame refused by `peer`'s full queue, and says so in the log at most once per
    /// `FULL_LOG_EVERY`.
    pub(super) fn note_queue_full(&self, peer: NodeId, what: &str, now_ms: u64) {
        let total = self.queue_full.fetch_add(1, Ordering::Relaxed) + 1;
        if time_to_log(&self.queue_full_logged, FULL_LOG_EVERY, now_ms) {
            tracing::warn!(
                peer,
                total,
                "the queue to node {peer} is full: {what} dropped ({total} so far)"
            );
        }
    }

    /// Counts a refused peer connection and logs it: at warn at most once per
    /// `REFUSED_LOG_EVERY` (a flood of bad connections must not flood the log), else at debug.
    pub(super) fn note_refused(&self, peer: &str, why: &dyn std::fmt::Display, now_ms: u64) {
        let total = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if time_to_log(&self.refused_logged, REFUSED_LOG_EVERY, now_ms) {
            tracing::warn!(
                peer,
                total,
                "refused a peer connection from {peer}: {why} ({total} refused so far)"
            );
        } else {
            tracing::debug!(peer, "refused a peer connection from {peer}: {why}");
        }
    }
}

/// Whether `every` has passed since `last_logged` (0: never) was set, setting it to `now` if
/// so: of threads asking at once, one gets true.
fn time_to_log(last_logged: &AtomicU64, every: Duration, now: u64) -> bool {
    let last = last_logged.load(Ordering::Relaxed);
    let every = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
    (last == 0 || now.saturating_sub(last) >= every)
        && last_logged
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
