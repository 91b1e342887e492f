//! Sorted sets side by side with a real `redis-server`: every command and option bucketd
//! implements, their errors word for word, in RESP2 and RESP3, on small sets (listpack) and
//! large ones (skiplist), and a long run of random commands on both. Then what only bucketd
//! shows: SCAN's TYPE filter and the key commands on a sorted set.

#![cfg(feature = "server")]

mod common;

use common::real_redis::{SideBySide, both_protocols};
use common::{Resp, Rng, TestNode, bounded};

/// Runs `script` on both servers: `!` before a command means both must refuse it.
async fn run_script(sb: &mut SideBySide, script: &[Vec<String>]) {
    for cmd in script {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        match args.split_first() {
            Some((&"!", rest)) => {
                sb.same_error(rest).await;
            }
            _ => {
                sb.same(&args).await;
            }
        }
    }
}

/// Builds a script from space-separated commands, `{k}` standing for the key prefix. An
/// argument `''` is the empty string.
fn script(prefix: &str, lines: &[&str]) -> Vec<Vec<String>> {
    lines
        .iter()
        .map(|l| {
            l.split_whitespace()
                .map(|w| match w {
                    "''" => String::new(),
                    w => w.replace("{k}", prefix),
                })
                .collect()
        })
        .collect()
}

const ZADD_AND_READS: &[&str] = &[
    "ZADD {k}:a 1 one 2 two 3 three",
    "ZADD {k}:a 0.1 tenth -0 negzero 1e-5 small 1.5e16 big +inf top -inf bottom",
    "ZCARD {k}:a",
    "ZCARD {k}:missing",
    "ZSCORE {k}:a tenth",
    "ZSCORE {k}:a negzero",
    "ZSCORE {k}:a small",
    "ZSCORE {k}:a big",
    "ZSCORE {k}:a top",
    "ZSCORE {k}:a bottom",
    "ZSCORE {k}:a nobody",
    "ZSCORE {k}:missing one",
    "ZMSCORE {k}:a one nobody top",
    "ZMSCORE {k}:missing one two",
    "ZRANGE {k}:a 0 -1 WITHSCORES",
    // Options: NX, XX, GT, LT, CH, INCR and their mixes.
    "ZADD {k}:a NX 10 one 4 four",
    "ZADD {k}:a XX 10 one 5 five",
    "ZADD {k}:a XX CH 11 one 5 five",
    "ZADD {k}:a GT CH 5 one 20 two",
    "ZADD {k}:a LT CH 5 one 30 two",
    "ZADD {k}:a XX GT CH 100 three 1 four",
    "ZADD {k}:a CH 5 one 5 two 6 six",
    "ZADD {k}:a INCR 2.5 one",
    "ZADD {k}:a INCR NX 1 one",
    "ZADD {k}:a INCR XX 1 nobody",
    "ZADD {k}:a INCR GT -1 one",
    "ZADD {k}:a INCR LT -1 one",
    "ZADD {k}:a INCR 1 fresh",
    "ZADD {k}:a nx ch 7 seven",
    "ZADD {k}:xx XX 1 one",
    "EXISTS {k}:xx",
    "ZADD {k}:xx XX INCR 1 one",
    "ZINCRBY {k}:a 1.5 one",
    "! ZINCRBY {k}:a -inf top",
    "ZINCRBY {k}:new 3 m",
    "ZRANGE {k}:a 0 -1 WITHSCORES",
    "! ZINCRBY {k}:a inf bottom",
    "! ZADD {k}:a INCR -inf top",
    "ZSCORE {k}:a top",
    "! ZADD {k}:a",
    "! ZADD {k}:a 1",
    "! ZADD {k}:a 1 one 2",
    "! ZADD {k}:a NX",
    "! ZADD {k}:a NX XX 1 one",
    "! ZADD {k}:a GT LT 1 one",
    "! ZADD {k}:a GT NX 1 one",
    "! ZADD {k}:a LT NX 1 one",
    "! ZADD {k}:a INCR 1 one 2 two",
    "! ZADD {k}:a x one",
    "! ZADD {k}:a 1 one y two",
    "! ZADD {k}:a nan one",
    "! ZADD {k}:a 1e400 one",
    "! ZADD {k}:a '' one",
    "! ZADD {k}:a WHAT 1 one",
    "! ZINCRBY {k}:a x one",
    "! ZINCRBY {k}:a nx one",
    "! ZINCRBY {k}:a 1",
    "! ZSCORE {k}:a",
    "! ZMSCORE {k}:a",
    "! ZCARD",
    "! ZCARD {k}:a extra",
];

