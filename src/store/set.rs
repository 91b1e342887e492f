//! A set of members, in one of Redis 7.0's two encodings.
//!
//! - `intset`: while every member is an integer (as Redis reads one: no sign `+`, no leading
//!   zero, no `-0`, within `i64`) and there are at most `MAX_INTSET` members, the members are
//!   kept sorted in one buffer of 2-, 4- or 8-byte integers, the narrowest that holds them all.
//!   SMEMBERS lists them in ascending order, as Redis does.
//! - `hashtable`: otherwise, as Redis converts (never back, as Redis never converts back). The
//!   members are packed end to end in an arena, in the order they were added (each a varint of
//!   `length << 1 | removed` then its bytes), and found through an open-addressing index of
//!   4-byte arena offsets, hashed with a fixed function. SMEMBERS lists them in the arena's
//!   order: Redis lists them in hash order, which clients must not rely on; this order is the
//!   same on every replica that applied the same commands, and needs no random seed.
//!
//! `mem` counts the buffers' capacities and is O(1); every capacity is chosen here.

use super::varint;

/// Redis's `set-max-intset-entries` default: one more integer member makes a hashtable.
pub(super) const MAX_INTSET: usize = 512;

/// A set that cannot take another member: its arena would pass what a 4-byte offset reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetFull;

/// A set.
#[derive(Debug, PartialEq, Eq)]
pub struct MemberSet {
    repr: Repr,
}

#[derive(Debug, PartialEq, Eq)]
enum Repr {
    Ints(IntSet),
    Table(Table),
}

impl Default for MemberSet {
    fn default() -> MemberSet {
        MemberSet {
            repr: Repr::Ints(IntSet::default()),
        }
    }
}

impl Clone for MemberSet {
    /// A copy with the same capacities, so it counts the same `mem`.
    fn clone(&self) -> MemberSet {
        MemberSet {
            repr: match &self.repr {
                Repr::Ints(i) => Repr::Ints(IntSet {
                    width: i.width,
                    data: same_capacity(&i.data, i.data.capacity()),
                }),
                Repr::Table(t) => Repr::Table(Table {
                    arena: same_capacity(&t.arena, t.arena.capacity()),
                    slots: t.slots.clone(),
                    live: t.live,
                    tombs: t.tombs,
                    dead: t.dead,
                }),
            },
        }
    }
}

fn same_capacity(v: &[u8], capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(v);
    out
}

/// Makes room for `extra` more bytes, growing by at least an eighth.
fn reserve(buf: &mut Vec<u8>, extra: usize) {
    if buf.capacity() - buf.len() < extra {
        buf.reserve_exact(extra.max(buf.len() / 8).max(16));
    }
}

/// Gives back spare room once it is more than a quarter of what is held.
fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() - buf.len() > buf.len() / 4 + 16 {
        buf.shrink_to(buf.len() + buf.len() / 8);
    }
}

/// A member as Redis would keep it in an intset.
fn as_int(member: &[u8]) -> Option<i64> {
    crate::protocol::parse_i64(member)
}

impl MemberSet {
    pub fn new() -> MemberSet {
        MemberSet::default()
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Ints(i) => i.len(),
            Repr::Table(t) => t.live,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn encoding(&self) -> &'static str {
        match &self.repr {
            Repr::Ints(_) => "intset",
            Repr::Table(_) => "hashtable",
        }
    }

    /// Heap bytes held.
    pub fn mem(&self) -> usize {
        match &self.repr {
            Repr::Ints(i) => i.data.capacity(),
            Repr::Table(t) => t.arena.capacity() + t.slots.capacity() * 4,
        }
    }

    pub fn contains(&self, member: &[u8]) -> bool {
        match &self.repr {
            Repr::Ints(i) => as_int(member).is_some_and(|v| i.find(v).is_ok()),
            Repr::Table(t) => t.find(member, t.hash(member)).is_some(),
        }
    }

    /// Adds `member`; true if it was not there. An intset of more than `max_intset` members
    /// (`set-max-intset-entries`) becomes a hashtable.
    pub fn add(&mut self, member: &[u8], max_intset: usize) -> Result<bool, SetFull> {
        if let Repr::Ints(i) = &mut self.repr {
            if let Some(v) = as_int(member) {
                if !i.insert(v) {
                    return Ok(false);
                }
                if i.len() <= max_intset {
                    return Ok(true);
                }
                self.convert_to_table()?;
                return Ok(true);
            }
            self.convert_to_table()?;
        }
        match &mut self.repr {
            Repr::Table(t) => t.insert(member),
            Repr::Ints(_) => Ok(false),
        }
    }

