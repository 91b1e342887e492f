//! Every command's reply and error shape, through the `redis` crate (RESP2) and raw RESP3,
//! compared with what Redis answers.

mod common;

use common::*;
use redis::Value;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";

fn arity(cmd: &str) -> String {
    format!("ERR wrong number of arguments for '{cmd}' command")
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_and_counter_commands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        assert_eq!(run(&mut c, &["GET", "k"]).await, Ok(Value::Nil));
        assert_eq!(run(&mut c, &["SET", "k", "v1"]).await, Ok(Value::Okay));
        assert_eq!(run(&mut c, &["GET", "k"]).await, Ok(bulk("v1")));
        assert_eq!(run(&mut c, &["SET", "k", "v2", "NX"]).await, Ok(Value::Nil));
        assert_eq!(
            run(&mut c, &["SET", "fresh", "v", "nx"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["SET", "absent", "v", "XX"]).await,
            Ok(Value::Nil)
        );
        assert_eq!(run(&mut c, &["EXISTS", "absent"]).await, Ok(Value::Int(0)));
        assert_eq!(
            run(&mut c, &["SET", "k", "v2", "XX"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["SET", "k", "v3", "GET"]).await,
            Ok(bulk("v2"))
        );
        assert_eq!(
            run(&mut c, &["SET", "new", "v", "GET"]).await,
            Ok(Value::Nil)
        );
        assert_eq!(run(&mut c, &["GET", "new"]).await, Ok(bulk("v")));
        assert_eq!(
            run(&mut c, &["SET", "k", "v4", "NX", "GET"]).await,
            Ok(bulk("v3"))
        );
        assert_eq!(run(&mut c, &["GET", "k"]).await, Ok(bulk("v3")));
        // Binary-safe values.
        let _: () = redis::cmd("SET")
            .arg("bin")
            .arg(b"\x00\xff\r\n".as_slice())
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            run(&mut c, &["GET", "bin"]).await,
            Ok(Value::BulkString(b"\x00\xff\r\n".to_vec()))
        );

        assert_eq!(q_err(&mut c, &["SET", "k"]).await, arity("set"));
        assert_eq!(q_err(&mut c, &["SET", "k", "v", "NX", "XX"]).await, SYNTAX);
        assert_eq!(q_err(&mut c, &["SET", "k", "v", "EX"]).await, SYNTAX);
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EX", "10", "PX", "10"]).await,
            SYNTAX
        );
        assert_eq!(q_err(&mut c, &["SET", "k", "v", "BOGUS"]).await, SYNTAX);
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EX", "abc"]).await,
            NOT_INT
        );
        let bad_expire = "ERR invalid expire time in 'set' command";
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EX", "0"]).await,
            bad_expire
        );
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "PX", "-1"]).await,
            bad_expire
        );
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EXAT", "0"]).await,
            bad_expire
        );
        assert_eq!(
            run(&mut c, &["GET", "k"]).await,
            Ok(bulk("v3")),
            "failed SETs change nothing"
        );

        assert_eq!(run(&mut c, &["INCR", "n"]).await, Ok(Value::Int(1)));
        assert_eq!(
            run(&mut c, &["INCRBY", "n", "10"]).await,
            Ok(Value::Int(11))
        );
        assert_eq!(run(&mut c, &["DECR", "n"]).await, Ok(Value::Int(10)));
        assert_eq!(
            run(&mut c, &["DECRBY", "n", "15"]).await,
            Ok(Value::Int(-5))
        );
        assert_eq!(
            run(&mut c, &["INCRBY", "n", "-5"]).await,
            Ok(Value::Int(-10))
        );
        assert_eq!(run(&mut c, &["GET", "n"]).await, Ok(bulk("-10")));
        assert_eq!(run(&mut c, &["DECR", "fresh-d"]).await, Ok(Value::Int(-1)));
        let _: () = q(&mut c, &["SET", "s", "41"]).await;
        assert_eq!(run(&mut c, &["INCR", "s"]).await, Ok(Value::Int(42)));
        assert_eq!(run(&mut c, &["GET", "s"]).await, Ok(bulk("42")));
        // Values that are not canonical integers stay strings, and do not count.
        let _: () = q(&mut c, &["SET", "z", "007"]).await;
        assert_eq!(run(&mut c, &["GET", "z"]).await, Ok(bulk("007")));
        assert_eq!(q_err(&mut c, &["INCR", "z"]).await, NOT_INT);
        let _: () = q(&mut c, &["SET", "abc", "abc"]).await;
        assert_eq!(q_err(&mut c, &["INCR", "abc"]).await, NOT_INT);
        assert_eq!(q_err(&mut c, &["INCRBY", "n", "x"]).await, NOT_INT);
        assert_eq!(q_err(&mut c, &["INCRBY", "n", "1.5"]).await, NOT_INT);
        assert_eq!(
            q_err(&mut c, &["INCRBY", "n", "99999999999999999999"]).await,
            NOT_INT
        );
        let _: () = q(&mut c, &["SET", "max", "9223372036854775807"]).await;
        assert_eq!(
            q_err(&mut c, &["INCR", "max"]).await,
            "ERR increment or decrement would overflow"
        );
        assert_eq!(
            run(&mut c, &["GET", "max"]).await,
            Ok(bulk("9223372036854775807"))
        );
        assert_eq!(
            q_err(&mut c, &["DECRBY", "n", "-9223372036854775808"]).await,
            "ERR decrement would overflow"
        );
        assert_eq!(q_err(&mut c, &["INCR"]).await, arity("incr"));
        assert_eq!(q_err(&mut c, &["INCRBY", "n"]).await, arity("incrby"));

        assert_eq!(
            run(&mut c, &["TYPE", "k"]).await,
            Ok(Value::SimpleString("string".into()))
        );
        assert_eq!(
            run(&mut c, &["TYPE", "n"]).await,
            Ok(Value::SimpleString("string".into()))
        );
        assert_eq!(
            run(&mut c, &["TYPE", "nope"]).await,
            Ok(Value::SimpleString("none".into()))
        );
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_commands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let now_s: i64 = 1_700_000_000;
        assert_eq!(run(&mut c, &["TTL", "missing"]).await, Ok(Value::Int(-2)));
        assert_eq!(run(&mut c, &["PTTL", "missing"]).await, Ok(Value::Int(-2)));
        let _: () = q(&mut c, &["SET", "k", "v"]).await;
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(-1)));
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(-1)));
        assert_eq!(
            run(&mut c, &["EXPIRE", "missing", "10"]).await,
            Ok(Value::Int(0))
        );

        // Conditions: a key without a TTL has an infinite one.
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "100", "XX"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "100", "GT"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "100", "NX"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(100)));
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "50", "NX"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "50", "GT"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "200", "gt"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "300", "LT"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "150", "LT"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "120", "XX"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(120)));
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(120_000)));
        assert_eq!(
            run(&mut c, &["PEXPIRE", "k", "1500"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(1500)));
        // TTL rounds to the nearest second, as Redis does.
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(2)));
        let at = (now_s + 60).to_string();
        assert_eq!(
            run(&mut c, &["EXPIREAT", "k", &at]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(60)));
        let pat = (now_s * 1000 + 2_500).to_string();
        assert_eq!(
            run(&mut c, &["PEXPIREAT", "k", &pat]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(2_500)));

        assert_eq!(run(&mut c, &["PERSIST", "k"]).await, Ok(Value::Int(1)));
        assert_eq!(run(&mut c, &["PERSIST", "k"]).await, Ok(Value::Int(0)));
        assert_eq!(
            run(&mut c, &["PERSIST", "missing"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(-1)));

        // A time in the past deletes the key.
        assert_eq!(run(&mut c, &["EXPIRE", "k", "-1"]).await, Ok(Value::Int(1)));
        assert_eq!(run(&mut c, &["EXISTS", "k"]).await, Ok(Value::Int(0)));
        let _: () = q(&mut c, &["SET", "k2", "v"]).await;
        assert_eq!(
            run(&mut c, &["EXPIREAT", "k2", "1000"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["GET", "k2"]).await, Ok(Value::Nil));

        // SET's expiry options.
        let _: () = q(&mut c, &["SET", "e", "v", "EX", "10"]).await;
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(10)));
        let _: () = q(&mut c, &["SET", "e", "v", "PX", "2500"]).await;
        assert_eq!(run(&mut c, &["PTTL", "e"]).await, Ok(Value::Int(2500)));
        let _: () = q(&mut c, &["SET", "e", "v2", "KEEPTTL"]).await;
        assert_eq!(run(&mut c, &["PTTL", "e"]).await, Ok(Value::Int(2500)));
        assert_eq!(run(&mut c, &["GET", "e"]).await, Ok(bulk("v2")));
        let _: () = q(
            &mut c,
            &["SET", "e", "v", "EXAT", &(now_s + 30).to_string()],
        )
        .await;
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(30)));
        let _: () = q(
            &mut c,
            &["SET", "e", "v", "PXAT", &(now_s * 1000 + 700).to_string()],
        )
        .await;
        assert_eq!(run(&mut c, &["PTTL", "e"]).await, Ok(Value::Int(700)));
        // A plain SET drops the TTL; INCR keeps it.
        let _: () = q(&mut c, &["SET", "e", "5"]).await;
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(-1)));
        let _: () = q(&mut c, &["SET", "e", "5", "EX", "100"]).await;
        assert_eq!(run(&mut c, &["INCR", "e"]).await, Ok(Value::Int(6)));
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(100)));

        assert_eq!(q_err(&mut c, &["EXPIRE", "e", "abc"]).await, NOT_INT);
        assert_eq!(
            q_err(&mut c, &["EXPIRE", "e", "10", "foo"]).await,
            "ERR Unsupported option foo"
        );
        assert_eq!(q_err(&mut c, &["EXPIRE", "e"]).await, arity("expire"));
        assert_eq!(q_err(&mut c, &["TTL"]).await, arity("ttl"));
        assert_eq!(q_err(&mut c, &["PERSIST"]).await, arity("persist"));
        node.shutdown().await;
    })
    .await
}

