//! What the answer to a write says about it, while the cluster is disrupted: leaders killed
//! and restarted, cut off and reconnected, leaderships handed back and forth, a node joining
//! and a node removed. Every INCR is answered with its reply (applied once), a refusal
//! (`-MOVED`, `-ASK`, `-CLUSTERDOWN`, `-TRYAGAIN`: not applied, and never will be), or
//! `-UNKNOWN` (its fate could not be learnt in time); or the connection is lost. Clients here
//! never retry by themselves, so each counter ends at least at the INCRs acknowledged and at
//! most at those plus the attempts of unknown fate (`-UNKNOWN`, a connection lost or a reply
//! timed out after sending). A refusal that hid an applied write would push a counter past
//! that bound.

use crate::harness::*;
use bucketd::testing::NodeId;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Client tasks, and the counters each one owns (spread over every group).
const TASKS: usize = 4;
const KEYS_PER_TASK: usize = 4;

/// How long one INCR may wait for its answer: past the server's bound on learning a write's
/// fate (about 2 s), with room for a busy machine. A reply that takes longer is a lost one.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Every client loop ends after this many attempts or this long, whatever the test does.
const MAX_ATTEMPTS: usize = 100_000;
const LOAD_LIMIT: Duration = Duration::from_secs(80);

/// How long the load may take to run into a disruption, or to be served again after it.
const FELT: Duration = Duration::from_secs(20);

/// The phases of a scenario: writes are counted by the phase they were sent in.
const BEFORE: usize = 0;
const DURING: usize = 1;
const AFTER: usize = 2;
const PHASES: [&str; 3] = ["before", "during", "after"];

/// What became of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// An integer reply: applied once.
    Acked,
    Moved,
    Ask,
    ClusterDown,
    TryAgain,
    /// A removed node's refusal (`-ERR node N was removed from the cluster`).
    Removed,
    /// `-UNKNOWN`: may or may not have been applied (a node stopping while the write waited
    /// for its fate says so too).
    Unknown,
    /// The connection failed or the reply timed out once the command was (maybe) sent.
    Lost,
    /// No connection could be opened: nothing was sent.
    Unreachable,
    /// Anything else (counted, and fails the scenario).
    Other,
}

use Outcome::*;

/// Outcomes that say the write was not applied.
const REFUSED: [Outcome; 5] = [Moved, Ask, ClusterDown, TryAgain, Removed];
/// Outcomes that leave the write's fate open.
const AMBIGUOUS: [Outcome; 2] = [Unknown, Lost];
/// Everything but an acknowledgement.
const NOT_ACKED: [Outcome; 9] = [
    Moved,
    Ask,
    ClusterDown,
    TryAgain,
    Removed,
    Unknown,
    Lost,
    Unreachable,
    Other,
];

#[derive(Debug, Default, Clone)]
struct Tally(BTreeMap<Outcome, u64>);

impl Tally {
    fn add(&mut self, o: Outcome) {
        *self.0.entry(o).or_default() += 1;
    }

    fn of(&self, kinds: &[Outcome]) -> u64 {
        kinds
            .iter()
            .map(|k| self.0.get(k).copied().unwrap_or(0))
            .sum()
    }

    fn merge(&mut self, other: &Tally) {
        for (&k, &n) in &other.0 {
            *self.0.entry(k).or_default() += n;
        }
    }

    fn show(&self) -> String {
        format!(
            "acked {}, refused {} ({}), unknown {}, lost {}, unreachable {}, other {}",
            self.of(&[Acked]),
            self.of(&REFUSED),
            REFUSED
                .iter()
                .map(|k| format!("{k:?} {}", self.of(&[*k])))
                .collect::<Vec<_>>()
                .join(", "),
            self.of(&[Unknown]),
            self.of(&[Lost]),
            self.of(&[Unreachable]),
            self.of(&[Other]),
        )
    }
}

