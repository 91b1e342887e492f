//! Rate limiting for HTTP services: a [`tower::Layer`] that checks every request against
//! bucketd before it reaches the service. It works with axum and hyper (http 1.x types).
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! use bucketd::client::http::{FailurePolicy, RateLimitLayer, Rule, Scope};
//! use bucketd::client::{Client, Limit};
//! use std::time::Duration;
//!
//! # fn demo() -> Result<(), bucketd::client::Error> {
//! let client = Client::builder(["redis://127.0.0.1:6379"])
//!     .deadline(Duration::from_millis(5))
//!     .build()?;
//! let limiter = RateLimitLayer::builder(client)
//!     // 100 requests a minute per caller, for every route...
//!     .rule(Rule::new("caller", Limit::per_minute(100)))
//!     // ...and, on /search, 5 a second per caller and route: one round trip checks both.
//!     .rule(
//!         Rule::new("search", Limit::per_second(5))
//!             .scope(Scope::ClientRoute)
//!             .path_prefix("/search"),
//!     )
//!     .failure_policy(FailurePolicy::Open)
//!     .gateways(4)
//!     .build();
//! let metrics = limiter.metrics();
//! let app: Router = Router::new()
//!     .route("/search", get(|| async { "results" }))
//!     .layer(limiter);
//! # let _ = (app, metrics);
//! # Ok(())
//! # }
//! ```
//!
//! # What a response carries
//!
//! Every response to a limited request (allowed or not) has `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds until the limit is full again,
//! rounded up), describing the deciding limit: the one with the least remaining when allowed,
//! the refusing one with the longest wait when refused. A refusal is `429 Too Many Requests`
//! with an empty body and `Retry-After` in whole seconds: the wait bucketd reported plus a
//! random jitter of up to [`RateLimitBuilder::retry_jitter`] (1 s by default), rounded up, so
//! refused clients do not all return in the same second.
//!
//! Requests no rule applies to, and requests a custom key function exempts, pass untouched
//! and carry no headers.
//!
//! # When bucketd fails
//!
//! Each decision gets one client deadline (see [`crate::client::ClientBuilder::deadline`]),
//! covering every bucketd call it makes. A timeout, connection failure or server error is
//! handled by the [`FailurePolicy`], and counted in [`Metrics::degraded`]:
//!
//! - [`FailurePolicy::Open`] (the default): the request is decided by an in-process token
//!   bucket per limit key with this gateway's share of the limit (limit and burst divided by
//!   [`RateLimitBuilder::gateways`], rounded up). At most
//!   [`RateLimitBuilder::fallback_capacity`] keys are kept; the least recently used go first.
//! - [`FailurePolicy::Closed`]: `503 Service Unavailable`;
//!   [`FailurePolicy::ClosedTooManyRequests`]: `429 Too Many Requests`. Both carry
//!   `Retry-After` of 1 s plus jitter, and the rate-limit headers with the smallest limit of
//!   the request's rules, `Remaining: 0`, `Reset: 1`.
//!
//! # Leases
//!
//! A rule marked with [`Rule::lease`] takes `batch` tokens at once from bucketd (`BK.LEASE`)
//! and spends them in process, so a very hot key costs one round trip per batch instead of
//! one per request. The price is precision:
//!
//! - Tokens are charged by bucketd when leased, not when spent. A gateway holds at most
//!   `batch - 1` unspent tokens per key (the request that triggers a lease spends the first),
//!   and drops tokens older than [`Rule::lease_max_hold`]. So over any span of time, the
//!   requests admitted for a key exceed what bucketd charged in that span by at most
//!   `gateways × (batch - 1)`: the tokens leased before the span and spent inside it. For a
//!   fixed window of `L` per period, one window admits at most `L + gateways × (batch - 1)`
//!   requests (tokens leased at the end of the previous window, spent at the start of this one).
//! - The reverse also happens: tokens dropped at the hold time, or left on a gateway that has
//!   no more traffic for the key, were charged and never used, so a key can be refused before
//!   it reached its limit.
//! - `X-RateLimit-Remaining` for a leased rule is bucketd's figure at the lease plus the
//!   tokens still unspent on this gateway.

