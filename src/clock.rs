//! Time, injected: shards read the time through a `Clock` so tests can move it by hand.
//!
//! A `Clock` gives two readings: the wall clock (nanoseconds since the UNIX epoch, which an
//! operator or NTP may step either way at any moment) and a monotonic clock (which only runs
//! forward, at the rate of real time). Limits are decided on a [`Timeline`]: time that runs
//! with the monotonic clock from an anchor on the wall clock, and leans toward the wall
//! clock by at most [`SLEW_DIVISOR`]th of the time that passes. A step of the wall clock,
//! either way, therefore moves no decision; slow drift between the two is absorbed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of time: the wall clock and a monotonic clock, both in nanoseconds.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time since the UNIX epoch; may step back or forward.
    fn now_ns(&self) -> u64;
    /// A clock that never steps: only its differences mean anything.
    fn mono_ns(&self) -> u64;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// The instant the process first read its monotonic clock: `mono_ns` counts from it.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn mono_ns(&self) -> u64 {
        u64::try_from(origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to; for tests and benchmarks. Moving it forward is time
/// passing (both readings move); `step_ns` steps the wall clock alone, as NTP or an operator
/// does.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
    mono: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ns: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: AtomicU64::new(start_ns),
            mono: AtomicU64::new(0),
        })
    }

    /// `ms` pass.
    pub fn advance_ms(&self, ms: u64) {
        self.advance_ns(ms * 1_000_000);
    }

    /// `ns` pass.
    pub fn advance_ns(&self, ns: u64) {
        self.mono.fetch_add(ns, Ordering::SeqCst);
        self.now.fetch_add(ns, Ordering::SeqCst);
    }

    /// Time passes until the wall clock reads `ns`; a time behind the wall clock steps it
    /// back instead (no time passes).
    pub fn set_ns(&self, ns: u64) {
        let before = self.now.swap(ns, Ordering::SeqCst);
        self.mono
            .fetch_add(ns.saturating_sub(before), Ordering::SeqCst);
    }

    /// Steps the wall clock by `delta` ns, back when negative; no time passes.
    pub fn step_ns(&self, delta: i64) {
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add_signed(delta))
            });
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn mono_ns(&self) -> u64 {
        self.mono.load(Ordering::SeqCst)
    }
}

/// A timeline leans toward the wall clock by at most one nanosecond per this many that pass:
/// 0.1 %, twice the fastest slew the kernel itself applies for NTP (500 ppm), so real drift is
/// always absorbed, while a wall clock that is off by any amount moves limits by at most
/// 0.1 % of the time that passes.
pub const SLEW_DIVISOR: u64 = 1000;

/// The time limits are decided at: monotonic, anchored to the wall clock, never backward.
///
/// `now` advances by what the monotonic clock saw since the last reading, corrected toward the
/// wall clock by at most `1/SLEW_DIVISOR` of that (so over any stretch it runs at between
/// 0.999 and 1.001 times real time, and never stands still). `raise` lifts it to a time it
/// must not fall below (a snapshot's time at restart, the time a Raft group has reached);
/// from there it runs on.
#[derive(Clone)]
pub struct Timeline {
    src: Arc<dyn Clock>,
    /// The time last given.
    at: u64,
    /// The monotonic reading it was given at.
    mono: u64,
    /// Nanoseconds passed that earned no correction yet: the wall clock is read, and the
    /// correction made, once at least `WALL_EVERY_NS` have passed, not on every reading.
    carry: u64,
}

/// How much monotonic time passes between two readings of the wall clock by a timeline: a
/// shard reads its time once per batch, and the correction toward the wall clock needs far
/// fewer readings than that.
const WALL_EVERY_NS: u64 = 1_000_000;

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").field("at", &self.at).finish()
    }
}

impl Timeline {
    /// A timeline that starts at the wall clock's time.
    pub fn new(src: Arc<dyn Clock>) -> Timeline {
        let at = src.now_ns();
        Timeline::starting_at(src, at)
    }

