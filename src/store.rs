//! The keyspace one shard owns: a hash table of entries with expiry and memory accounting.
//!
//! Only the shard thread touches a `Store`, so nothing here locks. The table is split into
//! parts by hash so active expiry can sweep one small part at a time instead of stalling the
//! shard on a full pass.

use crate::limiter::State;
use hashbrown::HashTable;
use hashbrown::hash_table::{Entry as TableEntry, OccupiedEntry, VacantEntry};

/// Number of parts the table is split into (a power of two).
const PARTS: usize = 64;

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Limiter state.
    Bucket(State),
    /// A counter set by INCR or by SET with an integer.
    Int(i64),
    /// Any other string.
    Str(Box<[u8]>),
}

#[derive(Debug)]
pub struct Entry {
    pub key: Box<[u8]>,
    pub value: Value,
    /// Absolute expiry in ns since the epoch; 0 = never.
    pub expires_at: u64,
}

impl Entry {
    fn cost(&self) -> usize {
        let value_bytes = match &self.value {
            Value::Str(s) => s.len(),
            _ => 0,
        };
        // Key and value bytes, the slot itself, and hashbrown's control byte.
        self.key.len() + value_bytes + std::mem::size_of::<Entry>() + 1
    }

    fn is_expired(&self, now: u64) -> bool {
        self.expires_at != 0 && self.expires_at <= now
    }
}

/// Refusal to add a key: the key cap or the memory cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreFull;

/// Counts and caps; kept beside the table so an entry and its accounting are updated together.
#[derive(Debug, Default)]
pub struct Usage {
    pub keys: usize,
    pub bytes: usize,
    pub max_keys: usize,
    pub max_bytes: usize,
    pub expired: u64,
    pub rejected_full: u64,
}

impl Usage {
    fn admits(&self, extra_bytes: usize) -> bool {
        (self.max_keys == 0 || self.keys < self.max_keys)
            && (self.max_bytes == 0 || self.bytes + extra_bytes <= self.max_bytes)
    }
}

pub struct Store {
    parts: Vec<HashTable<Entry>>,
    hasher: ahash::RandomState,
    pub usage: Usage,
    sweep_cursor: usize,
}

/// A key's place in the table, after lazy expiry: either a live entry or a vacancy.
pub enum Slot<'a> {
    Live(LiveEntry<'a>),
    Empty(EmptySlot<'a>),
}

pub struct LiveEntry<'a> {
    entry: OccupiedEntry<'a, Entry>,
    usage: &'a mut Usage,
}

pub struct EmptySlot<'a> {
    vacant: VacantEntry<'a, Entry>,
    usage: &'a mut Usage,
    key: &'a [u8],
}

impl<'a> LiveEntry<'a> {
    pub fn get(&self) -> &Entry {
        self.entry.get()
    }

    /// Replaces the value and expiry, keeping the memory accounting right.
    pub fn set(&mut self, value: Value, expires_at: u64) {
        let e = self.entry.get_mut();
        let before = e.cost();
        e.value = value;
        e.expires_at = expires_at;
        let after = e.cost();
        self.usage.bytes = self.usage.bytes.saturating_sub(before) + after;
    }

    pub fn set_expiry(&mut self, expires_at: u64) {
        self.entry.get_mut().expires_at = expires_at;
    }

    pub fn remove(self) {
        let (e, _) = self.entry.remove();
        self.usage.keys -= 1;
        self.usage.bytes = self.usage.bytes.saturating_sub(e.cost());
    }
}

impl<'a> EmptySlot<'a> {
    /// Adds the key, unless a cap is reached.
    pub fn insert(self, value: Value, expires_at: u64) -> Result<(), StoreFull> {
        let entry = Entry {
            key: self.key.into(),
            value,
            expires_at,
        };
        let cost = entry.cost();
        if !self.usage.admits(cost) {
            self.usage.rejected_full += 1;
            return Err(StoreFull);
        }
        self.usage.keys += 1;
        self.usage.bytes += cost;
        self.vacant.insert(entry);
        Ok(())
    }
}

