//! A shard's event loop: answers the messages in its inbox, runs the connections placed on it
//! and its Raft groups' proposer, and expires keys on a timer.

use super::core::{CoreRef, SWEEP_INTERVAL, ShardCore};
use super::msg::{ShardInbox, ShardMsg};
use crate::cluster::{Cluster, GroupId, Origin, ProposeError, TryAgain};
use crate::cmd::KeyCmd;
use crate::shutdown::Shutdown;
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Runs one shard on this thread until it is told to stop, then waits for the node's
/// shutdown and gives its connections a moment to say goodbye.
///
/// In a cluster the Raft groups the shard owns run on the same event loop (`rt`), so
/// proposing, committing and applying never wait for another thread to wake up.
///
/// `adopt` turns a connection the acceptor handed over into the task that serves it on this
/// loop, or into `None` when it cannot be served here.
pub(crate) fn run<A, F>(
    core: ShardCore,
    inbox: ShardInbox,
    shutdown: Shutdown,
    rt: tokio::runtime::Runtime,
    adopt: A,
) where
    A: Fn(&CoreRef, std::net::TcpStream, super::msg::Transport, Shutdown) -> Option<F>,
    F: Future<Output = ()> + 'static,
{
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let core: CoreRef = Rc::new(RefCell::new(core));
        let mut shutdown = shutdown;
        let sweeper = {
            let core = core.clone();
            let mut shutdown = shutdown.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(SWEEP_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            let due = core.borrow_mut().sweep();
                            if !due.is_empty() {
                                move_group_time_on(&core, due);
                            }
                        }
                        _ = shutdown.recv() => break,
                    }
                }
            })
        };
        let closer = tokio::task::spawn_local(super::turn::close_turns());
        let mut conns = tokio::task::JoinSet::new();
        let mut proposing = Vec::new();
        while let Some(msg) = inbox.recv().await {
            match msg {
                ShardMsg::Batch {
                    cmds,
                    budget,
                    reply,
                } => {
                    let answer = core.borrow_mut().apply_batch(cmds, budget);
                    // The asking connection may have gone; its replies are then dropped.
                    let _ = reply.send(answer);
                }
                ShardMsg::Keyed {
                    cmds,
                    slots,
                    budget,
                    reply,
                } => core.borrow_mut().run_for(cmds, &slots, budget, reply),
                ShardMsg::ApplyAt { batches, reply } => {
                    let replies = core.borrow_mut().apply_entries(batches);
                    let _ = reply.send(replies);
                }
                ShardMsg::Attach(cluster, run) => {
                    core.borrow_mut().hold_groups(cluster.spec.clone());
                    let p = super::proposer::Proposer::new(cluster, run);
                    let kick = p.kick();
                    core.borrow_mut().proposer = Some(p);
                    proposing.push(tokio::task::spawn_local(propose_turns(core.clone(), kick)));
                }
                ShardMsg::Export { slots, now, reply } => {
                    let _ = reply.send(core.borrow().export(slots, now));
                }
                ShardMsg::ExportPart { part, now, reply } => {
                    let mut out = Vec::new();
                    core.borrow()
                        .store
                        .export_partition(part, now, |_| true, &mut out);
                    let _ = reply.send(out);
                }
                ShardMsg::Import {
                    slots,
                    records,
                    reply,
                } => {
                    core.borrow_mut().import(slots, &records);
                    let _ = reply.send(());
                }
                ShardMsg::ClearPart { slots, part, reply } => {
                    core.borrow_mut().clear_part(slots, part);
                    let _ = reply.send(());
                }
                ShardMsg::RaiseTime { at, reply } => {
                    core.borrow_mut().raise_time(at);
                    let _ = reply.send(());
                }
                ShardMsg::Accept(std_stream, transport) => {
                    if let Some(serve) = adopt(&core, std_stream, transport, shutdown.clone()) {
                        conns.spawn_local(serve);
                    }
                }
                ShardMsg::Lend { reply } => {
                    let (back, comes_back) = crossbeam_channel::bounded(1);
                    let store = core.borrow_mut().take_store();
                    let id = core.borrow().id;
                    // Refused (the borrower is gone), the `Lent` drops and sends it back.
                    let _ = reply.send(super::msg::Lent::new(id, store, back));
                    // Nothing else runs on this shard until the store is back: that is what
                    // makes the borrower's command atomic and isolated here.
                    if let Ok(store) = comes_back.recv() {
                        core.borrow_mut().restore(store);
                    }
                }
                ShardMsg::SyncCaps { reply } => {
                    core.borrow_mut().store.sync_caps();
                    let _ = reply.send(());
                }
                ShardMsg::Stop => break,
            }
            while conns.try_join_next().is_some() {}
        }
        shutdown.recv().await;
        // Connections saw the shutdown signal; give them a moment to say goodbye.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        sweeper.abort();
        closer.abort();
        for p in proposing {
            p.abort();
        }
    });
}

/// Runs on the shard's event loop: after each turn that gathered something, proposes every
/// group's entry of that turn.
pub(crate) async fn propose_turns(core: CoreRef, kick: Rc<Notify>) {
    let mut wake: Option<Instant> = None;
    loop {
        match wake {
            // A group holds its commands: more of them, or the end of the hold, wakes it.
            Some(at) => {
                tokio::select! {
                    _ = kick.notified() => {}
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => kick.notified().await,
        }
        // Let every connection task that is ready run first, so what they hand the shard
        // this turn rides in the same entries.
        tokio::task::yield_now().await;
        let (cluster, work) = {
            let mut c = core.borrow_mut();
            let Some(p) = c.proposer.as_mut() else { return };
            let (work, at) = p.take_turn(Instant::now());
            wake = at;
            (p.cluster().clone(), work)
        };
        for (g, origin, cmds) in work {
            tokio::task::spawn_local(submit(core.clone(), cluster.clone(), g, origin, cmds));
        }
    }
}

/// Replicates one entry and settles its batches' fate: answered by the apply on this shard,
/// by the leader it was forwarded to, or failed.
async fn submit(
    core: CoreRef,
    cluster: Arc<Cluster>,
    g: GroupId,
    origin: Origin,
    cmds: Vec<KeyCmd>,
) {
    let result = cluster.replicate(g, origin, cmds).await;
    let mut c = core.borrow_mut();
    let Some(p) = c.proposer.as_mut() else { return };
    p.settled(g);
    match result {
        // Committed, and applied here before the commit was reported: already answered.
        Ok(None) => {
            if p.is_waiting(origin.seq) {
                p.failed(
                    origin.seq,
                    &ProposeError::unknown(TryAgain::CommittedWithoutReplies),
                );
            }
        }
        Ok(Some(replies)) => p.answered(origin.seq, replies),
        Err(e) => p.failed(origin.seq, &e),
    }
}

/// Has this node, where it leads them, commit an empty entry to each of `groups`: its stamp
/// moves the group's time on, and with it the expiry of its keys on every replica.
fn move_group_time_on(core: &super::core::CoreRef, groups: Vec<GroupId>) {
    let Some(cluster) = core.borrow().proposer.as_ref().map(|p| p.cluster().clone()) else {
        return;
    };
    for g in groups {
        if cluster.leads(g) {
            let cluster = cluster.clone();
            tokio::task::spawn_local(async move {
                let _ = cluster.move_time_on(g).await;
            });
        }
    }
}
