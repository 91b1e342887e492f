//! Helpers shared by the gateway tests: an in-process bucketd node on a frozen clock, and a
//! TCP listener that accepts connections and never answers.

#![allow(dead_code)]

use bucketd::client::Client;
use bucketd::clock::ManualClock;
use bucketd::config::Settings;
use bucketd::server::NodeHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A generous deadline for tests that want bucketd's answer, not a timeout, even on a busy
/// machine.
pub const PATIENT: Duration = Duration::from_secs(2);

pub struct Node {
    pub clock: Arc<ManualClock>,
    pub addr: SocketAddr,
    handle: Option<NodeHandle>,
}

impl Node {
    /// A node on a free port; its clock only moves when the test moves it.
    pub async fn start() -> Node {
        Node::start_on(0, ManualClock::new(1_700_000_000_000_000_000)).await
    }

    pub async fn start_on(port: u16, clock: Arc<ManualClock>) -> Node {
        let s = Settings {
            port,
            shards: 2,
            ..Settings::default()
        };
        let handle = bucketd::start(s, clock.clone()).await.expect("node starts");
        Node {
            clock,
            addr: handle.addr,
            handle: Some(handle),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// A client with a patient deadline and no reconnect backoff.
    pub fn client(&self) -> Client {
        client_for(&self.url(), PATIENT)
    }

    pub async fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
    }
}

pub fn client_for(url: &str, deadline: Duration) -> Client {
    Client::builder([url])
        .deadline(deadline)
        .reconnect_backoff(Duration::ZERO)
        .build()
        .expect("valid url")
}

/// Accepts connections and holds them open without reading or writing a byte.
pub struct Silent {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Silent {
    pub async fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Silent { addr, task }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An address nothing listens on (bound, then released).
pub async fn closed_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("redis://{addr}")
}
