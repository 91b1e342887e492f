//! One shared connection to bucketd (a multiplexed connection, or a cluster connection), opened
//! lazily in the background and reopened after it breaks.
//!
//! Callers never open a connection themselves: the first caller that finds none starts one
//! attempt on a spawned task and everyone waits for its outcome, so a caller's deadline can cut
//! the wait short without cancelling the attempt. After a failed attempt, callers fail at once
//! (connection error) until `reconnect_backoff` has passed, so a node that is down costs the
//! gateway nothing per request.

use super::Error;
use crate::sync::lock;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, RedisError, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Where to connect.
pub(crate) enum Target {
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
}

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

enum State {
    Idle,
    Connecting,
    Ready { conn: Conn, id: u64 },
    Failed { at: Instant, error: String },
}

pub(crate) struct Link {
    target: Target,
    connect_timeout: Duration,
    response_timeout: Duration,
    backoff: Duration,
    state: Mutex<State>,
    /// Bumped on every change of `state`, so waiters can sleep until the next one.
    changed: watch::Sender<u64>,
    next_id: AtomicU64,
}

impl Link {
    pub(crate) fn new(
        target: Target,
        connect_timeout: Duration,
        response_timeout: Duration,
        backoff: Duration,
    ) -> Link {
        Link {
            target,
            connect_timeout,
            response_timeout,
            backoff,
            state: Mutex::new(State::Idle),
            changed: watch::Sender::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Sends one command; `slot` pins it to that hash slot's primary in cluster mode (commands
    /// whose first argument is not the key need it). No deadline here: the caller adds it.
    pub(crate) async fn call(
        self: &Arc<Self>,
        cmd: Cmd,
        slot: Option<u16>,
    ) -> Result<Value, Error> {
        let (conn, id) = self.get().await?;
        let res = match conn {
            Conn::Single(mut c) => c.req_packed_command(&cmd).await,
            Conn::Cluster(mut c) => match slot {
                Some(slot) => {
                    let route = Route::new(slot, SlotAddr::Master);
                    c.route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
                }
                None => c.req_packed_command(&cmd).await,
            },
        };
        match res.and_then(Value::extract_error) {
            Ok(v) => Ok(v),
            Err(e) => Err(self.failed(e, id)),
        }
    }

    /// Classifies an error, and drops the connection if it is broken.
    fn failed(&self, e: RedisError, id: u64) -> Error {
        let err = Error::from_redis(&e);
        if matches!(err, Error::Connection(_)) || e.is_unrecoverable_error() {
            let mut st = lock(&self.state);
            if matches!(&*st, State::Ready { id: current, .. } if *current == id) {
                // Try again right away: a dropped connection says nothing about the next one.
                *st = State::Idle;
                drop(st);
                self.bump();
            }
        }
        err
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    async fn get(self: &Arc<Self>) -> Result<(Conn, u64), Error> {
        let mut rx = self.changed.subscribe();
        let mut waited = false;
        loop {
            {
                let mut st = lock(&self.state);
                match &*st {
                    State::Ready { conn, id } => return Ok((conn.clone(), *id)),
                    // One attempt per call at most, whatever the backoff.
                    State::Failed { at, error } if waited || at.elapsed() < self.backoff => {
                        return Err(Error::Connection(error.clone()));
                    }
                    State::Connecting => {}
                    State::Idle | State::Failed { .. } => {
                        *st = State::Connecting;
                        tokio::spawn(self.clone().connect());
                    }
                }
            }
            // The sender lives in `self`, so this only returns once the state moved on.
            if rx.changed().await.is_err() {
                return Err(Error::Connection("connection state lost".into()));
            }
            waited = true;
        }
    }

    async fn connect(self: Arc<Self>) {
        let res = tokio::time::timeout(self.connect_timeout, self.open()).await;
        let next = match res {
            Ok(Ok(conn)) => State::Ready {
                conn,
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
            },
            Ok(Err(e)) => State::Failed {
                at: Instant::now(),
                error: format!("cannot connect to bucketd: {e}"),
            },
            Err(_) => State::Failed {
                at: Instant::now(),
                error: format!(
                    "cannot connect to bucketd: no answer within {:?}",
                    self.connect_timeout
                ),
            },
        };
        if let State::Failed { error, .. } = &next {
            tracing::debug!("{error}");
        }
        *lock(&self.state) = next;
        self.bump();
    }

    async fn open(&self) -> Result<Conn, RedisError> {
        match &self.target {
            Target::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.response_timeout));
                let c = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Single(c))
            }
            Target::Cluster(client) => Ok(Conn::Cluster(client.get_async_connection().await?)),
        }
    }
}
