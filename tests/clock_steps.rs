//! Limits across steps of the wall clock, on the real `bucketd` binary: each node runs under
//! Debian's libfaketime, and the test steps the node's wall clock an hour back or forward
//! while it runs, as an operator or an NTP step does (the monotonic clock is left alone).
//! A step is no time passing: a node must neither stop admitting after a step back, nor give
//! out extra burst after a step forward, nor ask a client to wait longer than the limit itself
//! can make it wait, and a node restarted after a step back resumes its limits where they were.
//!
//! The step is confirmed in the node itself: `redis.log` in a script writes a log line whose
//! timestamp is the node's wall clock.

#![cfg(feature = "server")]

mod common;

use common::bucketd_process::BucketdProcess;
use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// How Debian's libfaketime is installed.
const INSTALL_FAKETIME: &str =
    "install Debian's libfaketime: apt-get install -y faketime libfaketime";

/// The path of libfaketime's preload library; fails the test when it is not installed (the
/// test never passes without having stepped a clock).
#[track_caller]
fn require_libfaketime() -> PathBuf {
    // Debian puts it under the architecture's library directory, e.g.
    // /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1.
    let mut dirs = vec![PathBuf::from("/usr/lib/faketime")];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(entries.flatten().map(|e| e.path().join("faketime")));
    }
    dirs.into_iter()
        .map(|d| d.join("libfaketime.so.1"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libfaketime.so.1 not found under /usr/lib: {INSTALL_FAKETIME}"))
}

/// A wall clock the test steps: the file libfaketime reads on every reading of the clock,
/// holding an offset in seconds from the real time.
struct SteppedClock {
    lib: PathBuf,
    file: PathBuf,
    dir: PathBuf,
}

impl SteppedClock {
    /// A clock at the real time (offset 0).
    fn new() -> SteppedClock {
        let lib = require_libfaketime();
        let dir = temp_dir("clock-steps");
        let clock = SteppedClock {
            lib,
            file: dir.join("faketime"),
            dir,
        };
        clock.set_offset(0);
        clock
    }

    /// Sets the wall clock `secs` seconds from the real time, at once. The file is replaced
    /// whole, so a reading never sees it half written.
    fn set_offset(&self, secs: i64) {
        let tmp = self.dir.join("faketime.tmp");
        std::fs::write(&tmp, format!("{secs:+}\n")).expect("write the faketime file");
        std::fs::rename(&tmp, &self.file).expect("replace the faketime file");
    }

    /// The environment that runs a process on this clock: the wall clock from the file, read
    /// on every call (no cache), and CLOCK_MONOTONIC untouched, as with an NTP step.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LD_PRELOAD", self.lib.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            ("FAKETIME_NO_CACHE", "1".to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ]
    }

    /// A `bucketd` on this clock with `args`.
    fn start_node(&self, args: &[&str]) -> BucketdProcess {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        BucketdProcess::start_with_env(BIN, args, &env)
    }
}

