//! Every command's reply and error shape, through the `redis` crate (RESP2) and raw RESP3,
//! compared with what Redis answers. Strings, counters, expiry, DEL/EXISTS and the limit
//! commands run on a standalone node and on a cluster alike, in tests/behaviour/.

#![cfg(feature = "server")]

mod common;

use common::*;
use redis::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_commands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        assert_eq!(run(&mut c, &["PING"]).await, Ok(Value::SimpleString("PONG".into())));
        assert_eq!(run(&mut c, &["ping", "hi there"]).await, Ok(bulk("hi there")));
        assert_eq!(q_err(&mut c, &["PING", "a", "b"]).await, arity("ping"));
        assert_eq!(run(&mut c, &["ECHO", "x\r\ny"]).await, Ok(bulk("x\r\ny")));
        assert_eq!(q_err(&mut c, &["ECHO"]).await, arity("echo"));
        assert_eq!(q_err(&mut c, &["ECHO", "a", "b"]).await, arity("echo"));
        assert_eq!(run(&mut c, &["SELECT", "0"]).await, Ok(Value::Okay));
        assert_eq!(
            q_err(&mut c, &["SELECT", "1"]).await,
            "ERR DB index is out of range"
        );
        assert_eq!(
            q_err(&mut c, &["NOSUCH", "a", "b"]).await,
            "ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' "
        );
        assert_eq!(
            q_err(&mut c, &["AUTH", "pw"]).await,
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
        );

        // HELLO without a version answers in the current protocol.
        let hello: Value = q(&mut c, &["HELLO"]).await;
        let Value::Array(items) = hello else {
            panic!("HELLO in RESP2 is a flat array, got {hello:?}")
        };
        assert_eq!(items.len(), 14);
        let field = |name: &str| {
            items
                .chunks(2)
                .find(|kv| kv[0] == bulk(name))
                .map(|kv| kv[1].clone())
                .unwrap_or_else(|| panic!("HELLO lacks {name}"))
        };
        assert_eq!(field("server"), bulk("bucketd"));
        assert_eq!(field("proto"), Value::Int(2));
        assert_eq!(field("mode"), bulk("standalone"));
        assert_eq!(field("role"), bulk("master"));
        assert_eq!(field("modules"), Value::Array(vec![]));
        let id: i64 = q(&mut c, &["CLIENT", "ID"]).await;
        assert_eq!(field("id"), Value::Int(id));
        assert_eq!(
            q_err(&mut c, &["HELLO", "4"]).await,
            "NOPROTO unsupported protocol version"
        );
        assert_eq!(
            q_err(&mut c, &["HELLO", "abc"]).await,
            "ERR Protocol version is not an integer or out of range"
        );
        assert_eq!(q_err(&mut c, &["HELLO", "2", "BOGUS"]).await, SYNTAX);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_setname_and_resp3_through_the_client_library() {
    bounded(async {
        let node = TestNode::start().await;
        let mut raw = node.raw().await;
        let hello = raw.cmd(&["HELLO", "3", "SETNAME", "via-hello"]).await;
        assert_eq!(map_get(&hello, "proto"), Some(&Resp::Int(3)));
        assert_eq!(
            raw.cmd(&["CLIENT", "GETNAME"]).await,
            Resp::bulk("via-hello")
        );

        // The redis crate negotiates RESP3 with HELLO 3 and checks the reply.
        let mut c = node.conn_resp3().await;
        assert_eq!(
            run(&mut c, &["PING"]).await,
            Ok(Value::SimpleString("PONG".into()))
        );
        assert_eq!(run(&mut c, &["GET", "nothing"]).await, Ok(Value::Nil));
        assert_eq!(run(&mut c, &["SET", "k", "v"]).await, Ok(Value::Okay));
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "user123", "15", "30", "60"]).await,
            [0, 16, 15, -1, 2]
        );
        let cfg = run(&mut c, &["CONFIG", "GET", "appendonly"]).await.unwrap();
        assert_eq!(cfg, Value::Map(vec![(bulk("appendonly"), bulk("no"))]));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_with_requirepass() {
    bounded(async {
        let node = TestNode::start_with(|s| s.requirepass = Some("s3cret".into())).await;
        let mut c = node.raw().await;
        let noauth = Resp::Error("NOAUTH Authentication required.".into());
        assert_eq!(c.cmd(&["GET", "k"]).await, noauth);
        assert_eq!(c.cmd(&["PING"]).await, noauth);
        assert_eq!(c.cmd(&["CL.THROTTLE", "k", "1", "1", "1"]).await, noauth);
        assert_eq!(c.cmd(&["BK.CHECK", "k", "1/1s"]).await, noauth);
        let wrongpass =
            Resp::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
        assert_eq!(c.cmd(&["AUTH", "nope"]).await, wrongpass);
        assert_eq!(c.cmd(&["AUTH", "someone", "s3cret"]).await, wrongpass);
        assert_eq!(c.cmd(&["AUTH", "s3cre"]).await, wrongpass);
        assert_eq!(c.cmd(&["AUTH", "s3cret!"]).await, wrongpass);
        assert_eq!(c.cmd(&["GET", "k"]).await, noauth);
        match c.cmd(&["HELLO", "3"]).await {
            Resp::Error(e) => assert!(e.starts_with("NOAUTH "), "{e}"),
            other => panic!("HELLO before AUTH should fail, got {other:?}"),
        }
        assert_eq!(c.cmd(&["AUTH", "s3cret"]).await, Resp::Simple("OK".into()));
        assert_eq!(c.cmd(&["GET", "k"]).await, Resp::NilBulk);
        assert_eq!(c.cmd(&["PING"]).await, Resp::Simple("PONG".into()));

        // AUTH with the default user name, and HELLO's AUTH option.
        let mut d = node.raw().await;
        assert_eq!(
            d.cmd(&["AUTH", "default", "s3cret"]).await,
            Resp::Simple("OK".into())
        );
        let mut h = node.raw().await;
        assert_eq!(
            h.cmd(&["HELLO", "3", "AUTH", "default", "wrong"]).await,
            wrongpass
        );
        let hello = h.cmd(&["HELLO", "3", "AUTH", "default", "s3cret"]).await;
        assert_eq!(map_get(&hello, "proto"), Some(&Resp::Int(3)));
        assert_eq!(h.cmd(&["GET", "k"]).await, Resp::Null);

        // Pipelined: commands after AUTH in the same write are allowed, before it refused.
        let mut p = node.raw().await;
        let mut batch = encode(&["SET", "k", "1"]);
        batch.extend(encode(&["AUTH", "s3cret"]));
        batch.extend(encode(&["INCR", "k"]));
        p.send(&batch).await;
        assert_eq!(p.reply().await, noauth);
        assert_eq!(p.reply().await, Resp::Simple("OK".into()));
        assert_eq!(p.reply().await, Resp::Int(1));

        // The client library authenticates from the URL.
        let url = format!("redis://:s3cret@{}/", node.addr);
        let mut con = connect_url(&url).await;
        assert_eq!(q::<i64>(&mut con, &["INCR", "k"]).await, 2);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_subcommands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let id: i64 = q(&mut c, &["CLIENT", "ID"]).await;
        assert!(id > 0);
        assert_eq!(run(&mut c, &["CLIENT", "GETNAME"]).await, Ok(Value::Nil));
        assert_eq!(
            run(&mut c, &["CLIENT", "SETNAME", "worker-7"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            q::<String>(&mut c, &["CLIENT", "GETNAME"]).await,
            "worker-7"
        );
        assert_eq!(
            q_err(&mut c, &["CLIENT", "SETNAME", "has space"]).await,
            "ERR Client names cannot contain spaces, newlines or special characters."
        );
        assert_eq!(
            run(&mut c, &["CLIENT", "SETINFO", "LIB-NAME", "mylib"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["CLIENT", "SETINFO", "LIB-VER", "1.2.3"]).await,
            Ok(Value::Okay)
        );
        let info: String = q(&mut c, &["CLIENT", "INFO"]).await;
        assert!(info.contains(&format!("id={id} ")), "{info}");
        assert!(info.contains("name=worker-7 "), "{info}");
        assert!(info.contains("lib-name=mylib"), "{info}");
        assert!(info.contains("lib-ver=1.2.3"), "{info}");

        // CLIENT LIST shows every connection, with the names they set.
        let mut other = node.conn().await;
        assert_eq!(
            run(&mut other, &["CLIENT", "SETNAME", "other-one"]).await,
            Ok(Value::Okay)
        );
        let list: String = q(&mut c, &["CLIENT", "LIST"]).await;
        let lines: Vec<&str> = list.lines().collect();
        assert!(lines.len() >= 2, "{list}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("id={id} ")) && l.contains("name=worker-7 ")),
            "{list}"
        );
        assert!(
            lines.iter().any(|l| l.contains("name=other-one ")),
            "{list}"
        );
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with("id=") && l.contains(" addr=")),
            "{list}"
        );
        // An empty name clears it.
        assert_eq!(
            run(&mut c, &["CLIENT", "SETNAME", ""]).await,
            Ok(Value::Okay)
        );
        assert_eq!(run(&mut c, &["CLIENT", "GETNAME"]).await, Ok(Value::Nil));
        assert_eq!(
            q_err(&mut c, &["CLIENT", "foo"]).await,
            "ERR unknown subcommand 'foo'. Try CLIENT HELP."
        );
        node.shutdown().await;
    })
    .await
}

/// The positions a COMMAND entry gives: (arity, first key, last key, step).
fn positions(entry: &Value) -> (i64, i64, i64, i64) {
    let Value::Array(f) = entry else {
        panic!("COMMAND entry should be an array, got {entry:?}")
    };
    assert_eq!(f.len(), 10, "COMMAND entries have 10 fields: {entry:?}");
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    };
    (int(&f[1]), int(&f[3]), int(&f[4]), int(&f[5]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_introspection() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let all: Vec<Value> = q(&mut c, &["COMMAND"]).await;
        let count: i64 = q(&mut c, &["COMMAND", "COUNT"]).await;
        assert_eq!(all.len() as i64, count);
        let mut names = Vec::new();
        for e in &all {
            positions(e);
            if let Value::Array(f) = e {
                match &f[0] {
                    Value::BulkString(n) => names.push(String::from_utf8(n.clone()).unwrap()),
                    other => panic!("command name should be a bulk string, got {other:?}"),
                }
            }
        }
        for want in [
            "get",
            "set",
            "incr",
            "del",
            "exists",
            "ttl",
            "cl.throttle",
            "bk.check",
            "bk.checkall",
            "bk.lease",
            "bk.reset",
            "bk.acquire",
            "bk.release",
            "bk.inflight",
            "bk.rule",
            "hello",
            "client",
            "info",
        ] {
            assert!(names.iter().any(|n| n == want), "COMMAND lacks {want}");
        }
        // As in Redis, COMMAND COUNT counts commands and COMMAND LIST adds `container|sub`.
        let list: Vec<String> = q(&mut c, &["COMMAND", "LIST"]).await;
        let top = list.iter().filter(|n| !n.contains('|')).count();
        assert_eq!(top as i64, count);
        assert!(list.contains(&"client|list".to_string()));
        assert!(list.contains(&"cl.throttle".to_string()));

        let info: Vec<Value> = q(
            &mut c,
            &[
                "COMMAND",
                "INFO",
                "get",
                "cl.throttle",
                "bk.check",
                "del",
                "nosuch",
            ],
        )
        .await;
        assert_eq!(positions(&info[0]), (2, 1, 1, 1));
        assert_eq!(positions(&info[1]), (-1, 1, 1, 1));
        assert_eq!(positions(&info[2]), (-3, 1, 1, 1));
        assert_eq!(positions(&info[3]), (-2, 1, -1, 1));
        assert_eq!(info[4], Value::Nil);
        // Upper case names are found too.
        let info: Vec<Value> = q(&mut c, &["COMMAND", "INFO", "CL.THROTTLE"]).await;
        assert_eq!(positions(&info[0]), (-1, 1, 1, 1));

        let keys: Vec<String> = q(
            &mut c,
            &[
                "COMMAND",
                "GETKEYS",
                "cl.throttle",
                "user1",
                "15",
                "30",
                "60",
            ],
        )
        .await;
        assert_eq!(keys, vec!["user1"]);
        let keys: Vec<String> = q(&mut c, &["COMMAND", "GETKEYS", "bk.check", "k1", "10/1s"]).await;
        assert_eq!(keys, vec!["k1"]);
        let keys: Vec<String> = q(&mut c, &["COMMAND", "GETKEYS", "get", "g"]).await;
        assert_eq!(keys, vec!["g"]);
        let keys: Vec<String> = q(&mut c, &["COMMAND", "GETKEYS", "del", "a", "b", "c"]).await;
        assert_eq!(keys, vec!["a", "b", "c"]);
        let keys: Vec<String> =
            q(&mut c, &["COMMAND", "GETKEYS", "set", "s", "v", "EX", "10"]).await;
        assert_eq!(keys, vec!["s"]);
        assert!(
            q_err(&mut c, &["COMMAND", "GETKEYS", "nosuch", "a"])
                .await
                .starts_with("ERR ")
        );
        assert!(
            q_err(&mut c, &["COMMAND", "GETKEYS", "ping"])
                .await
                .starts_with("ERR ")
        );

        let docs: Value = q(&mut c, &["COMMAND", "DOCS", "get"]).await;
        let Value::Array(d) = docs else {
            panic!("COMMAND DOCS in RESP2 is a flat array")
        };
        assert_eq!(d.len(), 2);
        assert_eq!(d[0], bulk("get"));
        node.shutdown().await;
    })
    .await
}

