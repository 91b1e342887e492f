//! The node-wide stop signal: one `Trigger` held by whoever stops the node, and a `Shutdown`
//! listener cloned into every task that must end with it.
//!
//! A listener fires once the trigger has fired or been dropped, whichever comes first, and
//! stays fired: `recv` then returns at once. Waiting costs what waiting on a
//! `tokio::sync::watch` receiver costs (one atomic load per poll), so it may sit in the
//! `select!` of a connection's read loop.
//!
//! Listeners are only ever cloned from the one `channel` made, never subscribed afresh: a
//! clone made after the trigger fired still fires, because it inherits the unseen change.

use tokio::sync::watch;

/// Fires every `Shutdown` listener of its channel.
#[derive(Debug)]
pub(crate) struct Trigger {
    tx: watch::Sender<bool>,
}

/// Listens for the node to stop. Clone it into each task.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
    /// Set once `recv` has seen the signal.
    fired: bool,
}

/// A trigger and the first of its listeners.
pub(crate) fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger { tx }, Shutdown { rx, fired: false })
}

impl Trigger {
    /// Fires every listener, those waiting now and those that look later.
    pub(crate) fn fire(&self) {
        // Only `true` is ever sent, so any change a listener sees is the signal. With no
        // listener left there is no one to tell.
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// Whether the node is stopping. Does not wait.
    pub fn is_shutdown(&self) -> bool {
        // A change not yet seen can only be the signal; a closed channel means the trigger
        // was dropped, which also stops the node's tasks.
        self.fired || self.rx.has_changed().unwrap_or(true)
    }

    /// Waits until the node is stopping; returns at once if it already is.
    pub async fn recv(&mut self) {
        if self.fired {
            return;
        }
        // An error means the trigger was dropped: that stops the listeners too.
        let _ = self.rx.changed().await;
        self.fired = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_every_listener_once_and_for_good() {
        let (trigger, mut first) = channel();
        let mut clone = first.clone();
        assert!(!first.is_shutdown());
        trigger.fire();
        assert!(first.is_shutdown());
        first.recv().await;
        first.recv().await;
        assert!(first.is_shutdown());
        // A clone made after the signal was seen still knows.
        let mut late = first.clone();
        late.recv().await;
        clone.recv().await;
        assert!(clone.is_shutdown());
    }

    #[tokio::test]
    async fn a_dropped_trigger_stops_the_listeners() {
        let (trigger, mut listener) = channel();
        drop(trigger);
        assert!(listener.is_shutdown());
        listener.recv().await;
    }
}