impl Drop for SteppedClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Seconds since the UNIX epoch of a log line's RFC 3339 UTC timestamp
/// (`2026-12-07T22:45:58.567327Z`).
fn log_time(line: &str) -> Option<f64> {
    let ts = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.splitn(3, ':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let s: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (proleptic Gregorian), counting from 1970-01-01.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60) as f64 + s)
}

/// Asserts the node's wall clock is `expected` seconds from the real time, give or take a few
/// seconds for a slow machine: a script logs `marker`, and its log line carries the node's
/// reading of the wall clock.
async fn assert_wall_offset(
    node: &BucketdProcess,
    con: &mut redis::aio::MultiplexedConnection,
    marker: &str,
    expected: i64,
) {
    let script = "redis.log(redis.LOG_WARNING, ARGV[1])";
    let _: redis::Value = q(con, &["EVAL", script, "0", marker]).await;
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the real clock is after 1970")
        .as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let log = node.log();
        if let Some(line) = log.lines().find(|l| l.ends_with(marker)) {
            break line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no {marker:?} in the log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let off = log_time(&line).unwrap_or_else(|| panic!("no timestamp in {line:?}")) - real;
    assert!(
        (off - expected as f64).abs() < 5.0,
        "the node's wall clock should be {expected} s from the real time, is {off:.3} s"
    );
}

/// The command a limit is asked through: redis-cell's CL.THROTTLE (seconds, `limited` first)
/// or BK.CHECK (milliseconds, `allowed` first).
#[derive(Clone, Copy)]
enum Cmd {
    Cell,
    Check,
}

/// A GCRA limit: `capacity` units, refilled at `count` per `period_s` seconds.
struct Limit {
    key: String,
    cmd: Cmd,
    capacity: i64,
    count: i64,
    period_s: i64,
}

/// One decided request: whether it was admitted, and the reply's figures in milliseconds.
#[derive(Debug)]
struct Decision {
    admitted: bool,
    remaining: i64,
    retry_after_ms: i64,
    reset_after_ms: i64,
}

impl Limit {
    /// Units per second.
    fn rate(&self) -> f64 {
        self.count as f64 / self.period_s as f64
    }

    /// Asks for `cost` units (0 only reports), and checks the reply stays within what the
    /// limit can ask: `remaining` in [0, capacity], a retry-after no longer than the cost takes
    /// to refill, a reset no longer than an empty bucket takes.
    async fn ask(&self, con: &mut redis::aio::MultiplexedConnection, cost: i64) -> Decision {
        let burst = (self.capacity - 1).to_string();
        let (count, period) = (self.count.to_string(), self.period_s.to_string());
        let spec = format!("gcra:{count}/{period}s:{}", self.capacity);
        let cost_s = cost.to_string();
        let (d, r) = match self.cmd {
            Cmd::Cell => {
                let args = ["CL.THROTTLE", &self.key, &burst, &count, &period, &cost_s];
                let r = limit(con, &args).await;
                let ms = |s: i64| if s < 0 { s } else { s * 1000 };
                let d = Decision {
                    admitted: r[0] == 0,
                    remaining: r[2],
                    retry_after_ms: ms(r[3]),
                    reset_after_ms: ms(r[4]),
                };
                (d, r)
            }
            Cmd::Check => {
                let r = limit(con, &["BK.CHECK", &self.key, &spec, "COST", &cost_s]).await;
                let d = Decision {
                    admitted: r[0] == 1,
                    remaining: r[2],
                    retry_after_ms: r[3],
                    reset_after_ms: r[4],
                };
                (d, r)
            }
        };
        // No reply asks for more than refilling what it needs: `cost` units for a retry, the
        // whole bucket for a reset (CL.THROTTLE rounds up to a second).
        let units = cost.max(1);
        let retry_ms = self.refill_ms(units);
        let longest_ms = self.refill_ms(self.capacity);
        let what = format!("{} on {}: {r:?}", self.name(), &self.key);
        assert_eq!(r[1], self.capacity, "limit field, {what}");
        assert!(
            (0..=self.capacity).contains(&d.remaining),
            "remaining outside [0, {}], {what}",
            self.capacity
        );
        assert!(
            d.retry_after_ms == -1 || (0..=retry_ms).contains(&d.retry_after_ms),
            "retry-after beyond the {retry_ms} ms that refill {units} units, {what}"
        );
        assert!(
            !d.admitted || d.retry_after_ms == -1,
            "an admitted request with a retry-after, {what}"
        );
        assert!(
            (0..=longest_ms).contains(&d.reset_after_ms),
            "reset beyond the limit's longest wait of {longest_ms} ms, {what}"
        );
        d
    }

    /// How long `units` take to refill, in the command's precision.
    fn refill_ms(&self, units: i64) -> i64 {
        let ms = ((units * self.period_s * 1000) as u64).div_ceil(self.count as u64);
        match self.cmd {
            Cmd::Cell => (ms.div_ceil(1000) * 1000) as i64,
            Cmd::Check => ms as i64,
        }
    }

    fn name(&self) -> &'static str {
        match self.cmd {
            Cmd::Cell => "CL.THROTTLE",
            Cmd::Check => "BK.CHECK",
        }
    }

    /// Takes units until one is refused; returns how many were admitted.
    async fn drain(&self, con: &mut redis::aio::MultiplexedConnection) -> i64 {
        for n in 0..=self.capacity + 1 {
            if !self.ask(con, 1).await.admitted {
                return n;
            }
        }
        panic!(
            "{} on {} admitted beyond its capacity",
            self.name(),
            self.key
        );
    }

    /// The most a limit may admit over `secs` seconds from full: its capacity, what refills in
    /// that time at up to 1.001 times its rate (how fast a node's time may run while it leans
    /// toward the wall clock), and one for the request that lands on the edge.
    fn most_in(&self, secs: f64) -> f64 {
        self.capacity as f64 + secs * self.rate() * 1.001 + 1.0
    }
}

/// The same limit through both commands, on keys named after `tag`.
fn both_commands(tag: &str, capacity: i64, count: i64, period_s: i64) -> [Limit; 2] {
    [(Cmd::Cell, "cell"), (Cmd::Check, "check")].map(|(cmd, name)| Limit {
        key: format!("{tag}:{name}"),
        cmd,
        capacity,
        count,
        period_s,
    })
}

/// After the wall clock steps back an hour, a drained bucket of 1 per second refills as time
/// passes: about one admit per second. A node that read limits off the wall clock would admit
/// nothing for an hour, and answer a retry-after of an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_back_keeps_a_running_node_admitting() {
    bounded(async {
        let clock = SteppedClock::new();
        let node = clock.start_node(&["--shards", "2"]);
        let mut con = connect_url(&format!("redis://{}/", node.addr)).await;
        assert_wall_offset(&node, &mut con, "before-step-back", 0).await;

        let limits = both_commands("back", 1, 1, 1);
        for l in &limits {
            assert_eq!(l.drain(&mut con).await, 1, "{} admits its burst", l.name());
        }
        let drained = Instant::now();
        clock.set_offset(-3600);
        assert_wall_offset(&node, &mut con, "after-step-back", -3600).await;

        // A request every 100 ms for 6 s.
        let start = Instant::now();
        let mut admitted = [0i64; 2];
        for _ in 0..60 {
            if start.elapsed() >= Duration::from_secs(6) {
                break;
            }
            for (l, n) in limits.iter().zip(&mut admitted) {
                *n += i64::from(l.ask(&mut con, 1).await.admitted);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ran = start.elapsed().as_secs_f64();
        let since_drain = drained.elapsed().as_secs_f64();
        for (l, n) in limits.iter().zip(admitted) {
            println!(
                "{}: {n} admitted in {ran:.2} s after the step back",
                l.name()
            );
            assert!(
                n as f64 <= l.most_in(since_drain),
                "{} admitted {n} in {since_drain:.2} s, more than the limit allows",
                l.name()
            );
            assert!(
                n >= ran.floor() as i64 - 2,
                "{} admitted only {n} in {ran:.2} s after the wall clock stepped back",
                l.name()
            );
        }
    })
    .await;
}

/// A step forward of an hour is no hour passing: a drained bucket stays drained at once, and
/// refills only at its rate after, never in one burst. The bucket holds 10 so that an extra
/// burst would show in the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_forward_gives_no_extra_burst() {
    bounded(async {
        let clock = SteppedClock::new();
        let node = clock.start_node(&["--shards", "2"]);
        let mut con = connect_url(&format!("redis://{}/", node.addr)).await;
        assert_wall_offset(&node, &mut con, "before-step-forward", 0).await;

        let limits = both_commands("forward", 10, 1, 1);
        let mut admitted = [0i64; 2];
        let start = Instant::now();
        for (l, n) in limits.iter().zip(&mut admitted) {
            *n = l.drain(&mut con).await;
            assert_eq!(*n, 10, "{} admits its burst", l.name());
        }
        clock.set_offset(3600);
        // At once: still refused, unless a second really passed since the drain began.
        for l in &limits {
            let d = l.ask(&mut con, 1).await;
            assert!(
                !d.admitted || start.elapsed() >= Duration::from_millis(998),
                "{} admitted right after the wall clock stepped forward: {d:?}",
                l.name()
            );
        }
        assert_wall_offset(&node, &mut con, "after-step-forward", 3600).await;

        // A request every 100 ms for 3 s; the first admit comes a second after the drain.
        let mut first_admit: [Option<Duration>; 2] = [None; 2];
        for _ in 0..30 {
            for ((l, n), first) in limits.iter().zip(&mut admitted).zip(&mut first_admit) {
                if l.ask(&mut con, 1).await.admitted {
                    *n += 1;
                    first.get_or_insert(start.elapsed());
                }
            }
            if start.elapsed() >= Duration::from_secs(3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ran = start.elapsed().as_secs_f64();
        for ((l, n), first) in limits.iter().zip(admitted).zip(first_admit) {
            println!(
                "{}: {n} admitted in {ran:.2} s, the first after the step at {first:?}",
                l.name()
            );
            assert!(
                n as f64 <= l.most_in(ran),
                "{} admitted {n} in {ran:.2} s from full: the step forward gave extra burst",
                l.name()
            );
            let first = first.unwrap_or_else(|| {
                panic!(
                    "{} admitted nothing within {ran:.2} s of the drain",
                    l.name()
                )
            });
            assert!(
                first >= Duration::from_millis(998),
                "{} admitted again {first:?} after the drain, before a second passed",
                l.name()
            );
        }
    })
    .await;
}

/// A node restarted after its wall clock stepped back an hour resumes its limits where they
/// were: its time starts from the snapshot's, so a drained bucket is still drained (not full)
/// and refills at its rate, and no reply asks for the hour (retry-after and reset stay within
/// the 10 s an empty bucket of 3 per 10 s needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_step_back_resumes_the_limits() {
    bounded(async {
        let clock = SteppedClock::new();
        let data = temp_dir("clock-steps-data");
        let data_s = data.display().to_string();
        let args = [
            "--shards",
            "2",
            "--data-dir",
            &data_s,
            "--save-interval",
            "1",
        ];
        let mut node = clock.start_node(&args);
        let mut con = connect_url(&format!("redis://{}/", node.addr)).await;
        assert_wall_offset(&node, &mut con, "first-node", 0).await;

        let limits = both_commands("restart", 3, 3, 10);
        let drained = Instant::now();
        for l in &limits {
            assert_eq!(l.drain(&mut con).await, 3, "{} admits its burst", l.name());
        }
        clock.set_offset(-3600);
        assert_wall_offset(&node, &mut con, "first-node-stepped", -3600).await;
        drop(con);
        let status = node.stop(Duration::from_secs(20));
        assert!(status.success(), "bucketd exits cleanly: {status:?}");
        assert!(
            node.log().contains("snapshot saved"),
            "a graceful stop saves the snapshot; log:\n{}",
            node.log()
        );
        drop(node);

        let node = clock.start_node(&args);
        let mut con = connect_url(&format!("redis://{}/", node.addr)).await;
        assert_wall_offset(&node, &mut con, "second-node", -3600).await;
        // Still drained, as far as the time since the drain allows: one unit per 3.33 s.
        for l in &limits {
            let d = l.ask(&mut con, 0).await;
            let since = drained.elapsed().as_secs_f64();
            let most = (since * l.rate() * 1.001).floor() as i64;
            assert!(
                d.remaining <= most,
                "{} after the restart, {since:.2} s after the drain: {d:?} (at most {most} \
                 remaining): the bucket lost its state",
                l.name()
            );
        }

        // It admits again within the refill time of one unit (3.33 s, some of which passed
        // before the restart), and every reply meanwhile stays within the limit's figures.
        let start = Instant::now();
        let mut first_admit: [Option<Duration>; 2] = [None; 2];
        for _ in 0..120 {
            for (l, first) in limits.iter().zip(&mut first_admit) {
                if first.is_none() && l.ask(&mut con, 1).await.admitted {
                    *first = Some(start.elapsed());
                }
            }
            if first_admit.iter().all(Option::is_some) || start.elapsed() >= Duration::from_secs(12)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (l, first) in limits.iter().zip(first_admit) {
            println!("{}: first admit after the restart at {first:?}", l.name());
            let first = first.unwrap_or_else(|| {
                panic!(
                    "{} admitted nothing within {:.2} s of the restart; log:\n{}",
                    l.name(),
                    start.elapsed().as_secs_f64(),
                    node.log()
                )
            });
            assert!(
                first <= Duration::from_secs(10),
                "{} took {first:?} to admit again, longer than the limit's refill",
                l.name()
            );
        }
        drop(node);
        let _ = std::fs::remove_dir_all(&data);
    })
    .await;
}

/// Log timestamps read as the UNIX time they name.
#[test]
fn log_times_read_as_unix_seconds() {
    assert_eq!(log_time("1970-01-01T00:00:00Z x"), Some(0.0));
    assert_eq!(
        log_time("2023-11-14T22:13:20.5Z  INFO bucketd: x"),
        Some(1_700_000_000.5)
    );
    assert_eq!(log_time("2000-03-01T00:00:00Z"), Some(951_868_800.0));
    assert_eq!(log_time("not a time"), None);
}
