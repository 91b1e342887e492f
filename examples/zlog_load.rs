//! A load generator for a sliding-log rate limiter over RESP, the way Tyk's gateway keeps one:
//! a sorted set per client whose members are the requests of the last window, scored by time.
//! Each request, for a key drawn from `--keys` keys at time `t` (milliseconds, from the
//! generator's clock, never decreasing), does
//!
//! ```text
//! ZREMRANGEBYSCORE key -inf (t - window)   drop what left the window
//! ZADD key t member                        log this request (member: t and a counter, unique)
//! ZCARD key                                how many requests the window holds
//! EXPIRE key window_s                      the log goes when the client goes quiet
//! ```
//!
//! either as one `MULTI`..`EXEC` transaction (`--mode multi`) or as one script called with
//! `EVALSHA` (`--mode script`, loaded with `SCRIPT LOAD` first). `--mode incr2` instead runs a
//! script that increments two keys, `{TAG1}:a:N` and `{TAG2}:b:N` (`--tags TAG1,TAG2`), to
//! compare a script over two shards of one node with the same script over one.
//!
//! ```text
//! zlog_load --addr 127.0.0.1:6379 --mode multi --pipeline 16 --requests 200000
//! zlog_load --addr 127.0.0.1:6379 --mode incr2 --tags b,a
//! ```
//!
//! `--pipeline` requests are written at once on each connection and their replies awaited
//! together, as `redis-benchmark -P` does; a request is a whole `MULTI`..`EXEC` or one
//! `EVALSHA`. Every reply is checked (`EXEC`: an array of 4 integers, the `ZADD` and `EXPIRE`
//! ones 1; a script: an integer); an error, an unexpected reply or a run cut short by
//! `--timeout-s` fails the run (exit 1) with the figures still printed. The last line on
//! stdout is machine-readable: with `--tsv`, requests/s, p50 ms, p99 ms, requests, errors,
//! tab-separated.

use bytes::{Buf, BytesMut};
use clap::{Parser, ValueEnum};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one batch of replies may take before the connection counts as failed.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening one connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The sliding log as one script: KEYS[1] the log, ARGV[1] now (ms), ARGV[2] the window (ms),
/// ARGV[3] this request's member. Returns the requests in the window, this one included.
const ZLOG_SCRIPT: &str = "\
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZADD', KEYS[1], now, ARGV[3])
local n = redis.call('ZCARD', KEYS[1])
redis.call('EXPIRE', KEYS[1], math.ceil(window / 1000))
return n
";

/// Two counters in one script: returns the sum of both new values.
const INCR2_SCRIPT: &str = "\
return redis.call('INCR', KEYS[1]) + redis.call('INCR', KEYS[2])
";

#[derive(Parser, Debug)]
#[command(about = "A sliding-log rate limiter (ZREMRANGEBYSCORE, ZADD, ZCARD, EXPIRE) under load")]
struct Args {
    /// The server's RESP address.
    #[arg(long, default_value = "127.0.0.1:6379")]
    addr: String,
    #[arg(long, value_enum, default_value_t = Mode::Multi)]
    mode: Mode,
    /// Connections, each with `--pipeline` requests in flight.
    #[arg(long, default_value_t = 50)]
    conns: usize,
    /// Requests written at once per connection (each a whole MULTI..EXEC or one EVALSHA).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pipeline: u32,
    /// Requests in all.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Distinct keys (logs, or counter pairs in incr2 mode).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// The sliding window, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    window_ms: u64,
    /// Take keys in turn (request i on key i mod keys) instead of at random: with requests a
    /// multiple of keys, every log gets the same number of entries.
    #[arg(long)]
    sequential: bool,
    /// incr2 mode: the hash tags of its two keys, `{TAG1}:a:N` and `{TAG2}:b:N`.
    #[arg(long, default_value = "a,b")]
    tags: String,
    /// The key prefix of the logs (`PREFIX:N`).
    #[arg(long, default_value = "zlog")]
    prefix: String,
    /// The whole run stops after this long, done or not.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Seed of the keys drawn.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One tab-separated line: requests/s, p50 ms, p99 ms, requests, errors.
    #[arg(long)]
    tsv: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// MULTI, the four commands, EXEC.
    Multi,
    /// EVALSHA of the same four commands as one script.
    Script,
    /// EVALSHA of a script that INCRs two keys.
    Incr2,
}

