//! Concurrency limits on a manual clock, on both setups: BK.ACQUIRE up to the limit and its
//! refusal, BK.RELEASE, holders that lose their slot exactly at their ttl, the key's life
//! (it expires with its last holder and goes when emptied), and the commands' errors.

use crate::common::*;
use redis::Value;

/// BK.ACQUIRE's reply: allowed, token, in_flight, limit, retry_after_ms.
type Acquired = (i64, Option<String>, i64, i64, i64);

async fn acquire(
    c: &mut impl redis::aio::ConnectionLike,
    key: &str,
    limit: &str,
    ttl: &str,
) -> Acquired {
    let v: Value = q(c, &["BK.ACQUIRE", key, limit, ttl]).await;
    let Value::Array(f) = &v else {
        panic!("BK.ACQUIRE answered {v:?}")
    };
    let int = |i: usize| match f.get(i) {
        Some(Value::Int(n)) => *n,
        other => panic!("BK.ACQUIRE field {i} is {other:?} in {v:?}"),
    };
    let token = match f.get(1) {
        Some(Value::BulkString(b)) => Some(String::from_utf8(b.clone()).expect("utf-8 token")),
        Some(Value::Nil) => None,
        other => panic!("BK.ACQUIRE's token is {other:?}"),
    };
    assert_eq!(f.len(), 5, "{v:?}");
    (int(0), token, int(2), int(3), int(4))
}

/// Takes a slot that must be granted; returns its token.
async fn take(
    c: &mut impl redis::aio::ConnectionLike,
    key: &str,
    limit: &str,
    ttl: &str,
) -> String {
    let (allowed, token, _, _, retry) = acquire(c, key, limit, ttl).await;
    assert_eq!((allowed, retry), (1, -1), "{key}: a slot was free");
    token.expect("a granted slot has a token")
}

async fn release(c: &mut impl redis::aio::ConnectionLike, key: &str, token: &str) -> i64 {
    q(c, &["BK.RELEASE", key, token]).await
}

async fn in_flight(c: &mut impl redis::aio::ConnectionLike, key: &str) -> i64 {
    q(c, &["BK.INFLIGHT", key]).await
}

both_topologies! {
    acquire_up_to_the_limit_then_refuse_with_the_count_and_the_wait, |t| {
        let mut c = t.conn().await;
        let mut tokens = Vec::new();
        for held in 1..=3 {
            let (allowed, token, in_flight, limit, retry) = acquire(&mut c, "sem", "3", "30000").await;
            assert_eq!((allowed, in_flight, limit, retry), (1, held, 3, -1));
            tokens.push(token.expect("a token"));
        }
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), 3, "every holder has a token of its own");
        // Full: refused, with how many are held and when the first holder's time is up.
        assert_eq!(acquire(&mut c, "sem", "3", "30000").await, (0, None, 3, 3, 30_000));
        t.advance_ms(1_000);
        assert_eq!(acquire(&mut c, "sem", "3", "5s").await, (0, None, 3, 3, 29_000));
        assert_eq!(in_flight(&mut c, "sem").await, 3);

        // A release frees one slot, once.
        assert_eq!(release(&mut c, "sem", &tokens[1]).await, 1);
        assert_eq!(release(&mut c, "sem", &tokens[1]).await, 0);
        assert_eq!(release(&mut c, "sem", "12345").await, 0);
        assert_eq!(in_flight(&mut c, "sem").await, 2);
        let (allowed, token, in_flight_now, _, _) = acquire(&mut c, "sem", "3", "1m").await;
        assert_eq!((allowed, in_flight_now), (1, 3));
        assert!(!tokens.contains(&token.expect("a token")), "tokens are not reused");
        assert_eq!(acquire(&mut c, "sem", "3", "1m").await.0, 0);

        // The limit is the caller's to give each time: a larger one admits more at once, a
        // smaller one waits until enough holders are gone. Four held, due in 10 s, 29 s,
        // 29 s and 60 s: a fifth needs one of them gone, a limit of 3 two, of 1 all four.
        assert_eq!(acquire(&mut c, "sem", "4", "10s").await.2, 4);
        assert_eq!(acquire(&mut c, "sem", "4", "1s").await, (0, None, 4, 4, 10_000));
        assert_eq!(acquire(&mut c, "sem", "3", "1s").await, (0, None, 4, 3, 29_000));
        assert_eq!(acquire(&mut c, "sem", "2", "1s").await, (0, None, 4, 2, 29_000));
        assert_eq!(acquire(&mut c, "sem", "1", "1s").await, (0, None, 4, 1, 60_000));
    }
}

