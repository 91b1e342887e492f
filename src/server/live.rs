//! The settings that can change while the node runs (CONFIG SET), and CONFIG GET's view of
//! every setting.
//!
//! `Settings` is what the node started with and never changes; `LiveSettings` holds the
//! current value of each run-time setting in an atomic, so the paths that read them (every
//! read of a connection, every accept) pay a relaxed load and never a lock.

use super::Node;
use crate::config::Settings;
use crate::protocol::RequestLimits;
use crate::shutdown::Shutdown;
use crate::store::Caps;
use crate::sync::lock;
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Current values of the settings CONFIG SET can change.
pub struct LiveSettings {
    maxclients: AtomicUsize,
    requirepass: ArcSwapOption<String>,
    proto_max_bulk_len: AtomicUsize,
    client_query_buffer_limit: AtomicUsize,
    /// Bytes, or, when negative, a percentage of `maxmemory` (as Redis stores it).
    maxmemory_clients: AtomicI64,
    /// Seconds a client may stay idle before it is closed (0 = forever).
    timeout_s: AtomicU64,
    /// Fixed at start: named users are configured, so every connection must authenticate
    /// (the default user is disabled unless `requirepass` gives it a password).
    has_users: bool,
    /// Fixed at start: the request parser's other limits.
    max_args: usize,
    max_inline_len: usize,
    /// The key and memory caps every shard's store reads.
    pub caps: Arc<Caps>,
}

impl LiveSettings {
    pub fn new(s: &Settings, caps: Arc<Caps>) -> LiveSettings {
        LiveSettings {
            maxclients: AtomicUsize::new(s.maxclients),
            requirepass: ArcSwapOption::from(s.requirepass.clone().map(Arc::new)),
            proto_max_bulk_len: AtomicUsize::new(s.proto_max_bulk_len),
            client_query_buffer_limit: AtomicUsize::new(s.client_query_buffer_limit),
            maxmemory_clients: AtomicI64::new(
                i64::try_from(s.maxmemory_clients).unwrap_or(i64::MAX),
            ),
            timeout_s: AtomicU64::new(0),
            has_users: !s.users.is_empty(),
            max_args: s.max_args,
            max_inline_len: s.max_inline_len,
            caps,
        }
    }

    pub fn maxclients(&self) -> usize {
        self.maxclients.load(Ordering::Relaxed)
    }

    /// The password clients must give, if one is set.
    pub fn requirepass(&self) -> Option<Arc<String>> {
        self.requirepass.load_full()
    }

    /// True if new connections must authenticate.
    pub fn needs_auth(&self) -> bool {
        self.has_users || self.requirepass.load().is_some()
    }

    pub fn timeout_s(&self) -> u64 {
        self.timeout_s.load(Ordering::Relaxed)
    }

    fn maxmemory_clients_text(&self) -> String {
        match self.maxmemory_clients.load(Ordering::Relaxed) {
            v if v < 0 => format!("{}%", v.unsigned_abs()),
            v => v.to_string(),
        }
    }
}

impl Node {
    /// What a client may make the node hold for one request, as currently set.
    pub fn request_limits(&self) -> RequestLimits {
        let l = &self.live;
        RequestLimits {
            max_bulk_len: l.proto_max_bulk_len.load(Ordering::Relaxed),
            max_args: l.max_args,
            max_inline_len: l.max_inline_len,
            max_request_bytes: l.client_query_buffer_limit.load(Ordering::Relaxed),
        }
    }

    /// Bytes one connection may have received and not yet handled.
    pub fn client_query_buffer_limit(&self) -> usize {
        self.live.client_query_buffer_limit.load(Ordering::Relaxed)
    }

    /// Bytes all connections may hold in buffers together (0 = no cap). A percentage is of
    /// `maxmemory`, and no cap while `maxmemory` is 0, as in Redis.
    pub fn maxmemory_clients(&self) -> usize {
        match self.live.maxmemory_clients.load(Ordering::Relaxed) {
            v if v < 0 => {
                let pct = usize::try_from(v.unsigned_abs()).unwrap_or(100);
                self.live.caps.max_bytes().saturating_mul(pct) / 100
            }
            v => usize::try_from(v).unwrap_or(usize::MAX),
        }
    }
}

