//! What one client can make a node hold is bounded in bytes, and a hostile client stalls only
//! itself: oversized requests, anonymous peers, pipelines whose replies are never read,
//! requests that trickle in, and many clients holding large buffers at once.
//!
//! Bounds are asserted on the node's own accounting (bytes held in client buffers) and, for
//! the reply path, on the process's resident memory; the RSS tests take a lock so that no
//! other test of this binary allocates meanwhile.

#![cfg(feature = "server")]

mod common;
use bucketd::testing::Node;

use common::real_redis::{RealRedis, SideBySide};
use common::{Raw, Resp, TestNode, bounded, encode, wait_for};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The tests of this binary run one at a time, so one's allocations do not show in another's
/// RSS figures.
static RSS_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn node_of(t: &TestNode) -> Arc<Node> {
    t.handle.as_ref().expect("running").node.clone()
}

fn client_bytes(t: &TestNode) -> usize {
    node_of(t).client_buffer_bytes.load(Ordering::Relaxed)
}

/// Resident memory of this process, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("rss field");
    pages * 4096
}

/// CPU time (user + system) of this process's `shard-*` threads, in seconds.
fn shard_cpu_seconds() -> f64 {
    let mut ticks = 0u64;
    for t in std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("shard-") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        ticks += f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

/// Sends PING on a fresh connection and waits at most `limit` for PONG.
async fn ping_within(t: &TestNode, limit: Duration) -> bool {
    let mut c = Raw::connect(t.addr).await;
    c.send(b"PING\r\n").await;
    matches!(c.try_reply(limit).await, Ok(Resp::Simple(s)) if s == "PONG")
}

/// Writes `bytes` in pieces until the peer stops taking them; returns how much was written.
async fn write_until_refused(c: &mut Raw, piece: &[u8], max_total: usize) -> usize {
    let mut sent = 0;
    while sent < max_total {
        if c.try_send(piece).await.is_err() {
            break;
        }
        sent += piece.len();
    }
    sent
}

#[tokio::test]
async fn a_request_past_the_query_buffer_limit_is_refused_before_its_bytes_arrive() {
    bounded(async {
        let _serial = RSS_LOCK.lock().await;
        let node = TestNode::start_with(|s| s.client_query_buffer_limit = 1 << 20).await;
        let base = client_bytes(&node);
        // One argument announced larger than the cap: refused at its header.
        let mut c = node.raw().await;
        c.send(b"*2\r\n$3\r\nSET\r\n$4000000\r\n").await;
        let got = String::from_utf8_lossy(&c.read_until_closed(Duration::from_secs(10)).await)
            .into_owned();
        assert!(
            got.starts_with("-ERR Protocol error: request larger than client-query-buffer-limit"),
            "{got}"
        );
        // The attack: 65,536 bulk arguments of 64 KiB each, sent as fast as the node
        // takes them. Without a total cap the node buffers gigabytes; with it, the connection
        // is cut after about a megabyte.
        let mut c = node.raw().await;
        c.send(b"*65536\r\n").await;
        let mut arg = b"$65536\r\n".to_vec();
        arg.extend(std::iter::repeat_n(b'x', 65536));
        arg.extend_from_slice(b"\r\n");
        let sent = write_until_refused(&mut c, &arg, 256 << 20).await;
        assert!(sent < 64 << 20, "the node took {sent} bytes of one request");
        let got = String::from_utf8_lossy(&c.read_until_closed(Duration::from_secs(10)).await)
            .into_owned();
        assert!(got.contains("client-query-buffer-limit"), "{got:?}");
        // The node goes on serving, and holds no more than before.
        assert!(ping_within(&node, Duration::from_secs(5)).await);
        wait_for(
            "client buffers to be released",
            Duration::from_secs(10),
            || async { (client_bytes(&node) <= base + (64 << 10)).then_some(()) },
        )
        .await;
        // Requests within the cap still work, large ones included.
        let mut c = node.raw().await;
        let value = "v".repeat(900 * 1024);
        assert_eq!(
            c.cmd(&["SET", "big", &value]).await,
            Resp::Simple("OK".into())
        );
        assert_eq!(c.cmd(&["GET", "big"]).await, Resp::Bulk(value.into_bytes()));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn clients_that_have_not_authenticated_get_redis_handshake_limits() {
    bounded(async {
        let _serial = RSS_LOCK.lock().await;
        let node = TestNode::start_with(|s| s.requirepass = Some("s3cret".into())).await;
        let redis = RealRedis::start_with(&["--requirepass", "s3cret"]).await;
        // Same refusals, word for word, as Redis, and the connection is closed.
        for wire in [&b"*11\r\n"[..], &b"*2\r\n$4\r\nAUTH\r\n$16385\r\n"[..]] {
            let mut sb = SideBySide::connect(&node, &redis).await;
            let (ours, theirs) = sb.send_both(wire).await;
            assert_eq!(ours, theirs, "on {:?}", String::from_utf8_lossy(wire));
            assert!(matches!(ours, Resp::Error(_)), "{ours:?}");
            sb.ours.read_until_closed(Duration::from_secs(5)).await;
        }
        // Commands before AUTH are refused as Redis refuses them, EXEC and MULTI included.
        let mut sb = SideBySide::connect(&node, &redis).await;
        for args in [&["GET", "k"][..], &["EXEC"], &["MULTI"], &["PING"]] {
            sb.same_error(args).await;
        }
        // The same request is fine once authenticated, in the same pipeline as the AUTH.
        let mut c = node.raw().await;
        let mut wire = encode(&["AUTH", "s3cret"]);
        let args: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let mut exists = vec!["EXISTS"];
        exists.extend(args.iter().map(String::as_str));
        wire.extend(encode(&exists));
        c.send(&wire).await;
        assert_eq!(c.reply().await, Resp::Simple("OK".into()));
        assert_eq!(c.reply().await, Resp::Int(0));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn inline_requests_obey_max_args() {
    bounded(async {
        let _serial = RSS_LOCK.lock().await;
        let node = TestNode::start_with(|s| s.max_args = 4).await;
        let mut c = node.raw().await;
        c.send(b"EXISTS a b c\r\n").await;
        assert_eq!(c.reply().await, Resp::Int(0));
        c.send(b"EXISTS a b c d\r\n").await;
        let got = String::from_utf8_lossy(&c.read_until_closed(Duration::from_secs(5)).await)
            .into_owned();
        assert!(got.starts_with("-ERR Protocol error"), "{got}");
        assert!(ping_within(&node, Duration::from_secs(5)).await);
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_client_that_does_not_read_its_replies_stalls_only_itself() {
    bounded(async {
        let _serial = RSS_LOCK.lock().await;
        // One shard, so the hostile clients and the well-behaved one share an event loop.
        let node = TestNode::start_with(|s| s.shards = 1).await;
        let n = node_of(&node);
        let mut setup = node.raw().await;
        let value = "v".repeat(1 << 20);
        assert_eq!(
            setup.cmd(&["SET", "big:v", &value]).await,
            Resp::Simple("OK".into())
        );
        let before = rss();
        // Four clients each pipeline 1024 GETs of the 1 MiB value (4 GiB of replies) and read
        // nothing.
        let mut pipeline = Vec::new();
        for _ in 0..1024 {
            pipeline.extend(encode(&["GET", "big:v"]));
        }
        let mut hogs = Vec::new();
        for _ in 0..4 {
            let mut c = node.raw().await;
            c.send(&pipeline).await;
            hogs.push(c);
        }
        // Each is stalled with replies unsent once the kernel's socket buffers are full.
        wait_for(
            "every hog to be stalled on its writes",
            Duration::from_secs(30),
            || {
                let n = n.clone();
                async move {
                    let clients = n.clients.lock().expect("clients");
                    let stalled = clients
                        .values()
                        .filter(|c| c.omem.load(Ordering::Relaxed) > 0)
                        .count();
                    (stalled >= 4).then_some(())
                }
            },
        )
        .await;
        // Another client on the same shard is answered at once.
        for _ in 0..5 {
            assert!(ping_within(&node, Duration::from_millis(500)).await);
        }
        let grown = rss().saturating_sub(before);
        assert!(
            grown < 128 << 20,
            "RSS grew {} MiB with 4 stalled clients",
            grown >> 20
        );
        let held = client_bytes(&node);
        assert!(held < 16 << 20, "client buffers hold {held} bytes");
        // A hog that starts reading gets every reply, complete and in order.
        let mut reader = hogs.pop().expect("a hog");
        let one = format!("${}\r\n{}\r\n", value.len(), value);
        for i in 0..1024 {
            let got = reader.read_bytes(one.len()).await;
            assert!(got == one.as_bytes(), "reply {i} differs");
        }
        drop(reader);
        drop(hogs);
        // Once they have left, what they held is given back.
        wait_for(
            "client buffers to be released",
            Duration::from_secs(20),
            || async { (client_bytes(&node) < 1 << 20).then_some(()) },
        )
        .await;
        wait_for("RSS to come back down", Duration::from_secs(20), || async {
            (rss().saturating_sub(before) < 64 << 20).then_some(())
        })
        .await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_request_trickling_in_does_not_slow_other_clients() {
    bounded(async {
        let _serial = RSS_LOCK.lock().await;
        let node = TestNode::start_with(|s| s.shards = 1).await;
        let mut wire = b"*65536\r\n$6\r\nEXISTS\r\n".to_vec();
        for i in 0..65535 {
            let k = format!("k{}", i % 10);
            wire.extend_from_slice(format!("${}\r\n{k}\r\n", k.len()).as_bytes());
        }
        let mut slow = node.raw().await;
        let id = slow.cmd(&["CLIENT", "ID"]).await.as_int() as u64;
        let info = node_of(&node)
            .clients
            .lock()
            .expect("clients")
            .get(&id)
            .cloned()
            .expect("the slow client is listed");
        let mut other = node.raw().await;
        let cpu_before = shard_cpu_seconds();
        let mut answered = 0;
        let mut sent = 0usize;
        for (i, piece) in wire.chunks(14).enumerate() {
            slow.send(piece).await;
            sent += piece.len();
            // One read per piece: wait until the node has taken this one in.
            while (info.qbuf.load(Ordering::Relaxed) as usize) < sent && sent < wire.len() {
                tokio::task::yield_now().await;
            }
            if i % 2048 == 0 {
                other.send(b"PING\r\n").await;
                assert!(matches!(
                    other.try_reply(Duration::from_secs(2)).await,
                    Ok(Resp::Simple(s)) if s == "PONG"
                ));
                answered += 1;
            }
        }
        assert_eq!(slow.reply().await, Resp::Int(0));
        assert!(answered > 10);
        // The work is linear in the bytes: about 37,000 reads of 14 bytes cost a debug build
        // about 2 s of shard CPU, mostly the reads themselves, and more on a busy machine.
        // Re-parsing the buffered request from its start on every read scans about 10 GB for
        // this request, a minute or more of CPU: the bound sits well between the two.
        let cpu = shard_cpu_seconds() - cpu_before;
        assert!(
            cpu < 6.0,
            "the shard spent {cpu:.2}s of CPU on one trickled request"
        );
        node.shutdown().await;
    })
    .await;
}

/// Bytes of the partial SET request the maxmemory-clients test sends first.
fn head_len(data: usize) -> usize {
    b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3670016\r\n".len() + data
}

#[tokio::test]
async fn maxmemory_clients_closes_the_client_that_passes_it() {
    bounded(async {
        let _serial = RSS_LOCK.lock().await;
        let node = TestNode::start_with(|s| {
            s.maxmemory_clients = 6 << 20;
            s.client_query_buffer_limit = 32 << 20;
        })
        .await;
        // 3.5 MiB values, 3 MiB of each sent: each buffer fits in 4 MiB, two pass the cap.
        let mut head = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3670016\r\n".to_vec();
        head.extend(std::iter::repeat_n(b'x', 3 << 20));
        let mut first = node.raw().await;
        first.send(&head).await;
        // Wait until the node has read all of it, so the second client is the one growing.
        let n = node_of(&node);
        wait_for(
            "the first request to be read",
            Duration::from_secs(10),
            || {
                let n = n.clone();
                async move {
                    let clients = n.clients.lock().expect("clients");
                    clients
                        .values()
                        .any(|c| c.qbuf.load(Ordering::Relaxed) as usize >= head_len(3 << 20))
                        .then_some(())
                }
            },
        )
        .await;
        let mut second = node.raw().await;
        let _ = second.try_send(&head).await;
        let got = String::from_utf8_lossy(&second.read_until_closed(Duration::from_secs(10)).await)
            .into_owned();
        assert!(got.contains("maxmemory-clients"), "{got:?}");
        // The first finishes its request and is served.
        let mut tail = vec![b'x'; 512 << 10];
        tail.extend_from_slice(b"\r\n");
        first.send(&tail).await;
        assert_eq!(first.reply().await, Resp::Simple("OK".into()));
        assert!(ping_within(&node, Duration::from_secs(5)).await);
        node.shutdown().await;
    })
    .await;
}
