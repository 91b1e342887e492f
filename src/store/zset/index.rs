//! A large sorted set: an order-statistic treap over (score, member) for ranges and ranks,
//! and a hash table from member to node for lookups, sharing the member's bytes.
//!
//! Nodes live in one vector and name each other by number; a removed node's number goes on a
//! free list (threaded through `left`) for the next insertion. Each node counts the nodes
//! under it, so finding a rank, the member at a rank, and cutting out a run of ranks take
//! O(log n) expected steps.
//!
//! A treap needs a priority per node. It comes from a counter the set carries, mixed
//! (splitmix64), never from the member or a random source: replicas that apply the same
//! commands build the same tree, and a client cannot choose members that unbalance it. The
//! hash table's hasher has fixed keys for the same reason.

use super::{Entry, alloc_size, cmp_key};
use hashbrown::HashTable;
use std::cmp::Ordering;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    score: f64,
    member: Box<[u8]>,
    left: u32,
    right: u32,
    /// Nodes in this subtree, itself included; 0 on the free list.
    size: u32,
    prio: u32,
}

#[derive(Debug, Clone)]
pub(super) struct Index {
    nodes: Vec<Node>,
    root: u32,
    /// Head of the free list.
    free: u32,
    by_member: HashTable<u32>,
    /// Bytes the allocator hands out for the members' buffers.
    member_bytes: usize,
    /// Priorities drawn so far.
    drawn: u64,
}

fn hash(member: &[u8]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(member)
}

fn splitmix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Default for Index {
    fn default() -> Index {
        Index {
            nodes: Vec::new(),
            root: NIL,
            free: NIL,
            by_member: HashTable::new(),
            member_bytes: 0,
            drawn: 0,
        }
    }
}

impl Index {
    pub(super) fn len(&self) -> usize {
        self.size(self.root)
    }

    /// Heap bytes held, as the allocator rounds them.
    pub(super) fn heap_bytes(&self) -> usize {
        alloc_size(self.nodes.capacity() * std::mem::size_of::<Node>())
            + alloc_size(self.by_member.allocation_size())
            + self.member_bytes
    }

    fn size(&self, t: u32) -> usize {
        self.nodes.get(t as usize).map_or(0, |n| n.size as usize)
    }

    fn node(&self, t: u32) -> &Node {
        &self.nodes[t as usize]
    }

    fn fix(&mut self, t: u32) {
        let (l, r) = (self.node(t).left, self.node(t).right);
        let size = 1 + self.size(l) + self.size(r);
        self.nodes[t as usize].size = size as u32;
    }

    fn find(&self, member: &[u8]) -> Option<u32> {
        self.by_member
            .find(hash(member), |&id| &*self.node(id).member == member)
            .copied()
    }

    pub(super) fn score(&self, member: &[u8]) -> Option<f64> {
        self.find(member).map(|id| self.node(id).score)
    }

    /// Rank of (score, member), which must be in the set.
    fn rank_of(&self, key: (f64, &[u8])) -> usize {
        let (mut t, mut acc) = (self.root, 0);
        while t != NIL {
            let n = self.node(t);
            match cmp_key(key, (n.score, &n.member)) {
                Ordering::Less => t = n.left,
                Ordering::Greater => {
                    acc += self.size(n.left) + 1;
                    t = n.right;
                }
                Ordering::Equal => return acc + self.size(n.left),
            }
        }
        acc
    }

    pub(super) fn rank(&self, member: &[u8]) -> Option<usize> {
        let id = self.find(member)?;
        let n = self.node(id);
        Some(self.rank_of((n.score, &n.member)))
    }

