//! What every cluster scenario needs: free ports, temporary data folders, a three-node cluster
//! running in this process (each node on its own `ManualClock`), a small RESP client, a client
//! that follows `-MOVED` and retries `-CLUSTERDOWN`/`-TRYAGAIN`, and bounded waiting.

use bucketd::clock::ManualClock;
use bucketd::config::Settings;
use bucketd::server::NodeHandle;
use bucketd::slot::key_slot;
use bucketd::testing::{
    Cluster, ClusterSettings, ClusterSpec, GroupId, NodeId, NodeSpec, Parsed, Reply,
};
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Where every node's clock starts: 2023-11-14T22:13:20Z, in nanoseconds.
pub const START_NS: u64 = 1_700_000_000_000_000_000;

/// The longest any one scenario may run before it fails instead of hanging the suite.
pub const TEST_DEADLINE: Duration = Duration::from_secs(90);

/// How long one reply may take before the client gives up on the connection.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Groups in the test clusters: enough that every node leads some.
pub const GROUPS: u32 = 8;

/// One scenario at a time: each runs a whole cluster, and timings (elections, failover,
/// replies within the write timeout) mean little on a machine the scenarios share.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a command may take to be served through retries and redirections.
pub const SERVE: Duration = Duration::from_secs(20);

/// Runs a scenario alone and with a deadline, so a hang fails the test instead of the run.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    let _alone = ONE_AT_A_TIME.lock().await;
    let t0 = Instant::now();
    match tokio::time::timeout(TEST_DEADLINE, f).await {
        Ok(v) => {
            println!("scenario took {:?}", t0.elapsed());
            v
        }
        Err(_) => panic!("scenario did not finish within {TEST_DEADLINE:?}"),
    }
}

/// Polls a condition with a deadline: the same helper every integration test uses.
pub use crate::common::wait_for;

/// A port nothing listens on (see `common::free_port`).
pub use crate::common::free_port;

/// A folder under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "bucketd-cluster-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A cluster description of `n` nodes on fresh local ports, three replicas per group (fewer
/// while there are fewer nodes).
pub fn local_spec(n: u64, groups: u32) -> ClusterSpec {
    ClusterSpec {
        nodes: (1..=n)
            .map(|id| NodeSpec {
                id,
                host: "127.0.0.1".into(),
                port: free_port(),
                peer_port: free_port(),
            })
            .collect(),
        replicas: 3,
        groups,
    }
}

/// A key whose slot belongs to group `g`.
pub fn key_in_group(spec: &ClusterSpec, prefix: &str, g: GroupId) -> String {
    (0u32..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| spec.group_of_slot(key_slot(k.as_bytes())) == g)
        .expect("some key lands in every group")
}

pub fn group_of_key(spec: &ClusterSpec, key: &str) -> GroupId {
    spec.group_of_slot(key_slot(key.as_bytes()))
}

/// How the test cluster's nodes are set up.
#[derive(Clone)]
pub struct Opts {
    pub nodes: u64,
    pub groups: u32,
    pub forward: bool,
    /// How long a write may wait for its group before `-TRYAGAIN` (the default: 500 ms).
    pub write_timeout: Option<Duration>,
    /// Whether nodes even out leaderships by themselves (off for scenarios that move them).
    pub balance: bool,
    /// How long a group stays idle before it goes quiet (`None`: the default).
    pub quiet_after: Option<Duration>,
    /// Serve Envoy's rate limit service on every node, with this configuration.
    pub rls_config: Option<PathBuf>,
    /// What the Raft log may hold in memory per node (`None`: the default).
    pub log_memory: Option<u64>,
    /// Replicas per group (`None`: three, or fewer with fewer nodes).
    pub replicas: Option<usize>,
    /// The election timeout's range in milliseconds (`None`: the default).
    pub election_timeout_ms: Option<(u64, u64)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            nodes: 3,
            groups: GROUPS,
            forward: false,
            write_timeout: None,
            balance: true,
            quiet_after: None,
            rls_config: None,
            log_memory: None,
            replicas: None,
            election_timeout_ms: None,
        }
    }
}

