//! Changing the membership while the cluster serves: a node joins and takes its share of
//! replicas and leaderships, a node is drained and removed (alive or dead), rules set on one
//! node hold on every node, bad requests change nothing, and a move cut short by a crash on
//! either side finishes once the node is back.

use crate::harness::*;
use bucketd::testing::NodeId;
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(30);

/// One member as `BK.CLUSTER STATUS` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    id: NodeId,
    state: String,
    replicas: i64,
    leaders: i64,
}

#[derive(Debug)]
struct Status {
    nodes: i64,
    moves: i64,
    version: i64,
    members: Vec<Member>,
}

async fn status(addr: &str) -> Status {
    let mut c = Conn::connect(addr).await.expect("connects");
    let r = c.must(&["BK.CLUSTER", "STATUS"]).await;
    let kv = pairs(&r);
    let members = field(&kv, "members")
        .array()
        .iter()
        .map(|m| {
            let m = pairs(m);
            Member {
                id: field(&m, "id").int() as NodeId,
                state: field(&m, "state").text(),
                replicas: field(&m, "replicas").int(),
                leaders: field(&m, "leaders").int(),
            }
        })
        .collect();
    Status {
        nodes: field(&kv, "nodes").int(),
        moves: field(&kv, "moves_in_progress").int(),
        version: field(&kv, "version").int(),
        members,
    }
}

/// Waits until `addr` reports exactly the members `ids`, all up, nothing left to move, and
/// replicas and leaderships spread evenly: floor or ceil of R*G/N and G/N per member.
async fn wait_settled(c: &TestCluster, addr: &str, ids: &[NodeId]) -> Status {
    let n = ids.len() as i64;
    let g = i64::from(c.spec.groups);
    let r = 3.min(n);
    let (rlo, rhi) = ((r * g) / n, (r * g + n - 1) / n);
    let (llo, lhi) = (g / n, (g + n - 1) / n);
    wait_for(
        &format!("members {ids:?} settled and balanced"),
        SETTLE,
        || async {
            let s = status(addr).await;
            let mut have: Vec<NodeId> = s.members.iter().map(|m| m.id).collect();
            have.sort_unstable();
            let even = s.members.iter().all(|m| {
                m.state == "up"
                    && (rlo..=rhi).contains(&m.replicas)
                    && (llo..=lhi).contains(&m.leaders)
            });
            (have == ids && s.moves == 0 && s.nodes == n && even).then_some(s)
        },
    )
    .await
}

/// Consumes `n` from `key` through the cluster and checks the exact count left.
async fn consume(router: &mut Router, key: &str, n: usize) {
    for _ in 0..n {
        let (r, _) = router
            .call(&["CL.THROTTLE", key, "99", "1", "3600", "1"], SERVE)
            .await;
        assert_eq!(r.limit()[0], 0, "{key} admits");
    }
}

async fn remaining(router: &mut Router, key: &str) -> i64 {
    let (r, _) = router
        .call(&["CL.THROTTLE", key, "99", "1", "3600", "0"], SERVE)
        .await;
    r.limit()[2]
}