    /// Splits `t` into its first `k` nodes and the rest.
    fn split_at(&mut self, t: u32, k: usize) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        let (l, r) = (self.node(t).left, self.node(t).right);
        let ls = self.size(l);
        if k <= ls {
            let (a, b) = self.split_at(l, k);
            self.nodes[t as usize].left = b;
            self.fix(t);
            (a, t)
        } else {
            let (a, b) = self.split_at(r, k - ls - 1);
            self.nodes[t as usize].right = a;
            self.fix(t);
            (t, b)
        }
    }

    /// Joins two trees, every key of `a` below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.node(a).prio >= self.node(b).prio {
            let r = self.node(a).right;
            let m = self.merge(r, b);
            self.nodes[a as usize].right = m;
            self.fix(a);
            a
        } else {
            let l = self.node(b).left;
            let m = self.merge(a, l);
            self.nodes[b as usize].left = m;
            self.fix(b);
            b
        }
    }

    /// Entries before the first for which `pred` is false (`pred` holds for a prefix).
    pub(super) fn partition_point(&self, mut pred: impl FnMut(Entry<'_>) -> bool) -> usize {
        let (mut t, mut acc) = (self.root, 0);
        while t != NIL {
            let n = self.node(t);
            if pred((&n.member, n.score)) {
                acc += self.size(n.left) + 1;
                t = n.right;
            } else {
                t = n.left;
            }
        }
        acc
    }

    /// Adds `member`, which must not be in the set; false (and nothing added) when the set
    /// has run out of node numbers.
    pub(super) fn insert(&mut self, member: &[u8], score: f64) -> bool {
        self.drawn += 1;
        let node = Node {
            score,
            member: member.into(),
            left: NIL,
            right: NIL,
            size: 1,
            prio: splitmix(self.drawn) as u32,
        };
        let id = if self.free != NIL {
            let id = self.free;
            self.free = self.node(id).left;
            self.nodes[id as usize] = node;
            id
        } else {
            let Ok(id) = u32::try_from(self.nodes.len()) else {
                return false;
            };
            if id == NIL {
                return false;
            }
            if self.nodes.len() == self.nodes.capacity() {
                // A quarter more at a time: amortised, without leaving a vector's usual
                // doubling as idle room.
                self.nodes.reserve_exact((self.nodes.len() / 4).max(8));
            }
            self.nodes.push(node);
            id
        };
        self.member_bytes += alloc_size(member.len());
        let nodes = &self.nodes;
        self.by_member
            .insert_unique(hash(member), id, |&i| hash(&nodes[i as usize].member));
        let rank =
            self.partition_point(|(m, s)| cmp_key((s, m), (score, member)) == Ordering::Less);
        let (l, r) = self.split_at(self.root, rank);
        let l = self.merge(l, id);
        self.root = self.merge(l, r);
        true
    }

    /// Removes `member`; its score if it was there.
    pub(super) fn remove(&mut self, member: &[u8]) -> Option<f64> {
        let rank = self.rank(member)?;
        let score = self.score(member)?;
        self.remove_range(rank, rank + 1);
        Some(score)
    }

    /// Removes the entries of ranks `from..to`.
    pub(super) fn remove_range(&mut self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        let (l, rest) = self.split_at(self.root, from);
        let (cut, r) = self.split_at(rest, to - from);
        self.root = self.merge(l, r);
        let mut stack = vec![cut];
        while let Some(t) = stack.pop() {
            if t == NIL {
                continue;
            }
            stack.push(self.node(t).left);
            stack.push(self.node(t).right);
            self.release(t);
        }
    }

    /// Puts node `t` (already out of the tree) on the free list.
    fn release(&mut self, t: u32) {
        let member = std::mem::take(&mut self.nodes[t as usize].member);
        if let Ok(entry) = self.by_member.find_entry(hash(&member), |&id| id == t) {
            entry.remove();
        }
        self.member_bytes -= alloc_size(member.len());
        let free = self.free;
        let n = &mut self.nodes[t as usize];
        n.left = free;
        n.right = NIL;
        n.size = 0;
        self.free = t;
    }

    /// Calls `f` on the entries of ranks `from..to`, in order.
    pub(super) fn each(&self, from: usize, to: usize, f: &mut dyn FnMut(Entry<'_>)) {
        // The path to rank `from`, keeping the nodes still to visit after it.
        let (mut stack, mut t, mut k) = (Vec::new(), self.root, from);
        while t != NIL {
            let n = self.node(t);
            let ls = self.size(n.left);
            if k < ls {
                stack.push(t);
                t = n.left;
            } else if k == ls {
                stack.push(t);
                break;
            } else {
                k -= ls + 1;
                t = n.right;
            }
        }
        for _ in from..to {
            let Some(t) = stack.pop() else { break };
            let n = self.node(t);
            f((&n.member, n.score));
            let mut c = n.right;
            while c != NIL {
                stack.push(c);
                c = self.node(c).left;
            }
        }
    }
}
