//! What a node command may see of the connection that sent it: the reply protocol, who the
//! client is authenticated as, its entry in CLIENT LIST, whether the connection closes after
//! this reply, and the node's shards. The connection (`conn`) owns one `Session` beside its
//! socket, buffers and round; node commands (`commands`) get only the session.

use super::share::ShareReplies;
use super::{ClientInfo, Node};
use crate::cmd::{KeyCmd, Reply};
use crate::shard::{Answer, CoreRef, Outcome, ShardGone};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// One connection's state as node commands see it.
pub(crate) struct Session {
    pub(super) node: Arc<Node>,
    /// The shard whose event loop runs this connection: its share of a round runs inline.
    pub(super) core: CoreRef,
    pub(super) my_shard: usize,
    pub(super) info: Arc<ClientInfo>,
    /// Whether replies use RESP3.
    pub(super) resp3: bool,
    pub(super) authed: bool,
    /// The user, when it is a read-only one (the others may run everything).
    pub(super) readonly_user: Option<Arc<str>>,
    /// Close once the replies so far are written; nothing after them in the pipeline runs.
    pub(super) quit: bool,
}

impl Session {
    pub(super) fn new(node: Arc<Node>, core: CoreRef, info: Arc<ClientInfo>) -> Session {
        let my_shard = core.borrow().id;
        Session {
            authed: !node.live.needs_auth(),
            readonly_user: None,
            node,
            core,
            my_shard,
            info,
            resp3: false,
            quit: false,
        }
    }

    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    pub(crate) fn info(&self) -> &ClientInfo {
        &self.info
    }

    /// Whether replies use RESP3.
    pub(crate) fn resp3(&self) -> bool {
        self.resp3
    }

    /// Switches the reply protocol, and what CLIENT LIST shows of it.
    pub(crate) fn set_resp3(&mut self, v: bool) {
        self.resp3 = v;
        crate::sync::lock(&self.info.meta).resp = if v { 3 } else { 2 };
    }

    pub(crate) fn authed(&self) -> bool {
        self.authed
    }

    pub(crate) fn set_authed(&mut self, v: bool) {
        self.authed = v;
    }

    /// Who the connection is authenticated as: its name, and whether it may only read.
    pub(crate) fn set_user(&mut self, name: &str, readonly: bool) {
        self.readonly_user = readonly.then(|| Arc::from(name));
        crate::sync::lock(&self.info.meta).user = name.to_string();
    }

    /// Closes the connection once the current reply is written; nothing after it in the
    /// pipeline runs.
    pub(crate) fn close_after_reply(&mut self) {
        self.quit = true;
    }

    /// Records the subcommand a container command ran, for CLIENT LIST's `cmd=`.
    pub(crate) fn note_subcommand(&self, sub: usize) {
        self.info.last_sub.store(sub, Ordering::Relaxed);
    }

    /// Sends a batch to shard `s` to apply at once, whole: inline when it is this
    /// connection's own shard.
    pub(super) async fn dispatch(
        &self,
        s: usize,
        cmds: Vec<KeyCmd>,
    ) -> Result<ShareReplies, ShardGone> {
        if s == self.my_shard {
            Ok(ShareReplies::Ready(
                self.core.borrow_mut().apply_batch_local(cmds),
            ))
        } else {
            Ok(ShareReplies::Wait(
                self.node.shards[s].submit(cmds, usize::MAX).await?,
            ))
        }
    }

    /// Hands shard `s` key commands to run whole, as one batch (in a cluster, one entry of
    /// their group), and waits for the answer.
    pub(super) async fn run_whole(
        &self,
        s: usize,
        cmds: Vec<KeyCmd>,
        slots: Vec<u16>,
    ) -> Result<Answer, ShardGone> {
        let rx = if s == self.my_shard {
            match self.core.borrow_mut().run(cmds, &slots, usize::MAX) {
                Outcome::Ready(a) => return Ok(a),
                Outcome::Later(rx) => rx,
            }
        } else {
            self.node.shards[s]
                .submit_keyed(cmds, slots, usize::MAX)
                .await?
        };
        rx.await.map_err(|_| ShardGone)
    }

    /// Runs one command on shard `s` and returns its replies.
    pub(crate) async fn run_on_shard(
        &self,
        s: usize,
        cmd: KeyCmd,
    ) -> Result<Vec<Reply>, ShardGone> {
        self.dispatch(s, vec![cmd]).await?.replies().await
    }

    /// Runs a command on every shard and returns the replies.
    pub(crate) async fn all_shards(
        &self,
        make: impl Fn() -> KeyCmd,
    ) -> Result<Vec<Reply>, ShardGone> {
        let mut waits = Vec::new();
        for s in 0..self.node.shards.len() {
            waits.push(self.dispatch(s, vec![make()]).await?);
        }
        let mut out = Vec::new();
        for w in waits {
            out.extend(w.replies().await?);
        }
        Ok(out)
    }

    /// Has every shard start or stop counting its keys in the caps now, and waits for all of
    /// them, so a cap switched on is in force everywhere once CONFIG SET has answered.
    pub(crate) async fn sync_caps(&mut self) -> Result<(), ShardGone> {
        let mut waits = Vec::new();
        for s in &self.node.shards {
            if s.id == self.my_shard {
                self.core.borrow_mut().store.sync_caps();
            } else {
                let (tx, rx) = tokio::sync::oneshot::channel();
                s.send(crate::shard::ShardMsg::SyncCaps { reply: tx })
                    .await?;
                waits.push(rx);
            }
        }
        for rx in waits {
            rx.await.map_err(|_| ShardGone)?;
        }
        Ok(())
    }
}
