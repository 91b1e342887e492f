//! An async client for bucketd, with typed replies and a deadline on every call.
//!
//! ```no_run
//! use bucketd::client::{Client, Limit};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), bucketd::client::Error> {
//! let client = Client::builder(["redis://127.0.0.1:6379"])
//!     .deadline(Duration::from_millis(5))
//!     .build()?;
//! let d = client.check("user:42", &Limit::per_minute(100), 1).await?;
//! if !d.allowed {
//!     println!("retry in {:?}", d.retry_after);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The client holds one multiplexed connection (or, given several node URLs or
//! [`ClientBuilder::cluster`], one cluster connection) shared by every clone. It connects lazily
//! in the background: building never fails because bucketd is down, and a call made while it is
//! down fails fast with [`Error::Connection`] instead of waiting.

mod conn;
mod limit;

#[cfg(feature = "http")]
pub mod http;

pub use limit::{Algorithm, Limit, ToSpec};

use conn::{Link, Target};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The deadline of a call unless configured otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// No reply within the call's deadline (the connection may be fine, or the node stuck).
    Timeout(Duration),
    /// bucketd could not be reached, or the connection broke.
    Connection(String),
    /// bucketd answered with an error (bad spec, unknown rule, wrong key type...).
    Server(String),
    /// bucketd answered with something this client does not understand.
    Reply(String),
    /// The client was configured wrongly (a URL that does not parse, no node).
    Config(String),
}

impl Error {
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout(_))
    }

    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection(_))
    }

    pub fn is_server(&self) -> bool {
        matches!(self, Error::Server(_))
    }

    fn from_redis(e: &RedisError) -> Error {
        if e.is_timeout() {
            // The connection's own response timeout, set no shorter than a deadline.
            return Error::Timeout(Duration::ZERO);
        }
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            return Error::Connection(e.to_string());
        }
        match e.kind() {
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::BusyLoading,
            ) => Error::Connection(e.to_string()),
            ErrorKind::Server(_) | ErrorKind::Extension => Error::Server(e.to_string()),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => Error::Reply(e.to_string()),
            ErrorKind::InvalidClientConfig => Error::Config(e.to_string()),
            _ => Error::Connection(e.to_string()),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout(d) if d.is_zero() => write!(f, "bucketd did not answer in time"),
            Error::Timeout(d) => write!(f, "bucketd did not answer within {d:?}"),
            Error::Connection(m) => write!(f, "bucketd unreachable: {m}"),
            Error::Server(m) => write!(f, "bucketd error: {m}"),
            Error::Reply(m) => write!(f, "unexpected reply from bucketd: {m}"),
            Error::Config(m) => write!(f, "bad bucketd client configuration: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// One limit's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Capacity: the burst for a token bucket, the limit for windows.
    pub limit: u64,
    /// Units left right after this decision.
    pub remaining: u64,
    /// When a refused request may succeed. `None` when allowed, or when the cost can never fit.
    pub retry_after: Option<Duration>,
    /// When the limiter is back to full capacity.
    pub reset_after: Duration,
}

/// The verdict on several limits checked together, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiDecision {
    /// The deciding limit: the one with the least remaining when allowed; when refused, the
    /// refusing limit with the longest wait. `summary.allowed` is the verdict for all.
    pub summary: Decision,
    /// One decision per limit, in the order given.
    pub each: Vec<Decision>,
}

/// What [`Client::lease`] took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Units granted, from 0 up to the number asked for; they are already counted by bucketd.
    pub granted: u64,
    pub limit: u64,
    pub remaining: u64,
    /// When at least one unit will be available again, if none were granted.
    pub retry_after: Option<Duration>,
    pub reset_after: Duration,
}

/// A slot of a concurrency limit, taken by [`Client::acquire`]. Give it back with
/// [`Client::release`]; one never given back frees itself when its ttl runs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    key: Vec<u8>,
    token: String,
}

impl Permit {
    /// The limit's key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// What bucketd handed out for this slot (opaque).
    pub fn token(&self) -> &str {
        &self.token
    }
}

/// What [`Client::acquire`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The slot taken; `None` when all `limit` slots were held.
    pub permit: Option<Permit>,
    /// Slots held right after this call.
    pub in_flight: u64,
    pub limit: u64,
    /// When refused: how long until the holders' ttls alone free a slot. A holder that
    /// releases frees one sooner, so this is the longest a caller could have to wait.
    pub retry_after: Option<Duration>,
}

