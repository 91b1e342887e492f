//! Writes the seed corpora under `fuzz/corpus/<target>/` from the node's own encoders: client
//! streams as clients send them, a `log.bin` written by the node's Raft log writer, and peer
//! frames encoded from the transport's frame type. Run from `fuzz/`:
//! `cargo run --example seeds`.
use bucketd::testing::{
    KeyCmd, LogEntry, LogId, NodeLog, Parsed, PeerError, PeerFrame, Proposal, Reply, Request, Rpc,
    RpcOk, RuleSet, TypeConfig, Vote, decode_peer_frame, parse_command, replay_len,
};

use openraft::Membership;
use openraft::entry::RaftEntry;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn multibulk(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

fn pipeline(cmds: &[&[&str]]) -> Vec<u8> {
    cmds.iter().flat_map(|c| multibulk(c)).collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// Client streams: what `command` takes as is, and `resp_request` after its two bytes of
/// flags and cut count (authenticated, default limits, two cuts).
fn client_streams() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("ping", multibulk(&["PING"])),
        (
            "set_get",
            pipeline(&[
                &["SET", "k", "hello", "PX", "1500", "NX"],
                &["GET", "k"],
                &["INCRBY", "n", "7"],
                &["EXPIRE", "n", "10", "GT"],
                &["PTTL", "n"],
                &["MSET", "a", "1", "b", "2"],
                &["MGET", "a", "b", "c"],
                &["DEL", "a", "b"],
            ]),
        ),
        (
            "limits",
            pipeline(&[
                &["BK.CHECK", "user:1", "5/1m"],
                &["BK.CHECK", "user:1", "api", "COST", "2"],
                &["BK.CHECK", "new:0", "5/1m", "PEEK"],
                &["BK.CHECKALL", "2", "u3", "u4", "api", "login"],
                &["BK.LEASE", "hot", "100/1m", "10"],
                &["BK.RESET", "user:1", "api"],
                &["CL.THROTTLE", "cell", "15", "30", "60", "1"],
            ]),
        ),
        (
            "hashes",
            pipeline(&[
                &["HSET", "h", "tokens", "10", "ts", "1700000000000"],
                &["HINCRBY", "h", "tokens", "-3"],
                &["HINCRBYFLOAT", "h", "tokens", "0.5"],
                &["HMGET", "h", "tokens", "ts", "x"],
                &["HGETALL", "h"],
                &["HDEL", "h", "tokens", "ts"],
            ]),
        ),
        (
            "inline",
            b"PING\r\nSET k \"a b\\x41\" 'c d'\nGETEX k PERSIST\r\n\r\n".to_vec(),
        ),
        (
            "mixed",
            [
                multibulk(&["INCRBYFLOAT", "f", "1.5e3"]),
                b"TTL f\r\n".to_vec(),
                multibulk(&["GETSET", "f", ""]),
                b"*0\r\n".to_vec(),
            ]
            .concat(),
        ),
    ]
}

fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, 1, index)
}

/// Key commands as the command table parses them from client arguments.
fn key_cmds() -> Vec<KeyCmd> {
    let rules = RuleSet::parse_toml("[rules]\napi = \"100/1m\"\n").unwrap();
    let reqs: &[&[&str]] = &[
        &["SET", "k", "v", "EX", "60"],
        &["INCRBY", "n", "3"],
        &["BK.CHECK", "user:7", "api", "COST", "2"],
        &["CL.THROTTLE", "cell", "15", "30", "60"],
        &["BK.CHECKALL", "2", "a", "b", "5/1s", "10/1m"],
        &["HSET", "h", "f", "v", "g", "1"],
        &["HINCRBYFLOAT", "h", "g", "2.5"],
    ];
    reqs.iter()
        .map(
            |args| match parse_command(Request::from_args(args), &rules) {
                Ok(Parsed::Keyed(cmd)) => cmd,
                Ok(Parsed::Multi(m)) => m.into_key_cmd(),
                _ => panic!("{args:?} is not a key command"),
            },
        )
        .collect()
}

fn normal(term: u64, index: u64, cmds: Vec<KeyCmd>) -> LogEntry {
    LogEntry::new_normal(
        log_id(term, index),
        Proposal::new(1_700_000_000_000_000_000 + index, None, cmds),
    )
}

fn membership(term: u64, index: u64) -> LogEntry {
    let voters: BTreeSet<u64> = [1, 2, 3].into_iter().collect();
    LogEntry::new_membership(
        log_id(term, index),
        Membership::new_with_defaults(vec![voters], []),
    )
}