/// Redis refuses contradictory EXPIRE conditions with specific messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_conflicting_conditions_error_like_redis() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        let _: () = q(&mut c, &["SET", "k", "v"]).await;
        assert_eq!(
            q_err(&mut c, &["EXPIRE", "k", "10", "NX", "XX"]).await,
            "ERR NX and XX, GT or LT options at the same time are not compatible"
        );
        assert_eq!(
            q_err(&mut c, &["EXPIRE", "k", "10", "GT", "LT"]).await,
            "ERR GT and LT options at the same time are not compatible"
        );
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_unlink_exists() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        for k in ["a", "b", "c", "d"] {
            let _: () = q(&mut c, &["SET", k, "1"]).await;
        }
        // Duplicates count twice for EXISTS and once for DEL, as in Redis.
        assert_eq!(
            run(&mut c, &["EXISTS", "a", "a", "zz"]).await,
            Ok(Value::Int(2))
        );
        assert_eq!(
            run(&mut c, &["DEL", "a", "a", "zz"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(
            run(&mut c, &["UNLINK", "b", "c", "zz"]).await,
            Ok(Value::Int(2))
        );
        assert_eq!(
            run(&mut c, &["EXISTS", "a", "b", "c", "d"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["BK.RESET", "d"]).await, Ok(Value::Int(1)));
        assert_eq!(q_err(&mut c, &["DEL"]).await, arity("del"));
        assert_eq!(q_err(&mut c, &["EXISTS"]).await, arity("exists"));
        assert_eq!(q_err(&mut c, &["UNLINK"]).await, arity("unlink"));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_reply_and_error_shapes() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.conn().await;
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "user123", "15", "30", "60"]).await,
            [0, 16, 15, -1, 2]
        );
        // redis-cell's own errors, as the module answers them inside Redis 7.0.
        let usage = "Cell error: Store error: Usage: cl.throttle <key> <max_burst> \
                     <count per period> <period> [<quantity>]";
        assert_eq!(q_err(&mut c, &["CL.THROTTLE", "k", "1", "2"]).await, usage);
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "k", "1", "2", "3", "1", "extra"]).await,
            usage
        );
        assert_eq!(q_err(&mut c, &["CL.THROTTLE"]).await, usage);
        for (bad, arg) in [
            (["CL.THROTTLE", "k", "x", "30", "60"], "x"),
            (["CL.THROTTLE", "k", "15", "3.5", "60"], "3.5"),
            (["CL.THROTTLE", "k", "15", "30", "sixty"], "sixty"),
        ] {
            assert_eq!(
                q_err(&mut c, &bad).await,
                format!("Cell error: Store error: Couldn't parse as integer: {arg}"),
                "{bad:?}"
            );
        }
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "k", "15", "30", "60", "q"]).await,
            "Cell error: Store error: Couldn't parse as integer: q"
        );
        let zero = "Cell error: Store error: Zero rates are not supported";
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "k", "15", "0", "60"]).await,
            zero
        );
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "k", "15", "30", "0"]).await,
            zero
        );
        // A negative burst is a limit of burst + 1, refusing everything; a negative quantity
        // of more than a millisecond fails after writing the key (see tests/limits.rs).
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "n", "-1", "30", "60"]).await,
            [1, 0, 0, -1, 0]
        );
        assert_eq!(
            run(&mut c, &["EXISTS", "k"]).await,
            Ok(Value::Int(0)),
            "errors store nothing"
        );

        assert_eq!(
            limit(&mut c, &["BK.CHECK", "b", "10/1s"]).await,
            [1, 10, 9, -1, 100]
        );
        assert_eq!(q_err(&mut c, &["BK.CHECK", "b"]).await, arity("bk.check"));
        let e = q_err(&mut c, &["BK.CHECK", "b", "x/y"]).await;
        assert!(e.starts_with("ERR invalid limit spec 'x/y'"), "{e}");
        for spec in [
            "0/1s",
            "10/0s",
            "10/1w",
            "fixed:10/1s:5",
            "leaky:1/1s",
            "10/1s:0",
        ] {
            let e = q_err(&mut c, &["BK.CHECK", "b", spec]).await;
            assert!(e.starts_with("ERR invalid limit spec"), "{spec}: {e}");
        }
        assert_eq!(
            q_err(&mut c, &["BK.CHECK", "b", "nosuch"]).await,
            "ERR no such rule 'nosuch'"
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECK", "b", "10/1s", "COST", "x"]).await,
            NOT_INT
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECK", "b", "10/1s", "COST", "-1"]).await,
            NOT_INT
        );
        assert!(
            q_err(&mut c, &["BK.CHECK", "b", "10/1s", "COST"])
                .await
                .starts_with("ERR ")
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECK", "b", "10/1s", "BOGUS"]).await,
            SYNTAX
        );

        let all: Value = q(
            &mut c,
            &["BK.CHECKALL", "2", "x1", "x2", "5/1s", "fixed:3/1s"],
        )
        .await;
        let Value::Array(parts) = all else {
            panic!("BK.CHECKALL is an array")
        };
        assert_eq!(parts.len(), 6);
        assert_eq!(parts[..5], [1, 3, 2, -1, 1000].map(Value::Int));
        assert_eq!(
            parts[5],
            Value::Array(vec![
                Value::Array([1, 5, 4, -1, 200].map(Value::Int).to_vec()),
                Value::Array([1, 3, 2, -1, 1000].map(Value::Int).to_vec()),
            ])
        );
        let numkeys = "ERR numkeys must be at least 1 and match the keys and specs given";
        assert_eq!(
            q_err(&mut c, &["BK.CHECKALL", "0", "a", "1/1s"]).await,
            numkeys
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECKALL", "2", "a", "1/1s"]).await,
            numkeys
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECKALL", "-1", "a", "1/1s"]).await,
            numkeys
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECKALL", "x", "a", "1/1s"]).await,
            NOT_INT
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECKALL", "1", "a"]).await,
            arity("bk.checkall")
        );
        assert_eq!(
            q_err(&mut c, &["BK.CHECKALL", "1", "a", "1/1s", "EXTRA"]).await,
            SYNTAX
        );

        assert_eq!(
            limit(&mut c, &["BK.LEASE", "l", "10/1s", "4"]).await,
            [4, 10, 6, -1, 400]
        );
        assert_eq!(
            q_err(&mut c, &["BK.LEASE", "l", "10/1s", "0"]).await,
            "ERR lease size must be positive"
        );
        assert_eq!(
            q_err(&mut c, &["BK.LEASE", "l", "10/1s", "-1"]).await,
            NOT_INT
        );
        assert_eq!(
            q_err(&mut c, &["BK.LEASE", "l", "10/1s"]).await,
            arity("bk.lease")
        );

        // A bucket is not a string, and a string is not a bucket.
        assert_eq!(q_err(&mut c, &["GET", "b"]).await, WRONGTYPE);
        assert_eq!(q_err(&mut c, &["INCR", "b"]).await, WRONGTYPE);
        assert_eq!(q_err(&mut c, &["SET", "b", "v", "GET"]).await, WRONGTYPE);
        assert_eq!(
            run(&mut c, &["TYPE", "b"]).await,
            Ok(Value::SimpleString("bucket".into()))
        );
        let _: () = q(&mut c, &["SET", "s", "1"]).await;
        assert_eq!(q_err(&mut c, &["BK.CHECK", "s", "10/1s"]).await, WRONGTYPE);
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "s", "1", "1", "1"]).await,
            WRONGTYPE
        );
        assert_eq!(
            q_err(&mut c, &["BK.LEASE", "s", "10/1s", "1"]).await,
            WRONGTYPE
        );
        // A bucket's expiry is its refill time: EXPIRE and PERSIST leave it alone.
        assert_eq!(
            run(&mut c, &["EXPIRE", "b", "1000"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(run(&mut c, &["PERSIST", "b"]).await, Ok(Value::Int(0)));
        assert_eq!(run(&mut c, &["PTTL", "b"]).await, Ok(Value::Int(100)));
        // SET over a bucket replaces it.
        assert_eq!(run(&mut c, &["SET", "b", "v"]).await, Ok(Value::Okay));
        assert_eq!(run(&mut c, &["GET", "b"]).await, Ok(bulk("v")));

        // Rules admin.
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