/// What every connection needs to build its requests.
struct Plan {
    mode: Mode,
    keys: u64,
    window_ms: u64,
    sequential: bool,
    tags: (String, String),
    prefix: String,
    seed: u64,
    /// The loaded script's SHA1 (script and incr2 modes).
    sha: String,
    requests: u64,
    deadline: Instant,
    /// The generator's clock: `t` is `epoch_ms` plus the milliseconds since `start`.
    epoch_ms: u64,
    start: Instant,
    /// The next request to make, shared by all connections.
    next: AtomicU64,
}

impl Plan {
    /// The next request's number, or None once every request is taken or time is up.
    fn take(&self) -> Option<u64> {
        if Instant::now() >= self.deadline {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.requests).then_some(i)
    }

    fn key_index(&self, i: u64) -> u64 {
        if self.sequential {
            i % self.keys
        } else {
            splitmix64(self.seed ^ i) % self.keys
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch_ms + u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX / 2)
    }

    /// Appends request `i` to `out`, in RESP.
    fn encode(&self, i: u64, out: &mut Vec<u8>) {
        let k = self.key_index(i);
        match self.mode {
            Mode::Multi => {
                let key = format!("{}:{k}", self.prefix);
                let t = self.now_ms();
                let floor = t.saturating_sub(self.window_ms).to_string();
                let t_s = t.to_string();
                let member = format!("{t}-{i}");
                let window_s = self.window_ms.div_ceil(1000).to_string();
                command(out, &["MULTI"]);
                command(out, &["ZREMRANGEBYSCORE", &key, "-inf", &floor]);
                command(out, &["ZADD", &key, &t_s, &member]);
                command(out, &["ZCARD", &key]);
                command(out, &["EXPIRE", &key, &window_s]);
                command(out, &["EXEC"]);
            }
            Mode::Script => {
                let key = format!("{}:{k}", self.prefix);
                let t = self.now_ms();
                let member = format!("{t}-{i}");
                let (t_s, w) = (t.to_string(), self.window_ms.to_string());
                command(out, &["EVALSHA", &self.sha, "1", &key, &t_s, &w, &member]);
            }
            Mode::Incr2 => {
                let a = format!("{{{}}}:a:{k}", self.tags.0);
                let b = format!("{{{}}}:b:{k}", self.tags.1);
                command(out, &["EVALSHA", &self.sha, "2", &a, &b]);
            }
        }
    }

    /// Replies one request gets.
    fn replies_per_request(&self) -> usize {
        match self.mode {
            Mode::Multi => 6,
            Mode::Script | Mode::Incr2 => 1,
        }
    }

    /// Whether one request's replies are what it should get; the reason when not.
    fn check(&self, replies: &[Reply]) -> Result<(), String> {
        match (self.mode, replies) {
            (Mode::Multi, [ok, q1, q2, q3, q4, exec]) => {
                if !matches!(ok, Reply::Simple(s) if s == "OK") {
                    return Err(format!("MULTI answered {ok:?}"));
                }
                for q in [q1, q2, q3, q4] {
                    if !matches!(q, Reply::Simple(s) if s == "QUEUED") {
                        return Err(format!("a queued command answered {q:?}"));
                    }
                }
                match exec {
                    Reply::Array(items) => match items.as_slice() {
                        [Reply::Int(_), Reply::Int(1), Reply::Int(n), Reply::Int(1)] if *n >= 1 => {
                            Ok(())
                        }
                        _ => Err(format!("EXEC answered {exec:?}")),
                    },
                    _ => Err(format!("EXEC answered {exec:?}")),
                }
            }
            (Mode::Script, [Reply::Int(n)]) if *n >= 1 => Ok(()),
            (Mode::Incr2, [Reply::Int(n)]) if *n >= 2 => Ok(()),
            (_, r) => Err(format!("EVALSHA answered {r:?}")),
        }
    }
}

/// Appends one command as a RESP array of bulk strings.
fn command(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A reply, as far as this generator looks at one.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
    Nil,
}

