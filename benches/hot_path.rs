//! Micro-benchmarks of the pieces on a request's hot path: RESP parsing, typed command parsing,
//! reply encoding, the limiter kernels, slot routing, the keyspace, and a batch's trip through a
//! shard thread.
//!
//! Inputs come from a fixed seed, so every run measures the same work:
//!
//! ```sh
//! cargo bench --bench hot_path            # everything, about two minutes
//! cargo bench --bench hot_path -- limiter # one group
//! ```

use bucketd::clock::{Clock, SystemClock};
use bucketd::limiter::cell::{self, CellArgs};
use bucketd::limiter::{self, Rule, State, parse_spec};
use bucketd::slot::key_slot;
use bucketd::testing::{
    ExecStats, KeyCmd, Reply, ReplyWriter, RequestLimits, RuleSet, ShardCore, ShardMsg, ShardStats,
    Store, StoreSlot, StoreValue, encode_reply, execute_key_cmd, parse_command, parse_request,
    shard_channel,
};
use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const SEED: u64 = 0x5eed_b0c4_e7d0_0001;
/// Commands per pipelined read, as in `redis-benchmark -P 16`.
const PIPELINE: usize = 16;
/// Keys in the keyspace benchmarks, as in `redis-benchmark -r 1000000`.
const KEYS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// A fixed "now" (2023-11-14) for the pure kernels.
const EPOCH: u64 = 1_700_000_000 * SEC;

/// splitmix64: small, fast and fully determined by its seed.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        Rng(SEED)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A key of the same shape as redis-benchmark's `bucket:__rand_int__` (19 bytes).
fn bucket_key(i: u64) -> String {
    format!("bucket:{i:012}")
}

/// The requests a gateway sends, by name.
struct RequestScenario {
    name: &'static str,
    args: fn(&str) -> Vec<String>,
}

const REQUESTS: &[RequestScenario] = &[
    RequestScenario {
        name: "cl_throttle",
        args: |k| {
            vec![
                "CL.THROTTLE".into(),
                k.into(),
                "99".into(),
                "10".into(),
                "1".into(),
            ]
        },
    },
    RequestScenario {
        name: "bk_check",
        args: |k| vec!["BK.CHECK".into(), k.into(), "10/1s:100".into()],
    },
    RequestScenario {
        name: "incr",
        args: |k| vec!["INCR".into(), k.into()],
    },
];

