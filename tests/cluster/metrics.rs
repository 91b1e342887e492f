//! The metrics endpoint of cluster nodes: per-group Raft state, and each decision counted
//! once, by the node that answered it, though every replica applies it.

use crate::common::scrape::{Scrape, promtool_check, scrape};
use crate::harness::*;
use std::time::Duration;

const SECS: Duration = Duration::from_secs(15);

async fn scrape_node(c: &TestCluster, id: u64) -> Scrape {
    let addr = c.handle(id).metrics_addr.expect("metrics on");
    scrape(addr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_is_counted_once_and_every_group_has_one_leader_in_the_metrics() {
    bounded(async {
        let mut c = TestCluster::start(
            "metrics",
            Opts {
                balance: false,
                ..Opts::patient()
            },
        )
        .await;
        let leaders = c.wait_leaders(SECS).await;
        let key = key_in_group(&c.spec, "metrics:cell", 0);
        let g = group_of_key(&c.spec, &key);
        let leader = leaders[g as usize];
        let mut conn = Conn::connect(&c.addr(leader)).await.expect("connect");
        let mut limited = 0;
        for _ in 0..5 {
            limited += conn
                .must(&["CL.THROTTLE", &key, "2", "1", "60"])
                .await
                .limit()[0];
        }
        assert_eq!(limited, 2);

        let group = g.to_string();
        let scrapes = wait_for("the replicas to apply the checks", SECS, || async {
            let mut all = Vec::new();
            for id in c.ids() {
                all.push((id, scrape_node(&c, id).await));
            }
            // Every replica has applied the group's entries, and knows of nothing committed
            // after them. (A leader answers a check as it applies the entry, a moment before
            // its Raft metrics count the entry applied, and a follower learns of a commit with
            // the leader's next append: either can be seen for a moment.)
            let index = |m: &Scrape, name: &str| m.sum(name, &[&format!("group=\"{group}\"")]);
            let first = all
                .first()
                .map(|(_, m)| index(m, "bucketd_raft_applied_index"))
                .unwrap_or(0.0);
            all.iter()
                .all(|(_, m)| {
                    first > 0.0
                        && index(m, "bucketd_raft_applied_index") == first
                        && index(m, "bucketd_raft_commit_index") == first
                })
                .then_some(all)
        })
        .await;
        let series = |cmd: &str, result: &str| {
            format!("bucketd_checks_total{{command=\"{cmd}\",result=\"{result}\"}}")
        };
        for (id, m) in &scrapes {
            let (allowed, denied) = if *id == leader {
                (3.0, 2.0)
            } else {
                (0.0, 0.0)
            };
            assert_eq!(
                m.get(&series("cl.throttle", "allowed")),
                allowed,
                "node {id}"
            );
            assert_eq!(m.get(&series("cl.throttle", "denied")), denied, "node {id}");
            let is_leader = m.get(&format!("bucketd_raft_leader{{group=\"{group}\"}}"));
            assert_eq!(is_leader, f64::from(u8::from(*id == leader)), "node {id}");
            let indexes: Vec<(u64, f64, f64)> = scrapes
                .iter()
                .map(|(id, m)| {
                    (
                        *id,
                        m.get(&format!("bucketd_raft_commit_index{{group=\"{group}\"}}")),
                        m.get(&format!("bucketd_raft_applied_index{{group=\"{group}\"}}")),
                    )
                })
                .collect();
            assert_eq!(
                m.get(&format!("bucketd_raft_apply_lag{{group=\"{group}\"}}")),
                0.0,
                "node {id}; (node, committed, applied): {indexes:?}"
            );
            assert!(m.get("bucketd_cluster_replicas") >= 1.0);
            promtool_check(&m.text);
        }
        let on_leader = &scrapes
            .iter()
            .find(|(id, _)| *id == leader)
            .expect("leader")
            .1;
        assert!(
            on_leader.get(&format!(
                "bucketd_raft_proposals_total{{group=\"{group}\"}}"
            )) >= 1.0
        );
        assert!(
            on_leader.get(&format!(
                "bucketd_raft_leader_changes_total{{group=\"{group}\"}}"
            )) >= 1.0
        );
        assert!(on_leader.get("bucketd_check_duration_seconds_count") >= 5.0);
        // Every group, the metadata group included, is led by exactly one node.
        for gid in (0..c.spec.groups)
            .map(|g| g.to_string())
            .chain(["meta".to_string()])
        {
            let label = format!("group=\"{gid}\"");
            let leading: f64 = scrapes
                .iter()
                .map(|(_, m)| m.sum("bucketd_raft_leader", &[&label]))
                .sum();
            assert_eq!(leading, 1.0, "group {gid}");
        }
        c.stop_all().await;
    })
    .await;
}
