//! When the sweep walks a partition: the expiry bookkeeping each partition keeps.

/// When a partition is worth sweeping: keys that never expire cost nothing, and a partition
/// where keys only trickle out is not walked on every pass.
#[derive(Default)]
pub(super) struct SweepTiming {
    /// No key of the partition expires before this (0: none has an expiry). May be early, never
    /// late.
    pub(super) next_expiry: u64,
    /// Do not walk the partition again before this time, unless nothing has been swept for long.
    pub(super) cooldown_until: u64,
}

impl SweepTiming {
    pub(super) fn note(&mut self, expires_at: u64) {
        if expires_at != 0 && (self.next_expiry == 0 || expires_at < self.next_expiry) {
            self.next_expiry = expires_at;
        }
    }
}

/// After a walk that removed only this fraction of a partition (1 in N), the partition rests.
pub(super) const TRICKLE: usize = 64;
/// How long a partition rests after a walk that removed little, in ns.
pub(super) const REST_NS: u64 = 1_000_000_000;
