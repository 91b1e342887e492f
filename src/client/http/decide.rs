//! The decision engine: which rules apply to a request and their limit keys, one round trip to
//! bucketd (leased limits first), and the mapping of its answer, or of its failure under the
//! `FailurePolicy`, to a verdict with the figures for the rate-limit headers and `Retry-After`.

use super::config::{FailurePolicy, KeyFn, LeaseOptions, Rule, Scope};
use super::identity::Identify;
use super::in_flight::{InFlightOptions, LocalInFlight};
use super::local::{self, Fallback, Leases, LocalRule};
use crate::client::{Client, Error, Limit};
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Counters of the layer's decisions.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(super) allowed: AtomicU64,
    pub(super) rejected: AtomicU64,
    degraded: AtomicU64,
    timeouts: AtomicU64,
    leased: AtomicU64,
    lease_refills: AtomicU64,
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

/// The figures that go into the rate-limit headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset: Duration,
}

impl Figures {
    fn from_decision(d: &crate::client::Decision) -> Figures {
        Figures {
            limit: d.limit,
            remaining: d.remaining,
            reset: d.reset_after,
        }
    }

    pub(super) fn write(&self, h: &mut HeaderMap) {
        h.insert(X_RATELIMIT_LIMIT, HeaderValue::from(self.limit));
        h.insert(X_RATELIMIT_REMAINING, HeaderValue::from(self.remaining));
        h.insert(X_RATELIMIT_RESET, HeaderValue::from(ceil_secs(self.reset)));
    }
}

pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub(super) enum Verdict {
    Exempt,
    Allow(Figures),
    Refuse {
        status: StatusCode,
        figures: Figures,
        retry_after: Duration,
    },
}

pub(super) struct Shared {
    pub(super) client: Client,
    pub(super) rules: Vec<Rule>,
    pub(super) in_flight: Option<InFlightOptions>,
    pub(super) local_in_flight: LocalInFlight,
    pub(super) key_fn: Option<KeyFn>,
    pub(super) identify: Identify,
    pub(super) prefix: String,
    pub(super) policy: FailurePolicy,
    pub(super) gateways: u64,
    pub(super) jitter: Duration,
    pub(super) fallback: Fallback,
    pub(super) leases: Leases,
    pub(super) metrics: Arc<Metrics>,
    pub(super) random: RandomState,
    pub(super) draws: AtomicU64,
}

/// A lease token taken for the request, to give back if another limit refuses it.
struct Taken<'a> {
    slot: Arc<local::LeaseSlot>,
    rule: &'a Rule,
}

/// The limits a request is checked against.
pub(super) struct Applicable<'a> {
    /// Who the request is from, as it goes into limit keys; `None` when the request is
    /// exempt, or when no limit needs to know.
    pub(super) caller: Option<String>,
    /// The rules that apply, with their limit keys.
    pub(super) rules: Vec<(&'a Rule, String)>,
}

