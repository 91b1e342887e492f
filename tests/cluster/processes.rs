//! Real processes: three `bucketd` binaries on real clocks. `kill -9` the leader of a key's
//! group, the group serves again with the bucket intact, the killed node comes back and leads
//! again; then `kill -9` all three and start them: the bucket is still there. And, under
//! libfaketime, wall clocks stepped while the nodes run and a leader paused (`SIGSTOP`): the
//! followers that take over, their clocks 30 s ahead, grant nothing for them, and no write
//! is counted twice behind its client's back.

use crate::harness::*;
use bucketd::testing::ClusterSpec;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// One token back per hour: during the test real time refills nothing.
fn check(key: &str, quantity: &'static str) -> Vec<String> {
    line(&["CL.THROTTLE", key, "99", "1", "3600", quantity])
}

/// The three processes; each is killed (SIGKILL) when dropped, so a failed test leaves
/// nothing running.
struct Procs {
    spec_arg: String,
    dir: TempDir,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    /// Per node, when it runs under libfaketime: the file its wall clock's offset is read
    /// from at every reading.
    clock_files: Vec<Option<std::path::PathBuf>>,
}

/// Debian's libfaketime, which the clock tests preload; they fail when it is missing.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl Procs {
    fn start(tag: &str) -> Procs {
        let spec = local_spec(3, GROUPS);
        Procs {
            spec_arg: ClusterSpec::format_nodes(&spec.nodes),
            dir: TempDir::new(tag),
            ports: spec.nodes.iter().map(|n| n.port).collect(),
            children: vec![None, None, None],
            clock_files: vec![None, None, None],
        }
    }

    /// Node `id` runs under libfaketime, its wall clock off by what `set_offset` says (none
    /// at first), its monotonic clock true, as NTP steps a clock.
    fn fake_clock(&mut self, id: u64) {
        assert!(
            std::path::Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} is missing: apt-get install -y faketime libfaketime"
        );
        let file = self.dir.path().join(format!("node-{id}.faketime"));
        std::fs::write(&file, "+0").expect("write the clock file");
        self.clock_files[id as usize - 1] = Some(file);
    }

    /// Steps node `id`'s wall clock to `offset_s` seconds from the true time, at once.
    fn set_offset(&self, id: u64, offset_s: i64) {
        let file = self.clock_files[id as usize - 1]
            .as_ref()
            .expect("the node runs under libfaketime");
        std::fs::write(file, format!("{offset_s:+}")).expect("write the clock file");
    }

    /// Pauses (`SIGSTOP`) or resumes (`SIGCONT`) node `id`.
    fn signal(&self, id: u64, sig: &str) {
        let child = self.children[id as usize - 1]
            .as_ref()
            .expect("process is running");
        let st = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(st.success(), "kill {sig} {}", child.id());
    }

    fn spawn(&mut self, id: u64) {
        let i = id as usize - 1;
        assert!(self.children[i].is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .expect("log file");
        let mut cmd = Command::new(BIN);
        if let Some(file) = &self.clock_files[i] {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .args(["--bind", "127.0.0.1", "--port", &self.ports[i].to_string()])
            .args(["--shards", "1", "--groups", &GROUPS.to_string()])
            .args([
                "--cluster-nodes",
                &self.spec_arg,
                "--node-id",
                &id.to_string(),
            ])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("node-{id}")))
            .args(["--log", "warn"])
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("bucketd starts");
        self.children[i] = Some(child);
    }

    /// `kill -9`.
    fn kill(&mut self, id: u64) {
        let mut child = self.children[id as usize - 1]
            .take()
            .expect("process is running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.ports[id as usize - 1])
    }

    fn addrs(&self) -> Vec<String> {
        (1..=3).map(|id| self.addr(id)).collect()
    }

    fn id_of(&self, addr: &str) -> u64 {
        (1..=3)
            .find(|&id| self.addr(id) == addr)
            .unwrap_or_else(|| panic!("{addr} is not a node"))
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What `CLUSTER INFO` on `addr` says `field` is.
async fn cluster_info(addr: &str, field: &str) -> Option<String> {
    let mut conn = Conn::connect(addr).await.ok()?;
    let text = conn.call(&["CLUSTER", "INFO"]).await.ok()?;
    let Resp::Bulk(Some(b)) = text else {
        return None;
    };
    String::from_utf8_lossy(&b).lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// The node ids `addr` names as masters in `CLUSTER SHARDS`, one per group.
async fn masters(p: &Procs, addr: &str) -> Option<Vec<u64>> {
    let mut conn = Conn::connect(addr).await.ok()?;
    let shards = conn.call(&["CLUSTER", "SHARDS"]).await.ok()?;
    let mut out = Vec::new();
    for shard in shards.array() {
        let shard = shard.array();
        let nodes = shard.get(3)?.array();
        for n in nodes {
            let kv = n.array();
            let field = |name: &str| {
                kv.chunks(2)
                    .find(|p| p[0].text() == name)
                    .map(|p| p[1].clone())
            };
            if field("role")?.text() == "master" {
                let port = field("port")?.int();
                out.push(p.id_of(&format!("127.0.0.1:{port}")));
            }
        }
    }
    Some(out)
}

async fn wait_cluster_ok(p: &Procs, ids: &[u64]) {
    for &id in ids {
        wait_for(
            &format!("node {id} to report cluster_state:ok"),
            Duration::from_secs(20),
            || async { (cluster_info(&p.addr(id), "cluster_state").await? == "ok").then_some(()) },
        )
        .await;
    }
}

/// Takes one token through `client`; returns what is left and which node answered.
async fn take(p: &Procs, client: &mut Router, key: &str, left: i64) -> (i64, u64) {
    let args = check(key, "1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (reply, route) = client.call(&args, SERVE).await;
    let l = reply.limit();
    assert_step(key, left, l[2], -1, &route);
    assert_eq!([l[0], l[1], l[3]], [0, 100, -1]);
    (l[2], p.id_of(&route.addr))
}

/// What is left in the bucket, asked through the cluster; and which node answered.
async fn peek(p: &Procs, client: &mut Router, key: &str) -> (i64, u64) {
    let args = check(key, "0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (reply, route) = client.call(&args, SERVE).await;
    (reply.limit()[2], p.id_of(&route.addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_processes_lose_no_acknowledged_check() {
    bounded(async {
        let mut p = Procs::start("procs");
        for id in 1..=3 {
            p.spawn(id);
        }
        wait_cluster_ok(&p, &[1, 2, 3]).await;

        let key = "procs:{tenant-9}";
        let mut client = Router::new(p.addrs());
        let mut left = 100;
        let mut leader = 0;
        for _ in 0..5 {
            (left, leader) = take(&p, &mut client, key, left).await;
        }

        // kill -9 the leader: another replica serves the bucket as it was acknowledged.
        let t0 = Instant::now();
        p.kill(leader);
        let (now, by) = peek(&p, &mut client, key).await;
        println!(
            "processes: after kill -9 of node {leader}, node {by} served the group after {:?}",
            t0.elapsed()
        );
        assert_ne!(by, leader);
        assert_eq!(now, left);
        (left, _) = take(&p, &mut client, key, left).await;

        // The killed node comes back, catches up and is given groups to lead again.
        p.spawn(leader);
        wait_cluster_ok(&p, &[leader]).await;
        let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
        wait_for(
            &format!("node {leader} to lead groups again"),
            Duration::from_secs(20),
            || async {
                let mut views = Vec::new();
                for id in [leader, others[0], others[1]] {
                    views.push(masters(&p, &p.addr(id)).await?);
                }
                let agree = views.iter().all(|v| *v == views[0]);
                (agree && views[0].contains(&leader)).then_some(())
            },
        )
        .await;
        let mut direct = Router::new(vec![p.addr(leader)]);
        assert_eq!(peek(&p, &mut direct, key).await.0, left);

        // kill -9 everything, start everything: the bucket is still there.
        for id in 1..=3 {
            p.kill(id);
        }
        for id in 1..=3 {
            p.spawn(id);
        }
        wait_cluster_ok(&p, &[1, 2, 3]).await;
        let mut client = Router::new(p.addrs());
        assert_eq!(peek(&p, &mut client, key).await.0, left);
        take(&p, &mut client, key, left).await;
    })
    .await;
}

/// What one non-retrying client saw of its writes to one key.
#[derive(Default, Debug)]
struct Outcomes {
    /// Admitted (a limit) or acknowledged (INCR).
    acked: i64,
    /// Refused by the limit.
    limited: i64,
    /// `-MOVED`, `-CLUSTERDOWN`, `-TRYAGAIN`: not applied.
    refused: i64,
    /// `-UNKNOWN`, or the connection lost or timed out after sending: may have been applied.
    ambiguous: i64,
}

/// Sends `args` once a round, for `run`, to the node it believes leads the key's group
/// (following `-MOVED` for the next round, never retrying), and classifies each outcome.
async fn one_shot_client(addrs: Vec<String>, args: Vec<String>, run: Duration) -> Outcomes {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut out = Outcomes::default();
    let mut target = addrs[0].clone();
    let mut conn: Option<Conn> = None;
    let mut next = 0;
    let t0 = Instant::now();
    while t0.elapsed() < run {
        if conn.is_none() {
            conn = Conn::connect(&target).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            next += 1;
            target = addrs[next % addrs.len()].clone();
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        match c.call_within(&args, Duration::from_secs(3)).await {
            Ok(Resp::Int(_)) => out.acked += 1,
            Ok(Resp::Array(Some(v))) if v.len() == 5 => {
                if v[0] == Resp::Int(0) {
                    out.acked += 1;
                } else {
                    out.limited += 1;
                }
            }
            Ok(Resp::Error(e)) if e.starts_with("MOVED ") => {
                out.refused += 1;
                target = parse_moved(&e).expect("a MOVED reply").1;
                conn = None;
            }
            Ok(Resp::Error(e)) if e.starts_with("CLUSTERDOWN") || e.starts_with("TRYAGAIN") => {
                out.refused += 1;
                next += 1;
                target = addrs[next % addrs.len()].clone();
                conn = None;
            }
            Ok(Resp::Error(e)) if e.starts_with("UNKNOWN") => out.ambiguous += 1,
            Ok(other) => panic!("{args:?} answered {other:?}"),
            Err(_) => {
                out.ambiguous += 1;
                next += 1;
                target = addrs[next % addrs.len()].clone();
                conn = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    out
}

/// The leader of a key's group is paused with `SIGSTOP` while non-retrying clients write to
/// it, and the followers that take over have wall clocks stepped 30 s ahead while running.
/// A bucket of one request a second, emptied at the start, admits no more than a request per
/// second that really passed (it would have granted the 30 s at once had the new leader
/// decided by its own clock), and a counter holds every acknowledged INCR plus at most the
/// ones whose outcome was unknown: no `-MOVED`, `-CLUSTERDOWN` or `-TRYAGAIN` was given for a
/// write that was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_and_clocks_stepped_ahead_grant_nothing_and_count_nothing_twice() {
    bounded(async {
        let mut p = Procs::start("procs-clocks");
        for id in 1..=3 {
            p.fake_clock(id);
            p.spawn(id);
        }
        wait_cluster_ok(&p, &[1, 2, 3]).await;
        let bucket = "clocks:{tenant-3}";
        let counter = "clocks:{tenant-3}:count";
        // The bucket: a burst of 60, one back per second; emptied now.
        let check = line(&["CL.THROTTLE", bucket, "59", "1", "1", "1"]);
        let mut client = Router::new(p.addrs());
        let (reply, route) = client
            .call(&["CL.THROTTLE", bucket, "59", "1", "1", "60"], SERVE)
            .await;
        let t0 = Instant::now();
        assert_eq!(reply.limit()[..3], [0, 60, 0], "{reply:?}");
        let leader = p.id_of(&route.addr);
        for id in (1..=3).filter(|&id| id != leader) {
            p.set_offset(id, 30);
        }

        let run = Duration::from_secs(8);
        let limits = tokio::spawn(one_shot_client(p.addrs(), check.clone(), run));
        let counts = tokio::spawn(one_shot_client(p.addrs(), line(&["INCR", counter]), run));
        tokio::time::sleep(Duration::from_secs(2)).await;
        p.signal(leader, "-STOP");
        tokio::time::sleep(Duration::from_secs(3)).await;
        p.signal(leader, "-CONT");
        let limits = limits.await.expect("bucket client");
        let counts = counts.await.expect("counter client");
        // Counted from the moment the bucket was emptied (its reply came a little later).
        let elapsed = t0.elapsed().as_secs_f64() + 0.5;
        println!(
            "processes: paused node {leader} for 3 s, the others 30 s ahead; bucket {limits:?} \
             over {elapsed:.1} s; counter {counts:?}"
        );
        assert!(
            limits.refused + limits.ambiguous > 0 || counts.refused + counts.ambiguous > 0,
            "the pause went unnoticed: {limits:?} {counts:?}"
        );
        // One a second for the time that passed, and one for the second under way.
        let most = 1.0 + elapsed * 1.001;
        assert!(
            (limits.acked as f64) <= most + limits.ambiguous as f64,
            "{} admits in {elapsed:.1} s, at most {most:.1} plus {} of unknown outcome",
            limits.acked,
            limits.ambiguous
        );
        let (reply, _) = client.call(&["GET", counter], SERVE).await;
        let value: i64 = reply.text().parse().expect("a counter");
        assert!(
            (counts.acked..=counts.acked + counts.ambiguous).contains(&value),
            "the counter holds {value}: {counts:?}"
        );
    })
    .await;
}
