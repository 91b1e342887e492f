//! The two setups every behaviour test runs on, and `both_topologies!`, which takes one test
//! body and makes a test of it for each: a standalone node, and a three-node cluster where
//! every write goes through Raft.
//!
//! Every node runs on a `ManualClock`, and a test moves time only with `Topo::advance_ms`,
//! which moves every node's clock by the same amount: a group's leader stamps each entry with
//! its clock and every replica applies the entry at that stamp.
//!
//! A standalone node is started for each test (it takes milliseconds). The cluster is started
//! once per test binary, on a runtime of its own so that it outlives every test's runtime, and
//! the tests take turns on it. Before each turn every key is deleted and the clocks move
//! forward to a fresh starting time. Time inside a Raft group never runs backward, so the clocks
//! cannot go back to `START_NS`: a test that needs its absolute starting time reads
//! `Topo::start_s`.

use crate::common::{self, START_NS, TestNode, wait_for};
use crate::harness::{self, Opts, SERVE, TestCluster};
use bucketd::clock::{Clock, ManualClock};
use bucketd::testing::Reply;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OnceCell};

/// Makes `$name::standalone` and `$name::cluster` from one test body; the body gets a
/// `Topo` named by the closure's argument.
macro_rules! both_topologies {
    ($(#[$attr:meta])* $name:ident, |$t:ident| $body:block) => {
        $(#[$attr])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn standalone() {
                $crate::topology::standalone(|$t| async move $body).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cluster() {
                $crate::topology::cluster(|$t| async move $body).await
            }
        }
    };
}

/// A connection to either setup: plain to the standalone node, cluster-aware (it follows
/// `-MOVED` and retries `-TRYAGAIN`) to the cluster.
pub enum Conn {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// What a test body sees of its setup.
#[derive(Clone)]
pub struct Topo {
    clocks: Vec<Arc<ManualClock>>,
    /// `redis://host:port/` of every node.
    urls: Vec<String>,
    cluster: bool,
    start_ns: u64,
}

impl Topo {
    /// A new connection.
    pub async fn conn(&self) -> Conn {
        if !self.cluster {
            return Conn::Node(common::connect_url(&self.urls[0]).await);
        }
        let client = redis::cluster::ClusterClient::builder(self.urls.clone())
            .connection_timeout(common::REPLY_TIMEOUT)
            .response_timeout(common::REPLY_TIMEOUT)
            .build()
            .expect("cluster client");
        Conn::Cluster(
            client
                .get_async_connection()
                .await
                .expect("cluster connection"),
        )
    }

    /// Moves every node's clock forward.
    pub fn advance_ms(&self, ms: u64) {
        for c in &self.clocks {
            c.advance_ms(ms);
        }
    }

    /// The time the test started at, in whole seconds since the epoch.
    pub fn start_s(&self) -> i64 {
        i64::try_from(self.start_ns / 1_000_000_000).expect("a time in range")
    }
}

/// Runs `body` on a fresh standalone node.
pub async fn standalone<F, Fut>(body: F)
where
    F: FnOnce(Topo) -> Fut,
    Fut: Future<Output = ()>,
{
    common::bounded(async {
        let node = TestNode::start().await;
        body(Topo {
            clocks: vec![node.clock.clone()],
            urls: vec![node.redis_url()],
            cluster: false,
            start_ns: START_NS,
        })
        .await;
        node.shutdown().await;
    })
    .await
}

/// Runs `body` on this binary's cluster, alone, after clearing what the previous test left.
pub async fn cluster<F, Fut>(body: F)
where
    F: FnOnce(Topo) -> Fut,
    Fut: Future<Output = ()>,
{
    let shared = shared().await;
    // A test that fails still lets go of its turn; the next one clears what it left.
    let _turn = TURN.lock().await;
    common::bounded(async {
        let topo = shared.fresh_turn().await;
        body(topo).await;
    })
    .await
}

/// The cluster every test of this binary shares.
struct Shared {
    clocks: Vec<Arc<ManualClock>>,
    addrs: Vec<String>,
}

static SHARED: OnceCell<Shared> = OnceCell::const_new();

/// One test at a time on the shared cluster: tests move its clocks.
static TURN: Mutex<()> = Mutex::const_new(());

/// How far apart the tests' starting times are: four weeks, longer than any test moves the
/// clock, and a whole number of days so every test starts at the same time of day.
const TURN_SPAN_NS: u64 = 28 * 86_400 * 1_000_000_000;

async fn shared() -> &'static Shared {
    SHARED
        .get_or_init(|| async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("shared-cluster".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("runtime for the shared cluster");
                    rt.block_on(async move {
                        let c = start_checked().await;
                        let shared = Shared {
                            clocks: c.clocks.clone(),
                            addrs: c.addrs(),
                        };
                        if tx.send(shared).is_ok() {
                            // The cluster lives as long as the test binary.
                            std::future::pending::<()>().await;
                        }
                        drop(c);
                    });
                })
                .expect("a thread for the shared cluster");
            rx.await.expect("the shared cluster starts")
        })
        .await
}

/// Starts the cluster and checks it is what the cluster runs claim to test: three nodes,
/// every group with an elected leader that every node knows, and a write that reaches every
/// replica's own copy through the Raft log.
async fn start_checked() -> TestCluster {
    let secs = Duration::from_secs(20);
    // Leaders stay where they were elected for the whole run: a leadership move in the middle
    // of a test could make a client retry a write whose fate it does not know.
    let opts = Opts {
        balance: false,
        ..Opts::patient()
    };
    let c = TestCluster::start("behaviour", opts).await;
    assert_eq!(c.running().len(), 3, "the cluster runs three nodes");
    assert!(c.spec.groups > 0 && c.spec.replicas == 3);
    wait_for(
        "every node to serve every group's elected leader",
        secs,
        || async {
            (0..c.spec.groups)
                .all(|g| {
                    c.agreed_leader(g).is_some_and(|l| {
                        c.cluster(l).leads(g)
                            && c.ids()
                                .iter()
                                .all(|&id| c.cluster(id).serving_leader(g) == Some(l))
                    })
                })
                .then_some(())
        },
    )
    .await;
    let mut client = harness::Router::new(c.addrs());
    let (r, _) = client.call(&["SET", "raft:probe", "1"], SERVE).await;
    assert_eq!(r, harness::Resp::Simple("OK".into()));
    for id in c.ids() {
        wait_for("the probe on every replica", secs, || async {
            matches!(c.local(id, &["GET", "raft:probe"]).await, Reply::Bulk(b) if &b[..] == b"1")
                .then_some(())
        })
        .await;
    }
    let (r, _) = client.call(&["DEL", "raft:probe"], SERVE).await;
    assert_eq!(r, harness::Resp::Int(1));
    c
}

impl Shared {
    /// Deletes every key and moves the clocks to the next turn's starting time.
    async fn fresh_turn(&self) -> Topo {
        let mut client = harness::Router::new(self.addrs.clone());
        for addr in &self.addrs {
            let mut node = harness::Conn::connect(addr).await.expect("node answers");
            let keys = node.must(&["KEYS", "*"]).await;
            for key in keys.array() {
                client.call(&["DEL", &key.text()], SERVE).await;
            }
        }
        let now = self.clocks[0].now_ns();
        let start_ns = START_NS + ((now - START_NS) / TURN_SPAN_NS + 1) * TURN_SPAN_NS;
        for c in &self.clocks {
            c.set_ns(start_ns);
        }
        Topo {
            clocks: self.clocks.clone(),
            urls: self.addrs.iter().map(|a| format!("redis://{a}/")).collect(),
            cluster: true,
            start_ns,
        }
    }
}