/// A `log.bin` as the node writes it: several groups' entries, votes, a truncation, a purge.
async fn log_file(scratch: &Path) -> Vec<u8> {
    let _ = std::fs::remove_dir_all(scratch);
    {
        let log = NodeLog::open(Some(scratch.to_path_buf()), false).unwrap();
        let append = |g: u32, entries: Vec<LogEntry>| {
            let mut store = log.group(g);
            async move {
                let (tx, rx) = TypeConfig::oneshot();
                store.append(entries, IOFlushed::signal(tx)).await.unwrap();
                rx.await.unwrap().unwrap();
            }
        };
        let cmds = key_cmds();
        append(1, vec![membership(1, 1), LogEntry::new_blank(log_id(1, 2))]).await;
        append(2, vec![membership(1, 1), normal(1, 2, cmds[..2].to_vec())]).await;
        append(1, vec![normal(1, 3, cmds[2..].to_vec())]).await;
        log.group(1)
            .save_vote(&Vote::new_committed(1, 1))
            .await
            .unwrap();
        log.group(2).save_vote(&Vote::new(2, 3)).await.unwrap();
        log.group(2)
            .truncate_after(Some(log_id(1, 1)))
            .await
            .unwrap();
        log.group(1).purge(log_id(1, 1)).await.unwrap();
        log.group(2)
            .save_committed(Some(log_id(1, 1)))
            .await
            .unwrap();
    }
    let bytes = std::fs::read(scratch.join("log.bin")).unwrap();
    std::fs::remove_dir_all(scratch).unwrap();
    bytes
}

fn peer_frames() -> Vec<(&'static str, PeerFrame)> {
    let cmds = key_cmds();
    vec![
        (
            "append",
            PeerFrame::Request {
                id: 1,
                group: 4,
                rpc: Rpc::Append(AppendEntriesRequest {
                    vote: Vote::new_committed(2, 1),
                    prev_log_id: Some(log_id(2, 9)),
                    entries: vec![membership(2, 10), normal(2, 11, cmds.clone())],
                    leader_commit: Some(log_id(2, 9)),
                }),
            },
        ),
        (
            "vote",
            PeerFrame::Request {
                id: 2,
                group: 1,
                rpc: Rpc::Vote(VoteRequest::new(Vote::new(3, 2), Some(log_id(2, 11)))),
            },
        ),
        (
            "forward",
            PeerFrame::Request {
                id: 3,
                group: 7,
                rpc: Rpc::Forward(cmds),
            },
        ),
        (
            "forward_answer",
            PeerFrame::Response {
                id: 3,
                result: Ok(RpcOk::Forward(vec![
                    Reply::Ok,
                    Reply::Int(4),
                    Reply::Bulk(bytes::Bytes::from_static(b"v")),
                ])),
            },
        ),
        (
            "no_replica",
            PeerFrame::Response {
                id: 9,
                result: Err(PeerError::NoReplica(5)),
            },
        ),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");

    for (name, stream) in client_streams() {
        write(&corpus.join("command"), name, &stream);
        let mut framed = vec![1, 2, 60, 180];
        framed.extend_from_slice(&stream);
        write(&corpus.join("resp_request"), name, &framed);
    }

    let log =
        log_file(&std::env::temp_dir().join(format!("bucketd-seeds-{}", std::process::id()))).await;
    assert_eq!(replay_len(&log).unwrap(), log.len() as u64);
    // Mode 0: the file as it is; and with a torn last record.
    write(
        &corpus.join("log_record"),
        "log",
        &[&[0][..], &log].concat(),
    );
    write(
        &corpus.join("log_record"),
        "torn",
        &[&[0][..], &log[..log.len() - 3]].concat(),
    );
    // Mode 1: the payloads alone, for the harness to frame.
    let mut payloads = vec![1u8];
    let mut pos = 0;
    while pos < log.len() {
        let len = u32::from_le_bytes(log[pos..pos + 4].try_into().unwrap()) as usize;
        let payload = &log[pos + 12..pos + 12 + len];
        if len < 256 {
            payloads.push(len as u8);
            payloads.extend_from_slice(payload);
        }
        pos += 12 + len;
    }
    write(&corpus.join("log_record"), "payloads", &payloads);

    for (name, frame) in peer_frames() {
        let body = bincode::serde::encode_to_vec(&frame, bincode::config::standard()).unwrap();
        assert!(decode_peer_frame(&body).is_ok(), "{name} does not decode");
        write(&corpus.join("peer_frame"), name, &body);
    }
    println!("seeds written under {}", corpus.display());
}
