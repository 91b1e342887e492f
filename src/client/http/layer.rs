//! The layer and its builder: the builder gathers the rules and options into the state every
//! clone of the layer shares (`Shared`); the layer wraps services in `RateLimit`.

use super::config::{FailurePolicy, KeyFn, Rule};
use super::identity::Identify;
use super::in_flight::{InFlightOptions, LocalInFlight};
use super::local::{Fallback, Leases};
use super::metrics::Metrics;
use super::service::RateLimit;
use super::shared::Shared;
use crate::client::Client;
use http::Request;
use http::header::HeaderName;
use http::request::Parts;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tower::Layer;

/// The layer; cheap to clone, and clones share their state and metrics.
#[derive(Clone)]
pub struct RateLimitLayer {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.rules)
            .field("policy", &self.shared.policy)
            .field("gateways", &self.shared.gateways)
            .finish()
    }
}

impl RateLimitLayer {
    pub fn builder(client: Client) -> RateLimitBuilder {
        RateLimitBuilder::new(client)
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Keys currently held by the fallback buckets.
    pub fn fallback_keys(&self) -> usize {
        self.shared.fallback.len()
    }

    /// The bucketd keys a request would be checked against, with their rules' names.
    pub fn keys_for<B>(&self, req: &Request<B>) -> Vec<(String, String)> {
        let mut parts = Request::new(()).into_parts().0;
        parts.method = req.method().clone();
        parts.uri = req.uri().clone();
        parts.headers = req.headers().clone();
        parts.extensions = req.extensions().clone();
        self.shared
            .applicable(&parts)
            .rules
            .into_iter()
            .map(|(rule, key)| (rule.name.clone(), key))
            .collect()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, self.shared.clone())
    }
}

/// Builds a [`RateLimitLayer`].
pub struct RateLimitBuilder {
    client: Client,
    rules: Vec<Rule>,
    in_flight: Option<InFlightOptions>,
    key_fn: Option<KeyFn>,
    identify: Identify,
    prefix: String,
    policy: FailurePolicy,
    gateways: u64,
    fallback_capacity: usize,
    jitter: Duration,
}

impl RateLimitBuilder {
    /// The defaults: no rules, no in-flight limit, the default caller key, prefix `rl`, an
    /// open failure policy, one gateway, 10 000 fallback keys and 1 s of jitter.
    pub(super) fn new(client: Client) -> RateLimitBuilder {
        RateLimitBuilder {
            client,
            rules: Vec::new(),
            in_flight: None,
            key_fn: None,
            identify: Identify {
                api_key_header: HeaderName::from_static("x-api-key"),
                trusted_proxies: 0,
            },
            prefix: "rl".into(),
            policy: FailurePolicy::Open,
            gateways: 1,
            fallback_capacity: 10_000,
            jitter: Duration::from_secs(1),
        }
    }

    /// Adds a rule; a request is checked against every rule that applies to it.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Caps each caller's requests in flight at `limit` (bucketd takes at most 100 000; 0
    /// turns the cap off), across every gateway sharing the bucketd key
    /// `PREFIX:{CALLER}:inflight`. A request takes a slot after passing the rules and before
    /// the inner service sees it, and gives it back once the service has produced its
    /// response (the body may still be streaming), or as soon as the request is dropped. A
    /// slot a gateway never gives back (it crashed) frees itself after `ttl`: make `ttl`
    /// longer than any request takes, or a slow request's slot is freed under it.
    ///
    /// A caller with every slot held gets `429 Too Many Requests` and `Retry-After: 1`
    /// (plus jitter). It was refused for its concurrency, not its rate, so the request has
    /// still been counted by the rules.
    pub fn in_flight(mut self, limit: u64, ttl: Duration) -> Self {
        self.in_flight = (limit > 0).then_some(InFlightOptions {
            limit: limit.min(100_000),
            ttl,
        });
        self
    }

    /// Replaces the default caller identification: the function returns the caller's key,
    /// or `None` to let the request through without any check.
    ///
    /// The default uses, in order: the API key header (a digest of it, never the key itself),
    /// the [`AuthenticatedUser`] extension, the client IP, and `anonymous` when none is known.
    pub fn key_fn(mut self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.key_fn = Some(Arc::new(f));
        self
    }

    /// The header holding an API key, for the default key (default `x-api-key`).
    pub fn api_key_header(mut self, name: HeaderName) -> Self {
        self.identify.api_key_header = name;
        self
    }

    /// How many proxies in front of this service append to `X-Forwarded-For` and are trusted
    /// (default 0: the header is ignored and the IP is the connection's peer, from axum's
    /// `ConnectInfo<SocketAddr>` or a `SocketAddr` extension). With `n`, the default key takes
    /// the n-th address from the right.
    pub fn trusted_proxies(mut self, n: usize) -> Self {
        self.identify.trusted_proxies = n;
        self
    }

    /// The start of every limit key (default `rl`), to share a bucketd with other uses.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How many gateways share the limits (default 1); the fallback buckets get `1/gateways`
    /// of each limit.
    pub fn gateways(mut self, n: u64) -> Self {
        self.gateways = n.max(1);
        self
    }

    /// Most keys kept by the fallback buckets, and separately by the lease pools and the
    /// fallback in-flight counts (default 10 000 each); the least recently used are evicted.
    pub fn fallback_capacity(mut self, keys: usize) -> Self {
        self.fallback_capacity = keys.max(1);
        self
    }

    /// Upper bound of the random delay added to `Retry-After` (default 1 s; zero for none).
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    pub fn build(self) -> RateLimitLayer {
        RateLimitLayer {
            shared: Arc::new(Shared {
                fallback: Fallback::new(self.fallback_capacity),
                leases: Leases::new(self.fallback_capacity),
                local_in_flight: LocalInFlight::new(self.fallback_capacity),
                client: self.client,
                rules: self.rules,
                in_flight: self.in_flight,
                key_fn: self.key_fn,
                identify: self.identify,
                prefix: self.prefix,
                policy: self.policy,
                gateways: self.gateways,
                jitter: self.jitter,
                metrics: Arc::new(Metrics::default()),
                random: RandomState::new(),
                draws: AtomicU64::new(0),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Limit;

    #[test]
    fn in_flight_options() {
        let client = || Client::new("redis://127.0.0.1:1").unwrap();
        let b = RateLimitBuilder::new(client()).in_flight(8, Duration::from_secs(30));
        assert_eq!(
            b.in_flight,
            Some(InFlightOptions {
                limit: 8,
                ttl: Duration::from_secs(30)
            })
        );
        let b = b.in_flight(0, Duration::from_secs(30));
        assert_eq!(b.in_flight, None);
        let b = RateLimitBuilder::new(client()).in_flight(u64::MAX, Duration::from_secs(1));
        assert_eq!(b.in_flight.map(|o| o.limit), Some(100_000));
    }

    #[test]
    fn lease_options() {
        let r = Rule::new("a", Limit::per_second(100)).lease(10);
        assert_eq!(r.lease.map(|l| l.batch), Some(10));
        let r = r.lease_max_hold(Duration::from_secs(5)).lease(20);
        assert_eq!(r.lease.map(|l| l.max_hold), Some(Duration::from_secs(5)));
        assert!(
            Rule::new("a", Limit::per_second(1))
                .lease(1)
                .lease
                .is_none()
        );
    }
}
