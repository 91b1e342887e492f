//! A load generator for the Envoy rate limit service: `ShouldRateLimit` calls over gRPC, or the
//! same limits checked over RESP (`BK.CHECK`, `BK.CHECKALL`), reporting calls/s and latency
//! percentiles, so the cost of the gRPC front end can be read next to a plain check.
//!
//! ```text
//! rls_load --print-config > /tmp/bench.yaml          # the limits both modes use
//! bucketd --port 6379 --grpc-port 8081 --rls-config /tmp/bench.yaml
//! rls_load --mode grpc --addr 127.0.0.1:8081 --descriptors 3
//! rls_load --mode resp --addr 127.0.0.1:6379 --descriptors 3
//! ```
//!
//! Both modes count in the same counters: a request has `--descriptors` descriptors of one
//! entry each (`user`, `tenant`, `route`), its values drawn from `--keyspace` values per key,
//! each limited to `--limit` per second in envoyproxy's aligned window. Over RESP the key is the
//! one the service derives from the descriptor and the spec is `aligned:LIMIT/1s`, so the
//! shards do the same work in both modes and only the front end differs. The limit is meant to
//! be large enough that nothing is refused; a refused call, an error or a run cut short by
//! `--timeout-s` fails the run (exit 1), with the figures still printed.

use clap::{Parser, ValueEnum};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// The descriptor keys, in the order a request carries them.
const KEYS: [&str; 3] = ["user", "tenant", "route"];
/// How long one call may take before it counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening one connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(about = "ShouldRateLimit over gRPC, or the same checks over RESP, under load")]
struct Args {
    /// The server: its gRPC port in grpc mode, its RESP port in resp mode.
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: String,
    #[arg(long, value_enum, default_value_t = Mode::Grpc)]
    mode: Mode,
    /// Calls in flight at once (each waits for its answer before the next).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Calls in all.
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Descriptors per call, 1 to 3 (over RESP: BK.CHECK for 1, BK.CHECKALL for more).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    descriptors: u8,
    /// Distinct values per descriptor key.
    #[arg(long, default_value_t = 100_000)]
    keyspace: u64,
    /// Connections, the calls in flight spread over them; each multiplexes its calls onto one
    /// socket (HTTP/2 streams, or RESP commands pipelined). Default: 4 in grpc mode, one per
    /// call in flight in resp mode.
    #[arg(long)]
    connections: Option<usize>,
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Requests per second per counter, in the printed configuration and the RESP spec.
    #[arg(long, default_value_t = 1_000_000)]
    limit: u32,
    /// The whole run stops after this long, done or not.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Seed of the values drawn.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runtime worker threads (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// One tab-separated line: calls/s, p50 ms, p99 ms, calls, errors, refused.
    #[arg(long)]
    tsv: bool,
    /// Print the envoyproxy/ratelimit YAML configuration these calls expect, and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Grpc,
    Resp,
}

/// What every worker needs to build its calls.
struct Plan {
    domain: String,
    descriptors: usize,
    keyspace: u64,
    limit: u32,
    seed: u64,
    requests: u64,
    deadline: Instant,
    /// The next call to make, shared by all workers.
    next: AtomicU64,
}

impl Plan {
    /// The next call's number, or None once every call is taken or time is up.
    fn take(&self) -> Option<u64> {
        if Instant::now() >= self.deadline {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.requests).then_some(i)
    }

    /// Descriptor `d`'s value in call `i`: a fixed function of the seed, so runs repeat.
    fn value(&self, i: u64, d: usize) -> String {
        let v = splitmix64(self.seed ^ (i * KEYS.len() as u64 + d as u64)) % self.keyspace;
        format!("{}{v}", &KEYS[d][..1])
    }

