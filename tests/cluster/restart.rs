//! Restarts: a node that was down catches up on what it missed and takes its share of the
//! leaderships back;
//! a cluster stopped as a whole comes back with every bucket and counter as it was.

use crate::harness::*;
use bucketd::testing::Reply;
use std::time::Duration;

const SECS: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_node_catches_up_and_leads_again() {
    bounded(async {
        let mut c = TestCluster::start("catchup", Opts::patient()).await;
        c.wait_balanced(SECS).await;
        let down = 3;
        let its_groups = c.led_by(down);
        assert!(!its_groups.is_empty(), "node {down} leads some groups");
        c.stop_node(down).await;

        // While it is down, every group goes on: one bucket and one counter per group.
        let mut client = Router::new(c.addrs());
        let buckets: Vec<String> = (0..c.spec.groups)
            .map(|g| key_in_group(&c.spec, "catchup:bucket", g))
            .collect();
        let counters: Vec<String> = (0..c.spec.groups)
            .map(|g| key_in_group(&c.spec, "catchup:counter", g))
            .collect();
        let mut left = vec![100i64; buckets.len()];
        for (i, key) in buckets.iter().enumerate() {
            for _ in 0..=i {
                let (r, route) = client
                    .call(&["CL.THROTTLE", key, "99", "1", "60"], SERVE)
                    .await;
                assert_step(key, left[i], r.limit()[2], -1, &route);
                left[i] = r.limit()[2];
            }
        }
        let mut counts = vec![0i64; counters.len()];
        for (i, key) in counters.iter().enumerate() {
            for _ in 0..=i {
                let (r, route) = client.call(&["INCR", key], SERVE).await;
                assert_step(key, counts[i], r.int(), 1, &route);
                counts[i] = r.int();
            }
        }

        c.start_node(down).await;
        // Its state machines apply everything it missed.
        for (i, key) in buckets.iter().enumerate() {
            wait_for(
                &format!("node {down} to catch up on {key}"),
                SECS,
                || async {
                    let l = c
                        .local_limit(down, &["CL.THROTTLE", key, "99", "1", "60", "0"])
                        .await;
                    (l[2] == left[i]).then_some(())
                },
            )
            .await;
        }
        for (i, key) in counters.iter().enumerate() {
            let want = counts[i].to_string();
            wait_for(
                &format!("node {down} to catch up on {key}"),
                SECS,
                || async {
                    match c.local(down, &["GET", key]).await {
                        Reply::Bulk(b) if b == want.as_bytes() => Some(()),
                        _ => None,
                    }
                },
            )
            .await;
        }
        // And it leads its share of the groups again (the balancer hands it as many as before,
        // not necessarily the same ones), serving the same counts.
        c.wait_balanced(SECS).await;
        // Hold the leaderships still while they are checked one by one.
        c.hold_leaders(SECS).await;
        let now_led = c.led_by(down);
        assert!(
            now_led.len().abs_diff(its_groups.len()) <= 1,
            "node {down} led {its_groups:?} before and {now_led:?} after"
        );
        let mut direct = Conn::connect(&c.addr(down)).await.expect("connect");
        for g in now_led {
            let key = &buckets[g as usize];
            let r = direct
                .must(&["CL.THROTTLE", key, "99", "1", "60", "0"])
                .await;
            assert_eq!(
                r.limit()[..3],
                [0, 100, left[g as usize]],
                "{key} on node {down}"
            );
            let r = direct.must(&["GET", &counters[g as usize]]).await;
            assert_eq!(r.text(), counts[g as usize].to_string());
        }
        c.stop_all().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_every_bucket() {
    bounded(async {
        let mut c = TestCluster::start("fullrestart", Opts::default()).await;
        // Five keys per group, each algorithm, each consumed a different amount.
        let mut writes = Vec::new();
        let mut peeks = Vec::new();
        for g in 0..c.spec.groups {
            let mut group_writes = Vec::new();
            for (j, kind) in ["cell", "gcra", "sliding", "fixed", "counter"]
                .iter()
                .enumerate()
            {
                let key = key_in_group(&c.spec, &format!("full:{kind}"), g);
                let times = 1 + (g as usize + j) % 7;
                let (write, peek) = match *kind {
                    "cell" => (
                        line(&["CL.THROTTLE", &key, "19", "1", "60"]),
                        line(&["CL.THROTTLE", &key, "19", "1", "60", "0"]),
                    ),
                    "counter" => (line(&["INCRBY", &key, "3"]), line(&["GET", &key])),
                    other => {
                        let spec = match other {
                            "gcra" => "20/1m",
                            "sliding" => "sliding:20/1h",
                            _ => "fixed:20/1h",
                        };
                        (
                            line(&["BK.CHECK", &key, spec]),
                            line(&["BK.CHECK", &key, spec, "PEEK"]),
                        )
                    }
                };
                group_writes.extend(std::iter::repeat_n(write, times));
                peeks.push(peek);
            }
            writes.push(group_writes);
        }
        replies_concurrently(&c.addrs(), writes).await;
        let mut client = Router::new(c.addrs());
        let before = replies(&mut client, &peeks).await;
        // Nothing full: every key holds something to lose.
        for (p, r) in peeks.iter().zip(&before) {
            match r {
                Resp::Bulk(Some(_)) => {}
                Resp::Array(Some(_)) => assert!(r.limit()[2] < 20, "{p:?}: {r:?}"),
                other => panic!("{p:?}: {other:?}"),
            }
        }

        c.stop_all().await;
        for id in c.ids() {
            c.start_node(id).await;
        }
        c.wait_leaders(SECS).await;
        let mut client = Router::new(c.addrs());
        let after = replies(&mut client, &peeks).await;
        for ((p, b), a) in peeks.iter().zip(&before).zip(&after) {
            assert_eq!(a, b, "{p:?} after the restart");
        }
        c.stop_all().await;
    })
    .await;
}