const RANGES: &[&str] = &[
    "ZADD {k}:r 1 a 2 b 2 c 3 d 4 e 5 f 5.5 g 10 h",
    "ZRANGE {k}:r 0 -1",
    "ZRANGE {k}:r 0 -1 WITHSCORES",
    "ZRANGE {k}:r 2 4 withscores",
    "ZRANGE {k}:r -3 -1",
    "ZRANGE {k}:r -100 100",
    "ZRANGE {k}:r 5 2",
    "ZRANGE {k}:r 8 10",
    "ZRANGE {k}:r -1 -3",
    "ZRANGE {k}:r 0 0 REV",
    "ZRANGE {k}:r 1 3 REV WITHSCORES",
    "ZRANGE {k}:r 2 5 BYSCORE",
    "ZRANGE {k}:r (2 5 BYSCORE WITHSCORES",
    "ZRANGE {k}:r 2 (5 BYSCORE",
    "ZRANGE {k}:r -inf +inf BYSCORE LIMIT 2 3",
    "ZRANGE {k}:r -inf +inf BYSCORE LIMIT 2 -1",
    "ZRANGE {k}:r -inf +inf BYSCORE LIMIT -1 2",
    "ZRANGE {k}:r -inf +inf BYSCORE LIMIT 100 2",
    "ZRANGE {k}:r -inf +inf BYSCORE LIMIT 0 0",
    "ZRANGE {k}:r 5 2 BYSCORE REV",
    "ZRANGE {k}:r +inf -inf BYSCORE REV LIMIT 1 2 WITHSCORES",
    "ZRANGE {k}:r 2 5 BYSCORE REV",
    "ZRANGE {k}:r (5 (5 BYSCORE",
    "ZRANGE {k}:r 5 5 BYSCORE",
    "ZRANGE {k}:r 0 -1 LIMIT 0 -1",
    "ZRANGE {k}:missing 0 -1",
    "ZRANGE {k}:missing 0 -1 WITHSCORES",
    "! ZRANGE {k}:r 0 -1 LIMIT 0 1",
    "! ZRANGE {k}:r 0 -1 LIMIT 0",
    "! ZRANGE {k}:r 0 -1 LIMIT x 1 BYSCORE",
    "! ZRANGE {k}:r - + BYLEX WITHSCORES",
    "! ZRANGE {k}:r 0 -1 BYSCORE BYLEX",
    "! ZRANGE {k}:r 0 -1 REV REV",
    "! ZRANGE {k}:r 0 -1 WHAT",
    "! ZRANGE {k}:r a b",
    "! ZRANGE {k}:r 0 1.5",
    "! ZRANGE {k}:r x 1 BYSCORE",
    "! ZRANGE {k}:r 1 nan BYSCORE",
    "! ZRANGE {k}:r a b BYLEX",
    "! ZRANGE {k}:r 0",
    "ZRANGEBYSCORE {k}:r 2 5",
    "ZRANGEBYSCORE {k}:r (1 (5.5 WITHSCORES",
    "ZRANGEBYSCORE {k}:r -inf +inf LIMIT 1 2",
    "ZRANGEBYSCORE {k}:r -inf inf WITHSCORES LIMIT 1 2",
    "ZRANGEBYSCORE {k}:r '' (",
    "ZRANGEBYSCORE {k}:r 1e400 -1e400",
    "ZRANGEBYSCORE {k}:r 5 2",
    "! ZRANGEBYSCORE {k}:r 2 5 BYSCORE",
    "! ZRANGEBYSCORE {k}:r 2 5 REV",
    "! ZRANGEBYSCORE {k}:r 2 x",
    "! ZRANGEBYSCORE {k}:r 2 5 LIMIT 1",
    "ZREVRANGEBYSCORE {k}:r 5 2",
    "ZREVRANGEBYSCORE {k}:r +inf -inf WITHSCORES LIMIT 2 2",
    "ZREVRANGEBYSCORE {k}:r (5 (2",
    "ZREVRANGEBYSCORE {k}:r 2 5",
    "ZREVRANGE {k}:r 0 2",
    "ZREVRANGE {k}:r 0 -1 WITHSCORES",
    "ZREVRANGE {k}:r -2 -1",
    "! ZREVRANGE {k}:r 0 -1 REV",
    "! ZREVRANGE {k}:r 0 -1 LIMIT 0 1",
    "ZADD {k}:l 0 a 0 b 0 c 0 d 0 e 0 f 0 g",
    "ZRANGEBYLEX {k}:l - +",
    "ZRANGEBYLEX {k}:l [b (e",
    "ZRANGEBYLEX {k}:l (b [e LIMIT 1 2",
    "ZRANGEBYLEX {k}:l - [c",
    "ZRANGEBYLEX {k}:l [c +",
    "ZRANGEBYLEX {k}:l + -",
    "ZRANGEBYLEX {k}:l (c (c",
    "ZRANGEBYLEX {k}:l [c [c",
    "ZRANGEBYLEX {k}:l [ +",
    "ZRANGE {k}:l [b [d BYLEX",
    "ZRANGE {k}:l [d [b BYLEX REV",
    "ZRANGE {k}:l + - BYLEX REV LIMIT 1 3",
    "ZREVRANGEBYLEX {k}:l + -",
    "ZREVRANGEBYLEX {k}:l (e [b LIMIT 0 2",
    "ZLEXCOUNT {k}:l - +",
    "ZLEXCOUNT {k}:l [b (e",
    "ZLEXCOUNT {k}:l + -",
    "ZLEXCOUNT {k}:missing - +",
    "! ZRANGEBYLEX {k}:l a +",
    "! ZRANGEBYLEX {k}:l -a +",
    "! ZRANGEBYLEX {k}:l - + WITHSCORES",
    "! ZLEXCOUNT {k}:l b c",
    "ZCOUNT {k}:r -inf +inf",
    "ZCOUNT {k}:r (2 5",
    "ZCOUNT {k}:r 5 2",
    "ZCOUNT {k}:r (5 5",
    "ZCOUNT {k}:missing 0 1",
    "! ZCOUNT {k}:r a 1",
    "! ZCOUNT {k}:r 1",
    "ZRANK {k}:r a",
    "ZRANK {k}:r h",
    "ZRANK {k}:r nobody",
    "ZRANK {k}:missing a",
    "ZREVRANK {k}:r a",
    "ZREVRANK {k}:r h",
    "ZREVRANK {k}:r nobody",
    "! ZRANK {k}:r a WITHSCORE",
];

