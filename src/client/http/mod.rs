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
//!
//! # In-flight limits
//!
//! [`RateLimitBuilder::in_flight`] caps how many of a caller's requests run at once, across
//! gateways (`BK.ACQUIRE` on `PREFIX:{CALLER}:inflight`). After the rules let a request
//! through, it takes a slot, and gives it back once the inner service has produced the
//! response (before the response is returned, so a caller that waits for each response is
//! never refused by its own previous request), or, if the request's future is dropped first,
//! from a spawned task. Either release costs a round trip within the client deadline; one that
//! fails leaves the slot to free itself at its ttl ([`Metrics::release_failures`]).
//!
//! A caller with every slot held gets `429 Too Many Requests` with `Retry-After: 1` plus
//! jitter (a slot frees when any of its requests completes) and the rules' headers, counted in
//! [`Metrics::in_flight_rejected`]. When bucketd fails, the [`FailurePolicy`] decides:
//! `Open` counts this gateway's share of the slots (limit divided by
//! [`RateLimitBuilder::gateways`], rounded up) in process, the closed policies refuse with
//! their status.

mod config;
mod decide;
mod identity;
mod in_flight;
mod local;

pub use identity::AuthenticatedUser;

pub use config::{FailurePolicy, RateLimitBuilder, Rule, Scope};
pub use decide::{Metrics, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};

use super::Client;
use decide::{Figures, Shared, Verdict};
use http::StatusCode;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response};
use in_flight::Slot;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use tower::{Layer, Service};

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
            let limits = shared.applicable(&parts);
            let figures = match shared.decide(&limits.rules).await {
                Verdict::Exempt => None,
                Verdict::Allow(figures) => Some(figures),
                Verdict::Refuse {
                    status,
                    figures,
                    retry_after,
                } => return Ok(refusal(&shared, status, Some(figures), retry_after)),
            };
            let slot = match shared.take_slot(limits.caller.as_deref()).await {
                Slot::Free => None,
                Slot::Held(slot) => Some(slot),
                Slot::Refused {
                    status,
                    retry_after,
                } => {
                    shared
                        .metrics
                        .in_flight_rejected
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(refusal(&shared, status, figures, retry_after));
                }
            };
            if figures.is_some() || slot.is_some() {
                shared.metrics.allowed.fetch_add(1, Ordering::Relaxed);
            }
            // The slot lives in this future until the response is there: dropped with it
            // (the client went away, a timeout layer gave up), it is given back all the same,
            // from a task of its own. So is it when the service fails, since its error need
            // not be `Send` and cannot wait here for the release.
            let mut res = inner.call(Request::from_parts(parts, body)).await?;
            if let Some(slot) = slot {
                slot.release().await;
            }
            if let Some(figures) = figures {
                figures.write(res.headers_mut());
            }
            Ok(res)
        })
    }
}

/// A refused request's response: an empty body, the rate-limit headers when rules applied,
/// and `Retry-After` with jitter.
fn refusal<B: Default>(
    shared: &Shared,
    status: StatusCode,
    figures: Option<Figures>,
    retry_after: std::time::Duration,
) -> Response<B> {
    shared.metrics.rejected.fetch_add(1, Ordering::Relaxed);
    let mut res = Response::new(B::default());
    *res.status_mut() = status;
    if let Some(figures) = figures {
        figures.write(res.headers_mut());
    }
    let secs = shared.retry_after_secs(retry_after);
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Limit;

    pub(super) fn layer(rules: Vec<Rule>) -> RateLimitLayer {
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
}
