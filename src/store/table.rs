//! A shard's keyspace, the `Store`: partitions of packed records found through a hash index;
//! the lookup of a key (with lazy expiry) and the entry handles it gives; the prefetch a batch
//! issues before it runs; the sweep that expires, compacts and shrinks one partition at a time;
//! and the operations over every key (snapshot export and import, SCAN, clearing).

use super::coll::{Coll, Colls};
use super::record::{
    EntryView, OwnedValue, Value, append, coll_id, encode_coll, encode_payload, is_expired,
    key_header_len, key_of, kill, layout, record_len, room_of, set_coll_expiry, view,
};
use super::timing::{REST_NS, SweepTiming, TRICKLE};
use super::usage::{Caps, StoreFull, Usage};
use super::{PARTITION_BITS, Record, SCAN_POSITION_BITS, ScanStep};
use hashbrown::HashTable;
use hashbrown::hash_table::OccupiedEntry;
use std::sync::Arc;

/// Number of partitions the table is split into (a power of two).
pub(super) const PARTITIONS: usize = 64;

/// Index slot and control byte per key, as counted in `Usage::bytes`.
const INDEX_COST: usize = std::mem::size_of::<u32>() + 1;

/// How far into a record its value usually ends: a 1-byte key length, a key of about 20
/// bytes, the tag and a timestamp or two.
const RECORD_TAIL: usize = 31;

/// About what a new key's record takes (a key of 20 to 40 bytes and a bucket's state).
const NEW_RECORD_GUESS: usize = 48;

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

/// One partition of the keyspace: an arena of records and the index into it.
#[derive(Default)]
pub(super) struct Partition {
    pub(super) index: HashTable<u32>,
    pub(super) arena: Vec<u8>,
    /// The collections the partition's records name.
    pub(super) colls: Colls,
    /// Bytes of dead records in the arena.
    dead: usize,
    /// Expiry bookkeeping for the sweep.
    timing: SweepTiming,
}

impl Partition {
    /// Rewrites the arena without dead records once they are half of it, or, when `keep` is 0
    /// (nothing expired since the last walk), once its room is four times its live records.
    /// The new arena has room for `keep` bytes at least: where short-lived keys come and go,
    /// room for as many as were live when the walk began, so that the arena does not grow
    /// again from nothing, by copying, before the next walk.
    fn maybe_compact(&mut self, keep: usize) {
        let live = self.arena.len() - self.dead;
        let dead_half = self.dead >= 4096 && self.dead * 2 >= self.arena.len();
        let idle_room = keep == 0 && self.arena.capacity() >= 4096 + live * 4;
        if !dead_half && !idle_room {
            return;
        }
        // `keep` is at most the arena's length: the room kept was in use a moment ago.
        let room = (live + live / 8).max(keep);
        let mut fresh = Vec::with_capacity(room);
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

/// Keys per partition whose TTL the sweep samples for INFO's `avg_ttl`.
const TTL_SAMPLES_PER_PARTITION: usize = 16;

/// A key's place in the table, after lazy expiry: either a live entry or a vacancy.
pub enum Slot<'a> {
    Live(LiveEntry<'a>),
    Empty(EmptySlot<'a>),
}

pub struct LiveEntry<'a> {
    entry: OccupiedEntry<'a, u32>,
    arena: &'a mut Vec<u8>,
    colls: &'a mut Colls,
    dead: &'a mut usize,
    timing: &'a mut SweepTiming,
    usage: &'a mut Usage,
    scratch: &'a mut Vec<u8>,
}

pub struct EmptySlot<'a> {
    index: &'a mut HashTable<u32>,
    arena: &'a mut Vec<u8>,
    colls: &'a mut Colls,
    timing: &'a mut SweepTiming,
    hasher: &'a ahash::RandomState,
    usage: &'a mut Usage,
    scratch: &'a mut Vec<u8>,
    hash: u64,
    key: &'a [u8],
}

impl<'a> LiveEntry<'a> {
    pub fn get(&self) -> EntryView<'_> {
        view(self.arena, self.colls, *self.entry.get() as usize)
    }

