//! A verdict on a request and the figures that go into its rate-limit headers.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use std::time::Duration;

pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The figures that go into the rate-limit headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset: Duration,
}

impl Figures {
    pub(super) fn from_decision(d: &crate::client::Decision) -> Figures {
        Figures {
            limit: d.limit,
            remaining: d.remaining,
            reset: d.reset_after,
        }
    }

    pub(super) fn write(&self, h: &mut HeaderMap) {
        h.insert(X_RATELIMIT_LIMIT, HeaderValue::from(self.limit));
        h.insert(X_RATELIMIT_REMAINING, HeaderValue::from(self.remaining));
        h.insert(X_RATELIMIT_RESET, HeaderValue::from(ceil_secs(self.reset)));
    }
}

pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub(super) enum Verdict {
    Exempt,
    Allow(Figures),
    Refuse {
        status: StatusCode,
        figures: Figures,
        retry_after: Duration,
    },
}
