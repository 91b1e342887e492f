//! Hashes through a failover: fields written on a group's leader are in every replica's log,
//! so the next leader reads them back in their order, with the key's expiry, and keeps
//! changing them.

use crate::harness::*;
use bucketd::testing::Reply;
use bytes::Bytes;
use std::time::Duration;

const KEY: &str = "bucket:{tenant-7}";

fn bulk(s: &str) -> Resp {
    Resp::Bulk(Some(s.as_bytes().to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_written_on_the_leader_is_read_back_after_a_failover() {
    bounded(async {
        let mut c = TestCluster::start("hashes", Opts::default()).await;
        let mut client = Router::new(c.addrs());
        // HSET and PEXPIRE can be retried safely: applied twice, they leave the same hash.
        let hset = [
            "HSET",
            KEY,
            "tokens",
            "10",
            "ts",
            "1700000000000",
            "tokens",
            "9.5",
        ];
        let (reply, route) = client.call(&hset, SERVE).await;
        assert!(matches!(reply, Resp::Int(2 | 0)), "{reply:?}");
        let leader = c.id_of_addr(&route.addr).expect("a node answered");
        let (reply, _) = client.call(&["PEXPIRE", KEY, "60000"], SERVE).await;
        assert_eq!(reply, Resp::Int(1));
        let pair = |f: &str, v: &str| {
            (
                Reply::Bulk(Bytes::copy_from_slice(f.as_bytes())),
                Reply::Bulk(Bytes::copy_from_slice(v.as_bytes())),
            )
        };
        let want = Reply::Map(vec![pair("tokens", "9.5"), pair("ts", "1700000000000")]);
        for id in c.ids() {
            wait_for(
                &format!("node {id} to hold the hash"),
                Duration::from_secs(5),
                || async { (c.local(id, &["HGETALL", KEY]).await == want).then_some(()) },
            )
            .await;
        }

        c.stop_node(leader).await;
        let (reply, route) = client.call(&["HGETALL", KEY], SERVE).await;
        assert_ne!(route.addr, c.addr(leader), "the old leader is gone");
        assert_eq!(
            reply,
            Resp::Array(Some(vec![
                bulk("tokens"),
                bulk("9.5"),
                bulk("ts"),
                bulk("1700000000000")
            ]))
        );
        let (reply, _) = client.call(&["PTTL", KEY], SERVE).await;
        assert!((1..=60_000).contains(&reply.int()), "{reply:?}");
        let (reply, route) = client
            .call(&["HINCRBYFLOAT", KEY, "tokens", "0.5"], SERVE)
            .await;
        if route.ambiguous == 0 {
            assert_eq!(reply, bulk("10"));
        }
        let (reply, _) = client.call(&["HDEL", KEY, "tokens", "ts"], SERVE).await;
        assert!(matches!(reply, Resp::Int(2 | 0)), "{reply:?}");
        let (reply, _) = client.call(&["EXISTS", KEY], SERVE).await;
        assert_eq!(reply, Resp::Int(0), "the last field took the key with it");
        c.stop_all().await;
    })
    .await;
}
