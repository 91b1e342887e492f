//! What a shard counts for the metrics endpoint beyond its INFO figures: limit decisions by
//! command and by named rule, and how long the checks of its connections took.
//!
//! Only the shard's own thread writes these, with relaxed atomics on the shard's own cache
//! lines (or, for rules, a lock taken once per round and only by rounds that used a named
//! rule); a scrape reads them from another thread and adds the shards up.

use crate::cmd::{CheckKind, ExecStats};
use crate::sync::lock;
use ahash::AHashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the check latency histogram's buckets, in microseconds (the last bucket,
/// `+Inf`, is implied). From well under a loopback round trip to a slow failover.
pub(crate) const LATENCY_BOUNDS_US: [u64; 14] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Most distinct rule names one shard keeps counts for: rule names come from the operator's
/// rules, but rules can be added and removed at run time, and the counts must stay bounded.
const MAX_RULES_COUNTED: usize = 4096;

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Latency {
    /// Records `n` observations that each took `ns`.
    pub(crate) fn observe(&self, ns: u64, n: u64) {
        let i = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| ns <= b * 1_000)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.buckets[i].fetch_add(n, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds this histogram's buckets (not cumulative), sum (ns) and count to `into`.
    pub(crate) fn add_to(&self, into: &mut LatencySnapshot) {
        for (t, b) in into.buckets.iter_mut().zip(&self.buckets) {
            *t += b.load(Ordering::Relaxed);
        }
        into.sum_ns += self.sum_ns.load(Ordering::Relaxed);
        into.count += self.count.load(Ordering::Relaxed);
    }
}

/// The shards' histograms added up.
#[derive(Debug, Default, Clone)]
pub(crate) struct LatencySnapshot {
    pub(crate) buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    pub(crate) sum_ns: u64,
    pub(crate) count: u64,
}

/// How one check that named a rule was decided, as the metrics by rule count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Within = 0,
    Over = 1,
    /// Over the limit, answered as allowed because the rule is in shadow mode.
    Shadowed = 2,
}

/// A shard's metrics.
#[derive(Debug, Default)]
pub(crate) struct ShardMetrics {
    /// Limit decisions answered by this shard, by `CheckKind`: `[allowed, denied]`. Only the
    /// replica that answers the client counts one: followers applying a log entry do not.
    pub(crate) decided: [[AtomicU64; 2]; 4],
    /// Time from a round's requests being read to its replies being written, once per check.
    pub(crate) check_latency: Latency,
    /// Decisions by rule name (checks that named a rule), by `Verdict`.
    rules: Mutex<AHashMap<Box<str>, [u64; 3]>>,
}

impl ShardMetrics {
    /// Adds a batch's decisions.
    pub(crate) fn count(&self, st: &ExecStats) {
        for (into, from) in self.decided.iter().zip(&st.decided) {
            for (a, &n) in into.iter().zip(from) {
                if n > 0 {
                    a.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
    }

    /// Adds decisions of one kind counted outside a batch.
    pub(crate) fn count_kind(&self, kind: CheckKind, allowed: u64, denied: u64) {
        let [a, d] = &self.decided[kind as usize];
        if allowed > 0 {
            a.fetch_add(allowed, Ordering::Relaxed);
        }
        if denied > 0 {
            d.fetch_add(denied, Ordering::Relaxed);
        }
    }

    /// Adds decisions by rule name.
    pub(crate) fn count_rules<'a>(&self, decisions: impl Iterator<Item = (&'a [u8], Verdict)>) {
        let mut map = lock(&self.rules);
        for (name, verdict) in decisions {
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            let i = verdict as usize;
            if let Some(c) = map.get_mut(name) {
                c[i] += 1;
            } else if map.len() < MAX_RULES_COUNTED {
                let mut c = [0; 3];
                c[i] = 1;
                map.insert(name.into(), c);
            }
        }
    }

    /// Decisions by rule name, for the rules `keep` accepts (the ones that still exist).
    pub(crate) fn rules(&self, mut keep: impl FnMut(&str) -> bool) -> Vec<(String, [u64; 3])> {
        let mut map = lock(&self.rules);
        map.retain(|k, _| keep(k));
        map.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let l = Latency::default();
        l.observe(10_000, 2); // 10 us
        l.observe(25_000, 1); // exactly 25 us: le="25"
        l.observe(26_000, 1);
        l.observe(5_000_000_000, 3); // 5 s: +Inf
        let mut s = LatencySnapshot::default();
        l.add_to(&mut s);
        assert_eq!(s.buckets[0], 3);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[LATENCY_BOUNDS_US.len()], 3);
        assert_eq!(s.count, 7);
        assert_eq!(s.sum_ns, 20_000 + 25_000 + 26_000 + 15_000_000_000);
    }

    #[test]
    fn rule_counts_stay_bounded_and_forget_removed_rules() {
        let m = ShardMetrics::default();
        let names: Vec<String> = (0..MAX_RULES_COUNTED + 10)
            .map(|i| format!("r{i}"))
            .collect();
        m.count_rules(names.iter().map(|n| (n.as_bytes(), Verdict::Within)));
        m.count_rules([(b"r0".as_slice(), Verdict::Over)].into_iter());
        let all = m.rules(|_| true);
        assert_eq!(all.len(), MAX_RULES_COUNTED);
        let r0 = all.iter().find(|(n, _)| n == "r0").map(|(_, c)| *c);
        assert_eq!(r0, Some([1, 1, 0]));
        assert_eq!(m.rules(|n| n == "r1").len(), 1);
        assert_eq!(m.rules(|_| true).len(), 1);
    }
}
