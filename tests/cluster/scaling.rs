//! Scaling under load, with real processes: the cluster goes 3 → 4 → 5 → 4 → 3 nodes (node 4
//! and node 5 join, then node 5 and node 4 are removed again, the founders stay) while three
//! kinds of clients with their default settings send `CL.THROTTLE` over a set of keys: the
//! `redis` crate's async cluster client, redis-py's `RedisCluster` (tests/py/scale_load.py)
//! and `redis-cli -c`. The clients may see `-MOVED` and nothing else: no error reaches the
//! application, no key admits more than its limit, and every admit a client was told of is the
//! one the bucket took (none lost, none extra). Keys written before the load keep their state
//! through the moves. Each step settles within a bound: STATUS lists exactly the members, all
//! up, no move left, replicas and leaderships even, CLUSTER SLOTS and CLUSTER INFO agree on
//! every member; a removed node, still running, says it was removed and sends clients on to a
//! member with `-MOVED`. A probe that writes to
//! one key per group, one write at a time, prints how long writes wait while replicas and
//! leaderships move, against steady state.
//!
//! `SCALING_KEEP_LOGS=1` keeps the nodes' logs in /tmp/scaling-logs, or in `SCALING_LOGS_TO`
//! (a failed run always does); `SCALING_LOG` sets their log filter (default `warn`).

use crate::common::tools::{REDIS_CLI, REDIS_PY, require_python, require_tool};
use crate::harness::*;
use bucketd::testing::ClusterSpec;
use redis::cluster_async::ClusterConnection;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// Keys the load uses, `scale:0` .. `scale:199`.
const KEYS: usize = 200;
const PREFIX: &str = "scale:";
/// `CL.THROTTLE k 99 1 3600 1`: 100 admits, then one token back per hour (nothing in a test).
const LIMIT: i64 = 100;
/// The load starts on `FIRST` keys and takes `STEP` more every `STEP_SECS`, so buckets run
/// out all along the run, not only in its first seconds.
const FIRST: usize = 20;
const STEP: usize = 20;
const STEP_SECS: f64 = 4.0;
/// The load stops when the scenario ends, and at the latest after this long...
const LOAD_MAX: Duration = Duration::from_secs(60);
/// ... or after this many requests per client task (redis crate, redis-py), or for redis-cli.
const MAX_REQUESTS: u64 = 40_000;
const MAX_CLI_REQUESTS: u64 = 1_500;
/// Tasks sharing the redis crate's cluster connection.
const CRATE_TASKS: usize = 4;
/// How long one step (a join or a removal) may take to settle.
const SETTLE: Duration = Duration::from_secs(20);
/// Steady state between the steps, so the probe has something to compare the moves with.
const DWELL: Duration = Duration::from_millis(1500);
/// Keys written once before the load and checked after it: state the moves must carry along.
const FILL: usize = if cfg!(debug_assertions) {
    // A debug build serves an order of magnitude fewer requests per second.
    4_000
} else {
    20_000
};
const FILL_TASKS: usize = 16;
/// Replicas per group.
const R: usize = 3;

/// The phases of the scenario, as the probe labels its samples; odd ones are moves.
const PHASES: [&str; 9] = [
    "3 nodes",
    "3 -> 4 (join)",
    "4 nodes",
    "4 -> 5 (join)",
    "5 nodes",
    "5 -> 4 (remove 5)",
    "4 nodes again",
    "4 -> 3 (remove 4)",
    "3 nodes again",
];

/// The keys in use `elapsed` after the load started.
fn window(elapsed: Duration) -> usize {
    (FIRST + STEP * (elapsed.as_secs_f64() / STEP_SECS) as usize).min(KEYS)
}

fn key(i: usize) -> String {
    format!("{PREFIX}{i}")
}

/// The nodes' log filter: `warn`, or `SCALING_LOG` (e.g. `warn,openraft=info`).
fn log_filter() -> String {
    std::env::var("SCALING_LOG").unwrap_or_else(|_| "warn".into())
}

/// One `bucketd` process: a founder (`id` known) or a node that joined (`id` from STATUS).
struct Proc {
    name: String,
    id: Option<u64>,
    port: u16,
    child: Option<Child>,
}

/// Every process of the scenario; each is killed (SIGKILL) when dropped. A failed scenario (or
/// `SCALING_KEEP_LOGS=1`) leaves the nodes' logs in /tmp/scaling-logs or `SCALING_LOGS_TO`.
struct Procs {
    spec_arg: String,
    dir: TempDir,
    procs: Vec<Proc>,
}

