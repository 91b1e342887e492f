//! The keyspace one shard owns: compact records in per-partition arenas, found through a hash
//! index, with expiry and memory accounting, in these parts:
//!
//! - `record`: a key's value and the packed record that holds it in an arena;
//! - `table`: the `Store` the shards call, its partitions, key lookup and its entry handles,
//!   prefetch, the expiry sweep, and the whole-keyspace operations (snapshot export and import,
//!   SCAN, clearing);
//! - `usage`: key and memory accounting against the node-wide caps, and the encoding
//!   thresholds of small collections;
//! - `timing`: when the sweep walks a partition;
//! - `coll`, `zset`, `list`, `set`: the collection values (sorted sets, lists, sets), kept
//!   beside the arena and changed in place.
//!
//! Memory follows active callers, so the per-key overhead is what matters: a GCRA bucket is a
//! record of `key length (1 byte) + key + tag (1 byte) + 8-byte timestamp` packed into an arena,
//! and the hash index holds only a 4-byte offset per key. Records that change size are appended
//! and the old one is marked dead; the sweep compacts a partition once half of it is dead.
//!
//! The table is split into partitions by hash so that active expiry and compaction work on one
//! small partition at a time instead of stalling the shard. Only the shard thread touches a
//! `Store`.

mod coll;
mod list;
mod record;
mod set;
mod table;
mod timing;
mod usage;
mod varint;
mod zset;

pub(crate) use coll::Coll;
pub(crate) use list::List;
pub use record::{Fields, Holder, Holders, OwnedValue, Record, Semaphore, Value};
pub(crate) use set::{MemberSet, SetFull};
pub use table::{Slot, Store};
pub(crate) use usage::{Caps, Encodings, StoreFull};
pub(crate) use zset::{PackLimits, ZSet};

use table::PARTITIONS;

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

    /// A collection lives beside the arena: its memory is counted while it lives and given
    /// back however it goes (removed, replaced, expired on access or by the sweep), and it
    /// travels whole in a snapshot.
    #[test]
    fn a_collection_is_counted_changed_in_place_exported_and_freed() {
        use super::coll::OwnedColl;
        let mut s = Store::new(0, 0);
        let owned = OwnedColl::List(vec![b"a".to_vec(), b"bb".to_vec()]);
        let coll = Coll::from_owned(&owned);
        let mem = coll.mem();
        let Slot::Empty(e) = s.slot(b"l", 0) else {
            panic!("new key")
        };
        e.insert_coll(coll, 0).unwrap();
        let base = s.usage.bytes;
        assert!(base > mem);
        let Slot::Live(mut l) = s.slot(b"l", 0) else {
            panic!("live")
        };
        let len = l.coll_mut(|c| c.len());
        assert_eq!(len, Some(2));
        l.set_expiry(100);
        assert_eq!(s.usage.expires, 1);
        let records = s.export(0, |_| true);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].value, OwnedValue::Coll(owned.clone()));
        assert_eq!(records[0].expires_at, 100);
        // Replaced by a counter: the collection's bytes go back, and so does its expiry.
        put(&mut s, b"l", Value::Int(1), 0, 0).unwrap();
        assert_eq!(s.usage.expires, 0);
        // A collection without an expiry replaced by a value without one leaves the count.
        let Slot::Live(mut l) = s.slot(b"l", 0) else {
            panic!("live")
        };
        l.set_coll(Coll::from_owned(&owned), 0);
        l.set(Value::Str(b"text"), 0);
        assert_eq!(s.usage.expires, 0);
        put(&mut s, b"l", Value::Int(1), 0, 0).unwrap();
        assert!(
            s.usage.bytes < base - mem + 30,
            "{} {}",
            s.usage.bytes,
            base
        );
        s.remove(b"l", 0);
        assert_eq!(s.usage.bytes, 0);
        // Imported, then expired on access, then by the sweep.
        let mut t = Store::new(0, 0);
        t.import(&records, |_| true);
        assert_eq!(t.usage.bytes, base);
        assert!(matches!(
            t.get(b"l", 50).map(|e| e.value),
            Some(Value::Coll(_))
        ));
        assert!(t.get(b"l", 100).is_none());
        assert!(matches!(t.slot(b"l", 100), Slot::Empty(_)));
        assert_eq!(t.usage.bytes, 0);
        t.import(&records, |_| true);
        t.sweep(200, Store::partitions());
        assert_eq!((t.len(), t.usage.bytes, t.usage.expires), (0, 0, 0));
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
