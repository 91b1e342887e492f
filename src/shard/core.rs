//! A shard's own state: its keys and its clock. Applies key commands (a connection's, another
//! shard's, or committed log entries), within a reply budget, and expires keys.

use super::msg::{Answer, Lent};
use super::stats::ShardStats;
use crate::clock::{Clock, Timeline};
use crate::cmd::{ExecStats, KeyCmd, Reply, Stores, eval_in, execute, is_escalate};
use crate::slot::key_slot;
use crate::store::{Record, Store};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::oneshot;

/// How often a shard expires keys, and how many of the store's parts it sweeps each time.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_millis(10);
const SWEEP_PARTS_PER_TICK: usize = 4;

/// A batch handed to the shard from a connection on it: answered at once, or later (once
/// proposed and committed).
pub enum Outcome {
    Ready(Answer),
    Later(oneshot::Receiver<Answer>),
}

/// Roughly how many bytes a reply takes on the wire; what the reply budget counts.
pub(super) fn reply_bytes(r: &Reply) -> usize {
    match r {
        Reply::Ok | Reply::Nil | Reply::NilArray | Reply::Int(_) | Reply::Bool(_) => 16,
        Reply::Bulk(b) | Reply::Double(b) | Reply::BigNumber(b) => b.len() + 16,
        Reply::Verbatim(_, b) => b.len() + 20,
        Reply::Simple(s) | Reply::Error(s) => s.len() + 3,
        Reply::Limit(_) => 64,
        Reply::LimitAll(_, each) => 64 + 64 * each.len(),
        Reply::Array(items) | Reply::Set(items) => {
            16 + items.iter().map(reply_bytes).sum::<usize>()
        }
        Reply::Map(pairs) => {
            16 + pairs
                .iter()
                .map(|(k, v)| reply_bytes(k) + reply_bytes(v))
                .sum::<usize>()
        }
        Reply::Scored(pairs) => 16 + pairs.iter().map(|(m, _)| m.len() + 48).sum::<usize>(),
    }
}

/// What one shard thread owns: its keys and its view of time.
pub struct ShardCore {
    pub id: usize,
    pub store: Store,
    /// Limit time on this shard (standalone: what commands apply at).
    time: Timeline,
    /// In a cluster: the time each group this shard holds has reached (the time of the last
    /// entry it applied), what its keys expire by.
    group_time: Option<super::group_times::GroupTimes>,
    stats: Arc<ShardStats>,
    /// The most bytes the store held since memory was last handed back.
    peak_since_trim: usize,
    /// What the store held when memory was last handed back.
    bytes_at_trim: usize,
    last_trim: std::time::Instant,
    /// In a cluster: gathers key commands into log entries of the groups this shard owns.
    pub proposer: Option<super::proposer::Proposer>,
    /// How the node's keys are placed, which decides what a script may reach.
    placement: Placement,
}

/// How a node places its keys on shards, as far as a script is concerned.
#[derive(Clone)]
pub enum Placement {
    /// A standalone node of one shard: a script reaches every key.
    Alone,
    /// A standalone node of several shards, with the shard that owns each hash slot: a
    /// script reaches this shard's keys, and runs again with every shard held when it
    /// needs more.
    Shards(Arc<[u16]>),
    /// A cluster node: a script reaches the keys it declares, all in one slot.
    Cluster,
}

/// Batches at least this long look their keys up ahead (see `ShardCore::prefetch`), and at
/// most this many of them: the cache keeps what was fetched only for so long.
const PREFETCH_FROM: usize = 4;
const PREFETCH_MAX: usize = 256;

/// How far the store must have shrunk since its peak (in bytes, and at least half of it)
/// before free memory is handed back to the operating system.
const TRIM_AFTER_BYTES: usize = 8 << 20;

/// How far the store must have grown since memory was last handed back (in bytes, and at
/// least an eighth of it) before the blocks it outgrew are handed back too.
const GROWN_BEFORE_TRIM: usize = 1 << 20;

/// What else hands free memory back, when the binary installed an allocator of its own
/// beside glibc's malloc.
static RELEASE_HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Tells the node how to hand back what the binary's own allocator holds free; glibc's heap
/// is trimmed either way. The first call wins.
pub fn set_free_memory_release(release: fn()) {
    let _ = RELEASE_HOOK.set(release);
}