/// How CONFIG SET treats a parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Changes at run time.
    Live,
    /// Accepted only with the value bucketd always has (it has no persistence or eviction).
    Fixed,
    /// Needs a restart.
    Immutable,
}

/// Every parameter CONFIG GET knows, by its Redis name.
const PARAMS: &[(&str, Kind)] = &[
    ("bind", Kind::Immutable),
    ("port", Kind::Immutable),
    ("maxclients", Kind::Live),
    ("maxmemory", Kind::Live),
    ("maxmemory-policy", Kind::Fixed),
    ("maxmemory-clients", Kind::Live),
    ("max-keys", Kind::Live),
    ("proto-max-bulk-len", Kind::Live),
    ("client-query-buffer-limit", Kind::Live),
    ("max-args", Kind::Immutable),
    ("max-inline-len", Kind::Immutable),
    ("requirepass", Kind::Live),
    ("timeout", Kind::Live),
    ("databases", Kind::Immutable),
    ("save", Kind::Fixed),
    ("appendonly", Kind::Fixed),
    ("cluster-enabled", Kind::Immutable),
    ("shards", Kind::Immutable),
    ("zset-max-listpack-entries", Kind::Live),
    ("zset-max-listpack-value", Kind::Live),
    ("set-max-intset-entries", Kind::Live),
    ("hash-max-listpack-entries", Kind::Live),
    ("hash-max-listpack-value", Kind::Live),
    ("list-max-listpack-size", Kind::Live),
    ("list-compress-depth", Kind::Live),
];

/// Redis 7.0's older names of the encoding settings, which it still takes.
const ALIASES: &[(&str, &str)] = &[
    ("zset-max-ziplist-entries", "zset-max-listpack-entries"),
    ("zset-max-ziplist-value", "zset-max-listpack-value"),
    ("hash-max-ziplist-entries", "hash-max-listpack-entries"),
    ("hash-max-ziplist-value", "hash-max-listpack-value"),
    ("list-max-ziplist-size", "list-max-listpack-size"),
];

/// The parameter `name` names (in any case), by its own name or an alias.
fn param(name: &[u8]) -> Option<(&'static str, Kind)> {
    let canonical = ALIASES
        .iter()
        .find(|(alias, _)| alias.as_bytes().eq_ignore_ascii_case(name))
        .map_or(name, |(_, to)| to.as_bytes());
    PARAMS
        .iter()
        .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(canonical))
        .copied()
}

fn current(node: &Node, name: &str) -> String {
    let s = &node.settings;
    let l = &node.live;
    match name {
        "bind" => s.bind.clone(),
        "port" => node.addr.port().to_string(),
        "maxclients" => l.maxclients().to_string(),
        "maxmemory" => l.caps.max_bytes().to_string(),
        "maxmemory-policy" => "noeviction".into(),
        "maxmemory-clients" => l.maxmemory_clients_text(),
        "max-keys" => l.caps.max_keys().to_string(),
        "proto-max-bulk-len" => l.proto_max_bulk_len.load(Ordering::Relaxed).to_string(),
        "client-query-buffer-limit" => node.client_query_buffer_limit().to_string(),
        "max-args" => l.max_args.to_string(),
        "max-inline-len" => l.max_inline_len.to_string(),
        "requirepass" => l.requirepass().map(|p| p.to_string()).unwrap_or_default(),
        "timeout" => l.timeout_s().to_string(),
        "databases" => "1".into(),
        "save" => String::new(),
        "appendonly" => "no".into(),
        "cluster-enabled" => if node.cluster().is_some() {
            "yes"
        } else {
            "no"
        }
        .into(),
        "shards" => node.shards.len().to_string(),
        "list-max-listpack-size" => {
            let e = &l.caps.encodings;
            e.list_max_listpack_size.load(Ordering::Relaxed).to_string()
        }
        other => encoding_setting(&l.caps.encodings, other)
            .map(|v| v.load(Ordering::Relaxed).to_string())
            .unwrap_or_default(),
    }
}

