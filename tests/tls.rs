//! The TLS client port, over real sockets: `redis-cli --tls`, redis-py with `ssl=True` and the
//! client crate get answers; a certificate from another CA, a missing one where one is
//! required, plain text and a silent connection are refused or ignored while everyone else
//! is served; bad TLS files stop the node with the file's name.

#![cfg(all(feature = "client-tls", feature = "server"))]

#[path = "common/certs.rs"]
mod certs;
mod common;

use bucketd::tls::{AuthClients, TlsFiles};
use certs::Certs;
use common::tools::{REDIS_CLI, REDIS_PY, require_python, require_tool};
use common::{TestNode, closed_within, free_port};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

async fn tls_node(c: &Certs, auth: AuthClients) -> (TestNode, u16) {
    TestNode::start_on_free_port(|s, port| {
        s.tls_port = port;
        s.tls = TlsFiles {
            cert: Some(c.server_cert.clone()),
            key: Some(c.server_key.clone()),
            ca: Some(c.ca.clone()),
            auth_clients: auth,
        };
    })
    .await
}

/// `redis-cli --tls` with the CA and, if given, a certificate and key; its output, or `None`
/// when it failed.
fn cli(port: u16, ca: &Path, id: Option<(&Path, &Path)>, args: &[&str]) -> Option<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--tls", "-h", "127.0.0.1", "-p", &port.to_string()])
        .arg("--cacert")
        .arg(ca);
    if let Some((cert, key)) = id {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = cmd.args(args).output().expect("redis-cli runs");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    (out.status.success() && !text.starts_with("Could not") && !err.contains("Could not"))
        .then_some(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_work_over_tls_from_redis_cli_redis_py_and_the_client_crate() {
    require_tool(REDIS_CLI);
    require_python(REDIS_PY);
    let dir = common::temp_dir("tls-ok");
    let c = Certs::make(&dir);
    let (node, port) = tls_node(&c, AuthClients::Yes).await;
    let good = Some((c.client_cert.as_path(), c.client_key.as_path()));

    assert_eq!(cli(port, &c.ca, good, &["PING"]).as_deref(), Some("PONG"));
    let reply = cli(port, &c.ca, good, &["CL.THROTTLE", "tls:k", "1", "1", "60"]).expect("served");
    assert_eq!(reply.lines().next(), Some("0"), "{reply}");

    let script = format!(
        "import redis\n\
         r = redis.Redis(host='127.0.0.1', port={port}, ssl=True, ssl_ca_certs={ca:?}, \
         ssl_certfile={cert:?}, ssl_keyfile={key:?})\n\
         print(r.ping(), r.execute_command('CL.THROTTLE', 'tls:k', 1, 1, 60)[0])\n",
        ca = c.ca.display().to_string(),
        cert = c.client_cert.display().to_string(),
        key = c.client_key.display().to_string(),
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "True 0",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let client = bucketd::client::Client::builder([format!("rediss://127.0.0.1:{port}/")])
        .tls(bucketd::client::TlsFiles {
            ca: std::fs::read(&c.ca).expect("CA"),
            client: Some((
                std::fs::read(&c.client_cert).expect("cert"),
                std::fs::read(&c.client_key).expect("key"),
            )),
        })
        .deadline(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("the client connects over TLS");
    let limit = bucketd::client::Limit::per_minute(3);
    let d = client.check("tls:crate", &limit, 1).await.expect("check");
    assert!(d.allowed);
    assert_eq!(d.remaining, 2);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_certificates_and_plain_text_are_refused_and_the_node_serves_on() {
    require_tool(REDIS_CLI);
    let dir = common::temp_dir("tls-refuse");
    let c = Certs::make(&dir);
    let (node, port) = tls_node(&c, AuthClients::Yes).await;
    let good = Some((c.client_cert.as_path(), c.client_key.as_path()));
    let rogue = Some((c.rogue_cert.as_path(), c.rogue_key.as_path()));

    // A client that opens a connection and says nothing holds up no one.
    let silent = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");

    assert_eq!(cli(port, &c.ca, rogue, &["PING"]), None);
    assert_eq!(cli(port, &c.ca, good, &["PING"]).as_deref(), Some("PONG"));
    // tls-auth-clients yes: no certificate, no service.
    assert_eq!(cli(port, &c.ca, None, &["PING"]), None);
    assert_eq!(cli(port, &c.ca, good, &["PING"]).as_deref(), Some("PONG"));

    let mut plain = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    plain.write_all(b"PING\r\n").expect("send");
    assert!(closed_within(&mut plain, Duration::from_secs(5)));
    assert_eq!(cli(port, &c.ca, good, &["PING"]).as_deref(), Some("PONG"));
    drop(silent);

    // The plain port is as it was.
    let mut conn = node.conn().await;
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("plain PING");
    assert_eq!(pong, "PONG");
    drop(node);

    // optional: no certificate is fine, a bad one is not; no: none is asked for.
    let (_node, port) = tls_node(&c, AuthClients::Optional).await;
    assert_eq!(cli(port, &c.ca, None, &["PING"]).as_deref(), Some("PONG"));
    assert_eq!(cli(port, &c.ca, rogue, &["PING"]), None);
    let (_node, port) = tls_node(&c, AuthClients::No).await;
    assert_eq!(cli(port, &c.ca, None, &["PING"]).as_deref(), Some("PONG"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_files_stop_the_node_with_the_file_named() {
    let dir = common::temp_dir("tls-bad");
    let c = Certs::make(&dir);
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let missing = dir.join("missing.pem");
    for (cert, key, named) in [
        (missing.clone(), c.server_key.clone(), missing.clone()),
        (garbage.clone(), c.server_key.clone(), garbage.clone()),
        (c.server_cert.clone(), garbage.clone(), garbage.clone()),
    ] {
        let mut s = common::test_settings();
        s.tls_port = free_port();
        s.tls = TlsFiles {
            cert: Some(cert),
            key: Some(key),
            ca: Some(c.ca.clone()),
            auth_clients: AuthClients::Yes,
        };
        let clock = bucketd::clock::ManualClock::new(common::START_NS);
        match bucketd::start(s, clock).await {
            Ok(_) => panic!("the node started with a bad TLS file"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&named.display().to_string()), "{msg}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
