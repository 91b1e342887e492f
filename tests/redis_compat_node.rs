//! The node-level commands a gateway and its tooling send first (AUTH, CONFIG, CLIENT, COMMAND
//! LIST, SCAN, INFO), checked side by side against a real `redis-server` 7.0 wherever Redis
//! defines the reply, and against bucketd's own guarantees where it adds to them.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{RealRedis, SideBySide};
use common::tools::{REDIS_PY, require_python};
use common::*;
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

/// The names of the `name=value` fields of one CLIENT LIST line.
fn line_fields(line: &str) -> Vec<String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('=').map(|(k, _)| k.to_string()))
        .collect()
}

/// The value of `field` in one CLIENT LIST line.
fn line_field(line: &str, field: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(field)?.strip_prefix('='))
        .map(str::to_string)
}

/// The field names of an INFO reply.
fn info_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_string()))
        .collect()
}

fn info_headers(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("# "))
        .map(str::to_string)
        .collect()
}

fn texts(r: &Resp) -> Vec<String> {
    r.as_array().iter().map(Resp::as_text).collect()
}

// ---------------------------------------------------------------------------------------------
// AUTH

#[tokio::test]
async fn auth_without_a_password_answers_as_redis_7s_nopass_default_user() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        assert_eq!(
            sb.same(&["AUTH", "default", "anything"]).await,
            Resp::Simple("OK".into())
        );
        sb.same(&["AUTH", "default", ""]).await;
        sb.same_error(&["AUTH", "otheruser", "x"]).await;
        sb.same_error(&["AUTH", "Default", "x"]).await;
        sb.same_error(&["AUTH", "onlypass"]).await;
        sb.same_error(&["AUTH", "a", "b", "c"]).await;
        sb.same_error(&["AUTH"]).await;
        sb.same_error(&["HELLO", "3", "AUTH", "other", "x"]).await;
        // HELLO's map names the server, so compare what a client checks: it succeeds, proto 3.
        let (ours, theirs) = sb.both(&["HELLO", "3", "AUTH", "default", "pw"]).await;
        for r in [&ours, &theirs] {
            assert_eq!(map_get(r, "proto"), Some(&Resp::Int(3)), "{r:?}");
        }
        sb.same(&["PING"]).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn auth_with_a_password_answers_as_redis_does() {
    bounded(async {
        let node = TestNode::start_with(|s| s.requirepass = Some("secret".into())).await;
        // Started without one (its start-up check sends a bare PING), then given the same
        // password as `--requirepass secret` would.
        let redis = RealRedis::start().await;
        let mut admin = redis.raw().await;
        assert_eq!(
            admin.cmd(&["CONFIG", "SET", "requirepass", "secret"]).await,
            Resp::Simple("OK".into())
        );
        let mut sb = SideBySide::connect(&node, &redis).await;
        sb.same_error(&["PING"]).await;
        sb.same_error(&["AUTH", "default", "wrong"]).await;
        sb.same_error(&["AUTH", "wrong"]).await;
        sb.same_error(&["AUTH", "other", "secret"]).await;
        // One argument is the password, even when it reads like a user name.
        sb.same_error(&["AUTH", "default"]).await;
        sb.same_error(&["HELLO", "3", "AUTH", "default", "wrong"])
            .await;
        sb.same(&["AUTH", "secret"]).await;
        // A failed AUTH leaves an authenticated connection authenticated.
        sb.same_error(&["AUTH", "wrong"]).await;
        sb.same(&["PING"]).await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        sb.same(&["AUTH", "default", "secret"]).await;
        sb.same(&["PING"]).await;
        node.shutdown().await;
    })
    .await;
}

/// Connects redis-py with a `redis://default:pw@` URL over RESP2 and RESP3 (it sends AUTH,
/// or HELLO 3 AUTH), and checks that another user is refused.
const PY_URL_AUTH: &str = r#"
import sys
import redis

port = int(sys.argv[1])
for proto in (2, 3):
    r = redis.Redis.from_url(f"redis://default:pw@127.0.0.1:{port}/0", protocol=proto,
                             socket_timeout=10, socket_connect_timeout=10)
    assert r.ping() is True, "PING"
    r.set(f"urlauth:{proto}", "v")
    assert r.get(f"urlauth:{proto}") == b"v", "GET"
    r.close()
    try:
        redis.Redis.from_url(f"redis://someone:pw@127.0.0.1:{port}", protocol=proto,
                             socket_timeout=10).ping()
    except redis.exceptions.AuthenticationError:
        pass
    else:
        sys.exit(f"RESP{proto}: connecting as 'someone' should fail")
print("ok")
"#;

