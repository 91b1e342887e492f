//! Strings, counters, expiry and key deletion: every reply and error shape, on both setups.
//! Keys of one multi-key command share a hash tag, so a cluster serves it from one slot.

use crate::common::*;
use redis::Value;

both_topologies! {
    string_and_counter_commands, |t| {
        let mut c = t.conn().await;
        assert_eq!(run(&mut c, &["GET", "k"]).await, Ok(Value::Nil));
        assert_eq!(run(&mut c, &["SET", "k", "v1"]).await, Ok(Value::Okay));
        assert_eq!(run(&mut c, &["GET", "k"]).await, Ok(bulk("v1")));
        assert_eq!(run(&mut c, &["SET", "k", "v2", "NX"]).await, Ok(Value::Nil));
        assert_eq!(
            run(&mut c, &["SET", "fresh", "v", "nx"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["SET", "absent", "v", "XX"]).await,
            Ok(Value::Nil)
        );
        assert_eq!(run(&mut c, &["EXISTS", "absent"]).await, Ok(Value::Int(0)));
        assert_eq!(
            run(&mut c, &["SET", "k", "v2", "XX"]).await,
            Ok(Value::Okay)
        );
        assert_eq!(
            run(&mut c, &["SET", "k", "v3", "GET"]).await,
            Ok(bulk("v2"))
        );
        assert_eq!(
            run(&mut c, &["SET", "new", "v", "GET"]).await,
            Ok(Value::Nil)
        );
        assert_eq!(run(&mut c, &["GET", "new"]).await, Ok(bulk("v")));
        assert_eq!(
            run(&mut c, &["SET", "k", "v4", "NX", "GET"]).await,
            Ok(bulk("v3"))
        );
        assert_eq!(run(&mut c, &["GET", "k"]).await, Ok(bulk("v3")));
        // Binary-safe values.
        let _: () = redis::cmd("SET")
            .arg("bin")
            .arg(b"\x00\xff\r\n".as_slice())
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            run(&mut c, &["GET", "bin"]).await,
            Ok(Value::BulkString(b"\x00\xff\r\n".to_vec()))
        );

        assert_eq!(q_err(&mut c, &["SET", "k"]).await, arity("set"));
        assert_eq!(q_err(&mut c, &["SET", "k", "v", "NX", "XX"]).await, SYNTAX);
        assert_eq!(q_err(&mut c, &["SET", "k", "v", "EX"]).await, SYNTAX);
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EX", "10", "PX", "10"]).await,
            SYNTAX
        );
        assert_eq!(q_err(&mut c, &["SET", "k", "v", "BOGUS"]).await, SYNTAX);
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EX", "abc"]).await,
            NOT_INT
        );
        let bad_expire = "ERR invalid expire time in 'set' command";
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EX", "0"]).await,
            bad_expire
        );
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "PX", "-1"]).await,
            bad_expire
        );
        assert_eq!(
            q_err(&mut c, &["SET", "k", "v", "EXAT", "0"]).await,
            bad_expire
        );
        assert_eq!(
            run(&mut c, &["GET", "k"]).await,
            Ok(bulk("v3")),
            "failed SETs change nothing"
        );

        assert_eq!(run(&mut c, &["INCR", "n"]).await, Ok(Value::Int(1)));
        assert_eq!(
            run(&mut c, &["INCRBY", "n", "10"]).await,
            Ok(Value::Int(11))
        );
        assert_eq!(run(&mut c, &["DECR", "n"]).await, Ok(Value::Int(10)));
        assert_eq!(
            run(&mut c, &["DECRBY", "n", "15"]).await,
            Ok(Value::Int(-5))
        );
        assert_eq!(
            run(&mut c, &["INCRBY", "n", "-5"]).await,
            Ok(Value::Int(-10))
        );
        assert_eq!(run(&mut c, &["GET", "n"]).await, Ok(bulk("-10")));
        assert_eq!(run(&mut c, &["DECR", "fresh-d"]).await, Ok(Value::Int(-1)));
        let _: () = q(&mut c, &["SET", "s", "41"]).await;
        assert_eq!(run(&mut c, &["INCR", "s"]).await, Ok(Value::Int(42)));
        assert_eq!(run(&mut c, &["GET", "s"]).await, Ok(bulk("42")));
        // Values that are not canonical integers stay strings, and do not count.
        let _: () = q(&mut c, &["SET", "z", "007"]).await;
        assert_eq!(run(&mut c, &["GET", "z"]).await, Ok(bulk("007")));
        assert_eq!(q_err(&mut c, &["INCR", "z"]).await, NOT_INT);
        let _: () = q(&mut c, &["SET", "abc", "abc"]).await;
        assert_eq!(q_err(&mut c, &["INCR", "abc"]).await, NOT_INT);
        assert_eq!(q_err(&mut c, &["INCRBY", "n", "x"]).await, NOT_INT);
        assert_eq!(q_err(&mut c, &["INCRBY", "n", "1.5"]).await, NOT_INT);
        assert_eq!(
            q_err(&mut c, &["INCRBY", "n", "99999999999999999999"]).await,
            NOT_INT
        );
        let _: () = q(&mut c, &["SET", "max", "9223372036854775807"]).await;
        assert_eq!(
            q_err(&mut c, &["INCR", "max"]).await,
            "ERR increment or decrement would overflow"
        );
        assert_eq!(
            run(&mut c, &["GET", "max"]).await,
            Ok(bulk("9223372036854775807"))
        );
        assert_eq!(
            q_err(&mut c, &["DECRBY", "n", "-9223372036854775808"]).await,
            "ERR decrement would overflow"
        );
        assert_eq!(q_err(&mut c, &["INCR"]).await, arity("incr"));
        assert_eq!(q_err(&mut c, &["INCRBY", "n"]).await, arity("incrby"));

        assert_eq!(
            run(&mut c, &["TYPE", "k"]).await,
            Ok(Value::SimpleString("string".into()))
        );
        assert_eq!(
            run(&mut c, &["TYPE", "n"]).await,
            Ok(Value::SimpleString("string".into()))
        );
        assert_eq!(
            run(&mut c, &["TYPE", "nope"]).await,
            Ok(Value::SimpleString("none".into()))
        );
    }
}