mod identity;
mod local;

pub use identity::AuthenticatedUser;

use super::{Client, Error, Limit};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use identity::Identify;
use local::{Fallback, Leases, LocalRule};
use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service};

pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
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
struct LeaseOptions {
    batch: u64,
    max_hold: Duration,
}

/// One limit a request must fit in. Several rules are checked together, all or nothing, in
/// one round trip.
#[derive(Clone)]
pub struct Rule {
    name: String,
    limit: Limit,
    scope: Scope,
    filter: Option<Filter>,
    lease: Option<LeaseOptions>,
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

    fn applies(&self, parts: &Parts) -> bool {
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

/// Counters of the layer's decisions.
#[derive(Debug, Default)]
pub struct Metrics {
    allowed: AtomicU64,
    rejected: AtomicU64,
    degraded: AtomicU64,
    timeouts: AtomicU64,
    leased: AtomicU64,
    lease_refills: AtomicU64,
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
}

/// Builds a [`RateLimitLayer`].
pub struct RateLimitBuilder {
    client: Client,
    rules: Vec<Rule>,
    key_fn: Option<KeyFn>,
    identify: Identify,
    prefix: String,
    policy: FailurePolicy,
    gateways: u64,
    fallback_capacity: usize,
    jitter: Duration,
}

impl RateLimitBuilder {
    /// Adds a rule; a request is checked against every rule that applies to it.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
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

    /// Most keys kept by the fallback buckets, and separately by the lease pools (default
    /// 10 000 each); the least recently used are evicted.
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
                client: self.client,
                rules: self.rules,
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

/// The layer; cheap to clone, and clones share their state and metrics.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
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
        RateLimitBuilder {
            client,
            rules: Vec::new(),
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
            .into_iter()
            .map(|(rule, key)| (rule.name.clone(), key))
            .collect()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service the layer wraps around another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the instance polled ready is the one that serves.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let verdict = shared.decide(&parts).await;
            let req = Request::from_parts(parts, body);
            match verdict {
                Verdict::Exempt => inner.call(req).await,
                Verdict::Allow(figures) => {
                    shared.metrics.allowed.fetch_add(1, Ordering::Relaxed);
                    let mut res = inner.call(req).await?;
                    figures.write(res.headers_mut());
                    Ok(res)
                }
                Verdict::Refuse {
                    status,
                    figures,
                    retry_after,
                } => {
                    shared.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                    let mut res = Response::new(ResBody::default());
                    *res.status_mut() = status;
                    figures.write(res.headers_mut());
                    let secs = shared.retry_after_secs(retry_after);
                    res.headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(secs));
                    Ok(res)
                }
            }
        })
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
    fn from_decision(d: &super::Decision) -> Figures {
        Figures {
            limit: d.limit,
            remaining: d.remaining,
            reset: d.reset_after,
        }
    }