impl Acquired {
    pub fn allowed(&self) -> bool {
        self.permit.is_some()
    }
}

/// How to build a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    nodes: Vec<String>,
    cluster: bool,
    deadline: Duration,
    connect_timeout: Duration,
    reconnect_backoff: Duration,
    #[cfg(feature = "client-tls")]
    tls: Option<TlsFiles>,
}

/// PEM bytes for a TLS connection to bucketd's `--tls-port` (feature `client-tls`).
#[cfg(feature = "client-tls")]
#[derive(Clone)]
pub struct TlsFiles {
    /// The CA that signed the nodes' certificates.
    pub ca: Vec<u8>,
    /// This client's certificate and key, for nodes that ask for one (`tls-auth-clients`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "client-tls")]
impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("client", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "client-tls")]
impl TlsFiles {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: Some(self.ca.clone()),
        }
    }
}

impl ClientBuilder {
    /// Connects over TLS (give `rediss://` URLs), trusting `files.ca` and presenting
    /// `files.client` when set. Uses rustls on ring.
    #[cfg(feature = "client-tls")]
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Every call's deadline, from sending to a parsed reply (default 5 ms). Waiting for a
    /// connection counts too.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// How long one connection attempt may take (default 1 s). It runs in the background, so a
    /// call never waits longer than its deadline for it.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// After a failed connection attempt, calls fail at once for this long before the next
    /// attempt (default 250 ms).
    pub fn reconnect_backoff(mut self, backoff: Duration) -> Self {
        self.reconnect_backoff = backoff;
        self
    }

    /// Talks to a Redis-cluster-protocol deployment: the URLs are seed nodes and each command
    /// goes to the node owning its key's slot. On by default when several URLs are given.
    /// [`Client::check_all`] then needs every key in one slot (use a `{hash tag}`).
    pub fn cluster(mut self, cluster: bool) -> Self {
        self.cluster = cluster;
        self
    }

    /// Builds the client without connecting; see [`ClientBuilder::connect`] to find out now
    /// whether bucketd is there.
    pub fn build(self) -> Result<Client, Error> {
        let response_timeout = self.connect_timeout.max(self.deadline);
        let target = match self.nodes.as_slice() {
            [] => return Err(Error::Config("no bucketd node URL given".into())),
            [one] if !self.cluster => Target::Single(Box::new(
                self.single_client(one)
                    .map_err(|e| Error::Config(format!("{one}: {e}")))?,
            )),
            nodes => {
                let builder =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(self.connect_timeout)
                        .response_timeout(response_timeout);
                #[cfg(feature = "client-tls")]
                let builder = match &self.tls {
                    Some(files) => {
                        let _ = rustls::crypto::ring::default_provider().install_default();
                        builder.certs(files.certificates())
                    }
                    None => builder,
                };
                Target::Cluster(Box::new(
                    builder.build().map_err(|e| Error::Config(e.to_string()))?,
                ))
            }
        };
        Ok(Client {
            link: Arc::new(Link::new(
                target,
                self.connect_timeout,
                response_timeout,
                self.reconnect_backoff,
            )),
            deadline: self.deadline,
        })
    }

    fn single_client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "client-tls")]
        if let Some(files) = &self.tls {
            // The redis crate asks rustls for the process's default provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            return redis::Client::build_with_tls(url, files.certificates());
        }
        redis::Client::open(url)
    }

    /// Builds the client and waits (up to the connect timeout) for its first connection.
    pub async fn connect(self) -> Result<Client, Error> {
        let timeout = self.connect_timeout;
        let client = self.build()?;
        client.with_deadline(timeout).ping().await?;
        Ok(client)
    }
}

