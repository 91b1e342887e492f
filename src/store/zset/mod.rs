//! A sorted set: members ordered by (score, member), in Redis 7.0's two encodings.
//!
//! - `packed`: while the set holds at most `MAX_PACKED_ENTRIES` members of at most
//!   `MAX_PACKED_VALUE` bytes, one contiguous buffer (Redis's listpack, with its
//!   `zset-max-listpack-entries 128` and `zset-max-listpack-value 64`);
//! - `index`: above that, an order-statistic tree and a member table (Redis's skiplist and
//!   dict), with O(log n) insertion, removal and rank.
//!
//! A set moves to the index the moment an insertion would pass either bound, and never moves
//! back while it lives, as in Redis; a set rebuilt from a snapshot takes the packed form again
//! if it fits, as Redis does when it loads one.
//!
//! Scores are never NaN: the commands refuse one before it reaches a set. Scores compare as
//! numbers, so 0 and -0 are one score (the member then decides the order), as in Redis.

mod index;
mod packed;

use index::Index;
use packed::Packed;
use std::cmp::Ordering;

/// Members the packed form holds at most (`zset-max-listpack-entries`).
pub(crate) const MAX_PACKED_ENTRIES: usize = 128;
/// Bytes of the longest member the packed form holds (`zset-max-listpack-value`).
pub(crate) const MAX_PACKED_VALUE: usize = 64;

/// A member and its score, borrowed from a set.
pub(crate) type Entry<'a> = (&'a [u8], f64);

/// Up to where a sorted set stays packed: Redis's `zset-max-listpack-entries` and
/// `zset-max-listpack-value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLimits {
    pub entries: usize,
    pub value: usize,
}

impl Default for PackLimits {
    fn default() -> PackLimits {
        PackLimits {
            entries: MAX_PACKED_ENTRIES,
            value: MAX_PACKED_VALUE,
        }
    }
}

/// The order of a sorted set.
pub(crate) fn cmp_key(a: (f64, &[u8]), b: (f64, &[u8])) -> Ordering {
    a.0.partial_cmp(&b.0)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.1.cmp(b.1))
}

/// What jemalloc hands out for a request of `n` bytes: 8, then multiples of 16 up to 128,
/// then four sizes per doubling. What a buffer really costs, not what it asked for.
pub(crate) fn alloc_size(n: usize) -> usize {
    match n {
        0 => 0,
        1..=8 => 8,
        9..=128 => n.div_ceil(16) * 16,
        _ => {
            let step = n.next_power_of_two() / 8;
            n.div_ceil(step) * step
        }
    }
}

#[derive(Debug, Clone)]
enum Repr {
    Packed(Packed),
    Index(Box<Index>),
}

/// A sorted set.
#[derive(Debug, Clone)]
pub struct ZSet {
    repr: Repr,
}

impl Default for ZSet {
    fn default() -> ZSet {
        ZSet {
            repr: Repr::Packed(Packed::default()),
        }
    }
}

/// Two sets are equal when they hold the same members with the same scores (to the bit),
/// whatever their encodings.
impl PartialEq for ZSet {
    fn eq(&self, other: &ZSet) -> bool {
        self.len() == other.len() && self.to_owned_pairs() == other.to_owned_pairs()
    }
}

impl Eq for ZSet {}

impl ZSet {
    pub fn new() -> ZSet {
        ZSet::default()
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Packed(p) => p.len(),
            Repr::Index(i) => i.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// OBJECT ENCODING's name, as Redis 7.0 gives it.
    pub fn encoding(&self) -> &'static str {
        match &self.repr {
            Repr::Packed(_) => "listpack",
            Repr::Index(_) => "skiplist",
        }
    }

    /// Heap bytes the set holds, as the allocator rounds them. O(1): each part keeps its
    /// own count.
    pub fn mem(&self) -> usize {
        match &self.repr {
            Repr::Packed(p) => alloc_size(p.capacity()),
            Repr::Index(i) => alloc_size(std::mem::size_of::<Index>()) + i.heap_bytes(),
        }
    }

    pub fn score(&self, member: &[u8]) -> Option<f64> {
        match &self.repr {
            Repr::Packed(p) => p.score(member),
            Repr::Index(i) => i.score(member),
        }
    }