impl Opts {
    /// For scenarios that count exactly through a healthy cluster: a write timeout long
    /// enough that a loaded machine does not turn slow commits into `-TRYAGAIN`.
    pub fn patient() -> Opts {
        Opts::write_timeout(Duration::from_secs(5))
    }

    /// The defaults, with writes waiting `limit` for their group before `-TRYAGAIN`.
    pub fn write_timeout(limit: Duration) -> Opts {
        Opts {
            write_timeout: Some(limit),
            ..Opts::default()
        }
    }
}

/// A cluster of nodes running in this process. Node `id` is at index `id - 1`; a stopped
/// node keeps its data folder, so starting it again is a restart.
pub struct TestCluster {
    pub spec: ClusterSpec,
    pub clocks: Vec<Arc<ManualClock>>,
    nodes: Vec<Option<NodeHandle>>,
    opts: Opts,
    dir: TempDir,
    /// Nodes that joined after the start (they restart from their data folder).
    joined: Vec<NodeId>,
    /// The rules file each node is started with, if any.
    pub rules: HashMap<NodeId, PathBuf>,
}

impl TestCluster {
    /// Starts every node and waits until every group has a leader all nodes agree on.
    pub async fn start(tag: &str, opts: Opts) -> TestCluster {
        let mut spec = local_spec(opts.nodes, opts.groups);
        if let Some(r) = opts.replicas {
            spec.replicas = r;
        }
        let mut c = TestCluster {
            clocks: (0..opts.nodes)
                .map(|_| ManualClock::new(START_NS))
                .collect(),
            nodes: (0..opts.nodes).map(|_| None).collect(),
            spec,
            opts,
            dir: TempDir::new(tag),
            joined: Vec::new(),
            rules: HashMap::new(),
        };
        for id in c.ids() {
            c.start_node(id).await;
        }
        c.wait_leaders(Duration::from_secs(10)).await;
        c.wait_formed(Duration::from_secs(10)).await;
        c
    }

    /// Waits until every running node has the cluster's first metadata.
    pub async fn wait_formed(&self, limit: Duration) {
        wait_for("the cluster's metadata on every node", limit, || async {
            self.running()
                .iter()
                .all(|&id| self.cluster(id).metadata().is_bootstrapped())
                .then_some(())
        })
        .await;
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.spec.nodes.iter().map(|n| n.id).collect()
    }

    /// A node other than `id` (the first by id).
    pub fn other_than(&self, id: NodeId) -> NodeId {
        self.ids()
            .into_iter()
            .find(|&n| n != id)
            .expect("a cluster of more than one node")
    }

    /// Ids of the nodes that are running.
    pub fn running(&self) -> Vec<NodeId> {
        self.ids()
            .into_iter()
            .filter(|&id| self.nodes[idx(id)].is_some())
            .collect()
    }

    pub fn data_dir(&self, id: NodeId) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    pub fn cluster_settings(&self, id: NodeId) -> ClusterSettings {
        let mut cs = ClusterSettings::new(id, self.spec.clone(), self.data_dir(id));
        if self.joined.contains(&id) {
            // Restarts from its data folder, as `--join` does.
            let n = self.spec.node(id).expect("node in spec").clone();
            cs = ClusterSettings::new(
                0,
                ClusterSpec {
                    nodes: vec![NodeSpec { id: 0, ..n }],
                    replicas: 1,
                    groups: 1,
                },
                self.data_dir(id),
            );
            cs.join = Some(self.addr(1));
        }
        cs.forward = self.opts.forward;
        cs.balance_leaders = self.opts.balance;
        if let Some(t) = self.opts.write_timeout {
            cs.write_timeout = t;
        }
        if let Some(t) = self.opts.quiet_after {
            cs.quiet_after = Some(t);
        }
        if let Some(b) = self.opts.log_memory {
            cs.log_memory = b;
        }
        if let Some(t) = self.opts.election_timeout_ms {
            cs.election_timeout_ms = t;
        }
        cs
    }

