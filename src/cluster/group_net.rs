//! Each group's network client, and one saving in what it sends to a follower.
//!
//! When an entry commits and the leader has no newer entry yet, openraft tells each follower
//! of the commit at once, in an append that carries no entries. Under steady writes the next
//! entry follows a moment later (the commit is what lets the proposer send it), and it carries
//! the commit too: sent alone, nearly every other append would be one with nothing but a
//! commit index, a whole round trip (two frames, a task on each side, a turn of each Raft core)
//! that tells the follower what the next append will.
//!
//! `MergeCommits` sits on the stream of a follower's appends: an append with no entries is held
//! for at most `COMMIT_WAIT`, and dropped if an append that continues from the same place (same
//! leader, same previous entry, so a commit index at least as new) comes within it; otherwise it
//! goes out when the wait ends. Nothing is claimed that the follower did not answer: openraft
//! matches answers to what it sent by log position and takes the send time of the newest
//! request answered, which is the later one that did go. The follower learns of a commit at
//! most about `COMMIT_WAIT` later; what it applies serves no client until it leads, and a new
//! leader commits its own entry before it serves.
//!
//! An append with no entries that ends its stream (a heartbeat is a stream of one) goes at once.

use crate::cluster::transport::Network;
use crate::cluster::typ::{GroupId, TypeConfig};
use futures_util::Stream;
use openraft::OptionalSend;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{RPCError, ReplicationClosed, StreamingError};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{Backoff, RPCOption, stream_append_sequential};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotOf, VoteOf};
use openraft_multi::GroupNetworkAdapter;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// How long an append that only carries a commit waits for one that carries entries too (the
/// timer rounds it up to the next millisecond). Heartbeats never wait (each is a stream of its
/// own), so the wait cannot make a follower miss its leader; it only delays when a follower
/// applies.
const COMMIT_WAIT: Duration = Duration::from_millis(1);

/// How long a follower has to answer an append. openraft gives every append the heartbeat
/// interval (100 ms; the transport gives up at three quarters of it), which a follower on a
/// loaded machine misses now and then: the leader then drops the answer that comes a moment
/// later, marks the follower unreachable and sends the entries again, more work for a machine
/// already behind, and while both followers of a group miss, nothing commits. Nothing else
/// waits on this timeout: elections and leases run on their own timers (heartbeats keep the
/// short one), and a peer that is gone is seen by its link.
const APPEND_TTL: Duration = Duration::from_millis(500);

type Request = AppendEntriesRequest<TypeConfig>;

/// The options of an append: openraft's, with room for `APPEND_TTL` when it carries entries.
/// Heartbeats and appends that only carry a commit keep openraft's timeout.
fn append_option(rpc: &Request, option: RPCOption) -> RPCOption {
    if rpc.entries.is_empty() || option.hard_ttl() >= APPEND_TTL {
        option
    } else {
        RPCOption::new(APPEND_TTL)
    }
}

/// One group's client for one follower: openraft's adapter over the node's shared `Network`,
/// with its appends streamed through `MergeCommits`.
pub(crate) struct GroupNet(pub(crate) GroupNetworkAdapter<TypeConfig, GroupId, Network>);

