//! Rules in shadow mode over RESP: decided and counted as usual, answered as allowed, and never
//! the reason a multi-limit check is refused.

#![cfg(feature = "server")]

mod common;

use common::scrape::scrape;
use common::*;

#[tokio::test]
async fn a_shadow_rule_is_counted_but_never_refuses() {
    bounded(async {
        let node = TestNode::start_with(|s| s.metrics_port = Some(0)).await;
        let addr = node
            .handle
            .as_ref()
            .and_then(|h| h.metrics_addr)
            .expect("metrics on");
        let mut c = node.conn().await;
        assert_eq!(
            run(&mut c, &["BK.RULE", "SET", "soft", "shadow:2/1m"]).await,
            Ok(redis::Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["BK.RULE", "SET", "hard", "2/1m"]).await,
            Ok(redis::Value::Okay)
        );
        assert_eq!(
            q::<String>(&mut c, &["BK.RULE", "GET", "soft"]).await,
            "shadow:gcra:2/60000ms:2"
        );
        let specs = q::<redis::Value>(&mut c, &["BK.RULE", "LIST"]).await;
        assert!(
            format!("{specs:?}").contains("shadow:gcra:2/60000ms:2"),
            "{specs:?}"
        );

        // BK.CHECK: two taken, the third would be refused and is answered as allowed, with
        // nothing left and no wait.
        for left in [1, 0] {
            let r = limit(&mut c, &["BK.CHECK", "k", "soft"]).await;
            assert_eq!((r[0], r[2]), (1, left), "{r:?}");
        }
        let r = limit(&mut c, &["BK.CHECK", "k", "soft"]).await;
        assert_eq!((r[0], r[2], r[3]), (1, 0, -1), "{r:?}");
        // The same spec inline, not in shadow mode, refuses the same bucket.
        let r = limit(&mut c, &["BK.CHECK", "k", "2/1m"]).await;
        assert_eq!(r[0], 0, "{r:?}");

        // BK.CHECKALL: the shadow limit is full, but the set is decided by the hard one,
        // which still takes its units; once it is full the set is refused. The hard key is
        // on any shard first, then in the shadow key's own slot.
        for hard_key in ["a", "{k}h"] {
            let args = ["BK.CHECKALL", "2", hard_key, "k", "hard", "soft"];
            for left in [1, 0] {
                let (sum, each) = checkall(&mut c, &args).await;
                assert_eq!(sum[0], 1, "allowed: {sum:?} {each:?}");
                assert_eq!(each[0][2], left, "{each:?}");
                // The shadow limit's own entry is answered as allowed too.
                assert_eq!((each[1][0], each[1][3]), (1, -1), "{each:?}");
            }
            let (sum, each) = checkall(&mut c, &args).await;
            assert_eq!(sum[0], 0, "refused: {sum:?} {each:?}");
            assert_eq!(each[0][0], 0, "{each:?}");
        }

        // Inside MULTI/EXEC too: the full shadow rule is answered as allowed.
        let replies: Vec<Vec<i64>> = redis::pipe()
            .atomic()
            .cmd("BK.CHECK")
            .arg("k")
            .arg("soft")
            .cmd("BK.CHECK")
            .arg("{k}fresh")
            .arg("hard")
            .query_async(&mut c)
            .await
            .expect("EXEC");
        assert_eq!(replies[0][0], 1, "{replies:?}");

        let m = scrape(addr).await;
        let soft = m.get("ratelimit_service_rate_limit_shadow_mode_total{rule=\"soft\"}");
        let over = m.get("ratelimit_service_rate_limit_over_limit_total{rule=\"soft\"}");
        // One BK.CHECK, the six BK.CHECKALLs and the one in EXEC all found `soft` full.
        assert_eq!(soft, 8.0, "{}", m.text);
        assert_eq!(over, 8.0);
        assert_eq!(
            m.get("ratelimit_service_rate_limit_shadow_mode_total{rule=\"hard\"}"),
            0.0
        );
        // Refused twice in BK.CHECKALL; allowed in EXEC, on a fresh key.
        assert_eq!(
            m.get("ratelimit_service_rate_limit_over_limit_total{rule=\"hard\"}"),
            2.0
        );
        assert_eq!(replies[1][0], 1, "{replies:?}");
        common::scrape::promtool_check(&m.text);
        node.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_rules_file_marks_rules_in_shadow_mode() {
    bounded(async {
        let dir = std::env::temp_dir().join(format!("bucketd-shadow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("rules.toml");
        std::fs::write(&file, "[rules]\nsoft = \"shadow:fixed:1/1m\"\n").expect("write rules");
        let node = TestNode::start_with(|s| s.rules = Some(file.clone())).await;
        let mut c = node.conn().await;
        for _ in 0..3 {
            let r = limit(&mut c, &["BK.CHECK", "k", "soft"]).await;
            assert_eq!(r[0], 1, "{r:?}");
        }
        assert_eq!(
            q::<String>(&mut c, &["BK.RULE", "GET", "soft"]).await,
            "shadow:fixed:1/60000ms"
        );
        node.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}
