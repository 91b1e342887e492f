//! The decision engine: one round trip to bucketd for the limits that apply to a request
//! (leased limits first), and the mapping of its answer, or of its failure under the
//! `FailurePolicy`, to a verdict with the figures for the rate-limit headers and `Retry-After`.

use super::config::{FailurePolicy, LeaseOptions, Rule};
use super::local::{self, LocalRule};
use super::shared::Shared;
use super::verdict::{Figures, Verdict};
use crate::client::{Error, Limit};
use http::StatusCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A lease token taken for the request, to give back if another limit refuses it.
struct Taken<'a> {
    slot: Arc<local::LeaseSlot>,
    rule: &'a Rule,
}

/// The rate limits' verdict on a request, given the rules that apply to it.
pub(super) async fn decide(shared: &Shared, limits: &[(&Rule, String)]) -> Verdict {
    if limits.is_empty() {
        return Verdict::Exempt;
    }
    let deadline = shared.client.deadline();
    match tokio::time::timeout(deadline, ask_bucketd(shared, limits)).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => degraded(shared, limits, &e),
        Err(_) => degraded(shared, limits, &Error::Timeout(deadline)),
    }
}

async fn ask_bucketd(shared: &Shared, limits: &[(&Rule, String)]) -> Result<Verdict, Error> {
    let mut taken: Vec<Taken<'_>> = Vec::new();
    let mut deciding: Option<Figures> = None;
    let mut direct: Vec<(&str, Limit)> = Vec::new();
    // Leased limits first: a refusal there costs the others nothing.
    for (rule, key) in limits {
        let Some(lease) = rule.lease else {
            direct.push((key.as_str(), rule.limit));
            continue;
        };
        match take_leased(shared, rule, lease, key).await {
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
        let md = match shared.client.check_all(&direct, 1).await {
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
    shared: &Shared,
    rule: &Rule,
    lease: LeaseOptions,
    key: &str,
) -> Result<Result<(Arc<local::LeaseSlot>, Figures), (Figures, Duration)>, Error> {
    let slot = shared.leases.slot(key);
    if let Some(f) = slot.take(lease.max_hold) {
        shared.metrics.leased.fetch_add(1, Ordering::Relaxed);
        return Ok(Ok((slot, f)));
    }
    // One refill per key at a time; whoever waited may find the pool filled.
    let refilling = slot.refill.lock().await;
    if let Some(f) = slot.take(lease.max_hold) {
        drop(refilling);
        shared.metrics.leased.fetch_add(1, Ordering::Relaxed);
        return Ok(Ok((slot, f)));
    }
    shared.metrics.lease_refills.fetch_add(1, Ordering::Relaxed);
    let l = shared.client.lease(key, &rule.limit, lease.batch).await?;
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

fn degraded(shared: &Shared, limits: &[(&Rule, String)], e: &Error) -> Verdict {
    shared.note_degraded(e);
    let status = match shared.policy {
        FailurePolicy::Open => {
            let local: Vec<(&str, LocalRule)> = limits
                .iter()
                .map(|(r, k)| (k.as_str(), LocalRule::share(&r.limit, shared.gateways)))
                .collect();
            let (allowed, figures, retry_after) = shared.fallback.check_all(&local);
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

fn give_back(taken: &[Taken<'_>]) {
    for t in taken {
        if let Some(l) = t.rule.lease {
            t.slot.give_back(l.batch);
        }
    }
}
