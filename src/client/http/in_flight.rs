//! The layer's concurrency limit: a request holds one of its caller's slots in bucketd
//! (`BK.ACQUIRE`) while the inner service produces its response, and gives it back
//! (`BK.RELEASE`) once the response is there, or from a task of its own if the request is
//! dropped first. When bucketd fails, the `FailurePolicy` decides, as for the rate limits; an
//! open policy counts this gateway's share of the slots in process.

use super::local::Lru;
use super::metrics::Metrics;
use crate::client::{Client, Error, Permit};
use crate::sync::lock;
use http::StatusCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// At most `limit` requests of one caller in flight at once, each slot held for `ttl` at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct InFlightOptions {
    pub(super) limit: u64,
    pub(super) ttl: Duration,
}

/// What a request got from the concurrency limit.
pub(super) enum Slot {
    /// No concurrency limit applies to it.
    Free,
    Held(SlotGuard),
    Refused {
        status: StatusCode,
        retry_after: Duration,
    },
}

/// A slot the request holds. `release` gives it back; dropped without that (the request's
/// future was dropped mid-way), it gives the slot back from a spawned task. A slot that is
/// never given back (no runtime to spawn on, bucketd unreachable) frees itself at its ttl.
pub(super) struct SlotGuard {
    held: Held,
    client: Client,
    metrics: Arc<Metrics>,
}

enum Held {
    /// In bucketd; `None` once given back.
    Remote(Option<Permit>),
    /// In this gateway's count, while bucketd is away; given back when dropped.
    Local { _hold: LocalHold },
}

impl SlotGuard {
    /// A slot held in bucketd, given back with `permit`.
    pub(super) fn remote(permit: Permit, client: Client, metrics: Arc<Metrics>) -> SlotGuard {
        SlotGuard {
            held: Held::Remote(Some(permit)),
            client,
            metrics,
        }
    }

    /// Gives the slot back, within the client's deadline.
    pub(super) async fn release(mut self) {
        if let Held::Remote(Some(permit)) = &self.held {
            let done = self.client.release(permit).await;
            // Given back (or failed for good) before the permit is forgotten: if this future
            // is dropped while it waits, `drop` still sends a release.
            if let Held::Remote(p) = &mut self.held {
                *p = None;
            }
            note_release(&self.metrics, done);
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let Held::Remote(permit) = &mut self.held else {
            return;
        };
        let Some(permit) = permit.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, metrics) = (self.client.clone(), self.metrics.clone());
        runtime.spawn(async move {
            note_release(&metrics, client.release(&permit).await);
        });
    }
}

fn note_release(metrics: &Metrics, done: Result<bool, Error>) {
    if let Err(e) = done {
        metrics.release_failures.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("in-flight slot not given back (it frees itself at its ttl): {e}");
    }
}

/// One slot of a local count, given back on drop.
struct LocalHold(Arc<AtomicU64>);

impl Drop for LocalHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Slots held per caller on this gateway while bucketd is away. Bounded like the fallback
/// buckets: a caller evicted while its requests run starts a fresh count, so eviction can only
/// admit more, never refuse a caller for slots it does not hold.
pub(super) struct LocalInFlight {
    counts: Mutex<Lru<Arc<AtomicU64>>>,
}

impl LocalInFlight {
    pub(super) fn new(cap: usize) -> LocalInFlight {
        LocalInFlight {
            counts: Mutex::new(Lru::new(cap)),
        }
    }

    /// Holds one of `limit` local slots for `key` for a request, if one is free.
    pub(super) fn hold(
        &self,
        key: &str,
        limit: u64,
        client: Client,
        metrics: Arc<Metrics>,
    ) -> Option<SlotGuard> {
        self.take(key, limit).map(|hold| SlotGuard {
            held: Held::Local { _hold: hold },
            client,
            metrics,
        })
    }

    /// Takes one of `limit` local slots for `key`, if one is free.
    fn take(&self, key: &str, limit: u64) -> Option<LocalHold> {
        let count = lock(&self.counts)
            .get_or_insert_with(key, Arc::default)
            .clone();
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| LocalHold(count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_slots_are_counted_per_key_and_come_back_on_drop() {
        let local = LocalInFlight::new(10);
        let a1 = local.take("a", 2).expect("a free slot");
        let a2 = local.take("a", 2).expect("a free slot");
        assert!(local.take("a", 2).is_none());
        assert!(local.take("b", 2).is_some(), "each key counts apart");
        drop(a1);
        let a3 = local.take("a", 2).expect("a slot came back");
        assert!(local.take("a", 2).is_none());
        drop((a2, a3));
        assert!(local.take("a", 1).is_some());
    }
}
