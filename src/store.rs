//! The keyspace one shard owns: compact records in per-part arenas, found through a hash index,
//! with expiry and memory accounting.
//!
//! Memory follows active callers, so the per-key overhead is what matters: a GCRA bucket is a
//! record of `key length (1 byte) + key + tag (1 byte) + 8-byte timestamp` packed into an arena,
//! and the hash index holds only a 4-byte offset per key. Records that change size are appended
//! and the old one is marked dead; the sweep compacts a part once half of it is dead.
//!
//! The table is split into parts by hash so that active expiry and compaction work on one small
//! part at a time instead of stalling the shard. Only the shard thread touches a `Store`.

use crate::limiter::State;
use hashbrown::HashTable;
use hashbrown::hash_table::OccupiedEntry;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Number of parts the table is split into (a power of two).
const PARTS: usize = 64;

/// A key's value, borrowed from the arena for reading or given for writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Limiter state.
    Bucket(State),
    /// A counter set by INCR or by SET with an integer.
    Int(i64),
    /// Any other string.
    Str(&'a [u8]),
}

/// A value detached from the store, for snapshots.
///
/// On-disk format: bincode-encoded into snapshots (golden bytes in tests/encoding.rs).
/// Variants are append-only: add new ones at the end, never reorder or change existing ones.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OwnedValue {
    Bucket(State),
    Int(i64),
    Str(Vec<u8>),
}

/// One key as it travels in a snapshot.
///
/// On-disk format: bincode-encoded into snapshots (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub key: Vec<u8>,
    pub value: OwnedValue,
    pub expires_at: u64,
}

/// A live key as read from the store.
#[derive(Debug, Clone, Copy)]
pub struct EntryView<'a> {
    pub value: Value<'a>,
    /// Absolute expiry in ns since the epoch; 0 = never.
    pub expires_at: u64,
}

/// Refusal to add a key: the key cap or the memory cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreFull;

/// The node's key and memory caps, shared by every shard's store so that they hold for the
/// node as a whole however keys spread over shards. The caps can change at run time (CONFIG
/// SET). The shared counters are only kept while a cap is set, and only touched when a key is
/// added or removed, never on a plain check.
///
/// Invariant: `keys` and `bytes` are the sum of the usage of every store whose
/// `Usage::counted` is set. Only a store's own thread changes its usage and its `counted`
/// flag, and it adds or withdraws its whole usage whenever it sees that caps were switched on
/// or off (`Usage::sync_caps`), so the sum stays exact however the caps change.
#[derive(Debug, Default)]
pub struct Caps {
    /// 0 = no cap.
    max_keys: AtomicUsize,
    /// 0 = no cap.
    max_bytes: AtomicUsize,
    keys: AtomicUsize,
    bytes: AtomicUsize,
    /// The largest string value any store has held (a high-water mark, never lowered): how
    /// large one reply carrying a stored value can be.
    largest_value: AtomicUsize,
}