/// BK.CHECKALL takes `numkeys` keys: introspection must report all of them, as Redis does
/// for its numkeys commands, or a client that routes by COMMAND GETKEYS misses keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_getkeys_for_checkall_lists_every_key() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let keys: Vec<String> = q(
            &mut c,
            &[
                "COMMAND",
                "GETKEYS",
                "bk.checkall",
                "2",
                "ka",
                "kb",
                "1/1s",
                "1/1s",
            ],
        )
        .await;
        assert_eq!(keys, vec!["ka", "kb"]);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_entries_in_resp3() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        c.cmd(&["HELLO", "3"]).await;
        let info = c.cmd(&["COMMAND", "INFO", "bk.check"]).await;
        let entry = info.as_array()[0].as_array().to_vec();
        assert_eq!(entry.len(), 10);
        assert_eq!(entry[0], Resp::bulk("bk.check"));
        assert!(
            matches!(entry[2], Resp::Set(_)),
            "flags are a set: {:?}",
            entry[2]
        );
        assert!(
            matches!(entry[6], Resp::Set(_)),
            "ACL categories are a set: {:?}",
            entry[6]
        );
        assert!(matches!(
            c.cmd(&["COMMAND", "DOCS", "bk.check"]).await,
            Resp::Map(_)
        ));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_sections() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let all: String = q(&mut c, &["INFO"]).await;
        for section in [
            "# Server",
            "# Clients",
            "# Memory",
            "# Stats",
            "# Keyspace",
            "# Bucketd",
        ] {
            assert!(all.contains(section), "INFO lacks {section}: {all}");
        }
        assert_eq!(
            info_field(&all, "redis_mode").as_deref(),
            Some("standalone")
        );
        assert_eq!(info_field(&all, "tcp_port"), Some(node.port().to_string()));
        assert_eq!(info_field(&all, "shards").as_deref(), Some("2"));
        let server: String = q(&mut c, &["INFO", "server"]).await;
        assert!(server.contains("redis_version:"));
        assert!(!server.contains("# Clients"), "{server}");
        // Limit time: the wall clock's, until the wall clock steps; a step back of an hour
        // shows as limit time an hour ahead, and TIME keeps answering limit time.
        use bucketd::clock::Clock;
        let wall_us = node.clock.now_ns() / 1000;
        assert_eq!(
            info_field(&server, "server_time_usec"),
            Some(wall_us.to_string())
        );
        assert_eq!(info_field(&server, "clock_offset_ms").as_deref(), Some("0"));
        node.clock.step_ns(-3_600_000_000_000);
        let server: String = q(&mut c, &["INFO", "server"]).await;
        assert_eq!(
            info_field(&server, "server_time_usec"),
            Some(wall_us.to_string())
        );
        assert_eq!(
            info_field(&server, "clock_offset_ms").as_deref(),
            Some("3600000")
        );
        let time: Vec<String> = q(&mut c, &["TIME"]).await;
        assert_eq!(time[0], (wall_us / 1_000_000).to_string());
        let two: String = q(&mut c, &["INFO", "clients", "memory"]).await;
        assert!(two.contains("# Clients") && two.contains("# Memory") && !two.contains("# Stats"));
        let clients = info_field(&two, "connected_clients").unwrap();
        assert!(clients.parse::<u64>().unwrap() >= 1);

        // Keyspace counts keys on every shard.
        for i in 0..20 {
            let _: () = q(&mut c, &["SET", &format!("info:{i}"), "1"]).await;
        }
        let n = &node;
        wait_for(
            "INFO keyspace to count 20 keys",
            std::time::Duration::from_secs(5),
            move || async move {
                let mut c = n.raw().await;
                let text = c.cmd(&["INFO", "keyspace"]).await.as_text();
                info_field(&text, "db0")
                    .filter(|v| v.starts_with("keys=20,"))
                    .map(|_| ())
            },
        )
        .await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_get() {
    bounded(async {
        let node = TestNode::start_with(|s| s.maxclients = 123).await;
        let mut c = node.conn().await;
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "save"]).await;
        assert_eq!(v, vec!["save", ""]);
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "appendonly"]).await;
        assert_eq!(v, vec!["appendonly", "no"]);
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "maxclients"]).await;
        assert_eq!(v, vec!["maxclients", "123"]);
        // As Redis 7.0: a plain name is answered under the name as given.
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "MAXMEMORY"]).await;
        assert_eq!(v, vec!["MAXMEMORY", "0"]);
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "nothing-like-this"]).await;
        assert!(v.is_empty());
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "max*"]).await;
        assert!(v.contains(&"maxclients".to_string()) && v.contains(&"maxmemory".to_string()));
        assert_eq!(v.len() % 2, 0);
        let v: Vec<String> = q(&mut c, &["CONFIG", "GET", "save", "appendonly"]).await;
        assert_eq!(v.len(), 4);
        assert_eq!(
            q_err(&mut c, &["CONFIG", "GET"]).await,
            "ERR wrong number of arguments for 'config|get' command"
        );
        assert_eq!(q_err(&mut c, &["CONFIG"]).await, arity("config"));
        // Settings that need a restart are refused; the run-time ones are covered in
        // tests/redis_compat_node.rs.
        assert_eq!(
            q_err(&mut c, &["CONFIG", "SET", "port", "5"]).await,
            "ERR CONFIG SET failed (possibly related to argument 'port') - can't set immutable config"
        );
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_commands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        // TIME reads the injected clock.
        let t: Vec<String> = q(&mut c, &["TIME"]).await;
        assert_eq!(t, vec!["1700000000", "0"]);
        node.advance_ms(1_500);
        let t: Vec<String> = q(&mut c, &["TIME"]).await;
        assert_eq!(t, vec!["1700000001", "500000"]);
        assert_eq!(q_err(&mut c, &["TIME", "x"]).await, arity("time"));

        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, 0);
        for i in 0..30 {
            let _: () = q(&mut c, &["SET", &format!("user:{i}"), "x"]).await;
        }
        let _: () = q(&mut c, &["SET", "other", "x"]).await;
        let _: Vec<i64> = q(&mut c, &["BK.CHECK", "user:bucket", "5/1s"]).await;
        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, 32);
        assert_eq!(q_err(&mut c, &["DBSIZE", "x"]).await, arity("dbsize"));

        let mut keys: Vec<String> = q(&mut c, &["KEYS", "user:*"]).await;
        keys.sort();
        let mut want: Vec<String> = (0..30).map(|i| format!("user:{i}")).collect();
        want.push("user:bucket".into());
        want.sort();
        assert_eq!(keys, want);
        let keys: Vec<String> = q(&mut c, &["KEYS", "user:?"]).await;
        assert_eq!(keys.len(), 10);
        let keys: Vec<String> = q(&mut c, &["KEYS", "*"]).await;
        assert_eq!(keys.len(), 32);
        assert_eq!(q_err(&mut c, &["KEYS"]).await, arity("keys"));

        assert_eq!(q_err(&mut c, &["FLUSHALL", "foo"]).await, SYNTAX);
        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, 32);
        assert_eq!(run(&mut c, &["FLUSHALL"]).await, Ok(Value::Okay));
        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, 0);
        let _: () = q(&mut c, &["SET", "a", "1"]).await;
        assert_eq!(run(&mut c, &["FLUSHALL", "ASYNC"]).await, Ok(Value::Okay));
        assert_eq!(q::<i64>(&mut c, &["DBSIZE"]).await, 0);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keyslot() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        // Values Redis Cluster gives for these keys.
        assert_eq!(
            q::<i64>(&mut c, &["CLUSTER", "KEYSLOT", "foo"]).await,
            12182
        );
        assert_eq!(
            q::<i64>(&mut c, &["CLUSTER", "KEYSLOT", "hello"]).await,
            866
        );
        assert_eq!(
            q::<i64>(&mut c, &["CLUSTER", "KEYSLOT", "somekey"]).await,
            11058
        );
        assert_eq!(
            q::<i64>(&mut c, &["CLUSTER", "KEYSLOT", "foo{hash_tag}"]).await,
            2515
        );
        let a: i64 = q(&mut c, &["CLUSTER", "KEYSLOT", "{user1000}.following"]).await;
        let b: i64 = q(&mut c, &["CLUSTER", "KEYSLOT", "{user1000}.followers"]).await;
        let u: i64 = q(&mut c, &["CLUSTER", "KEYSLOT", "user1000"]).await;
        assert_eq!((a, b), (u, u));
        // An empty tag does not count: the whole key is hashed.
        let e: i64 = q(&mut c, &["CLUSTER", "KEYSLOT", "{}foo"]).await;
        assert_eq!(e, i64::from(bucketd::slot::key_slot(b"{}foo")));
        assert_ne!(e, q::<i64>(&mut c, &["CLUSTER", "KEYSLOT", "foo"]).await);
        let disabled = "ERR This instance has cluster support disabled";
        assert_eq!(q_err(&mut c, &["CLUSTER", "INFO"]).await, disabled);
        assert_eq!(q_err(&mut c, &["CLUSTER", "NODES"]).await, disabled);
        assert_eq!(q_err(&mut c, &["CLUSTER", "SLOTS"]).await, disabled);
        assert_eq!(q_err(&mut c, &["READONLY"]).await, disabled);
        node.shutdown().await;
    })
    .await
}