both_topologies! {
    expiry_commands, |t| {
        let mut c = t.conn().await;
        let now_s: i64 = t.start_s();
        assert_eq!(run(&mut c, &["TTL", "missing"]).await, Ok(Value::Int(-2)));
        assert_eq!(run(&mut c, &["PTTL", "missing"]).await, Ok(Value::Int(-2)));
        let _: () = q(&mut c, &["SET", "k", "v"]).await;
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(-1)));
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(-1)));
        assert_eq!(
            run(&mut c, &["EXPIRE", "missing", "10"]).await,
            Ok(Value::Int(0))
        );

        // Conditions: a key without a TTL has an infinite one.
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "100", "XX"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "100", "GT"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "100", "NX"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(100)));
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "50", "NX"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "50", "GT"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "200", "gt"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "300", "LT"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "150", "LT"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(
            run(&mut c, &["EXPIRE", "k", "120", "XX"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(120)));
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(120_000)));
        assert_eq!(
            run(&mut c, &["PEXPIRE", "k", "1500"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(1500)));
        // TTL rounds to the nearest second, as Redis does.
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(2)));
        let at = (now_s + 60).to_string();
        assert_eq!(
            run(&mut c, &["EXPIREAT", "k", &at]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(60)));
        let pat = (now_s * 1000 + 2_500).to_string();
        assert_eq!(
            run(&mut c, &["PEXPIREAT", "k", &pat]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["PTTL", "k"]).await, Ok(Value::Int(2_500)));

        assert_eq!(run(&mut c, &["PERSIST", "k"]).await, Ok(Value::Int(1)));
        assert_eq!(run(&mut c, &["PERSIST", "k"]).await, Ok(Value::Int(0)));
        assert_eq!(
            run(&mut c, &["PERSIST", "missing"]).await,
            Ok(Value::Int(0))
        );
        assert_eq!(run(&mut c, &["TTL", "k"]).await, Ok(Value::Int(-1)));

        // A time in the past deletes the key.
        assert_eq!(run(&mut c, &["EXPIRE", "k", "-1"]).await, Ok(Value::Int(1)));
        assert_eq!(run(&mut c, &["EXISTS", "k"]).await, Ok(Value::Int(0)));
        let _: () = q(&mut c, &["SET", "k2", "v"]).await;
        assert_eq!(
            run(&mut c, &["EXPIREAT", "k2", "1000"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["GET", "k2"]).await, Ok(Value::Nil));

        // SET's expiry options.
        let _: () = q(&mut c, &["SET", "e", "v", "EX", "10"]).await;
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(10)));
        let _: () = q(&mut c, &["SET", "e", "v", "PX", "2500"]).await;
        assert_eq!(run(&mut c, &["PTTL", "e"]).await, Ok(Value::Int(2500)));
        let _: () = q(&mut c, &["SET", "e", "v2", "KEEPTTL"]).await;
        assert_eq!(run(&mut c, &["PTTL", "e"]).await, Ok(Value::Int(2500)));
        assert_eq!(run(&mut c, &["GET", "e"]).await, Ok(bulk("v2")));
        let _: () = q(
            &mut c,
            &["SET", "e", "v", "EXAT", &(now_s + 30).to_string()],
        )
        .await;
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(30)));
        let _: () = q(
            &mut c,
            &["SET", "e", "v", "PXAT", &(now_s * 1000 + 700).to_string()],
        )
        .await;
        assert_eq!(run(&mut c, &["PTTL", "e"]).await, Ok(Value::Int(700)));
        // A plain SET drops the TTL; INCR keeps it.
        let _: () = q(&mut c, &["SET", "e", "5"]).await;
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(-1)));
        let _: () = q(&mut c, &["SET", "e", "5", "EX", "100"]).await;
        assert_eq!(run(&mut c, &["INCR", "e"]).await, Ok(Value::Int(6)));
        assert_eq!(run(&mut c, &["TTL", "e"]).await, Ok(Value::Int(100)));

        assert_eq!(q_err(&mut c, &["EXPIRE", "e", "abc"]).await, NOT_INT);
        assert_eq!(
            q_err(&mut c, &["EXPIRE", "e", "10", "foo"]).await,
            "ERR Unsupported option foo"
        );
        assert_eq!(q_err(&mut c, &["EXPIRE", "e"]).await, arity("expire"));
        assert_eq!(q_err(&mut c, &["TTL"]).await, arity("ttl"));
        assert_eq!(q_err(&mut c, &["PERSIST"]).await, arity("persist"));
    }
}