impl Caps {
    pub fn new(max_keys: usize, max_bytes: usize) -> Arc<Caps> {
        Arc::new(Caps {
            max_keys: AtomicUsize::new(max_keys),
            max_bytes: AtomicUsize::new(max_bytes),
            ..Caps::default()
        })
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys.load(Ordering::Relaxed)
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// The largest string value stored so far (at least 4 KiB: smaller ones are not tracked).
    pub fn largest_value(&self) -> usize {
        self.largest_value.load(Ordering::Relaxed).max(4096)
    }

    /// Raises the largest-value mark; touches the shared counter only for a large value.
    fn note_value(&self, value: &Value<'_>) {
        if let Value::Str(s) = value
            && s.len() > 4096
        {
            self.largest_value.fetch_max(s.len(), Ordering::Relaxed);
        }
    }

    /// Changes the key cap; each store starts or stops counting on its next add or removal,
    /// or when told to (`Store::sync_caps`).
    pub fn set_max_keys(&self, n: usize) {
        self.max_keys.store(n, Ordering::Relaxed);
    }

    pub fn set_max_bytes(&self, n: usize) {
        self.max_bytes.store(n, Ordering::Relaxed);
    }

    fn enabled(&self) -> bool {
        self.max_keys() > 0 || self.max_bytes() > 0
    }

    /// Takes room for one key of `bytes`; false if a cap would be passed.
    fn reserve(&self, bytes: usize) -> bool {
        let max_keys = self.max_keys();
        if self.keys.fetch_add(1, Ordering::Relaxed) >= max_keys && max_keys > 0 {
            self.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let max_bytes = self.max_bytes();
        if self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > max_bytes && max_bytes > 0 {
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Counts keys admitted regardless of the caps (a snapshot being installed, or a store
    /// that starts counting).
    fn force(&self, keys: usize, bytes: usize) {
        self.keys.fetch_add(keys, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn release(&self, keys: usize, bytes: usize) {
        self.keys.fetch_sub(keys, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Counts and caps; kept beside the table so an entry and its accounting change together.
#[derive(Debug, Default)]
pub struct Usage {
    pub keys: usize,
    /// Bytes of live records plus the index slots they occupy.
    pub bytes: usize,
    pub caps: Arc<Caps>,
    pub expired: u64,
    pub rejected_full: u64,
    /// Parts the sweep has walked (a part with nothing due is skipped without a walk).
    pub sweep_walks: u64,
    /// Keys that have an expiry (buckets always do: they expire once refilled).
    pub expires: usize,
    /// Average time to live of keys with an expiry, in ms, sampled by the sweep over its last
    /// full round of the parts (0 until one has completed).
    pub avg_ttl_ms: u64,
    /// This store's usage is included in the caps' shared counters.
    counted: bool,
    /// Adds are admitted regardless of the caps (installing a snapshot).
    admit_all: bool,
}

impl Usage {
    /// Accounts a new key of `cost` bytes, unless a cap is reached.
    fn add(&mut self, cost: usize) -> bool {
        self.sync_caps();
        if self.counted {
            if self.admit_all {
                self.caps.force(1, cost);
            } else if !self.caps.reserve(cost) {
                self.rejected_full += 1;
                return false;
            }
        }
        self.keys += 1;
        self.bytes += cost;
        true
    }

    fn remove(&mut self, cost: usize) {
        self.sync_caps();
        let cost = cost.min(self.bytes);
        self.keys -= 1;
        self.bytes -= cost;
        if self.counted {
            self.caps.release(1, cost);
        }
    }

    fn resize(&mut self, old: usize, new: usize) {
        self.sync_caps();
        let old = old.min(self.bytes);
        self.bytes = self.bytes - old + new;
        if self.counted {
            self.caps.force(0, new);
            self.caps.release(0, old);
        }
    }

    /// Adds this store's usage to the shared counters when caps were switched on, and takes it
    /// out when they were switched off.
    fn sync_caps(&mut self) {
        let on = self.caps.enabled();
        if on != self.counted {
            if on {
                self.caps.force(self.keys, self.bytes);
            } else {
                self.caps.release(self.keys, self.bytes);
            }
            self.counted = on;
        }
    }
}

// Record tags. The payload that follows each is fixed by the tag (strings carry a length).
const T_GCRA: u8 = 0; // tat (also its expiry)
const T_GCRA_EXP: u8 = 1; // tat, expiry
const T_FIXED: u8 = 2; // expiry, start, count
const T_SLIDING: u8 = 3; // expiry, start, prev, cur
const T_INT: u8 = 4; // value
const T_INT_EXP: u8 = 5; // value, expiry
const T_STR: u8 = 6; // len u32, bytes
const T_STR_EXP: u8 = 7; // expiry, len u32, bytes
const T_DEAD: u8 = 0xFF;

/// Index slot and control byte per key, as counted in `Usage::bytes`.
const INDEX_COST: usize = std::mem::size_of::<u32>() + 1;

fn rd64(a: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&a[at..at + 8]);
    u64::from_le_bytes(b)
}

fn rd32(a: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&a[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Where a record's parts are.
struct Layout {
    key_start: usize,
    key_len: usize,
    tag_at: usize,
}

fn layout(a: &[u8], off: usize) -> Layout {
    if a[off] < 0xFF {
        let key_len = a[off] as usize;
        Layout {
            key_start: off + 1,
            key_len,
            tag_at: off + 1 + key_len,
        }
    } else {
        let key_len = rd32(a, off + 1) as usize;
        Layout {
            key_start: off + 5,
            key_len,
            tag_at: off + 5 + key_len,
        }
    }
}

/// Asks the processor to bring the cache line at `p` in, without waiting for it.
#[inline(always)]
fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and reads nothing into the program,
    // whatever the address; `p` points into a live allocation anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn key_of(a: &[u8], off: usize) -> &[u8] {
    let l = layout(a, off);
    &a[l.key_start..l.key_start + l.key_len]
}

fn key_header_len(key_len: usize) -> usize {
    if key_len < 0xFF { 1 } else { 5 }
}

/// Bytes of payload after the tag.
fn payload_len(a: &[u8], tag: u8, at: usize) -> usize {
    match tag {
        T_GCRA | T_INT => 8,
        T_GCRA_EXP | T_INT_EXP => 16,
        T_FIXED => 24,
        T_SLIDING => 32,
        T_STR => 4 + rd32(a, at) as usize,
        T_STR_EXP => 12 + rd32(a, at + 8) as usize,
        _ => 0,
    }
}

fn record_len(a: &[u8], off: usize) -> usize {
    let l = layout(a, off);
    let tag = a[l.tag_at];
    l.tag_at + 1 - off + payload_len(a, tag, l.tag_at + 1)
}

fn view(a: &[u8], off: usize) -> EntryView<'_> {
    let l = layout(a, off);
    let p = l.tag_at + 1;
    match a[l.tag_at] {
        T_GCRA => {
            let tat = rd64(a, p);
            EntryView {
                value: Value::Bucket(State::Gcra { tat }),
                expires_at: tat,
            }
        }
        T_GCRA_EXP => EntryView {
            value: Value::Bucket(State::Gcra { tat: rd64(a, p) }),
            expires_at: rd64(a, p + 8),
        },
        T_FIXED => EntryView {
            value: Value::Bucket(State::Fixed {
                start: rd64(a, p + 8),
                count: rd64(a, p + 16),
            }),
            expires_at: rd64(a, p),
        },
        T_SLIDING => EntryView {
            value: Value::Bucket(State::Sliding {
                start: rd64(a, p + 8),
                prev: rd64(a, p + 16),
                cur: rd64(a, p + 24),
            }),
            expires_at: rd64(a, p),
        },
        T_INT => EntryView {
            value: Value::Int(rd64(a, p) as i64),
            expires_at: 0,
        },
        T_INT_EXP => EntryView {
            value: Value::Int(rd64(a, p) as i64),
            expires_at: rd64(a, p + 8),
        },
        T_STR => {
            let n = rd32(a, p) as usize;
            EntryView {
                value: Value::Str(&a[p + 4..p + 4 + n]),
                expires_at: 0,
            }
        }
        T_STR_EXP => {
            let n = rd32(a, p + 8) as usize;
            EntryView {
                value: Value::Str(&a[p + 12..p + 12 + n]),
                expires_at: rd64(a, p),
            }
        }
        // Dead records are never reachable from the index; read as an expired counter.
        _ => EntryView {
            value: Value::Int(0),
            expires_at: 1,
        },
    }
}

/// The tag and payload bytes for a value.
fn encode_payload(value: Value<'_>, expires_at: u64, out: &mut Vec<u8>) {
    let push = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    match value {
        Value::Bucket(State::Gcra { tat }) if tat == expires_at => {
            out.push(T_GCRA);
            push(out, tat);
        }
        Value::Bucket(State::Gcra { tat }) => {
            out.push(T_GCRA_EXP);
            push(out, tat);
            push(out, expires_at);
        }
        Value::Bucket(State::Fixed { start, count }) => {
            out.push(T_FIXED);
            push(out, expires_at);
            push(out, start);
            push(out, count);
        }
        Value::Bucket(State::Sliding { start, prev, cur }) => {
            out.push(T_SLIDING);
            push(out, expires_at);
            push(out, start);
            push(out, prev);
            push(out, cur);
        }
        Value::Int(v) if expires_at == 0 => {
            out.push(T_INT);
            push(out, v as u64);
        }
        Value::Int(v) => {
            out.push(T_INT_EXP);
            push(out, v as u64);
            push(out, expires_at);
        }
        Value::Str(s) => {
            // Values are bounded by the protocol's bulk limit, far below 4 GiB.
            let n = u32::try_from(s.len()).unwrap_or(u32::MAX);
            if expires_at == 0 {
                out.push(T_STR);
            } else {
                out.push(T_STR_EXP);
                push(out, expires_at);
            }
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&s[..n as usize]);
        }
    }
}

fn is_expired(expires_at: u64, now: u64) -> bool {
    expires_at != 0 && expires_at <= now
}

/// Appends a record (key header, key, encoded payload); returns its offset, or None if the
/// arena would pass 4 GiB.
fn append(arena: &mut Vec<u8>, key: &[u8], payload: &[u8]) -> Option<u32> {
    let off = u32::try_from(arena.len()).ok()?;
    let key_len = u32::try_from(key.len()).ok()?;
    if arena.len() + key.len() + payload.len() + 5 > u32::MAX as usize {
        return None;
    }
    if key.len() < 0xFF {
        arena.push(key.len() as u8);
    } else {
        arena.push(0xFF);
        arena.extend_from_slice(&key_len.to_le_bytes());
    }
    arena.extend_from_slice(key);
    arena.extend_from_slice(payload);
    Some(off)
}

/// Marks the record at `off` dead; returns its length.
fn kill(arena: &mut [u8], dead: &mut usize, off: usize) -> usize {
    let len = record_len(arena, off);
    let l = layout(arena, off);
    arena[l.tag_at] = T_DEAD;
    *dead += len;
    len
}

/// One part of the keyspace: an arena of records and the index into it.
#[derive(Default)]
struct Part {
    index: HashTable<u32>,
    arena: Vec<u8>,
    /// Bytes of dead records in the arena.
    dead: usize,
    /// Expiry bookkeeping for the sweep.
    timing: PartTiming,
}

/// When a part is worth sweeping: keys that never expire cost nothing, and a part where keys
/// only trickle out is not walked on every pass.
#[derive(Default)]
struct PartTiming {
    /// No key of the part expires before this (0: none has an expiry). May be early, never late.
    next_expiry: u64,
    /// Do not walk the part again before this time, unless nothing has been swept for long.
    cooldown_until: u64,
}

impl PartTiming {
    fn note(&mut self, expires_at: u64) {
        if expires_at != 0 && (self.next_expiry == 0 || expires_at < self.next_expiry) {
            self.next_expiry = expires_at;
        }
    }
}

/// After a walk that removed only this fraction of a part (1 in N), the part rests.
const TRICKLE: usize = 64;
/// How long a part rests after a walk that removed little, in ns.
const REST_NS: u64 = 1_000_000_000;

impl Part {
    /// Rewrites the arena without dead records once they are half of it.
    fn maybe_compact(&mut self) {
        if self.dead < 4096 || self.dead * 2 < self.arena.len() {
            return;
        }
        let live = self.arena.len() - self.dead;
        let mut fresh = Vec::with_capacity(live + live / 8);
        for off in self.index.iter_mut() {
            let start = *off as usize;
            let len = record_len(&self.arena, start);
            // The live total fits: it was at most the old arena's length.
            *off = fresh.len() as u32;
            fresh.extend_from_slice(&self.arena[start..start + len]);
        }
        self.arena = fresh;
        self.dead = 0;
    }
}

pub struct Store {
    parts: Vec<Part>,
    hasher: ahash::RandomState,
    pub usage: Usage,
    sweep_cursor: usize,
    /// Sum of the sampled TTLs (ns) and their number, over the sweep's current round.
    ttl_sample: (u128, u64),
    scratch: Vec<u8>,
}

/// Keys per part whose TTL the sweep samples for INFO's `avg_ttl`.
const TTL_SAMPLES_PER_PART: usize = 16;

/// A key's place in the table, after lazy expiry: either a live entry or a vacancy.
pub enum Slot<'a> {
    Live(LiveEntry<'a>),
    Empty(EmptySlot<'a>),
}

pub struct LiveEntry<'a> {
    entry: OccupiedEntry<'a, u32>,
    arena: &'a mut Vec<u8>,
    dead: &'a mut usize,
    timing: &'a mut PartTiming,
    usage: &'a mut Usage,
    scratch: &'a mut Vec<u8>,
}

pub struct EmptySlot<'a> {
    index: &'a mut HashTable<u32>,
    arena: &'a mut Vec<u8>,
    timing: &'a mut PartTiming,
    hasher: &'a ahash::RandomState,
    usage: &'a mut Usage,
    scratch: &'a mut Vec<u8>,
    hash: u64,
    key: &'a [u8],
}

impl<'a> LiveEntry<'a> {
    pub fn get(&self) -> EntryView<'_> {
        view(self.arena, *self.entry.get() as usize)
    }

    /// Replaces the value and expiry: in place when the record keeps its size, otherwise as a
    /// new record (the old one becomes dead space for the next compaction).
    pub fn set(&mut self, value: Value<'_>, expires_at: u64) {
        self.timing.note(expires_at);
        self.usage.caps.note_value(&value);
        let off = *self.entry.get() as usize;
        let had_expiry = view(self.arena, off).expires_at != 0;
        if had_expiry != (expires_at != 0) {
            if had_expiry {
                self.usage.expires -= 1;
            } else {
                self.usage.expires += 1;
            }
        }
        let l = layout(self.arena, off);
        let old_len = record_len(self.arena, off);
        self.scratch.clear();
        encode_payload(value, expires_at, self.scratch);
        let head = l.tag_at - off;
        if head + self.scratch.len() == old_len {
            self.arena[l.tag_at..l.tag_at + self.scratch.len()].copy_from_slice(self.scratch);
            return;
        }
        let Ok(new_off) = u32::try_from(self.arena.len()) else {
            return;
        };
        let key_end = l.key_start + l.key_len;
        self.arena.extend_from_within(off..key_end);
        self.arena.extend_from_slice(self.scratch);
        kill(self.arena, self.dead, off);
        let new_len = head + self.scratch.len();
        self.usage.resize(old_len, new_len);
        *self.entry.get_mut() = new_off;
    }

    /// Changes only the expiry (counters and strings).
    pub fn set_expiry(&mut self, expires_at: u64) {
        // Strings are copied out first: re-encoding writes the arena they live in.
        let detached: Result<Value<'static>, Vec<u8>> = match self.get().value {
            Value::Str(s) => Err(s.to_vec()),
            Value::Bucket(b) => Ok(Value::Bucket(b)),
            Value::Int(i) => Ok(Value::Int(i)),
        };
        match detached {
            Ok(v) => self.set(v, expires_at),
            Err(bytes) => self.set(Value::Str(&bytes), expires_at),
        }
    }

    pub fn remove(self) {
        let off = *self.entry.get() as usize;
        if view(self.arena, off).expires_at != 0 {
            self.usage.expires -= 1;
        }
        let len = kill(self.arena, self.dead, off);
        self.entry.remove();
        self.usage.remove(len + INDEX_COST);
    }
}

impl<'a> EmptySlot<'a> {
    /// Adds the key, unless a cap is reached.
    pub fn insert(self, value: Value<'_>, expires_at: u64) -> Result<(), StoreFull> {
        self.usage.caps.note_value(&value);
        self.scratch.clear();
        encode_payload(value, expires_at, self.scratch);
        let cost =
            key_header_len(self.key.len()) + self.key.len() + self.scratch.len() + INDEX_COST;
        if !self.usage.add(cost) {
            return Err(StoreFull);
        }
        self.timing.note(expires_at);
        let Some(off) = append(self.arena, self.key, self.scratch) else {
            self.usage.remove(cost);
            self.usage.rejected_full += 1;
            return Err(StoreFull);
        };
        if expires_at != 0 {
            self.usage.expires += 1;
        }
        let (hasher, arena) = (self.hasher, &*self.arena);
        self.index.insert_unique(self.hash, off, |&o| {
            hasher.hash_one(key_of(arena, o as usize))
        });
        Ok(())
    }
}

impl Store {
    /// A store with caps of its own (0 = no cap).
    pub fn new(max_keys: usize, max_bytes: usize) -> Store {
        Store::with_caps(Caps::new(max_keys, max_bytes))
    }

    /// A store that shares the node's caps with the other shards.
    pub fn with_caps(caps: Arc<Caps>) -> Store {
        Store {
            parts: (0..PARTS).map(|_| Part::default()).collect(),
            // Fixed seeds keep the layout reproducible across runs.
            hasher: ahash::RandomState::with_seeds(
                0x243f_6a88_85a3_08d3,
                0x1319_8a2e_0370_7344,
                0xa409_3822_299f_31d0,
                0x082e_fa98_ec4e_6c89,
            ),
            usage: Usage {
                caps,
                ..Usage::default()
            },
            sweep_cursor: 0,
            ttl_sample: (0, 0),
            scratch: Vec::new(),
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn part_of(hash: u64) -> usize {
        (hash >> 58) as usize & (PARTS - 1)
    }

    /// Starts loading what a lookup of `key` will touch (its index entries and the records
    /// they point at) into the cache, without waiting for it. Called for every key of a batch
    /// before the batch runs, the cache misses of a large keyspace overlap instead of coming
    /// one after another.
    pub fn prefetch(&self, key: &[u8]) {
        let hash = self.hash(key);
        let part = &self.parts[Self::part_of(hash)];
        // The probe reads the index's control bytes (the first miss); each candidate's record
        // is only asked for, not compared, so nothing waits on it.
        let _ = part.index.find(hash, |&o| {
            if let Some(rec) = part.arena.get(o as usize..) {
                prefetch_read(rec.as_ptr());
            }
            false
        });
    }

    /// Finds `key`, dropping it first if it has expired.
    pub fn slot<'a>(&'a mut self, key: &'a [u8], now: u64) -> Slot<'a> {
        let hash = self.hash(key);
        let Store {
            parts,
            hasher,
            usage,
            scratch,
            ..
        } = self;
        let Part {
            index,
            arena,
            dead,
            timing,
        } = &mut parts[Self::part_of(hash)];
        match index.find_entry(hash, |&o| key_of(arena, o as usize) == key) {
            Ok(occ) => {
                let off = *occ.get() as usize;
                if !is_expired(view(arena, off).expires_at, now) {
                    return Slot::Live(LiveEntry {
                        entry: occ,
                        arena,
                        dead,
                        timing,
                        usage,
                        scratch,
                    });
                }
                let len = kill(arena, dead, off);
                let (_, vacant) = occ.remove();
                usage.remove(len + INDEX_COST);
                usage.expires -= 1;
                usage.expired += 1;
                Slot::Empty(EmptySlot {
                    index: vacant.into_table(),
                    arena,
                    timing,
                    hasher,
                    usage,
                    scratch,
                    hash,
                    key,
                })
            }
            Err(absent) => Slot::Empty(EmptySlot {
                index: absent.into_table(),
                arena,
                timing,
                hasher,
                usage,
                scratch,
                hash,
                key,
            }),
        }
    }

    /// Reads `key` without changing anything (an expired key reads as absent).
    pub fn get(&self, key: &[u8], now: u64) -> Option<EntryView<'_>> {
        let hash = self.hash(key);
        let part = &self.parts[Self::part_of(hash)];
        let off = *part
            .index
            .find(hash, |&o| key_of(&part.arena, o as usize) == key)?;
        let v = view(&part.arena, off as usize);
        (!is_expired(v.expires_at, now)).then_some(v)
    }

    /// Removes `key`; true if a live key was there.
    pub fn remove(&mut self, key: &[u8], now: u64) -> bool {
        match self.slot(key, now) {
            Slot::Live(live) => {
                live.remove();
                true
            }
            Slot::Empty(_) => false,
        }
    }

    pub fn len(&self) -> usize {
        self.usage.keys
    }

    pub fn is_empty(&self) -> bool {
        self.usage.keys == 0
    }

    pub fn clear(&mut self) {
        for p in &mut self.parts {
            *p = Part::default();
        }
        if self.usage.counted {
            self.usage.caps.release(self.usage.keys, self.usage.bytes);
        }
        self.usage.keys = 0;
        self.usage.bytes = 0;
        self.usage.expires = 0;
    }

    /// Removes expired entries from the next `parts` parts of the table, compacting and
    /// shrinking them as they empty; returns how many entries were removed.
    pub fn sweep(&mut self, now: u64, parts: usize) -> usize {
        let mut removed = 0;
        for _ in 0..parts.min(PARTS) {
            let idx = self.sweep_cursor;
            self.sweep_cursor = (self.sweep_cursor + 1) % PARTS;
            let usage = &mut self.usage;
            let part = &mut self.parts[idx];
            let t = &part.timing;
            let due = t.next_expiry != 0 && t.next_expiry <= now && t.cooldown_until <= now;
            if due {
                usage.sweep_walks += 1;
                let Part {
                    index,
                    arena,
                    dead,
                    timing,
                } = &mut *part;
                let before = index.len();
                let mut next = 0u64;
                index.retain(|o| {
                    let off = *o as usize;
                    let exp = view(arena, off).expires_at;
                    if is_expired(exp, now) {
                        let len = kill(arena, dead, off);
                        usage.remove(len + INDEX_COST);
                        usage.expires -= 1;
                        false
                    } else {
                        if exp != 0 && (next == 0 || exp < next) {
                            next = exp;
                        }
                        true
                    }
                });
                let gone = before - index.len();
                removed += gone;
                timing.next_expiry = next;
                timing.cooldown_until = if gone * TRICKLE < before {
                    now.saturating_add(REST_NS)
                } else {
                    0
                };
            }
            for &o in part.index.iter().take(TTL_SAMPLES_PER_PART) {
                let exp = view(&part.arena, o as usize).expires_at;
                if exp > now {
                    self.ttl_sample.0 += u128::from(exp - now);
                    self.ttl_sample.1 += 1;
                }
            }
            if self.sweep_cursor == 0 {
                // A full round of the parts: publish its sample and start the next.
                let (sum, n) = std::mem::take(&mut self.ttl_sample);
                self.usage.avg_ttl_ms = sum
                    .checked_div(u128::from(n))
                    .map_or(0, |ns| u64::try_from(ns / 1_000_000).unwrap_or(u64::MAX));
            }
            if part.index.is_empty() {
                if part.arena.capacity() > 0 {
                    // Give everything back, not just the records.
                    *part = Part::default();
                }
                continue;
            }
            part.maybe_compact();
            if part.index.capacity() > 64 && part.index.len() * 4 < part.index.capacity() {
                let hasher = &self.hasher;
                let arena = &part.arena;
                part.index.shrink_to(part.index.len() * 2, |&o| {
                    hasher.hash_one(key_of(arena, o as usize))
                });
            }
        }
        self.usage.expired += removed as u64;
        removed
    }

    /// Number of parts; a full sweep visits each once.
    pub const fn parts() -> usize {
        PARTS
    }

    /// Copies out every live key that `keep` selects (snapshots of a slot range).
    pub fn export(&self, now: u64, keep: impl Fn(&[u8]) -> bool) -> Vec<Record> {
        let mut out = Vec::new();
        for p in &self.parts {
            for &o in p.index.iter() {
                let v = view(&p.arena, o as usize);
                let key = key_of(&p.arena, o as usize);
                if is_expired(v.expires_at, now) || !keep(key) {
                    continue;
                }
                let value = match v.value {
                    Value::Bucket(s) => OwnedValue::Bucket(s),
                    Value::Int(i) => OwnedValue::Int(i),
                    Value::Str(s) => OwnedValue::Str(s.to_vec()),
                };
                out.push(Record {
                    key: key.to_vec(),
                    value,
                    expires_at: v.expires_at,
                });
            }
        }
        out
    }

    /// Replaces every key that `owned` selects with `records` (installing a snapshot). Caps do
    /// not apply: the records were admitted where they were created.
    pub fn import(&mut self, records: &[Record], owned: impl Fn(&[u8]) -> bool) {
        let mut doomed = Vec::new();
        self.for_each_key(0, |k| {
            if owned(k) {
                doomed.push(k.to_vec());
            }
        });
        for k in doomed {
            self.remove(&k, 0);
        }
        self.usage.admit_all = true;
        for r in records {
            let value = match &r.value {
                OwnedValue::Bucket(s) => Value::Bucket(*s),
                OwnedValue::Int(i) => Value::Int(*i),
                OwnedValue::Str(s) => Value::Str(s),
            };
            let _ = match self.slot(&r.key, 0) {
                Slot::Live(mut l) => {
                    l.set(value, r.expires_at);
                    Ok(())
                }
                Slot::Empty(e) => e.insert(value, r.expires_at),
            };
        }
        self.usage.admit_all = false;
    }

    /// Calls `f` on every live key (for KEYS-style admin use, not the hot path).
    pub fn for_each_key(&self, now: u64, mut f: impl FnMut(&[u8])) {
        for p in &self.parts {
            for &o in p.index.iter() {
                if !is_expired(view(&p.arena, o as usize).expires_at, now) {
                    f(key_of(&p.arena, o as usize));
                }
            }
        }
    }

    /// Starts or stops counting this store in the shared caps now, after they changed.
    pub fn sync_caps(&mut self) {
        self.usage.sync_caps();
    }

    /// One step of SCAN: examines about `count` keys whose scan position (`scan_position`)
    /// is at least `from`, in order of position, calling `f` with each live one; returns the
    /// position to resume from, or `None` once the store is done.
    ///
    /// Every key present for a whole scan is returned at least once, however keys are added,
    /// removed or moved by table growth and compaction in between: positions are fixed by the
    /// key's hash, each step covers a contiguous range of positions starting at `from`, and
    /// keys that share a position are always returned by the same step.
    ///
    /// Cost: each step walks (and hashes the keys of) the part it resumes in, plus whole parts
    /// holding fewer than `count` keys. A step that stops inside a part of P keys takes at least
    /// P/8 of them, so a full scan walks each part at most about 9 times: O(keys) overall
    /// whatever `count` is, at the price of steps that return up to P/8 keys when `count` is
    /// smaller.
    pub fn scan(
        &self,
        from: u64,
        count: usize,
        now: u64,
        mut f: impl FnMut(&[u8], Value<'_>),
    ) -> ScanStep {
        let mut examined = 0usize;
        let first = usize::try_from(from >> (SCAN_POSITION_BITS - PART_BITS)).unwrap_or(PARTS);
        let mut candidates: Vec<(u64, u32)> = Vec::new();
        for p in first..PARTS {
            let part = &self.parts[p];
            candidates.clear();
            candidates.extend(part.index.iter().filter_map(|&o| {
                let pos = self.scan_position(key_of(&part.arena, o as usize));
                (pos >= from).then_some((pos, o))
            }));
            let quota = count
                .saturating_sub(examined)
                .max(part.index.len() / 8)
                .max(1);
            let mut resume = None;
            if candidates.len() > quota {
                candidates.select_nth_unstable_by_key(quota - 1, |c| c.0);
                let cut = candidates[quota - 1].0;
                candidates.retain(|c| c.0 <= cut);
                resume = Some(cut + 1);
            }
            examined += candidates.len();
            for &(_, o) in &candidates {
                let v = view(&part.arena, o as usize);
                if !is_expired(v.expires_at, now) {
                    f(key_of(&part.arena, o as usize), v.value);
                }
            }
            let next_part =
                (p + 1 < PARTS).then(|| ((p + 1) as u64) << (SCAN_POSITION_BITS - PART_BITS));
            let next = resume.or(next_part);
            if resume.is_some() || examined >= count {
                return ScanStep { next, examined };
            }
        }
        ScanStep {
            next: None,
            examined,
        }
    }

    /// Where SCAN finds `key`: the top `SCAN_POSITION_BITS` bits of its hash, so positions
    /// run through the parts in order.
    fn scan_position(&self, key: &[u8]) -> u64 {
        self.hash(key) >> (64 - SCAN_POSITION_BITS)
    }
}

/// Bits of a scan position; the rest of a 64-bit SCAN cursor is left to name the shard.
pub const SCAN_POSITION_BITS: u32 = 54;
/// Bits of the hash that choose the part (`PARTS` is 2^PART_BITS).
const PART_BITS: u32 = PARTS.trailing_zeros();

/// What one `Store::scan` step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanStep {
    /// The position to resume from; `None` when the store has been scanned to the end.
    pub next: Option<u64>,
    /// Keys looked at, returned or not (expired ones, and those a filter drops, count too).
    pub examined: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(s: &mut Store, k: &[u8], v: Value<'_>, exp: u64, now: u64) -> Result<(), StoreFull> {
        match s.slot(k, now) {
            Slot::Live(mut l) => {
                l.set(v, exp);
                Ok(())
            }
            Slot::Empty(e) => e.insert(v, exp),
        }
    }

    fn value_of(s: &Store, k: &[u8], now: u64) -> Option<(String, u64)> {
        s.get(k, now)
            .map(|e| (format!("{:?}", e.value), e.expires_at))
    }

    #[test]
    fn insert_get_update_remove_every_kind() {
        let mut s = Store::new(0, 0);
        let long_key = vec![b'k'; 300];
        let values = [
            (Value::Bucket(State::Gcra { tat: 50 }), 50),
            (Value::Bucket(State::Gcra { tat: 50 }), 70),
            (Value::Bucket(State::Fixed { start: 1, count: 2 }), 90),
            (
                Value::Bucket(State::Sliding {
                    start: 1,
                    prev: 2,
                    cur: 3,
                }),
                90,
            ),
            (Value::Int(-5), 0),
            (Value::Int(7), 99),
            (Value::Str(b"hello"), 0),
            (Value::Str(b"a longer string value"), 99),
            (Value::Str(b""), 0),
        ];
        for key in [&b"a"[..], &long_key[..]] {
            for (v, exp) in values {
                put(&mut s, key, v, exp, 10).unwrap();
                assert_eq!(
                    value_of(&s, key, 10),
                    Some((format!("{v:?}"), exp)),
                    "{v:?}"
                );
                assert_eq!(s.len(), 1);
            }
            assert!(s.remove(key, 10));
            assert!(!s.remove(key, 10));
        }
        assert_eq!(s.len(), 0);
        assert_eq!(s.usage.bytes, 0);
    }

    #[test]
    fn lazy_and_active_expiry_and_compaction() {
        let mut s = Store::new(0, 0);
        for i in 0..20_000u32 {
            put(
                &mut s,
                &i.to_be_bytes(),
                Value::Bucket(State::Gcra { tat: 100 }),
                100,
                0,
            )
            .unwrap();
        }
        put(&mut s, b"forever", Value::Int(1), 0, 0).unwrap();
        assert!(s.get(&7u32.to_be_bytes(), 100).is_none());
        assert_eq!(s.sweep(100, Store::parts()), 20_000);
        assert_eq!(s.len(), 1);
        assert!(s.get(b"forever", 1 << 60).is_some());
        let arena: usize = s.parts.iter().map(|p| p.arena.capacity()).sum();
        assert!(arena < 1024, "arenas not released: {arena}");
    }

    #[test]
    fn updates_that_change_size_survive_compaction() {
        let mut s = Store::new(0, 0);
        for round in 0..8u64 {
            for i in 0..20_000u32 {
                let v = if round % 2 == 0 {
                    Value::Int(round as i64)
                } else {
                    Value::Bucket(State::Fixed {
                        start: round,
                        count: u64::from(i),
                    })
                };
                put(&mut s, &i.to_le_bytes(), v, 1_000_000, 0).unwrap();
            }
            s.sweep(0, Store::parts());
        }
        for i in 0..20_000u32 {
            let e = s.get(&i.to_le_bytes(), 0).unwrap();
            assert_eq!(
                e.value,
                Value::Bucket(State::Fixed {
                    start: 7,
                    count: u64::from(i)
                })
            );
        }
        // Live records are 30 bytes each; without compaction eight rounds would leave ~7x that.
        let arena: usize = s.parts.iter().map(|p| p.arena.len()).sum();
        assert!(arena < 20_000 * 30 * 3, "dead space not reclaimed: {arena}");
    }

    #[test]
    fn sweep_walks_only_parts_with_something_due() {
        let mut s = Store::new(0, 0);
        for i in 0..10_000u32 {
            put(&mut s, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
        }
        s.sweep(1_000, Store::parts());
        assert_eq!(
            s.usage.sweep_walks, 0,
            "keys without expiry are never walked"
        );
        for i in 0..10_000u32 {
            let exp = if i == 7 { 500 } else { 1_000_000_000_000 };
            put(&mut s, &(i + 100_000).to_be_bytes(), Value::Int(1), exp, 0).unwrap();
        }
        s.sweep(100, Store::parts());
        assert_eq!(s.usage.sweep_walks, 0, "nothing is due yet");
        assert_eq!(s.sweep(600, Store::parts()), 1);
        assert_eq!(s.usage.sweep_walks, 1, "only the part holding the due key");
        // One key trickling out rests its part; a full expiry is swept at once.
        assert_eq!(s.sweep(1_000_000_000_001, Store::parts()), 9_999);
        assert_eq!(s.len(), 10_000);
    }

    #[test]
    fn key_cap_refuses_new_keys_but_updates_live_ones() {
        let mut s = Store::new(2, 0);
        put(&mut s, b"a", Value::Int(1), 0, 0).unwrap();
        put(&mut s, b"b", Value::Int(1), 0, 0).unwrap();
        assert_eq!(put(&mut s, b"c", Value::Int(1), 0, 0), Err(StoreFull));
        put(&mut s, b"a", Value::Int(5), 0, 0).unwrap();
        assert_eq!(s.get(b"a", 0).map(|e| e.value), Some(Value::Int(5)));
        assert_eq!(s.usage.rejected_full, 1);
    }

    /// Runs a whole scan in steps of `count`, calling `between` after each step.
    fn scan_all(
        s: &mut Store,
        count: usize,
        mut between: impl FnMut(&mut Store, usize),
    ) -> Vec<Vec<u8>> {
        let (mut from, mut seen, mut step) = (0u64, Vec::new(), 0usize);
        loop {
            let r = s.scan(from, count, 0, |k, _| seen.push(k.to_vec()));
            step += 1;
            between(s, step);
            match r.next {
                Some(n) => {
                    assert!(n > from, "a scan step must make progress");
                    from = n;
                }
                None => return seen,
            }
        }
    }

    #[test]
    fn scan_returns_every_key_present_throughout_while_the_table_changes() {
        let mut s = Store::new(0, 0);
        let stable: Vec<Vec<u8>> = (0..3_000u32)
            .map(|i| format!("stable:{i}").into_bytes())
            .collect();
        for k in &stable {
            put(&mut s, k, Value::Int(1), 0, 0).unwrap();
        }
        for count in [1, 10, 100, 5_000] {
            let mut churn = 0u32;
            let seen = scan_all(&mut s, count, |s, step| {
                // Grow the table a lot (forcing resizes) and delete what was added before,
                // between every step.
                for _ in 0..50 {
                    churn += 1;
                    put(
                        s,
                        format!("new:{count}:{churn}").as_bytes(),
                        Value::Int(2),
                        0,
                        0,
                    )
                    .unwrap();
                }
                if step % 3 == 0 {
                    for i in churn.saturating_sub(120)..churn.saturating_sub(60) {
                        s.remove(format!("new:{count}:{i}").as_bytes(), 0);
                    }
                    s.sweep(0, Store::parts());
                }
            });
            let seen: std::collections::HashSet<_> = seen.into_iter().collect();
            let missing = stable.iter().filter(|k| !seen.contains(*k)).count();
            assert_eq!(
                missing, 0,
                "COUNT {count}: {missing} stable keys never returned"
            );
        }
    }

    #[test]
    fn scan_of_a_quiet_store_returns_each_key_once_and_skips_expired_ones() {
        let mut s = Store::new(0, 0);
        for i in 0..500u32 {
            put(&mut s, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
        }
        put(&mut s, b"gone", Value::Int(1), 5, 0).unwrap();
        let (mut from, mut seen) = (0, Vec::new());
        loop {
            let r = s.scan(from, 7, 10, |k, _| seen.push(k.to_vec()));
            match r.next {
                Some(n) => from = n,
                None => break,
            }
        }
        let unique: std::collections::HashSet<_> = seen.iter().cloned().collect();
        assert_eq!(seen.len(), 500);
        assert_eq!(unique.len(), 500);
        assert!(!unique.contains(b"gone".as_slice()));
    }

    #[test]
    fn expiry_count_follows_every_change() {
        let mut s = Store::new(0, 0);
        put(&mut s, b"a", Value::Int(1), 0, 0).unwrap();
        put(&mut s, b"b", Value::Int(1), 100, 0).unwrap();
        put(&mut s, b"c", Value::Bucket(State::Gcra { tat: 50 }), 50, 0).unwrap();
        assert_eq!(s.usage.expires, 2);
        put(&mut s, b"a", Value::Int(1), 200, 0).unwrap();
        assert_eq!(s.usage.expires, 3);
        if let Slot::Live(mut l) = s.slot(b"b", 0) {
            l.set_expiry(0);
        }
        assert_eq!(s.usage.expires, 2);
        s.remove(b"a", 0);
        assert_eq!(s.usage.expires, 1);
        // Lazy expiry on access, then the sweep.
        put(&mut s, b"d", Value::Int(1), 60, 0).unwrap();
        assert!(s.get(b"c", 55).is_none());
        assert!(matches!(s.slot(b"c", 55), Slot::Empty(_)));
        assert_eq!(s.usage.expires, 1);
        s.sweep(70, Store::parts());
        assert_eq!(s.usage.expires, 0);
        put(&mut s, b"e", Value::Int(1), 1_000, 0).unwrap();
        s.clear();
        assert_eq!(s.usage.expires, 0);
    }

    #[test]
    fn sweep_samples_the_average_ttl() {
        let mut s = Store::new(0, 0);
        for i in 0..200u32 {
            put(&mut s, &i.to_be_bytes(), Value::Int(1), 7_000_000_000, 0).unwrap();
        }
        put(&mut s, b"forever", Value::Int(1), 0, 0).unwrap();
        s.sweep(2_000_000_000, Store::parts());
        assert_eq!(s.usage.avg_ttl_ms, 5_000);
    }

    #[test]
    fn caps_switched_on_at_run_time_count_the_keys_already_held() {
        let caps = Caps::new(0, 0);
        let mut a = Store::with_caps(caps.clone());
        let mut b = Store::with_caps(caps.clone());
        for i in 0..5u32 {
            put(&mut a, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
            put(&mut b, &(i + 100).to_be_bytes(), Value::Int(1), 0, 0).unwrap();
        }
        caps.set_max_keys(12);
        a.sync_caps();
        b.sync_caps();
        put(&mut a, b"x1", Value::Int(1), 0, 0).unwrap();
        put(&mut b, b"x2", Value::Int(1), 0, 0).unwrap();
        assert_eq!(put(&mut a, b"x3", Value::Int(1), 0, 0), Err(StoreFull));
        assert_eq!(put(&mut b, b"x3", Value::Int(1), 0, 0), Err(StoreFull));
        // Switched off, then on again with room for one more: the count is still exact.
        caps.set_max_keys(0);
        put(&mut a, b"x4", Value::Int(1), 0, 0).unwrap();
        b.remove(b"x2", 0);
        caps.set_max_keys(13);
        a.sync_caps();
        b.sync_caps();
        put(&mut b, b"x5", Value::Int(1), 0, 0).unwrap();
        assert_eq!(put(&mut a, b"x6", Value::Int(1), 0, 0), Err(StoreFull));
        assert_eq!(caps.keys.load(Ordering::Relaxed), a.len() + b.len());
        caps.set_max_bytes(1 << 20);
        caps.set_max_keys(0);
        a.clear();
        b.sync_caps();
        assert_eq!(caps.keys.load(Ordering::Relaxed), b.len());
        assert_eq!(caps.bytes.load(Ordering::Relaxed), b.usage.bytes);
    }

    #[test]
    fn memory_cap_counts_bytes() {
        let mut s = Store::new(0, 100);
        put(&mut s, b"k1", Value::Str(&[0u8; 40]), 0, 0).unwrap();
        assert_eq!(
            put(&mut s, b"k2", Value::Str(&[0u8; 60]), 0, 0),
            Err(StoreFull)
        );
        assert!(s.usage.bytes <= 100);
    }
}
