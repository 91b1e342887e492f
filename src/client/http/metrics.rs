//! The layer's counters of its decisions, shared by every clone of the layer.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the layer's decisions.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(super) allowed: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) degraded: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) leased: AtomicU64,
    pub(super) lease_refills: AtomicU64,
    pub(super) in_flight_rejected: AtomicU64,
    pub(super) release_failures: AtomicU64,
}

impl Metrics {
    /// Requests let through (by bucketd, a lease, or the fallback).
    pub fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }

    /// Requests refused (429 or 503), for whatever reason.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Decisions made without bucketd because it failed or timed out: by the fallback
    /// buckets, or by refusing under a closed policy.
    pub fn degraded(&self) -> u64 {
        self.degraded.load(Ordering::Relaxed)
    }

    /// The degraded decisions that were due to a timeout.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// Limit checks answered from leased tokens without a round trip.
    pub fn leased(&self) -> u64 {
        self.leased.load(Ordering::Relaxed)
    }

    /// `BK.LEASE` calls made.
    pub fn lease_refills(&self) -> u64 {
        self.lease_refills.load(Ordering::Relaxed)
    }

    /// The refusals that were for the in-flight limit (all of the caller's slots held, or,
    /// while bucketd fails, the failure policy's); also counted in [`Metrics::rejected`].
    pub fn in_flight_rejected(&self) -> u64 {
        self.in_flight_rejected.load(Ordering::Relaxed)
    }

    /// In-flight slots that could not be given back (bucketd failed or timed out); each
    /// frees itself when its ttl runs out.
    pub fn release_failures(&self) -> u64 {
        self.release_failures.load(Ordering::Relaxed)
    }
}
