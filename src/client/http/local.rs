//! State the gateway keeps in process: a bounded least-recently-used map, the fallback token
//! buckets used while bucketd is unavailable, and the pools of leased tokens.

use super::verdict::Figures;
use crate::client::Limit;
use crate::sync::lock;
use hashbrown::HashMap;
use hashbrown::hash_map::EntryRef;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Entry<V> {
    value: V,
    used: u64,
}

/// A map holding at most `cap` keys; inserting past the cap evicts the least recently used.
///
/// Recency is kept as a queue of `(key, stamp)` touches; stale touches are skipped when
/// evicting and swept when the queue grows past twice the cap, so each operation is O(1)
/// amortized.
pub(crate) struct Lru<V> {
    map: HashMap<Arc<str>, Entry<V>>,
    order: VecDeque<(Arc<str>, u64)>,
    cap: usize,
    clock: u64,
}

impl<V> Lru<V> {
    pub(crate) fn new(cap: usize) -> Lru<V> {
        Lru {
            map: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
            clock: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The value for `key`, created by `make` if absent; either way it becomes the most
    /// recently used.
    pub(crate) fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(key) {
            self.make_room();
        }
        self.sweep();
        self.clock += 1;
        let stamp = self.clock;
        let entry = match self.map.entry_ref(key) {
            EntryRef::Occupied(o) => o,
            EntryRef::Vacant(v) => v.insert_entry_with_key(
                Arc::from(key),
                Entry {
                    value: make(),
                    used: stamp,
                },
            ),
        };
        self.order.push_back((entry.key().clone(), stamp));
        let entry = entry.into_mut();
        entry.used = stamp;
        &mut entry.value
    }

    /// Evicts until one more key fits.
    fn make_room(&mut self) {
        while self.map.len() >= self.cap {
            let Some((key, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&key).is_some_and(|e| e.used == stamp) {
                self.map.remove(&key);
            }
        }
    }

    fn sweep(&mut self) {
        if self.order.len() > 2 * self.cap + 16 {
            let map = &self.map;
            self.order
                .retain(|(k, stamp)| map.get(k).is_some_and(|e| e.used == *stamp));
        }
    }
}

/// Nanoseconds since the gateway started, for the local buckets.
#[derive(Clone, Copy)]
pub(crate) struct Origin(Instant);

impl Origin {
    pub(crate) fn new() -> Origin {
        Origin(Instant::now())
    }

    pub(crate) fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A token bucket's parameters in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalRule {
    pub(crate) capacity: u64,
    emission_ns: u64,
}

impl LocalRule {
    /// This gateway's share of `limit` when `gateways` share it: rate and capacity divided by
    /// the number of gateways, rounded up, never below one unit.
    pub(crate) fn share(limit: &Limit, gateways: u64) -> LocalRule {
        let gateways = gateways.max(1);
        let per_period = limit.limit().div_ceil(gateways).max(1);
        let capacity = limit.capacity().div_ceil(gateways).max(1);
        let period = u64::try_from(limit.period().as_nanos()).unwrap_or(u64::MAX);
        LocalRule {
            capacity,
            emission_ns: (period / per_period).max(1),
        }
    }

    fn tau(&self) -> u64 {
        self.emission_ns.saturating_mul(self.capacity)
    }
}

/// One local bucket: the theoretical arrival time of the next unit, as in bucketd's GCRA.
#[derive(Default)]
pub(crate) struct Bucket {
    tat: u64,
}

/// What a local bucket says about one unit.
pub(crate) struct LocalDecision {
    pub(crate) allowed: bool,
    pub(crate) figures: Figures,
    pub(crate) retry_after: Duration,
    new_tat: u64,
}

impl Bucket {
    fn check(&self, rule: &LocalRule, now: u64) -> LocalDecision {
        let tau = rule.tau();
        let start = self.tat.max(now);
        let new_tat = start.saturating_add(rule.emission_ns);
        let debt = new_tat - now;
        if debt > tau {
            let held = start - now;
            LocalDecision {
                allowed: false,
                figures: Figures {
                    limit: rule.capacity,
                    remaining: tau.saturating_sub(held) / rule.emission_ns,
                    reset: Duration::from_nanos(held),
                },
                retry_after: Duration::from_nanos(debt - tau),
                new_tat: self.tat,
            }
        } else {
            LocalDecision {
                allowed: true,
                figures: Figures {
                    limit: rule.capacity,
                    remaining: (tau - debt) / rule.emission_ns,
                    reset: Duration::from_nanos(debt),
                },
                retry_after: Duration::ZERO,
                new_tat,
            }
        }
    }
}

/// The in-process buckets that stand in for bucketd while it cannot answer.
pub(crate) struct Fallback {
    buckets: Mutex<Lru<Bucket>>,
    origin: Origin,
}

impl Fallback {
    pub(crate) fn new(cap: usize) -> Fallback {
        Fallback {
            buckets: Mutex::new(Lru::new(cap)),
            origin: Origin::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.buckets).len()
    }

    /// Takes one unit from every `(key, rule)` bucket, or from none if any is empty. Returns
    /// the deciding figures (least remaining when allowed, longest wait when refused).
    pub(crate) fn check_all(&self, limits: &[(&str, LocalRule)]) -> (bool, Figures, Duration) {
        let now = self.origin.now_ns();
        let mut buckets = lock(&self.buckets);
        let decisions: Vec<LocalDecision> = limits
            .iter()
            .map(|(key, rule)| {
                buckets
                    .get_or_insert_with(key, Bucket::default)
                    .check(rule, now)
            })
            .collect();
        let allowed = decisions.iter().all(|d| d.allowed);
        if allowed {
            for ((key, _), d) in limits.iter().zip(&decisions) {
                buckets.get_or_insert_with(key, Bucket::default).tat = d.new_tat;
            }
        }
        let deciding = if allowed {
            decisions.iter().min_by_key(|d| d.figures.remaining)
        } else {
            decisions
                .iter()
                .filter(|d| !d.allowed)
                .max_by_key(|d| d.retry_after)
        };
        match deciding {
            Some(d) => (allowed, d.figures, d.retry_after),
            None => (true, Figures::default(), Duration::ZERO),
        }
    }
}

/// Unspent tokens leased from bucketd for one key.
#[derive(Default)]
struct Pool {
    tokens: u64,
    leased_at: Option<Instant>,
    /// bucketd's figures when the tokens were leased.
    limit: u64,
    remaining: u64,
    reset_after: Duration,
}

/// One key's pool, plus a lock so that only one refill per key is in flight.
#[derive(Default)]
pub(crate) struct LeaseSlot {
    pool: Mutex<Pool>,
    pub(crate) refill: tokio::sync::Mutex<()>,
}

impl LeaseSlot {
    /// Spends one leased token if one is left and not older than `max_hold`.
    pub(crate) fn take(&self, max_hold: Duration) -> Option<Figures> {
        let mut pool = lock(&self.pool);
        let age = pool.leased_at?.elapsed();
        if age >= max_hold {
            pool.tokens = 0;
            return None;
        }
        if pool.tokens == 0 {
            return None;
        }
        pool.tokens -= 1;
        Some(Figures {
            limit: pool.limit,
            remaining: pool.remaining.saturating_add(pool.tokens),
            reset: pool.reset_after.saturating_sub(age),
        })
    }

    /// Stores a fresh lease of `granted` tokens of which the caller spends one now.
    pub(crate) fn fill(
        &self,
        granted: u64,
        limit: u64,
        remaining: u64,
        reset: Duration,
    ) -> Figures {
        let mut pool = lock(&self.pool);
        *pool = Pool {
            tokens: granted.saturating_sub(1),
            leased_at: Some(Instant::now()),
            limit,
            remaining,
            reset_after: reset,
        };
        Figures {
            limit,
            remaining: remaining.saturating_add(pool.tokens),
            reset,
        }
    }

    /// Returns a token taken for a request that another limit then refused, keeping the pool
    /// at most `batch - 1`.
    pub(crate) fn give_back(&self, batch: u64) {
        let mut pool = lock(&self.pool);
        if pool.leased_at.is_some() && pool.tokens < batch.saturating_sub(1) {
            pool.tokens += 1;
        }
    }

    #[cfg(test)]
    pub(crate) fn tokens(&self) -> u64 {
        lock(&self.pool).tokens
    }
}

/// The lease pools of every leased key, bounded like the fallback buckets (an evicted pool's
/// tokens are dropped: charged by bucketd, never spent).
pub(crate) struct Leases {
    slots: Mutex<Lru<Arc<LeaseSlot>>>,
}

impl Leases {
    pub(crate) fn new(cap: usize) -> Leases {
        Leases {
            slots: Mutex::new(Lru::new(cap)),
        }
    }

    pub(crate) fn slot(&self, key: &str) -> Arc<LeaseSlot> {
        lock(&self.slots)
            .get_or_insert_with(key, || Arc::new(LeaseSlot::default()))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_keeps_the_recently_used() {
        let mut lru: Lru<u32> = Lru::new(3);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            *lru.get_or_insert_with(k, || 0) = i as u32;
        }
        // Touch "a"; inserting "d" evicts "b", the least recently used.
        lru.get_or_insert_with("a", || 99);
        lru.get_or_insert_with("d", || 3);
        assert_eq!(lru.len(), 3);
        assert_eq!(*lru.get_or_insert_with("a", || 99), 0);
        assert_eq!(*lru.get_or_insert_with("b", || 99), 99);
        // Many touches of one key do not grow the queue without bound.
        for _ in 0..1000 {
            lru.get_or_insert_with("a", || 0);
        }
        assert!(lru.order.len() <= 2 * 3 + 16 + 1);
        assert_eq!(lru.len(), 3);
    }

    #[test]
    fn local_share_divides_and_rounds_up() {
        let l = Limit::per_minute(10);
        assert_eq!(LocalRule::share(&l, 1).capacity, 10);
        assert_eq!(LocalRule::share(&l, 2).capacity, 5);
        assert_eq!(LocalRule::share(&l, 3).capacity, 4);
        assert_eq!(LocalRule::share(&l, 100).capacity, 1);
        assert_eq!(LocalRule::share(&l, 0).capacity, 10);
        assert_eq!(
            LocalRule::share(&Limit::per_second(10).burst(40), 4).capacity,
            10
        );
    }

    #[test]
    fn bucket_admits_its_capacity_then_refills() {
        let rule = LocalRule::share(&Limit::per_second(4), 2); // 2 per second
        let mut b = Bucket::default();
        let now = 1_000_000_000;
        for left in [1, 0] {
            let d = b.check(&rule, now);
            assert!(d.allowed);
            assert_eq!(d.figures.remaining, left);
            b.tat = d.new_tat;
        }
        let d = b.check(&rule, now);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(500));
        assert!(b.check(&rule, now + 500_000_000).allowed);
    }

    #[test]
    fn fallback_is_all_or_nothing() {
        let f = Fallback::new(10);
        let wide = LocalRule::share(&Limit::per_minute(100), 1);
        let narrow = LocalRule::share(&Limit::per_minute(1), 1);
        assert!(f.check_all(&[("w", wide), ("n", narrow)]).0);
        let (allowed, figures, retry) = f.check_all(&[("w", wide), ("n", narrow)]);
        assert!(!allowed);
        assert_eq!(figures.limit, 1);
        assert!(retry > Duration::from_secs(59));
        // The refused request took nothing from the wide bucket: 98 left after one more.
        let (_, figures, _) = f.check_all(&[("w", wide)]);
        assert_eq!(figures.remaining, 98);
    }

    #[test]
    fn lease_pool_spends_and_caps() {
        let slot = LeaseSlot::default();
        assert!(slot.take(Duration::from_secs(60)).is_none());
        let f = slot.fill(5, 10, 5, Duration::from_secs(30));
        assert_eq!((f.limit, f.remaining), (10, 9));
        assert_eq!(slot.tokens(), 4);
        let f = slot.take(Duration::from_secs(60)).unwrap();
        assert_eq!(f.remaining, 8);
        slot.give_back(5);
        assert_eq!(slot.tokens(), 4);
        // Never more than batch - 1 held.
        slot.give_back(5);
        assert_eq!(slot.tokens(), 4);
        // Tokens older than the hold time are dropped.
        assert!(slot.take(Duration::ZERO).is_none());
        assert_eq!(slot.tokens(), 0);
    }
}
