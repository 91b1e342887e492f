//! How a peer message is written as bytes and read back: `PeerFrame`s in bincode
//! (`bincode::config::standard()`), framed by `frame`.
//!
//! An append's entries travel as the bytes the leader's log wrote for them, and a follower
//! keeps each entry's bytes as they arrived, so an entry is encoded once on its way through
//! the cluster.

use super::frame::{self, MESSAGE_CAP, MessageTooLarge, ReadError, encode_with};
use super::message::{PeerFrame, Rpc};
use crate::cluster::decode_bounded;
use crate::cluster::typ::{Entry, GroupId, LogId, Vote, set_wire, wire_of};
use openraft::raft::AppendEntriesRequest;
use serde::Serialize;
use tokio::io::AsyncRead;

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// bincode refused a value, in its words.
    Bincode(String),
    /// The message takes this many bytes, more than a peer takes (`frame::MESSAGE_CAP`).
    TooLarge(usize),
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EncodeError::Bincode(e) => f.write_str(e),
            EncodeError::TooLarge(len) => {
                write!(f, "message of {len} bytes is larger than a peer takes")
            }
        }
    }
}

impl std::error::Error for EncodeError {}

impl From<MessageTooLarge> for EncodeError {
    fn from(e: MessageTooLarge) -> EncodeError {
        EncodeError::TooLarge(e.0)
    }
}

/// Appends `frame` to `out` as one message: one length-prefixed frame, or several when it is
/// larger than `FRAME_CAP`.
pub(super) fn encode(frame: &PeerFrame, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode_with(out, |out| put(out, frame))
}

/// Appends one value's bincode encoding to `out`.
fn put(out: &mut Vec<u8>, value: impl Serialize) -> Result<(), EncodeError> {
    bincode::serde::encode_into_std_write(value, out, bincode::config::standard())
        .map(drop)
        .map_err(|e| EncodeError::Bincode(e.to_string()))
}

/// The variant numbers bincode gives `PeerFrame::Request` and `Rpc::Append` (their places in
/// their enums).
const REQUEST_VARIANT: u32 = 0;
const APPEND_VARIANT: u32 = 0;

/// Appends a request to `out` as `encode` does. An append's entries that carry their encoding
/// (`Proposal::wire`, the leader's log wrote it) are copied from it rather than encoded again
/// for each follower; the bytes are the same either way, since bincode writes an enum's
/// variant number and then its fields one after the other, with nothing around them.
pub(super) fn encode_request(
    id: u64,
    group: GroupId,
    rpc: Rpc,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let Rpc::Append(req) = &rpc else {
        return encode(&PeerFrame::Request { id, group, rpc }, out);
    };
    encode_with(out, |out| {
        put(out, (REQUEST_VARIANT, id, group, APPEND_VARIANT))?;
        put(out, (&req.vote, &req.prev_log_id, req.entries.len() as u64))?;
        for entry in &req.entries {
            match wire_of(entry) {
                Some(bytes) => out.extend_from_slice(bytes),
                None => put(out, entry)?,
            }
        }
        put(out, req.leader_commit)
    })
}

/// About how many bytes `rpc` takes framed, so that the buffer it is encoded into is made
/// once rather than regrown by doubling (an append at pipeline 16 is about ten KiB).
pub(super) fn size_hint(rpc: &Rpc) -> usize {
    match rpc {
        Rpc::Append(req) => req
            .entries
            .iter()
            .map(|e| wire_of(e).map_or(ENTRY_GUESS, |w| w.len()))
            .fold(64, usize::saturating_add)
            .min(MESSAGE_CAP),
        _ => 128,
    }
}

/// What an entry whose encoding is not at hand is guessed to take.
const ENTRY_GUESS: usize = 256;

/// Decodes a message's bytes (what its frames carried), refusing lengths the bytes cannot
/// hold.
pub fn decode_peer_frame(bytes: &[u8]) -> Result<PeerFrame, bincode::error::DecodeError> {
    if let Ok(((REQUEST_VARIANT, id, group, APPEND_VARIANT), at)) =
        decode_bounded::<(u32, u64, GroupId, u32)>(bytes)
    {
        return decode_append(bytes, at, id, group);
    }
    decode_bounded(bytes).map(|(f, _)| f)
}

/// How many entries to make room for ahead of decoding an append that announces `n` of them
/// with `left` bytes to go: no more than the bytes could hold (an entry takes at least one
/// byte) and no more than 1 MiB of entries, as serde does for a sequence. A count beyond what
/// the bytes hold fails once they end.
fn entries_room(n: u64, left: usize) -> usize {
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .min(left)
        .min((1 << 20) / std::mem::size_of::<Entry>().max(1))
}