    /// The member's place from the lowest score, from 0.
    pub fn rank(&self, member: &[u8]) -> Option<usize> {
        match &self.repr {
            Repr::Packed(p) => p.rank(member),
            Repr::Index(i) => i.rank(member),
        }
    }

    /// Sets the member's score, adding it if new; answers the score it had, if any. False in
    /// the second place when the set cannot grow (past 2^32 - 2 members).
    pub fn set(&mut self, member: &[u8], score: f64) -> (Option<f64>, bool) {
        self.set_within(member, score, PackLimits::default())
    }

    /// `set`, converting a packed set to the index once it passes `limits` (the node's
    /// `zset-max-listpack-entries` and `zset-max-listpack-value`).
    pub fn set_within(
        &mut self,
        member: &[u8],
        score: f64,
        limits: PackLimits,
    ) -> (Option<f64>, bool) {
        let old = self.score(member);
        if let Some(old) = old {
            if old == score {
                return (Some(old), true);
            }
            self.remove(member);
        }
        let grows = old.is_none();
        if let Repr::Packed(p) = &self.repr
            && (member.len() > limits.value || (grows && p.len() >= limits.entries))
        {
            self.convert_to_index();
        }
        let stored = match &mut self.repr {
            Repr::Packed(p) => {
                p.insert(member, score);
                true
            }
            Repr::Index(i) => i.insert(member, score),
        };
        (old, stored)
    }

    /// Removes the member; its score if it was there.
    pub fn remove(&mut self, member: &[u8]) -> Option<f64> {
        match &mut self.repr {
            Repr::Packed(p) => p.remove(member),
            Repr::Index(i) => i.remove(member),
        }
    }

    /// How many entries, from the lowest, satisfy `pred`, which must hold for a prefix of
    /// the set's order (a lower bound on score or member).
    pub fn partition_point(&self, pred: impl FnMut(Entry<'_>) -> bool) -> usize {
        match &self.repr {
            Repr::Packed(p) => p.partition_point(pred),
            Repr::Index(i) => i.partition_point(pred),
        }
    }

    /// Calls `f` on the entries of ranks `from..to`, lowest first.
    pub fn each(&self, from: usize, to: usize, mut f: impl FnMut(Entry<'_>)) {
        let to = to.min(self.len());
        match &self.repr {
            Repr::Packed(p) => p.each(from, to, &mut f),
            Repr::Index(i) => i.each(from, to, &mut f),
        }
    }

    /// Removes the entries of ranks `from..to`; answers how many went.
    pub fn remove_range(&mut self, from: usize, to: usize) -> usize {
        let to = to.min(self.len());
        if from >= to {
            return 0;
        }
        match &mut self.repr {
            Repr::Packed(p) => p.remove_range(from, to),
            Repr::Index(i) => i.remove_range(from, to),
        }
        to - from
    }

    fn convert_to_index(&mut self) {
        if let Repr::Packed(p) = &self.repr {
            let mut index = Index::default();
            for (m, s) in p.entries() {
                index.insert(m, s);
            }
            self.repr = Repr::Index(Box::new(index));
        }
    }

    /// (member, score bits), in the set's order: the snapshot form.
    pub fn to_owned_pairs(&self) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::with_capacity(self.len());
        self.each(0, self.len(), |(m, s)| out.push((m.to_vec(), s.to_bits())));
        out
    }

    /// Rebuilds a set from its snapshot form: packed if it fits, as Redis loads one. A NaN
    /// score (which no command stores) is read as 0.
    pub fn from_owned_pairs(pairs: &[(Vec<u8>, u64)]) -> ZSet {
        let mut z = ZSet::new();
        let fits = pairs.len() <= MAX_PACKED_ENTRIES
            && pairs.iter().all(|(m, _)| m.len() <= MAX_PACKED_VALUE);
        if !fits {
            z.repr = Repr::Index(Box::default());
        }
        for (m, bits) in pairs {
            let s = f64::from_bits(*bits);
            z.set(m, if s.is_nan() { 0.0 } else { s });
        }
        z
    }
}

#[cfg(test)]
mod tests;
