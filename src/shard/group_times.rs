//! In a cluster, the time each Raft group a shard holds has reached: the stamp of the last
//! entry the shard applied for it. A replica changes its keys only by applying the log, so a
//! key expires here when its group's time passes its expiry, never by this node's clock: every
//! replica then holds the same keys, however far apart their clocks are.
//!
//! A group that takes no writes does not move its time on. So that its keys still go once
//! they are due, the sweep notes the groups holding keys due by this node's time but not yet
//! by the group's, and their leader commits an empty entry (`due_groups`), whose stamp moves
//! the group's time on every replica.

use crate::cluster::{ClusterSpec, GroupId};
use crate::slot::key_slot;
use std::time::{Duration, Instant};

/// A group is asked for an empty entry at most this often.
const TICK_EVERY: Duration = Duration::from_millis(500);

pub(crate) struct GroupTimes {
    spec: ClusterSpec,
    /// By group id: the time of the last entry applied here.
    at: Vec<u64>,
    /// By group id: when this shard last asked for an empty entry.
    asked: Vec<Option<Instant>>,
    /// Groups with keys due by this node's time and not by theirs, found by the last sweep.
    due: Vec<GroupId>,
}

impl GroupTimes {
    pub(crate) fn new(spec: ClusterSpec) -> GroupTimes {
        let n = spec.groups as usize;
        GroupTimes {
            spec,
            at: vec![0; n],
            asked: vec![None; n],
            due: Vec::new(),
        }
    }

    /// Group `g` applied an entry at `now` here.
    pub(crate) fn applied(&mut self, g: GroupId, now: u64) {
        if let Some(t) = self.at.get_mut(g as usize) {
            *t = (*t).max(now);
        }
    }

    /// Whether `key`, which expires at `expires_at` (due by this node's time), has expired by
    /// its group's time; notes the group when not.
    pub(crate) fn expired(&mut self, key: &[u8], expires_at: u64) -> bool {
        let g = self.spec.group_of_slot(key_slot(key));
        let reached = self.at.get(g as usize).copied().unwrap_or(0);
        if expires_at <= reached {
            return true;
        }
        if !self.due.contains(&g) {
            self.due.push(g);
        }
        false
    }

    /// The groups the last sweeps found keys due in, not asked for an entry lately; each is
    /// counted as asked now.
    pub(crate) fn due_groups(&mut self, now: Instant) -> Vec<GroupId> {
        let mut out = Vec::new();
        for g in self.due.drain(..) {
            if let Some(asked) = self.asked.get_mut(g as usize)
                && asked.is_none_or(|t| now.duration_since(t) >= TICK_EVERY)
            {
                *asked = Some(now);
                out.push(g);
            }
        }
        out
    }
}
