//! Rate-limit semantics on a manual clock, on both setups: CL.THROTTLE as redis-cell, BK.CHECK
//! for each algorithm with exact counts and retry times, COST, PEEK, BK.CHECKALL over keys of
//! one slot, BK.LEASE, and the limit commands' reply and error shapes.

use crate::common::*;
use redis::Value;

both_topologies! {
    limiter_reply_and_error_shapes, |t| {
        let mut c = t.conn().await;
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
            &["BK.CHECKALL", "2", "{x}1", "{x}2", "5/1s", "fixed:3/1s"],
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
    }
}

both_topologies! {
    cl_throttle_matches_redis_cell, |topo| {
        let mut c = topo.conn().await;
        let t = |k: &'static str| ["CL.THROTTLE", k, "15", "30", "60"];
        // 15 burst + 1: sixteen allowed, one every 2 s after that.
        for i in 1..=16 {
            assert_eq!(
                limit(&mut c, &t("user123")).await,
                [0, 16, 16 - i, -1, 2 * i],
                "call {i}"
            );
        }
        assert_eq!(limit(&mut c, &t("user123")).await, [1, 16, 0, 2, 32]);
        assert_eq!(limit(&mut c, &t("user123")).await, [1, 16, 0, 2, 32]);
        topo.advance_ms(1_000);
        assert_eq!(limit(&mut c, &t("user123")).await, [1, 16, 0, 1, 31]);
        topo.advance_ms(1_000);
        assert_eq!(limit(&mut c, &t("user123")).await, [0, 16, 0, -1, 32]);
        assert_eq!(limit(&mut c, &t("user123")).await, [1, 16, 0, 2, 32]);
        // Idle long enough and the bucket is full again.
        topo.advance_ms(32_000);
        assert_eq!(limit(&mut c, &t("user123")).await, [0, 16, 15, -1, 2]);

        let one = ["CL.THROTTLE", "k", "0", "1", "2", "1"];
        assert_eq!(limit(&mut c, &one).await, [0, 1, 0, -1, 2]);
        assert_eq!(limit(&mut c, &one).await, [1, 1, 0, 2, 2]);
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "k", "0", "1", "2"]).await,
            [1, 1, 0, 2, 2]
        );

        // Quantity 0 peeks: full figures on a fresh key, and nothing is stored.
        let peek = ["CL.THROTTLE", "fresh", "15", "30", "60", "0"];
        assert_eq!(limit(&mut c, &peek).await, [0, 16, 16, -1, 0]);
        assert!(!exists(&mut c, "fresh").await);
        // Quantity spends several units; more than the whole capacity never fits.
        let q5 = ["CL.THROTTLE", "qty", "9", "10", "1", "5"];
        assert_eq!(limit(&mut c, &q5).await, [0, 10, 5, -1, 1]);
        assert_eq!(limit(&mut c, &q5).await, [0, 10, 0, -1, 1]);
        assert_eq!(limit(&mut c, &q5).await, [1, 10, 0, 1, 1]);
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "big", "4", "1", "1", "6"]).await,
            [1, 5, 5, -1, 0]
        );
        assert!(!exists(&mut c, "big").await);
    }
}

both_topologies! {
    /// Arguments the redis-cell module accepts and how it answers them, each reply taken from
    /// redis-cell 0.5 loaded into Redis 7.0, on a fresh key.
    cl_throttle_answers_odd_arguments_as_redis_cell_does, |t| {
        let mut c = t.conn().await;
        let cases: [(&[&str], [i64; 5]); 11] = [
            // A negative burst is a limit of burst + 1: nothing fits.
            (&["-1", "30", "60"], [1, 0, 0, -1, 0]),
            (&["-5", "30", "60"], [1, -4, 0, -1, 0]),
            // Negative counts and periods make a negative interval.
            (&["1", "-1", "60"], [1, 2, 0, -1, 0]),
            (&["1", "1", "-60"], [1, 2, 0, -1, 0]),
            // Rust's integer syntax: a plus sign and leading zeros are fine.
            (&["+1", "01", "60"], [0, 2, 1, -1, 60]),
            // Wrapping 64-bit products: limit i64::MAX + 1, and a period so long that the
            // interval saturates.
            (&["9223372036854775807", "1", "1"], [1, i64::MIN, 0, -1, 0]),
            (
                &["1", "9223372036854775807", "9223372036854775807"],
                [0, 2, 1, -1, 1],
            ),
            (&["1", "1", "9223372036854775807"], [1, 2, 0, -1, 0]),
            // A negative quantity within a millisecond answers; remaining counts it back.
            (&["1", "1000", "1", "-1"], [0, 2, 3, -1, 0]),
            // Under one microsecond per request, remaining divides by zero microseconds.
            (&["5", "2000000", "1", "1"], [0, 6, i64::MAX, -1, 0]),
            (&["15", "30", "60", "0"], [0, 16, 16, -1, 0]),
        ];
        for (i, (args, want)) in cases.iter().enumerate() {
            let key = format!("odd:{i}");
            let mut cmd = vec!["CL.THROTTLE", key.as_str()];
            cmd.extend_from_slice(args);
            assert_eq!(limit(&mut c, &cmd).await, *want, "{args:?}");
        }
        let errors: [(&[&str], &str); 5] = [
            (&["1", "0", "60"], "Zero rates are not supported"),
            (&["1", "1", "0"], "Zero rates are not supported"),
            (&["1", "2000000000", "1"], "Zero rates are not supported"),
            (&["1.5", "1", "60"], "Couldn't parse as integer: 1.5"),
            (
                &["1", "1", "60", "9223372036854775808"],
                "Couldn't parse as integer: 9223372036854775808",
            ),
        ];
        for (args, want) in errors {
            let mut cmd = vec!["CL.THROTTLE", "err"];
            cmd.extend_from_slice(args);
            assert_eq!(
                q_err(&mut c, &cmd).await,
                format!("Cell error: Store error: {want}"),
                "{args:?}"
            );
        }
        assert!(!exists(&mut c, "err").await);
    }
}

