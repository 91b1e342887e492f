//! The peer port against strangers, with real processes and raw sockets: garbage and frame
//! headers that claim a gigabyte cost a node nothing and change no limit; with a cluster
//! secret, a connection that cannot prove it is dropped and a node with another secret is
//! kept out; with `--tls-cluster`, nodes talk over mutual TLS and a peer without a certificate
//! from the CA gets nowhere.

use crate::common::closed_within;
use crate::harness::*;
use bucketd::testing::ClusterSpec;
use hmac::Mac;
use std::io::{Read, Write};
use std::net::TcpStream as RawStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../common/certs.rs"]
mod certs;

const BIN: &str = env!("CARGO_BIN_EXE_bucketd");

/// Node processes of one cluster description, each with its own extra flags; killed when
/// dropped.
struct Nodes {
    spec_arg: String,
    dir: TempDir,
    ports: Vec<u16>,
    peer_ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

impl Nodes {
    fn new(n: u64, tag: &str) -> Nodes {
        let spec = local_spec(n, GROUPS);
        let spec_arg = ClusterSpec::format_nodes(&spec.nodes);
        Nodes {
            spec_arg,
            dir: TempDir::new(tag),
            ports: spec.nodes.iter().map(|n| n.port).collect(),
            peer_ports: spec.nodes.iter().map(|n| n.peer_port).collect(),
            children: (0..n).map(|_| None).collect(),
        }
    }

    fn spawn(&mut self, id: u64, extra: &[String]) {
        let i = id as usize - 1;
        let log = std::fs::File::create(self.log_path(id)).expect("log file");
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
            .args(extra)
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("bucketd starts");
        self.children[i] = Some(child);
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.ports[id as usize - 1])
    }

