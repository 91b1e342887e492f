//! A list: elements from head to tail, packed into chunks of bytes.
//!
//! Redis keeps a list as a quicklist, a linked list of listpacks of about 8 KiB each. Here a
//! list is a deque of chunks; a chunk is one buffer of elements end to end, each a length
//! (`varint`) then its bytes, so a 20-byte element costs 21 bytes plus its share of the
//! chunk's spare room and of the chunk's own 32 bytes.
//!
//! Invariants a change must keep:
//! - no chunk is empty, and `count` is the number of elements in its buffer;
//! - `len` is the sum of the chunks' counts;
//! - `heap` is the sum of the chunks' buffer capacities, so `mem` is O(1);
//! - a chunk grows past `CHUNK_BYTES` only when it holds one element (a larger one gets a
//!   chunk of its own); one that does is split;
//! - buffers grow by an eighth at a time and give back room they no longer use, so spare room
//!   stays near an eighth of what is held.
//!
//! Every capacity is chosen here, never by the allocator or a growth policy of `Vec`, so the
//! same commands leave the same chunks and the same `mem` on every replica.

use super::varint;
use std::collections::VecDeque;

/// A chunk takes no more elements once this full.
const CHUNK_BYTES: usize = 4096;
/// A chunk this small after a removal is merged with a neighbour when the two fit in one.
const SMALL_CHUNK: usize = CHUNK_BYTES / 4;

/// Elements end to end, each a varint length then its bytes.
#[derive(Debug)]
struct Chunk {
    buf: Vec<u8>,
    count: usize,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            buf: Vec::new(),
            count: 0,
        }
    }

    /// The element at byte `at` and the offset of the next one.
    fn entry_at(&self, at: usize) -> Option<(&[u8], usize)> {
        entry_at(&self.buf, at)
    }

    /// The byte offset of element `k` (`count` gives the end of the buffer).
    fn offset_of(&self, k: usize) -> usize {
        let mut at = 0;
        for _ in 0..k {
            match self.entry_at(at) {
                Some((_, next)) => at = next,
                None => return self.buf.len(),
            }
        }
        at
    }

    /// The byte offset of every element, in order.
    fn offsets(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.count);
        let mut at = 0;
        while let Some((_, next)) = self.entry_at(at) {
            out.push(at);
            at = next;
        }
        out
    }
}

fn entry_at(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let (n, start) = varint::get(buf, at)?;
    let end = start.checked_add(n)?;
    Some((buf.get(start..end)?, end))
}