const REMOVALS: &[&str] = &[
    "ZADD {k}:d 1 a 2 b 3 c 4 d 5 e 6 f 7 g 8 h 9 i",
    "ZREM {k}:d a nobody a",
    "ZREM {k}:missing a",
    "ZREMRANGEBYSCORE {k}:d (2 4",
    "ZREMRANGEBYSCORE {k}:d 100 200",
    "ZREMRANGEBYSCORE {k}:missing -inf +inf",
    "ZRANGE {k}:d 0 -1",
    "ZREMRANGEBYRANK {k}:d 0 0",
    "ZREMRANGEBYRANK {k}:d -2 -1",
    "ZREMRANGEBYRANK {k}:d 5 1",
    "ZREMRANGEBYRANK {k}:d 10 20",
    "ZRANGE {k}:d 0 -1 WITHSCORES",
    "ZADD {k}:d 0 x 0 y 0 z",
    "ZREMRANGEBYLEX {k}:d [x (z",
    "ZREMRANGEBYLEX {k}:d + -",
    "! ZREMRANGEBYSCORE {k}:d x 1",
    "! ZREMRANGEBYRANK {k}:d 0 x",
    "! ZREMRANGEBYLEX {k}:d x y",
    "ZPOPMIN {k}:d",
    "ZPOPMAX {k}:d",
    "ZPOPMIN {k}:d 2",
    "ZPOPMAX {k}:d 0",
    "ZPOPMIN {k}:missing",
    "ZPOPMIN {k}:missing 3",
    "! ZPOPMIN {k}:d -1",
    "! ZPOPMIN {k}:d x",
    "! ZPOPMIN {k}:d 1 2",
    "ZPOPMAX {k}:d 100",
    "EXISTS {k}:d",
    "ZADD {k}:e 1 a 2 b",
    "ZREM {k}:e a b c",
    "EXISTS {k}:e",
    "ZADD {k}:e 1 a 2 b 3 c",
    "ZREMRANGEBYSCORE {k}:e -inf +inf",
    "EXISTS {k}:e",
    "ZADD {k}:e 1 a",
    "ZREMRANGEBYRANK {k}:e 0 -1",
    "TYPE {k}:e",
];