/// Everything the clients saw of one key.
#[derive(Debug, Default)]
struct KeyLog {
    tally: Tally,
    /// The values acknowledged INCRs returned.
    values: Vec<i64>,
}

#[derive(Default)]
struct Log {
    keys: BTreeMap<String, KeyLog>,
    /// By phase and by the node the attempt went to.
    by_target: HashMap<(usize, String), Tally>,
    /// The text of every `Other` outcome.
    other: Vec<String>,
}

impl Log {
    /// Attempts sent in `phase` (to `target`, or to any node) that ended as one of `kinds`.
    fn count(&self, phase: usize, target: Option<&str>, kinds: &[Outcome]) -> u64 {
        self.by_target
            .iter()
            .filter(|((p, t), _)| *p == phase && target.is_none_or(|want| want == t))
            .map(|(_, tally)| tally.of(kinds))
            .sum()
    }

    fn phase(&self, phase: usize) -> Tally {
        let mut t = Tally::default();
        for ((p, _), tally) in &self.by_target {
            if *p == phase {
                t.merge(tally);
            }
        }
        t
    }
}

struct Shared {
    log: Mutex<Log>,
    phase: AtomicUsize,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, phase: usize, target: &str, key: &str, o: Outcome, value: Option<i64>) {
        let mut log = self.lock();
        log.by_target
            .entry((phase, target.to_string()))
            .or_default()
            .add(o);
        let k = log.keys.entry(key.to_string()).or_default();
        k.tally.add(o);
        k.values.extend(value);
    }
}

/// The node after `addr` among those the client knows of.
fn next_after(known: &[String], addr: &str) -> String {
    let at = known.iter().position(|a| a == addr).unwrap_or(0);
    known[(at + 1) % known.len()].clone()
}

