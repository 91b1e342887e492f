//! The keyspace one shard owns: compact records in per-partition arenas, found through a hash
//! index, with expiry and memory accounting. This file holds the `Store` API the shards call and
//! its whole-keyspace operations (snapshot export and import, SCAN, clearing); the rest is in
//! three parts:
//!
//! - `record`: a key's value and the packed record that holds it in an arena;
//! - `table`: the partitions, key lookup and its entry handles, prefetch, and the expiry sweep;
//! - `usage`: key and memory accounting against the node-wide caps.
//!
//! Memory follows active callers, so the per-key overhead is what matters: a GCRA bucket is a
//! record of `key length (1 byte) + key + tag (1 byte) + 8-byte timestamp` packed into an arena,
//! and the hash index holds only a 4-byte offset per key. Records that change size are appended
//! and the old one is marked dead; the sweep compacts a partition once half of it is dead.
//!
//! The table is split into partitions by hash so that active expiry and compaction work on one
//! small partition at a time instead of stalling the shard. Only the shard thread touches a
//! `Store`.

mod record;
mod table;
mod usage;

pub use record::{Fields, Holder, Holders, OwnedValue, Record, Semaphore, Value};
pub use table::Slot;
pub(crate) use usage::{Caps, StoreFull, Usage};

use record::{is_expired, key_of, view};
use std::sync::Arc;
use table::{PARTITIONS, Partition};

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
                let v = view(&p.arena, o as usize);
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
            let value = r.value.as_value(&mut holders);
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
                if !is_expired(view(&p.arena, o as usize).expires_at, now) {
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
                let v = view(&part.arena, o as usize);
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
}

/// Bits of a scan position; the rest of a 64-bit SCAN cursor is left to name the shard.
pub(crate) const SCAN_POSITION_BITS: u32 = 54;
/// Bits of the hash that choose the partition (`PARTITIONS` is 2^PARTITION_BITS).
const PARTITION_BITS: u32 = PARTITIONS.trailing_zeros();

