//! Cutting links on purpose, as tests do to simulate a partition: a blocked peer's messages
//! are dropped in both directions, as a network that lost them would.

use crate::ids::NodeId;
use std::collections::HashSet;
use std::sync::RwLock;

/// Links that tests have cut.
#[derive(Default)]
pub struct Faults {
    blocked: RwLock<HashSet<NodeId>>,
}

impl Faults {
    pub fn block(&self, peer: NodeId) {
        crate::sync::write(&self.blocked).insert(peer);
    }

    pub fn unblock(&self, peer: NodeId) {
        crate::sync::write(&self.blocked).remove(&peer);
    }

    pub fn heal(&self) {
        crate::sync::write(&self.blocked).clear();
    }

    pub fn is_blocked(&self, peer: NodeId) -> bool {
        crate::sync::read(&self.blocked).contains(&peer)
    }
}
