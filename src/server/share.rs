//! What a connection holds for the replies of one shard's share of its work.

use crate::cmd::Reply;
use crate::shard::{Answer, ShardGone};
use tokio::sync::oneshot;

/// The replies to one shard's share: already there (the connection's own shard ran it
/// inline), or still to come from another shard.
pub(super) enum ShareReplies {
    Ready(Vec<Reply>),
    Wait(oneshot::Receiver<Answer>),
}

impl ShareReplies {
    /// The replies, once they are there.
    pub(super) async fn replies(self) -> Result<Vec<Reply>, ShardGone> {
        match self {
            ShareReplies::Ready(r) => Ok(r),
            ShareReplies::Wait(rx) => rx.await.map(|a| a.replies).map_err(|_| ShardGone),
        }
    }
}