const TYPES: &[&str] = &[
    "SET {k}:s text",
    "! ZADD {k}:s 1 a",
    "! ZINCRBY {k}:s 1 a",
    "! ZREM {k}:s a",
    "! ZCARD {k}:s",
    "! ZSCORE {k}:s a",
    "! ZMSCORE {k}:s a",
    "! ZRANGE {k}:s 0 -1",
    "! ZRANGEBYSCORE {k}:s 0 1",
    "! ZRANGEBYLEX {k}:s - +",
    "! ZCOUNT {k}:s 0 1",
    "! ZLEXCOUNT {k}:s - +",
    "! ZRANK {k}:s a",
    "! ZREMRANGEBYRANK {k}:s 0 1",
    "! ZPOPMIN {k}:s",
    "! ZPOPMIN {k}:s 0",
    // Argument errors come before the type check, as in Redis.
    "! ZADD {k}:s x a",
    "! ZCOUNT {k}:s x 1",
    "! ZRANGE {k}:s 0 -1 LIMIT 0 1",
    "ZADD {k}:z 1 a",
    "! GET {k}:z",
    "! INCR {k}:z",
    "! HSET {k}:z f v",
    "TYPE {k}:z",
    "EXPIRE {k}:z 100",
    "TTL {k}:z",
    "ZADD {k}:z 2 b",
    "TTL {k}:z",
    "PERSIST {k}:z",
    "TTL {k}:z",
    "EXISTS {k}:z",
    "DEL {k}:z",
    "EXISTS {k}:z",
    "ZCARD {k}:z",
    "SET {k}:z again",
    "GET {k}:z",
];

#[tokio::test]
async fn small_sorted_sets_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        for lines in [ZADD_AND_READS, RANGES, REMOVALS, TYPES] {
            run_script(sb, &script(p, lines)).await;
        }
    }))
    .await;
}

