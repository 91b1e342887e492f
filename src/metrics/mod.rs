//! The Prometheus endpoint (`--metrics-port`): `GET /metrics` in the text exposition format.
//!
//! Nothing is counted for it on the request path that INFO does not count already, except
//! the decisions by command and by rule and one clock read per round (see `shard::metrics`).
//! A scrape reads the shards' counters and the Raft groups' state as they are at that moment
//! and builds the families then.
//!
//! Names follow what dashboards already use: redis_exporter's `redis_*` for what INFO has,
//! envoy ratelimit's `ratelimit_service_rate_limit_*` for decisions by rule, and `bucketd_*`
//! for the rest.

mod family;

use crate::cmd::CheckKind;
use crate::server::Node;
use crate::server::{NodeReport, stats};
use crate::shard::LatencySnapshot;
use crate::shutdown::Shutdown;
use family::{Family, counter, gauge, histogram, one_counter, one_gauge};
use prometheus::proto::MetricFamily;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;

/// What Envoy's rate limit service counted, as the metrics show it. The composition root
/// hands a way to read it, so this module needs nothing of the service.
pub(crate) struct ServiceStats {
    /// Hits by stat key: `[within, over, shadowed]`.
    pub(crate) by_rule: Vec<(String, [u64; 3])>,
    /// Answers by overall code: `[OK, OVER_LIMIT]`.
    pub(crate) answers: [u64; 2],
    /// Requests refused with a gRPC error.
    pub(crate) errors: u64,
    pub(crate) reloads: u64,
    pub(crate) reload_errors: u64,
}

/// Reads the rate limit service's counters at the moment of a scrape.
pub(crate) type ServiceCounts = Arc<dyn Fn() -> ServiceStats + Send + Sync>;

/// Serves `/metrics` until shutdown; `service`: the rate limit service's counters, when it
/// runs.
pub(crate) async fn serve(
    node: Arc<Node>,
    service: Option<ServiceCounts>,
    listener: TcpListener,
    mut shutdown: Shutdown,
) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let node = node.clone();
            let service = service.as_ref().map(|read| read());
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    render(&node, service.as_ref()),
                )
            }
        }),
    );
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.recv().await })
        .await;
    if let Err(e) = res {
        tracing::warn!("metrics endpoint stopped: {e}");
    }
}

/// Builds every family from the node as it is now, in the text format.
pub(crate) fn render(node: &Node, service: Option<&ServiceStats>) -> String {
    let st = stats(node);
    let mut out: Vec<Family> = Vec::new();
    node_families(&mut out, node, &st);
    key_families(&mut out, node, &st);
    error_families(&mut out, node, &st);
    decision_families(&mut out, node);
    rule_families(&mut out, node, service);
    if let Some(service) = service {
        service_families(&mut out, service);
    }
    let mut lat = LatencySnapshot::default();
    for s in &node.shards {
        s.stats.metrics.check_latency.add_to(&mut lat);
    }
    out.push(histogram(
        "bucketd_check_duration_seconds",
        "Time from a check being read to its reply being written (a replicated check includes its replication).",
        &lat,
    ));
    raft_families(&mut out, node);

    let families: Vec<MetricFamily> = out
        .into_iter()
        .map(|f| f.0)
        .filter(|f| !f.get_metric().is_empty())
        .collect();
    let mut text = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut text) {
        tracing::warn!("metrics encoding failed: {e}");
    }
    text
}

/// The node itself: version, uptime, clients, requests.
fn node_families(out: &mut Vec<Family>, node: &Node, st: &NodeReport) {
    let ns = &node.stats;
    let mut info = gauge("bucketd_info", "The node's version and mode; always 1.");
    let mode = if node.cluster().is_some() {
        "cluster"
    } else {
        "standalone"
    };
    info.gauge(&[("version", crate::server::VERSION), ("mode", mode)], 1.0);
    out.push(info);
    out.push(one_gauge("redis_up", "1 while the node answers.", 1.0));
    out.push(one_gauge(
        "redis_uptime_in_seconds",
        "Seconds since the node started.",
        node.started.elapsed().as_secs() as f64,
    ));

    out.push(one_gauge(
        "redis_connected_clients",
        "Client connections open now.",
        node.connected_clients() as f64,
    ));
    out.push(one_gauge(
        "redis_max_clients",
        "The most client connections allowed.",
        node.live.maxclients() as f64,
    ));
    out.push(one_counter(
        "redis_connections_received_total",
        "Client connections accepted.",
        ns.connections_received.load(Ordering::Relaxed) as f64,
    ));
    out.push(one_counter(
        "redis_rejected_connections_total",
        "Client connections refused at maxclients.",
        ns.rejected_connections.load(Ordering::Relaxed) as f64,
    ));
    out.push(one_counter(
        "redis_commands_processed_total",
        "Requests handled, of any command.",
        st.requests as f64,
    ));
}