    /// The collection under the key, if it holds one.
    pub fn coll(&self) -> Option<&Coll> {
        self.colls
            .get(coll_id(self.arena, *self.entry.get() as usize)?)
    }

    /// Runs `f` on the collection under the key, in place, and accounts the change in its
    /// size; None (and `f` not run) if the key holds something else. A command that empties
    /// the collection removes the key afterwards, as Redis does.
    pub fn coll_mut<R>(&mut self, f: impl FnOnce(&mut Coll) -> R) -> Option<R> {
        let c = self
            .colls
            .get_mut(coll_id(self.arena, *self.entry.get() as usize)?)?;
        let before = c.mem();
        let r = f(c);
        let after = c.mem();
        if before != after {
            self.usage.resize(before, after);
            self.usage.caps.note_len(after);
        }
        Some(r)
    }

    /// Replaces the value and expiry: in place when the record keeps its size, otherwise as a
    /// new record (the old one becomes dead space for the next compaction). A collection
    /// given is copied in; one replaced is dropped.
    pub fn set(&mut self, value: Value<'_>, expires_at: u64) {
        let new_coll = match value {
            Value::Coll(c) => match self.colls.add(c.clone()) {
                Some(id) => {
                    self.usage.resize(0, c.mem());
                    Some(id)
                }
                None => return,
            },
            _ => None,
        };
        self.replace(value, new_coll, expires_at);
    }

    /// Replaces the value with collection `c` (moved in) and the expiry.
    pub fn set_coll(&mut self, c: Coll, expires_at: u64) {
        let mem = c.mem();
        if let Some(id) = self.colls.add(c) {
            self.usage.resize(0, mem);
            self.replace(Value::Int(0), Some(id), expires_at);
        }
    }

    /// Writes the record for `value`, or for collection `coll` already stored under that
    /// number, and drops the collection the record named before, if any.
    fn replace(&mut self, value: Value<'_>, coll: Option<u32>, expires_at: u64) {
        self.timing.note(expires_at);
        self.usage.caps.note_value(&value);
        let off = *self.entry.get() as usize;
        // Read before the old collection goes: a record naming no collection reads as expired.
        let had_expiry = view(self.arena, self.colls, off).expires_at != 0;
        if let Some(old) = coll_id(self.arena, off) {
            let freed = self.colls.remove(old);
            self.usage.resize(freed, 0);
        }
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
        match coll {
            Some(id) => encode_coll(id, expires_at, self.scratch),
            None => encode_payload(value, expires_at, room_of(self.arena, off), self.scratch),
        }
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

    /// Changes only the expiry (counters, strings, hashes and collections).
    pub fn set_expiry(&mut self, expires_at: u64) {
        let off = *self.entry.get() as usize;
        let had_expiry = view(self.arena, self.colls, off).expires_at != 0;
        if set_coll_expiry(self.arena, off, expires_at) {
            self.timing.note(expires_at);
            match (had_expiry, expires_at != 0) {
                (true, false) => self.usage.expires -= 1,
                (false, true) => self.usage.expires += 1,
                _ => {}
            }
            return;
        }
        // Copied out first: re-encoding writes the arena a string, semaphore or hash lives in.
        let detached = OwnedValue::from(self.get().value);
        let (mut scratch, mut coll) = (Vec::new(), None);
        self.set(detached.as_value(&mut scratch, &mut coll), expires_at);
    }

    pub fn remove(self) {
        let off = *self.entry.get() as usize;
        if view(self.arena, self.colls, off).expires_at != 0 {
            self.usage.expires -= 1;
        }
        if let Some(id) = coll_id(self.arena, off) {
            let freed = self.colls.remove(id);
            self.usage.resize(freed, 0);
        }
        let len = kill(self.arena, self.dead, off);
        self.entry.remove();
        self.usage.remove(len + INDEX_COST);
    }
}

impl<'a> EmptySlot<'a> {
    /// Adds the key, unless a cap is reached. A collection given is copied in.
    pub fn insert(self, value: Value<'_>, expires_at: u64) -> Result<(), StoreFull> {
        match value {
            Value::Coll(c) => self.insert_coll(c.clone(), expires_at),
            _ => self.insert_value(value, None, expires_at),
        }
    }