impl Store {
    pub fn new(max_keys: usize, max_bytes: usize) -> Store {
        Store {
            parts: (0..PARTS).map(|_| HashTable::new()).collect(),
            // Fixed seeds keep the layout reproducible; keys never leave the shard, so there
            // is no cross-node hash-flooding concern beyond what ahash already resists.
            hasher: ahash::RandomState::with_seeds(
                0x243f_6a88_85a3_08d3,
                0x1319_8a2e_0370_7344,
                0xa409_3822_299f_31d0,
                0x082e_fa98_ec4e_6c89,
            ),
            usage: Usage {
                max_keys,
                max_bytes,
                ..Usage::default()
            },
            sweep_cursor: 0,
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn part_of(hash: u64) -> usize {
        (hash >> 58) as usize & (PARTS - 1)
    }

    /// Finds `key`, dropping it first if it has expired.
    pub fn slot<'a>(&'a mut self, key: &'a [u8], now: u64) -> Slot<'a> {
        let hash = self.hash(key);
        let hasher = &self.hasher;
        let usage = &mut self.usage;
        let table = &mut self.parts[Self::part_of(hash)];
        match table.entry(hash, |e| &*e.key == key, |e| hasher.hash_one(&*e.key)) {
            TableEntry::Occupied(occ) => {
                if occ.get().is_expired(now) {
                    let (old, vacant) = occ.remove();
                    usage.keys -= 1;
                    usage.bytes = usage.bytes.saturating_sub(old.cost());
                    usage.expired += 1;
                    Slot::Empty(EmptySlot { vacant, usage, key })
                } else {
                    Slot::Live(LiveEntry { entry: occ, usage })
                }
            }
            TableEntry::Vacant(vacant) => Slot::Empty(EmptySlot { vacant, usage, key }),
        }
    }

    /// Reads `key` without changing anything (an expired key reads as absent).
    pub fn get(&self, key: &[u8], now: u64) -> Option<&Entry> {
        let hash = self.hash(key);
        self.parts[Self::part_of(hash)]
            .find(hash, |e| &*e.key == key)
            .filter(|e| !e.is_expired(now))
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
            *p = HashTable::new();
        }
        self.usage.keys = 0;
        self.usage.bytes = 0;
    }

    /// Removes expired entries from the next `parts` parts of the table; returns how many.
    pub fn sweep(&mut self, now: u64, parts: usize) -> usize {
        let mut removed = 0;
        for _ in 0..parts.min(PARTS) {
            let idx = self.sweep_cursor;
            self.sweep_cursor = (self.sweep_cursor + 1) % PARTS;
            let usage = &mut self.usage;
            let table = &mut self.parts[idx];
            table.retain(|e| {
                if e.is_expired(now) {
                    usage.keys -= 1;
                    usage.bytes = usage.bytes.saturating_sub(e.cost());
                    removed += 1;
                    false
                } else {
                    true
                }
            });
            // Give memory back once a part has shrunk well below its capacity.
            if table.capacity() > 64 && table.len() * 4 < table.capacity() {
                let hasher = &self.hasher;
                table.shrink_to(table.len() * 2, |e| hasher.hash_one(&*e.key));
            }
        }
        self.usage.expired += removed as u64;
        removed
    }

    /// Number of parts; a full sweep visits each once.
    pub const fn parts() -> usize {
        PARTS
    }

    /// Calls `f` on every live key (for KEYS/SCAN-style admin use, not the hot path).
    pub fn for_each_key(&self, now: u64, mut f: impl FnMut(&[u8])) {
        for p in &self.parts {
            for e in p.iter() {
                if !e.is_expired(now) {
                    f(&e.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(s: &mut Store, k: &[u8], v: i64, exp: u64, now: u64) -> Result<(), StoreFull> {
        match s.slot(k, now) {
            Slot::Live(mut l) => {
                l.set(Value::Int(v), exp);
                Ok(())
            }
            Slot::Empty(e) => e.insert(Value::Int(v), exp),
        }
    }

    #[test]
    fn insert_get_remove() {
        let mut s = Store::new(0, 0);
        put(&mut s, b"a", 1, 0, 10).unwrap();
        assert_eq!(
            s.get(b"a", 10).map(|e| e.value.clone()),
            Some(Value::Int(1))
        );
        assert_eq!(s.len(), 1);
        assert!(s.remove(b"a", 10));
        assert!(!s.remove(b"a", 10));
        assert_eq!(s.len(), 0);
        assert_eq!(s.usage.bytes, 0);
    }

    #[test]
    fn lazy_and_active_expiry() {
        let mut s = Store::new(0, 0);
        for i in 0..1000u32 {
            put(&mut s, &i.to_be_bytes(), 1, 100, 0).unwrap();
        }
        put(&mut s, b"forever", 1, 0, 0).unwrap();
        assert!(s.get(&7u32.to_be_bytes(), 100).is_none());
        assert_eq!(s.sweep(100, Store::parts()), 1000);
        assert_eq!(s.len(), 1);
        assert!(s.get(b"forever", 1 << 60).is_some());
    }

    #[test]
    fn key_cap_refuses_new_keys_but_updates_live_ones() {
        let mut s = Store::new(2, 0);
        put(&mut s, b"a", 1, 0, 0).unwrap();
        put(&mut s, b"b", 1, 0, 0).unwrap();
        assert_eq!(put(&mut s, b"c", 1, 0, 0), Err(StoreFull));
        put(&mut s, b"a", 5, 0, 0).unwrap();
        assert_eq!(s.get(b"a", 0).map(|e| e.value.clone()), Some(Value::Int(5)));
        assert_eq!(s.usage.rejected_full, 1);
    }
}