/// CONFIG GET: every parameter matching any of `patterns`, as Redis 7.0 answers: a pattern
/// without glob characters is looked up by name and answered under the name as given; a glob
/// (matched ignoring case) answers under the parameters' own names; each parameter once.
pub(crate) fn config_get(node: &Node, patterns: &[Bytes]) -> Vec<(String, String)> {
    let mut found: Vec<(String, &'static str)> = Vec::new();
    let mut add = |shown: String, name: &'static str| {
        if !found.iter().any(|(_, n)| *n == name) {
            found.push((shown, name));
        }
    };
    for p in patterns {
        if !p.iter().any(|b| matches!(b, b'*' | b'?' | b'[')) {
            if let Some((name, _)) = param(p) {
                add(String::from_utf8_lossy(p).into_owned(), name);
            }
            continue;
        }
        for (name, _) in PARAMS {
            if crate::glob::matches_nocase(p, name.as_bytes()) {
                add((*name).to_string(), name);
            }
        }
    }
    found
        .into_iter()
        .map(|(shown, name)| (shown, current(node, name)))
        .collect()
}

/// A validated new value, applied only once every pair of the request has been validated.
enum Change {
    MaxClients(usize),
    MaxMemory(usize),
    MaxMemoryClients(i64),
    MaxKeys(usize),
    ProtoMaxBulkLen(usize),
    QueryBufferLimit(usize),
    RequirePass(Option<String>),
    Timeout(u64),
    /// An encoding threshold (`list-max-listpack-size`, which may be negative, apart).
    Encoding(&'static str, usize),
    ListMaxListpackSize(i64),
    /// The value bucketd already has.
    Same,
}

/// What a successful CONFIG SET changed that the caller must still act on.
pub(crate) struct Applied {
    /// The key or memory cap was switched on or off: the shards must sync with it.
    pub caps_switched: bool,
}

/// Why CONFIG SET changed nothing; its text is Redis 7.0's reply word for word.
#[derive(Debug)]
pub(crate) enum ConfigSetError {
    /// A name that is no setting, as the client spelled it.
    Unknown(String),
    /// A setting that cannot take the value (or cannot be set, or was named twice): the name
    /// and Redis's reason.
    Refused { name: String, why: String },
}

impl std::fmt::Display for ConfigSetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigSetError::Unknown(name) => write!(
                f,
                "ERR Unknown option or number of arguments for CONFIG SET - '{name}'"
            ),
            ConfigSetError::Refused { name, why } => write!(
                f,
                "ERR CONFIG SET failed (possibly related to argument '{name}') - {why}"
            ),
        }
    }
}

/// The error reply's text.
impl From<ConfigSetError> for String {
    fn from(e: ConfigSetError) -> String {
        e.to_string()
    }
}

