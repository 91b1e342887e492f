//! Rate-limit behaviour that only a standalone node has: BK.CHECKALL and BK.RESET over keys on
//! different shards (a cluster refuses keys of different slots), named rules and the rules file
//! (node-local today), and exact admission under concurrent load. The limit commands' semantics
//! on one slot run on a standalone node and on a cluster alike in tests/behaviour/limits.rs.

#![cfg(feature = "server")]

mod common;

use common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkall_across_shards_never_consumes_when_refused() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        for spec_b in ["5/1s", "fixed:5/1s", "sliding:5/1s"] {
            let a = key_on_shard(&format!("xa{spec_b}"), 0, 2);
            let b = key_on_shard(&format!("xb{spec_b}"), 1, 2);
            let c0 = key_on_shard(&format!("xc{spec_b}"), 0, 2);
            // The tight limit on shard 0; the roomy ones on shard 1 and shard 0.
            let args = [
                "BK.CHECKALL",
                "3",
                &b,
                &a,
                &c0,
                spec_b,
                "fixed:2/1s",
                "sliding:9/1s",
            ];
            for i in 1..=2 {
                let (summary, each) = checkall(&mut c, &args).await;
                assert_eq!(summary[0], 1, "{spec_b} call {i}");
                assert_eq!(
                    each.iter().map(|e| e[2]).collect::<Vec<_>>(),
                    [5 - i, 2 - i, 9 - i]
                );
            }
            let before_b = figures(&mut c, &b, spec_b).await;
            let before_c = figures(&mut c, &c0, "sliding:9/1s").await;
            for _ in 0..5 {
                let (summary, each) = checkall(&mut c, &args).await;
                assert_eq!(
                    summary[..4],
                    [0, 2, 0, 1000],
                    "{spec_b}: the fixed limit refuses"
                );
                assert_eq!(each[1][0], 0);
                assert_eq!(each[0][..3], [1, 5, 3], "{spec_b}: {each:?}");
                assert_eq!(each[2][..3], [1, 9, 7], "{spec_b}: {each:?}");
            }
            assert_eq!(
                figures(&mut c, &b, spec_b).await,
                before_b,
                "{spec_b} on shard 1 lost units"
            );
            assert_eq!(figures(&mut c, &c0, "sliding:9/1s").await, before_c);

            // The refusing limit on the other shard, and keys that did not exist before.
            let fresh = key_on_shard(&format!("fresh{spec_b}"), 0, 2);
            let spent = key_on_shard(&format!("spent{spec_b}"), 1, 2);
            assert_eq!(check(&mut c, &spent, "fixed:1/1m").await[0], 1);
            let (summary, each) = checkall(
                &mut c,
                &[
                    "BK.CHECKALL",
                    "2",
                    &fresh,
                    &spent,
                    spec_b,
                    "fixed:1/1m",
                    "COST",
                    "1",
                ],
            )
            .await;
            assert_eq!(summary[0], 0);
            assert_eq!(
                each[0][..3],
                [1, 5, 5],
                "{spec_b}: nothing was taken from {fresh}"
            );
            assert!(
                !exists(&mut c, &fresh).await,
                "{spec_b}: a refused BK.CHECKALL left {fresh} behind"
            );
            assert_eq!(figures(&mut c, &fresh, spec_b).await, [1, 5, 5, -1, 0]);
        }
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkall_peek_and_cost() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let a = key_on_shard("pa", 0, 2);
        let b = key_on_shard("pb", 1, 2);
        let (summary, each) = checkall(
            &mut c,
            &[
                "BK.CHECKALL",
                "2",
                &a,
                &b,
                "10/1s",
                "4/1s",
                "COST",
                "3",
                "PEEK",
            ],
        )
        .await;
        assert_eq!(summary, [1, 4, 1, -1, 750]);
        assert_eq!(each, vec![[1, 10, 7, -1, 300], [1, 4, 1, -1, 750]]);
        assert!(!exists(&mut c, &a).await && !exists(&mut c, &b).await);
        let (summary, _) = checkall(
            &mut c,
            &["BK.CHECKALL", "2", &a, &b, "10/1s", "4/1s", "COST", "3"],
        )
        .await;
        assert_eq!(summary, [1, 4, 1, -1, 750]);
        let (summary, each) = checkall(
            &mut c,
            &[
                "BK.CHECKALL",
                "2",
                &a,
                &b,
                "10/1s",
                "4/1s",
                "COST",
                "2",
                "PEEK",
            ],
        )
        .await;
        assert_eq!(summary[..4], [0, 4, 1, 250]);
        assert_eq!(each[1], [0, 4, 1, 250, 750]);
        assert_eq!(figures(&mut c, &a, "10/1s").await, [1, 10, 7, -1, 300]);
        assert_eq!(figures(&mut c, &b, "4/1s").await, [1, 4, 1, -1, 750]);
        node.shutdown().await;
    })
    .await
}

