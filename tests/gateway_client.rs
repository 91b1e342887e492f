//! The bucketd client against a real in-process node on a frozen clock.

#![cfg(all(feature = "client", feature = "server"))]

mod gateway_support;

use bucketd::client::{Client, Error, Limit};
use gateway_support::{Node, Silent, closed_url};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_allows_until_the_limit_then_says_when_to_retry() {
    let mut node = Node::start().await;
    let c = node.client();
    let limit = Limit::per_minute(3);
    for left in [2, 1, 0] {
        let d = c.check("k", &limit, 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining, d.retry_after), (3, left, None));
    }
    let d = c.check("k", &limit, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, Some(Duration::from_secs(20)));
    assert_eq!(d.reset_after, Duration::from_secs(60));

    // Time only moves when the test moves it.
    node.clock.advance_ms(20_000);
    assert!(c.check("k", &limit, 1).await.unwrap().allowed);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_takes_nothing_and_cost_takes_several() {
    let mut node = Node::start().await;
    let c = node.client();
    let limit = Limit::per_minute(10);
    for _ in 0..3 {
        let d = c.peek("k", &limit).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.limit, 10);
    }
    let d = c.check("k", &limit, 4).await.unwrap();
    assert_eq!(d.remaining, 6);
    let d = c.check("k", &limit, 7).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.remaining, 6);
    assert!(c.peek("k", &limit).await.unwrap().allowed);
    assert_eq!(c.check("k", &limit, 6).await.unwrap().remaining, 0);
    assert!(!c.peek("k", &limit).await.unwrap().allowed);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spec_form_is_accepted() {
    let mut node = Node::start().await;
    let c = node.client();
    let d = c
        .check("s", &Limit::per_hour(5000).sliding(), 1)
        .await
        .unwrap();
    assert_eq!((d.limit, d.remaining), (5000, 4999));
    let d = c.check("f", &Limit::per_day(7).fixed(), 2).await.unwrap();
    assert_eq!((d.limit, d.remaining), (7, 5));
    let d = c
        .check("b", &Limit::per_second(10).burst(50), 1)
        .await
        .unwrap();
    assert_eq!((d.limit, d.remaining), (50, 49));
    let d = c.check("t", "100/1m", 1).await.unwrap();
    assert_eq!(d.remaining, 99);
    let d = c.check("t2", &String::from("fixed:2/1s"), 1).await.unwrap();
    assert_eq!(d.limit, 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_typed() {
    let mut node = Node::start().await;
    let c = node.client();
    let e = c.check("k", "no-such-rule", 1).await.unwrap_err();
    assert!(e.is_server(), "{e:?}");
    let e = c
        .check("k", &Limit::new(0, Duration::from_secs(1)), 1)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Server(_)), "{e:?}");
    let e = c.check_all::<&str, Limit>(&[], 1).await.unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    // The connection survives a server error.
    assert!(c.check("k", "1/1s", 1).await.unwrap().allowed);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_all_is_all_or_nothing() {
    let mut node = Node::start().await;
    let c = node.client();
    let limits = [
        ("{u}:wide", Limit::per_minute(10)),
        ("{u}:narrow", Limit::per_minute(1)),
    ];
    let md = c.check_all(&limits, 1).await.unwrap();
    assert!(md.summary.allowed);
    assert_eq!(md.each.len(), 2);
    assert_eq!((md.each[0].remaining, md.each[1].remaining), (9, 0));
    // The deciding limit when allowed: the least remaining.
    assert_eq!((md.summary.limit, md.summary.remaining), (1, 0));

    let md = c.check_all(&limits, 1).await.unwrap();
    assert!(!md.summary.allowed);
    assert_eq!(md.summary.limit, 1);
    assert_eq!(md.summary.retry_after, Some(Duration::from_secs(60)));
    // Nothing was taken from the wide limit.
    assert_eq!(md.each[0].remaining, 9);
    let d = c.peek("{u}:wide", &Limit::per_minute(10)).await.unwrap();
    assert!(d.allowed);

    // Keys on different shards still count as one decision.
    let spread = [("a", "5/1m"), ("b", "5/1m"), ("c", "5/1m"), ("d", "5/1m")];
    let md = c.check_all(&spread, 5).await.unwrap();
    assert!(md.summary.allowed);
    assert!(md.each.iter().all(|d| d.remaining == 0));
    let pk = c.peek_all(&spread, 1).await.unwrap();
    assert!(!pk.summary.allowed);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grants_what_is_available() {
    let mut node = Node::start().await;
    let c = node.client();
    let limit = Limit::per_minute(5);
    let l = c.lease("k", &limit, 3).await.unwrap();
    assert_eq!((l.granted, l.limit, l.remaining), (3, 5, 2));
    let l = c.lease("k", &limit, 3).await.unwrap();
    assert_eq!((l.granted, l.remaining), (2, 0));
    let l = c.lease("k", &limit, 3).await.unwrap();
    assert_eq!(l.granted, 0);
    assert_eq!(l.retry_after, Some(Duration::from_secs(12)));
    node.clock.advance_ms(24_000);
    assert_eq!(c.lease("k", &limit, 3).await.unwrap().granted, 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_forgets_keys() {
    let mut node = Node::start().await;
    let c = node.client();
    let limit = Limit::per_minute(1);
    for k in ["a", "b"] {
        assert!(c.check(k, &limit, 1).await.unwrap().allowed);
        assert!(!c.check(k, &limit, 1).await.unwrap().allowed);
    }
    assert_eq!(c.reset(&["a", "b", "never-seen"]).await.unwrap(), 2);
    assert_eq!(c.reset::<&str>(&[]).await.unwrap(), 0);
    assert!(c.check("a", &limit, 1).await.unwrap().allowed);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_speaks_redis_cell() {
    let mut node = Node::start().await;
    let c = node.client();
    // max_burst 1 => limit 2; 2 per 60 s.
    let d = c.throttle("cell", 1, 2, 60, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!((d.limit, d.remaining, d.retry_after), (2, 1, None));
    assert!(c.throttle("cell", 1, 2, 60, 1).await.unwrap().allowed);
    let d = c.throttle("cell", 1, 2, 60, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Duration::from_secs(30)));
    assert_eq!(d.reset_after, Duration::from_secs(60));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_times_out_within_the_deadline() {
    let silent = Silent::start().await;
    let deadline = Duration::from_millis(30);
    let c = Client::builder([silent.url()])
        .deadline(deadline)
        .connect_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let e = c.check("k", "1/1s", 1).await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(e, Error::Timeout(deadline));
        assert!(e.is_timeout());
        assert!(took >= deadline, "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_a_connection_error() {
    let url = closed_url().await;
    let c = Client::builder([url.as_str()])
        .deadline(Duration::from_secs(2))
        .reconnect_backoff(Duration::from_secs(60))
        .build()
        .unwrap();
    let e = c.check("k", "1/1s", 1).await.unwrap_err();
    assert!(e.is_connection(), "{e:?}");
    // Within the backoff, calls fail at once without another attempt.
    let started = Instant::now();
    for _ in 0..100 {
        assert!(c.check("k", "1/1s", 1).await.unwrap_err().is_connection());
    }
    assert!(started.elapsed() < Duration::from_millis(500));
    let e = Client::builder([url.as_str()])
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(e.is_connection(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_node_comes_back() {
    let mut node = Node::start().await;
    let port = node.addr.port();
    let clock = node.clock.clone();
    let c = node.client();
    let limit = Limit::per_minute(10);
    assert_eq!(c.check("k", &limit, 1).await.unwrap().remaining, 9);
    node.stop().await;
    let e = c.check("k", &limit, 1).await.unwrap_err();
    assert!(e.is_connection(), "{e:?}");

    let mut again = Node::start_on(port, clock).await;
    // A fresh node: the key starts full.
    assert_eq!(c.check("k", &limit, 1).await.unwrap().remaining, 9);
    let connected = Client::builder([again.url()]).connect().await.unwrap();
    connected.ping().await.unwrap();
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_takes_slots_that_release_or_their_ttl_gives_back() {
    let mut node = Node::start().await;
    let c = node.client();
    let ttl = Duration::from_secs(30);
    let first = c.acquire("conc", 2, ttl).await.unwrap();
    let second = c.acquire("conc", 2, ttl).await.unwrap();
    assert!(first.allowed() && second.allowed());
    assert_eq!(
        (second.in_flight, second.limit, second.retry_after),
        (2, 2, None)
    );
    let (first, second) = (first.permit.unwrap(), second.permit.unwrap());
    assert_eq!(first.key(), b"conc");
    assert_ne!(first.token(), second.token());

    node.clock.advance_ms(10_000);
    let refused = c.acquire("conc", 2, ttl).await.unwrap();
    assert!(!refused.allowed());
    assert_eq!((refused.in_flight, refused.limit), (2, 2));
    assert_eq!(refused.retry_after, Some(Duration::from_secs(20)));
    assert_eq!(c.in_flight("conc").await.unwrap(), 2);

    assert!(c.release(&first).await.unwrap());
    assert!(!c.release(&first).await.unwrap(), "released once only");
    assert_eq!(c.in_flight("conc").await.unwrap(), 1);
    // A ttl finer than a millisecond is sent as it is.
    let short = c
        .acquire("conc", 2, Duration::from_micros(1500))
        .await
        .unwrap();
    assert!(short.allowed());
    node.clock.advance_ms(2);
    assert_eq!(c.in_flight("conc").await.unwrap(), 1);
    // The holder that never gives its slot back loses it at its ttl.
    node.clock.advance_ms(19_998);
    assert_eq!(c.in_flight("conc").await.unwrap(), 0);
    assert!(!c.release(&second).await.unwrap());

    let e = c.acquire("conc", 0, ttl).await.unwrap_err();
    assert!(e.is_server(), "{e}");
    let e = c.acquire("conc", 1, Duration::ZERO).await.unwrap_err();
    assert!(e.is_server(), "{e}");
    node.stop().await;
}
