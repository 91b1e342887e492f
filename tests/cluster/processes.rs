//! Real processes: three `bucketd` binaries on real clocks. `kill -9` the leader of a key's
//! group, the group serves again with the bucket intact, the killed node comes back and leads
//! again; then `kill -9` all three and start them: the bucket is still there.

use crate::harness::*;
use bucketd::testing::ClusterSpec;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// One token back per hour: during the test real time refills nothing.
fn check(key: &str, quantity: &'static str) -> Vec<String> {
    line(&["CL.THROTTLE", key, "99", "1", "3600", quantity])
}

/// The three processes; each is killed (SIGKILL) when dropped, so a failed test leaves
/// nothing running.
struct Procs {
    spec_arg: String,
    dir: TempDir,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

impl Procs {
    fn spawn(&mut self, id: u64) {
        let i = id as usize - 1;
        assert!(self.children[i].is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .expect("log file");
        let child = Command::new(BIN)
            .args(["--bind", "127.0.0.1", "--port", &self.ports[i].to_string()])
            .args(["--shards", "1", "--groups", &GROUPS.to_string()])
            .args([
                "--cluster-nodes",
                &self.spec_arg,
                "--node-id",
                &id.to_string(),
            ])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("node-{id}")))
            .args(["--log", "warn"])
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("bucketd starts");
        self.children[i] = Some(child);
    }

    /// `kill -9`.
    fn kill(&mut self, id: u64) {
        let mut child = self.children[id as usize - 1]
            .take()
            .expect("process is running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.ports[id as usize - 1])
    }

    fn addrs(&self) -> Vec<String> {
        (1..=3).map(|id| self.addr(id)).collect()
    }

    fn id_of(&self, addr: &str) -> u64 {
        (1..=3)
            .find(|&id| self.addr(id) == addr)
            .unwrap_or_else(|| panic!("{addr} is not a node"))
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What `CLUSTER INFO` on `addr` says `field` is.
async fn cluster_info(addr: &str, field: &str) -> Option<String> {
    let mut conn = Conn::connect(addr).await.ok()?;
    let text = conn.call(&["CLUSTER", "INFO"]).await.ok()?;
    let Resp::Bulk(Some(b)) = text else {
        return None;
    };
    String::from_utf8_lossy(&b).lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// The node ids `addr` names as masters in `CLUSTER SHARDS`, one per group.
async fn masters(p: &Procs, addr: &str) -> Option<Vec<u64>> {
    let mut conn = Conn::connect(addr).await.ok()?;
    let shards = conn.call(&["CLUSTER", "SHARDS"]).await.ok()?;
    let mut out = Vec::new();
    for shard in shards.array() {
        let shard = shard.array();
        let nodes = shard.get(3)?.array();
        for n in nodes {
            let kv = n.array();
            let field = |name: &str| {
                kv.chunks(2)
                    .find(|p| p[0].text() == name)
                    .map(|p| p[1].clone())
            };
            if field("role")?.text() == "master" {
                let port = field("port")?.int();
                out.push(p.id_of(&format!("127.0.0.1:{port}")));
            }
        }
    }
    Some(out)
}

async fn wait_cluster_ok(p: &Procs, ids: &[u64]) {
    for &id in ids {
        wait_for(
            &format!("node {id} to report cluster_state:ok"),
            Duration::from_secs(20),
            || async { (cluster_info(&p.addr(id), "cluster_state").await? == "ok").then_some(()) },
        )
        .await;
    }
}

/// Takes one token through `client`; returns what is left and which node answered.
async fn take(p: &Procs, client: &mut Router, key: &str, left: i64) -> (i64, u64) {
    let args = check(key, "1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (reply, route) = client.call(&args, SERVE).await;
    let l = reply.limit();
    assert_step(key, left, l[2], -1, &route);
    assert_eq!([l[0], l[1], l[3]], [0, 100, -1]);
    (l[2], p.id_of(&route.addr))
}

/// What is left in the bucket, asked through the cluster; and which node answered.
async fn peek(p: &Procs, client: &mut Router, key: &str) -> (i64, u64) {
    let args = check(key, "0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (reply, route) = client.call(&args, SERVE).await;
    (reply.limit()[2], p.id_of(&route.addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_processes_lose_no_acknowledged_check() {
    bounded(async {
        let spec = local_spec(3, GROUPS);
        let spec_arg = ClusterSpec::format_nodes(&spec.nodes);
        let mut p = Procs {
            spec_arg,
            dir: TempDir::new("procs"),
            ports: spec.nodes.iter().map(|n| n.port).collect(),
            children: vec![None, None, None],
        };
        for id in 1..=3 {
            p.spawn(id);
        }
        wait_cluster_ok(&p, &[1, 2, 3]).await;

        let key = "procs:{tenant-9}";
        let mut client = Router::new(p.addrs());
        let mut left = 100;
        let mut leader = 0;
        for _ in 0..5 {
            (left, leader) = take(&p, &mut client, key, left).await;
        }

        // kill -9 the leader: another replica serves the bucket as it was acknowledged.
        let t0 = Instant::now();
        p.kill(leader);
        let (now, by) = peek(&p, &mut client, key).await;
        println!(
            "processes: after kill -9 of node {leader}, node {by} served the group after {:?}",
            t0.elapsed()
        );
        assert_ne!(by, leader);
        assert_eq!(now, left);
        (left, _) = take(&p, &mut client, key, left).await;

        // The killed node comes back, catches up and is given groups to lead again.
        p.spawn(leader);
        wait_cluster_ok(&p, &[leader]).await;
        let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
        wait_for(
            &format!("node {leader} to lead groups again"),
            Duration::from_secs(20),
            || async {
                let mut views = Vec::new();
                for id in [leader, others[0], others[1]] {
                    views.push(masters(&p, &p.addr(id)).await?);
                }
                let agree = views.iter().all(|v| *v == views[0]);
                (agree && views[0].contains(&leader)).then_some(())
            },
        )
        .await;
        let mut direct = Router::new(vec![p.addr(leader)]);
        assert_eq!(peek(&p, &mut direct, key).await.0, left);

        // kill -9 everything, start everything: the bucket is still there.
        for id in 1..=3 {
            p.kill(id);
        }
        for id in 1..=3 {
            p.spawn(id);
        }
        wait_cluster_ok(&p, &[1, 2, 3]).await;
        let mut client = Router::new(p.addrs());
        assert_eq!(peek(&p, &mut client, key).await.0, left);
        take(&p, &mut client, key, left).await;
    })
    .await;
}
