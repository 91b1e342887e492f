//! MULTI / EXEC in a cluster: the queued commands of one slot go into the group's log as one
//! entry, so every replica applies them together; keys of several slots are refused with
//! CROSSSLOT, and a node that does not lead the slot's group answers EXEC with MOVED.

use crate::harness::*;
use std::time::Duration;

const KEY: &str = "txn:{tenant-3}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_is_one_entry_applied_on_every_replica() {
    bounded(async {
        // Leaderships stay put, so the leader found below still leads when asked.
        let c = TestCluster::start(
            "txn",
            Opts {
                balance: false,
                ..Opts::patient()
            },
        )
        .await;
        let g = group_of_key(&c.spec, KEY);
        let leaders = c.wait_leaders(Duration::from_secs(10)).await;
        let leader = leaders[g as usize];
        let mut conn = Conn::connect(&c.addr(leader)).await.expect("connect");
        assert_eq!(conn.must(&["MULTI"]).await.text(), "OK");
        for args in [
            &["INCR", KEY][..],
            &["INCRBY", KEY, "41"],
            &["EXPIRE", KEY, "600"],
            &["GET", KEY],
        ] {
            assert_eq!(conn.must(args).await.text(), "QUEUED");
        }
        let r = conn.must(&["EXEC"]).await;
        let got: Vec<String> = r.array().iter().map(|x| format!("{x:?}")).collect();
        assert_eq!(r.array().len(), 4, "{got:?}");
        assert_eq!(r.array()[1].int(), 42);
        // Every replica holds the transaction's result.
        for id in c.ids() {
            wait_for(
                &format!("node {id} to apply the transaction"),
                Duration::from_secs(5),
                || async {
                    matches!(c.local(id, &["GET", KEY]).await,
                        bucketd::testing::Reply::Bulk(b) if &b[..] == b"42")
                    .then_some(())
                },
            )
            .await;
        }
        // Keys of another slot are refused, and the transaction with them.
        conn.must(&["MULTI"]).await;
        conn.must(&["INCR", KEY]).await;
        let e = conn.must(&["INCR", "txn:{other}"]).await;
        assert!(
            e.error().is_some_and(|e| e.starts_with("CROSSSLOT")),
            "{e:?}"
        );
        let e = conn.must(&["EXEC"]).await;
        assert!(
            e.error().is_some_and(|e| e.starts_with("EXECABORT")),
            "{e:?}"
        );
        // A node that does not lead the group sends the client to the one that does.
        let other = c.other_than(leader);
        let mut f = Conn::connect(&c.addr(other)).await.expect("connect");
        f.must(&["MULTI"]).await;
        f.must(&["INCR", KEY]).await;
        let e = f.must(&["EXEC"]).await;
        let moved = e.error().and_then(parse_moved);
        assert!(
            moved.is_some_and(|(_, addr)| addr == c.addr(leader)),
            "{e:?}"
        );
        assert!(matches!(c.local(leader, &["GET", KEY]).await,
            bucketd::testing::Reply::Bulk(b) if &b[..] == b"42"));
    })
    .await;
}