    /// Starts (or restarts) node `id` with its data folder.
    pub async fn start_node(&mut self, id: NodeId) {
        assert!(
            self.nodes[idx(id)].is_none(),
            "node {id} is already running"
        );
        let n = self.spec.node(id).expect("node in spec").clone();
        let s = Settings {
            bind: "127.0.0.1".into(),
            port: n.port,
            shards: 2,
            rules: self.rules.get(&id).cloned(),
            rules_reload_ms: 100,
            metrics_port: Some(0),
            grpc_port: self.opts.rls_config.as_ref().map(|_| 0),
            rls_config: self.opts.rls_config.clone(),
            cluster: Some(self.cluster_settings(id)),
            ..Settings::default()
        };
        let h = match tokio::time::timeout(
            Duration::from_secs(15),
            bucketd::start(s, self.clocks[idx(id)].clone()),
        )
        .await
        {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => panic!("node {id} does not start: {e}"),
            Err(_) => panic!("node {id} did not start within 15 s"),
        };
        self.nodes[idx(id)] = Some(h);
    }

    /// Starts a new node that joins the running cluster through node `via`; returns the id
    /// the cluster gave it.
    pub async fn join_node(&mut self, via: NodeId) -> NodeId {
        let host = "127.0.0.1".to_string();
        let (port, peer_port) = (free_port(), free_port());
        // Ids are handed out in order and never reused: the node gets the next one.
        let expected = self.nodes.len() as NodeId + 1;
        let dir = self.data_dir(expected);
        let mut cs = ClusterSettings::new(
            0,
            ClusterSpec {
                nodes: vec![NodeSpec {
                    id: 0,
                    host: host.clone(),
                    port,
                    peer_port,
                }],
                replicas: 1,
                groups: 1,
            },
            dir.clone(),
        );
        cs.join = Some(self.addr(via));
        cs.forward = self.opts.forward;
        cs.balance_leaders = self.opts.balance;
        if let Some(t) = self.opts.write_timeout {
            cs.write_timeout = t;
        }
        if let Some(t) = self.opts.quiet_after {
            cs.quiet_after = Some(t);
        }
        if let Some(t) = self.opts.election_timeout_ms {
            cs.election_timeout_ms = t;
        }
        let clock = ManualClock::new(START_NS);
        if let Some(c) = self.clocks.first() {
            use bucketd::clock::Clock;
            clock.set_ns(c.now_ns());
        }
        let s = Settings {
            bind: host.clone(),
            port,
            shards: 2,
            cluster: Some(cs),
            ..Settings::default()
        };
        let h =
            match tokio::time::timeout(Duration::from_secs(15), bucketd::start(s, clock.clone()))
                .await
            {
                Ok(Ok(h)) => h,
                Ok(Err(e)) => panic!("the joining node does not start: {e}"),
                Err(_) => panic!("the joining node did not start within 15 s"),
            };
        let id = h.node.cluster().expect("cluster mode").me;
        assert_eq!(id, expected, "ids are handed out in order");
        self.spec.nodes.push(NodeSpec {
            id,
            host,
            port,
            peer_port,
        });
        self.clocks.push(clock);
        self.nodes.push(Some(h));
        self.joined.push(id);
        id
    }

    /// Stops node `id` (its Raft groups, peer links and shards); its data folder stays.
    pub async fn stop_node(&mut self, id: NodeId) {
        let h = self.nodes[idx(id)].take().expect("node is running");
        tokio::time::timeout(Duration::from_secs(10), h.shutdown())
            .await
            .unwrap_or_else(|_| panic!("node {id} did not stop within 10 s"));
    }

    pub async fn stop_all(&mut self) {
        for id in self.running() {
            self.stop_node(id).await;
        }
    }