/// The same BK.CHECKALL calls over keys kept together by a hash tag and over keys spread
/// across shards: the replies, per-limit entries included, must not depend on placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkall_entries_do_not_depend_on_shard_placement() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let together = ("{t}:a".to_string(), "{t}:b".to_string());
        let spread = (key_on_shard("sa", 0, 2), key_on_shard("sb", 1, 2));
        let script: [&[&str]; 7] = [
            &["10/1s", "4/1s", "COST", "3", "PEEK"],
            &["10/1s", "4/1s", "COST", "3"],
            // Refused by the second limit, with and without PEEK.
            &["10/1s", "4/1s", "COST", "2", "PEEK"],
            &["10/1s", "4/1s", "COST", "2"],
            &["fixed:10/1s", "4/1s"],
            &["sliding:10/1s", "4/1s", "COST", "5"],
            &["10/1s", "4/1s"],
        ];
        let mut replies = Vec::new();
        for (a, b) in [&together, &spread] {
            let mut mine = Vec::new();
            for (i, rest) in script.iter().enumerate() {
                let mut args = vec!["BK.CHECKALL", "2", a.as_str(), b.as_str()];
                args.extend_from_slice(rest);
                mine.push((i, checkall(&mut c, &args).await));
            }
            replies.push(mine);
        }
        let differences: Vec<String> = replies[0]
            .iter()
            .zip(&replies[1])
            .filter(|((_, one), (_, two))| one != two)
            .map(|((i, one), (_, two))| {
                format!(
                    "call {i} {:?}: one shard {one:?}, two shards {two:?}",
                    script[*i]
                )
            })
            .collect();
        assert!(
            differences.is_empty(),
            "replies differ:\n{}",
            differences.join("\n")
        );
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_forgets_buckets() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let a = key_on_shard("ra", 0, 2);
        let b = key_on_shard("rb", 1, 2);
        for k in [&a, &b] {
            while check(&mut c, k, "3/1m").await[0] == 1 {}
        }
        let _ = limit(&mut c, &["CL.THROTTLE", "rc", "0", "1", "60"]).await;
        assert_eq!(
            q::<i64>(&mut c, &["BK.RESET", &a, &b, "rc", "missing"]).await,
            3
        );
        assert_eq!(check(&mut c, &a, "3/1m").await, [1, 3, 2, -1, 20_000]);
        assert_eq!(check(&mut c, &b, "3/1m").await, [1, 3, 2, -1, 20_000]);
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "rc", "0", "1", "60"]).await[0],
            0
        );
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_rules_via_bk_rule() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let _: () = q(&mut c, &["BK.RULE", "SET", "login", "sliding:3/1m"]).await;
        let _: () = q(&mut c, &["BK.RULE", "SET", "api", "gcra:10/1s:20"]).await;
        let list: Vec<String> = q(&mut c, &["BK.RULE", "LIST"]).await;
        assert_eq!(
            list,
            vec!["api", "gcra:10/1000ms:20", "login", "sliding:3/60000ms"]
        );
        for i in 1..=3 {
            assert_eq!(check(&mut c, "u1", "login").await[..3], [1, 3, 3 - i]);
        }
        assert_eq!(check(&mut c, "u1", "login").await[..3], [0, 3, 0]);
        assert_eq!(check(&mut c, "u2", "api").await, [1, 20, 19, -1, 100]);
        let (summary, _) =
            checkall(&mut c, &["BK.CHECKALL", "2", "u3", "u4", "api", "login"]).await;
        assert_eq!(summary[..3], [1, 3, 2]);
        assert_eq!(
            limit(&mut c, &["BK.LEASE", "u5", "api", "50"]).await[..3],
            [20, 20, 0]
        );
        // Changing a rule applies to the next check.
        let _: () = q(&mut c, &["BK.RULE", "SET", "api", "5/1s"]).await;
        assert_eq!(check(&mut c, "u6", "api").await, [1, 5, 4, -1, 200]);
        assert_eq!(q::<i64>(&mut c, &["BK.RULE", "DEL", "api"]).await, 1);
        assert_eq!(q::<i64>(&mut c, &["BK.RULE", "DEL", "api"]).await, 0);
        assert_eq!(
            q_err(&mut c, &["BK.CHECK", "u6", "api"]).await,
            "ERR no such rule 'api'"
        );
        // Rules are node-wide: another connection sees them.
        let mut other = node.conn().await;
        assert_eq!(check(&mut other, "u7", "login").await[..3], [1, 3, 2]);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_file_is_loaded_and_hot_reloaded() {
    bounded(async {
        let dir = temp_dir("rules");
        let path = dir.join("rules.toml");
        write_atomically(&path, "[rules]\napi = \"3/1m\"\nlogin = \"fixed:2/1m\"\n");
        let p = path.clone();
        let node = TestNode::start_with(move |s| {
            s.rules = Some(p);
            s.rules_reload_ms = 20;
        })
        .await;
        let mut c = node.conn().await;
        let list: Vec<String> = q(&mut c, &["BK.RULE", "LIST"]).await;
        assert_eq!(
            list,
            vec!["api", "gcra:3/60000ms:3", "login", "fixed:2/60000ms"]
        );
        assert_eq!(check(&mut c, "k1", "api").await, [1, 3, 2, -1, 20_000]);

        // A new version of the file is picked up without any command.
        write_atomically(
            &path,
            "# second version\n[rules]\napi = \"7/1m\"\nsearch = \"sliding:20/1s\"\n",
        );
        let n = &node;
        wait_for(
            "the rules file to be reloaded",
            Duration::from_secs(5),
            move || async move {
                let mut c = n.conn().await;
                let r: Option<String> = q(&mut c, &["BK.RULE", "GET", "api"]).await;
                (r.as_deref() == Some("gcra:7/60000ms:7")).then_some(())
            },
        )
        .await;
        assert_eq!(check(&mut c, "k2", "api").await, [1, 7, 6, -1, 8572]);
        assert_eq!(check(&mut c, "k3", "search").await[..3], [1, 20, 19]);
        assert_eq!(
            q_err(&mut c, &["BK.CHECK", "k4", "login"]).await,
            "ERR no such rule 'login'"
        );

        // A bad file is rejected whole, and the rules in force stay.
        write_atomically(
            &path,
            "[rules]\napi = \"1/1m\"\nbroken = \"many/sometimes\"\n",
        );
        let e = q_err(&mut c, &["BK.RULE", "RELOAD"]).await;
        assert!(
            e.starts_with("ERR rules not reloaded, previous rules kept: "),
            "{e}"
        );
        assert!(e.contains("broken"), "the error names the bad rule: {e}");
        // Watch it for a good while (many poll intervals): the old rules stay in force.
        let watch_until = std::time::Instant::now() + Duration::from_millis(400);
        while std::time::Instant::now() < watch_until {
            let r: Option<String> = q(&mut c, &["BK.RULE", "GET", "api"]).await;
            assert_eq!(r.as_deref(), Some("gcra:7/60000ms:7"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        write_atomically(&path, "[rules\n");
        let watch_until = std::time::Instant::now() + Duration::from_millis(200);
        while std::time::Instant::now() < watch_until {
            let r: Option<String> = q(&mut c, &["BK.RULE", "GET", "search"]).await;
            assert_eq!(r.as_deref(), Some("sliding:20/1000ms"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Fixed again: picked up, by the poller and by RELOAD.
        write_atomically(&path, "[rules]\napi = \"9/1m\"\n");
        wait_for(
            "the fixed rules file to be reloaded",
            Duration::from_secs(5),
            move || async move {
                let mut c = n.conn().await;
                let r: Option<String> = q(&mut c, &["BK.RULE", "GET", "api"]).await;
                (r.as_deref() == Some("gcra:9/60000ms:9")).then_some(())
            },
        )
        .await;
        write_atomically(&path, "[rules]\napi = \"11/1m\"\nx = \"1/1s\"\n");
        assert_eq!(q::<i64>(&mut c, &["BK.RULE", "RELOAD"]).await, 2);
        assert_eq!(check(&mut c, "k5", "api").await[..3], [1, 11, 10]);
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rules_file_at_start_is_an_error() {
    bounded(async {
        let dir = temp_dir("badrules");
        let path = dir.join("rules.toml");
        write_atomically(&path, "[rules]\napi = \"0/1m\"\n");
        let mut s = test_settings();
        s.rules = Some(path.clone());
        let clock = bucketd::clock::ManualClock::new(START_NS);
        match bucketd::start(s.clone(), clock.clone()).await {
            Ok(h) => {
                h.shutdown().await;
                panic!("a node started with an invalid rules file");
            }
            Err(e) => assert!(e.to_string().contains("api"), "{e}"),
        }
        s.rules = Some(dir.join("missing.toml"));
        match bucketd::start(s, clock).await {
            Ok(h) => {
                h.shutdown().await;
                panic!("a node started with a missing rules file");
            }
            Err(e) => assert!(e.to_string().contains("missing.toml"), "{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

/// Replaces a file the way a deploy tool should: write a sibling, then rename over it, so a
/// reader never sees a half-written file.
fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Runs `per_conn` copies of `args` concurrently on each of `conns` connections; returns
/// every reply.
async fn hammer(
    node: &TestNode,
    conns: usize,
    per_conn: usize,
    args: Vec<String>,
) -> Vec<Vec<i64>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let con = node.conn().await;
        for _ in 0..per_conn {
            let mut con = con.clone();
            let args = args.clone();
            tasks.spawn(async move {
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                match q::<redis::Value>(&mut con, &refs).await {
                    redis::Value::Array(items) => items
                        .iter()
                        .map_while(|v| match v {
                            redis::Value::Int(i) => Some(*i),
                            _ => None,
                        })
                        .collect::<Vec<i64>>(),
                    other => panic!("{refs:?}: unexpected reply {other:?}"),
                }
            });
        }
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.expect("task"));
    }
    out
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_admission_under_contention() {
    bounded(async {
        let node = TestNode::start().await;
        for spec in ["100/1m", "fixed:100/1m", "sliding:100/1m"] {
            let key = format!("hot:{spec}");
            let replies = hammer(&node, 20, 50, owned(&["BK.CHECK", &key, spec])).await;
            assert_eq!(replies.len(), 1000);
            let allowed = replies.iter().filter(|r| r[0] == 1).count();
            assert_eq!(allowed, 100, "{spec}");
            // Every allowed reply saw a distinct remaining count.
            let mut rem: Vec<i64> = replies.iter().filter(|r| r[0] == 1).map(|r| r[2]).collect();
            rem.sort();
            assert_eq!(rem, (0..100).collect::<Vec<_>>(), "{spec}");
        }

        let replies = hammer(
            &node,
            20,
            50,
            owned(&["CL.THROTTLE", "hot:cell", "99", "100", "60"]),
        )
        .await;
        assert_eq!(replies.iter().filter(|r| r[0] == 0).count(), 100);

        let replies = hammer(
            &node,
            20,
            50,
            owned(&["BK.LEASE", "hot:lease", "100/1m", "1"]),
        )
        .await;
        assert_eq!(replies.iter().map(|r| r[0]).sum::<i64>(), 100);

        // Across shards: the tight limit decides, and the roomy one on the other shard ends
        // up charged exactly for the admitted calls, whatever was refunded on the way.
        for (spec_a, spec_b) in [("100/1m", "1000/1m"), ("fixed:100/1m", "sliding:1000/1m")] {
            let a = key_on_shard(&format!("hot-a{spec_a}"), 0, 2);
            let b = key_on_shard(&format!("hot-b{spec_b}"), 1, 2);
            let replies = hammer(
                &node,
                20,
                50,
                owned(&["BK.CHECKALL", "2", &a, &b, spec_a, spec_b]),
            )
            .await;
            let allowed = replies.iter().filter(|r| r[0] == 1).count();
            assert_eq!(allowed, 100, "{spec_a} + {spec_b}");
            let mut c = node.conn().await;
            assert_eq!(figures(&mut c, &a, spec_a).await[2], 0);
            assert_eq!(
                figures(&mut c, &b, spec_b).await[2],
                900,
                "{spec_b}: refunds must be exact"
            );
        }
        node.shutdown().await;
    })
    .await
}