    /// Removes `member`; true if it was there.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match &mut self.repr {
            Repr::Ints(i) => as_int(member).is_some_and(|v| i.remove(v)),
            Repr::Table(t) => t.remove(member),
        }
    }

    /// Calls `f` on every member, in the set's order.
    pub fn for_each(&self, mut f: impl FnMut(&[u8])) {
        match &self.repr {
            Repr::Ints(i) => {
                for k in 0..i.len() {
                    f(i.get(k).to_string().as_bytes());
                }
            }
            Repr::Table(t) => t.for_each(f),
        }
    }

    pub fn to_owned_members(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(self.len());
        self.for_each(|m| out.push(m.to_vec()));
        out
    }

    /// The set a snapshot's members (in the set's order) make: an intset when they fit one,
    /// else a hashtable in their order. A snapshot keeps no encoding, so a hashtable that
    /// shrank back to a few integers comes back as an intset, in ascending order.
    pub fn from_owned_members(members: &[Vec<u8>]) -> MemberSet {
        let ints = members.len() <= MAX_INTSET && members.iter().all(|m| as_int(m).is_some());
        let mut s = MemberSet::new();
        if !ints {
            let mut t = Table::default();
            t.resize(members.len());
            s.repr = Repr::Table(t);
        }
        for m in members {
            // The members fitted in a set before, so they fit again.
            let _ = s.add(m, MAX_INTSET);
        }
        s
    }

    /// Converts an intset into a hashtable holding the same members in ascending order.
    fn convert_to_table(&mut self) -> Result<(), SetFull> {
        let Repr::Ints(ints) = &self.repr else {
            return Ok(());
        };
        let mut t = Table::default();
        t.resize(ints.len() + 1);
        for k in 0..ints.len() {
            t.insert(ints.get(k).to_string().as_bytes())?;
        }
        self.repr = Repr::Table(t);
        Ok(())
    }
}

/// Sorted integers, little-endian, `width` bytes each.
#[derive(Debug, PartialEq, Eq)]
struct IntSet {
    width: usize,
    data: Vec<u8>,
}

impl Default for IntSet {
    fn default() -> IntSet {
        IntSet {
            width: 2,
            data: Vec::new(),
        }
    }
}

/// The narrowest width (2, 4 or 8 bytes) that holds `v`.
fn width_of(v: i64) -> usize {
    if i16::try_from(v).is_ok() {
        2
    } else if i32::try_from(v).is_ok() {
        4
    } else {
        8
    }
}

fn read_int(b: &[u8]) -> i64 {
    match *b {
        [a, b] => i64::from(i16::from_le_bytes([a, b])),
        [a, b, c, d] => i64::from(i32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e, f, g, h] => i64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => 0,
    }
}

fn int_bytes(v: i64, width: usize) -> Vec<u8> {
    v.to_le_bytes()[..width].to_vec()
}

impl IntSet {
    fn len(&self) -> usize {
        self.data.len() / self.width
    }

    fn get(&self, k: usize) -> i64 {
        self.data
            .get(k * self.width..(k + 1) * self.width)
            .map_or(0, read_int)
    }

    /// Where `v` is (Ok) or would go (Err).
    fn find(&self, v: i64) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.get(mid).cmp(&v) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    fn insert(&mut self, v: i64) -> bool {
        let w = width_of(v);
        if w > self.width {
            let mut data = Vec::with_capacity((self.len() + 1) * w);
            for k in 0..self.len() {
                data.extend_from_slice(&int_bytes(self.get(k), w));
            }
            self.data = data;
            self.width = w;
        }
        match self.find(v) {
            Ok(_) => false,
            Err(k) => {
                reserve(&mut self.data, self.width);
                let at = k * self.width;
                self.data.splice(at..at, int_bytes(v, self.width));
                true
            }
        }
    }

    fn remove(&mut self, v: i64) -> bool {
        match self.find(v) {
            Ok(k) => {
                self.data.drain(k * self.width..(k + 1) * self.width);
                shrink(&mut self.data);
                true
            }
            Err(_) => false,
        }
    }
}

/// An index slot: no member.
const EMPTY: u32 = 0;
/// An index slot whose member was removed: probing goes on past it.
const TOMB: u32 = u32::MAX;
/// The largest arena a 4-byte offset (plus one, so 0 stays free) reaches.
const MAX_ARENA: usize = (u32::MAX - 2) as usize;

/// Members packed in an arena in the order they were added, found through `slots`.
///
/// `slots` has a power-of-two length; a slot is `EMPTY`, `TOMB` or the member's arena
/// offset plus one. `live` members and `tombs` tomb slots fill at most 7/8 of it. `dead`
/// counts the arena bytes of removed members, which a rebuild drops.
#[derive(Debug, Default)]
struct Table {
    arena: Vec<u8>,
    slots: Vec<u32>,
    live: usize,
    tombs: usize,
    dead: usize,
}

/// Two tables are equal when they hold the same members in the same order.
impl PartialEq for Table {
    fn eq(&self, other: &Table) -> bool {
        let mut a = Vec::new();
        let mut b = Vec::new();
        self.for_each(|m| a.push(m.to_vec()));
        other.for_each(|m| b.push(m.to_vec()));
        a == b
    }
}

impl Eq for Table {}