/// Bytes an element takes in a chunk.
fn encoded_len(e: &[u8]) -> usize {
    varint::len(e.len()) + e.len()
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

/// A list.
#[derive(Debug, Default)]
pub struct List {
    chunks: VecDeque<Chunk>,
    len: usize,
    heap: usize,
}

impl Clone for List {
    /// A copy with the same chunks and the same capacities, so it counts the same `mem`.
    fn clone(&self) -> List {
        let chunks = self
            .chunks
            .iter()
            .map(|c| {
                let mut buf = Vec::with_capacity(c.buf.capacity());
                buf.extend_from_slice(&c.buf);
                Chunk {
                    buf,
                    count: c.count,
                }
            })
            .collect::<VecDeque<_>>();
        let mut chunks_copy = VecDeque::with_capacity(self.chunks.capacity());
        chunks_copy.extend(chunks);
        List {
            chunks: chunks_copy,
            len: self.len,
            heap: self.heap,
        }
    }
}

/// Two lists are equal when they hold the same elements in the same order, however chunked.
impl PartialEq for List {
    fn eq(&self, other: &List) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for List {}

impl List {
    pub fn new() -> List {
        List::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn encoding(&self) -> &'static str {
        "quicklist"
    }

    /// Heap bytes held: the chunks' buffers and the deque of chunks.
    pub fn mem(&self) -> usize {
        self.heap + self.chunks.capacity() * std::mem::size_of::<Chunk>()
    }

    pub fn to_owned_items(&self) -> Vec<Vec<u8>> {
        self.iter().map(<[u8]>::to_vec).collect()
    }

    pub fn from_owned_items(items: &[Vec<u8>]) -> List {
        let mut l = List::new();
        for i in items {
            l.push_back(i);
        }
        l
    }

    /// Elements from head to tail.
    pub fn iter(&self) -> Iter<'_> {
        self.iter_from(0)
    }

    /// Elements from index `start` (0 is the head) to the tail.
    pub fn iter_from(&self, start: usize) -> Iter<'_> {
        match self.locate(start) {
            Some((ci, k)) => {
                let first = self.chunks.get(ci);
                Iter {
                    rest: self.chunks.range(ci + 1..),
                    buf: first.map_or(&[][..], |c| &c.buf[..]),
                    at: first.map_or(0, |c| c.offset_of(k)),
                }
            }
            None => Iter {
                rest: self.chunks.range(0..0),
                buf: &[],
                at: 0,
            },
        }
    }

    /// Elements from tail to head.
    pub fn iter_rev(&self) -> RevIter<'_> {
        RevIter {
            rest: self.chunks.iter().rev(),
            buf: &[],
            offsets: Vec::new(),
        }
    }

    /// The element at `index` (0 is the head).
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.iter_from(index).next()
    }

    pub fn push_back(&mut self, e: &[u8]) {
        let need = encoded_len(e);
        let fits = self
            .chunks
            .back()
            .is_some_and(|c| c.buf.len() + need <= CHUNK_BYTES);
        if !fits {
            // A chunk that takes no more keeps no spare room.
            if let Some(last) = self.chunks.len().checked_sub(1) {
                self.edit(last, |c| c.buf.shrink_to_fit());
            }
            self.chunks.push_back(Chunk::new());
        }
        let last = self.chunks.len() - 1;
        self.edit(last, |c| {
            reserve(&mut c.buf, need);
            varint::put(&mut c.buf, e.len());
            c.buf.extend_from_slice(e);
            c.count += 1;
        });
        self.len += 1;
    }

    pub fn push_front(&mut self, e: &[u8]) {
        let need = encoded_len(e);
        let fits = self
            .chunks
            .front()
            .is_some_and(|c| c.buf.len() + need <= CHUNK_BYTES);
        if !fits {
            if !self.chunks.is_empty() {
                self.edit(0, |c| c.buf.shrink_to_fit());
            }
            self.chunks.push_front(Chunk::new());
        }
        self.edit(0, |c| insert_bytes(c, 0, e));
        self.len += 1;
    }

    /// Inserts `e` so that it becomes element `index` (`len` appends).
    pub fn insert(&mut self, index: usize, e: &[u8]) {
        if index == 0 {
            return self.push_front(e);
        }
        if index >= self.len {
            return self.push_back(e);
        }
        let Some((ci, k)) = self.locate(index) else {
            return self.push_back(e);
        };
        self.edit(ci, |c| {
            let at = c.offset_of(k);
            insert_bytes(c, at, e);
        });
        self.len += 1;
        self.settle(ci);
    }

    /// Replaces element `index` with `e`; false when there is no such element.
    pub fn set(&mut self, index: usize, e: &[u8]) -> bool {
        let Some((ci, k)) = self.locate(index) else {
            return false;
        };
        let done = self.edit(ci, |c| {
            let at = c.offset_of(k);
            let Some((_, end)) = c.entry_at(at) else {
                return false;
            };
            let mut encoded = Vec::with_capacity(encoded_len(e));
            varint::put(&mut encoded, e.len());
            encoded.extend_from_slice(e);
            reserve(&mut c.buf, encoded.len().saturating_sub(end - at));
            c.buf.splice(at..end, encoded);
            shrink(&mut c.buf);
            true
        });
        if done {
            self.settle(ci);
        }
        done
    }

    /// Removes the first `n` elements (all of them when `n` is larger).
    pub fn drain_front(&mut self, mut n: usize) {
        while n > 0 {
            let Some(first) = self.chunks.front() else {
                break;
            };
            if first.count <= n {
                n -= first.count;
                self.remove_chunk(0);
                continue;
            }
            self.edit(0, |c| {
                let at = c.offset_of(n);
                c.buf.drain(..at);
                c.count -= n;
                shrink(&mut c.buf);
            });
            self.len -= n;
            break;
        }
        self.shrink_deque();
    }

    /// Removes the last `n` elements (all of them when `n` is larger).
    pub fn drain_back(&mut self, mut n: usize) {
        while n > 0 {
            let Some(last) = self.chunks.back() else {
                break;
            };
            let ci = self.chunks.len() - 1;
            if last.count <= n {
                n -= last.count;
                self.remove_chunk(ci);
                continue;
            }
            self.edit(ci, |c| {
                let at = c.offset_of(c.count - n);
                c.buf.truncate(at);
                c.count -= n;
                shrink(&mut c.buf);
            });
            self.len -= n;
            break;
        }
        self.shrink_deque();
    }

    /// Removes the elements equal to `e` whose place among the matches (0 for the first from
    /// the head) is at least `skip`, up to `limit` of them; returns how many went.
    pub fn remove_matches(&mut self, e: &[u8], skip: usize, limit: usize) -> usize {
        let (mut seen, mut removed) = (0usize, 0usize);
        let mut ci = 0;
        while ci < self.chunks.len() && removed < limit {
            let gone = self.edit(ci, |c| {
                let (mut read, mut write, mut gone) = (0, 0, 0);
                while let Some((item, next)) = entry_at(&c.buf, read) {
                    let drop = removed + gone < limit && item == e && {
                        seen += 1;
                        seen > skip
                    };
                    if drop {
                        gone += 1;
                    } else {
                        c.buf.copy_within(read..next, write);
                        write += next - read;
                    }
                    read = next;
                }
                c.buf.truncate(write);
                c.count -= gone;
                shrink(&mut c.buf);
                gone
            });
            removed += gone;
            self.len -= gone;
            if self.chunks.get(ci).is_some_and(|c| c.count == 0) {
                self.remove_chunk(ci);
            } else {
                ci += 1;
            }
        }
        if removed > 0 {
            self.merge_all();
        }
        removed
    }

    /// How many elements equal `e`.
    pub fn count_matches(&self, e: &[u8]) -> usize {
        self.iter().filter(|i| *i == e).count()
    }

    /// The chunk holding element `index`, and the element's place in it.
    fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        if index < self.len / 2 {
            let mut k = index;
            for (ci, c) in self.chunks.iter().enumerate() {
                if k < c.count {
                    return Some((ci, k));
                }
                k -= c.count;
            }
        } else {
            let mut from_end = self.len - 1 - index;
            for (ci, c) in self.chunks.iter().enumerate().rev() {
                if from_end < c.count {
                    return Some((ci, c.count - 1 - from_end));
                }
                from_end -= c.count;
            }
        }
        None
    }

    /// Runs `f` on chunk `ci`, keeping `heap` in step with its buffer's capacity.
    fn edit<R: Default>(&mut self, ci: usize, f: impl FnOnce(&mut Chunk) -> R) -> R {
        let Some(c) = self.chunks.get_mut(ci) else {
            return R::default();
        };
        let before = c.buf.capacity();
        let r = f(c);
        self.heap = self.heap - before + c.buf.capacity();
        r
    }

    fn remove_chunk(&mut self, ci: usize) {
        if let Some(c) = self.chunks.remove(ci) {
            self.heap -= c.buf.capacity();
            self.len -= c.count;
        }
    }

    fn insert_chunk(&mut self, ci: usize, c: Chunk) {
        self.heap += c.buf.capacity();
        self.chunks.insert(ci, c);
    }

    /// Restores the invariants around chunk `ci` after an element was added, replaced or
    /// removed: splits it when it grew past `CHUNK_BYTES`, merges it into a neighbour when
    /// small, drops it when empty.
    fn settle(&mut self, ci: usize) {
        let Some(c) = self.chunks.get(ci) else {
            return;
        };
        if c.count == 0 {
            self.remove_chunk(ci);
        } else if oversized(c) {
            self.split(ci);
        } else if c.buf.len() < SMALL_CHUNK && !self.merge(ci) && ci > 0 {
            self.merge(ci - 1);
        }
    }

    /// Splits chunk `ci` in two near the middle of its bytes.
    fn split(&mut self, ci: usize) {
        let Some(c) = self.chunks.get(ci) else {
            return;
        };
        let half = c.buf.len() / 2;
        let offsets = c.offsets();
        // The first element to move: the one starting nearest the middle, never the first.
        let k = offsets
            .iter()
            .position(|&o| o >= half)
            .unwrap_or(offsets.len())
            .clamp(1, offsets.len().saturating_sub(1).max(1));
        let at = offsets.get(k).copied().unwrap_or(c.buf.len());
        let moved = self.edit(ci, |c| {
            let mut tail = Vec::with_capacity(c.buf.len() - at);
            tail.extend_from_slice(&c.buf[at..]);
            c.buf.truncate(at);
            shrink(&mut c.buf);
            let n = c.count - k;
            c.count = k;
            Some(Chunk {
                buf: tail,
                count: n,
            })
        });
        if let Some(tail) = moved {
            self.insert_chunk(ci + 1, tail);
        }
        // Large elements can leave a half still too large.
        for part in [ci + 1, ci] {
            if self.chunks.get(part).is_some_and(oversized) {
                self.split(part);
            }
        }
    }

    /// Moves chunk `ci + 1` into chunk `ci` when their bytes fit in one chunk; true if done.
    fn merge(&mut self, ci: usize) -> bool {
        let (Some(a), Some(b)) = (self.chunks.get(ci), self.chunks.get(ci + 1)) else {
            return false;
        };
        if a.buf.len() + b.buf.len() > CHUNK_BYTES {
            return false;
        }
        let Some(next) = self.chunks.remove(ci + 1) else {
            return false;
        };
        self.heap -= next.buf.capacity();
        self.edit(ci, |c| {
            reserve(&mut c.buf, next.buf.len());
            c.buf.extend_from_slice(&next.buf);
            c.count += next.count;
        });
        true
    }

    /// Merges every run of neighbours that fits in one chunk (after removals inside the list).
    fn merge_all(&mut self) {
        let mut ci = 0;
        while ci + 1 < self.chunks.len() {
            let small = self
                .chunks
                .get(ci)
                .is_some_and(|c| c.buf.len() < SMALL_CHUNK)
                || self
                    .chunks
                    .get(ci + 1)
                    .is_some_and(|c| c.buf.len() < SMALL_CHUNK);
            if !(small && self.merge(ci)) {
                ci += 1;
            }
        }
        self.shrink_deque();
    }

    /// Gives back the deque's room once it holds less than a quarter of what it could.
    fn shrink_deque(&mut self) {
        if self.chunks.capacity() > 8 && self.chunks.len() < self.chunks.capacity() / 4 {
            self.chunks.shrink_to(self.chunks.len() * 2);
        }
    }
}