/// CONFIG SET with one or more `name value` pairs, all or nothing.
pub(crate) fn config_set(node: &Node, pairs: &[(Bytes, Bytes)]) -> Result<Applied, ConfigSetError> {
    let mut chosen: Vec<(&'static str, &Bytes)> = Vec::with_capacity(pairs.len());
    // Redis reports the first unknown, read-only or repeated name, as the client spelled it.
    for (name, value) in pairs {
        let given = String::from_utf8_lossy(name);
        let Some((canonical, kind)) = param(name) else {
            return Err(ConfigSetError::Unknown(given.into_owned()));
        };
        let refuse = |why: &str| ConfigSetError::Refused {
            name: given.to_string(),
            why: why.to_string(),
        };
        if kind == Kind::Immutable {
            return Err(refuse("can't set immutable config"));
        }
        if chosen.iter().any(|(n, _)| *n == canonical) {
            return Err(refuse("duplicate parameter"));
        }
        chosen.push((canonical, value));
    }
    let mut changes = Vec::with_capacity(chosen.len());
    for (name, value) in &chosen {
        let change = parse_value(name, value).map_err(|why| ConfigSetError::Refused {
            name: name.to_string(),
            why,
        })?;
        changes.push(change);
    }
    let l = &node.live;
    let caps_were_on = l.caps.max_keys() > 0 || l.caps.max_bytes() > 0;
    for change in changes {
        match change {
            Change::MaxClients(n) => l.maxclients.store(n, Ordering::Relaxed),
            Change::MaxMemory(n) => l.caps.set_max_bytes(n),
            Change::MaxMemoryClients(v) => l.maxmemory_clients.store(v, Ordering::Relaxed),
            Change::MaxKeys(n) => l.caps.set_max_keys(n),
            Change::ProtoMaxBulkLen(n) => l.proto_max_bulk_len.store(n, Ordering::Relaxed),
            Change::QueryBufferLimit(n) => l.client_query_buffer_limit.store(n, Ordering::Relaxed),
            Change::RequirePass(p) => l.requirepass.store(p.map(Arc::new)),
            Change::Timeout(s) => l.timeout_s.store(s, Ordering::Relaxed),
            Change::Encoding(name, v) => {
                if let Some(a) = encoding_setting(&l.caps.encodings, name) {
                    a.store(v, Ordering::Relaxed);
                }
            }
            Change::ListMaxListpackSize(v) => l
                .caps
                .encodings
                .list_max_listpack_size
                .store(v, Ordering::Relaxed),
            Change::Same => {}
        }
    }
    let caps_are_on = l.caps.max_keys() > 0 || l.caps.max_bytes() > 0;
    Ok(Applied {
        caps_switched: caps_were_on != caps_are_on,
    })
}

/// Parses one value as Redis's config code does for that parameter; the error is the part of
/// Redis's message after the dash.
fn parse_value(name: &str, value: &[u8]) -> Result<Change, String> {
    let text = String::from_utf8_lossy(value);
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    match name {
        "maxclients" => {
            let v = integer(value)?;
            // An unsigned setting: Redis compares the value as unsigned, so -1 is out of range.
            let v = unsigned_in(v as u64, 1, u64::from(u32::MAX))?;
            Ok(Change::MaxClients(usize_of(v)))
        }
        "timeout" => {
            let v = signed_in(integer(value)?, 0, i64::from(i32::MAX))?;
            Ok(Change::Timeout(v.unsigned_abs()))
        }
        "max-keys" => {
            let v = signed_in(integer(value)?, 0, i64::MAX)?;
            Ok(Change::MaxKeys(usize_of(v.unsigned_abs())))
        }
        "maxmemory" => {
            let v = memory(value).ok_or("argument must be a memory value")?;
            Ok(Change::MaxMemory(usize_of(v)))
        }
        "proto-max-bulk-len" | "client-query-buffer-limit" => {
            let v = memory(value).ok_or("argument must be a memory value")?;
            // Signed settings: a value past i64::MAX wraps negative and is out of range.
            let v = signed_in(v as i64, 1024 * 1024, i64::MAX)?;
            let n = usize_of(v.unsigned_abs());
            Ok(if name == "proto-max-bulk-len" {
                Change::ProtoMaxBulkLen(n)
            } else {
                Change::QueryBufferLimit(n)
            })
        }
        "maxmemory-clients" => {
            const WHAT: &str = "argument must be a memory or percent value";
            let v = match memory(value) {
                Some(v) => v as i64,
                None => {
                    let pct = value
                        .strip_suffix(b"%")
                        .filter(|d| !d.is_empty())
                        .and_then(crate::protocol::parse_i64)
                        .filter(|&p| p >= 0)
                        .ok_or(WHAT)?;
                    -pct
                }
            };
            if v < -100 {
                return Err("percentage argument must be less or equal to 100".into());
            }
            Ok(Change::MaxMemoryClients(v))
        }
        "list-max-listpack-size" => {
            let v = signed_in(integer(value)?, i64::from(i32::MIN), i64::from(i32::MAX))?;
            Ok(Change::ListMaxListpackSize(v))
        }
        "list-compress-depth" => {
            let v = signed_in(integer(value)?, 0, i64::from(i32::MAX))?;
            Ok(Change::Encoding(
                "list-compress-depth",
                usize_of(v.unsigned_abs()),
            ))
        }
        "zset-max-listpack-entries"
        | "zset-max-listpack-value"
        | "set-max-intset-entries"
        | "hash-max-listpack-entries"
        | "hash-max-listpack-value" => {
            let v = signed_in(integer(value)?, 0, i64::MAX)?;
            let name = PARAMS
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(n, _)| n);
            Ok(Change::Encoding(name, usize_of(v.unsigned_abs())))
        }
        "requirepass" => Ok(Change::RequirePass(
            (!value.is_empty()).then(|| text.into_owned()),
        )),
        "maxmemory-policy" => {
            const POLICIES: [&str; 8] = [
                "volatile-lru",
                "volatile-lfu",
                "volatile-random",
                "volatile-ttl",
                "allkeys-lru",
                "allkeys-lfu",
                "allkeys-random",
                "noeviction",
            ];
            if !POLICIES.iter().any(|p| p.eq_ignore_ascii_case(&text)) {
                return Err(format!(
                    "argument(s) must be one of the following: {}",
                    POLICIES.join(", ")
                ));
            }
            if !text.eq_ignore_ascii_case("noeviction") {
                return Err("bucketd never evicts keys: only noeviction is supported".into());
            }
            Ok(Change::Same)
        }
        "appendonly" => match text.to_ascii_lowercase().as_str() {
            "no" => Ok(Change::Same),
            "yes" => Err("bucketd keeps no append-only file: only no is supported".into()),
            _ => Err("argument must be 'yes' or 'no'".into()),
        },
        "save" => {
            if text.trim().is_empty() {
                Ok(Change::Same)
            } else {
                Err("bucketd keeps no snapshots: only an empty save is supported".into())
            }
        }
        _ => Err("can't set immutable config".into()),
    }
}

