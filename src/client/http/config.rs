//! The layer's configuration: the rules a request is checked against (`Rule`, `Scope`), what to
//! do when bucketd fails (`FailurePolicy`), and the builder that gathers them into a
//! [`RateLimitLayer`].

use super::RateLimitLayer;
use super::decide::{Metrics, Shared};
use super::identity::Identify;
use super::in_flight::{InFlightOptions, LocalInFlight};
use super::local::{Fallback, Leases};
use crate::client::{Client, Limit};
use http::header::HeaderName;
use http::request::Parts;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub(super) type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
type Filter = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// What a rule's limit key is made of, besides the rule's name.
///
/// Keys are `PREFIX:RULE:{CALLER}` (`Client`), `PREFIX:RULE:{CALLER}:METHOD ROUTE`
/// (`ClientRoute`), `PREFIX:RULE:METHOD ROUTE` (`Route`) and `PREFIX:RULE` (`Global`). The
/// caller is the hash tag, so a caller's keys live in one slot: on a bucketd cluster, the
/// non-leased rules of one request should be `Client`/`ClientRoute` ones, or a single
/// `Route`/`Global` rule, since one `BK.CHECKALL` cannot span slots there. The route is axum's
/// matched path (`/items/{id}`) when the layer runs inside a `Router`, else the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scope {
    /// One limit per caller (the key function's result), across routes.
    #[default]
    Client,
    /// One limit per caller and route (method and matched path).
    ClientRoute,
    /// One limit per route, shared by every caller.
    Route,
    /// One limit shared by every request the rule applies to.
    Global,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct LeaseOptions {
    pub(super) batch: u64,
    pub(super) max_hold: Duration,
}

/// One limit a request must fit in. Several rules are checked together, all or nothing, in
/// one round trip.
#[derive(Clone)]
pub struct Rule {
    pub(super) name: String,
    pub(super) limit: Limit,
    pub(super) scope: Scope,
    filter: Option<Filter>,
    pub(super) lease: Option<LeaseOptions>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("limit", &self.limit.to_string())
            .field("scope", &self.scope)
            .field("filtered", &self.filter.is_some())
            .field("lease", &self.lease)
            .finish()
    }
}

impl Rule {
    /// A rule per caller ([`Scope::Client`]) applying to every request. The name goes into
    /// the limit key, so two rules need two names.
    pub fn new(name: impl Into<String>, limit: Limit) -> Rule {
        Rule {
            name: name.into(),
            limit,
            scope: Scope::Client,
            filter: None,
            lease: None,
        }
    }

    pub fn scope(mut self, scope: Scope) -> Rule {
        self.scope = scope;
        self
    }

    /// Applies the rule only to requests for which `f` is true.
    pub fn when(mut self, f: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Rule {
        self.filter = Some(Arc::new(f));
        self
    }

    /// Applies the rule only to paths starting with `prefix`.
    pub fn path_prefix(self, prefix: impl Into<String>) -> Rule {
        let prefix = prefix.into();
        self.when(move |p| p.uri.path().starts_with(&prefix))
    }

    /// Takes tokens from bucketd `batch` at a time and spends them locally (see the module
    /// documentation for the over-admission this allows). A batch of 0 or 1 turns leasing off.
    pub fn lease(mut self, batch: u64) -> Rule {
        self.lease = (batch > 1).then_some(LeaseOptions {
            batch,
            max_hold: self.lease.map_or(Duration::from_secs(1), |l| l.max_hold),
        });
        self
    }

    /// How long leased tokens stay usable (default 1 s); older ones are dropped unspent.
    pub fn lease_max_hold(mut self, max_hold: Duration) -> Rule {
        if let Some(l) = &mut self.lease {
            l.max_hold = max_hold;
        }
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    pub(super) fn applies(&self, parts: &Parts) -> bool {
        self.filter.as_ref().is_none_or(|f| f(parts))
    }
}

/// What the layer does when bucketd times out, cannot be reached, or answers with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Decide locally with this gateway's share of each limit (the default).
    #[default]
    Open,
    /// Refuse with `503 Service Unavailable`.
    Closed,
    /// Refuse with `429 Too Many Requests`.
    ClosedTooManyRequests,
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
