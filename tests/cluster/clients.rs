//! Clients as gateways run them: the `redis` crate's cluster client, `redis-cli -c`,
//! redis-py's `RedisCluster`, a plain client that must follow `-MOVED` itself, and plain
//! clients on a cluster that forwards. Also the `CLUSTER` replies cluster clients rely on.

use crate::common::tools::{REDIS_CLI, REDIS_PY, require_python, require_tool};
use crate::harness::*;
use bucketd::slot::key_slot;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const SECS: Duration = Duration::from_secs(10);

/// Runs a program to completion (at most 30 s) and returns its standard output.
async fn run(program: &str, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(program)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {args:?} did not finish within 30 s"))
    .unwrap_or_else(|e| panic!("{program} does not run: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crate_cluster_client_routes_every_command() {
    use redis::AsyncCommands;
    bounded(async {
        let c = TestCluster::start("rediscluster", Opts::patient()).await;
        let client =
            redis::cluster::ClusterClient::builder(vec![format!("redis://{}/", c.addr(1))])
                .connection_timeout(SECS)
                .response_timeout(SECS)
                .build()
                .expect("cluster client");
        let mut con = client.get_async_connection().await.expect("connects");
        let mut groups_seen = std::collections::BTreeSet::new();
        for i in 0..48 {
            let key = format!("rc:{i}");
            groups_seen.insert(group_of_key(&c.spec, &key));
            for left in [4, 3] {
                let r: Vec<i64> = redis::cmd("CL.THROTTLE")
                    .arg(&key)
                    .arg(4)
                    .arg(1)
                    .arg(3600)
                    .query_async(&mut con)
                    .await
                    .expect("CL.THROTTLE");
                assert_eq!(r, [0, 5, left, -1, 3600 * (5 - left)], "{key}");
            }
            let r: Vec<i64> = redis::cmd("BK.CHECK")
                .arg(format!("rc:bk:{i}"))
                .arg("10/1h")
                .query_async(&mut con)
                .await
                .expect("BK.CHECK");
            assert_eq!(r, [1, 10, 9, -1, 360_000]);
            for n in 1..=3 {
                let v: i64 = con.incr(format!("rc:n:{i}"), 1).await.expect("INCR");
                assert_eq!(v, n);
            }
            // Several limits in one slot, by hash tag.
            let r: redis::Value = redis::cmd("BK.CHECKALL")
                .arg(2)
                .arg(format!("{{rc:{i}}}:min"))
                .arg(format!("{{rc:{i}}}:day"))
                .arg("10/1m")
                .arg("100/1d")
                .query_async(&mut con)
                .await
                .expect("BK.CHECKALL");
            let redis::Value::Array(parts) = r else {
                panic!("BK.CHECKALL replied {r:?}");
            };
            assert_eq!(parts.len(), 6);
            assert_eq!(parts[0], redis::Value::Int(1));
        }
        assert_eq!(groups_seen.len(), c.spec.groups as usize);
        drop(con);
        let mut c = c;
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_follows_moved() {
    require_tool(REDIS_CLI);
    bounded(async {
        let mut c = TestCluster::start("rediscli", Opts::patient()).await;
        c.wait_balanced(SECS).await;
        let port = c.spec.node(1).expect("node 1").port.to_string();
        let mut moved = 0;
        for g in 0..c.spec.groups {
            let key = key_in_group(&c.spec, "cli", g);
            if c.agreed_leader(g) != Some(1) {
                moved += 1;
            }
            for left in [4, 3] {
                let out = run(
                    "redis-cli",
                    &[
                        "-c",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &port,
                        "CL.THROTTLE",
                        &key,
                        "4",
                        "1",
                        "3600",
                    ],
                )
                .await;
                let got: Vec<i64> = out
                    .split_whitespace()
                    .map(|w| w.parse().expect("integers"))
                    .collect();
                assert_eq!(got, [0, 5, left, -1, 3600 * (5 - left)], "{key}: {out}");
            }
        }
        assert!(moved > 0, "some group is led by another node");
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_cluster_client_smoke() {
    require_python(REDIS_PY);
    const SCRIPT: &str = r#"
import sys
from redis.cluster import RedisCluster
rc = RedisCluster(host="127.0.0.1", port=int(sys.argv[1]), decode_responses=True)
assert len(rc.get_nodes()) == 3, rc.get_nodes()
for i in range(24):
    k = f"py:{i}"
    for left in (4, 3):
        r = rc.execute_command("CL.THROTTLE", k, 4, 1, 3600)
        assert list(r) == [0, 5, left, -1, 3600 * (5 - left)], (k, r)
    assert rc.incr(f"py:n:{i}") == 1
    r = rc.execute_command("BK.CHECK", f"py:bk:{i}", "10/1h")
    assert list(r) == [1, 10, 9, -1, 360000], r
assert rc.cluster_keyslot("py:0") == int(sys.argv[2])
print("ok")
"#;
    bounded(async {
        let mut c = TestCluster::start("redispy", Opts::patient()).await;
        c.wait_balanced(SECS).await;
        let port = c.spec.node(2).expect("node 2").port.to_string();
        let slot = key_slot(b"py:0").to_string();
        let out = run("python3", &["-c", SCRIPT, &port, &slot]).await;
        assert_eq!(out.trim(), "ok");
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_client_is_sent_to_the_leader() {
    bounded(async {
        let mut c = TestCluster::start("moved", Opts::patient()).await;
        c.wait_balanced(SECS).await;
        let mut conns = HashMap::new();
        for id in c.ids() {
            conns.insert(id, Conn::connect(&c.addr(id)).await.expect("connect"));
        }
        for g in 0..c.spec.groups {
            let key = key_in_group(&c.spec, "plain", g);
            let slot = key_slot(key.as_bytes());
            for id in c.ids() {
                let conn = conns.get_mut(&id).expect("conn");
                // Polled: should a leader change be under way, the reply must name the new one.
                let deadline = std::time::Instant::now() + SECS;
                loop {
                    let leader = c.agreed_leader(g);
                    let reply = conn
                        .must(&["CL.THROTTLE", &key, "4", "1", "3600", "0"])
                        .await;
                    let want = match leader {
                        Some(l) if l == id => {
                            Resp::Array(Some([0, 5, 5, -1, 0].into_iter().map(Resp::Int).collect()))
                        }
                        Some(l) => Resp::Error(format!("MOVED {slot} {}", c.addr(l))),
                        None => Resp::Error("no agreed leader".into()),
                    };
                    if reply == want && c.agreed_leader(g) == leader {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "node {id} answered {reply:?} for {key}; the leader is {leader:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_commands_need_one_slot() {
    bounded(async {
        let mut c = TestCluster::start("crossslot", Opts::patient()).await;
        let (a, b) = ("cross:a", "cross:b");
        assert_ne!(key_slot(a.as_bytes()), key_slot(b.as_bytes()));
        const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
        for id in c.ids() {
            let mut conn = Conn::connect(&c.addr(id)).await.expect("connect");
            for cmd in [
                vec!["BK.CHECKALL", "2", a, b, "10/1m", "10/1m"],
                vec!["DEL", a, b],
                vec!["EXISTS", a, b],
                vec!["BK.RESET", a, b],
            ] {
                let r = conn.must(&cmd).await;
                assert_eq!(r, Resp::Error(CROSSSLOT.into()), "{cmd:?} on node {id}");
            }
        }
        // One hash tag: one slot, whatever follows it.
        let (min, day) = ("{user:42}:min", "{user:42}:day");
        assert_eq!(key_slot(min.as_bytes()), key_slot(day.as_bytes()));
        let mut client = Router::new(c.addrs());
        for left in [9, 8] {
            let (r, _) = client
                .call(&["BK.CHECKALL", "2", min, day, "10/1m", "100/1d"], SERVE)
                .await;
            let parts = r.array();
            assert_eq!(parts.len(), 6, "{r:?}");
            let each: Vec<[i64; 5]> = parts[5].array().iter().map(Resp::limit).collect();
            assert_eq!(each[0][..3], [1, 10, left]);
            assert_eq!(each[1][..3], [1, 100, 90 + left]);
            // The deciding limit is the one with the least left.
            assert_eq!(
                parts[..5].iter().map(Resp::int).collect::<Vec<_>>(),
                each[0]
            );
        }
        let (r, _) = client.call(&["EXISTS", min, day, min], SERVE).await;
        assert_eq!(r.int(), 3);
        let (r, _) = client.call(&["DEL", min, day], SERVE).await;
        assert_eq!(r.int(), 2);
        let (r, _) = client.call(&["EXISTS", min, day], SERVE).await;
        assert_eq!(r.int(), 0);
        c.stop_all().await;
    })
    .await;
}

/// One node of a CLUSTER SLOTS entry: host, port, id.
type SlotNode = (String, i64, String);

/// CLUSTER SLOTS, as (first slot, last slot, nodes).
fn parse_slots(r: &Resp) -> Vec<(i64, i64, Vec<SlotNode>)> {
    r.array()
        .iter()
        .map(|e| {
            let e = e.array();
            let nodes = e[2..]
                .iter()
                .map(|n| {
                    let n = n.array();
                    assert!(n.len() >= 3, "node entry {n:?}");
                    (n[0].text(), n[1].int(), n[2].text())
                })
                .collect();
            (e[0].int(), e[1].int(), nodes)
        })
        .collect()
}

/// A RESP2 flat key-value array as a map.
fn pairs(r: &Resp) -> BTreeMap<String, Resp> {
    r.array()
        .chunks(2)
        .map(|kv| (kv[0].text(), kv[1].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_commands_describe_the_cluster() {
    bounded(async {
        let mut c = TestCluster::start("topology", Opts::patient()).await;
        c.wait_balanced(SECS).await;
        // Leaderships stay where they are while the views are compared.
        let leaders: Vec<u64> = c.hold_leaders(SECS).await;
        let id_of = |redis_id: &str| {
            c.spec
                .nodes
                .iter()
                .find(|n| n.redis_id() == redis_id)
                .unwrap_or_else(|| panic!("unknown node id {redis_id}"))
                .id
        };
        for me in c.ids() {
            let mut conn = Conn::connect(&c.addr(me)).await.expect("connect");

            // SLOTS: every slot exactly once, three replicas each, the leader first.
            let slots = parse_slots(&conn.must(&["CLUSTER", "SLOTS"]).await);
            assert_eq!(slots.len(), c.spec.groups as usize);
            let mut next = 0;
            let mut sorted = slots.clone();
            sorted.sort_by_key(|s| s.0);
            for (lo, hi, nodes) in &sorted {
                assert_eq!(*lo, next, "slot ranges are contiguous");
                assert!(hi >= lo);
                next = hi + 1;
                assert_eq!(nodes.len(), 3, "three replicas of {lo}-{hi}");
                let g = c.spec.group_of_slot(*lo as u16);
                assert_eq!(
                    id_of(&nodes[0].2),
                    leaders[g as usize],
                    "leader of {lo}-{hi} first"
                );
                let mut ids: Vec<u64> = nodes.iter().map(|n| id_of(&n.2)).collect();
                ids.sort_unstable();
                assert_eq!(ids, [1, 2, 3]);
                for (host, port, id) in nodes {
                    let n = c.spec.node(id_of(id)).expect("node");
                    assert_eq!((host.as_str(), *port), (n.host.as_str(), i64::from(n.port)));
                }
            }
            assert_eq!(next, 16384, "all 16384 slots are served");
            for id in c.ids() {
                assert!(
                    slots.iter().any(|s| id_of(&s.2[0].2) == id),
                    "node {id} leads some group"
                );
            }

            // SHARDS: the same, as maps, with one master per shard.
            let shards = conn.must(&["CLUSTER", "SHARDS"]).await;
            assert_eq!(shards.array().len(), c.spec.groups as usize);
            for shard in shards.array() {
                let shard = pairs(shard);
                let range: Vec<i64> = shard["slots"].array().iter().map(Resp::int).collect();
                let g = c.spec.group_of_slot(range[0] as u16);
                assert_eq!(
                    range,
                    [
                        i64::from(c.spec.group_slots(g).0),
                        i64::from(c.spec.group_slots(g).1)
                    ]
                );
                let nodes: Vec<BTreeMap<String, Resp>> =
                    shard["nodes"].array().iter().map(pairs).collect();
                assert_eq!(nodes.len(), 3);
                let masters: Vec<u64> = nodes
                    .iter()
                    .filter(|n| n["role"].text() == "master")
                    .map(|n| id_of(&n["id"].text()))
                    .collect();
                assert_eq!(masters, [leaders[g as usize]]);
                for n in &nodes {
                    let spec = c.spec.node(id_of(&n["id"].text())).expect("node");
                    assert_eq!(n["port"].int(), i64::from(spec.port));
                    assert_eq!(n["ip"].text(), spec.host);
                    assert_eq!(n["endpoint"].text(), spec.host);
                    assert_eq!(n["health"].text(), "online");
                    assert!(["master", "replica"].contains(&n["role"].text().as_str()));
                }
            }

            // NODES: one line per node; each master's slots are the groups it leads.
            let text = conn.must(&["CLUSTER", "NODES"]).await.text();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 3, "{text}");
            let mut covered = 0;
            for l in lines {
                let f: Vec<&str> = l.split(' ').collect();
                assert!(f.len() >= 8, "{l}");
                assert!(f[0].len() == 40 && f[0].chars().all(|ch| ch.is_ascii_hexdigit()));
                let id = id_of(f[0]);
                let n = c.spec.node(id).expect("node");
                assert_eq!(f[1], format!("{}:{}@{}", n.host, n.port, n.peer_port));
                assert_eq!(f[2].split(',').any(|x| x == "myself"), id == me, "{l}");
                assert!(f[2].split(',').any(|x| x == "master"), "{l}");
                assert_eq!(f[7], "connected");
                let mut led: Vec<u32> = Vec::new();
                for r in &f[8..] {
                    let (lo, hi) = match r.split_once('-') {
                        Some((lo, hi)) => (lo.parse::<u16>().unwrap(), hi.parse::<u16>().unwrap()),
                        None => (r.parse().unwrap(), r.parse().unwrap()),
                    };
                    covered += u32::from(hi - lo) + 1;
                    led.push(c.spec.group_of_slot(lo));
                }
                assert_eq!(led, c.led_by(id), "{l}");
            }
            assert_eq!(covered, 16384);

            // INFO, MYID, KEYSLOT and the connection-mode commands.
            let info: HashMap<String, String> = conn
                .must(&["CLUSTER", "INFO"])
                .await
                .text()
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect();
            for (k, v) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
                ("cluster_slots_fail", "0"),
                ("cluster_known_nodes", "3"),
                ("cluster_size", "3"),
            ] {
                assert_eq!(info.get(k).map(String::as_str), Some(v), "{k} in {info:?}");
            }
            assert_eq!(
                conn.must(&["CLUSTER", "MYID"]).await.text(),
                format!("{me:040x}")
            );
            assert_eq!(
                conn.must(&["CLUSTER", "KEYSLOT", "{user:42}:min"]).await,
                Resp::Int(i64::from(key_slot(b"user:42")))
            );
            for cmd in ["READONLY", "READWRITE", "ASKING"] {
                assert_eq!(conn.must(&[cmd]).await, Resp::Simple("OK".into()), "{cmd}");
            }
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_nodes_serve_clients_that_ignore_moved() {
    bounded(async {
        let mut c = TestCluster::start(
            "forward",
            Opts {
                forward: true,
                ..Opts::patient()
            },
        )
        .await;
        c.wait_balanced(SECS).await;
        let mut conns = Vec::new();
        for id in c.ids() {
            conns.push(Conn::connect(&c.addr(id)).await.expect("connect"));
        }
        for g in 0..c.spec.groups {
            for j in 0..2 {
                let key = key_in_group(&c.spec, &format!("fwd:{j}"), g);
                // The same bucket through every node in turn, none of which needs to lead it.
                for (i, conn) in conns.iter_mut().enumerate() {
                    let r = conn.must(&["CL.THROTTLE", &key, "4", "1", "3600"]).await;
                    assert!(!r.is_error(), "{key} via {}: {r:?}", conn.addr);
                    let left = 4 - i as i64;
                    assert_eq!(
                        r.limit(),
                        [0, 5, left, -1, 3600 * (5 - left)],
                        "{key} via {}",
                        conn.addr
                    );
                }
                // Errors come back through the forwarding node as they are.
                let r = conns[0].must(&["INCRBY", &key, "1"]).await;
                assert!(
                    r.error().is_some_and(|e| e.starts_with("WRONGTYPE")),
                    "{r:?}"
                );
            }
        }
        c.stop_all().await;
    })
    .await;
}

/// With forwarding on, a client that does not understand `-MOVED` must never be sent one,
/// also while a group's leadership moves: it should be forwarded, or told to try again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_never_redirects_during_leader_changes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    bounded(async {
        let mut c = TestCluster::start(
            "forwardmoves",
            Opts {
                forward: true,
                balance: false,
                ..Opts::patient()
            },
        )
        .await;
        c.wait_leaders(SECS).await;
        let g = 0;
        let key = key_in_group(&c.spec, "fwdmove", g);
        let replicas = c.spec.placement(g);
        let stop = Arc::new(AtomicBool::new(false));
        let mut hammers = Vec::new();
        let admits: Vec<Arc<std::sync::atomic::AtomicUsize>> = c
            .ids()
            .iter()
            .map(|_| Arc::new(std::sync::atomic::AtomicUsize::new(0)))
            .collect();
        for (i, id) in c.ids().into_iter().enumerate() {
            let addr = c.addr(id);
            let key = key.clone();
            let stop = stop.clone();
            let admitted = admits[i].clone();
            hammers.push(tokio::spawn(async move {
                let mut conn = Conn::connect(&addr).await.expect("connect");
                let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = conn
                        .must(&["CL.THROTTLE", &key, "999999", "1", "3600"])
                        .await;
                    let kind = match r.error() {
                        Some(e) if e.starts_with("MOVED") => e.to_string(),
                        Some(e) => e.split(' ').next().unwrap_or_default().to_string(),
                        None => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            "admitted".to_string()
                        }
                    };
                    *kinds.entry(kind).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                (addr, kinds)
            }));
        }
        // Leadership goes round the group's replicas a few times.
        for round in 0..6 {
            let leader = c.wait_leaders(SECS).await[g as usize];
            let at = replicas
                .iter()
                .position(|&r| r == leader)
                .expect("a replica leads");
            let to = replicas[(at + 1) % replicas.len()];
            c.cluster(leader)
                .transfer_leader(g, to)
                .await
                .expect("transfer");
            wait_for(
                &format!("round {round}: node {to} to lead"),
                SECS,
                || async { (c.agreed_leader(g) == Some(to)).then_some(()) },
            )
            .await;
        }
        // The transfers can all be over in well under a second: once the leadership has
        // settled, every node must serve again.
        let settled: Vec<usize> = admits.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        wait_for("every forwarding node to admit again", SECS, || async {
            admits
                .iter()
                .zip(&settled)
                .all(|(a, &before)| a.load(Ordering::Relaxed) > before)
                .then_some(())
        })
        .await;
        stop.store(true, Ordering::Relaxed);
        let mut redirected = Vec::new();
        for h in hammers {
            let (addr, kinds) = h.await.expect("hammer");
            println!("forwarding through {addr}: {kinds:?}");
            assert!(kinds.contains_key("admitted"), "{addr} admitted nothing");
            for (kind, n) in kinds {
                if kind.starts_with("MOVED") {
                    redirected.push(format!("{addr}: {n} x {kind}"));
                }
            }
        }
        assert!(
            redirected.is_empty(),
            "forwarding nodes redirected: {redirected:?}"
        );
        c.stop_all().await;
    })
    .await;
}