    pub fn handle(&self, id: NodeId) -> &NodeHandle {
        self.nodes[idx(id)]
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} is not running"))
    }

    pub fn cluster(&self, id: NodeId) -> &Arc<Cluster> {
        self.handle(id).node.cluster().expect("cluster mode")
    }

    pub fn addr(&self, id: NodeId) -> String {
        self.spec.node(id).expect("node in spec").client_addr()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.ids().iter().map(|&id| self.addr(id)).collect()
    }

    /// The client addresses of every node but `id` (the majority side of a cut, say).
    pub fn addrs_but(&self, id: NodeId) -> Vec<String> {
        self.ids()
            .into_iter()
            .filter(|&other| other != id)
            .map(|other| self.addr(other))
            .collect()
    }

    /// Node id listening at a client address.
    pub fn id_of_addr(&self, addr: &str) -> Option<NodeId> {
        self.spec
            .nodes
            .iter()
            .find(|n| n.client_addr() == addr)
            .map(|n| n.id)
    }

    /// The leader of `g` if every running replica of `g` names the same running node, and
    /// that node names itself.
    pub fn agreed_leader(&self, g: GroupId) -> Option<NodeId> {
        let viewer = *self.running().first()?;
        let replicas: Vec<NodeId> = self
            .cluster(viewer)
            .voters(g)
            .into_iter()
            .filter(|id| self.nodes.get(idx(*id)).is_some_and(Option::is_some))
            .collect();
        let first = self.cluster(*replicas.first()?).leader(g)?;
        let all_agree = replicas
            .iter()
            .all(|&id| self.cluster(id).leader(g) == Some(first));
        (all_agree && self.nodes[idx(first)].is_some()).then_some(first)
    }

    /// Waits until every group has an agreed leader; returns them by group.
    pub async fn wait_leaders(&self, limit: Duration) -> Vec<NodeId> {
        wait_for("every group to have an agreed leader", limit, || async {
            (0..self.spec.groups)
                .map(|g| self.agreed_leader(g))
                .collect::<Option<Vec<NodeId>>>()
        })
        .await
    }

    /// Runs one keyed command straight on node `id`'s own copy of the key, bypassing Raft:
    /// what this replica's state machine holds, at this node's clock.
    pub async fn local(&self, id: NodeId, args: &[&str]) -> Reply {
        let node = &self.handle(id).node;
        let req = bucketd::testing::Request::from_args(args);
        let rules = node.rules.load();
        let Ok(Parsed::Keyed(cmd)) = bucketd::testing::parse_command(req, &rules) else {
            panic!("{args:?} is not a single-key command");
        };
        // In cluster mode every slot of a group lives on shard (group % shards).
        let shard = group_of_key(
            &self.spec,
            std::str::from_utf8(cmd.route_key()).expect("utf-8 key"),
        ) as usize
            % node.shards.len();
        let mut replies = node.shards[shard]
            .call(vec![cmd])
            .await
            .expect("shard is running");
        replies.remove(0)
    }

    /// The five fields of a limit command run on node `id`'s local copy.
    pub async fn local_limit(&self, id: NodeId, args: &[&str]) -> [i64; 5] {
        match self.local(id, args).await {
            Reply::Limit(l) => l,
            other => panic!("{args:?} on node {id} locally: expected a limit reply, got {other:?}"),
        }
    }
}

/// A scenario that failed half-way still stops its nodes, so they do not load the machine
/// while the other scenarios run. The test's runtime is going away, so each node is stopped
/// on a thread of its own, not waited for.
impl Drop for TestCluster {
    fn drop(&mut self) {
        for h in self.nodes.iter_mut().filter_map(Option::take) {
            std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(async {
                        let _ = tokio::time::timeout(Duration::from_secs(10), h.shutdown()).await;
                    });
                }
            });
        }
    }
}

fn idx(id: NodeId) -> usize {
    usize::try_from(id).expect("small id") - 1
}

/// A decoded RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    pub fn error(&self) -> Option<&str> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }

    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(v) => *v,
            other => panic!("expected an integer, got {other:?}"),
        }
    }

    pub fn array(&self) -> &[Resp] {
        match self {
            Resp::Array(Some(items)) => items,
            other => panic!("expected an array, got {other:?}"),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("expected a string, got {other:?}"),
        }
    }

    /// The five integers of a limit reply.
    pub fn limit(&self) -> [i64; 5] {
        let v: Vec<i64> = self.array().iter().map(Resp::int).collect();
        v.try_into()
            .unwrap_or_else(|v| panic!("expected five integers, got {v:?}"))
    }
}

/// A plain (not cluster-aware) RESP2 connection.
pub struct Conn {
    pub addr: String,
    stream: BufReader<TcpStream>,
}