    /// Adds the key holding collection `c` (moved in), unless a cap is reached.
    pub fn insert_coll(self, c: Coll, expires_at: u64) -> Result<(), StoreFull> {
        self.insert_value(Value::Int(0), Some(c), expires_at)
    }

    fn insert_value(
        self,
        value: Value<'_>,
        coll: Option<Coll>,
        expires_at: u64,
    ) -> Result<(), StoreFull> {
        self.usage.caps.note_value(&value);
        self.scratch.clear();
        let coll_mem = coll.as_ref().map_or(0, Coll::mem);
        match coll {
            // The number is written once the key is admitted; its room is the same.
            Some(_) => encode_coll(0, expires_at, self.scratch),
            None => encode_payload(value, expires_at, 0, self.scratch),
        }
        let cost = key_header_len(self.key.len())
            + self.key.len()
            + self.scratch.len()
            + INDEX_COST
            + coll_mem;
        if !self.usage.add(cost) {
            return Err(StoreFull);
        }
        let mut coll_at = None;
        if let Some(c) = coll {
            let Some(id) = self.colls.add(c) else {
                self.usage.remove(cost);
                self.usage.rejected_full += 1;
                return Err(StoreFull);
            };
            coll_at = Some(id);
            self.scratch.clear();
            encode_coll(id, expires_at, self.scratch);
        }
        self.timing.note(expires_at);
        let Some(off) = append(self.arena, self.key, self.scratch) else {
            if let Some(id) = coll_at {
                self.colls.remove(id);
            }
            self.usage.remove(cost);
            self.usage.rejected_full += 1;
            return Err(StoreFull);
        };
        if expires_at != 0 {
            self.usage.expires += 1;
        }
        let (hasher, arena) = (self.hasher, &*self.arena);
        self.index.insert_unique(index_hash(self.hash), off, |&o| {
            index_hash(hasher.hash_one(key_of(arena, o as usize)))
        });
        Ok(())
    }
}

/// The hash a partition's index files a key under, from the key's hash. The top bits of the
/// key's hash choose its partition (SCAN walks the partitions in that order), and the index
/// keeps the top 7 bits of what it is given as the tag that rules out most slots without
/// reading them: given the key's hash as it is, every key of a partition would share six of
/// the seven, and about half of the occupied slots a probe passes would match, each costing a
/// read of the slot, of its record and a key comparison. Rotated, the tag comes from the
/// lowest bits and the probe's start from the bits above them, neither of them the
/// partition's.
#[inline]
fn index_hash(hash: u64) -> u64 {
    hash.rotate_right(7)
}

pub struct Store {
    partitions: Vec<Partition>,
    hasher: ahash::RandomState,
    pub usage: Usage,
    sweep_cursor: usize,
    /// Sum of the sampled TTLs (ns) and their number, over the sweep's current round.
    ttl_sample: (u128, u64),
    scratch: Vec<u8>,
    /// The hashes of a batch's keys while `prefetch` runs (kept to reuse the allocation).
    hashes: Vec<u64>,
}

impl Store {
    /// A store with caps of its own (0 = no cap).
    pub fn new(max_keys: usize, max_bytes: usize) -> Store {
        Store::with_caps(Caps::new(max_keys, max_bytes))
    }

    /// A store that shares the node's caps with the other shards.
    pub fn with_caps(caps: Arc<Caps>) -> Store {
        Store {
            partitions: (0..PARTITIONS).map(|_| Partition::default()).collect(),
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
            hashes: Vec::new(),
        }
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
        for p in &mut self.partitions {
            *p = Partition::default();
        }
        if self.usage.counted {
            self.usage.caps.release(self.usage.keys, self.usage.bytes);
        }
        self.usage.keys = 0;
        self.usage.bytes = 0;
        self.usage.expires = 0;
    }

