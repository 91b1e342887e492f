//! Shared helpers for the integration tests: an in-process node on a manual clock, clients
//! (the `redis` crate and raw TCP with a small RESP reader), and bounded waiting.
#![allow(dead_code)]

pub mod bucketd_process;
pub mod real_redis;
pub mod scrape;
pub mod tools;

use bucketd::clock::ManualClock;
use bucketd::config::Settings;
use bucketd::server::NodeHandle;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where every test node's clock starts: 2023-11-14T22:13:20Z, in nanoseconds.
pub const START_NS: u64 = 1_700_000_000_000_000_000;

/// How long a single reply may take before a test fails instead of hanging.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest any one test may run.
pub const TEST_DEADLINE: Duration = Duration::from_secs(120);

/// Runs a test body with a deadline, so a hang fails the test instead of the whole run.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    match tokio::time::timeout(TEST_DEADLINE, f).await {
        Ok(v) => v,
        Err(_) => panic!("test did not finish within {TEST_DEADLINE:?}"),
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

static NEXT_PORT: AtomicU32 = AtomicU32::new(0);

/// A port nothing listens on, for a server that binds it a moment later. Ports come from
/// below the kernel's ephemeral range (32768 and up by default), so no client socket's local
/// port, and no listener on port 0 (a test node's client port), can take it in between or
/// when a node binds it again after a restart; each test process starts at its own offset,
/// and within one no port is handed out twice in a row.
pub fn free_port() -> u16 {
    const LO: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let base = (std::process::id() % 48) * 250;
    for _ in 0..SPAN {
        let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
        let port = (LO + (base + n) % SPAN) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) {
            return port;
        }
    }
    panic!("no free port between {LO} and {}", LO + SPAN);
}

/// A node running in this process on a `ManualClock`.
pub struct TestNode {
    pub addr: SocketAddr,
    pub clock: Arc<ManualClock>,
    pub handle: Option<NodeHandle>,
}

/// Settings for a test node: an ephemeral port and two shards.
pub fn test_settings() -> Settings {
    Settings {
        bind: "127.0.0.1".into(),
        port: 0,
        shards: 2,
        ..Settings::default()
    }
}

impl TestNode {
    /// A node with the default test settings.
    pub async fn start() -> TestNode {
        TestNode::start_with(|_| {}).await
    }

    /// A node with the test settings changed by `f`.
    pub async fn start_with(f: impl FnOnce(&mut Settings)) -> TestNode {
        TestNode::try_start_with(f).await.expect("node starts")
    }

    /// A node with the test settings changed by `f`, or why it did not start.
    pub async fn try_start_with(
        f: impl FnOnce(&mut Settings),
    ) -> Result<TestNode, bucketd::error::StartError> {
        let mut s = test_settings();
        f(&mut s);
        let clock = ManualClock::new(START_NS);
        let handle = bucketd::start(s, clock.clone()).await?;
        Ok(TestNode {
            addr: handle.addr,
            clock,
            handle: Some(handle),
        })
    }

    /// A node that listens on a fixed port as well as its client port: `f` puts the port it is
    /// given in the settings. `free_port` only saw the port free a moment before; when another
    /// process takes it in between, the node starts again on another one.
    pub async fn start_on_free_port(f: impl Fn(&mut Settings, u16)) -> (TestNode, u16) {
        const TRIES: usize = 5;
        for _ in 1..TRIES {
            let port = free_port();
            match TestNode::try_start_with(|s| f(s, port)).await {
                Ok(node) => return (node, port),
                Err(bucketd::error::StartError::Listen { error, .. })
                    if error.kind() == std::io::ErrorKind::AddrInUse => {}
                Err(e) => panic!("node starts: {e:?}"),
            }
        }
        let port = free_port();
        (TestNode::start_with(|s| f(s, port)).await, port)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn redis_url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// A RESP2 connection through the `redis` crate.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        connect_url(&self.redis_url()).await
    }

    /// A RESP3 connection through the `redis` crate.
    pub async fn conn_resp3(&self) -> redis::aio::MultiplexedConnection {
        connect_url(&format!("{}?protocol=resp3", self.redis_url())).await
    }

    /// A raw TCP connection.
    pub async fn raw(&self) -> Raw {
        Raw::connect(self.addr).await
    }

    /// Moves the node's clock forward.
    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance_ms(ms);
    }

    /// Stops the node and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(10), h.shutdown())
                .await
                .expect("node shuts down within 10s");
        }
    }
}