/// Rules are node-local today (BK.RULE SET changes only the node it reaches), so their
/// admin replies are checked on a standalone node only; tests/behaviour runs the limit
/// commands themselves on a cluster too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_admin_replies() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        assert_eq!(
            run(&mut c, &["BK.RULE", "SET", "api", "100/1m"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["BK.RULE", "GET", "api"]).await,
            Ok(bulk("gcra:100/60000ms:100"))
        );
        assert_eq!(
            run(&mut c, &["BK.RULE", "GET", "nope"]).await,
            Ok(Value::Nil)
        );
        assert_eq!(
            q_err(&mut c, &["BK.RULE", "SET", "api2", "api"]).await,
            "ERR a rule needs an inline spec such as 100/1m"
        );
        assert!(
            q_err(&mut c, &["BK.RULE", "SET", "api3", "0/1s"])
                .await
                .starts_with("ERR invalid limit spec")
        );
        assert!(
            q_err(&mut c, &["BK.RULE", "SET", "has space", "1/1s"])
                .await
                .starts_with("ERR invalid rule name")
        );
        assert!(
            q_err(&mut c, &["BK.RULE", "FOO"])
                .await
                .starts_with("ERR unknown subcommand 'FOO'")
        );
        assert_eq!(
            q_err(&mut c, &["BK.RULE", "RELOAD"]).await,
            "ERR rules not reloaded, previous rules kept: no rules file configured"
        );
        assert_eq!(q_err(&mut c, &["BK.RULE"]).await, arity("bk.rule"));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_replies_in_resp3() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        c.cmd(&["HELLO", "3"]).await;
        c.send(&encode(&["CL.THROTTLE", "k", "0", "1", "2"])).await;
        let expected = b"*5\r\n:0\r\n:1\r\n:0\r\n:-1\r\n:2\r\n";
        assert_eq!(c.read_bytes(expected.len()).await, expected);
        c.send(&encode(&["BK.CHECKALL", "1", "ka", "2/1s"])).await;
        let expected =
            b"*6\r\n:1\r\n:2\r\n:1\r\n:-1\r\n:500\r\n*1\r\n*5\r\n:1\r\n:2\r\n:1\r\n:-1\r\n:500\r\n";
        assert_eq!(c.read_bytes(expected.len()).await, expected);
        c.send(&encode(&["BK.RULE", "SET", "r", "fixed:5/1s"]))
            .await;
        assert_eq!(c.read_bytes(5).await, b"+OK\r\n");
        c.send(&encode(&["BK.RULE", "LIST"])).await;
        let expected = b"%1\r\n$1\r\nr\r\n$14\r\nfixed:5/1000ms\r\n";
        assert_eq!(c.read_bytes(expected.len()).await, expected);
        c.send(&encode(&["BK.RULE", "GET", "none"])).await;
        assert_eq!(c.read_bytes(3).await, b"_\r\n");
        node.shutdown().await;
    })
    .await
}
