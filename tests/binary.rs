//! The real `bucketd` binary: flags, a config file, the log line that names the address,
//! clients (redis-cli and the `redis` crate), and a clean exit on SIGTERM.

#![cfg(feature = "server")]

mod common;

use common::tools::{REDIS_CLI, require_tool};
use common::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// A running bucketd process; killed on drop if it is still running, so a failed test
/// leaves nothing behind.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes ANSI colour sequences from a log line.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for n in chars.by_ref() {
                if n.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The first `host:port` token after "listening" in a log line.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    let at = line.find("listening")?;
    line[at..]
        .split(|c: char| c.is_whitespace() || c == '=' || c == ',')
        .find_map(|tok| {
            tok.trim_matches(|c| c == '"' || c == '\'')
                .parse::<SocketAddr>()
                .ok()
        })
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the bucketd binary starts");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        // Drain both pipes for the life of the process so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(strip_ansi(&l));
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(strip_ansi(&l));
            }
        });
        Proc {
            child,
            lines: rx,
            log: Vec::new(),
        }
    }

    /// Reads the log until the listening address shows up (at most 20 s).
    fn wait_listening(&mut self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let addr = listening_addr(&line);
                    self.log.push(line);
                    if let Some(a) = addr {
                        return a;
                    }
                }
                Err(_) => panic!(
                    "no listening address in the log within 20 s; exit: {:?}; log:\n{}",
                    self.child.try_wait(),
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to exit (at most `limit`), then collects the rest of its log.
    async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            if Instant::now() >= deadline {
                panic!(
                    "bucketd did not exit within {limit:?}; log:\n{}",
                    self.log.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The pipes close at exit; give the readers a moment to pass on the last lines.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.log.push(l);
        }
        status
    }

    fn sigterm(&self) {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(st.success(), "kill -TERM failed");
    }
}

