//! A store's table: partitions of packed records found through a hash index; the lookup of a
//! key (with lazy expiry) and the entry handles it gives; the prefetch a batch issues before it
//! runs; and the sweep that expires, compacts and shrinks one partition at a time.

use super::Store;
use super::record::{
    EntryView, OwnedValue, Value, append, encode_payload, is_expired, key_header_len, key_of, kill,
    layout, record_len, room_of, view,
};
use super::usage::{StoreFull, Usage};
use hashbrown::HashTable;
use hashbrown::hash_table::OccupiedEntry;

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
    /// Bytes of dead records in the arena.
    dead: usize,
    /// Expiry bookkeeping for the sweep.
    timing: SweepTiming,
}

/// When a partition is worth sweeping: keys that never expire cost nothing, and a partition
/// where keys only trickle out is not walked on every pass.
#[derive(Default)]
struct SweepTiming {
    /// No key of the partition expires before this (0: none has an expiry). May be early, never
    /// late.
    next_expiry: u64,
    /// Do not walk the partition again before this time, unless nothing has been swept for long.
    cooldown_until: u64,
}

impl SweepTiming {
    fn note(&mut self, expires_at: u64) {
        if expires_at != 0 && (self.next_expiry == 0 || expires_at < self.next_expiry) {
            self.next_expiry = expires_at;
        }
    }
}

/// After a walk that removed only this fraction of a partition (1 in N), the partition rests.
const TRICKLE: usize = 64;
/// How long a partition rests after a walk that removed little, in ns.
const REST_NS: u64 = 1_000_000_000;

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
    dead: &'a mut usize,
    timing: &'a mut SweepTiming,
    usage: &'a mut Usage,
    scratch: &'a mut Vec<u8>,
}