both_topologies! {
    /// What redis-cell leaves behind on negative quantities, and how later calls read it; each
    /// step checked against redis-cell 0.5 in Redis 7.0 (with real waits there).
    cl_throttle_negative_quantities_leave_what_redis_cell_leaves, |t| {
        let mut c = t.conn().await;
        // A 1 ms increment taken back: the key stays without expiry, its tat 1 ms ago.
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "neg1", "1", "1000", "1", "-1"]).await,
            [0, 2, 3, -1, 0]
        );
        assert_eq!(q::<i64>(&mut c, &["TTL", "neg1"]).await, -1);
        t.advance_ms(5_000);
        // A limited request reads that old tat as a full bucket (redis-cell reads it as it is
        // and answers a reset of -5 s with 5003 remaining, out of any range the limit has).
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "neg1", "1", "1000", "1", "5"]).await,
            [1, 2, 2, -1, 0]
        );
        // More than a millisecond back: the key is written, then setting its TTL fails.
        assert_eq!(
            q_err(&mut c, &["CL.THROTTLE", "neg2", "1", "1", "60", "-1"]).await,
            "Cell error: Store error: Error while setting key expire"
        );
        assert!(exists(&mut c, "neg2").await);
        assert_eq!(q::<i64>(&mut c, &["TTL", "neg2"]).await, -1);
        // Its tat is in the past, so the next request starts afresh.
        assert_eq!(
            limit(&mut c, &["CL.THROTTLE", "neg2", "1", "1", "60", "1"]).await,
            [0, 2, 1, -1, 60]
        );
        assert_eq!(q::<i64>(&mut c, &["TTL", "neg2"]).await, 60);
        // A tat taken before 1970 wraps modulo 2^64 into the far future, and stays there; it
        // reads as an empty bucket, whose wait is the period (redis-cell answers the wrapped
        // time, 9446744074 s).
        let wrap = ["CL.THROTTLE", "wrap", "0", "1", "9000000000"];
        assert_eq!(
            q_err(&mut c, &[&wrap[..], &["-1"]].concat()).await,
            "Cell error: Store error: Error while setting key expire"
        );
        assert_eq!(
            limit(&mut c, &[&wrap[..], &["1"]].concat()).await,
            [1, 1, 0, 9_000_000_000, 9_000_000_000]
        );
    }
}

both_topologies! {
    cl_throttle_keys_expire_when_full_again, |t| {
        let mut c = t.conn().await;
        let _ = limit(&mut c, &["CL.THROTTLE", "exp", "4", "1", "1"]).await;
        assert_eq!(q::<i64>(&mut c, &["PTTL", "exp"]).await, 1_000);
        t.advance_ms(999);
        assert!(exists(&mut c, "exp").await);
        t.advance_ms(1);
        assert!(!exists(&mut c, "exp").await);
    }
}