/// Parses one reply from the front of `buf`: `Ok(None)` when it is not all there yet, else the
/// reply and the bytes it took.
fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, line)) = buf[..end].split_first() else {
        return Err("an empty line where a reply should start".into());
    };
    let line = std::str::from_utf8(line).map_err(|_| "a reply line is not UTF-8".to_string())?;
    let after = end + 2;
    let number = || {
        line.parse::<i64>()
            .map_err(|_| format!("'{line}' is not a number"))
    };
    match kind {
        b'+' => Ok(Some((Reply::Simple(line.to_string()), after))),
        b'-' => Ok(Some((Reply::Error(line.to_string()), after))),
        b':' => Ok(Some((Reply::Int(number()?), after))),
        b'_' => Ok(Some((Reply::Nil, after))),
        b'$' => {
            let Ok(len) = usize::try_from(number()?) else {
                return Ok(Some((Reply::Bulk(None), after)));
            };
            if buf.len() < after + len + 2 {
                return Ok(None);
            }
            let body = buf[after..after + len].to_vec();
            Ok(Some((Reply::Bulk(Some(body)), after + len + 2)))
        }
        b'*' => {
            let Ok(n) = usize::try_from(number()?) else {
                return Ok(Some((Reply::Nil, after)));
            };
            let mut items = Vec::with_capacity(n.min(1024));
            let mut at = after;
            for _ in 0..n {
                match parse_reply(&buf[at..])? {
                    None => return Ok(None),
                    Some((r, used)) => {
                        items.push(r);
                        at += used;
                    }
                }
            }
            Ok(Some((Reply::Array(items), at)))
        }
        other => Err(format!("unknown reply type byte {other:#04x}")),
    }
}

/// One connection: writes a request or a batch, reads the replies, checks each.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    async fn open(addr: &str) -> Result<Conn, String> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connecting to {addr}: timed out"))?
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
        })
    }

    /// Reads `n` replies.
    async fn read_replies(&mut self, n: usize) -> Result<Vec<Reply>, String> {
        let mut replies = Vec::with_capacity(n);
        while replies.len() < n {
            match parse_reply(&self.buf)? {
                Some((r, used)) => {
                    self.buf.advance(used);
                    replies.push(r);
                }
                None => {
                    let read =
                        tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_buf(&mut self.buf))
                            .await
                            .map_err(|_| format!("no reply within {REPLY_TIMEOUT:?}"))?
                            .map_err(|e| format!("reading: {e}"))?;
                    if read == 0 {
                        return Err("the server closed the connection".into());
                    }
                }
            }
        }
        Ok(replies)
    }

    /// Sends one command and returns its reply.
    async fn call(&mut self, args: &[&str]) -> Result<Reply, String> {
        let mut out = Vec::new();
        command(&mut out, args);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let mut r = self.read_replies(1).await?;
        r.pop().ok_or_else(|| "no reply".to_string())
    }
}

/// One connection's count: each answered request's latency in nanoseconds, and what went wrong.
#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn error(&mut self, n: u64, e: String) {
        self.errors += n;
        self.first_error.get_or_insert(e);
    }

    fn merge(&mut self, other: Tally) {
        self.latencies_ns.extend(other.latencies_ns);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

async fn worker(mut conn: Conn, plan: Arc<Plan>, pipeline: usize) -> Tally {
    let mut t = Tally::default();
    let per = plan.replies_per_request();
    let mut out = Vec::with_capacity(4096);
    loop {
        out.clear();
        let mut batch = 0;
        while batch < pipeline {
            match plan.take() {
                Some(i) => {
                    plan.encode(i, &mut out);
                    batch += 1;
                }
                None => break,
            }
        }
        if batch == 0 {
            return t;
        }
        let start = Instant::now();
        if let Err(e) = conn.stream.write_all(&out).await {
            t.error(batch as u64, format!("writing: {e}"));
            return t;
        }
        let replies = match conn.read_replies(batch * per).await {
            Ok(r) => r,
            Err(e) => {
                // The connection is out of step with its requests: give it up.
                t.error(batch as u64, e);
                return t;
            }
        };
        let took = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        for one in replies.chunks(per) {
            match plan.check(one) {
                Ok(()) => t.latencies_ns.push(took),
                Err(e) => t.error(1, e),
            }
        }
    }
}

/// The `q` quantile (0..=1) of sorted latencies, in milliseconds: the smallest value at or
/// above that share of the requests.
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e6
}