/// The keys and the memory they take, on the node and by shard.
fn key_families(out: &mut Vec<Family>, node: &Node, st: &NodeReport) {
    let mut db = gauge("redis_db_keys", "Keys held.");
    db.gauge(&[("db", "db0")], st.keys as f64);
    out.push(db);
    out.push(one_counter(
        "redis_expired_keys_total",
        "Keys removed as they expired.",
        st.expired as f64,
    ));
    out.push(one_gauge(
        "redis_memory_used_bytes",
        "Bytes the keys take, by the node's own count.",
        st.used_bytes as f64,
    ));
    out.push(one_gauge(
        "redis_memory_used_rss_bytes",
        "Resident set size of the process.",
        st.rss_bytes as f64,
    ));
    out.push(one_gauge(
        "redis_memory_max_bytes",
        "The memory cap for keys (0: none).",
        node.live.caps.max_bytes() as f64,
    ));

    let mut shard_keys = gauge("bucketd_shard_keys", "Keys held, by shard.");
    let mut shard_bytes = gauge(
        "bucketd_shard_memory_bytes",
        "Bytes the keys take, by shard.",
    );
    for s in &st.shards {
        let id = s.id.to_string();
        shard_keys.gauge(&[("shard", &id)], s.keys as f64);
        shard_bytes.gauge(&[("shard", &id)], s.bytes as f64);
    }
    out.push(shard_keys);
    out.push(shard_bytes);
}

/// Error replies by code (ERR, WRONGTYPE, OOM, MOVED, TRYAGAIN, CLUSTERDOWN...), and
/// connections closed for a malformed request.
fn error_families(out: &mut Vec<Family>, node: &Node, st: &NodeReport) {
    let mut errs = counter("redis_errors_total", "Error replies sent, by error code.");
    for (code, n) in st.errors.iter().filter(|e| e.1 > 0) {
        errs.counter(&[("err", code)], *n as f64);
    }
    out.push(errs);
    out.push(one_counter(
        "bucketd_protocol_errors_total",
        "Connections closed for a malformed request.",
        node.stats.protocol_errors.load(Ordering::Relaxed) as f64,
    ));
}

/// Decisions by command and result.
fn decision_families(out: &mut Vec<Family>, node: &Node) {
    let mut checks = counter(
        "bucketd_checks_total",
        "Limit decisions this node answered, by command and result.",
    );
    for kind in CheckKind::ALL {
        for (i, result) in ["allowed", "denied"].iter().enumerate() {
            let n: u64 = node
                .shards
                .iter()
                .map(|s| s.stats.metrics.decided[kind as usize][i].load(Ordering::Relaxed))
                .sum();
            checks.counter(&[("command", kind.command()), ("result", result)], n as f64);
        }
    }
    out.push(checks);
}