pub struct EmptySlot<'a> {
    index: &'a mut HashTable<u32>,
    arena: &'a mut Vec<u8>,
    timing: &'a mut SweepTiming,
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
        encode_payload(value, expires_at, room_of(self.arena, off), self.scratch);
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

    /// Changes only the expiry (counters, strings and hashes).
    pub fn set_expiry(&mut self, expires_at: u64) {
        // Copied out first: re-encoding writes the arena a string, semaphore or hash lives in.
        let detached = OwnedValue::from(self.get().value);
        let mut scratch = Vec::new();
        self.set(detached.as_value(&mut scratch), expires_at);
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
        encode_payload(value, expires_at, 0, self.scratch);
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

impl Store {
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
            dead,
            timing,
        } = &mut partitions[Self::partition_of(hash)];
        let index = match index.find_entry(index_hash(hash), |&o| key_of(arena, o as usize) == key)
        {
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
                vacant.into_table()
            }
            Err(absent) => absent.into_table(),
        };
        Slot::Empty(EmptySlot {
            index,
            arena,
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
        let v = view(&part.arena, off as usize);
        (!is_expired(v.expires_at, now)).then_some(v)
    }

    /// Removes expired entries from the next `partitions` partitions of the table, compacting and
    /// shrinking them as they empty; returns how many entries were removed.
    pub fn sweep(&mut self, now: u64, partitions: usize) -> usize {
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
            let (mut live_before, mut gone) = (0, 0);
            if due {
                usage.sweep_walks += 1;
                let Partition {
                    index,
                    arena,
                    dead,
                    timing,
                } = &mut *part;
                live_before = arena.len() - *dead;
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
                gone = before - index.len();
                removed += gone;
                timing.next_expiry = next;
                timing.cooldown_until = if gone * TRICKLE < before {
                    now.saturating_add(REST_NS)
                } else {
                    0
                };
            }
            for &o in part.index.iter().take(TTL_SAMPLES_PER_PARTITION) {
                let exp = view(&part.arena, o as usize).expires_at;
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
mod tests {
    use super::*;
    use crate::limiter::State;
    use crate::store::tests::put;
    use crate::store::{Holder, Holders, Semaphore};

    #[test]
    fn keys_of_one_partition_spread_over_every_index_tag() {
        // The index compares a key only where a slot's 7-bit tag (the top bits of the hash it
        // was given) matches. If the partition's own bits fed the tag, a partition's keys
        // would share most of it, and a probe would read and compare about half the slots it
        // passes.
        let s = Store::new(0, 0);
        let mut tags = std::collections::HashSet::new();
        let mut starts = std::collections::HashSet::new();
        for i in 0..200_000u32 {
            let hash = s.hash(format!("bucket:{i}").as_bytes());
            if Store::partition_of(hash) == 5 {
                tags.insert(index_hash(hash) >> 57);
                starts.insert(index_hash(hash) & 1023);
            }
        }
        assert_eq!(tags.len(), 128, "tags in use: {}", tags.len());
        // And the probe's start (the low bits) is not fixed by the partition either.
        assert!(
            starts.len() > 900,
            "start positions in use: {}",
            starts.len()
        );
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
        assert_eq!(s.sweep(100, Store::partitions()), 20_000);
        assert_eq!(s.len(), 1);
        assert!(s.get(b"forever", 1 << 60).is_some());
        // The walk that expired them keeps the partitions' room, for keys to come...
        let arena: usize = s.partitions.iter().map(|p| p.arena.capacity()).sum();
        assert!(arena >= 20_000 * 20, "room not kept: {arena}");
        // ...and the next walk, which finds nothing expired, gives it back.
        assert_eq!(s.sweep(100, Store::partitions()), 0);
        let arena: usize = s.partitions.iter().map(|p| p.arena.capacity()).sum();
        assert!(arena < 1024, "arenas not released: {arena}");
        let index: usize = s.partitions.iter().map(|p| p.index.capacity()).sum();
        assert!(index < 1024, "indexes not released: {index}");
        assert!(s.get(b"forever", 1 << 60).is_some());
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
            s.sweep(0, Store::partitions());
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
        let arena: usize = s.partitions.iter().map(|p| p.arena.len()).sum();
        assert!(arena < 20_000 * 30 * 3, "dead space not reclaimed: {arena}");
    }

    #[test]
    fn sweep_walks_only_partitions_with_something_due() {
        let mut s = Store::new(0, 0);
        for i in 0..10_000u32 {
            put(&mut s, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
        }
        s.sweep(1_000, Store::partitions());
        assert_eq!(
            s.usage.sweep_walks, 0,
            "keys without expiry are never walked"
        );
        for i in 0..10_000u32 {
            let exp = if i == 7 { 500 } else { 1_000_000_000_000 };
            put(&mut s, &(i + 100_000).to_be_bytes(), Value::Int(1), exp, 0).unwrap();
        }
        s.sweep(100, Store::partitions());
        assert_eq!(s.usage.sweep_walks, 0, "nothing is due yet");
        assert_eq!(s.sweep(600, Store::partitions()), 1);
        assert_eq!(
            s.usage.sweep_walks, 1,
            "only the partition holding the due key"
        );
        // One key trickling out rests its partition; a full expiry is swept at once.
        assert_eq!(s.sweep(1_000_000_000_001, Store::partitions()), 9_999);
        assert_eq!(s.len(), 10_000);
    }

    /// `n` holders with tokens and deadlines from 1, packed into `buf`.
    fn semaphore(n: u64, buf: &mut Vec<u8>) -> Value<'_> {
        let holders: Vec<Holder> = (1..=n)
            .map(|i| Holder {
                token: i,
                deadline: 1_000 + i,
            })
            .collect();
        Value::Semaphore(Semaphore {
            next_token: n + 1,
            holders: Holders::pack(&holders, buf),
        })
    }

    #[test]
    fn a_semaphore_moving_within_its_room_is_rewritten_in_place() {
        let mut s = Store::new(0, 0);
        let mut buf = Vec::new();
        let mut arena_after = Vec::new();
        // Up to 16 holders and back down to 5: 4 → 8 → 16 on the way up, and the room of 16
        // is kept on the way down while more than a quarter of it is used.
        let counts: Vec<u64> = (1..=16).chain((5..16).rev()).collect();
        for &n in &counts {
            put(&mut s, b"sem", semaphore(n, &mut buf), 2_000, 0).unwrap();
            let e = s.get(b"sem", 0).unwrap();
            assert_eq!(e.value, semaphore(n, &mut Vec::new()), "{n} holders");
            assert_eq!(e.expires_at, 2_000);
            arena_after.push(s.partitions.iter().map(|p| p.arena.len()).sum::<usize>());
        }
        let grew = arena_after.windows(2).filter(|w| w[1] != w[0]).count();
        assert_eq!(grew, 2, "only the growth to 8 and to 16 appends a record");
        // The bytes counted are the record's, room included: 16 holders of 16 bytes and more.
        assert!(s.usage.bytes > 16 * 16, "{}", s.usage.bytes);
        // Down to 4 of 16: the record shrinks to a room of 4.
        put(&mut s, b"sem", semaphore(4, &mut buf), 2_000, 0).unwrap();
        assert!(s.usage.bytes < 8 * 16, "{}", s.usage.bytes);
        assert_eq!(
            s.get(b"sem", 0).map(|e| e.value),
            Some(semaphore(4, &mut buf))
        );
    }

    #[test]
    fn semaphores_survive_compaction() {
        let mut s = Store::new(0, 0);
        let mut buf = Vec::new();
        for round in 1..=6u64 {
            for i in 0..2_000u32 {
                let n = round * 3;
                put(&mut s, &i.to_le_bytes(), semaphore(n, &mut buf), 10_000, 0).unwrap();
            }
            s.sweep(0, Store::partitions());
        }
        for i in 0..2_000u32 {
            let e = s.get(&i.to_le_bytes(), 0).unwrap();
            assert_eq!(e.value, semaphore(18, &mut buf));
        }
        assert_eq!(s.sweep(10_000, Store::partitions()), 2_000);
        assert_eq!(s.usage.bytes, 0);
    }

    #[test]
    fn sweep_samples_the_average_ttl() {
        let mut s = Store::new(0, 0);
        for i in 0..200u32 {
            put(&mut s, &i.to_be_bytes(), Value::Int(1), 7_000_000_000, 0).unwrap();
        }
        put(&mut s, b"forever", Value::Int(1), 0, 0).unwrap();
        s.sweep(2_000_000_000, Store::partitions());
        assert_eq!(s.usage.avg_ttl_ms, 5_000);
    }
}
