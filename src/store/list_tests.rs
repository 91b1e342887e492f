//! The packed list against a `VecDeque` of elements, under random operations.

use super::*;

/// A fixed-seed xorshift generator: the same operations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// An element from a small alphabet (so that matches happen), sometimes long.
    fn element(&mut self) -> Vec<u8> {
        match self.below(20) {
            0 => vec![b'L'; 200 + self.below(5000)],
            1 => Vec::new(),
            _ => format!("e{}", self.below(12)).into_bytes(),
        }
    }
}

/// Checks every invariant the list's header states, and the elements against `want`.
fn check(l: &List, want: &VecDeque<Vec<u8>>) {
    assert_eq!(l.len(), want.len());
    assert_eq!(
        l.iter().collect::<Vec<_>>(),
        want.iter().collect::<Vec<_>>()
    );
    let back: Vec<&[u8]> = l.iter_rev().collect();
    assert!(back.iter().eq(want.iter().rev()));
    let mut heap = 0;
    let mut len = 0;
    for c in &l.chunks {
        assert!(c.count > 0, "an empty chunk");
        assert_eq!(c.offsets().len(), c.count);
        assert_eq!(
            c.offset_of(c.count),
            c.buf.len(),
            "a chunk ends on an element"
        );
        assert!(
            c.buf.len() <= CHUNK_BYTES || c.count == 1,
            "an oversized chunk"
        );
        heap += c.buf.capacity();
        len += c.count;
    }
    assert_eq!(l.heap, heap);
    assert_eq!(l.len, len);
    assert_eq!(
        l.mem(),
        heap + l.chunks.capacity() * std::mem::size_of::<Chunk>()
    );
    let copy = l.clone();
    assert_eq!(copy.mem(), l.mem());
    assert_eq!(&copy, l);
}

#[test]
fn random_operations_match_a_deque() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20 {
        let mut l = List::new();
        let mut want: VecDeque<Vec<u8>> = VecDeque::new();
        for _ in 0..600 {
            let e = rng.element();
            match rng.below(10) {
                0 | 1 => {
                    l.push_back(&e);
                    want.push_back(e);
                }
                2 | 3 => {
                    l.push_front(&e);
                    want.push_front(e);
                }
                4 => {
                    let i = rng.below(want.len() + 1);
                    l.insert(i, &e);
                    want.insert(i, e);
                }
                5 => {
                    let i = rng.below(want.len() + 2);
                    assert_eq!(l.set(i, &e), i < want.len());
                    if let Some(slot) = want.get_mut(i) {
                        *slot = e;
                    }
                }
                6 => {
                    let n = rng.below(8);
                    l.drain_front(n);
                    want.drain(..n.min(want.len()));
                }
                7 => {
                    let n = rng.below(8);
                    l.drain_back(n);
                    want.truncate(want.len().saturating_sub(n));
                }
                8 => {
                    let (skip, limit) = (rng.below(3), 1 + rng.below(4));
                    let mut seen = 0;
                    let mut gone = 0;
                    want.retain(|x| {
                        if *x != e || gone >= limit {
                            return true;
                        }
                        seen += 1;
                        if seen > skip {
                            gone += 1;
                            return false;
                        }
                        true
                    });
                    assert_eq!(l.remove_matches(&e, skip, limit), gone);
                }
                _ => {
                    let i = rng.below(want.len() + 2);
                    assert_eq!(l.get(i), want.get(i).map(Vec::as_slice));
                    let tail: Vec<&[u8]> = l.iter_from(i).collect();
                    assert!(tail.iter().eq(want.iter().skip(i)));
                    assert_eq!(
                        l.count_matches(&e),
                        want.iter().filter(|x| **x == e).count()
                    );
                }
            }
            check(&l, &want);
        }
        let items = l.to_owned_items();
        assert_eq!(List::from_owned_items(&items), l);
        l.drain_back(usize::MAX);
        assert!(l.is_empty());
        assert_eq!(l.mem(), l.chunks.capacity() * std::mem::size_of::<Chunk>());
    }
}

#[test]
fn small_elements_cost_little_more_than_their_bytes() {
    for n in [100usize, 10_000] {
        let mut l = List::new();
        for i in 0..n {
            l.push_front(format!("element-{i:012}").as_bytes());
        }
        // 20-byte elements: 21 bytes packed, plus room and chunk headers.
        let per = l.mem() as f64 / n as f64;
        eprintln!(
            "list of {n} 20-byte elements: {} bytes, {per:.2} an element",
            l.mem()
        );
        assert!(per < 25.0, "{n} elements: {per:.1} bytes each");
    }
}