/// A chunk past `CHUNK_BYTES` that holds more than one element, so can be split.
fn oversized(c: &Chunk) -> bool {
    c.buf.len() > CHUNK_BYTES && c.count > 1
}

/// Inserts element `e` at byte `at` of chunk `c`.
fn insert_bytes(c: &mut Chunk, at: usize, e: &[u8]) {
    let mut encoded = Vec::with_capacity(encoded_len(e));
    varint::put(&mut encoded, e.len());
    encoded.extend_from_slice(e);
    reserve(&mut c.buf, encoded.len());
    c.buf.splice(at..at, encoded);
    c.count += 1;
}

/// Elements from a place in the list to its tail.
pub struct Iter<'a> {
    rest: std::collections::vec_deque::Iter<'a, Chunk>,
    buf: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            if let Some((e, next)) = entry_at(self.buf, self.at) {
                self.at = next;
                return Some(e);
            }
            let c = self.rest.next()?;
            self.buf = &c.buf;
            self.at = 0;
        }
    }
}

/// Elements from the tail to the head.
pub struct RevIter<'a> {
    rest: std::iter::Rev<std::collections::vec_deque::Iter<'a, Chunk>>,
    buf: &'a [u8],
    offsets: Vec<usize>,
}

impl<'a> Iterator for RevIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            if let Some(at) = self.offsets.pop() {
                return entry_at(self.buf, at).map(|(e, _)| e);
            }
            let c = self.rest.next()?;
            self.buf = &c.buf;
            self.offsets = c.offsets();
        }
    }
}

#[cfg(test)]
#[path = "list_tests.rs"]
mod tests;