/// A bucketd client; clones share one connection.
#[derive(Clone)]
pub struct Client {
    link: Arc<Link>,
    deadline: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("cluster", &self.link.is_cluster())
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Client {
    /// A builder for the given node URLs (`redis://host:port`, `redis://:password@host:port`);
    /// one URL is a single node, several are cluster seeds.
    pub fn builder<I, S>(nodes: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        ClientBuilder {
            cluster: nodes.len() > 1,
            nodes,
            deadline: DEFAULT_DEADLINE,
            connect_timeout: Duration::from_secs(1),
            reconnect_backoff: Duration::from_millis(250),
            #[cfg(feature = "client-tls")]
            tls: None,
        }
    }

    /// A client for one node with the default settings, connecting lazily.
    pub fn new(url: &str) -> Result<Client, Error> {
        Client::builder([url]).build()
    }

    /// The deadline of each call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The same client (same connection) with another deadline.
    pub fn with_deadline(&self, deadline: Duration) -> Client {
        Client {
            link: self.link.clone(),
            deadline,
        }
    }

    /// Round trip with PING, connecting first if needed.
    pub async fn ping(&self) -> Result<(), Error> {
        match self.call(redis::cmd("PING"), None).await? {
            Value::SimpleString(_) | Value::Okay | Value::BulkString(_) => Ok(()),
            other => Err(Error::Reply(format!("PING answered {other:?}"))),
        }
    }

    /// `BK.CHECK`: takes `cost` units from `key` under `spec` if they fit.
    pub async fn check<S: ToSpec + ?Sized>(
        &self,
        key: impl AsRef<[u8]>,
        spec: &S,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.check_one(key.as_ref(), spec, cost, false).await
    }

    /// `BK.CHECK ... PEEK`: whether one unit would fit, taking nothing. The figures are
    /// those the check would give, so `remaining` counts that unit as taken; a
    /// [`check`](Client::check) of cost 0 reports the units left as they are.
    pub async fn peek<S: ToSpec + ?Sized>(
        &self,
        key: impl AsRef<[u8]>,
        spec: &S,
    ) -> Result<Decision, Error> {
        self.check_one(key.as_ref(), spec, 1, true).await
    }

    async fn check_one<S: ToSpec + ?Sized>(
        &self,
        key: &[u8],
        spec: &S,
        cost: u64,
        peek: bool,
    ) -> Result<Decision, Error> {
        let mut cmd = redis::cmd("BK.CHECK");
        cmd.arg(key)
            .arg(spec.to_spec().as_ref())
            .arg("COST")
            .arg(cost);
        if peek {
            cmd.arg("PEEK");
        }
        let v = self.call(cmd, None).await?;
        decision(&ints(&v, 5, "BK.CHECK")?)
    }

    /// `BK.CHECKALL`: takes `cost` units from every `(key, spec)` pair, or from none of them if
    /// any refuses. In cluster mode every key must hash to one slot.
    pub async fn check_all<K, S>(
        &self,
        limits: &[(K, S)],
        cost: u64,
    ) -> Result<MultiDecision, Error>
    where
        K: AsRef<[u8]>,
        S: ToSpec,
    {
        self.check_many(limits, cost, false).await
    }

    /// `BK.CHECKALL ... PEEK`: whether `cost` units would fit in all of them, taking nothing
    /// (the figures count them as taken).
    pub async fn peek_all<K, S>(&self, limits: &[(K, S)], cost: u64) -> Result<MultiDecision, Error>
    where
        K: AsRef<[u8]>,
        S: ToSpec,
    {
        self.check_many(limits, cost, true).await
    }

    async fn check_many<K, S>(
        &self,
        limits: &[(K, S)],
        cost: u64,
        peek: bool,
    ) -> Result<MultiDecision, Error>
    where
        K: AsRef<[u8]>,
        S: ToSpec,
    {
        let Some((first, _)) = limits.first() else {
            return Err(Error::Config("check_all needs at least one limit".into()));
        };
        let mut cmd = redis::cmd("BK.CHECKALL");
        cmd.arg(limits.len());
        for (k, _) in limits {
            cmd.arg(k.as_ref());
        }
        for (_, s) in limits {
            cmd.arg(s.to_spec().as_ref());
        }
        cmd.arg("COST").arg(cost);
        if peek {
            cmd.arg("PEEK");
        }
        let slot = crate::slot::key_slot(first.as_ref());
        let v = self.call(cmd, Some(slot)).await?;
        let Value::Array(items) = v else {
            return Err(Error::Reply(format!("BK.CHECKALL answered {v:?}")));
        };
        if items.len() != 6 {
            return Err(Error::Reply(format!(
                "BK.CHECKALL answered {} items instead of 6",
                items.len()
            )));
        }
        let mut summary = [0i64; 5];
        for (slot, item) in summary.iter_mut().zip(&items) {
            *slot = int(item, "BK.CHECKALL")?;
        }
        let Some(Value::Array(per)) = items.get(5) else {
            return Err(Error::Reply("BK.CHECKALL: no per-limit array".into()));
        };
        if per.len() != limits.len() {
            return Err(Error::Reply(format!(
                "BK.CHECKALL answered for {} limits instead of {}",
                per.len(),
                limits.len()
            )));
        }
        let each = per
            .iter()
            .map(|p| decision(&ints(p, 5, "BK.CHECKALL")?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MultiDecision {
            summary: decision(&summary)?,
            each,
        })
    }

    /// `BK.LEASE`: takes up to `n` units at once, as many as are available now.
    pub async fn lease<S: ToSpec + ?Sized>(
        &self,
        key: impl AsRef<[u8]>,
        spec: &S,
        n: u64,
    ) -> Result<Lease, Error> {
        let mut cmd = redis::cmd("BK.LEASE");
        cmd.arg(key.as_ref()).arg(spec.to_spec().as_ref()).arg(n);
        let f = ints(&self.call(cmd, None).await?, 5, "BK.LEASE")?;
        Ok(Lease {
            granted: non_negative(f[0]),
            limit: non_negative(f[1]),
            remaining: non_negative(f[2]),
            retry_after: millis(f[3]),
            reset_after: millis(f[4]).unwrap_or_default(),
        })
    }

    /// `BK.RESET`: forgets the given limiter keys; returns how many existed.
    pub async fn reset<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<u64, Error> {
        if keys.is_empty() {
            return Ok(0);
        }
        // One command per slot in cluster mode; a single node takes them all at once.
        let mut groups: Vec<(Option<u16>, Vec<&[u8]>)> = Vec::new();
        for k in keys {
            let k = k.as_ref();
            let slot = self.link.is_cluster().then(|| crate::slot::key_slot(k));
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(k),
                None => groups.push((slot, vec![k])),
            }
        }
        let mut total = 0;
        for (slot, group) in groups {
            let mut cmd = redis::cmd("BK.RESET");
            for k in group {
                cmd.arg(k);
            }
            total += non_negative(int(&self.call(cmd, slot).await?, "BK.RESET")?);
        }
        Ok(total)
    }

    /// `BK.ACQUIRE`: takes one of at most `limit` in-flight slots on `key`, held until
    /// released or for `ttl` at most (sent in milliseconds when it is whole milliseconds,
    /// else in nanoseconds).
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        limit: u64,
        ttl: Duration,
    ) -> Result<Acquired, Error> {
        let key = key.as_ref();
        let mut cmd = redis::cmd("BK.ACQUIRE");
        cmd.arg(key).arg(limit).arg(ttl_arg(ttl));
        let v = self.call(cmd, None).await?;
        let bad = || Error::Reply(format!("BK.ACQUIRE: expected 5 fields, got {v:?}"));
        let Value::Array(f) = &v else {
            return Err(bad());
        };
        let [allowed, token, in_flight, limit, retry] = f.as_slice() else {
            return Err(bad());
        };
        let permit = match (int(allowed, "BK.ACQUIRE")?, token) {
            (1, Value::BulkString(t)) => Some(Permit {
                key: key.to_vec(),
                token: String::from_utf8(t.clone()).map_err(|_| bad())?,
            }),
            (0, Value::Nil) => None,
            _ => return Err(bad()),
        };
        Ok(Acquired {
            retry_after: match permit {
                Some(_) => None,
                None => millis(int(retry, "BK.ACQUIRE")?),
            },
            permit,
            in_flight: non_negative(int(in_flight, "BK.ACQUIRE")?),
            limit: non_negative(int(limit, "BK.ACQUIRE")?),
        })
    }