pub async fn connect_url(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("valid url");
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REPLY_TIMEOUT))
        .set_response_timeout(Some(REPLY_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .expect("redis connection")
}

/// Runs a command through the `redis` crate and returns the raw value or the error text.
pub async fn run(
    con: &mut impl redis::aio::ConnectionLike,
    args: &[&str],
) -> Result<redis::Value, String> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async::<redis::Value>(con)
        .await
        .map_err(|e| err_text(&e))
}

/// Runs a command that must succeed and converts its reply.
pub async fn q<T: redis::FromRedisValue>(
    con: &mut impl redis::aio::ConnectionLike,
    args: &[&str],
) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    match c.query_async::<T>(con).await {
        Ok(v) => v,
        Err(e) => panic!("{args:?} failed: {}", err_text(&e)),
    }
}

/// Runs a command that must fail and returns the whole error line (code and message).
pub async fn q_err(con: &mut impl redis::aio::ConnectionLike, args: &[&str]) -> String {
    match run(con, args).await {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => e,
    }
}

/// The server's error line as it was sent, e.g. `ERR syntax error`.
pub fn err_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// Redis's error texts that the reply-shape tests expect.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const NOT_INT: &str = "ERR value is not an integer or out of range";
pub const SYNTAX: &str = "ERR syntax error";

/// Redis's wrong-arity error for `cmd`.
pub fn arity(cmd: &str) -> String {
    format!("ERR wrong number of arguments for '{cmd}' command")
}

/// A bulk-string value as the `redis` crate decodes it.
pub fn bulk(s: &str) -> redis::Value {
    redis::Value::BulkString(s.as_bytes().to_vec())
}

/// Five integers of a limit reply.
pub async fn limit(con: &mut impl redis::aio::ConnectionLike, args: &[&str]) -> [i64; 5] {
    let v: Vec<i64> = q(con, args).await;
    v.try_into()
        .unwrap_or_else(|v: Vec<i64>| panic!("{args:?}: expected 5 integers, got {v:?}"))
}

/// `BK.CHECK key spec`: consumes one unit and returns the limit reply.
pub async fn check(c: &mut impl redis::aio::ConnectionLike, key: &str, spec: &str) -> [i64; 5] {
    limit(c, &["BK.CHECK", key, spec]).await
}

/// The current figures of a limit, without consuming (COST 0).
pub async fn figures(c: &mut impl redis::aio::ConnectionLike, key: &str, spec: &str) -> [i64; 5] {
    limit(c, &["BK.CHECK", key, spec, "COST", "0"]).await
}

pub async fn exists(c: &mut impl redis::aio::ConnectionLike, key: &str) -> bool {
    q::<i64>(c, &["EXISTS", key]).await == 1
}

/// Decodes a BK.CHECKALL reply into its summary and per-limit entries.
pub async fn checkall(
    c: &mut impl redis::aio::ConnectionLike,
    args: &[&str],
) -> ([i64; 5], Vec<[i64; 5]>) {
    let (a, b, c1, d, e, each): (i64, i64, i64, i64, i64, Vec<Vec<i64>>) = q(c, args).await;
    let each = each
        .into_iter()
        .map(|v| <[i64; 5]>::try_from(v).expect("5 integers per limit"))
        .collect();
    ([a, b, c1, d, e], each)
}

/// A decoded RESP2/RESP3 value, as raw tests see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// `$-1`
    NilBulk,
    /// `*-1`
    NilArray,
    /// RESP3 `_`
    Null,
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    Set(Vec<Resp>),
    Verbatim(String, String),
    Bool(bool),
    Double(String),
    BigNumber(String),
    Push(Vec<Resp>),
}

impl Resp {
    pub fn bulk(s: &str) -> Resp {
        Resp::Bulk(s.as_bytes().to_vec())
    }

    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(v) => *v,
            other => panic!("expected an integer, got {other:?}"),
        }
    }

    pub fn as_array(&self) -> &[Resp] {
        match self {
            Resp::Array(v) | Resp::Set(v) | Resp::Push(v) => v,
            other => panic!("expected an array, got {other:?}"),
        }
    }

    pub fn as_text(&self) -> String {
        match self {
            Resp::Simple(s) | Resp::Error(s) => s.clone(),
            Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Resp::Verbatim(_, t) => t.clone(),
            other => panic!("expected text, got {other:?}"),
        }
    }

    pub fn ints(&self) -> Vec<i64> {
        self.as_array().iter().map(Resp::as_int).collect()
    }
}

/// Why a reply could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection (before or within a reply).
    Closed,
    Timeout,
    Io(std::io::Error),
    Malformed(String),
}