/// A plain integer setting, parsed as Redis's `string2ll` does.
fn integer(value: &[u8]) -> Result<i64, String> {
    crate::protocol::parse_i64(value)
        .ok_or_else(|| "argument couldn't be parsed into an integer".to_string())
}

fn signed_in(v: i64, lo: i64, hi: i64) -> Result<i64, String> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("argument must be between {lo} and {hi} inclusive"))
    }
}

fn unsigned_in(v: u64, lo: u64, hi: u64) -> Result<u64, String> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("argument must be between {lo} and {hi} inclusive"))
    }
}

/// A memory value as Redis's `memtoull` reads it: digits and an optional unit, `b`, `k`
/// (1000), `kb` (1024), `m`, `mb`, `g` or `gb`, in any case. No sign, no fraction; an empty
/// number reads as 0 and an overflowing one as the largest value, as glibc's `strtoull` has it.
pub(crate) fn memory(value: &[u8]) -> Option<u64> {
    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
    let (num, unit) = value.split_at(digits);
    let unit = String::from_utf8_lossy(unit).to_ascii_lowercase();
    let mul: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    let n = num.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    });
    let n = n.unwrap_or(u64::MAX);
    n.checked_mul(mul)
}

/// Closes clients idle for longer than `timeout` seconds (checked once a second, as Redis's
/// client cron does); does nothing while `timeout` is 0.
pub(super) async fn close_idle_clients(node: Arc<Node>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let timeout_ms = node.live.timeout_s().saturating_mul(1000);
                if timeout_ms == 0 {
                    continue;
                }
                let now = node.uptime_ms();
                for c in lock(&node.clients).values() {
                    if now.saturating_sub(c.last_active_ms.load(Ordering::Relaxed)) > timeout_ms {
                        c.kill();
                    }
                }
            }
            _ = shutdown.recv() => break,
        }
    }
}

/// The threshold a CONFIG name sets.
fn encoding_setting<'a>(
    e: &'a crate::store::Encodings,
    name: &str,
) -> Option<&'a std::sync::atomic::AtomicUsize> {
    Some(match name {
        "zset-max-listpack-entries" => &e.zset_max_listpack_entries,
        "zset-max-listpack-value" => &e.zset_max_listpack_value,
        "set-max-intset-entries" => &e.set_max_intset_entries,
        "hash-max-listpack-entries" => &e.hash_max_listpack_entries,
        "hash-max-listpack-value" => &e.hash_max_listpack_value,
        "list-compress-depth" => &e.list_compress_depth,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::memory;

    #[test]
    fn memory_values_as_redis_reads_them() {
        assert_eq!(memory(b"100"), Some(100));
        assert_eq!(memory(b"1k"), Some(1000));
        assert_eq!(memory(b"1KB"), Some(1024));
        assert_eq!(memory(b"64mb"), Some(64 << 20));
        assert_eq!(memory(b"1g"), Some(1_000_000_000));
        assert_eq!(memory(b"1gb"), Some(1 << 30));
        assert_eq!(memory(b"5b"), Some(5));
        assert_eq!(memory(b"kb"), Some(0));
        assert_eq!(memory(b""), Some(0));
        assert_eq!(memory(b"1.5gb"), None);
        assert_eq!(memory(b"-1"), None);
        assert_eq!(memory(b"10%"), None);
        assert_eq!(memory(b"1tb"), None);
        assert_eq!(memory(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(memory(b"20000000000gb"), None);
    }
}
