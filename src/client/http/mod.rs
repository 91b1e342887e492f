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
mod layer;
mod local;
mod metrics;
mod service;
mod shared;
mod verdict;

pub use config::{FailurePolicy, Rule, Scope};
pub use identity::AuthenticatedUser;
pub use layer::{RateLimitBuilder, RateLimitLayer};
pub use metrics::Metrics;
pub use service::RateLimit;
pub use verdict::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Client;
    use crate::client::Limit;
    use http::Request;

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