/// A raw TCP client that writes bytes and reads RESP replies.
pub struct Raw {
    pub stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = tokio::time::timeout(REPLY_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect within the timeout")
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Raw {
            stream,
            buf: Vec::new(),
            pos: 0,
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(REPLY_TIMEOUT, self.stream.write_all(bytes))
            .await
            .expect("write within the timeout")
            .expect("write");
    }

    /// Like `send`, but a write error (the server already closed) is returned, not a panic.
    pub async fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match tokio::time::timeout(REPLY_TIMEOUT, self.stream.write_all(bytes)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::other("write timed out")),
        }
    }

    /// Sends one command as a RESP array of bulk strings.
    pub async fn cmd(&mut self, args: &[&str]) -> Resp {
        self.send(&encode(args)).await;
        self.reply().await
    }

    /// Reads one reply; panics on timeout, close or a malformed reply.
    pub async fn reply(&mut self) -> Resp {
        match self.try_reply(REPLY_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => panic!("reading a reply failed: {e:?}"),
        }
    }

    /// Reads one reply within `limit`.
    pub async fn try_reply(&mut self, limit: Duration) -> Result<Resp, ReadError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let mut at = self.pos;
            match parse(&self.buf, &mut at) {
                Ok(Some(v)) => {
                    self.pos = at;
                    if self.pos == self.buf.len() {
                        self.buf.clear();
                        self.pos = 0;
                    }
                    return Ok(v);
                }
                Ok(None) => {}
                Err(m) => return Err(ReadError::Malformed(m)),
            }
            self.fill(deadline).await?;
        }
    }

    /// Reads exactly `n` raw bytes (whatever they are).
    pub async fn read_bytes(&mut self, n: usize) -> Vec<u8> {
        let deadline = tokio::time::Instant::now() + REPLY_TIMEOUT;
        while self.buf.len() - self.pos < n {
            if let Err(e) = self.fill(deadline).await {
                panic!(
                    "reading {n} bytes failed: {e:?}; got {:?}",
                    String::from_utf8_lossy(&self.buf[self.pos..])
                );
            }
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        out
    }

    /// Reads until the server closes the connection; returns everything read on the way.
    /// Panics if the connection stays open for `limit`.
    pub async fn read_until_closed(&mut self, limit: Duration) -> Vec<u8> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.fill(deadline).await {
                Ok(()) => {}
                Err(ReadError::Closed) => break,
                // A reset also means the server closed it.
                Err(ReadError::Io(_)) => break,
                Err(e) => panic!(
                    "connection still open after {limit:?} ({e:?}); read so far: {:?}",
                    String::from_utf8_lossy(&self.buf[self.pos..])
                ),
            }
        }
        let out = self.buf[self.pos..].to_vec();
        self.buf.clear();
        self.pos = 0;
        out
    }

    /// True if nothing at all arrives within `wait` (the connection stays open and silent).
    pub async fn is_silent_for(&mut self, wait: Duration) -> bool {
        if self.buf.len() > self.pos {
            return false;
        }
        let deadline = tokio::time::Instant::now() + wait;
        matches!(self.fill(deadline).await, Err(ReadError::Timeout))
    }

    async fn fill(&mut self, deadline: tokio::time::Instant) -> Result<(), ReadError> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.reserve(64 * 1024);
        match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
            Err(_) => Err(ReadError::Timeout),
            Ok(Err(e)) => Err(ReadError::Io(e)),
            Ok(Ok(0)) => Err(ReadError::Closed),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn encode(args: &[&str]) -> Vec<u8> {
    encode_bytes(&args.iter().map(|a| a.as_bytes()).collect::<Vec<_>>())
}

