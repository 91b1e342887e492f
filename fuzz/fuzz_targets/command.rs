//! Command parsing and execution: the input is a pipelined client stream. Each request goes
//! through the command table's parser (arity, keywords, numbers, limit specs and rule names)
//! as a connection's would; a key command is then run against an in-memory keyspace at a
//! fixed clock, its reply written out in RESP2 and RESP3, and the command itself put through
//! the Raft log's encoding and back, as a replica would receive it.
#![no_main]
use bucketd::testing::{
    ExecStats, KeyCmd, Parsed, ReplyWriter, RequestLimits, RuleSet, Store, encode_reply,
    execute_key_cmd, parse_command, parse_request,
};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// 2023-11-14T22:13:20Z, in ns: a fixed, realistic now.
const EPOCH_NS: u64 = 1_700_000_000 * 1_000_000_000;

fn rules() -> &'static RuleSet {
    static RULES: OnceLock<RuleSet> = OnceLock::new();
    RULES.get_or_init(|| {
        RuleSet::parse_toml("[rules]\napi = \"100/1m\"\nlogin = \"5/10s\"\n")
            .expect("the harness's rules parse")
    })
}

fn round_trip(cmd: &KeyCmd) {
    let cfg = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(cmd, cfg).expect("a command encodes");
    let (back, used): (KeyCmd, usize) =
        bincode::serde::decode_from_slice(&bytes, cfg).expect("an encoded command decodes");
    assert_eq!(used, bytes.len());
    let again = bincode::serde::encode_to_vec(&back, cfg).expect("a command encodes");
    assert_eq!(bytes, again, "{cmd:?} changed on its way through the log");
}

fn run(store: &mut Store, cmd: &KeyCmd, now: u64) {
    round_trip(cmd);
    let mut stats = ExecStats::default();
    let reply = execute_key_cmd(store, cmd, now, &mut stats);
    for resp3 in [false, true] {
        let mut out = Vec::new();
        encode_reply(&mut ReplyWriter::new(&mut out, resp3), &reply);
        assert!(!out.is_empty());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    // A small keyspace, so the key and memory caps are reached too.
    let mut store = Store::new(64, 64 << 10);
    let mut now = EPOCH_NS;
    while let Ok(Some(req)) = parse_request(&mut buf, &RequestLimits::default()) {
        if req.is_empty() {
            continue;
        }
        // Each command a little later than the one before, so windows and TTLs move.
        now += 250_000_000;
        match parse_command(req, rules()) {
            Ok(Parsed::Keyed(cmd)) => run(&mut store, &cmd, now),
            Ok(Parsed::Multi(multi)) => {
                assert!(!multi.keys().is_empty());
                run(&mut store, &multi.into_key_cmd(), now);
            }
            Ok(Parsed::Node(..)) | Err(_) => {}
        }
    }
});