    fn grpc_request(&self, i: u64) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: (0..self.descriptors)
                .map(|d| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: KEYS[d].to_string(),
                        value: self.value(i, d),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    fn resp_command(&self, i: u64) -> redis::Cmd {
        let spec = format!("aligned:{}/1s", self.limit);
        let keys: Vec<String> = (0..self.descriptors)
            .map(|d| counter_key(&self.domain, KEYS[d], &self.value(i, d)))
            .collect();
        if self.descriptors == 1 {
            let mut c = redis::cmd("BK.CHECK");
            c.arg(&keys[0]).arg(&spec);
            c
        } else {
            let mut c = redis::cmd("BK.CHECKALL");
            c.arg(keys.len()).arg(&keys);
            for _ in &keys {
                c.arg(&spec);
            }
            c
        }
    }

    fn yaml(&self) -> String {
        let mut y = format!("domain: {}\ndescriptors:\n", self.domain);
        for key in KEYS {
            y.push_str(&format!(
                "  - key: {key}\n    rate_limit:\n      unit: second\n      requests_per_unit: {}\n",
                self.limit
            ));
        }
        y
    }
}

/// The counter the rate limit service counts a one-entry descriptor in (its domain and
/// entries, each length-prefixed), so RESP checks land on the same keys.
fn counter_key(domain: &str, key: &str, value: &str) -> String {
    format!(
        "rls:{}:{domain}:{}:{key}:{}:{value}",
        domain.len(),
        key.len(),
        value.len()
    )
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One worker's count: each answered call's latency in nanoseconds, and what went wrong.
#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    errors: u64,
    refused: u64,
    first_error: Option<String>,
}

impl Tally {
    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }

    fn merge(&mut self, other: Tally) {
        self.latencies_ns.extend(other.latencies_ns);
        self.errors += other.errors;
        self.refused += other.refused;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

async fn grpc_worker(mut client: RateLimitServiceClient<Channel>, plan: Arc<Plan>) -> Tally {
    let mut t = Tally::default();
    while let Some(i) = plan.take() {
        let req = plan.grpc_request(i);
        let start = Instant::now();
        let answer = tokio::time::timeout(CALL_TIMEOUT, client.should_rate_limit(req)).await;
        let took = start.elapsed();
        match answer {
            Err(_) => t.error(format!("no answer within {CALL_TIMEOUT:?}")),
            Ok(Err(status)) => t.error(format!("status {status}")),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                // A descriptor the configuration does not match is answered OK with no limit,
                // having counted nothing: that would measure nothing.
                let limited = r.statuses.len() == plan.descriptors
                    && r.statuses.iter().all(|s| {
                        s.current_limit
                            .as_ref()
                            .is_some_and(|l| l.requests_per_unit == plan.limit)
                    });
                if !limited {
                    t.error(format!("a descriptor matched no limit of {}", plan.limit));
                } else if r.overall_code != Code::Ok as i32 {
                    t.refused += 1;
                }
                t.latencies_ns.push(nanos(took));
            }
        }
    }
    t
}

async fn resp_worker(mut conn: redis::aio::MultiplexedConnection, plan: Arc<Plan>) -> Tally {
    let mut t = Tally::default();
    while let Some(i) = plan.take() {
        let cmd = plan.resp_command(i);
        let start = Instant::now();
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, cmd.query_async::<redis::Value>(&mut conn)).await;
        let took = start.elapsed();
        match answer {
            Err(_) => t.error(format!("no answer within {CALL_TIMEOUT:?}")),
            Ok(Err(e)) => t.error(format!("error reply {e}")),
            Ok(Ok(v)) => {
                // The limit reply (or BK.CHECKALL's deciding limit): allowed, limit, ...
                match first_two(&v) {
                    Some((allowed, limit)) if limit == i64::from(plan.limit) => {
                        if allowed != 1 {
                            t.refused += 1;
                        }
                    }
                    _ => t.error(format!("unexpected reply {v:?}")),
                }
                t.latencies_ns.push(nanos(took));
            }
        }
    }
    t
}