async fn run_py_url_auth(port: u16) -> (bool, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg("-c")
            .arg(PY_URL_AUTH)
            .arg(port.to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("redis-py finishes within 60 s")
    .expect("python3 runs");
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_connects_with_a_default_user_url_to_a_node_without_password() {
    require_python(REDIS_PY);
    bounded(async {
        let redis = RealRedis::start().await;
        let (ok, out) = run_py_url_auth(redis.addr.port()).await;
        assert!(
            ok,
            "the script's expectations do not hold for Redis itself\n{out}"
        );
        let node = TestNode::start().await;
        let (ok, out) = run_py_url_auth(node.port()).await;
        assert!(
            ok,
            "redis-py with a default-user URL failed against bucketd\n{out}"
        );
        node.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// CONFIG

#[tokio::test]
async fn config_set_refusals_match_redis_word_for_word() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let refused: &[&[&str]] = &[
            &["CONFIG", "SET"],
            &["CONFIG", "SET", "maxclients"],
            &["CONFIG", "SET", "maxclients", "100", "maxmemory"],
            &["CONFIG", "SET", "x", "1"],
            &["CONFIG", "SET", "databases", "3"],
            &["CONFIG", "SET", "Databases", "3", "xx", "1"],
            &["CONFIG", "SET", "xx", "1", "databases", "3"],
            &["CONFIG", "SET", "cluster-enabled", "yes"],
            &["CONFIG", "SET", "maxclients", "10", "MAXCLIENTS", "20"],
            &["CONFIG", "SET", "maxmemory", "5", "maxmemory", "6"],
            &["CONFIG", "SET", "maxclients", "abc", "databases", "1"],
            &["CONFIG", "SET", "maxclients", "abc"],
            &["CONFIG", "SET", "MAXCLIENTS", "abc"],
            &["CONFIG", "SET", "maxclients", "1.5"],
            &["CONFIG", "SET", "maxclients", "0"],
            &["CONFIG", "SET", "maxclients", "-1"],
            &["CONFIG", "SET", "maxclients", "1000000000000"],
            &["CONFIG", "SET", "maxmemory", "1.5gb"],
            &["CONFIG", "SET", "maxmemory", "-1"],
            &["CONFIG", "SET", "maxmemory", "abc"],
            &["CONFIG", "SET", "maxmemory", "1tb"],
            &["CONFIG", "SET", "proto-max-bulk-len", "100"],
            &["CONFIG", "SET", "proto-max-bulk-len", "1000k"],
            &[
                "CONFIG",
                "SET",
                "proto-max-bulk-len",
                "18446744073709551615",
            ],
            &["CONFIG", "SET", "client-query-buffer-limit", "1000"],
            &["CONFIG", "SET", "client-query-buffer-limit", "x"],
            &["CONFIG", "SET", "maxmemory-clients", "120%"],
            &["CONFIG", "SET", "maxmemory-clients", "-5"],
            &["CONFIG", "SET", "maxmemory-clients", "abc"],
            &["CONFIG", "SET", "maxmemory-clients", "%"],
            &["CONFIG", "SET", "timeout", "-1"],
            &["CONFIG", "SET", "timeout", "abc"],
            &["CONFIG", "SET", "timeout", "2147483648"],
            &["CONFIG", "SET", "appendonly", "maybe"],
            &["CONFIG", "SET", "maxmemory-policy", "xx"],
            &["CONFIG", "SET", "requirepass"],
            &["CONFIG", "FOO"],
            &["CONFIG", "GET"],
            &["CONFIG", "RESETSTAT", "x"],
        ];
        for cmd in refused {
            sb.same_error(cmd).await;
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn config_set_values_round_trip_through_config_get_as_in_redis() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let cases: &[(&str, &[&str])] = &[
            (
                "maxmemory",
                &["1gb", "64MB", "10k", "1kb", "1g", "1G", "5b", "kb", "0"],
            ),
            // Redis refuses more clients than it has file descriptors for: stay low.
            ("maxclients", &["100", "1000"]),
            ("proto-max-bulk-len", &["1mb", "1048576", "512mb"]),
            ("client-query-buffer-limit", &["2mb", "1gb"]),
            ("maxmemory-clients", &["10%", "100%", "0%", "1gb", "0"]),
            ("timeout", &["10", "0"]),
            ("maxmemory-policy", &["noeviction", "NOEVICTION"]),
            ("appendonly", &["no"]),
            ("save", &[""]),
        ];
        for (name, values) in cases {
            for v in *values {
                sb.same(&["CONFIG", "SET", name, v]).await;
                sb.same(&["CONFIG", "GET", name]).await;
                let upper = name.to_ascii_uppercase();
                sb.same(&["CONFIG", "GET", &upper]).await;
            }
        }
        // Several pairs at once, all or nothing.
        sb.same(&["CONFIG", "SET", "maxclients", "100", "maxmemory", "10k"])
            .await;
        sb.same_error(&["CONFIG", "SET", "maxclients", "50", "maxmemory", "abc"])
            .await;
        assert_eq!(
            texts(&sb.same(&["CONFIG", "GET", "maxclients"]).await),
            ["maxclients", "100"]
        );
        sb.same(&["CONFIG", "GET", "maxmemory"]).await;
        sb.same(&["CONFIG", "SET", "maxclients", "1000", "maxmemory", "0"])
            .await;
        // Unknown names match nothing; CONFIG GET takes several patterns.
        sb.same(&["CONFIG", "GET", "no-such-thing"]).await;
        sb.same(&["CONFIG", "GET", "MaxClients", "maxc*"]).await;
        sb.same(&["CONFIG", "GET", "MAXMEMORY", "maxmemory"]).await;
        let (ours, theirs) = sb.both(&["CONFIG", "GET", "maxclients", "timeout"]).await;
        let as_set = |r: &Resp| texts(r).into_iter().collect::<BTreeSet<_>>();
        assert_eq!(as_set(&ours), as_set(&theirs));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn config_get_lists_bucketds_parameters() {
    bounded(async {
        let node = TestNode::start_with(|s| {
            s.max_args = 77;
            s.max_inline_len = 4321;
        })
        .await;
        let mut c = node.raw().await;
        let all = c.cmd(&["CONFIG", "GET", "*"]).await;
        for (name, want) in [
            ("client-query-buffer-limit", Some("33554432")),
            ("maxmemory-clients", Some("1073741824")),
            ("max-args", Some("77")),
            ("max-inline-len", Some("4321")),
            ("max-keys", Some("0")),
            ("requirepass", Some("")),
            ("timeout", Some("0")),
            ("shards", Some("2")),
        ] {
            let got = map_get(&all, name).map(Resp::as_text);
            assert_eq!(got.as_deref(), want, "{name}");
        }
        // Read-only parameters say so.
        for name in ["max-args", "max-inline-len", "shards", "bind", "port"] {
            let r = c.cmd(&["CONFIG", "SET", name, "1"]).await;
            assert_eq!(
                r,
                Resp::Error(format!(
                    "ERR CONFIG SET failed (possibly related to argument '{name}') - can't set immutable config"
                ))
            );
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn config_set_caps_apply_to_the_keys_already_held_on_every_shard() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        // Ten keys on each of the two shards, before any cap.
        for shard in 0..2 {
            for i in 0..10 {
                let k = key_on_shard(&format!("held{shard}:{i}"), shard, 2);
                assert_eq!(c.cmd(&["SET", &k, "1"]).await, Resp::Simple("OK".into()));
            }
        }
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "max-keys", "23"]).await,
            Resp::Simple("OK".into())
        );
        let mut added = 0;
        for i in 0..10 {
            let shard = i % 2;
            let k = key_on_shard(&format!("new{i}"), shard, 2);
            match c.cmd(&["SET", &k, "1"]).await {
                Resp::Simple(_) => added += 1,
                Resp::Error(e) => assert!(e.starts_with("OOM "), "{e}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            added, 3,
            "the cap counts the 20 keys held before it was set"
        );
        // Live keys can still be updated; switching the cap off admits new keys again.
        let held = key_on_shard("held1:0", 1, 2);
        assert_eq!(c.cmd(&["SET", &held, "2"]).await, Resp::Simple("OK".into()));
        c.cmd(&["CONFIG", "SET", "max-keys", "0"]).await;
        assert_eq!(
            c.cmd(&["SET", "after", "1"]).await,
            Resp::Simple("OK".into())
        );
        assert_eq!(c.cmd(&["DBSIZE"]).await, Resp::Int(24));
        // The memory cap too: far below what is held, so no new key fits.
        c.cmd(&["CONFIG", "SET", "maxmemory", "100"]).await;
        let r = c.cmd(&["SET", "one-more", "1"]).await;
        assert!(
            matches!(&r, Resp::Error(e) if e.starts_with("OOM ")),
            "{r:?}"
        );
        assert_eq!(info_u64(&node, "memory", "maxmemory").await, Some(100));
        c.cmd(&["CONFIG", "SET", "maxmemory", "0"]).await;
        assert_eq!(
            c.cmd(&["SET", "one-more", "1"]).await,
            Resp::Simple("OK".into())
        );
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn config_set_changes_the_limits_the_node_hands_out() {
    bounded(async {
        let node = TestNode::start().await;
        let n = node.handle.as_ref().expect("running").node.clone();
        let mut c = node.raw().await;
        let ok = Resp::Simple("OK".into());
        assert_eq!(
            c.cmd(&[
                "CONFIG",
                "SET",
                "proto-max-bulk-len",
                "1mb",
                "client-query-buffer-limit",
                "3mb"
            ])
            .await,
            ok
        );
        assert_eq!(n.request_limits().max_bulk_len, 1 << 20);
        assert_eq!(n.client_query_buffer_limit(), 3 << 20);
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "maxmemory-clients", "64mb"]).await,
            ok
        );
        assert_eq!(n.maxmemory_clients(), 64 << 20);
        // A percentage is of maxmemory, and no cap while maxmemory is 0.
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "maxmemory-clients", "10%"]).await,
            ok
        );
        assert_eq!(n.maxmemory_clients(), 0);
        assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory", "1000"]).await, ok);
        assert_eq!(n.maxmemory_clients(), 100);
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn config_set_maxclients_applies_to_the_next_connection() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let clients = |text: String, f: &str| info_field(&text, f);
        let text = c.cmd(&["INFO", "clients"]).await.as_text();
        assert_eq!(clients(text, "connected_clients").as_deref(), Some("1"));
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "maxclients", "2"]).await,
            Resp::Simple("OK".into())
        );
        let text = c.cmd(&["INFO", "clients"]).await.as_text();
        assert_eq!(clients(text, "maxclients").as_deref(), Some("2"));
        let mut second = node.raw().await;
        assert_eq!(second.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        let mut third = node.raw().await;
        assert_eq!(
            third.reply().await,
            Resp::Error("ERR max number of clients reached".into())
        );
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn config_set_requirepass_gates_new_connections_as_in_redis() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut admin = SideBySide::connect(&node, &redis).await;
        admin.same(&["CONFIG", "SET", "requirepass", "pw"]).await;
        admin.same(&["CONFIG", "GET", "requirepass"]).await;
        // The connection that set it stays authenticated; new ones must AUTH.
        admin.same(&["PING"]).await;
        let mut fresh = SideBySide::connect(&node, &redis).await;
        fresh.same_error(&["PING"]).await;
        fresh.same_error(&["AUTH", "nope"]).await;
        fresh.same(&["AUTH", "default", "pw"]).await;
        fresh.same(&["PING"]).await;
        // RESET drops the authentication again while a password is set.
        fresh.same(&["RESET"]).await;
        fresh.same_error(&["PING"]).await;
        admin.same(&["CONFIG", "SET", "requirepass", ""]).await;
        admin.same(&["CONFIG", "GET", "requirepass"]).await;
        let mut open = SideBySide::connect(&node, &redis).await;
        open.same(&["PING"]).await;
        open.same(&["AUTH", "default", "whatever"]).await;
        open.same_error(&["AUTH", "whatever"]).await;
        node.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// CLIENT

#[tokio::test]
async fn client_kill_replies_match_redis() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let cases: &[&[&str]] = &[
            &["CLIENT", "KILL"],
            &["CLIENT", "KILL", "1.2.3.4:5"],
            &["CLIENT", "KILL", "nonsense"],
            &["CLIENT", "KILL", "ID"],
            &["CLIENT", "KILL", "ID", "99999"],
            &["CLIENT", "KILL", "ID", "abc"],
            &["CLIENT", "KILL", "ID", "0"],
            &["CLIENT", "KILL", "ID", "-3"],
            &["CLIENT", "KILL", "ID", "99999999999999999999"],
            &["CLIENT", "KILL", "ADDR", "1.2.3.4:5"],
            &["CLIENT", "KILL", "LADDR", "1.2.3.4:5"],
            &["CLIENT", "KILL", "USER", "default", "ID", "99999"],
            &["CLIENT", "KILL", "USER", "nobody"],
            &["CLIENT", "KILL", "SKIPME", "maybe"],
            &["CLIENT", "KILL", "SKIPME", "yes", "ID", "99999"],
            &["CLIENT", "KILL", "TYPE", "foo"],
            &["CLIENT", "KILL", "TYPE", "master"],
            &["CLIENT", "KILL", "TYPE", "pubsub"],
            &["CLIENT", "KILL", "TYPE", "replica"],
            &["CLIENT", "KILL", "TYPE", "slave"],
            &["CLIENT", "KILL", "FOO", "bar"],
            &["CLIENT", "KILL", "ID", "1", "ID"],
            &["CLIENT", "KILL", "id", "99999", "skipme", "no"],
        ];
        for cmd in cases {
            sb.same(cmd).await;
        }
        // The caller is skipped by default in the new form...
        let ours_id = sb.ours.cmd(&["CLIENT", "ID"]).await.as_int().to_string();
        let theirs_id = sb.redis.cmd(&["CLIENT", "ID"]).await.as_int().to_string();
        let (o, t) = (
            sb.ours.cmd(&["CLIENT", "KILL", "ID", &ours_id]).await,
            sb.redis.cmd(&["CLIENT", "KILL", "ID", &theirs_id]).await,
        );
        assert_eq!((o, t), (Resp::Int(0), Resp::Int(0)));
        // ... and killed, after its reply, with SKIPME no.
        let (o, t) = (
            sb.ours
                .cmd(&["CLIENT", "KILL", "ID", &ours_id, "SKIPME", "no"])
                .await,
            sb.redis
                .cmd(&["CLIENT", "KILL", "ID", &theirs_id, "SKIPME", "no"])
                .await,
        );
        assert_eq!((o, t), (Resp::Int(1), Resp::Int(1)));
        for r in [&mut sb.ours, &mut sb.redis] {
            r.read_until_closed(Duration::from_secs(5)).await;
        }
        // The old form may kill the caller: OK, then the connection closes.
        let mut sb = SideBySide::connect(&node, &redis).await;
        for r in [&mut sb.ours, &mut sb.redis] {
            let info = r.cmd(&["CLIENT", "INFO"]).await.as_text();
            let addr = line_field(&info, "addr").expect("addr=");
            assert_eq!(
                r.cmd(&["CLIENT", "KILL", &addr]).await,
                Resp::Simple("OK".into())
            );
            r.read_until_closed(Duration::from_secs(5)).await;
        }
        node.shutdown().await;
    })
    .await;
}

/// Needs the connection loop to close a connection once `ClientInfo::killed` resolves.
#[tokio::test]
async fn client_kill_closes_the_other_connection_promptly() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        for (name, addr) in [("redis", redis.addr), ("bucketd", node.addr)] {
            let mut killer = Raw::connect(addr).await;
            let mut by_id = Raw::connect(addr).await;
            let mut by_addr = Raw::connect(addr).await;
            let id = by_id.cmd(&["CLIENT", "ID"]).await.as_int().to_string();
            let info = by_addr.cmd(&["CLIENT", "INFO"]).await.as_text();
            let peer = line_field(&info, "addr").expect("addr=");
            assert_eq!(
                killer.cmd(&["CLIENT", "KILL", "ID", &id]).await,
                Resp::Int(1)
            );
            by_id.read_until_closed(Duration::from_secs(5)).await;
            assert_eq!(
                killer.cmd(&["CLIENT", "KILL", "ADDR", &peer]).await,
                Resp::Int(1),
                "{name}"
            );
            by_addr.read_until_closed(Duration::from_secs(5)).await;
            // Neither is listed any more, and killing again finds nobody.
            let list = killer.cmd(&["CLIENT", "LIST"]).await.as_text();
            assert_eq!(list.lines().count(), 1, "{name}: {list}");
            assert_eq!(
                killer.cmd(&["CLIENT", "KILL", "ID", &id]).await,
                Resp::Int(0)
            );
        }
        node.shutdown().await;
    })
    .await;
}