pub fn encode_bytes(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn line(buf: &[u8], at: &mut usize) -> Option<String> {
    let rest = buf.get(*at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    let s = String::from_utf8_lossy(&rest[..end]).into_owned();
    *at += end + 2;
    Some(s)
}

fn num(s: &str) -> Result<i64, String> {
    s.parse::<i64>()
        .map_err(|_| format!("bad number {s:?} in reply"))
}

fn items(buf: &[u8], at: &mut usize, n: usize) -> Result<Option<Vec<Resp>>, String> {
    let mut v = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        match parse(buf, at)? {
            Some(x) => v.push(x),
            None => return Ok(None),
        }
    }
    Ok(Some(v))
}

/// Parses one value at `*at`; `Ok(None)` when more bytes are needed (`*at` is then unusable).
pub fn parse(buf: &[u8], at: &mut usize) -> Result<Option<Resp>, String> {
    let Some(&kind) = buf.get(*at) else {
        return Ok(None);
    };
    *at += 1;
    let Some(head) = line(buf, at) else {
        return Ok(None);
    };
    let blob = |buf: &[u8], at: &mut usize, len: i64| -> Option<Vec<u8>> {
        let len = usize::try_from(len).ok()?;
        let end = *at + len;
        if buf.len() < end + 2 {
            return None;
        }
        let b = buf[*at..end].to_vec();
        *at = end + 2;
        Some(b)
    };
    Ok(Some(match kind {
        b'+' => Resp::Simple(head),
        b'-' => Resp::Error(head),
        b':' => Resp::Int(num(&head)?),
        b'$' => {
            let len = num(&head)?;
            if len < 0 {
                Resp::NilBulk
            } else {
                match blob(buf, at, len) {
                    Some(b) => Resp::Bulk(b),
                    None => return Ok(None),
                }
            }
        }
        b'=' => {
            let len = num(&head)?;
            match blob(buf, at, len) {
                Some(b) => {
                    let t = String::from_utf8_lossy(&b).into_owned();
                    let (fmt, text) = t.split_at(3.min(t.len()));
                    Resp::Verbatim(fmt.to_string(), text.trim_start_matches(':').to_string())
                }
                None => return Ok(None),
            }
        }
        b'*' | b'~' | b'>' => {
            let n = num(&head)?;
            if n < 0 {
                Resp::NilArray
            } else {
                match items(buf, at, n as usize)? {
                    Some(v) if kind == b'*' => Resp::Array(v),
                    Some(v) if kind == b'~' => Resp::Set(v),
                    Some(v) => Resp::Push(v),
                    None => return Ok(None),
                }
            }
        }
        b'%' => {
            let n = num(&head)? as usize;
            match items(buf, at, n * 2)? {
                Some(v) => {
                    let mut pairs = Vec::new();
                    let mut it = v.into_iter();
                    while let (Some(k), Some(val)) = (it.next(), it.next()) {
                        pairs.push((k, val));
                    }
                    Resp::Map(pairs)
                }
                None => return Ok(None),
            }
        }
        b'_' => Resp::Null,
        b'#' => Resp::Bool(head == "t"),
        b',' => Resp::Double(head),
        b'(' => Resp::BigNumber(head),
        other => return Err(format!("unknown reply type byte {:?}", other as char)),
    }))
}

/// Finds a key whose hash slot maps to `shard` out of `shards`, starting from `prefix`.
pub fn key_on_shard(prefix: &str, shard: usize, shards: usize) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| usize::from(bucketd::slot::key_slot(k.as_bytes())) % shards == shard)
        .expect("some key lands on every shard")
}

/// Looks up `name` in a flat RESP2 map reply or a RESP3 map reply.
pub fn map_get<'a>(reply: &'a Resp, name: &str) -> Option<&'a Resp> {
    match reply {
        Resp::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| k.as_text() == name)
            .map(|(_, v)| v),
        Resp::Array(v) => v
            .chunks(2)
            .find(|kv| kv[0].as_text() == name)
            .map(|kv| &kv[1]),
        _ => None,
    }
}

/// Reads one numeric field of an INFO section over a fresh connection.
pub async fn info_u64(node: &TestNode, section: &str, field: &str) -> Option<u64> {
    let mut c = node.raw().await;
    let text = c.cmd(&["INFO", section]).await.as_text();
    info_field(&text, field)?.parse().ok()
}

/// The value of `field` in INFO text.
pub fn info_field(text: &str, field: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// A fresh directory under the system temp dir, unique to this process and `tag`.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "bucketd-test-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Runs `tests/py/NAME` (which imports redis-py) with `args` under python3, for at most `limit`, and fails the test with
/// its output unless it exits with success. Its output is printed (shown when a test fails).
pub async fn run_py_script(name: &str, args: &[String], limit: Duration) {
    tools::require_python(tools::REDIS_PY);
    let script = format!("{}/tests/py/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::time::timeout(
        limit,
        tokio::process::Command::new("python3")
            .arg(&script)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{name} {args:?} did not finish within {limit:?}"))
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{name} {args:?} failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the node closes `s` within `limit` (reads end or fail), whatever it sent before.
pub fn closed_within(s: &mut std::net::TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match std::io::Read::read(s, &mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A fixed-seed xorshift generator for the tests that send random commands, so a failing run
/// repeats.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A number in `-span..=span`, as text.
    pub fn int(&mut self, span: i64) -> String {
        (self.below(2 * span as u64 + 1) as i64 - span).to_string()
    }

    pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }
}