impl Procs {
    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log file")
    }

    fn start(&mut self, name: String, id: Option<u64>, port: u16, args: Vec<String>) -> usize {
        let log = self.log(&name);
        let child = Command::new(BIN)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--shards", "1"])
            .args(args)
            .arg("--data-dir")
            .arg(self.dir.path().join(&name))
            .args(["--log", &log_filter()])
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("bucketd starts");
        self.procs.push(Proc {
            name,
            id,
            port,
            child: Some(child),
        });
        self.procs.len() - 1
    }

    fn founder(&mut self, id: u64, port: u16) {
        let args = vec![
            "--groups".to_string(),
            GROUPS.to_string(),
            "--cluster-nodes".to_string(),
            self.spec_arg.clone(),
            "--node-id".to_string(),
            id.to_string(),
        ];
        self.start(format!("node-{id}"), Some(id), port, args);
    }

    /// Starts a node that joins through node 1; returns its index.
    fn joiner(&mut self) -> usize {
        let n = self.procs.len() + 1;
        let args = vec![
            "--peer-port".to_string(),
            free_port().to_string(),
            "--join".to_string(),
            self.addr(0),
        ];
        self.start(format!("joined-{n}"), None, free_port(), args)
    }

    fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.procs[i].port)
    }

    fn founder_addrs(&self) -> Vec<String> {
        (0..3).map(|i| self.addr(i)).collect()
    }

    /// Whether every process still runs (none exited by itself).
    fn check_alive(&mut self) -> Result<(), String> {
        for p in &mut self.procs {
            if let Some(c) = p.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!("{} (id {:?}) exited: {status}", p.name, p.id));
            }
        }
        Ok(())
    }

    fn keep_logs(&self) {
        let to = std::env::var_os("SCALING_LOGS_TO")
            .map_or_else(|| PathBuf::from("/tmp/scaling-logs"), PathBuf::from);
        let _ = std::fs::create_dir_all(&to);
        for p in &self.procs {
            let f = format!("{}.log", p.name);
            let _ = std::fs::copy(self.dir.path().join(&f), to.join(&f));
        }
        println!(
            "scaling: node logs copied from {} to {}",
            self.dir.path().display(),
            to.display()
        );
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(mut c) = p.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() || std::env::var_os("SCALING_KEEP_LOGS").is_some() {
            self.keep_logs();
        }
    }
}

/// A RESP2 map (a flat array of names and values) by name.
fn fields(r: &Resp) -> Option<HashMap<String, Resp>> {
    let Resp::Array(Some(items)) = r else {
        return None;
    };
    Some(
        items
            .chunks(2)
            .filter(|kv| kv.len() == 2)
            .filter_map(|kv| match &kv[0] {
                Resp::Bulk(Some(b)) => {
                    Some((String::from_utf8_lossy(b).into_owned(), kv[1].clone()))
                }
                Resp::Simple(s) => Some((s.clone(), kv[1].clone())),
                _ => None,
            })
            .collect(),
    )
}

#[derive(Debug, Clone)]
struct Member {
    id: u64,
    address: String,
    state: String,
    replicas: i64,
    leaders: i64,
}

#[derive(Debug, Clone)]
struct Status {
    moves: i64,
    version: i64,
    members: Vec<Member>,
}

/// `BK.CLUSTER STATUS` as node `addr` answers it.
async fn status(addr: &str) -> Result<Status, String> {
    let mut conn = Conn::connect(addr)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let r = conn
        .call(&["BK.CLUSTER", "STATUS"])
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let m = fields(&r).ok_or_else(|| format!("{addr}: STATUS replied {r:?}"))?;
    let int = |m: &HashMap<String, Resp>, k: &str| match m.get(k) {
        Some(Resp::Int(v)) => Ok(*v),
        other => Err(format!("{addr}: STATUS {k} is {other:?}")),
    };
    let text = |m: &HashMap<String, Resp>, k: &str| match m.get(k) {
        Some(Resp::Bulk(Some(b))) => Ok(String::from_utf8_lossy(b).into_owned()),
        Some(Resp::Simple(s)) => Ok(s.clone()),
        other => Err(format!("{addr}: STATUS {k} is {other:?}")),
    };
    let mut members = Vec::new();
    for item in m.get("members").map(Resp::array).unwrap_or_default() {
        let f = fields(item).ok_or_else(|| format!("{addr}: member {item:?}"))?;
        members.push(Member {
            id: int(&f, "id")? as u64,
            address: text(&f, "address")?,
            state: text(&f, "state")?,
            replicas: int(&f, "replicas")?,
            leaders: int(&f, "leaders")?,
        });
    }
    Ok(Status {
        moves: int(&m, "moves_in_progress")?,
        version: int(&m, "version")?,
        members,
    })
}