fn redis_cli(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli {args:?}: {:?}", out);
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_clients_and_exits_cleanly_on_sigterm() {
    require_tool(REDIS_CLI);
    bounded(async {
        let mut p = Proc::spawn(&["--port", "0", "--shards", "2"]);
        let addr = p.wait_listening();
        assert_ne!(addr.port(), 0);

        assert_eq!(redis_cli(addr, &["PING"]), "PONG");
        assert_eq!(redis_cli(addr, &["SET", "cli-key", "hello"]), "OK");
        assert_eq!(redis_cli(addr, &["GET", "cli-key"]), "hello");
        assert_eq!(
            redis_cli(addr, &["CL.THROTTLE", "user123", "15", "30", "60"]),
            "0\n16\n15\n-1\n2"
        );
        assert_eq!(
            redis_cli(addr, &["BK.CHECK", "cli-bucket", "10/1s"])
                .lines()
                .count(),
            5
        );
        assert_eq!(redis_cli(addr, &["-3", "PING"]), "PONG");

        let mut c = connect_url(&format!("redis://{addr}/")).await;
        assert_eq!(q::<String>(&mut c, &["PING"]).await, "PONG");
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "k", "0", "1", "2"]).await,
            [0, 1, 0, -1, 2]
        );
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "k", "0", "1", "2"]).await[0],
            1
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "b", "5/1m"]).await[..3],
            [1, 5, 4]
        );
        let t: Vec<String> = q(&mut c, &["TIME"]).await;
        let secs: u64 = t[0].parse().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            secs.abs_diff(now) < 60,
            "the binary runs on the real clock: {secs} vs {now}"
        );
        let info: String = q(&mut c, &["INFO", "bucketd"]).await;
        assert_eq!(info_field(&info, "shards").as_deref(), Some("2"));

        // An idle client stays connected while the node is told to stop.
        let mut idle = Raw::connect(addr).await;
        assert_eq!(idle.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        p.sigterm();
        let status = p.wait_exit(Duration::from_secs(5)).await;
        assert!(
            status.success(),
            "exit status {status:?}; log:\n{}",
            p.log.join("\n")
        );
        // The idle client sees the connection closed, and nothing listens any more.
        let _ = idle.read_until_closed(Duration::from_secs(5)).await;
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still listening after exit"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_sets_options_and_flags_override_it() {
    bounded(async {
        let dir = temp_dir("cfg");
        let cfg = dir.join("bucketd.toml");
        let rules = dir.join("rules.toml");
        std::fs::write(&rules, "[rules]\napi = \"4/1m\"\n").unwrap();
        std::fs::write(
            &cfg,
            format!(
                "bind = \"127.0.0.1\"\nport = 0\nshards = 1\nrequirepass = \"pw\"\nmaxclients = 7\nmax-keys = 100\nmaxmemory = \"1mb\"\nrules = \"{}\"\nlog = \"info\"\n",
                rules.display()
            ),
        )
        .unwrap();
        let cfg_s = cfg.to_str().unwrap();
        for (extra, shards) in [(vec![], "1"), (vec!["--shards", "3"], "3")] {
            let mut args = vec!["--config", cfg_s];
            args.extend(extra);
            let mut p = Proc::spawn(&args);
            let addr = p.wait_listening();
            let mut raw = Raw::connect(addr).await;
            assert_eq!(
                raw.cmd(&["PING"]).await,
                Resp::Error("NOAUTH Authentication required.".into())
            );
            assert_eq!(raw.cmd(&["AUTH", "pw"]).await, Resp::Simple("OK".into()));
            let get = |r: Resp| r.as_array()[1].as_text();
            assert_eq!(get(raw.cmd(&["CONFIG", "GET", "maxclients"]).await), "7");
            assert_eq!(get(raw.cmd(&["CONFIG", "GET", "max-keys"]).await), "100");
            assert_eq!(get(raw.cmd(&["CONFIG", "GET", "maxmemory"]).await), "1048576");
            assert_eq!(get(raw.cmd(&["CONFIG", "GET", "shards"]).await), shards);
            assert_eq!(raw.cmd(&["BK.CHECK", "k", "api"]).await.ints(), vec![1, 4, 3, -1, 15_000]);
            p.sigterm();
            let status = p.wait_exit(Duration::from_secs(5)).await;
            assert!(status.success(), "exit status {status:?}; log:\n{}", p.log.join("\n"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_exits_with_a_clear_message() {
    bounded(async {
        let dir = temp_dir("badcfg");
        let typo = dir.join("typo.toml");
        std::fs::write(&typo, "prot = 1\n").unwrap();
        let not_toml = dir.join("broken.toml");
        std::fs::write(&not_toml, "port = [\n").unwrap();
        let bad_size = dir.join("size.toml");
        std::fs::write(&bad_size, "maxmemory = \"lots\"\n").unwrap();
        let missing = dir.join("missing.toml");
        let bad_rules = dir.join("rules.toml");
        std::fs::write(&bad_rules, "[rules]\napi = \"nonsense\"\n").unwrap();
        let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
            (
                vec!["--config".into(), typo.display().to_string()],
                vec!["invalid config", "typo.toml", "prot"],
            ),
            (
                vec!["--config".into(), not_toml.display().to_string()],
                vec!["invalid config", "broken.toml"],
            ),
            (
                vec!["--config".into(), bad_size.display().to_string()],
                vec!["lots"],
            ),
            (
                vec!["--config".into(), missing.display().to_string()],
                vec!["cannot read config", "missing.toml"],
            ),
            (
                vec!["--shards".into(), "0".into(), "--port".into(), "0".into()],
                vec!["shards"],
            ),
            (
                vec![
                    "--maxmemory".into(),
                    "12parsecs".into(),
                    "--port".into(),
                    "0".into(),
                ],
                vec!["12parsecs"],
            ),
            (vec!["--no-such-flag".into()], vec!["--no-such-flag"]),
            (
                vec![
                    "--port".into(),
                    "0".into(),
                    "--rules".into(),
                    bad_rules.display().to_string(),
                ],
                vec!["api"],
            ),
        ];
        for (args, needles) in cases {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut p = Proc::spawn(&refs);
            let status = p.wait_exit(Duration::from_secs(10)).await;
            let log = p.log.join("\n");
            assert!(!status.success(), "{args:?} should fail; log:\n{log}");
            for n in needles {
                assert!(
                    log.contains(n),
                    "{args:?}: the message should mention {n:?}; got:\n{log}"
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

#[test]
fn help_and_version() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--port", "--shards", "--config", "--rules", "--requirepass"] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// Starts the binary with `args` and connects to it.
async fn serve(args: &[&str]) -> (Proc, redis::aio::MultiplexedConnection) {
    let mut p = Proc::spawn(args);
    let addr = p.wait_listening();
    let c = connect_url(&format!("redis://{addr}/")).await;
    (p, c)
}

/// The snapshot's modification time, if it exists.
fn dump_mtime(dir: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(dir.join("dump.bkd"))
        .and_then(|m| m.modified())
        .ok()
}

/// A standalone node with --data-dir: a clean restart keeps every bucket and counter, and so
/// does a kill -9 once a periodic snapshot has been written since the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_node_keeps_its_buckets_across_restarts_and_crashes() {
    bounded(async {
        let dir = temp_dir("persist");
        let d = dir.to_str().expect("utf-8 path");
        let with_interval = |every| {
            [
                "--port",
                "0",
                "--shards",
                "2",
                "--data-dir",
                d,
                "--save-interval",
                every,
            ]
        };
        let args = with_interval("0");

        let (mut p, mut c) = serve(&args).await;
        // A bucket of 3 per hour, all taken: a restart must not hand out a fresh burst.
        for _ in 0..3 {
            assert_eq!(
                limit(&mut c, &["CL.THROTTLE", "cell", "2", "3", "3600"]).await[0],
                0
            );
        }
        limit(&mut c, &["BK.CHECK", "win", "fixed:10/1h", "COST", "4"]).await;
        let before = limit(&mut c, &["BK.CHECK", "win", "fixed:10/1h", "PEEK"]).await;
        assert_eq!(before[2], 5);
        let _: () = q(&mut c, &["SET", "plain", "v"]).await;
        let _: i64 = q(&mut c, &["INCRBY", "counter", "41"]).await;
        let keys: i64 = q(&mut c, &["DBSIZE"]).await;
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());
        assert!(dir.join("dump.bkd").exists(), "a snapshot at shutdown");

        let (mut p, mut c) = serve(&args).await;
        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, keys);
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "cell", "2", "3", "3600"]).await[0],
            1
        );
        let after = limit(&mut c, &["BK.CHECK", "win", "fixed:10/1h", "PEEK"]).await;
        assert_eq!(after[2], before[2], "the window's count survived");
        assert_eq!(q::<String>(&mut c, &["GET", "plain"]).await, "v");
        assert_eq!(q::<i64>(&mut c, &["INCR", "counter"]).await, 42);
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());

        // Periodic snapshots: after kill -9, what the last one held is back.
        let args = with_interval("1");
        let (mut p, mut c) = serve(&args).await;
        let _: i64 = q(&mut c, &["INCRBY", "counter", "100"]).await;
        // Two snapshots written after the write: the second was begun after it.
        let mut seen = dump_mtime(&dir);
        for _ in 0..2 {
            seen = Some(
                wait_for("a periodic snapshot", Duration::from_secs(10), || async {
                    let now = dump_mtime(&dir);
                    (now != seen).then_some(now).flatten()
                })
                .await,
            );
        }
        p.child.kill().expect("kill -9");
        let _ = p.child.wait();
        let (mut p, mut c) = serve(&args).await;
        assert_eq!(q::<i64>(&mut c, &["GET", "counter"]).await, 142);
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "cell", "2", "3", "3600"]).await[0],
            1
        );
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// A standalone node with --data-dir brings its hashes back from the snapshot: every field in
/// its order, the values, and the key's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_node_keeps_its_hashes_across_a_restart() {
    bounded(async {
        let dir = temp_dir("persist-hashes");
        let d = dir.to_str().expect("utf-8 path");
        let args = [
            "--port",
            "0",
            "--shards",
            "2",
            "--data-dir",
            d,
            "--save-interval",
            "0",
        ];
        let fields: Vec<(String, String)> = (0..128)
            .map(|i| (format!("f{i}"), format!("v{}", 127 - i)))
            .collect();

        let (mut p, mut c) = serve(&args).await;
        let added: i64 = q(
            &mut c,
            &["HSET", "bucket:{u}", "tokens", "10", "ts", "1700000000000"],
        )
        .await;
        assert_eq!(added, 2);
        assert_eq!(
            q::<String>(&mut c, &["HINCRBYFLOAT", "bucket:{u}", "tokens", "-0.5"]).await,
            "9.5"
        );
        assert_eq!(
            q::<i64>(&mut c, &["PEXPIRE", "bucket:{u}", "600000"]).await,
            1
        );
        let mut hset = vec!["HSET", "wide"];
        for (f, v) in &fields {
            hset.extend([f.as_str(), v.as_str()]);
        }
        assert_eq!(q::<i64>(&mut c, &hset).await, 128);
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());

        let (mut p, mut c) = serve(&args).await;
        assert_eq!(q::<String>(&mut c, &["TYPE", "wide"]).await, "hash");
        let wide: Vec<String> = q(&mut c, &["HGETALL", "wide"]).await;
        let want: Vec<String> = fields.into_iter().flat_map(|(f, v)| [f, v]).collect();
        assert_eq!(wide, want, "every field, in the order they were added");
        let bucket: Vec<String> = q(&mut c, &["HGETALL", "bucket:{u}"]).await;
        assert_eq!(bucket, ["tokens", "9.5", "ts", "1700000000000"]);
        let ttl: i64 = q(&mut c, &["PTTL", "bucket:{u}"]).await;
        assert!(
            (500_000..=600_000).contains(&ttl),
            "the hash keeps its expiry: {ttl}"
        );
        assert_eq!(
            q::<String>(&mut c, &["HINCRBYFLOAT", "bucket:{u}", "tokens", "0.5"]).await,
            "10"
        );
        // Still bounded after the restart.
        let e = q_err(&mut c, &["HSET", "wide", "one", "more"]).await;
        assert!(e.contains("128 fields"), "{e}");
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// A damaged snapshot stops the node with the file's name, rather than an empty start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_torn_snapshot_is_refused_by_name() {
    bounded(async {
        let dir = temp_dir("corrupt");
        let d = dir.to_str().expect("utf-8 path");
        let args = ["--port", "0", "--data-dir", d, "--save-interval", "0"];
        let (mut p, mut c) = serve(&args).await;
        for i in 0..200 {
            let _: i64 = q(&mut c, &["INCR", &format!("k{i}")]).await;
        }
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());
        let file = dir.join("dump.bkd");
        let good = std::fs::read(&file).expect("snapshot");

        let torn = &good[..good.len() / 2];
        let mut flipped = good.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x01;
        for (what, bytes) in [
            ("torn", torn.to_vec()),
            ("flipped", flipped),
            ("garbage", b"hello".to_vec()),
        ] {
            std::fs::write(&file, &bytes).expect("write");
            let mut p = Proc::spawn(&args);
            let st = p.wait_exit(Duration::from_secs(20)).await;
            assert!(!st.success(), "{what}: the node must not start");
            let log = p.log.join("\n");
            assert!(
                log.contains("cannot load the snapshot")
                    && log.contains(file.to_str().unwrap_or("")),
                "{what}: {log}"
            );
        }
        // The whole file loads again.
        std::fs::write(&file, &good).expect("write");
        let (mut p, mut c) = serve(&args).await;
        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, 200);
        p.sigterm();
        assert!(p.wait_exit(Duration::from_secs(20)).await.success());
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
