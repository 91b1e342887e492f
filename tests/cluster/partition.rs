//! A network partition: the node cut off from the others cannot commit, so it answers
//! errors quickly and never admits; the majority side goes on serving; after the partition
//! heals the replicas converge; and through it all no bucket admits more than its limit. A
//! follower cut off and reconnected does not depose the leader the others kept.

use crate::harness::*;
use openraft::type_config::async_runtime::WatchReceiver;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// CL.THROTTLE key 59 1 3600: 60 tokens, refilled so slowly that on a frozen clock every
/// admit is one token gone for good.
const CAPACITY: i64 = 60;

fn check(key: &str) -> [&str; 5] {
    ["CL.THROTTLE", key, "59", "1", "3600"]
}

/// Everything the clients saw.
#[derive(Default)]
struct Log {
    admits: HashMap<String, i64>,
    /// Attempts whose fate is unknown (`-UNKNOWN`, a connection lost mid-command).
    ambiguous: HashMap<String, i64>,
    /// Replies from the isolated node to commands sent after the cut and answered before the
    /// heal: (latency, reply).
    minority: Vec<(Duration, Resp)>,
    /// For each key, when the majority side first served it after the cut.
    majority_served: HashMap<String, Duration>,
}

struct Shared {
    log: Mutex<Log>,
    stop: AtomicBool,
    start: Instant,
    /// When the cut was made and when it was healed, as offsets from `start`.
    window: Mutex<(Option<Duration>, Option<Duration>)>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn window(&self) -> (Option<Duration>, Option<Duration>) {
        *self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, key: &str, reply: &Resp) {
        if let Resp::Array(Some(_)) = reply
            && reply.limit()[0] == 0
        {
            *self.lock().admits.entry(key.to_string()).or_default() += 1;
        }
    }

    fn ambiguous(&self, key: &str, n: usize) {
        if n > 0 {
            *self.lock().ambiguous.entry(key.to_string()).or_default() += n as i64;
        }
    }
}