#[tokio::test]
async fn large_sorted_sets_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let k = format!("{p}:big");
        // 300 members, scores repeating so members break ties; then the same reads.
        let mut zadd = vec!["ZADD".to_string(), k.clone()];
        for i in 0..300 {
            zadd.push(format!("{}", (i * 7) % 50));
            zadd.push(format!("member:{i:05}"));
        }
        let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
        sb.same(&zadd).await;
        let lines: Vec<String> = [
            "ZCARD {k}",
            "ZRANGE {k} 0 9 WITHSCORES",
            "ZRANGE {k} -10 -1",
            "ZRANGE {k} 140 160 REV WITHSCORES",
            "ZRANGE {k} (10 20 BYSCORE LIMIT 5 10 WITHSCORES",
            "ZRANGE {k} 20 (10 BYSCORE REV LIMIT 5 10",
            "ZRANGEBYSCORE {k} 49 +inf",
            "ZCOUNT {k} 10 (20",
            "ZRANK {k} member:00150",
            "ZREVRANK {k} member:00150",
            "ZSCORE {k} member:00299",
            "ZINCRBY {k} 0.5 member:00010",
            "ZADD {k} GT CH 100 member:00001 -5 member:00002",
            "ZREM {k} member:00003 member:00004 nobody",
            "ZREMRANGEBYRANK {k} 10 19",
            "ZREMRANGEBYSCORE {k} (30 35",
            "ZPOPMIN {k} 3",
            "ZPOPMAX {k}",
            "ZRANGE {k} 0 -1 WITHSCORES",
            "ZREMRANGEBYRANK {k} 0 -1",
            "EXISTS {k}",
        ]
        .iter()
        .map(|l| l.replace("{k}", &k))
        .collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        run_script(sb, &script(p, &lines)).await;
        // Lex ranges over a large set of equal scores.
        let lk = format!("{k}:lex");
        let mut zadd = vec!["ZADD".to_string(), lk.clone()];
        for i in 0..300 {
            zadd.extend(["0".to_string(), format!("member:{i:05}")]);
        }
        let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
        sb.same(&zadd).await;
        for (min, max) in [
            ("[member:00100", "(member:00105"),
            ("-", "(member:00003"),
            ("(member:00290", "+"),
        ] {
            sb.same(&["ZRANGEBYLEX", &lk, min, max]).await;
            sb.same(&["ZREVRANGEBYLEX", &lk, max, min, "LIMIT", "1", "2"])
                .await;
            sb.same(&["ZLEXCOUNT", &lk, min, max]).await;
        }
        sb.same(&["ZREMRANGEBYLEX", &lk, "[member:00010", "[member:00200"])
            .await;
        sb.same(&["ZRANGE", &lk, "0", "20"]).await;
        // A long member in a new set, and scores of every shape, printed the same way.
        let long = "x".repeat(65);
        sb.same(&["ZADD", &format!("{k}:long"), "1", &long, "2", "b"])
            .await;
        sb.same(&["ZRANGE", &format!("{k}:long"), "0", "-1", "WITHSCORES"])
            .await;
        for s in [
            "0.1",
            "3.14159",
            "-1e-300",
            "1e300",
            "123456789012345678",
            "2.5e-7",
        ] {
            sb.same(&["ZADD", &format!("{k}:s"), s, s]).await;
            sb.same(&["ZSCORE", &format!("{k}:s"), s]).await;
        }
        sb.same(&["ZRANGE", &format!("{k}:s"), "0", "-1", "WITHSCORES"])
            .await;
    }))
    .await;
}

