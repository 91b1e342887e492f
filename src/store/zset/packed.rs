//! A small sorted set as one contiguous buffer, what Redis calls a listpack: entries in order
//! of (score, member), each `score | member length (LEB128) | member`.
//!
//! A score that is a whole number of magnitude below 2^53 is written as a LEB128 of
//! `zigzag(n) << 1`, so a small count takes one byte and a millisecond timestamp seven; any
//! other score is the byte 1 then its eight bytes, little-endian. As in a listpack, where
//! Redis writes whole scores as integers, -0 is kept as 0. Every operation
//! walks the buffer, which holds at most `MAX_ENTRIES` members of at most `MAX_VALUE` bytes.
//!
//! The buffer is grown and shrunk to fit exactly, as a listpack is reallocated at every
//! change: a set of a hundred members keeps no room for a second hundred.

use super::{Entry, cmp_key};
use std::cmp::Ordering;

/// Largest whole-number magnitude written in the short form (all such values are exact).
const INT_LIMIT: f64 = 9_007_199_254_740_992.0;

#[derive(Debug, Clone, Default)]
pub(super) struct Packed {
    buf: Vec<u8>,
    len: usize,
}

/// Where one entry lies in the buffer.
#[derive(Debug, Clone, Copy)]
struct At {
    start: usize,
    member: usize,
    end: usize,
    score: f64,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a LEB128 at `*at`; None on a truncated or overlong one (a buffer is only ever
/// written by `encode`, so neither happens).
fn get_varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn encode(out: &mut Vec<u8>, score: f64, member: &[u8]) {
    if score.fract() == 0.0 && score.abs() < INT_LIMIT {
        let n = score as i64;
        let zigzag = ((n << 1) ^ (n >> 63)) as u64;
        put_varint(out, zigzag << 1);
    } else {
        out.push(1);
        out.extend_from_slice(&score.to_le_bytes());
    }
    put_varint(out, member.len() as u64);
    out.extend_from_slice(member);
}

impl Packed {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes asked of the allocator.
    pub(super) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    fn decode(&self, start: usize) -> Option<At> {
        let mut at = start;
        let head = get_varint(&self.buf, &mut at)?;
        let score = if head & 1 == 0 {
            let z = head >> 1;
            ((z >> 1) as i64 ^ -((z & 1) as i64)) as f64
        } else {
            let bytes = self.buf.get(at..at + 8)?;
            at += 8;
            f64::from_le_bytes(bytes.try_into().ok()?)
        };
        let mlen = usize::try_from(get_varint(&self.buf, &mut at)?).ok()?;
        let end = at.checked_add(mlen).filter(|&e| e <= self.buf.len())?;
        Some(At {
            start,
            member: at,
            end,
            score,
        })
    }

    fn iter(&self) -> impl Iterator<Item = At> + '_ {
        let mut next = 0;
        std::iter::from_fn(move || {
            if next >= self.buf.len() {
                return None;
            }
            let at = self.decode(next)?;
            next = at.end;
            Some(at)
        })
    }

    fn member(&self, at: &At) -> &[u8] {
        &self.buf[at.member..at.end]
    }

    /// The entries in order.
    pub(super) fn entries(&self) -> impl Iterator<Item = Entry<'_>> + '_ {
        self.iter().map(|a| (self.member(&a), a.score))
    }

    fn find(&self, member: &[u8]) -> Option<(usize, At)> {
        self.iter()
            .enumerate()
            .find(|(_, a)| self.member(a) == member)
    }

    pub(super) fn score(&self, member: &[u8]) -> Option<f64> {
        self.find(member).map(|(_, a)| a.score)
    }

    pub(super) fn rank(&self, member: &[u8]) -> Option<usize> {
        self.find(member).map(|(i, _)| i)
    }

    /// Adds `member`, which must not be in the set.
    pub(super) fn insert(&mut self, member: &[u8], score: f64) {
        let pos = self
            .iter()
            .find(|a| cmp_key((a.score, self.member(a)), (score, member)) == Ordering::Greater)
            .map_or(self.buf.len(), |a| a.start);
        let mut bytes = Vec::with_capacity(member.len() + 12);
        encode(&mut bytes, score, member);
        self.buf.reserve_exact(bytes.len());
        self.buf.splice(pos..pos, bytes);
        self.len += 1;
    }

    /// Removes `member`; its score if it was there.
    pub(super) fn remove(&mut self, member: &[u8]) -> Option<f64> {
        let (_, at) = self.find(member)?;
        self.buf.drain(at.start..at.end);
        self.len -= 1;
        self.fit();
        Some(at.score)
    }

    /// Entries before the first for which `pred` is false (`pred` holds for a prefix).
    pub(super) fn partition_point(&self, mut pred: impl FnMut(Entry<'_>) -> bool) -> usize {
        self.entries().take_while(|&e| pred(e)).count()
    }

    /// Calls `f` on the entries of ranks `from..to`, in order.
    pub(super) fn each(&self, from: usize, to: usize, f: &mut dyn FnMut(Entry<'_>)) {
        self.entries()
            .skip(from)
            .take(to.saturating_sub(from))
            .for_each(f);
    }

    /// Removes the entries of ranks `from..to`.
    pub(super) fn remove_range(&mut self, from: usize, to: usize) {
        let bounds: Vec<usize> = self
            .iter()
            .enumerate()
            .filter(|(i, _)| *i == from || *i + 1 == to)
            .flat_map(|(i, a)| {
                [
                    (i == from).then_some(a.start),
                    (i + 1 == to).then_some(a.end),
                ]
            })
            .flatten()
            .collect();
        if let [start, end] = bounds[..] {
            self.buf.drain(start..end);
            self.len -= to - from;
            self.fit();
        }
    }

    /// Gives back the room a removal left.
    fn fit(&mut self) {
        if self.buf.capacity() > self.buf.len() {
            self.buf.shrink_to_fit();
        }
    }
}