fn first_two(v: &redis::Value) -> Option<(i64, i64)> {
    let redis::Value::Array(items) = v else {
        return None;
    };
    match items.as_slice() {
        [redis::Value::Int(a), redis::Value::Int(b), ..] => Some((*a, *b)),
        _ => None,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The `q` quantile (0..=1) of sorted latencies, in milliseconds: the smallest value at or
/// above that share of the calls.
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e6
}

async fn run(args: Args) -> Result<bool, String> {
    let plan = Arc::new(Plan {
        domain: args.domain.clone(),
        descriptors: usize::from(args.descriptors),
        keyspace: args.keyspace.max(1),
        limit: args.limit,
        seed: args.seed,
        requests: args.requests,
        deadline: Instant::now() + Duration::from_secs(args.timeout_s),
        next: AtomicU64::new(0),
    });
    if args.print_config {
        print!("{}", plan.yaml());
        return Ok(true);
    }
    let concurrency = args.concurrency.max(1);
    let connections = match (args.connections, args.mode) {
        (Some(n), _) => n.clamp(1, concurrency),
        (None, Mode::Grpc) => 4.min(concurrency),
        (None, Mode::Resp) => concurrency,
    };
    // Connections are made before the clock starts.
    let mut workers = tokio::task::JoinSet::new();
    match args.mode {
        Mode::Grpc => {
            let endpoint = Endpoint::from_shared(format!("http://{}", args.addr))
                .map_err(|e| format!("--addr {}: {e}", args.addr))?
                .tcp_nodelay(true)
                .connect_timeout(CONNECT_TIMEOUT);
            let mut channels = Vec::with_capacity(connections);
            for _ in 0..connections {
                let ch = endpoint
                    .connect()
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", args.addr))?;
                channels.push(ch);
            }
            let start = Instant::now();
            for w in 0..concurrency {
                let client = RateLimitServiceClient::new(channels[w % connections].clone());
                workers.spawn(grpc_worker(client, plan.clone()));
            }
            report(&args, &plan, connections, start, workers).await
        }
        Mode::Resp => {
            let client = redis::Client::open(format!("redis://{}/", args.addr))
                .map_err(|e| format!("--addr {}: {e}", args.addr))?;
            let mut conns = Vec::with_capacity(connections);
            for _ in 0..connections {
                let c = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    client.get_multiplexed_async_connection(),
                )
                .await
                .map_err(|_| format!("connecting to {}: timed out", args.addr))?
                .map_err(|e| format!("connecting to {}: {e}", args.addr))?;
                conns.push(c);
            }
            let start = Instant::now();
            for w in 0..concurrency {
                workers.spawn(resp_worker(conns[w % connections].clone(), plan.clone()));
            }
            report(&args, &plan, connections, start, workers).await
        }
    }
}

/// Waits for the workers and prints what they measured; false when the run failed.
async fn report(
    args: &Args,
    plan: &Plan,
    connections: usize,
    start: Instant,
    mut workers: tokio::task::JoinSet<Tally>,
) -> Result<bool, String> {
    let mut all = Tally::default();
    while let Some(t) = workers.join_next().await {
        all.merge(t.map_err(|e| format!("a worker failed: {e}"))?);
    }
    let secs = start.elapsed().as_secs_f64();
    let calls = all.latencies_ns.len() as u64;
    all.latencies_ns.sort_unstable();
    let rate = calls as f64 / secs;
    let p50 = quantile_ms(&all.latencies_ns, 0.50);
    let p99 = quantile_ms(&all.latencies_ns, 0.99);
    if args.tsv {
        println!(
            "{rate:.0}\t{p50:.3}\t{p99:.3}\t{calls}\t{}\t{}",
            all.errors, all.refused
        );
    } else {
        println!(
            "{:?} x{} descriptors, {} in flight on {connections} connections: {calls} calls in \
             {secs:.2} s = {rate:.0} calls/s, p50 {p50:.3} ms, p99 {p99:.3} ms, {} errors, \
             {} refused",
            args.mode, plan.descriptors, args.concurrency, all.errors, all.refused
        );
    }
    if let Some(e) = &all.first_error {
        eprintln!("rls_load: first error: {e}");
    }
    let complete = calls + all.errors >= plan.requests;
    if !complete {
        eprintln!(
            "rls_load: stopped after {} s with {} of {} calls made",
            args.timeout_s,
            calls + all.errors,
            plan.requests
        );
    }
    Ok(complete && all.errors == 0 && all.refused == 0)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rls_load: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rls_load: {e}");
            ExitCode::from(2)
        }
    }
}
