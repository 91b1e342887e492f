//! The collection values (sorted sets, lists, sets) and where a partition keeps them.
//!
//! A collection does not live in the arena: its record there holds the key, the expiry and the
//! collection's number in the partition's `Colls`, and the collection itself is an object of
//! its own that a command changes in place. A sorted set that a sliding log adds to on every
//! request would otherwise be copied whole, as a new record, at every change. Each type keeps a
//! compact encoding while small (one contiguous buffer) and an index above that; `mem` is what
//! it counts in the store's memory use.
//!
//! Everything here is deterministic: the same commands applied to two stores leave the same
//! collections, in the same order, on every replica.

use super::list::List;
use super::set::MemberSet;
use super::zset::ZSet;
use serde::{Deserialize, Serialize};

/// A collection value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coll {
    ZSet(ZSet),
    List(List),
    Set(MemberSet),
}

/// A collection detached from the store, as it travels in a snapshot. Part of
/// `OwnedValue`'s encoding: the variant order is its encoding; new ones go at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OwnedColl {
    /// (member, score as `f64::to_bits`), in order of score then member.
    ZSet(Vec<(Vec<u8>, u64)>),
    /// Elements from head to tail.
    List(Vec<Vec<u8>>),
    /// Members, in the set's own order.
    Set(Vec<Vec<u8>>),
}

impl Coll {
    /// TYPE's name for the value.
    pub fn type_name(&self) -> &'static str {
        match self {
            Coll::ZSet(_) => "zset",
            Coll::List(_) => "list",
            Coll::Set(_) => "set",
        }
    }

    /// OBJECT ENCODING's name for the value, as Redis 7.0 names its encodings.
    pub fn encoding(&self) -> &'static str {
        match self {
            Coll::ZSet(z) => z.encoding(),
            Coll::List(l) => l.encoding(),
            Coll::Set(s) => s.encoding(),
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            Coll::ZSet(z) => z.len(),
            Coll::List(l) => l.len(),
            Coll::Set(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the collection takes, as counted in the store's memory use.
    pub fn mem(&self) -> usize {
        match self {
            Coll::ZSet(z) => z.mem(),
            Coll::List(l) => l.mem(),
            Coll::Set(s) => s.mem(),
        }
    }

    pub fn to_owned_coll(&self) -> OwnedColl {
        match self {
            Coll::ZSet(z) => OwnedColl::ZSet(z.to_owned_pairs()),
            Coll::List(l) => OwnedColl::List(l.to_owned_items()),
            Coll::Set(s) => OwnedColl::Set(s.to_owned_members()),
        }
    }

    pub fn from_owned(o: &OwnedColl) -> Coll {
        match o {
            OwnedColl::ZSet(pairs) => Coll::ZSet(ZSet::from_owned_pairs(pairs)),
            OwnedColl::List(items) => Coll::List(List::from_owned_items(items)),
            OwnedColl::Set(members) => Coll::Set(MemberSet::from_owned_members(members)),
        }
    }
}

/// A partition's collections, by number. A number is reused once its collection is gone.
#[derive(Debug, Default)]
pub(super) struct Colls {
    slots: Vec<Option<Coll>>,
    free: Vec<u32>,
}

impl Colls {
    /// Keeps `c`; returns its number, or None past 2^32 collections in one partition.
    pub(super) fn add(&mut self, c: Coll) -> Option<u32> {
        if let Some(id) = self.free.pop()
            && let Some(slot) = self.slots.get_mut(id as usize)
        {
            *slot = Some(c);
            return Some(id);
        }
        let id = u32::try_from(self.slots.len()).ok()?;
        self.slots.push(Some(c));
        Some(id)
    }

    pub(super) fn get(&self, id: u32) -> Option<&Coll> {
        self.slots.get(id as usize).and_then(Option::as_ref)
    }

    pub(super) fn get_mut(&mut self, id: u32) -> Option<&mut Coll> {
        self.slots.get_mut(id as usize).and_then(Option::as_mut)
    }

    /// Drops collection `id`; returns the bytes it took.
    pub(super) fn remove(&mut self, id: u32) -> usize {
        match self.slots.get_mut(id as usize).and_then(Option::take) {
            Some(c) => {
                self.free.push(id);
                c.mem()
            }
            None => 0,
        }
    }
}