impl RaftNetworkV2<TypeConfig> for GroupNet {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: Request,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let option = append_option(&rpc, option);
        self.0.append_entries(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.vote(rpc, option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.pre_vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.0.full_snapshot(vote, snapshot, cancel, option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.transfer_leader(req, option).await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.0.backoff()
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = Request> + OptionalSend + Unpin + 'static,
    {
        stream_append_sequential(self, MergeCommits::new(input, COMMIT_WAIT), option)
    }
}

/// Whether the append carries nothing but the leader's commit index.
fn commit_only(r: &Request) -> bool {
    r.entries.is_empty()
}

/// A stream of appends in which an append with no entries gives way to the next one when that
/// continues from the same place within `wait`.
struct MergeCommits<S> {
    input: S,
    wait: Duration,
    /// An append with no entries, waiting for one to take its place.
    held: Option<(Request, Pin<Box<tokio::time::Sleep>>)>,
    /// An append that could not take the held one's place: it goes right after it.
    next: Option<Request>,
    ended: bool,
}

impl<S> MergeCommits<S> {
    fn new(input: S, wait: Duration) -> MergeCommits<S> {
        MergeCommits {
            input,
            wait,
            held: None,
            next: None,
            ended: false,
        }
    }
}

impl<S: Stream<Item = Request> + Unpin> Stream for MergeCommits<S> {
    type Item = Request;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        let this = self.get_mut();
        if let Some(r) = this.next.take() {
            return Poll::Ready(Some(r));
        }
        loop {
            if this.ended {
                return Poll::Ready(this.held.take().map(|(r, _)| r));
            }
            let polled = Pin::new(&mut this.input).poll_next(cx);
            let Some((held, sleep)) = this.held.as_mut() else {
                return match polled {
                    Poll::Ready(Some(r)) if commit_only(&r) => {
                        let sleep = Box::pin(tokio::time::sleep(this.wait));
                        this.held = Some((r, sleep));
                        continue;
                    }
                    Poll::Ready(None) => {
                        this.ended = true;
                        Poll::Ready(None)
                    }
                    other => other,
                };
            };
            match polled {
                Poll::Ready(Some(r)) => {
                    if r.vote == held.vote && r.prev_log_id == held.prev_log_id {
                        // It says all the held one would have, and maybe more.
                        if commit_only(&r) {
                            *held = r;
                            continue;
                        }
                        this.held = None;
                        return Poll::Ready(Some(r));
                    }
                    this.next = Some(r);
                    return Poll::Ready(this.held.take().map(|(r, _)| r));
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(this.held.take().map(|(r, _)| r));
                }
                Poll::Pending => {
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(this.held.take().map(|(r, _)| r));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::typ::{Entry, LogId, Vote};
    use futures_util::StreamExt;
    use openraft::entry::RaftEntry;
    use tokio::sync::mpsc;

    /// Long against the timer's millisecond, so what a test sends at `WAIT / 4` is in time.
    const WAIT: Duration = Duration::from_millis(20);

    fn lid(i: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(1, 1, i)
    }

    /// An append after entry `prev`, with `n` entries, and the commit at `commit`.
    fn append(prev: u64, n: u64, commit: u64) -> Request {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(lid(prev)),
            entries: (1..=n).map(|i| Entry::new_blank(lid(prev + i))).collect(),
            leader_commit: Some(lid(commit)),
        }
    }

    #[test]
    fn appends_with_entries_get_room_and_heartbeats_do_not() {
        let openraft_ttl = Duration::from_millis(100);
        let with = append_option(&append(4, 2, 4), RPCOption::new(openraft_ttl));
        assert_eq!(with.hard_ttl(), APPEND_TTL);
        assert!(with.soft_ttl() > openraft_ttl * 3);
        let heartbeat = append_option(&append(4, 0, 4), RPCOption::new(openraft_ttl));
        assert_eq!(heartbeat.hard_ttl(), openraft_ttl);
        // A longer timeout than ours is left as it is.
        let long = append_option(&append(4, 2, 4), RPCOption::new(APPEND_TTL * 2));
        assert_eq!(long.hard_ttl(), APPEND_TTL * 2);
    }

    fn shape(r: &Request) -> (u64, usize, u64) {
        (
            r.prev_log_id.as_ref().map_or(0, |l| l.index),
            r.entries.len(),
            r.leader_commit.as_ref().map_or(0, |l| l.index),
        )
    }

    /// A stream fed by hand, so a test decides when each append is ready.
    fn fed() -> (
        mpsc::UnboundedSender<Request>,
        MergeCommits<tokio_stream::wrappers::UnboundedReceiverStream<Request>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let s = MergeCommits::new(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            WAIT,
        );
        (tx, s)
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_gives_way_to_the_next_entries_that_come_in_time() {
        let (tx, mut s) = fed();
        tx.send(append(4, 1, 4)).unwrap();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((4, 1, 4)));
        // Entry 5 committed: the leader says so, then has entry 6 soon after.
        tx.send(append(5, 0, 5)).unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(WAIT / 4).await;
            tx.send(append(5, 1, 5)).unwrap();
            tx
        });
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 1, 5)));
        drop(sender.await.unwrap());
        assert!(s.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_with_nothing_after_it_goes_when_the_wait_ends() {
        let (tx, mut s) = fed();
        tx.send(append(5, 0, 5)).unwrap();
        let t0 = tokio::time::Instant::now();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 0, 5)));
        let waited = t0.elapsed();
        assert!(waited >= WAIT && waited < WAIT * 2, "{waited:?}");
        // The stream goes on as before.
        tx.send(append(5, 2, 5)).unwrap();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 2, 5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_commit_replaces_an_older_one_held() {
        let (tx, mut s) = fed();
        tx.send(append(5, 0, 4)).unwrap();
        tx.send(append(5, 0, 5)).unwrap();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 0, 5)));
        drop(tx);
        assert!(s.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_from_elsewhere_goes_after_the_held_commit_not_instead() {
        let (tx, mut s) = fed();
        tx.send(append(5, 0, 5)).unwrap();
        tx.send(append(3, 2, 5)).unwrap();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 0, 5)));
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((3, 2, 5)));
        let mut other_leader = append(5, 1, 5);
        other_leader.vote = Vote::new_committed(2, 2);
        tx.send(append(5, 0, 5)).unwrap();
        tx.send(other_leader).unwrap();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 0, 5)));
        assert_eq!(
            s.next().await.map(|r| r.vote),
            Some(Vote::new_committed(2, 2))
        );
    }

    /// A heartbeat is a stream of one append with no entries: it must not wait.
    #[tokio::test(start_paused = true)]
    async fn a_lone_append_at_the_end_of_its_stream_goes_at_once() {
        let mut s = MergeCommits::new(
            Box::pin(futures_util::stream::once(async { append(5, 0, 5) })),
            WAIT,
        );
        let t0 = tokio::time::Instant::now();
        assert_eq!(s.next().await.map(|r| shape(&r)), Some((5, 0, 5)));
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert!(s.next().await.is_none());
    }
}