fn timed_out(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string())
}

impl Conn {
    pub async fn connect(addr: &str) -> std::io::Result<Conn> {
        let s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .map_err(|_| timed_out("connect"))??;
        s.set_nodelay(true)?;
        Ok(Conn {
            addr: addr.to_string(),
            stream: BufReader::new(s),
        })
    }

    /// Sends one command and reads its reply (at most `REPLY_TIMEOUT`).
    pub async fn call(&mut self, args: &[&str]) -> std::io::Result<Resp> {
        self.call_within(args, REPLY_TIMEOUT).await
    }

    pub async fn call_within(&mut self, args: &[&str], limit: Duration) -> std::io::Result<Resp> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&out).await?;
        tokio::time::timeout(limit, read_resp(&mut self.stream))
            .await
            .map_err(|_| timed_out("reply"))?
    }

    /// Sends every command in one write, then reads all the replies.
    pub async fn pipeline(&mut self, cmds: &[Vec<String>]) -> std::io::Result<Vec<Resp>> {
        let mut out = Vec::new();
        for args in cmds {
            out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
        self.stream.get_mut().write_all(&out).await?;
        let mut replies = Vec::with_capacity(cmds.len());
        for _ in cmds {
            let r = tokio::time::timeout(REPLY_TIMEOUT, read_resp(&mut self.stream))
                .await
                .map_err(|_| timed_out("reply"))??;
            replies.push(r);
        }
        Ok(replies)
    }

    /// Like `call`, for tests where the node must answer.
    pub async fn must(&mut self, args: &[&str]) -> Resp {
        match self.call(args).await {
            Ok(r) => r,
            Err(e) => panic!("{args:?} to {}: {e}", self.addr),
        }
    }
}

fn read_resp(
    r: &mut BufReader<TcpStream>,
) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<Resp>> + Send + '_>> {
    Box::pin(async move {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let bad = |what: &str| std::io::Error::other(format!("bad RESP: {what}"));
        if !line.ends_with(b"\r\n") {
            return Err(bad("line without CRLF"));
        }
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let num = || body.parse::<i64>().map_err(|_| bad(&body));
        Ok(match line[0] {
            b'+' => Resp::Simple(body),
            b'-' => Resp::Error(body),
            b':' => Resp::Int(num()?),
            b'$' => {
                let n = num()?;
                if n < 0 {
                    Resp::Bulk(None)
                } else {
                    let mut data = vec![0u8; n as usize + 2];
                    r.read_exact(&mut data).await?;
                    data.truncate(n as usize);
                    Resp::Bulk(Some(data))
                }
            }
            b'*' => {
                let n = num()?;
                if n < 0 {
                    Resp::Array(None)
                } else {
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(read_resp(r).await?);
                    }
                    Resp::Array(Some(items))
                }
            }
            other => return Err(bad(&format!("type byte {other}"))),
        })
    })
}

/// Splits `MOVED slot host:port` into the slot and the address.
pub fn parse_moved(err: &str) -> Option<(u16, String)> {
    let mut it = err.strip_prefix("MOVED ")?.split(' ');
    let slot = it.next()?.parse().ok()?;
    let addr = it.next()?.to_string();
    Some((slot, addr))
}

/// A client that behaves as a cluster-aware one would: follows `-MOVED`, and on
/// `-CLUSTERDOWN`, `-TRYAGAIN` or a dead node tries the next known node a moment later.
pub struct Router {
    addrs: Vec<String>,
    conns: HashMap<String, Conn>,
    next: usize,
    /// Follow `-MOVED` only to the known nodes (a client cut off from the others).
    pub stay_inside: bool,
}

/// What one routed command ran into before it was answered.
#[derive(Debug, Default, Clone)]
pub struct Route {
    /// The node that answered.
    pub addr: String,
    pub moved: usize,
    /// Attempts that failed before reaching a node that could take the command.
    pub retries: usize,
    /// Attempts whose fate is unknown: `-UNKNOWN` (the entry may still commit) or a
    /// connection lost after sending. A write retried after one may have been applied twice.
    /// (`-TRYAGAIN`, like `-MOVED` and `-CLUSTERDOWN`, says the write was not applied.)
    pub ambiguous: usize,
}