/// A fixed 64-bit hash (eight bytes at a time, then a murmur3 finalizer): the same on every
/// machine and every build, which a seeded hasher is not.
fn hash_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15 ^ (b.len() as u64);
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let mut x = [0u8; 8];
        x.copy_from_slice(w);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(x)).wrapping_mul(0x5175_c1b7_2722_0a95);
    }
    let mut x = [0u8; 8];
    let tail = words.remainder();
    x[..tail.len()].copy_from_slice(tail);
    h = (h.rotate_left(5) ^ u64::from_le_bytes(x)).wrapping_mul(0x5175_c1b7_2722_0a95);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The member at arena offset `at`: its bytes, whether it was removed, and the next offset.
fn member_at(arena: &[u8], at: usize) -> Option<(&[u8], bool, usize)> {
    let (head, start) = varint::get(arena, at)?;
    let end = start.checked_add(head >> 1)?;
    Some((arena.get(start..end)?, head & 1 == 1, end))
}

/// Slots for `n` members: a power of two, filled at most 7/8.
fn slots_for(n: usize) -> usize {
    (n + n / 7 + 1).next_power_of_two().max(8)
}

impl Table {
    fn hash(&self, member: &[u8]) -> u64 {
        hash_bytes(member)
    }

    /// The slot holding `member`.
    fn find(&self, member: &[u8], h: u64) -> Option<usize> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut i = (h as usize) & mask;
        for _ in 0..self.slots.len() {
            match self.slots.get(i).copied()? {
                EMPTY => return None,
                TOMB => {}
                s => {
                    if let Some((m, false, _)) = member_at(&self.arena, (s - 1) as usize)
                        && m == member
                    {
                        return Some(i);
                    }
                }
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Places arena offset `at` for a member of hash `h` known to be absent.
    fn place(&mut self, at: usize, h: u64) {
        let Some(mask) = self.slots.len().checked_sub(1) else {
            return;
        };
        let mut i = (h as usize) & mask;
        loop {
            match self.slots.get(i).copied() {
                Some(EMPTY) => break,
                Some(TOMB) => {
                    self.tombs -= 1;
                    break;
                }
                Some(_) => i = (i + 1) & mask,
                None => return,
            }
        }
        if let Some(s) = self.slots.get_mut(i) {
            *s = (at + 1) as u32;
        }
    }

    fn insert(&mut self, member: &[u8]) -> Result<bool, SetFull> {
        let h = self.hash(member);
        if self.find(member, h).is_some() {
            return Ok(false);
        }
        let head = member.len() << 1;
        let need = varint::len(head) + member.len();
        if self.arena.len() - self.dead + need > MAX_ARENA {
            return Err(SetFull);
        }
        if (self.live + self.tombs + 1) * 8 > self.slots.len() * 7
            || self.arena.len() + need > MAX_ARENA
        {
            self.resize(self.live + 1);
        }
        let at = self.arena.len();
        reserve(&mut self.arena, need);
        varint::put(&mut self.arena, head);
        self.arena.extend_from_slice(member);
        self.place(at, h);
        self.live += 1;
        Ok(true)
    }

    fn remove(&mut self, member: &[u8]) -> bool {
        let Some(i) = self.find(member, self.hash(member)) else {
            return false;
        };
        let Some(at) = self.slots.get(i).map(|s| (s - 1) as usize) else {
            return false;
        };
        if let Some((head, start)) = varint::get(&self.arena, at) {
            if let Some(h) = self.arena.get_mut(at..start) {
                varint::write(h, head | 1);
            }
            self.dead += start - at + (head >> 1);
        }
        if let Some(s) = self.slots.get_mut(i) {
            *s = TOMB;
        }
        self.live -= 1;
        self.tombs += 1;
        if self.live == 0 {
            *self = Table::default();
        } else if self.live * 4 < self.slots.len() || self.dead * 2 > self.arena.len() {
            self.resize(self.live);
        }
        true
    }

    /// Rebuilds the arena without removed members and the index for `n` members.
    fn resize(&mut self, n: usize) {
        let keep = self.arena.len() - self.dead;
        let mut arena = Vec::with_capacity(keep + keep / 8);
        let mut at = 0;
        while let Some((_, removed, next)) = member_at(&self.arena, at) {
            if !removed {
                arena.extend_from_slice(&self.arena[at..next]);
            }
            at = next;
        }
        self.arena = arena;
        self.dead = 0;
        self.tombs = 0;
        self.slots = vec![EMPTY; slots_for(n.max(self.live))];
        let mut at = 0;
        while let Some((m, _, next)) = member_at(&self.arena, at) {
            let h = hash_bytes(m);
            self.place(at, h);
            at = next;
        }
    }

    fn for_each(&self, mut f: impl FnMut(&[u8])) {
        let mut at = 0;
        while let Some((m, removed, next)) = member_at(&self.arena, at) {
            if !removed {
                f(m);
            }
            at = next;
        }
    }
}

#[cfg(test)]
#[path = "set_tests.rs"]
mod tests;