fn random_command(rng: &mut Rng, key: &str) -> Vec<String> {
    let member = |rng: &mut Rng| format!("m{}", rng.below(200));
    let score = |rng: &mut Rng| {
        rng.pick(&[
            "1", "2", "-3", "0.5", "10", "+inf", "-inf", "7", "100", "42.25",
        ])
        .to_string()
    };
    let bound = |rng: &mut Rng| {
        rng.pick(&["-inf", "+inf", "0", "(1", "2", "(10", "50", "(0.5", "100"])
            .to_string()
    };
    let lex = |rng: &mut Rng| {
        rng.pick(&["-", "+", "[m1", "(m1", "[m150", "(m5", "[m99"])
            .to_string()
    };
    let idx = |rng: &mut Rng| (rng.below(400) as i64 - 200).to_string();
    let mut c: Vec<String> = Vec::new();
    let k = key.to_string();
    match rng.below(14) {
        0..=3 => {
            c.extend(["ZADD".into(), k]);
            c.extend(
                ["NX", "XX", "GT", "LT", "CH", ""]
                    .iter()
                    .filter(|_| rng.below(4) == 0)
                    .filter(|o| !o.is_empty())
                    .map(|o| o.to_string()),
            );
            for _ in 0..=rng.below(4) {
                c.extend([score(rng), member(rng)]);
            }
        }
        4 => c.extend(["ZINCRBY".into(), k, score(rng), member(rng)]),
        5 => c.extend(["ZREM".into(), k, member(rng), member(rng)]),
        6 => c.extend(["ZRANGE".into(), k, idx(rng), idx(rng), "WITHSCORES".into()]),
        7 => {
            c.extend(["ZRANGE".into(), k, bound(rng), bound(rng), "BYSCORE".into()]);
            if rng.below(2) == 0 {
                c.push("REV".into());
            }
            c.extend(["LIMIT".into(), rng.below(5).to_string(), idx(rng)]);
        }
        // Lex ranges on members of different scores are left unspecified by Redis (its answer
        // depends on its skiplist's random levels): they go to a set of equal scores.
        8 => c.extend(["ZRANGEBYLEX".into(), format!("{k}:lex"), lex(rng), lex(rng)]),
        9 => c.extend(["ZCOUNT".into(), k, bound(rng), bound(rng)]),
        10 => c.extend(["ZRANK".into(), k, member(rng)]),
        11 => c.extend(["ZREMRANGEBYSCORE".into(), k, bound(rng), bound(rng)]),
        12 => c.extend(["ZREMRANGEBYRANK".into(), k, idx(rng), idx(rng)]),
        _ => {
            let pop = rng.pick(&["ZPOPMIN", "ZPOPMAX"]).to_string();
            c.extend([pop, k, rng.below(3).to_string()]);
        }
    }
    c
}

#[tokio::test]
async fn random_commands_answer_as_redis_does() {
    bounded(both_protocols(async |sb: &mut SideBySide, p: &str| {
        let mut rng = Rng(0x5eed_2024 + p.len() as u64);
        let key = format!("{p}:random");
        let mut lex = vec!["ZADD".to_string(), format!("{key}:lex")];
        for i in 0..200 {
            lex.extend(["0".to_string(), format!("m{i}")]);
        }
        let lex: Vec<&str> = lex.iter().map(String::as_str).collect();
        sb.same(&lex).await;
        for _ in 0..3000 {
            let cmd = random_command(&mut rng, &key);
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            sb.same(&args).await;
        }
        sb.same(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]).await;
    }))
    .await;
}

#[tokio::test]
async fn scan_finds_sorted_sets_by_type() {
    bounded(async {
        let node = TestNode::start().await;
        let mut c = node.raw().await;
        for i in 0..20 {
            let k = format!("z{i}");
            assert_eq!(c.cmd(&["ZADD", &k, "1", "a"]).await, Resp::Int(1));
            assert_eq!(
                c.cmd(&["SET", &format!("s{i}"), "v"]).await,
                Resp::Simple("OK".into())
            );
        }
        let mut found = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let reply = c
                .cmd(&["SCAN", &cursor, "TYPE", "zset", "COUNT", "7"])
                .await;
            let parts = reply.as_array();
            cursor = parts[0].as_text();
            found.extend(parts[1].as_array().iter().map(Resp::as_text));
            if cursor == "0" {
                break;
            }
        }
        found.sort();
        let mut want: Vec<String> = (0..20).map(|i| format!("z{i}")).collect();
        want.sort();
        assert_eq!(found, want);
        node.shutdown().await;
    })
    .await;
}
