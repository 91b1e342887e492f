//! Sorted sets, lists and sets through the Raft log: every replica applies the same commands
//! and holds the same collections, in the same order and encoding, and the next leader goes
//! on from them after a failover.

use crate::harness::*;
use bucketd::testing::{NodeId, Reply};
use std::time::Duration;

const ZSET: &str = "log:{tenant-9}";
const LIST: &str = "list:{tenant-9}";
const SET: &str = "set:{tenant-9}";

/// What every replica must hold alike: each collection's members in order, and encodings.
const READS: &[&[&str]] = &[
    &["ZRANGE", ZSET, "0", "-1", "WITHSCORES"],
    &["LRANGE", LIST, "0", "-1"],
    &["SMEMBERS", SET],
    &["OBJECT", "ENCODING", ZSET],
    &["OBJECT", "ENCODING", LIST],
    &["OBJECT", "ENCODING", SET],
    &["PEXPIRETIME", ZSET],
];

/// What the leader holds (it has applied every write a client saw answered), once every
/// replica holds the same.
async fn same_on_every_replica(c: &TestCluster, leader: NodeId) -> Vec<Reply> {
    let leader_view = {
        let id = leader;
        let mut v = Vec::new();
        for r in READS {
            v.push(c.local(id, r).await);
        }
        v
    };
    for id in c.ids() {
        wait_for(
            &format!("node {id} to hold the collections"),
            Duration::from_secs(10),
            || async {
                let mut v = Vec::new();
                for r in READS {
                    v.push(c.local(id, r).await);
                }
                (v == leader_view).then_some(())
            },
        )
        .await;
    }
    leader_view
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_are_alike_on_every_replica_and_survive_a_failover() {
    bounded(async {
        let mut c = TestCluster::start("collections", Opts::default()).await;
        let mut client = Router::new(c.addrs());
        // Each write leaves the same state if a client retries it: members with their
        // scores, a list rebuilt whole by one script, set members.
        let mut zadd = vec!["ZADD".to_string(), ZSET.to_string()];
        for i in 0..200 {
            zadd.push(format!("{}", 1_700_000_000_000u64 + i * 7));
            zadd.push(format!("req-{i}"));
        }
        let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
        client.call(&zadd, SERVE).await;
        client
            .call(
                &["ZREMRANGEBYSCORE", ZSET, "-inf", "1700000000100"],
                SERVE,
            )
            .await;
        client.call(&["PEXPIRE", ZSET, "600000"], SERVE).await;
        client
            .call(
                &[
                    "EVAL",
                    "redis.call('DEL', KEYS[1]) return redis.call('RPUSH', KEYS[1], 'a', 'b', 'c', 'd')",
                    "1",
                    LIST,
                ],
                SERVE,
            )
            .await;
        client.call(&["LTRIM", LIST, "1", "-1"], SERVE).await;
        let mut sadd = vec!["SADD", SET];
        let members: Vec<String> = (0..600).map(|i| format!("{i}")).collect();
        sadd.extend(members.iter().map(String::as_str));
        sadd.push("not-a-number");
        // The node that answered the last write has applied them all.
        let (_, route) = client.call(&sadd, SERVE).await;
        let leader = c.id_of_addr(&route.addr).expect("a node answered");
        let before = same_on_every_replica(&c, leader).await;
        assert!(
            matches!(&before[0], Reply::Scored(v) if v.len() == 185),
            "{:?}",
            before[0]
        );

        c.stop_node(leader).await;
        let (reply, route) = client.call(&["ZCARD", ZSET], SERVE).await;
        assert_ne!(route.addr, c.addr(leader), "the old leader is gone");
        assert_eq!(reply, Resp::Int(185));
        let (reply, _) = client.call(&["LRANGE", LIST, "0", "-1"], SERVE).await;
        assert_eq!(
            reply,
            Resp::Array(Some(
                ["b", "c", "d"]
                    .iter()
                    .map(|s| Resp::Bulk(Some(s.as_bytes().to_vec())))
                    .collect()
            ))
        );
        let (reply, _) = client.call(&["SCARD", SET], SERVE).await;
        assert_eq!(reply, Resp::Int(601));
        c.stop_all().await;
    })
    .await;
}
