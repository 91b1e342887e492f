//! Named users from the config file: AUTH and HELLO with a user name, a read-only user that
//! can peek and read but not consume or change anything, and refusals worded as Redis words
//! them (checked against a real Redis with the same users).

#![cfg(feature = "server")]

mod common;

use bucketd::config::{Flags, Settings, User};
use common::real_redis::{RealRedis, SideBySide};
use common::*;

fn users() -> Vec<User> {
    vec![
        User {
            name: "gw".into(),
            password: "gwpass".into(),
            readonly: false,
        },
        User {
            name: "dash".into(),
            password: "dashpass".into(),
            readonly: true,
        },
    ]
}

async fn node_with_users(requirepass: Option<&str>) -> TestNode {
    let pass = requirepass.map(str::to_string);
    TestNode::start_with(move |s| {
        s.users = users();
        s.requirepass = pass;
    })
    .await
}

#[tokio::test]
async fn wrong_credentials_are_refused_as_redis_refuses_them() {
    bounded(async {
        let node = node_with_users(Some("s3cret")).await;
        let redis = RealRedis::start_with(&[
            "--requirepass",
            "s3cret",
            // redis-server joins a flag's words into one config line.
            "--user",
            "gw",
            "on",
            ">gwpass",
            "~*",
            "&*",
            "+@all",
            "--user",
            "dash",
            "on",
            ">dashpass",
            "~*",
            "&*",
            "+@read",
            "+@connection",
            "+info",
        ])
        .await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        for args in [
            &["AUTH", "gw", "wrong"][..],
            &["AUTH", "nobody", "gwpass"],
            &["AUTH", "wrong"],
            &["AUTH", "default", "wrong"],
            &["HELLO", "3", "AUTH", "dash", "wrong"],
            &["GET", "k"],
        ] {
            sb.same_error(args).await;
        }
        assert_eq!(
            sb.same(&["AUTH", "dash", "dashpass"]).await,
            Resp::Simple("OK".into())
        );
        assert_eq!(sb.same(&["GET", "k"]).await, Resp::NilBulk);
        // A read-only user may not write: both answer NOPERM (the wording after the code is
        // Redis 7.2's, the version bucketd reports).
        let (ours, theirs) = sb.both(&["INCR", "k"]).await;
        for r in [&ours, &theirs] {
            assert!(r.as_text().starts_with("NOPERM "), "{r:?}");
        }
        assert_eq!(
            ours.as_text(),
            "NOPERM User dash has no permissions to run the 'incr' command"
        );
        assert_eq!(
            sb.same(&["AUTH", "gw", "gwpass"]).await,
            Resp::Simple("OK".into())
        );
        assert_eq!(sb.same(&["INCR", "k"]).await, Resp::Int(1));
        // HELLO authenticates in the same step, as a named user.
        let mut sb = SideBySide::connect(&node, &redis).await;
        let (ours, theirs) = sb.both(&["HELLO", "2", "AUTH", "gw", "gwpass"]).await;
        assert!(matches!(ours, Resp::Array(_)), "{ours:?}");
        assert!(matches!(theirs, Resp::Array(_)), "{theirs:?}");
        assert_eq!(sb.same(&["INCR", "k"]).await, Resp::Int(2));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_readonly_user_peeks_and_reads_but_consumes_and_changes_nothing() {
    bounded(async {
        let node = node_with_users(None).await;
        let url = |user: &str, pass: &str| format!("redis://{user}:{pass}@{}/", node.addr);
        let mut gw = connect_url(&url("gw", "gwpass")).await;
        let mut dash = connect_url(&format!("{}?protocol=resp3", url("dash", "dashpass"))).await;
        assert!(
            run(&mut gw, &["BK.RULE", "SET", "api", "5/1h"])
                .await
                .is_ok()
        );
        assert_eq!(check(&mut gw, "user:1", "api").await[..3], [1, 5, 4]);

        // Peeks, reads and server state are fine.
        let peek = limit(&mut dash, &["BK.CHECK", "user:1", "api", "PEEK"]).await;
        assert_eq!(peek[..3], [1, 5, 3]);
        let info: String = q(&mut dash, &["INFO", "bucketd"]).await;
        assert!(info.contains("checks_total"));
        assert!(run(&mut dash, &["BK.RULE", "LIST"]).await.is_ok());
        let list: String = q(&mut dash, &["CLIENT", "LIST"]).await;
        assert!(list.contains("user=dash"), "{list}");
        assert!(list.contains("user=gw"), "{list}");

        // Consuming, writing and changing rules are not.
        for args in [
            &["BK.CHECK", "user:1", "api"][..],
            &["CL.THROTTLE", "user:1", "5", "5", "60"],
            &["BK.CHECKALL", "1", "user:1", "api"],
            &["BK.LEASE", "user:1", "api", "2"],
            &["BK.RESET", "user:1"],
            &["SET", "k", "v"],
            &["BK.RULE", "SET", "api", "1000/1s"],
            &["CONFIG", "SET", "maxclients", "1"],
            &["FLUSHALL"],
        ] {
            let e = q_err(&mut dash, args).await;
            assert!(
                e.starts_with("NOPERM User dash has no permissions"),
                "{args:?}: {e}"
            );
        }
        // Nothing of it took effect.
        assert_eq!(check(&mut gw, "user:1", "api").await[..3], [1, 5, 3]);
        assert_eq!(
            run(&mut gw, &["BK.RULE", "GET", "api"]).await,
            Ok(bulk("gcra:5/3600000ms:5"))
        );

        // With named users and no requirepass the default user is off.
        let mut anon = node.raw().await;
        anon.send(&encode(&["PING"])).await;
        assert!(anon.reply().await.as_text().starts_with("NOAUTH"));
        anon.send(&encode(&["AUTH", "anything"])).await;
        assert!(anon.reply().await.as_text().starts_with("WRONGPASS"));
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn users_come_from_the_config_file() {
    bounded(async {
        let dir = temp_dir("users");
        let file = dir.join("bucketd.toml");
        std::fs::write(
            &file,
            "port = 0\n[users.gw]\npassword = \"gwpass\"\n[users.dash]\npassword = \"dashpass\"\nreadonly = true\n",
        )
        .expect("config written");
        let flags = Flags {
            config: Some(file.clone()),
            ..Flags::default()
        };
        let s = Settings::resolve(&flags).expect("config resolves");
        let mut got: Vec<(String, bool)> =
            s.users.iter().map(|u| (u.name.clone(), u.readonly)).collect();
        got.sort();
        assert_eq!(got, [("dash".to_string(), true), ("gw".to_string(), false)]);
        // A bad table is refused when the node starts.
        for bad in [
            "[users.default]\npassword = \"x\"\n",
            "[users.gw]\npassword = \"\"\n",
            "[users.gw]\npassword = \"x\"\nrole = \"admin\"\n",
            "[users.\"has space\"]\npassword = \"x\"\n",
        ] {
            std::fs::write(&file, bad).expect("config written");
            assert!(Settings::resolve(&flags).is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