fn resp(args: &[String]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// One read's worth of a pipeline: PIPELINE requests of a scenario on random keys.
fn pipeline_bytes(s: &RequestScenario, rng: &mut Rng) -> Vec<u8> {
    (0..PIPELINE)
        .flat_map(|_| resp(&(s.args)(&bucket_key(rng.below(KEYS)))))
        .collect()
}

fn protocol(c: &mut Criterion) {
    let limits = RequestLimits::default();
    let rules = RuleSet::default();
    let mut rng = Rng::new();

    let mut g = c.benchmark_group("parse_request");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    for s in REQUESTS {
        let wire = pipeline_bytes(s, &mut rng);
        g.bench_function(format!("{}_x{PIPELINE}", s.name), |b| {
            b.iter_batched(
                || BytesMut::from(&wire[..]),
                |mut buf| {
                    let mut n = 0;
                    while let Some(req) = parse_request(&mut buf, &limits).expect("valid RESP") {
                        n += req.len();
                    }
                    n
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    // Framing plus the typed command a shard executes.
    let mut g = c.benchmark_group("parse_command");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    for s in REQUESTS {
        let wire = pipeline_bytes(s, &mut rng);
        g.bench_function(format!("{}_x{PIPELINE}", s.name), |b| {
            b.iter_batched(
                || BytesMut::from(&wire[..]),
                |mut buf| {
                    let mut n = 0;
                    while let Some(req) = parse_request(&mut buf, &limits).expect("valid RESP") {
                        if parse_command(req, &rules).is_ok() {
                            n += 1;
                        }
                    }
                    assert_eq!(n, PIPELINE);
                    n
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    let mut g = c.benchmark_group("encode_reply");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    let replies: &[(&str, Vec<Reply>)] = &[
        (
            "limit",
            (0..PIPELINE)
                .map(|i| Reply::Limit([0, 100, 99 - i as i64, -1, 1]))
                .collect(),
        ),
        (
            "int",
            (0..PIPELINE)
                .map(|_| Reply::Int(rng.below(1000) as i64))
                .collect(),
        ),
    ];
    let mut out = Vec::with_capacity(64 * 1024);
    for (name, batch) in replies {
        g.bench_function(format!("{name}_x{PIPELINE}"), |b| {
            b.iter(|| {
                out.clear();
                let mut w = ReplyWriter::new(&mut out, false);
                for r in batch {
                    encode_reply(&mut w, black_box(r));
                }
                out.len()
            })
        });
    }
    g.finish();
}

/// The limits the kernels are measured with, by name.
const RULES: &[(&str, &str)] = &[
    ("gcra", "10/1s:100"),
    ("sliding", "sliding:100/1m"),
    ("fixed", "fixed:100/1m"),
];

/// Buckets the kernel benchmarks cycle through, and the steps between requests.
const LANES: usize = 1024;

fn limiter_kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("limiter");
    let mut rng = Rng::new();
    // Gaps between requests to the same bucket: 0 to 50 ms, so buckets drain and refill.
    let gaps: Vec<u64> = (0..LANES).map(|_| rng.below(50_000_000)).collect();
    for (name, spec) in RULES {
        let rule: Rule = parse_spec(spec).expect("valid spec");
        g.bench_function(format!("check/{name}"), |b| {
            let mut states: Vec<Option<State>> = vec![None; LANES];
            let mut now = EPOCH;
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % LANES;
                now += gaps[i];
                let out = limiter::check(&rule, states[i], 1, black_box(now));
                if out.new_state.is_some() {
                    states[i] = out.new_state;
                }
                out.decision.allowed
            })
        });
    }
    let args = CellArgs {
        max_burst: 99,
        count: 10,
        period_s: 1,
        quantity: 1,
    };
    g.bench_function("cell_throttle", |b| {
        let mut tats: Vec<Option<u64>> = vec![None; LANES];
        let mut now = EPOCH;
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % LANES;
            now += gaps[i];
            let out = cell::throttle(tats[i], black_box(&args), black_box(now));
            match out.write {
                cell::CellWrite::Store { tat, .. } => tats[i] = Some(tat),
                cell::CellWrite::Remove => tats[i] = None,
                cell::CellWrite::Keep => {}
            }
            out.reply.map_or(-1, |r| r[0])
        })
    });
    g.finish();
}

/// Makes the i-th key of a key shape.
type KeyShape = fn(u64) -> String;

fn routing(c: &mut Criterion) {
    let mut rng = Rng::new();
    let shapes: &[(&str, KeyShape)] = &[
        ("bucket_19b", bucket_key),
        ("hash_tag", |i| format!("user:{{{i}}}:minute")),
        ("long_64b", |i| {
            format!("{:0>64}", format!("tenant:acme:route:/v1/items:{i}"))
        }),
    ];
    let mut g = c.benchmark_group("key_slot");
    for (name, make) in shapes {
        let keys: Vec<Vec<u8>> = (0..LANES)
            .map(|_| make(rng.below(KEYS)).into_bytes())
            .collect();
        g.bench_function(*name, |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % LANES;
                key_slot(black_box(&keys[i]))
            })
        });
    }
    g.finish();
}

/// A store holding KEYS GCRA buckets, as the CL.THROTTLE load of compare.sh leaves it.
fn full_store(keys: &[Bytes]) -> Store {
    let mut store = Store::new(0, 0);
    let args = CellArgs {
        max_burst: 99,
        count: 10,
        period_s: 3600,
        quantity: 1,
    };
    let mut st = ExecStats::default();
    for k in keys {
        execute_key_cmd(
            &mut store,
            &KeyCmd::Throttle {
                key: k.clone(),
                args,
            },
            EPOCH,
            &mut st,
        );
    }
    store
}

fn keyspace(c: &mut Criterion) {
    let keys: Vec<Bytes> = (1..=KEYS).map(|i| Bytes::from(bucket_key(i))).collect();
    let mut store = full_store(&keys);
    assert_eq!(store.len(), KEYS as usize);
    let mut rng = Rng::new();
    let order: Vec<usize> = (0..64 * 1024).map(|_| rng.below(KEYS) as usize).collect();
    let now = EPOCH + SEC;

    let mut g = c.benchmark_group("store_1m");
    g.bench_function("slot_update", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % order.len();
            match store.slot(&keys[order[i]], now) {
                StoreSlot::Live(mut live) => {
                    let tat = match live.get().value {
                        StoreValue::Bucket(State::Gcra { tat }) => tat,
                        _ => now,
                    };
                    let next = tat + 1;
                    live.set(StoreValue::Bucket(State::Gcra { tat: next }), next);
                    true
                }
                StoreSlot::Empty(_) => false,
            }
        })
    });
    g.bench_function("slot_insert_remove", |b| {
        let fresh: Vec<Vec<u8>> = (0..1024)
            .map(|i| bucket_key(KEYS + 1 + i).into_bytes())
            .collect();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % fresh.len();
            let key = &fresh[i];
            if let StoreSlot::Empty(empty) = store.slot(key, now) {
                let tat = now + SEC;
                empty
                    .insert(StoreValue::Bucket(State::Gcra { tat }), tat)
                    .expect("no cap");
            }
            if let StoreSlot::Live(live) = store.slot(key, now) {
                live.remove();
            }
        })
    });
    g.bench_function("execute_cl_throttle", |b| {
        let args = CellArgs {
            max_burst: 99,
            count: 10,
            period_s: 1,
            quantity: 1,
        };
        let mut st = ExecStats::default();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % order.len();
            let cmd = KeyCmd::Throttle {
                key: keys[order[i]].clone(),
                args,
            };
            execute_key_cmd(&mut store, &cmd, now, &mut st)
        })
    });
    g.finish();
}