both_topologies! {
    exact_counts_for_each_algorithm, |t| {
        let mut c = t.conn().await;
        // GCRA: limit 10 per second, one unit back every 100 ms.
        for i in 1..=10 {
            assert_eq!(
                check(&mut c, "g", "10/1s").await,
                [1, 10, 10 - i, -1, 100 * i]
            );
        }
        assert_eq!(check(&mut c, "g", "10/1s").await, [0, 10, 0, 100, 1000]);
        // Denials consumed nothing: the figures are the same after many of them.
        let before = figures(&mut c, "g", "10/1s").await;
        for _ in 0..20 {
            assert_eq!(check(&mut c, "g", "10/1s").await[0], 0);
        }
        assert_eq!(figures(&mut c, "g", "10/1s").await, before);
        // A burst larger than the rate.
        for i in 1..=50 {
            assert_eq!(
                check(&mut c, "gb", "gcra:10/1s:50").await[..3],
                [1, 50, 50 - i]
            );
        }
        assert_eq!(
            check(&mut c, "gb", "gcra:10/1s:50").await,
            [0, 50, 0, 100, 5000]
        );
        // Fixed window: the window opens with the first request.
        for i in 1..=5 {
            assert_eq!(
                check(&mut c, "f", "fixed:5/1s").await,
                [1, 5, 5 - i, -1, 1000]
            );
        }
        assert_eq!(
            check(&mut c, "f", "fixed:5/1s").await,
            [0, 5, 0, 1000, 1000]
        );
        t.advance_ms(400);
        assert_eq!(check(&mut c, "f", "fixed:5/1s").await, [0, 5, 0, 600, 600]);
        // Sliding window: exactly the limit within one instant.
        for i in 1..=100 {
            let r = check(&mut c, "s", "sliding:100/1m").await;
            assert_eq!(r[..4], [1, 100, 100 - i, -1], "call {i}");
        }
        let r = check(&mut c, "s", "sliding:100/1m").await;
        assert_eq!(r[..3], [0, 100, 0]);
        assert!(
            r[3] > 0,
            "a refused sliding check says when to retry: {r:?}"
        );
    }
}

both_topologies! {
    /// Waiting exactly retry_after_ms makes the same request pass; one millisecond less does not.
    retry_after_is_exact, |t| {
        let mut c = t.conn().await;
        let specs = [
            "10/1s",
            "3/1s",
            "gcra:7/1s:3",
            "fixed:5/1s",
            "fixed:3/700ms",
            "sliding:4/1s",
            "sliding:100/1m",
        ];
        for (n, spec) in specs.iter().enumerate() {
            let key = format!("retry:{n}");
            for cost in ["1", "2"] {
                for round in 0..4 {
                    // Use the limit up, then wait as long as the refusal says.
                    while limit(&mut c, &["BK.CHECK", &key, spec, "COST", cost]).await[0] == 1 {}
                    let denied = limit(&mut c, &["BK.CHECK", &key, spec, "COST", cost]).await;
                    assert_eq!(denied[0], 0, "{spec} cost {cost} round {round}: {denied:?}");
                    let wait = denied[3];
                    assert!(wait > 0, "{spec}: retry_after {wait}");
                    t.advance_ms(u64::try_from(wait - 1).unwrap());
                    let early = limit(&mut c, &["BK.CHECK", &key, spec, "COST", cost]).await;
                    assert_eq!(
                        early[0], 0,
                        "{spec} cost {cost} round {round}: allowed 1 ms before retry_after {wait}: {early:?}"
                    );
                    assert_eq!(early[3], 1, "{spec} cost {cost}: 1 ms left: {early:?}");
                    t.advance_ms(1);
                    let on_time = limit(&mut c, &["BK.CHECK", &key, spec, "COST", cost]).await;
                    assert_eq!(
                        on_time[0], 1,
                        "{spec} cost {cost} round {round}: refused after waiting retry_after {wait}: {on_time:?}"
                    );
                }
                t.advance_ms(3_600_000);
            }
        }
    }
}

