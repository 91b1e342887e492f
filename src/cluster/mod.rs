//! Cluster mode: hash slots split over a fixed number of Raft groups, each replicated on R
//! nodes.

mod balance;
mod bootstrap;
pub(crate) mod entry_decode;
pub(crate) mod errors;
pub(crate) mod executor;
pub(crate) mod group_net;
mod group_time;
mod groups;
mod join;
pub(crate) mod log_store;
pub(crate) mod membership;
pub(crate) mod meta;
pub(crate) mod node;
mod peer;
pub(crate) mod quiet;
mod replicas;
mod settings;
pub(crate) mod spec;
pub(crate) mod state_machine;
pub(crate) mod transport;
pub(crate) mod typ;
mod writes;

// What the rest of the crate uses of this folder, named here so it imports the folder and not
// its files.
pub(crate) use errors::{ProposeError, TryAgain};
pub(crate) use executor::{ExecFuture, GroupExecutor, ShardStopped};
#[cfg(test)]
pub(crate) use join::CLUSTER_FILE;
pub(crate) use join::{read_cluster_file, resolve_join};
pub(crate) use meta::{MemberState, MetaOp, RulesHook};
pub(crate) use node::{Cluster, ClusterSettings};
#[cfg(test)]
pub(crate) use settings::DEFAULT_LOG_MEMORY;
pub(crate) use spec::{ClusterSpec, NodeSpec, redis_id};
pub(crate) use state_machine::EntryBatch;
pub(crate) use transport::ScriptsChange;
pub(crate) use typ::{GroupId, NodeId, Origin};

/// A timer for a node's periodic task: a tick that comes late is not made up for.
pub(crate) fn ticker(period: std::time::Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// Waits for the next tick; false once the node is shutting down.
pub(crate) async fn next_tick(
    tick: &mut tokio::time::Interval,
    shutdown: &mut crate::shutdown::Shutdown,
) -> bool {
    tokio::select! {
        _ = tick.tick() => true,
        _ = shutdown.recv() => false,
    }
}

/// Decodes bincode (`bincode::config::standard()`, the encoding of everything the cluster
/// writes to disk or sends to peers) from bytes read back or received, without letting an
/// encoded length make it allocate what the bytes could never hold.
///
/// bincode sizes a string or byte buffer from its length before reading it, and with no limit
/// it trusts that length: a few bytes announcing 2^64 bytes panic, 2^40 abort the process. With
/// a limit it refuses a length past it. The limit is on what bincode counts, and it counts
/// each integer at its size in memory (8 bytes for a `u64` written in one), 16 bytes for one
/// byte of input at most; so the limit is 16 times the input, rounded up to one of a few
/// sizes (bincode takes it as a constant).
pub(crate) fn decode_bounded<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    use bincode::config::standard;
    use bincode::serde::decode_from_slice;
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    match bytes.len() {
        n if n <= 64 * KIB => {
            decode_from_slice(bytes, standard().with_limit::<{ 16 * 64 * KIB }>())
        }
        n if n <= 4 * MIB => decode_from_slice(bytes, standard().with_limit::<{ 16 * 4 * MIB }>()),
        n if n <= 256 * MIB => {
            decode_from_slice(bytes, standard().with_limit::<{ 16 * 256 * MIB }>())
        }
        _ => decode_from_slice(bytes, standard().with_limit::<{ 16 * 4096 * MIB }>()),
    }
}

#[cfg(test)]
mod tests {
    use super::log_store::replay_len;
    use super::transport::{PeerFrame, Rpc, decode_peer_frame};
    use super::typ::{Entry, TypeConfig, Vote};
    use openraft::entry::RaftEntry;

    /// A bincode length of 2^64 - 1: a varint's `u64` marker and eight bytes.
    const HUGE_LEN: [u8; 9] = [0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];

    /// A peer frame whose string or key announces 2^64 bytes is refused, rather than sized
    /// from that length (which would panic, or abort the node for lengths around 2^56).
    #[test]
    fn a_peer_frame_announcing_more_than_it_holds_is_refused() {
        // Response { id: 0, result: Err(PeerError::Raft(<huge string>)) }.
        let answer = [&[1, 0, 1, 4][..], &HUGE_LEN].concat();
        assert!(decode_peer_frame(&answer).is_err());
        // Request { id: 0, group: 0, rpc: Forward([Get(<huge key>)]) }.
        let forward = [&[0, 0, 0, 5, 1, 0][..], &HUGE_LEN].concat();
        assert!(decode_peer_frame(&forward).is_err());
    }

    /// A log record with valid checksums whose key announces 2^64 bytes fails to open the log,
    /// as other undecodable records do, instead of panicking at start.
    #[test]
    fn a_log_record_announcing_more_than_it_holds_is_refused() {
        // Group 3, an entry (log id 2-1-9) with a normal payload: ts 0, no origin, one
        // command, Get(<huge key>).
        let payload = [&[3, 0, 2, 1, 9, 1, 0, 0, 1, 0][..], &HUGE_LEN].concat();
        let len = (payload.len() as u32).to_le_bytes();
        let crc = |parts: &[&[u8]]| {
            parts
                .iter()
                .fold(0, |c, p| crc32c::crc32c_append(c, p))
                .to_le_bytes()
        };
        let file = [&len[..], &crc(&[&len]), &crc(&[&len, &payload]), &payload].concat();
        let err = replay_len(&file).unwrap_err();
        assert!(err.to_string().contains("offset 0"), "{err}");
    }

    /// The limit counts integers at their size in memory, several times their encoded size:
    /// frames made mostly of small integers still decode, at every size.
    #[test]
    fn integer_heavy_frames_still_decode() {
        for n in [1, 1_000, 20_000, 300_000] {
            let entries = (1..=n)
                .map(|i| Entry::new_blank(openraft::testing::log_id::<TypeConfig>(1, 1, i)))
                .collect();
            let frame = PeerFrame::Request {
                id: u64::MAX,
                group: 1,
                rpc: Rpc::Append(openraft::raft::AppendEntriesRequest {
                    vote: Vote::new_committed(1, 1),
                    prev_log_id: None,
                    entries,
                    leader_commit: None,
                }),
            };
            let bytes = bincode::serde::encode_to_vec(&frame, bincode::config::standard()).unwrap();
            assert!(decode_peer_frame(&bytes).is_ok(), "{n} entries");
        }
    }
}