    fn peer_addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.peer_ports[id as usize - 1])
    }

    fn pid(&self, id: u64) -> u32 {
        self.children[id as usize - 1]
            .as_ref()
            .expect("node runs")
            .id()
    }

    /// The node's resident memory, in KiB.
    fn rss_kib(&self, id: u64) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid(id)))
            .expect("/proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    fn is_running(&mut self, id: u64) -> bool {
        self.children[id as usize - 1]
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A limit of 5 (burst 4, one token back per hour): `CL.THROTTLE` allows exactly 5 checks.
const CAPACITY: usize = 5;

fn check(key: &str) -> Vec<String> {
    line(&["CL.THROTTLE", key, "4", "1", "3600", "1"])
}

/// Makes `n` checks of `key` through the cluster; how many were allowed.
async fn allowed(client: &mut Router, key: &str, n: usize) -> usize {
    let args = check(key);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ok = 0;
    for _ in 0..n {
        let (reply, route) = client.call(&args, SERVE).await;
        // A retried check of unknown fate could count twice; a healthy cluster has none.
        assert_eq!(route.ambiguous, 0, "{route:?}");
        if reply.limit()[0] == 0 {
            ok += 1;
        }
    }
    ok
}

/// Waits until `addrs` serve checks (every group has a leader that answers).
async fn wait_serving(addrs: Vec<String>) {
    let mut client = Router::new(addrs);
    for g in 0..GROUPS {
        let key = format!("warmup-{g}");
        let args = line(&["CL.THROTTLE", &key, "9", "1", "3600", "0"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        client.call(&args, SERVE).await;
    }
}

fn refusals(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("refused a peer connection"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_on_the_peer_port_cost_nothing_and_change_no_limit() {
    bounded(async {
        let mut nodes = Nodes::new(3, "peer-garbage");
        for id in 1..=3 {
            nodes.spawn(id, &[]);
        }
        let addrs: Vec<String> = (1..=3).map(|id| nodes.addr(id)).collect();
        wait_serving(addrs.clone()).await;
        let mut client = Router::new(addrs.clone());
        let key = "garbage:{bucket}";
        assert_eq!(allowed(&mut client, key, 2).await, 2);

        // Garbage: an HTTP request, and a node id followed by a frame that is not a message.
        let mut http = RawStream::connect(nodes.peer_addr(1)).expect("connect");
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("send");
        assert!(closed_within(&mut http, Duration::from_secs(5)));
        let mut junk = RawStream::connect(nodes.peer_addr(1)).expect("connect");
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&64u32.to_le_bytes());
        bytes.extend_from_slice(&[0xff; 64]);
        junk.write_all(&bytes).expect("send");
        assert!(closed_within(&mut junk, Duration::from_secs(5)));

        // Headers over the cap: dropped at once.
        for _ in 0..20 {
            let mut s = RawStream::connect(nodes.peer_addr(1)).expect("connect");
            let mut bytes = 2u64.to_le_bytes().to_vec();
            bytes.extend_from_slice(&0x7fff_ffffu32.to_le_bytes());
            s.write_all(&bytes).expect("send");
            assert!(closed_within(&mut s, Duration::from_secs(5)));
        }

        // 200 connections each announcing a frame just under the cap, then nothing: the node
        // reserves nothing for bytes that never come.
        let before = nodes.rss_kib(1);
        let mut held = Vec::new();
        for _ in 0..200 {
            let mut s = RawStream::connect(nodes.peer_addr(1)).expect("connect");
            let mut bytes = 2u64.to_le_bytes().to_vec();
            bytes.extend_from_slice(&((16u32 << 20) - 1).to_le_bytes());
            s.write_all(&bytes).expect("send");
            held.push(s);
        }
        // Every one is taken in (the node reads their headers) before memory is measured.
        let probe_deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut probe = RawStream::connect(nodes.peer_addr(1)).expect("connect");
            probe.write_all(&[0xee; 16]).expect("send");
            if closed_within(&mut probe, Duration::from_secs(2)) || Instant::now() > probe_deadline
            {
                break;
            }
        }
        let after = nodes.rss_kib(1);
        println!("peer port: RSS {before} KiB before 200 held headers, {after} KiB with them");
        assert!(
            after < before + 50 * 1024,
            "RSS grew from {before} KiB to {after} KiB"
        );
        // The limit still holds exactly: 3 more of the 5, then no more.
        assert_eq!(allowed(&mut client, key, 6).await, CAPACITY - 2);
        drop(held);

        // Refusals are logged, but not one line each.
        let log = nodes.log(1);
        let n = refusals(&log);
        assert!((1..20).contains(&n), "{n} refusal lines:\n{log}");
        assert!(nodes.is_running(1));
    })
    .await;
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The proof one side of the peer handshake gives (see the transport's handshake).
fn proof(secret: &[u8], role: u8, dialer: u64, listener: u64, dn: &[u8], ln: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("any key length");
    mac.update(b"bucketd-peer-v1");
    mac.update(&[role]);
    mac.update(&dialer.to_le_bytes());
    mac.update(&listener.to_le_bytes());
    mac.update(dn);
    mac.update(ln);
    mac
}

/// Dials node `to` as node `me` and proves `secret`; whether the node kept the connection.
fn handshake_as(nodes: &Nodes, me: u64, to: u64, secret: &[u8], right: &[u8]) -> bool {
    let mut s = RawStream::connect(nodes.peer_addr(to)).expect("connect");
    let nonce = [7u8; 32];
    let mut hello = b"BKDPEER1".to_vec();
    hello.extend_from_slice(&me.to_le_bytes());
    hello.extend_from_slice(&nonce);
    s.write_all(&hello).expect("hello");
    let mut answer = [0u8; 64];
    s.read_exact(&mut answer)
        .expect("the node answers the hello");
    // The node's own proof is of the real secret, and does not prove another.
    assert!(
        proof(right, 2, me, to, &nonce, &answer[..32])
            .verify_slice(&answer[32..])
            .is_ok()
    );
    assert!(
        proof(b"not the secret", 2, me, to, &nonce, &answer[..32])
            .verify_slice(&answer[32..])
            .is_err()
    );
    let mine = proof(secret, 1, me, to, &nonce, &answer[..32]).finalize();
    s.write_all(&mine.into_bytes()).expect("proof");
    !closed_within(&mut s, Duration::from_millis(800))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_prove_the_cluster_secret_and_a_node_with_another_is_kept_out() {
    bounded(async {
        // Four nodes in the description; the fourth has another secret.
        let mut nodes = Nodes::new(4, "peer-secret");
        let secret_file = nodes.dir.path().join("secret");
        std::fs::write(&secret_file, "correct horse battery staple\n").expect("secret");
        let other_file = nodes.dir.path().join("other");
        std::fs::write(&other_file, "another cluster's secret\n").expect("secret");
        let with = |f: &PathBuf| vec!["--cluster-secret-file".to_string(), f.display().to_string()];
        for id in 1..=3 {
            nodes.spawn(id, &with(&secret_file));
        }
        nodes.spawn(4, &with(&other_file));
        let addrs: Vec<String> = (1..=3).map(|id| nodes.addr(id)).collect();
        wait_serving(addrs.clone()).await;
        let mut client = Router::new(addrs.clone());
        let key = "secret:{bucket}";
        assert_eq!(allowed(&mut client, key, 2).await, 2);

        // The file's trailing newline is not part of the secret; a wrong secret is dropped.
        let right = b"correct horse battery staple";
        assert!(handshake_as(&nodes, 2, 1, right, right));
        assert!(!handshake_as(
            &nodes,
            2,
            1,
            b"another cluster's secret",
            right
        ));

        // No handshake at all: the old hello (a bare node id) and frames are dropped, and a
        // connection that says nothing is dropped after the handshake's timeout.
        let mut bare = RawStream::connect(nodes.peer_addr(1)).expect("connect");
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 40]);
        bare.write_all(&bytes).expect("send");
        assert!(closed_within(&mut bare, Duration::from_secs(5)));
        let mut silent = RawStream::connect(nodes.peer_addr(1)).expect("connect");
        assert!(closed_within(&mut silent, Duration::from_secs(6)));

        // The node with the other secret gets no hearing, and nothing it holds counts.
        wait_for(
            "nodes 1-3 to refuse node 4",
            Duration::from_secs(10),
            || async { (1..=3).all(|id| refusals(&nodes.log(id)) > 0).then_some(()) },
        )
        .await;
        wait_for(
            "node 4 to refuse the others",
            Duration::from_secs(10),
            || async { (refusals(&nodes.log(4)) > 0).then_some(()) },
        )
        .await;
        assert_eq!(allowed(&mut client, key, 6).await, CAPACITY - 2);
        let mut on_four = Conn::connect(&nodes.addr(4)).await.expect("node 4 is up");
        let reply = on_four
            .call(&["CL.THROTTLE", "elsewhere", "4", "1", "3600", "1"])
            .await
            .expect("node 4 answers");
        assert!(reply.is_error(), "node 4 must not serve: {reply:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_mutual_tls_serves_and_keeps_out_peers_without_its_certificates() {
    bounded(async {
        let mut nodes = Nodes::new(3, "peer-tls");
        let c = certs::Certs::make(&nodes.dir.path().join("certs"));
        let tls = vec![
            "--tls-cluster".to_string(),
            "yes".to_string(),
            "--tls-cert-file".to_string(),
            c.server_cert.display().to_string(),
            "--tls-key-file".to_string(),
            c.server_key.display().to_string(),
            "--tls-ca-cert-file".to_string(),
            c.ca.display().to_string(),
        ];
        for id in 1..=3 {
            nodes.spawn(id, &tls);
        }
        let addrs: Vec<String> = (1..=3).map(|id| nodes.addr(id)).collect();
        wait_serving(addrs.clone()).await;
        let mut client = Router::new(addrs.clone());
        let key = "tls:{bucket}";
        assert_eq!(allowed(&mut client, key, 2).await, 2);

        // Plain bytes on the TLS peer port.
        let mut plain = RawStream::connect(nodes.peer_addr(1)).expect("connect");
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 64]);
        plain.write_all(&bytes).expect("send");
        assert!(closed_within(&mut plain, Duration::from_secs(5)));

        // A TLS peer whose certificate another CA signed is refused in the handshake.
        bucketd::tls::install_default_provider();
        let rogue_roots = {
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            for cert in rustls::pki_types::CertificateDer::pem_file_iter(&c.ca).expect("CA") {
                roots.add(cert.expect("CA cert")).expect("CA added");
            }
            roots
        };
        let rogue_certs: Vec<_> = {
            use rustls::pki_types::pem::PemObject;
            rustls::pki_types::CertificateDer::pem_file_iter(&c.rogue_cert)
                .expect("cert")
                .map(|c| c.expect("cert"))
                .collect()
        };
        let rogue_key = {
            use rustls::pki_types::pem::PemObject;
            rustls::pki_types::PrivateKeyDer::from_pem_file(&c.rogue_key).expect("key")
        };
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(rogue_roots)
            .with_client_auth_cert(rogue_certs, rogue_key)
            .expect("client config");
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(nodes.peer_addr(1))
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let refused = match connector.connect(name, tcp).await {
            Err(_) => true,
            // TLS 1.3 lets the client finish first; the refusal comes with the first read.
            Ok(mut s) => {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = s.write_all(&2u64.to_le_bytes()).await;
                let mut b = [0u8; 1];
                matches!(
                    tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
                    Ok(Ok(0)) | Ok(Err(_))
                )
            }
        };
        assert!(refused, "a peer with another CA's certificate was let in");
        assert_eq!(allowed(&mut client, key, 6).await, CAPACITY - 2);
        assert!((1..=3).all(|id| nodes.is_running(id)));
    })
    .await;
}
