//! The replicated write path: the shard that owns a group gathers every connection's commands
//! for the group during one turn of its loop into one log entry.

use crate::harness::*;
use std::time::Duration;

const CLIENTS: usize = 20;
const ROUNDS: usize = 20;
const PIPELINE: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_proposes_one_entry_per_group_per_turn() {
    bounded(async {
        let c = TestCluster::start("pipeline", Opts::patient()).await;
        c.wait_balanced(Duration::from_secs(10)).await;
        let leaders = c.hold_leaders(Duration::from_secs(10)).await;
        let g = 0;
        let leader = leaders[g as usize];
        let key = key_in_group(&c.spec, "pipeline", g);

        // One client's pipeline: the whole read is one round, and one entry.
        let before = c.cluster(leader).proposals();
        let mut conn = Conn::connect(&c.addr(leader)).await.expect("connect");
        let cmds: Vec<Vec<String>> = (0..PIPELINE).map(|_| line(&["INCR", &key])).collect();
        for r in conn.pipeline(&cmds).await.expect("pipeline") {
            assert!(!r.is_error(), "{r:?}");
        }
        let after = c.cluster(leader).proposals();
        let (entries, commands) = (after.0 - before.0, after.1 - before.1);
        assert_eq!(commands, PIPELINE as u64);
        // A read of the socket may deliver the pipeline in pieces; each piece is one entry.
        assert!(
            entries <= 4,
            "{PIPELINE} pipelined commands took {entries} entries"
        );

        // Many clients, one command each at a time: their commands share entries.
        let before = c.cluster(leader).proposals();
        let mut tasks = Vec::new();
        for i in 0..CLIENTS {
            let addr = c.addr(leader);
            let key = key_in_group(&c.spec, &format!("pipeline:{i}"), g);
            tasks.push(tokio::spawn(async move {
                let mut conn = Conn::connect(&addr).await.expect("connect");
                for _ in 0..ROUNDS {
                    let r = conn.call(&["BK.CHECK", &key, "1000/1h"]).await.expect("call");
                    assert_eq!(r.limit()[0], 1, "{r:?}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("client");
        }
        let after = c.cluster(leader).proposals();
        let (entries, commands) = (after.0 - before.0, after.1 - before.1);
        println!(
            "pipeline: {commands} commands from {CLIENTS} clients in {entries} entries ({:.1} per entry)",
            commands as f64 / entries.max(1) as f64
        );
        assert_eq!(commands, (CLIENTS * ROUNDS) as u64);
        assert!(
            entries < commands,
            "every command of {CLIENTS} concurrent clients took an entry of its own"
        );

        // Every replica applied every command: the counter is the same everywhere.
        let want = PIPELINE.to_string();
        for id in c.ids() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let got = c.local(id, &["GET", &key]).await;
                if matches!(&got, bucketd::testing::Reply::Bulk(b) if b[..] == *want.as_bytes()) {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "node {id} holds {got:?} for {key}, want {want}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await;
}