    /// A timeline that starts at `at`, whatever the wall clock says.
    pub fn starting_at(src: Arc<dyn Clock>, at: u64) -> Timeline {
        let mono = src.mono_ns();
        Timeline {
            src,
            at,
            mono,
            carry: 0,
        }
    }

    /// The time now: never less than any time given before.
    pub fn now(&mut self) -> u64 {
        let mono = self.src.mono_ns();
        let passed = mono.saturating_sub(self.mono);
        if passed == 0 {
            return self.at;
        }
        self.mono = mono;
        let base = self.at.saturating_add(passed);
        let earned = self.carry + passed;
        if earned < WALL_EVERY_NS {
            self.carry = earned;
            self.at = base;
            return base;
        }
        let room = earned / SLEW_DIVISOR;
        self.carry = earned % SLEW_DIVISOR;
        let wall = self.src.now_ns();
        self.at = if wall >= base {
            base + (wall - base).min(room)
        } else {
            base - (base - wall).min(room)
        };
        self.at
    }

    /// Lifts the timeline to `floor` if it is behind it; it runs on from there.
    pub fn raise(&mut self, floor: u64) {
        if floor > self.now() {
            self.at = floor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn timeline(start: u64) -> (Arc<ManualClock>, Timeline) {
        let c = ManualClock::new(start);
        let t = Timeline::new(c.clone());
        (c, t)
    }

    #[test]
    fn follows_the_wall_clock_while_it_does_not_step() {
        let (c, mut t) = timeline(100 * S);
        assert_eq!(t.now(), 100 * S);
        c.advance_ms(1500);
        assert_eq!(t.now(), 101 * S + S / 2);
        c.set_ns(200 * S);
        assert_eq!(t.now(), 200 * S);
    }

    #[test]
    fn a_step_back_neither_stops_nor_reverses_time() {
        let (c, mut t) = timeline(10_000 * S);
        c.step_ns(-3600 * S as i64);
        assert_eq!(t.now(), 10_000 * S);
        c.advance_ms(6_000);
        // Six seconds passed; the wall clock an hour behind takes off at most 0.1 % of them.
        let at = t.now();
        assert_eq!(at, 10_006 * S - 6 * S / SLEW_DIVISOR);
    }

    #[test]
    fn a_step_forward_is_absorbed_at_the_bounded_rate() {
        let (c, mut t) = timeline(10_000 * S);
        c.step_ns(3600 * S as i64);
        assert_eq!(t.now(), 10_000 * S);
        // Over an hour the timeline gains at most 3.6 s on real time.
        for _ in 0..3600 {
            c.advance_ms(1000);
            t.now();
        }
        assert_eq!(t.now(), 13_600 * S + 3600 * S / SLEW_DIVISOR);
    }

    #[test]
    fn small_offsets_are_closed_then_followed() {
        let (c, mut t) = timeline(10_000 * S);
        c.step_ns(2_000_000); // 2 ms ahead
        for _ in 0..2_000 {
            c.advance_ms(1); // read often: the correction still accumulates
            t.now();
        }
        // 2 s passed: 2 ms of correction earned, the offset is closed.
        assert_eq!(t.now(), c.now_ns());
        c.advance_ms(10);
        assert_eq!(t.now(), c.now_ns());
    }

    #[test]
    fn raise_lifts_and_runs_on() {
        let (c, mut t) = timeline(10_000 * S);
        t.raise(13_600 * S);
        assert_eq!(t.now(), 13_600 * S);
        t.raise(5 * S);
        assert_eq!(t.now(), 13_600 * S);
        c.advance_ms(1000);
        assert_eq!(t.now(), 13_601 * S - S / SLEW_DIVISOR);
    }

    #[test]
    fn set_ns_back_is_a_step_and_forward_is_time_passing() {
        let c = ManualClock::new(100 * S);
        c.set_ns(50 * S);
        assert_eq!((c.now_ns(), c.mono_ns()), (50 * S, 0));
        c.set_ns(60 * S);
        assert_eq!((c.now_ns(), c.mono_ns()), (60 * S, 10 * S));
    }
}
