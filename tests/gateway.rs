//! The HTTP layer end to end: a real axum service behind the layer, a real HTTP client, and a
//! real in-process bucketd node whose clock only moves when a test moves it.

#![cfg(all(feature = "http", feature = "server"))]

mod gateway_support;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use bucketd::client::http::{AuthenticatedUser, FailurePolicy, RateLimitLayer, Rule, Scope};
use bucketd::client::{Client, Limit};
use gateway_support::{Node, PATIENT, Silent, client_for, closed_url};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Stands in for authentication middleware: `x-user: NAME` becomes an `AuthenticatedUser`.
async fn fake_auth(mut req: Request, next: Next) -> Response {
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        let user = AuthenticatedUser(user.to_string());
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

/// A small service behind `layer`, on a free port.
struct Gateway {
    base: String,
    http: reqwest::Client,
    task: JoinHandle<()>,
}

impl Gateway {
    async fn start(layer: RateLimitLayer) -> Gateway {
        let app = Router::new()
            .route("/", get(|| async { "home" }))
            .route("/search", get(|| async { "results" }))
            .route("/items/{id}", get(|| async { "item" }))
            .layer(layer)
            .layer(middleware::from_fn(fake_auth));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        Gateway {
            base: format!("http://{addr}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            task,
        }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.get_with(path, &[]).await
    }

    async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self.http.get(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.unwrap()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn header(res: &reqwest::Response, name: &str) -> Option<u64> {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// `(limit, remaining, reset)` from the rate-limit headers; panics if one is missing.
fn figures(res: &reqwest::Response) -> (u64, u64, u64) {
    let get = |n| header(res, n).unwrap_or_else(|| panic!("{n} missing on {}", res.status()));
    (
        get("x-ratelimit-limit"),
        get("x-ratelimit-remaining"),
        get("x-ratelimit-reset"),
    )
}

/// Units bucketd has left for `key` (a check of cost 0 takes nothing and reports them).
async fn available(client: &Client, key: &str, limit: Limit) -> u64 {
    client.check(key, &limit, 0).await.unwrap().remaining
}

fn one_rule(client: Client, limit: Limit) -> RateLimitLayer {
    RateLimitLayer::builder(client)
        .rule(Rule::new("caller", limit))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_limit_passes_then_429_with_headers() {
    let mut node = Node::start().await;
    let gw = Gateway::start(one_rule(node.client(), Limit::per_minute(5))).await;

    for left in (0..5).rev() {
        let res = gw.get("/").await;
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("retry-after").is_none());
        // 5 per minute refills one every 12 s: full again 12 s per unit taken.
        assert_eq!(figures(&res), (5, left, (5 - left) * 12));
        assert_eq!(res.text().await.unwrap(), "home");
    }
    for _ in 0..3 {
        let res = gw.get("/").await;
        assert_eq!(res.status(), 429);
        assert_eq!(figures(&res), (5, 0, 60));
        let retry = header(&res, "retry-after").unwrap();
        assert!((12..=13).contains(&retry), "{retry}");
        assert_eq!(res.text().await.unwrap(), "");
    }

    // One unit comes back after 12 s of the node's time.
    node.clock.advance_ms(12_000);
    assert_eq!(gw.get("/").await.status(), 200);
    assert_eq!(gw.get("/").await.status(), 429);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_jitter_stays_within_bounds_and_varies() {
    let mut node = Node::start().await;
    // 2 per 3 s: a refused request may retry in exactly 1.5 s.
    let limit = Limit::new(2, Duration::from_secs(3));
    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("caller", limit))
        .retry_jitter(Duration::from_secs(1))
        .build();
    let gw = Gateway::start(layer).await;
    assert_eq!(gw.get("/").await.status(), 200);
    assert_eq!(gw.get("/").await.status(), 200);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let res = gw.get("/").await;
        assert_eq!(res.status(), 429);
        // 1.5 s + [0, 1] s, rounded up: 2 or 3, never less than the real wait.
        let retry = header(&res, "retry-after").unwrap();
        assert!((2..=3).contains(&retry), "{retry}");
        seen.insert(retry);
    }
    assert_eq!(seen.len(), 2, "jitter never varied: {seen:?}");

    // Without jitter, exactly the wait rounded up.
    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("other", limit))
        .retry_jitter(Duration::ZERO)
        .build();
    let gw = Gateway::start(layer).await;
    gw.get("/").await;
    gw.get("/").await;
    for _ in 0..5 {
        assert_eq!(header(&gw.get("/").await, "retry-after"), Some(2));
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_rules_in_one_decision() {
    let mut node = Node::start().await;
    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("caller", Limit::per_minute(100)))
        .rule(
            Rule::new("search", Limit::per_minute(2))
                .scope(Scope::ClientRoute)
                .path_prefix("/search"),
        )
        .build();
    let gw = Gateway::start(layer).await;

    // The deciding limit is the one with the least remaining: the route's.
    for left in [1, 0] {
        let res = gw.get("/search").await;
        assert_eq!(res.status(), 200);
        assert_eq!((figures(&res).0, figures(&res).1), (2, left));
    }
    let res = gw.get("/search").await;
    assert_eq!(res.status(), 429);
    assert_eq!((figures(&res).0, figures(&res).1), (2, 0));
    let retry = header(&res, "retry-after").unwrap();
    assert!((30..=31).contains(&retry), "{retry}");

    // The refused request took nothing from the caller's limit: 100 - 2 searches - 1.
    let res = gw.get("/").await;
    assert_eq!(res.status(), 200);
    assert_eq!(figures(&res).0, 100);
    assert_eq!(figures(&res).1, 97);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_told_apart() {
    let mut node = Node::start().await;
    let gw = Gateway::start(one_rule(node.client(), Limit::per_minute(2))).await;
    let spend = |headers: &'static [(&'static str, &'static str)]| {
        let gw = &gw;
        async move {
            let mut codes = Vec::new();
            for _ in 0..3 {
                codes.push(gw.get_with("/", headers).await.status().as_u16());
            }
            codes
        }
    };
    // The API key wins over the user, the user over the IP: four separate budgets.
    assert_eq!(
        spend(&[("x-api-key", "k1"), ("x-user", "ann")]).await,
        [200, 200, 429]
    );
    assert_eq!(spend(&[("x-api-key", "k2")]).await, [200, 200, 429]);
    assert_eq!(spend(&[("x-user", "ann")]).await, [200, 200, 429]);
    assert_eq!(spend(&[]).await, [200, 200, 429]);
    // Forwarded-for is not trusted by default: same IP, same (spent) budget.
    assert_eq!(
        spend(&[("x-forwarded-for", "9.9.9.9")]).await,
        [429, 429, 429]
    );

    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("proxied", Limit::per_minute(2)))
        .trusted_proxies(1)
        .build();
    let gw = Gateway::start(layer).await;
    let spend = |xff: &'static str| {
        let gw = &gw;
        async move {
            let mut codes = Vec::new();
            for _ in 0..3 {
                let res = gw.get_with("/", &[("x-forwarded-for", xff)]).await;
                codes.push(res.status().as_u16());
            }
            codes
        }
    };
    assert_eq!(spend("1.1.1.1").await, [200, 200, 429]);
    // Only the rightmost entry (added by the one trusted proxy) counts.
    assert_eq!(spend("2.2.2.2, 1.1.1.1").await, [429, 429, 429]);
    assert_eq!(spend("1.1.1.1, 2.2.2.2").await, [200, 200, 429]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_uses_a_local_share_of_the_limit() {
    let mut node = Node::start().await;
    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("caller", Limit::per_minute(10)))
        .failure_policy(FailurePolicy::Open)
        .gateways(2)
        .build();
    let metrics = layer.metrics();
    let gw = Gateway::start(layer.clone()).await;
    assert_eq!(gw.get("/").await.status(), 200);
    assert_eq!(metrics.degraded(), 0);

    node.stop().await;
    // bucketd is gone: this gateway's share is 10 / 2 = 5 a minute.
    for left in (0..5).rev() {
        let res = gw.get("/").await;
        assert_eq!(res.status(), 200);
        assert_eq!(figures(&res).0, 5);
        assert_eq!(figures(&res).1, left);
    }
    let res = gw.get("/").await;
    assert_eq!(res.status(), 429);
    assert_eq!(figures(&res).0, 5);
    let retry = header(&res, "retry-after").unwrap();
    assert!((12..=13).contains(&retry), "{retry}");
    assert_eq!(metrics.degraded(), 6);
    assert_eq!(metrics.timeouts(), 0);
    assert_eq!(metrics.allowed(), 6);
    assert_eq!(metrics.rejected(), 1);
    assert_eq!(layer.fallback_keys(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_keys_are_capped() {
    let layer = RateLimitLayer::builder(client_for(&closed_url().await, PATIENT))
        .rule(Rule::new("caller", Limit::per_minute(1)))
        .fallback_capacity(3)
        .build();
    let gw = Gateway::start(layer.clone()).await;
    for key in ["a", "b", "c", "d", "e"] {
        let res = gw.get_with("/", &[("x-api-key", key)]).await;
        assert_eq!(res.status(), 200);
    }
    assert_eq!(layer.fallback_keys(), 3);
    // "e" is still remembered (and spent); "a" was evicted, so it starts afresh.
    assert_eq!(gw.get_with("/", &[("x-api-key", "e")]).await.status(), 429);
    assert_eq!(gw.get_with("/", &[("x-api-key", "a")]).await.status(), 200);
    assert_eq!(layer.metrics().degraded(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_with_503_or_429() {
    let mut node = Node::start().await;
    let url = node.url();
    node.stop().await;
    for (policy, status) in [
        (FailurePolicy::Closed, 503),
        (FailurePolicy::ClosedTooManyRequests, 429),
    ] {
        let layer = RateLimitLayer::builder(client_for(&url, PATIENT))
            .rule(Rule::new("caller", Limit::per_minute(100)))
            .rule(Rule::new("tight", Limit::per_minute(7)))
            .failure_policy(policy)
            .build();
        let metrics = layer.metrics();
        let gw = Gateway::start(layer).await;
        for _ in 0..3 {
            let res = gw.get("/").await;
            assert_eq!(res.status(), status);
            assert_eq!(figures(&res), (7, 0, 1));
            let retry = header(&res, "retry-after").unwrap();
            assert!((1..=2).contains(&retry), "{retry}");
        }
        assert_eq!(metrics.degraded(), 3);
        assert_eq!(metrics.rejected(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_bucketd_costs_one_deadline_not_a_hang() {
    let silent = Silent::start().await;
    let deadline = Duration::from_millis(50);
    for (policy, status) in [(FailurePolicy::Open, 200), (FailurePolicy::Closed, 503)] {
        // The connection attempt itself hangs too; it must not matter how long it may take.
        let client = Client::builder([silent.url()])
            .deadline(deadline)
            .connect_timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder(client)
            .rule(Rule::new("caller", Limit::per_minute(100)))
            .failure_policy(policy)
            .build();
        let metrics = layer.metrics();
        let gw = Gateway::start(layer).await;
        for i in 1..=3 {
            let started = Instant::now();
            let res = gw.get("/").await;
            let took = started.elapsed();
            assert_eq!(res.status(), status);
            assert!(took >= deadline, "{took:?}");
            assert!(took < Duration::from_secs(1), "{took:?}");
            assert_eq!(metrics.timeouts(), i);
            assert_eq!(metrics.degraded(), i);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_spend_locally_and_refill_in_batches() {
    let mut node = Node::start().await;
    let client = node.client();
    let limit = Limit::per_minute(10);
    let layer = RateLimitLayer::builder(client.clone())
        .rule(
            Rule::new("hot", limit)
                .lease(5)
                .lease_max_hold(Duration::from_secs(600)),
        )
        .build();
    let metrics = layer.metrics();
    let gw = Gateway::start(layer).await;
    let key = "rl:hot:{ip:127.0.0.1}";

    // The first request leases 5; bucketd is left with 5.
    let res = gw.get("/").await;
    assert_eq!(res.status(), 200);
    assert_eq!(figures(&res).1, 9);
    assert_eq!(available(&client, key, limit).await, 5);
    // The next 4 are spent locally: bucketd sees nothing.
    for left in (5..9).rev() {
        let res = gw.get("/").await;
        assert_eq!(res.status(), 200);
        assert_eq!(figures(&res).1, left);
    }
    assert_eq!(available(&client, key, limit).await, 5);
    assert_eq!((metrics.lease_refills(), metrics.leased()), (1, 4));
    // The sixth takes the second batch.
    for _ in 0..5 {
        assert_eq!(gw.get("/").await.status(), 200);
    }
    assert_eq!(available(&client, key, limit).await, 0);
    assert_eq!((metrics.lease_refills(), metrics.leased()), (2, 8));
    // Nothing left anywhere: refused with bucketd's wait.
    let res = gw.get("/").await;
    assert_eq!(res.status(), 429);
    let retry = header(&res, "retry-after").unwrap();
    assert!((6..=7).contains(&retry), "{retry}");
    assert_eq!(metrics.allowed(), 10);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_over_admission_is_at_most_batch_minus_one_per_gateway() {
    let mut node = Node::start().await;
    // A fixed window of 10 a minute, leased 5 at a time by two gateways.
    let limit = Limit::per_minute(10).fixed();
    let gateway = || {
        RateLimitLayer::builder(node.client())
            .rule(
                Rule::new("hot", limit)
                    .scope(Scope::Global)
                    .lease(5)
                    .lease_max_hold(Duration::from_secs(600)),
            )
            .build()
    };
    let a = Gateway::start(gateway()).await;
    let b = Gateway::start(gateway()).await;
    let admitted = |codes: &[u16]| codes.iter().filter(|&&c| c == 200).count();
    async fn hammer(gw: &Gateway, n: usize) -> Vec<u16> {
        let mut codes = Vec::new();
        for _ in 0..n {
            codes.push(gw.get("/").await.status().as_u16());
        }
        codes
    }

    // First window: A leases 5 and spends 1; B leases the other 5 and spends them.
    assert_eq!(admitted(&hammer(&a, 1).await), 1);
    assert_eq!(admitted(&hammer(&b, 8).await), 5);

    // Next window: bucketd grants its 10 again, and A still holds 4 from the last one.
    node.clock.advance_ms(61_000);
    let from_b = admitted(&hammer(&b, 20).await);
    let from_a = admitted(&hammer(&a, 20).await);
    assert_eq!(from_b, 10);
    assert_eq!(from_a, 4);
    // limit + gateways holding tokens x (batch - 1) = 10 + 1 x 4.
    assert_eq!(from_a + from_b, 14);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_leased_request_costs_the_other_limits_nothing() {
    let mut node = Node::start().await;
    let client = node.client();
    let layer = RateLimitLayer::builder(client.clone())
        .rule(Rule::new("caller", Limit::per_minute(100)))
        .rule(
            Rule::new("hot", Limit::per_minute(2))
                .scope(Scope::Global)
                .lease(2)
                .lease_max_hold(Duration::from_secs(600)),
        )
        .build();
    let gw = Gateway::start(layer).await;
    assert_eq!(gw.get("/").await.status(), 200);
    assert_eq!(gw.get("/").await.status(), 200);
    for _ in 0..3 {
        assert_eq!(gw.get("/").await.status(), 429);
    }
    let caller = available(&client, "rl:caller:{ip:127.0.0.1}", Limit::per_minute(100)).await;
    assert_eq!(caller, 98);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_and_exempt_requests_pass_untouched() {
    let mut node = Node::start().await;
    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("search", Limit::per_minute(1)).path_prefix("/search"))
        .key_fn(|p| p.headers.get("x-tenant")?.to_str().ok().map(str::to_string))
        .build();
    let gw = Gateway::start(layer).await;
    for _ in 0..3 {
        let res = gw.get("/").await;
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("x-ratelimit-limit").is_none());
        // No tenant: the key function exempts it.
        assert_eq!(gw.get("/search").await.status(), 200);
    }
    let t = [("x-tenant", "t1")];
    assert_eq!(gw.get_with("/search", &t).await.status(), 200);
    assert_eq!(gw.get_with("/search", &t).await.status(), 429);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_route_keys_use_the_matched_path() {
    let mut node = Node::start().await;
    let client = node.client();
    let layer = RateLimitLayer::builder(client.clone())
        .rule(Rule::new("items", Limit::per_minute(3)).scope(Scope::Route))
        .build();
    let gw = Gateway::start(layer).await;
    for id in 1..=3 {
        assert_eq!(gw.get(&format!("/items/{id}")).await.status(), 200);
    }
    // Different ids, one route: the fourth is refused.
    assert_eq!(gw.get("/items/99").await.status(), 429);
    let d = client
        .peek("rl:items:GET /items/{id}", &Limit::per_minute(3))
        .await
        .unwrap();
    assert!(!d.allowed);
    node.stop().await;
}
