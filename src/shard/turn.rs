//! The end of a turn of a shard's loop, for connections to write their replies together.
//!
//! A turn is what the loop runs between two polls of its sockets: every connection the poll
//! found readable runs its round. A connection that has replies waits with `end_of_turn`
//! until the others queued in the same turn have run theirs, and then they all write back to
//! back. A write wakes the reader at the other end; a reader woken a moment ago is still
//! awake, so writes made together cost far less than the same writes spread out between
//! other clients' rounds (Redis, too, writes every reply of an event-loop pass before it
//! sleeps).
//!
//! The turn ends in a task of the loop's own (`close_turns`), woken by the first connection
//! that waits. Being woken puts it at the back of the loop's queue, behind every task that
//! was already due, so it runs once they have; it then wakes all the waiting connections
//! at once. Nothing here asks the operating system anything: waiting for the next poll of
//! the sockets instead (`tokio::task::yield_now`) added a poll per turn.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

thread_local! {
    static GATE: Gate = Gate::default();
}

#[derive(Default)]
struct Gate {
    /// The connections waiting for this turn to end.
    waiting: RefCell<Vec<Waker>>,
    /// The task that ends turns, once this thread's loop runs one.
    closer: RefCell<Option<Waker>>,
    /// How many turns have ended on this thread.
    ended: Cell<u64>,
}

/// Waits until every task that was due on this thread's loop when it was called has run.
/// On a thread with no shard loop (no `close_turns` task), returns at once.
pub(crate) async fn end_of_turn() {
    let mut turn: Option<u64> = None;
    poll_fn(|cx| {
        GATE.with(|g| {
            if turn.is_some_and(|t| g.ended.get() > t) {
                return Poll::Ready(());
            }
            let closer = g.closer.borrow();
            let Some(closer) = closer.as_ref() else {
                return Poll::Ready(());
            };
            let mut waiting = g.waiting.borrow_mut();
            if waiting.is_empty() {
                closer.wake_by_ref();
            }
            // Polled again before its turn ended: it is in the list already, unless the
            // task's waker changed.
            let again = turn.is_some();
            turn.get_or_insert(g.ended.get());
            if !again || !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
            Poll::Pending
        })
    })
    .await
}

/// Ends this thread's turns, for as long as it runs: run it as a task of the shard's loop.
pub(crate) async fn close_turns() {
    // Held so that a drop of this task (the loop ending) leaves no stale waker behind.
    struct Unset;
    impl Drop for Unset {
        fn drop(&mut self) {
            let _ = GATE.try_with(|g| {
                g.closer.borrow_mut().take();
                for w in g.waiting.borrow_mut().drain(..) {
                    w.wake();
                }
            });
        }
    }
    let _unset = Unset;
    let mut woken: Vec<Waker> = Vec::new();
    poll_fn(|cx| {
        GATE.with(|g| {
            {
                let mut closer = g.closer.borrow_mut();
                if !closer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *closer = Some(cx.waker().clone());
                }
            }
            std::mem::swap(&mut woken, &mut *g.waiting.borrow_mut());
            if !woken.is_empty() {
                g.ended.set(g.ended.get() + 1);
                for w in woken.drain(..) {
                    w.wake();
                }
            }
        });
        Poll::<()>::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// Two tasks each do a first step, wait for the end of the turn, then a second step: every
    /// first step comes before any second one, as replies are written after every round.
    #[test]
    fn waiters_go_on_only_after_every_task_due_has_run() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let log: Rc<RefCell<Vec<&'static str>>> = Rc::default();
        local.block_on(&rt, async {
            let closer = tokio::task::spawn_local(close_turns());
            // Let the closer register before anyone waits.
            tokio::task::yield_now().await;
            let mut tasks = Vec::new();
            for (first, second) in [("a1", "a2"), ("b1", "b2"), ("c1", "c2")] {
                let log = log.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    log.borrow_mut().push(first);
                    end_of_turn().await;
                    log.borrow_mut().push(second);
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            closer.abort();
        });
        assert_eq!(*log.borrow(), ["a1", "b1", "c1", "a2", "b2", "c2"]);
    }

    #[test]
    fn without_a_loop_to_wait_for_it_returns_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(end_of_turn());
    }
}
