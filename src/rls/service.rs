//! ShouldRateLimit: a request's descriptors, matched against the configuration, decided as one
//! set, and answered the way Envoy reads it.

use super::config::{Decide, Limit, Unit};
use super::{NodeParts, Rls};
use crate::cmd::{LimitReply, Reply};
use crate::limiter::Algorithm;
use crate::server::{Node, SetError, SetLimit, decide_limit_set};
use crate::shard::Verdict;
use crate::shutdown::Shutdown;
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tonic::{Request, Response, Status};

/// Bounds on one request, whatever the message size allows: Envoy sends a handful of
/// descriptors of a few entries each.
const MAX_DESCRIPTORS: usize = 256;
const MAX_ENTRIES: usize = 32;
/// Bytes of keys and values in one request.
const MAX_DESCRIPTOR_BYTES: usize = 64 * 1024;
/// The largest request message accepted, in bytes.
const MAX_MESSAGE: usize = 1024 * 1024;
/// The most requests one connection may have in flight at once.
const MAX_STREAMS: u32 = 1024;

const NS_PER_S: u64 = 1_000_000_000;

struct Service {
    node: Arc<Node>,
    rls: Arc<Rls>,
}

pub(super) async fn serve(
    node: Arc<Node>,
    rls: Arc<Rls>,
    listener: tokio::net::TcpListener,
    mut shutdown: Shutdown,
) {
    let svc =
        RateLimitServiceServer::new(Service { node, rls }).max_decoding_message_size(MAX_MESSAGE);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let res = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS))
        .tcp_nodelay(true)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, async move { shutdown.recv().await })
        .await;
    if let Err(e) = res {
        tracing::warn!("rate limit service stopped: {e}");
    }
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        match self.decide(request.into_inner()).await {
            Ok(r) => {
                let i = usize::from(r.overall_code == Code::OverLimit as i32);
                self.rls.stats.answers[i].fetch_add(1, Ordering::Relaxed);
                Ok(Response::new(r))
            }
            Err(s) => {
                self.rls.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(s)
            }
        }
    }
}

/// One descriptor of a request, once matched.
struct Item {
    limit: Option<Arc<Limit>>,
    stat_key: Option<String>,
    hits: u64,
    /// Its place in the set sent to the shards, for a limit that is counted there.
    in_set: Option<usize>,
}

impl Service {
    async fn decide(&self, req: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        check_bounds(&req)?;
        let (mut items, keys) = self.match_descriptors(&req)?;
        drop_replaced(&mut items);
        let (set, blocked) = limit_set_of(&mut items, keys);
        let now = self.node.now();
        let mut each = if set.is_empty() {
            Vec::new()
        } else {
            self.decide_set(&set, blocked).await?
        };
        each.truncate(set.len());
        Ok(self.answer(&items, &each, now))
    }

    /// Each descriptor with the limit that applies to it (one given in the request, or the
    /// configuration's), and the counter it counts in.
    fn match_descriptors(&self, req: &RateLimitRequest) -> Result<(Vec<Item>, Vec<Bytes>), Status> {
        let config = self.rls.config();
        let hits = u64::from(req.hits_addend.max(1));
        let mut items: Vec<Item> = Vec::with_capacity(req.descriptors.len());
        let mut keys: Vec<Bytes> = Vec::with_capacity(req.descriptors.len());
        for d in &req.descriptors {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let hits = d.hits_addend.map_or(hits, |h| h.value);
            let (limit, stat_key) = match &d.limit {
                Some(o) => {
                    let unit = Unit::from_proto(o.unit).ok_or_else(|| {
                        Status::invalid_argument(format!("limit override with unit {}", o.unit))
                    })?;
                    let key = override_stat_key(&req.domain, &entries);
                    let l = Limit::override_of(key, o.requests_per_unit, unit, Algorithm::Aligned);
                    (Some(Arc::new(l)), None)
                }
                None => match config.find(&req.domain, &entries) {
                    Some(m) => (Some(m.limit), m.stat_key),
                    None => (None, None),
                },
            };
            keys.push(counter_key(&req.domain, &entries));
            items.push(Item {
                limit,
                stat_key,
                hits,
                in_set: None,
            });
        }
        Ok((items, keys))
    }