/// Starts a cluster and takes 3 from one key per group, named `prefix:N`: the counts a test
/// then follows through its membership changes (97 left each).
async fn start_counted(tag: &str, opts: Opts, prefix: &str) -> (TestCluster, Vec<String>) {
    let c = TestCluster::start(tag, opts).await;
    let mut router = Router::new(c.addrs());
    let keys: Vec<String> = (0..c.spec.groups)
        .map(|g| key_in_group(&c.spec, prefix, g))
        .collect();
    for k in &keys {
        consume(&mut router, k, 3).await;
    }
    (c, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_and_takes_its_share_then_is_removed() {
    bounded(async {
        let (mut c, keys) = start_counted("join", Opts::patient(), "joined").await;
        let mut router = Router::new(c.addrs());
        let first = status(&c.addr(1)).await;
        assert_eq!(first.nodes, 3);
        let four = c.join_node(2).await;
        assert_eq!(four, 4, "the first node to join gets the next id");
        let s = wait_settled(&c, &c.addr(1), &[1, 2, 3, 4]).await;
        assert!(s.version > first.version);
        // The new node holds replicas, leads groups and describes the cluster like the others.
        let on_four = wait_settled(&c, &c.addr(4), &[1, 2, 3, 4]).await;
        assert_eq!(on_four.members.len(), s.members.len());
        // Counts moved with the replicas.
        for k in &keys {
            assert_eq!(remaining(&mut router, k).await, 97, "{k}");
            consume(&mut router, k, 1).await;
        }
        // CLUSTER SLOTS on the new node names it for some ranges.
        let mut conn = Conn::connect(&c.addr(4)).await.expect("connects");
        let slots = conn.must(&["CLUSTER", "SLOTS"]).await;
        let mine = c.spec.node(4).expect("node 4").port as i64;
        assert!(
            slots.array().iter().any(|range| range.array()[2..]
                .iter()
                .any(|n| n.array()[1].int() == mine)),
            "{slots:?}"
        );

        // Take a founder out: its replicas move to the others, then it stops serving.
        let mut admin = Conn::connect(&c.addr(4)).await.expect("connects");
        assert_eq!(
            admin.must(&["BK.CLUSTER", "REMOVE", "2"]).await.text(),
            "OK"
        );
        wait_settled(&c, &c.addr(1), &[1, 3, 4]).await;
        // The removed node says so, and sends a client with a stale slot map to a member.
        // It hears of its removal from the metadata it still follows, shortly after the
        // members have settled without it.
        let mut two = Conn::connect(&c.addr(2)).await.expect("connects");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let st = two.must(&["BK.CLUSTER", "STATUS"]).await;
            let state = field(&pairs(&st), "this_node").text();
            if state == "removed" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node 2 still says {state} 10 s after the members settled without it"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let gone = two
            .call(&["CL.THROTTLE", &keys[0], "99", "1", "3600", "1"])
            .await
            .expect("answers");
        let (_, to) = gone
            .error()
            .and_then(parse_moved)
            .unwrap_or_else(|| panic!("{gone:?}"));
        assert_ne!(to, c.addr(2), "sent to a member");
        let mut router = Router::new(vec![c.addr(1), c.addr(3), c.addr(4)]);
        for k in &keys {
            assert_eq!(remaining(&mut router, k).await, 96, "{k}");
        }
        c.stop_all().await;
    })
    .await;
}

/// A cluster started on one node serves at once (each group's one replica is its own
/// majority), and grows: a second node joins and every group gains a replica on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_node_cluster_serves_and_grows() {
    bounded(async {
        let opts = Opts {
            nodes: 1,
            groups: 4,
            ..Opts::patient()
        };
        let (mut c, keys) = start_counted("one", opts, "one").await;
        let two = c.join_node(1).await;
        for addr in [c.addr(1), c.addr(two)] {
            wait_for(
                "every group on both nodes, half led by each",
                SETTLE,
                || async {
                    let s = status(&addr).await;
                    let mut ids: Vec<NodeId> = s.members.iter().map(|m| m.id).collect();
                    ids.sort_unstable();
                    let even = s
                        .members
                        .iter()
                        .all(|m| m.state == "up" && m.replicas == 4 && m.leaders == 2);
                    (ids == [1, two] && s.moves == 0 && even).then_some(())
                },
            )
            .await;
        }
        let mut router = Router::new(c.addrs());
        for k in &keys {
            assert_eq!(remaining(&mut router, k).await, 97, "{k}");
        }
        c.stop_all().await;
    })
    .await;
}

/// A group of one replica that moves to another node is handed over, not left to an election:
/// with no replica that stays, its leader first makes the incoming replica a voter beside
/// itself, then transfers the leadership to it, so a client sees a `-MOVED` and no pause as
/// long as an election. Elections here take 3-4 s: a group left leaderless during its move
/// would keep a write waiting that long. (On a loaded machine a transfer may outlast the
/// 700 ms a request waits for a settling leadership, and a write is then told to retry: that
/// is allowed, a wait as long as an election is not.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_one_replica_is_handed_over_when_it_moves() {
    bounded(async {
        let opts = Opts {
            nodes: 2,
            groups: 4,
            replicas: Some(1),
            election_timeout_ms: Some((3_000, 4_000)),
            ..Opts::patient()
        };
        let (mut c, keys) = start_counted("handover", opts, "handover").await;
        // One write at a time to every group while the third node joins and takes its share.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe = {
            let (stop, keys, addrs) = (stop.clone(), keys.clone(), c.addrs());
            tokio::spawn(async move {
                let mut router = Router::new(addrs);
                let (mut writes, mut moved, mut failed) = (0usize, 0usize, Vec::new());
                let (mut retried, mut slowest) = (Vec::new(), Duration::ZERO);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for k in &keys {
                        let probe = format!("{k}:probe");
                        let t0 = std::time::Instant::now();
                        match router
                            .try_call(&["CL.THROTTLE", &probe, "999999", "1", "3600", "1"], SERVE)
                            .await
                        {
                            Ok((_, route)) => {
                                writes += 1;
                                moved += route.moved;
                                if route.retries > 0 {
                                    retried.push(format!("{probe}: {route:?}"));
                                }
                            }
                            Err(e) => failed.push(format!("{probe}: {e}")),
                        }
                        slowest = slowest.max(t0.elapsed());
                    }
                }
                (writes, moved, failed, retried, slowest)
            })
        };
        let three = c.join_node(1).await;
        wait_for("the third node to hold and lead groups", SETTLE, || async {
            let s = status(&c.addr(1)).await;
            let on_three = s.members.iter().find(|m| m.id == three)?;
            (s.nodes == 3 && s.moves == 0 && on_three.replicas > 0 && on_three.leaders > 0)
                .then_some(())
        })
        .await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (writes, moved, failed, retried, slowest) = probe.await.expect("probe");
        println!(
            "handover: {writes} writes, {moved} moved, {} retried, the slowest took {slowest:?}",
            retried.len()
        );
        assert!(
            failed.is_empty(),
            "{} of {writes} writes were not served: {failed:?}",
            failed.len()
        );
        assert!(
            slowest < Duration::from_millis(3_000),
            "a write waited {slowest:?}, as long as an election: {retried:?}"
        );
        assert!(
            moved > 0,
            "no group moved under the probe ({writes} writes)"
        );
        // The counts moved with the groups, and every group has one replica.
        let s = status(&c.addr(1)).await;
        assert_eq!(
            s.members.iter().map(|m| m.replicas).sum::<i64>(),
            4,
            "{s:?}"
        );
        let mut router = Router::new(c.addrs());
        for k in &keys {
            assert_eq!(remaining(&mut router, k).await, 97, "{k}");
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_replaced_from_the_survivors() {
    bounded(async {
        let mut c = TestCluster::start("dead", Opts::patient()).await;
        c.join_node(1).await;
        wait_settled(&c, &c.addr(1), &[1, 2, 3, 4]).await;
        let mut router = Router::new(c.addrs());
        let keys: Vec<String> = (0..c.spec.groups)
            .map(|g| key_in_group(&c.spec, "dead", g))
            .collect();
        for k in &keys {
            consume(&mut router, k, 2).await;
        }
        // Node 3 never comes back.
        c.stop_node(3).await;
        let mut admin = Conn::connect(&c.addr(1)).await.expect("connects");
        assert_eq!(
            admin.must(&["BK.CLUSTER", "REMOVE", "3"]).await.text(),
            "OK"
        );
        // A second removal while one is under way is refused.
        let second = admin
            .call(&["BK.CLUSTER", "REMOVE", "4"])
            .await
            .expect("answers");
        if let Some(e) = second.error() {
            assert!(e.contains("being removed"), "{e}");
        } else {
            panic!("a second removal was accepted: {second:?}");
        }
        wait_settled(&c, &c.addr(1), &[1, 2, 4]).await;
        let mut router = Router::new(vec![c.addr(1), c.addr(2), c.addr(4)]);
        for k in &keys {
            assert_eq!(remaining(&mut router, k).await, 98, "{k}");
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_set_on_one_node_hold_on_every_node_and_on_joiners() {
    bounded(async {
        let mut c = TestCluster::start("rules", Opts::patient()).await;
        let mut one = Conn::connect(&c.addr(1)).await.expect("connects");
        assert_eq!(
            one.must(&["BK.RULE", "SET", "api", "5/1m"]).await.text(),
            "OK"
        );
        assert_eq!(
            one.must(&["BK.RULE", "SET", "login", "sliding:3/1m"])
                .await
                .text(),
            "OK"
        );
        // Read back where it was set, in its written-out form.
        let want = one.must(&["BK.RULE", "GET", "api"]).await.text();
        assert!(want.contains("5/"), "{want}");
        for id in [2, 3] {
            let addr = c.addr(id);
            let want = want.clone();
            wait_for("the rule on every node", SETTLE, || async {
                let mut conn = Conn::connect(&addr).await.ok()?;
                let r = conn.call(&["BK.RULE", "GET", "api"]).await.ok()?;
                (r == Resp::Bulk(Some(want.clone().into_bytes()))).then_some(())
            })
            .await;
        }
        // Deleted on another node: gone everywhere.
        let mut three = Conn::connect(&c.addr(3)).await.expect("connects");
        assert_eq!(three.must(&["BK.RULE", "DEL", "login"]).await.int(), 1);
        assert_eq!(three.must(&["BK.RULE", "DEL", "login"]).await.int(), 0);
        // A node that joins later has them too, and a named check uses them.
        let four = c.join_node(1).await;
        let addr = c.addr(four);
        let want = want.clone();
        wait_for("the rules on the joined node", SETTLE, || async {
            let mut conn = Conn::connect(&addr).await.ok()?;
            let api = conn.call(&["BK.RULE", "GET", "api"]).await.ok()?;
            let login = conn.call(&["BK.RULE", "GET", "login"]).await.ok()?;
            (api == Resp::Bulk(Some(want.clone().into_bytes())) && login == Resp::Bulk(None))
                .then_some(())
        })
        .await;
        let mut router = Router::new(c.addrs());
        let mut admitted = 0;
        for _ in 0..8 {
            let (r, _) = router.call(&["BK.CHECK", "rules:k", "api"], SERVE).await;
            if r.limit()[0] == 1 {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "the cluster's rule allows 5");
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_membership_requests_are_refused_and_change_nothing() {
    bounded(async {
        let mut c = TestCluster::start("badmember", Opts::patient()).await;
        let before = status(&c.addr(1)).await;
        let mut conn = Conn::connect(&c.addr(2)).await.expect("connects");
        let refusals: &[(&[&str], &str)] = &[
            (&["BK.CLUSTER", "REMOVE", "9"], "no node 9"),
            (&["BK.CLUSTER", "REMOVE", "x"], "invalid node id"),
            (&["BK.CLUSTER", "REMOVE"], "wrong number"),
            (&["BK.CLUSTER", "FROB"], "unknown subcommand"),
            // Nothing listens on port 1: the joining node could never be reached.
            (
                &["BK.CLUSTER", "JOIN", "127.0.0.1", "7999", "1"],
                "cannot reach",
            ),
            (
                &["BK.CLUSTER", "JOIN", "127.0.0.1", "0", "1"],
                "invalid port",
            ),
            // Hosts that would break the member list every node keeps.
            (&["BK.CLUSTER", "JOIN", "a,b", "7999", "1"], "invalid host"),
            (
                &["BK.CLUSTER", "JOIN", "a b\"", "7999", "1"],
                "invalid host",
            ),
        ];
        for (cmd, want) in refusals {
            let r = conn.call(cmd).await.expect("answers");
            let e = r
                .error()
                .unwrap_or_else(|| panic!("{cmd:?} answered {r:?}"));
            assert!(e.contains(want), "{cmd:?}: {e}");
        }
        // An address a member uses already.
        let taken = c.spec.node(3).expect("node 3").clone();
        let r = conn
            .call(&[
                "BK.CLUSTER",
                "JOIN",
                "127.0.0.1",
                &taken.port.to_string(),
                &taken.peer_port.to_string(),
            ])
            .await
            .expect("answers");
        assert!(
            r.error().is_some_and(|e| e.contains("already taken")),
            "{r:?}"
        );
        let after = status(&c.addr(1)).await;
        assert_eq!(after.version, before.version, "nothing changed");
        // Leaderships may still be evening out; membership and placement may not change.
        let placed = |s: &Status| -> Vec<(NodeId, String, i64)> {
            s.members
                .iter()
                .map(|m| (m.id, m.state.clone(), m.replicas))
                .collect()
        };
        assert_eq!(placed(&after), placed(&before));
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_cut_short_by_a_crash_finishes_once_the_node_is_back() {
    bounded(async {
        let mut c = TestCluster::start("crashmove", Opts::patient()).await;
        let mut router = Router::new(c.addrs());
        let keys: Vec<String> = (0..c.spec.groups)
            .map(|g| key_in_group(&c.spec, "crash", g))
            .collect();
        for k in &keys {
            consume(&mut router, k, 4).await;
        }
        // The receiving side crashes as soon as it is in, while replicas move to it.
        let four = c.join_node(1).await;
        c.stop_node(four).await;
        c.start_node(four).await;
        wait_settled(&c, &c.addr(1), &[1, 2, 3, 4]).await;
        // The leaving side crashes in the middle of a drain.
        let mut admin = Conn::connect(&c.addr(1)).await.expect("connects");
        assert_eq!(
            admin.must(&["BK.CLUSTER", "REMOVE", "4"]).await.text(),
            "OK"
        );
        let leader_side = 2;
        c.stop_node(leader_side).await;
        c.start_node(leader_side).await;
        wait_settled(&c, &c.addr(1), &[1, 2, 3]).await;
        let mut router = Router::new(vec![c.addr(1), c.addr(2), c.addr(3)]);
        for k in &keys {
            assert_eq!(remaining(&mut router, k).await, 96, "{k}");
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_rules_file_is_loaded_into_the_clusters_rules() {
    bounded(async {
        let mut c = TestCluster::start("rulesfile", Opts::patient()).await;
        let file = c.data_dir(1).with_file_name("rules.toml");
        std::fs::write(&file, "[rules]\nfromfile = \"7/1m\"\n").expect("rules file");
        c.rules.insert(1, file.clone());
        // Node 1 restarts with the file: every node gets its rules.
        c.stop_node(1).await;
        c.start_node(1).await;
        let has = |id: NodeId, name: &'static str| {
            let addr = c.addr(id);
            async move {
                let mut conn = Conn::connect(&addr).await.ok()?;
                let r = conn.call(&["BK.RULE", "GET", name]).await.ok()?;
                matches!(r, Resp::Bulk(Some(_))).then_some(())
            }
        };
        for id in [1, 2, 3] {
            wait_for("the file's rule on every node", SETTLE, || {
                has(id, "fromfile")
            })
            .await;
        }
        // A change to the file reaches every node too.
        std::fs::write(&file, "[rules]\nfromfile = \"7/1m\"\nlater = \"9/1s\"\n")
            .expect("rules file");
        for id in [1, 2, 3] {
            wait_for("the changed file's rule on every node", SETTLE, || {
                has(id, "later")
            })
            .await;
        }
        c.stop_all().await;
    })
    .await;
}
