//! The Prometheus endpoint of a standalone node: what it counts, scraped over HTTP from a
//! live node, and the text checked by `promtool check metrics`.

#![cfg(feature = "server")]

mod common;

use common::scrape::{promtool_check, scrape};
use common::*;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn a_scrape_counts_decisions_by_command_and_by_rule_and_passes_promtool() {
    bounded(async {
        let node = TestNode::start_with(|s| s.metrics_port = Some(0)).await;
        let addr = node
            .handle
            .as_ref()
            .and_then(|h| h.metrics_addr)
            .expect("metrics on");
        let mut c = node.conn().await;

        // CL.THROTTLE with a burst of 3 (max_burst 2): 3 allowed, then 2 limited.
        for _ in 0..5 {
            limit(&mut c, &["CL.THROTTLE", "cell", "2", "1", "60"]).await;
        }
        // A named rule of 2 per minute: 2 allowed and 1 denied through BK.CHECK, one more
        // denied through BK.CHECKALL with an inline limit beside it.
        assert_eq!(
            run(&mut c, &["BK.RULE", "SET", "api", "2/1m"]).await,
            Ok(redis::Value::Okay)
        );
        for _ in 0..3 {
            limit(&mut c, &["BK.CHECK", "user:1", "api"]).await;
        }
        let all = run(
            &mut c,
            &["BK.CHECKALL", "2", "user:1", "ip:1", "api", "100/1m"],
        )
        .await;
        assert!(all.is_ok(), "{all:?}");
        // An inline limit is counted by command only.
        limit(&mut c, &["BK.CHECK", "user:2", "10/1s"]).await;
        // An error reply, and a connection closed for a protocol error.
        let _ = q_err(&mut c, &["BK.CHECK", "user:3", "nosuchrule"]).await;
        let mut raw = tokio::net::TcpStream::connect(node.addr)
            .await
            .expect("connect");
        raw.write_all(b"*1\r\n$x\r\n").await.expect("write");
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut raw, &mut sink).await;

        // Keys are published by the shards' sweep, every few milliseconds.
        let keys: i64 = q(&mut c, &["DBSIZE"]).await;
        assert!(keys >= 3);
        let m = wait_for(
            "the keys in the metrics",
            std::time::Duration::from_secs(5),
            || async {
                let m = scrape(addr).await;
                (m.get("redis_db_keys{db=\"db0\"}") == keys as f64).then_some(m)
            },
        )
        .await;
        let checks = |cmd: &str, result: &str| {
            m.get(&format!(
                "bucketd_checks_total{{command=\"{cmd}\",result=\"{result}\"}}"
            ))
        };
        assert_eq!(checks("cl.throttle", "allowed"), 3.0);
        assert_eq!(checks("cl.throttle", "denied"), 2.0);
        assert_eq!(checks("bk.check", "allowed"), 3.0);
        assert_eq!(checks("bk.check", "denied"), 1.0);
        assert_eq!(checks("bk.checkall", "denied"), 1.0);
        assert_eq!(checks("bk.checkall", "allowed"), 0.0);
        let rule = |name: &str| m.get(&format!("{name}{{rule=\"api\"}}"));
        assert_eq!(rule("ratelimit_service_rate_limit_total_hits_total"), 4.0);
        assert_eq!(rule("ratelimit_service_rate_limit_within_limit_total"), 2.0);
        assert_eq!(rule("ratelimit_service_rate_limit_over_limit_total"), 2.0);
        // Every check answered is one observation of the latency histogram.
        assert_eq!(m.get("bucketd_check_duration_seconds_count"), 10.0);
        assert_eq!(
            m.get("bucketd_check_duration_seconds_bucket{le=\"+Inf\"}"),
            10.0
        );
        assert!(m.get("bucketd_check_duration_seconds_sum") > 0.0);
        assert_eq!(m.get("bucketd_protocol_errors_total"), 1.0);
        assert!(m.get("redis_errors_total{err=\"ERR\"}") >= 1.0);
        assert!(m.get("redis_connected_clients") >= 1.0);
        assert_eq!(
            m.sum("bucketd_shard_keys", &[]),
            m.get("redis_db_keys{db=\"db0\"}")
        );
        promtool_check(&m.text);

        // A rule that is removed stops being reported.
        assert!(run(&mut c, &["BK.RULE", "DEL", "api"]).await.is_ok());
        let m = scrape(addr).await;
        assert!(!m.text.contains("rule=\"api\""), "{}", m.text);
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn metrics_are_off_unless_asked_for() {
    bounded(async {
        let node = TestNode::start().await;
        assert!(node.handle.as_ref().and_then(|h| h.metrics_addr).is_none());
        node.shutdown().await;
    })
    .await;
}