fn throttle_batch(keys: &[Bytes], rng: &mut Rng) -> Vec<KeyCmd> {
    throttle_batch_of(PIPELINE, keys, rng)
}

/// A batch as a shard applies one round (or one Raft entry) of many clients' commands.
const ROUND: usize = 128;

fn throttle_batch_of(n: usize, keys: &[Bytes], rng: &mut Rng) -> Vec<KeyCmd> {
    let args = CellArgs {
        max_burst: 99,
        count: 10,
        period_s: 1,
        quantity: 1,
    };
    (0..n)
        .map(|_| KeyCmd::Throttle {
            key: keys[rng.below(keys.len() as u64) as usize].clone(),
            args,
        })
        .collect()
}

fn shard_hop(c: &mut Criterion) {
    let keys: Vec<Bytes> = (1..=KEYS).map(|i| Bytes::from(bucket_key(i))).collect();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);

    // A shard thread running the same loop shape as the server's: drain the inbox, apply each
    // batch on the core, answer over the oneshot.
    let (handle, inbox) = shard_channel(0);
    let remote_store = full_store(&keys);
    let (stats, remote_clock) = (handle.stats.clone(), clock.clone());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("shard runtime");
        let mut core = ShardCore::new(0, remote_store, remote_clock, stats);
        rt.block_on(async move {
            while let Some(msg) = inbox.recv().await {
                match msg {
                    ShardMsg::Batch {
                        cmds,
                        budget,
                        reply,
                    } => {
                        let _ = reply.send(core.apply_batch(cmds, budget));
                    }
                    ShardMsg::Stop => break,
                    _ => {}
                }
            }
        });
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");

    let mut local = ShardCore::new(1, full_store(&keys), clock, Arc::new(ShardStats::default()));
    let mut rng = Rng::new();

    let mut g = c.benchmark_group("shard_batch");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    g.bench_function(format!("inline_x{PIPELINE}"), |b| {
        b.iter_batched(
            || throttle_batch(&keys, &mut rng),
            |cmds| local.apply_batch_local(cmds),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Elements(ROUND as u64));
    g.bench_function(format!("prefetched_x{ROUND}"), |b| {
        b.iter_batched(
            || throttle_batch_of(ROUND, &keys, &mut rng),
            |cmds| local.apply_within(cmds, usize::MAX),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Elements(PIPELINE as u64));
    g.bench_function(format!("cross_thread_x{PIPELINE}"), |b| {
        b.iter_batched(
            || throttle_batch(&keys, &mut rng),
            |cmds| rt.block_on(handle.call(cmds)).expect("shard running"),
            BatchSize::SmallInput,
        )
    });
    g.finish();

    handle.stop();
    thread.join().expect("shard thread");
}

/// Commands per Raft entry under `redis-benchmark --cluster -P 16 -c 50` (about 265 measured).
const ENTRY_COMMANDS: usize = 256;

/// A follower's decoding of an append from its leader: one entry of `ENTRY_COMMANDS` checks.
fn replication(c: &mut Criterion) {
    use bucketd::testing::{
        LogEntry, Origin, PeerFrame, Proposal, Rpc, SetCond, SetExpiry, TypeConfig, Vote,
        decode_peer_frame,
    };
    use openraft::entry::RaftEntry;
    let lid = |i| openraft::testing::log_id::<TypeConfig>(3, 1, i);
    // An append as a leader sends it: one entry of `cmds`.
    let append = |cmds: Vec<KeyCmd>| {
        let origin = Some(Origin { run: 7, seq: 1234 });
        let frame = PeerFrame::Request {
            id: 99,
            group: 5,
            rpc: Rpc::Append(openraft::raft::AppendEntriesRequest {
                vote: Vote::new_committed(3, 1),
                prev_log_id: Some(lid(123_455)),
                entries: vec![LogEntry::new_normal(
                    lid(123_456),
                    Proposal::new(EPOCH, origin, cmds),
                )],
                leader_commit: Some(lid(123_450)),
            }),
        };
        bincode::serde::encode_to_vec(&frame, bincode::config::standard()).expect("encodable frame")
    };
    let keys: Vec<Bytes> = (1..=KEYS)
        .map(|i| Bytes::from(format!("bucket:{{tag}}:{i:012}")))
        .collect();
    let mut rng = Rng::new();
    let checks = append(throttle_batch_of(ENTRY_COMMANDS, &keys, &mut rng));
    // The same append with plain SETs, commands that are decoded through serde.
    let sets = append(
        keys.iter()
            .take(ENTRY_COMMANDS)
            .map(|key| KeyCmd::Set {
                key: key.clone(),
                value: Bytes::from_static(b"1"),
                expiry: SetExpiry::In(60_000),
                cond: SetCond::Always,
                get: false,
            })
            .collect(),
    );
    let mut g = c.benchmark_group("replication");
    g.throughput(Throughput::Elements(ENTRY_COMMANDS as u64));
    for (name, bytes) in [("decode_append", &checks), ("decode_append_set", &sets)] {
        g.bench_function(format!("{name}_x{ENTRY_COMMANDS}"), |b| {
            b.iter(|| decode_peer_frame(black_box(bytes)).expect("decodable frame"))
        });
    }
    g.finish();
}

criterion_group! {
    name = hot_path;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = protocol, limiter_kernels, routing, keyspace, shard_hop, replication
}
criterion_main!(hot_path);
