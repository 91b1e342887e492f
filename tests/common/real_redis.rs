//! A real Redis server started by a test (Debian's `redis-server`), and a side-by-side client
//! that sends the same bytes to it and to a bucketd node, so behaviour Redis defines is checked
//! against Redis itself rather than against expectations written by hand.

use super::{Raw, Resp, TestNode};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on a free loopback port, killed when dropped.
pub struct RealRedis {
    pub addr: SocketAddr,
    child: Child,
    dir: std::path::PathBuf,
}

impl RealRedis {
    /// Starts `redis-server` with persistence off. Panics with a clear message when the
    /// program is missing: `.ci/run` installs it, so a missing one is a broken setup.
    pub async fn start() -> RealRedis {
        RealRedis::start_with(&[]).await
    }

    /// Starts `redis-server` with extra `--name value` arguments.
    pub async fn start_with(extra: &[&str]) -> RealRedis {
        super::tools::require_tool(super::tools::REDIS_SERVER);
        let dir = super::temp_dir("real-redis");
        // `free_port` only saw the port free a moment before: a server that exits at once has
        // most likely lost it to another process, and starts again on another port.
        const TRIES: usize = 5;
        for _ in 0..TRIES {
            let port = super::free_port();
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--daemonize",
                    "no",
                    "--dir",
                ])
                .arg(&dir)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            if answers(addr, &mut child).await {
                return RealRedis { addr, child, dir };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server exited at start on {TRIES} free ports in a row (arguments {extra:?})");
    }

    /// A raw connection to the real Redis.
    pub async fn raw(&self) -> Raw {
        Raw::connect(self.addr).await
    }

    /// The major.minor.patch version the server reports.
    pub async fn version(&self) -> String {
        let mut r = self.raw().await;
        let info = r.cmd(&["INFO", "server"]).await.as_text();
        super::info_field(&info, "redis_version").unwrap_or_default()
    }
}

/// Waits up to 10 s for `child` to answer PING on `addr`: `false` when it exits first (its
/// port was taken), and a panic when it neither answers nor exits.
async fn answers(addr: SocketAddr, child: &mut Child) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if let Ok(Ok(mut s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
            && s.write_all(b"PING\r\n").await.is_ok()
        {
            // PONG, or NOAUTH when started with a password: either way it serves.
            let mut b = [0u8; 5];
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut b)).await
                && (&b == b"+PONG" || &b == b"-NOAU")
                && matches!(child.try_wait(), Ok(None))
            {
                return true;
            }
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not answer on {addr} within 10s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for RealRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One raw connection to bucketd and one to Redis, fed the same requests.
pub struct SideBySide {
    pub ours: Raw,
    pub redis: Raw,
}

impl SideBySide {
    pub async fn connect(node: &TestNode, redis: &RealRedis) -> SideBySide {
        SideBySide {
            ours: node.raw().await,
            redis: redis.raw().await,
        }
    }

    /// Sends the same raw bytes to both and reads one reply from each.
    pub async fn send_both(&mut self, bytes: &[u8]) -> (Resp, Resp) {
        self.ours.send(bytes).await;
        self.redis.send(bytes).await;
        (self.ours.reply().await, self.redis.reply().await)
    }

    /// Sends one command to both and returns (bucketd's reply, Redis's reply).
    pub async fn both(&mut self, args: &[&str]) -> (Resp, Resp) {
        self.send_both(&super::encode(args)).await
    }

    /// Sends one command to both and asserts the replies are identical, error text included.
    pub async fn same(&mut self, args: &[&str]) -> Resp {
        let (ours, theirs) = self.both(args).await;
        assert_eq!(ours, theirs, "bucketd and Redis differ on {args:?}");
        ours
    }

    /// Like `same`, for a command whose replies must both be errors; only the first word (the
    /// error code) and the whole text are compared.
    pub async fn same_error(&mut self, args: &[&str]) -> String {
        let (ours, theirs) = self.both(args).await;
        assert!(
            matches!(theirs, Resp::Error(_)),
            "Redis did not refuse {args:?}: {theirs:?}"
        );
        assert_eq!(ours, theirs, "bucketd and Redis differ on {args:?}");
        ours.as_text()
    }
}

/// Runs `script` on both servers: `!` before a command means both must refuse it.
pub async fn run_script(sb: &mut SideBySide, script: &[&[&str]]) {
    for &cmd in script {
        match cmd.split_first() {
            Some((&"!", rest)) => {
                sb.same_error(rest).await;
            }
            _ => {
                sb.same(cmd).await;
            }
        }
    }
}

/// Runs `body` on a RESP2 pair of connections to `node` and `redis`, then on a pair after
/// `HELLO 3` on both (the HELLO maps differ: server name, version, id; what follows must not).
pub async fn on_both_protocols<F>(node: &TestNode, redis: &RealRedis, body: F)
where
    F: AsyncFn(&mut SideBySide, &str),
{
    for resp3 in [false, true] {
        let mut sb = SideBySide::connect(node, redis).await;
        if resp3 {
            let (ours, theirs) = sb.both(&["HELLO", "3"]).await;
            assert!(matches!(ours, Resp::Map(_)), "{ours:?}");
            assert!(matches!(theirs, Resp::Map(_)), "{theirs:?}");
        }
        body(&mut sb, if resp3 { "r3" } else { "r2" }).await;
    }
}

/// `on_both_protocols` on a fresh node and a fresh Redis.
pub async fn both_protocols<F>(body: F)
where
    F: AsyncFn(&mut SideBySide, &str),
{
    let node = TestNode::start().await;
    let redis = RealRedis::start().await;
    on_both_protocols(&node, &redis, body).await;
    node.shutdown().await;
}