both_topologies! {
    /// Redis refuses contradictory EXPIRE conditions with specific messages.
    expire_conflicting_conditions_error_like_redis, |t| {
        let mut c = t.conn().await;
        let _: () = q(&mut c, &["SET", "k", "v"]).await;
        assert_eq!(
            q_err(&mut c, &["EXPIRE", "k", "10", "NX", "XX"]).await,
            "ERR NX and XX, GT or LT options at the same time are not compatible"
        );
        assert_eq!(
            q_err(&mut c, &["EXPIRE", "k", "10", "GT", "LT"]).await,
            "ERR GT and LT options at the same time are not compatible"
        );
    }
}

both_topologies! {
    del_unlink_exists, |t| {
        // One hash tag keeps every key in one slot, so a cluster serves each command whole.
        let mut c = t.conn().await;
        for k in ["{k}a", "{k}b", "{k}c", "{k}d"] {
            let _: () = q(&mut c, &["SET", k, "1"]).await;
        }
        // Duplicates count twice for EXISTS and once for DEL, as in Redis.
        assert_eq!(
            run(&mut c, &["EXISTS", "{k}a", "{k}a", "{k}zz"]).await,
            Ok(Value::Int(2))
        );
        assert_eq!(
            run(&mut c, &["DEL", "{k}a", "{k}a", "{k}zz"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(
            run(&mut c, &["UNLINK", "{k}b", "{k}c", "{k}zz"]).await,
            Ok(Value::Int(2))
        );
        assert_eq!(
            run(&mut c, &["EXISTS", "{k}a", "{k}b", "{k}c", "{k}d"]).await,
            Ok(Value::Int(1))
        );
        assert_eq!(run(&mut c, &["BK.RESET", "{k}d"]).await, Ok(Value::Int(1)));
        assert_eq!(q_err(&mut c, &["DEL"]).await, arity("del"));
        assert_eq!(q_err(&mut c, &["EXISTS"]).await, arity("exists"));
        assert_eq!(q_err(&mut c, &["UNLINK"]).await, arity("unlink"));
    }
}

both_topologies! {
    ttls_follow_the_clock, |t| {
        let mut c = t.conn().await;
        let _: () = q(&mut c, &["SET", "k", "v", "EX", "10"]).await;
        t.advance_ms(3_000);
        assert_eq!(q::<i64>(&mut c, &["TTL", "k"]).await, 7);
        assert_eq!(q::<i64>(&mut c, &["PTTL", "k"]).await, 7_000);
        t.advance_ms(6_999);
        assert_eq!(q::<i64>(&mut c, &["PTTL", "k"]).await, 1);
        assert_eq!(
            q::<Option<String>>(&mut c, &["GET", "k"]).await.as_deref(),
            Some("v")
        );
        t.advance_ms(1);
        assert_eq!(q::<Option<String>>(&mut c, &["GET", "k"]).await, None);
        assert_eq!(q::<i64>(&mut c, &["TTL", "k"]).await, -2);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "k"]).await, 0);
        assert_eq!(q::<String>(&mut c, &["TYPE", "k"]).await, "none");
        assert_eq!(q::<i64>(&mut c, &["EXPIRE", "k", "100"]).await, 0);
        // An expired key is gone for every command: SET NX succeeds, INCR starts from zero.
        let _: () = q(&mut c, &["SET", "n", "41", "PX", "500"]).await;
        assert_eq!(q::<i64>(&mut c, &["INCR", "n"]).await, 42);
        assert_eq!(q::<i64>(&mut c, &["PTTL", "n"]).await, 500);
        t.advance_ms(500);
        assert_eq!(q::<i64>(&mut c, &["INCR", "n"]).await, 1);
        assert_eq!(q::<i64>(&mut c, &["TTL", "n"]).await, -1);
        let _: () = q(&mut c, &["SET", "nx", "old", "PX", "10"]).await;
        t.advance_ms(10);
        assert_eq!(
            run(&mut c, &["SET", "nx", "new", "NX"]).await,
            Ok(redis::Value::Okay)
        );
        assert_eq!(q::<String>(&mut c, &["GET", "nx"]).await, "new");
        // EXPIREAT is absolute on the node's clock.
        let _: () = q(&mut c, &["SET", "at", "v"]).await;
        let at = (t.start_s() + 3_600).to_string();
        assert_eq!(q::<i64>(&mut c, &["EXPIREAT", "at", &at]).await, 1);
        let ttl: i64 = q(&mut c, &["TTL", "at"]).await;
        assert!((3_600 - 20..=3_600).contains(&ttl), "TTL {ttl}");

        // A bucket lives until it is full again.
        assert_eq!(
            limit(&mut c, &["BK.CHECK", "b", "10/1s", "COST", "3"]).await[2],
            7
        );
        assert_eq!(q::<i64>(&mut c, &["PTTL", "b"]).await, 300);
        t.advance_ms(299);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "b"]).await, 1);
        t.advance_ms(1);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "b"]).await, 0);
        for spec in ["fixed:5/1s", "sliding:5/1s"] {
            let k = format!("w:{spec}");
            assert_eq!(limit(&mut c, &["BK.CHECK", &k, spec]).await[0], 1);
            assert_eq!(q::<i64>(&mut c, &["EXISTS", &k]).await, 1);
        }
        // A sliding window remembers its count through the next window too.
        t.advance_ms(1_000);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "w:fixed:5/1s"]).await, 0);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "w:sliding:5/1s"]).await, 1);
        t.advance_ms(1_000);
        assert_eq!(q::<i64>(&mut c, &["EXISTS", "w:sliding:5/1s"]).await, 0);
    }
}