    /// `BK.RELEASE`: gives a slot back; false if it was no longer held (released before, or
    /// its ttl ran out).
    pub async fn release(&self, permit: &Permit) -> Result<bool, Error> {
        let mut cmd = redis::cmd("BK.RELEASE");
        cmd.arg(permit.key()).arg(permit.token());
        Ok(int(&self.call(cmd, None).await?, "BK.RELEASE")? == 1)
    }

    /// `BK.INFLIGHT`: how many slots of a concurrency limit are held now.
    pub async fn in_flight(&self, key: impl AsRef<[u8]>) -> Result<u64, Error> {
        let mut cmd = redis::cmd("BK.INFLIGHT");
        cmd.arg(key.as_ref());
        Ok(non_negative(int(
            &self.call(cmd, None).await?,
            "BK.INFLIGHT",
        )?))
    }

    /// `CL.THROTTLE` (redis-cell): `count` per `period_secs` with `max_burst` extra, taking
    /// `quantity`. `limit` is `max_burst + 1`; times are whole seconds, as the command gives them.
    pub async fn throttle(
        &self,
        key: impl AsRef<[u8]>,
        max_burst: u64,
        count: u64,
        period_secs: u64,
        quantity: u64,
    ) -> Result<Decision, Error> {
        let mut cmd = redis::cmd("CL.THROTTLE");
        cmd.arg(key.as_ref())
            .arg(max_burst)
            .arg(count)
            .arg(period_secs)
            .arg(quantity);
        let f = ints(&self.call(cmd, None).await?, 5, "CL.THROTTLE")?;
        let secs = |v: i64| u64::try_from(v).ok().map(Duration::from_secs);
        Ok(Decision {
            allowed: f[0] == 0,
            limit: non_negative(f[1]),
            remaining: non_negative(f[2]),
            retry_after: secs(f[3]),
            reset_after: secs(f[4]).unwrap_or_default(),
        })
    }

