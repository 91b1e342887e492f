//! What every clone of the layer and every request shares: the client, the rules, the
//! failure policy and the local state (fallback buckets, lease pools, in-flight counts).

use super::config::{FailurePolicy, KeyFn, Rule, Scope};
use super::identity::Identify;
use super::in_flight::{InFlightOptions, LocalInFlight, Slot, SlotGuard};
use super::local::{Fallback, Leases};
use super::metrics::Metrics;
use super::verdict::ceil_secs;
use crate::client::{Client, Error};
use http::StatusCode;
use http::request::Parts;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

    /// Counts a decision made without bucketd, because of `e`.
    pub(super) fn note_degraded(&self, e: &Error) {
        self.metrics.degraded.fetch_add(1, Ordering::Relaxed);
        if e.is_timeout() {
            self.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(policy = ?self.policy, "rate limit decided without bucketd: {e}");
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

    /// The bucketd key of a caller's concurrency limit. The caller is the hash tag, so it
    /// shares a slot with the caller's rate limits.
    fn in_flight_key(&self, caller: &str) -> String {
        format!("{}:{{{caller}}}:inflight", self.prefix)
    }

    /// Takes one of the caller's slots (no caller: the request is exempt).
    pub(super) async fn take_slot(&self, caller: Option<&str>) -> Slot {
        let (Some(opts), Some(caller)) = (self.in_flight, caller) else {
            return Slot::Free;
        };
        let key = self.in_flight_key(caller);
        match self.client.acquire(&key, opts.limit, opts.ttl).await {
            Ok(a) => match a.permit {
                Some(permit) => Slot::Held(SlotGuard::remote(
                    permit,
                    self.client.clone(),
                    self.metrics.clone(),
                )),
                // A slot frees as soon as one of the caller's requests completes, usually
                // long before the holders' ttls (bucketd's wait) run out.
                None => Slot::Refused {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    retry_after: Duration::from_secs(1),
                },
            },
            Err(e) => {
                self.note_degraded(&e);
                let status = match self.policy {
                    FailurePolicy::Open => {
                        let share = opts.limit.div_ceil(self.gateways).max(1);
                        if let Some(held) = self.local_in_flight.hold(
                            &key,
                            share,
                            self.client.clone(),
                            self.metrics.clone(),
                        ) {
                            return Slot::Held(held);
                        }
                        StatusCode::TOO_MANY_REQUESTS
                    }
                    FailurePolicy::Closed => StatusCode::SERVICE_UNAVAILABLE,
                    FailurePolicy::ClosedTooManyRequests => StatusCode::TOO_MANY_REQUESTS,
                };
                Slot::Refused {
                    status,
                    retry_after: Duration::from_secs(1),
                }
            }
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