/// Loads the mode's script on one connection and returns its SHA1 (empty in multi mode).
async fn load_script(addr: &str, mode: Mode) -> Result<String, String> {
    let body = match mode {
        Mode::Multi => return Ok(String::new()),
        Mode::Script => ZLOG_SCRIPT,
        Mode::Incr2 => INCR2_SCRIPT,
    };
    let mut conn = Conn::open(addr).await?;
    match conn.call(&["SCRIPT", "LOAD", body]).await? {
        Reply::Bulk(Some(sha)) if sha.len() == 40 => {
            String::from_utf8(sha).map_err(|_| "SCRIPT LOAD answered a non-UTF-8 SHA1".into())
        }
        other => Err(format!("SCRIPT LOAD answered {other:?}")),
    }
}

async fn run(args: Args) -> Result<bool, String> {
    let sha = load_script(&args.addr, args.mode).await?;
    let tags = match args.tags.split_once(',') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => (a.to_string(), b.to_string()),
        _ => return Err(format!("--tags {}: expected TAG1,TAG2", args.tags)),
    };
    let epoch_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| format!("the clock is before 1970: {e}"))?
        .as_millis();
    let conns = args.conns.max(1);
    // Connections are made before the clock starts.
    let mut opened = Vec::with_capacity(conns);
    for _ in 0..conns {
        opened.push(Conn::open(&args.addr).await?);
    }
    let start = Instant::now();
    let plan = Arc::new(Plan {
        mode: args.mode,
        keys: args.keys.max(1),
        window_ms: args.window_ms,
        sequential: args.sequential,
        tags,
        prefix: args.prefix.clone(),
        seed: args.seed,
        sha,
        requests: args.requests,
        deadline: start + Duration::from_secs(args.timeout_s),
        epoch_ms: u64::try_from(epoch_ms).map_err(|_| "the clock is too far ahead".to_string())?,
        start,
        next: AtomicU64::new(0),
    });
    let mut workers = tokio::task::JoinSet::new();
    for conn in opened {
        workers.spawn(worker(conn, plan.clone(), args.pipeline as usize));
    }
    let mut all = Tally::default();
    while let Some(t) = workers.join_next().await {
        all.merge(t.map_err(|e| format!("a connection's task failed: {e}"))?);
    }
    let secs = start.elapsed().as_secs_f64();
    let done = all.latencies_ns.len() as u64;
    all.latencies_ns.sort_unstable();
    let rate = done as f64 / secs;
    let p50 = quantile_ms(&all.latencies_ns, 0.50);
    let p99 = quantile_ms(&all.latencies_ns, 0.99);
    if args.tsv {
        println!("{rate:.0}\t{p50:.3}\t{p99:.3}\t{done}\t{}", all.errors);
    } else {
        println!(
            "mode={:?} conns={conns} pipeline={} requests={done} errors={} secs={secs:.3} \
             rps={rate:.0} p50_ms={p50:.3} p99_ms={p99:.3}",
            args.mode, args.pipeline, all.errors
        );
    }
    if let Some(e) = &all.first_error {
        eprintln!("zlog_load: first error: {e}");
    }
    let complete = done + all.errors >= args.requests;
    if !complete {
        eprintln!(
            "zlog_load: stopped after {} s with {} of {} requests made",
            args.timeout_s,
            done + all.errors,
            args.requests
        );
    }
    Ok(complete && all.errors == 0)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("zlog_load: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("zlog_load: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_and_partial_replies() -> Result<(), String> {
        let exec = b"*4\r\n:0\r\n:1\r\n:3\r\n:1\r\n";
        let Some((r, used)) = parse_reply(exec)? else {
            return Err("incomplete".into());
        };
        assert_eq!(used, exec.len());
        assert_eq!(
            r,
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(1),
                Reply::Int(3),
                Reply::Int(1)
            ])
        );
        assert_eq!(parse_reply(&exec[..exec.len() - 1])?, None);
        assert_eq!(parse_reply(b"$3\r\nab")?, None);
        assert_eq!(parse_reply(b"$-1\r\n")?, Some((Reply::Bulk(None), 5)));
        Ok(())
    }
}