    /// The set decided in one round to the shards. With a block-listed descriptor the limits
    /// are only read, so nothing is taken, and the request is refused.
    async fn decide_set(&self, set: &[SetLimit], blocked: bool) -> Result<Vec<LimitReply>, Status> {
        match decide_limit_set(&NodeParts(&self.node), set, blocked).await {
            Ok(o) => {
                let mut each = o.each;
                if blocked && o.allowed {
                    // Every limit was read as if taken: report what they hold, untaken.
                    for (r, l) in each.iter_mut().zip(set) {
                        if r[0] == 1 {
                            r[2] = r[2].saturating_add(i64::try_from(l.cost).unwrap_or(0));
                        }
                    }
                }
                Ok(each)
            }
            Err(SetError::Gone) => Err(Status::unavailable("the node is shutting down")),
            Err(SetError::Reply(r)) => Err(status_of(&r)),
        }
    }

    fn answer(&self, items: &[Item], each: &[LimitReply], now: u64) -> RateLimitResponse {
        let mut statuses = Vec::with_capacity(items.len());
        let mut counted: Vec<(&str, Verdict, u64)> = Vec::new();
        let mut over = false;
        for it in items {
            let Some(limit) = &it.limit else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            };
            let current_limit = Some(RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: limit.requests_per_unit,
                unit: limit.unit as i32,
            });
            let window_left = || {
                let unit = limit.unit.seconds() * NS_PER_S;
                unit - now % unit
            };
            let (passes, remaining, reset_ns) = match limit.decide {
                Decide::Unlimited => {
                    statuses.push(DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..Default::default()
                    });
                    continue;
                }
                Decide::Never => (false, 0, window_left()),
                Decide::Rule(rule) => {
                    let r = it
                        .in_set
                        .and_then(|i| each.get(i))
                        .copied()
                        .unwrap_or_default();
                    let reset = if rule.algorithm == Algorithm::Aligned {
                        window_left()
                    } else {
                        u64::try_from(r[4]).unwrap_or(0).saturating_mul(1_000_000)
                    };
                    (r[0] == 1, u64::try_from(r[2]).unwrap_or(0), reset)
                }
            };
            let stat = it.stat_key.as_deref().unwrap_or(&limit.stat_key);
            let code = if passes {
                counted.push((stat, Verdict::Within, it.hits));
                Code::Ok
            } else if limit.shadow {
                counted.push((stat, Verdict::Shadowed, it.hits));
                Code::Ok
            } else {
                counted.push((stat, Verdict::Over, it.hits));
                over = true;
                Code::OverLimit
            };
            // A limit over its figure has nothing left for this request, whatever smaller
            // request would still fit: envoyproxy answers 0, and the headers say it.
            let remaining = if passes { remaining } else { 0 };
            statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit,
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(pb_duration(reset_ns)),
                quota: None,
            });
        }
        self.rls.stats.count(&counted);
        let response_headers_to_add = if self.rls.headers {
            rate_limit_headers(&statuses)
        } else {
            Vec::new()
        };
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        }
    }
}

/// Refuses a request outside the bounds one request may have, before anything is matched.
fn check_bounds(req: &RateLimitRequest) -> Result<(), Status> {
    if req.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "{} descriptors in one request; at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        )));
    }
    let mut bytes = req.domain.len();
    for d in &req.descriptors {
        if d.entries.is_empty() {
            return Err(Status::invalid_argument("a descriptor has no entries"));
        }
        if d.is_negative_hits {
            // Counting it as a positive hit would take what the caller meant to give back.
            return Err(Status::invalid_argument(
                "is_negative_hits is not supported: hits are only ever counted up",
            ));
        }
        if d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "a descriptor has {} entries; at most {MAX_ENTRIES}",
                d.entries.len()
            )));
        }
        bytes += d
            .entries
            .iter()
            .map(|e| e.key.len() + e.value.len())
            .sum::<usize>();
    }
    if bytes > MAX_DESCRIPTOR_BYTES {
        return Err(Status::invalid_argument(format!(
            "descriptors of {bytes} bytes; at most {MAX_DESCRIPTOR_BYTES}"
        )));
    }
    Ok(())
}

