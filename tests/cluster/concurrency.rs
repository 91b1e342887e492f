//! Concurrency limits through a failover: slots taken on a group's leader are in every
//! replica's log, so the next leader still refuses once the limit is held, accepts the tokens
//! the old leader handed out, and frees holders at the same deadlines.

use crate::harness::*;
use bucketd::testing::Reply;
use std::time::Duration;

const KEY: &str = "inflight:{tenant-9}";

fn acquire() -> [&'static str; 4] {
    ["BK.ACQUIRE", KEY, "3", "60s"]
}

/// BK.ACQUIRE's five fields: allowed, token (None when refused), in_flight, limit, retry.
fn fields(r: &Resp) -> (i64, Option<String>, i64, i64, i64) {
    let f = r.array();
    assert_eq!(f.len(), 5, "{r:?}");
    let token = match &f[1] {
        Resp::Bulk(None) => None,
        t => Some(t.text()),
    };
    (f[0].int(), token, f[2].int(), f[3].int(), f[4].int())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_slots_survive_the_loss_of_the_leader() {
    bounded(async {
        let mut c = TestCluster::start("concurrency", Opts::default()).await;
        let mut client = Router::new(c.addrs());
        let mut tokens = Vec::new();
        let mut leader = 0;
        for held in 1..=3 {
            let (reply, route) = client.call(&acquire(), SERVE).await;
            let (allowed, token, in_flight, limit, retry) = fields(&reply);
            assert_eq!(
                (allowed, in_flight, limit, retry),
                (1, held, 3, -1),
                "{route:?}"
            );
            tokens.push(token.expect("a granted slot has a token"));
            leader = c.id_of_addr(&route.addr).expect("a node answered");
        }
        // Every replica applied the acquires at the leader's timestamps: the same holders.
        for id in c.ids() {
            wait_for(
                &format!("node {id} to hold the three slots"),
                Duration::from_secs(5),
                || async {
                    (c.local(id, &["BK.INFLIGHT", KEY]).await == Reply::Int(3)).then_some(())
                },
            )
            .await;
        }

        c.stop_node(leader).await;
        let (reply, route) = client.call(&acquire(), SERVE).await;
        assert_ne!(route.addr, c.addr(leader), "the old leader is gone");
        assert_eq!(
            fields(&reply),
            (0, None, 3, 3, 60_000),
            "the new leader refuses: the limit is held"
        );
        // A token the old leader handed out gives its slot back on the new one, once.
        let release = ["BK.RELEASE", KEY, &tokens[0]];
        assert_eq!(client.call(&release, SERVE).await.0, Resp::Int(1));
        assert_eq!(client.call(&release, SERVE).await.0, Resp::Int(0));
        let advance = |c: &TestCluster, ms: u64| {
            for id in c.running() {
                c.clocks[id as usize - 1].advance_ms(ms);
            }
        };
        advance(&c, 10_000);
        let (reply, _) = client.call(&acquire(), SERVE).await;
        let (allowed, token, in_flight, _, _) = fields(&reply);
        assert_eq!((allowed, in_flight), (1, 3));
        assert!(
            !tokens.contains(&token.expect("a token")),
            "no token is handed out twice"
        );

        // The two holders nobody released free themselves at their deadline, on the new
        // leader's clock: one millisecond before it, all three slots are still held.
        advance(&c, 49_999);
        let (reply, _) = client.call(&acquire(), SERVE).await;
        assert_eq!(fields(&reply), (0, None, 3, 3, 1));
        advance(&c, 1);
        let (reply, _) = client.call(&acquire(), SERVE).await;
        let (allowed, _, in_flight, _, _) = fields(&reply);
        assert_eq!(
            (allowed, in_flight),
            (1, 2),
            "two expired; the newer one is held"
        );
        c.stop_all().await;
    })
    .await;
}