both_topologies! {
    cost_and_peek, |t| {
        let mut c = t.conn().await;
        let spec = "10/1s";
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "c", spec, "COST", "3"]).await,
            [1, 10, 7, -1, 300]
        );
        // Eight more would need 100 ms of refill.
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "c", spec, "COST", "8"]).await,
            [0, 10, 7, 100, 300]
        );
        // More than the capacity can never fit.
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "c", spec, "COST", "11"]).await,
            [0, 10, 7, -1, 300]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "c", spec, "COST", "0"]).await,
            [1, 10, 7, -1, 300]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "c", spec, "cost", "7"]).await,
            [1, 10, 0, -1, 1000]
        );

        // PEEK answers what a check would, and takes nothing.
        let p = "peek";
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "PEEK"]).await,
            [1, 10, 9, -1, 100]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "PEEK"]).await,
            [1, 10, 9, -1, 100]
        );
        assert!(!exists(&mut c, p).await);
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "PEEK", "COST", "4"]).await,
            [1, 10, 6, -1, 400]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "COST", "4", "PEEK"]).await,
            [1, 10, 6, -1, 400]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "COST", "4"]).await,
            [1, 10, 6, -1, 400]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "COST", "6", "PEEK"]).await,
            [1, 10, 0, -1, 1000]
        );
        assert_eq!(
            limit(&mut c, &["BK.CHECK", p, spec, "COST", "7", "PEEK"]).await,
            [0, 10, 6, 100, 400]
        );
        assert_eq!(figures(&mut c, p, spec).await, [1, 10, 6, -1, 400]);

        // The window algorithms honour COST and PEEK the same way.
        for spec in ["fixed:10/1s", "sliding:10/1s"] {
            let k = format!("cp:{spec}");
            assert_eq!(
                limit(&mut c, &["BK.CHECK", &k, spec, "COST", "4", "PEEK"]).await[..3],
                [1, 10, 6]
            );
            assert!(!exists(&mut c, &k).await, "{spec}: PEEK stored a key");
            assert_eq!(
                limit(&mut c, &["BK.CHECK", &k, spec, "COST", "4"]).await[..3],
                [1, 10, 6]
            );
            assert_eq!(
                limit(&mut c, &["BK.CHECK", &k, spec, "COST", "7"]).await[..3],
                [0, 10, 6]
            );
            assert_eq!(
                limit(&mut c, &["BK.CHECK", &k, spec, "COST", "11"]).await[..4],
                [0, 10, 6, -1]
            );
            assert_eq!(
                limit(&mut c, &["BK.CHECK", &k, spec, "COST", "6"]).await[..3],
                [1, 10, 0]
            );
            assert_eq!(
                limit(&mut c, &["BK.CHECK", &k, spec, "PEEK"]).await[..3],
                [0, 10, 0]
            );
        }
    }
}

both_topologies! {
    checkall_on_one_shard_is_all_or_nothing, |t| {
        let mut c = t.conn().await;
        let (a, b) = ("{user7}:minute", "{user7}:second");
        let call = |cost: &'static str| ["BK.CHECKALL", "2", a, b, "3/1m", "10/1s", "COST", cost];
        let all: Vec<redis::Value> = q(&mut c, &call("1")).await;
        assert_eq!(all.len(), 6);
        for _ in 0..2 {
            let _: redis::Value = q(&mut c, &call("1")).await;
        }
        // The minute limit is spent: the second limit must not lose anything.
        let before = figures(&mut c, b, "10/1s").await;
        assert_eq!(before[2], 7);
        let (summary, each) = checkall(&mut c, &call("1")).await;
        assert_eq!(summary[0], 0);
        assert_eq!(
            summary[..4],
            [0, 3, 0, 20_000],
            "the refusing limit decides: {summary:?}"
        );
        assert_eq!(each[0][0], 0);
        // The limit that would have passed says so, with what it still has.
        assert_eq!(each[1], [1, 10, 7, -1, before[4]]);
        assert_eq!(figures(&mut c, b, "10/1s").await, before);
        // A refused call over keys never seen creates none of them.
        let (summary, _) = checkall(
            &mut c,
            &[
                "BK.CHECKALL",
                "3",
                "{user7}:new1",
                a,
                "{user7}:new2",
                "5/1s",
                "3/1m",
                "5/1s",
            ],
        )
        .await;
        assert_eq!(summary[0], 0);
        assert!(!exists(&mut c, "{user7}:new1").await);
        assert!(!exists(&mut c, "{user7}:new2").await);
    }
}

both_topologies! {
    lease_takes_what_is_available, |t| {
        let mut c = t.conn().await;
        let lease = |n: &'static str| ["BK.LEASE", "l", "10/1s", n];
        assert_eq!(limit(&mut c, &lease("4")).await, [4, 10, 6, -1, 400]);
        assert_eq!(limit(&mut c, &lease("20")).await, [6, 10, 0, -1, 1000]);
        assert_eq!(limit(&mut c, &lease("1")).await, [0, 10, 0, 100, 1000]);
        t.advance_ms(250);
        assert_eq!(limit(&mut c, &lease("5")).await, [2, 10, 0, -1, 950]);
        assert_eq!(limit(&mut c, &lease("5")).await, [0, 10, 0, 50, 950]);

        for spec in ["fixed:10/1s", "sliding:10/1s"] {
            let k = format!("l:{spec}");
            assert_eq!(
                limit(&mut c, &["BK.LEASE", &k, spec, "4"]).await[..3],
                [4, 10, 6]
            );
            assert_eq!(
                limit(&mut c, &["BK.LEASE", &k, spec, "100"]).await[..3],
                [6, 10, 0]
            );
            let none = limit(&mut c, &["BK.LEASE", &k, spec, "1"]).await;
            assert_eq!(none[..3], [0, 10, 0]);
            assert!(none[3] > 0, "{spec}: {none:?}");
            assert_eq!(check(&mut c, &k, spec).await[0], 0);
        }
    }
}