    /// Copies out every live key that `keep` selects (snapshots of a slot range).
    pub fn export(&self, now: u64, keep: impl Fn(&[u8]) -> bool) -> Vec<Record> {
        let mut out = Vec::new();
        for part in 0..self.partitions.len() {
            self.export_partition(part, now, &keep, &mut out);
        }
        out
    }

    /// Copies out the live keys of one partition that `keep` selects, into `out`.
    pub fn export_partition(
        &self,
        part: usize,
        now: u64,
        keep: impl Fn(&[u8]) -> bool,
        out: &mut Vec<Record>,
    ) {
        if let Some(p) = self.partitions.get(part) {
            for &o in p.index.iter() {
                let v = view(&p.arena, &p.colls, o as usize);
                let key = key_of(&p.arena, o as usize);
                if is_expired(v.expires_at, now) || !keep(key) {
                    continue;
                }
                out.push(Record {
                    key: key.to_vec(),
                    value: OwnedValue::from(v.value),
                    expires_at: v.expires_at,
                });
            }
        }
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
        let mut holders = Vec::new();
        for r in records {
            let mut coll = None;
            let value = r.value.as_value(&mut holders, &mut coll);
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

    /// Removes every key of partition `part` that `owned` selects; returns how many.
    pub fn remove_in_partition(&mut self, part: usize, owned: impl Fn(&[u8]) -> bool) -> usize {
        let Some(p) = self.partitions.get(part) else {
            return 0;
        };
        let doomed: Vec<Vec<u8>> = p
            .index
            .iter()
            .map(|&o| key_of(&p.arena, o as usize))
            .filter(|k| owned(k))
            .map(<[u8]>::to_vec)
            .collect();
        for k in &doomed {
            self.remove(k, 0);
        }
        doomed.len()
    }

    /// Calls `f` on every live key (for KEYS-style admin use, not the hot path).
    pub fn for_each_key(&self, now: u64, mut f: impl FnMut(&[u8])) {
        for p in &self.partitions {
            for &o in p.index.iter() {
                if !is_expired(view(&p.arena, &p.colls, o as usize).expires_at, now) {
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
    /// Cost: each step walks (and hashes the keys of) the partition it resumes in, plus whole
    /// partitions holding fewer than `count` keys. A step that stops inside a partition of P
    /// keys takes at least P/8 of them, so a full scan walks each partition at most about 9
    /// times: O(keys) overall whatever `count` is, at the price of steps that return up to P/8
    /// keys when `count` is smaller.
    pub fn scan(
        &self,
        from: u64,
        count: usize,
        now: u64,
        mut f: impl FnMut(&[u8], Value<'_>),
    ) -> ScanStep {
        let mut examined = 0usize;
        let first =
            usize::try_from(from >> (SCAN_POSITION_BITS - PARTITION_BITS)).unwrap_or(PARTITIONS);
        let mut candidates: Vec<(u64, u32)> = Vec::new();
        for p in first..PARTITIONS {
            let part = &self.partitions[p];
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
                let v = view(&part.arena, &part.colls, o as usize);
                if !is_expired(v.expires_at, now) {
                    f(key_of(&part.arena, o as usize), v.value);
                }
            }
            let next_part = (p + 1 < PARTITIONS)
                .then(|| ((p + 1) as u64) << (SCAN_POSITION_BITS - PARTITION_BITS));
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
    /// run through the partitions in order.
    fn scan_position(&self, key: &[u8]) -> u64 {
        self.hash(key) >> (64 - SCAN_POSITION_BITS)
    }

    pub(super) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn partition_of(hash: u64) -> usize {
        (hash >> 58) as usize & (PARTITIONS - 1)
    }

    /// Starts loading what the lookups of `keys` will touch (their index entries and the
    /// records they point at) into the cache, without waiting for it. Called with a batch's
    /// keys before the batch runs, so the cache misses of a large keyspace overlap instead of
    /// coming one after another.
    ///
    /// A lookup touches three cache lines, each found only through the one before: the
    /// index's control bytes, the index slot, the record. So this goes over the keys twice.
    /// The first pass reads only control bytes (a probe that compares nothing), and its misses
    /// overlap across keys. The second pass finds those bytes in the cache, reads the slots
    /// (their misses overlap too) and asks for each candidate's record without reading it.
    pub fn prefetch<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]>) {
        let mut hashes = std::mem::take(&mut self.hashes);
        hashes.clear();
        hashes.extend(keys.map(|key| self.hash(key)));
        // Hashed first, in a loop of their own: the probes then follow each other closely
        // enough that the processor has many of their misses in flight at once. The probes
        // also ask for where new keys' records will go: the end of their partition's arena,
        // moved on by about a record for each earlier key of the batch in the same partition.
        // An arena's end is written again only every few dozen inserts, by which time its
        // line has left the cache, and the first write to it made the insert wait for memory.
        let mut ahead = [0u16; PARTITIONS];
        for &hash in &hashes {
            let p = Self::partition_of(hash);
            let part = &self.partitions[p];
            let _ = part.index.find(index_hash(hash), |_| false);
            if let Some(k) = ahead.get_mut(p) {
                let at = part.arena.len() + usize::from(*k) * NEW_RECORD_GUESS;
                if at < part.arena.capacity() {
                    prefetch_read(part.arena.as_ptr().wrapping_add(at));
                }
                *k = k.saturating_add(1);
            }
        }
        for &hash in &hashes {
            let part = &self.partitions[Self::partition_of(hash)];
            let _ = part.index.find(index_hash(hash), |&o| {
                if let Some(rec) = part.arena.get(o as usize..) {
                    prefetch_read(rec.as_ptr());
                    // A small record (a bucket or a counter under a short key) straddles two
                    // cache lines almost half the time: ask for its tail's line too (the
                    // same line again, at no cost, when it does not straddle).
                    if let Some(tail) = rec.get(RECORD_TAIL..) {
                        prefetch_read(tail.as_ptr());
                    }
                }
                false
            });
        }
        self.hashes = hashes;
    }

    /// Finds `key`, dropping it first if it has expired.
    pub fn slot<'a>(&'a mut self, key: &'a [u8], now: u64) -> Slot<'a> {
        let hash = self.hash(key);
        let Store {
            partitions,
            hasher,
            usage,
            scratch,
            ..
        } = self;
        let Partition {
            index,
            arena,
            colls,
            dead,
            timing,
        } = &mut partitions[Self::partition_of(hash)];
        let index = match index.find_entry(index_hash(hash), |&o| key_of(arena, o as usize) == key)
        {
            Ok(occ) => {
                let off = *occ.get() as usize;
                if !is_expired(view(arena, colls, off).expires_at, now) {
                    return Slot::Live(LiveEntry {
                        entry: occ,
                        arena,
                        colls,
                        dead,
                        timing,
                        usage,
                        scratch,
                    });
                }
                let freed = coll_id(arena, off).map_or(0, |id| colls.remove(id));
                let len = kill(arena, dead, off);
                let (_, vacant) = occ.remove();
                usage.remove(len + INDEX_COST + freed);
                usage.expires -= 1;
                usage.expired += 1;
                vacant.into_table()
            }
            Err(absent) => absent.into_table(),
        };
        Slot::Empty(EmptySlot {
            index,
            arena,
            colls,
            timing,
            hasher,
            usage,
            scratch,
            hash,
            key,
        })
    }

    /// Reads `key` without changing anything (an expired key reads as absent).
    pub fn get(&self, key: &[u8], now: u64) -> Option<EntryView<'_>> {
        let hash = self.hash(key);
        let part = &self.partitions[Self::partition_of(hash)];
        let off = *part.index.find(index_hash(hash), |&o| {
            key_of(&part.arena, o as usize) == key
        })?;
        let v = view(&part.arena, &part.colls, off as usize);
        (!is_expired(v.expires_at, now)).then_some(v)
    }

    /// Removes expired entries from the next `partitions` partitions of the table, compacting and
    /// shrinking them as they empty; returns how many entries were removed.
    pub fn sweep(&mut self, now: u64, partitions: usize) -> usize {
        self.sweep_by(now, partitions, |_, exp| is_expired(exp, now))
    }

    /// As `sweep`, where `expired(key, expires_at)` says whether a key whose expiry time is
    /// at or before `now` is gone (in a cluster, a key expires by its group's time, which may
    /// be behind `now`). Partitions with nothing due by `now` are not walked.
    pub fn sweep_by(
        &mut self,
        now: u64,
        partitions: usize,
        mut expired: impl FnMut(&[u8], u64) -> bool,
    ) -> usize {
        let mut removed = 0;
        for _ in 0..partitions.min(PARTITIONS) {
            let idx = self.sweep_cursor;
            self.sweep_cursor = (self.sweep_cursor + 1) % PARTITIONS;
            let usage = &mut self.usage;
            let part = &mut self.partitions[idx];
            let t = &part.timing;
            let due = t.next_expiry != 0 && t.next_expiry <= now && t.cooldown_until <= now;
            // Entries and live bytes when the walk began, and how many the walk removed.
            let before = part.index.len();
            let (mut live_before, mut gone, mut held) = (0, 0, 0);
            if due {
                usage.sweep_walks += 1;
                let Partition {
                    index,
                    arena,
                    colls,
                    dead,
                    timing,
                } = &mut *part;
                live_before = arena.len() - *dead;
                let mut next = 0u64;
                index.retain(|o| {
                    let off = *o as usize;
                    let exp = view(arena, colls, off).expires_at;
                    let due = is_expired(exp, now);
                    if due && expired(key_of(arena, off), exp) {
                        let freed = coll_id(arena, off).map_or(0, |id| colls.remove(id));
                        let len = kill(arena, dead, off);
                        usage.remove(len + INDEX_COST + freed);
                        usage.expires -= 1;
                        false
                    } else {
                        held += usize::from(due);
                        if exp != 0 && (next == 0 || exp < next) {
                            next = exp;
                        }
                        true
                    }
                });
                gone = before - index.len();
                removed += gone;
                timing.next_expiry = next;
                // Keys held back by `expired` go soon (their group's time is on its way): no
                // rest then.
                timing.cooldown_until = if held == 0 && gone * TRICKLE < before {
                    now.saturating_add(REST_NS)
                } else {
                    0
                };
            }
            for &o in part.index.iter().take(TTL_SAMPLES_PER_PARTITION) {
                let exp = view(&part.arena, &part.colls, o as usize).expires_at;
                if exp > now {
                    self.ttl_sample.0 += u128::from(exp - now);
                    self.ttl_sample.1 += 1;
                }
            }
            if self.sweep_cursor == 0 {
                // A full round of the partitions: publish its sample and start the next.
                let (sum, n) = std::mem::take(&mut self.ttl_sample);
                self.usage.avg_ttl_ms = sum
                    .checked_div(u128::from(n))
                    .map_or(0, |ns| u64::try_from(ns / 1_000_000).unwrap_or(u64::MAX));
            }
            // Where keys expired since the last walk, as many may come before the next one:
            // the partition keeps its room for what was live when this walk began. Where none
            // did (`before` is then what is live), the room beyond what is live goes back.
            if part.index.is_empty() {
                if gone > 0 {
                    part.arena.clear();
                    part.dead = 0;
                } else if part.arena.capacity() > 0 || part.index.capacity() > 0 {
                    // Give everything back, not just the records.
                    *part = Partition::default();
                }
                continue;
            }
            part.maybe_compact(if gone > 0 { live_before } else { 0 });
            if part.index.capacity() > 64 && before * 4 < part.index.capacity() {
                let hasher = &self.hasher;
                let arena = &part.arena;
                part.index.shrink_to(before * 2, |&o| {
                    index_hash(hasher.hash_one(key_of(arena, o as usize)))
                });
            }
        }
        self.usage.expired += removed as u64;
        removed
    }

    /// Number of partitions; a full sweep visits each once.
    pub const fn partitions() -> usize {
        PARTITIONS
    }
}

#[cfg(test)]
mod tests;
