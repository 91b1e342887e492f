//! The HTTP layer's in-flight limit end to end: an axum service whose handler waits until the
//! test lets it finish, a real HTTP client, and a real in-process bucketd node; and the layer
//! as a bare tower service, to drop a request half-way.

#![cfg(all(feature = "http", feature = "server"))]

mod gateway_support;

use axum::Router;
use axum::routing::get;
use bucketd::client::http::{FailurePolicy, RateLimitLayer, Rule};
use bucketd::client::{Client, Limit};
use gateway_support::{Node, PATIENT, client_for, closed_url};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::{Layer, ServiceExt};

/// Holds requests inside the service until the test lets them out.
struct Gate {
    entered: AtomicUsize,
    open: Semaphore,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            entered: AtomicUsize::new(0),
            open: Semaphore::new(0),
        }
    }
}

impl Gate {
    async fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        if let Ok(p) = self.open.acquire().await {
            p.forget();
        }
    }

    /// Waits until `n` requests in all have reached the service.
    async fn wait_entered(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.entered.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "{n} requests never reached the service"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The caller is the `x-user` header.
fn caller(parts: &http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `/slow` waits at the gate, `/` answers at once.
struct Gateway {
    base: String,
    http: reqwest::Client,
    task: JoinHandle<()>,
}

impl Gateway {
    async fn start(layer: RateLimitLayer, gate: Arc<Gate>) -> Gateway {
        let app = Router::new()
            .route("/", get(|| async { "home" }))
            .route(
                "/slow",
                get(move || async move {
                    gate.pass().await;
                    "slow"
                }),
            )
            .layer(layer);
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

    fn get(&self, path: &str, user: &str) -> impl Future<Output = reqwest::Response> + use<> {
        let req = self
            .http
            .get(format!("{}{path}", self.base))
            .header("x-user", user);
        async move { req.send().await.unwrap() }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn retry_after(res: &reqwest::Response) -> u64 {
    res.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a refusal carries Retry-After")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_past_the_limit_is_refused_and_slots_come_back_with_responses() {
    let mut node = Node::start().await;
    let client = node.client();
    let layer = RateLimitLayer::builder(node.client())
        .rule(Rule::new("caller", Limit::per_minute(100)))
        .in_flight(2, Duration::from_secs(30))
        .key_fn(caller)
        .build();
    let metrics = layer.metrics();
    let gate = Arc::new(Gate::default());
    let gw = Gateway::start(layer, gate.clone()).await;

    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(gw.get("/slow", "alice")))
        .collect();
    gate.wait_entered(2).await;
    assert_eq!(client.in_flight("rl:{alice}:inflight").await.unwrap(), 2);
    // Alice's third request is refused, fast or slow; Bob has slots of his own.
    for path in ["/", "/slow"] {
        let res = gw.get(path, "alice").await;
        assert_eq!(res.status(), 429);
        assert!((1..=2).contains(&retry_after(&res)));
        // Refused for its concurrency; the rate limit's headers are still there.
        assert!(res.headers().contains_key("x-ratelimit-remaining"));
    }
    assert_eq!(gw.get("/", "bob").await.status(), 200);
    assert_eq!(metrics.in_flight_rejected(), 2);
    assert_eq!(metrics.rejected(), 2);

    gate.open.add_permits(2);
    for r in slow {
        let res = r.await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.text().await.unwrap(), "slow");
    }
    // Each slot was given back before its response went out.
    assert_eq!(client.in_flight("rl:{alice}:inflight").await.unwrap(), 0);
    assert_eq!(client.in_flight("rl:{bob}:inflight").await.unwrap(), 0);
    for _ in 0..5 {
        assert_eq!(gw.get("/", "alice").await.status(), 200);
    }
    assert_eq!(metrics.release_failures(), 0);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_mid_way_gives_its_slot_back() {
    let mut node = Node::start().await;
    let client = node.client();
    let layer = RateLimitLayer::builder(node.client())
        .in_flight(1, Duration::from_secs(30))
        .key_fn(caller)
        .build();
    let gate = Arc::new(Gate::default());
    let inner = {
        let gate = gate.clone();
        tower::service_fn(move |_req: http::Request<()>| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok::<_, Infallible>(http::Response::new(String::from("done")))
            }
        })
    };
    let service = layer.layer(inner);
    let request = || {
        http::Request::get("/")
            .header("x-user", "carol")
            .body(())
            .unwrap()
    };
    let held = tokio::spawn(service.clone().oneshot(request()));
    gate.wait_entered(1).await;
    let res = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(res.status(), 429, "the one slot is held");

    // The caller goes away: the request's future is dropped inside the service.
    held.abort();
    let key = "rl:{carol}:inflight";
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.in_flight(key).await.unwrap() != 0 {
        assert!(
            Instant::now() < deadline,
            "the dropped request kept its slot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gate.open.add_permits(1);
    let res = service.oneshot(request()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.into_body(), "done");
    assert_eq!(client.in_flight(key).await.unwrap(), 0);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bucketd_the_failure_policy_decides() {
    let url = closed_url().await;
    // Open: this gateway's share of the slots, 4 over 2 gateways, counted in process.
    let layer = RateLimitLayer::builder(client_for(&url, PATIENT))
        .in_flight(4, Duration::from_secs(30))
        .gateways(2)
        .key_fn(caller)
        .build();
    let metrics = layer.metrics();
    let gate = Arc::new(Gate::default());
    let gw = Gateway::start(layer, gate.clone()).await;
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(gw.get("/slow", "dave")))
        .collect();
    gate.wait_entered(2).await;
    let res = gw.get("/", "dave").await;
    assert_eq!(res.status(), 429);
    assert!((1..=2).contains(&retry_after(&res)));
    assert_eq!(gw.get("/", "erin").await.status(), 200);
    gate.open.add_permits(2);
    for r in slow {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    assert_eq!(
        gw.get("/", "dave").await.status(),
        200,
        "the local slots came back"
    );
    assert_eq!(metrics.degraded(), 5);
    assert_eq!(metrics.in_flight_rejected(), 1);

    for (policy, status) in [
        (FailurePolicy::Closed, 503),
        (FailurePolicy::ClosedTooManyRequests, 429),
    ] {
        let layer = RateLimitLayer::builder(client_for(&url, PATIENT))
            .in_flight(4, Duration::from_secs(30))
            .failure_policy(policy)
            .key_fn(caller)
            .build();
        let metrics = layer.metrics();
        let gw = Gateway::start(layer, Arc::new(Gate::default())).await;
        for _ in 0..3 {
            let res = gw.get("/", "dave").await;
            assert_eq!(res.status(), status);
            assert!((1..=2).contains(&retry_after(&res)));
        }
        assert_eq!(metrics.degraded(), 3);
        assert_eq!(metrics.in_flight_rejected(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_callers_take_no_slot() {
    let mut node = Node::start().await;
    let client: Client = node.client();
    let layer = RateLimitLayer::builder(node.client())
        .in_flight(1, Duration::from_secs(30))
        .key_fn(|p| (p.uri.path() != "/slow").then(|| "frank".to_string()))
        .build();
    let gate = Arc::new(Gate::default());
    let gw = Gateway::start(layer, gate.clone()).await;
    let slow: Vec<_> = (0..3)
        .map(|_| tokio::spawn(gw.get("/slow", "frank")))
        .collect();
    gate.wait_entered(3).await;
    assert_eq!(client.in_flight("rl:{frank}:inflight").await.unwrap(), 0);
    assert_eq!(gw.get("/", "frank").await.status(), 200);
    gate.open.add_permits(3);
    for r in slow {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    node.stop().await;
}