/// Needs the connection loop to close a connection once `ClientInfo::killed` resolves.
#[tokio::test]
async fn the_idle_timeout_closes_idle_clients() {
    bounded(async {
        let node = TestNode::start().await;
        let mut admin = node.raw().await;
        let mut idle = node.raw().await;
        assert_eq!(idle.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        assert_eq!(
            admin.cmd(&["CONFIG", "SET", "timeout", "1"]).await,
            Resp::Simple("OK".into())
        );
        // Idle means no request for over a second; the check runs once a second.
        let keep_busy = async {
            for _ in 0..30 {
                admin.cmd(&["PING"]).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let (_, closed) = tokio::join!(keep_busy, async {
            idle.read_until_closed(Duration::from_secs(4)).await
        });
        assert!(closed.is_empty());
        assert_eq!(admin.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn client_list_and_info_refusals_match_redis() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let cases: &[&[&str]] = &[
            &["CLIENT", "LIST", "ID", "abc"],
            &["CLIENT", "LIST", "ID", "1", "abc"],
            &["CLIENT", "LIST", "ID", "1.5"],
            &["CLIENT", "LIST", "ID"],
            &["CLIENT", "LIST", "ID", "0"],
            &["CLIENT", "LIST", "ID", "-1"],
            &["CLIENT", "LIST", "ID", "99998", "99999"],
            &["CLIENT", "LIST", "TYPE", "foo"],
            &["CLIENT", "LIST", "TYPE", "master"],
            &["CLIENT", "LIST", "TYPE", "pubsub"],
            &["CLIENT", "LIST", "TYPE", "normal", "ID", "1"],
            &["CLIENT", "LIST", "TYPE"],
            &["CLIENT", "LIST", "foo"],
            &["CLIENT", "INFO", "x"],
            &["CLIENT", "ID", "x"],
            &["CLIENT", "GETNAME", "x"],
            &["CLIENT", "SETNAME"],
            &["CLIENT", "NO-EVICT"],
            &["CLIENT", "NO-EVICT", "on"],
            &["CLIENT", "NO-EVICT", "OFF"],
            &["CLIENT", "NO-EVICT", "maybe"],
            &["CLIENT", "NO-EVICT", "on", "x"],
            &["CLIENT", "HELP", "x"],
            &["CLIENT", "NOSUCH"],
        ];
        for cmd in cases {
            sb.same(cmd).await;
        }
        // Every field Redis 7.0 shows is there, in Redis's order.
        let ours = sb.ours.cmd(&["CLIENT", "INFO"]).await.as_text();
        let theirs = sb.redis.cmd(&["CLIENT", "INFO"]).await.as_text();
        let ours_fields = line_fields(&ours);
        let redis_fields = line_fields(&theirs);
        let shared: Vec<_> = ours_fields
            .iter()
            .filter(|f| redis_fields.contains(f))
            .cloned()
            .collect();
        assert_eq!(shared, redis_fields, "ours: {ours}");
        for line in [&ours, &theirs] {
            assert_eq!(line_field(line, "cmd").as_deref(), Some("client|info"));
            assert_eq!(line_field(line, "multi").as_deref(), Some("-1"));
        }
        // HELP lists KILL and LIST's filters.
        let help = texts(&sb.ours.cmd(&["CLIENT", "HELP"]).await).join("\n");
        for word in [
            "KILL <ip:port>",
            "SKIPME",
            "LADDR",
            "NO-EVICT",
            "LIST [options ...]",
        ] {
            assert!(help.contains(word), "{word} missing from CLIENT HELP");
        }
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn client_list_shows_each_clients_last_command_and_buffers() {
    bounded(async {
        let node = TestNode::start().await;
        let mut me = node.raw().await;
        let mut getter = node.raw().await;
        let mut namer = node.raw().await;
        let silent = node.raw().await;
        getter.cmd(&["GET", "k"]).await;
        namer.cmd(&["CLIENT", "SETNAME", "nm"]).await;
        namer.cmd(&["CLIENT", "GETNAME"]).await;
        let id_of = |r: &Raw| r.stream.local_addr().expect("local addr").to_string();
        // The silent client is listed once its shard has taken the connection.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let text = loop {
            let text = me.cmd(&["CLIENT", "LIST"]).await.as_text();
            if text.lines().count() == 4 {
                break text;
            }
            assert!(std::time::Instant::now() < deadline, "{text}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let line_of = |addr: String| {
            text.lines()
                .find(|l| line_field(l, "addr").as_deref() == Some(addr.as_str()))
                .unwrap_or_else(|| panic!("no line for {addr} in {text}"))
                .to_string()
        };
        let cmd_of = |addr: String| line_field(&line_of(addr), "cmd");
        assert_eq!(cmd_of(id_of(&me)).as_deref(), Some("client|list"));
        assert_eq!(cmd_of(id_of(&getter)).as_deref(), Some("get"));
        assert_eq!(cmd_of(id_of(&namer)).as_deref(), Some("client|getname"));
        assert_eq!(cmd_of(id_of(&silent)).as_deref(), Some("NULL"));
        // qbuf, omem and tot-mem come from what the connection records.
        let getter_id: u64 = line_field(&line_of(id_of(&getter)), "id")
            .and_then(|v| v.parse().ok())
            .expect("id");
        {
            let n = node.handle.as_ref().expect("running").node.clone();
            let clients = n.clients.lock().expect("clients");
            let info = clients.get(&getter_id).expect("listed");
            info.qbuf.store(123, std::sync::atomic::Ordering::Relaxed);
            info.omem.store(77, std::sync::atomic::Ordering::Relaxed);
        }
        let one = me
            .cmd(&["CLIENT", "LIST", "ID", &getter_id.to_string()])
            .await
            .as_text();
        assert_eq!(one.lines().count(), 1);
        assert_eq!(line_field(&one, "qbuf").as_deref(), Some("123"));
        assert_eq!(line_field(&one, "omem").as_deref(), Some("77"));
        assert_eq!(line_field(&one, "tot-mem").as_deref(), Some("200"));
        let normal = me
            .cmd(&["CLIENT", "LIST", "TYPE", "normal"])
            .await
            .as_text();
        assert_eq!(normal.lines().count(), 4);
        drop(silent);
        node.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// COMMAND LIST

#[tokio::test]
async fn command_list_filterby_matches_redis_for_the_commands_both_know() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        let names = |r: Resp| -> BTreeSet<String> {
            texts(&r).into_iter().filter(|n| !n.contains('|')).collect()
        };
        let ours_all = names(sb.ours.cmd(&["COMMAND", "LIST"]).await);
        let redis_all = names(sb.redis.cmd(&["COMMAND", "LIST"]).await);
        let filters: &[(&str, &str)] = &[
            ("PATTERN", "*expire*"),
            ("PATTERN", "p*"),
            ("pattern", "PING"),
            ("PATTERN", "[gs]et"),
            ("PATTERN", "nothing-like-this"),
            ("ACLCAT", "string"),
            ("ACLCAT", "STRING"),
            ("ACLCAT", "read"),
            ("ACLCAT", "nosuch"),
            ("ACLCAT", "@fast"),
            ("MODULE", "foo"),
        ];
        for (kind, arg) in filters {
            let (ours, theirs) = sb.both(&["COMMAND", "LIST", "FILTERBY", kind, arg]).await;
            let (ours, theirs) = (names(ours), names(theirs));
            let ours_known: BTreeSet<_> = ours.intersection(&redis_all).cloned().collect();
            let theirs_known: BTreeSet<_> = theirs.intersection(&ours_all).cloned().collect();
            assert_eq!(ours_known, theirs_known, "FILTERBY {kind} {arg}");
        }
        // bucketd's own category lists its limiter commands.
        let rl = names(
            sb.ours
                .cmd(&["COMMAND", "LIST", "FILTERBY", "ACLCAT", "ratelimit"])
                .await,
        );
        assert!(
            rl.contains("cl.throttle") && rl.contains("bk.check"),
            "{rl:?}"
        );
        assert!(!rl.contains("get"));
        for cmd in [
            &["COMMAND", "LIST", "FILTERBY"][..],
            &["COMMAND", "LIST", "FILTERBY", "FOO", "x"],
            &["COMMAND", "LIST", "FOO"],
            &["COMMAND", "LIST", "FILTERBY", "PATTERN"],
            &["COMMAND", "LIST", "FILTERBY", "PATTERN", "a", "b"],
            &["COMMAND", "LIST", "x", "y", "z"],
            &["COMMAND", "COUNT", "x"],
        ] {
            sb.same_error(cmd).await;
        }
        // COUNT and INFO are as before.
        let count = sb.ours.cmd(&["COMMAND", "COUNT"]).await.as_int();
        assert_eq!(count as usize, ours_all.len());
        let info = sb.ours.cmd(&["COMMAND", "INFO", "scan"]).await;
        assert_eq!(info.as_array()[0].as_array()[0], Resp::bulk("scan"));
        node.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// SCAN

/// Runs a whole SCAN with `opts` and returns every key returned, and how many calls it took.
async fn scan_all(r: &mut Raw, opts: &[&str]) -> (Vec<String>, usize) {
    let mut cursor = "0".to_string();
    let (mut keys, mut calls) = (Vec::new(), 0);
    loop {
        let mut args = vec!["SCAN", cursor.as_str()];
        args.extend_from_slice(opts);
        let reply = r.cmd(&args).await;
        let parts = reply.as_array();
        assert_eq!(parts.len(), 2, "{reply:?}");
        let next = parts[0].as_text();
        assert!(next.bytes().all(|b| b.is_ascii_digit()), "cursor {next:?}");
        keys.extend(texts(&parts[1]));
        calls += 1;
        assert!(calls < 100_000, "the scan does not end");
        if next == "0" {
            return (keys, calls);
        }
        cursor = next;
    }
}

#[tokio::test]
async fn scan_matches_redis_on_the_same_keys() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        for i in 0..60 {
            sb.same(&["SET", &format!("sc:a:{i}"), "v"]).await;
            sb.same(&["SET", &format!("sc:b:{i}"), &i.to_string(), "EX", "100"])
                .await;
        }
        sb.same(&["SET", "sc:gone", "v", "PX", "10"]).await;
        node.advance_ms(20);
        // A key that expired is not returned; Redis's may linger in its table, so wait until
        // Redis has forgotten it too.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sb.redis.cmd(&["EXISTS", "sc:gone"]).await != Resp::Int(0) {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Only in bucketd: a bucket, which TYPE calls "bucket".
        sb.ours
            .cmd(&["CL.THROTTLE", "sc:bucket", "5", "10", "60"])
            .await;
        let option_sets: &[&[&str]] = &[
            &[],
            &["COUNT", "1"],
            &["COUNT", "3"],
            &["COUNT", "1000"],
            &["MATCH", "sc:a:*"],
            &["MATCH", "sc:?:1*", "COUNT", "7"],
            &["MATCH", "*"],
            &["TYPE", "string"],
            &["TYPE", "STRING", "MATCH", "sc:b:*"],
            &["TYPE", "foo"],
            &["MATCH", "nothing*"],
            &["count", "5", "count", "6", "match", "x*", "match", "sc:a:1"],
        ];
        for opts in option_sets {
            let (mut ours, _) = scan_all(&mut sb.ours, opts).await;
            let (theirs, _) = scan_all(&mut sb.redis, opts).await;
            ours.retain(|k| k != "sc:bucket");
            let (ours_set, theirs_set): (BTreeSet<_>, BTreeSet<_>) = (
                ours.iter().cloned().collect(),
                theirs.iter().cloned().collect(),
            );
            assert_eq!(ours_set, theirs_set, "SCAN {opts:?}");
            // Nothing changed during the scan: each key comes once.
            assert_eq!(ours.len(), ours_set.len(), "SCAN {opts:?} repeated keys");
        }
        // TYPE bucket finds the limiter key (and nothing in Redis, which has no such type).
        let (buckets, _) = scan_all(&mut sb.ours, &["TYPE", "bucket"]).await;
        assert_eq!(buckets, ["sc:bucket"]);
        let (none, _) = scan_all(&mut sb.redis, &["TYPE", "bucket"]).await;
        assert!(none.is_empty());
        // COUNT larger than the keyspace: one call, both end at once.
        for r in [&mut sb.ours, &mut sb.redis] {
            let reply = r.cmd(&["SCAN", "0", "COUNT", "1000"]).await;
            assert_eq!(reply.as_array()[0], Resp::bulk("0"));
        }
        // Small COUNTs take many calls.
        let (_, calls) = scan_all(&mut sb.ours, &["COUNT", "2"]).await;
        assert!(calls >= 20, "COUNT 2 over 121 keys took {calls} calls");
        for cmd in [
            &["SCAN"][..],
            &["SCAN", "x"],
            &["SCAN", "1.5"],
            &["SCAN", " 0"],
            &["SCAN", "18446744073709551616"],
            &["SCAN", "x", "COUNT", "0"],
            &["SCAN", "0", "COUNT", "0"],
            &["SCAN", "0", "COUNT", "-1"],
            &["SCAN", "0", "COUNT", "x"],
            &["SCAN", "0", "MATCH"],
            &["SCAN", "0", "FOO", "bar"],
            &["SCAN", "0", "COUNT", "5", "TYPE"],
        ] {
            sb.same_error(cmd).await;
        }
        // Cursors Redis reads leniently are read the same way (the keys returned differ).
        for cursor in ["-1", "+0", "18446744073709551615", ""] {
            let (ours, theirs) = sb.both(&["SCAN", cursor]).await;
            for r in [&ours, &theirs] {
                assert_eq!(r.as_array().len(), 2, "SCAN {cursor:?}: {r:?}");
            }
        }
        let empty_cursor = sb.ours.cmd(&["SCAN", "", "COUNT", "1000"]).await;
        assert_eq!(empty_cursor.as_array()[1].as_array().len(), 121);
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn scan_returns_every_key_present_throughout_while_keys_come_and_go() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let mut churn = node.raw().await;
        let stable: Vec<String> = (0..400).map(|i| format!("stable:{i}")).collect();
        for k in &stable {
            c.cmd(&["SET", k, "1"]).await;
        }
        for count in ["1", "7", "50"] {
            let mut cursor = "0".to_string();
            let (mut seen, mut added, mut calls) = (HashSet::new(), 0usize, 0usize);
            loop {
                let reply = c.cmd(&["SCAN", &cursor, "COUNT", count]).await;
                let parts = reply.as_array();
                seen.extend(texts(&parts[1]));
                calls += 1;
                // Between calls the keyspace grows by 20 keys (forcing the tables to grow
                // several times over the scan) and loses keys added earlier.
                let mut batch = Vec::new();
                for _ in 0..20 {
                    added += 1;
                    batch.extend(encode(&["SET", &format!("churn:{count}:{added}"), "x"]));
                }
                churn.send(&batch).await;
                for _ in 0..20 {
                    churn.reply().await;
                }
                if calls % 2 == 0 {
                    let old: Vec<String> = (added.saturating_sub(40)..added.saturating_sub(20))
                        .map(|i| format!("churn:{count}:{i}"))
                        .collect();
                    let mut del = vec!["DEL"];
                    del.extend(old.iter().map(String::as_str));
                    churn.cmd(&del).await;
                }
                cursor = parts[0].as_text();
                if cursor == "0" {
                    break;
                }
                assert!(calls < 50_000, "the scan does not end");
            }
            let missing: Vec<_> = stable.iter().filter(|k| !seen.contains(*k)).collect();
            assert!(
                missing.is_empty(),
                "COUNT {count}: {} stable keys never returned over {calls} calls, e.g. {:?}",
                missing.len(),
                missing.first()
            );
            assert!(calls > 3, "COUNT {count}: the scan took only {calls} calls");
            // Start over on a smaller keyspace for the next round.
            c.cmd(&["FLUSHALL"]).await;
            for k in &stable {
                c.cmd(&["SET", k, "1"]).await;
            }
        }
        node.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// INFO

#[tokio::test]
async fn info_errorstats_count_every_error_reply_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        sb.same(&["CONFIG", "RESETSTAT"]).await;
        sb.same(&["INFO", "errorstats"]).await;
        for _ in 0..3 {
            sb.same_error(&["GET"]).await;
        }
        sb.same_error(&["AUTH", "x"]).await;
        sb.same_error(&["AUTH", "someone", "x"]).await;
        sb.same_error(&["NOSUCHCOMMAND"]).await;
        sb.same(&["SET", "errs:s", "abc"]).await;
        sb.same_error(&["INCR", "errs:s"]).await;
        // The same errors, counted the same way.
        let text = sb.same(&["INFO", "errorstats"]).await.as_text();
        assert!(text.contains("errorstat_ERR:count=6"), "{text}");
        assert!(text.contains("errorstat_WRONGPASS:count=1"), "{text}");
        let (ours, theirs) = sb.both(&["INFO", "stats"]).await;
        let total = |r: &Resp| info_field(&r.as_text(), "total_error_replies");
        assert_eq!(total(&ours), total(&theirs));
        assert_eq!(total(&ours).as_deref(), Some("7"));
        // Errors sent by the shards (WRONGTYPE from a key on either shard) count too.
        let mut c = node.raw().await;
        for shard in 0..2 {
            let k = key_on_shard("errs:bucket", shard, 2);
            c.cmd(&["CL.THROTTLE", &k, "5", "10", "60"]).await;
            assert!(
                matches!(c.cmd(&["GET", &k]).await, Resp::Error(e) if e.starts_with("WRONGTYPE"))
            );
        }
        let text = c.cmd(&["INFO", "errorstats"]).await.as_text();
        assert!(text.contains("errorstat_WRONGTYPE:count=2"), "{text}");
        sb.same(&["CONFIG", "RESETSTAT"]).await;
        sb.same(&["INFO", "errorstats"]).await;
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn info_keyspace_counts_keys_with_an_expiry_and_their_average_ttl() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        for i in 0..6 {
            sb.same(&["SET", &format!("ks:plain:{i}"), "v"]).await;
        }
        for i in 0..4 {
            sb.same(&["SET", &format!("ks:ttl:{i}"), "v", "EX", "100"])
                .await;
        }
        sb.same(&["PERSIST", "ks:ttl:3"]).await;
        sb.same(&["EXPIRE", "ks:plain:0", "100"]).await;
        sb.same(&["DEL", "ks:ttl:2"]).await;
        let db0 = |text: &str| -> Vec<(String, String)> {
            info_field(text, "db0")
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let theirs = db0(&sb.redis.cmd(&["INFO", "keyspace"]).await.as_text());
        let want: Vec<_> = theirs
            .iter()
            .filter(|(k, _)| k != "avg_ttl")
            .cloned()
            .collect();
        assert_eq!(
            want,
            [
                ("keys".to_string(), "9".to_string()),
                ("expires".into(), "3".into())
            ]
        );
        // The figures are published by the shards' sweep, and avg_ttl once it has sampled.
        let ours = wait_for("bucketd's keyspace line", Duration::from_secs(5), || {
            let addr = node.addr;
            async move {
                let mut r = Raw::connect(addr).await;
                let line = db0(&r.cmd(&["INFO", "keyspace"]).await.as_text());
                line.iter()
                    .any(|(k, v)| k == "avg_ttl" && v == "100000")
                    .then_some(line)
            }
        })
        .await;
        let names: Vec<_> = ours.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["keys", "expires", "avg_ttl"]);
        let ours: Vec<_> = ours.into_iter().filter(|(k, _)| k != "avg_ttl").collect();
        assert_eq!(ours, want);
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn info_sections_use_redis_names() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        sb.same(&["SET", "names:k", "1"]).await;
        sb.same_error(&["GET"]).await;
        for section in [
            "cpu",
            "errorstats",
            "keyspace",
            "stats",
            "clients",
            "memory",
            "server",
        ] {
            let ours = sb.ours.cmd(&["INFO", section]).await.as_text();
            let theirs = sb.redis.cmd(&["INFO", section]).await.as_text();
            assert_eq!(info_headers(&ours), info_headers(&theirs), "INFO {section}");
            let extra: Vec<_> = info_names(&ours)
                .difference(&info_names(&theirs))
                .cloned()
                .collect();
            // bucketd's own additions to Redis's sections.
            let own = ["bucketd_version", "protocol_errors", "clock_offset_ms"];
            assert!(
                extra.iter().all(|f| own.contains(&f.as_str())),
                "INFO {section}: fields Redis does not have: {extra:?}"
            );
        }
        let cpu = sb.ours.cmd(&["INFO", "cpu"]).await.as_text();
        for f in [
            "used_cpu_sys",
            "used_cpu_user",
            "used_cpu_sys_children",
            "used_cpu_user_children",
        ] {
            let v = info_field(&cpu, f).unwrap_or_else(|| panic!("{f} missing: {cpu}"));
            assert!(v.parse::<f64>().is_ok_and(|s| s >= 0.0), "{f}:{v}");
        }
        let stats = sb.ours.cmd(&["INFO", "stats"]).await.as_text();
        assert!(info_field(&stats, "total_error_replies").is_some());
        // The sections bucketd has come in Redis's order, under each selector.
        for selector in [&[][..], &["default"], &["all"], &["everything"]] {
            let mut args = vec!["INFO"];
            args.extend_from_slice(selector);
            let ours = info_headers(&sb.ours.cmd(&args).await.as_text());
            let theirs = info_headers(&sb.redis.cmd(&args).await.as_text());
            for h in ["# CPU", "# Errorstats", "# Keyspace"] {
                assert!(ours.iter().any(|o| o == h), "INFO {selector:?} lacks {h}");
            }
            let ours_known: Vec<_> = ours.iter().filter(|h| theirs.contains(h)).collect();
            let theirs_known: Vec<_> = theirs.iter().filter(|h| ours.contains(h)).collect();
            assert_eq!(ours_known, theirs_known, "INFO {selector:?}");
        }
        node.shutdown().await;
    })
    .await;
}
