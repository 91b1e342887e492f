//! A small HTTP service protected by bucketd.
//!
//! Start a node, then the gateway:
//!
//! ```text
//! cargo run --release -- --port 6379
//! cargo run --example gateway --features http -- --bucketd redis://127.0.0.1:6379 --listen 127.0.0.1:8080
//! curl -i http://127.0.0.1:8080/                       # limited by client IP
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:8080/  # limited by API key
//! curl -i -H 'authorization: Bearer ann' http://127.0.0.1:8080/search
//! curl http://127.0.0.1:8080/metrics
//! ```

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use bucketd::client::http::{
    AuthenticatedUser, FailurePolicy, Metrics, RateLimitLayer, Rule, Scope,
};
use bucketd::client::{Client, Limit};
use clap::Parser;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "An HTTP service rate limited by bucketd")]
struct Args {
    /// bucketd node URL; repeat it to talk to a cluster.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    bucketd: Vec<String>,
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Requests per minute per caller, on every route.
    #[arg(long, default_value_t = 60)]
    per_minute: u64,
    /// Requests per second per caller on /search, on top of the per-minute limit.
    #[arg(long, default_value_t = 2)]
    search_per_second: u64,
    /// Gateways sharing the limits: each gets 1/N of them while bucketd is unavailable.
    #[arg(long, default_value_t = 1)]
    gateways: u64,
    /// Refuse requests (503) while bucketd is unavailable, instead of limiting locally.
    #[arg(long)]
    fail_closed: bool,
    /// Deadline of each bucketd decision, in milliseconds.
    #[arg(long, default_value_t = 5)]
    deadline_ms: u64,
    /// Proxies in front of this service that append to X-Forwarded-For.
    #[arg(long, default_value_t = 0)]
    trusted_proxies: usize,
}

/// Stand-in for real authentication: `Authorization: Bearer NAME` is taken at its word.
async fn demo_auth(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|name| AuthenticatedUser(name.trim().to_string()));
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

async fn metrics(State(m): State<Arc<Metrics>>) -> String {
    format!(
        "allowed {}\nrejected {}\ndegraded {}\ntimeouts {}\n",
        m.allowed(),
        m.rejected(),
        m.degraded(),
        m.timeouts()
    )
}

fn limited(path: &str) -> bool {
    path != "/health" && path != "/metrics"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();

    // Connects in the background: the gateway starts even if bucketd is not up yet.
    let client = Client::builder(args.bucketd.iter().map(String::as_str))
        .deadline(Duration::from_millis(args.deadline_ms))
        .build()?;
    let limiter = RateLimitLayer::builder(client)
        .rule(
            Rule::new("caller", Limit::per_minute(args.per_minute)).when(|p| limited(p.uri.path())),
        )
        .rule(
            Rule::new("search", Limit::per_second(args.search_per_second))
                .scope(Scope::ClientRoute)
                .path_prefix("/search"),
        )
        .failure_policy(if args.fail_closed {
            FailurePolicy::Closed
        } else {
            FailurePolicy::Open
        })
        .gateways(args.gateways)
        .trusted_proxies(args.trusted_proxies)
        .build();

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .with_state(limiter.metrics())
        .layer(limiter)
        .layer(middleware::from_fn(demo_auth));

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, bucketd = ?args.bucketd, "gateway listening");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