/// Decisions by rule: the RESP rules' checks and the rate limit service's hits together.
fn rule_families(out: &mut Vec<Family>, node: &Node, service: Option<&ServiceStats>) {
    let rules = node.rules.load();
    // By rule: `[allowed, denied, denied but answered allowed (shadow mode)]`.
    let mut by_rule: std::collections::BTreeMap<String, [u64; 3]> = Default::default();
    let mut add = |name: String, [within, over, shadowed]: [u64; 3]| {
        let e = by_rule.entry(name).or_default();
        e[0] += within;
        e[1] += over + shadowed;
        e[2] += shadowed;
    };
    for s in &node.shards {
        for (name, hits) in s.stats.metrics.rules(|n| rules.get(n).is_some()) {
            add(name, hits);
        }
    }
    if let Some(service) = service {
        for (name, hits) in &service.by_rule {
            add(name.clone(), *hits);
        }
    }
    let mut hits = counter(
        "ratelimit_service_rate_limit_total_hits_total",
        "Checks that named a rule (rate limit service: hits of a limit), by rule.",
    );
    let mut over = counter(
        "ratelimit_service_rate_limit_over_limit_total",
        "Checks that named a rule and were over it, by rule; shadow mode's included.",
    );
    let mut within = counter(
        "ratelimit_service_rate_limit_within_limit_total",
        "Checks that named a rule and were allowed, by rule.",
    );
    let mut shadow = counter(
        "ratelimit_service_rate_limit_shadow_mode_total",
        "Checks over a rule in shadow mode, answered allowed, by rule.",
    );
    for (name, [allowed, denied, shadowed]) in &by_rule {
        hits.counter(&[("rule", name)], (allowed + denied) as f64);
        over.counter(&[("rule", name)], *denied as f64);
        within.counter(&[("rule", name)], *allowed as f64);
        shadow.counter(&[("rule", name)], *shadowed as f64);
    }
    out.extend([hits, over, within, shadow]);
}

/// The rate limit service's answers and configuration reloads.
fn service_families(out: &mut Vec<Family>, st: &ServiceStats) {
    let mut answers = counter(
        "bucketd_rls_requests_total",
        "ShouldRateLimit calls of the rate limit service, by overall code (error: refused with a gRPC error).",
    );
    for (i, code) in ["ok", "over_limit"].iter().enumerate() {
        answers.counter(&[("code", code)], st.answers[i] as f64);
    }
    answers.counter(&[("code", "error")], st.errors as f64);
    out.push(answers);
    let mut reloads = counter(
        "bucketd_rls_config_reloads_total",
        "Changes to the rate limit service's configuration files, by result (error: refused, the configuration in force kept).",
    );
    reloads.counter(&[("result", "success")], st.reloads as f64);
    reloads.counter(&[("result", "error")], st.reload_errors as f64);
    out.push(reloads);
}

/// The Raft groups' state here, in cluster mode.
fn raft_families(out: &mut Vec<Family>, node: &Node) {
    let Some(c) = node.cluster() else {
        return;
    };
    let groups = c.group_metrics();
    let mut leader = gauge("bucketd_raft_leader", "1 if this node leads the group.");
    let mut term = gauge("bucketd_raft_term", "The group's current term here.");
    let mut commit = gauge(
        "bucketd_raft_commit_index",
        "The group's last committed log index known here.",
    );
    let mut applied = gauge(
        "bucketd_raft_applied_index",
        "The group's last log index applied here.",
    );
    let mut lag = gauge(
        "bucketd_raft_apply_lag",
        "Committed entries of the group not yet applied here.",
    );
    let mut changes = counter(
        "bucketd_raft_leader_changes_total",
        "Changes of the group's leader seen here.",
    );
    let mut proposals = counter(
        "bucketd_raft_proposals_total",
        "Log entries proposed for the group through this node.",
    );
    for g in &groups {
        let name = if g.meta {
            "meta".to_string()
        } else {
            g.group.to_string()
        };
        let l = [("group", name.as_str())];
        leader.gauge(&l, f64::from(u8::from(g.leader)));
        term.gauge(&l, g.term as f64);
        commit.gauge(&l, g.committed as f64);
        applied.gauge(&l, g.applied as f64);
        lag.gauge(&l, g.committed.saturating_sub(g.applied) as f64);
        changes.counter(&l, g.leader_changes as f64);
        proposals.counter(&l, g.proposals as f64);
    }
    out.extend([leader, term, commit, applied, lag, changes, proposals]);
    let meta = c.metadata();
    let mut moves = gauge(
        "bucketd_cluster_moves_in_progress",
        "Groups whose replicas are being moved to their planned nodes.",
    );
    moves.gauge(&[], meta.moves_in_progress() as f64);
    out.push(moves);
    let mut replicas = gauge(
        "bucketd_cluster_replicas",
        "Group replicas this node holds (the metadata group's included).",
    );
    replicas.gauge(&[], groups.len() as f64);
    out.push(replicas);
}
