//! The wire protocol, byte for byte: inline and multibulk requests, pipelining, partial
//! requests, RESP3, malformed input and request limits. Whatever a client sends, the node
//! must answer what it can, close what it cannot frame, and keep serving everyone else.

#![cfg(feature = "server")]

mod common;

use common::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Asserts that `conn` gets exactly `expected` (an error line) and is then closed.
async fn expect_error_then_close(conn: &mut Raw, expected_prefix: &str) {
    let got = conn.read_until_closed(CLOSE_WAIT).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with(expected_prefix)
            && text.ends_with("\r\n")
            && text.matches("\r\n").count() == 1,
        "expected one error line starting with {expected_prefix:?} then a close, got {text:?}"
    );
}

async fn assert_serving(node: &TestNode) {
    let mut c = node.raw().await;
    assert_eq!(c.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
    assert_eq!(
        c.cmd(&["SET", "alive", "1"]).await,
        Resp::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["INCR", "alive"]).await, Resp::Int(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_commands() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        c.send(b"PING\r\n").await;
        assert_eq!(c.reply().await, Resp::Simple("PONG".into()));
        // A bare LF also ends an inline command; quotes group arguments.
        c.send(b"SET greeting \"hello world\"\n").await;
        assert_eq!(c.reply().await, Resp::Simple("OK".into()));
        c.send(b"GET greeting\r\n").await;
        assert_eq!(c.reply().await, Resp::bulk("hello world"));
        c.send(b"ECHO 'single quoted'\r\n").await;
        assert_eq!(c.reply().await, Resp::bulk("single quoted"));
        c.send(b"ECHO \"esc\\x41\\n\"\r\n").await;
        assert_eq!(c.reply().await, Resp::bulk("escA\n"));
        // Empty lines are skipped without a reply.
        c.send(b"\r\n\r\n   \r\nping\r\n").await;
        assert_eq!(c.reply().await, Resp::Simple("PONG".into()));
        c.send(b"CL.THROTTLE user123 15 30 60\r\n").await;
        assert_eq!(c.reply().await.ints(), vec![0, 16, 15, -1, 2]);
        // Unbalanced quotes are a protocol error: the stream cannot be framed any more.
        c.send(b"SET k \"unterminated\r\n").await;
        expect_error_then_close(&mut c, "-ERR Protocol error: unbalanced quotes").await;
        assert_serving(&node).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_frames_are_answered_in_order() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        // Keys on both shards, node commands and errors, all in one write.
        let mut batch = Vec::new();
        let mut expected = Vec::new();
        for i in 0..40 {
            let k = format!("pipe:{i}");
            batch.extend(encode(&["SET", &k, &i.to_string()]));
            expected.push(Resp::Simple("OK".into()));
            batch.extend(encode(&["INCRBY", &k, "1000"]));
            expected.push(Resp::Int(1000 + i));
            batch.extend(encode(&["ECHO", &k]));
            expected.push(Resp::bulk(&k));
            batch.extend(encode(&["GET", &k]));
            expected.push(Resp::bulk(&(1000 + i).to_string()));
            batch.extend(encode(&["NOSUCH", &k]));
            expected.push(Resp::Error(format!(
                "ERR unknown command 'NOSUCH', with args beginning with: '{k}' "
            )));
        }
        batch.extend(encode(&["DBSIZE"]));
        expected.push(Resp::Int(40));
        batch.extend(b"PING\r\n");
        expected.push(Resp::Simple("PONG".into()));
        c.send(&batch).await;
        for (i, want) in expected.iter().enumerate() {
            assert_eq!(&c.reply().await, want, "reply #{i}");
        }
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_command_pipeline() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let n = 10_000;
        let mut batch = Vec::new();
        for i in 0..n {
            // Alternate a counter on one shard with keys spread over all of them.
            if i % 2 == 0 {
                batch.extend(encode(&["INCR", "big-pipeline"]));
            } else {
                batch.extend(encode(&["SET", &format!("bp:{i}"), &i.to_string()]));
            }
        }
        c.send(&batch).await;
        for i in 0..n {
            let r = c.reply().await;
            if i % 2 == 0 {
                assert_eq!(r, Resp::Int(i / 2 + 1), "reply #{i}");
            } else {
                assert_eq!(r, Resp::Simple("OK".into()), "reply #{i}");
            }
        }
        assert_eq!(c.cmd(&["DBSIZE"]).await, Resp::Int(1 + n / 2));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_split_byte_by_byte() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let frames: [&[u8]; 3] = [
            b"*3\r\n$3\r\nSET\r\n$5\r\nsplit\r\n$12\r\nhello\r\nworld\r\n",
            b"*2\r\n$3\r\nGET\r\n$5\r\nsplit\r\n",
            b"ECHO inline-split\r\n",
        ];
        for f in frames {
            for b in f {
                c.send(std::slice::from_ref(b)).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        assert_eq!(c.reply().await, Resp::Simple("OK".into()));
        // Binary safe: the CRLF inside the value is data.
        assert_eq!(c.reply().await, Resp::bulk("hello\r\nworld"));
        assert_eq!(c.reply().await, Resp::bulk("inline-split"));
        // Nothing more was sent, so nothing more comes back.
        assert!(c.is_silent_for(Duration::from_millis(100)).await);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_after_hello_3() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        c.send(&encode(&["GET", "missing"])).await;
        assert_eq!(c.read_bytes(5).await, b"$-1\r\n");

        c.send(&encode(&["HELLO", "3"])).await;
        assert_eq!(c.read_bytes(4).await, b"%7\r\n");
        let mut fields = Vec::new();
        for _ in 0..7 {
            let k = c.reply().await.as_text();
            let v = c.reply().await;
            fields.push((k, v));
        }
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("HELLO reply lacks {name}: {fields:?}"))
        };
        assert_eq!(get("server"), Resp::bulk("bucketd"));
        assert_eq!(get("proto"), Resp::Int(3));
        assert_eq!(get("mode"), Resp::bulk("standalone"));
        assert_eq!(get("role"), Resp::bulk("master"));
        assert_eq!(get("modules"), Resp::Array(vec![]));
        assert!(matches!(get("id"), Resp::Int(id) if id > 0));
        assert!(matches!(get("version"), Resp::Bulk(_)));

        c.send(&encode(&["GET", "missing"])).await;
        assert_eq!(c.read_bytes(3).await, b"_\r\n");
        // Other replies keep their shapes; maps are real maps now.
        assert_eq!(c.cmd(&["SET", "k", "v"]).await, Resp::Simple("OK".into()));
        assert_eq!(c.cmd(&["GET", "k"]).await, Resp::bulk("v"));
        assert_eq!(
            c.cmd(&["CL.THROTTLE", "r3", "0", "1", "2"]).await.ints(),
            vec![0, 1, 0, -1, 2]
        );
        c.send(&encode(&["CONFIG", "GET", "appendonly"])).await;
        assert_eq!(c.read_bytes(4).await, b"%1\r\n");
        assert_eq!(c.reply().await, Resp::bulk("appendonly"));
        assert_eq!(c.reply().await, Resp::bulk("no"));
        c.send(&encode(&["CLIENT", "GETNAME"])).await;
        assert_eq!(c.read_bytes(3).await, b"_\r\n");
        match c.cmd(&["INFO", "server"]).await {
            Resp::Verbatim(fmt, text) => {
                assert_eq!(fmt, "txt");
                assert!(text.contains("redis_version:"), "{text}");
            }
            other => panic!("INFO in RESP3 should be verbatim text, got {other:?}"),
        }

        // Back to RESP2.
        c.send(&encode(&["HELLO", "2"])).await;
        assert_eq!(c.read_bytes(5).await, b"*14\r\n");
        for _ in 0..14 {
            c.reply().await;
        }
        c.send(&encode(&["GET", "missing"])).await;
        assert_eq!(c.read_bytes(5).await, b"$-1\r\n");
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_switch_applies_mid_pipeline() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        // Replies before HELLO use RESP2, replies after it RESP3, all from one write.
        let mut batch = encode(&["GET", "missing"]);
        batch.extend(encode(&["HELLO", "3"]));
        batch.extend(encode(&["GET", "missing"]));
        batch.extend(encode(&["HELLO", "2"]));
        batch.extend(encode(&["GET", "missing"]));
        c.send(&batch).await;
        assert_eq!(c.reply().await, Resp::NilBulk);
        assert!(matches!(c.reply().await, Resp::Map(m) if m.len() == 7));
        assert_eq!(c.reply().await, Resp::Null);
        assert!(matches!(c.reply().await, Resp::Array(a) if a.len() == 14));
        assert_eq!(c.reply().await, Resp::NilBulk);
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_binary_value_in_pieces() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let value: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
        let frame = encode_bytes(&[b"SET", b"big", &value]);
        for piece in frame.chunks(100_003) {
            c.send(piece).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(c.reply().await, Resp::Simple("OK".into()));
        assert_eq!(c.cmd(&["GET", "big"]).await, Resp::Bulk(value));
        assert_eq!(c.cmd(&["DEL", "big"]).await, Resp::Int(1));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_an_error_then_close() {
    bounded(async {
        let node = TestNode::start().await;
        let cases: [(&[u8], &str); 6] = [
            (b"*x\r\n", "-ERR Protocol error: invalid multibulk length"),
            (b"*1\r\n$-5\r\n", "-ERR Protocol error: invalid bulk length"),
            (
                b"*1\r\n$abc\r\n",
                "-ERR Protocol error: invalid bulk length",
            ),
            (b"*1\r\n$3\r\nabcd\r\n", "-ERR Protocol error:"),
            (
                b"*1\r\n+foo\r\n",
                "-ERR Protocol error: expected '$', got '+'",
            ),
            (
                b"*99999999999999999999\r\n",
                "-ERR Protocol error: invalid multibulk length",
            ),
        ];
        for (bytes, want) in cases {
            let mut c = node.raw().await;
            c.send(bytes).await;
            expect_error_then_close(&mut c, want).await;
        }
        // Commands before the bad frame in the same write are still answered, in order.
        let mut c = node.raw().await;
        let mut batch = encode(&["SET", "before", "1"]);
        batch.extend(b"PING\r\n");
        batch.extend(b"*1\r\n$-5\r\n");
        batch.extend(encode(&["SET", "after", "1"]));
        c.send(&batch).await;
        let got = String::from_utf8(c.read_until_closed(CLOSE_WAIT).await).unwrap();
        assert_eq!(
            got,
            "+OK\r\n+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"
        );
        let mut check = node.conn().await;
        assert_eq!(
            q::<Option<String>>(&mut check, &["GET", "before"]).await,
            Some("1".into())
        );
        assert_eq!(
            q::<Option<String>>(&mut check, &["GET", "after"]).await,
            None
        );
        assert_serving(&node).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_request_limits_are_enforced() {
    bounded(async {
        let node = TestNode::start_with(|s| {
            s.proto_max_bulk_len = 16;
            s.max_args = 4;
            s.max_inline_len = 64;
        })
        .await;
        // At the limits: accepted.
        let mut c = node.raw().await;
        let sixteen = "x".repeat(16);
        assert_eq!(
            c.cmd(&["SET", "k", &sixteen]).await,
            Resp::Simple("OK".into())
        );
        // Four arguments reach the command, which answers them as redis-cell does.
        assert_eq!(
            c.cmd(&["CL.THROTTLE", "k2", "1", "1"]).await,
            Resp::Error(
                "Cell error: Store error: Usage: cl.throttle <key> <max_burst> \
                 <count per period> <period> [<quantity>]"
                    .into()
            )
        );
        let inline = format!("ECHO {}\r\n", "y".repeat(64 - 7));
        c.send(inline.as_bytes()).await;
        assert_eq!(c.reply().await, Resp::bulk(&"y".repeat(64 - 7)));

        // A bulk one byte too long.
        let mut c = node.raw().await;
        c.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$17\r\n").await;
        expect_error_then_close(&mut c, "-ERR Protocol error: invalid bulk length").await;

        // Too many arguments: refused from the header, before any of them arrives.
        let mut c = node.raw().await;
        c.send(b"*5\r\n").await;
        expect_error_then_close(&mut c, "-ERR Protocol error: invalid multibulk length").await;

        // An inline line over the limit, with and without its newline.
        let mut c = node.raw().await;
        c.send(format!("ECHO {}\r\n", "z".repeat(100)).as_bytes())
            .await;
        expect_error_then_close(&mut c, "-ERR Protocol error: too big inline request").await;
        let mut c = node.raw().await;
        c.send("z".repeat(200).as_bytes()).await;
        expect_error_then_close(&mut c, "-ERR Protocol error: too big inline request").await;

        // A multibulk count line that never ends.
        let mut c = node.raw().await;
        c.send(format!("*{}", "1".repeat(200)).as_bytes()).await;
        expect_error_then_close(&mut c, "-ERR Protocol error:").await;

        // An over-long bulk length line that never ends.
        let mut c = node.raw().await;
        c.send(format!("*1\r\n${}", "9".repeat(200)).as_bytes())
            .await;
        expect_error_then_close(&mut c, "-ERR Protocol error: invalid bulk length").await;

        assert_serving(&node).await;
        let errors = info_u64(&node, "stats", "protocol_errors")
            .await
            .expect("INFO stats has protocol_errors");
        assert!(errors >= 6, "protocol_errors {errors}");
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_bulk_limit_is_enforced() {
    bounded(async {
        let node = TestNode::start().await;
        let limit = bucketd::config::Settings::default().proto_max_bulk_len;
        let mut c = node.raw().await;
        c.send(format!("*2\r\n$4\r\nECHO\r\n${}\r\n", limit + 1).as_bytes())
            .await;
        expect_error_then_close(&mut c, "-ERR Protocol error: invalid bulk length").await;
        assert_serving(&node).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_does_not_block_others() {
    bounded(async {
        let node = TestNode::start().await;
        // Several half-sent commands: connections are spread over the node's event loops,
        // so leave one stalled on each.
        let mut slow = Vec::new();
        for i in 0..4 {
            let mut c = node.raw().await;
            c.send(format!("*3\r\n$3\r\nSET\r\n$4\r\nslo{i}\r\n$5\r\nval").as_bytes())
                .await;
            slow.push(c);
        }
        let mut inline_slow = node.raw().await;
        inline_slow.send(b"SET inline-slow val").await;

        // Meanwhile other clients, on every loop, are served, including cross-shard work.
        for round in 0..8 {
            let mut c = node.raw().await;
            assert_eq!(c.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
            let a = key_on_shard("fast-a", 0, 2);
            let b = key_on_shard("fast-b", 1, 2);
            assert_eq!(c.cmd(&["SET", &a, "1"]).await, Resp::Simple("OK".into()));
            assert_eq!(c.cmd(&["SET", &b, "1"]).await, Resp::Simple("OK".into()));
            assert_eq!(c.cmd(&["EXISTS", &a, &b]).await, Resp::Int(2));
            assert_eq!(
                c.cmd(&["BK.CHECKALL", "2", &a, &b, "5/1s", "5/1s"]).await,
                Resp::Error(
                    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
                ),
                "round {round}: string keys are the wrong type for a limit"
            );
            assert_eq!(c.cmd(&["DEL", &a, &b]).await, Resp::Int(2));
            assert_eq!(
                c.cmd(&["CL.THROTTLE", &format!("fast:{round}"), "5", "10", "1"])
                    .await
                    .ints(),
                vec![0, 6, 5, -1, 1]
            );
        }

        // The stalled clients finish their commands and get their replies.
        for (i, c) in slow.iter_mut().enumerate() {
            assert!(c.is_silent_for(Duration::from_millis(20)).await);
            c.send(b"ue\r\n").await;
            assert_eq!(
                c.reply().await,
                Resp::Simple("OK".into()),
                "slow client {i}"
            );
        }
        inline_slow.send(b"\r\n").await;
        assert_eq!(inline_slow.reply().await, Resp::Simple("OK".into()));
        let mut c = node.conn().await;
        assert_eq!(q::<String>(&mut c, &["GET", "slo3"]).await, "value");
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_never_reads_does_not_block_others() {
    bounded(async {
        let node = TestNode::start().await;
        // Each of these queues megabytes of replies and never reads them.
        let payload = "p".repeat(4096);
        let mut hogs = Vec::new();
        for _ in 0..4 {
            let mut stream = node.raw().await.stream;
            let mut batch = Vec::new();
            for _ in 0..2000 {
                batch.extend(encode(&["ECHO", &payload]));
            }
            // The write cannot finish while nobody reads the replies: run it in the background.
            hogs.push(tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(Duration::from_secs(60), stream.write_all(&batch)).await;
                stream
            }));
        }
        // Let the hogs get going: the node has taken in a good share of their requests.
        let n = &node;
        wait_for(
            "the hogs' requests to be processed",
            Duration::from_secs(10),
            move || async move {
                let done = info_u64(n, "stats", "total_commands_processed").await?;
                (done >= 400).then_some(())
            },
        )
        .await;
        for i in 0..8 {
            let mut c = node.raw().await;
            assert_eq!(
                c.cmd(&["PING"]).await,
                Resp::Simple("PONG".into()),
                "client {i}"
            );
            assert_eq!(
                c.cmd(&["INCR", &key_on_shard("busy", i % 2, 2)]).await,
                Resp::Int(1 + (i / 2) as i64)
            );
        }
        for h in hogs {
            h.abort();
        }
        assert_serving(&node).await;
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxclients_refuses_extra_connections() {
    bounded(async {
        let node = TestNode::start_with(|s| s.maxclients = 2).await;
        let mut a = node.raw().await;
        let mut b = node.raw().await;
        assert_eq!(a.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        assert_eq!(b.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        let mut c = node.raw().await;
        expect_error_then_close(&mut c, "-ERR max number of clients reached").await;
        drop(a);
        // Once a slot frees up, a new client gets in.
        wait_for("a free client slot", Duration::from_secs(5), || async {
            let mut c = node.raw().await;
            let _ = c.try_send(&encode(&["PING"])).await;
            match c.try_reply(Duration::from_secs(2)).await {
                Ok(Resp::Simple(s)) if s == "PONG" => Some(()),
                _ => None,
            }
        })
        .await;
        assert_eq!(b.cmd(&["PING"]).await, Resp::Simple("PONG".into()));
        node.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_replies_then_closes() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        let mut batch = encode(&["PING"]);
        batch.extend(encode(&["QUIT"]));
        batch.extend(encode(&["SET", "after-quit", "1"]));
        c.send(&batch).await;
        let got = String::from_utf8(c.read_until_closed(CLOSE_WAIT).await).unwrap();
        assert_eq!(got, "+PONG\r\n+OK\r\n");
        let mut con = node.conn().await;
        assert_eq!(q::<i64>(&mut con, &["EXISTS", "after-quit"]).await, 0);
        node.shutdown().await;
    })
    .await
}

/// Random garbage, and garbage built from protocol fragments, never takes the node down:
/// after every such connection a fresh client still gets PONG, and whatever the node sent
/// back is well-formed RESP.
#[test]
fn random_bytes_never_crash_the_node() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let node = rt.block_on(TestNode::start_with(|s| {
        s.proto_max_bulk_len = 4096;
        s.max_args = 64;
        s.max_inline_len = 1024;
    }));
    let fragment = prop_oneof![
        Just(b"*".to_vec()),
        Just(b"$".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"0".to_vec()),
        Just(b"3".to_vec()),
        Just(b"99999999999".to_vec()),
        Just(b"PING".to_vec()),
        Just(b"GET".to_vec()),
        Just(b"SET".to_vec()),
        Just(b"CL.THROTTLE".to_vec()),
        Just(b"BK.CHECK".to_vec()),
        Just(b"BK.CHECKALL".to_vec()),
        Just(b"HELLO".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"'".to_vec()),
        Just(b"\\x".to_vec()),
        Just(b"10/1s".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..16),
    ];
    let input = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        proptest::collection::vec(fragment, 0..48).prop_map(|parts| parts.concat()),
    ];
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&input, |bytes| {
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), async {
                let mut c = node.raw().await;
                if c.try_send(&bytes).await.is_ok() {
                    let _ = c.stream.shutdown().await;
                }
                // Every reply the node sent must be well-formed RESP, ending on a boundary.
                let got = c.read_until_closed(Duration::from_secs(10)).await;
                let mut at = 0;
                while at < got.len() {
                    match parse(&got, &mut at) {
                        Ok(Some(_)) => {}
                        other => panic!(
                            "malformed output {other:?} at byte {at} for input {:?}: {:?}",
                            String::from_utf8_lossy(&bytes),
                            String::from_utf8_lossy(&got)
                        ),
                    }
                }
                let mut fresh = node.raw().await;
                assert_eq!(
                    fresh.cmd(&["PING"]).await,
                    Resp::Simple("PONG".into()),
                    "node stopped answering after input {:?}",
                    String::from_utf8_lossy(&bytes)
                );
            })
            .await
            .expect("each case finishes within 30s");
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    rt.block_on(node.shutdown());
}
