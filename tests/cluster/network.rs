//! Node-to-node links: all groups between two nodes share one connection each way, and a
//! burst of work for many groups travels in few writes.

use crate::harness::*;
use std::time::Duration;

const BURST_CONNS: usize = 10;

/// Established TCP connections whose remote end is `port`, from the kernel's table.
fn established_to(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // f[2] is the remote address as HEX_IP:HEX_PORT; f[3] the state, 01 = established.
            f.len() > 3
                && f[3] == "01"
                && f[2]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_share_one_link_per_peer_and_batch_their_frames() {
    bounded(async {
        let mut c = TestCluster::start("links", Opts::patient()).await;
        c.wait_balanced(Duration::from_secs(10)).await;
        let before: Vec<(u64, u64)> = c
            .ids()
            .iter()
            .map(|&id| c.cluster(id).network().batching())
            .collect();

        // A burst: every node gets pipelines of checks for keys of every group it leads, from
        // several connections at once, so appends of many groups are due to a peer together.
        let mut bursts = Vec::new();
        for id in c.ids() {
            let cmds: Vec<Vec<String>> = c
                .led_by(id)
                .into_iter()
                .flat_map(|g| (0..8).map(move |j| (g, j)))
                .map(|(g, j)| {
                    let key = key_in_group(&c.spec, &format!("links:{j}"), g);
                    line(&["BK.CHECK", &key, "1000/1h"])
                })
                .collect();
            for _ in 0..BURST_CONNS {
                let addr = c.addr(id);
                let cmds = cmds.clone();
                bursts.push(tokio::spawn(async move {
                    let mut conn = Conn::connect(&addr).await.expect("connect");
                    let mut admitted = 0;
                    for _ in 0..10 {
                        for r in conn.pipeline(&cmds).await.expect("pipeline") {
                            // A leader change mid-burst answers -MOVED; that is not the point here.
                            if !r.is_error() {
                                assert_eq!(r.limit()[0], 1, "{r:?}");
                                admitted += 1;
                            }
                        }
                    }
                    admitted
                }));
            }
        }
        let mut admitted = 0;
        for b in bursts {
            admitted += b.await.expect("burst");
        }
        assert!(admitted > 0);

        let mut sent = 0;
        let mut writes = 0;
        for (i, id) in c.ids().into_iter().enumerate() {
            let net = c.cluster(id).network();
            let links = net.open_links();
            assert!(
                (1..=2).contains(&links),
                "node {id} has {links} open links to its 2 peers"
            );
            let (f, w) = net.batching();
            sent += f - before[i].0;
            writes += w - before[i].1;
        }
        println!(
            "links: {sent} frames in {writes} writes ({:.1} per write) during the burst",
            sent as f64 / writes.max(1) as f64
        );
        assert!(sent > writes, "{sent} frames took {writes} writes");

        // Peers that keep up never fill each other's queues, and INFO says what the node counts.
        for id in c.ids() {
            let refused = c.cluster(id).network().queue_full_drops();
            assert_eq!(
                refused, 0,
                "node {id} refused {refused} frames to a full peer queue"
            );
            let mut conn = Conn::connect(&c.addr(id)).await.expect("connect");
            let info = conn.must(&["INFO", "cluster"]).await.text();
            assert!(
                info.contains(&format!("cluster_peer_queue_full:{refused}\r\n")),
                "INFO cluster of node {id}: {info}"
            );
        }

        // The kernel agrees: towards each node's peer port, one connection from each peer.
        for n in &c.spec.nodes {
            let conns = established_to(n.peer_port);
            assert!(
                conns <= 2,
                "{conns} connections to node {}'s peer port {}",
                n.id,
                n.peer_port
            );
        }
        c.stop_all().await;
    })
    .await;
}
