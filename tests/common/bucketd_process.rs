//! The real `bucketd` binary run as a child process on the wall clock, for tests whose clients
//! measure time themselves (a limiter library's own test suite, a script that reads TIME) and
//! so cannot use an in-process node on a manual clock.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A `bucketd` child process on a free loopback port, killed when dropped. Its log is kept in a
/// file under the test's temporary directory, and shown when it fails to start.
pub struct BucketdProcess {
    pub addr: SocketAddr,
    child: Child,
    dir: PathBuf,
    log: PathBuf,
}

impl BucketdProcess {
    /// Starts `bin` (the binary cargo built for the test: `env!("CARGO_BIN_EXE_bucketd")`)
    /// with `args` besides its address, and waits until it answers PING.
    pub fn start(bin: &str, args: &[&str]) -> BucketdProcess {
        BucketdProcess::start_with_env(bin, args, &[])
    }

    /// Like `start`, with `env` added to the process's environment (e.g. a preloaded library
    /// that fakes the wall clock).
    pub fn start_with_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> BucketdProcess {
        let dir = super::temp_dir("bucketd-process");
        let log = dir.join("bucketd.log");
        // `free_port` only saw the port free a moment before: a node that exits at once has
        // most likely lost it to another process, and starts again on another port.
        const TRIES: usize = 5;
        for _ in 0..TRIES {
            let port = super::free_port();
            let out = std::fs::File::create(&log).expect("create the node's log file");
            let err = out.try_clone().expect("clone the log file handle");
            let mut child = Command::new(bin)
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(args)
                .env("NO_COLOR", "1")
                .env_remove("RUST_LOG")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("the bucketd binary starts");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            if answers_ping(addr, &mut child, &log) {
                return BucketdProcess {
                    addr,
                    child,
                    dir,
                    log,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "bucketd exited at start on {TRIES} free ports in a row (arguments {args:?}); log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the node as an operator does, with SIGTERM (a graceful stop: a node with a data
    /// directory saves its snapshot), and waits up to `limit` for it to exit.
    pub fn stop(&mut self, limit: Duration) -> ExitStatus {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(st.success(), "kill -TERM {} failed", self.child.id());
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait on bucketd") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "bucketd did not exit within {limit:?} of SIGTERM; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Waits up to 20 s for `child` to answer PING on `addr`: `false` when it exits first (its port
/// was taken), and a panic when it neither answers nor exits.
fn answers_ping(addr: SocketAddr, child: &mut Child, log: &std::path::Path) -> bool {
    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let mut b = [0u8; 5];
            if s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut b).is_ok() && &b == b"+PONG" {
                return true;
            }
        }
        assert!(
            Instant::now() < deadline,
            "bucketd did not answer on {addr} within 20s; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for BucketdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