/// Sends to one node only and never follows a redirection: what that node itself answers.
async fn probe(addr: String, keys: Vec<String>, sh: Arc<Shared>) {
    let mut conn = None;
    let mut i = 0;
    while !sh.stop.load(Ordering::Relaxed) {
        let key = &keys[i % keys.len()];
        i += 1;
        if conn.is_none() {
            conn = Conn::connect(&addr).await.ok();
        }
        let Some(c) = conn.as_mut() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let sent = sh.start.elapsed();
        let res = c.call(&check(key)).await;
        let took = sh.start.elapsed() - sent;
        match res {
            Ok(reply) => {
                sh.record(key, &reply);
                if reply.error().is_some_and(|e| e.starts_with("UNKNOWN")) {
                    sh.ambiguous(key, 1);
                }
                if let (Some(cut), None) = sh.window()
                    && sent >= cut
                {
                    sh.lock().minority.push((took, reply));
                }
            }
            Err(_) => {
                sh.ambiguous(key, 1);
                conn = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A cluster-aware client over `addrs`.
async fn client(addrs: Vec<String>, stay_inside: bool, keys: Vec<String>, sh: Arc<Shared>) {
    let mut r = Router::new(addrs);
    r.stay_inside = stay_inside;
    let mut i = 0;
    while !sh.stop.load(Ordering::Relaxed) {
        let key = &keys[i % keys.len()];
        i += 1;
        let res = r.try_call(&check(key), Duration::from_secs(2)).await;
        let at = sh.start.elapsed();
        match res {
            Ok((reply, route)) => {
                sh.record(key, &reply);
                sh.ambiguous(key, route.ambiguous);
                if stay_inside
                    && let (Some(cut), None) = sh.window()
                    && at >= cut
                {
                    sh.lock()
                        .majority_served
                        .entry(key.clone())
                        .or_insert(at - cut);
                }
            }
            // Gave up on this one for now; it may still have been applied.
            Err(_) => sh.ambiguous(key, 1),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_node_refuses_majority_serves_and_limits_hold() {
    bounded(async {
        let mut c = TestCluster::start("partition", Opts::default()).await;
        c.wait_balanced(Duration::from_secs(10)).await;
        // The node that leads the most groups is the one cut off.
        let alone = c
            .ids()
            .into_iter()
            .max_by_key(|&id| c.led_by(id).len())
            .expect("nodes");
        let its_groups = c.led_by(alone);
        let keys: Vec<String> = (0..c.spec.groups)
            .map(|g| key_in_group(&c.spec, "partition", g))
            .collect();

        let sh = Arc::new(Shared {
            log: Mutex::new(Log::default()),
            stop: AtomicBool::new(false),
            start: Instant::now(),
            window: Mutex::new((None, None)),
        });
        let majority = c.addrs_but(alone);
        let mut tasks = vec![
            tokio::spawn(probe(c.addr(alone), keys.clone(), sh.clone())),
            tokio::spawn(client(c.addrs(), false, keys.clone(), sh.clone())),
        ];
        for first in 0..2 {
            let mut addrs = majority.clone();
            addrs.rotate_left(first);
            tasks.push(tokio::spawn(client(addrs, true, keys.clone(), sh.clone())));
        }

        // Healthy for a moment, then cut, then healed.
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.isolate(alone);
        sh.window.lock().unwrap().0 = Some(sh.start.elapsed());
        wait_for(
            "the majority side to serve every key",
            Duration::from_secs(15),
            || async { (sh.lock().majority_served.len() == keys.len()).then_some(()) },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        sh.window.lock().unwrap().1 = Some(sh.start.elapsed());
        c.heal();
        tokio::time::sleep(Duration::from_millis(500)).await;
        sh.stop.store(true, Ordering::Relaxed);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("client stops")
                .expect("client task");
        }

        let log = std::mem::take(&mut *sh.lock());
        // The isolated node answered, quickly, and never with an admit.
        assert!(
            log.minority.len() >= 3,
            "the isolated node answered {} commands",
            log.minority.len()
        );
        let slowest = log
            .minority
            .iter()
            .map(|(t, _)| *t)
            .max()
            .unwrap_or_default();
        let mut kinds: HashMap<&str, usize> = HashMap::new();
        for (took, reply) in &log.minority {
            let e = reply
                .error()
                .unwrap_or_else(|| panic!("the isolated node answered {reply:?}"));
            let kind = ["TRYAGAIN", "CLUSTERDOWN", "MOVED", "UNKNOWN"]
                .into_iter()
                .find(|k| e.starts_with(k))
                .unwrap_or_else(|| panic!("unexpected error from the isolated node: {e}"));
            *kinds.entry(kind).or_default() += 1;
            assert!(*took < Duration::from_secs(1), "a reply took {took:?}: {e}");
        }
        let mut served: Vec<_> = log.majority_served.iter().collect();
        served.sort();
        println!(
            "partition: node {alone} (leading groups {its_groups:?}) cut off; it answered {} \
             commands with {kinds:?}, slowest in {slowest:?}; the majority first served each \
             key after {served:?}",
            log.minority.len()
        );

        // Healed: one leader per group that all agree on, and identical replicas.
        c.wait_leaders(Duration::from_secs(10)).await;
        let mut client = Router::new(c.addrs());
        for key in &keys {
            let (reply, _) = client
                .call(&["CL.THROTTLE", key, "59", "1", "3600", "0"], SERVE)
                .await;
            let now = reply.limit();
            for id in c.ids() {
                wait_for(
                    &format!("node {id} to converge on {key}"),
                    Duration::from_secs(10),
                    || async {
                        let l = c
                            .local_limit(id, &["CL.THROTTLE", key, "59", "1", "3600", "0"])
                            .await;
                        (l == now).then_some(())
                    },
                )
                .await;
            }
            let admits = log.admits.get(key).copied().unwrap_or(0);
            let unsure = log.ambiguous.get(key).copied().unwrap_or(0);
            let consumed = CAPACITY - now[2];
            assert!(
                admits <= CAPACITY,
                "{key}: {admits} admits over a limit of {CAPACITY}"
            );
            assert!(
                admits <= consumed && consumed <= admits + unsure,
                "{key}: {admits} admits and {unsure} attempts of unknown fate, yet {consumed} \
                 tokens gone"
            );
        }
        c.wait_balanced(Duration::from_secs(15)).await;
        c.stop_all().await;
    })
    .await;
}

/// A write a leader takes just as it is cut off enters its log, where it can no longer commit;
/// the majority elects another leader, whose log replaces that entry once the link heals. The
/// old leader answers that write only once it has applied as far as its log reached, so the
/// `-TRYAGAIN` it sends says the write was not applied, and the bucket on every replica shows
/// it was not: a client that retries (as Redis Cluster clients do on their own) takes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_entry_a_new_leader_replaced_is_refused_once_its_fate_is_known() {
    bounded(async {
        let c = TestCluster::start("discarded", Opts::write_timeout(Duration::from_secs(20))).await;
        c.wait_balanced(Duration::from_secs(10)).await;
        let g = 0;
        let old = c.agreed_leader(g).expect("group 0 has a leader");
        let key = key_in_group(&c.spec, "discarded", g);
        let take = ["CL.THROTTLE", key.as_str(), "9", "1", "3600", "1"];
        let peek = ["CL.THROTTLE", key.as_str(), "9", "1", "3600", "0"];

        // One token taken through the leader: the group is awake and its lease fresh.
        let mut conn = Conn::connect(&c.addr(old)).await.expect("connect");
        assert_eq!(conn.must(&take).await.limit()[2], 9);

        // Cut off, then a write at once, inside the lease: it is proposed, and waits.
        c.isolate(old);
        let args = take.map(str::to_owned);
        let pending = tokio::spawn(async move {
            conn.call_within(
                &args.each_ref().map(String::as_str),
                Duration::from_secs(60),
            )
            .await
        });

        // The majority elects another leader and takes a token through it.
        let mut router = Router::new(c.addrs_but(old));
        let (r, _) = router.call(&take, SERVE).await;
        assert_eq!(r.limit()[2], 8, "the majority's take: {r:?}");
        assert!(
            !pending.is_finished(),
            "the cut-off leader answered before the heal: {:?}",
            pending.await
        );

        c.heal();
        let reply = tokio::time::timeout(Duration::from_secs(15), pending)
            .await
            .expect("the old leader answers after the heal")
            .expect("the write task")
            .expect("the old leader's connection");
        let e = reply
            .error()
            .unwrap_or_else(|| panic!("the replaced write was answered {reply:?}"));
        assert!(
            e.starts_with("TRYAGAIN") && e.ends_with("it was not applied"),
            "the replaced write was answered -{e}"
        );

        // Not applied anywhere: every replica shows the two takes the clients were told of.
        for id in c.ids() {
            wait_for(
                &format!("node {id} to show two tokens taken"),
                Duration::from_secs(10),
                || async { (c.local_limit(id, &peek).await[2] == 8).then_some(()) },
            )
            .await;
        }
        println!("discarded: node {old}'s write was answered -{e}");
    })
    .await;
}

/// A commit slower than the write timeout, on a healthy cluster, is answered with its reply
/// once it commits: the group has a serving leader, so the write's fate is on its way. Had it
/// been answered at the timeout, the client would not know whether it was taken. A write timeout of a millisecond makes
/// nearly every commit slower than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_slower_than_the_write_timeout_is_answered_not_retried() {
    bounded(async {
        let c =
            TestCluster::start("slowcommit", Opts::write_timeout(Duration::from_millis(1))).await;
        c.wait_balanced(Duration::from_secs(10)).await;
        let key = key_in_group(&c.spec, "slowcommit", 0);
        let take = ["CL.THROTTLE", key.as_str(), "199", "1", "3600", "1"];
        let peek = ["CL.THROTTLE", key.as_str(), "199", "1", "3600", "0"];
        const WRITES: i64 = 100;
        let mut router = Router::new(c.addrs());
        let mut retried = 0;
        for i in 1..=WRITES {
            let (r, route) = router.call(&take, SERVE).await;
            retried += route.ambiguous;
            assert_eq!(
                r.limit()[..3],
                [0, 200, 200 - i],
                "take {i}: {r:?} {route:?}"
            );
        }
        assert_eq!(retried, 0, "writes answered -UNKNOWN and retried");
        for id in c.ids() {
            wait_for(
                &format!("node {id} to show {WRITES} tokens taken"),
                Duration::from_secs(10),
                || async { (c.local_limit(id, &peek).await[2] == 200 - WRITES).then_some(()) },
            )
            .await;
        }
    })
    .await;
}

/// The term of group `g` as node `id`'s replica knows it.
fn term_on(c: &TestCluster, id: bucketd::testing::NodeId, g: u32) -> u64 {
    let raft = c.cluster(id).raft(g).expect("a replica of the group");
    raft.metrics().borrow_watched().current_term
}

/// A follower cut off from its group for several election timeouts, then reconnected, does not
/// depose the leader the others kept: while cut off it cannot win an election, so it must not
/// raise its term either (its elections are asked for first, and refused), or the leader would
/// step down at its first answer after the heal and the group would go without one until the
/// next election, answering `-CLUSTERDOWN` and `-TRYAGAIN` meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_and_back_does_not_depose_its_leader() {
    bounded(async {
        let c = TestCluster::start(
            "partition-rejoin",
            Opts {
                // Leaderships stay where they are, so any change is the cut's doing.
                balance: false,
                ..Opts::default()
            },
        )
        .await;
        let leaders = c.wait_leaders(Duration::from_secs(10)).await;
        let g = 0;
        let leader = leaders[g as usize];
        let alone = c.other_than(leader);
        let key = key_in_group(&c.spec, "rejoin", g);
        let args = ["CL.THROTTLE", key.as_str(), "999999", "1", "3600"];
        let mut conn = Conn::connect(&c.addr(leader)).await.expect("connect");
        let term = term_on(&c, leader, g);
        let alone_term = term_on(&c, alone, g);

        // Writes all along keep the group awake (a quiet group's followers do not campaign).
        let write_for = async |conn: &mut Conn, how_long: Duration| {
            let t0 = Instant::now();
            let mut failed = Vec::new();
            while t0.elapsed() < how_long {
                let reply = conn.call(&args).await.expect("the leader answers");
                if let Some(e) = reply.error() {
                    failed.push(e.to_string());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            failed
        };
        let before = write_for(&mut conn, Duration::from_millis(500)).await;
        assert!(before.is_empty(), "before the cut: {before:?}");
        // Four times the longest election timeout.
        c.isolate(alone);
        let during = write_for(&mut conn, Duration::from_secs(2)).await;
        c.heal();
        let after = write_for(&mut conn, Duration::from_millis(1500)).await;

        println!(
            "rejoin: group {g}: leader {leader} at term {term} -> {}, cut-off follower {alone} \
             at term {alone_term} -> {}; agreed leader {:?}",
            term_on(&c, leader, g),
            term_on(&c, alone, g),
            c.agreed_leader(g)
        );
        assert!(
            during.is_empty(),
            "the leader and the other follower: {during:?}"
        );
        assert!(
            after.is_empty(),
            "after the heal, the leader answered {after:?}"
        );
        assert_eq!(
            term_on(&c, alone, g),
            term,
            "the cut-off follower (at term {alone_term} before the cut) is at the leader's term"
        );
        assert_eq!(c.agreed_leader(g), Some(leader), "the leader stayed");
        assert_eq!(term_on(&c, leader, g), term, "the leader's term stayed");
    })
    .await;
}