    fn write(&self, h: &mut HeaderMap) {
        h.insert(X_RATELIMIT_LIMIT, HeaderValue::from(self.limit));
        h.insert(X_RATELIMIT_REMAINING, HeaderValue::from(self.remaining));
        h.insert(X_RATELIMIT_RESET, HeaderValue::from(ceil_secs(self.reset)));
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

enum Verdict {
    Exempt,
    Allow(Figures),
    Refuse {
        status: StatusCode,
        figures: Figures,
        retry_after: Duration,
    },
}

struct Shared {
    client: Client,
    rules: Vec<Rule>,
    key_fn: Option<KeyFn>,
    identify: Identify,
    prefix: String,
    policy: FailurePolicy,
    gateways: u64,
    jitter: Duration,
    fallback: Fallback,
    leases: Leases,
    metrics: Arc<Metrics>,
    random: RandomState,
    draws: AtomicU64,
}

/// A lease token taken for the request, to give back if another limit refuses it.
struct Taken<'a> {
    slot: Arc<local::LeaseSlot>,
    rule: &'a Rule,
}

impl Shared {
    /// The rules that apply to a request, with their limit keys.
    fn applicable(&self, parts: &Parts) -> Vec<(&Rule, String)> {
        let rules: Vec<&Rule> = self.rules.iter().filter(|r| r.applies(parts)).collect();
        if rules.is_empty() {
            return Vec::new();
        }
        let caller = match &self.key_fn {
            Some(f) => match f(parts) {
                Some(k) => k,
                None => return Vec::new(),
            },
            None => self.identify.key(parts),
        };
        // The caller is the hash tag, so a caller's keys share a slot: one shard on a single
        // node, one node in a cluster.
        let caller = escape_braces(&caller);
        let route = || {
            let path = parts
                .extensions
                .get::<axum::extract::MatchedPath>()
                .map_or_else(|| parts.uri.path(), |m| m.as_str());
            format!("{} {}", parts.method, path)
        };
        rules
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
            .collect()
    }

    async fn decide(&self, parts: &Parts) -> Verdict {
        let limits = self.applicable(parts);
        if limits.is_empty() {
            return Verdict::Exempt;
        }
        let deadline = self.client.deadline();
        match tokio::time::timeout(deadline, self.ask_bucketd(&limits)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => self.degraded(&limits, &e),
            Err(_) => self.degraded(&limits, &Error::Timeout(deadline)),
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

    fn degraded(&self, limits: &[(&Rule, String)], e: &Error) -> Verdict {
        self.metrics.degraded.fetch_add(1, Ordering::Relaxed);
        if e.is_timeout() {
            self.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(policy = ?self.policy, "rate limit decided without bucketd: {e}");
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
    fn retry_after_secs(&self, wait: Duration) -> u64 {
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

    fn layer(rules: Vec<Rule>) -> RateLimitLayer {
        let client = Client::new("redis://127.0.0.1:1").unwrap();
        rules
            .into_iter()
            .fold(RateLimitLayer::builder(client), RateLimitBuilder::rule)
            .build()
    }

    #[test]
    fn keys_by_scope() {
        let l = layer(vec![
            Rule::new("a", Limit::per_minute(1)),
            Rule::new("b", Limit::per_minute(1)).scope(Scope::ClientRoute),
            Rule::new("c", Limit::per_minute(1)).scope(Scope::Route),
            Rule::new("d", Limit::per_minute(1))
                .scope(Scope::Global)
                .path_prefix("/admin"),
        ]);
        let mut req = Request::get("/x/1").body(()).unwrap();
        req.extensions_mut()
            .insert(AuthenticatedUser("a{b}%".into()));
        let keys: Vec<String> = l.keys_for(&req).into_iter().map(|(_, k)| k).collect();
        assert_eq!(
            keys,
            [
                "rl:a:{user:a%7Bb%7D%25}",
                "rl:b:{user:a%7Bb%7D%25}:GET /x/1",
                "rl:c:GET /x/1",
            ]
        );
        let req = Request::post("/admin/z").body(()).unwrap();
        let keys: Vec<String> = l.keys_for(&req).into_iter().map(|(_, k)| k).collect();
        assert_eq!(keys[0], "rl:a:{anonymous}");
        assert_eq!(keys[3], "rl:d");
    }

    #[test]
    fn custom_key_fn_can_exempt() {
        let client = Client::new("redis://127.0.0.1:1").unwrap();
        let l = RateLimitLayer::builder(client)
            .rule(Rule::new("a", Limit::per_minute(1)))
            .key_fn(|p| (p.uri.path() != "/health").then(|| "tenant-7".to_string()))
            .key_prefix("gw")
            .build();
        let req = Request::get("/health").body(()).unwrap();
        assert!(l.keys_for(&req).is_empty());
        let req = Request::get("/x").body(()).unwrap();
        assert_eq!(l.keys_for(&req)[0].1, "gw:a:{tenant-7}");
    }

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