both_topologies! {
    a_holder_that_never_releases_loses_its_slot_at_its_ttl, |t| {
        let mut c = t.conn().await;
        let lost = take(&mut c, "gw", "1", "5000").await;
        t.advance_ms(4_999);
        assert_eq!(acquire(&mut c, "gw", "1", "5000").await, (0, None, 1, 1, 1));
        assert_eq!(in_flight(&mut c, "gw").await, 1);
        assert_eq!(q::<i64>(&mut c, &["PTTL", "gw"]).await, 1);
        t.advance_ms(1);
        // Its time is up: the slot is free, and the key went with its only holder.
        assert_eq!(in_flight(&mut c, "gw").await, 0);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "gw"]).await, 0);
        let next = take(&mut c, "gw", "1", "5000").await;
        assert_ne!(next, lost);
        assert_eq!(release(&mut c, "gw", &lost).await, 0, "an expired slot is not given back");
        assert_eq!(in_flight(&mut c, "gw").await, 1);

        // The key lives as long as its longest-lived holder, and goes with the last one.
        let short = take(&mut c, "k", "5", "1s").await;
        let long = take(&mut c, "k", "5", "10s").await;
        assert_eq!(q::<i64>(&mut c, &["PTTL", "k"]).await, 10_000);
        assert_eq!(q::<String>(&mut c, &["TYPE", "k"]).await, "semaphore");
        assert_eq!(release(&mut c, "k", &long).await, 1);
        assert_eq!(q::<i64>(&mut c, &["PTTL", "k"]).await, 1_000);
        assert_eq!(release(&mut c, "k", &short).await, 1);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "k"]).await, 0, "an empty semaphore is no key");
        assert_eq!(release(&mut c, "k", &short).await, 0);
        assert_eq!(q::<String>(&mut c, &["TYPE", "k"]).await, "none");

        // Expired holders are dropped when the key is next written.
        take(&mut c, "mix", "3", "100ms").await;
        take(&mut c, "mix", "3", "2m").await;
        t.advance_ms(100);
        assert_eq!(in_flight(&mut c, "mix").await, 1);
        let (allowed, _, held, _, _) = acquire(&mut c, "mix", "2", "2m").await;
        assert_eq!((allowed, held), (1, 2));

        // A key's holders go with DEL (BK.RESET too), and EXPIRE cannot free them early.
        assert_eq!(q::<i64>(&mut c, &["EXPIRE", "mix", "1"]).await, 0);
        assert_eq!(q::<i64>(&mut c, &["PERSIST", "mix"]).await, 0);
        assert_eq!(q::<i64>(&mut c, &["PTTL", "mix"]).await, 120_000);
        assert_eq!(q::<i64>(&mut c, &["BK.RESET", "mix"]).await, 1);
        assert_eq!(in_flight(&mut c, "mix").await, 0);
    }
}

both_topologies! {
    concurrency_errors_and_wrong_types, |t| {
        let mut c = t.conn().await;
        assert_eq!(q_err(&mut c, &["BK.ACQUIRE", "a", "1"]).await, arity("bk.acquire"));
        assert_eq!(
            q_err(&mut c, &["BK.ACQUIRE", "a", "1", "1s", "x"]).await,
            arity("bk.acquire")
        );
        assert_eq!(q_err(&mut c, &["BK.RELEASE", "a"]).await, arity("bk.release"));
        assert_eq!(q_err(&mut c, &["BK.INFLIGHT"]).await, arity("bk.inflight"));
        let range = "ERR limit must be between 1 and 100000";
        for bad in ["0", "-1", "100001", "99999999999"] {
            assert_eq!(q_err(&mut c, &["BK.ACQUIRE", "a", bad, "1s"]).await, range, "{bad}");
        }
        assert_eq!(q_err(&mut c, &["BK.ACQUIRE", "a", "ten", "1s"]).await, NOT_INT);
        assert_eq!(
            q_err(&mut c, &["BK.ACQUIRE", "a", "1", "0"]).await,
            "ERR invalid ttl '0': it must be positive"
        );
        for bad in ["1w", "-5", "1.5s", "", "s"] {
            assert_eq!(
                q_err(&mut c, &["BK.ACQUIRE", "a", "1", bad]).await,
                format!(
                    "ERR invalid ttl '{bad}': expected milliseconds or a duration such as \
                     500ms, 30s or 2m"
                )
            );
        }
        assert_eq!(
            q_err(&mut c, &["BK.ACQUIRE", "a", "1", "999999999999999999"]).await,
            "ERR invalid ttl '999999999999999999': too large"
        );
        for bad in ["abc", "-1", "", "1.0"] {
            assert_eq!(q_err(&mut c, &["BK.RELEASE", "a", bad]).await, "ERR invalid token");
        }
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "a"]).await, 0, "errors store nothing");
        assert_eq!(in_flight(&mut c, "a").await, 0);
        assert_eq!(release(&mut c, "a", "1").await, 0);
        // The largest limit is accepted.
        assert_eq!(acquire(&mut c, "a", "100000", "1s").await.3, 100_000);

        // Other kinds of key are not semaphores, and a semaphore is nothing else.
        let _: () = q(&mut c, &["SET", "s", "v"]).await;
        assert_eq!(check(&mut c, "b", "5/1s").await[0], 1);
        for key in ["s", "b"] {
            assert_eq!(q_err(&mut c, &["BK.ACQUIRE", key, "1", "1s"]).await, WRONGTYPE);
            assert_eq!(q_err(&mut c, &["BK.RELEASE", key, "1"]).await, WRONGTYPE);
            assert_eq!(q_err(&mut c, &["BK.INFLIGHT", key]).await, WRONGTYPE);
        }
        assert_eq!(q::<String>(&mut c, &["GET", "s"]).await, "v");
        take(&mut c, "sem", "2", "1s").await;
        assert_eq!(q_err(&mut c, &["GET", "sem"]).await, WRONGTYPE);
        assert_eq!(q_err(&mut c, &["INCR", "sem"]).await, WRONGTYPE);
        assert_eq!(q_err(&mut c, &["BK.CHECK", "sem", "5/1s"]).await, WRONGTYPE);
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "sem", "1", "1", "1"]).await,
            WRONGTYPE
        );
        assert_eq!(in_flight(&mut c, "sem").await, 1);
        // SET replaces whatever a key holds, as in Redis.
        let _: () = q(&mut c, &["SET", "sem", "now a string"]).await;
        assert_eq!(q::<String>(&mut c, &["TYPE", "sem"]).await, "string");
    }
}