impl Router {
    pub fn new(addrs: Vec<String>) -> Router {
        assert!(!addrs.is_empty());
        Router {
            addrs,
            conns: HashMap::new(),
            next: 0,
            stay_inside: false,
        }
    }

    fn rotate(&mut self) -> String {
        self.next = (self.next + 1) % self.addrs.len();
        self.addrs[self.next].clone()
    }

    /// Runs a command until some node answers it with anything but a redirection or a
    /// retryable error; panics after `limit`.
    pub async fn call(&mut self, args: &[&str], limit: Duration) -> (Resp, Route) {
        match self.try_call(args, limit).await {
            Ok(r) => r,
            Err(last) => panic!("{args:?} not served within {limit:?}; last: {last}"),
        }
    }

    /// Like `call`, returning what went wrong instead of panicking.
    pub async fn try_call(
        &mut self,
        args: &[&str],
        limit: Duration,
    ) -> Result<(Resp, Route), String> {
        let deadline = Instant::now() + limit;
        let mut target = self.addrs[self.next].clone();
        let mut route = Route::default();
        let mut hops = 0;
        let mut last = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("{last} ({route:?})"));
            }
            if !self.conns.contains_key(&target) {
                match Conn::connect(&target).await {
                    Ok(c) => {
                        self.conns.insert(target.clone(), c);
                    }
                    Err(e) => {
                        last = format!("{target}: {e}");
                        route.retries += 1;
                        target = self.rotate();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            let conn = self.conns.get_mut(&target).expect("connected");
            let res = conn.call_within(args, left.min(REPLY_TIMEOUT)).await;
            let pause = match res {
                Ok(Resp::Error(e)) if e.starts_with("MOVED ") => {
                    let (_, to) = parse_moved(&e).expect("well-formed MOVED");
                    route.moved += 1;
                    hops += 1;
                    last = format!("{target}: {e}");
                    if self.stay_inside && !self.addrs.contains(&to) {
                        target = self.rotate();
                        true
                    } else {
                        target = to;
                        // A stale view can bounce a client between nodes; slow down then.
                        hops > 3
                    }
                }
                Ok(Resp::Error(e)) if e.starts_with("CLUSTERDOWN") || e.starts_with("TRYAGAIN") => {
                    route.retries += 1;
                    last = format!("{target}: {e}");
                    target = self.rotate();
                    true
                }
                // Redis clients do not retry this by themselves; this one does, and counts
                // the attempt as one that may have been applied.
                Ok(Resp::Error(e)) if e.starts_with("UNKNOWN") => {
                    route.retries += 1;
                    route.ambiguous += 1;
                    last = format!("{target}: {e}");
                    target = self.rotate();
                    true
                }
                Ok(reply) => {
                    route.addr = target;
                    return Ok((reply, route));
                }
                Err(e) => {
                    self.conns.remove(&target);
                    route.retries += 1;
                    route.ambiguous += 1;
                    last = format!("{target}: {e}");
                    target = self.rotate();
                    true
                }
            };
            if pause {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

impl TestCluster {
    /// Waits until every group has an agreed leader and the leaderships are spread evenly over
    /// the running nodes (floor(G/N) or ceil(G/N) each), which is where the balancer settles
    /// them after start-up, elections and restarts. Returns the leaders by group.
    pub async fn wait_balanced(&self, limit: Duration) -> Vec<NodeId> {
        let running = self.running();
        let n = running.len().max(1);
        let groups = self.spec.groups as usize;
        let (lo, hi) = (groups / n, groups.div_ceil(n));
        wait_for(
            "leaderships spread evenly over the running nodes",
            limit,
            || async {
                let leaders = (0..self.spec.groups)
                    .map(|g| self.agreed_leader(g))
                    .collect::<Option<Vec<NodeId>>>()?;
                running
                    .iter()
                    .all(|id| {
                        let led = leaders.iter().filter(|&&l| l == *id).count();
                        (lo..=hi).contains(&led)
                    })
                    .then_some(leaders)
            },
        )
        .await
    }

    /// Turns leadership balancing off on every running node (call it once they are balanced),
    /// then waits until the leaderships are balanced, settled (no move under way) and every node serves the same view of them.
    pub async fn hold_leaders(&self, limit: Duration) -> Vec<NodeId> {
        for id in self.running() {
            self.cluster(id).set_balancing(false);
        }
        wait_for("every node to serve the same leaders", limit, || async {
            let now = self.wait_balanced(limit).await;
            let agree = (0..self.spec.groups).all(|g| {
                let l = now[g as usize];
                self.cluster(l).leads(g)
                    && self
                        .running()
                        .iter()
                        .all(|&id| self.cluster(id).serving_leader(g) == Some(l))
            });
            agree.then_some(now)
        })
        .await
    }

    /// Cuts node `alone` off from every other node, in both directions.
    pub fn isolate(&self, alone: NodeId) {
        for id in self.running() {
            if id == alone {
                for other in self.ids().into_iter().filter(|&o| o != alone) {
                    self.cluster(id).faults().block(other);
                }
            } else {
                self.cluster(id).faults().block(alone);
            }
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        for id in self.running() {
            self.cluster(id).faults().heal();
        }
    }

    /// Waits until every group is quiet (led quietly by its agreed leader).
    pub async fn wait_all_quiet(&self, limit: Duration) {
        wait_for("every group to go quiet", limit, || async {
            (0..self.spec.groups)
                .all(|g| {
                    self.agreed_leader(g)
                        .is_some_and(|l| self.cluster(l).is_quiet(g))
                })
                .then_some(())
        })
        .await;
    }

    /// Groups node `id` leads, as the cluster agrees.
    pub fn led_by(&self, id: NodeId) -> Vec<GroupId> {
        (0..self.spec.groups)
            .filter(|&g| self.agreed_leader(g) == Some(id))
            .collect()
    }
}

/// Runs every command through `client` and returns the replies, in order.
pub async fn replies(client: &mut Router, cmds: &[Vec<String>]) -> Vec<Resp> {
    let mut out = Vec::with_capacity(cmds.len());
    for c in cmds {
        let args: Vec<&str> = c.iter().map(String::as_str).collect();
        out.push(client.call(&args, SERVE).await.0);
    }
    out
}

/// Runs each list of commands on its own client, all lists at once; replies per list.
pub async fn replies_concurrently(
    addrs: &[String],
    lists: Vec<Vec<Vec<String>>>,
) -> Vec<Vec<Resp>> {
    let tasks: Vec<_> = lists
        .into_iter()
        .enumerate()
        .map(|(i, cmds)| {
            let mut addrs = addrs.to_vec();
            let n = addrs.len();
            addrs.rotate_left(i % n);
            tokio::spawn(async move { replies(&mut Router::new(addrs), &cmds).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

/// A command line from words.
pub fn line(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// Asserts that a value a write reported moved from `before` to `after` by exactly `step`;
/// when the write was retried after `route.ambiguous` attempts of unknown fate, by `k * step`
/// for some k in 1..=1 + ambiguous (each such attempt may have been applied as well).
pub fn assert_step(what: &str, before: i64, after: i64, step: i64, route: &Route) {
    let ok = (1..=1 + route.ambiguous as i64).any(|k| after - before == k * step);
    assert!(
        ok,
        "{what}: went from {before} to {after}, expected a step of {step} ({route:?})"
    );
    if route.ambiguous > 0 {
        println!(
            "note: {what}: retried after {route:?}; step {}",
            after - before
        );
    }
}

/// Pairs of a RESP2-flattened map (`BK.CLUSTER STATUS` and the like).
pub fn pairs(r: &Resp) -> Vec<(String, Resp)> {
    r.array()
        .chunks(2)
        .map(|kv| (kv[0].text(), kv[1].clone()))
        .collect()
}

/// The value named `k` in `kv`; panics, showing them all, when there is none.
pub fn field<'a>(kv: &'a [(String, Resp)], k: &str) -> &'a Resp {
    &kv.iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("no {k} in {kv:?}"))
        .1
}