impl Shared {
    /// The caller and the rules that apply to a request, with their limit keys. The caller is
    /// only worked out (the key function called) when a rule applies or an in-flight limit is
    /// set.
    pub(super) fn applicable(&self, parts: &Parts) -> Applicable<'_> {
        let none = Applicable {
            caller: None,
            rules: Vec::new(),
        };
        let rules: Vec<&Rule> = self.rules.iter().filter(|r| r.applies(parts)).collect();
        if rules.is_empty() && self.in_flight.is_none() {
            return none;
        }
        let caller = match &self.key_fn {
            Some(f) => match f(parts) {
                Some(k) => k,
                None => return none,
            },
            None => self.identify.key(parts),
        };
        // The caller is the hash tag, so a caller's keys share a slot: one shard on a single
        // node, one node in a cluster.
        let caller = escape_braces(&caller).into_owned();
        let route = || {
            let path = parts
                .extensions
                .get::<axum::extract::MatchedPath>()
                .map_or_else(|| parts.uri.path(), |m| m.as_str());
            format!("{} {}", parts.method, path)
        };
        let rules = rules
            .into_iter()
            .map(|r| {
                let key = match r.scope {
                    Scope::Client => format!("{}:{}:{{{caller}}}", self.prefix, r.name),
                    Scope::ClientRoute => {
                        format!("{}:{}:{{{caller}}}:{}", self.prefix, r.name, route())
                    }
                    Scope::Route => format!("{}:{}:{}", self.prefix, r.name, route()),
                    Scope::Global => format!("{}:{}", self.prefix, r.name),
                };
                (r, key)
            })
            .collect();
        Applicable {
            caller: Some(caller),
            rules,
        }
    }

    /// The rate limits' verdict on a request, given the rules that apply to it.
    pub(super) async fn decide(&self, limits: &[(&Rule, String)]) -> Verdict {
        if limits.is_empty() {
            return Verdict::Exempt;
        }
        let deadline = self.client.deadline();
        match tokio::time::timeout(deadline, self.ask_bucketd(limits)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => self.degraded(limits, &e),
            Err(_) => self.degraded(limits, &Error::Timeout(deadline)),
        }
    }

    async fn ask_bucketd(&self, limits: &[(&Rule, String)]) -> Result<Verdict, Error> {
        let mut taken: Vec<Taken<'_>> = Vec::new();
        let mut deciding: Option<Figures> = None;
        let mut direct: Vec<(&str, Limit)> = Vec::new();
        // Leased limits first: a refusal there costs the others nothing.
        for (rule, key) in limits {
            let Some(lease) = rule.lease else {
                direct.push((key.as_str(), rule.limit));
                continue;
            };
            match self.take_leased(rule, lease, key).await {
                Ok(Ok((slot, figures))) => {
                    taken.push(Taken { slot, rule });
                    if deciding.is_none_or(|d| figures.remaining < d.remaining) {
                        deciding = Some(figures);
                    }
                }
                Ok(Err((figures, retry_after))) => {
                    give_back(&taken);
                    return Ok(Verdict::Refuse {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        figures,
                        retry_after,
                    });
                }
                Err(e) => {
                    give_back(&taken);
                    return Err(e);
                }
            }
        }
        if !direct.is_empty() {
            let md = match self.client.check_all(&direct, 1).await {
                Ok(md) => md,
                Err(e) => {
                    give_back(&taken);
                    return Err(e);
                }
            };
            let summary = Figures::from_decision(&md.summary);
            if !md.summary.allowed {
                give_back(&taken);
                return Ok(Verdict::Refuse {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    figures: summary,
                    retry_after: md.summary.retry_after.unwrap_or(md.summary.reset_after),
                });
            }
            if deciding.is_none_or(|d| summary.remaining < d.remaining) {
                deciding = Some(summary);
            }
        }
        Ok(Verdict::Allow(deciding.unwrap_or_default()))
    }

    /// One token of a leased limit: from the local pool, or from a fresh lease. The inner
    /// error is a refusal, with its figures and wait.
    #[allow(clippy::type_complexity)]
    async fn take_leased(
        &self,
        rule: &Rule,
        lease: LeaseOptions,
        key: &str,
    ) -> Result<Result<(Arc<local::LeaseSlot>, Figures), (Figures, Duration)>, Error> {
        let slot = self.leases.slot(key);
        if let Some(f) = slot.take(lease.max_hold) {
            self.metrics.leased.fetch_add(1, Ordering::Relaxed);
            return Ok(Ok((slot, f)));
        }
        // One refill per key at a time; whoever waited may find the pool filled.
        let refilling = slot.refill.lock().await;
        if let Some(f) = slot.take(lease.max_hold) {
            drop(refilling);
            self.metrics.leased.fetch_add(1, Ordering::Relaxed);
            return Ok(Ok((slot, f)));
        }
        self.metrics.lease_refills.fetch_add(1, Ordering::Relaxed);
        let l = self.client.lease(key, &rule.limit, lease.batch).await?;
        if l.granted == 0 {
            let figures = Figures {
                limit: l.limit,
                remaining: l.remaining,
                reset: l.reset_after,
            };
            drop(refilling);
            return Ok(Err((figures, l.retry_after.unwrap_or(l.reset_after))));
        }
        let f = slot.fill(l.granted, l.limit, l.remaining, l.reset_after);
        drop(refilling);
        Ok(Ok((slot, f)))
    }

    /// Counts a decision made without bucketd, because of `e`.
    pub(super) fn note_degraded(&self, e: &Error) {
        self.metrics.degraded.fetch_add(1, Ordering::Relaxed);
        if e.is_timeout() {
            self.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(policy = ?self.policy, "rate limit decided without bucketd: {e}");
    }

    fn degraded(&self, limits: &[(&Rule, String)], e: &Error) -> Verdict {
        self.note_degraded(e);
        let status = match self.policy {
            FailurePolicy::Open => {
                let local: Vec<(&str, LocalRule)> = limits
                    .iter()
                    .map(|(r, k)| (k.as_str(), LocalRule::share(&r.limit, self.gateways)))
                    .collect();
                let (allowed, figures, retry_after) = self.fallback.check_all(&local);
                return if allowed {
                    Verdict::Allow(figures)
                } else {
                    Verdict::Refuse {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        figures,
                        retry_after,
                    }
                };
            }
            FailurePolicy::Closed => StatusCode::SERVICE_UNAVAILABLE,
            FailurePolicy::ClosedTooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        };
        let limit = limits
            .iter()
            .map(|(r, _)| r.limit.capacity())
            .min()
            .unwrap_or(0);
        Verdict::Refuse {
            status,
            figures: Figures {
                limit,
                remaining: 0,
                reset: Duration::from_secs(1),
            },
            retry_after: Duration::from_secs(1),
        }
    }

    /// `Retry-After` in whole seconds: the wait plus a uniform random jitter in
    /// `[0, jitter]` (millisecond steps), rounded up.
    pub(super) fn retry_after_secs(&self, wait: Duration) -> u64 {
        let jitter_ms = u64::try_from(self.jitter.as_millis()).unwrap_or(u64::MAX);
        let extra = if jitter_ms == 0 {
            0
        } else {
            let draw = self.draws.fetch_add(1, Ordering::Relaxed);
            self.random.hash_one(draw) % jitter_ms.saturating_add(1)
        };
        ceil_secs(wait.saturating_add(Duration::from_millis(extra)))
    }
}

fn give_back(taken: &[Taken<'_>]) {
    for t in taken {
        if let Some(l) = t.rule.lease {
            t.slot.give_back(l.batch);
        }
    }
}

/// Braces would end the hash tag early; percent-encode them (and `%`, to stay unambiguous).
fn escape_braces(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['{', '}', '%']) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::http::RateLimitLayer;
    use crate::client::http::tests::layer;

    #[test]
    fn retry_after_rounds_up_and_jitters_within_bounds() {
        let l = layer(vec![]);
        let s = &l.shared;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let secs = s.retry_after_secs(Duration::from_millis(1500));
            assert!((2..=3).contains(&secs), "{secs}");
            seen.insert(secs);
        }
        assert_eq!(seen.len(), 2);
        let client = Client::new("redis://127.0.0.1:1").unwrap();
        let none = RateLimitLayer::builder(client)
            .retry_jitter(Duration::ZERO)
            .build();
        assert_eq!(none.shared.retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(none.shared.retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