/// Whether the cluster has settled on exactly the members at `addrs`: node 1 lists them all
/// up, no move is left, replicas and leaderships are spread evenly (floor or ceil of R*G/N and
/// G/N), every group is led, and every member reports the same metadata version.
async fn settled(addrs: &[String]) -> Result<Status, String> {
    let st = status(&addrs[0]).await?;
    let mut have: Vec<&str> = st.members.iter().map(|m| m.address.as_str()).collect();
    have.sort_unstable();
    let mut want: Vec<&str> = addrs.iter().map(String::as_str).collect();
    want.sort_unstable();
    if have != want {
        return Err(format!("members {have:?}, want {want:?}"));
    }
    if let Some(m) = st.members.iter().find(|m| m.state != "up") {
        return Err(format!("node {} is {}", m.id, m.state));
    }
    if st.moves != 0 {
        return Err(format!("{} moves in progress", st.moves));
    }
    let n = addrs.len();
    let g = GROUPS as usize;
    let (rlo, rhi) = (R * g / n, (R * g).div_ceil(n));
    let (llo, lhi) = (g / n, g.div_ceil(n));
    for m in &st.members {
        if !(rlo..=rhi).contains(&(m.replicas as usize)) {
            return Err(format!(
                "node {} holds {} replicas, want {rlo}..={rhi}",
                m.id, m.replicas
            ));
        }
        if !(llo..=lhi).contains(&(m.leaders as usize)) {
            return Err(format!(
                "node {} leads {} groups, want {llo}..={lhi}",
                m.id, m.leaders
            ));
        }
    }
    let led: i64 = st.members.iter().map(|m| m.leaders).sum();
    if led != g as i64 {
        return Err(format!("{led} of {g} groups have a leader"));
    }
    for a in &addrs[1..] {
        let other = status(a).await?;
        if other.version != st.version || other.moves != 0 {
            return Err(format!(
                "{a} is at version {} with {} moves; node 1 at {}",
                other.version, other.moves, st.version
            ));
        }
    }
    let ports: Vec<i64> = addrs
        .iter()
        .map(|a| {
            a.rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    for a in addrs {
        let (named, covered) = slot_view(a).await?;
        if covered != 16384 || named.len() != R * g || named.iter().any(|p| !ports.contains(p)) {
            return Err(format!(
                "{a}: CLUSTER SLOTS covers {covered} slots with nodes {named:?}; members {ports:?}"
            ));
        }
    }
    for a in addrs {
        let state = cluster_info(a, "cluster_state").await;
        if state.as_deref() != Some("ok") {
            return Err(format!("{a}: CLUSTER INFO says cluster_state {state:?}"));
        }
    }
    Ok(st)
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

/// Waits (at most `SETTLE`) until the cluster settles on the members at `addrs`; returns the
/// status and how long it took, or what it is still waiting for.
async fn settle(p: &mut Procs, what: &str, addrs: &[String]) -> Result<(Status, Duration), String> {
    let t0 = Instant::now();
    loop {
        p.check_alive().map_err(|e| format!("{what}: {e}"))?;
        let last = match settled(addrs).await {
            Ok(st) => return Ok((st, t0.elapsed())),
            Err(e) => e,
        };
        if t0.elapsed() > SETTLE {
            let st = status(&addrs[0]).await;
            return Err(format!(
                "{what}: not settled after {SETTLE:?}: {last}\nstatus: {st:#?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a key command on the removed node at `addr` gets once its STATUS says it was removed
/// (or after `REMOVED_KNOWS`), whether it said so, and how long that took.
async fn removed_answers(addr: &str) -> (Resp, bool, Duration) {
    let t0 = Instant::now();
    let mut conn = Conn::connect(addr)
        .await
        .expect("the removed node still runs");
    loop {
        let st = conn.must(&["BK.CLUSTER", "STATUS"]).await;
        let says = st
            .array()
            .chunks(2)
            .any(|kv| kv[0].text() == "this_node" && kv[1].text() == "removed");
        if says || t0.elapsed() > REMOVED_KNOWS {
            let r = conn
                .must(&["CL.THROTTLE", &key(0), "99", "1", "3600", "0"])
                .await;
            return (r, says, t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How soon after it left STATUS a removed node must know it (the cluster gives it 2 s to
/// hear the commit before it drops it from the metadata group).
const REMOVED_KNOWS: Duration = Duration::from_secs(5);

/// The ports `CLUSTER SLOTS` on `addr` names first (as the leader) for each range.
async fn slot_owners(addr: &str) -> Option<Vec<i64>> {
    let mut conn = Conn::connect(addr).await.ok()?;
    let r = conn.call(&["CLUSTER", "SLOTS"]).await.ok()?;
    let Resp::Array(Some(ranges)) = r else {
        return None;
    };
    ranges
        .iter()
        .map(|range| match range {
            Resp::Array(Some(v)) if v.len() > 2 => match &v[2] {
                Resp::Array(Some(node)) if node.len() > 1 => Some(node[1].int()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Every port `CLUSTER SLOTS` on `addr` names, and how many slots its ranges cover.
async fn slot_view(addr: &str) -> Result<(Vec<i64>, i64), String> {
    let mut conn = Conn::connect(addr)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let r = conn
        .call(&["CLUSTER", "SLOTS"])
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let Resp::Array(Some(ranges)) = &r else {
        return Err(format!("{addr}: CLUSTER SLOTS replied {r:?}"));
    };
    let (mut ports, mut covered) = (Vec::new(), 0);
    for range in ranges {
        let v = range.array();
        covered += v[1].int() - v[0].int() + 1;
        for node in &v[2..] {
            ports.push(node.array()[1].int());
        }
    }
    Ok((ports, covered))
}

fn show(st: &Status) -> String {
    st.members
        .iter()
        .map(|m| format!("{}: {} replicas, {} leaders", m.id, m.replicas, m.leaders))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What one load client counted.
#[derive(Default)]
struct Counts {
    requests: u64,
    admits: HashMap<String, i64>,
    refusals: HashMap<String, i64>,
    errors: Vec<String>,
    n_errors: u64,
    /// Per key: writes answered `-UNKNOWN` (may have been applied); an application sees
    /// them as errors, but they may happen on a loaded machine, and are accounted for.
    unknown: HashMap<String, i64>,
}

impl Counts {
    fn reply(&mut self, key: &str, limited: i64) {
        let to = if limited == 0 {
            &mut self.admits
        } else {
            &mut self.refusals
        };
        *to.entry(key.to_string()).or_default() += 1;
    }

    fn error(&mut self, t0: Instant, key: &str, e: String) {
        if e.contains("UNKNOWN") {
            *self.unknown.entry(key.to_string()).or_default() += 1;
            return;
        }
        self.n_errors += 1;
        if self.errors.len() < 20 {
            self.errors
                .push(format!("{:.3}s {key}: {e}", t0.elapsed().as_secs_f64()));
        }
    }

    fn add(&mut self, other: Counts) {
        self.requests += other.requests;
        for (k, v) in other.admits {
            *self.admits.entry(k).or_default() += v;
        }
        for (k, v) in other.refusals {
            *self.refusals.entry(k).or_default() += v;
        }
        self.errors.extend(other.errors);
        self.n_errors += other.n_errors;
        for (k, v) in other.unknown {
            *self.unknown.entry(k).or_default() += v;
        }
    }

    fn admitted(&self) -> i64 {
        self.admits.values().sum()
    }

    fn refused(&self) -> i64 {
        self.refusals.values().sum()
    }
}

/// One task on the redis crate's cluster connection.
async fn crate_load(
    mut con: ClusterConnection,
    task: usize,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> Counts {
    let mut c = Counts::default();
    let mut i = task * 5;
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < LOAD_MAX && c.requests < MAX_REQUESTS {
        let k = key(i % window(t0.elapsed()));
        i += 13;
        c.requests += 1;
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            redis::cmd("CL.THROTTLE")
                .arg(&k)
                .arg(99)
                .arg(1)
                .arg(3600)
                .arg(1)
                .query_async::<Vec<i64>>(&mut con),
        )
        .await;
        match r {
            Ok(Ok(v)) if v.len() == 5 => c.reply(&k, v[0]),
            Ok(Ok(v)) => c.error(t0, &k, format!("unexpected reply {v:?}")),
            Ok(Err(e)) => c.error(t0, &k, format!("{:?}: {e}", e.kind())),
            Err(_) => c.error(t0, &k, "no reply within 10 s".into()),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    c
}

/// Runs `CL.THROTTLE scale:fill:i 9 1 3600 quantity` on every fill key, `FILL_TASKS` at a
/// time, for at most 30 s; returns how many replies were not `[0, 10, want, ..]` (or keys not
/// reached), and the first few of them.
async fn fill(con: &ClusterConnection, quantity: i64, want: i64) -> (usize, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let tasks: Vec<_> = (0..FILL_TASKS)
        .map(|t| {
            let mut con = con.clone();
            tokio::spawn(async move {
                let mut bad = Vec::new();
                for i in (t..FILL).step_by(FILL_TASKS) {
                    if Instant::now() > deadline {
                        bad.push(format!("{PREFIX}fill:{i}: not reached within 30 s"));
                        continue;
                    }
                    let k = format!("{PREFIX}fill:{i}");
                    let r = tokio::time::timeout(
                        Duration::from_secs(10),
                        redis::cmd("CL.THROTTLE")
                            .arg(&k)
                            .arg(9)
                            .arg(1)
                            .arg(3600)
                            .arg(quantity)
                            .query_async::<Vec<i64>>(&mut con),
                    )
                    .await;
                    match r {
                        Ok(Ok(v)) if v.len() == 5 && v[..3] == [0, 10, want] => {}
                        other => bad.push(format!("{k}: {other:?}")),
                    }
                }
                bad
            })
        })
        .collect();
    let mut bad = Vec::new();
    for t in tasks {
        bad.extend(t.await.expect("fill task"));
    }
    let n = bad.len();
    bad.truncate(10);
    (n, bad)
}

/// `redis-cli -c`, one process per check, seeded with each founder in turn.
async fn cli_load(ports: Vec<u16>, t0: Instant, stop: Arc<AtomicBool>) -> Counts {
    let mut c = Counts::default();
    let mut i = 3;
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < LOAD_MAX && c.requests < MAX_CLI_REQUESTS
    {
        let k = key(i % window(t0.elapsed()));
        i += 13;
        let port = ports[c.requests as usize % ports.len()].to_string();
        c.requests += 1;
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::process::Command::new("redis-cli")
                .args(["-c", "-h", "127.0.0.1", "-p", &port])
                .args(["CL.THROTTLE", &k, "99", "1", "3600", "1"])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await;
        match out {
            Ok(Ok(out)) => {
                let text = String::from_utf8_lossy(&out.stdout);
                let nums: Vec<i64> = text
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                if out.status.success() && nums.len() == 5 && text.split_whitespace().count() == 5 {
                    c.reply(&k, nums[0]);
                } else {
                    let err = String::from_utf8_lossy(&out.stderr);
                    c.error(
                        t0,
                        &k,
                        format!(
                            "redis-cli -p {port} ({}): {} {}",
                            out.status,
                            text.trim(),
                            err.trim()
                        ),
                    );
                }
            }
            Ok(Err(e)) => panic!("redis-cli does not run: {e}"),
            Err(_) => c.error(
                t0,
                &k,
                format!("redis-cli -p {port} did not finish within 10 s"),
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c
}

/// What redis-py's script printed: its counts.
fn parse_py(stdout: &str) -> Counts {
    let mut c = Counts::default();
    let mut total = false;
    for l in stdout.lines() {
        let mut w = l.splitn(2, ' ');
        match (w.next(), w.next()) {
            (Some("count"), Some(rest)) => {
                let v: Vec<&str> = rest.split(' ').collect();
                assert_eq!(v.len(), 3, "scale_load.py printed {l:?}");
                c.admits
                    .insert(v[0].to_string(), v[1].parse().expect("a count"));
                c.refusals
                    .insert(v[0].to_string(), v[2].parse().expect("a count"));
            }
            (Some("error"), Some(rest)) => c.errors.push(rest.to_string()),
            (Some("unknown"), Some(rest)) => {
                let v: Vec<&str> = rest.split(' ').collect();
                assert_eq!(v.len(), 2, "scale_load.py printed {l:?}");
                c.unknown
                    .insert(v[0].to_string(), v[1].parse().expect("a count"));
            }
            (Some("total"), Some(rest)) => {
                let v: Vec<u64> = rest
                    .split(' ')
                    .map(|n| n.parse().expect("a count"))
                    .collect();
                c.requests = v[0];
                c.n_errors = v[1];
                total = true;
            }
            _ => panic!("scale_load.py printed {l:?}"),
        }
    }
    assert!(total, "scale_load.py did not finish its report:\n{stdout}");
    c
}

/// One write of the probe.
struct Sample {
    phase: usize,
    group: u32,
    done: Instant,
    latency: Duration,
}

#[derive(Default)]
struct Probe {
    samples: Vec<Sample>,
    moved: usize,
    /// Replies other than a limit or `-MOVED`, and lost connections: `(phase, text)`.
    other: Vec<(usize, String)>,
    /// Attempts whose outcome is unknown (an error after the command was sent).
    ambiguous: usize,
    admits: HashMap<String, i64>,
    unserved: usize,
}

/// Probe burst: the probe's keys never run out.
const PROBE_BURST: &str = "999999";

/// One client, one write at a time, to one key per group in turn: follows `-MOVED` itself and
/// on anything else tries a founder again 20 ms later, so each latency is how long that write
/// waited for its group.
async fn probe(
    founders: Vec<String>,
    keys: Vec<String>,
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Probe {
    let mut p = Probe::default();
    let mut conns: HashMap<String, Conn> = HashMap::new();
    let mut route: Vec<String> = vec![founders[0].clone(); keys.len()];
    let mut next = 0;
    while !stop.load(Ordering::Relaxed) {
        for (g, k) in keys.iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let start = Instant::now();
            let ph = phase.load(Ordering::Relaxed);
            let served = loop {
                if start.elapsed() > Duration::from_secs(10) {
                    break false;
                }
                let addr = route[g].clone();
                if !conns.contains_key(&addr) {
                    match Conn::connect(&addr).await {
                        Ok(c) => {
                            conns.insert(addr.clone(), c);
                        }
                        Err(e) => {
                            p.other.push((ph, format!("connect {addr}: {e}")));
                            next += 1;
                            route[g] = founders[next % founders.len()].clone();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    }
                }
                let conn = conns.get_mut(&addr).expect("connected");
                match conn
                    .call(&["CL.THROTTLE", k, PROBE_BURST, "1", "3600", "1"])
                    .await
                {
                    Ok(Resp::Error(e)) if e.starts_with("MOVED ") => {
                        p.moved += 1;
                        route[g] = parse_moved(&e).expect("a MOVED reply").1;
                    }
                    Ok(Resp::Array(Some(v))) if v.len() == 5 => {
                        if v[0] == Resp::Int(0) {
                            *p.admits.entry(k.clone()).or_default() += 1;
                        }
                        break true;
                    }
                    Ok(other) => {
                        if other.error().is_some_and(|e| e.starts_with("UNKNOWN")) {
                            p.ambiguous += 1;
                        }
                        p.other.push((ph, format!("{addr}: {other:?}")));
                        next += 1;
                        route[g] = founders[next % founders.len()].clone();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => {
                        p.ambiguous += 1;
                        p.other.push((ph, format!("{addr}: {e}")));
                        conns.remove(&addr);
                        next += 1;
                        route[g] = founders[next % founders.len()].clone();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            };
            if !served {
                p.unserved += 1;
                p.other.push((ph, format!("{k}: not served within 10 s")));
                continue;
            }
            let done = Instant::now();
            p.samples.push(Sample {
                phase: ph,
                group: g as u32,
                done,
                latency: done - start,
            });
        }
    }
    p
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}

/// Prints latency figures per phase and for moves against steady state; returns the longest.
fn report(p: &Probe) -> Duration {
    // The longest wait between two completed writes to the same group, by the phase of the later.
    let mut gaps = vec![Duration::ZERO; PHASES.len()];
    let mut last: HashMap<u32, Instant> = HashMap::new();
    for s in &p.samples {
        if let Some(prev) = last.insert(s.group, s.done) {
            gaps[s.phase] = gaps[s.phase].max(s.done - prev);
        }
    }
    let line = |name: &str, mut v: Vec<Duration>, gap: Option<Duration>| {
        v.sort_unstable();
        println!(
            "  {name:<20} writes {:>6}  p50 {:>8}  p99 {:>8}  max {:>8}{}",
            v.len(),
            ms(pct(&v, 0.5)),
            ms(pct(&v, 0.99)),
            ms(v.last().copied().unwrap_or_default()),
            gap.map(|g| format!("  longest pause of a group {:>8}", ms(g)))
                .unwrap_or_default()
        );
    };
    println!("scaling: probe latencies (one write at a time, a key per group):");
    for (i, name) in PHASES.iter().enumerate() {
        let v: Vec<Duration> = p
            .samples
            .iter()
            .filter(|s| s.phase == i)
            .map(|s| s.latency)
            .collect();
        line(name, v, Some(gaps[i]));
    }
    let moving: Vec<Duration> = p
        .samples
        .iter()
        .filter(|s| s.phase % 2 == 1)
        .map(|s| s.latency)
        .collect();
    let steady: Vec<Duration> = p
        .samples
        .iter()
        .filter(|s| s.phase % 2 == 0)
        .map(|s| s.latency)
        .collect();
    line("all moves", moving, None);
    line("all steady", steady, None);
    println!(
        "scaling: probe saw {} MOVED, {} other replies or lost connections, {} unserved",
        p.moved,
        p.other.len(),
        p.unserved
    );
    for (ph, e) in p.other.iter().take(20) {
        println!("  during {}: {e}", PHASES[*ph]);
    }
    p.samples
        .iter()
        .map(|s| s.latency)
        .max()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_see_only_moved_while_the_cluster_scales_under_load() {
    require_python(REDIS_PY);
    require_tool(REDIS_CLI);
    bounded(async {
        let t_start = Instant::now();
        let spec = local_spec(3, GROUPS);
        let spec_arg = ClusterSpec::format_nodes(&spec.nodes);
        let mut p = Procs {
            spec_arg,
            dir: TempDir::new("scaling"),
            procs: Vec::new(),
        };
        println!("scaling: data and logs in {}", p.dir.path().display());
        for n in &spec.nodes {
            p.founder(n.id, n.port);
        }
        let founders = p.founder_addrs();
        let (st, took) = settle(&mut p, "3 founders", &founders)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        println!("scaling: 3 founders settled in {took:?}: {}", show(&st));

        // State for the moves to carry: FILL keys, one token taken from each.
        let client = redis::cluster::ClusterClient::new(
            founders
                .iter()
                .map(|a| format!("redis://{a}/"))
                .collect::<Vec<_>>(),
        )
        .expect("cluster client");
        let con = client
            .get_async_connection()
            .await
            .expect("cluster connection");
        let t_fill = Instant::now();
        let (n, bad) = fill(&con, 1, 9).await;
        assert_eq!(n, 0, "filling {FILL} keys: {bad:#?}");
        println!("scaling: filled {FILL} keys in {:?}", t_fill.elapsed());

        // The load: the redis crate (several tasks on one connection), redis-py, redis-cli.
        let stop = Arc::new(AtomicBool::new(false));
        let stop_file = p.dir.path().join("stop-load");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/scale_load.py");
        let py = tokio::process::Command::new("python3")
            .arg(script)
            .args(["--port", &p.procs[1].port.to_string()])
            .args(["--prefix", PREFIX, "--keys", &KEYS.to_string()])
            .arg("--stop")
            .arg(&stop_file)
            .args(["--max-requests", &MAX_REQUESTS.to_string()])
            .args(["--max-seconds", &LOAD_MAX.as_secs().to_string()])
            .args(["--first", &FIRST.to_string(), "--step", &STEP.to_string()])
            .args([
                "--step-secs",
                &STEP_SECS.to_string(),
                "--pause",
                "0.001",
                "--offset",
                "11",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let t0 = Instant::now();
        let crate_tasks: Vec<_> = (0..CRATE_TASKS)
            .map(|t| tokio::spawn(crate_load(con.clone(), t, t0, stop.clone())))
            .collect();
        let cli_task = tokio::spawn(cli_load(
            p.procs[..3].iter().map(|n| n.port).collect(),
            t0,
            stop.clone(),
        ));
        let phase = Arc::new(AtomicUsize::new(0));
        let probe_keys: Vec<String> = (0..GROUPS)
            .map(|g| key_in_group(&spec, "scale:probe", g))
            .collect();
        let probe_task = tokio::spawn(probe(
            founders.clone(),
            probe_keys.clone(),
            phase.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(2 * DWELL).await;

        // Every check that fails is gathered here, so that one failure does not hide the
        // others (or what the clients saw), and asserted at the end.
        let mut failures: Vec<String> = Vec::new();
        'steps: {
            // 3 -> 4 -> 5: two nodes join.
            let mut members = founders.clone();
            let mut joined = Vec::new();
            for (step, want_id) in [(1, 4u64), (3, 5)] {
                phase.store(step, Ordering::Relaxed);
                let i = p.joiner();
                members.push(p.addr(i));
                let (st, took) = match settle(&mut p, PHASES[step], &members).await {
                    Ok(v) => v,
                    Err(e) => {
                        failures.push(e);
                        break 'steps;
                    }
                };
                let id = st
                    .members
                    .iter()
                    .find(|m| m.address == p.addr(i))
                    .expect("the new member")
                    .id;
                assert_eq!(id, want_id, "the cluster gave the new node id {id}");
                p.procs[i].id = Some(id);
                joined.push(i);
                println!(
                    "scaling: {} settled in {took:?} (load at {:?}): {}",
                    PHASES[step],
                    t0.elapsed(),
                    show(&st)
                );
                phase.store(step + 1, Ordering::Relaxed);
                tokio::time::sleep(DWELL).await;
            }

            // 5 -> 4 -> 3: the joined nodes are removed again, the last one first.
            for (step, i) in [(5, joined[1]), (7, joined[0])] {
                let id = p.procs[i].id.expect("joined node's id");
                phase.store(step, Ordering::Relaxed);
                let mut conn = Conn::connect(&founders[0]).await.expect("node 1");
                let r = conn.must(&["BK.CLUSTER", "REMOVE", &id.to_string()]).await;
                assert!(!r.is_error(), "BK.CLUSTER REMOVE {id}: {r:?}");
                let addr = p.addr(i);
                members.retain(|a| *a != addr);
                let (st, took) = match settle(&mut p, PHASES[step], &members).await {
                    Ok(v) => v,
                    Err(e) => {
                        failures.push(e);
                        break 'steps;
                    }
                };
                println!(
                    "scaling: {} settled in {took:?} (load at {:?}): {}",
                    PHASES[step],
                    t0.elapsed(),
                    show(&st)
                );
                // The removed node keeps running, and serves nothing.
                phase.store(step + 1, Ordering::Relaxed);
                let dwell_end = Instant::now() + DWELL;
                // It knows, and sends clients with a stale slot map to a member: -MOVED.
                let (r, says, after) = removed_answers(&addr).await;
                let moved_to = r.error().and_then(parse_moved).map(|(_, to)| to);
                if says && moved_to.as_ref().is_some_and(|to| *to != addr) {
                    println!("scaling: removed node {id} answers {r:?} (after {after:?})");
                } else {
                    let view = slot_owners(&addr).await;
                    failures.push(format!(
                        "{}: node {id} left STATUS but still answers {r:?} {after:?} later \
                         (it never heard it was removed); its CLUSTER SLOTS leaders: {view:?}",
                        PHASES[step]
                    ));
                }
                tokio::time::sleep_until(dwell_end.into()).await;
            }
        }
        for f in &failures {
            println!("scaling: FAILURE {f}");
        }
        let load_time = t0.elapsed();
        if load_time >= LOAD_MAX {
            failures.push(format!(
                "the load stopped (after {LOAD_MAX:?}) before the scenario ended"
            ));
        }

        // Stop the load; gather what every client counted.
        stop.store(true, Ordering::Relaxed);
        std::fs::write(&stop_file, b"stop").expect("stop file");
        let mut by_client: Vec<(&str, Counts)> = Vec::new();
        let mut rc = Counts::default();
        for t in crate_tasks {
            rc.add(t.await.expect("redis crate task"));
        }
        by_client.push(("redis crate", rc));
        let py_out = tokio::time::timeout(Duration::from_secs(20), py.wait_with_output())
            .await
            .expect("scale_load.py stops within 20 s")
            .expect("scale_load.py runs");
        let py_stdout = String::from_utf8_lossy(&py_out.stdout);
        assert!(
            py_out.status.success(),
            "scale_load.py failed ({}):\n{py_stdout}\n{}",
            py_out.status,
            String::from_utf8_lossy(&py_out.stderr)
        );
        by_client.push(("redis-py", parse_py(&py_stdout)));
        by_client.push(("redis-cli", cli_task.await.expect("redis-cli task")));
        let pr = probe_task.await.expect("probe task");

        println!("scaling: load ran {load_time:?}");
        let mut total = Counts::default();
        for (name, c) in by_client {
            println!(
                "scaling: {name:<11} requests {:>6}  admits {:>6}  refusals {:>6}  errors {}  unknown {}",
                c.requests,
                c.admitted(),
                c.refused(),
                c.n_errors,
                c.unknown.values().sum::<i64>()
            );
            for e in &c.errors {
                println!("  {name} error: {e}");
            }
            if c.n_errors > 0 {
                failures.push(format!(
                    "{} errors reached {name}'s application: {:?}",
                    c.n_errors, c.errors
                ));
            }
            total.add(c);
        }
        let longest = report(&pr);

        // What the buckets say: each took exactly the admits its clients were told of.
        let mut router = Router::new(founders.clone());
        let mut wrong = BTreeMap::new();
        let mut over = BTreeMap::new();
        for i in 0..KEYS {
            let k = key(i);
            let admits = total.admits.get(&k).copied().unwrap_or(0);
            let left = match router
                .try_call(&["CL.THROTTLE", &k, "99", "1", "3600", "0"], SERVE)
                .await
            {
                Ok((r, _)) => r.limit()[2],
                Err(e) => {
                    failures.push(format!("peek {k}: {e}"));
                    break;
                }
            };
            if admits > LIMIT {
                over.insert(k.clone(), admits);
            }
            // Every admit was taken, and a write whose outcome was unknown may have been.
            let unknown = total.unknown.get(&k).copied().unwrap_or(0);
            if !(admits..=admits + unknown).contains(&(LIMIT - left)) {
                wrong.insert(k, (admits, unknown, left));
            }
        }
        if !over.is_empty() {
            failures.push(format!("keys admitted more than {LIMIT} times: {over:?}"));
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "buckets that differ from the admits the clients saw (admits, unknown, remaining): {wrong:?}"
            ));
        }
        let t_check = Instant::now();
        let (fill_wrong, fill_bad) = fill(&con, 0, 9).await;
        println!(
            "scaling: checked the {FILL} filled keys in {:?}",
            t_check.elapsed()
        );
        if fill_wrong > 0 {
            failures.push(format!(
                "{fill_wrong} filled keys lost their state or could not be read: {fill_bad:?}"
            ));
        }
        let mut probe_wrong = BTreeMap::new();
        for k in &probe_keys {
            let admits = pr.admits.get(k).copied().unwrap_or(0);
            match router
                .try_call(&["CL.THROTTLE", k, PROBE_BURST, "1", "3600", "0"], SERVE)
                .await
            {
                Ok((r, _)) => {
                    let taken = 1_000_000 - r.limit()[2];
                    if !(admits..=admits + pr.ambiguous as i64).contains(&taken) {
                        probe_wrong.insert(k.clone(), (admits, taken));
                    }
                }
                Err(e) => failures.push(format!("peek {k}: {e}")),
            }
        }
        if !probe_wrong.is_empty() {
            failures.push(format!(
                "probe buckets that differ from its writes (admits, taken): {probe_wrong:?}"
            ));
        }
        if pr.unserved > 0 {
            failures.push(format!(
                "{} probe writes not served within 10 s",
                pr.unserved
            ));
        }
        if longest >= Duration::from_secs(5) {
            failures.push(format!("a probe write waited {longest:?}"));
        }
        if let Err(e) = p.check_alive() {
            failures.push(e);
        }
        println!(
            "scaling: {} keys used, {} admits, {} refusals in all; scenario {:?}",
            total.admits.len().max(total.refusals.len()),
            total.admitted(),
            total.refused(),
            t_start.elapsed()
        );
        assert!(failures.is_empty(), "{failures:#?}");
    })
    .await;
}