/// The rest of an append request (from `at` in `bytes`), decoded piece by piece so that each
/// entry keeps the bytes it came in (`Proposal::wire`): the follower's log writes those
/// rather than encoding the entry again, and keeps only those once the entry is applied. The
/// entries' bytes are copied out of the frame once, all together, and each entry's strings
/// are views into them rather than copies of their own.
fn decode_append(
    bytes: &[u8],
    mut at: usize,
    id: u64,
    group: GroupId,
) -> Result<PeerFrame, bincode::error::DecodeError> {
    let rest = |at: usize| bytes.get(at..).unwrap_or_default();
    let ((vote, prev_log_id, n), used): ((Vote, Option<LogId>, u64), usize) =
        decode_bounded(rest(at))?;
    at += used;
    let mut entries = Vec::with_capacity(entries_room(n, bytes.len().saturating_sub(at)));
    let region = bytes::Bytes::copy_from_slice(rest(at));
    let mut from = 0;
    for _ in 0..n {
        let (mut entry, used) = crate::cluster::entry_decode::decode_entry(&region, from)?;
        set_wire(&mut entry, Some(region.slice(from..from + used)));
        from += used;
        entries.push(entry);
    }
    let (leader_commit, _) = decode_bounded(region.get(from..).unwrap_or_default())?;
    Ok(PeerFrame::Request {
        id,
        group,
        rpc: Rpc::Append(AppendEntriesRequest {
            vote,
            prev_log_id,
            entries,
            leader_commit,
        }),
    })
}