/// Returns free heap memory to the operating system (the allocators keep it otherwise).
pub(crate) fn release_free_memory() {
    if let Some(release) = RELEASE_HOOK.get() {
        release();
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds free; it touches no
    // memory owned by Rust code and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Shared within one shard thread only (tasks of one single-threaded event loop).
pub(crate) type CoreRef = Rc<RefCell<ShardCore>>;

impl ShardCore {
    pub fn new(
        id: usize,
        store: Store,
        clock: Arc<dyn Clock>,
        stats: Arc<ShardStats>,
    ) -> ShardCore {
        ShardCore {
            id,
            store,
            time: Timeline::new(clock),
            group_time: None,
            stats,
            peak_since_trim: 0,
            bytes_at_trim: 0,
            last_trim: std::time::Instant::now(),
            proposer: None,
            placement: Placement::Cluster,
        }
    }

    /// Says how the node places its keys (a cluster's, until told otherwise).
    pub fn set_placement(&mut self, placement: Placement) {
        self.placement = placement;
    }

    /// Runs one command at `now`. A script reaches the keys its node's placement allows.
    fn execute_one(&mut self, cmd: &KeyCmd, now: u64, st: &mut ExecStats) -> Reply {
        let KeyCmd::Eval(e) = cmd else {
            return execute(&mut self.store, cmd, now, st);
        };
        match &self.placement {
            Placement::Cluster => execute(&mut self.store, cmd, now, st),
            Placement::Alone => eval_in(&mut Stores::one(&mut self.store, false), e, now, st),
            Placement::Shards(map) => {
                let map = map.clone();
                let mut stores = Stores::held(vec![(self.id, &mut self.store)], &map, false);
                eval_in(&mut stores, e, now, st)
            }
        }
    }

    /// Runs `cmds` in order over this shard's store and the stores `lent` by other shards
    /// (every shard of the node when `every`), as one step nothing else interleaves with: the
    /// lenders wait, and this runs without yielding. Standalone nodes only.
    pub fn run_across(&mut self, lent: &mut [Lent], every: bool, cmds: &[KeyCmd]) -> Vec<Reply> {
        let Placement::Shards(map) = self.placement.clone() else {
            return vec![
                Reply::err(
                    "ERR the keys of several shards are reached only on a standalone node"
                );
                cmds.len()
            ];
        };
        let now = self.now();
        let mut st = ExecStats::default();
        let mut held = vec![(self.id, &mut self.store)];
        for l in lent.iter_mut() {
            let shard = l.shard;
            if let Some(s) = l.store() {
                held.push((shard, s));
            }
        }
        let mut stores = Stores::held(held, &map, every);
        let mut replies = Vec::with_capacity(cmds.len());
        for c in cmds {
            replies.push(match c {
                KeyCmd::Eval(e) => {
                    stores.wrote = false;
                    eval_in(&mut stores, e, now, &mut st)
                }
                other => stores.run(other, now, &mut st),
            });
        }
        drop(stores);
        let s = &self.stats;
        s.commands.fetch_add(cmds.len() as u64, Ordering::Relaxed);
        if st.checks > 0 {
            s.checks.fetch_add(st.checks, Ordering::Relaxed);
            s.denied.fetch_add(st.denied, Ordering::Relaxed);
        }
        self.stats.metrics.count(&st);
        replies
    }

    /// Takes the store out to lend it (`Lent`), leaving an empty one in its place until
    /// `restore`.
    pub(super) fn take_store(&mut self) -> crate::store::Store {
        std::mem::replace(&mut self.store, crate::store::Store::new(0, 0))
    }

    pub(super) fn restore(&mut self, store: crate::store::Store) {
        self.store = store;
    }

    /// The shard's limit time (see `clock::Timeline`): never backward, unmoved by steps of
    /// the wall clock.
    pub fn now(&mut self) -> u64 {
        self.time.now()
    }

    /// Limit time here must not fall below `at` (a snapshot's time).
    pub fn raise_time(&mut self, at: u64) {
        self.time.raise(at);
    }

    /// Applies commands at one instant, calling `each` with every reply in order.
    pub fn apply(&mut self, cmds: impl IntoIterator<Item = KeyCmd>, mut each: impl FnMut(Reply)) {
        let now = self.now();
        let (st, escalated) = self.apply_at_time(now, &mut cmds.into_iter(), |r| {
            each(r);
            true
        });
        // Only a standalone node's script escalates; a whole batch run here has none.
        if escalated.is_some() {
            each(Reply::err(crate::cmd::MISSING_REPLY));
        }
        self.stats.metrics.count(&st);
    }

    /// Starts the lookups of a batch's keys, so their cache misses overlap (see
    /// `Store::prefetch`). Small batches gain nothing from it.
    fn prefetch(&mut self, cmds: &[KeyCmd]) {
        if cmds.len() >= PREFETCH_FROM {
            let keys = cmds
                .iter()
                .take(PREFETCH_MAX)
                .filter_map(KeyCmd::single_key);
            self.store.prefetch(keys);
        }
    }

    /// Applies commands at `now` and counts them, until `each` answers false; every way into
    /// the keyspace goes through here, so the figures INFO shows cover them all. The
    /// decisions are handed back: the caller counts them for the metrics when it answers a
    /// client with them.
    fn apply_at_time<C: std::borrow::Borrow<KeyCmd>>(
        &mut self,
        now: u64,
        cmds: &mut impl Iterator<Item = C>,
        mut each: impl FnMut(Reply) -> bool,
    ) -> (ExecStats, Option<C>) {
        let mut st = ExecStats::default();
        let mut n = 0u64;
        let mut escalated = None;
        for c in cmds {
            n += 1;
            let r = self.execute_one(c.borrow(), now, &mut st);
            if is_escalate(&r) {
                escalated = Some(c);
                break;
            }
            if !each(r) {
                break;
            }
        }
        let s = &self.stats;
        s.commands.fetch_add(n, Ordering::Relaxed);
        if st.checks > 0 {
            s.checks.fetch_add(st.checks, Ordering::Relaxed);
            s.denied.fetch_add(st.denied, Ordering::Relaxed);
        }
        (st, escalated)
    }

    /// Applies committed Raft entries, each at its own time. The entries this shard
    /// proposed answer their connections here; the others' replies are handed back.
    pub fn apply_entries(&mut self, batches: Vec<crate::cluster::EntryBatch>) -> Vec<Vec<Reply>> {
        let mut all = Vec::with_capacity(batches.len());
        for b in batches {
            if let Some(gt) = self.group_time.as_mut() {
                gt.applied(b.group, b.now);
            }
            self.prefetch(&b.cmds);
            // A replica's copy of another node's entry: nobody reads its replies.
            let keep = b.wanted || self.proposer.as_ref().is_some_and(|p| p.proposed(b.origin));
            let mut out = Vec::with_capacity(if keep { b.cmds.len() } else { 0 });
            let (st, _) = self.apply_at_time(b.now, &mut b.cmds.iter(), |r| {
                if keep {
                    out.push(r);
                }
                true
            });
            let back = match self.proposer.as_mut() {
                Some(p) => {
                    let back = p.applied(b.origin, out);
                    if back.is_none() {
                        // This shard proposed the entry: its decisions were answered here.
                        self.stats.metrics.count(&st);
                    }
                    back.unwrap_or_default()
                }
                None => out,
            };
            all.push(back);
        }
        all
    }

    /// A connection's key commands (see `ShardMsg::Keyed`), from a connection on this shard.
    pub fn run(&mut self, cmds: Vec<KeyCmd>, slots: &[u16], budget: usize) -> Outcome {
        match self.proposer.as_mut() {
            None => Outcome::Ready(self.apply_within(cmds, budget)),
            Some(p) => {
                let (tx, rx) = oneshot::channel();
                p.gather(cmds, slots, tx);
                Outcome::Later(rx)
            }
        }
    }

    /// A connection's key commands, from a connection on another shard.
    pub fn run_for(
        &mut self,
        cmds: Vec<KeyCmd>,
        slots: &[u16],
        budget: usize,
        reply: oneshot::Sender<Answer>,
    ) {
        match self.proposer.as_mut() {
            None => {
                let _ = reply.send(self.apply_batch(cmds, budget));
            }
            Some(p) => {
                self.stats.remote_batches.fetch_add(1, Ordering::Relaxed);
                p.gather(cmds, slots, reply);
            }
        }
    }

    pub fn export(&self, (lo, hi): (u16, u16), now: u64) -> Vec<Record> {
        self.store.export(now, |k| (lo..=hi).contains(&key_slot(k)))
    }

    pub fn import(&mut self, (lo, hi): (u16, u16), records: &[Record]) {
        self.store
            .import(records, |k| (lo..=hi).contains(&key_slot(k)));
    }

    /// Removes the keys of slots `lo..=hi` held in partition `part` of the store.
    pub fn clear_part(&mut self, (lo, hi): (u16, u16), part: usize) {
        self.store
            .remove_in_partition(part, |k| (lo..=hi).contains(&key_slot(k)));
    }

    /// Applies a batch from another shard, within a reply budget.
    pub fn apply_batch(&mut self, cmds: Vec<KeyCmd>, budget: usize) -> Answer {
        self.stats.remote_batches.fetch_add(1, Ordering::Relaxed);
        self.apply_within(cmds, budget)
    }

    /// Applies a whole batch from a connection on this shard.
    pub fn apply_batch_local(&mut self, cmds: Vec<KeyCmd>) -> Vec<Reply> {
        let mut out = Vec::with_capacity(cmds.len());
        self.apply(cmds, |r| out.push(r));
        out
    }

    /// Applies commands in order until their replies pass `budget` bytes, and hands back
    /// the ones not run. The command that crosses the budget still runs, so every call
    /// makes progress. Replies are copies, so this is what bounds the memory one round of
    /// a client's pipelined reads (say, many GETs of a large value) can take.
    pub fn apply_within(&mut self, cmds: Vec<KeyCmd>, budget: usize) -> Answer {
        self.prefetch(&cmds);
        let now = self.now();
        let mut replies = Vec::with_capacity(cmds.len());
        let mut used = 0usize;
        let mut it = cmds.into_iter();
        let (st, escalated) = self.apply_at_time(now, &mut it, |r| {
            used = used.saturating_add(reply_bytes(&r));
            replies.push(r);
            used < budget
        });
        self.stats.metrics.count(&st);
        let escalate = escalated.is_some();
        Answer {
            replies,
            rest: escalated.into_iter().chain(it).collect(),
            refused: None,
            escalate,
        }
    }

    /// This shard holds keys of a cluster's groups (see `group_times`).
    pub(crate) fn hold_groups(&mut self, spec: crate::cluster::ClusterSpec) {
        self.group_time = Some(super::group_times::GroupTimes::new(spec));
    }

    /// One step of active expiry, then publishes the figures INFO shows. In a cluster, keys
    /// expire by their group's time; the groups whose leader should move it on (an empty
    /// entry) are handed back.
    pub fn sweep(&mut self) -> Vec<crate::cluster::GroupId> {
        let now = self.now();
        // A shard that adds and removes nothing still joins a cap switched on elsewhere.
        self.store.sync_caps();
        let due = match self.group_time.as_mut() {
            None => {
                self.store.sweep(now, SWEEP_PARTS_PER_TICK);
                Vec::new()
            }
            Some(gt) => {
                self.store
                    .sweep_by(now, SWEEP_PARTS_PER_TICK, |key, exp| gt.expired(key, exp));
                gt.due_groups(std::time::Instant::now())
            }
        };
        // Freed records go back to the allocator, which keeps them; once the store has shrunk
        // to under half of its peak, hand them back to the operating system, so RSS follows
        // the active callers. Not while keys only come and go: the allocator reuses what they
        // free at once, and memory handed back would only be faulted in (and zeroed) again.
        // Likewise once it has grown by an eighth: the blocks its partitions and index
        // outgrew (each grows by doubling) are free, and the allocator would keep them.
        // At most once a second: trimming walks the allocator's free lists.
        let bytes = self.store.usage.bytes;
        self.peak_since_trim = self.peak_since_trim.max(bytes);
        let shrunk = self.peak_since_trim - bytes;
        let grown = bytes.saturating_sub(self.bytes_at_trim);
        if ((shrunk >= TRIM_AFTER_BYTES && shrunk * 2 >= self.peak_since_trim)
            || grown >= (bytes / 8).max(GROWN_BEFORE_TRIM))
            && self.last_trim.elapsed() >= Duration::from_secs(1)
        {
            self.peak_since_trim = bytes;
            self.bytes_at_trim = bytes;
            self.last_trim = std::time::Instant::now();
            release_free_memory();
        }
        let u = &self.store.usage;
        let s = &self.stats;
        s.keys.store(u.keys as u64, Ordering::Relaxed);
        s.bytes.store(u.bytes as u64, Ordering::Relaxed);
        s.expired.store(u.expired, Ordering::Relaxed);
        s.rejected_full.store(u.rejected_full, Ordering::Relaxed);
        s.expires.store(u.expires as u64, Ordering::Relaxed);
        s.avg_ttl_ms.store(u.avg_ttl_ms, Ordering::Relaxed);
        due
    }
}
