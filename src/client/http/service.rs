//! The service the layer wraps around another: a request's verdict, its in-flight slot, and
//! the response it gets, refused or served.

use super::decide::decide;
use super::in_flight::Slot;
use super::shared::Shared;
use super::verdict::{Figures, Verdict};
use http::StatusCode;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use tower::Service;

/// The service the layer wraps around another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> RateLimit<S> {
        RateLimit { inner, shared }
    }
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
            let figures = match decide(&shared, &limits.rules).await {
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