/// What one `Store::scan` step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanStep {
    /// The position to resume from; `None` when the store has been scanned to the end.
    pub next: Option<u64>,
    /// Keys looked at, returned or not (expired ones, and those a filter drops, count too).
    pub examined: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::State;

    pub(super) fn put(
        s: &mut Store,
        k: &[u8],
        v: Value<'_>,
        exp: u64,
        now: u64,
    ) -> Result<(), StoreFull> {
        match s.slot(k, now) {
            Slot::Live(mut l) => {
                l.set(v, exp);
                Ok(())
            }
            Slot::Empty(e) => e.insert(v, exp),
        }
    }

    fn value_of(s: &Store, k: &[u8], now: u64) -> Option<(String, u64)> {
        s.get(k, now)
            .map(|e| (format!("{:?}", e.value), e.expires_at))
    }

    /// A prefetch only warms the cache: lookups after it, of its keys and of a shorter key at
    /// the same address, find what they would find without it.
    #[test]
    fn lookups_after_a_prefetch_find_every_key_by_its_own_bytes() {
        let mut s = Store::new(0, 0);
        let now = 1;
        let wire = b"abcdef".to_vec();
        let (abc, ab, def) = (&wire[..3], &wire[..2], &wire[3..]);
        put(&mut s, b"ab", Value::Int(2), 0, now).unwrap();
        s.prefetch([abc, def].into_iter());
        put(&mut s, abc, Value::Int(3), 0, now).unwrap();
        assert_eq!(value_of(&s, ab, now), Some(("Int(2)".into(), 0)));
        put(&mut s, def, Value::Int(6), 0, now).unwrap();
        assert_eq!(value_of(&s, abc, now), Some(("Int(3)".into(), 0)));
        for (k, v) in [(&b"ab"[..], 2), (b"abc", 3), (b"def", 6)] {
            assert_eq!(value_of(&s, k, now), Some((format!("Int({v})"), 0)));
        }
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn insert_get_update_remove_every_kind() {
        let mut s = Store::new(0, 0);
        let long_key = vec![b'k'; 300];
        let holders = [
            Holder {
                token: 7,
                deadline: 95,
            },
            Holder {
                token: 9,
                deadline: 99,
            },
        ];
        let mut packed = Vec::new();
        let semaphore = Value::Semaphore(Semaphore {
            next_token: 10,
            holders: Holders::pack(&holders, &mut packed),
        });
        let mut packed_fields = Vec::new();
        let hash = Value::Hash(Fields::pack(
            [
                (&b"tokens"[..], &b"9.5"[..]),
                (b"ts", b"1700000000000"),
                (b"", b""),
            ],
            &mut packed_fields,
        ));
        let values = [
            (Value::Bucket(State::Gcra { tat: 50 }), 50),
            (Value::Bucket(State::Gcra { tat: 50 }), 70),
            (Value::Bucket(State::Fixed { start: 1, count: 2 }), 90),
            (
                Value::Bucket(State::Sliding {
                    start: 1,
                    prev: 2,
                    cur: 3,
                }),
                90,
            ),
            (Value::Int(-5), 0),
            (Value::Int(7), 99),
            (Value::Str(b"hello"), 0),
            (Value::Str(b"a longer string value"), 99),
            (Value::Str(b""), 0),
            (semaphore, 99),
            (hash, 0),
            (hash, 99),
            (Value::Int(3), 0),
        ];
        for key in [&b"a"[..], &long_key[..]] {
            for (v, exp) in values {
                put(&mut s, key, v, exp, 10).unwrap();
                assert_eq!(
                    value_of(&s, key, 10),
                    Some((format!("{v:?}"), exp)),
                    "{v:?}"
                );
                assert_eq!(s.len(), 1);
            }
            assert!(s.remove(key, 10));
            assert!(!s.remove(key, 10));
        }
        assert_eq!(s.len(), 0);
        assert_eq!(s.usage.bytes, 0);
    }

    /// Runs a whole scan in steps of `count`, calling `between` after each step.
    fn scan_all(
        s: &mut Store,
        count: usize,
        mut between: impl FnMut(&mut Store, usize),
    ) -> Vec<Vec<u8>> {
        let (mut from, mut seen, mut step) = (0u64, Vec::new(), 0usize);
        loop {
            let r = s.scan(from, count, 0, |k, _| seen.push(k.to_vec()));
            step += 1;
            between(s, step);
            match r.next {
                Some(n) => {
                    assert!(n > from, "a scan step must make progress");
                    from = n;
                }
                None => return seen,
            }
        }
    }

    #[test]
    fn scan_returns_every_key_present_throughout_while_the_table_changes() {
        let mut s = Store::new(0, 0);
        let stable: Vec<Vec<u8>> = (0..3_000u32)
            .map(|i| format!("stable:{i}").into_bytes())
            .collect();
        for k in &stable {
            put(&mut s, k, Value::Int(1), 0, 0).unwrap();
        }
        for count in [1, 10, 100, 5_000] {
            let mut churn = 0u32;
            let seen = scan_all(&mut s, count, |s, step| {
                // Grow the table a lot (forcing resizes) and delete what was added before,
                // between every step.
                for _ in 0..50 {
                    churn += 1;
                    put(
                        s,
                        format!("new:{count}:{churn}").as_bytes(),
                        Value::Int(2),
                        0,
                        0,
                    )
                    .unwrap();
                }
                if step % 3 == 0 {
                    for i in churn.saturating_sub(120)..churn.saturating_sub(60) {
                        s.remove(format!("new:{count}:{i}").as_bytes(), 0);
                    }
                    s.sweep(0, Store::partitions());
                }
            });
            let seen: std::collections::HashSet<_> = seen.into_iter().collect();
            let missing = stable.iter().filter(|k| !seen.contains(*k)).count();
            assert_eq!(
                missing, 0,
                "COUNT {count}: {missing} stable keys never returned"
            );
        }
    }

    #[test]
    fn scan_of_a_quiet_store_returns_each_key_once_and_skips_expired_ones() {
        let mut s = Store::new(0, 0);
        for i in 0..500u32 {
            put(&mut s, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
        }
        put(&mut s, b"gone", Value::Int(1), 5, 0).unwrap();
        let (mut from, mut seen) = (0, Vec::new());
        loop {
            let r = s.scan(from, 7, 10, |k, _| seen.push(k.to_vec()));
            match r.next {
                Some(n) => from = n,
                None => break,
            }
        }
        let unique: std::collections::HashSet<_> = seen.iter().cloned().collect();
        assert_eq!(seen.len(), 500);
        assert_eq!(unique.len(), 500);
        assert!(!unique.contains(b"gone".as_slice()));
    }

    #[test]
    fn export_and_import_carry_every_kind() {
        let mut s = Store::new(0, 0);
        let mut packed = Vec::new();
        let holders = [Holder {
            token: 3,
            deadline: 500,
        }];
        let sem = Value::Semaphore(Semaphore {
            next_token: 4,
            holders: Holders::pack(&holders, &mut packed),
        });
        put(&mut s, b"sem", sem, 500, 0).unwrap();
        let mut packed_fields = Vec::new();
        let pairs = [
            (b"f".to_vec(), b"1".to_vec()),
            (b"g".to_vec(), b"two".to_vec()),
        ];
        let hash = Value::Hash(Fields::pack(pairs.iter().cloned(), &mut packed_fields));
        put(&mut s, b"h", hash, 800, 0).unwrap();
        put(&mut s, b"n", Value::Int(5), 0, 0).unwrap();
        put(&mut s, b"s", Value::Str(b"v"), 700, 0).unwrap();
        put(
            &mut s,
            b"b",
            Value::Bucket(State::Gcra { tat: 600 }),
            600,
            0,
        )
        .unwrap();
        let mut records = s.export(10, |_| true);
        records.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            records.iter().find(|r| r.key == b"sem").map(|r| &r.value),
            Some(&OwnedValue::Semaphore {
                next_token: 4,
                holders: holders.to_vec(),
            })
        );
        assert_eq!(
            records.iter().find(|r| r.key == b"h").map(|r| &r.value),
            Some(&OwnedValue::Hash(pairs.to_vec()))
        );
        let mut t = Store::new(0, 0);
        t.import(&records, |_| true);
        for r in &records {
            let e = t.get(&r.key, 10).unwrap();
            assert_eq!(OwnedValue::from(e.value), r.value);
            assert_eq!(e.expires_at, r.expires_at);
        }
        assert_eq!(t.usage.bytes, s.usage.bytes);
    }

    #[test]
    fn expiry_count_follows_every_change() {
        let mut s = Store::new(0, 0);
        put(&mut s, b"a", Value::Int(1), 0, 0).unwrap();
        put(&mut s, b"b", Value::Int(1), 100, 0).unwrap();
        put(&mut s, b"c", Value::Bucket(State::Gcra { tat: 50 }), 50, 0).unwrap();
        assert_eq!(s.usage.expires, 2);
        put(&mut s, b"a", Value::Int(1), 200, 0).unwrap();
        assert_eq!(s.usage.expires, 3);
        if let Slot::Live(mut l) = s.slot(b"b", 0) {
            l.set_expiry(0);
        }
        assert_eq!(s.usage.expires, 2);
        s.remove(b"a", 0);
        assert_eq!(s.usage.expires, 1);
        // Lazy expiry on access, then the sweep.
        put(&mut s, b"d", Value::Int(1), 60, 0).unwrap();
        assert!(s.get(b"c", 55).is_none());
        assert!(matches!(s.slot(b"c", 55), Slot::Empty(_)));
        assert_eq!(s.usage.expires, 1);
        s.sweep(70, Store::partitions());
        assert_eq!(s.usage.expires, 0);
        put(&mut s, b"e", Value::Int(1), 1_000, 0).unwrap();
        s.clear();
        assert_eq!(s.usage.expires, 0);
    }
}