    async fn call(&self, cmd: redis::Cmd, slot: Option<u16>) -> Result<Value, Error> {
        match tokio::time::timeout(self.deadline, self.link.call(cmd, slot)).await {
            Ok(Err(Error::Timeout(_))) | Err(_) => Err(Error::Timeout(self.deadline)),
            Ok(r) => r,
        }
    }
}

fn int(v: &Value, what: &str) -> Result<i64, Error> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(Error::Reply(format!(
            "{what}: expected an integer, got {other:?}"
        ))),
    }
}

fn ints(v: &Value, n: usize, what: &str) -> Result<Vec<i64>, Error> {
    match v {
        Value::Array(items) if items.len() == n => items.iter().map(|i| int(i, what)).collect(),
        other => Err(Error::Reply(format!(
            "{what}: expected {n} integers, got {other:?}"
        ))),
    }
}

fn non_negative(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Milliseconds; negative means "none".
fn millis(v: i64) -> Option<Duration> {
    u64::try_from(v).ok().map(Duration::from_millis)
}

/// A ttl as BK.ACQUIRE takes it: whole milliseconds as a bare number, anything finer in ns.
fn ttl_arg(ttl: Duration) -> String {
    let ns = ttl.as_nanos();
    if ns.is_multiple_of(1_000_000) {
        (ns / 1_000_000).to_string()
    } else {
        format!("{ns}ns")
    }
}

fn decision(f: &[i64]) -> Result<Decision, Error> {
    let [allowed, limit, remaining, retry, reset] = f else {
        return Err(Error::Reply(format!(
            "expected 5 integers, got {}",
            f.len()
        )));
    };
    let allowed = *allowed == 1;
    Ok(Decision {
        allowed,
        limit: non_negative(*limit),
        remaining: non_negative(*remaining),
        retry_after: if allowed { None } else { millis(*retry) },
        reset_after: millis(*reset).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_from_wire_figures() {
        let d = decision(&[1, 10, 9, -1, 6000]).unwrap();
        assert_eq!(
            d,
            Decision {
                allowed: true,
                limit: 10,
                remaining: 9,
                retry_after: None,
                reset_after: Duration::from_secs(6),
            }
        );
        let d = decision(&[0, 10, 0, 1500, 60000]).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(1500)));
        // Refused and never fits.
        assert_eq!(decision(&[0, 10, 0, -1, 0]).unwrap().retry_after, None);
        assert!(decision(&[1, 2, 3]).is_err());
    }

    #[test]
    fn reply_shapes_are_checked() {
        let five = Value::Array((0..5).map(Value::Int).collect());
        assert_eq!(ints(&five, 5, "x").unwrap(), vec![0, 1, 2, 3, 4]);
        assert!(ints(&five, 6, "x").unwrap_err().to_string().contains("6"));
        let bad = Value::Array(vec![Value::Nil; 5]);
        assert!(matches!(ints(&bad, 5, "x"), Err(Error::Reply(_))));
    }

    #[test]
    fn ttls_are_sent_exactly() {
        assert_eq!(ttl_arg(Duration::from_secs(30)), "30000");
        assert_eq!(ttl_arg(Duration::from_millis(1)), "1");
        assert_eq!(ttl_arg(Duration::from_micros(1500)), "1500000ns");
        assert_eq!(ttl_arg(Duration::ZERO), "0");
    }

    #[test]
    fn builder_rejects_bad_urls() {
        assert!(matches!(
            Client::builder(Vec::<String>::new()).build(),
            Err(Error::Config(_))
        ));
        assert!(matches!(Client::new("not a url"), Err(Error::Config(_))));
        let c = Client::new("redis://127.0.0.1:1").unwrap();
        assert_eq!(c.deadline(), DEFAULT_DEADLINE);
        assert_eq!(
            c.with_deadline(Duration::from_secs(1)).deadline(),
            Duration::from_secs(1)
        );
    }
}
