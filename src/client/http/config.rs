//! The layer's configuration: the rules a request is checked against (`Rule`, `Scope`), what to
//! do when bucketd fails (`FailurePolicy`), and the builder that gathers them into a
//! [`RateLimitLayer`].

use crate::client::Limit;
use http::request::Parts;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub(super) type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
type Filter = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// What a rule's limit key is made of, besides the rule's name.
///
/// Keys are `PREFIX:RULE:{CALLER}` (`Client`), `PREFIX:RULE:{CALLER}:METHOD ROUTE`
/// (`ClientRoute`), `PREFIX:RULE:METHOD ROUTE` (`Route`) and `PREFIX:RULE` (`Global`). The
/// caller is the hash tag, so a caller's keys live in one slot: on a bucketd cluster, the
/// non-leased rules of one request should be `Client`/`ClientRoute` ones, or a single
/// `Route`/`Global` rule, since one `BK.CHECKALL` cannot span slots there. The route is axum's
/// matched path (`/items/{id}`) when the layer runs inside a `Router`, else the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scope {
    /// One limit per caller (the key function's result), across routes.
    #[default]
    Client,
    /// One limit per caller and route (method and matched path).
    ClientRoute,
    /// One limit per route, shared by every caller.
    Route,
    /// One limit shared by every request the rule applies to.
    Global,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct LeaseOptions {
    pub(super) batch: u64,
    pub(super) max_hold: Duration,
}

/// One limit a request must fit in. Several rules are checked together, all or nothing, in
/// one round trip.
#[derive(Clone)]
pub struct Rule {
    pub(super) name: String,
    pub(super) limit: Limit,
    pub(super) scope: Scope,
    filter: Option<Filter>,
    pub(super) lease: Option<LeaseOptions>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("limit", &self.limit.to_string())
            .field("scope", &self.scope)
            .field("filtered", &self.filter.is_some())
            .field("lease", &self.lease)
            .finish()
    }
}

impl Rule {
    /// A rule per caller ([`Scope::Client`]) applying to every request. The name goes into
    /// the limit key, so two rules need two names.
    pub fn new(name: impl Into<String>, limit: Limit) -> Rule {
        Rule {
            name: name.into(),
            limit,
            scope: Scope::Client,
            filter: None,
            lease: None,
        }
    }

    pub fn scope(mut self, scope: Scope) -> Rule {
        self.scope = scope;
        self
    }

    /// Applies the rule only to requests for which `f` is true.
    pub fn when(mut self, f: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Rule {
        self.filter = Some(Arc::new(f));
        self
    }

    /// Applies the rule only to paths starting with `prefix`.
    pub fn path_prefix(self, prefix: impl Into<String>) -> Rule {
        let prefix = prefix.into();
        self.when(move |p| p.uri.path().starts_with(&prefix))
    }

    /// Takes tokens from bucketd `batch` at a time and spends them locally (see the module
    /// documentation for the over-admission this allows). A batch of 0 or 1 turns leasing off.
    pub fn lease(mut self, batch: u64) -> Rule {
        self.lease = (batch > 1).then_some(LeaseOptions {
            batch,
            max_hold: self.lease.map_or(Duration::from_secs(1), |l| l.max_hold),
        });
        self
    }

    /// How long leased tokens stay usable (default 1 s); older ones are dropped unspent.
    pub fn lease_max_hold(mut self, max_hold: Duration) -> Rule {
        if let Some(l) = &mut self.lease {
            l.max_hold = max_hold;
        }
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    pub(super) fn applies(&self, parts: &Parts) -> bool {
        self.filter.as_ref().is_none_or(|f| f(parts))
    }
}

/// What the layer does when bucketd times out, cannot be reached, or answers with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Decide locally with this gateway's share of each limit (the default).
    #[default]
    Open,
    /// Refuse with `503 Service Unavailable`.
    Closed,
    /// Refuse with `429 Too Many Requests`.
    ClosedTooManyRequests,
}