/// Reads one message (one frame, or several) and decodes it.
pub(super) async fn read_frame(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<PeerFrame, ReadError> {
    frame::read_message(r, buf).await?;
    decode_peer_frame(buf).map_err(ReadError::Decode)
}

#[cfg(test)]
mod tests {
    use super::super::message::{GroupSnapshotWire, PeerError, RpcOk, ScriptsChange};
    use super::*;
    use crate::cluster::errors::ProposeError;
    use crate::cluster::quiet::VoteRefusal;
    use crate::cluster::typ::TypeConfig;
    use crate::cmd::{KeyCmd, Reply};
    use openraft::raft::{
        AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, VoteRequest, VoteResponse,
    };

    fn wired_append() -> (AppendEntriesRequest<TypeConfig>, Vec<Vec<u8>>) {
        use crate::cluster::typ::Proposal;
        use openraft::entry::RaftEntry;
        let lid = |i| openraft::testing::log_id::<TypeConfig>(2, 1, i);
        let cmds = |k: &str| {
            vec![KeyCmd::IncrBy {
                key: bytes::Bytes::from(k.to_string()),
                delta: 3,
            }]
        };
        let entries = vec![
            Entry::new_normal(lid(5), Proposal::new(7, None, cmds("a"))),
            Entry::new_blank(lid(6)),
            Entry::new_normal(lid(7), Proposal::new(8, None, cmds("b"))),
        ];
        let plain: Vec<Vec<u8>> = entries
            .iter()
            .map(|e| bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap())
            .collect();
        let req = AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(lid(4)),
            entries,
            leader_commit: Some(lid(3)),
        };
        (req, plain)
    }

    /// An append whose entries carry their encoding (as the leader's log leaves them) is sent
    /// as exactly the bytes of the whole request encoded, and those bytes are copied, not
    /// encoded again; the follower gets each entry back with the bytes it came in.
    #[test]
    fn appends_carry_each_entry_as_encoded_once() {
        let (mut req, plain) = wired_append();
        let mut whole = Vec::new();
        encode(
            &PeerFrame::Request {
                id: 11,
                group: 4,
                rpc: Rpc::Append(req.clone()),
            },
            &mut whole,
        )
        .unwrap();
        // The first entry carries its encoding, the third does not: both ways give the same
        // bytes.
        set_wire(&mut req.entries[0], Some(plain[0].clone().into()));
        let mut spliced = Vec::new();
        encode_request(11, 4, Rpc::Append(req.clone()), &mut spliced).unwrap();
        assert_eq!(spliced, whole);

        let PeerFrame::Request { id, group, rpc } = decode_peer_frame(&spliced[4..]).unwrap()
        else {
            panic!("a request");
        };
        let Rpc::Append(back) = rpc else {
            panic!("an append")
        };
        assert_eq!((id, group), (11, 4));
        assert_eq!(back.vote, req.vote);
        assert_eq!(back.prev_log_id, req.prev_log_id);
        assert_eq!(back.leader_commit, req.leader_commit);
        assert_eq!(back.entries.len(), 3);
        for (i, e) in back.entries.iter().enumerate() {
            // A normal entry arrives decoded, with the bytes it came in; held as those bytes
            // alone, it refuses to be encoded anew, and decodes to the entry sent.
            let mut held = e.clone();
            crate::cluster::typ::keep_bytes_only(&mut held);
            assert_eq!(
                crate::cluster::typ::is_bytes_only(&held),
                i != 1,
                "entry {i}"
            );
            let as_held = bincode::serde::encode_to_vec(&held, bincode::config::standard());
            assert_eq!(as_held.is_err(), i != 1, "entry {i}");
            let full = crate::cluster::entry_decode::decoded(held).unwrap();
            assert!(!crate::cluster::typ::is_bytes_only(&full));
            let again = bincode::serde::encode_to_vec(&full, bincode::config::standard()).unwrap();
            assert_eq!(again, plain[i], "entry {i}");
            let arrived = bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap();
            assert_eq!(arrived, plain[i], "entry {i}");
            // Its keys are views into its bytes, not copies, as it arrived and decoded again.
            let mut viewed = 0;
            for x in [e, &full] {
                if let (openraft::EntryPayload::Normal(p), Some(wire)) =
                    (&x.payload, crate::cluster::typ::wire_of(x))
                {
                    let within = wire.as_ptr_range();
                    for key in p.cmds.iter().filter_map(KeyCmd::single_key) {
                        assert!(within.contains(&key.as_ptr()), "entry {i}");
                        viewed += 1;
                    }
                    assert_eq!(p.cmds.len(), 1, "entry {i}");
                }
            }
            assert_eq!(viewed, if i == 1 { 0 } else { 2 }, "entry {i}");
            // A blank entry has nowhere to keep bytes; a normal one keeps what it came in.
            let kept = crate::cluster::typ::wire_of(e).map(|b| b.to_vec());
            assert_eq!(kept, (i != 1).then(|| plain[i].clone()), "entry {i}");
        }

        // The carried bytes are what is sent: an entry carrying another's encoding arrives
        // as that other entry.
        set_wire(&mut req.entries[0], Some(plain[2].clone().into()));
        let mut swapped = Vec::new();
        encode_request(11, 4, Rpc::Append(req), &mut swapped).unwrap();
        let Ok(PeerFrame::Request {
            rpc: Rpc::Append(back),
            ..
        }) = decode_peer_frame(&swapped[4..])
        else {
            panic!("an append");
        };
        assert_eq!(back.entries[0].log_id.index, 7);
    }

    /// An append announcing more entries than its bytes hold is refused, without room made
    /// for the count it announced.
    #[test]
    fn an_append_announcing_more_entries_than_it_holds_is_refused() {
        let (req, _) = wired_append();
        let mut bytes = Vec::new();
        put(&mut bytes, (REQUEST_VARIANT, 1u64, 2u32, APPEND_VARIANT)).unwrap();
        put(&mut bytes, (&req.vote, &req.prev_log_id, u64::MAX)).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        assert!(decode_peer_frame(&bytes).is_err());
        // However large the message, no more than 1 MiB of entries is set aside for the count.
        let most = (1 << 20) / std::mem::size_of::<Entry>();
        assert_eq!(entries_room(u64::MAX, MESSAGE_CAP), most);
        assert_eq!(entries_room(u64::MAX, 3), 3);
        assert_eq!(entries_room(2, MESSAGE_CAP), 2);
        // Cut anywhere, a real append is refused too.
        let mut whole = Vec::new();
        encode_request(1, 2, Rpc::Append(req), &mut whole).unwrap();
        for end in 4..whole.len() {
            assert!(decode_peer_frame(&whole[4..end]).is_err(), "cut at {end}");
        }
    }

    /// Every kind of message, as the bytes it goes out as (framed): nodes of one cluster
    /// speak this format to each other, so it changes only with a new protocol version.
    #[test]
    fn peer_frames_keep_their_encoding() {
        use crate::cluster::quiet::{Ping, PingAck};
        use crate::cluster::typ::SnapshotMeta;
        let vote = Vote::new_committed(2, 1);
        let lid = |i| openraft::testing::log_id::<TypeConfig>(2, 1, i);
        let (append, _) = wired_append();
        let req = |rpc| PeerFrame::Request {
            id: 300,
            group: 7,
            rpc,
        };
        let ok = |r| PeerFrame::Response {
            id: 300,
            result: Ok(r),
        };
        let err = |e| PeerFrame::Response {
            id: 300,
            result: Err(e),
        };
        let frames = [
            req(Rpc::Append(append)),
            req(Rpc::Vote(VoteRequest::new(vote, Some(lid(4))))),
            req(Rpc::PreVote(VoteRequest::new(vote, None))),
            req(Rpc::Snapshot {
                vote,
                snapshot: GroupSnapshotWire {
                    meta: SnapshotMeta::default(),
                    data: vec![1, 2, 3],
                },
            }),
            req(Rpc::TransferLeader(TransferLeaderRequest::new(
                vote,
                3,
                Some(lid(9)),
            ))),
            req(Rpc::Forward(vec![KeyCmd::IncrBy {
                key: bytes::Bytes::from_static(b"k"),
                delta: -2,
            }])),
            req(Rpc::Ping(Ping {
                from: 1,
                quiet: vec![(2, 5)],
                leads: vec![(3, 6)],
            })),
            req(Rpc::Scripts(ScriptsChange::Load(b"return 1".to_vec()))),
            req(Rpc::Scripts(ScriptsChange::Flush)),
            ok(RpcOk::Append(AppendEntriesResponse::Success)),
            ok(RpcOk::Vote(VoteResponse {
                vote,
                vote_granted: true,
                last_log_id: Some(lid(4)),
            })),
            ok(RpcOk::Snapshot(SnapshotResponse::new(vote))),
            ok(RpcOk::TransferLeader(Ok(()))),
            ok(RpcOk::Forward(vec![Reply::Int(7)])),
            ok(RpcOk::Ping(PingAck { promised: vec![2] })),
            ok(RpcOk::Scripts),
            err(PeerError::Refused(ProposeError::Moved(3))),
            err(PeerError::Refused(ProposeError::ClusterDown)),
            err(PeerError::Refused(ProposeError::TryAgain("t".into()))),
            err(PeerError::Refused(ProposeError::Removed)),
            err(PeerError::ShuttingDown),
            err(PeerError::NoReplica(7)),
            err(PeerError::VoteRefused(VoteRefusal::JustRestarted)),
            err(PeerError::VoteRefused(VoteRefusal::LedQuietly(4))),
            err(PeerError::VoteRefused(VoteRefusal::Promised {
                leader: 2,
                group: 5,
            })),
            err(PeerError::Raft("r".into())),
        ];
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let actual: Vec<String> = frames.into_iter().map(|f| hex(&framed(f))).collect();
        assert_eq!(actual, GOLDEN_FRAMES);
        // Each decodes to a message that goes out as the same bytes again.
        for (i, golden) in actual.iter().enumerate() {
            let bytes: Vec<u8> = (0..golden.len())
                .step_by(2)
                .map(|at| u8::from_str_radix(&golden[at..at + 2], 16).unwrap())
                .collect();
            let back = decode_peer_frame(&bytes[4..]).unwrap();
            assert_eq!(framed(back), bytes, "frame {i}");
        }
    }

    /// A message as it goes out: a request as `Network::call` encodes it, a response as
    /// `serve_peer` does.
    fn framed(frame: PeerFrame) -> Vec<u8> {
        let mut out = Vec::new();
        match frame {
            PeerFrame::Request { id, group, rpc } => {
                encode_request(id, group, rpc, &mut out).unwrap()
            }
            f => encode(&f, &mut out).unwrap(),
        }
        out
    }

    const GOLDEN_FRAMES: [&str; 26] = [
        "2c00000000fb2c0107000201010102010403020105010700010201610602010600020107010800010201620601020103",
        "0e00000000fb2c0107010201010102010400",
        "0b00000000fb2c0107020201010000",
        "1200000000fb2c010703020101000000000003010203",
        "0e00000000fb2c0107040201010301020109",
        "0b00000000fb2c0107050102016b03",
        "0d00000000fb2c01070601010205010306",
        "1000000000fb2c010707000872657475726e2031",
        "0700000000fb2c01070701",
        "0700000001fb2c01000000",
        "0e00000001fb2c0100010201010101020104",
        "0900000001fb2c010002020101",
        "0700000001fb2c01000300",
        "0900000001fb2c01000401020e",
        "0800000001fb2c0100050102",
        "0600000001fb2c010006",
        "0800000001fb2c0101000003",
        "0700000001fb2c01010001",
        "0900000001fb2c010100020174",
        "0700000001fb2c01010003",
        "0600000001fb2c010101",
        "0700000001fb2c01010207",
        "0700000001fb2c01010300",
        "0800000001fb2c0101030104",
        "0900000001fb2c010103020205",
        "0800000001fb2c0101040172",
    ];

    /// What a forwarding node acts on survives the trip: a redirect keeps its node, a reason
    /// its words.
    #[test]
    fn peer_errors_travel_intact() {
        let cfg = bincode::config::standard();
        for e in [
            PeerError::Refused(ProposeError::Moved(3)),
            PeerError::Refused(ProposeError::ClusterDown),
            PeerError::Refused(ProposeError::TryAgain("group 1 did not commit".into())),
            PeerError::ShuttingDown,
            PeerError::NoReplica(7),
            PeerError::VoteRefused(VoteRefusal::Promised {
                leader: 2,
                group: 5,
            }),
            PeerError::Raft("stopped".into()),
        ] {
            let bytes = bincode::serde::encode_to_vec(&e, cfg).unwrap();
            let (back, _): (PeerError, usize) =
                bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
            assert_eq!(back, e);
        }
        assert_eq!(PeerError::ShuttingDown.to_string(), "node is shutting down");
    }
}
