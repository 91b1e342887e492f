//! A group's time: what its leader stamps on each entry, so every replica applies the entry at
//! the same instant (see `state_machine`).
//!
//! Group time is the group's, not a node's: each replica keeps a [`Timeline`] per group. A
//! follower re-anchors its timeline at the stamp of every entry it applies, and between
//! entries runs it on its own monotonic clock; a leader runs it on from there, leaning toward
//! its own wall clock by at most `clock::SLEW_DIVISOR`th of the time that passes. So a new
//! leader continues from the last time it applied plus what its monotonic clock has seen
//! since, whatever its wall clock says, and a node whose wall clock is off by any amount moves
//! the group's time by at most 0.1 % of the time it leads.

use crate::clock::{Clock, Timeline};
use crate::cluster::typ::GroupId;
use crate::sync::lock;
use std::sync::{Arc, Mutex};

/// A replica that stamped an entry this recently (in monotonic ns) counts as the group's
/// leader for its timeline: the entries it applies were stamped from that timeline, so they
/// only raise it (re-anchoring at them would drop the time they took to commit).
const LEADING_NS: u64 = 2_000_000_000;

/// One group's time on this node.
struct GroupClock {
    /// None until the group applied an entry here or this node stamped one.
    line: Option<Timeline>,
    /// The monotonic time of this node's last stamp for the group.
    stamped_at: Option<u64>,
}

/// Every group's time on this node.
pub(crate) struct GroupClocks {
    src: Arc<dyn Clock>,
    per: Vec<Mutex<GroupClock>>,
}

impl GroupClocks {
    /// Clocks for groups `0..groups`, reading `src`.
    pub(crate) fn new(src: Arc<dyn Clock>, groups: usize) -> GroupClocks {
        GroupClocks {
            src,
            per: (0..groups)
                .map(|_| {
                    Mutex::new(GroupClock {
                        line: None,
                        stamped_at: None,
                    })
                })
                .collect(),
        }
    }

    /// The time this node, leading `g`, stamps on a new entry: the group's time as this node
    /// has followed it, run on by its monotonic clock (the wall clock's, for a group that
    /// has no time yet).
    pub(crate) fn stamp(&self, g: GroupId) -> u64 {
        let Some(c) = self.per.get(g as usize) else {
            return self.src.now_ns();
        };
        let mut c = lock(c);
        let src = &self.src;
        let at = c
            .line
            .get_or_insert_with(|| Timeline::new(src.clone()))
            .now();
        c.stamped_at = Some(self.src.mono_ns());
        at
    }

    /// Group `g` applied an entry at `ts` here.
    pub(crate) fn observe(&self, g: GroupId, ts: u64) {
        let Some(c) = self.per.get(g as usize) else {
            return;
        };
        let mut c = lock(c);
        let mono = self.src.mono_ns();
        let leading = c
            .stamped_at
            .is_some_and(|at| mono.saturating_sub(at) < LEADING_NS);
        match c.line.as_mut() {
            Some(line) if leading => line.raise(ts),
            _ => c.line = Some(Timeline::starting_at(self.src.clone(), ts)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SLEW_DIVISOR};

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_follower_takes_over_from_the_group_time_not_its_wall_clock() {
        // The follower's wall clock is 30 s ahead of the group's.
        let c = ManualClock::new(1_030 * S);
        let clocks = GroupClocks::new(c.clone(), 2);
        for i in 0..5 {
            clocks.observe(1, (1_000 + i) * S);
            c.advance_ms(1000);
        }
        // The leader's last entry was at 1004 s; 1 s passed since. The wall clock's 30 s
        // are worth at most 0.1 % of that second.
        assert_eq!(clocks.stamp(1), 1_005 * S + S / SLEW_DIVISOR);
        // Another group, never applied here, starts at the wall clock.
        assert_eq!(clocks.stamp(0), c.now_ns());
    }

    #[test]
    fn a_leader_is_only_raised_by_the_entries_it_applies() {
        let c = ManualClock::new(1_000 * S);
        let clocks = GroupClocks::new(c.clone(), 1);
        let first = clocks.stamp(0);
        c.advance_ms(5);
        // Its own entry, applied 5 ms later, does not take those 5 ms back.
        clocks.observe(0, first);
        assert_eq!(clocks.stamp(0), first + 5_000_000);
        // An entry stamped ahead by a former leader raises it.
        clocks.observe(0, first + 10 * S);
        assert_eq!(clocks.stamp(0), first + 10 * S);
    }

    #[test]
    fn a_former_leader_follows_again_once_it_stopped_stamping() {
        let c = ManualClock::new(1_000 * S);
        let clocks = GroupClocks::new(c.clone(), 1);
        clocks.stamp(0);
        c.advance_ms(LEADING_NS / 1_000_000 + 1);
        // A new leader's entry behind this node's own timeline: followed, not kept ahead.
        clocks.observe(0, 1_001 * S);
        assert_eq!(clocks.stamp(0), 1_001 * S);
    }
}