/// Sends one `INCR` at a time for its keys, each to the node it believes leads the key's
/// group, and never sends a command twice: a refusal or an unknown fate moves it on to the
/// next command (after updating its belief), as a client that does not retry would.
async fn client(
    keys: Vec<String>,
    mut belief: HashMap<String, String>,
    mut known: Vec<String>,
    sh: Arc<Shared>,
) {
    let mut conns: HashMap<String, Conn> = HashMap::new();
    let t0 = Instant::now();
    for i in 0..MAX_ATTEMPTS {
        if sh.stop.load(Ordering::Relaxed) || t0.elapsed() > LOAD_LIMIT {
            break;
        }
        let key = &keys[i % keys.len()];
        let target = belief[key].clone();
        let phase = sh.phase.load(Ordering::SeqCst);
        if !conns.contains_key(&target) {
            match Conn::connect(&target).await {
                Ok(c) => {
                    conns.insert(target.clone(), c);
                }
                Err(_) => {
                    sh.record(phase, &target, key, Unreachable, None);
                    belief.insert(key.clone(), next_after(&known, &target));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let conn = conns.get_mut(&target).expect("connected");
        let res = conn.call_within(&["INCR", key], CALL_TIMEOUT).await;
        let (outcome, value) = match res {
            Ok(Resp::Int(v)) => (Acked, Some(v)),
            Ok(Resp::Error(e)) => {
                let kind = if e.starts_with("MOVED ") {
                    Moved
                } else if e.starts_with("ASK ") {
                    Ask
                } else if e.starts_with("CLUSTERDOWN") {
                    ClusterDown
                } else if e.starts_with("TRYAGAIN") {
                    TryAgain
                } else if e.starts_with("UNKNOWN") {
                    Unknown
                } else if e.starts_with("ERR node") && e.contains("removed from the cluster") {
                    Removed
                } else {
                    Other
                };
                match kind {
                    Moved => {
                        let (_, to) = parse_moved(&e).expect("a well-formed MOVED");
                        if !known.contains(&to) {
                            known.push(to.clone());
                        }
                        belief.insert(key.clone(), to);
                    }
                    // Asked elsewhere for this one command only; the belief stays.
                    Ask => {}
                    Other => sh.lock().other.push(format!("{target}: INCR {key}: -{e}")),
                    // A node that is stopping closes the connection after it.
                    Unknown => {
                        conns.remove(&target);
                        belief.insert(key.clone(), next_after(&known, &target));
                    }
                    // No leader known there, or the leadership is moving: ask another node,
                    // which redirects to the leader it knows.
                    _ => {
                        belief.insert(key.clone(), next_after(&known, &target));
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                (kind, None)
            }
            Ok(other) => {
                sh.lock()
                    .other
                    .push(format!("{target}: INCR {key}: {other:?}"));
                (Other, None)
            }
            Err(_) => {
                // The reply may still come on this connection: it is not used again.
                conns.remove(&target);
                belief.insert(key.clone(), next_after(&known, &target));
                (Lost, None)
            }
        };
        sh.record(phase, &target, key, outcome, value);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The clients, running.
struct Load {
    sh: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    keys: Vec<String>,
}

impl Load {
    /// Starts the clients, each believing at first what the cluster agrees on now.
    fn start(c: &TestCluster, tag: &str) -> Load {
        let sh = Arc::new(Shared {
            log: Mutex::new(Log::default()),
            phase: AtomicUsize::new(BEFORE),
            stop: AtomicBool::new(false),
        });
        let known: Vec<String> = c.running().into_iter().map(|id| c.addr(id)).collect();
        let mut all = Vec::new();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let mut keys = Vec::new();
            let mut belief = HashMap::new();
            for j in 0..KEYS_PER_TASK {
                let g = ((t * KEYS_PER_TASK + j) % c.spec.groups as usize) as u32;
                let key = key_in_group(&c.spec, &format!("{tag}:{t}:{j}"), g);
                let leader = c.agreed_leader(g).unwrap_or(c.running()[0]);
                belief.insert(key.clone(), c.addr(leader));
                keys.push(key);
            }
            all.extend(keys.iter().cloned());
            let mut known = known.clone();
            let n = known.len();
            known.rotate_left(t % n);
            tasks.push(tokio::spawn(client(keys, belief, known, sh.clone())));
        }
        Load {
            sh,
            tasks,
            keys: all,
        }
    }

    fn enter(&self, phase: usize) {
        self.sh.phase.store(phase, Ordering::SeqCst);
    }

    fn count(&self, phase: usize, target: Option<&str>, kinds: &[Outcome]) -> u64 {
        self.sh.lock().count(phase, target, kinds)
    }

    /// Waits until more attempts sent in `phase` (to `target`) ended as one of `kinds` than
    /// `than`: the load ran into what the scenario did, or was served through it.
    async fn wait_more(
        &self,
        what: &str,
        phase: usize,
        target: Option<&str>,
        kinds: &[Outcome],
        than: u64,
    ) {
        wait_for(what, FELT, || async {
            (self.count(phase, target, kinds) > than).then_some(())
        })
        .await;
    }

    /// Waits until some write sent from now on is acknowledged.
    async fn wait_served(&self, what: &str) {
        let phase = self.sh.phase.load(Ordering::SeqCst);
        let acked = self.count(phase, None, &[Acked]);
        self.wait_more(what, phase, None, &[Acked], acked).await;
    }

    /// Stops the clients; each finishes the attempt it is in (bounded by `CALL_TIMEOUT`).
    async fn finish(self) -> (Vec<String>, Log) {
        self.sh.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(10), t)
                .await
                .expect("a client stops")
                .expect("a client task");
        }
        let log = std::mem::take(&mut *self.sh.lock());
        (self.keys, log)
    }
}

/// Once the cluster serves every key again, checks each counter against what the clients
/// were told: acked <= value <= acked + unknown + lost, the acknowledged values all
/// different and none above the final value. Prints the counts by phase.
async fn check(scenario: &str, members: Vec<String>, keys: Vec<String>, log: Log) {
    let mut router = Router::new(members);
    let mut wrong = Vec::new();
    let mut total = Tally::default();
    for key in &keys {
        let (r, _) = router.call(&["GET", key], SERVE).await;
        let value = match &r {
            Resp::Bulk(None) => 0,
            Resp::Bulk(Some(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("GET {key}: {r:?}")),
            other => panic!("GET {key}: {other:?}"),
        };
        let k = log.keys.get(key.as_str());
        let tally = k.map(|k| k.tally.clone()).unwrap_or_default();
        total.merge(&tally);
        let acked = tally.of(&[Acked]) as i64;
        let ambiguous = tally.of(&AMBIGUOUS) as i64;
        if !(acked <= value && value <= acked + ambiguous) {
            wrong.push(format!(
                "{key}: value {value}, outside [{acked}, {}]: {}",
                acked + ambiguous,
                tally.show()
            ));
        }
        let mut values = k.map(|k| k.values.clone()).unwrap_or_default();
        values.sort_unstable();
        let highest = values.last().copied().unwrap_or(0);
        if highest > value {
            wrong.push(format!(
                "{key}: an INCR was answered {highest}, yet the value is {value}"
            ));
        }
        let n = values.len();
        values.dedup();
        if values.len() != n {
            wrong.push(format!(
                "{key}: {n} acknowledged INCRs returned only {} different values",
                values.len()
            ));
        }
    }
    for (p, name) in PHASES.iter().enumerate() {
        println!("{scenario}: {name}: {}", log.phase(p).show());
    }
    println!("{scenario}: {} keys, in all: {}", keys.len(), total.show());
    assert!(
        log.other.is_empty(),
        "{scenario}: unexpected answers: {:?}",
        log.other
    );
    assert!(wrong.is_empty(), "{scenario}: {wrong:#?}");
    assert!(
        total.of(&[Acked]) > 0,
        "{scenario}: no write was acknowledged"
    );
}

/// How long the load runs on before each disruption, so every client has written to the
/// leaders of the moment (a refusal or a lost connection sends it on to them).
const DWELL: Duration = Duration::from_millis(700);

/// The running node that leads the most groups.
fn busiest(c: &TestCluster) -> NodeId {
    c.running()
        .into_iter()
        .max_by_key(|&id| c.led_by(id).len())
        .expect("a running node")
}

/// Leaders are stopped mid-load and started again: a write in flight on a stopped node is
/// answered (with anything) or its connection is lost; nothing is refused that was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_killed_leaders_are_counted_within_their_answers() {
    bounded(async {
        let mut c = TestCluster::start("outcomes-kill", Opts::default()).await;
        c.wait_balanced(Duration::from_secs(15)).await;
        let load = Load::start(&c, "kill");
        load.wait_served("writes before the kills").await;
        load.enter(DURING);
        for round in 0..2 {
            tokio::time::sleep(DWELL).await;
            let victim = busiest(&c);
            let led = c.led_by(victim);
            let addr = c.addr(victim);
            let failed = load.count(DURING, Some(&addr), &[Lost, Unreachable]);
            c.stop_node(victim).await;
            // Its clients find it gone, and the others take over its groups.
            load.wait_more(
                &format!("round {round}: writes to the stopped node {victim} to fail"),
                DURING,
                Some(&addr),
                &[Lost, Unreachable],
                failed,
            )
            .await;
            c.wait_leaders(Duration::from_secs(15)).await;
            load.wait_served(&format!(
                "round {round}: writes while node {victim} is down"
            ))
            .await;
            println!("kill: round {round}: stopped node {victim}, leading groups {led:?}");
            tokio::time::sleep(DWELL).await;
            c.start_node(victim).await;
            c.wait_balanced(Duration::from_secs(20)).await;
            load.wait_served(&format!("round {round}: writes once node {victim} is back"))
                .await;
        }
        load.enter(AFTER);
        load.wait_served("writes after the restarts").await;
        let (keys, log) = load.finish().await;
        c.wait_leaders(Duration::from_secs(15)).await;
        check("kill", c.addrs(), keys, log).await;
        c.stop_all().await;
    })
    .await;
}

/// A leader is cut off from the other nodes mid-load, long enough for the writes it took to
/// reach the bound on learning their fate, then reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_cut_off_leader_are_counted_within_their_answers() {
    bounded(async {
        let c = TestCluster::start("outcomes-cut", Opts::default()).await;
        c.wait_balanced(Duration::from_secs(15)).await;
        let load = Load::start(&c, "cut");
        load.wait_served("writes before the cuts").await;
        load.enter(DURING);
        for round in 0..2 {
            tokio::time::sleep(DWELL).await;
            let alone = busiest(&c);
            let led = c.led_by(alone);
            let addr = c.addr(alone);
            let failed = load.count(DURING, Some(&addr), &NOT_ACKED);
            c.isolate(alone);
            let t0 = Instant::now();
            load.wait_more(
                &format!("round {round}: writes to the cut-off node {alone} to fail"),
                DURING,
                Some(&addr),
                &NOT_ACKED,
                failed,
            )
            .await;
            load.wait_served(&format!("round {round}: the majority to serve"))
                .await;
            // Past the bound on a write's fate, so the writes the cut-off node took are
            // answered while it is still cut off.
            let left = Duration::from_millis(2500).saturating_sub(t0.elapsed());
            tokio::time::sleep(left).await;
            println!(
                "cut: round {round}: node {alone}, leading groups {led:?}, cut off for {:?}",
                t0.elapsed()
            );
            c.heal();
            c.wait_leaders(Duration::from_secs(15)).await;
            c.wait_balanced(Duration::from_secs(20)).await;
        }
        load.enter(AFTER);
        load.wait_served("writes after the heals").await;
        let (keys, log) = load.finish().await;
        c.wait_leaders(Duration::from_secs(15)).await;
        check("cut", c.addrs(), keys, log).await;
    })
    .await;
}

/// Every group's leadership is handed to another replica and back, several times, mid-load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_leadership_transfers_are_counted_within_their_answers() {
    bounded(async {
        // The test moves the leaderships itself; the balancer would move them too.
        let c = TestCluster::start(
            "outcomes-transfer",
            Opts {
                balance: false,
                ..Opts::default()
            },
        )
        .await;
        let first = c.wait_leaders(Duration::from_secs(15)).await;
        let load = Load::start(&c, "transfer");
        load.wait_served("writes before the transfers").await;
        load.enter(DURING);
        for round in 0..4 {
            tokio::time::sleep(DWELL).await;
            let now = c.wait_leaders(Duration::from_secs(15)).await;
            // Away from the first leaders, then back to them.
            let want: Vec<NodeId> = (0..c.spec.groups)
                .map(|g| {
                    if round % 2 == 1 {
                        return first[g as usize];
                    }
                    let voters = c.cluster(now[g as usize]).voters(g);
                    let at = voters
                        .iter()
                        .position(|&v| v == now[g as usize])
                        .unwrap_or(0);
                    voters[(at + 1) % voters.len()]
                })
                .collect();
            let moved = load.count(DURING, None, &[Moved]);
            // A transfer is only asked for; one the group did not act on is asked again.
            let asked = std::cell::Cell::new(Instant::now() - Duration::from_secs(1));
            wait_for(
                &format!("round {round}: leaders {want:?}"),
                FELT,
                || async {
                    let leaders: Vec<Option<NodeId>> =
                        (0..c.spec.groups).map(|g| c.agreed_leader(g)).collect();
                    if leaders.iter().zip(&want).all(|(l, w)| *l == Some(*w)) {
                        return Some(());
                    }
                    if asked.get().elapsed() >= Duration::from_millis(500) {
                        asked.set(Instant::now());
                        for g in 0..c.spec.groups {
                            if let Some(l) = leaders[g as usize]
                                && l != want[g as usize]
                            {
                                let _ = c.cluster(l).transfer_leader(g, want[g as usize]).await;
                            }
                        }
                    }
                    None
                },
            )
            .await;
            load.wait_more(
                &format!("round {round}: clients to be sent to the new leaders"),
                DURING,
                None,
                &[Moved],
                moved,
            )
            .await;
            load.wait_served(&format!("round {round}: writes to the new leaders"))
                .await;
        }
        load.enter(AFTER);
        load.wait_served("writes after the transfers").await;
        let (keys, log) = load.finish().await;
        c.wait_leaders(Duration::from_secs(15)).await;
        check("transfer", c.addrs(), keys, log).await;
    })
    .await;
}

/// Whether `addr` reports exactly the members `ids`, all up, and nothing left to move.
async fn settled(addr: &str, ids: &[NodeId]) -> bool {
    let Ok(mut conn) = Conn::connect(addr).await else {
        return false;
    };
    let Ok(r) = conn.call(&["BK.CLUSTER", "STATUS"]).await else {
        return false;
    };
    if r.is_error() {
        return false;
    }
    let kv = pairs(&r);
    let mut have: Vec<(NodeId, String)> = field(&kv, "members")
        .array()
        .iter()
        .map(|m| {
            let m = pairs(m);
            (field(&m, "id").int() as NodeId, field(&m, "state").text())
        })
        .collect();
    have.sort();
    let want: Vec<(NodeId, String)> = ids.iter().map(|&id| (id, "up".to_string())).collect();
    have == want && field(&kv, "moves_in_progress").int() == 0
}

/// A fourth node joins mid-load and takes its share of leaderships, then a founder is
/// removed and its replicas and leaderships move to the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_join_and_a_removal_are_counted_within_their_answers() {
    bounded(async {
        let mut c = TestCluster::start("outcomes-members", Opts::default()).await;
        c.wait_balanced(Duration::from_secs(15)).await;
        let load = Load::start(&c, "members");
        load.wait_served("writes before the join").await;
        tokio::time::sleep(DWELL).await;
        load.enter(DURING);

        let moved = load.count(DURING, None, &[Moved]);
        let four = c.join_node(1).await;
        wait_for(
            "node 4 in, every move done, and node 4 leading groups",
            Duration::from_secs(30),
            || async {
                (settled(&c.addr(1), &[1, 2, 3, four]).await && !c.led_by(four).is_empty())
                    .then_some(())
            },
        )
        .await;
        load.wait_more(
            "clients to be sent to the joined node's groups",
            DURING,
            None,
            &[Moved],
            moved,
        )
        .await;
        load.wait_served("writes after the join").await;
        println!("members: node {four} joined, leading {:?}", c.led_by(four));

        tokio::time::sleep(DWELL).await;
        let gone: NodeId = 2;
        let gone_addr = c.addr(gone);
        let led = c.led_by(gone);
        let refused = load.count(DURING, Some(&gone_addr), &NOT_ACKED);
        let mut admin = Conn::connect(&c.addr(four)).await.expect("connects");
        let r = admin
            .call(&["BK.CLUSTER", "REMOVE", &gone.to_string()])
            .await
            .expect("the removal is answered");
        assert_eq!(r, Resp::Simple("OK".into()), "BK.CLUSTER REMOVE {gone}");
        wait_for(
            &format!("node {gone} out and every move done"),
            Duration::from_secs(30),
            || async { settled(&c.addr(1), &[1, 3, four]).await.then_some(()) },
        )
        .await;
        if !led.is_empty() {
            load.wait_more(
                &format!("clients of the removed node {gone} to be sent on"),
                DURING,
                Some(&gone_addr),
                &NOT_ACKED,
                refused,
            )
            .await;
        }
        println!("members: node {gone}, leading {led:?}, removed");
        load.enter(AFTER);
        load.wait_served("writes after the removal").await;
        let (keys, log) = load.finish().await;
        let members: Vec<String> = [1, 3, four].iter().map(|&id| c.addr(id)).collect();
        check("members", members, keys, log).await;
        c.stop_all().await;
    })
    .await;
}