/// A limit named in another matched limit's `replaces` is not applied.
fn drop_replaced(items: &mut [Item]) {
    let replaced: Vec<String> = items
        .iter()
        .filter_map(|i| i.limit.as_ref())
        .flat_map(|l| l.replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    for it in items {
        if it
            .limit
            .as_ref()
            .and_then(|l| l.name.as_ref())
            .is_some_and(|n| replaced.contains(n))
        {
            it.limit = None;
        }
    }
}

/// The limits the shards decide, each item told its place in the set, and whether a
/// block-listed descriptor refuses the request. The same counter named twice is one limit,
/// costing both descriptors' hits.
fn limit_set_of(items: &mut [Item], keys: Vec<Bytes>) -> (Vec<SetLimit>, bool) {
    let mut set: Vec<SetLimit> = Vec::new();
    let mut blocked = false;
    for (it, key) in items.iter_mut().zip(keys) {
        let Some(limit) = &it.limit else { continue };
        match limit.decide {
            Decide::Unlimited => {}
            Decide::Never => blocked |= !limit.shadow,
            Decide::Rule(rule) => {
                if let Some(at) = set.iter().position(|s| s.key == key) {
                    set[at].cost += it.hits;
                    it.in_set = Some(at);
                } else {
                    it.in_set = Some(set.len());
                    set.push(SetLimit {
                        key,
                        rule,
                        cost: it.hits,
                        shadow: limit.shadow,
                    });
                }
            }
        }
    }
    (set, blocked)
}

/// The RateLimit-* headers envoyproxy/ratelimit sets, from the limited descriptor with the
/// least remaining (a refusing one before one that passes with nothing left).
fn rate_limit_headers(statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let Some((s, l)) = statuses
        .iter()
        .filter_map(|s| s.current_limit.as_ref().map(|l| (s, l)))
        .min_by_key(|(s, _)| (s.limit_remaining, s.code != Code::OverLimit as i32))
    else {
        return Vec::new();
    };
    let reset = s
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    [
        ("RateLimit-Limit", l.requests_per_unit.to_string()),
        ("RateLimit-Remaining", s.limit_remaining.to_string()),
        ("RateLimit-Reset", reset.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| HeaderValue {
        key: k.to_string(),
        value: v,
        ..Default::default()
    })
    .collect()
}

fn pb_duration(ns: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(ns / NS_PER_S).unwrap_or(i64::MAX),
        nanos: i32::try_from(ns % NS_PER_S).unwrap_or(0),
    }
}

/// The counter a descriptor counts in: its domain and entries, each length-prefixed, so no
/// two descriptors share one.
fn counter_key(domain: &str, entries: &[(&str, &str)]) -> Bytes {
    use std::fmt::Write;
    let mut k = String::with_capacity(
        16 + domain.len()
            + entries
                .iter()
                .map(|(k, v)| 12 + k.len() + v.len())
                .sum::<usize>(),
    );
    let _ = write!(k, "rls:{}:{domain}", domain.len());
    for (key, value) in entries {
        let _ = write!(k, ":{}:{key}:{}:{value}", key.len(), value.len());
    }
    Bytes::from(k)
}

/// The stat key of a limit given in the request, as envoyproxy names it.
fn override_stat_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let path: Vec<String> = entries
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                k.to_string()
            } else {
                format!("{k}_{v}")
            }
        })
        .collect();
    format!("{domain}.{}", path.join("."))
}

/// A shard's or a group's error, as a gRPC status: unavailable for the ones a retry may cure.
fn status_of(r: &Reply) -> Status {
    let text = match r {
        Reply::Error(e) => e.as_ref(),
        _ => "unexpected reply",
    };
    if ["TRYAGAIN", "CLUSTERDOWN", "MOVED"]
        .iter()
        .any(|p| text.starts_with(p))
    {
        Status::unavailable(text.to_string())
    } else {
        Status::internal(text.to_string())
    }
}
